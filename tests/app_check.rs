//! The app check with real processes on SQLite: an instance campaigns only
//! while the app next to it answers its check. A leader whose app fails
//! hands over; when every app fails nobody leads and no job runs; an instance
//! whose app fails from the start never leads, even when the leader dies; a
//! check that hangs fails after its timeout and never delays a renewal. The
//! jobs write a shared history that the checker proves free of overlap. A
//! command probe leaves no process behind: not after each probe, not after
//! leaderd ends mid-probe. Command probes pass on exit 0 and fail otherwise.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::app::App;
use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, wait_until};
use common::procfs;
use nix::sys::signal::Signal;

/// L = 4 s, R = 2 s, P = 500 ms, G = 500 ms.
const TIMING: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--renew-interval",
    "2s",
    "--retry-interval",
    "500ms",
    "--kill-grace",
    "500ms",
];
const L: Duration = Duration::from_secs(4);
const R: Duration = Duration::from_secs(2);
const P: Duration = Duration::from_millis(500);
/// The app check: every 500 ms, 300 ms timeout, 2 failures to fail, 1 pass
/// to pass.
const INTERVAL: Duration = Duration::from_millis(500);
const FAILURES: u32 = 2;
const SUCCESSES: u32 = 1;

/// How long a change of the app's health may take to move leadership.
fn failing_bound() -> Duration {
    INTERVAL * FAILURES + Duration::from_secs(2)
}

fn passing_bound() -> Duration {
    INTERVAL * SUCCESSES + Duration::from_secs(2)
}

fn job(history: &Path) -> Vec<String> {
    common::job_command(history)
}

/// An instance on `db` with its app check on `app`; `failures` is its
/// failure threshold.
fn start(dir: &Path, id: &str, db: &Path, app: &App, failures: u32, history: &Path) -> Leaderd {
    let mut args: Vec<String> = vec![
        "--store-path".into(),
        db.display().to_string(),
        "--election".into(),
        "job".into(),
        "--app-check".into(),
        app.url(),
    ];
    args.extend(TIMING.iter().map(|s| s.to_string()));
    let node = Leaderd::start(Spec {
        identity: id,
        args,
        env: vec![
            ("LEADERD_APP_CHECK__INTERVAL".into(), "500ms".into()),
            ("LEADERD_APP_CHECK__TIMEOUT".into(), "300ms".into()),
            (
                "LEADERD_APP_CHECK__FAILURE_THRESHOLD".into(),
                failures.to_string(),
            ),
            (
                "LEADERD_APP_CHECK__SUCCESS_THRESHOLD".into(),
                SUCCESSES.to_string(),
            ),
        ],
        command: job(history),
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    node
}

/// The `app_check` field of `/leader`.
fn app_check(node: &Leaderd) -> Option<String> {
    let (_, body) = node.leader()?;
    body["app_check"].as_str().map(str::to_owned)
}

/// A sample of a metric without labels, or labelled by `election="job"`.
fn metric(node: &Leaderd, name: &str) -> Option<f64> {
    node.metric(name)
        .or_else(|| node.metric(&format!("{name}{{election=\"job\"}}")))
}

fn check_history(history: &Path) -> common::history::Summary {
    let log = std::fs::read_to_string(history).unwrap_or_default();
    common::history::check(&log).unwrap_or_else(|v| panic!("{v}\n{log}"))
}

/// Waits (up to 10 s) until the history holds `n` tenures. A job's first
/// line may take a moment on a busy machine (the job is a Python script),
/// and a tenure ended before its job wrote a line leaves no trace: so each
/// tenure is seen in the history before the test ends it. (If it never
/// comes, the test's assertion on the history shows it.)
fn wait_for_tenures(history: &Path, n: usize) {
    let _ = wait_until(Duration::from_secs(10), || {
        // The jobs run: their last line may be on its way.
        let log = std::fs::read_to_string(history).unwrap_or_default();
        let summary = common::history::check(common::history::complete_lines(&log));
        summary
            .unwrap_or_else(|v| panic!("{v}\n{log}"))
            .tenures
            .len()
            >= n
    });
}

#[test]
fn a_leader_whose_app_fails_hands_over_nobody_leads_while_all_fail_and_it_leads_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let history = dir.path().join("history.log");
    let app_a = App::start(dir.path(), "app-a", "ok");
    let app_b = App::start(dir.path(), "app-b", "ok");
    let a = start(dir.path(), "a", &db, &app_a, FAILURES, &history);
    wait_until(Duration::from_secs(15), || a.is_leader())
        .unwrap_or_else(|| panic!("a does not lead; log:\n{}", a.log()));
    assert_eq!(app_check(&a).as_deref(), Some("pass"));
    wait_for_tenures(&history, 1);
    let b = start(dir.path(), "b", &db, &app_b, FAILURES, &history);
    wait_until(Duration::from_secs(10), || {
        app_check(&b).as_deref() == Some("pass")
    })
    .expect("b's app check passes");
    assert!(!b.is_leader(), "b must not take a held lease");

    // a's app fails: b leads.
    app_a.set("fail");
    let took = wait_until(failing_bound(), || b.is_leader()).unwrap_or_else(|| {
        panic!(
            "b does not lead within {:?} of a's app failing;\na:\n{}\nb:\n{}",
            failing_bound(),
            a.log(),
            b.log()
        )
    });
    eprintln!("a's app failed -> b leads after {took:?}");
    assert!(!a.is_leader());
    assert_eq!(app_check(&a).as_deref(), Some("fail"));
    assert_eq!(metric(&a, "leaderd_app_check_up"), Some(0.0));
    assert!(metric(&a, "leaderd_app_check_failures_total").unwrap_or(0.0) >= f64::from(FAILURES));
    wait_for_tenures(&history, 2);

    // Both fail: nobody leads, no job runs, for a while.
    app_b.set("fail");
    wait_until(failing_bound(), || !a.is_leader() && !b.is_leader())
        .unwrap_or_else(|| panic!("b still leads with its app failing; log:\n{}", b.log()));
    wait_until(Duration::from_secs(5), || {
        metric(&a, "leaderd_child_running") == Some(0.0)
            && metric(&b, "leaderd_child_running") == Some(0.0)
    })
    .expect("no job runs");
    let quiet_from = Instant::now();
    while quiet_from.elapsed() < L {
        assert!(
            !a.is_leader() && !b.is_leader(),
            "someone leads with every app failing"
        );
        for node in [&a, &b] {
            let (status, _) = node.get("/leader").expect("answers");
            assert_eq!(status, 503);
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // a's app is healthy again: a leads.
    app_a.set("ok");
    let took = wait_until(passing_bound(), || a.is_leader()).unwrap_or_else(|| {
        panic!(
            "a does not lead within {:?} of its app passing; log:\n{}",
            passing_bound(),
            a.log()
        )
    });
    eprintln!("a's app passes again -> a leads after {took:?}");
    wait_until(Duration::from_secs(5), || {
        metric(&a, "leaderd_child_running") == Some(1.0)
    })
    .expect("a's job runs");
    wait_for_tenures(&history, 3);
    std::thread::sleep(Duration::from_millis(300));

    let summary = check_history(&history);
    let leaders: Vec<&str> = summary
        .tenures
        .iter()
        .map(|t| t.id.identity.as_str())
        .collect();
    assert_eq!(leaders, ["a", "b", "a"], "{summary:?}");
}

#[test]
fn an_instance_whose_app_fails_from_the_start_never_leads_even_when_the_leader_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let history = dir.path().join("history.log");
    let app_a = App::start(dir.path(), "app-a", "ok");
    let app_b = App::start(dir.path(), "app-b", "fail");
    let mut a = start(dir.path(), "a", &db, &app_a, FAILURES, &history);
    wait_until(Duration::from_secs(15), || a.is_leader()).expect("a leads");
    let b = start(dir.path(), "b", &db, &app_b, FAILURES, &history);
    wait_until(Duration::from_secs(10), || {
        app_check(&b).as_deref() == Some("fail")
    })
    .unwrap_or_else(|| panic!("b's app check does not fail; log:\n{}", b.log()));

    a.kill9();
    // Well past the takeover wait L·(1 + D) + P: b would have taken it.
    let watch = L.mul_f64(1.01) + P + Duration::from_secs(3);
    let from = Instant::now();
    while from.elapsed() < watch {
        assert!(
            !b.is_leader(),
            "b leads although its app fails; log:\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(metric(&b, "leaderd_child_running"), Some(0.0));

    // Only the check held it back.
    app_b.set("ok");
    wait_until(passing_bound(), || b.is_leader())
        .unwrap_or_else(|| panic!("b does not lead once its app passes; log:\n{}", b.log()));
    wait_until(Duration::from_secs(5), || {
        metric(&b, "leaderd_child_running") == Some(1.0)
    })
    .expect("b's job runs");
    std::thread::sleep(Duration::from_millis(300));
    check_history(&history);
}

#[test]
fn a_check_that_hangs_never_delays_a_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let history = dir.path().join("history.log");
    let app = App::start(dir.path(), "app", "ok");
    // A threshold that the watch below never reaches: the leader keeps the
    // lease while every probe hangs until its timeout.
    let a = start(dir.path(), "a", &db, &app, 1000, &history);
    wait_until(Duration::from_secs(15), || a.is_leader()).expect("a leads");
    app.set("hang");
    let failures_before = metric(&a, "leaderd_app_check_failures_total").unwrap_or(0.0);
    let from = Instant::now();
    let mut least = Duration::MAX;
    while from.elapsed() < 3 * R {
        let (status, body) = a.leader().expect("/leader answers");
        assert_eq!(status, 200, "{body}");
        least = least.min(Duration::from_millis(
            body["lease_remaining_ms"].as_u64().expect("ms"),
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    let failures = metric(&a, "leaderd_app_check_failures_total").unwrap_or(0.0) - failures_before;
    eprintln!("while the check hung: {failures} failed probes, least lease remaining {least:?}");
    assert!(
        failures >= 3.0,
        "the hanging probes fail after their timeout: {failures}"
    );
    // Renewed every R on time: the validity left never falls below L - R - P.
    assert!(
        least >= L - R - P,
        "least lease remaining {least:?}: a renewal was late"
    );
    check_history(&history);
}

#[test]
fn a_check_that_hangs_fails_after_its_timeout_and_the_leader_steps_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let history = dir.path().join("history.log");
    let app = App::start(dir.path(), "app", "ok");
    let a = start(dir.path(), "a", &db, &app, FAILURES, &history);
    wait_until(Duration::from_secs(15), || a.is_leader()).expect("a leads");
    app.set("hang");
    wait_until(failing_bound(), || !a.is_leader())
        .unwrap_or_else(|| panic!("a still leads with its check hanging; log:\n{}", a.log()));
    assert_eq!(app_check(&a).as_deref(), Some("fail"));
    wait_until(Duration::from_secs(5), || {
        metric(&a, "leaderd_child_running") == Some(0.0)
    })
    .expect("the job is stopped");
    let log = a.log();
    assert!(log.contains("no answer within 300ms"), "{log}");
    let summary = check_history(&history);
    assert!(
        summary.ends >= 1,
        "the job was stopped with its stop signal: {summary:?}"
    );
}

/// Flags, environment, and what the one-line error must say.
type Case = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Bad `[app_check]` values are one-line configuration errors (exit 64).
#[test]
fn bad_app_check_settings_are_config_errors() {
    let cases: [Case; 9] = [
        (
            &["--app-check", "https://127.0.0.1/healthz"],
            &[],
            "app_check.http = \"https://127.0.0.1/healthz\" (from --app-check)",
        ),
        (
            &["--app-check", "127.0.0.1:8080"],
            &[],
            "not an http:// URL",
        ),
        (&["--app-check", "http:///healthz"], &[], "app_check.http"),
        (
            &[],
            &[("LEADERD_APP_CHECK__TCP", "localhost")],
            "app_check.tcp",
        ),
        (
            &[],
            &[("LEADERD_APP_CHECK__COMMAND", "[]")],
            "app_check.command",
        ),
        (
            &["--app-check", "http://127.0.0.1:1/"],
            &[("LEADERD_APP_CHECK__FAILURE_THRESHOLD", "0")],
            "app_check.failure_threshold = 0 must be between 1 and 1000",
        ),
        (
            &["--app-check", "http://127.0.0.1:1/"],
            &[("LEADERD_APP_CHECK__INTERVAL", "5ms")],
            "app_check.interval",
        ),
        (&[], &[("LEADERD_APP_CHECK__INTERVAL", "2s")], "no probe is"),
        (
            &["--app-check", "http://127.0.0.1:1/"],
            &[("LEADERD_APP_CHECK__TCP", "127.0.0.1:1")],
            "only one app check probe",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (flags, env, expected) in cases {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(["run", "--listen", "127.0.0.1:0", "--store-path"])
            .arg(dir.path().join("leases.db"))
            .args(flags)
            .envs(env.iter().copied())
            .args(["--", "true"]);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(ended, "{flags:?} {env:?}: leaderd kept running");
        assert_eq!(out.status.code(), Some(64), "{flags:?} {env:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?} {env:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{flags:?} {env:?}: {stderr}"
        );
    }
}

/// A `sleep` argument no other process has: a number of seconds just above
/// a minute (so a process a broken build leaks ends soon) whose digits are
/// this test's own.
fn marker() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    format!("60.{}{nanos:09}", std::process::id())
}

/// An instance on SQLite that probes with `command` every 200 ms (its
/// timeout `timeout`); no job.
fn start_with_command_probe(dir: &Path, id: &str, command: &[&str], timeout: &str) -> Leaderd {
    let command = serde_json::to_string(command).expect("JSON array");
    let mut args = vec![
        "--store-path".to_owned(),
        dir.join("leases.db").display().to_string(),
        "--election".to_owned(),
        "job".to_owned(),
    ];
    args.extend(TIMING.iter().map(|s| s.to_string()));
    let node = Leaderd::start(Spec {
        identity: id,
        args,
        env: vec![
            ("LEADERD_APP_CHECK__COMMAND".into(), command),
            ("LEADERD_APP_CHECK__INTERVAL".into(), "200ms".into()),
            ("LEADERD_APP_CHECK__TIMEOUT".into(), timeout.into()),
            ("LEADERD_APP_CHECK__FAILURE_THRESHOLD".into(), "1".into()),
        ],
        command: vec![],
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    node
}

/// `sh -c 'sleep M & exit 0'`: the probe passes, and what it started in the
/// background is killed with its process group after every probe, so at
/// most the one of the probe under way lives; none outlives leaderd.
#[test]
fn a_command_probe_leaves_no_process_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = marker();
    let script = format!("sleep {m} & exit 0");
    let mut node = start_with_command_probe(dir.path(), "a", &["sh", "-c", &script], "1s");
    wait_until(Duration::from_secs(10), || {
        app_check(&node).as_deref() == Some("pass")
    })
    .unwrap_or_else(|| panic!("the check does not pass; log:\n{}", node.log()));
    // 2 s at 200 ms: ten probes, each of which left its `sleep` running
    // before the fix.
    let from = Instant::now();
    let mut most = 0;
    while from.elapsed() < Duration::from_secs(2) {
        most = most.max(procfs::with_arg(&m).len());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("at most {most} `sleep {m}` alive at once while probing");
    assert!(
        most <= 1,
        "{most} background processes of the probes alive at once; log:\n{}",
        node.log()
    );
    assert_eq!(app_check(&node).as_deref(), Some("pass"), "still passing");
    node.signal(Signal::SIGTERM);
    node.wait_exit(Duration::from_secs(20))
        .expect("leaderd exits on SIGTERM");
    let left = wait_until(Duration::from_secs(2), || procfs::with_arg(&m).is_empty());
    assert!(
        left.is_some(),
        "left behind after leaderd exited: {:?}",
        procfs::with_arg(&m)
    );
}

/// A probe under way (`sh -c 'sleep M & exec sleep M'`, timeout 30 s) when
/// leaderd ends, by SIGTERM and by SIGKILL: none of its processes outlives
/// leaderd.
#[test]
fn a_command_probe_under_way_dies_with_leaderd() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (round, signal) in [Signal::SIGTERM, Signal::SIGKILL].into_iter().enumerate() {
        let m = marker();
        let script = format!("sleep {m} & exec sleep {m}");
        let id = format!("n{round}");
        let mut node = start_with_command_probe(dir.path(), &id, &["sh", "-c", &script], "30s");
        wait_until(Duration::from_secs(10), || procfs::with_arg(&m).len() == 2)
            .unwrap_or_else(|| panic!("{signal}: the probe does not run; log:\n{}", node.log()));
        assert_eq!(app_check(&node).as_deref(), Some("unknown"), "{signal}");
        node.signal(signal);
        node.wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{signal}: leaderd does not exit"));
        let left = wait_until(Duration::from_secs(2), || procfs::with_arg(&m).is_empty());
        assert!(
            left.is_some(),
            "{signal}: the probe outlived leaderd: {:?}; log:\n{}",
            procfs::with_arg(&m),
            node.log()
        );
    }
}

/// A command probe passes on exit 0 and fails on any other end, saying
/// how it ended; a command that cannot start fails saying why.
#[test]
fn a_command_probe_passes_on_exit_0_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str, &str); 3] = [
        (&["true"], "pass", ""),
        (&["sh", "-c", "exit 3"], "fail", "exit code 3"),
        (&["./no-such-check"], "fail", "cannot run ./no-such-check"),
    ];
    for (round, (command, verdict, says)) in cases.into_iter().enumerate() {
        let id = format!("c{round}");
        let node = start_with_command_probe(dir.path(), &id, command, "1s");
        wait_until(Duration::from_secs(10), || {
            app_check(&node).as_deref() == Some(verdict)
        })
        .unwrap_or_else(|| panic!("{command:?}: not {verdict}; log:\n{}", node.log()));
        assert!(
            node.log().contains(says),
            "{command:?}: log:\n{}",
            node.log()
        );
    }
}

/// A command probe that hangs (`sh -c 'sleep M & exec sleep M'`) fails at
/// its timeout (300 ms) and is killed whole each time: never more than the
/// two processes of one probe alive, none after leaderd exits.
#[test]
fn a_command_probe_that_hangs_fails_at_its_timeout_and_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = marker();
    let script = format!("sleep {m} & exec sleep {m}");
    let mut node = start_with_command_probe(dir.path(), "h", &["sh", "-c", &script], "300ms");
    wait_until(Duration::from_secs(10), || {
        app_check(&node).as_deref() == Some("fail")
    })
    .unwrap_or_else(|| panic!("the check does not fail; log:\n{}", node.log()));
    let from = Instant::now();
    let mut most = 0;
    while from.elapsed() < Duration::from_secs(2) {
        most = most.max(procfs::with_arg(&m).len());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        (1..=2).contains(&most),
        "{most} processes of hanging probes alive at once"
    );
    assert!(
        node.log().contains("no answer within 300ms"),
        "{}",
        node.log()
    );
    node.signal(Signal::SIGTERM);
    node.wait_exit(Duration::from_secs(20))
        .expect("leaderd exits on SIGTERM");
    let left = wait_until(Duration::from_secs(2), || procfs::with_arg(&m).is_empty());
    assert!(left.is_some(), "left behind: {:?}", procfs::with_arg(&m));
}
