//! What every scenario needs: leaderd processes with their configuration,
//! their HTTP API, the child's history log, store requests seen by the
//! proxies with the time they were seen, and /proc readings.
//!
//! All times are CLOCK_MONOTONIC nanoseconds, the clock tests/common/job.py
//! writes into its log, so a child's `start` line compares directly with the
//! moment the benchmark sent a signal.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

use crate::dynamo_local::{die_with_parent, free_port};
use crate::procfs;
use crate::proxy::FaultProxy;

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn mono_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    // Both parts are non-negative for CLOCK_MONOTONIC.
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

/// Sleeps until the monotonic clock reads `at_ns` (returns at once if past).
pub fn sleep_until(at_ns: u64) {
    let now = mono_ns();
    if at_ns > now {
        std::thread::sleep(Duration::from_nanos(at_ns - now));
    }
}

/// Milliseconds from `from_ns` to `to_ns` (negative if `to` is earlier).
pub fn ms_between(from_ns: u64, to_ns: u64) -> f64 {
    (to_ns as f64 - from_ns as f64) / 1e6
}

/// Polls `probe` every `every` until it yields a value or `limit` passes.
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = mono_ns() + limit.as_nanos() as u64;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if mono_ns() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// The admin token in every configuration: `leaderd resign` needs one.
pub const ADMIN_TOKEN: &str = "bench-admin-token";

/// The store the benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Store {
    /// DynamoDB Local (the benchmark starts it).
    Dynamodb,
    /// PostgreSQL (the benchmark starts a server of its own, reached
    /// without TLS so that each instance's proxy can read its statements).
    Postgres,
}

/// What every instance shares: the binary, the working directory, the table.
#[derive(Clone)]
pub struct Env {
    /// The store.
    pub store: Store,
    /// The release leaderd binary.
    pub bin: PathBuf,
    /// Configs and logs go here.
    pub dir: PathBuf,
    /// The DynamoDB table (already created).
    pub table: String,
    /// tests/common/job.py.
    pub job_py: PathBuf,
    /// The Python interpreter itself (not a wrapper such as a pyenv shim,
    /// whose start-up would count as the child's).
    pub python: PathBuf,
}

impl Env {
    /// The command line of a job.py child that appends to `log`. `-S`:
    /// job.py needs nothing from site-packages, and reading a crowded
    /// site directory at every start (55 ms with one interpreter here,
    /// against 1 ms with another) would be timed as leaderd's handover.
    pub fn job_command(&self, log: &Path) -> Vec<String> {
        vec![
            self.python.display().to_string(),
            "-S".into(),
            self.job_py.display().to_string(),
            log.display().to_string(),
            // Beats are not used; the `start` line is.
            "--interval-ms".into(),
            "500".into(),
            "--max-seconds".into(),
            "7200".into(),
        ]
    }

    /// Writes a configuration file for the store at `endpoint`
    /// (`http://HOST:PORT`: DynamoDB's endpoint, or PostgreSQL's host and
    /// port) with the benchmark's timing, the given elections (the first is
    /// primary) and `http` settings (key, TOML value) beside the admin
    /// token.
    pub fn write_config(
        &self,
        file: &str,
        endpoint: &str,
        elections: &[String],
        http: &[(&str, String)],
    ) -> Result<PathBuf, String> {
        let store = match self.store {
            Store::Dynamodb => format!(
                "kind = \"dynamodb\"\ntable = \"{}\"\nregion = \"us-east-1\"\nendpoint_url = \"{endpoint}\"",
                self.table
            ),
            Store::Postgres => format!(
                "kind = \"postgres\"\ntable = \"{}\"\nurl = \"{}\"",
                self.table,
                postgres_url(endpoint.trim_start_matches("http://"))
            ),
        };
        let mut toml = format!(
            "{SELF_LEASED}[store]\n{store}\n\n\
             [lease]\nduration = \"{}ms\"\nrenew_interval = \"{}ms\"\nretry_interval = \"{}ms\"\n\n\
             [log]\nlevel = \"info\"\n",
            crate::L.as_millis(),
            crate::R.as_millis(),
            crate::P.as_millis(),
        );
        for name in elections {
            let _ = write!(toml, "\n[[elections]]\nname = \"{name}\"\n");
        }
        let _ = write!(toml, "\n[http]\nadmin_token = \"{ADMIN_TOKEN}\"\n");
        if let Some(primary) = elections.first() {
            let _ = writeln!(toml, "primary = \"{primary}\"");
        }
        for (key, value) in http {
            let _ = writeln!(toml, "{key} = {value}");
        }
        let path = self.dir.join(file);
        std::fs::write(&path, toml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(path)
    }

    /// Runs `leaderd table create` against `endpoint` with `config`.
    pub fn create_table(&self, config: &Path) -> Result<(), String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["table", "create", "--config"]).arg(config);
        aws_env(&mut cmd);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`leaderd table create` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Env {
    /// The store's name in the report.
    pub fn store_name(&self) -> &'static str {
        match self.store {
            Store::Dynamodb => "DynamoDB Local",
            Store::Postgres => "PostgreSQL",
        }
    }

    /// A counting proxy in front of the store at `upstream`.
    pub fn proxy(&self, upstream: SocketAddr) -> crate::proxy::FaultProxy {
        match self.store {
            Store::Dynamodb => crate::proxy::FaultProxy::start(upstream),
            Store::Postgres => crate::proxy::FaultProxy::start_postgres(upstream),
        }
    }
}

/// leaderd's URL of the benchmark's PostgreSQL at `host_port`: its role,
/// no TLS.
pub fn postgres_url(host_port: &str) -> String {
    let (role, password) = crate::postgres::ROLE;
    format!(
        "postgres://{role}:{password}@{host_port}/{}?sslmode=disable",
        crate::postgres::DATABASE
    )
}

/// The interpreter `python3` on PATH resolves to.
pub fn python() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map_err(|e| format!("cannot run python3 (needed for tests/common/job.py): {e}"))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "python3 did not name its interpreter: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Fake credentials: the emulator accepts any.
fn aws_env(cmd: &mut Command) {
    cmd.env("AWS_ACCESS_KEY_ID", "leaderdbench")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdbench")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
}

/// One running `leaderd run`.
pub struct Instance {
    /// Its identity.
    pub identity: String,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
    /// CLOCK_MONOTONIC just before it was spawned.
    pub spawned_ns: u64,
    log_path: PathBuf,
    child: Child,
    exited: Option<ExitStatus>,
}

impl Instance {
    /// Starts `leaderd run --config CONFIG --identity ID --listen 127.0.0.1:FREE -- COMMAND`.
    pub fn start(
        env: &Env,
        identity: &str,
        config: &Path,
        command: &[String],
    ) -> Result<Instance, String> {
        let port = free_port()?;
        let log_path = env.dir.join(format!("{identity}.log"));
        let log = File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("cannot duplicate a file handle: {e}"))?;
        let mut cmd = Command::new(&env.bin);
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .args(["--identity", identity, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        aws_env(&mut cmd);
        if !command.is_empty() {
            cmd.arg("--").args(command);
        }
        die_with_parent(&mut cmd);
        let spawned_ns = mono_ns();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env.bin.display()))?;
        Ok(Instance {
            identity: identity.to_owned(),
            port,
            spawned_ns,
            log_path,
            child,
            exited: None,
        })
    }

    /// The leaderd process id.
    pub fn pid(&self) -> i32 {
        // A Linux pid always fits in i32.
        self.child.id() as i32
    }

    /// GET `path`: (status, body), or `None` if it does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// Whether `/leader` answers 200.
    pub fn is_leader(&self) -> bool {
        matches!(self.get("/leader"), Some((200, _)))
    }

    /// Waits until the HTTP server answers.
    pub fn wait_http(&mut self, limit: Duration) -> Result<(), String> {
        let ready = poll(limit, Duration::from_millis(20), || {
            self.get("/healthz").map(|_| ())
        });
        match ready {
            Some(()) => Ok(()),
            None => Err(format!(
                "{} did not serve HTTP within {limit:?} (exited: {:?}); see {}",
                self.identity,
                self.child.try_wait().ok().flatten(),
                self.log_path.display()
            )),
        }
    }

    /// Sends `signal` to the leaderd process only; returns CLOCK_MONOTONIC
    /// taken just before the system call.
    pub fn signal(&self, signal: Signal) -> u64 {
        let at = mono_ns();
        let _ = kill(Pid::from_raw(self.pid()), signal);
        at
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = poll(limit, Duration::from_millis(20), || {
                self.child.try_wait().ok().flatten()
            });
        }
        self.exited
    }

    /// Stops it: SIGTERM (it stops its child and releases its leases), then
    /// SIGKILL if it has not exited within `limit`.
    pub fn stop(&mut self, limit: Duration) {
        if self.exited.is_none() {
            self.signal(Signal::SIGTERM);
            if self.wait_exit(limit).is_none() {
                self.kill9();
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }

    /// Where it logs.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SIGKILL: the supervisor's guard then kills the child.
        self.kill9();
    }
}

/// One HTTP/1.0 GET to 127.0.0.1:port (HTTP/1.0 keeps the body unchunked).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// One line of the child's history log that matters here.
#[derive(Debug, Clone)]
pub struct JobEvent {
    /// CLOCK_MONOTONIC ns written by the child.
    pub at_ns: u64,
    /// `start` or `end`.
    pub kind: String,
    /// LEADERD_IDENTITY of the leaderd that started it.
    pub identity: String,
}

/// Reads a job.py history log incrementally, keeping `start` and `end` lines.
pub struct JobLog {
    path: PathBuf,
    offset: u64,
    partial: String,
    events: Vec<JobEvent>,
}

impl JobLog {
    /// A reader of `path` (the file need not exist yet).
    pub fn new(path: PathBuf) -> JobLog {
        JobLog {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn refresh(&mut self) {
        let Ok(mut file) = File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut fresh = String::new();
        let Ok(read) = file.read_to_string(&mut fresh) else {
            return;
        };
        self.offset += read as u64;
        self.partial.push_str(&fresh);
        // Keep a trailing incomplete line for the next read.
        let complete = self.partial.rfind('\n').map_or(0, |i| i + 1);
        let lines: String = self.partial.drain(..complete).collect();
        for line in lines.lines() {
            let mut fields = line.split_whitespace();
            let (Some(at), Some(kind), Some(identity)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(at_ns) = at.parse::<u64>() else {
                continue; // a `#` comment from job.py
            };
            if kind == "start" || kind == "end" {
                self.events.push(JobEvent {
                    at_ns,
                    kind: kind.to_owned(),
                    identity: identity.to_owned(),
                });
            }
        }
    }

    /// The first `start` after `after_ns` by a leaderd other than `not_by`.
    pub fn start_after(&mut self, after_ns: u64, not_by: Option<&str>) -> Option<JobEvent> {
        self.refresh();
        self.events
            .iter()
            .find(|e| {
                e.kind == "start" && e.at_ns > after_ns && Some(e.identity.as_str()) != not_by
            })
            .cloned()
    }

    /// The first `end` after `after_ns` by `identity`: the old job's last
    /// line when it stops on SIGTERM.
    pub fn end_after(&mut self, after_ns: u64, by: &str) -> Option<JobEvent> {
        self.refresh();
        self.events
            .iter()
            .find(|e| e.kind == "end" && e.at_ns > after_ns && e.identity == by)
            .cloned()
    }

    /// The latest `start` by `identity`, if any.
    pub fn last_start_by(&mut self, identity: &str) -> Option<JobEvent> {
        self.refresh();
        self.events
            .iter()
            .rev()
            .find(|e| e.kind == "start" && e.identity == identity)
            .cloned()
    }
}

/// The first line of every instance's config: each election its own lease
/// (the footprint and start-up sections). The failover, cost and balance
/// sections choose with [`set_sessions`].
pub const SELF_LEASED: &str = "sessions = false\n";

/// Makes the config at `path` (from [`Env::write_config`]) hold its
/// elections through a session when `sessions`, else each its own lease.
pub fn set_sessions(path: &Path, sessions: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.replacen(SELF_LEASED, &format!("sessions = {sessions}\n"), 1);
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A store request seen by one instance's proxy.
#[derive(Debug, Clone)]
pub struct StoreEvent {
    /// Which proxy (instance slot).
    pub slot: usize,
    /// `GetItem`, `PutItem`, ...
    pub op: String,
    /// When the watcher saw the proxy's count go up (within ~1 ms of the
    /// request's arrival).
    pub at_ns: u64,
}

/// Polls the proxies' request counts every millisecond and timestamps every
/// increase: the only clock we have on requests without touching the proxy.
pub struct Watcher {
    events: Arc<Mutex<Vec<StoreEvent>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Watcher {
    /// Starts watching `proxies` (slot i = proxies[i]).
    pub fn start(proxies: Vec<Arc<FaultProxy>>) -> Watcher {
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let events = events.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen: Vec<BTreeMap<String, u64>> =
                    proxies.iter().map(|p| p.counts()).collect();
                while !stop.load(Ordering::Relaxed) {
                    for (slot, proxy) in proxies.iter().enumerate() {
                        let now = proxy.counts();
                        let at_ns = mono_ns();
                        for (op, count) in &now {
                            let before = seen[slot].get(op).copied().unwrap_or(0);
                            for _ in before..*count {
                                lock(&events).push(StoreEvent {
                                    slot,
                                    op: op.clone(),
                                    at_ns,
                                });
                            }
                        }
                        seen[slot] = now;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        Watcher {
            events,
            stop,
            thread: Some(thread),
        }
    }

    /// The first request matching `op` and `slot` after `after_ns`.
    pub fn first(
        &self,
        after_ns: u64,
        op: &str,
        slot: impl Fn(usize) -> bool,
    ) -> Option<StoreEvent> {
        lock(&self.events)
            .iter()
            .find(|e| e.at_ns > after_ns && e.op == op && slot(e.slot))
            .cloned()
    }

    /// The last request matching `op` and `slot` in (after_ns, before_ns).
    pub fn last_between(
        &self,
        after_ns: u64,
        before_ns: u64,
        op: &str,
        slot: usize,
    ) -> Option<StoreEvent> {
        lock(&self.events)
            .iter()
            .rev()
            .find(|e| e.at_ns > after_ns && e.at_ns < before_ns && e.op == op && e.slot == slot)
            .cloned()
    }

    /// Every request in (after_ns, before_ns], in order.
    pub fn between(&self, after_ns: u64, before_ns: u64) -> Vec<StoreEvent> {
        lock(&self.events)
            .iter()
            .filter(|e| e.at_ns > after_ns && e.at_ns <= before_ns)
            .cloned()
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A process's CPU time so far (user + system), in seconds.
pub fn cpu_seconds(pid: i32, clock_ticks: f64) -> Option<f64> {
    Some(procfs::stat(pid)?.cpu_ticks as f64 / clock_ticks)
}

pub use crate::procfs::{smaps_kib, status_field as status_kib};

/// Processes whose parent is `pid`: (pid, command name).
pub fn children_of(pid: i32) -> Vec<(i32, String)> {
    procfs::children_of(pid)
        .into_iter()
        .filter_map(|c| Some((c, procfs::comm(c)?)))
        .collect()
}

/// Clock ticks per second, the unit of /proc/PID/stat.
pub fn clock_ticks() -> Result<f64, String> {
    Ok(procfs::clock_ticks())
}
