//! What the driver reports: each store request timed for metrics (under
//! its election's name, or `#session` for the daemon's session, its reads
//! of other sessions and the read-back of its records), store errors
//! logged once per change, and what the node noted, as logs and metrics.
//! It decides nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::error_log::{Burst, Crowd, ErrorLog, RequestKind, Tallies};
use crate::clock::Instant;
use crate::core::election::{ElectionConfig, Note};
use crate::core::node::ElectionId;
use crate::election::{Observer, Outcome, SESSION_LABEL, Transition};
use crate::lease::StoreError;
use crate::text;

/// Under what a store request is counted for metrics and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Metric {
    /// An election's own request (`op`), under its name.
    Election(ElectionId, &'static str),
    /// The daemon's session's request (`op`), under `#session`.
    Own(&'static str),
    /// A read of another daemon's session shared by the elections that
    /// time it, under `#session` (its errors are the elections' to log).
    Shared,
    /// The read-back of the records held through the session, under
    /// `#session`.
    Check,
    /// The records of elections that asked for them together, read in one
    /// request, under `#session` (their errors are the elections' to log).
    Reads,
    /// Not counted (a read that only confirms a write).
    None,
}

/// The metric `op` of the read-back's reads.
const CHECK_OP: &str = "read_check";
/// The metric `op` of the reads of many elections' records.
const READS_OP: &str = "read_elections";

/// What the driver reports, and what it remembers to log once per change.
pub(super) struct Report {
    observer: Arc<dyn Observer>,
    identity: String,
    /// R: how long until the read-back tries again.
    every: Duration,
    /// Store errors of the elections that have a streak of them.
    errors: HashMap<ElectionId, ErrorLog>,
    /// The same, daemon-wide: logged by the first election to meet one.
    crowd: Crowd,
    /// Warnings many elections give for one cause: releases that fail,
    /// streams distrusted.
    tallies: Tallies,
    /// The leases lost in the input being handled, by cause.
    losses: Burst,
    /// The daemon's session's store errors.
    session: ErrorLog,
    /// The read-back's store errors.
    check: ErrorLog,
}

impl Report {
    /// A report of the daemon `identity` to `observer`; `every`: R.
    pub(super) fn new(observer: Arc<dyn Observer>, identity: String, every: Duration) -> Report {
        Report {
            observer,
            identity,
            every,
            errors: HashMap::new(),
            crowd: Crowd::default(),
            tallies: Tallies::default(),
            losses: Burst::default(),
            session: ErrorLog::default(),
            check: ErrorLog::default(),
        }
    }

    /// A request counted as `metric` took `took` and came to `outcome`
    /// (`answered`: the store answered, a failed condition included);
    /// `cfg`: its election's settings, for an election's.
    pub(super) fn request(
        &mut self,
        metric: Metric,
        cfg: Option<&ElectionConfig>,
        took: Duration,
        outcome: Outcome<'_>,
        now: Instant,
    ) {
        match metric {
            Metric::Election(id, op) => {
                let Some(cfg) = cfg else { return };
                self.observer.store_request(&cfg.name, op, took, outcome);
                if !matches!(outcome, Outcome::Failed(_)) {
                    self.election_answered(id, cfg, op, now);
                }
            }
            Metric::Own(op) => {
                if op == crate::core::election::WriteOp::RenewSession.label() {
                    // The renewals every tenure held through the session
                    // rely on: counted (and alerted on) as an election's
                    // own were.
                    self.observer.renew(SESSION_LABEL, outcome);
                }
                self.observer
                    .store_request(SESSION_LABEL, op, took, outcome);
                self.session_outcome(op, outcome, now);
            }
            Metric::Shared => {
                self.observer
                    .store_request(SESSION_LABEL, "read_session", took, outcome);
            }
            Metric::Reads => {
                self.observer
                    .store_request(SESSION_LABEL, READS_OP, took, outcome);
            }
            Metric::Check => {
                self.observer
                    .store_request(SESSION_LABEL, CHECK_OP, took, outcome);
                self.check_outcome(outcome, now);
            }
            Metric::None => {}
        }
    }

    /// A store request of an election's `op` kind was answered.
    pub(super) fn election_answered(
        &mut self,
        id: ElectionId,
        cfg: &ElectionConfig,
        op: &str,
        now: Instant,
    ) {
        let kind = RequestKind::of(op);
        let Some(log) = self.errors.get_mut(&id) else {
            return;
        };
        if let Some(streak) = log.succeeded(kind) {
            let failing = now - streak.since;
            match self.crowd.left(kind, streak.class, now) {
                Some(all) if all.now == 0 => {
                    tracing::info!(election = %cfg.name, identity = %cfg.identity, failures = streak.count, failing_ms = failing.as_millis() as u64, elections = all.joined, "store {} work again (for every election that met the error)", kind.plural())
                }
                Some(all) => {
                    tracing::info!(election = %cfg.name, identity = %cfg.identity, failures = streak.count, failing_ms = failing.as_millis() as u64, elections_still_failing = all.now, "store {} work again", kind.plural())
                }
                None => {
                    tracing::debug!(election = %cfg.name, failures = streak.count, "store {} work again", kind.plural())
                }
            }
        }
        if log.reads.is_none() && log.writes.is_none() {
            self.errors.remove(&id);
        }
    }

    /// The once-per-change error log of the session's requests.
    fn session_outcome(&mut self, op: &'static str, outcome: Outcome<'_>, now: Instant) {
        let kind = RequestKind::of(op);
        let id = &self.identity;
        match outcome {
            Outcome::Failed(e) => {
                if let Some(previous) =
                    self.session
                        .failed(kind, e.to_string(), e.metric_label(), now)
                {
                    tracing::warn!(identity = %id, op, previous_failures = previous, "session store {} fail: {e}", kind.plural());
                }
            }
            _ => {
                if let Some(streak) = self.session.succeeded(kind) {
                    tracing::info!(identity = %id, failures = streak.count, "session store {} work again", kind.plural());
                }
            }
        }
    }

    /// The once-per-change error log of the read-back.
    fn check_outcome(&mut self, outcome: Outcome<'_>, now: Instant) {
        let id = &self.identity;
        match outcome {
            Outcome::Failed(e) => {
                if let Some(previous) =
                    self.check
                        .failed(RequestKind::Read, e.to_string(), e.metric_label(), now)
                {
                    tracing::warn!(identity = %id, previous_failures = previous, "cannot check the records held through the session (tried again in {:?}): {e}", self.every);
                }
            }
            _ => {
                if let Some(streak) = self.check.succeeded(RequestKind::Read) {
                    tracing::info!(identity = %id, failures = streak.count, "the check of the records held through the session reads again");
                }
            }
        }
    }

    fn store_error(
        &mut self,
        id: ElectionId,
        cfg: &ElectionConfig,
        op: &'static str,
        e: &StoreError,
        now: Instant,
    ) {
        let kind = RequestKind::of(op);
        let class = e.metric_label();
        let log = self.errors.entry(id).or_default();
        let before = log.streak(kind).as_ref().map(|s| s.class);
        let changed = log.failed(kind, e.to_string(), class, now);
        if let Some(old) = before.filter(|old| *old != class) {
            // Still failing: the end of the old class is not logged.
            let _ = self.crowd.left(kind, old, now);
        }
        let fresh = self.crowd.met(kind, class, before != Some(class), now);
        match changed {
            Some(0) if fresh => {
                tracing::warn!(election = %cfg.name, identity = %cfg.identity, op, error = %e, class, "store request failed (logged again only when the error changes; other elections that meet it are counted, not logged)")
            }
            Some(previous)
                if fresh || before == Some(class) && self.crowd.size(kind, class) == 1 =>
            {
                tracing::warn!(election = %cfg.name, identity = %cfg.identity, op, error = %e, class, previous_error_repeats = previous, "store request failed with another error")
            }
            _ => {
                tracing::debug!(election = %cfg.name, op, error = %e, "store request failed again")
            }
        }
    }

    /// Log and count what the node noted: of an election (`cfg`, its
    /// settings), or of the daemon's session and its reads.
    pub(super) fn note(
        &mut self,
        election: Option<(ElectionId, &ElectionConfig)>,
        note: Note,
        now: Instant,
    ) {
        let Some((id, cfg)) = election else {
            match note {
                Note::RenewSent(late) => self.observer.renew_sent(SESSION_LABEL, late),
                // A shared read's or the read-back's error: logged by the
                // elections that asked, and by `check_outcome`.
                other => tracing::debug!(note = ?other, "node"),
            }
            return;
        };
        let (name, me) = (cfg.name.as_str(), cfg.identity.as_str());
        match note {
            Note::StoreError { op, error } => self.store_error(id, cfg, op, &error, now),
            Note::Acquire { op, outcome: res } => {
                self.observer.acquire_attempt(name, as_outcome(&res));
                if matches!(res, Ok(false)) {
                    tracing::debug!(election = %name, op = op.label(), "acquisition lost the race");
                }
            }
            Note::Renew(res) => self.observer.renew(name, as_outcome(&res)),
            Note::Gained(token) => {
                self.observer.transition(name, Transition::Gained);
                tracing::info!(election = %name, identity = %me, fencing_token = token, "became leader");
            }
            Note::Lost => self.observer.transition(name, Transition::Lost),
            Note::Renewed(token) => {
                tracing::debug!(election = %name, fencing_token = token, "renewed")
            }
            Note::RenewSent(late) => self.observer.renew_sent(name, late),
            Note::AdoptedEarlierWrite => {
                tracing::debug!(election = %name, "an earlier renew had applied; continuing from it")
            }
            Note::RenewingAfterReplacement(token) => {
                tracing::warn!(election = %name, identity = %me, fencing_token = token, "the lease store's data was replaced under us; renewing at once to learn whether we still lead")
            }
            note @ (Note::LeaseLost { .. } | Note::SessionLost(_)) => self.lost(cfg, note),
            note => self.tenure_note(cfg, note, now),
        }
    }

    /// A tenure ended because its lease was lost: logged with its election
    /// for the first few of an input, summed for the rest (see [`Burst`]).
    fn lost(&mut self, cfg: &ElectionConfig, note: Note) {
        let (name, me) = (cfg.name.as_str(), cfg.identity.as_str());
        self.observer.lease_lost(name);
        let cause = match &note {
            Note::LeaseLost {
                written_by: None, ..
            } => CAUSE_NOT_RENEWED,
            Note::LeaseLost { .. } => CAUSE_WRITTEN,
            _ => CAUSE_SESSION,
        };
        if !self.losses.one(cause) {
            tracing::debug!(election = %name, cause, "lease lost");
            return;
        }
        match note {
            Note::LeaseLost {
                fencing_token,
                written_by: Some(by),
            } => {
                tracing::warn!(election = %name, identity = %me, fencing_token, cause, written_by = %by, "lease lost: stopping the child")
            }
            Note::LeaseLost { fencing_token, .. } | Note::SessionLost(fencing_token) => {
                tracing::warn!(election = %name, identity = %me, fencing_token, cause, "lease lost: stopping the child")
            }
            _ => {}
        }
    }

    /// The input that was being handled is over: the leases it lost that
    /// were not logged each, summed by cause.
    pub(super) fn input_handled(&mut self) {
        for (cause, count) in self.losses.end() {
            tracing::warn!(identity = %self.identity, lost = count, cause, "lease lost by {count} more elections at the same moment (each counted in leaderd_leases_lost_total, each shown in /status)");
        }
    }

    /// The notes of a tenure's end and of records, logged.
    fn tenure_note(&mut self, cfg: &ElectionConfig, note: Note, now: Instant) {
        let (name, me) = (cfg.name.as_str(), cfg.identity.as_str());
        match note {
            Note::TenureEnded(token) => {
                tracing::info!(election = %name, identity = %me, fencing_token = token, "tenure ended; campaigning again")
            }
            Note::Released {
                fencing_token,
                successor,
            } => {
                tracing::info!(election = %name, identity = %me, fencing_token, successor = successor.as_deref().unwrap_or("(anyone)"), "released the lease")
            }
            Note::NothingToRelease(token) => {
                tracing::warn!(election = %name, identity = %me, fencing_token = token, "nothing to release: someone else wrote the lease record since our last write")
            }
            Note::ReleaseFailed(e) => {
                if self.tallies.seen(RELEASE_FAILED, e.metric_label(), now) {
                    tracing::warn!(election = %name, identity = %me, error = %e, class = e.metric_label(), "release failed; the lease will expire on its own (more releases that fail with this class of error within seconds are counted, and logged together)")
                } else {
                    tracing::debug!(election = %name, error = %e, "release failed")
                }
            }
            Note::SittingOut(d) => {
                tracing::info!(election = %name, identity = %me, sit_out = %text::duration(d), "sitting out before campaigning again")
            }
            Note::StreamDistrusted { holder, address } => {
                let key = address.as_deref().unwrap_or("(none)");
                if self.tallies.seen(STREAM_DISTRUSTED, key, now) {
                    tracing::warn!(election = %name, holder = ?holder, address = ?address, "the leader's watch stream does not match the lease store; polling the store instead for this tenure (more elections that distrust a stream from this address within seconds are counted, and logged together)")
                } else {
                    tracing::debug!(election = %name, address = ?address, "stream distrusted")
                }
            }
            note => self.record_note(name, note),
        }
    }

    /// The counts of the warnings many elections gave that are due at
    /// `now` (`None`: all, the node ended), logged.
    pub(super) fn tallies_due(&mut self, now: Option<Instant>) {
        for (kind, key, count) in self.tallies.due(now) {
            match kind {
                RELEASE_FAILED => {
                    tracing::warn!(failed = count, class = %key, "{count} more releases failed with {key} errors (each lease expires on its own, or at once where the session it was held through ends)")
                }
                _ => {
                    tracing::warn!(elections = count, address = %key, "{count} more elections found the watch stream from {key} not matching the lease store; each polls the store instead for this tenure")
                }
            }
        }
    }

    /// Log and count what the node noted of a record it cannot use as it
    /// is: malformed, or of a format this build does not know.
    fn record_note(&self, name: &str, note: Note) {
        match note {
            Note::Malformed(problem) => {
                tracing::warn!(election = %name, problem = %problem, "lease record is malformed; it will be overwritten only if it stays unchanged for a full lease");
                self.observer.malformed_record(name);
            }
            Note::UnknownFormat { format, holder } => {
                tracing::warn!(election = %name, format = %format, holder = %holder.as_deref().unwrap_or("(unreadable)"), "lease record has format {format}, and this build knows formats {}: it is left alone, never taken over or overwritten however long it stays; upgrade this instance", crate::lease::known_formats());
                self.observer.unknown_format_record(name);
            }
            Note::OverwritingMalformed => {
                tracing::warn!(election = %name, "overwriting a malformed lease record that stayed unchanged for a full lease")
            }
            other => tracing::debug!(election = %name, note = ?other, "node"),
        }
    }
}

/// The kinds of [`Tallies`] lines.
const RELEASE_FAILED: &str = "release_failed";
const STREAM_DISTRUSTED: &str = "stream_distrusted";

/// Why a lease was lost, as the log says it.
const CAUSE_NOT_RENEWED: &str = "no successful renew before validity - kill_grace";
const CAUSE_WRITTEN: &str = "someone else wrote the lease record";
const CAUSE_SESSION: &str = "the session it was held through is gone (ended by another instance, deleted, or not renewed in time)";

/// A noted outcome as the observer takes it.
fn as_outcome(res: &Result<bool, StoreError>) -> Outcome<'_> {
    match res {
        Ok(true) => Outcome::Ok,
        Ok(false) => Outcome::Lost,
        Err(e) => Outcome::Failed(e),
    }
}
