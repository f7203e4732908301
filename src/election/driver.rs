//! The driver: the tokio task that runs one election's [`Core`]. It owns
//! every piece of IO the core must not: the store requests the core asks
//! for (timed for metrics, their errors logged once per change), the
//! clock, the stamps of new writes, the commands, the app check's verdict,
//! the leader's watch stream and the channels the state and the events
//! are published on. It decides nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use std::time::Duration;

use super::error_log::{ErrorLog, RequestKind};
use super::hint_feed::HintFeed;
use super::session_reads::SessionReads;
use super::session_task::DemandShare;
use super::{Command, ElectionState, Observer, Outcome, Transition};
use crate::app_check::Verdict;
use crate::clock::{Clock, Instant};
use crate::core::election::{Action, Core, Input, Note, Tick, WriteOp};
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::node::CountBasis;
use crate::core::session::{SessionAnswer, SessionView};
use crate::lease::{Condition, Lease, LeaseStore, Stamp, StoreError, WriteOutcome};
use crate::text;

/// One election's task: see the module docs.
pub(super) struct Driver {
    pub(super) core: Core,
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) clock: Clock,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) state_tx: watch::Sender<ElectionState>,
    pub(super) events: watch::Sender<Option<LeaseEvent>>,
    pub(super) commands: mpsc::Receiver<Box<Command>>,
    /// The app check's verdict; `None`: no app check.
    pub(super) gate: Option<watch::Receiver<Verdict>>,
    /// The watch client; `None`: no hints (or the client is gone).
    pub(super) feed: Option<HintFeed>,
    /// Moves when the store notices its data was replaced under it.
    pub(super) store_changes: Option<watch::Receiver<u64>>,
    /// The daemon's session, when tenures are held through it.
    pub(super) session: Option<watch::Receiver<Option<SessionView>>>,
    /// Reads of session records shared with the daemon's other elections.
    pub(super) session_reads: Option<Arc<SessionReads>>,
    /// This election's part in keeping the daemon's session open.
    pub(super) demand: Option<DemandShare>,
    /// The daemon's stream, told every event too.
    pub(super) told: Option<broadcast::Sender<LeaseEvent>>,
    /// Store errors, logged once per change.
    pub(super) errors: ErrorLog,
    /// The caller of the release in progress, answered when it is done.
    pub(super) answer: Option<oneshot::Sender<bool>>,
    /// The count of ended tenures of the session the election is held
    /// through, as this election judges it.
    pub(super) count: CountBasis,
}

/// Resolves with the app check's next verdict (pass or not); never without
/// an app check, or once it is gone.
async fn gate_changed(gate: &mut Option<watch::Receiver<Verdict>>) -> bool {
    if let Some(g) = gate
        && g.changed().await.is_ok()
    {
        return *g.borrow_and_update() == Verdict::Pass;
    }
    std::future::pending().await
}

/// Resolves when the store's change counter moves; never without one.
async fn store_changed(changes: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = changes
        && rx.changed().await.is_ok()
    {
        return;
    }
    // No counter, or its store is gone: nothing will ever change.
    std::future::pending().await
}

/// The daemon's session once it changes; `None` (no session) once the
/// session task is gone; never without one.
async fn session_changed(
    session: &mut Option<watch::Receiver<Option<SessionView>>>,
) -> Option<SessionView> {
    let Some(rx) = session else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_ok() {
        return rx.borrow_and_update().clone();
    }
    *session = None;
    None
}

/// The next hint; `None` once the watch client is gone; never without one.
async fn next_hint(feed: &mut Option<HintFeed>) -> Option<Hint> {
    match feed {
        Some(f) => f.hints.recv().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    /// The app check's verdict now, marked seen: whether it lets the
    /// election campaign (always without an app check).
    pub(super) fn gate_passes(gate: &mut Option<watch::Receiver<Verdict>>) -> bool {
        gate.as_mut()
            .is_none_or(|g| *g.borrow_and_update() == Verdict::Pass)
    }

    /// The task: step the core on every input until the election ends.
    ///
    /// An `async` block rather than an `async fn`: an async fn keeps its
    /// by-value `self` twice in its state (the argument and its binding),
    /// ~2 KiB more in every election's task for its whole life.
    #[allow(clippy::manual_async_fn)] // On purpose: see above.
    pub(super) fn run(mut self) -> impl Future<Output = ()> + Send {
        async move {
            if let Some(rx) = &mut self.session {
                let view = rx.borrow_and_update().clone();
                self.step(Input::Session(view)).await;
            }
            self.step(Input::Timeout).await;
            while !self.core.is_finished() {
                let wake = self
                    .core
                    .next_wake()
                    .expect("no request is in flight between steps");
                let takes_hints = self.core.takes_hints();
                let watches_store = self.core.watches_store_changes();
                // Only a tenure (or a round waiting for the session to
                // open) follows each change of the daemon's session; a
                // follower is told the latest before anything else it
                // handles.
                let follows_session = self.core.holds_tenure() || self.core.wants_session();
                let input = tokio::select! {
                    _ = self.clock.sleep_until(wake) => Input::Timeout,
                    pass = gate_changed(&mut self.gate) => Input::Gate(pass),
                    hint = next_hint(&mut self.feed), if takes_hints => match hint {
                        Some(hint) => Input::Hint(hint),
                        None => {
                            self.feed = None;
                            Input::HintsClosed
                        }
                    },
                    cmd = self.commands.recv() => match cmd.map(|c| *c) {
                        Some(Command::Release { then, successor, done }) => {
                            self.answer = Some(done);
                            Input::Release { then, successor }
                        }
                        Some(Command::Checked { fencing_token, record }) => {
                            Input::Checked { fencing_token, record }
                        }
                        None => Input::Orphaned,
                    },
                    () = store_changed(&mut self.store_changes), if watches_store => Input::StoreReplaced,
                    view = session_changed(&mut self.session), if follows_session => Input::Session(view),
                };
                if !matches!(input, Input::Session(_)) {
                    self.catch_up_on_session().await;
                }
                if !matches!(input, Input::Gate(_)) {
                    self.catch_up_on_gate().await;
                }
                self.step(input).await;
            }
        }
    }

    /// Tell the core of a change of the app check's verdict that came
    /// with another input: a release because the app fails arrives right
    /// after the verdict changed, and the round after it must not take
    /// the election back before the core was told.
    async fn catch_up_on_gate(&mut self) {
        let changed = self
            .gate
            .as_ref()
            .is_some_and(|g| g.has_changed().unwrap_or(false));
        if changed {
            let pass = Self::gate_passes(&mut self.gate);
            self.step(Input::Gate(pass)).await;
        }
    }

    /// Tell the core of a change of the daemon's session it was not woken
    /// for (a follower is not woken for each renew).
    async fn catch_up_on_session(&mut self) {
        let Some(rx) = &mut self.session else {
            return;
        };
        match rx.has_changed() {
            Ok(true) => {
                let view = rx.borrow_and_update().clone();
                self.step(Input::Session(view)).await;
            }
            Ok(false) => {}
            // The session task is gone: no session from now on.
            Err(_) => {
                self.session = None;
                self.step(Input::Session(None)).await;
            }
        }
    }

    fn tick(&self) -> Tick {
        Tick {
            now: self.clock.now(),
            stamp: Stamp::now(),
            jitter: rand::random::<f64>(),
        }
    }

    /// Hand `input` to the core, then carry out what it asks, feeding it
    /// the answers of the store requests, until it waits for time or news.
    ///
    /// Boxed: the requests it awaits make it the largest part of the
    /// task, which waits far longer between steps than in them. Unboxed,
    /// every election's task kept about 10 KiB for it while idle (most of
    /// a daemon's memory at a thousand elections).
    fn step(&mut self, input: Input) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.step_now(input))
    }

    async fn step_now(&mut self, input: Input) {
        let tick = self.tick();
        self.core.handle(&tick, input);
        self.publish();
        while let Some(action) = self.core.poll_action() {
            if let Some(answer) = self.carry_out(action).await {
                let tick = self.tick();
                self.core.handle(&tick, answer);
                self.publish();
            }
        }
    }

    fn publish(&mut self) {
        if let Some(demand) = &mut self.demand {
            demand.set(self.core.wants_session());
        }
        let state = self.core.state();
        self.state_tx.send_if_modified(|s| {
            if s == state {
                return false;
            }
            s.clone_from(state);
            true
        });
    }

    /// Carry out one action; a store request's answer comes back.
    async fn carry_out(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::Read { budget, confirming } => {
                if !confirming {
                    self.count.read_sent();
                }
                Some(self.read(budget, confirming).await)
            }
            Action::ReadSession {
                key,
                budget,
                not_before,
            } => Some(self.read_session(&key, budget, not_before).await),
            Action::Write {
                op,
                lease,
                condition,
                budget,
                deadline,
            } => Some(self.write(op, &lease, &condition, budget, deadline).await),
            Action::TenureOver => {
                // The session's next write says so, for followers whose
                // stream of this daemon left it out.
                if let Some(demand) = &self.demand {
                    demand.tenure_ended();
                }
                None
            }
            Action::Tell(event) => {
                if let Some(told) = &self.told {
                    // No follower daemon listening: nobody to tell.
                    let _ = told.send(event.clone());
                }
                self.events.send_replace(Some(event));
                None
            }
            Action::Watch(address) => {
                if let Some(feed) = &self.feed {
                    feed.aim(address);
                }
                None
            }
            Action::Answer(released) => {
                if let Some(done) = self.answer.take() {
                    let _ = done.send(released);
                }
                None
            }
            Action::ForgetStoreChanges => {
                if let Some(rx) = &mut self.store_changes {
                    rx.borrow_and_update();
                }
                None
            }
            Action::Note(note) => {
                self.report(note);
                None
            }
        }
    }

    /// Read the record within `budget`; a campaign round's read (not
    /// `confirming`) is timed for metrics.
    async fn read(&mut self, budget: Duration, confirming: bool) -> Input {
        let name = self.core.config().name.clone();
        let start = self.clock.now();
        let res = self.store.read(&name, budget).await;
        if !confirming {
            let outcome = match &res {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
            };
            self.observer
                .store_request(&name, "read", self.clock.now() - start, outcome);
            if res.is_ok() {
                self.store_answered("read");
            }
        }
        Input::Read(res)
    }

    /// Read the session record under `key` within `budget` (the election
    /// is held through it), with the daemon's other elections when it can
    /// (an answer from a read sent at or after `not_before` will do;
    /// counted for metrics there, under `#session`); timed for metrics as
    /// `read_session` of this election when it read alone.
    async fn read_session(
        &mut self,
        key: &str,
        budget: Duration,
        not_before: Option<Instant>,
    ) -> Input {
        let name = self.core.config().name.clone();
        let (answer, took) = match &self.session_reads {
            Some(reads) => reads.read(key, budget, not_before).await,
            None => {
                let start = self.clock.now();
                let res = self.store.read(key, budget).await;
                (SessionAnswer::bare(res), Some(self.clock.now() - start))
            }
        };
        let mut answer = answer;
        if let Ok(record) = &answer.record {
            answer.moved = self.count.answered(key, record);
        }
        let Some(took) = took else {
            return Input::SessionRecord(answer);
        };
        if self.session_reads.is_none() {
            let outcome = match &answer.record {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
            };
            self.observer
                .store_request(&name, "read_session", took, outcome);
        }
        if answer.record.is_ok() {
            self.store_answered("read_session");
        }
        Input::SessionRecord(answer)
    }

    /// Write `lease` under `condition` within `budget`, giving up at
    /// `deadline`; timed for metrics.
    async fn write(
        &mut self,
        op: WriteOp,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
        deadline: Option<Instant>,
    ) -> Input {
        let start = self.clock.now();
        let write = self.store.write(lease, condition, budget);
        let res = match deadline {
            Some(at) => self
                .clock
                .timeout_at(at, write)
                .await
                .unwrap_or(Err(StoreError::Timeout(budget))),
            None => write.await,
        };
        let outcome = match &res {
            Ok(WriteOutcome::Applied) => Outcome::Ok,
            Ok(WriteOutcome::ConditionFailed { .. }) => Outcome::Lost,
            Err(e) => Outcome::Failed(e),
        };
        let name = self.core.config().name.clone();
        self.observer
            .store_request(&name, op.label(), self.clock.now() - start, outcome);
        if res.is_ok() {
            self.store_answered(op.label());
        }
        Input::Written(res)
    }

    /// A store request of `op`'s kind was answered (a failed condition is
    /// an answer too).
    fn store_answered(&mut self, op: &'static str) {
        let kind = RequestKind::of(op);
        if let Some(streak) = self.errors.succeeded(kind) {
            let failing = self.clock.now() - streak.since;
            let cfg = self.core.config();
            tracing::info!(election = %cfg.name, identity = %cfg.identity, failures = streak.count, failing_ms = failing.as_millis() as u64, "store {} work again", kind.plural());
        }
    }

    fn store_error(&mut self, op: &'static str, e: &StoreError) {
        let kind = RequestKind::of(op);
        let now = self.clock.now();
        let cfg = self.core.config();
        match self.errors.failed(kind, e.to_string(), now) {
            Some(0) => {
                tracing::warn!(election = %cfg.name, identity = %cfg.identity, op, error = %e, class = e.metric_label(), "store request failed (logged again only when the error changes)")
            }
            Some(previous) => {
                tracing::warn!(election = %cfg.name, identity = %cfg.identity, op, error = %e, class = e.metric_label(), previous_error_repeats = previous, "store request failed with another error")
            }
            None => {
                tracing::debug!(election = %cfg.name, op, error = %e, "store request failed again")
            }
        }
    }

    /// Log and count what the core noted.
    fn report(&mut self, note: Note) {
        let cfg = self.core.config();
        let (name, me) = (cfg.name.clone(), cfg.identity.clone());
        let (name, me) = (name.as_str(), me.as_str());
        let outcome = |res: &Result<bool, StoreError>| -> &'static str {
            match res {
                Ok(true) => "ok",
                Ok(false) => "lost",
                Err(_) => "failed",
            }
        };
        match note {
            Note::StoreError { op, error } => self.store_error(op, &error),
            Note::Acquire { op, outcome: res } => {
                self.observer.acquire_attempt(name, as_outcome(&res));
                if outcome(&res) == "lost" {
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
            Note::LeaseLost {
                fencing_token,
                written_by: None,
            } => {
                self.observer.lease_lost(name);
                tracing::warn!(election = %name, identity = %me, fencing_token, cause = "no successful renew before validity - kill_grace", "lease lost: stopping the child")
            }
            Note::LeaseLost {
                fencing_token,
                written_by: Some(by),
            } => {
                self.observer.lease_lost(name);
                tracing::warn!(election = %name, identity = %me, fencing_token, cause = "someone else wrote the lease record", written_by = %by, "lease lost: stopping the child")
            }
            Note::SessionLost(token) => {
                self.observer.lease_lost(name);
                tracing::warn!(election = %name, identity = %me, fencing_token = token, cause = "the session it was held through is gone (ended by another instance, deleted, or not renewed in time)", "lease lost: stopping the child")
            }
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
                tracing::warn!(election = %name, identity = %me, error = %e, "release failed; the lease will expire on its own")
            }
            Note::SittingOut(d) => {
                tracing::info!(election = %name, identity = %me, sit_out = %text::duration(d), "sitting out before campaigning again")
            }
            note @ (Note::Malformed(_)
            | Note::OverwritingMalformed
            | Note::UnknownFormat { .. }) => self.report_record(name, note),
            Note::StreamDistrusted { holder, address } => {
                tracing::warn!(election = %name, holder = ?holder, address = ?address, "the leader's watch stream does not match the lease store; polling the store instead for this tenure")
            }
        }
    }

    /// Log and count what the core noted of a record it cannot use as it
    /// is: malformed, or of a format this build does not know.
    fn report_record(&self, name: &str, note: Note) {
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
            // Every other note is `report`'s.
            _ => {}
        }
    }
}

/// A noted outcome as the observer takes it.
fn as_outcome(res: &Result<bool, StoreError>) -> Outcome<'_> {
    match res {
        Ok(true) => Outcome::Ok,
        Ok(false) => Outcome::Lost,
        Err(e) => Outcome::Failed(e),
    }
}
