//! `leaderd lock acquire|renew|release|status`: a lock that outlives one
//! command, for the steps of a pipeline or a person running a deployment by
//! hand.
//!
//! A lock is an election's record like any other, so a lock taken here keeps
//! `leaderd run` from leading the same name and the reverse. Waiting follows
//! the daemon's rule ([`Lease::free_for`]): a released record is taken at
//! once, unless a daemon's resign handed it to someone else (`successor`),
//! who alone may take it at once; a held or handed record is taken over only
//! as the takeover rule allows ([`election::TakeoverTimer`], on this
//! process's own clock), with a write conditional on that `rvn`. A record a
//! daemon holds through its session is timed by that session's `rvn`, and
//! the session is ended before the lock is taken
//! ([`crate::core::session::judge_session`], the daemon's rule). No wall
//! clock is compared.
//!
//! The token printed by `acquire` and `renew` names the write it came from
//! (fencing token, `rvn`, holder). `renew` and `release` write only under the
//! condition that the record is still that write of that holder, so a stale
//! token can never renew or release someone else's lock.
//!
//! Every command checks the store before it reads, as `leaderd run` does: a
//! table with another key is exit 69 at once (`acquire` retries any other
//! failure of the check, as it retries the store's errors).
//!
//! With `--slots N` the lock is a counting lock, up to N holders at once:
//! `slots.rs`. A plain lock's command never writes over a counting lock's
//! record, nor the reverse: each is a usage error (64) naming the other.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::status::session_lease_ms;
use super::tool::{self, check_name};
use super::{
    LockAcquireArgs, LockReleaseArgs, LockRenewArgs, LockStatusArgs, StatusArgs, ToolError,
};
use crate::clock::{self, Clock, Instant};
use crate::config::LockConfig;
use crate::election;
use crate::exit;
use crate::lease::{self, Condition, Lease, LeaseStore, Record, StoreError, WriteOutcome};
use crate::text;

mod slots;

/// Longest one store request may take.
const BUDGET: Duration = Duration::from_secs(10);

/// What `acquire` prints and `renew` and `release` take: opaque to users,
/// `<fencing token>.<rvn>.<holder in hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockToken {
    /// The lock's fencing token (rises with every new holder).
    pub fencing_token: u64,
    /// The `rvn` of the write that produced this token.
    pub rvn: String,
    /// Who holds the lock.
    pub holder: String,
}

impl fmt::Display for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}",
            self.fencing_token,
            self.rvn,
            text::hex(self.holder.as_bytes())
        )
    }
}

impl std::str::FromStr for LockToken {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{} is not a lock token (what `leaderd lock acquire` printed)",
                text::echo(s)
            )
        };
        let mut parts = s.trim().split('.');
        let (Some(token), Some(rvn), Some(holder), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let fencing_token = token.parse().map_err(|_| bad())?;
        if rvn.is_empty() || !rvn.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad());
        }
        let holder = text::unhex(holder)
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|h| !h.is_empty())
            .ok_or_else(bad)?;
        Ok(LockToken {
            fencing_token,
            rvn: rvn.to_owned(),
            holder,
        })
    }
}

fn token_of(lease: &Lease) -> LockToken {
    LockToken {
        fencing_token: lease.fencing_token,
        rvn: lease.rvn.clone(),
        holder: lease.holder.clone().unwrap_or_default(),
    }
}

fn unavailable(e: impl fmt::Display) -> ToolError {
    ToolError::new(exit::UNAVAILABLE, e.to_string())
}

fn not_ours(name: &str, why: impl fmt::Display) -> ToolError {
    ToolError::new(
        exit::NOT_OURS,
        format!(
            "lock {}: {why}; nothing was changed",
            text::echo_plain(name)
        ),
    )
}

async fn open(store: &super::StoreArgs) -> Result<(LockConfig, Arc<dyn LeaseStore>), ToolError> {
    let cfg = LockConfig::load(store).map_err(|e| ToolError::new(e.exit_code(), e.to_string()))?;
    for w in &cfg.warnings {
        eprintln!("leaderd: warning: {w}");
    }
    let store = lease::open(&cfg.store.spec()).await.map_err(unavailable)?;
    Ok((cfg, store))
}

fn lease_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What keeps `identity` from taking the lock at once, as one clause naming
/// the lock: who holds it (and its lease: for a record held through a
/// session, the session's, from `session`, its record as read), whom it was
/// handed to, or that its record is malformed or of a format this build
/// does not know. `None` when nothing does.
fn obstacle(
    name: &str,
    identity: &str,
    record: &Record,
    session: Option<&Record>,
) -> Option<String> {
    let name = text::echo_plain(name);
    match record {
        Record::Valid(l) if l.free_for(identity) => None,
        Record::Valid(l) => Some(match (&l.holder, &l.successor) {
            (Some(h), _) => format!(
                "lock {name} is held by {} (fencing token {}, {})",
                text::echo_plain(h),
                l.fencing_token,
                match (&l.session, session.and_then(session_lease_ms)) {
                    (None, _) => format!(
                        "lease {}",
                        text::duration(Duration::from_millis(l.lease_ms))
                    ),
                    (Some(_), Some(ms)) =>
                        format!("lease {}", text::duration(Duration::from_millis(ms))),
                    (Some(_), None) => "its session's lease unknown".to_owned(),
                }
            ),
            // Not free for us, not held: handed to someone else.
            (None, s) => format!(
                "lock {name} was handed to {} (fencing token {}); anyone else waits one lease of {}",
                text::echo_plain(s.as_deref().unwrap_or_default()),
                l.fencing_token,
                text::duration(Duration::from_millis(l.lease_ms))
            ),
        }),
        Record::Malformed(m) => Some(format!(
            "lock {name}: the record is malformed ({}); it is overwritten only once it stayed unchanged for a lease",
            m.problem
        )),
        Record::UnknownFormat(u) => Some(format!(
            "lock {name} is held{} in {}",
            u.holder
                .as_deref()
                .map_or_else(String::new, |h| format!(" by {}", text::echo_plain(h))),
            unknown_format(&u.format)
        )),
        Record::Absent => None,
    }
}

/// What a round of `acquire` does next.
#[allow(clippy::large_enum_variant)] // one per round, at most one a second
enum Plan {
    /// Write this, under this condition.
    Write(Lease, Condition),
    /// Look again then.
    Wait(Instant),
    /// The record is held through the session `key` (a daemon's): read it.
    Session { key: String, election: Lease },
    /// That session timed out: end it with this write, then take the lock.
    EndThenTake {
        ended: Lease,
        condition: Condition,
        election: Lease,
    },
}

/// How a round of `acquire` ended.
enum Round {
    /// The lock is ours: this write applied.
    Taken(Lease),
    /// The store can never hold the lock: its table has another key.
    Unusable(StoreError),
    /// The lock is a counting lock: not one for this command (64).
    Counting(ToolError),
    /// Not now: look again at `next`; `failed`: what failed and the
    /// store's error, if that was why; `blocked`: what stands in the way,
    /// if anything, and whether it is waited on (said on stderr).
    Again {
        next: Instant,
        failed: Option<(String, String)>,
        blocked: Option<String>,
        waiting: bool,
    },
}

/// The write that would take the lock now, if any, by the daemon's rules:
/// a held or handed record is timed by its `rvn`, one held through a
/// daemon's session by that session's ([`crate::core::session::judge_session`]).
struct Waiter {
    name: String,
    identity: String,
    lease_ms: u64,
    /// Times the held record's (or its session's) `rvn`.
    takeover: election::TakeoverTimer,
    /// Whether the store passed its check ([`LeaseStore::check`]), which
    /// the first round makes before it reads, as every tool does; it is
    /// made again while it fails, as any store error is retried, but a
    /// table with the wrong key is final.
    checked: bool,
}

impl Waiter {
    /// Our record with fencing token `token`, taken now.
    fn take(&self, token: u64) -> Lease {
        let now = clock::unix_ms();
        Lease::stamped(&self.name, &self.identity, token, self.lease_ms, now, None)
    }

    /// What to do about `record`, read at `at` (the answer's arrival).
    fn plan(&mut self, record: &Record, at: Instant) -> Plan {
        let (key, lease_ms, previous_token, cond) = match record {
            Record::Absent => {
                return Plan::Write(self.take(clock::unix_ms()), Condition::NotExists);
            }
            // The daemon's rule: released to anyone or to us. A record
            // handed to someone else is waited on like a held one.
            Record::Valid(l) if l.free_for(&self.identity) => {
                let cond = Condition::RvnIs(l.rvn.clone());
                return Plan::Write(self.take(l.fencing_token + 1), cond);
            }
            // Renewed through its session: its own rvn says nothing.
            Record::Valid(l) if l.holder.is_some() && l.session.is_some() => {
                return Plan::Session {
                    key: l.session.clone().unwrap_or_default(),
                    election: l.clone(),
                };
            }
            Record::Valid(l) => (
                l.rvn.clone(),
                l.lease_ms,
                Some(l.fencing_token),
                Condition::RvnIs(l.rvn.clone()),
            ),
            Record::Malformed(m) => (
                format!("malformed:{}", m.fingerprint),
                self.lease_ms,
                m.fencing_token,
                Condition::Unchanged(m.guard.clone()),
            ),
            // Held by someone this build cannot time: never taken, however
            // long it stays; looked at again as a live holder's lock is.
            Record::UnknownFormat(_) => {
                self.takeover.forget();
                return Plan::Wait(at + Duration::from_millis(self.lease_ms));
            }
        };
        let due = self.takeover.observe(&key, lease_ms, at, None);
        if at < due {
            return Plan::Wait(due);
        }
        let token = previous_token.map_or_else(clock::unix_ms, |t| t + 1);
        Plan::Write(self.take(token), cond)
    }

    /// What to do about `election`, held through the session `key` whose
    /// record reads `session` at `at`.
    fn session_plan(&mut self, election: Lease, key: &str, session: &Record, at: Instant) -> Plan {
        use crate::core::session::SessionVerdict as V;
        let stamp = lease::Stamp::now();
        let take = |w: &Self| {
            Plan::Write(
                w.take(election.fencing_token + 1),
                Condition::RvnIs(election.rvn.clone()),
            )
        };
        match crate::core::session::judge_session(
            &mut self.takeover,
            key,
            session,
            at,
            None,
            self.lease_ms,
            &stamp,
        ) {
            V::Ended | V::TimedOut => take(self),
            V::WaitUntil(due) => Plan::Wait(due),
            V::Unknown => Plan::Wait(at + Duration::from_millis(self.lease_ms)),
            V::End { ended, condition } => Plan::EndThenTake {
                ended,
                condition,
                election,
            },
        }
    }

    /// One round: read the record (and the session it is held through),
    /// and write what the rules allow.
    async fn round(&mut self, store: &dyn LeaseStore, clock: &Clock, retry: Duration) -> Round {
        let name = text::echo_plain(&self.name);
        let changed = |next: Instant| Round::Again {
            next,
            failed: None,
            blocked: Some(format!("lock {name} changed while it was being taken")),
            waiting: false,
        };
        if !self.checked {
            match store.check(BUDGET).await {
                Ok(()) => self.checked = true,
                Err(e) => return failed("cannot check the store", e, clock.now() + retry),
            }
        }
        let record = match store.read(&self.name, BUDGET).await {
            Ok(r) => r,
            Err(e) => return failed(&format!("cannot read lock {name}"), e, clock.now() + retry),
        };
        if let Some(limit) = slots::counting(&record) {
            return Round::Counting(slots::plain_on_counting(&self.name, limit));
        }
        let at = clock.now();
        // The session the record is held through, if it is: read each
        // round to time it, and what the waiter says of its lease.
        let mut session = None;
        let plan = match self.plan(&record, at) {
            Plan::Session { key, election } => match store.read(&key, BUDGET).await {
                Ok(read) => {
                    let plan = self.session_plan(election, &key, &read, clock.now());
                    session = Some(read);
                    plan
                }
                Err(e) => {
                    let what = format!("cannot read the session lock {name} is held through");
                    return failed(&what, e, clock.now() + retry);
                }
            },
            other => other,
        };
        let (lease, cond) = match plan {
            Plan::Write(lease, cond) => (lease, cond),
            Plan::EndThenTake {
                ended,
                condition,
                election,
            } => match store.write(&ended, &condition, BUDGET).await {
                Ok(WriteOutcome::Applied) => (
                    self.take(election.fencing_token + 1),
                    Condition::RvnIs(election.rvn),
                ),
                // Renewed meanwhile, or ended by someone else: look again.
                Ok(WriteOutcome::ConditionFailed { .. }) => return changed(clock.now()),
                Err(e) => {
                    let what = format!("cannot end the session lock {name} was held through");
                    return failed(&what, e, clock.now() + retry);
                }
            },
            Plan::Wait(due) => {
                return Round::Again {
                    next: due.min(at + retry),
                    failed: None,
                    blocked: obstacle(&self.name, &self.identity, &record, session.as_ref()),
                    waiting: true,
                };
            }
            Plan::Session { .. } => unreachable!("resolved above"),
        };
        match store.write(&lease, &cond, BUDGET).await {
            Ok(WriteOutcome::Applied) => Round::Taken(lease),
            // Someone else wrote first: look again at once.
            Ok(WriteOutcome::ConditionFailed { .. }) => changed(clock.now()),
            Err(e) => failed(&format!("cannot take lock {name}"), e, clock.now() + retry),
        }
    }
}

/// A round whose request (`what`) failed with `e`: tried again at `next`,
/// unless no retry can help.
fn failed(what: &str, e: StoreError, next: Instant) -> Round {
    match e {
        StoreError::WrongSchema { .. } => Round::Unusable(e),
        e => Round::Again {
            next,
            failed: Some((what.to_owned(), e.to_string())),
            blocked: None,
            waiting: false,
        },
    }
}

/// Why `name` was not acquired (75): the store's error, or what stood in
/// the way; `waited`: how long it waited, unless it was not to wait.
fn not_acquired(
    name: &str,
    waited: Option<Duration>,
    failed: Option<String>,
    blocked: Option<String>,
) -> ToolError {
    let waited = waited.map_or_else(String::new, |w| format!(" within {}", text::duration(w)));
    let name = text::echo_plain(name);
    let message = match (failed, blocked) {
        (Some(e), _) => format!("lock {name} not acquired{waited}: the store failed: {e}"),
        (None, Some(b)) => format!("{b}; not acquired{waited}"),
        (None, None) => format!("lock {name} not acquired{waited}"),
    };
    ToolError::new(exit::TEMPFAIL, message)
}

/// `leaderd lock acquire NAME`.
pub async fn acquire(args: LockAcquireArgs) -> Result<(), ToolError> {
    check_name(&args.name)?;
    if let Some(limit) = args.slots {
        return slots::acquire(args, limit).await;
    }
    let (cfg, store) = open(&args.store).await?;
    let clock = Clock::boot();
    let started = clock.now();
    // --no-wait: one round; --wait: until then; else for ever.
    let deadline = (args.no_wait)
        .then_some(started)
        .or_else(|| args.wait.map(|w| started + w));
    let mut waiter = Waiter {
        name: args.name.clone(),
        identity: cfg.identity.clone(),
        lease_ms: lease_ms(args.lease_duration),
        takeover: election::TakeoverTimer::new(cfg.max_clock_drift),
        checked: false,
    };
    // What a waiter says on stderr, each line once until it changes. With
    // --no-wait nothing is waited for: the final error says why.
    let mut said: Option<String> = None;
    loop {
        let (next, failed, blocked, waiting) = match waiter
            .round(store.as_ref(), &clock, cfg.retry_interval)
            .await
        {
            Round::Taken(lease) => return hand_out(store.as_ref(), &args.name, &lease).await,
            Round::Unusable(e) => return Err(unavailable(e)),
            Round::Counting(e) => return Err(e),
            Round::Again {
                next,
                failed,
                blocked,
                waiting,
            } => (next, failed, blocked, waiting),
        };
        let line = match (&failed, &blocked) {
            (Some((what, e)), _) => Some(format!("{what}: {e}; retrying")),
            (None, Some(b)) if waiting => Some(format!("{b}; waiting")),
            _ => None,
        };
        if let Some(line) = line
            && !args.no_wait
            && said.as_ref() != Some(&line)
        {
            eprintln!("leaderd: {line}");
            said = Some(line);
        }
        if let Some(d) = deadline
            && next > d
        {
            let waited = (!args.no_wait).then(|| d.saturating_since(started));
            let failed = failed.map(|(_, e)| e);
            return Err(not_acquired(&args.name, waited, failed, blocked));
        }
        clock.sleep_until(next).await;
    }
}

/// The record, if it is still the write `token` names (never a counting
/// lock's: its newest holder's token can name the record's last write).
async fn ours(store: &dyn LeaseStore, name: &str, token: &LockToken) -> Result<Lease, ToolError> {
    let record = store.read(name, BUDGET).await.map_err(unavailable)?;
    if let Some(limit) = slots::counting(&record) {
        return Err(slots::plain_on_counting(name, limit));
    }
    match record {
        Record::Valid(l)
            if l.holder.as_deref() == Some(token.holder.as_str())
                && l.rvn == token.rvn
                && l.fencing_token == token.fencing_token =>
        {
            Ok(l)
        }
        Record::Absent => Err(not_ours(name, "there is no such lock")),
        Record::Valid(l) => Err(not_ours(
            name,
            match l.holder {
                Some(h) if l.fencing_token != token.fencing_token || h != token.holder => format!(
                    "it is held by {} now (fencing token {})",
                    text::echo_plain(&h),
                    l.fencing_token
                ),
                Some(_) => {
                    "it was written since this token (a newer token of the same holder exists)"
                        .into()
                }
                None => "it was released".into(),
            },
        )),
        Record::Malformed(m) => Err(not_ours(
            name,
            format!("the record is malformed ({})", m.problem),
        )),
        Record::UnknownFormat(u) => Err(not_ours(
            name,
            format!("it is {}", unknown_format(&u.format)),
        )),
    }
}

/// A record of format `format`, and why it is left alone.
fn unknown_format(format: &str) -> String {
    format!(
        "a record of format {format}, which this leaderd does not know (it knows formats {}) and never writes: upgrade leaderd",
        crate::lease::known_formats()
    )
}

/// Write `next` under "still the write `token` names".
async fn write_ours(
    store: &dyn LeaseStore,
    name: &str,
    next: &Lease,
    token: &LockToken,
) -> Result<(), ToolError> {
    let cond = Condition::HeldBy {
        rvn: token.rvn.clone(),
        holder: token.holder.clone(),
    };
    match store
        .write(next, &cond, BUDGET)
        .await
        .map_err(unavailable)?
    {
        WriteOutcome::Applied => Ok(()),
        WriteOutcome::ConditionFailed { .. } => {
            Err(not_ours(name, "it changed hands while being written"))
        }
    }
}

/// Print `lease`'s token on stdout, the one way its holder learns it. When
/// that fails (a full disk, a closed pipe) the lock is released again at
/// once: a token nobody has must not keep the lock held for its lease, and
/// nobody could renew or release it. Exits [`exit::IOERR`] then.
async fn hand_out(store: &dyn LeaseStore, name: &str, lease: &Lease) -> Result<(), ToolError> {
    let token = token_of(lease);
    let Err(e) = tool::print(&format!("{token}\n")) else {
        return Ok(());
    };
    let undo = Condition::HeldBy {
        rvn: token.rvn.clone(),
        holder: token.holder.clone(),
    };
    let outcome = match store.write(&lease.released(), &undo, BUDGET).await {
        Ok(WriteOutcome::Applied) => "released the lock again".to_owned(),
        // Taken over already (a lease shorter than the store's answer): not
        // ours to release any more.
        Ok(WriteOutcome::ConditionFailed { .. }) => {
            "the lock changed hands meanwhile; nothing else was changed".to_owned()
        }
        // The token goes to stderr, the one place left to tell it.
        Err(release_error) => format!(
            "releasing the lock failed too ({release_error}): it stays held for its lease of {} unless released with token {token}",
            text::duration(Duration::from_millis(lease.lease_ms))
        ),
    };
    Err(ToolError::new(
        exit::IOERR,
        format!(
            "lock {}: cannot write the token to stdout ({e}); {outcome}",
            text::echo_plain(name)
        ),
    ))
}

/// `leaderd lock renew NAME TOKEN`.
pub async fn renew(args: LockRenewArgs) -> Result<(), ToolError> {
    check_name(&args.name)?;
    if let Some(limit) = args.slots {
        return slots::renew(args, limit).await;
    }
    let token = parse_token(&args.token)?;
    let (_, store) = open(&args.store).await?;
    tool::check_store(store.as_ref()).await?;
    let current = ours(store.as_ref(), &args.name, &token).await?;
    let next = Lease::stamped(
        &args.name,
        &token.holder,
        token.fencing_token,
        lease_ms(args.lease_duration),
        current.acquired_at_ms,
        None,
    );
    write_ours(store.as_ref(), &args.name, &next, &token).await?;
    // The old token is stale now: if the new one cannot be delivered,
    // nobody could renew or release the lock, so `hand_out` releases it.
    hand_out(store.as_ref(), &args.name, &next).await
}

/// `leaderd lock release NAME TOKEN`.
pub async fn release(args: LockReleaseArgs) -> Result<(), ToolError> {
    check_name(&args.name)?;
    if let Some(limit) = args.slots {
        return slots::release(args, limit).await;
    }
    let token = parse_token(&args.token)?;
    let (_, store) = open(&args.store).await?;
    tool::check_store(store.as_ref()).await?;
    let current = ours(store.as_ref(), &args.name, &token).await?;
    write_ours(store.as_ref(), &args.name, &current.released(), &token).await
}

/// `leaderd lock status NAME`: `leaderd status NAME`, but a counting
/// lock's holders are listed, each with its remaining lease.
pub async fn status(args: LockStatusArgs) -> Result<(), ToolError> {
    check_name(&args.name)?;
    if slots::status(&args).await? {
        return Ok(());
    }
    super::status::run(StatusArgs {
        store: args.store,
        elections: vec![args.name],
        members: false,
        json: args.json,
    })
    .await
}

fn parse_token(s: &str) -> Result<LockToken, ToolError> {
    s.parse().map_err(|e| ToolError::new(exit::USAGE, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::new_rvn;

    #[test]
    fn a_token_round_trips_and_rejects_what_it_did_not_print() {
        let t = LockToken {
            fencing_token: 42,
            rvn: new_rvn(),
            holder: "ci-runner 7".into(),
        };
        assert_eq!(t.to_string().parse::<LockToken>(), Ok(t.clone()));
        for bad in [
            "",
            "42",
            "x.abc.6869",
            "42..6869",
            "42.abc.686",
            "42.abc.zz",
            "42.abc.6869.1",
            "42.a-b.6869",
        ] {
            assert!(bad.parse::<LockToken>().is_err(), "{bad:?} accepted");
        }
    }
}
