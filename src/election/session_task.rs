//! The tokio task that runs the daemon's [`SessionCore`]: its store
//! requests (timed for metrics under the election label `#session`, their
//! errors logged once per change), its clock, and the [`SessionView`] the
//! elections held through it follow on a watch channel. It decides
//! nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::error_log::{ErrorLog, RequestKind};
use super::{Observer, Outcome, TaskContext};
use crate::clock::Clock;
use crate::core::election::{Action, ElectionConfig, Note, Tick, WriteOp};
use crate::core::session::{SessionCore, SessionInput, SessionView};
use crate::core::sweep::SessionSweep;
use crate::lease::{LeaseStore, Record, Stamp, StoreError, WriteOutcome};

/// The `election` label of the session's store requests in metrics (no
/// election can be named so).
pub const SESSION_LABEL: &str = "#session";

/// How often a daemon sweeps the session records that are over (the first
/// time once its session is open; see [`SessionSweep`]). A session nobody
/// renews any more, or ended, is deleted at the second sweep that finds it
/// unchanged (when its lease is shorter than this).
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// How long one sweep (its read and its deletes) may take.
const SWEEP_BUDGET: Duration = Duration::from_secs(5);

/// How many of the daemon's elections want its session now: those that
/// hold a tenure through it or are about to take one. The session is open
/// only while some do (or always, for balance). Also how many of their
/// tenures ended, a count the session's record carries (see
/// [`SessionInput::TenuresEnded`]).
#[derive(Clone)]
pub struct Demand {
    wanting: Arc<watch::Sender<usize>>,
    ended: Arc<watch::Sender<u64>>,
}

impl Demand {
    /// One election's share: counted while it wants the session.
    pub fn share(&self) -> DemandShare {
        DemandShare {
            demand: self.clone(),
            counted: false,
        }
    }

    /// A tenure of one of the daemon's elections ended (its last write,
    /// if any, answered).
    pub fn tenure_ended(&self) {
        self.ended.send_modify(|n| *n = n.saturating_add(1));
    }
}

/// One election's part of the [`Demand`]; uncounted when dropped.
pub struct DemandShare {
    demand: Demand,
    counted: bool,
}

impl DemandShare {
    /// Whether this election wants the session now.
    pub fn set(&mut self, wants: bool) {
        if wants == self.counted {
            return;
        }
        self.counted = wants;
        self.demand.wanting.send_modify(|n| {
            *n = if wants {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        });
    }

    /// See [`Demand::tenure_ended`].
    pub fn tenure_ended(&self) {
        self.demand.tenure_ended();
    }
}

impl Drop for DemandShare {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The daemon's session task.
pub struct SessionHandle {
    /// The session as the elections held through it see it: `None` while
    /// none is open and valid.
    pub view: watch::Receiver<Option<SessionView>>,
    /// L·(1−D) − M of its timing: how long a view stays valid after its
    /// last renew's send.
    pub validity: Duration,
    /// The labels its record carries from its next write on.
    pub labels: watch::Sender<BTreeMap<String, String>>,
    /// What the elections tell of wanting it.
    pub demand: Demand,
    close: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl SessionHandle {
    /// End the session (once the elections held through it were released)
    /// and wait until that write is answered.
    pub async fn close(mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        // Dropped without `close` (a test, an aborted start): the task
        // must not renew for ever.
        if self.close.is_some() {
            self.task.abort();
        }
    }
}

/// Start the session of `cfg.identity` with `cfg`'s timing (L, R, P, D,
/// M). With `always` it opens at once and stays open (balance counts on
/// it); else it opens once an election wants it ([`Demand`]) and ends a
/// lease after the last stopped wanting it.
pub fn spawn_session(context: TaskContext, cfg: ElectionConfig, always: bool) -> SessionHandle {
    let TaskContext {
        store,
        clock,
        observer,
    } = context;
    let validity = cfg.validity();
    let sweeper = Arc::new(Mutex::new(Sweeper {
        sweep: SessionSweep::new(cfg.max_clock_drift),
        failure: None,
    }));
    let core = SessionCore::new(cfg.clone(), clock.now(), always);
    let (demand, demand_rx) = watch::channel(0);
    let (ended, ended_rx) = watch::channel(0);
    let (view_tx, view) = watch::channel(None);
    let (close, close_rx) = oneshot::channel();
    let (labels, labels_rx) = watch::channel(BTreeMap::new());
    let task = SessionTask {
        core,
        identity: cfg.identity,
        store,
        clock,
        observer,
        view_tx,
        close: Some(close_rx),
        errors: ErrorLog::default(),
        swept: false,
        sweeper,
        changes: None,
        lapsed: None,
        labels: labels_rx,
        always,
        demand: demand_rx,
        ended: ended_rx,
    };
    let mut task = task;
    task.changes = task.store.changes();
    SessionHandle {
        view,
        validity,
        labels,
        demand: Demand {
            wanting: Arc::new(demand),
            ended: Arc::new(ended),
        },
        close: Some(close),
        task: tokio::spawn(task.run()),
    }
}

struct SessionTask {
    core: SessionCore,
    identity: String,
    store: Arc<dyn LeaseStore>,
    clock: Clock,
    observer: Arc<dyn Observer>,
    view_tx: watch::Sender<Option<SessionView>>,
    close: Option<oneshot::Receiver<()>>,
    errors: ErrorLog,
    /// Whether the first sweep was made.
    swept: bool,
    /// What the sweeps remember from one to the next.
    sweeper: Arc<Mutex<Sweeper>>,
    /// Moves when the store notices its data was replaced under it.
    changes: Option<watch::Receiver<u64>>,
    /// The session whose validity ran out while it was still being renewed.
    lapsed: Option<String>,
    /// The labels to write.
    labels: watch::Receiver<BTreeMap<String, String>>,
    /// Wanted whatever the elections say.
    always: bool,
    /// How many elections want the session.
    demand: watch::Receiver<usize>,
    /// How many tenures of the daemon's elections ended.
    ended: watch::Receiver<u64>,
}

/// Resolves when the store's change counter moves; never without one.
async fn store_changed(changes: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = changes
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Resolves at `at`; never without one.
async fn sleep_until_some(clock: &Clock, at: Option<crate::clock::Instant>) {
    match at {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves when asked to close (or when the handle is gone); never after.
async fn close_asked(close: &mut Option<oneshot::Receiver<()>>) {
    match close {
        Some(rx) => {
            let _ = rx.await;
        }
        None => std::future::pending().await,
    }
}

/// The sweep's memory, shared with the sweep under way (it runs beside the
/// session, never in its way).
struct Sweeper {
    sweep: SessionSweep,
    /// The error the last sweep failed with, logged once per change.
    failure: Option<String>,
}

/// Lock `sweeper`, even if a sweep panicked holding it: its memory is
/// then at worst out of date, which only makes a record wait longer.
fn lock(sweeper: &Mutex<Sweeper>) -> MutexGuard<'_, Sweeper> {
    sweeper.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Delete the session records that are over (see [`SessionSweep`]),
/// judged on `clock` when the store's read answers.
async fn sweep(
    store: Arc<dyn LeaseStore>,
    identity: String,
    sweeper: Arc<Mutex<Sweeper>>,
    clock: Clock,
) {
    let mut read = 0;
    let mut judge = |records: &[Record]| {
        read = records.len();
        let unix_s = crate::clock::unix_ms() / 1000;
        lock(&sweeper).sweep.judge(records, clock.now(), unix_s)
    };
    let res = store.sweep_sessions(&mut judge, SWEEP_BUDGET).await;
    let mut sweeper = lock(&sweeper);
    match res {
        Ok(n) => {
            tracing::debug!(identity = %identity, read, timing = sweeper.sweep.timing(), deleted = n, "swept the session records");
            if n > 0 {
                tracing::info!(identity = %identity, deleted = n, "deleted session records that stayed unchanged (ended, or not renewed) for a takeover wait");
            }
            if sweeper.failure.take().is_some() {
                tracing::info!(identity = %identity, "session records can be swept again");
            }
        }
        Err(e) => {
            let e = e.to_string();
            if sweeper.failure.as_ref() != Some(&e) {
                tracing::warn!(identity = %identity, "cannot sweep the session records that are over (tried again in an hour): {e}");
                sweeper.failure = Some(e);
            }
        }
    }
}

impl SessionTask {
    async fn run(mut self) {
        self.step(SessionInput::Timeout).await;
        let mut next_sweep = self.clock.now();
        while !self.core.is_finished() {
            // `None`: closed and not wanted, nothing to do until it is.
            let wake = self.core.next_wake();
            let sweep_due = self.swept || self.core.record_key().is_some();
            let input = tokio::select! {
                () = sleep_until_some(&self.clock, wake) => SessionInput::Timeout,
                Ok(()) = self.demand.changed() => {
                    SessionInput::Wanted(self.always || *self.demand.borrow_and_update() > 0)
                }
                () = close_asked(&mut self.close) => {
                    self.close = None;
                    SessionInput::Close
                }
                () = store_changed(&mut self.changes) => SessionInput::StoreReplaced,
                Ok(()) = self.labels.changed() => {
                    SessionInput::Labels(self.labels.borrow_and_update().clone())
                }
                Ok(()) = self.ended.changed() => {
                    SessionInput::TenuresEnded(*self.ended.borrow_and_update())
                }
                () = self.clock.sleep_until(next_sweep), if sweep_due => {
                    // Beside the session, never in its way: a slow sweep
                    // must not delay a renew.
                    self.swept = true;
                    tokio::spawn(sweep(
                        self.store.clone(),
                        self.identity.clone(),
                        self.sweeper.clone(),
                        self.clock.clone(),
                    ));
                    next_sweep = self.clock.now() + SWEEP_EVERY;
                    continue;
                }
            };
            self.step(input).await;
        }
        self.publish();
    }

    fn tick(&self) -> Tick {
        Tick {
            now: self.clock.now(),
            stamp: Stamp::now(),
            jitter: rand::random::<f64>(),
        }
    }

    /// Hand `input` to the core, then carry out what it asks.
    async fn step(&mut self, input: SessionInput) {
        let tick = self.tick();
        self.core.handle(&tick, input);
        self.publish();
        while let Some(action) = self.core.poll_action() {
            let answer = match action {
                Action::Write {
                    op,
                    lease,
                    condition,
                    budget,
                    ..
                } => {
                    let start = self.clock.now();
                    let res = self.store.write(&lease, &condition, budget).await;
                    self.account(
                        op.label(),
                        start,
                        res.as_ref().map(|o| matches!(o, WriteOutcome::Applied)),
                    );
                    if op == WriteOp::EndSession && res.is_ok() {
                        let why = if self.core.is_retired() {
                            "this instance held nothing through it for a lease; "
                        } else {
                            ""
                        };
                        tracing::info!(identity = %self.identity, session = %lease.election, "session ended: {why}nobody has to wait it out");
                    }
                    SessionInput::Written(res)
                }
                Action::Read { budget, .. } => {
                    let key = self.core.record_key().unwrap_or_default().to_owned();
                    let start = self.clock.now();
                    let res = self.store.read(&key, budget).await;
                    self.account("read_session", start, res.as_ref().map(|_| true));
                    SessionInput::Read(res)
                }
                Action::Note(Note::RenewSent(late)) => {
                    self.observer.renew_sent(SESSION_LABEL, late);
                    continue;
                }
                _ => continue,
            };
            let tick = self.tick();
            self.core.handle(&tick, answer);
            self.publish();
        }
    }

    /// Metrics and the once-per-change error log of one request.
    fn account(
        &mut self,
        op: &'static str,
        start: crate::clock::Instant,
        res: Result<bool, &StoreError>,
    ) {
        let outcome = match res {
            Ok(true) => Outcome::Ok,
            Ok(false) => Outcome::Lost,
            Err(e) => Outcome::Failed(e),
        };
        let took = self.clock.now() - start;
        if op == WriteOp::RenewSession.label() {
            // The renewals every tenure held through the session rely on:
            // counted (and alerted on) as an election's own were.
            self.observer.renew(SESSION_LABEL, outcome);
        }
        self.observer
            .store_request(SESSION_LABEL, op, took, outcome);
        let kind = RequestKind::of(op);
        match res {
            Ok(_) => {
                if let Some(streak) = self.errors.succeeded(kind) {
                    tracing::info!(identity = %self.identity, failures = streak.count, "session store {} work again", kind.plural());
                }
            }
            Err(e) => {
                if let Some(previous) = self.errors.failed(kind, e.to_string(), self.clock.now()) {
                    tracing::warn!(identity = %self.identity, op, previous_failures = previous, "session store {} fail: {e}", kind.plural());
                }
            }
        }
    }

    /// Publish the view, logging each change of session.
    fn publish(&mut self) {
        let view = self.core.view();
        let old = self.view_tx.borrow().clone();
        let id = &self.identity;
        // A lapsed session found ended or gone when its renew was answered.
        if let Some(key) = self.lapsed.take_if(|k| {
            self.core.record_key() != Some(k.as_str())
                && !self.core.is_closing()
                && !self.core.is_retired()
        }) {
            tracing::warn!(identity = %id, session = %key, "session lost (ended by another instance, or gone from the store) while it was not renewed in time; a new one opens once an election needs it");
        }
        if old == view {
            return;
        }
        match (&old, &view) {
            (None, Some(v)) if self.lapsed.as_deref() == Some(v.key.as_str()) => {
                tracing::info!(identity = %id, session = %v.key, "session renewed again after it lapsed: the elections held through it are campaigned for anew");
            }
            (None, Some(v)) => {
                tracing::info!(identity = %id, session = %v.key, "session opened: the elections this instance leads are held through it");
            }
            (Some(_), None) if self.core.is_closing() => {}
            // Ended for nothing wanting it (logged with its end write).
            (Some(_), None) if self.core.is_retired() => {}
            // Still ours, only not renewed within its validity.
            (Some(o), None) if self.core.record_key() == Some(o.key.as_str()) => {
                tracing::warn!(identity = %id, session = %o.key, "session not renewed in time: every election held through it stops; still trying to renew it");
                self.lapsed = Some(o.key.clone());
            }
            (Some(o), None) => {
                tracing::warn!(identity = %id, session = %o.key, "session lost (ended by another instance, or gone from the store): every election held through it stops; a new one opens once an election needs it");
            }
            (Some(o), Some(v)) if o.key != v.key => {
                tracing::warn!(identity = %id, old = %o.key, session = %v.key, "session replaced: every election held through the old one stopped");
            }
            _ => {}
        }
        if view.is_some() {
            self.lapsed = None;
        }
        self.view_tx.send_replace(view);
    }
}
