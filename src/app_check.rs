//! The app check: leaderd campaigns only while the app it stands for is
//! healthy, the way Kubernetes probes a container.
//!
//! One task runs the probe (an HTTP GET, a TCP connect or a command) every
//! `interval`, each attempt bounded by `timeout`, and publishes a verdict on a
//! watch channel: `Unknown` until the first verdict, `Pass` after
//! `success_threshold` consecutive passes, `Fail` after `failure_threshold`
//! consecutive failures. It runs apart from the elections, so a probe that
//! hangs never delays a renewal. The elections read the verdict as a gate
//! (`driver::NodeDriver::gated`); the daemon steps down when it turns bad.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::supervisor::{self, ChildExit, ChildSpec, Streams, SupervisorError};
use crate::text;

/// Defaults of `[app_check]`, as Kubernetes' probes have them except the
/// interval (2 s instead of 10 s: leadership should move soon).
pub mod defaults {
    use std::time::Duration;

    /// `app_check.interval`.
    pub const INTERVAL: Duration = Duration::from_secs(2);
    /// `app_check.timeout`.
    pub const TIMEOUT: Duration = Duration::from_secs(1);
    /// `app_check.failure_threshold`.
    pub const FAILURE_THRESHOLD: u32 = 3;
    /// `app_check.success_threshold`.
    pub const SUCCESS_THRESHOLD: u32 = 1;
}

/// What is probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `GET` this `http://` URL; a 2xx answer passes.
    Http(hyper::Uri),
    /// Connect to this `host:port`; a connection passes.
    Tcp(String),
    /// Run this command (no shell); exit status 0 passes.
    Command(Vec<String>),
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Http(uri) => write!(f, "GET {uri}"),
            Probe::Tcp(addr) => write!(f, "connect {addr}"),
            Probe::Command(argv) => write!(f, "run {}", text::echo(&argv.join(" "))),
        }
    }
}

/// `[app_check]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppCheckConfig {
    /// What is probed.
    pub probe: Probe,
    /// Time between the starts of two probes.
    pub interval: Duration,
    /// Longest one probe may take; a slower one failed.
    pub timeout: Duration,
    /// Consecutive failures that turn the verdict to `Fail`.
    pub failure_threshold: u32,
    /// Consecutive passes that turn the verdict to `Pass`.
    pub success_threshold: u32,
}

/// The app check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No verdict yet: leaderd does not campaign.
    Unknown,
    /// The app is healthy: leaderd campaigns.
    Pass,
    /// The app is failing: leaderd neither campaigns nor keeps a lease.
    Fail,
}

impl Verdict {
    /// As `/leader` and `/status` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Unknown => "unknown",
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
        }
    }
}

/// Where the app check reports, for metrics.
pub trait Report: Send + Sync {
    /// A probe ended; `up` is whether it passed.
    fn probed(&self, up: bool);
    /// The verdict is now `verdict` (also once at the start: `Unknown`).
    fn verdict(&self, verdict: Verdict);
}

/// Consecutive results and the verdict they make.
#[derive(Debug)]
struct Tally {
    verdict: Verdict,
    passes: u32,
    failures: u32,
}

impl Tally {
    /// Count one result; the new verdict if it changed.
    fn count(&mut self, up: bool, cfg: &AppCheckConfig) -> Option<Verdict> {
        if up {
            self.passes = self.passes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.passes = 0;
        }
        let next = if self.passes >= cfg.success_threshold {
            Verdict::Pass
        } else if self.failures >= cfg.failure_threshold {
            Verdict::Fail
        } else {
            self.verdict
        };
        (next != self.verdict).then(|| {
            self.verdict = next;
            next
        })
    }
}

/// Start probing; the receiver holds the current verdict. The task ends
/// when every receiver is gone.
pub fn spawn(cfg: AppCheckConfig, report: Arc<dyn Report>) -> watch::Receiver<Verdict> {
    let (tx, rx) = watch::channel(Verdict::Unknown);
    tokio::spawn(run(cfg, report, tx));
    rx
}

async fn run(cfg: AppCheckConfig, report: Arc<dyn Report>, tx: watch::Sender<Verdict>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tally = Tally {
        verdict: Verdict::Unknown,
        passes: 0,
        failures: 0,
    };
    let mut last_problem: Option<String> = None;
    report.verdict(Verdict::Unknown);
    let mut ticks = tokio::time::interval(cfg.interval);
    // A probe that overran its slot is not made up for with a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(probe = %cfg.probe, interval = %text::duration(cfg.interval), "app check started: not campaigning until it passes");
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = tx.closed() => return,
        }
        let result = match tokio::time::timeout(cfg.timeout, probe(&cfg.probe, &client)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {}", text::duration(cfg.timeout))),
        };
        report.probed(result.is_ok());
        let problem = result.err();
        if problem != last_problem {
            match &problem {
                Some(p) => tracing::warn!(probe = %cfg.probe, problem = %p, "app check failed"),
                None if last_problem.is_some() => {
                    tracing::info!(probe = %cfg.probe, "app check passes again")
                }
                None => {}
            }
            last_problem = problem.clone();
        }
        if let Some(verdict) = tally.count(problem.is_none(), &cfg) {
            match verdict {
                Verdict::Pass => tracing::info!(probe = %cfg.probe, "app is healthy: campaigning"),
                _ => {
                    tracing::warn!(probe = %cfg.probe, failures = tally.failures, "app is failing: not campaigning, and stepping down where leading")
                }
            }
            report.verdict(verdict);
            tx.send_replace(verdict);
        }
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// One probe: `Ok` when it passed, else what went wrong.
async fn probe(probe: &Probe, client: &HttpClient) -> Result<(), String> {
    match probe {
        Probe::Http(uri) => {
            let answer = client.get(uri.clone()).await.map_err(|e| {
                // The client's own message is generic; its causes say what
                // happened ("tcp connect error: Connection refused").
                let mut why = Vec::new();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    why.push(c.to_string());
                    cause = c.source();
                }
                if why.is_empty() {
                    why.push(e.to_string());
                }
                format!("GET failed: {}", why.join(": "))
            })?;
            let status = answer.status();
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("GET answered {status}"))
            }
        }
        Probe::Tcp(addr) => tokio::net::TcpStream::connect(addr.as_str())
            .await
            .map(drop)
            .map_err(|e| format!("cannot connect: {e}")),
        Probe::Command(argv) => run_command(argv).await,
    }
}

/// Run the check command the way the job is run: under a guard process
/// (see [`crate::supervisor`]), in a process group of its own. Whatever it
/// leaves behind (`sh -c 'sleep 300 & exit 0'`) is SIGKILLed with its group
/// once it exited: [`supervisor::Child::wait`] resolves only when every
/// member and orphan is gone. When the probe's timeout drops this future,
/// or leaderd ends however it ends (even by SIGKILL), the guard's control
/// socket closes and the guard kills them all.
async fn run_command(argv: &[String]) -> Result<(), String> {
    let spec = ChildSpec {
        command: argv.to_vec(),
        env: Vec::new(),
        // Never sent: no deadline and no stop; the guard only ever kills.
        stop_signal: Signal::SIGKILL,
        // The running binary, as for the job (still right after an upgrade
        // replaced the file).
        guard_exe: PathBuf::from("/proc/self/exe"),
    };
    let mut child = supervisor::spawn_with(&spec, None, Streams::Null)
        .await
        .map_err(|e| match e {
            SupervisorError::Spawn(failure) => format!("cannot run {}", failure.message),
            e => format!("cannot run the command: {e}"),
        })?;
    match child.wait().await {
        ChildExit::Exited(0) => Ok(()),
        ChildExit::Exited(code) => Err(format!("the command ended with exit code {code}")),
        end => Err(format!("the command ended: {end}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(failure_threshold: u32, success_threshold: u32) -> AppCheckConfig {
        AppCheckConfig {
            probe: Probe::Tcp("127.0.0.1:1".into()),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold,
            success_threshold,
        }
    }

    fn tally() -> Tally {
        Tally {
            verdict: Verdict::Unknown,
            passes: 0,
            failures: 0,
        }
    }

    #[test]
    fn the_verdict_changes_only_after_the_thresholds() {
        let cfg = cfg(3, 2);
        let mut t = tally();
        assert_eq!(t.count(true, &cfg), None, "one pass of two: still unknown");
        assert_eq!(t.count(true, &cfg), Some(Verdict::Pass));
        assert_eq!(t.count(false, &cfg), None);
        assert_eq!(t.count(false, &cfg), None);
        assert_eq!(t.count(true, &cfg), None, "a pass resets the failures");
        assert_eq!(t.count(false, &cfg), None);
        assert_eq!(t.count(false, &cfg), None);
        assert_eq!(t.count(false, &cfg), Some(Verdict::Fail));
        assert_eq!(t.count(true, &cfg), None, "one pass of two");
        assert_eq!(t.count(true, &cfg), Some(Verdict::Pass));
    }

    #[test]
    fn failing_from_the_start_turns_unknown_to_fail() {
        let cfg = cfg(2, 1);
        let mut t = tally();
        assert_eq!(t.count(false, &cfg), None);
        assert_eq!(t.count(false, &cfg), Some(Verdict::Fail));
        assert_eq!(t.count(false, &cfg), None, "no repeated change");
    }

    #[tokio::test]
    async fn http_and_tcp_probes_pass_on_an_answer_and_fail_without_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&buf[..n]).to_string();
                let status = if line.starts_with("GET /ok") {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let ok: hyper::Uri = format!("http://{addr}/ok").parse().unwrap();
        let bad: hyper::Uri = format!("http://{addr}/bad").parse().unwrap();
        assert_eq!(probe(&Probe::Http(ok), &client).await, Ok(()));
        let err = probe(&Probe::Http(bad), &client).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        assert_eq!(probe(&Probe::Tcp(addr.to_string()), &client).await, Ok(()));
        // A port nobody listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let err = probe(&Probe::Tcp(closed_addr.to_string()), &client)
            .await
            .unwrap_err();
        assert!(err.contains("cannot connect"), "{err}");
        // Command probes need the leaderd binary (their guard): see
        // tests/app_check.rs.
    }
}
