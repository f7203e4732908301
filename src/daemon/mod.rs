//! Wiring for `leaderd run`: the store, one engine per election, the HTTP
//! server, the child supervisor and the shutdown sequence.
//!
//! Everything that reacts to leadership watches the engines' state; this
//! module owns the one loop that turns those states, signals and child exits
//! into actions, so the order of events is easy to follow:
//! lead -> start child; lose -> stop child (the guard enforces the kill);
//! SIGTERM -> forward, keep renewing while the child winds down, release, exit.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::app_check::{self, Verdict};
use crate::balance::{self, BalanceConfig, Balancer, Elected};
use crate::clock::{Clock, Instant};
use crate::config::{ChildConfig, Config, Mode};
use crate::election::{self, AfterRelease, ElectionHandle, ElectionState, Role};
use crate::exit;
use crate::hints;
use crate::http::{self, AppState, ResignError, ResignRequest, Resigned};
use crate::lease::{self, HolderMeta, LeaseStore, StoreError};
use crate::metrics::Metrics;
use crate::notify::{self, Notifier};
use crate::shutdown::{self, Signals};
use crate::supervisor::{self, Child, ChildExit, ChildSpec, SupervisorError};

mod child;

use child::{AfterExit, AfterStartFailure, Job, Slot};

/// How long the start-up store check may take with `fail_fast`.
const FAIL_FAST_BUDGET: Duration = Duration::from_secs(10);
/// Elections start [`CAMPAIGN_SPACING`] apart, all within [`CAMPAIGN_SPREAD`]
/// (the default renew interval). Their first writes, and with them their
/// renewals, then spread over the whole renew cycle, so each tick of the
/// renewal grid (election.rs, `renew_due`) carries a like share; and a start
/// never asks the store for more than about 200 elections a second (1,000
/// within one second opened hundreds of connections to a slow store).
const CAMPAIGN_SPACING: Duration = Duration::from_millis(5);
const CAMPAIGN_SPREAD: Duration = Duration::from_secs(5);

/// When election `i` of `n` makes its first store request, after start.
fn campaign_delay(i: usize, n: usize) -> Duration {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    let n = u32::try_from(n).unwrap_or(u32::MAX).max(1);
    CAMPAIGN_SPACING
        .saturating_mul(i)
        .min(CAMPAIGN_SPREAD.saturating_mul(i) / n)
}

/// Run the daemon until it is told to stop; returns the process exit code.
///
/// The caller hands in what belongs to the process: the signals it
/// installed, the clock every decision is timed with, and the HTTP listener
/// it bound (see [`http::bind`]), so a test can drive a whole daemon in
/// process on a paused clock and a port of its choosing.
pub async fn run(
    mut cfg: Config,
    notifier: Notifier,
    signals: Signals,
    clock: Clock,
    listener: TcpListener,
) -> i32 {
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    let (store, store_check) = match open_and_check_store(&cfg).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };

    let http_addr = listener.local_addr().ok();
    let advertised = advertised_address(cfg.http.advertise.as_deref(), http_addr);
    if let Some(address) = &advertised {
        tracing::info!(advertise = %address, "advertising this address in the records of the elections it leads");
        for e in &mut cfg.elections {
            e.holder_meta = Some(HolderMeta {
                address: Some(address.clone()),
                labels: Default::default(),
            });
        }
    }

    let metrics = Arc::new(Metrics::new());
    let app_check = cfg
        .app_check
        .clone()
        .map(|c| app_check::spawn(c, metrics.clone()));
    let handles = start_elections(&cfg, &store, &clock, &metrics, app_check.as_ref());
    let balancer = cfg.balance.then(|| {
        start_balancer(
            &cfg,
            &store,
            &handles,
            &clock,
            app_check.as_ref(),
            advertised,
        )
    });

    let (resign_tx, resign_rx) = mpsc::channel(8);
    let (job_health, job_health_rx) = watch::channel(None);
    let mut app = http_state(&cfg, &handles, &clock, &metrics, resign_tx, job_health_rx);
    if let Some(rx) = &app_check {
        app = app.with_app_check(rx.clone());
    }
    if let Some(b) = &balancer {
        app = app.with_balance(b.share.clone());
    }
    let http_stop = CancellationToken::new();
    let http_task = tokio::spawn(http::serve(
        listener,
        http::router(app),
        http_stop.clone().cancelled_owned(),
    ));
    // The bound address (port 0 in the configuration picks a free one).
    let listen = http_addr.map_or_else(|| cfg.http.listen.to_string(), |a| a.to_string());
    tracing::info!(listen = %listen, identity = %cfg.identity, store = store.kind(), elections = cfg.elections.len(), "leaderd running");

    #[cfg(feature = "testing")]
    if let Some(path) = std::env::var_os("LEADERD_TEST_STALL_FILE") {
        tokio::spawn(test_hooks::stall_when_file_appears(path.into()));
    }

    let notify_task = tokio::spawn(notify::report_states(
        notifier.clone(),
        handles.values().map(|h| h.state.clone()).collect(),
        cfg.primary.clone(),
        clock.clone(),
    ));

    let primary = handles
        .get(&cfg.primary)
        .expect("primary names a configured election: validated in Config::load");
    let job = Job::new(
        cfg.child.mode,
        cfg.child.on_child_exit,
        primary.lease_duration,
    );
    let mut daemon = Daemon {
        primary: primary.state.clone(),
        cfg,
        clock,
        metrics,
        handles,
        signals,
        resign_rx,
        store_check,
        job_health,
        job,
        shutdown: None,
        app_check,
        balancer,
        pending_step_down: None,
        seen_seq: None,
        always_started: false,
        acquired_once: false,
    };
    let code = daemon.run().await;

    notifier.send("STOPPING=1");
    daemon.release_all().await;
    notify_task.abort();
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), http_task).await;
    tracing::info!(exit_code = code, "leaderd stopped");
    code
}

/// The address written into the records of the elections this instance
/// leads: `http.advertise` if set; else the bound address unless it is a
/// wildcard; else the first non-loopback address of this host (IPv4 first)
/// with the bound port. `None` only when nothing at all is known.
fn advertised_address(configured: Option<&str>, bound: Option<SocketAddr>) -> Option<String> {
    if let Some(a) = configured {
        return Some(a.to_owned());
    }
    let bound = bound?;
    if !bound.ip().is_unspecified() {
        return Some(bound.to_string());
    }
    let mut found: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|addrs| {
            addrs
                .filter_map(|ifa| {
                    let addr = ifa.address?;
                    if let Some(v4) = addr.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                    }
                })
                .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip))
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|ip| ip.is_ipv6());
    match found.first() {
        Some(ip) => Some(SocketAddr::new(*ip, bound.port()).to_string()),
        None => {
            tracing::warn!("no non-loopback address found to advertise; set http.advertise");
            Some(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), bound.port()).to_string())
        }
    }
}

/// IPv6 link-local addresses (fe80::/10) need a scope to be reached.
fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Open the store. With `fail_fast` it must answer before anything else
/// happens; without, it is checked in the background while HTTP answers and
/// the elections campaign (the receiver hears of a store that can never
/// work). An error is the exit code.
async fn open_and_check_store(
    cfg: &Config,
) -> Result<(Arc<dyn LeaseStore>, Option<oneshot::Receiver<StoreError>>), i32> {
    let store = lease::open(&cfg.store.spec()).await.map_err(|e| {
        tracing::error!(error = %e, "cannot open the lease store");
        exit::UNAVAILABLE
    })?;
    if cfg.store.fail_fast {
        if let Err(e) = store.check(FAIL_FAST_BUDGET).await {
            tracing::error!(error = %e, store = store.kind(), "lease store unreachable at start (fail_fast)");
            return Err(exit::UNAVAILABLE);
        }
        return Ok((store, None));
    }
    let (tx, rx) = oneshot::channel();
    tokio::spawn(check_store(store.clone(), tx));
    Ok((store, Some(rx)))
}

/// One engine per election. Their first store requests are spread: a
/// thousand elections reach the store over a second instead of in one burst
/// that would open a connection per election (and keep them all pooled), and
/// their renewals stay that far apart afterwards. One election starts at
/// once.
fn start_elections(
    cfg: &Config,
    store: &Arc<dyn LeaseStore>,
    clock: &Clock,
    metrics: &Arc<Metrics>,
    app_check: Option<&watch::Receiver<Verdict>>,
) -> BTreeMap<String, ElectionHandle> {
    let n = cfg.elections.len();
    cfg.elections
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let hints = hints::spawn(
                e.name.clone(),
                clock.clone(),
                e.retry_interval,
                e.hint_quiet(),
            );
            let handle = election::spawn_gated(
                store.clone(),
                e.clone(),
                clock.clone(),
                metrics.clone(),
                campaign_delay(i, n),
                app_check.cloned(),
                Some(hints),
            );
            (e.name.clone(), handle)
        })
        .collect()
}

/// The balancer, when `balance` is on: every election may move, except the
/// primary when a job runs under it (that one moves by resign or shutdown,
/// which stop the job first).
fn start_balancer(
    cfg: &Config,
    store: &Arc<dyn LeaseStore>,
    handles: &BTreeMap<String, ElectionHandle>,
    clock: &Clock,
    app_check: Option<&watch::Receiver<Verdict>>,
    address: Option<String>,
) -> Balancer {
    let timing = cfg
        .elections
        .iter()
        .find(|e| e.name == cfg.primary)
        .expect("primary names a configured election: validated in Config::load");
    let config = BalanceConfig {
        identity: cfg.identity.clone(),
        lease_duration: timing.lease_duration,
        renew_interval: timing.renew_interval,
        retry_interval: timing.retry_interval,
        max_clock_drift: timing.max_clock_drift,
        address,
    };
    let pinned = (!cfg.child.command.is_empty()).then_some(cfg.primary.as_str());
    let elections = handles
        .iter()
        .map(|(name, h)| Elected {
            name: name.clone(),
            state: h.state.clone(),
            steering: (Some(name.as_str()) != pinned).then(|| h.steering()),
        })
        .collect();
    balance::spawn(
        store.clone(),
        config,
        elections,
        clock.clone(),
        app_check.cloned(),
    )
}

/// What the HTTP handlers read: every election's state, the job's health,
/// the way to ask for a resign.
fn http_state(
    cfg: &Config,
    handles: &BTreeMap<String, ElectionHandle>,
    clock: &Clock,
    metrics: &Arc<Metrics>,
    resign: mpsc::Sender<ResignRequest>,
    job_health: watch::Receiver<Option<String>>,
) -> AppState {
    let mut app = AppState::new(cfg.primary.clone(), clock.clone(), metrics.clone(), resign)
        .with_admin_token(cfg.http.admin_token.clone())
        .with_store_timeout(cfg.health.store_timeout)
        .with_job_health(job_health);
    for e in &cfg.elections {
        if let Some(h) = handles.get(&e.name) {
            app = app
                .with_election(h.state.clone(), http::wedge_threshold(e))
                .with_watch(&e.name, h.events.clone());
        }
    }
    app
}

/// Check the store until it answers. A wrong schema is final and goes to
/// the daemon, which exits; a store that cannot be reached or a table that
/// is missing or still being created is checked again, with growing pauses,
/// while the elections campaign (they report their own errors).
async fn check_store(store: Arc<dyn LeaseStore>, unusable: oneshot::Sender<StoreError>) {
    let mut pause = Duration::from_secs(1);
    let mut warned = false;
    loop {
        match store.check(FAIL_FAST_BUDGET).await {
            Ok(()) => {
                if warned {
                    tracing::info!(store = store.kind(), "lease store usable");
                }
                return;
            }
            Err(e @ StoreError::WrongSchema { .. }) => {
                let _ = unusable.send(e);
                return;
            }
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, store = store.kind(), "lease store not usable yet; campaigning anyway and checking again");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// Fault injection for the safety tests: built only with the `testing`
/// feature (test builds), and enabled only when the test sets
/// `LEADERD_TEST_STALL_FILE`.
#[cfg(feature = "testing")]
mod test_hooks {
    use std::path::PathBuf;
    use std::time::Duration;

    /// When the file appears, block every runtime worker thread for the number
    /// of milliseconds written in it: the async runtime stalls as it would
    /// under a runaway blocking call, while the guard process keeps time.
    pub(super) async fn stall_when_file_appears(path: PathBuf) {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let _ = std::fs::remove_file(&path);
            let ms: u64 = text.trim().parse().unwrap_or(5_000);
            tracing::warn!(stall_ms = ms, "test hook: stalling the async runtime");
            // One sleeper per worker thread (the daemon runs one).
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            for _ in 0..workers {
                tokio::spawn(async move { std::thread::sleep(Duration::from_millis(ms)) });
            }
        }
    }
}

struct Shutdown {
    /// When to stop waiting for the child and kill it.
    kill_at: Instant,
    killed: bool,
}

struct Daemon {
    cfg: Config,
    clock: Clock,
    metrics: Arc<Metrics>,
    handles: BTreeMap<String, ElectionHandle>,
    primary: watch::Receiver<ElectionState>,
    signals: Signals,
    resign_rx: mpsc::Receiver<ResignRequest>,
    /// The background store check's verdict, until it came or was dropped.
    store_check: Option<oneshot::Receiver<StoreError>>,
    /// What `/healthz` says of the job: a problem, or nothing.
    job_health: watch::Sender<Option<String>>,
    /// The job under the primary election, and what its starts and exits
    /// mean.
    job: Job<Box<Child>>,
    shutdown: Option<Shutdown>,
    /// The app check's verdict; `None` when there is no app check.
    app_check: Option<watch::Receiver<Verdict>>,
    /// Moves elections to share them with the other daemons; `None` when
    /// `balance` is off.
    balancer: Option<Balancer>,
    /// Stepping down from the primary election: the child is being stopped,
    /// the release follows its exit.
    pending_step_down: Option<StepDown>,
    /// Tenure seq seen by mode "always", to signal gains and losses once.
    seen_seq: Option<u64>,
    /// Mode "always": the child was started once (restarts go via Backoff).
    always_started: bool,
    /// Once a lease was held, `--acquire-timeout` no longer applies.
    acquired_once: bool,
}

/// Why the primary election is being given up once the child is gone.
enum StepDown {
    /// `POST /leader/{election}/resign`: answer the caller, sit out one lease.
    Resign(ResignRequest),
    /// The app check failed: release and campaign again once it passes.
    AppFailing,
}

impl StepDown {
    /// For the log.
    fn why(&self) -> &'static str {
        match self {
            StepDown::Resign(_) => "resign requested",
            StepDown::AppFailing => "app check failing",
        }
    }
}

enum Event {
    /// The app check's verdict changed.
    AppCheck,
    State,
    StateGone,
    ChildExited(ChildExit),
    Signal(Option<Signal>),
    Resign(Option<ResignRequest>),
    /// The store can never work (`Some`), or the check ended well (`None`).
    StoreCheck(Option<StoreError>),
    Timer,
}

impl Daemon {
    fn primary_name(&self) -> &str {
        &self.cfg.primary
    }

    fn child_config(&self) -> &ChildConfig {
        &self.cfg.child
    }

    fn has_command(&self) -> bool {
        !self.cfg.child.command.is_empty()
    }

    async fn run(&mut self) -> i32 {
        let started = self.clock.now();
        let acquire_by = self.cfg.acquire_timeout.map(|t| started + t);
        loop {
            // Act on the current state first, then wait for the next event.
            if let Some(code) = self.reconcile(acquire_by).await {
                return code;
            }
            let timer = self.next_timer(acquire_by);
            let event = {
                // Split the borrows: each select arm owns one field.
                let Daemon {
                    job,
                    primary,
                    signals,
                    resign_rx,
                    store_check,
                    clock,
                    app_check,
                    ..
                } = self;
                let verdict_changed = async {
                    match app_check {
                        Some(rx) => {
                            if rx.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending().await,
                    }
                };
                let store_verdict = async {
                    match store_check {
                        Some(rx) => rx.await.ok(),
                        None => std::future::pending().await,
                    }
                };
                let child_wait = async {
                    match &mut job.slot {
                        Slot::Running { child, .. } => child.wait().await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = primary.changed() => if r.is_ok() { Event::State } else { Event::StateGone },
                    exit = child_wait => Event::ChildExited(exit),
                    sig = signals.recv() => Event::Signal(sig),
                    req = resign_rx.recv() => Event::Resign(req),
                    verdict = store_verdict => Event::StoreCheck(verdict),
                    _ = verdict_changed => Event::AppCheck,
                    _ = clock.sleep_until(timer) => Event::Timer,
                }
            };
            match event {
                Event::State => tracing::debug!("event: state"),
                Event::AppCheck => self.on_app_check().await,
                Event::Timer => tracing::debug!("event: timer"),
                Event::StateGone => {
                    tracing::error!(election = %self.primary_name(), "election task ended unexpectedly");
                    self.kill_child().await;
                    return exit::SOFTWARE;
                }
                Event::ChildExited(status) => {
                    if let Some(code) = self.on_child_exit(status).await {
                        return code;
                    }
                }
                Event::Signal(None) => tracing::debug!("event: signal channel closed"),
                Event::Signal(Some(sig)) => self.on_signal(sig).await,
                Event::Resign(None) => tracing::debug!("event: resign channel closed"),
                Event::Resign(Some(req)) => self.on_resign(req).await,
                Event::StoreCheck(None) => self.store_check = None,
                Event::StoreCheck(Some(e)) => {
                    tracing::error!(error = %e, "the lease store cannot be used; stopping");
                    self.kill_child().await;
                    return exit::UNAVAILABLE;
                }
            }
        }
    }

    /// The next instant something is due without an event: the acquire
    /// timeout, a restart backoff, the shutdown kill, a validity edge.
    fn next_timer(&self, acquire_by: Option<Instant>) -> Instant {
        let now = self.clock.now();
        let mut t = now + Duration::from_secs(1);
        if let Some(a) = acquire_by
            && !self.acquired_once
        {
            // Never in the past: the zero timeout is decided by `rounds`.
            t = t.min(a.max(now + Duration::from_millis(10)));
        }
        if let Slot::Backoff { until } = &self.job.slot {
            t = t.min(*until);
        }
        if let Some(s) = &self.shutdown
            && !s.killed
        {
            t = t.min(s.kill_at);
        }
        if let Some(tenure) = &self.primary.borrow().tenure {
            // Wake at the stop time even if the engine is late publishing it.
            if tenure.stop_at > now {
                t = t.min(tenure.stop_at);
            }
        }
        t
    }

    /// Bring the child in line with the primary election's state. Returns an
    /// exit code when the daemon should end.
    async fn reconcile(&mut self, acquire_by: Option<Instant>) -> Option<i32> {
        let now = self.clock.now();
        let state = self.primary.borrow().clone();
        let leading = state.is_leader_at(now);

        // Shutdown: once the child is gone, we are done. Until then the
        // lease rules still apply: the engine keeps renewing, the guard's
        // deadline follows the renewals, a lost lease stops the child.
        if let Some(s) = &mut self.shutdown {
            let Slot::Running { child, .. } = &mut self.job.slot else {
                return Some(self.job.last_exit.map_or(0, |e| e.exit_code()));
            };
            if now >= s.kill_at && !s.killed {
                tracing::warn!(
                    "child still running after shutdown_grace; killing its process group"
                );
                s.killed = true;
                let _ = child.kill().await;
            }
            if self.cfg.child.mode == Mode::WhileLeader {
                // Starts nothing, so it never asks to end.
                let _ = self.reconcile_while_leader(&state, now, false).await;
            }
            return None;
        }

        // --acquire-timeout: give up when not leading in time (0: one attempt).
        if state.tenure.is_some() {
            self.acquired_once = true;
        }
        if let Some(by) = acquire_by
            && !self.acquired_once
            && !leading
        {
            let tried_once = state.rounds >= 1;
            let zero = self.cfg.acquire_timeout == Some(Duration::ZERO);
            if (zero && tried_once) || (!zero && now >= by) {
                tracing::warn!(election = %state.election, leader = state.leader.as_deref().unwrap_or("none"), "lease not acquired within --acquire-timeout");
                return Some(exit::TEMPFAIL);
            }
        }

        if !self.has_command() {
            return None;
        }
        match self.cfg.child.mode {
            Mode::Always => self.reconcile_always(&state, now).await,
            Mode::WhileLeader => self.reconcile_while_leader(&state, now, true).await,
        }
    }

    /// Returns an exit code when the job cannot run and leaderd must end.
    async fn reconcile_always(&mut self, state: &ElectionState, now: Instant) -> Option<i32> {
        let seq = state
            .tenure
            .as_ref()
            .filter(|_| state.is_leader_at(now))
            .map(|t| t.seq);
        // Start once the first observation settled whether we lead: the child
        // learns its initial role from LEADERD_IS_LEADER, and is signalled
        // only of later transitions (a signal racing the child's own start
        // could kill it before it installs its handler).
        let due = match self.job.slot {
            Slot::Idle => !self.always_started && (state.rounds >= 1 || seq.is_some()),
            Slot::Backoff { .. } => self.job.backoff_over(now),
            Slot::Running { .. } => false,
        };
        if due {
            self.always_started = true;
            self.seen_seq = seq;
            return self.start_child(None).await;
        }
        if seq == self.seen_seq {
            return None;
        }
        let lost = self.seen_seq.is_some();
        let gained = seq.is_some();
        self.seen_seq = seq;
        let Slot::Running { child, .. } = &mut self.job.slot else {
            return None;
        };
        let signals = [
            (lost, self.cfg.child.signal_on_loss, "loss"),
            (gained, self.cfg.child.signal_on_gain, "gain"),
        ];
        for (happened, sig, what) in signals {
            if let (true, Some(sig)) = (happened, sig) {
                tracing::info!(election = %state.election, signal = %sig, transition = what, "signalling the child of a leadership change");
                if let Err(e) = child.signal(sig).await {
                    tracing::warn!(error = %e, "cannot signal the child");
                }
            }
        }
        None
    }

    /// `may_start`: false while shutting down (never start a new child then).
    /// Returns an exit code when the job cannot run and leaderd must end.
    async fn reconcile_while_leader(
        &mut self,
        state: &ElectionState,
        now: Instant,
        may_start: bool,
    ) -> Option<i32> {
        let leading = state.is_leader_at(now);
        match &mut self.job.slot {
            Slot::Running {
                child,
                seq,
                stopping,
                ..
            } => {
                let same_tenure = state.tenure.as_ref().map(|t| t.seq) == *seq;
                // The guard's deadline follows every renewal, also while a
                // planned step-down (resign, a failing app check) stops the
                // job: the lease is still ours, so the job may take its
                // shutdown_grace. The stop's own grace still bounds the
                // kill (re-arming never moves a stop's kill later).
                if leading && same_tenure {
                    let t = state.tenure.as_ref().expect("leading implies a tenure");
                    match child.arm(t.stop_at, t.valid_until).await {
                        // Exited: its exit report is on the way.
                        Ok(()) | Err(SupervisorError::Gone) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot extend the child's deadline"),
                    }
                } else if !*stopping {
                    // Lost the lease (or a new tenure began without us
                    // noticing the end of the old one): stop now; the guard
                    // kills the group at the end of the old validity at the
                    // latest.
                    *stopping = true;
                    let grace = match &state.tenure {
                        Some(t) if state.role == Role::Stopping => t.valid_until - now,
                        _ => self.cfg.child.kill_grace,
                    };
                    tracing::warn!(election = %state.election, identity = %state.identity, grace_ms = grace.as_millis() as u64, "not leader any more: stopping the child");
                    if let Err(e) = child.stop(grace).await {
                        tracing::error!(error = %e, "cannot stop the child; killing its process group");
                        let _ = child.kill().await;
                    }
                }
            }
            Slot::Idle => {
                if leading && may_start && self.pending_step_down.is_none() && self.app_ok() {
                    let t = state.tenure.clone().expect("leading implies a tenure");
                    return self.start_child(Some(&t)).await;
                }
            }
            Slot::Backoff { .. } => {
                if !leading {
                    self.job.slot = Slot::Idle;
                } else if may_start && self.job.backoff_over(now) {
                    let t = state.tenure.clone().expect("leading implies a tenure");
                    return self.start_child(Some(&t)).await;
                }
            }
        }
        None
    }

    /// Start the child under `tenure` (none in mode "always"). Returns an
    /// exit code when the command cannot run at all and the configured
    /// `on_child_exit` is `exit`.
    async fn start_child(&mut self, tenure: Option<&election::Tenure>) -> Option<i32> {
        let cfg = self.child_config();
        let state = self.primary.borrow().clone();
        let lease_ms = match tenure {
            Some(t) => t.lease_ms,
            None => self.job.lease().as_millis() as u64,
        };
        let env = supervisor::child_env::vars(
            &state.election,
            &state.identity,
            state.is_leader_at(self.clock.now()),
            tenure.map(|t| t.fencing_token),
            lease_ms,
        );
        // The running binary itself, even if a package upgrade replaced the
        // file since we started.
        let guard_exe = std::path::PathBuf::from("/proc/self/exe");
        let spec = ChildSpec {
            command: cfg.command.clone(),
            env,
            stop_signal: cfg.stop_signal,
            guard_exe,
        };
        let deadline = tenure.map(|t| (t.stop_at, t.valid_until));
        match supervisor::spawn(&spec, deadline).await {
            Ok(child) => {
                match tenure {
                    Some(t) => {
                        tracing::info!(election = %state.election, identity = %state.identity, fencing_token = t.fencing_token, pid = child.pid(), command = ?cfg.command, "child started")
                    }
                    None => {
                        tracing::info!(election = %state.election, identity = %state.identity, pid = child.pid(), command = ?cfg.command, "child started")
                    }
                }
                self.metrics.child_started(&self.cfg.primary);
                let now = self.clock.now();
                self.job
                    .started(Box::new(child), tenure.map(|t| t.seq), now);
                self.publish_job_health();
                None
            }
            Err(e) => self.start_failed(e).await,
        }
    }

    /// The child could not be started: the job's policy decides (see
    /// [`child`]).
    async fn start_failed(&mut self, e: SupervisorError) -> Option<i32> {
        let now = self.clock.now();
        let primary = self.cfg.primary.clone();
        self.metrics.child_start_failed(&primary);
        let cannot_run = match &e {
            SupervisorError::Spawn(f) => f.exit_code,
            _ => None,
        };
        tracing::error!(election = %primary, error = %e, command = ?self.cfg.child.command, "cannot start the child");
        let after = self.job.start_failed(now, e.to_string(), cannot_run);
        self.publish_job_health();
        match after {
            AfterStartFailure::Retry => None,
            AfterStartFailure::ExitWith(code) => {
                tracing::error!(election = %primary, exit_code = code, "the job cannot run; releasing and exiting");
                Some(code)
            }
            AfterStartFailure::Release(why) => {
                self.release_and_sit_out(why).await;
                None
            }
        }
    }

    /// Give the primary lease up and sit out one lease.
    async fn release_and_sit_out(&mut self, why: &str) {
        let primary = self.cfg.primary.clone();
        if let Some(h) = self.handles.get(&primary) {
            let sit_out = h.lease_duration;
            tracing::warn!(election = %primary, "{why}: releasing the lease and sitting out one lease");
            h.release(AfterRelease::SitOut(sit_out)).await;
        }
    }

    fn publish_job_health(&self) {
        let problem = self.job.problem();
        self.job_health.send_if_modified(|current| {
            let changed = *current != problem;
            if changed {
                current.clone_from(&problem);
            }
            changed
        });
    }

    async fn on_child_exit(&mut self, status: ChildExit) -> Option<i32> {
        let now = self.clock.now();
        let leading_seq = {
            let state = self.primary.borrow();
            state
                .tenure
                .as_ref()
                .filter(|_| state.is_leader_at(now))
                .map(|t| t.seq)
        };
        let winding_down = self.shutdown.is_some() || self.pending_step_down.is_some();
        let (_, after) = self.job.exited(status, now, leading_seq, winding_down)?;
        self.metrics
            .child_exited(&self.cfg.primary, status.reason());
        if matches!(status, ChildExit::Killed) {
            self.metrics.child_killed(&self.cfg.primary);
        }
        self.publish_job_health();
        if self.shutdown.is_some() {
            return None;
        }
        match self.pending_step_down.take() {
            Some(StepDown::Resign(req)) => {
                self.finish_resign(req).await;
                return None;
            }
            Some(StepDown::AppFailing) => {
                self.release_for_app(&self.cfg.primary.clone()).await;
                return None;
            }
            None => {}
        }
        match after {
            AfterExit::Nothing => None,
            AfterExit::ExitWith(code) => Some(code),
            AfterExit::Release(why) => {
                self.release_and_sit_out(why).await;
                None
            }
        }
    }

    async fn on_signal(&mut self, sig: Signal) {
        if shutdown::is_shutdown(sig) {
            match &mut self.shutdown {
                None => {
                    // Leaving: no more handovers to balance the others.
                    if let Some(b) = &self.balancer {
                        b.halt();
                    }
                    let grace = self.cfg.child.shutdown_grace;
                    if matches!(self.job.slot, Slot::Running { .. }) {
                        tracing::info!(signal = %sig, grace_ms = grace.as_millis() as u64, "shutting down: forwarding the signal to the child, then releasing");
                    } else {
                        tracing::info!(signal = %sig, "shutting down: releasing");
                    }
                    self.shutdown = Some(Shutdown {
                        kill_at: self.clock.now() + grace,
                        killed: false,
                    });
                    if let Slot::Running { child, .. } = &mut self.job.slot {
                        // No deadline from the lease while we wind down: the
                        // engine keeps renewing; shutdown_grace bounds it.
                        if let Err(e) = child.signal(sig).await {
                            tracing::warn!(error = %e, "cannot forward the signal to the child");
                        }
                    } else {
                        // Nothing runs (maybe a restart was pending): exit 0.
                        self.job.slot = Slot::Idle;
                        self.job.last_exit = None;
                    }
                }
                Some(s) => {
                    tracing::warn!(signal = %sig, "second shutdown signal: killing the child now");
                    s.kill_at = self.clock.now();
                }
            }
            return;
        }
        match &mut self.job.slot {
            Slot::Running { child, .. } => {
                tracing::info!(signal = %sig, "forwarding signal to the child");
                if let Err(e) = child.signal(sig).await {
                    tracing::warn!(error = %e, "cannot forward the signal to the child");
                }
            }
            _ => tracing::info!(signal = %sig, "no child to forward the signal to"),
        }
    }

    async fn on_resign(&mut self, req: ResignRequest) {
        if self.shutdown.is_some() {
            // Every lease is released as the daemon exits, to whoever is
            // fastest (or to the successor of a resign already under way).
            let _ = req.done.send(Err(ResignError::ShuttingDown));
            return;
        }
        if let Some(StepDown::Resign(earlier)) = &self.pending_step_down
            && earlier.election == req.election
        {
            // The first resign stands, its successor with it: replacing it
            // would leave its caller without an answer.
            tracing::info!(election = %req.election, to = req.to.as_deref().unwrap_or("(anyone)"), "resign refused: an earlier resign is still stepping down");
            let _ = req.done.send(Err(ResignError::InProgress {
                election: req.election.clone(),
                to: earlier.to.clone(),
            }));
            return;
        }
        let leading = self
            .handles
            .get(&req.election)
            .is_some_and(|h| h.state.borrow().is_leader_at(self.clock.now()));
        if !leading {
            // Not ours to give up: change nothing (no stop, no sit-out).
            let _ = req.done.send(Err(ResignError::NotLeader(req.election)));
            return;
        }
        let election = req.election.clone();
        if let Err(StepDown::Resign(req)) = self
            .stop_child_first(&election, StepDown::Resign(req))
            .await
        {
            self.finish_resign(req).await;
        }
    }

    /// Giving up `election`: when its job runs (the primary, mode
    /// while-leader), stop it and keep `step` for when it has exited, since
    /// the job must be gone before the lease is released. `Err(step)`: no job
    /// to wait for, release now.
    async fn stop_child_first(&mut self, election: &str, step: StepDown) -> Result<(), StepDown> {
        let Slot::Running {
            child, stopping, ..
        } = &mut self.job.slot
        else {
            return Err(step);
        };
        if election != self.cfg.primary || self.cfg.child.mode != Mode::WhileLeader {
            return Err(step);
        }
        tracing::info!(election = %election, why = step.why(), "stopping the child before releasing the lease");
        if !*stopping {
            *stopping = true;
            // A planned step-down, like SIGTERM: the job gets
            // shutdown_grace. The lease stays ours meanwhile (still
            // renewed), and the guard's deadline moves with each renewal
            // (`reconcile_while_leader`), so a job slower to stop than the
            // lease is not killed while the lease is ours.
            if let Err(e) = child.stop(self.cfg.child.shutdown_grace).await {
                tracing::error!(error = %e, "cannot stop the child; killing its process group");
                let _ = child.kill().await;
            }
        }
        self.pending_step_down = Some(step);
        Ok(())
    }

    /// Whether the app check (if any) passes.
    fn app_ok(&self) -> bool {
        self.app_check
            .as_ref()
            .is_none_or(|rx| *rx.borrow() == Verdict::Pass)
    }

    /// The app check's verdict changed. A failing app gives up every lease
    /// this instance holds, the primary's child stopped first; the gate keeps
    /// the elections from campaigning until it passes again.
    async fn on_app_check(&mut self) {
        if self.app_ok() {
            return;
        }
        let now = self.clock.now();
        let leading: Vec<String> = self
            .handles
            .iter()
            .filter(|(_, h)| h.state.borrow().is_leader_at(now))
            .map(|(name, _)| name.clone())
            .collect();
        for name in leading {
            let primary = name == self.cfg.primary;
            if primary && self.pending_step_down.is_some() {
                // A resign is stopping the child; it releases after.
                continue;
            }
            if self
                .stop_child_first(&name, StepDown::AppFailing)
                .await
                .is_err()
            {
                self.release_for_app(&name).await;
            }
        }
    }

    /// Release `election` because the app fails; campaigning resumes when
    /// the app check passes (no sit-out).
    async fn release_for_app(&self, election: &str) {
        if let Some(h) = self.handles.get(election) {
            tracing::warn!(election = %election, "app check failing: releasing the lease");
            h.release(AfterRelease::SitOut(Duration::ZERO)).await;
        }
    }

    async fn finish_resign(&mut self, req: ResignRequest) {
        let Some(h) = self.handles.get(&req.election) else {
            let _ = req.done.send(Err(ResignError::Failed(format!(
                "unknown election `{}`",
                req.election
            ))));
            return;
        };
        let sit_out = h.lease_duration;
        tracing::info!(election = %req.election, to = req.to.as_deref().unwrap_or("(anyone)"), "resigning: releasing the lease and sitting out one lease");
        let released = h
            .hand_over(AfterRelease::SitOut(sit_out), req.to.clone())
            .await;
        let _ = req.done.send(if released {
            Ok(Resigned::SittingOut)
        } else {
            Err(ResignError::NotLeader(req.election.clone()))
        });
    }

    async fn kill_child(&mut self) {
        if let Slot::Running { child, .. } = &mut self.job.slot {
            let _ = child.kill().await;
            let status = child.wait().await;
            self.job.last_exit = Some(status);
        }
        self.job.slot = Slot::Idle;
    }

    /// Final step of every exit path: the child is gone; give up every lease.
    /// A resign that was waiting for the child (SIGTERM came meanwhile) is
    /// honoured by the release, its successor named, and answered; resigns
    /// still queued are answered `ShuttingDown`. Nothing is left waiting for
    /// an answer, so the HTTP drain that follows has nothing of ours to
    /// wait for.
    async fn release_all(&mut self) {
        if let Some(b) = self.balancer.take() {
            b.leave().await;
        }
        self.kill_child().await;
        let resign = match self.pending_step_down.take() {
            Some(StepDown::Resign(req)) => Some(req),
            Some(StepDown::AppFailing) | None => None,
        };
        let releases = self.handles.iter().map(|(name, h)| {
            let successor = resign
                .as_ref()
                .filter(|r| r.election == *name)
                .and_then(|r| r.to.clone());
            async move { (name, h.hand_over(AfterRelease::Exit, successor).await) }
        });
        let released = futures_util::future::join_all(releases).await;
        if let Some(req) = resign {
            let done = released
                .iter()
                .any(|(name, released)| **name == req.election && *released);
            tracing::info!(election = %req.election, released = done, "answering the resign that was under way at shutdown");
            let _ = req.done.send(if done {
                Ok(Resigned::Exiting)
            } else {
                Err(ResignError::Failed(format!(
                    "the daemon is shutting down and could not release the lease of election `{}` (lost, or the store failed): it expires on its own",
                    req.election
                )))
            });
        }
        self.resign_rx.close();
        while let Ok(req) = self.resign_rx.try_recv() {
            let _ = req.done.send(Err(ResignError::ShuttingDown));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn campaign_starts_are_spaced_and_bounded() {
        assert_eq!(campaign_delay(0, 1), Duration::ZERO);
        assert_eq!(campaign_delay(0, 1000), Duration::ZERO);
        // 5 ms apart up to a thousand elections...
        assert_eq!(campaign_delay(1, 10), Duration::from_millis(5));
        assert_eq!(campaign_delay(999, 1000), Duration::from_millis(4_995));
        // ...then closer, so that all start within five seconds.
        let last = campaign_delay(9999, 10_000);
        assert!(last < CAMPAIGN_SPREAD && last > Duration::from_millis(4_995));
        assert_eq!(campaign_delay(5000, 10_000), Duration::from_millis(2_500));
    }
}
