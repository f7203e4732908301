//! `leaderd run -- COMMAND` with real processes on the SQLite store: the
//! child's start, environment, signals, exits and exit codes.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::daemon::{Leaderd, Spec, wait_until};
use nix::sys::signal::Signal;

/// L = 2 s, R = 1 s, P = 250 ms, G = 500 ms.
fn timing(db: &Path) -> Vec<String> {
    common::daemon::sqlite_short_args(db, "job")
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn db(&self) -> PathBuf {
        self.path("leases.db")
    }
    fn start(&self, id: &str, extra: &[&str], env: &[(&str, &str)], cmd: &[&str]) -> Leaderd {
        let mut args = timing(&self.db());
        args.extend(extra.iter().map(|s| s.to_string()));
        let node = Leaderd::start(Spec {
            identity: id,
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            dir: self.dir.path(),
        });
        node.wait_http(Duration::from_secs(20));
        node
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn sh(script: &str, arg: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        script.into(),
        arg.display().to_string(),
    ]
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

#[test]
fn child_starts_only_on_the_leader_with_its_fencing_token() {
    let env = Env::new();
    let script = r#"echo "$LEADERD_FENCING_TOKEN $LEADERD_ELECTION $LEADERD_IDENTITY $LEADERD_LEASE_MS" > "$0"; exec sleep 1000"#;
    let a_file = env.path("a.token");
    let a = env.start("a", &[], &[], &as_refs(&sh(script, &a_file)));
    wait_until(Duration::from_secs(10), || !read(&a_file).is_empty())
        .expect("leader's child starts");
    let b_file = env.path("b.token");
    let b = env.start("b", &[], &[], &as_refs(&sh(script, &b_file)));
    let (status, body) = a.leader().expect("a answers");
    assert_eq!(status, 200, "{body}");
    let fields: Vec<String> = read(&a_file).split_whitespace().map(String::from).collect();
    assert_eq!(
        fields[0],
        body["fencing_token"].to_string(),
        "child token vs /leader: {body}"
    );
    assert_eq!(fields[1..], ["job", "a", "2000"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(!b.is_leader());
    assert!(
        read(&b_file).is_empty(),
        "the follower must not run the command"
    );
}

#[test]
fn sigterm_forwards_waits_releases_and_exits_with_the_childs_code() {
    let env = Env::new();
    let marker = env.path("term");
    let script = r#"trap 'echo got-term >> "$0"; exit 7' TERM; while :; do sleep 0.05; done"#;
    let mut a = env.start("a", &[], &[], &as_refs(&sh(script, &marker)));
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let b = env.start("b", &[], &[], &["sleep", "1000"]);
    // A settled follower: one that watches the leader's stream (a fixed
    // pause was not always enough on a loaded machine, and a follower not
    // yet watching learns of the release by polling, later).
    wait_until(Duration::from_secs(10), || {
        b.metric("leaderd_watching_leader{election=\"job\"}") == Some(1.0)
    })
    .expect("b watches a");
    a.signal(Signal::SIGTERM);
    let status = a.wait_exit(Duration::from_secs(10)).expect("a exits");
    assert_eq!(
        status.code(),
        Some(7),
        "leaderd exits with the child's code"
    );
    assert_eq!(read(&marker).trim(), "got-term");
    // Released: b leads within P + 1 s.
    let took = wait_until(Duration::from_secs(5), || b.is_leader()).expect("b leads");
    assert!(
        took <= Duration::from_millis(1_250),
        "handover took {took:?}"
    );
}

#[test]
fn child_ignoring_sigterm_is_killed_after_shutdown_grace_or_at_a_second_sigterm() {
    let env = Env::new();
    let ignore = ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"];
    let grace = [("LEADERD_CHILD__SHUTDOWN_GRACE", "2s")];
    let mut a = env.start("a", &[], &grace, &ignore);
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    a.signal(Signal::SIGTERM);
    assert!(
        a.wait_exit(Duration::from_millis(1_500)).is_none(),
        "must wait for shutdown_grace"
    );
    let status = a
        .wait_exit(Duration::from_secs(5))
        .expect("a exits after the grace");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    assert_eq!(status.code(), Some(128 + 9), "killed child: 128+SIGKILL");

    // A second SIGTERM skips the wait.
    let mut b = env.start(
        "b",
        &[],
        &[("LEADERD_CHILD__SHUTDOWN_GRACE", "30s")],
        &ignore,
    );
    wait_until(Duration::from_secs(10), || b.is_leader()).expect("b leads");
    std::thread::sleep(Duration::from_millis(300));
    b.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    b.signal(Signal::SIGTERM);
    let status = b
        .wait_exit(Duration::from_secs(3))
        .expect("second SIGTERM kills at once");
    assert_eq!(status.code(), Some(137));
}

#[test]
fn forwarded_signals_reach_the_child() {
    let env = Env::new();
    let log = env.path("signals");
    let script = r#"for s in HUP QUIT USR1 USR2 WINCH; do trap "echo $s >> \"$0\"" $s; done; echo ready >> "$0"; while :; do sleep 0.05; done"#;
    let a = env.start("a", &[], &[], &as_refs(&sh(script, &log)));
    wait_until(Duration::from_secs(10), || read(&log).contains("ready")).expect("child ready");
    for sig in [
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
    ] {
        a.signal(sig);
        let name = sig.as_str().trim_start_matches("SIG");
        wait_until(Duration::from_secs(3), || read(&log).contains(name))
            .unwrap_or_else(|| panic!("{sig} not forwarded; child saw: {}", read(&log)));
    }
    assert!(a.is_leader(), "forwarded signals do not stop leaderd");
}

#[test]
fn on_child_exit_exit_returns_the_code_and_releases() {
    let env = Env::new();
    let mut a = env.start(
        "a",
        &["--on-child-exit", "exit"],
        &[],
        &["sh", "-c", "sleep 1; exit 3"],
    );
    let b = env.start("b", &[], &[], &["sleep", "1000"]);
    let status = a.wait_exit(Duration::from_secs(15)).expect("a exits");
    assert_eq!(status.code(), Some(3));
    // Released: b leads well before the lease (L·(1+D) = 2.02 s) could have
    // expired. Bounded generously: other tests load the machine in CI.
    let took = wait_until(Duration::from_secs(5), || b.is_leader()).expect("b leads after release");
    assert!(
        a.log().contains("released the lease"),
        "a must release before exiting:\n{}",
        a.log()
    );
    eprintln!("handover after the child's exit: {took:?}");

    let mut c = env.start(
        "c",
        &["--on-child-exit", "exit"],
        &[],
        &["sh", "-c", "kill -SEGV $$"],
    );
    drop(b);
    let status = c.wait_exit(Duration::from_secs(15)).expect("c exits");
    assert_eq!(status.code(), Some(139), "SIGSEGV → 128+11");
}

#[test]
fn on_child_exit_restart_backs_off_with_growing_delays() {
    let env = Env::new();
    let stamps = env.path("stamps");
    let script = r#"date +%s.%N >> "$0"; exit 1"#;
    let a = env.start(
        "a",
        &["--on-child-exit", "restart"],
        &[],
        &as_refs(&sh(script, &stamps)),
    );
    wait_until(Duration::from_secs(20), || {
        read(&stamps).lines().count() >= 4
    })
    .expect("four starts");
    let t: Vec<f64> = read(&stamps)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.windows(2).all(|g| g[1] > g[0] * 1.5),
        "delays must grow: {gaps:?}"
    );
    assert!(gaps[0] >= 0.9, "first delay about 1 s: {gaps:?}");
    assert!(a.is_leader(), "restart keeps the lease");
}

#[test]
fn on_child_exit_release_hands_leadership_over() {
    let env = Env::new();
    let mut a = env.start(
        "a",
        &["--on-child-exit", "release"],
        &[],
        &["sh", "-c", "sleep 1; exit 0"],
    );
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let b = env.start("b", &[], &[], &["sleep", "1000"]);
    wait_until(Duration::from_secs(10), || b.is_leader()).expect("b leads after a released");
    assert!(!a.is_leader());
    assert!(
        a.wait_exit(Duration::from_millis(100)).is_none(),
        "a keeps running and campaigning"
    );
}

#[test]
fn acquire_timeout_zero_exits_75_at_once_without_running_the_command() {
    let env = Env::new();
    let a = env.start("a", &[], &[], &["sleep", "1000"]);
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let marker = env.path("ran");
    let t0 = std::time::Instant::now();
    let out = std::process::Command::new(common::daemon::leaderd_bin())
        .arg("run")
        .args(timing(&env.db()))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--identity",
            "b",
            "--acquire-timeout",
            "0",
            "--",
        ])
        .args(sh(r#"touch "$0""#, &marker))
        .output()
        .expect("run leaderd");
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "at once: {:?}",
        t0.elapsed()
    );
    assert!(!marker.exists(), "the command must not run");
}

#[test]
fn mode_always_runs_everywhere_and_signals_transitions() {
    let env = Env::new();
    let script = r#"trap 'echo gain >> "$0"' USR1; trap 'echo loss >> "$0"' USR2; echo "start leader=$LEADERD_IS_LEADER" >> "$0"; while :; do sleep 0.05; done"#;
    let extra = ["--mode", "always"];
    let vars = [
        ("LEADERD_CHILD__SIGNAL_ON_GAIN", "SIGUSR1"),
        ("LEADERD_CHILD__SIGNAL_ON_LOSS", "SIGUSR2"),
        ("LEADERD_HTTP__ADMIN_TOKEN", "s3cret"),
    ];
    let (fa, fb) = (env.path("a"), env.path("b"));
    let a = env.start("a", &extra, &vars, &as_refs(&sh(script, &fa)));
    // Started once the first observation settled the role: told by the
    // environment, not by a signal that could race its start.
    wait_until(Duration::from_secs(10), || {
        read(&fa).contains("start leader=true")
    })
    .expect("a's child starts as leader");
    let b = env.start("b", &extra, &vars, &as_refs(&sh(script, &fb)));
    wait_until(Duration::from_secs(10), || {
        read(&fb).contains("start leader=false")
    })
    .expect("b's child runs while following");
    assert!(!read(&fb).contains("gain"));
    // a resigns: its child hears of the loss, b's of the gain.
    let (status, body) = common::daemon::http(
        a.port,
        "POST",
        "/leader/job/resign",
        &[("Authorization", "Bearer s3cret")],
    )
    .expect("resign answers");
    assert!(status == 200 || status == 202, "{status} {body}");
    wait_until(Duration::from_secs(10), || read(&fa).contains("loss"))
        .expect("a's child told of the loss");
    wait_until(Duration::from_secs(10), || read(&fb).contains("gain"))
        .expect("b's child told of the gain");
    assert!(b.is_leader());
}

#[test]
fn a_job_running_leaderd_itself_is_not_confused_by_its_variables() {
    // The child gets LEADERD_ELECTION, LEADERD_IS_LEADER, ...; a leaderd the
    // job runs must not take them for configuration.
    let env = Env::new();
    let db = env.db();
    let mut args = timing(&db);
    args.extend(["--on-child-exit".to_string(), "exit".to_string()]);
    // Not `env.start`: this instance may be gone before its HTTP is asked.
    let mut a = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![],
        command: vec![
            common::daemon::leaderd_bin().to_string(),
            "status".to_string(),
            "--store-path".to_string(),
            db.to_str().expect("utf-8 temp path").to_string(),
        ],
        dir: env.dir.path(),
    });
    let status = a
        .wait_exit(Duration::from_secs(15))
        .expect("a exits with its job");
    assert_eq!(
        status.code(),
        Some(0),
        "the job's `leaderd status` failed:\n{}",
        a.log()
    );
    assert!(
        a.log().contains("held"),
        "status printed the election:\n{}",
        a.log()
    );
}

/// A command that cannot be started at all is the job failing: exit 127
/// (not found) or 126 (not executable), as a shell would, after releasing.
#[test]
fn a_job_that_cannot_start_releases_and_exits_127_or_126() {
    let env = Env::new();
    let b = env.start("b", &[], &[], &["sleep", "1000"]);
    wait_until(Duration::from_secs(10), || b.is_leader()).expect("b leads");
    // a waits behind b, then b leaves: a leads and cannot start its job.
    let missing = env.path("exprot.sh");
    let mut a = env.start(
        "a",
        &["--on-child-exit", "exit"],
        &[],
        &[missing.to_str().expect("utf-8 temp path")],
    );
    let c = env.start("c", &[], &[], &["sleep", "1000"]);
    std::thread::sleep(Duration::from_millis(300));
    drop(b);
    let status = a
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a kept running with a job that cannot start:\n{}", a.log()));
    assert_eq!(status.code(), Some(127), "{}", a.log());
    assert!(a.log().contains("released the lease"), "{}", a.log());
    wait_until(Duration::from_secs(10), || c.is_leader()).expect("c leads after a released");

    let not_executable = env.path("job.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nsleep 1000\n").expect("write job.sh");
    drop(c);
    let mut d = env.start(
        "d",
        &["--on-child-exit", "exit"],
        &[],
        &[not_executable.to_str().expect("utf-8 temp path")],
    );
    let status = d
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("d kept running:\n{}", d.log()));
    assert_eq!(status.code(), Some(126), "{}", d.log());
}

/// With `restart`, a job that cannot start is retried with back-off, shows
/// in `/healthz` and the metrics, and the lease is released once the
/// failures outlast one lease, so another instance can run the job.
#[test]
fn a_job_that_cannot_start_under_restart_is_reported_and_gives_the_lease_up() {
    let env = Env::new();
    let missing = env.path("exprot.sh");
    let a = env.start(
        "a",
        &["--on-child-exit", "restart"],
        &[],
        &[missing.to_str().expect("utf-8 temp path")],
    );
    let (status, body) = wait_until(Duration::from_secs(10), || {
        matches!(a.get("/healthz"), Some((503, _)))
    })
    .and_then(|_| a.get("/healthz"))
    .unwrap_or_else(|| panic!("/healthz stayed healthy:\n{}", a.log()));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("exprot.sh"), "/healthz names the job: {body}");
    let (_, metrics) = a.get("/metrics").expect("metrics");
    let failures: f64 = metrics
        .lines()
        .find(|l| l.starts_with("leaderd_child_start_failures_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no leaderd_child_start_failures_total:\n{metrics}"));
    assert!(failures >= 1.0, "{failures}");

    // b has a job that works: it takes over once a gives the lease up (one
    // lease of failures, L = 2 s here), not never.
    let b_file = env.path("b.ran");
    let b = env.start(
        "b",
        &[],
        &[],
        &as_refs(&sh(r#"touch "$0"; exec sleep 1000"#, &b_file)),
    );
    wait_until(Duration::from_secs(20), || b.is_leader())
        .unwrap_or_else(|| panic!("a never gave the lease up:\n{}", a.log()));
    wait_until(Duration::from_secs(10), || b_file.exists()).expect("b's job runs");
    assert!(!a.is_leader());
}

/// A job that keeps crashing makes `/healthz` fail (like a container in
/// CrashLoopBackOff), while `restart` keeps trying.
#[test]
fn a_crash_looping_job_fails_healthz() {
    let env = Env::new();
    let a = env.start(
        "a",
        &["--on-child-exit", "restart"],
        &[],
        &["sh", "-c", "exit 3"],
    );
    wait_until(Duration::from_secs(20), || {
        matches!(a.get("/healthz"), Some((503, _)))
    })
    .unwrap_or_else(|| panic!("/healthz stayed healthy:\n{}", a.log()));
    let (_, body) = a.get("/healthz").expect("healthz");
    assert!(body.contains("exited with code 3"), "{body}");
}
