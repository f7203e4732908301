//! Elections held through sessions: a tenure lasts as long as the
//! daemon's session (see `crate::core::session`), and an election held
//! through another daemon's session is taken over only once that session
//! has been timed out by the takeover rule *and ended* (a write
//! conditional on the session's `rvn`). Ending it first is what makes a
//! renew of the owner still on its way fail instead of stretching the
//! tenures of elections taken from under it.

use std::sync::Arc;

use super::{Action, Core, Note, Pending, Phase, Round, Term, Tick, WriteOp};
use crate::core::record::{Condition, Lease, Record, WriteOutcome};
use crate::core::session::{Flow, SessionAnswer, SessionVerdict, SessionView, judge_session};
use crate::core::store_error::StoreError;
use crate::core::takeover::takeover_wait;
use crate::core::time::Instant;

/// The acquisition a round found allowed but could not make for want of
/// a session: made as soon as the session opens, under the same
/// condition (so a record that changed since is not taken).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct DeferredTake {
    pub(super) op: WriteOp,
    pub(super) condition: Condition,
    /// The fencing token of the record read, if any.
    pub(super) previous: Option<u64>,
    /// The end of the timed-out session the election was held through,
    /// written first (on the `rvn` that was timed), as the round would
    /// have: a dead daemon's elections go from the opening of this
    /// daemon's session to their takes without another read.
    pub(super) end_first: Option<Box<SessionEnd>>,
}

/// The end of another daemon's session that a take waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SessionEnd {
    election: Followed,
    ended: Lease,
    condition: Condition,
}

/// An election held through another daemon's session, followed by that
/// session alone while its owner's stream flows: the stream tells of the
/// election's release or handover, so between those only the session's
/// timing matters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SessionWatch {
    /// The election's record as read last.
    pub(super) election: Followed,
    /// When the session's `rvn` timed last may be taken over: read it then.
    pub(super) due: Instant,
    /// When the owner's stream counted as quiet at the last answer; `None`:
    /// it did not flow (the read at the due is the last poll's).
    pub(super) flow_until: Option<Instant>,
}

/// How many retry intervals a takeover waits for a daemon that ranks
/// before this one (see [`SessionAnswer::yields`]).
const YIELD_FOR: u32 = 2;

/// What a takeover of an election held through another daemon's session
/// needs of its record as read last: the `rvn` the takeover is
/// conditional on, the fencing token the new one rises above, and the
/// session's key (thousands of elections follow one session: the rest of
/// the record, labels and all, is not kept for each).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Followed {
    pub(super) rvn: String,
    pub(super) fencing_token: u64,
    pub(super) session: String,
}

/// What the daemon heard of a session besides the store's answer (see
/// [`SessionAnswer`]).
struct Heard {
    learned: Option<Instant>,
    flow: Option<Flow>,
    told: Option<(String, Instant)>,
    moved: bool,
    yields: bool,
}

impl Core {
    /// Whether a tenure may start now: without sessions always; with
    /// them, only through an open session with time left before its
    /// tenures would have to stop.
    pub(super) fn can_hold(&self) -> bool {
        !self.sessions
            || self
                .own_session
                .as_ref()
                .is_some_and(|v| self.now + self.cfg.kill_grace < v.last_send + self.cfg.validity())
    }

    /// Whether this round may take the election it found free for it: the
    /// app check lets it campaign and, with sessions, the daemon's session
    /// is open with time to spare. With none, the session is asked for
    /// ([`Core::wants_session`]) and the round waits; the session's
    /// opening starts the next round at once.
    pub(super) fn may_take(&mut self) -> bool {
        if !self.may_campaign {
            return false;
        }
        if self.can_hold() {
            return true;
        }
        self.session_wanted = self.sessions;
        false
    }

    /// Keep the acquisition a round could not make for want of a session
    /// (only while it waits for one), to make it as the session opens.
    pub(super) fn defer_take(&mut self, op: WriteOp, condition: Condition, previous: Option<u64>) {
        self.defer(DeferredTake {
            op,
            condition,
            previous,
            end_first: None,
        });
    }

    /// Keep `take` while the election waits for the session.
    fn defer(&mut self, take: DeferredTake) {
        if self.session_wanted {
            self.deferred_take = Some(Box::new(take));
        }
    }

    /// The same for an election held through a session that is over
    /// (`verdict`): its take, after the session's end if it has to be
    /// ended.
    fn defer_session_take(&mut self, election: Followed, verdict: SessionVerdict) {
        let end_first = match verdict {
            SessionVerdict::End { ended, condition } if !self.skips_session_end() => {
                Some(Box::new(SessionEnd {
                    election: election.clone(),
                    ended,
                    condition,
                }))
            }
            SessionVerdict::End { .. } | SessionVerdict::Ended | SessionVerdict::TimedOut => None,
            SessionVerdict::WaitUntil(_) | SessionVerdict::Unknown => return,
        };
        self.defer(DeferredTake {
            op: WriteOp::TakeOver,
            condition: Condition::RvnIs(election.rvn),
            previous: Some(election.fencing_token),
            end_first,
        });
    }

    /// Whether this election wants the daemon's session now: it holds (or
    /// is taking, or giving up) a tenure through it, or a round found the
    /// election free for it and waits for a session to hold it through.
    /// The daemon keeps a session open only while one of its elections
    /// wants it (or for balance).
    pub fn wants_session(&self) -> bool {
        if !self.sessions {
            return false;
        }
        match &self.phase {
            Phase::Leading { .. } | Phase::Stopping { .. } => true,
            Phase::Following { .. } => {
                self.session_wanted
                    || matches!(
                        self.pending.as_deref(),
                        Some(Pending::Acquire { .. } | Pending::EndSession { .. })
                    )
            }
            Phase::Delayed { .. } | Phase::SittingOut { .. } | Phase::Exited => false,
        }
    }

    /// Whether `record` is held through this daemon's open session.
    pub(super) fn holds_session_of(&self, record: &Lease) -> bool {
        record.session.is_some()
            && record.session.as_ref() == self.own_session.as_ref().map(|v| &v.key)
    }

    /// Where the validity of a tenure just won with `lease` counts from:
    /// its own write's send (`sent`) for a self-leased record, the
    /// session's last successful write for one held through the session
    /// (even one sent after the take: the record names the session, and
    /// nobody takes what a live session holds, nor ends the session
    /// before it timed out from that write); `None` if that session is no
    /// longer open.
    pub(super) fn session_origin(&self, lease: &Lease, sent: Instant) -> Option<Instant> {
        let Some(key) = &lease.session else {
            return Some(sent);
        };
        self.own_session
            .as_ref()
            .filter(|v| &v.key == key)
            .map(|v| v.last_send)
    }

    /// A round found `election` held through the session `key`: read it.
    pub(super) fn read_session(&mut self, election: Lease, key: String) -> Option<Round> {
        self.pending = Some(Box::new(Pending::SessionRound {
            election: Followed {
                rvn: election.rvn,
                fencing_token: election.fencing_token,
                session: key.clone(),
            },
        }));
        self.out.push_back(Action::ReadSession {
            key,
            budget: self.cfg.renew_interval,
            not_before: None,
        });
        None
    }

    /// A round of an election followed by its session alone: read the
    /// session (an answer from a read sent once it was due will do).
    pub(super) fn start_session_round(&mut self, watch: SessionWatch) {
        let key = watch.election.session.clone();
        self.pending = Some(Box::new(Pending::SessionRound {
            election: watch.election,
        }));
        self.phase = Phase::Following { poll_at: self.now };
        self.out.push_back(Action::ReadSession {
            key,
            budget: self.cfg.renew_interval,
            not_before: Some(watch.due),
        });
    }

    pub(super) fn on_session_record(&mut self, tick: &Tick, answer: SessionAnswer) {
        let Some(Pending::SessionRound { election }) = self.pending.take().map(|p| *p) else {
            return;
        };
        let SessionAnswer {
            record,
            learned,
            flow,
            told,
            moved,
            yields,
        } = answer;
        let round = match record {
            Err(error) => {
                self.store_error("read_session", error);
                Some(Round::Failed)
            }
            Ok(record) => {
                let heard = Heard {
                    learned,
                    flow,
                    told,
                    moved,
                    yields,
                };
                self.consider_session(election, &record, heard, tick)
            }
        };
        if let Some(round) = round {
            self.end_round(round, tick);
        }
    }

    /// The session `election` is held through reads `record` (its `rvn`
    /// first `learned` then, if earlier; its owner's stream as in `flow`):
    /// judged by [`judge_session`]; a live session that timed out is ended
    /// before the election is taken.
    fn consider_session(
        &mut self,
        election: Followed,
        record: &Record,
        heard: Heard,
        tick: &Tick,
    ) -> Option<Round> {
        let Heard {
            learned,
            flow,
            told,
            moved,
            yields,
        } = heard;
        // Yielded on this record once already: not again.
        let yielded = self.yielded.take().is_some_and(|rvn| rvn == election.rvn);
        self.session_wanted = false;
        self.deferred_take = None;
        let at = self.now;
        let poll = at + self.cfg.retry_interval;
        // Whether a tenure of the session's owner may have ended since the
        // election was read, unaccounted for (the daemon's node judges,
        // from the session's count of ended tenures): then the election is
        // read again, whatever the stream told.
        let unmoved = !moved;
        let own_ms = u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let verdict = judge_session(
            &mut self.takeover,
            &election.session,
            record,
            at,
            learned,
            own_ms,
            &tick.stamp,
        );
        match verdict {
            // Written by a later build: never ended here, and what it
            // holds is never taken; looked at again every R.
            SessionVerdict::Unknown => return Some(Round::Wait(at + self.cfg.renew_interval)),
            SessionVerdict::WaitUntil(due) => {
                return Some(self.wait_on_session(election, due, flow, unmoved));
            }
            // The stream told of a later write than this (cached) record
            // shows: not ended on this answer while that write is not due.
            SessionVerdict::End { .. }
                if let Some(due) = told.and_then(|t| self.told_due(record, t.1)) =>
            {
                return Some(self.wait_on_session(election, due, flow, unmoved));
            }
            // Without a session to hold it through, the take (and the
            // session's end before it) is made as the session opens; but
            // for a daemon that ranks before this one (below), which is
            // given its moment first, read again after.
            _ if !self.may_take() => {
                if !yields || yielded {
                    self.defer_session_take(election, verdict);
                }
                return Some(Round::Wait(poll));
            }
            // A daemon that ranks before this one takes the election
            // first; read again a moment later, it is taken here only if
            // that daemon did not.
            _ if yields && !yielded => {
                self.yielded = Some(election.rvn);
                return Some(Round::Wait(at + self.cfg.retry_interval * YIELD_FOR));
            }
            SessionVerdict::End { ended, condition } if !self.skips_session_end() => {
                self.end_session(SessionEnd {
                    election,
                    ended,
                    condition,
                });
            }
            _ => self.take_election(election, tick),
        }
        None
    }

    /// End another daemon's timed-out session; the election is taken once
    /// that is answered ([`Core::session_ended`]).
    fn end_session(&mut self, end: SessionEnd) {
        let SessionEnd {
            election,
            ended,
            condition,
        } = end;
        self.pending = Some(Box::new(Pending::EndSession { election }));
        self.out.push_back(Action::Write {
            op: WriteOp::EndSession,
            lease: ended,
            condition,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    /// A live session of `election`'s holder is due at `due`. While the
    /// owner's stream flows, and flowed (and this election's events were
    /// handed to it) since before the election was read last, so that it
    /// told of every release since, and no tenure held through the
    /// session ended since that the daemon cannot account for (`unmoved`:
    /// see [`SessionAnswer::moved`]), the election is
    /// not read again: the next round reads the session alone, once it is
    /// due. Otherwise the election is polled every P as usual, but for the
    /// last poll before the session is due (within P, the count unmoved):
    /// that round too reads the session alone, at its due; every election
    /// of a dead daemon then goes from the read of its session to the end
    /// of the session and its take, without a read of its own record in
    /// between (it was read less than P before, and the take is
    /// conditional on what that read found). (The count comes from the
    /// store: a stream that leaves a release out delays its election's
    /// next read by a read of the session at most.)
    fn wait_on_session(
        &mut self,
        election: Followed,
        due: Instant,
        flow: Option<Flow>,
        unmoved: bool,
    ) -> Round {
        let at = self.now;
        let sent = self.last_read_sent;
        let aimed = self.hints.aimed_before(sent);
        let poll = at + self.cfg.retry_interval;
        let flow_until = match flow.filter(|f| unmoved && aimed && f.since <= sent && at < f.until)
        {
            Some(f) => Some(f.until),
            None if unmoved && due <= poll => None,
            None => return Round::Wait(poll.min(due)),
        };
        self.session_watch = Some(Box::new(SessionWatch {
            election,
            due,
            flow_until,
        }));
        Round::Wait(due)
    }

    /// When a write told at `at` of the session `record` is due, if it is
    /// not yet.
    fn told_due(&self, record: &Record, at: Instant) -> Option<Instant> {
        let Record::Valid(s) = record else {
            return None;
        };
        let due = at + takeover_wait(s.lease_ms, self.cfg.max_clock_drift);
        (due > self.now).then_some(due)
    }

    /// Whether the deliberate defect "take over without ending the session"
    /// is on (model checker only).
    fn skips_session_end(&self) -> bool {
        #[cfg(test)]
        if self.mutations.session_end_skipped {
            return true;
        }
        false
    }

    /// Take over `election`, whose session is over.
    fn take_election(&mut self, election: Followed, tick: &Tick) {
        let token = self.next_token(Some(election.fencing_token), tick);
        let lease = self.new_lease(token, tick);
        self.acquire(WriteOp::TakeOver, lease, Condition::RvnIs(election.rvn));
    }

    /// The end of the session `election` is held through was answered.
    pub(super) fn session_ended(
        &mut self,
        tick: &Tick,
        election: Followed,
        res: Result<WriteOutcome, StoreError>,
    ) {
        let ended = match &res {
            Ok(WriteOutcome::Applied) => true,
            // Someone else ended it first: as good.
            Ok(WriteOutcome::ConditionFailed {
                current: Some(Record::Valid(s)),
            }) => s.holder.is_none(),
            _ => false,
        };
        self.takeover.forget();
        if ended && self.may_take() {
            self.take_election(election, tick);
            return;
        }
        let round = match res {
            Err(error) => {
                self.store_error(WriteOp::EndSession.label(), error);
                Round::Failed
            }
            _ => Round::Lost,
        };
        self.end_round(round, tick);
    }

    /// The daemon's session as it stands now. A tenure held through it
    /// is valid as long as it is; once it is gone (ended by a follower,
    /// deleted, or replaced by a new one), so is every such tenure.
    pub(super) fn on_session(&mut self, tick: &Tick, view: Option<Arc<SessionView>>) {
        self.own_session = view.clone();
        // The session a round waited for is open: take the election now
        // rather than at the next poll (a graceful handover waits on it),
        // with the write that round would have made (its condition keeps
        // a record that changed since), or else a new round.
        // (Closing the app check drops the want and the deferred take:
        // see `on_gate`.)
        if self.session_wanted
            && self.pending.is_none()
            && matches!(self.phase, Phase::Following { .. })
            && self.can_hold()
        {
            self.session_wanted = false;
            match self.deferred_take.take().map(|t| *t) {
                Some(DeferredTake {
                    end_first: Some(end),
                    ..
                }) => self.end_session(*end),
                Some(take) => {
                    let token = self.next_token(take.previous, tick);
                    let lease = self.new_lease(token, tick);
                    self.acquire(take.op, lease, take.condition);
                }
                None => self.start_round(),
            }
            return;
        }
        // A tenure being released is over, whatever the session does
        // next: a renew of it must never revive it.
        if matches!(
            self.pending.as_deref(),
            Some(Pending::Release { .. } | Pending::ReleaseConflict { .. })
        ) {
            return;
        }
        // Taken out, not copied: every election held through the session
        // comes here at each of its writes.
        let phase = std::mem::replace(&mut self.phase, Phase::Exited);
        let Phase::Leading {
            mut term,
            role,
            next_renew,
        } = phase
        else {
            self.phase = phase;
            return;
        };
        let put_back = |term| Phase::Leading {
            term,
            role,
            next_renew,
        };
        if term.lease.session.is_none() {
            self.phase = put_back(term);
            return;
        }
        match view {
            Some(v) if term.lease.session.as_ref() == Some(&v.key) => {
                if v.last_send > term.last_send {
                    term.last_send = v.last_send;
                    self.publish_validity(&term, role);
                }
                self.phase = put_back(term);
            }
            _ => {
                self.note(Note::SessionLost(term.lease.fencing_token));
                let valid_until = term.last_send + self.cfg.validity();
                let kill_at = (self.now + self.cfg.kill_grace).min(valid_until);
                self.enter_stopping(term, kill_at);
            }
        }
    }

    /// The tenure's validity moved on with the session's.
    fn publish_validity(&mut self, term: &Term, role: super::Role) {
        let valid_until = term.last_send + self.cfg.validity();
        self.state.role = role;
        self.state.tenure = Some(Self::tenure_of(term, valid_until, self.stop_at(term)));
    }
}
