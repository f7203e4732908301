//! Elections: one task per election.
//!
//! The task reads and writes the lease through a [`LeaseStore`] and publishes
//! its state on a `watch` channel, so the HTTP server, the metrics and the
//! child supervisor observe it without ever locking or slowing it.
//! Elections are independent tasks: a slow request in one never delays
//! another's renewal. Every decision is the pure core's (`crate::core`:
//! the election core, the takeover rule, hints, the session, the sweep);
//! its types are re-exported here, where the rest of leaderd uses them.
//!
//! - this file: the handle to an election's task, what the task follows
//!   ([`Links`]) and what it reports ([`Observer`]);
//! - `driver`: the tokio task that runs the core: store requests, clock,
//!   commands, hints, published state, logs and metrics;
//! - `timing`: the timing rules an election's settings must keep, checked
//!   as the configuration is built;
//! - `hint_feed`: the task's end of a watch client;
//! - `error_log`: how store errors are logged, once per change;
//! - `session_task`: the tokio task that runs the daemon's session, and
//!   its sweep of ended sessions;
//! - `session_reads`: what the daemon knows of other daemons' sessions,
//!   one read shared by all its elections;
//! - `record_check`: the read-back of the records held through the
//!   session, which notices one deleted or rewritten under its tenure;
//! - `tests`, `hint_tests`: paused-clock tests of the engine and of the
//!   hints.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::app_check::Verdict;
use crate::clock::Clock;
use crate::lease::{LeaseStore, Record, StoreError};

/// What a renew, acquire or store call came to, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Done.
    Ok,
    /// Someone else wrote (condition failed).
    Lost,
    /// A store error.
    Failed(&'a StoreError),
}

impl Outcome<'_> {
    /// Label of `leaderd_renew_total{result}`: ok, lost, throttled, timeout, error.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Lost => "lost",
            Outcome::Failed(e) => e.renew_label(),
        }
    }
}

/// Leadership changes, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Became leader.
    Gained,
    /// Stopped leading (lost, expired, released or resigned).
    Lost,
}

/// Receives the engine's events; `crate::metrics` implements it. Methods are
/// called from the election task and must not block.
pub trait Observer: Send + Sync + 'static {
    /// A store request finished after `took`.
    fn store_request(
        &self,
        _election: &str,
        _op: &'static str,
        _took: Duration,
        _outcome: Outcome<'_>,
    ) {
    }
    /// An acquisition attempt (create, take over) ended.
    fn acquire_attempt(&self, _election: &str, _outcome: Outcome<'_>) {}
    /// A renew ended.
    fn renew(&self, _election: &str, _outcome: Outcome<'_>) {}
    /// Leadership changed.
    fn transition(&self, _election: &str, _t: Transition) {}
    /// A tenure ended because its lease was lost (no renew in time,
    /// another writer, or the session it was held through gone), not
    /// given up.
    fn lease_lost(&self, _election: &str) {}
    /// A renew went out `late` after it was due: under `election`'s name,
    /// or the session's label for the daemon's session.
    fn renew_sent(&self, _election: &str, _late: Duration) {}
    /// A malformed record was seen.
    fn malformed_record(&self, _election: &str) {}
    /// A record of a format this build does not know was seen.
    fn unknown_format_record(&self, _election: &str) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// What the daemon's tasks beside its elections (its session, the reads
/// of other daemons' sessions, the check of its records) run with: the
/// store, the clock they decide by, and where they report.
#[derive(Clone)]
pub struct TaskContext {
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// The clock every decision is timed with.
    pub clock: Clock,
    /// Where store requests and their outcomes are reported (the metrics).
    pub observer: Arc<dyn Observer>,
}

/// Requests to the election task.
#[derive(Debug)]
pub enum Command {
    /// Give the lease up (the caller stopped the child first), then act as said.
    /// `done` is answered once the release was attempted.
    Release {
        /// What to do afterwards.
        then: AfterRelease,
        /// Hand the lease to this identity (see [`Lease::handed_to`]).
        successor: Option<String>,
        /// Answered with whether a lease was released.
        done: oneshot::Sender<bool>,
    },
    /// What the daemon's check of its records found (see
    /// [`Input::Checked`]).
    Checked {
        /// The tenure checked.
        fencing_token: u64,
        /// The record as read.
        record: Record,
    },
}

/// Handle to a running election task.
#[derive(Debug)]
pub struct ElectionHandle {
    /// The published state.
    pub state: watch::Receiver<ElectionState>,
    /// What this instance tells its followers: the last event of its
    /// tenure (`None` before the first).
    pub events: watch::Receiver<Option<LeaseEvent>>,
    /// The configured lease duration (also how long a resign sits out).
    pub lease_duration: Duration,
    commands: mpsc::Sender<Box<Command>>,
    task: JoinHandle<()>,
}

impl ElectionHandle {
    /// Release the lease if held, then act as said. Returns whether a lease
    /// was released; `false` also when the task is gone.
    pub async fn release(&self, then: AfterRelease) -> bool {
        self.hand_over(then, None).await
    }

    /// [`ElectionHandle::release`], handing the lease to `successor` (to
    /// anyone when `None`).
    pub async fn hand_over(&self, then: AfterRelease, successor: Option<String>) -> bool {
        self.steering().hand_over(then, successor).await
    }

    /// A handle that can only hand the lease over, for a task that moves
    /// leaderships (`crate::balance`) while the daemon keeps this one.
    pub fn steering(&self) -> Steering {
        Steering {
            commands: self.commands.clone(),
        }
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Wait for the task to end.
    pub async fn join(self) {
        let _ = self.task.await;
    }

    /// Abort the task (no release).
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// Hands an election's lease over; see [`ElectionHandle::steering`].
#[derive(Debug, Clone)]
pub struct Steering {
    commands: mpsc::Sender<Box<Command>>,
}

impl Steering {
    /// Release the lease if held, handing it to `successor` (to anyone when
    /// `None`), then act as said. Returns whether a lease was released.
    pub async fn hand_over(&self, then: AfterRelease, successor: Option<String>) -> bool {
        let (done, rx) = oneshot::channel();
        if self
            .commands
            .send(Box::new(Command::Release {
                then,
                successor,
                done,
            }))
            .await
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Tell the election what the daemon's check of its record found (see
    /// [`Input::Checked`]); dropped when its queue is full (the next check
    /// tells it again).
    pub fn checked(&self, fencing_token: u64, record: Record) {
        let _ = self.commands.try_send(Box::new(Command::Checked {
            fencing_token,
            record,
        }));
    }
}

/// Start the election task; it campaigns at once.
pub fn spawn(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
) -> ElectionHandle {
    spawn_after(store, config, clock, observer, Duration::ZERO)
}

/// Start the election task; its first store request waits `delay` (it
/// reports follower meanwhile and obeys release/exit at once). A daemon with
/// many elections spaces their starts so they do not all hit the store in
/// the same instant.
pub fn spawn_after(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
    delay: Duration,
) -> ElectionHandle {
    spawn_gated(store, config, clock, observer, delay, Links::default())
}

/// What an election task follows besides the store; each is optional.
#[derive(Default)]
pub struct Links {
    /// The app check's verdict: it campaigns only while it passes.
    pub gate: Option<watch::Receiver<Verdict>>,
    /// The leader's hints (the watch client).
    pub hints: Option<HintFeed>,
    /// The daemon's session: tenures are held through it instead of being
    /// renewed one by one.
    pub session: Option<watch::Receiver<Option<SessionView>>>,
    /// Reads of session records shared with the daemon's other elections.
    pub session_reads: Option<Arc<SessionReads>>,
    /// What keeps the daemon's session open: this election tells it when it
    /// wants the session (none: the session is open whatever it says).
    pub demand: Option<Demand>,
    /// The daemon's stream (`GET /v1/watch`): every event this election
    /// tells is sent there too.
    pub told: Option<broadcast::Sender<LeaseEvent>>,
}

/// [`spawn_after`], following `links`: campaigning only while the app
/// check's verdict passes, following the leader's hints, holding tenures
/// through the daemon's session, each when given. A closed gate never ends
/// a tenure: the caller stops the child and releases the lease through the
/// handle.
pub fn spawn_gated(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
    delay: Duration,
    links: Links,
) -> ElectionHandle {
    let now = clock.now();
    let lease_duration = config.lease_duration;
    let Links {
        mut gate,
        hints,
        session,
        session_reads,
        demand,
        told,
    } = links;
    let may_campaign = driver::Driver::gate_passes(&mut gate);
    let core = Core::new(config, now, delay, hints.is_some(), may_campaign);
    let core = if session.is_some() {
        core.through_sessions()
    } else {
        core
    };
    let (state_tx, state) = watch::channel(core.state().clone());
    // Boxed: a channel allocates room for 32 messages as it is made, and
    // every election keeps one for its whole life.
    let (commands, cmd_rx) = mpsc::channel(8);
    let (events_tx, events) = watch::channel(None);
    let store_changes = store.changes();
    let driver = driver::Driver {
        core,
        store,
        clock,
        observer,
        state_tx,
        events: events_tx,
        commands: cmd_rx,
        gate,
        feed: hints,
        store_changes,
        session,
        session_reads,
        demand: demand.map(|d| d.share()),
        told,
        errors: ErrorLog::default(),
        answer: None,
        count: Default::default(),
    };
    let task = tokio::spawn(driver.run());
    ElectionHandle {
        state,
        events,
        lease_duration,
        commands,
        task,
    }
}

mod driver;
mod error_log;
mod hint_feed;
#[cfg(test)]
mod hint_tests;
mod record_check;
mod session_reads;
mod session_task;
#[cfg(test)]
mod tests;
mod timing;

pub use crate::core::election::{
    Action, AfterRelease, Core, ElectionConfig, ElectionState, Input, Note, Role, Tenure, Tick,
    WriteOp, defaults,
};
pub use crate::core::hints::{Hint, LeaseEvent};
pub use crate::core::session::SessionView;
pub use crate::core::takeover::{TakeoverTimer, takeover_wait};
use error_log::ErrorLog;
pub use hint_feed::{Aim, HintFeed, Target};
pub use record_check::{CheckTarget, spawn_record_check};
pub use session_reads::{KnownSession, SessionReads};
pub use session_task::{Demand, SESSION_LABEL, SessionHandle, spawn_session};
pub use timing::{TimingError, check_drift};
