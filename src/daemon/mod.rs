//! Wiring for `leaderd run`: the store, the node that runs every election
//! and the session (one IO driver, `crate::driver`), the HTTP server, the
//! child supervisor and the shutdown sequence.
//!
//! Everything that reacts to leadership watches the elections' state; the
//! daemon owns the one loop that turns those states, signals and child exits
//! into actions, so the order of events is easy to follow:
//! lead -> start child; lose -> stop child (the guard enforces the kill);
//! SIGTERM -> forward, keep renewing while the child winds down, release, exit.
//!
//! The rooms:
//! - this file: [`run`] builds everything and hands it to the [`Daemon`];
//! - `event_loop.rs`: the loop, waiting for the next event and dispatching it;
//! - `reconcile.rs`: what to do with the job given the election's state, the
//!   job's and a shutdown (pure: state in, actions out);
//! - `supervise.rs`: carrying those actions out, and what the child's starts
//!   and exits lead to;
//! - `child.rs`: what the job's starts and exits mean (pure);
//! - `step_down.rs`: giving leases up on purpose (a resign, a failing app
//!   check, the release of every lease at exit);
//! - `signals.rs`: process signals: forwarding, and the shutdown they start;
//! - `advertise.rs`: the address written into the records this daemon leads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::app_check::{self, Verdict};
use crate::balance::{
    self, BalanceConfig, Balancer, Elected, Membership, Preferences, SessionMembers,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::core::node::{ElectionId, Node};
use crate::driver::board::StateView;
use crate::driver::{ElectionHandle, NodeDriver, Running, SitOuts};
use crate::election::{self, Aim, Clients, ElectionConfig, HintSink, LeaseEvent};
use crate::exit;
use crate::http::{self, AppState};
use crate::lease::{self, LeaseStore, StoreError};
use crate::metrics::{self, Metrics};
use crate::notify::{self, Notifier};
use crate::resign::ResignRequest;
use crate::shutdown::Signals;
use crate::supervisor::Child;
use crate::watch::client::{self as hints, Pacing};
use crate::watch::mux::Mux;
use crate::watch::watchers::Watchers;

mod advertise;
mod child;
mod event_loop;
mod reconcile;
mod signals;
mod step_down;
mod supervise;

use child::Job;
use reconcile::Policy;
use signals::Shutdown;
use step_down::StepDown;

/// How long the start-up store check may take with `fail_fast`.
const FAIL_FAST_BUDGET: Duration = Duration::from_secs(10);
/// Events the daemon's stream keeps for a follower daemon that is slow to
/// read them (a shutdown releasing a thousand elections tells a thousand
/// at once); one that falls further behind is cut off and reads the store.
const TOLD_BUFFER: usize = 4096;
/// Elections start [`CAMPAIGN_SPACING`] apart, all within [`CAMPAIGN_SPREAD`]
/// (the default renew interval). Their first writes, and with them their
/// renewals, then spread over the whole renew cycle, so each tick of the
/// renewal grid (the engine's `renew_due`) carries a like share; and a start
/// never asks the store for more than about 200 elections a second (1,000
/// within one second opened hundreds of connections to a slow store).
///
/// With sessions no election renews a lease of its own: elections start in
/// groups of [`lease::READ_MANY_LIMIT`], each group at its first one's
/// instant, so that a group's first reads go out as one request (a daemon
/// of 10,000 elections reads them in 100 requests, not 10,000 one by one
/// while the other daemons' balance rounds wait behind them at the store).
const CAMPAIGN_SPACING: Duration = Duration::from_millis(5);
const CAMPAIGN_SPREAD: Duration = Duration::from_secs(5);

/// When election `i` of `n` makes its first store request, after start;
/// `grouped`: with sessions (see [`CAMPAIGN_SPACING`]).
fn campaign_delay(i: usize, n: usize, grouped: bool) -> Duration {
    let i = if grouped {
        i - i % lease::READ_MANY_LIMIT
    } else {
        i
    };
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
    let advertised = advertise::advertise_in_records(&mut cfg, http_addr);

    let metrics = Arc::new(Metrics::shaped(metrics_shape(&cfg)));
    let app_check = cfg
        .app_check
        .clone()
        .map(|c| app_check::spawn(c, metrics.clone()));
    let wiring = Wiring {
        cfg: &cfg,
        store: &store,
        clock: &clock,
        metrics: &metrics,
        app_check: app_check.as_ref(),
    };
    let (resign_tx, resign_rx) = mpsc::channel(8);
    let mut started = wiring.start(advertised, &resign_tx);

    let (job_health, job_health_rx) = watch::channel(None);
    let app = wiring.http_state(&mut started, resign_tx, job_health_rx);
    let Ok(http) = http::Server::start(listener, http::router(app))
        .inspect_err(|e| tracing::error!(error = %e, "cannot start the HTTP server"))
    else {
        return exit::SOFTWARE;
    };
    // The bound address (port 0 in the configuration picks a free one).
    let listen = http_addr.map_or_else(|| cfg.http.listen.to_string(), |a| a.to_string());
    tracing::info!(listen = %listen, identity = %cfg.identity, store = store.kind(), elections = cfg.elections.len(), "leaderd running");

    #[cfg(feature = "testing")]
    test_hooks::start();
    let notify_task = tokio::spawn(notify::report_states(
        notifier.clone(),
        started.handles.values().map(|h| h.state.clone()).collect(),
        cfg.primary.clone(),
        clock.clone(),
    ));

    let mut daemon = Daemon::new(Parts {
        cfg,
        clock,
        metrics,
        handles: started.handles,
        signals,
        resign_rx,
        store_check,
        job_health,
        app_check,
        balancer: started.balancer,
    });
    let code = daemon.run().await;

    notifier.send("STOPPING=1");
    daemon.release_all().await;
    // Its elections are released: end the session, so nobody waits it
    // out, and the node with it.
    started.running.close().await;
    notify_task.abort();
    http.stop().await;
    tracing::info!(exit_code = code, "leaderd stopped");
    code
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

/// How the metrics are shaped by the configuration: with sessions or
/// not, the job's election, which elections have series of their own.
fn metrics_shape(cfg: &Config) -> metrics::Shape {
    let kept = cfg.metrics.elections.iter().chain([&cfg.primary]);
    metrics::Shape {
        sessions: cfg.sessions,
        job: (!cfg.child.command.is_empty()).then(|| cfg.primary.clone()),
        own_series: metrics::OwnSeries::decide(
            cfg.elections.len(),
            cfg.metrics.election_series_limit,
            kept.map(String::as_str),
        ),
    }
}

/// What every part `run` starts is started with: the configuration, the
/// store, the clock, the metrics and the app check's verdict.
struct Wiring<'a> {
    cfg: &'a Config,
    store: &'a Arc<dyn LeaseStore>,
    clock: &'a Clock,
    metrics: &'a Arc<Metrics>,
    app_check: Option<&'a watch::Receiver<Verdict>>,
}

/// What `run` started besides HTTP and the job.
struct Started {
    /// Each election of the node.
    handles: BTreeMap<String, ElectionHandle>,
    /// The node: its session (with `sessions`), its end.
    running: Running,
    /// The daemon's stream (what every election tells), with `sessions`.
    told: Option<broadcast::Sender<LeaseEvent>>,
    /// The sessions named by the daemons that watch this one's stream
    /// (balance looks them up), with balance and sessions.
    watchers: Option<Watchers>,
    /// The balancer, with balance.
    balancer: Option<Balancer>,
}

impl Wiring<'_> {
    /// What the tasks beside the elections run with.
    fn tasks(&self) -> election::TaskContext {
        election::TaskContext {
            store: self.store.clone(),
            clock: self.clock.clone(),
            observer: self.metrics.clone(),
        }
    }

    /// The node (its session with `sessions`, its elections), its
    /// driver, and the balancer (with balance); `advertised`: the address
    /// written into the records.
    fn start(&self, advertised: Option<String>, resign: &mpsc::Sender<ResignRequest>) -> Started {
        let cfg = self.cfg;
        let (driver, handles, mut running) = NodeDriver::new(self.node(), self.tasks());
        let (sink, hints) = HintSink::channel();
        // With sessions, what every election tells goes out on one stream,
        // and the followers watch other daemons' streams through one mux
        // instead of one stream per election.
        let told = cfg
            .sessions
            .then(|| broadcast::channel::<LeaseEvent>(TOLD_BUFFER).0);
        let mux = cfg.sessions.then(|| {
            // Streams name this daemon's session only for balance (a
            // leader learns its members so); without it the session opens
            // and ends with what this daemon leads, which need not reopen
            // every stream.
            let own = members(cfg).then(|| running.session.clone());
            let pacing = Pacing::of(primary_timing(cfg));
            Mux::new(self.clock.clone(), pacing, sink.clone(), own)
        });
        let aim: Box<dyn Aim> = match &mux {
            Some(mux) => Box::new(mux.clone()),
            None => Box::new(self.clients(&sink)),
        };
        // With priorities, the balancer may hold the elections back from
        // taking anything for a moment (a lower priority tries later).
        let (gate, hold) = match cfg.priority.in_use {
            true => {
                let (gate, hold) = balance::holding_gate(self.app_check.cloned());
                (Some(gate), Some(hold))
            }
            false => (self.app_check.cloned(), None),
        };
        let mut driver = driver.gated(gate).with_hints(hints, aim);
        if let Some(told) = &told {
            driver = driver.telling(told.clone());
        }
        driver.spawn(&mut running);
        let handles: BTreeMap<String, ElectionHandle> = cfg
            .elections
            .iter()
            .map(|e| e.name.clone())
            .zip(handles)
            .collect();
        // Balance looks up the sessions its watchers name.
        let watchers = (members(cfg) && cfg.sessions).then(Watchers::default);
        let balancer = members(cfg).then(|| {
            let membership = match (&mux, &watchers) {
                (Some(mux), Some(watchers)) => Membership::Sessions(SessionMembers {
                    sessions: running.sessions(self.tasks()),
                    labels: running.labels.clone(),
                    mux: mux.clone(),
                    watchers: watchers.clone(),
                }),
                _ => Membership::Records,
            };
            let steer = (running.sit_outs.clone(), resign.clone(), hold);
            self.start_balancer(&handles, advertised, membership, steer)
        });
        Started {
            handles,
            running,
            told,
            watchers,
            balancer,
        }
    }

    /// The node: with `sessions` the daemon's session on the primary
    /// election's timing (every election has the same, checked in
    /// `Config::load`), open always with balance (balance counts on it as
    /// this instance's member record), else only while an election wants
    /// it; and every election. Their first store requests are spread: a
    /// thousand elections reach the store over a second instead of in one
    /// burst that would open a connection per election (and keep them all
    /// pooled), and their renewals stay that far apart afterwards. One
    /// election starts at once.
    fn node(&self) -> Node {
        let cfg = self.cfg;
        let timing = primary_timing(cfg);
        let may_campaign = self.app_check.is_none_or(|g| *g.borrow() == Verdict::Pass);
        let mut node = Node::new(&cfg.identity, timing, self.clock.now(), may_campaign);
        if cfg.sessions {
            node = node.with_session(timing.clone(), members(cfg));
        }
        let n = cfg.elections.len();
        node.reserve(n);
        for (i, e) in cfg.elections.iter().enumerate() {
            let delay = campaign_delay(i, n, cfg.sessions);
            node.add_election(e.clone(), delay, true, |core| core);
        }
        node
    }

    /// Without sessions, one watch client per election, each handing its
    /// hints to `sink`.
    fn clients(&self, sink: &HintSink) -> Clients {
        let clients = self.cfg.elections.iter().enumerate().map(|(i, e)| {
            let id = ElectionId(u32::try_from(i).unwrap_or(u32::MAX));
            hints::spawn(
                e.name.clone(),
                id,
                self.clock.clone(),
                Pacing::of(e),
                sink.clone(),
            )
        });
        Clients(clients.collect())
    }

    /// The balancer, when `balance` is on: every election may move, except
    /// the primary when a job runs under it (that one moves by resign or
    /// shutdown, which stop the job first).
    fn start_balancer(
        &self,
        handles: &BTreeMap<String, ElectionHandle>,
        address: Option<String>,
        membership: Membership,
        (sit_outs, resign, hold): Steer,
    ) -> Balancer {
        let cfg = self.cfg;
        let timing = primary_timing(cfg);
        let config = BalanceConfig {
            identity: cfg.identity.clone(),
            lease_duration: timing.lease_duration,
            renew_interval: timing.renew_interval,
            retry_interval: timing.retry_interval,
            max_clock_drift: timing.max_clock_drift,
            address,
            share: cfg.balance,
            preferences: Preferences {
                priority: cfg.priority.clone(),
                sit_outs: Some(sit_outs),
                resign: Some(resign),
                hold,
            },
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
            self.store.clone(),
            config,
            elections,
            self.clock.clone(),
            self.app_check.cloned(),
            membership,
            self.metrics.clone(),
        )
    }

    /// What the HTTP handlers read: every election's state, the job's
    /// health, the way to ask for a resign, and what `started` has to show
    /// (the app check, balance, the session; the daemon's stream, which
    /// is handed over).
    fn http_state(
        &self,
        started: &mut Started,
        resign: mpsc::Sender<ResignRequest>,
        job_health: watch::Receiver<Option<String>>,
    ) -> AppState {
        let cfg = self.cfg;
        let mut app = AppState::new(
            cfg.primary.clone(),
            self.clock.clone(),
            self.metrics.clone(),
            resign,
        )
        .with_admin_token(cfg.http.admin_token.clone())
        .with_store_timeout(cfg.health.store_timeout)
        .with_job_health(job_health);
        for e in &cfg.elections {
            if let Some(h) = started.handles.get(&e.name) {
                app = app
                    .with_election(h.state.clone(), http::wedge_threshold(e))
                    .with_watch(&e.name, h.events.clone());
            }
        }
        if let Some(rx) = self.app_check {
            app = app.with_app_check(rx.clone());
        }
        if let Some(b) = started.balancer.as_ref().filter(|_| cfg.balance) {
            app = app.with_balance(b.share.clone());
        }
        if let Some(b) = started.balancer.as_ref().filter(|_| cfg.priority.in_use) {
            app = app.with_priority(b.priorities.clone());
        }
        if self.cfg.sessions {
            let validity = primary_timing(cfg).validity();
            app = app.with_session(started.running.session.clone(), validity);
        }
        if let Some(told) = started.told.take() {
            app = app.with_daemon_stream(told, started.watchers.take());
        }
        app
    }
}

/// What the balancer steers the daemon's elections with beside their
/// handles: the sit-outs asked of them, the resign queue (for the job's
/// election) and, with priorities, the hold on taking anything.
type Steer = (
    watch::Receiver<SitOuts>,
    mpsc::Sender<ResignRequest>,
    Option<Arc<watch::Sender<bool>>>,
);

/// Whether the daemon runs the member layer: for balance, or for
/// preferred leaders (priorities configured), which then only publishes
/// and learns priorities and preempts.
fn members(cfg: &Config) -> bool {
    cfg.balance || cfg.priority.in_use
}

/// The timing of the primary election: with sessions, every election's
/// (checked in `Config::load`).
fn primary_timing(cfg: &Config) -> &ElectionConfig {
    cfg.elections
        .iter()
        .find(|e| e.name == cfg.primary)
        .expect("primary names a configured election: validated in Config::load")
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

    /// Start the hooks the test asked for.
    pub(super) fn start() {
        if let Some(path) = std::env::var_os("LEADERD_TEST_STALL_FILE") {
            tokio::spawn(stall_when_file_appears(path.into()));
        }
    }

    /// When the file appears, block every runtime worker thread for the number
    /// of milliseconds written in it: the async runtime stalls as it would
    /// under a runaway blocking call, while the guard process keeps time.
    async fn stall_when_file_appears(path: PathBuf) {
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

/// The daemon after start-up: what its loop watches and acts on. Its
/// methods live in the rooms listed at the top of this file.
struct Daemon {
    cfg: Config,
    clock: Clock,
    metrics: Arc<Metrics>,
    handles: BTreeMap<String, ElectionHandle>,
    primary: StateView,
    signals: Signals,
    resign_rx: mpsc::Receiver<ResignRequest>,
    /// The background store check's verdict, until it came or was dropped.
    store_check: Option<oneshot::Receiver<StoreError>>,
    /// What `/healthz` says of the job: a problem, or nothing.
    job_health: watch::Sender<Option<String>>,
    /// The job under the primary election, and what its starts and exits
    /// mean.
    job: Job<Box<Child>>,
    /// What to do with the job as the election's state changes, and what it
    /// remembers between events.
    policy: Policy,
    shutdown: Option<Shutdown>,
    /// The app check's verdict; `None` when there is no app check.
    app_check: Option<watch::Receiver<Verdict>>,
    /// Moves elections to share them with the other daemons; `None` when
    /// `balance` is off.
    balancer: Option<Balancer>,
    /// Stepping down from the primary election: the child is being stopped,
    /// the release follows its exit.
    pending_step_down: Option<StepDown>,
}

/// What [`run`] built for the daemon.
struct Parts {
    cfg: Config,
    clock: Clock,
    metrics: Arc<Metrics>,
    handles: BTreeMap<String, ElectionHandle>,
    signals: Signals,
    resign_rx: mpsc::Receiver<ResignRequest>,
    store_check: Option<oneshot::Receiver<StoreError>>,
    job_health: watch::Sender<Option<String>>,
    app_check: Option<watch::Receiver<Verdict>>,
    balancer: Option<Balancer>,
}

impl Daemon {
    /// The daemon, its job idle; `--acquire-timeout` counts from now.
    fn new(parts: Parts) -> Daemon {
        let Parts {
            cfg,
            clock,
            metrics,
            handles,
            signals,
            resign_rx,
            store_check,
            job_health,
            app_check,
            balancer,
        } = parts;
        let primary = handles
            .get(&cfg.primary)
            .expect("primary names a configured election: validated in Config::load");
        let job = Job::new(
            cfg.child.mode,
            cfg.child.on_child_exit,
            primary.lease_duration,
        );
        let policy = Policy::new(&cfg.child, cfg.acquire_timeout, clock.now());
        Daemon {
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
            policy,
            shutdown: None,
            app_check,
            balancer,
            pending_step_down: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn campaign_starts_are_spaced_and_bounded() {
        let self_leased = |i, n| campaign_delay(i, n, false);
        assert_eq!(self_leased(0, 1), Duration::ZERO);
        assert_eq!(self_leased(0, 1000), Duration::ZERO);
        // 5 ms apart up to a thousand elections...
        assert_eq!(self_leased(1, 10), Duration::from_millis(5));
        assert_eq!(self_leased(999, 1000), Duration::from_millis(4_995));
        // ...then closer, so that all start within five seconds.
        let last = self_leased(9999, 10_000);
        assert!(last < CAMPAIGN_SPREAD && last > Duration::from_millis(4_995));
        assert_eq!(self_leased(5000, 10_000), Duration::from_millis(2_500));
    }

    #[test]
    fn with_sessions_a_hundred_elections_start_together() {
        let grouped = |i, n| campaign_delay(i, n, true);
        // Fewer than a hundred: all at once.
        assert_eq!(grouped(42, 50), Duration::ZERO);
        // Each group at its first election's instant, never later than
        // alone, and the last group within the spread.
        assert_eq!(grouped(99, 1000), Duration::ZERO);
        assert_eq!(grouped(100, 1000), Duration::from_millis(500));
        assert_eq!(grouped(199, 1000), Duration::from_millis(500));
        assert_eq!(grouped(5050, 10_000), Duration::from_millis(2_500));
        let last = grouped(9999, 10_000);
        assert_eq!(last, Duration::from_millis(4_950));
        for i in [0, 1, 99, 100, 4321, 9999] {
            assert!(grouped(i, 10_000) <= campaign_delay(i, 10_000, false));
        }
    }
}
