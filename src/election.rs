//! The election engine: one task per election.
//!
//! The task reads and writes the lease through a [`LeaseStore`] and publishes
//! its state on a `watch` channel, so the HTTP server, the metrics and the
//! child supervisor observe it without ever locking or slowing the engine.
//! Elections are independent tasks: a slow request in one never delays
//! another's renewal.
//!
//! Timing, all on the boot-time [`Clock`]:
//! - follower: takes over an `rvn` only after it stayed unchanged for
//!   `lease_ms·(1+D)` since the response that first showed it arrived;
//! - leader: valid until `send time of last successful write + L·(1−D) − M`;
//!   renews every R, retries every P, and at `validity − G` without a renew it
//!   enters [`Role::Stopping`] (the child must stop), at validity it is a
//!   follower again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock::{self, Clock, Instant};
use crate::lease::{
    Condition, HolderMeta, Lease, LeaseStore, Malformed, Record, StoreError, WriteOutcome, new_rvn,
};
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
    /// After creating a missing item, wait L·(1+D) (renewing) before leading.
    pub strict_new_lease: bool,
    /// Advertised in the lease record.
    pub holder_meta: Option<HolderMeta>,
}

/// The built-in timing: the defaults of the configuration's timing keys.
pub mod defaults {
    use std::time::Duration;

    /// L, `lease.duration`; R defaults to L/2.
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);
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
            renew_interval: defaults::LEASE_DURATION / 2,
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
        if !(0.0..0.5).contains(&self.max_clock_drift) {
            return Err(TimingError::Drift(self.max_clock_drift));
        }
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

    /// How long a follower waits on an unchanged rvn whose holder promised `lease_ms`.
    pub fn takeover_wait(&self, lease_ms: u64) -> Duration {
        Duration::from_millis(lease_ms).mul_f64(1.0 + self.max_clock_drift)
    }

    fn request_budget(&self) -> Duration {
        self.renew_interval
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq)]
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
    /// Boot instant at which the campaign loop last made progress.
    pub heartbeat: Instant,
    /// True once the first read of the record has been answered.
    pub first_observation_done: bool,
    /// True once the task has ended (after a final release).
    pub finished: bool,
    /// Campaign rounds completed as a follower (read, and the acquisition
    /// attempt it allowed, if any). `--acquire-timeout 0` gives up after one.
    pub rounds: u64,
}

impl ElectionState {
    /// Whether we lead at `now`: role `Leader` and before the stop time. Callers
    /// pass the current clock reading so a stalled engine cannot make a stale
    /// state look valid.
    pub fn is_leader_at(&self, now: Instant) -> bool {
        self.role == Role::Leader && self.tenure.as_ref().is_some_and(|t| now < t.stop_at)
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
            heartbeat: now,
            first_observation_done: true,
            finished: false,
            rounds: 1,
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
    /// A malformed record was seen.
    fn malformed_record(&self, _election: &str) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// What to do after a voluntary release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRelease {
    /// End the election task.
    Exit,
    /// Sit out this long, then campaign again.
    SitOut(Duration),
}

/// Requests to the election task.
#[derive(Debug)]
pub enum Command {
    /// Give the lease up (the caller stopped the child first), then act as said.
    /// `done` is answered once the release was attempted.
    Release {
        /// What to do afterwards.
        then: AfterRelease,
        /// Answered with whether a lease was released.
        done: oneshot::Sender<bool>,
    },
}

/// Handle to a running election task.
#[derive(Debug)]
pub struct ElectionHandle {
    /// The published state.
    pub state: watch::Receiver<ElectionState>,
    /// The configured lease duration (also how long a resign sits out).
    pub lease_duration: Duration,
    commands: mpsc::Sender<Command>,
    task: JoinHandle<()>,
}

impl ElectionHandle {
    /// Release the lease if held, then act as said. Returns whether a lease
    /// was released; `false` also when the task is gone.
    pub async fn release(&self, then: AfterRelease) -> bool {
        let (done, rx) = oneshot::channel();
        if self
            .commands
            .send(Command::Release { then, done })
            .await
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
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
    let now = clock.now();
    let lease_duration = config.lease_duration;
    let (state_tx, state) = watch::channel(ElectionState {
        election: config.name.clone(),
        identity: config.identity.clone(),
        role: Role::Follower,
        tenure: None,
        leader: None,
        fencing_token: None,
        observed_at: None,
        observed_at_unix_ms: None,
        last_error: None,
        malformed: None,
        heartbeat: now,
        first_observation_done: false,
        finished: false,
        rounds: 0,
    });
    let (commands, cmd_rx) = mpsc::channel(8);
    let retry = Retry::new(config.retry_interval);
    let store_changes = store.changes();
    let engine = Engine {
        store,
        cfg: config,
        clock,
        observer,
        state_tx,
        commands: cmd_rx,
        observed: None,
        own_rvns: Vec::new(),
        last_token: None,
        tenure_seq: 0,
        warned_malformed: None,
        errors: ErrorLog::default(),
        retry,
        store_changes,
    };
    let task = tokio::spawn(engine.run(delay));
    ElectionHandle {
        state,
        lease_duration,
        commands,
        task,
    }
}

/// The record version a follower is timing.
#[derive(Debug, Clone)]
struct Observed {
    /// rvn, or `malformed:<fingerprint>` for a malformed item.
    key: String,
    first_seen: Instant,
    lease_ms: u64,
}

/// The leader's private view of its tenure.
#[derive(Debug, Clone)]
struct Term {
    lease: Lease,
    last_send: Instant,
    leads_from: Instant,
    since: Instant,
    seq: u64,
}

/// How an acquisition attempt ended.
enum Attempt {
    /// The write applied: lead under this term (boxed: a term is large
    /// next to the other variants).
    Won(Box<Term>),
    /// Someone else wrote first: an answer, look again at once.
    Lost,
    /// A store error: pause before the next round.
    Failed,
}

/// What one follower round came to.
enum Round {
    /// Nothing to take: look again at this instant.
    Wait(Instant),
    /// It tried to take the lease.
    Attempted(Attempt),
}

enum Step {
    Follow,
    Lead(Term),
    /// Stop the child now; kill at the given instant; then follow.
    Stopping(Term, Instant),
    /// Sit out this long, then follow.
    SitOut(Duration),
    Exit,
}

struct Engine {
    store: Arc<dyn LeaseStore>,
    cfg: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
    state_tx: watch::Sender<ElectionState>,
    commands: mpsc::Receiver<Command>,
    observed: Option<Observed>,
    /// rvns we wrote or may have written (an unanswered write): finding one of
    /// these in the record means nobody else wrote since, so we may take it
    /// back at once.
    own_rvns: Vec<String>,
    /// Highest fencing token seen in this process, to keep tokens increasing
    /// across deletion of the item.
    last_token: Option<u64>,
    tenure_seq: u64,
    warned_malformed: Option<String>,
    /// Store errors, logged once per change.
    errors: ErrorLog,
    /// The follower's pause after a round that failed with a store error.
    retry: Retry,
    /// Moves when the store notices its data was replaced under it.
    store_changes: Option<watch::Receiver<u64>>,
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

/// Which kind of store request failed: reads and writes are told apart so
/// that a read that works between two writes that fail does not count as
/// the end of the writes' trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    Read,
    Write,
}

impl RequestKind {
    fn of(op: &str) -> RequestKind {
        if op == "read" {
            RequestKind::Read
        } else {
            RequestKind::Write
        }
    }

    fn plural(self) -> &'static str {
        match self {
            RequestKind::Read => "reads",
            RequestKind::Write => "writes",
        }
    }
}

/// An error that keeps coming back: logged when it starts, when it turns
/// into another error, and when it ends, with how often it came in between;
/// never once per attempt.
#[derive(Debug, Default)]
struct ErrorLog {
    reads: Option<Streak>,
    writes: Option<Streak>,
}

#[derive(Debug)]
struct Streak {
    /// The error's text: the same text is the same error.
    error: String,
    /// Failures in a row with this text.
    count: u64,
    /// When the streak (of any error) began.
    since: Instant,
}

impl ErrorLog {
    fn streak(&mut self, kind: RequestKind) -> &mut Option<Streak> {
        match kind {
            RequestKind::Read => &mut self.reads,
            RequestKind::Write => &mut self.writes,
        }
    }

    /// Counts a failure; `Some(previous)` when it is worth a log line: a new
    /// error (`previous` is how often the one before it came, 0 if none).
    fn failed(&mut self, kind: RequestKind, error: String, now: Instant) -> Option<u64> {
        let streak = self.streak(kind);
        match streak {
            Some(s) if s.error == error => {
                s.count += 1;
                None
            }
            Some(s) => {
                let previous = s.count;
                s.error = error;
                s.count = 1;
                Some(previous)
            }
            None => {
                *streak = Some(Streak {
                    error,
                    count: 1,
                    since: now,
                });
                Some(0)
            }
        }
    }

    /// A request of this kind succeeded: the streak that ended, if any.
    fn succeeded(&mut self, kind: RequestKind) -> Option<Streak> {
        self.streak(kind).take()
    }
}

/// The follower's pause after a failed round: the retry interval P at
/// first, doubling up to 4·P, each pause drawn from `[d, 2d)` so that
/// instances that failed together do not retry together.
#[derive(Debug)]
struct Retry {
    retry_interval: Duration,
    pauses: backon::ExponentialBackoff,
}

impl Retry {
    fn new(retry_interval: Duration) -> Retry {
        use backon::BackoffBuilder;
        Retry {
            retry_interval,
            pauses: backon::ExponentialBuilder::default()
                .with_min_delay(retry_interval)
                .with_max_delay(retry_interval * 4)
                .with_jitter()
                .without_max_times()
                .build(),
        }
    }

    fn next_pause(&mut self) -> Duration {
        self.pauses.next().unwrap_or(self.retry_interval * 4)
    }

    fn reset(&mut self) {
        *self = Retry::new(self.retry_interval);
    }
}

impl Engine {
    async fn run(mut self, delay: Duration) {
        let mut step = Step::Follow;
        if !delay.is_zero()
            && let Some(decided) = self.wait_follower(self.clock.now() + delay).await
        {
            step = decided;
        }
        loop {
            step = match step {
                Step::Follow => self.follow().await,
                Step::Lead(term) => self.lead(term).await,
                Step::Stopping(term, kill_at) => self.stopping(term, kill_at).await,
                Step::SitOut(d) => self.sit_out(d).await,
                Step::Exit => break,
            };
        }
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
            s.finished = true;
        });
    }

    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn beat(&self) {
        let now = self.clock.now();
        self.state_tx.send_modify(|s| s.heartbeat = now);
    }

    fn remember_own(&mut self, rvn: &str) {
        self.own_rvns.push(rvn.to_owned());
        if self.own_rvns.len() > 4 {
            self.own_rvns.remove(0);
        }
    }

    fn note_token(&mut self, token: u64) {
        self.last_token = Some(self.last_token.map_or(token, |t| t.max(token)));
    }

    /// The token for a new tenure: above every token seen, and when there is no
    /// previous item, at least the unix ms so it also exceeds tokens of items
    /// deleted before this process started.
    fn next_token(&self, previous: Option<u64>) -> u64 {
        let floor = self.last_token.map_or(0, |t| t + 1);
        match previous {
            Some(p) => (p + 1).max(floor),
            None => clock::unix_ms().max(floor),
        }
    }

    fn store_error(&mut self, op: &'static str, e: &StoreError) {
        let kind = RequestKind::of(op);
        let now = self.clock.now();
        match self.errors.failed(kind, e.to_string(), now) {
            Some(0) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, op, error = %e, class = e.metric_label(), "store request failed (logged again only when the error changes)")
            }
            Some(previous) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, op, error = %e, class = e.metric_label(), previous_error_repeats = previous, "store request failed with another error")
            }
            None => {
                tracing::debug!(election = %self.name(), op, error = %e, "store request failed again")
            }
        }
        let label = e.metric_label().to_owned();
        self.state_tx.send_modify(|s| s.last_error = Some(label));
    }

    /// A store request of `op`'s kind was answered (a failed condition is an
    /// answer too).
    fn store_answered(&mut self, op: &'static str) {
        let kind = RequestKind::of(op);
        if let Some(streak) = self.errors.succeeded(kind) {
            let failing = self.clock.now() - streak.since;
            tracing::info!(election = %self.name(), identity = %self.cfg.identity, failures = streak.count, failing_ms = failing.as_millis() as u64, "store {} work again", kind.plural());
        }
    }

    fn observed_ok(
        &self,
        at: Instant,
        leader: Option<String>,
        token: Option<u64>,
        malformed: Option<String>,
    ) {
        let unix = clock::unix_ms();
        self.state_tx.send_modify(|s| {
            s.observed_at = Some(at);
            s.observed_at_unix_ms = Some(unix);
            s.last_error = None;
            s.first_observation_done = true;
            s.leader = leader;
            s.fencing_token = token;
            s.malformed = malformed;
        });
    }

    async fn timed_read(&mut self) -> (Instant, Result<Record, StoreError>) {
        let start = self.clock.now();
        let res = self
            .store
            .read(self.name(), self.cfg.request_budget())
            .await;
        let end = self.clock.now();
        let outcome = match &res {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(self.name(), "read", end - start, outcome);
        if res.is_ok() {
            self.store_answered("read");
        }
        (end, res)
    }

    async fn timed_write(
        &mut self,
        op: &'static str,
        lease: &Lease,
        cond: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let start = self.clock.now();
        let res = self.store.write(lease, cond, budget).await;
        let outcome = match &res {
            Ok(WriteOutcome::Applied) => Outcome::Ok,
            Ok(WriteOutcome::ConditionFailed { .. }) => Outcome::Lost,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(self.name(), op, self.clock.now() - start, outcome);
        if res.is_ok() {
            self.store_answered(op);
        }
        res
    }

    fn new_lease(&self, token: u64, acquired_at_ms: u64) -> Lease {
        let now_ms = clock::unix_ms();
        let lease_ms = self.cfg.lease_duration.as_millis() as u64;
        Lease {
            election: self.cfg.name.clone(),
            holder: Some(self.cfg.identity.clone()),
            rvn: new_rvn(),
            fencing_token: token,
            lease_ms,
            acquired_at_ms,
            renewed_at_ms: now_ms,
            expires_at_s: (now_ms + lease_ms).div_ceil(1000),
            holder_meta: self.cfg.holder_meta.clone(),
        }
    }

    /// Wait until `until` or a command; handles the command. Returns
    /// `Some(step)` if a command decided the next step.
    async fn wait_follower(&mut self, until: Instant) -> Option<Step> {
        loop {
            tokio::select! {
                _ = self.clock.sleep_until(until) => return None,
                cmd = self.commands.recv() => match cmd {
                    // Not leading: nothing to release, and a step-down
                    // (resign) changes nothing either; only an exit ends
                    // the task.
                    Some(Command::Release { then, done }) => {
                        let _ = done.send(false);
                        if then == AfterRelease::Exit {
                            return Some(Step::Exit);
                        }
                    }
                    None => return Some(Step::Exit),
                },
            }
        }
    }

    fn after_release(then: AfterRelease) -> Step {
        match then {
            AfterRelease::Exit => Step::Exit,
            AfterRelease::SitOut(d) => Step::SitOut(d),
        }
    }

    async fn sit_out(&mut self, d: Duration) -> Step {
        self.observed = None;
        let until = self.clock.now() + d;
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, sit_out = %text::duration(d), "sitting out before campaigning again");
        loop {
            self.beat();
            let slice = (self.clock.now() + self.cfg.retry_interval).min(until);
            if let Some(step) = self.wait_follower(slice).await {
                return step;
            }
            if self.clock.now() >= until {
                return Step::Follow;
            }
        }
    }

    async fn follow(&mut self) -> Step {
        loop {
            self.beat();
            let (at, res) = self.timed_read().await;
            let round = match res {
                Err(e) => {
                    self.store_error("read", &e);
                    Round::Attempted(Attempt::Failed)
                }
                Ok(record) => self.consider(record, at).await,
            };
            let next_poll = match round {
                Round::Attempted(Attempt::Won(term)) => return Step::Lead(*term),
                // Someone else wrote since our read: read again at once.
                Round::Attempted(Attempt::Lost) => {
                    self.retry.reset();
                    self.clock.now()
                }
                // An error, not an answer: never retried in a loop.
                Round::Attempted(Attempt::Failed) => self.clock.now() + self.retry.next_pause(),
                Round::Wait(until) => {
                    self.retry.reset();
                    until
                }
            };
            self.state_tx.send_modify(|s| s.rounds += 1);
            if let Some(step) = self.wait_follower(next_poll).await {
                return step;
            }
        }
    }

    /// One follower round after a successful read (answered at `at`): take
    /// the lease if it is free, or say when to look again.
    async fn consider(&mut self, record: Record, at: Instant) -> Round {
        let poll = at + self.cfg.retry_interval;
        match record {
            Record::Absent => {
                self.observed_ok(at, None, None, None);
                self.observed = None;
                let token = self.next_token(None);
                let lease = self.new_lease(token, clock::unix_ms());
                Round::Attempted(self.acquire("create", lease, Condition::NotExists).await)
            }
            Record::Valid(current) => {
                self.note_token(current.fencing_token);
                self.observed_ok(
                    at,
                    current.holder.clone(),
                    Some(current.fencing_token),
                    None,
                );
                let ours = current.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && self.own_rvns.contains(&current.rvn);
                let expired = self.expired(&current.rvn, current.lease_ms, at);
                if current.holder.is_none() || ours || expired {
                    let token = self.next_token(Some(current.fencing_token));
                    let lease = self.new_lease(token, clock::unix_ms());
                    let cond = Condition::RvnIs(current.rvn.clone());
                    return Round::Attempted(self.acquire("take_over", lease, cond).await);
                }
                match &self.observed {
                    // Wake exactly when the takeover becomes allowed.
                    Some(obs) => {
                        let due = obs.first_seen + self.cfg.takeover_wait(obs.lease_ms);
                        Round::Wait(poll.min(due.max(at)))
                    }
                    None => Round::Wait(poll),
                }
            }
            Record::Malformed(m) => self.consider_malformed(m, at).await,
        }
    }

    async fn consider_malformed(&mut self, m: Malformed, at: Instant) -> Round {
        if self.warned_malformed.as_deref() != Some(m.fingerprint.as_str()) {
            tracing::warn!(election = %self.name(), problem = %m.problem, "lease record is malformed; it will be overwritten only if it stays unchanged for a full lease");
            self.observer.malformed_record(self.name());
            self.warned_malformed = Some(m.fingerprint.clone());
        }
        if let Some(t) = m.fencing_token {
            self.note_token(t);
        }
        self.observed_ok(at, None, m.fencing_token, Some(m.problem.clone()));
        let key = format!("malformed:{}", m.fingerprint);
        let lease_ms = self.cfg.lease_duration.as_millis() as u64;
        if !self.expired(&key, lease_ms, at) {
            return Round::Wait(at + self.cfg.retry_interval);
        }
        // Treat an unreadable token as absent: unix ms keeps the new token
        // above any sane earlier one.
        let token = self
            .next_token(None)
            .max(m.fencing_token.map_or(0, |t| t + 1));
        let lease = self.new_lease(token, clock::unix_ms());
        tracing::warn!(election = %self.name(), "overwriting a malformed lease record that stayed unchanged for a full lease");
        Round::Attempted(
            self.acquire("take_over", lease, Condition::Unchanged(m.guard))
                .await,
        )
    }

    /// Track `key` (an rvn); true once it has stayed unchanged for the wait
    /// its holder's `lease_ms` calls for. Time starts when the response that
    /// first showed it arrived.
    fn expired(&mut self, key: &str, lease_ms: u64, at: Instant) -> bool {
        match &self.observed {
            Some(obs) if obs.key == key => {
                at - obs.first_seen >= self.cfg.takeover_wait(obs.lease_ms)
            }
            _ => {
                self.observed = Some(Observed {
                    key: key.to_owned(),
                    first_seen: at,
                    lease_ms,
                });
                false
            }
        }
    }

    /// Try to start a tenure with `lease` under `cond`.
    async fn acquire(&mut self, op: &'static str, lease: Lease, cond: Condition) -> Attempt {
        let send = self.clock.now();
        self.remember_own(&lease.rvn);
        let res = self
            .timed_write(op, &lease, &cond, self.cfg.request_budget())
            .await;
        match res {
            Ok(WriteOutcome::Applied) => {
                self.observer.acquire_attempt(self.name(), Outcome::Ok);
                self.note_token(lease.fencing_token);
                self.observed = None;
                self.tenure_seq += 1;
                let leads_from = if op == "create" && self.cfg.strict_new_lease {
                    send + self.cfg.takeover_wait(lease.lease_ms)
                } else {
                    send
                };
                let term = Term {
                    since: send,
                    leads_from,
                    last_send: send,
                    seq: self.tenure_seq,
                    lease,
                };
                Attempt::Won(Box::new(term))
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                self.observer.acquire_attempt(self.name(), Outcome::Lost);
                tracing::debug!(election = %self.name(), op, "acquisition lost the race");
                self.observed = None;
                Attempt::Lost
            }
            Err(e) => {
                self.observer
                    .acquire_attempt(self.name(), Outcome::Failed(&e));
                self.store_error(op, &e);
                Attempt::Failed
            }
        }
    }

    /// The published view of `term`, ending at `valid_until` and due to stop
    /// the child at `stop_at`.
    fn tenure_of(term: &Term, valid_until: Instant, stop_at: Instant) -> Tenure {
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

    fn publish_term(&self, term: &Term, role: Role) {
        let valid_until = term.last_send + self.cfg.validity();
        let tenure = Self::tenure_of(
            term,
            valid_until,
            valid_until.saturating_sub(self.cfg.kill_grace),
        );
        let at = self.clock.now();
        let unix = clock::unix_ms();
        let me = self.cfg.identity.clone();
        self.state_tx.send_modify(|s| {
            s.role = role;
            s.tenure = Some(tenure);
            s.leader = Some(me);
            s.fencing_token = Some(term.lease.fencing_token);
            s.observed_at = Some(at);
            s.observed_at_unix_ms = Some(unix);
            s.last_error = None;
            s.malformed = None;
            s.first_observation_done = true;
            s.heartbeat = at;
        });
    }

    async fn lead(&mut self, mut term: Term) -> Step {
        let mut role = if self.clock.now() < term.leads_from {
            Role::Confirming
        } else {
            Role::Leader
        };
        self.publish_term(&term, role);
        if role == Role::Leader {
            self.announce_gain(&term);
        }
        // Replacements noticed before this tenure's first write are old news:
        // that write went to what the store names now.
        if let Some(rx) = &mut self.store_changes {
            rx.borrow_and_update();
        }
        let mut next_renew = self.renew_due(term.last_send);
        loop {
            self.beat();
            let valid_until = term.last_send + self.cfg.validity();
            let stop_at = valid_until.saturating_sub(self.cfg.kill_grace);
            if role == Role::Confirming && self.clock.now() >= term.leads_from {
                role = Role::Leader;
                self.publish_term(&term, role);
                self.announce_gain(&term);
            }
            let wake = if role == Role::Confirming {
                next_renew.min(stop_at).min(term.leads_from)
            } else {
                next_renew.min(stop_at)
            };
            tokio::select! {
                _ = self.clock.sleep_until(wake) => {}
                cmd = self.commands.recv() => {
                    let (then, done) = match cmd {
                        Some(Command::Release { then, done }) => (then, Some(done)),
                        None => (AfterRelease::Exit, None),
                    };
                    self.release(&term, role).await;
                    if let Some(done) = done {
                        let _ = done.send(true);
                    }
                    return Self::after_release(then);
                }
                () = store_changed(&mut self.store_changes) => {
                    tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "the lease store's data was replaced under us; renewing at once to learn whether we still lead");
                    next_renew = self.clock.now();
                }
            }
            let now = self.clock.now();
            if now >= stop_at {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, cause = "no successful renew before validity - kill_grace", "lease lost: stopping the child");
                return Step::Stopping(term, valid_until);
            }
            if now < next_renew {
                continue;
            }
            // Renew. The request may not outlive the stop time: past it the
            // answer no longer matters to this tenure.
            let mut renewed = term.lease.clone();
            renewed.rvn = new_rvn();
            let now_ms = clock::unix_ms();
            renewed.renewed_at_ms = now_ms;
            renewed.expires_at_s = (now_ms + renewed.lease_ms).div_ceil(1000);
            let cond = Condition::HeldBy {
                rvn: term.lease.rvn.clone(),
                holder: self.cfg.identity.clone(),
            };
            self.remember_own(&renewed.rvn);
            let send = self.clock.now();
            let budget = self.cfg.request_budget().min(stop_at - send);
            let clock = self.clock.clone();
            let res = clock
                .timeout_at(stop_at, self.timed_write("renew", &renewed, &cond, budget))
                .await
                .unwrap_or(Err(StoreError::Timeout(budget)));
            match res {
                Ok(WriteOutcome::Applied) => {
                    self.observer.renew(self.name(), Outcome::Ok);
                    term.lease = renewed;
                    term.last_send = send;
                    next_renew = self.renew_due(send);
                    self.publish_term(&term, role);
                    tracing::debug!(election = %self.name(), fencing_token = term.lease.fencing_token, "renewed");
                }
                Ok(WriteOutcome::ConditionFailed { current }) => {
                    // An earlier renew whose answer was lost may have applied:
                    // the record then carries an rvn we wrote. Adopt it and
                    // renew again at once; validity still counts from the
                    // last write we know succeeded (the conservative choice).
                    let budget = self.cfg.request_budget().min(stop_at - self.clock.now());
                    let (current, ours) = self.record_after_conflict(current, &term, budget).await;
                    if let Some(rvn) = ours {
                        tracing::debug!(election = %self.name(), "an earlier renew had applied; continuing from it");
                        term.lease.rvn = rvn;
                        next_renew = self.clock.now();
                        continue;
                    }
                    self.observer.renew(self.name(), Outcome::Lost);
                    let by = match &current {
                        Some(Record::Valid(l)) => {
                            l.holder.clone().unwrap_or_else(|| "(released)".into())
                        }
                        Some(Record::Absent) => "(item deleted)".into(),
                        Some(Record::Malformed(m)) => format!("(malformed: {})", m.problem),
                        None => "(unknown)".into(),
                    };
                    tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, cause = "someone else wrote the lease record", written_by = %by, "lease lost: stopping the child");
                    self.observed = None;
                    let kill_at = (self.clock.now() + self.cfg.kill_grace).min(valid_until);
                    return Step::Stopping(term, kill_at);
                }
                Err(e) => {
                    self.observer.renew(self.name(), Outcome::Failed(&e));
                    self.store_error("renew", &e);
                    next_renew = self.clock.now() + self.cfg.retry_interval;
                }
            }
        }
    }

    /// When to renew after a write sent at `send`: R later, rounded down to
    /// a grid of R/20 shared by every election of this process. Only the
    /// first renewal of a tenure moves (earlier, by less than R/20, which
    /// is always safe); the later ones are R apart on the grid. Elections
    /// whose renewals fall in the same tick are renewed in one wake-up, and
    /// their requests and answers are handled in batches. At 1,000
    /// elections (started over one R, see daemon.rs) R/20 puts about 50
    /// renewals on a tick; the earlier R/100 grid with starts within one
    /// second cost about 25 % more CPU and twice the connections, and R/10
    /// saved nothing more (docs/benchmarks.md).
    fn renew_due(&self, send: Instant) -> Instant {
        (send + self.cfg.renew_interval).floor_to(self.cfg.renew_interval / 20)
    }

    fn announce_gain(&self, term: &Term) {
        self.observer.transition(self.name(), Transition::Gained);
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "became leader");
    }

    /// The record after a write of ours failed its condition: the one the
    /// store answered with, else read back within `budget` (`None` when that
    /// fails too). With it, the rvn to continue from when the record is
    /// still this tenure's: a renew whose answer was lost applied after all
    /// (our identity, this tenure's token, an rvn we wrote).
    async fn record_after_conflict(
        &self,
        current: Option<Record>,
        term: &Term,
        budget: Duration,
    ) -> (Option<Record>, Option<String>) {
        let current = match current {
            Some(c) => Some(c),
            None => self.store.read(self.name(), budget).await.ok(),
        };
        let ours = match &current {
            Some(Record::Valid(l))
                if l.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && l.fencing_token == term.lease.fencing_token
                    && self.own_rvns.contains(&l.rvn) =>
            {
                Some(l.rvn.clone())
            }
            _ => None,
        };
        (current, ours)
    }

    async fn release(&mut self, term: &Term, role: Role) {
        let mut released = term.lease.clone();
        released.holder = None;
        released.holder_meta = None;
        released.rvn = new_rvn();
        released.renewed_at_ms = clock::unix_ms();
        released.expires_at_s = released.renewed_at_ms / 1000;
        let cond = Condition::HeldBy {
            rvn: term.lease.rvn.clone(),
            holder: self.cfg.identity.clone(),
        };
        // Not leading from here on, whatever the store answers.
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
            s.leader = None;
        });
        if role == Role::Leader {
            self.observer.transition(self.name(), Transition::Lost);
        }
        let budget = self.cfg.request_budget();
        let mut outcome = self.timed_write("release", &released, &cond, budget).await;
        // A renew whose answer was lost may have applied after all: the
        // record then carries an rvn we wrote. Release that one instead.
        if let Ok(WriteOutcome::ConditionFailed { current }) = &outcome
            && let (_, Some(rvn)) = self
                .record_after_conflict(current.clone(), term, budget)
                .await
        {
            let cond = Condition::HeldBy {
                rvn,
                holder: self.cfg.identity.clone(),
            };
            released.rvn = new_rvn();
            outcome = self.timed_write("release", &released, &cond, budget).await;
        }
        match outcome {
            Ok(WriteOutcome::Applied) => {
                tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "released the lease");
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "nothing to release: someone else wrote the lease record since our last write");
            }
            Err(e) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, error = %e, "release failed; the lease will expire on its own");
            }
        }
        self.own_rvns.clear();
        self.observed = None;
    }

    async fn stopping(&mut self, term: Term, kill_at: Instant) -> Step {
        // Stop now; the child must be dead by `kill_at`, never after validity.
        let valid_until = kill_at.min(term.last_send + self.cfg.validity());
        let tenure_state = Self::tenure_of(&term, valid_until, self.clock.now().min(valid_until));
        let was_leader = self.state_tx.borrow().role == Role::Leader;
        self.state_tx.send_modify(|s| {
            s.role = Role::Stopping;
            s.tenure = Some(tenure_state.clone());
        });
        if was_leader {
            self.observer.transition(self.name(), Transition::Lost);
        }
        loop {
            self.beat();
            let until = (self.clock.now() + self.cfg.retry_interval).min(tenure_state.valid_until);
            tokio::select! {
                _ = self.clock.sleep_until(until) => {}
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Release { then, done }) => {
                        // The caller stopped the child; the record may still be
                        // ours, so release it if we can.
                        self.release(&term, Role::Stopping).await;
                        let _ = done.send(true);
                        return Self::after_release(then);
                    }
                    None => return Step::Exit,
                },
            }
            if self.clock.now() >= tenure_state.valid_until {
                break;
            }
        }
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
        });
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "tenure ended; campaigning again");
        Step::Follow
    }
}

#[cfg(test)]
mod tests;
