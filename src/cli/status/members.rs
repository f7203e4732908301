//! `leaderd status --members [--json]`: the daemons' session records (and,
//! without sessions, member records) and what each publishes: its set of
//! elections, its priorities, whether it is eligible, the record's age and
//! lease. One read of the store's items, each record shown once; a record
//! or label this build cannot read is shown as unreadable.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::KnownSet;
use super::published::{Label, Overrides, Published};
use crate::cli::tool::{aligned, seconds};
use crate::clock;
use crate::lease::{
    LeaseStore, MEMBER_PREFIX, Record, StoreError, is_member_key, is_session_key, session_owner,
};

/// One daemon's session or member record, as `status --members` reports
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberStatus {
    /// The daemon's identity.
    pub identity: String,
    /// The record's key (`#session/IDENTITY/NONCE` or `#member/IDENTITY`).
    pub record: String,
    /// "session" or "member".
    pub kind: &'static str,
    /// Its `elections` label as stored: the digest of the set of elections
    /// it campaigns for.
    pub set: Option<String>,
    /// Whether that set is the one of the configuration `status` was given
    /// (its per-election priorities are then named).
    pub set_known: bool,
    /// Whether it publishes a priority label: its app check passes, it
    /// sits out no election and it is not leaving.
    pub eligible: bool,
    /// Its priority (that of every election not listed below), if its
    /// label can be read.
    pub priority: Option<i64>,
    /// Its elections whose priority differs, by name (the set is known).
    pub priority_elections: BTreeMap<String, i64>,
    /// Its elections whose priority differs, by place in the sorted names
    /// of its set, from 0 (the set is not known).
    pub priority_indexes: BTreeMap<u32, i64>,
    /// What cannot be read: the record, or its priority label.
    pub problem: Option<String>,
    /// Milliseconds since the record's last write, by this host's clock.
    pub age_ms: Option<u64>,
    /// The record's lease, ms.
    pub lease_ms: Option<u64>,
}

impl MemberStatus {
    /// The row of the record under `key`, if it is a daemon's and held
    /// (a released one is a daemon that left).
    fn of(key: &str, record: &Record, known: &KnownSet, now_ms: u64) -> Option<MemberStatus> {
        let kind = if is_session_key(key) {
            "session"
        } else if is_member_key(key) {
            "member"
        } else {
            return None;
        };
        let owner = session_owner(key)
            .or_else(|| key.strip_prefix(MEMBER_PREFIX))
            .unwrap_or(key);
        let mut row = MemberStatus {
            identity: owner.to_owned(),
            record: key.to_owned(),
            kind,
            set: None,
            set_known: false,
            eligible: false,
            priority: None,
            priority_elections: BTreeMap::new(),
            priority_indexes: BTreeMap::new(),
            problem: None,
            age_ms: None,
            lease_ms: None,
        };
        match record {
            Record::Absent => return None,
            Record::Valid(l) => {
                row.identity = l.holder.clone()?;
                row.age_ms = Some(now_ms.saturating_sub(l.renewed_at_ms));
                row.lease_ms = Some(l.lease_ms);
                let published = Published::of(l);
                row.set_known = known.is(published.set.as_deref());
                row.eligible = published.priority != Label::Absent;
                match published.overrides(known) {
                    Some(Overrides::Named(named)) => row.priority_elections = named,
                    Some(Overrides::Indexed(indexed)) => row.priority_indexes = indexed,
                    None => {}
                }
                match published.priority {
                    Label::Readable(p) => row.priority = Some(p.default),
                    Label::Unreadable(problem) => row.problem = Some(problem),
                    Label::Absent => {}
                }
                row.set = published.set;
            }
            Record::Malformed(m) => row.problem = Some(format!("malformed record: {}", m.problem)),
            Record::UnknownFormat(u) => {
                row.problem = Some(format!(
                    "record of format {}; this leaderd knows {}",
                    u.format,
                    crate::lease::known_formats()
                ));
            }
        }
        Some(row)
    }
}

/// Every daemon's session and member record, sorted by identity; their
/// per-election priorities are named by `known`'s set.
pub async fn collect(
    store: &dyn LeaseStore,
    known: &KnownSet,
    budget: Duration,
) -> Result<Vec<MemberStatus>, StoreError> {
    let now_ms = clock::unix_ms();
    // One read of the items (no store lists the session records alone);
    // the elections' records are passed over.
    let mut rows: Vec<MemberStatus> = store
        .scan(budget)
        .await?
        .iter()
        .filter_map(|r| MemberStatus::of(r.key()?, r, known, now_ms))
        .collect();
    rows.sort_by(|a, b| (&a.identity, &a.record).cmp(&(&b.identity, &b.record)));
    Ok(rows)
}

/// The line below the table that explains a priority named by index.
const INDEX_NOTE: &str = "#N: the member's election at place N (from 0) of its sorted election names; pass its daemon's config file with --config to name them";

/// A member's priorities as text: `2`, `2; b=5, c=-1`, or by index
/// `2; #3=5`.
fn priorities_text(m: &MemberStatus) -> String {
    if let Some(problem) = &m.problem {
        return format!("unreadable ({problem})");
    }
    let Some(default) = m.priority else {
        return "-".to_owned();
    };
    let differing: Vec<String> = m
        .priority_elections
        .iter()
        .map(|(name, p)| format!("{name}={p}"))
        .chain(m.priority_indexes.iter().map(|(i, p)| format!("#{i}={p}")))
        .collect();
    match differing.is_empty() {
        true => default.to_string(),
        false => format!("{default}; {}", differing.join(", ")),
    }
}

/// Render as an aligned text table.
pub fn render_text(members: &[MemberStatus]) -> String {
    let mut lines = vec![
        [
            "IDENTITY", "RECORD", "SET", "ELIGIBLE", "AGE", "LEASE", "PRIORITY",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for m in members {
        let dash = || "-".to_owned();
        lines.push(vec![
            m.identity.clone(),
            m.kind.to_owned(),
            match (&m.set, m.set_known) {
                (Some(set), true) => format!("{set} (the config's)"),
                (Some(set), false) => set.chars().take(16).collect(),
                (None, _) => dash(),
            },
            match m.eligible {
                true => "yes".to_owned(),
                false => "no".to_owned(),
            },
            m.age_ms.map_or_else(dash, seconds),
            m.lease_ms.map_or_else(dash, seconds),
            priorities_text(m),
        ]);
    }
    let mut out = aligned(&lines);
    if members.is_empty() {
        out.push_str("(no session or member records in the store)\n");
    }
    if members.iter().any(|m| !m.priority_indexes.is_empty()) {
        out.push_str(INDEX_NOTE);
        out.push('\n');
    }
    out
}

/// Render as JSON (an array, one object per record).
pub fn render_json(members: &[MemberStatus]) -> String {
    serde_json::to_string_pretty(members).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::super::tests::publishing;
    use super::*;
    use crate::lease::memory::MemoryStore;
    use crate::lease::{Lease, Malformed, RvnGuard};

    /// A store of members, as `collect` reads them given the config of
    /// the set {a, b, c}; and that set's digest.
    async fn members() -> (Vec<MemberStatus>, String) {
        let store = MemoryStore::new();
        let ours = crate::balance::set_digest(["a", "b", "c"]);
        let put = |lease: Lease| store.set(&lease.election.clone(), Record::Valid(lease));
        put(publishing(
            "#session/web-1/n1",
            "web-1",
            &[("elections", &ours), ("priority", "2;2=-1")],
        ));
        // Of another set: its per-election priorities stay indexes.
        put(publishing(
            "#member/web-2",
            "web-2",
            &[("elections", "00000000000000aa"), ("priority", "1;0=3")],
        ));
        put(publishing(
            "#session/web-3/n3",
            "web-3",
            &[("elections", &ours)],
        ));
        put(publishing(
            "#session/web-4/n4",
            "web-4",
            &[("elections", &ours), ("priority", "1;x")],
        ));
        // Gone: an ended session, a given-up member record; and an
        // election, which is no member.
        let gone = |key: &str| Lease {
            holder: None,
            ..publishing(key, "web-9", &[("priority", "9")])
        };
        put(gone("#session/web-9/n9"));
        put(gone("#member/web-9"));
        put(Lease::stamped("a", "web-1", 3, 10_000, 1, None));
        store.set(
            "#session/web-0/n0",
            Record::Malformed(Malformed {
                election: "#session/web-0/n0".into(),
                problem: "attribute `rvn` is missing".into(),
                fingerprint: "x".into(),
                fencing_token: None,
                guard: RvnGuard::Missing,
            }),
        );
        let config = KnownSet::new(&["a", "b", "c"].map(String::from));
        let members = collect(&store, &config, Duration::from_secs(1))
            .await
            .unwrap();
        (members, ours)
    }

    #[tokio::test]
    async fn members_show_their_set_priorities_and_eligibility() {
        let (members, _) = members().await;
        let who: Vec<_> = members
            .iter()
            .map(|m| (m.identity.as_str(), m.kind, m.eligible, m.priority))
            .collect();
        assert_eq!(
            who,
            [
                ("web-0", "session", false, None),
                ("web-1", "session", true, Some(2)),
                ("web-2", "member", true, Some(1)),
                ("web-3", "session", false, None),
                ("web-4", "session", true, None),
            ]
        );
        assert_eq!(
            members[1].priority_elections,
            BTreeMap::from([("c".to_owned(), -1)])
        );
        assert!(members[1].set_known && !members[2].set_known);
        assert_eq!(members[2].priority_indexes, BTreeMap::from([(0, 3)]));
        assert_eq!(members[1].lease_ms, Some(10_000));
        assert!(members[1].age_ms.is_some_and(|a| a < 10_000));
    }

    #[tokio::test]
    async fn members_as_text_and_json() {
        let (members, ours) = members().await;
        let text = render_text(&members);
        let row = |identity: &str| {
            text.lines()
                .find(|l| l.starts_with(identity))
                .unwrap_or_else(|| panic!("no row {identity} in\n{text}"))
        };
        assert!(text.starts_with("IDENTITY"), "{text}");
        assert!(
            row("web-0").ends_with("unreadable (malformed record: attribute `rvn` is missing)"),
            "{text}"
        );
        assert!(
            row("web-1").contains(&format!("{ours} (the config's)")),
            "{text}"
        );
        assert!(row("web-1").ends_with("2; c=-1"), "{text}");
        assert!(row("web-2").ends_with("1; #0=3"), "{text}");
        assert!(
            row("web-3").contains(" no ") && row("web-3").ends_with('-'),
            "{text}"
        );
        assert!(
            row("web-4").ends_with("unreadable (priority label \"1;x\" cannot be read)"),
            "{text}"
        );
        assert!(text.ends_with(&format!("{INDEX_NOTE}\n")), "{text}");

        let json: serde_json::Value = serde_json::from_str(&render_json(&members)).unwrap();
        assert_eq!(json[1]["identity"], "web-1");
        assert_eq!(json[1]["record"], "#session/web-1/n1");
        assert_eq!(json[1]["set"], ours.as_str());
        assert_eq!(json[1]["set_known"], true);
        assert_eq!(json[1]["eligible"], true);
        assert_eq!(json[1]["priority"], 2);
        assert_eq!(json[1]["priority_elections"]["c"], -1);
        assert_eq!(json[2]["priority_indexes"]["0"], 3);
        assert_eq!(json[3]["eligible"], false);
        assert_eq!(json[3]["priority"], serde_json::Value::Null);
        assert_eq!(json[4]["problem"], "priority label \"1;x\" cannot be read");

        let none = render_text(&[]);
        assert!(none.contains("(no session or member records in the store)"));
    }
}
