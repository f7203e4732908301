//! A daemon's session: one record whose renewals keep every election held
//! through it, so that a daemon leading a thousand elections writes one
//! record every R instead of a thousand. Pure, like the election core: a
//! [`Tick`] and what happened in, [`Action`]s out.
//!
//! The rules (instants on the boot-time clock):
//! - each process opens its own session under a key no other process
//!   uses (`#session/IDENTITY/NONCE`, a fresh nonce per opening): a
//!   restarted process never inherits the old one, and the key is never
//!   created twice (a create whose answer was lost is not retried under
//!   the same key);
//! - the session is written like a self-leased record: renewed every R
//!   under `HeldBy` its last `rvn`, retried every P; it is valid until the
//!   send instant of its last successful write + L·(1−D) − M, and so is
//!   every tenure held through it ([`SessionView`]);
//! - a follower that has timed the session's `rvn` by the takeover rule
//!   ends it (a write that clears its holder, conditional on that `rvn`)
//!   before it takes any election held through it: a renew of the owner
//!   that was still on its way then fails instead of stretching the
//!   tenures of elections taken from under it;
//! - a renew that finds the session ended, deleted or rewritten loses it
//!   (and with it every tenure); the daemon opens a new one at once;
//! - the record's `fencing_token` is the daemon's count of ended tenures
//!   (released, handed over, or stopped), carried by the session's next
//!   write: it moves after every tenure held through the session ends
//!   (never before that tenure's last write). A follower that finds it
//!   moved reads the elections it follows through the session once more,
//!   so that a release its owner's stream left out (a forged stream at
//!   the owner's address) is found within a read of the session;
//! - a session is open only while it is wanted: while an election holds a
//!   tenure through it or is about to take one, or always for balance (the
//!   session is then the member record). Once nothing wanted it for a
//!   whole lease, the daemon ends it (as at shutdown) and writes nothing
//!   until it is wanted again, when it opens a new one: a daemon that
//!   only follows costs reads, not a write every R.
//!
//! Its rules are tested one input at a time in `tests`
//! (`session/tests.rs`).

use std::sync::Arc;

use super::election::{Action, Backoff, ElectionConfig, Note, Tick, WriteOp};
use super::takeover::TakeoverTimer;
use crate::core::keys::session_key;
use crate::core::record::{Condition, HolderMeta, Lease, Record, Stamp, WriteOutcome};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

/// What a taker may do about an election held through a session, judged
/// from that session's record as read now.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per judgement, used at once
pub enum SessionVerdict {
    /// The session was ended: every election held through it is free.
    Ended,
    /// Not timed out yet: look again then.
    WaitUntil(Instant),
    /// A live session timed out: end it with this write first, then take
    /// the election (a renew of its owner still on its way then fails
    /// instead of stretching the tenure).
    End {
        /// The session record ended (no holder).
        ended: Lease,
        /// Conditional on the `rvn` that was timed.
        condition: Condition,
    },
    /// Missing or unreadable for a whole wait: nothing to end; the
    /// election may be taken.
    TimedOut,
    /// Of a format this build does not know: its elections are never taken.
    Unknown,
}

/// The rule for an election held through the session `key`, whose record
/// reads `record` at `at` (the answer's arrival; `learned`: an earlier
/// instant this taker knew the record's `rvn`, if any), the one place it
/// is written (the election core and `leaderd lock` follow it): an ended
/// session frees the election; a live one is timed by its `rvn` with
/// `timer` (the takeover rule), a missing or malformed one like a missing
/// or malformed record (with `default_lease_ms`), and once the wait is
/// over a live one must be ended before the election is taken. `stamp` is
/// what that end write carries.
pub fn judge_session(
    timer: &mut TakeoverTimer,
    key: &str,
    record: &Record,
    at: Instant,
    learned: Option<Instant>,
    default_lease_ms: u64,
    stamp: &Stamp,
) -> SessionVerdict {
    let (timed, lease_ms) = match record {
        Record::Valid(s) if s.holder.is_none() => return SessionVerdict::Ended,
        Record::Valid(s) => ([key, "@", s.rvn.as_str()], s.lease_ms),
        Record::Absent => ([key, "@missing", ""], default_lease_ms),
        Record::Malformed(m) => (
            [key, "@malformed:", m.fingerprint.as_str()],
            default_lease_ms,
        ),
        Record::UnknownFormat(_) => return SessionVerdict::Unknown,
    };
    // Only a live record's rvn can have been learned before.
    let learned = learned.filter(|_| matches!(record, Record::Valid(_)));
    let due = timer.observe_joined(&timed, lease_ms, at, learned);
    if due > at {
        return SessionVerdict::WaitUntil(due);
    }
    match record {
        Record::Valid(s) => SessionVerdict::End {
            ended: s.handed_to_with(None, stamp),
            condition: Condition::RvnIs(s.rvn.clone()),
        },
        _ => SessionVerdict::TimedOut,
    }
}

/// The daemon's own session as the elections held through it see it:
/// open, and the send instant of its last write known to have applied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionView {
    /// The session record's key.
    pub key: String,
    /// The record version of its last successful write.
    pub rvn: String,
    /// When its last successful write was sent: every tenure held through
    /// it is valid until this + L·(1−D) − M.
    pub last_send: Instant,
    /// The labels that write carried (see [`SessionInput::Labels`]);
    /// shared, as every election held through the session keeps the view.
    pub labels: std::sync::Arc<std::collections::BTreeMap<String, String>>,
}

/// When the daemon's stream of the session's owner tells of its writes:
/// a follower that read an election while this flow ran learns of its
/// release from the stream, and reads the session only to time it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The first of the session's events on the current connection.
    pub since: Instant,
    /// When the flow counts as quiet (the last event + R + P).
    pub until: Instant,
}

/// The answer to a read of another daemon's session record, as the
/// election core is told it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionAnswer {
    /// What the store answered: one record shared by every election
    /// answered with it (thousands follow through one session).
    pub record: Result<Arc<Record>, StoreError>,
    /// When this daemon first learned the record's `rvn` (a stream's event
    /// naming it, or an earlier read finding it), if before now: its
    /// takeover timer may count from then (an `rvn` cannot be named
    /// before it was written).
    pub learned: Option<Instant>,
    /// The owner's stream, while it flows.
    pub flow: Option<Flow>,
    /// A later write of the session than the record shows, told by its
    /// owner's stream (its `rvn` and arrival) after the read was sent: the
    /// record may be a moment old. A follower does not end the session on
    /// this answer while that write is not due; it reads again then.
    pub told: Option<(String, Instant)>,
    /// Whether a tenure of the session's owner may have ended since the
    /// election asking was last read, and this daemon cannot account for
    /// it (the record's count of ended tenures moved by more than the
    /// ends it saw for itself): the election is then read again, whatever
    /// the owner's stream told (it may have left a release out).
    pub moved: bool,
    /// Another daemon, its stream flowing, ranks before this one for the
    /// election asking (the node's `rank`): a takeover this daemon would
    /// make on this answer waits two retry intervals for that daemon's
    /// first, once for each record of the election it finds.
    /// Both would take the election together otherwise, and one of the
    /// two writes fails. Never a matter of safety: every take is
    /// conditional on the record read.
    pub yields: bool,
}

impl SessionAnswer {
    /// A bare store answer: nothing learned before, no stream, and
    /// nothing known of the count (so the election is read again).
    pub fn bare(record: Result<Record, StoreError>) -> SessionAnswer {
        SessionAnswer {
            record: record.map(Arc::new),
            learned: None,
            flow: None,
            told: None,
            moved: true,
            yields: false,
        }
    }
}

/// What happened, as the session core is told.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionInput {
    /// The instant asked for by [`SessionCore::next_wake`] came.
    Timeout,
    /// The answer to the read asked for.
    Read(Result<Record, StoreError>),
    /// The answer to the write asked for.
    Written(Result<WriteOutcome, StoreError>),
    /// The daemon is shutting down (its elections were released): end the
    /// session, so that nobody has to time it out, and open no other.
    Close,
    /// The store noticed its data was replaced under it (a SQLite file
    /// deleted or swapped): renew at once; that conditional write, against
    /// what the store names now, decides whether the session still holds.
    StoreReplaced,
    /// The labels the session's record carries from its next write on
    /// (balance: how many elections this daemon leads, and which set).
    /// When the set of their names changes (the daemon became a member,
    /// eligible for priority, or stopped being one), that write comes
    /// early: at once, and at most once an R, so that the others learn of
    /// it within moments, not an R later.
    Labels(std::collections::BTreeMap<String, String>),
    /// Whether the session is wanted now: an election holds a tenure
    /// through it or is about to take one (or balance counts on it).
    Wanted(bool),
    /// How many tenures of the daemon's elections ended so far (a count
    /// that only rises), and the election whose tenure's end made it so:
    /// its next write carries the count, and the latest ends by number
    /// (see [`ENDED_LABEL`]).
    TenuresEnded(u64, String),
}

/// The label of a session record that names the latest tenures that ended
/// through its daemon's sessions, with their numbers in the count the
/// record carries (`fencing_token`): `"41:shard-7 42:shard-3"`, the
/// numbers consecutive and the last one the count. A follower whose
/// session read shows the count moved reads again only the elections
/// named past the count it knew, when the list reaches back that far
/// (else every election it follows through the session, as an older
/// daemon's record without the label has it do). Written by the daemon
/// into the store, so nothing a stream says can forge it.
pub const ENDED_LABEL: &str = "ended";

/// The ends [`ENDED_LABEL`] names at most, and the most bytes it takes:
/// the record is written every R, and a DynamoDB write costs a unit per
/// KB.
const ENDS_LISTED: usize = 16;
const ENDS_LABEL_BYTES: usize = 512;

/// What the session core is doing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // One per daemon.
enum Phase {
    /// No session: open one at `at`.
    Closed { at: Instant },
    /// Open: `lease` is the record of its last successful write, sent at
    /// `last_send`; renew at `next_renew`.
    Open {
        lease: Lease,
        last_send: Instant,
        next_renew: Instant,
    },
    /// Closed for good (ended, or asked to end).
    Finished,
}

/// The request in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pending {
    Create {
        lease: Lease,
        sent: Instant,
    },
    Renew {
        lease: Lease,
        sent: Instant,
    },
    /// Reading back after a renew refused without the record.
    Confirm,
    /// Ending the session at shutdown.
    End,
    /// Ending the session nothing wanted for a lease.
    Retire,
}

/// One daemon's session; see the module docs.
#[derive(Debug, Clone)]
pub struct SessionCore {
    cfg: ElectionConfig,
    phase: Phase,
    pending: Option<Pending>,
    /// rvns of renews whose answer was lost: finding one in the record
    /// means nobody else wrote since.
    own_rvns: Vec<String>,
    /// The pause after failed openings.
    backoff: Backoff,
    /// Asked to close: end the session once no request is in flight.
    closing: bool,
    /// What the record's `holder_meta` carries besides the address.
    labels: std::collections::BTreeMap<String, String>,
    /// Whether the names of `labels` changed since the last write was
    /// sent, and when a write was last sent early for that.
    labels_unsent: bool,
    hastened: Option<Instant>,
    /// Whether the session is wanted ([`SessionInput::Wanted`]), and
    /// since when it is not.
    wanted: bool,
    unwanted_since: Option<Instant>,
    /// The last session was ended for nothing wanting it (no other since).
    retired: bool,
    /// The count of ended tenures its writes carry (see
    /// [`SessionInput::TenuresEnded`]), and the latest ends by number.
    tenures_ended: u64,
    ends: std::collections::VecDeque<(u64, String)>,
    now: Instant,
    out: std::collections::VecDeque<Action>,
}

impl PartialEq for SessionCore {
    fn eq(&self, other: &SessionCore) -> bool {
        self.key() == other.key()
    }
}

impl Eq for SessionCore {}

impl std::hash::Hash for SessionCore {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl SessionCore {
    /// Everything that changes (the config is fixed for a core's life).
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        &Phase,
        &Option<Pending>,
        &Vec<String>,
        (
            &Backoff,
            bool,
            (
                &std::collections::BTreeMap<String, String>,
                bool,
                Option<Instant>,
            ),
            (bool, Option<Instant>, u64),
            &std::collections::VecDeque<(u64, String)>,
        ),
        Instant,
        &std::collections::VecDeque<Action>,
    ) {
        (
            &self.phase,
            &self.pending,
            &self.own_rvns,
            (
                &self.backoff,
                self.closing,
                (&self.labels, self.labels_unsent, self.hastened),
                (self.wanted, self.unwanted_since, self.tenures_ended),
                &self.ends,
            ),
            self.now,
            &self.out,
        )
    }

    /// A session for the daemon of `cfg.identity` with `cfg`'s timing,
    /// opened at `start` if `wanted` (else once it is).
    pub fn new(cfg: ElectionConfig, start: Instant, wanted: bool) -> SessionCore {
        SessionCore {
            cfg,
            phase: Phase::Closed { at: start },
            pending: None,
            own_rvns: Vec::new(),
            backoff: Backoff::default(),
            closing: false,
            labels: Default::default(),
            labels_unsent: false,
            hastened: None,
            wanted,
            unwanted_since: (!wanted).then_some(start),
            retired: false,
            tenures_ended: 0,
            ends: Default::default(),
            now: start,
            out: Default::default(),
        }
    }

    /// Its timing and identity.
    pub fn config(&self) -> &ElectionConfig {
        &self.cfg
    }

    /// The open session, if its validity has not run out yet.
    pub fn view(&self) -> Option<SessionView> {
        match &self.phase {
            Phase::Open {
                lease, last_send, ..
            } if self.now < *last_send + self.cfg.validity() => Some(SessionView {
                key: lease.election.clone(),
                rvn: lease.rvn.clone(),
                last_send: *last_send,
                labels: std::sync::Arc::new(
                    lease
                        .holder_meta
                        .as_ref()
                        .map(|m| m.labels.clone())
                        .unwrap_or_default(),
                ),
            }),
            _ => None,
        }
    }

    /// The key of the open session's record, if one is open.
    pub fn record_key(&self) -> Option<&str> {
        match &self.phase {
            Phase::Open { lease, .. } => Some(&lease.election),
            Phase::Closed { .. } | Phase::Finished => None,
        }
    }

    /// Whether it was asked to close.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Whether the session is over for good (after [`SessionInput::Close`]).
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished && self.pending.is_none()
    }

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// When the core wants a [`SessionInput::Timeout`]; `None` while a
    /// request is in flight.
    pub fn next_wake(&self) -> Option<Instant> {
        if self.pending.is_some() {
            return None;
        }
        Some(match &self.phase {
            Phase::Finished => return None,
            Phase::Closed { at } if self.wanted => *at,
            Phase::Closed { .. } => return None,
            Phase::Open {
                last_send,
                next_renew,
                ..
            } => {
                // Wake when the validity ends too, so that the view drops.
                let end = *last_send + self.cfg.validity();
                let wake = if self.now < end {
                    (*next_renew).min(end)
                } else {
                    *next_renew
                };
                match self.retire_at() {
                    Some(retire) => wake.min(retire),
                    None => wake,
                }
            }
        })
    }

    /// When the open session is ended for nothing wanting it, if nothing
    /// does: a lease after the last that did.
    fn retire_at(&self) -> Option<Instant> {
        self.unwanted_since
            .filter(|_| !self.wanted)
            .map(|since| since + self.cfg.lease_duration)
    }

    /// The count of ended tenures its writes carry.
    pub fn tenures_ended(&self) -> u64 {
        self.tenures_ended
    }

    /// Whether the session is wanted now.
    pub fn is_wanted(&self) -> bool {
        self.wanted
    }

    /// Whether the last session was ended for nothing wanting it, and no
    /// other opened since.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    /// Take `input` in at `tick`.
    pub fn handle(&mut self, tick: &Tick, input: SessionInput) {
        self.now = self.now.max(tick.now);
        match input {
            SessionInput::Timeout => self.on_timeout(tick),
            SessionInput::Written(res) => self.on_written(tick, res),
            SessionInput::Read(res) => self.on_read(res),
            SessionInput::Close => self.closing = true,
            SessionInput::Labels(labels) => {
                self.labels_unsent |= !labels.keys().eq(self.labels.keys());
                self.labels = labels;
            }
            SessionInput::Wanted(wanted) => self.on_wanted(tick, wanted),
            SessionInput::TenuresEnded(n, election) => self.tenure_ended(n, election),
            SessionInput::StoreReplaced => {
                if let Phase::Open { next_renew, .. } = &mut self.phase {
                    *next_renew = self.now;
                }
                self.on_timeout(tick);
            }
        }
        if self.closing && self.pending.is_none() && self.phase != Phase::Finished {
            self.finish(tick);
        }
        self.hasten_labels();
    }

    /// Bring the next renewal forward to now, at most once an R, while
    /// the names of the labels changed since the last write was sent.
    fn hasten_labels(&mut self) {
        if !self.labels_unsent || self.closing {
            return;
        }
        let soonest = self
            .hastened
            .map_or(self.now, |at| at + self.cfg.renew_interval)
            .max(self.now);
        if let Phase::Open { next_renew, .. } = &mut self.phase
            && soonest < *next_renew
        {
            *next_renew = soonest;
            self.hastened = Some(soonest);
        }
    }

    /// End the open session (a write that clears its holder, under the
    /// condition that it is still ours), and stop.
    fn finish(&mut self, tick: &Tick) {
        if let Phase::Open { lease, .. } = std::mem::replace(&mut self.phase, Phase::Finished) {
            self.end(tick, &lease, Pending::End);
        }
    }

    /// Ask for the write that ends the session whose record is `lease`
    /// (its holder cleared, under the condition that it is still ours).
    fn end(&mut self, tick: &Tick, lease: &Lease, pending: Pending) {
        self.pending = Some(pending);
        self.out.push_back(Action::Write {
            op: WriteOp::EndSession,
            lease: lease.handed_to_with(None, &tick.stamp),
            condition: Condition::HeldBy {
                rvn: lease.rvn.clone(),
                holder: self.cfg.identity.clone(),
            },
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    fn on_wanted(&mut self, tick: &Tick, wanted: bool) {
        if wanted == self.wanted {
            return;
        }
        self.wanted = wanted;
        self.unwanted_since = (!wanted).then_some(self.now);
        // Wanted again: a closed session opens now (or after the pause
        // that is running).
        if wanted {
            self.on_timeout(tick);
        }
    }

    /// End the open session nothing wanted for a lease: like the end at
    /// shutdown, but the core stays ready to open a new one.
    fn retire(&mut self, tick: &Tick, lease: &Lease) {
        self.phase = Phase::Closed { at: self.now };
        self.retired = true;
        self.end(tick, lease, Pending::Retire);
    }

    fn on_timeout(&mut self, tick: &Tick) {
        if self.pending.is_some() {
            return;
        }
        if let (Phase::Open { lease, .. }, Some(at)) = (&self.phase, self.retire_at())
            && self.now >= at
        {
            let lease = lease.clone();
            self.retire(tick, &lease);
            return;
        }
        match self.phase.clone() {
            Phase::Closed { at } if self.now >= at && self.wanted => self.open(tick),
            Phase::Open {
                lease, next_renew, ..
            } if self.now >= next_renew => {
                self.renew(tick, &lease);
                // Late when the task woke late: the runtime or the host was busy.
                let late = self.now - next_renew;
                self.out.push_back(Action::Note(Note::RenewSent(late)));
            }
            _ => {}
        }
    }

    fn open(&mut self, tick: &Tick) {
        let key = session_key(&self.cfg.identity, &tick.stamp.rvn());
        let lease_ms = u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let lease = Lease::stamped_with(
            &key,
            &self.cfg.identity,
            self.tenures_ended,
            lease_ms,
            tick.stamp.unix_ms,
            self.meta(),
            &tick.stamp,
        );
        self.own_rvns.clear();
        self.retired = false;
        self.labels_unsent = false;
        self.pending = Some(Pending::Create {
            lease: lease.clone(),
            sent: self.now,
        });
        self.out.push_back(Action::Write {
            op: WriteOp::OpenSession,
            lease,
            condition: Condition::NotExists,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    /// The count moved to `n` as `election`'s tenure ended. A count told
    /// late never lowers it; a number that skips some starts the list
    /// over (it names consecutive numbers only).
    fn tenure_ended(&mut self, n: u64, election: String) {
        if n <= self.tenures_ended {
            return;
        }
        if n != self.tenures_ended + 1 {
            self.ends.clear();
        }
        self.tenures_ended = n;
        self.ends.push_back((n, election));
        while self.ends.len() > ENDS_LISTED || self.ends_label().len() > ENDS_LABEL_BYTES {
            self.ends.pop_front();
        }
    }

    fn ends_label(&self) -> String {
        let ends: Vec<String> = self.ends.iter().map(|(n, e)| format!("{n}:{e}")).collect();
        ends.join(" ")
    }

    /// What the record advertises: the address, the labels, the latest
    /// ends.
    fn meta(&self) -> Option<HolderMeta> {
        let mut meta = self.cfg.holder_meta.clone();
        if !self.labels.is_empty() {
            let labels = &mut meta.get_or_insert_with(HolderMeta::default).labels;
            labels.extend(self.labels.clone());
        }
        if !self.ends.is_empty() {
            let labels = &mut meta.get_or_insert_with(HolderMeta::default).labels;
            labels.insert(ENDED_LABEL.to_owned(), self.ends_label());
        }
        meta
    }

    fn renew(&mut self, tick: &Tick, lease: &Lease) {
        let mut renewed = lease.renewed_with(&tick.stamp);
        renewed.holder_meta = self.meta();
        renewed.fencing_token = self.tenures_ended;
        self.labels_unsent = false;
        self.own_rvns.push(renewed.rvn.clone());
        if self.own_rvns.len() > 4 {
            self.own_rvns.remove(0);
        }
        self.pending = Some(Pending::Renew {
            lease: renewed.clone(),
            sent: self.now,
        });
        self.out.push_back(Action::Write {
            op: WriteOp::RenewSession,
            lease: renewed,
            condition: Condition::HeldBy {
                rvn: lease.rvn.clone(),
                holder: self.cfg.identity.clone(),
            },
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    fn on_written(&mut self, tick: &Tick, res: Result<WriteOutcome, StoreError>) {
        match (self.pending.take(), res) {
            (Some(Pending::Create { lease, sent }), Ok(WriteOutcome::Applied)) => {
                self.backoff = Backoff::default();
                self.phase = Phase::Open {
                    lease,
                    last_send: sent,
                    next_renew: sent + self.cfg.renew_interval,
                };
            }
            // Refused, or unknown: never create this key again (a lost
            // create may still apply; nobody names that record then).
            (Some(Pending::Create { .. }), _) => {
                let pause = self
                    .backoff
                    .next_pause(self.cfg.retry_interval, tick.jitter);
                self.phase = Phase::Closed {
                    at: self.now + pause,
                };
            }
            (Some(Pending::Renew { lease, sent }), Ok(WriteOutcome::Applied)) => {
                self.phase = Phase::Open {
                    lease,
                    last_send: sent,
                    next_renew: sent + self.cfg.renew_interval,
                };
            }
            (Some(Pending::Renew { .. }), Ok(WriteOutcome::ConditionFailed { current })) => {
                match current {
                    Some(record) => self.conflict(record),
                    None => {
                        self.pending = Some(Pending::Confirm);
                        self.out.push_back(Action::Read {
                            budget: self.cfg.renew_interval,
                            confirming: true,
                        });
                    }
                }
            }
            (Some(Pending::Renew { .. }), Err(_)) => self.retry_later(),
            (Some(Pending::End | Pending::Retire), _) => {}
            (other, _) => self.pending = other,
        }
    }

    fn on_read(&mut self, res: Result<Record, StoreError>) {
        match (self.pending.take(), res) {
            (Some(Pending::Confirm), Ok(record)) => self.conflict(record),
            (Some(Pending::Confirm), Err(_)) => self.retry_later(),
            (other, _) => self.pending = other,
        }
    }

    fn retry_later(&mut self) {
        if let Phase::Open { next_renew, .. } = &mut self.phase {
            *next_renew = self.now + self.cfg.retry_interval;
        }
    }

    /// A renew was refused and `current` is the record now. A renew of
    /// ours whose answer was lost applied after all: carry on from it
    /// (validity still counts from the last write known to have applied).
    /// Anything else (ended, deleted, rewritten): the session is lost.
    fn conflict(&mut self, current: Record) {
        let Phase::Open { last_send, .. } = self.phase.clone() else {
            return;
        };
        match current {
            Record::Valid(lease)
                if lease.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && self.own_rvns.contains(&lease.rvn) =>
            {
                self.phase = Phase::Open {
                    lease,
                    last_send,
                    next_renew: self.now,
                };
            }
            _ => {
                self.phase = Phase::Closed { at: self.now };
            }
        }
    }
}

#[cfg(test)]
mod tests;
