//! A three-instance leaderd cluster on DynamoDB Local (or PostgreSQL) for
//! the safety scenarios (`tests/safety.rs`) and the soak (`tests/soak.rs`).
//!
//! Every instance talks to the store through its own [`FaultProxy`] (raw
//! TCP for PostgreSQL, TLS inside), runs
//! `job.py` as its child, and every child appends to one shared history that
//! the checker (`common::history`) reads at the end. Instances can be started
//! with a shifted wall clock (libfaketime), frozen with their whole process
//! tree, stalled through the daemon's test hook, killed and restarted.
//!
//! Timing is short so that a scenario takes seconds: L = 2 s, R = 1 s,
//! P = 250 ms, G = 500 ms (M = 200 ms, D = 1 % by default).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::common;
use crate::common::daemon::{http, leaderd_bin, listen_port, wait_until};
use crate::common::emulators::{self, Emulator};
use crate::common::history::{self, Summary, Violation};
use crate::common::postgres::{PgServer, shared_postgres};
use crate::common::procfs;
use crate::common::proxy::{Fault, FaultProxy};

/// L: lease duration.
pub const L: Duration = Duration::from_secs(2);
/// R: renew interval.
pub const R: Duration = Duration::from_secs(1);
/// P: retry interval.
pub const P: Duration = Duration::from_millis(250);
/// G: kill grace.
pub const G: Duration = Duration::from_millis(500);
/// L·(1−D) − M: how long one successful renew keeps the leader valid.
pub const VALIDITY: Duration = Duration::from_millis(1_780);
/// L·(1+D): how long a follower waits on an unchanged record.
pub const TAKEOVER_WAIT: Duration = Duration::from_millis(2_020);
/// Scheduling slack on a loaded 2-core machine, for bounds on real time.
pub const SLACK: Duration = Duration::from_millis(500);
/// How long a cluster may take to have a leader again once faults are gone:
/// a takeover wait and a few polls, generously.
pub const RECOVERY: Duration = Duration::from_secs(15);

/// The `leaderd run` flags every instance gets.
fn timing_args() -> Vec<String> {
    [
        "--lease-duration",
        "2s",
        "--renew-interval",
        "1s",
        "--retry-interval",
        "250ms",
        "--kill-grace",
        "500ms",
        "--election",
        "job",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// CLOCK_MONOTONIC in ns: the clock of the history's timestamps.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable on Linux");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Milliseconds for messages.
pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The seed of a randomised run: `var` from the environment if set (to
/// replay a run), else a fresh one. Printed either way, with how to replay.
pub fn seed(var: &str, what: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={text:?} is not a whole number (a seed to replay)")),
        Err(_) => rand::random(),
    };
    eprintln!("{what}: seed {seed} (replay with {var}={seed})");
    seed
}

/// An RNG for one scenario: the run's seed mixed with the scenario's name,
/// so replaying one scenario with its printed seed gives the same timings.
pub fn scenario_rng(seed: u64, scenario: &str) -> StdRng {
    let mixed = scenario.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    StdRng::seed_from_u64(mixed)
}

/// A duration drawn uniformly from `lo..=hi`.
pub fn between(rng: &mut StdRng, lo: Duration, hi: Duration) -> Duration {
    let lo_ms = lo.as_millis() as u64;
    let hi_ms = hi.as_millis() as u64;
    Duration::from_millis(rng.random_range(lo_ms..=hi_ms))
}

/// The scenarios (`safety`, `soak`) run one at a time even under plain
/// `cargo test` (threads): parallel clusters on 2 cores would stretch every
/// timeline. nextest runs them in the `cluster` group (one at a time) anyway.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A wall-clock shift for an instance: libfaketime preloaded with
/// `FAKETIME=OFFSET` and `FAKETIME_DONT_FAKE_MONOTONIC=1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockShift {
    /// The machine's wall clock.
    None,
    /// One hour behind.
    Behind1h,
    /// One hour ahead.
    Ahead1h,
}

impl ClockShift {
    fn offset(self) -> Option<&'static str> {
        match self {
            ClockShift::None => None,
            ClockShift::Behind1h => Some("-1h"),
            ClockShift::Ahead1h => Some("+1h"),
        }
    }
}

/// libfaketime, or a failure that says how to install it.
///
/// Preloaded directly rather than through the `faketime` wrapper: the
/// wrapper creates a semaphore and a shared-memory object named after its own
/// pid and removes them only when it exits normally, so a kill -9 leaks them
/// and a later wrapper that gets the same pid fails with `sem_open: File
/// exists`. A plain relative offset needs neither.
pub fn libfaketime() -> PathBuf {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    let candidates = [
        PathBuf::from(format!("/usr/lib/{triple}/faketime/libfaketime.so.1")),
        PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the wall-clock scenarios need libfaketime (looked for {candidates:?}): \
                 install the Debian package `faketime` (apt-get install faketime)"
            )
        })
}

/// The scenario is only worth running if the shift took: the first log
/// line's timestamp (leaderd's wall clock) must be off by the offset.
fn assert_clock_shifted(identity: &str, shift: ClockShift, log_path: &Path) {
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    let stamp = log.split_whitespace().next().unwrap_or_default();
    let logged = humantime::parse_rfc3339(stamp).unwrap_or_else(|e| {
        panic!("{identity}: the first log word {stamp:?} is not a timestamp ({e}); log:\n{log}")
    });
    let skew_s = match logged.duration_since(SystemTime::now()) {
        Ok(ahead) => ahead.as_secs_f64(),
        Err(behind) => -behind.duration().as_secs_f64(),
    };
    let want_s = match shift {
        ClockShift::None => 0.0,
        ClockShift::Behind1h => -3600.0,
        ClockShift::Ahead1h => 3600.0,
    };
    assert!(
        (skew_s - want_s).abs() < 300.0,
        "{identity} should run {shift:?} but logs a clock {skew_s:.0} s off the real one \
         (libfaketime not applied?)"
    );
}

/// The test's own `LEADERD_*` settings (seeds, durations) must not reach
/// leaderd: its configuration rejects unknown `LEADERD_` keys.
fn scrub_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if let Some(k) = key.to_str()
            && k.starts_with("LEADERD_")
            && !k.starts_with("LEADERD_TEST_")
        {
            cmd.env_remove(k);
        }
    }
}

/// Every process below `root` (children, grandchildren...).
pub fn descendants(root: i32) -> Vec<i32> {
    procfs::descendants(root)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// One `leaderd run` process, maybe with a shifted wall clock (libfaketime).
pub struct Node {
    /// Its identity (also in the history lines of its children).
    pub identity: String,
    /// HTTP port on 127.0.0.1.
    pub port: u16,
    /// Its wall-clock shift.
    pub shift: ClockShift,
    /// The file the stall hook watches (`LEADERD_TEST_STALL_FILE`).
    pub stall_file: PathBuf,
    /// Its log (stdout and stderr).
    pub log_path: PathBuf,
    /// The leaderd process.
    spawned: Child,
    /// Its process id.
    pid: i32,
    dead: bool,
    /// Set while the test keeps it from answering (SIGSTOP, stall): probes
    /// skip it instead of waiting for a timeout.
    pub paused: bool,
}

impl Node {
    /// The leaderd process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it was killed.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// GET `/leader` with a short timeout: `Some((status, body))`, `None` if
    /// it does not answer (stopped, stalled, dead).
    pub fn leader(&self) -> Option<(u16, serde_json::Value)> {
        if self.dead || self.paused {
            return None;
        }
        let (status, body) = http(self.port, "GET", "/leader", &[])?;
        Some((status, serde_json::from_str(&body).ok()?))
    }

    /// Whether `/leader` answers 200 now.
    pub fn is_leader(&self) -> bool {
        matches!(self.leader(), Some((200, _)))
    }

    /// Send a signal to leaderd alone.
    pub fn signal(&self, sig: Signal) {
        let _ = kill(Pid::from_raw(self.pid), sig);
    }

    /// Every process leaderd started (guard, child, grandchildren).
    pub fn descendants(&self) -> Vec<i32> {
        descendants(self.pid)
    }

    /// kill -9 of leaderd, then reap. Its children are left to leaderd's
    /// own mechanism (the guard).
    pub fn kill9(&mut self) {
        let _ = self.spawned.kill();
        let _ = self.spawned.wait();
        self.dead = true;
        if self.shift != ClockShift::None {
            // libfaketime names a semaphore and a shared-memory object after
            // the process and removes them in a destructor that kill -9
            // skips: remove them here, now that the pid is reaped.
            for name in [
                format!("/dev/shm/sem.faketime_sem_{}", self.pid),
                format!("/dev/shm/faketime_shm_{}", self.pid),
            ] {
                let _ = std::fs::remove_file(name);
            }
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Ask the stall hook to block leaderd's async runtime for `d`.
    pub fn stall(&self, d: Duration) {
        // Written to a temporary name and renamed, so the hook never reads a
        // half-written number.
        let tmp = self.stall_file.with_extension("tmp");
        std::fs::write(&tmp, d.as_millis().to_string()).expect("write the stall request");
        std::fs::rename(&tmp, &self.stall_file).expect("publish the stall request");
        // The hook takes the file (within 50 ms) before it stalls. A build
        // without the `testing` feature has no hook: say so, rather than let
        // the scenario fail for a reason it cannot name.
        let taken = wait_until(Duration::from_secs(5), || !self.stall_file.exists());
        assert!(
            taken.is_some(),
            "leaderd `{}` did not take the stall request {}: its binary lacks the test hook \
             (test builds enable the `testing` feature through the dev-dependency on itself)",
            self.identity,
            self.stall_file.display()
        );
    }

    fn wait_http(&self, limit: Duration) -> bool {
        wait_until(limit, || http(self.port, "GET", "/healthz", &[]).is_some()).is_some()
    }
}

/// The store a cluster runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterStore {
    /// DynamoDB Local.
    DynamoDbLocal,
    /// PostgreSQL, TLS verified against the test's CA.
    Postgres,
}

/// How to build a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The store.
    pub store: ClusterStore,
    /// Test name, for the table and messages.
    pub name: String,
    /// `lease.strict_new_lease` for every instance.
    pub strict_new_lease: bool,
    /// Run an emulator (or a PostgreSQL server) of our own (needed to
    /// restart or stop it) instead of the one shared by the test binary.
    pub own_emulator: bool,
    /// Wall-clock shift of each of the three instances.
    pub shifts: [ClockShift; 3],
    /// `balance` for every instance: member records written and read next
    /// to the lease through every fault.
    pub balance: bool,
    /// `sessions` for every instance; `None`: leaderd's default (on).
    pub sessions: Option<bool>,
}

impl ClusterSpec {
    /// Three unshifted instances on the shared emulator, default settings.
    pub fn new(name: &str) -> ClusterSpec {
        ClusterSpec {
            store: ClusterStore::DynamoDbLocal,
            name: name.to_owned(),
            strict_new_lease: false,
            own_emulator: false,
            shifts: [ClockShift::None; 3],
            balance: false,
            sessions: None,
        }
    }
}

/// A fault applied at a time, for the record.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// CLOCK_MONOTONIC ns when it began.
    pub from_ns: u64,
    /// When it ended (None: instantaneous or still on).
    pub to_ns: Option<u64>,
    /// Which instance (None: all, or the store).
    pub target: Option<String>,
    /// What it was.
    pub what: String,
}

/// Three leaderd instances, their proxies, the emulator and the history.
pub struct Cluster {
    /// The scenario's name.
    pub name: String,
    /// Temporary directory: history, logs, stall files.
    pub dir: tempfile::TempDir,
    /// The shared history of every child.
    pub history: PathBuf,
    /// DynamoDB table of this cluster.
    pub table: String,
    /// One proxy per instance, same index as `nodes`.
    pub proxies: Vec<FaultProxy>,
    /// The instances.
    pub nodes: Vec<Node>,
    /// Faults applied so far.
    pub faults: Vec<FaultRecord>,
    spec: ClusterSpec,
    emulator: Option<Emulator>,
    /// The PostgreSQL server of our own (`own_emulator`).
    postgres: Option<PgServer>,
    upstream: SocketAddr,
    endpoint: String,
    /// Starts per identity, to name log files of restarts apart.
    starts: BTreeMap<String, u32>,
    _serial: MutexGuard<'static, ()>,
}

pub const IDENTITIES: [&str; 3] = ["alpha", "bravo", "charlie"];

impl Cluster {
    /// Start the emulator (or use the shared one), the proxies and three
    /// instances; wait until all of them serve HTTP.
    pub fn start(spec: ClusterSpec) -> Cluster {
        let serial = serial();
        emulators::fake_aws_env();
        if spec.shifts.iter().any(|s| *s != ClockShift::None) {
            libfaketime();
        }
        let (mut emulator, mut postgres) = (None, None);
        let endpoint = match (spec.store, spec.own_emulator) {
            (ClusterStore::DynamoDbLocal, true) => {
                let e = emulators::dynamodb_local();
                let endpoint = e.endpoint.clone();
                emulator = Some(e);
                endpoint
            }
            (ClusterStore::DynamoDbLocal, false) => {
                emulators::shared_dynamodb_local().endpoint.clone()
            }
            (ClusterStore::Postgres, own) => {
                let port = if own {
                    postgres.insert(PgServer::start()).port
                } else {
                    shared_postgres().port
                };
                format!("http://127.0.0.1:{port}")
            }
        };
        let upstream: SocketAddr = endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the store's endpoint is http://127.0.0.1:PORT");
        // DynamoDB table names: letters, digits, '_', '-', '.'.
        let table = crate::common::unique_name(&format!("safety-{}", spec.name));
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let history = dir.path().join("history");
        // Created empty, so that a scenario where nobody ever led reads "".
        std::fs::write(&history, "").expect("create the history file");
        let proxies = IDENTITIES
            .iter()
            .map(|_| match spec.store {
                ClusterStore::DynamoDbLocal => FaultProxy::start(upstream),
                ClusterStore::Postgres => FaultProxy::start_raw(upstream),
            })
            .collect();
        let mut cluster = Cluster {
            name: spec.name.clone(),
            dir,
            history,
            table,
            proxies,
            nodes: Vec::new(),
            faults: Vec::new(),
            spec,
            emulator,
            postgres,
            upstream,
            endpoint,
            starts: BTreeMap::new(),
            _serial: serial,
        };
        // Create the table once, before the instances start, so that they do
        // not race each other's CreateTable on a slow machine.
        cluster.create_table();
        for (i, id) in IDENTITIES.iter().enumerate() {
            let node = cluster.spawn_node(i, id, cluster.spec.shifts[i]);
            cluster.nodes.push(node);
        }
        for node in &cluster.nodes {
            assert!(
                node.wait_http(Duration::from_secs(30)),
                "{} did not serve HTTP within 30 s; log:\n{}",
                node.identity,
                node.log()
            );
        }
        cluster
    }

    fn spawn_node(&mut self, index: usize, identity: &str, shift: ClockShift) -> Node {
        let n = self.starts.entry(identity.to_owned()).or_insert(0);
        *n += 1;
        let log_path = self.dir.path().join(format!("{identity}-{n}.log"));
        let log = std::fs::File::create(&log_path).expect("create the instance log");
        let stall_file = self.dir.path().join(format!("stall-{identity}"));
        let mut cmd = Command::new(leaderd_bin());
        if let Some(offset) = shift.offset() {
            cmd.env("LD_PRELOAD", libfaketime())
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        scrub_env(&mut cmd);
        cmd.arg("run")
            // Port 0: leaderd logs the port it got (no race over "free" ports).
            .args(["--listen", "127.0.0.1:0"])
            .args(["--identity", identity])
            .args(self.store_args(Some(index)))
            .args(timing_args())
            .env(
                "LEADERD_LEASE__STRICT_NEW_LEASE",
                self.spec.strict_new_lease.to_string(),
            )
            .env("LEADERD_BALANCE", self.spec.balance.to_string())
            .envs(
                self.spec
                    .sessions
                    .map(|s| ("LEADERD_SESSIONS", s.to_string())),
            )
            .env("LEADERD_TEST_STALL_FILE", &stall_file)
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LOG", "leaderd=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicate the log handle"))
            .stderr(log)
            .arg("--");
        if shift != ClockShift::None {
            // The job is the measuring instrument, not the system under test:
            // it runs on the real wall clock. (It would not run under
            // libfaketime 0.9.10 anyway: Python 3.11's time.sleep, an absolute
            // clock_nanosleep on CLOCK_MONOTONIC, fails there with EINVAL.)
            // leaderd and its guard keep the shifted clock.
            cmd.args([
                "env",
                "-u",
                "LD_PRELOAD",
                "-u",
                "FAKETIME",
                "-u",
                "FAKETIME_DONT_FAKE_MONOTONIC",
            ]);
        }
        cmd.args([
            "python3".to_owned(),
            common::job_script().display().to_string(),
            self.history.display().to_string(),
            "--max-seconds".to_owned(),
            "3600".to_owned(),
        ]);
        let spawned = cmd.spawn().expect("start leaderd");
        let pid = spawned.id() as i32;
        let mut port = 0;
        let found = wait_until(Duration::from_secs(30), || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            port = listen_port(&log).unwrap_or(0);
            port != 0
        });
        assert!(
            found.is_some(),
            "{identity} did not log its HTTP port within 30 s; log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        if shift != ClockShift::None {
            assert_clock_shifted(identity, shift, &log_path);
        }
        Node {
            identity: identity.to_owned(),
            port,
            shift,
            stall_file,
            log_path,
            spawned,
            pid,
            dead: false,
            paused: false,
        }
    }

    /// Start instance `index` again (after [`Node::kill9`]), same identity,
    /// maybe with another wall-clock shift. Waits until it serves HTTP.
    pub fn restart_node(&mut self, index: usize, shift: ClockShift) {
        assert!(
            self.nodes[index].dead,
            "restart_node: {} is still running",
            self.nodes[index].identity
        );
        if shift != ClockShift::None {
            libfaketime();
        }
        let identity = self.nodes[index].identity.clone();
        let node = self.spawn_node(index, &identity, shift);
        assert!(
            node.wait_http(Duration::from_secs(30)),
            "{identity} did not serve HTTP within 30 s after a restart; log:\n{}",
            node.log()
        );
        self.nodes[index] = node;
    }

    /// The PostgreSQL server, when that is the store.
    pub fn postgres(&self) -> Option<&PgServer> {
        match self.spec.store {
            ClusterStore::DynamoDbLocal => None,
            ClusterStore::Postgres => {
                Some(self.postgres.as_ref().unwrap_or_else(|| shared_postgres()))
            }
        }
    }

    /// The store flags of instance `index` (through its proxy), or of a
    /// tool that goes to the store directly (`None`).
    fn store_args(&self, index: Option<usize>) -> Vec<String> {
        let to = index.map(|i| self.proxies[i].addr());
        match self.postgres() {
            None => vec![
                "--store".into(),
                "dynamodb".into(),
                "--endpoint-url".into(),
                to.map_or_else(|| self.endpoint.clone(), |a| format!("http://{a}")),
                "--table".into(),
                self.table.clone(),
            ],
            Some(server) => {
                let mut args = server.args(&self.table);
                if let Some(addr) = to {
                    let at = args
                        .iter()
                        .position(|a| a == "--store-url")
                        .expect("the flags name the URL");
                    args[at + 1] = args[at + 1]
                        .replace(&format!("127.0.0.1:{}", server.port), &addr.to_string());
                }
                args
            }
        }
    }

    /// Create the table (directly on the store, not through a proxy).
    pub fn create_table(&self) {
        let mut cmd = Command::new(leaderd_bin());
        scrub_env(&mut cmd);
        cmd.args(["table", "create"]).args(self.store_args(None));
        if self.spec.store == ClusterStore::DynamoDbLocal {
            cmd.args(["--wait", "60s"]);
        }
        let out = cmd
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .output()
            .expect("run `leaderd table create`");
        assert!(
            out.status.success(),
            "`leaderd table create` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// PostgreSQL: kill -9 every process of the server and start it again
    /// on the same port and data (it recovers from its WAL). Returns how
    /// long it was gone. Needs `own_emulator`.
    pub fn restart_postgres(&mut self) -> Duration {
        let t0 = Instant::now();
        self.postgres
            .as_mut()
            .expect("restart_postgres needs a PostgreSQL cluster with own_emulator")
            .kill9_and_restart();
        t0.elapsed()
    }

    /// PostgreSQL: SIGSTOP (`true`) or SIGCONT every process of the server.
    /// Needs `own_emulator`.
    pub fn pause_postgres(&self, stop: bool) {
        self.postgres
            .as_ref()
            .expect("pause_postgres needs a PostgreSQL cluster with own_emulator")
            .pause(stop);
    }

    /// Kill the emulator and start it again on the same port with no data,
    /// then create the table again (as an operator would). Returns how long
    /// the store was gone. Needs `own_emulator`.
    pub fn restart_emulator(&mut self) -> Duration {
        let t0 = Instant::now();
        self.emulator
            .as_mut()
            .expect("restart_emulator needs ClusterSpec::own_emulator")
            .restart();
        self.create_table();
        t0.elapsed()
    }

    /// Delete the lease item directly on the emulator: data loss without
    /// downtime, the case `strict_new_lease` is for.
    pub fn delete_lease_item(&self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds unless the OS is out of resources");
        runtime.block_on(async {
            let store = leaderd::lease::dynamodb::DynamoStore::new(
                &leaderd::lease::dynamodb::DynamoConfig {
                    table: self.table.clone(),
                    region: "us-east-1".to_owned(),
                    endpoint_url: Some(self.endpoint.clone()),
                },
            )
            .await;
            store
                .client()
                .delete_item()
                .table_name(&self.table)
                .key(
                    "election",
                    aws_sdk_dynamodb::types::AttributeValue::S("job".to_owned()),
                )
                .send()
                .await
                .expect("DeleteItem on the emulator");
        });
    }

    /// Indexes of live instances that answer 200 on `/leader` now.
    pub fn leaders(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.dead && n.is_leader())
            .map(|(i, _)| i)
            .collect()
    }

    /// Wait until exactly one instance (not in `skip`) answers 200, and its
    /// child has written to the history. Panics with the logs after `limit`.
    pub fn wait_leader(&self, limit: Duration, skip: &[usize]) -> usize {
        let mut found = None;
        let ok = wait_until(limit, || {
            let leaders: Vec<usize> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, n)| !skip.contains(i) && !n.dead && n.is_leader())
                .map(|(i, _)| i)
                .collect();
            if leaders.len() != 1 {
                return false;
            }
            let id = &self.nodes[leaders[0]].identity;
            let running = self
                .history_text()
                .lines()
                .rev()
                .take(200)
                .any(|l| l.split(' ').nth(2) == Some(id.as_str()));
            found = Some(leaders[0]);
            running
        });
        match (ok, found) {
            (Some(_), Some(i)) => i,
            _ => self.fail(&format!(
                "no single leader with a running child within {} (skipping {skip:?})",
                ms(limit)
            )),
        }
    }

    /// The fencing token instance `i` leads with now (`None` if it does not
    /// lead or answer).
    pub fn token_of(&self, i: usize) -> Option<u64> {
        match self.nodes[i].leader()? {
            (200, body) => body["fencing_token"].as_u64(),
            _ => None,
        }
    }

    /// CPU time (user + system) the guard process of instance `i` uses
    /// over `window` (zero if it has none).
    pub fn guard_cpu(&self, i: usize, window: Duration) -> Duration {
        let guard = self.nodes[i].descendants().into_iter().find(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"__guard"))
        });
        let Some(guard) = guard else {
            return Duration::ZERO;
        };
        let ticks = || -> u64 {
            std::fs::read_to_string(format!("/proc/{guard}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, rest) = s.rsplit_once(')')?;
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    // utime and stime: fields 14 and 15, i.e. 11 and 12 after the name.
                    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
                })
                .unwrap_or(0)
        };
        let before = ticks();
        std::thread::sleep(window);
        let after = ticks();
        // USER_HZ is 100 on Linux.
        Duration::from_millis(after.saturating_sub(before) * 10)
    }

    /// The history so far.
    pub fn history_text(&self) -> String {
        std::fs::read_to_string(&self.history).unwrap_or_default()
    }

    /// Note a fault that starts now.
    pub fn fault_begins(&mut self, target: Option<usize>, what: impl Into<String>) -> usize {
        let target = target.map(|i| self.nodes[i].identity.clone());
        let what = what.into();
        eprintln!(
            "[{}] fault: {what}{}",
            self.name,
            target
                .as_deref()
                .map(|t| format!(" on {t}"))
                .unwrap_or_default()
        );
        self.faults.push(FaultRecord {
            from_ns: monotonic_ns(),
            to_ns: None,
            target,
            what,
        });
        self.faults.len() - 1
    }

    /// Note that fault `i` ends now.
    pub fn fault_ends(&mut self, i: usize) {
        self.faults[i].to_ns = Some(monotonic_ns());
    }

    /// Set a proxy fault on instance `i` (or on all with `None`).
    pub fn set_fault(&self, target: Option<usize>, fault: Fault) {
        match target {
            Some(i) => self.proxies[i].set(fault),
            None => self.proxies.iter().for_each(|p| p.set(fault.clone())),
        }
    }

    /// Freeze a whole machine: SIGSTOP leaderd and everything below it
    /// (guard, child process group). Returns the frozen pids, for [`thaw`].
    pub fn freeze(&mut self, i: usize) -> Vec<i32> {
        self.nodes[i].paused = true;
        let node = &self.nodes[i];
        let mut frozen = vec![node.pid];
        node.signal(Signal::SIGSTOP);
        // Repeat until no new process appears (one forked while we stopped
        // its parent).
        loop {
            let mut added = false;
            for p in node.descendants() {
                if !frozen.contains(&p) {
                    let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
                    frozen.push(p);
                    added = true;
                }
            }
            if !added {
                break;
            }
        }
        frozen
    }

    /// SIGCONT every pid [`Cluster::freeze`] stopped, children before
    /// parents (the old child gets the first chance to run: the pessimistic
    /// order for a thawing machine).
    pub fn thaw(&mut self, i: usize, frozen: &[i32]) {
        for &p in frozen.iter().rev() {
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
        }
        self.nodes[i].paused = false;
    }

    /// Stop everything (SIGCONT first, for frozen processes), make sure every
    /// child that ever wrote to the history is gone, and return the history.
    pub fn finish(&mut self) -> String {
        let mut pids: Vec<i32> = Vec::new();
        for node in &self.nodes {
            if !node.dead {
                pids.push(node.pid);
                pids.extend(node.descendants());
            }
        }
        let ours = nix::unistd::getpgrp().as_raw();
        let groups: std::collections::BTreeSet<i32> = pids
            .iter()
            .filter_map(|&p| procfs::stat(p).map(|s| s.pgrp))
            .filter(|&g| g > 1 && g != ours)
            .collect();
        for &p in &pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
        }
        for node in &mut self.nodes {
            if !node.dead {
                node.kill9();
            }
        }
        // Whatever is left below (guard, child, grandchild): this is teardown,
        // not a test of the guard.
        for &p in &pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        for &g in &groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        let text = self.history_text();
        let writers: Vec<i32> = text
            .lines()
            .filter_map(|l| l.split(' ').nth(4)?.parse().ok())
            .collect::<std::collections::BTreeSet<i32>>()
            .into_iter()
            .collect();
        let gone = wait_until(Duration::from_secs(10), || {
            writers.iter().all(|&p| procfs::gone(p))
        });
        if gone.is_none() {
            let alive: Vec<i32> = writers.into_iter().filter(|&p| !procfs::gone(p)).collect();
            self.fail(&format!(
                "children still alive after every leaderd was killed: {alive:?}"
            ));
        }
        // Lines written up to the kill are all there now.
        self.history_text()
    }

    /// `history::check`, or a failure with the evidence.
    pub fn check(&self, log: &str) -> Summary {
        match history::check(log) {
            Ok(summary) => summary,
            Err(v) => self.fail(&self.explain(&v, log)),
        }
    }

    /// `history::check_measuring_overlap`, or a failure with the evidence.
    pub fn check_measuring_overlap(&self, log: &str) -> Summary {
        match history::check_measuring_overlap(log) {
            Ok(summary) => summary,
            Err(v) => self.fail(&self.explain(&v, log)),
        }
    }

    /// The violation, the faults, and the history lines around it.
    fn explain(&self, v: &Violation, log: &str) -> String {
        let mut out = format!("history check failed: {v}\n");
        let _ = writeln!(out, "faults: {}", self.faults_text());
        let focus: Option<(String, u64)> = match v {
            Violation::Overlap(o) => Some((o.later.identity.clone(), o.later.fencing_token)),
            Violation::TokenNotIncreasing { tenure, .. } => {
                Some((tenure.identity.clone(), tenure.fencing_token))
            }
            _ => None,
        };
        if let Some((id, token)) = focus {
            let lines: Vec<&str> = log.lines().collect();
            let token = token.to_string();
            if let Some(at) = lines.iter().position(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.get(2) == Some(&id.as_str()) && f.get(3) == Some(&token.as_str())
            }) {
                let from = at.saturating_sub(25);
                let to = (at + 25).min(lines.len());
                let _ = writeln!(
                    out,
                    "history lines {}..{} (around the later tenure's start):",
                    from + 1,
                    to
                );
                for l in &lines[from..to] {
                    let _ = writeln!(out, "  {l}");
                }
            }
        }
        out
    }

    /// The faults applied so far, one per line, times relative to the first.
    pub fn faults_text(&self) -> String {
        let t0 = self.faults.first().map_or(0, |f| f.from_ns);
        let mut out = String::new();
        for f in &self.faults {
            let _ = write!(
                out,
                "\n  +{} {}{}{}",
                ms(Duration::from_nanos(f.from_ns - t0)),
                f.what,
                f.target
                    .as_deref()
                    .map(|t| format!(" on {t}"))
                    .unwrap_or_default(),
                f.to_ns
                    .map(|e| format!(" for {}", ms(Duration::from_nanos(e - f.from_ns))))
                    .unwrap_or_default()
            );
        }
        out
    }

    /// Fail the test: the message, the instances' important log lines, and
    /// where the whole directory was kept.
    pub fn fail(&self, message: &str) -> ! {
        let mut out = format!("[{}] {message}\n", self.name);
        for node in &self.nodes {
            let log = node.log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| {
                    ["WARN", "ERROR", "leader", "child", "lease", "panick"]
                        .iter()
                        .any(|k| l.contains(k))
                })
                .collect();
            let from = lines.len().saturating_sub(40);
            let _ = writeln!(
                out,
                "---- {} ({}), last important log lines ----",
                node.identity,
                node.log_path.display()
            );
            for l in &lines[from..] {
                let _ = writeln!(out, "{l}");
            }
        }
        let kept = self.dir.path().display().to_string();
        let _ = writeln!(out, "(logs and history kept in {kept})");
        // Keep the directory for a post-mortem: a panic drops the cluster, so
        // mark it first.
        KEEP_DIR.with(|k| k.set(true));
        panic!("{out}");
    }

    /// Print the summary and failover figures of a passed check.
    pub fn report(&self, summary: &Summary) {
        eprintln!("[{}] {summary}", self.name);
        match &summary.failover {
            Some(f) => eprintln!(
                "[{}] failover: min {}, median {}, max {} over {} gap(s)",
                self.name,
                ms(f.min),
                ms(f.median),
                ms(f.max),
                summary.gaps.len()
            ),
            None => eprintln!("[{}] failover: none (one tenure)", self.name),
        }
        if !self.faults.is_empty() {
            eprintln!("[{}] faults:{}", self.name, self.faults_text());
        }
    }

    /// The emulator's address (what the proxies forward to).
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }
}

thread_local! {
    static KEEP_DIR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Every process down (idempotent after finish()).
        for node in &mut self.nodes {
            if !node.dead {
                let below = node.descendants();
                for &p in &below {
                    let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
                }
                node.kill9();
                for p in below {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
        }
        if std::thread::panicking() || KEEP_DIR.with(|k| k.get()) {
            let dir = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("create a temporary directory"),
            );
            let kept = dir.keep();
            eprintln!("[{}] kept {} for a post-mortem", self.name, kept.display());
        }
    }
}

/// Lines of the history that belong to `identity`: (ns, event, token, pid).
pub fn lines_of(log: &str, identity: &str) -> Vec<(u64, String, u64, i32)> {
    log.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 5 && f[2] == identity).then(|| {
                (
                    f[0].parse().unwrap_or(0),
                    f[1].to_owned(),
                    f[3].parse().unwrap_or(0),
                    f[4].parse().unwrap_or(0),
                )
            })
        })
        .collect()
}

/// The time of the last history line of one tenure (identity and token).
pub fn last_line_of_tenure(log: &str, identity: &str, token: u64) -> Option<u64> {
    lines_of(log, identity)
        .into_iter()
        .filter(|l| l.2 == token)
        .map(|l| l.0)
        .max()
}
