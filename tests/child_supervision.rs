//! `leaderd run -- COMMAND` with real processes on the SQLite store: the
//! child's start, environment, signals, exits and exit codes (DESIGN §3).

mod common;

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
    std::thread::sleep(Duration::from_millis(500));
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
