//! The follower's rules: when to read, what a read allows (take over,
//! or wait until when), how a hint counts, and what an acquisition's
//! answer comes to.

use super::{Action, Backoff, Core, Note, Pending, Phase, Round, Term, Tick, WriteOp};
use crate::core::hints::{AfterHint, Hint};
use crate::core::record::{Condition, Lease, Malformed, Record, UnknownFormat, WriteOutcome};
use crate::core::store_error::StoreError;
use crate::core::takeover::takeover_wait;
use crate::core::time::Instant;

impl Core {
    /// The follower's wake between rounds: at `poll_at`, or, while the
    /// leader's hints flow, at the next read they cannot spare.
    pub(super) fn follower_wake(&self, poll_at: Instant) -> Instant {
        if let Some(watch) = &self.session_watch {
            let due = watch.due;
            return self.hints.deferred_read().map_or(due, |d| d.min(due));
        }
        let quiet = self.cfg.hint_quiet();
        let wake = if self.hints.flowing(self.now, quiet) && !self.hints.doubted() {
            // Past the due, the read waits for the next renewal the stream
            // tells of (so that it finds a fresh rvn, timed from its hint),
            // a slack at most.
            let due_read = self.unread_due().map(|d| d + self.cfg.due_read_slack());
            let confirm = self.last_read + self.cfg.hint_confirm_interval();
            [due_read, self.hints.quiet_at(quiet), Some(confirm)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(poll_at)
        } else {
            poll_at
        };
        self.hints.deferred_read().map_or(wake, |d| d.min(wake))
    }

    /// The end of the takeover wait of the rvn the store showed last, if no
    /// read happened since it passed: hints never move it (only a read
    /// does), so whatever a stream says, a lease left unchanged is read
    /// again then, and taken.
    pub(super) fn unread_due(&self) -> Option<Instant> {
        self.takeover.due().filter(|d| self.last_read < *d)
    }

    /// Take `record`, which the store showed in answer to a write of ours
    /// sent at `sent`, as a round's read (it was seen after that): one
    /// request fewer.
    pub(super) fn read_with_a_write(&mut self, record: Record, sent: Instant, tick: &Tick) {
        self.session_watch = None;
        self.last_read_sent = sent;
        self.last_read = self.now;
        if let Some(round) = self.consider(record, tick) {
            self.end_round(round, tick);
        }
    }

    /// Start a round: read the record.
    pub(super) fn start_round(&mut self) {
        self.session_watch = None;
        self.last_read_sent = self.now;
        self.pending = Some(Box::new(Pending::Round));
        self.phase = Phase::Following { poll_at: self.now };
        self.out.push_back(Action::Read {
            budget: self.cfg.renew_interval,
            confirming: false,
        });
    }

    /// A round ended: wait as it says.
    pub(super) fn end_round(&mut self, round: Round, tick: &Tick) {
        let poll_at = match round {
            Round::Lost => {
                self.backoff = Backoff::default();
                self.now
            }
            // An error, not an answer: never retried in a loop.
            Round::Failed => {
                self.now
                    + self
                        .backoff
                        .next_pause(self.cfg.retry_interval, tick.jitter)
            }
            Round::Wait(until) => {
                self.backoff = Backoff::default();
                until
            }
        };
        // A round that found the election free for us but waits for the
        // daemon's session to open is not over (the opening starts it
        // again at once): counted only if the one before waited too (the
        // session did not open within P), so that `--acquire-timeout 0`,
        // a job run everywhere and READY=1 wait for a round that could
        // take it.
        if self.session_wanted && !self.waited_for_session {
            self.waited_for_session = true;
            // Nor does it settle the role: READY=1 waits for the next.
            if self.state.rounds == 0 {
                self.state.first_observation_done = false;
            }
        } else {
            self.waited_for_session = false;
            self.state.rounds += 1;
        }
        self.phase = Phase::Following { poll_at };
    }

    pub(super) fn on_read(&mut self, tick: &Tick, res: Result<Record, StoreError>) {
        match self.pending.take().map(|p| *p) {
            Some(Pending::Round) => {
                self.last_read = self.now;
                let round = match res {
                    Err(error) => {
                        self.store_error("read", error);
                        Some(Round::Failed)
                    }
                    Ok(record) => self.consider(record, tick),
                };
                if let Some(round) = round {
                    self.end_round(round, tick);
                }
            }
            Some(Pending::RenewConflict) => self.renew_conflict(res.ok()),
            Some(Pending::ReleaseConflict {
                term,
                successor,
                then,
            }) => self.release_conflict(tick, term, res.ok(), successor, then),
            other => self.pending = other.map(Box::new),
        }
    }

    /// One round after a successful read: take the lease if it is free (a
    /// write goes out: `None`), or say when to look again.
    pub(super) fn consider(&mut self, record: Record, tick: &Tick) -> Option<Round> {
        let at = self.now;
        let poll = at + self.cfg.retry_interval;
        // Wanted again below only if this round finds the election free
        // for us but no session to hold it through.
        self.session_wanted = false;
        self.deferred_take = None;
        match record {
            Record::Absent => {
                self.observed_ok(tick, None, None, None);
                self.takeover.forget();
                self.hints.stop();
                if !self.may_take() {
                    self.defer_take(WriteOp::Create, Condition::NotExists, None);
                    return Some(Round::Wait(poll));
                }
                let token = self.next_token(None, tick);
                let lease = self.new_lease(token, tick);
                self.acquire(WriteOp::Create, lease, Condition::NotExists);
                None
            }
            Record::Valid(current) => self.consider_valid(current, tick),
            Record::Malformed(m) => self.consider_malformed(m, tick),
            Record::UnknownFormat(u) => Some(self.consider_unknown_format(u, tick)),
        }
    }

    pub(super) fn consider_valid(&mut self, current: Lease, tick: &Tick) -> Option<Round> {
        let at = self.now;
        let poll = at + self.cfg.retry_interval;
        self.note_token(current.fencing_token);
        self.observed_ok(
            tick,
            current.holder.clone(),
            Some(current.fencing_token),
            None,
        );
        self.state.session = current.session.clone();
        let me = self.cfg.identity.clone();
        // Before the stream is judged: a stream found lying is dropped
        // with what it named, but an rvn cannot be named before it was
        // written, whoever named it.
        let learned = self.hints.learned_at(&current.rvn);
        let sent = self.last_read_sent;
        if self
            .hints
            .after_read(&current, &me, sent, at, self.cfg.hint_quiet())
        {
            self.note(Note::StreamDistrusted {
                holder: current.holder.clone(),
                address: current.holder_meta.as_ref().and_then(|m| m.address.clone()),
            });
        }
        let ours = current.holder.as_deref() == Some(me.as_str())
            && (self.own_rvns.contains(&current.rvn) || self.holds_session_of(&current));
        // Held through someone's session: the session is what is timed
        // (the record's own rvn does not change on renew).
        if !ours
            && current.holder.is_some()
            && let Some(key) = current.session.clone()
        {
            return self.read_session(current, key);
        }
        let lease_ms = self.timing_lease_ms(&current);
        let expired = self.takeover.observe(&current.rvn, lease_ms, at, learned) <= at;
        // Released to anyone or to us; a lease handed to someone else
        // waits like a held one.
        let free = self.free_for_me(&current) || ours || expired;
        if free && !self.may_take() {
            let condition = Condition::RvnIs(current.rvn.clone());
            self.defer_take(WriteOp::TakeOver, condition, Some(current.fencing_token));
            return Some(Round::Wait(poll));
        }
        if free {
            let token = self.next_token(Some(current.fencing_token), tick);
            let lease = self.new_lease(token, tick);
            self.acquire(WriteOp::TakeOver, lease, Condition::RvnIs(current.rvn));
            return None;
        }
        Some(match self.takeover.due() {
            // Wake exactly when the takeover becomes allowed.
            Some(due) => Round::Wait(poll.min(due.max(at))),
            None => Round::Wait(poll),
        })
    }

    /// The lease a record is timed with: the one it promises.
    pub(super) fn timing_lease_ms(&self, current: &Lease) -> u64 {
        #[cfg(test)]
        if self.mutations.hint_lease_ms_used
            && let Some(ms) = self.hints.hinted_lease_ms(&current.rvn)
        {
            return ms;
        }
        current.lease_ms
    }

    /// Whether the record is released to anyone or to us.
    pub(super) fn free_for_me(&self, current: &Lease) -> bool {
        #[cfg(test)]
        if self.mutations.successor_ignored {
            return current.holder.is_none();
        }
        current.free_for(&self.cfg.identity)
    }

    pub(super) fn consider_malformed(&mut self, m: Malformed, tick: &Tick) -> Option<Round> {
        let at = self.now;
        self.hints.stop();
        if self.warned_malformed.as_deref() != Some(m.fingerprint.as_str()) {
            self.note(Note::Malformed(m.problem.clone()));
            self.warned_malformed = Some(m.fingerprint.clone());
        }
        if let Some(t) = m.fencing_token {
            self.note_token(t);
        }
        self.observed_ok(tick, None, m.fencing_token, Some(m.problem.clone()));
        let key = format!("malformed:{}", m.fingerprint);
        let lease_ms = u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let expired = self.takeover.observe(&key, lease_ms, at, None) <= at;
        if !expired || !self.may_take() {
            return Some(Round::Wait(at + self.cfg.retry_interval));
        }
        // Treat an unreadable token as absent: unix ms keeps the new token
        // above any sane earlier one.
        let token = self
            .next_token(None, tick)
            .max(m.fencing_token.map_or(0, |t| t + 1));
        let lease = self.new_lease(token, tick);
        self.note(Note::OverwritingMalformed);
        self.acquire(WriteOp::TakeOver, lease, Condition::Unchanged(m.guard));
        None
    }

    /// A record of a format this build does not know: held by someone it
    /// cannot time, so it never writes it, whatever time passes. It reads
    /// again every R, not P: this lasts until the record changes or this
    /// instance is upgraded, so it is kept cheap.
    pub(super) fn consider_unknown_format(&mut self, u: UnknownFormat, tick: &Tick) -> Round {
        self.hints.stop();
        // A record that turns readable again is timed from that read.
        self.takeover.forget();
        if self.warned_unknown_format.as_deref() != Some(u.fingerprint.as_str()) {
            self.note(Note::UnknownFormat {
                format: u.format.clone(),
                holder: u.holder.clone(),
            });
            self.warned_unknown_format = Some(u.fingerprint.clone());
        }
        if let Some(t) = u.fencing_token {
            self.note_token(t);
        }
        self.observed_ok(tick, u.holder, u.fencing_token, None);
        self.state.unknown_format = Some(u.format);
        Round::Wait(self.now + self.cfg.renew_interval)
    }

    /// Try to start a tenure with `lease` under `condition`.
    pub(super) fn acquire(&mut self, op: WriteOp, lease: Lease, condition: Condition) {
        self.remember_own(&lease.rvn);
        self.pending = Some(Box::new(Pending::Acquire {
            op,
            lease: lease.clone(),
            sent: self.now,
        }));
        self.out.push_back(Action::Write {
            op,
            lease,
            condition,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    pub(super) fn acquired(
        &mut self,
        tick: &Tick,
        op: WriteOp,
        lease: Lease,
        sent: Instant,
        res: Result<WriteOutcome, StoreError>,
    ) {
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Ok(true),
                });
                self.note_token(lease.fencing_token);
                self.takeover.forget();
                self.tenure_seq += 1;
                let since = self.validity_origin(sent);
                // Held through the session: valid as long as it is.
                let Some(last_send) = self.session_origin(&lease, since) else {
                    self.end_round(Round::Lost, tick);
                    return;
                };
                let leads_from = if op == WriteOp::Create && self.cfg.strict_new_lease {
                    since + takeover_wait(lease.lease_ms, self.cfg.max_clock_drift)
                } else {
                    since
                };
                let term = Term {
                    since,
                    leads_from,
                    last_send,
                    seq: self.tenure_seq,
                    lease,
                };
                self.enter_lead(term, tick);
            }
            Ok(WriteOutcome::ConditionFailed { current }) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Ok(false),
                });
                self.takeover.forget();
                match current {
                    // The store showed the record the take lost to: the
                    // next round's read, as if sent with the take (it was
                    // seen after that), instead of one more request.
                    Some(record) => self.read_with_a_write(record, sent, tick),
                    None => self.end_round(Round::Lost, tick),
                }
            }
            Err(error) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Err(error.clone()),
                });
                self.store_error(op.label(), error);
                self.end_round(Round::Failed, tick);
            }
        }
    }

    /// The instant a write's validity counts from: its send.
    pub(super) fn validity_origin(&self, sent: Instant) -> Instant {
        #[cfg(test)]
        if self.mutations.validity_from_reply {
            return self.now;
        }
        sent
    }

    pub(super) fn on_hint(&mut self, #[allow(unused)] tick: &Tick, hint: Hint) {
        let Phase::Following { poll_at } = self.phase else {
            return;
        };
        #[cfg(test)]
        if self.mutations.released_hint_trusted
            && let Hint::Event { event, .. } = &hint
            && let crate::core::hints::LeaseEvent::Released { rvn, .. } = &**event
            && self.may_campaign
        {
            let token = self.next_token(self.last_token, tick);
            let lease = self.new_lease(token, tick);
            self.acquire(WriteOp::TakeOver, lease, Condition::RvnIs(rvn.clone()));
            return;
        }
        #[cfg(test)]
        if let Hint::Event { event, .. } = &hint
            && let crate::core::hints::LeaseEvent::Renewed { rvn, lease_ms, .. } = &**event
        {
            self.hints.remember_lease_ms(rvn, *lease_ms);
        }
        let due = self.unread_due();
        let now = self.now;
        match self.hints.take(hint, now, self.cfg.retry_interval) {
            AfterHint::ReadNow => {
                // A release or a loss was told: open the session while the
                // record is read, in case the round may take it (advice
                // only: the round still decides, on what the store says).
                if self.sessions && self.may_campaign && !self.can_hold() {
                    self.session_wanted = true;
                }
                self.start_round();
            }
            AfterHint::Renewed if due.is_some_and(|d| now >= d) => self.start_round(),
            AfterHint::Renewed | AfterHint::Wait => {
                self.phase = Phase::Following { poll_at };
            }
        }
    }

    pub(super) fn on_gate(&mut self, _tick: &Tick, pass: bool) {
        let opened = pass && !self.may_campaign;
        self.may_campaign = pass;
        // Closed: a round waiting for the session to take the election
        // waits no more (nor does it want the session).
        if !pass {
            self.session_wanted = false;
            self.deferred_take = None;
        }
        // May campaign again: look at the record now.
        if opened
            && self.pending.is_none()
            && matches!(self.phase, Phase::Delayed { .. } | Phase::Following { .. })
        {
            self.start_round();
        }
    }

    /// The token for a new tenure: above every token seen, and when there
    /// is no previous item, at least the unix ms so it also exceeds tokens
    /// of items deleted before this process started.
    pub(super) fn next_token(&self, previous: Option<u64>, tick: &Tick) -> u64 {
        let floor = self.last_token.map_or(0, |t| t + 1);
        match previous {
            Some(p) => (p + 1).max(floor),
            None => tick.stamp.unix_ms.max(floor),
        }
    }

    pub(super) fn new_lease(&self, token: u64, tick: &Tick) -> Lease {
        let lease = Lease::stamped_with(
            &self.cfg.name,
            &self.cfg.identity,
            token,
            u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX),
            tick.stamp.unix_ms,
            self.cfg.holder_meta.clone(),
            &tick.stamp,
        );
        match &self.own_session {
            Some(v) => lease.held_through(&v.key),
            None => lease,
        }
    }
}
