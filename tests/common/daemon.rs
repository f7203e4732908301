//! Start real `leaderd` processes and talk to their HTTP API.
//!
//! The binary is built once by cargo (`CARGO_BIN_EXE_leaderd`) and started as
//! many times as a test needs. Each instance logs to its own file, which a
//! failing test prints.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The leaderd binary under test.
pub fn leaderd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_leaderd")
}

/// One running `leaderd run`.
pub struct Leaderd {
    /// The process.
    pub child: Child,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
    /// Its identity.
    pub identity: String,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    exited: Option<ExitStatus>,
}

/// How to start an instance.
pub struct Spec<'a> {
    /// `--identity`.
    pub identity: &'a str,
    /// Extra arguments after `run` (store, timing...).
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The child command after `--` (empty: none).
    pub command: Vec<String>,
    /// Directory for the log file.
    pub dir: &'a Path,
}

impl Leaderd {
    /// Start `leaderd run --listen 127.0.0.1:<free> --identity <id> ARGS [-- CMD]`.
    pub fn start(spec: Spec<'_>) -> Leaderd {
        Self::start_with(spec, |_| {})
    }

    /// [`Leaderd::start`], letting `adjust` change the command before it is
    /// spawned (resource limits, say).
    pub fn start_with(spec: Spec<'_>, adjust: impl FnOnce(&mut Command)) -> Leaderd {
        let log_path = spec.dir.join(format!("{}.log", spec.identity));
        let log = std::fs::File::create(&log_path).expect("create the instance log");
        let mut cmd = Command::new(leaderd_bin());
        cmd.arg("run")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--identity")
            .arg(spec.identity)
            .args(&spec.args)
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("RUST_BACKTRACE", "1")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log);
        if !spec.command.is_empty() {
            cmd.arg("--").args(&spec.command);
        }
        adjust(&mut cmd);
        let child = cmd.spawn().expect("start leaderd");
        let mut node = Leaderd {
            child,
            port: 0,
            identity: spec.identity.to_owned(),
            log_path,
            exited: None,
        };
        // leaderd binds port 0 and logs the port it got: no race with other
        // tests over "free" ports.
        let found = wait_until(Duration::from_secs(30), || {
            node.port = listen_port(&node.log()).unwrap_or(0);
            node.port != 0 || matches!(node.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            found.is_some() && node.port != 0,
            "{} did not start serving HTTP; log:\n{}",
            node.identity,
            node.log()
        );
        node
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// GET a path; `None` when the server does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http(self.port, "GET", path, &[])
    }

    /// One sample of `GET /metrics`, `series` written as in the text
    /// (`leaderd_is_leader{election="web"}`, or a name alone); `None` when
    /// the instance does not answer or has no such series.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (status, text) = self.get("/metrics")?;
        assert_eq!(status, 200, "{text}");
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))?;
        Some(
            value
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{series}: {value:?} is not a number ({e})")),
        )
    }

    /// GET `/leader`: (status, parsed JSON body).
    pub fn leader(&self) -> Option<(u16, serde_json::Value)> {
        let (status, body) = self.get("/leader")?;
        let json = serde_json::from_str(&body).ok()?;
        Some((status, json))
    }

    /// Whether `/leader` answers 200.
    pub fn is_leader(&self) -> bool {
        matches!(self.leader(), Some((200, _)))
    }

    /// Wait until `/leader` answers at all.
    pub fn wait_http(&self, limit: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self.get("/healthz").is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{} did not serve HTTP within {limit:?}; log:\n{}",
            self.identity,
            self.log()
        );
    }

    /// Send a signal to the leaderd process.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
    }

    /// Wait for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if self.exited.is_some() {
            return self.exited;
        }
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exited = Some(status);
                return self.exited;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// kill -9 and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        if let Ok(status) = self.child.wait() {
            self.exited = Some(status);
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Leaderd {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.kill9();
        }
        if std::thread::panicking() {
            eprintln!("---- log of {} ----\n{}", self.identity, self.log());
        }
    }
}

/// The port in leaderd's "leaderd running listen=127.0.0.1:PORT" log line.
pub fn listen_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("leaderd running"))?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))?;
    addr.rsplit_once(':')?.1.trim_matches('"').parse().ok()
}

/// One HTTP/1.0 request to 127.0.0.1:port; `(status, body)` or `None` if the
/// server does not answer within 2 s. HTTP/1.0 keeps the response unchunked.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Poll until `pred` holds or `limit` passes; returns the time it took.
pub fn wait_until(limit: Duration, mut pred: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if pred() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Which instances answer 200 on `/leader` right now.
pub fn leaders(instances: &[&Leaderd]) -> Vec<String> {
    instances
        .iter()
        .filter(|i| i.is_leader())
        .map(|i| i.identity.clone())
        .collect()
}

/// Short timing that keeps real-process tests quick and valid under
/// R + G + M + L·D < L: L = 2 s, R = 1 s, P = 250 ms, G = 500 ms.
pub fn short_timing_args() -> Vec<String> {
    [
        "--lease-duration",
        "2s",
        "--renew-interval",
        "1s",
        "--retry-interval",
        "250ms",
        "--kill-grace",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// [`short_timing_args`] for one election.
pub fn short_lease_args(election: &str) -> Vec<String> {
    let mut args = short_timing_args();
    args.extend(["--election".to_owned(), election.to_owned()]);
    args
}

/// For [`Leaderd::start_with`]: start leaderd with an open-files limit of
/// `limit` (soft and hard), which also bounds its HTTP connections.
pub fn open_files_limit(limit: u64) -> impl FnOnce(&mut Command) {
    use std::os::unix::process::CommandExt;
    move |cmd| {
        // SAFETY: setrlimit is async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    limit,
                    limit,
                )
                .map_err(std::io::Error::from)
            });
        }
    }
}

/// The SQLite store in `db` with [`short_lease_args`].
pub fn sqlite_short_args(db: &Path, election: &str) -> Vec<String> {
    let mut args: Vec<String> = ["--store", "sqlite", "--store-path"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(db.to_str().expect("utf-8 temp path").to_owned());
    args.extend(short_lease_args(election));
    args
}

/// Let leaderd create its SQLite store in `db` (a one-shot run that leads
/// election `setup` and exits), so a test can alter the table (add a
/// trigger, say) before the daemon under test opens it.
pub fn create_sqlite_store(db: &Path) {
    let (out, _) = output_within(
        Command::new(leaderd_bin()).args([
            "run",
            "--store-path",
            db.to_str().expect("utf-8 temp path"),
            "--listen",
            "127.0.0.1:0",
            "--acquire-timeout",
            "0",
            "--election",
            "setup",
            "--",
            "true",
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run `cmd` to its end, or kill it once `limit` has passed: its output, and
/// whether it ended on its own.
pub fn output_within(cmd: &mut Command, limit: Duration) -> (std::process::Output, bool) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    let t0 = Instant::now();
    let mut ended = true;
    while child.try_wait().expect("try_wait").is_none() {
        if t0.elapsed() >= limit {
            let _ = child.kill();
            ended = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (child.wait_with_output().expect("collect the output"), ended)
}
