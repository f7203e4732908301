//! Hints: what a leader tells its followers after each write, and how a
//! follower uses what it is told.
//!
//! A hint is advice to act sooner, never a reason to lead. Of all a hint
//! says, only its `rvn` and the instant it arrived enter the timing:
//! - a `renewed` hint tells when its `rvn` was first learned (the leader
//!   sends it after the write succeeded, so the write came first, and an
//!   `rvn` is random: nobody can name one before it was written). When a
//!   read later finds that `rvn` in the store, its takeover timer counts
//!   from the earlier of the hint's arrival and the read. The lease it
//!   runs for is the store's `lease_ms`, never the hint's, and a hint
//!   naming another `rvn` never restarts the timer of the one the store
//!   shows: a stream that alternates `rvn`s cannot keep an expired lease
//!   alive;
//! - hints never push a follower's reads past the end of the takeover
//!   wait of the `rvn` the store showed last (plus a short slack to catch
//!   the next renewal): whatever a stream says, a dead leader's lease is
//!   read, and taken, within the takeover wait plus a few P;
//! - every takeover stays a conditional write on the `rvn` the follower
//!   read and timed;
//! - `released` and `not_leader`, and the end of a stream that spoke, only
//!   make the follower read the store at once; the store's answer decides
//!   (a forged `released` costs one read, and a flood of them no more than
//!   one a retry interval on average);
//! - a follower whose reads keep finding an `rvn` the stream never named,
//!   or find an older `rvn` than one the stream named before the read was
//!   sent (a leader names each `rvn` only after writing it, and reads are
//!   strongly consistent, so that is a lie), stops believing that stream
//!   until the record's tenure changes: a stream that lies (or lags) costs
//!   polls, not a leaderless election.
//!
//! The transport (an HTTP stream, `crate::watch::client`, fed to the
//! node through `crate::election`'s `HintSink`) is outside the core:
//! it gets the address to watch and hands back what arrived.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record::Lease;
use super::time::Instant;

/// What a leader tells its followers (one line of the watch stream).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LeaseEvent {
    /// The sender holds the lease; its last successful write carries `rvn`.
    Renewed {
        /// The election.
        election: String,
        /// The sender's identity.
        holder: String,
        /// The record version of its last successful write.
        rvn: String,
        /// The tenure's fencing token.
        fencing_token: u64,
        /// The lease the holder promises to honour, ms.
        lease_ms: u64,
    },
    /// The sender released the lease; the released record carries `rvn`.
    Released {
        /// The election.
        election: String,
        /// The record version of the released record.
        rvn: String,
        /// The fencing token of the tenure that ended.
        fencing_token: u64,
        /// Who the lease was handed to, if anyone.
        successor: Option<String>,
    },
    /// The sender does not lead (any more): its lease ran out or someone
    /// else wrote the record. Look at the store.
    NotLeader {
        /// The election.
        election: String,
    },
    /// The sender's session was written (opened or renewed): its record
    /// now carries `rvn`. Only the daemon's stream (`GET /v1/watch`) says
    /// this; the elections held through the session are not renewed one by
    /// one, so this is what tells their followers the holder is alive.
    Session {
        /// The session record's key.
        session: String,
        /// The record version of its last successful write.
        rvn: String,
        /// The labels that write carried (balance: how many elections the
        /// daemon leads, and which set): advice, as the record's are.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        labels: BTreeMap<String, String>,
    },
}

impl LeaseEvent {
    /// The election it is about; `None` for a session's event.
    pub fn election(&self) -> Option<&str> {
        match self {
            LeaseEvent::Renewed { election, .. }
            | LeaseEvent::Released { election, .. }
            | LeaseEvent::NotLeader { election } => Some(election),
            LeaseEvent::Session { .. } => None,
        }
    }

    /// Whether it tells that a tenure ended (released, handed over, or
    /// stopped): what moves the count of ended tenures a session's writes
    /// carry.
    pub fn ends_tenure(&self) -> bool {
        matches!(
            self,
            LeaseEvent::Released { .. } | LeaseEvent::NotLeader { .. }
        )
    }
}

/// What reached a follower from the leader it watches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Hint {
    /// An event, read from the stream at `at`.
    Event {
        /// When it arrived, on the follower's clock.
        at: Instant,
        /// What it said (boxed: a hint queue's slots are as large as a
        /// hint, and every follower's engine has one).
        event: Box<LeaseEvent>,
    },
    /// The stream ended, broke or could not be opened.
    Ended,
}

/// What a follower does after a hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterHint {
    /// Go on waiting.
    Wait,
    /// A `renewed` hint arrived: a follower past the takeover wait of the
    /// `rvn` it read last reads now (to find the renewal, or the lease
    /// still unchanged); others go on waiting.
    Renewed,
    /// Read the store now.
    ReadNow,
}

/// How many recently hinted rvns a follower remembers.
const REMEMBERED: usize = 8;

/// Reads that hints may ask for within `EARLY_READS` retry intervals: a
/// few handovers in a row (a rolling update) are each acted on at once,
/// while a flood of hints (forged, replayed) costs one read a retry
/// interval on average.
const EARLY_READS: usize = 3;

/// A follower's bookkeeping of the stream it watches. Pure: the stream
/// itself is the driver's (it is told where to aim through
/// [`Hints::take_retarget`]).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Hints {
    /// Whether a watch client feeds this follower at all.
    has_feed: bool,
    /// The address watched now, if any.
    target: Option<String>,
    /// When the current target was set (by a read's answer): the client
    /// hands this election events from that address from a moment later.
    aimed_at: Option<Instant>,
    /// A change of target the driver has yet to carry out.
    retarget: Option<Option<String>>,
    /// Arrival of the last event; `None`: no stream flowing.
    last: Option<Instant>,
    /// The stream's last event was `released` or `not_leader`, after which
    /// a leader ends its stream: that end is no news.
    end_told: bool,
    /// The rvns the stream named lately, in the order it first named them,
    /// each with the instant it was first named.
    hinted: VecDeque<(String, Instant)>,
    /// Consecutive reads that found an rvn the flowing stream never named.
    strikes: u32,
    /// A tenure (holder, fencing token) whose stream is not believed.
    distrusted: Option<(String, u64)>,
    /// When hints last made the follower read (the latest
    /// [`EARLY_READS`] times).
    early_reads: VecDeque<Instant>,
    /// A read a hint asked for while that budget was spent: (when it was
    /// asked for, when it is due). Any read after the asking fulfils it.
    deferred_read: Option<(Instant, Instant)>,
    /// What `renewed` hints promised for their rvn (model checker's
    /// mutations only: nothing else may read a hint's `lease_ms`).
    #[cfg(test)]
    hinted_lease: Vec<(String, u64)>,
}

impl Hints {
    /// Bookkeeping for a follower fed by a watch client (`has_feed`) or
    /// by none.
    pub(crate) fn new(has_feed: bool) -> Hints {
        Hints {
            has_feed,
            ..Hints::default()
        }
    }

    /// The change of the watched address not yet carried out, if any.
    pub(crate) fn take_retarget(&mut self) -> Option<Option<String>> {
        self.retarget.take()
    }

    /// Remember what a hint promised for `rvn` (mutations only).
    #[cfg(test)]
    pub(crate) fn remember_lease_ms(&mut self, rvn: &str, lease_ms: u64) {
        self.hinted_lease.retain(|(r, _)| r != rvn);
        self.hinted_lease.push((rvn.to_owned(), lease_ms));
        if self.hinted_lease.len() > REMEMBERED {
            self.hinted_lease.remove(0);
        }
    }

    /// What a hint promised for `rvn` (mutations only).
    #[cfg(test)]
    pub(crate) fn hinted_lease_ms(&self, rvn: &str) -> Option<u64> {
        self.hinted_lease
            .iter()
            .find(|(r, _)| r == rvn)
            .map(|(_, ms)| *ms)
    }

    /// The watch client is gone: no more hints, ever.
    pub(crate) fn closed(&mut self) {
        self.has_feed = false;
        self.last = None;
    }

    /// Whether events arrived within `quiet` before `now`.
    pub(crate) fn flowing(&self, now: Instant, quiet: Duration) -> bool {
        self.last.is_some_and(|t| now - t < quiet)
    }

    /// When the flowing stream counts as quiet, if it flows.
    pub(crate) fn quiet_at(&self, quiet: Duration) -> Option<Instant> {
        self.last.map(|t| t + quiet)
    }

    /// When a read that a hint asked for, and that had to wait, is due.
    pub(crate) fn deferred_read(&self) -> Option<Instant> {
        self.deferred_read.map(|(_, due)| due)
    }

    /// The follower wakes at `now` to read: if that is the deferred read,
    /// the read fulfils it whatever it finds (a failed one is retried with
    /// back-off, like any other) and spends the budget like any read a
    /// hint asked for.
    pub(crate) fn waking(&mut self, now: Instant) {
        if self.deferred_read.is_some_and(|(_, due)| due <= now) {
            self.deferred_read = None;
            self.spend_early_read(now);
        }
    }

    /// Whether the last reads found what the stream did not say, so the
    /// store is to be polled again soon.
    pub(crate) fn doubted(&self) -> bool {
        self.strikes > 0
    }

    /// Watch `address`, or nothing. A new target forgets the old stream.
    fn aim(&mut self, address: Option<String>) {
        if !self.has_feed || self.target == address {
            return;
        }
        self.target = address.clone();
        self.retarget = Some(address);
        self.last = None;
        self.end_told = false;
        self.hinted.clear();
        self.strikes = 0;
    }

    /// Stop watching (this instance leads, or nobody does).
    pub(crate) fn stop(&mut self) {
        self.aim(None);
    }

    /// When the stream first named `rvn`, if it did lately: its takeover
    /// timer may count from then (an rvn cannot be named before it was
    /// written).
    pub(crate) fn learned_at(&self, rvn: &str) -> Option<Instant> {
        self.hinted
            .iter()
            .find(|(r, _)| r == rvn)
            .map(|(_, at)| *at)
    }

    /// A read sent at `sent` and answered at `at` found `lease`: watch its
    /// holder's advertised address (unless it is `me` or its stream is not
    /// believed), and check the stream against what the store says.
    /// Returns true when it stopped believing the stream just now.
    pub(crate) fn after_read(
        &mut self,
        lease: &Lease,
        me: &str,
        sent: Instant,
        at: Instant,
        quiet: Duration,
    ) -> bool {
        let mut distrusted_now = false;
        let tenure = lease
            .holder
            .as_ref()
            .map(|h| (h.clone(), lease.fencing_token));
        if self.deferred_read.is_some_and(|(asked, _)| at >= asked) {
            self.deferred_read = None;
        }
        if self.distrusted.is_some() && self.distrusted != tenure {
            self.distrusted = None;
        }
        if self.flowing(at, quiet) && lease.holder.is_some() {
            match self.hinted.iter().position(|(r, _)| *r == lease.rvn) {
                // The stream named a newer rvn before this read was sent,
                // yet the store still holds an older one: the stream lies.
                Some(i) if self.hinted.iter().skip(i + 1).any(|(_, t)| *t <= sent) => {
                    self.strikes = 2;
                }
                Some(_) => self.strikes = 0,
                // Not named (yet): a renewal whose hint is on its way, or
                // a stream that hides the real renewals.
                None => self.strikes += 1,
            }
            if self.strikes >= 2 && self.distrusted != tenure {
                distrusted_now = true;
                self.distrusted = tenure.clone();
            }
        }
        let address = match (&lease.holder, &lease.holder_meta) {
            (Some(h), Some(meta)) if h != me && self.distrusted.is_none() => meta.address.clone(),
            _ => None,
        };
        let before = self.target.clone();
        self.aim(address);
        if self.target != before {
            self.aimed_at = self.target.as_ref().map(|_| at);
        }
        distrusted_now
    }

    /// Whether a stream is watched, aimed before `t`: a read sent at `t`
    /// or later cannot miss an event the stream told since (an event
    /// between the read and the aim would not have reached this election).
    pub(crate) fn aimed_before(&self, t: Instant) -> bool {
        self.has_feed && self.target.is_some() && self.aimed_at.is_some_and(|a| a < t)
    }

    /// Take `hint` in. Of a `renewed` event only its rvn and arrival are
    /// kept (everything else it says is the sender's word); `now` and
    /// `retry` pace the reads hints ask for.
    pub(crate) fn take(&mut self, hint: Hint, now: Instant, retry: Duration) -> AfterHint {
        let (at, event) = match hint {
            // A stream that spoke and ended: its leader may have left (its
            // `released` lost on the way) or died; the store tells which.
            Hint::Ended => {
                let spoke = self.last.take().is_some();
                if spoke && !std::mem::take(&mut self.end_told) {
                    return self.read_on_a_hint(now, retry);
                }
                return AfterHint::Wait;
            }
            Hint::Event { at, event } => (at, *event),
        };
        // Sent before the target changed (to nobody): not about what this
        // follower watches now.
        if !self.has_feed || self.target.is_none() {
            return AfterHint::Wait;
        }
        self.last = Some(at);
        match event {
            LeaseEvent::Renewed { rvn, .. } => {
                self.end_told = false;
                // Named again (a replay): it was learned when first named.
                if !self.hinted.iter().any(|(r, _)| *r == rvn) {
                    if self.hinted.len() == REMEMBERED {
                        self.hinted.pop_front();
                    }
                    self.hinted.push_back((rvn, at));
                }
                AfterHint::Renewed
            }
            LeaseEvent::Released { .. } | LeaseEvent::NotLeader { .. } => {
                self.end_told = true;
                self.read_on_a_hint(now, retry)
            }
            // Not about this election: its session is timed elsewhere.
            LeaseEvent::Session { .. } => AfterHint::Wait,
        }
    }

    /// A read on a hint's word, within a budget: a flood of hints (forged,
    /// replayed) costs no more, and delays nothing. Past the budget the
    /// read waits for it, but is not forgotten.
    fn read_on_a_hint(&mut self, now: Instant, retry: Duration) -> AfterHint {
        let window = retry * EARLY_READS as u32;
        if self.early_reads.len() == EARLY_READS {
            let oldest = self.early_reads[0];
            if now < oldest + window {
                if self.deferred_read.is_none() {
                    self.deferred_read = Some((now, oldest + window));
                }
                return AfterHint::Wait;
            }
        }
        self.spend_early_read(now);
        AfterHint::ReadNow
    }

    fn spend_early_read(&mut self, now: Instant) {
        if self.early_reads.len() == EARLY_READS {
            self.early_reads.pop_front();
        }
        self.early_reads.push_back(now);
    }
}
