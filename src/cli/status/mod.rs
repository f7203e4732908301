//! `leaderd status [ELECTION…] [--json]`: read the store, print each
//! election's holder, fencing token, age and the holder's priority. The
//! store is checked first, as `leaderd run` checks it: a table with another
//! key is exit 69, never its items shown as elections.
//!
//! Ages come from the record's `renewed_at` and this host's wall clock: they
//! are for humans and decide nothing.
//!
//! The rooms: this file holds the elections' table; `members.rs` is
//! `status --members`, the daemons' session and member records;
//! `published.rs` reads what those records publish for preferred leaders.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::StatusArgs;
use super::tool::{self, ToolError, aligned, seconds};
use crate::clock;
use crate::exit;
use crate::lease::{LeaseStore, Record, StoreError, member_key};

mod members;
mod published;

pub use members::MemberStatus;
pub use published::KnownSet;
use published::Published;

/// One election as `status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ElectionStatus {
    /// Election name.
    pub election: String,
    /// "held", "released", "absent", "malformed" or "unknown_format".
    pub state: &'static str,
    /// Current holder, if held.
    pub holder: Option<String>,
    /// Fencing token, if readable.
    pub fencing_token: Option<u64>,
    /// The holder's promised lease, ms.
    pub lease_ms: Option<u64>,
    /// Unix ms of the start of the tenure.
    pub acquired_at_ms: Option<u64>,
    /// Unix ms of the last write.
    pub renewed_at_ms: Option<u64>,
    /// Milliseconds since the last write, by this host's wall clock.
    pub age_ms: Option<u64>,
    /// The holder's advertised address, if any.
    pub holder_address: Option<String>,
    /// What is wrong with a malformed record.
    pub problem: Option<String>,
    /// The format of a record of a format this build does not know, as
    /// stored.
    pub format: Option<String>,
    /// The session the record is held through, if any: its renewals are
    /// the session's (the age and last write shown are the session's).
    pub session: Option<String>,
    /// That session's state: "live", "ended", "missing" or "unreadable".
    pub session_state: Option<&'static str>,
    /// A counting lock's slots, as "2 of 3" (`holder` is its newest
    /// holder, `lease_ms` the longest lease: `leaderd lock status` lists
    /// every holder).
    pub slots: Option<String>,
    /// The holder's priority for this election, as it publishes it on its
    /// session record (or, without a session, its member record); `None`
    /// while it publishes none (not eligible, or no priorities).
    pub holder_priority: Option<i64>,
    /// `false` when `holder_priority` is the holder's default standing in
    /// for this election's own priority, which the label names by the
    /// holder's set of elections, unknown here (give `status` the
    /// holder's configuration).
    pub holder_priority_exact: bool,
    /// Why the holder's priority label cannot be read, if it cannot.
    pub holder_priority_problem: Option<String>,
}

impl ElectionStatus {
    fn from_record(election: &str, record: &Record, now_ms: u64) -> ElectionStatus {
        let mut s = ElectionStatus {
            election: election.to_owned(),
            state: "absent",
            holder: None,
            fencing_token: None,
            lease_ms: None,
            acquired_at_ms: None,
            renewed_at_ms: None,
            age_ms: None,
            holder_address: None,
            problem: None,
            format: None,
            session: None,
            session_state: None,
            slots: None,
            holder_priority: None,
            holder_priority_exact: true,
            holder_priority_problem: None,
        };
        match record {
            Record::Absent => {}
            Record::Valid(l) => {
                s.election = l.election.clone();
                s.state = if l.holder.is_some() {
                    "held"
                } else {
                    "released"
                };
                s.holder = l.holder.clone();
                s.fencing_token = Some(l.fencing_token);
                s.lease_ms = Some(l.lease_ms);
                s.acquired_at_ms = Some(l.acquired_at_ms);
                s.renewed_at_ms = Some(l.renewed_at_ms);
                s.age_ms = Some(now_ms.saturating_sub(l.renewed_at_ms));
                s.holder_address = l.holder_meta.as_ref().and_then(|m| m.address.clone());
                s.session = l.session.clone().filter(|_| l.holder.is_some());
                s.slots = crate::core::slots::Slots::of(l).map(|t| match t {
                    Ok(t) => format!("{} of {}", t.holders.len(), t.limit),
                    Err(_) => "unreadable".to_owned(),
                });
            }
            Record::Malformed(m) => {
                s.election = m.election.clone();
                s.state = "malformed";
                s.fencing_token = m.fencing_token;
                s.problem = Some(m.problem.clone());
            }
            // Only what this build can read of it: the rest of its layout
            // is the later format's.
            Record::UnknownFormat(u) => {
                s.election = u.election.clone();
                s.state = "unknown_format";
                s.holder = u.holder.clone();
                s.fencing_token = u.fencing_token;
                s.format = Some(u.format.clone());
            }
        }
        s
    }
}

/// Read the named elections (all of them when `names` is empty); a
/// holder's per-election priority is named by `known`'s set.
pub async fn collect(
    store: &dyn LeaseStore,
    names: &[String],
    known: &KnownSet,
    budget: Duration,
) -> Result<Vec<ElectionStatus>, StoreError> {
    let now_ms = clock::unix_ms();
    if names.is_empty() {
        let mut all: Vec<ElectionStatus> = store
            .list(budget)
            .await?
            .iter()
            .map(|r| ElectionStatus::from_record("", r, now_ms))
            .collect();
        all.sort_by(|a, b| a.election.cmp(&b.election));
        return with_holders(store, all, known, budget, now_ms).await;
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let record = store.read(name, budget).await?;
        out.push(ElectionStatus::from_record(name, &record, now_ms));
    }
    with_holders(store, out, known, budget, now_ms).await
}

/// The held rows, completed from their holders' records: a row held
/// through a session from that session's record, any other from its
/// holder's member record (its priority). Each record is read once: a
/// handful of daemons, however many elections.
async fn with_holders(
    store: &dyn LeaseStore,
    mut rows: Vec<ElectionStatus>,
    known: &KnownSet,
    budget: Duration,
    now_ms: u64,
) -> Result<Vec<ElectionStatus>, StoreError> {
    let mut records: BTreeMap<String, Record> = BTreeMap::new();
    for row in &mut rows {
        // A counting lock's holders are `leaderd lock` commands, which
        // publish nothing.
        let key = match (&row.session, &row.holder) {
            (Some(session), _) => session.clone(),
            (None, Some(holder)) if row.state == "held" && row.slots.is_none() => {
                member_key(holder)
            }
            _ => continue,
        };
        if !records.contains_key(&key) {
            let record = store.read(&key, budget).await?;
            records.insert(key.clone(), record);
        }
        let record = &records[&key];
        if let Record::Valid(r) = record
            && r.holder.is_some()
            && r.holder == row.holder
        {
            row.set_priority(&Published::of(r), known);
        }
        if row.session.is_none() {
            continue;
        }
        row.lease_ms = session_lease_ms(record);
        row.session_state = Some(match record {
            Record::Valid(s) if s.holder.is_some() => {
                row.renewed_at_ms = Some(s.renewed_at_ms);
                row.age_ms = Some(now_ms.saturating_sub(s.renewed_at_ms));
                "live"
            }
            Record::Valid(_) => "ended",
            Record::Absent => "missing",
            Record::Malformed(_) | Record::UnknownFormat(_) => "unreadable",
        });
    }
    Ok(rows)
}

impl ElectionStatus {
    /// The holder's priority for this election, from what its record
    /// publishes.
    fn set_priority(&mut self, published: &Published, known: &KnownSet) {
        if let published::Label::Unreadable(problem) = &published.priority {
            self.holder_priority_problem = Some(problem.clone());
        }
        if let Some((p, exact)) = published.priority_for(&self.election, known) {
            self.holder_priority = Some(p);
            self.holder_priority_exact = exact;
        }
    }
}

/// The lease of an election held through a session, from that session's
/// record as read: the election's own `lease_ms` is stored as a hundred
/// years (see `Lease::stored_lease_ms`) and says nothing; its session's is
/// the one that counts. `None` when the session's record cannot tell
/// (missing, malformed, of an unknown format).
pub(super) fn session_lease_ms(session: &Record) -> Option<u64> {
    match session {
        Record::Valid(s) => Some(s.lease_ms),
        _ => None,
    }
}

/// The mark of a priority that is the holder's default standing in for
/// the election's own, and the line below the table that explains it.
const INEXACT_MARK: &str = "*";
const INEXACT_NOTE: &str = "* the holder's default priority: it configures other priorities for some elections; pass its daemon's config file with --config to see them";

/// Render as an aligned text table.
pub fn render_text(rows: &[ElectionStatus]) -> String {
    let mut lines = vec![
        [
            "ELECTION",
            "STATE",
            "HOLDER",
            "FENCING_TOKEN",
            "AGE",
            "LEASE",
            "PRIORITY",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for r in rows {
        let dash = || "-".to_owned();
        lines.push(vec![
            r.election.clone(),
            match (&r.problem, &r.format) {
                (Some(p), _) => format!("malformed ({p})"),
                (None, Some(f)) => {
                    format!(
                        "unknown_format (format {f}; this leaderd knows {})",
                        crate::lease::known_formats()
                    )
                }
                (None, None) => match (r.session_state, &r.slots) {
                    (Some(s), _) => format!("{} (session {s})", r.state),
                    (None, Some(slots)) => format!("{} (counting lock: {slots} slots)", r.state),
                    (None, None) => r.state.to_owned(),
                },
            },
            r.holder.clone().unwrap_or_else(dash),
            r.fencing_token.map_or_else(dash, |t| t.to_string()),
            r.age_ms.map_or_else(dash, seconds),
            r.lease_ms.map_or_else(dash, seconds),
            match (r.holder_priority, &r.holder_priority_problem) {
                (Some(p), _) if r.holder_priority_exact => p.to_string(),
                (Some(p), _) => format!("{p}{INEXACT_MARK}"),
                (None, Some(_)) => "unreadable".to_owned(),
                (None, None) => dash(),
            },
        ]);
    }
    let mut out = aligned(&lines);
    if rows.is_empty() {
        out.push_str("(no elections in the store)\n");
    }
    if rows
        .iter()
        .any(|r| r.holder_priority.is_some() && !r.holder_priority_exact)
    {
        out.push_str(INEXACT_NOTE);
        out.push('\n');
    }
    out
}

/// Render as JSON (an array, one object per election).
pub fn render_json(rows: &[ElectionStatus]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Budget of one store request made by `status`.
const BUDGET: Duration = Duration::from_secs(10);

/// `leaderd status`: check the store, read it (never create or change
/// anything) and print every election found in it, or the ones named; with
/// `--members`, the daemons' session and member records instead.
pub async fn run(args: StatusArgs) -> Result<(), ToolError> {
    for name in &args.elections {
        tool::check_name(name)?;
    }
    let cfg = tool::config(&args.store)?;
    let known = KnownSet::new(&cfg.elections);
    let store = crate::lease::open_to_read(&cfg.store.spec())
        .await
        .map_err(|e| ToolError::new(exit::UNAVAILABLE, e))?;
    tool::check_store(store.as_ref()).await?;
    let failed = |e: StoreError| ToolError::new(exit::UNAVAILABLE, e.to_string());
    let text = if args.members {
        let members = members::collect(store.as_ref(), &known, BUDGET)
            .await
            .map_err(failed)?;
        match args.json {
            true => format!("{}\n", members::render_json(&members)),
            false => members::render_text(&members),
        }
    } else {
        let rows = collect(store.as_ref(), &args.elections, &known, BUDGET)
            .await
            .map_err(failed)?;
        match args.json {
            true => format!("{}\n", render_json(&rows)),
            false => render_text(&rows),
        }
    };
    tool::print(&text).map_err(|e| {
        ToolError::new(
            exit::IOERR,
            format!("cannot write the status to stdout: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::memory::MemoryStore;
    use crate::lease::{Lease, Malformed, RvnGuard};

    /// The set of a configuration that lists no election.
    fn known() -> KnownSet {
        KnownSet::new(&[crate::config::DEFAULT_ELECTION.to_owned()])
    }

    #[tokio::test]
    async fn reports_held_released_absent_malformed_and_unknown_format() {
        let store = MemoryStore::new();
        let now = clock::unix_ms();
        let lease = Lease {
            election: "a".into(),
            holder: Some("web-1".into()),
            rvn: "r".into(),
            fencing_token: 12,
            lease_ms: 10_000,
            acquired_at_ms: now - 5_000,
            renewed_at_ms: now - 2_000,
            expires_at_s: 0,
            holder_meta: None,
            successor: None,
            session: None,
        };
        store.set("a", Record::Valid(lease.clone()));
        store.set(
            "b",
            Record::Valid(Lease {
                election: "b".into(),
                holder: None,
                ..lease
            }),
        );
        store.set(
            "m",
            Record::Malformed(Malformed {
                election: "m".into(),
                problem: "attribute `rvn` is missing".into(),
                fingerprint: "x".into(),
                fencing_token: None,
                guard: RvnGuard::Missing,
            }),
        );
        store.plant_unknown_format("u", "4", Some("web-9"), Some(40));
        let names = ["a", "b", "m", "z", "u"].map(String::from);
        let rows = collect(&store, &names, &known(), Duration::from_secs(1))
            .await
            .unwrap();
        let states: Vec<_> = rows.iter().map(|r| r.state).collect();
        assert_eq!(
            states,
            ["held", "released", "malformed", "absent", "unknown_format"]
        );
        assert_eq!(rows[4].holder.as_deref(), Some("web-9"));
        assert_eq!(rows[4].fencing_token, Some(40));
        assert_eq!(rows[0].holder.as_deref(), Some("web-1"));
        assert_eq!(rows[0].fencing_token, Some(12));
        assert!((2_000..3_000).contains(&rows[0].age_ms.unwrap()));
        let text = render_text(&rows);
        assert!(text.contains("web-1") && text.contains("malformed (attribute `rvn` is missing)"));
        let json: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        assert_eq!(json[0]["fencing_token"], 12);
        assert_eq!(json[3]["state"], "absent");
        assert_eq!(json[4]["state"], "unknown_format");
        assert_eq!(json[4]["format"], "4");
        assert!(
            text.contains("unknown_format (format 4; this leaderd knows 1, 2 and 3)"),
            "{text}"
        );
        let all = collect(&store, &[], &known(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(all.len(), 4);
    }

    #[tokio::test]
    async fn a_counting_lock_shows_its_slots() {
        let store = MemoryStore::new();
        let mut lease = Lease::stamped("c", "newest", 7, 30_000, 1, None);
        lease.holder_meta = Some(crate::lease::HolderMeta {
            slots: Some("3 6.ab.10000.1.1.61 7.cd.30000.1.1.62".into()),
            ..Default::default()
        });
        store.set("c", Record::Valid(lease));
        let rows = collect(&store, &["c".to_owned()], &known(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(rows[0].slots.as_deref(), Some("2 of 3"));
        let text = render_text(&rows);
        assert!(
            text.contains("held (counting lock: 2 of 3 slots)"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        assert_eq!(json[0]["slots"], "2 of 3");
    }

    #[tokio::test]
    async fn a_record_held_through_a_session_shows_the_session_and_its_renewals() {
        let store = MemoryStore::new();
        let now = clock::unix_ms();
        let session = Lease {
            election: "#session/web-1/n1".into(),
            holder: Some("web-1".into()),
            rvn: "s".into(),
            fencing_token: 0,
            lease_ms: 10_000,
            acquired_at_ms: now - 60_000,
            renewed_at_ms: now - 1_000,
            expires_at_s: 0,
            holder_meta: None,
            successor: None,
            session: None,
        };
        let held = |name: &str, key: &str| Lease {
            election: name.into(),
            rvn: "e".into(),
            fencing_token: 5,
            acquired_at_ms: now - 50_000,
            renewed_at_ms: now - 50_000,
            session: Some(key.into()),
            ..session.clone()
        };
        store.set(&session.election, Record::Valid(session.clone()));
        let ended = Lease {
            election: "#session/web-2/n2".into(),
            holder: None,
            ..session.clone()
        };
        store.set(&ended.election, Record::Valid(ended.clone()));
        store.set("a", Record::Valid(held("a", &session.election)));
        store.set("b", Record::Valid(held("b", &ended.election)));
        store.set("c", Record::Valid(held("c", "#session/web-3/gone")));
        let names = ["a", "b", "c"].map(String::from);
        let rows = collect(&store, &names, &known(), Duration::from_secs(1))
            .await
            .unwrap();
        let sessions: Vec<_> = rows.iter().map(|r| r.session_state).collect();
        assert_eq!(sessions, [Some("live"), Some("ended"), Some("missing")]);
        assert_eq!(rows[0].session.as_deref(), Some("#session/web-1/n1"));
        // The age is the session's: its renewals are the election's.
        assert!((1_000..2_000).contains(&rows[0].age_ms.unwrap()));
        assert!(rows[1].age_ms.unwrap() >= 50_000);
        assert!(render_text(&rows).contains("held (session live)"));
        // Listing every election shows no session record as an election.
        let all = collect(&store, &[], &known(), Duration::from_secs(1))
            .await
            .unwrap();
        let listed: Vec<_> = all.iter().map(|r| r.election.as_str()).collect();
        assert_eq!(listed, ["a", "b", "c"]);
    }

    /// A daemon's session or member record under `key`, publishing `labels`.
    pub(super) fn publishing(key: &str, identity: &str, labels: &[(&str, &str)]) -> Lease {
        let mut lease = Lease::stamped(key, identity, 0, 10_000, 1, None);
        lease.holder_meta = Some(crate::lease::HolderMeta {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        });
        lease
    }

    /// The row of `election` in `text`, split into its cells.
    fn cells<'a>(text: &'a str, election: &str) -> Vec<&'a str> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(election))
            .unwrap_or_else(|| panic!("no row {election} in\n{text}"));
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    /// Elections a to f held by daemons that publish their priorities (or
    /// not) in every way, all of one set.
    fn store_of_priorities() -> MemoryStore {
        let store = MemoryStore::new();
        let set = crate::balance::set_digest(["a", "b", "c", "d", "e", "f"]);
        // web-1 holds a and b through its session: priority 2, but 7 for
        // b (the second of the set's sorted names).
        let session = publishing(
            "#session/web-1/n1",
            "web-1",
            &[("elections", &set), ("priority", "2;1=7")],
        );
        store.set(&session.election, Record::Valid(session.clone()));
        for name in ["a", "b"] {
            let mut lease = Lease::stamped(name, "web-1", 3, 10_000, 1, None);
            lease.session = Some(session.election.clone());
            store.set(name, Record::Valid(lease));
        }
        // The others hold without a session: their member records count.
        let member = |identity: &str, labels: &[(&str, &str)]| {
            let key = crate::lease::member_key(identity);
            store.set(&key, Record::Valid(publishing(&key, identity, labels)));
        };
        let held = |name: &str, identity: &str| {
            store.set(
                name,
                Record::Valid(Lease::stamped(name, identity, 4, 10_000, 1, None)),
            );
        };
        held("c", "web-2");
        member("web-2", &[("elections", &set), ("priority", "5")]);
        // Not eligible (or no priorities): no label.
        held("d", "web-3");
        member("web-3", &[("elections", &set), ("led", "1")]);
        held("e", "web-4");
        member("web-4", &[("elections", &set), ("priority", "high")]);
        // A member record given up (its daemon left) publishes nothing.
        held("f", "web-5");
        let left = Lease {
            holder: None,
            ..publishing("#member/web-5", "web-5", &[("priority", "9")])
        };
        store.set("#member/web-5", Record::Valid(left));
        store
    }

    #[tokio::test]
    async fn the_holders_priority_is_read_from_its_session_or_member_record() {
        let store = store_of_priorities();
        let config = KnownSet::new(&["f", "e", "d", "c", "b", "a"].map(String::from));
        let rows = collect(&store, &[], &config, Duration::from_secs(1))
            .await
            .unwrap();
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.election.as_str(),
                    r.holder_priority,
                    r.holder_priority_exact,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", Some(2), true),
                ("b", Some(7), true),
                ("c", Some(5), true),
                ("d", None, true),
                ("e", None, true),
                ("f", None, true),
            ]
        );
        assert_eq!(
            rows[4].holder_priority_problem.as_deref(),
            Some("priority label \"high\" cannot be read")
        );
        let text = render_text(&rows);
        assert!(text.lines().next().unwrap().ends_with("PRIORITY"), "{text}");
        let last = |e| cells(&text, e).last().copied().unwrap();
        assert_eq!(
            ["a", "b", "c", "d", "e", "f"].map(last),
            ["2", "7", "5", "-", "unreadable", "-"],
            "{text}"
        );
        assert!(!text.contains(INEXACT_NOTE), "{text}");
        let json: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        assert_eq!(json[1]["holder_priority"], 7);
        assert_eq!(json[1]["holder_priority_exact"], true);
        assert_eq!(json[3]["holder_priority"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn without_the_holders_set_its_default_stands_in_marked() {
        let store = store_of_priorities();
        // Given another set, b's own priority cannot be named: the
        // default stands in for it, marked, and a line says why.
        let other = KnownSet::new(&["b".to_owned()]);
        let names = ["a", "b"].map(String::from);
        let rows = collect(&store, &names, &other, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(rows[1].holder_priority, Some(2));
        assert!(!rows[1].holder_priority_exact);
        let text = render_text(&rows);
        assert_eq!(cells(&text, "b").last(), Some(&"2*"), "{text}");
        assert!(text.ends_with(&format!("{INEXACT_NOTE}\n")), "{text}");
        let json: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        assert_eq!(json[1]["holder_priority"], 2);
        assert_eq!(json[1]["holder_priority_exact"], false);
    }
}
