//! Elections: one task per election.
//!
//! The task reads and writes the lease through a [`LeaseStore`] and publishes
//! its state on a `watch` channel, so the HTTP server, the metrics and the
//! child supervisor observe it without ever locking or slowing it.
//! Elections are independent tasks: a slow request in one never delays
//! another's renewal.
//!
//! - this file: the election's settings, their timing rules and published
//!   state, and the handle to its task;
//! - `core`: every decision (when to take over, renew, stop the job,
//!   release; how hints and a successor count) in one state machine
//!   without IO: observations in, actions out;
//! - `driver`: the tokio task that runs the core: store requests, clock,
//!   commands, hints, published state, logs and metrics;
//! - `takeover`: the takeover rule, the one place it is written (the
//!   core, `leaderd lock` and balance use it);
//! - `hints`: a follower's bookkeeping of the leader's watch stream;
//! - `error_log`: how store errors are logged, once per change;
//! - [`session`]: a daemon's session, one record whose renewals keep every
//!   election held through it (pure, like the core);
//! - `session_task`: the tokio task that runs the session;
//! - `session_sweep`: which ended or abandoned session records the daemon's
//!   sweep deletes (pure; its tests in `session_sweep/tests.rs`);
//! - `session_reads`: what the daemon knows of other daemons' sessions,
//!   one read shared by all its elections;
//! - `record_check`: the read-back of the records held through the
//!   session, which notices one deleted or rewritten under its tenure;
//! - `model` (tests): the model checker of the core;
//! - `tests`, `hint_tests`: paused-clock tests of the engine and of the
//!   hints.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::app_check::Verdict;
use crate::clock::{Clock, Instant};
use crate::lease::{HolderMeta, LeaseStore, Record, StoreError};
use crate::text;

/// Timing and identity of one election.
#[derive(Debug, Clone, PartialEq)]
pub struct ElectionConfig {
    /// The election's name (the lease record's key).
    pub name: String,
    /// Our identity, written as `holder`.
    pub identity: String,
    /// L: the lease we promise to honour.
    pub lease_duration: Duration,
    /// R: how often the leader renews.
    pub renew_interval: Duration,
    /// P: follower poll and renew retry interval.
    pub retry_interval: Duration,
    /// G: time between the stop signal and the kill, before validity ends.
    pub kill_grace: Duration,
    /// D: the clock-rate drift we tolerate, as a fraction (0.01 = 1%).
    pub max_clock_drift: f64,
    /// M: margin subtracted from the leader's validity.
    pub safety_margin: Duration,
    /// After creating a missing item, wait the takeover wait of its lease
    /// (renewing) before leading.
    pub strict_new_lease: bool,
    /// Advertised in the lease record.
    pub holder_meta: Option<HolderMeta>,
}

/// The built-in timing: the defaults of the configuration's timing keys.
pub mod defaults {
    use std::time::Duration;

    /// L, `lease.duration`.
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);

    /// R, `lease.renew_interval`, for a lease of `lease_duration`: half of it.
    pub fn renew_interval(lease_duration: Duration) -> Duration {
        lease_duration / 2
    }
    /// P, `lease.retry_interval`.
    pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
    /// D, `lease.max_clock_drift`.
    pub const MAX_CLOCK_DRIFT: f64 = 0.01;
    /// M, `lease.safety_margin`.
    pub const SAFETY_MARGIN: Duration = Duration::from_millis(200);
    /// G, `child.kill_grace`.
    pub const KILL_GRACE: Duration = Duration::from_secs(2);
}

impl ElectionConfig {
    /// A config with the built-in defaults for everything but name and
    /// identity (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_defaults(name: impl Into<String>, identity: impl Into<String>) -> Self {
        ElectionConfig {
            name: name.into(),
            identity: identity.into(),
            lease_duration: defaults::LEASE_DURATION,
            renew_interval: defaults::renew_interval(defaults::LEASE_DURATION),
            retry_interval: defaults::RETRY_INTERVAL,
            kill_grace: defaults::KILL_GRACE,
            max_clock_drift: defaults::MAX_CLOCK_DRIFT,
            safety_margin: defaults::SAFETY_MARGIN,
            strict_new_lease: false,
            holder_meta: None,
        }
    }

    /// Check the timing rules, the one place they are written: every
    /// interval above zero, D in [0, 0.5), R < L, and the invariant
    /// R + G + M + L·D < L, without which a leader could still be running its
    /// job when a follower's wait ends.
    pub fn validate(&self) -> Result<(), TimingError> {
        let l = self.lease_duration;
        if l.is_zero() || self.renew_interval.is_zero() || self.retry_interval.is_zero() {
            return Err(TimingError::Zero);
        }
        check_drift(self.max_clock_drift)?;
        if self.renew_interval >= l {
            return Err(TimingError::RenewNotShorter {
                renew: self.renew_interval,
                lease: l,
            });
        }
        let drift = l.mul_f64(self.max_clock_drift);
        let sum = self.renew_interval + self.kill_grace + self.safety_margin + drift;
        if sum >= l {
            return Err(TimingError::Invariant {
                renew: self.renew_interval,
                kill_grace: self.kill_grace,
                safety_margin: self.safety_margin,
                drift,
                lease: l,
            });
        }
        Ok(())
    }

    /// How many renew retries fit between a missed renew and the stop signal.
    /// Fewer than two is worth a warning: one slow answer then costs the lease.
    pub fn retries_that_fit(&self) -> u32 {
        let window = self
            .validity()
            .saturating_sub(self.kill_grace + self.renew_interval);
        (window.as_secs_f64() / self.retry_interval.as_secs_f64()).floor() as u32
    }

    /// L·(1−D) − M: how long a successful write keeps the leader valid.
    pub fn validity(&self) -> Duration {
        self.lease_duration
            .mul_f64(1.0 - self.max_clock_drift)
            .saturating_sub(self.safety_margin)
    }

    /// R + P: a watch stream that says nothing this long is taken for
    /// broken, and the follower polls every P again.
    pub fn hint_quiet(&self) -> Duration {
        self.renew_interval + self.retry_interval
    }

    /// While hints flow, the longest a follower goes without reading the
    /// store: 2·L. It reads sooner at the end of the takeover wait of the
    /// rvn it read last (see [`Self::due_read_slack`]), about once a lease.
    pub fn hint_confirm_interval(&self) -> Duration {
        self.lease_duration * 2
    }

    /// While hints flow, a follower past the takeover wait of the rvn it
    /// read last reads when the next renewal is told, or this much later
    /// at most: min(R, 2·P). Reading just after a renewal finds an rvn
    /// timed from its hint, so the next such read is a whole lease away
    /// (60/L reads a minute, 6 at the defaults); and a dead leader's lease
    /// is taken at most 2·P after its takeover wait ends, whatever the
    /// stream says.
    pub fn due_read_slack(&self) -> Duration {
        self.renew_interval.min(self.retry_interval * 2)
    }
}

/// D must be at least 0 and below 0.5.
pub fn check_drift(max_clock_drift: f64) -> Result<(), TimingError> {
    if (0.0..0.5).contains(&max_clock_drift) {
        Ok(())
    } else {
        Err(TimingError::Drift(max_clock_drift))
    }
}

/// A timing rule an election's settings break (see
/// [`ElectionConfig::validate`]); the message names the values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    /// The lease, renew or retry interval is zero.
    #[error("lease duration, renew_interval and retry_interval must be above zero")]
    Zero,
    /// D is outside [0, 0.5).
    #[error("max_clock_drift = {0} must be at least 0 and below 0.5")]
    Drift(f64),
    /// R ≥ L.
    #[error("renew_interval ({}) must be shorter than lease duration ({})", text::duration(*renew), text::duration(*lease))]
    RenewNotShorter {
        /// R.
        renew: Duration,
        /// L.
        lease: Duration,
    },
    /// R + G + M + L·D ≥ L.
    #[error(
        "timing invariant R + G + M + L·D < L violated: renew_interval {} + kill_grace {} + safety_margin {} + lease_duration·max_clock_drift {} = {} is not below lease_duration {}",
        text::duration(*renew),
        text::duration(*kill_grace),
        text::duration(*safety_margin),
        text::duration(*drift),
        text::duration(*renew + *kill_grace + *safety_margin + *drift),
        text::duration(*lease)
    )]
    Invariant {
        /// R.
        renew: Duration,
        /// G.
        kill_grace: Duration,
        /// M.
        safety_margin: Duration,
        /// L·D.
        drift: Duration,
        /// L.
        lease: Duration,
    },
}

/// Where this instance stands in one election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Not leading; polling the record.
    Follower,
    /// Created the item under `strict_new_lease`; renewing but not leading yet.
    Confirming,
    /// Leading, inside validity.
    Leader,
    /// Lost the lease or could not renew in time: the child must stop now and be
    /// killed by `Tenure::valid_until`. Not leading.
    Stopping,
}

/// One term of leadership.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenure {
    /// The fencing token of this tenure.
    pub fencing_token: u64,
    /// Unix ms when it began (for humans).
    pub since_unix_ms: u64,
    /// Boot-clock instant it began.
    pub since: Instant,
    /// The end of validity: the child must be dead by then.
    pub valid_until: Instant,
    /// `valid_until − G`: the stop signal is due then unless renewed.
    pub stop_at: Instant,
    /// Counts tenures in this process: a new number is a new tenure.
    pub seq: u64,
    /// Lease duration promised in the record, ms.
    pub lease_ms: u64,
}

/// The engine's published state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ElectionState {
    /// Election name.
    pub election: String,
    /// Our identity.
    pub identity: String,
    /// Our role.
    pub role: Role,
    /// Present while `Leader`, `Confirming` or `Stopping`.
    pub tenure: Option<Tenure>,
    /// The holder as last observed (ourselves while leading).
    pub leader: Option<String>,
    /// The fencing token as last observed.
    pub fencing_token: Option<u64>,
    /// Boot instant of the last successful store answer.
    pub observed_at: Option<Instant>,
    /// Unix ms of the same, for humans.
    pub observed_at_unix_ms: Option<u64>,
    /// The class of the last store error, cleared by the next success.
    pub last_error: Option<String>,
    /// What is wrong with the stored record, if it is malformed.
    pub malformed: Option<String>,
    /// The stored record's format, as stored, when this build does not
    /// know it (see [`crate::lease::FORMAT`]): it never writes that record.
    pub unknown_format: Option<String>,
    /// The session the record names as last observed (ours while leading
    /// through it); `None` for a record that is its own lease.
    pub session: Option<String>,
    /// Boot instant at which the campaign loop last made progress.
    pub heartbeat: Instant,
    /// True once the first read of the record has been answered.
    pub first_observation_done: bool,
    /// True once the task has ended (after a final release).
    pub finished: bool,
    /// Campaign rounds completed as a follower (read, and the acquisition
    /// attempt it allowed, if any). `--acquire-timeout 0` gives up after one.
    pub rounds: u64,
    /// While the leader's events reach this follower: the boot instant at
    /// which its watch stream counts as quiet (last event + R + P). `None`
    /// while it polls the store instead.
    pub hints_until: Option<Instant>,
}

impl ElectionState {
    /// Whether we lead at `now`: role `Leader` and before the stop time. Callers
    /// pass the current clock reading so a stalled engine cannot make a stale
    /// state look valid.
    pub fn is_leader_at(&self, now: Instant) -> bool {
        self.role == Role::Leader && self.tenure.as_ref().is_some_and(|t| now < t.stop_at)
    }

    /// Whether this instance follows with the leader's events flowing at
    /// `now`, rather than polling the store.
    pub fn watching_leader_at(&self, now: Instant) -> bool {
        self.role != Role::Leader && self.hints_until.is_some_and(|until| now < until)
    }

    /// Validity left at `now` while leading, else zero.
    pub fn lease_remaining(&self, now: Instant) -> Duration {
        match &self.tenure {
            Some(t) if self.is_leader_at(now) => t.valid_until - now,
            _ => Duration::ZERO,
        }
    }
}

/// Made-up states for tests of what watches the engines (HTTP, metrics):
/// one place that builds them, so a new field is added once.
#[cfg(any(test, feature = "testing"))]
impl ElectionState {
    /// A follower of `election` as `identity` that last heard from the store
    /// at `now` (unix ms 1,700,000,000,000) and knows of no leader.
    pub fn example(election: &str, identity: &str, now: Instant) -> ElectionState {
        ElectionState {
            election: election.into(),
            identity: identity.into(),
            role: Role::Follower,
            tenure: None,
            leader: None,
            fencing_token: None,
            observed_at: Some(now),
            observed_at_unix_ms: Some(1_700_000_000_000),
            last_error: None,
            malformed: None,
            unknown_format: None,
            session: None,
            heartbeat: now,
            first_observation_done: true,
            finished: false,
            rounds: 1,
            hints_until: None,
        }
    }

    /// The same, seeing `leader` hold the lease under `token`.
    #[must_use]
    pub fn seeing(self, leader: &str, token: u64) -> ElectionState {
        ElectionState {
            leader: Some(leader.into()),
            fencing_token: Some(token),
            ..self
        }
    }

    /// The same, in `role` of a tenure begun at `since` under `token` with
    /// the default timing: a 10 s lease, valid for 9.7 s, stop at 7.7 s.
    #[must_use]
    pub fn in_tenure(self, role: Role, token: u64, since: Instant) -> ElectionState {
        let identity = self.identity.clone();
        ElectionState {
            role,
            tenure: Some(Tenure {
                fencing_token: token,
                since_unix_ms: 1_700_000_000_000,
                since,
                valid_until: since + Duration::from_millis(9_700),
                stop_at: since + Duration::from_millis(7_700),
                seq: 1,
                lease_ms: 10_000,
            }),
            ..self.seeing(&identity, token)
        }
    }
}

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

/// What to do after a voluntary release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AfterRelease {
    /// End the election task.
    Exit,
    /// Sit out this long, then campaign again.
    SitOut(Duration),
    /// Follow at once: the lease went to a named successor, which others
    /// wait for as if it were held.
    Follow,
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
    /// [`core::Input::Checked`]).
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
    /// [`core::Input::Checked`]); dropped when its queue is full (the next check
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

pub mod core;
mod driver;
mod error_log;
#[cfg(test)]
mod hint_tests;
mod hints;
#[cfg(test)]
mod model;
mod record_check;
pub mod session;
mod session_reads;
mod session_sweep;
mod session_task;
mod takeover;
#[cfg(test)]
mod tests;

pub use self::core::{Action, Core, Input, Note, Tick, WriteOp};
use error_log::ErrorLog;
pub use hints::{Aim, Hint, HintFeed, LeaseEvent, Target};
pub use record_check::{CheckTarget, spawn_record_check};
pub use session::SessionView;
pub use session_reads::{KnownSession, SessionReads};
pub use session_task::{Demand, SESSION_LABEL, SessionHandle, spawn_session};
pub use takeover::{TakeoverTimer, takeover_wait};
