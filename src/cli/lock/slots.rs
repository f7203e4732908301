//! Counting locks: `leaderd lock acquire|renew|release|status NAME
//! --slots N`. Up to N holders at once in one record
//! ([`crate::core::slots`] decides what each write is); every write is
//! conditional on the record's `rvn`, so a write that lost to another
//! holder's (they all write the one record) is read and tried again at
//! once: that is contention, not a full lock.
//!
//! The token a holder gets names its own slot (its fencing token, the
//! slot's renew marker, its identity), so it renews and releases that slot
//! only, and a stale one changes nothing (exit 77).

use std::time::Duration;

use serde::Serialize;

use super::{BUDGET, LockToken, lease_ms, not_ours, open, parse_token, unavailable};
use crate::cli::{
    LockAcquireArgs, LockReleaseArgs, LockRenewArgs, LockStatusArgs, ToolError, tool,
};
use crate::clock::{self, Clock, Instant};
use crate::core::slots::{self, Blocked, Conflict, Refusal, SlotWatch, Slots, Verdict};
use crate::exit;
use crate::lease::{Condition, Lease, LeaseStore, Record, Stamp, StoreError, WriteOutcome};
use crate::text;

/// How long a command keeps trying when every write it makes loses to
/// another holder's (with `--no-wait` too: a lock with a free slot is not
/// full just because others are writing it).
const CONTENTION: Duration = Duration::from_secs(10);

/// A pause of up to 20 ms before trying again after losing a write, so
/// that writers racing for the one record spread out.
fn jitter() -> Duration {
    Duration::from_micros(rand::random::<u64>() % 20_000)
}

/// The one-line error (64) of a record that is not a counting lock of
/// `limit` slots.
pub(super) fn conflict(name: &str, limit: Option<u32>, c: &Conflict) -> ToolError {
    let name = text::echo_plain(name);
    let message = match (c, limit) {
        (Conflict::Limit { theirs }, Some(mine)) => format!(
            "lock {name} is a counting lock of {theirs} slots, not {mine} (--slots {mine}); give --slots {theirs}, or wait until every slot is released to change it"
        ),
        (Conflict::Limit { theirs }, None) => {
            format!("lock {name} is a counting lock of {theirs} slots; give --slots {theirs}")
        }
        (Conflict::Plain { holder }, _) => format!(
            "lock {name} is a plain lock (held by {}), not a counting lock; use it without --slots",
            text::echo_plain(holder)
        ),
        (Conflict::Handed { successor }, _) => format!(
            "lock {name} is a plain lock (handed to {}), not a counting lock; use it without --slots",
            text::echo_plain(successor)
        ),
    };
    ToolError::new(exit::USAGE, message)
}

/// The counting lock's limit, when `record` is one: what keeps a plain
/// lock's command from it (`Some(Err)`: its table is unreadable).
pub(super) fn counting(record: &Record) -> Option<Result<u32, String>> {
    match record {
        Record::Valid(l) => Slots::of(l).map(|s| s.map(|s| s.limit)),
        _ => None,
    }
}

/// The error (64) of a plain lock's command on the counting lock `record`.
pub(super) fn plain_on_counting(name: &str, limit: Result<u32, String>) -> ToolError {
    match limit {
        Ok(theirs) => conflict(name, None, &Conflict::Limit { theirs }),
        Err(problem) => ToolError::new(
            exit::USAGE,
            format!(
                "lock {} is a counting lock (its holder table is unreadable: {problem}); give --slots N",
                text::echo_plain(name)
            ),
        ),
    }
}

/// What stands in the way, as one clause naming the lock.
fn blocked(name: &str, b: &Blocked) -> String {
    let name = text::echo_plain(name);
    match b {
        Blocked::Full(s) => format!(
            "lock {name}: all {} slots are held ({})",
            s.limit,
            s.holders
                .iter()
                .map(|h| format!(
                    "{} token {} lease {}",
                    text::echo_plain(&h.holder),
                    h.fencing_token,
                    text::duration(Duration::from_millis(h.lease_ms))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Blocked::Malformed(problem) => format!(
            "lock {name}: the record is malformed ({problem}); it is overwritten only once it stayed unchanged for a lease"
        ),
        Blocked::UnknownFormat(format) => {
            format!("lock {name} is held in {}", super::unknown_format(format))
        }
    }
}

/// How a round of `acquire` ended.
enum Round {
    /// The slot is ours: this is its token.
    Taken(LockToken),
    /// Nothing to wait for: exit with this.
    Final(ToolError),
    /// Not now: look again at `next`; `why` says what stood in the way.
    Again {
        next: Instant,
        why: String,
        kind: Again,
    },
}

/// Why a round did not take a slot.
enum Again {
    /// The store failed (its error).
    Failed(String),
    /// Every slot is held, or the record cannot be taken yet.
    Blocked,
    /// Another writer wrote first: read again at once.
    Contended,
}

/// One `acquire --slots`: what it wants, and its view of the holders.
struct SlotWaiter {
    name: String,
    identity: String,
    limit: u32,
    lease_ms: u64,
    retry: Duration,
    watch: SlotWatch,
    /// Whether the store passed its check (made again while it fails).
    checked: bool,
}

impl SlotWaiter {
    /// One round: read the record, and write what the rules allow.
    async fn round(&mut self, store: &dyn LeaseStore, clock: &Clock) -> Round {
        let name = text::echo_plain(&self.name);
        if !self.checked {
            match store.check(BUDGET).await {
                Ok(()) => self.checked = true,
                Err(e) => return self.failed("cannot check the store", e, clock),
            }
        }
        let record = match store.read(&self.name, BUDGET).await {
            Ok(r) => r,
            Err(e) => return self.failed(&format!("cannot read lock {name}"), e, clock),
        };
        let at = clock.now();
        let stamp = Stamp::now();
        let me = &self.identity;
        let verdict = (self.watch).acquire(
            &self.name,
            &record,
            me,
            self.limit,
            self.lease_ms,
            at,
            &stamp,
        );
        let (lease, condition, evicted) = match verdict {
            Verdict::Conflict(c) => {
                return Round::Final(conflict(&self.name, Some(self.limit), &c));
            }
            Verdict::Wait { until, blocked: b } => {
                return Round::Again {
                    next: until.min(at + self.retry),
                    why: blocked(&self.name, &b),
                    kind: Again::Blocked,
                };
            }
            Verdict::Take {
                lease,
                condition,
                evicted,
            } => (lease, condition, evicted),
        };
        match store.write(&lease, &condition, BUDGET).await {
            Ok(WriteOutcome::Applied) => {
                for h in evicted {
                    eprintln!(
                        "leaderd: lock {name}: the slot of {} (fencing token {}) was taken: it was not renewed for its lease of {}",
                        text::echo_plain(&h.holder),
                        h.fencing_token,
                        text::duration(Duration::from_millis(h.lease_ms))
                    );
                }
                Round::Taken(LockToken {
                    fencing_token: lease.fencing_token,
                    rvn: stamp.rvn(),
                    holder: self.identity.clone(),
                })
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => Round::Again {
                next: clock.now() + jitter(),
                why: format!("lock {name} kept changing while a slot was being taken"),
                kind: Again::Contended,
            },
            Err(e) => self.failed(&format!("cannot take a slot of lock {name}"), e, clock),
        }
    }

    /// A round whose request (`what`) failed with `e`: tried again after
    /// P, unless no retry can help (a table with the wrong key).
    fn failed(&self, what: &str, e: StoreError, clock: &Clock) -> Round {
        if matches!(e, StoreError::WrongSchema { .. }) {
            return Round::Final(unavailable(e));
        }
        Round::Again {
            next: clock.now() + self.retry,
            why: format!("{what}: {e}"),
            kind: Again::Failed(e.to_string()),
        }
    }
}

/// `leaderd lock acquire NAME --slots N`.
pub(super) async fn acquire(args: LockAcquireArgs, limit: u32) -> Result<(), ToolError> {
    let (cfg, store) = open(&args.store).await?;
    let clock = Clock::boot();
    let started = clock.now();
    // --no-wait: no waiting for a slot; --wait: until then; else for ever.
    let deadline = (args.no_wait)
        .then_some(started)
        .or_else(|| args.wait.map(|w| started + w));
    let mut waiter = SlotWaiter {
        name: args.name.clone(),
        identity: cfg.identity.clone(),
        limit,
        lease_ms: lease_ms(args.lease_duration),
        retry: cfg.retry_interval,
        watch: SlotWatch::new(cfg.max_clock_drift),
        checked: false,
    };
    // What a waiter says on stderr, each line once until it changes.
    let mut said: Option<String> = None;
    loop {
        let (next, why, kind) = match waiter.round(store.as_ref(), &clock).await {
            Round::Taken(token) => return hand_out(store.as_ref(), &args.name, limit, token).await,
            Round::Final(e) => return Err(e),
            Round::Again { next, why, kind } => (next, why, kind),
        };
        // Contention is no reason to give up, even with --no-wait, until
        // it has lasted a while.
        let give_up_at = match kind {
            Again::Contended => deadline.map(|d| d.max(started + CONTENTION)),
            _ => deadline,
        };
        if let Some(d) = give_up_at
            && next > d
        {
            let waited = (!args.no_wait).then(|| d.saturating_since(started));
            return Err(match kind {
                Again::Failed(e) => super::not_acquired(&args.name, waited, Some(e), None),
                _ => super::not_acquired(&args.name, waited, None, Some(why)),
            });
        }
        let line = match kind {
            Again::Failed(_) => Some(format!("{why}; retrying")),
            Again::Blocked => Some(format!("{why}; waiting")),
            Again::Contended => None,
        };
        if let Some(line) = line
            && !args.no_wait
            && said.as_ref() != Some(&line)
        {
            eprintln!("leaderd: {line}");
            said = Some(line);
        }
        clock.sleep_until(next).await;
    }
}

/// Print `token` on stdout. When that fails the slot is released again
/// at once (nobody could renew or release it), and the exit is 74.
async fn hand_out(
    store: &dyn LeaseStore,
    name: &str,
    limit: u32,
    token: LockToken,
) -> Result<(), ToolError> {
    let Err(e) = tool::print(&format!("{token}\n")) else {
        return Ok(());
    };
    let outcome = match change(store, name, limit, &token, None).await {
        Ok(_) => "released the slot again".to_owned(),
        Err(undo) if undo.code == exit::NOT_OURS => {
            "the slot changed hands meanwhile; nothing else was changed".to_owned()
        }
        Err(undo) => format!(
            "releasing the slot failed too ({}): it stays held for its lease unless released with token {token}",
            undo.message
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

/// Renew (`Some(lease_ms)`) or release (`None`) the token's slot: read,
/// write under the record's `rvn`, and read again when another holder
/// wrote first. Returns the renewed slot's new token.
async fn change(
    store: &dyn LeaseStore,
    name: &str,
    limit: u32,
    token: &LockToken,
    renew_ms: Option<u64>,
) -> Result<LockToken, ToolError> {
    let started = tokio::time::Instant::now();
    loop {
        let record = store.read(name, BUDGET).await.map_err(unavailable)?;
        let stamp = Stamp::now();
        let t = token;
        let planned = match renew_ms {
            Some(ms) => slots::renew(
                &record,
                limit,
                t.fencing_token,
                &t.rvn,
                &t.holder,
                ms,
                &stamp,
            ),
            None => slots::release(&record, limit, t.fencing_token, &t.rvn, &t.holder, &stamp),
        };
        let (lease, condition): (Lease, Condition) = match planned {
            Ok(w) => w,
            Err(Refusal::NotOurs(why)) => return Err(not_ours(name, why)),
            Err(Refusal::Conflict(c)) => return Err(conflict(name, Some(limit), &c)),
        };
        match store
            .write(&lease, &condition, BUDGET)
            .await
            .map_err(unavailable)?
        {
            WriteOutcome::Applied => {
                return Ok(LockToken {
                    fencing_token: token.fencing_token,
                    rvn: stamp.rvn(),
                    holder: token.holder.clone(),
                });
            }
            WriteOutcome::ConditionFailed { .. } if started.elapsed() < CONTENTION => {
                tokio::time::sleep(jitter()).await;
            }
            WriteOutcome::ConditionFailed { .. } => {
                return Err(unavailable(format!(
                    "lock {}: every write for {} lost to another holder's; nothing was changed",
                    text::echo_plain(name),
                    text::duration(CONTENTION)
                )));
            }
        }
    }
}

/// `leaderd lock renew NAME TOKEN --slots N`.
pub(super) async fn renew(args: LockRenewArgs, limit: u32) -> Result<(), ToolError> {
    let token = parse_token(&args.token)?;
    let (_, store) = open(&args.store).await?;
    tool::check_store(store.as_ref()).await?;
    let ms = lease_ms(args.lease_duration);
    let renewed = change(store.as_ref(), &args.name, limit, &token, Some(ms)).await?;
    // The old token is stale now: if the new one cannot be delivered,
    // nobody could renew or release the slot, so `hand_out` releases it.
    hand_out(store.as_ref(), &args.name, limit, renewed).await
}

/// `leaderd lock release NAME TOKEN --slots N`.
pub(super) async fn release(args: LockReleaseArgs, limit: u32) -> Result<(), ToolError> {
    let token = parse_token(&args.token)?;
    let (_, store) = open(&args.store).await?;
    tool::check_store(store.as_ref()).await?;
    change(store.as_ref(), &args.name, limit, &token, None)
        .await
        .map(|_| ())
}

/// One holder as `lock status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct HolderStatus {
    holder: String,
    fencing_token: u64,
    lease_ms: u64,
    acquired_at_ms: u64,
    renewed_at_ms: u64,
    /// Since its last renew, by this host's wall clock (for humans).
    age_ms: u64,
    /// Its lease left, by this host's wall clock (for humans; a waiter
    /// times it on its own clock from when it first saw the renew).
    remaining_ms: u64,
}

/// A counting lock as `lock status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct SlotsStatus {
    lock: String,
    slots: u32,
    /// The highest fencing token given so far.
    fencing_token: Option<u64>,
    holders: Vec<HolderStatus>,
}

/// `leaderd lock status NAME` of a counting lock, or with `--slots N`:
/// every holder and its remaining lease. `Ok(false)`: not a counting lock
/// and no `--slots`: shown as any lock.
pub(super) async fn status(args: &LockStatusArgs) -> Result<bool, ToolError> {
    let cfg = tool::config(&args.store)?;
    let store = crate::lease::open_to_read(&cfg.store.spec())
        .await
        .map_err(|e| ToolError::new(exit::UNAVAILABLE, e))?;
    tool::check_store(store.as_ref()).await?;
    let record = store
        .read(&args.name, BUDGET)
        .await
        .map_err(|e| ToolError::new(exit::UNAVAILABLE, e.to_string()))?;
    let now_ms = clock::unix_ms();
    let Some((slots, counter)) = table_of(&args.name, &record, args.slots)? else {
        return Ok(false);
    };
    let shown = SlotsStatus {
        lock: args.name.clone(),
        slots: slots.limit,
        fencing_token: counter,
        holders: slots
            .holders
            .iter()
            .map(|h| {
                let age_ms = now_ms.saturating_sub(h.renewed_at_ms);
                HolderStatus {
                    holder: h.holder.clone(),
                    fencing_token: h.fencing_token,
                    lease_ms: h.lease_ms,
                    acquired_at_ms: h.acquired_at_ms,
                    renewed_at_ms: h.renewed_at_ms,
                    age_ms,
                    remaining_ms: h.lease_ms.saturating_sub(age_ms),
                }
            })
            .collect(),
    };
    let text = if args.json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&shown)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        )
    } else {
        render(&shown)
    };
    tool::print(&text).map_err(|e| {
        ToolError::new(
            exit::IOERR,
            format!("cannot write the status to stdout: {e}"),
        )
    })?;
    Ok(true)
}

/// The holder table `lock status` shows of `record`, and the highest
/// token given: `None` for a lock that is no counting lock, when no N was
/// given (shown as any lock); an error (64) when it is not one of N slots.
fn table_of(
    name: &str,
    record: &Record,
    limit: Option<u32>,
) -> Result<Option<(Slots, Option<u64>)>, ToolError> {
    let empty = |n: u32| Slots {
        limit: n,
        holders: Vec::new(),
    };
    let (slots, counter) = match (record, limit) {
        (Record::Valid(l), _) => match (Slots::of(l), limit) {
            (Some(Ok(s)), _) => (s, Some(l.fencing_token)),
            // Unreadable: shown as the record it reads as.
            (Some(Err(_)), _) => return Ok(None),
            (None, None) => return Ok(None),
            (None, Some(_)) if l.holder.is_some() => {
                let c = Conflict::Plain {
                    holder: l.holder.clone().unwrap_or_default(),
                };
                return Err(conflict(name, limit, &c));
            }
            (None, Some(n)) => (empty(n), Some(l.fencing_token)),
        },
        (Record::Absent, Some(n)) => (empty(n), None),
        _ => return Ok(None),
    };
    if let Some(mine) = limit
        && mine != slots.limit
    {
        let c = Conflict::Limit {
            theirs: slots.limit,
        };
        return Err(conflict(name, Some(mine), &c));
    }
    Ok(Some((slots, counter)))
}

fn render(s: &SlotsStatus) -> String {
    let secs = crate::cli::tool::seconds;
    let mut out = format!(
        "lock {}: {} of {} slots held\n",
        text::echo_plain(&s.lock),
        s.holders.len(),
        s.slots
    );
    let mut lines = vec![
        ["HOLDER", "FENCING_TOKEN", "AGE", "LEASE", "REMAINING"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for h in &s.holders {
        lines.push(vec![
            text::echo_plain(&h.holder),
            h.fencing_token.to_string(),
            secs(h.age_ms),
            secs(h.lease_ms),
            secs(h.remaining_ms),
        ]);
    }
    out.push_str(&crate::cli::tool::aligned(&lines));
    out
}
