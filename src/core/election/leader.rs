//! The leader's rules: when its tenure is valid, when to renew, when the
//! job must stop, and how the lease is released (to a named successor or
//! anyone).

use super::{Action, AfterRelease, Core, Note, Pending, Phase, Role, Tenure, Term, Tick, WriteOp};
use crate::core::hints::LeaseEvent;
use crate::core::record::{Condition, Lease, Record, WriteOutcome};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

impl Core {
    pub(super) fn stop_at(&self, term: &Term) -> Instant {
        (term.last_send + self.cfg.validity()).saturating_sub(self.cfg.kill_grace)
    }

    /// When to renew after a write sent at `send`: R later, rounded down to
    /// a grid of R/20 shared by every election of this process. Only the
    /// first renewal of a tenure moves (earlier, by less than R/20, which
    /// is always safe); the later ones are R apart on the grid. Elections
    /// whose renewals fall in the same tick are renewed in one wake-up, and
    /// their requests and answers are handled in batches (see
    /// docs/benchmarks.md for what other grids cost).
    pub(super) fn renew_due(&self, send: Instant) -> Instant {
        (send + self.cfg.renew_interval).floor_to(self.cfg.renew_interval / 20)
    }

    pub(super) fn enter_lead(&mut self, term: Term, tick: &Tick) {
        self.hints.stop();
        let role = if self.now < term.leads_from {
            Role::Confirming
        } else {
            Role::Leader
        };
        self.publish_term(&term, role, tick);
        if role == Role::Leader {
            self.note(Note::Gained(term.lease.fencing_token));
        }
        // Replacements noticed before this tenure's first write are old
        // news: that write went to what the store names now.
        self.out.push_back(Action::ForgetStoreChanges);
        let next_renew = self.renew_due(term.last_send);
        self.phase = Phase::Leading {
            term: Box::new(term),
            role,
            next_renew,
        };
    }

    pub(super) fn tenure_of(term: &Term, valid_until: Instant, stop_at: Instant) -> Tenure {
        Tenure {
            fencing_token: term.lease.fencing_token,
            since_unix_ms: term.lease.acquired_at_ms,
            since: term.since,
            valid_until,
            stop_at,
            seq: term.seq,
            lease_ms: term.lease.lease_ms,
        }
    }

    pub(super) fn publish_term(&mut self, term: &Term, role: Role, tick: &Tick) {
        let valid_until = term.last_send + self.cfg.validity();
        let tenure = Self::tenure_of(term, valid_until, self.stop_at(term));
        let me = self.cfg.identity.clone();
        // Followers hear of the write only after it succeeded.
        self.out.push_back(Action::Tell(LeaseEvent::Renewed {
            election: self.cfg.name.clone(),
            holder: me.clone(),
            rvn: term.lease.rvn.clone(),
            fencing_token: term.lease.fencing_token,
            lease_ms: term.lease.lease_ms,
        }));
        self.observed_ok(tick, Some(me), Some(term.lease.fencing_token), None);
        self.state.session = term.lease.session.clone();
        let s = &mut self.state;
        s.role = role;
        s.tenure = Some(tenure);
        // Holding a tenure, it watches nobody: a stream it heard as a
        // follower must not count once it follows again (after a resign's
        // sit-out) until it hears one anew.
        s.hints_until = None;
    }

    /// While leading, at any input: begin leading once confirmed, stop
    /// when no renew succeeded by validity − G, renew when due.
    pub(super) fn leading_tick(&mut self, tick: &Tick) {
        let Phase::Leading {
            term,
            mut role,
            next_renew,
        } = self.phase.clone()
        else {
            return;
        };
        let now = self.now;
        if role == Role::Confirming && now >= term.leads_from {
            role = Role::Leader;
            self.publish_term(&term, role, tick);
            self.note(Note::Gained(term.lease.fencing_token));
            self.phase = Phase::Leading {
                term: term.clone(),
                role,
                next_renew,
            };
        }
        let stop_at = self.stop_at(&term);
        let valid_until = term.last_send + self.cfg.validity();
        if now >= stop_at {
            self.note(Note::LeaseLost {
                fencing_token: term.lease.fencing_token,
                written_by: None,
            });
            self.enter_stopping(term, valid_until);
            return;
        }
        // Held through the session, which renews for every election.
        if self.sessions || now < next_renew {
            return;
        }
        // Renew. The request may not outlive the stop time: past it the
        // answer no longer matters to this tenure.
        let renewed = term.lease.renewed_with(&tick.stamp);
        let condition = Condition::HeldBy {
            rvn: term.lease.rvn.clone(),
            holder: self.cfg.identity.clone(),
        };
        #[cfg(test)]
        let condition = if self.mutations.renew_ignores_rvn {
            Condition::HolderIs(self.cfg.identity.clone())
        } else {
            condition
        };
        self.remember_own(&renewed.rvn);
        // Late when this task woke late: the runtime or the host was busy.
        self.note(Note::RenewSent(now - next_renew));
        self.pending = Some(Box::new(Pending::Renew {
            renewed: renewed.clone(),
            sent: now,
        }));
        self.out.push_back(Action::Write {
            op: WriteOp::Renew,
            lease: renewed,
            condition,
            budget: self.cfg.renew_interval.min(stop_at - now),
            deadline: Some(stop_at),
        });
    }

    pub(super) fn renewed(
        &mut self,
        tick: &Tick,
        renewed: Lease,
        sent: Instant,
        res: Result<WriteOutcome, StoreError>,
    ) {
        let Phase::Leading { mut term, role, .. } = self.phase.clone() else {
            return;
        };
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Renew(Ok(true)));
                term.lease = renewed;
                term.last_send = self.validity_origin(sent);
                let next_renew = self.renew_due(sent);
                self.publish_term(&term, role, tick);
                self.note(Note::Renewed(term.lease.fencing_token));
                self.phase = Phase::Leading {
                    term,
                    role,
                    next_renew,
                };
            }
            Ok(WriteOutcome::ConditionFailed { current }) => {
                match current {
                    Some(record) => self.renew_conflict(Some(record)),
                    None => {
                        // An earlier renew whose answer was lost may have
                        // applied: read back to know.
                        let stop_at = self.stop_at(&term);
                        self.pending = Some(Box::new(Pending::RenewConflict));
                        self.out.push_back(Action::Read {
                            budget: self.cfg.renew_interval.min(stop_at - self.now),
                            confirming: true,
                        });
                    }
                }
            }
            Err(error) => {
                self.note(Note::Renew(Err(error.clone())));
                self.store_error("renew", error);
                self.phase = Phase::Leading {
                    term,
                    role,
                    next_renew: self.now + self.cfg.retry_interval,
                };
            }
        }
    }

    /// A renew failed its condition and `current` is the record after it
    /// (`None`: unknown). If it is still ours (a renew whose answer was
    /// lost applied after all), carry on from it and renew again at once;
    /// validity still counts from the last write known to have succeeded.
    /// Else the lease is lost.
    pub(super) fn renew_conflict(&mut self, current: Option<Record>) {
        let Phase::Leading { mut term, role, .. } = self.phase.clone() else {
            return;
        };
        if let Some(rvn) = self.still_ours(current.as_ref(), &term) {
            self.note(Note::AdoptedEarlierWrite);
            term.lease.rvn = rvn;
            self.phase = Phase::Leading {
                term,
                role,
                next_renew: self.now,
            };
            return;
        }
        self.note(Note::Renew(Ok(false)));
        self.lose(term, current);
    }

    /// The daemon's check found the record of the tenure `fencing_token`
    /// reading `record`: lost unless still ours. Only a tenure held
    /// through the session, with no request of its own in flight (a
    /// release's answer says more).
    pub(super) fn on_checked(&mut self, fencing_token: u64, record: Record) {
        let Phase::Leading { term, .. } = &self.phase else {
            return;
        };
        if term.lease.session.is_none()
            || term.lease.fencing_token != fencing_token
            || self.pending.is_some()
            || self.still_ours(Some(&record), term).is_some()
        {
            return;
        }
        let term = term.clone();
        self.lose(term, Some(record));
    }

    /// `term` is over: someone else wrote its record (as `current` shows).
    fn lose(&mut self, term: Box<Term>, current: Option<Record>) {
        let written_by = match &current {
            Some(Record::Valid(l)) => l.holder.clone().unwrap_or_else(|| "(released)".into()),
            Some(Record::Absent) => "(item deleted)".into(),
            Some(Record::Malformed(m)) => format!("(malformed: {})", m.problem),
            Some(Record::UnknownFormat(u)) => match &u.holder {
                Some(h) => format!("{h} (in a record of unknown format {})", u.format),
                None => format!("(a record of unknown format {})", u.format),
            },
            None => "(unknown)".into(),
        };
        self.note(Note::LeaseLost {
            fencing_token: term.lease.fencing_token,
            written_by: Some(written_by),
        });
        self.takeover.forget();
        let valid_until = term.last_send + self.cfg.validity();
        let kill_at = (self.now + self.cfg.kill_grace).min(valid_until);
        self.enter_stopping(term, kill_at);
    }

    /// The rvn to continue from when `current` is still `term`'s: our
    /// identity, its token, an rvn we wrote.
    pub(super) fn still_ours(&self, current: Option<&Record>, term: &Term) -> Option<String> {
        match current {
            Some(Record::Valid(l))
                if l.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && l.fencing_token == term.lease.fencing_token
                    && self.own_rvns.contains(&l.rvn) =>
            {
                Some(l.rvn.clone())
            }
            _ => None,
        }
    }

    pub(super) fn on_store_replaced(&mut self) {
        if let Phase::Leading {
            term,
            role,
            next_renew: _,
        } = self.phase.clone()
        {
            self.note(Note::RenewingAfterReplacement(term.lease.fencing_token));
            self.phase = Phase::Leading {
                term,
                role,
                next_renew: self.now,
            };
        }
    }

    pub(super) fn enter_stopping(&mut self, term: Box<Term>, kill_at: Instant) {
        // Stop now; the job must be dead by `kill_at`, never after validity.
        let valid_until = kill_at.min(term.last_send + self.cfg.validity());
        let tenure = Self::tenure_of(&term, valid_until, self.now.min(valid_until));
        let was_leader = self.state.role == Role::Leader;
        self.state.role = Role::Stopping;
        self.state.tenure = Some(tenure);
        if was_leader {
            self.note(Note::Lost);
        }
        self.tell_not_leader();
        self.phase = Phase::Stopping { term, valid_until };
    }

    pub(super) fn tell_not_leader(&mut self) {
        self.out.push_back(Action::Tell(LeaseEvent::NotLeader {
            election: self.cfg.name.clone(),
        }));
        self.out.push_back(Action::TenureOver);
    }

    pub(super) fn on_release(
        &mut self,
        tick: &Tick,
        then: AfterRelease,
        successor: Option<String>,
    ) {
        match self.phase.clone() {
            Phase::Leading { term, role, .. } => self.release(tick, term, role, successor, then),
            Phase::Stopping { term, .. } => {
                // The caller stopped the job; the record may still be ours,
                // so release it if we can.
                self.release(tick, term, Role::Stopping, successor, then);
            }
            // Not leading: nothing to release, and a step-down (resign)
            // changes nothing either; only an exit ends the election.
            _ => {
                self.out.push_back(Action::Answer(false));
                if then == AfterRelease::Exit {
                    self.phase = Phase::Exited;
                }
            }
        }
    }

    pub(super) fn on_orphaned(&mut self, tick: &Tick) {
        match self.phase.clone() {
            Phase::Leading { term, role, .. } => {
                self.release(tick, term, role, None, AfterRelease::Exit)
            }
            _ => self.phase = Phase::Exited,
        }
    }

    pub(super) fn release(
        &mut self,
        tick: &Tick,
        term: Box<Term>,
        role: Role,
        successor: Option<String>,
        then: AfterRelease,
    ) {
        // Not leading from here on, whatever the store answers.
        self.state.role = Role::Follower;
        self.state.tenure = None;
        self.state.leader = None;
        if role == Role::Leader {
            self.note(Note::Lost);
        }
        let rvn = term.lease.rvn.clone();
        self.write_release(tick, term, rvn, successor, then, false);
    }

    /// Write `term`'s lease released (to `successor`, or anyone) under the
    /// condition that the record still holds `rvn` and names us; `again`:
    /// the second try, from an rvn of ours found after the first failed.
    fn write_release(
        &mut self,
        tick: &Tick,
        term: Box<Term>,
        rvn: String,
        successor: Option<String>,
        then: AfterRelease,
        again: bool,
    ) {
        let lease = term.lease.handed_to_with(successor.clone(), &tick.stamp);
        let condition = Condition::HeldBy {
            rvn,
            holder: self.cfg.identity.clone(),
        };
        self.pending = Some(Box::new(Pending::Release {
            term,
            lease: lease.clone(),
            successor,
            then,
            again,
            sent: self.now,
        }));
        self.out.push_back(Action::Write {
            op: WriteOp::Release,
            lease,
            condition,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    pub(super) fn on_written(&mut self, tick: &Tick, res: Result<WriteOutcome, StoreError>) {
        match self.pending.take().map(|p| *p) {
            Some(Pending::Acquire { op, lease, sent }) => self.acquired(tick, op, lease, sent, res),
            Some(Pending::Renew { renewed, sent }) => self.renewed(tick, renewed, sent, res),
            Some(Pending::EndSession { election }) => self.session_ended(tick, election, res),
            Some(Pending::Release {
                term,
                lease,
                successor,
                then,
                again,
                sent,
            }) => match res {
                Ok(WriteOutcome::ConditionFailed { current }) if !again => match current {
                    Some(record) => {
                        self.release_conflict(tick, term, Some(record), successor, then)
                    }
                    None => {
                        self.pending = Some(Box::new(Pending::ReleaseConflict {
                            term,
                            successor,
                            then,
                        }));
                        self.out.push_back(Action::Read {
                            budget: self.cfg.renew_interval,
                            confirming: true,
                        });
                    }
                },
                res => self.released(tick, res, &lease, successor, then, sent),
            },
            other => self.pending = other.map(Box::new),
        }
    }

    /// A release failed its condition; `current` is the record after it.
    /// A renew whose answer was lost may have applied after all: the record
    /// then carries an rvn we wrote. Release that one instead.
    pub(super) fn release_conflict(
        &mut self,
        tick: &Tick,
        term: Box<Term>,
        current: Option<Record>,
        successor: Option<String>,
        then: AfterRelease,
    ) {
        match self.still_ours(current.as_ref(), &term) {
            Some(rvn) => self.write_release(tick, term, rvn, successor, then, true),
            None => self.released(
                tick,
                Ok(WriteOutcome::ConditionFailed { current: None }),
                &term.lease,
                successor,
                then,
                self.now,
            ),
        }
    }

    /// The release's last write, sent at `sent`, ended with `res`
    /// (`lease`: what it wrote, of the tenure's fencing token).
    pub(super) fn released(
        &mut self,
        tick: &Tick,
        res: Result<WriteOutcome, StoreError>,
        lease: &Lease,
        successor: Option<String>,
        then: AfterRelease,
        sent: Instant,
    ) {
        let token = lease.fencing_token;
        let applied = matches!(res, Ok(WriteOutcome::Applied));
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Released {
                    fencing_token: token,
                    successor: successor.clone(),
                });
                // Only now: a follower that acts on it finds it released.
                self.out.push_back(Action::Tell(LeaseEvent::Released {
                    election: self.cfg.name.clone(),
                    rvn: lease.rvn.clone(),
                    fencing_token: token,
                    successor,
                }));
                self.out.push_back(Action::TenureOver);
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                self.note(Note::NothingToRelease(token));
                self.tell_not_leader();
            }
            Err(error) => {
                self.note(Note::ReleaseFailed(error));
                self.tell_not_leader();
            }
        }
        self.own_rvns.clear();
        self.takeover.forget();
        self.out.push_back(Action::Answer(true));
        match then {
            AfterRelease::Exit => self.phase = Phase::Exited,
            AfterRelease::SitOut(d) => {
                self.takeover.forget();
                self.note(Note::SittingOut(d));
                self.phase = Phase::SittingOut {
                    until: self.now + d,
                };
            }
            // The store took the record we wrote: the first round's read,
            // as if sent with the release (it was seen after that),
            // instead of one more request.
            AfterRelease::Follow if applied => {
                self.phase = Phase::Following { poll_at: self.now };
                self.read_with_a_write(Record::Valid(lease.clone()), sent, tick);
            }
            AfterRelease::Follow => self.start_round(),
        }
    }
}
