//! The HTTP API of a running daemon: errors as JSON, resign
//! behind the admin token, `/metrics` accepted by promtool, and `leaderd
//! status --json` on DynamoDB Local.

mod common;

use std::io::Write;
use std::time::Duration;

use common::daemon::{Leaderd, Spec, http, wait_until};

fn sqlite_args(db: &std::path::Path) -> Vec<String> {
    common::daemon::sqlite_short_args(db, "web")
}

fn start(dir: &std::path::Path, id: &str) -> Leaderd {
    let node = Leaderd::start(Spec {
        identity: id,
        args: sqlite_args(&dir.join("l.db")),
        env: vec![("LEADERD_HTTP__ADMIN_TOKEN".into(), "s3cret".into())],
        command: vec![],
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    node
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[test]
fn errors_are_json_and_resign_needs_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(dir.path(), "a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let b = start(dir.path(), "b");

    let (status, body) = a.get("/leader/nope").expect("answer");
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"], "unknown_election");
    let (status, body) = http(a.port, "DELETE", "/leader", &[]).expect("answer");
    assert_eq!(status, 405);
    assert_eq!(json(&body)["error"], "method_not_allowed");
    let (status, body) = a.get("/no/such/path").expect("answer");
    assert_eq!(status, 404);
    assert!(json(&body)["error"].is_string());
    let (status, body) = a.get("/leader/web").expect("answer");
    assert_eq!(status, 200, "{body}");

    // Without or with a wrong token: refused, nothing changes.
    let (status, _) = http(a.port, "POST", "/leader/web/resign", &[]).expect("answer");
    assert_eq!(status, 401);
    let (status, _) = http(
        a.port,
        "POST",
        "/leader/web/resign",
        &[("Authorization", "Bearer wrong")],
    )
    .expect("answer");
    assert_eq!(status, 403);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        a.is_leader() && !b.is_leader(),
        "a refused resign changed nothing"
    );

    // With the token: a steps down and b leads.
    let (status, body) = http(
        a.port,
        "POST",
        "/leader/web/resign",
        &[("Authorization", "Bearer s3cret")],
    )
    .expect("answer");
    assert!(status == 200 || status == 202, "{status} {body}");
    wait_until(Duration::from_secs(5), || b.is_leader()).expect("b leads after a resigned");
    assert!(!a.is_leader());
}

#[test]
fn live_metrics_pass_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(dir.path(), "a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    std::thread::sleep(Duration::from_millis(1_200));
    let (status, text) = a.get("/metrics").expect("metrics");
    assert_eq!(status, 200);
    for name in [
        "leaderd_is_leader{election=\"web\"} 1",
        "leaderd_fencing_token",
        "leaderd_lease_remaining_seconds",
        "leaderd_renew_total",
        "leaderd_store_request_duration_seconds",
        "leaderd_build_info",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool not found: install it with `apt-get install prometheus`");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn status_json_on_dynamodb_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    let emulator = common::emulators::shared_dynamodb_local();
    let table = common::unique_name("status");
    let store = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--store",
            "dynamodb",
            "--endpoint-url",
            emulator.endpoint.as_str(),
            "--table",
            table.as_str(),
            "--region",
            "us-east-1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let create = std::process::Command::new(common::daemon::leaderd_bin())
        .arg("table")
        .arg("create")
        .args(store(&[]))
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .output()
        .expect("table create");
    assert!(
        create.status.success(),
        "{}",
        String::from_utf8_lossy(&create.stderr)
    );
    assert!(String::from_utf8_lossy(&create.stdout).contains("ACTIVE"));
    let nodes: Vec<Leaderd> = ["one", "two"]
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let n = Leaderd::start(Spec {
                identity: id,
                args: store(&["--election", if i == 0 { "alpha" } else { "beta" }]),
                env: vec![],
                command: vec![],
                dir: dir.path(),
            });
            n.wait_http(Duration::from_secs(20));
            n
        })
        .collect();
    wait_until(Duration::from_secs(10), || {
        nodes.iter().all(|n| n.is_leader())
    })
    .expect("both lead");
    let out = std::process::Command::new(common::daemon::leaderd_bin())
        .arg("status")
        .args(store(&["--json"]))
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = json(&String::from_utf8_lossy(&out.stdout));
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, holder) in rows.iter().zip(["one", "two"]) {
        assert_eq!(row["holder"], holder, "{row}");
        assert!(row["fencing_token"].as_u64().is_some(), "{row}");
        assert!(row["age_ms"].as_u64().is_some_and(|a| a < 5_000), "{row}");
    }
}

/// Idle and half-sent connections are closed by the server, and a flood of
/// them under a small file-descriptor limit neither stops `/healthz` from
/// answering nor the job's guard from being started.
#[test]
fn idle_and_half_sent_connections_are_closed_and_never_starve_the_daemon() {
    use std::io::Read;
    use std::os::unix::process::CommandExt;

    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs");
    let script = format!("echo run >> {}; sleep 0.5", runs.display());
    let a = Leaderd::start_with(
        Spec {
            identity: "a",
            args: [
                sqlite_args(&dir.path().join("l.db")),
                vec!["--on-child-exit".into(), "restart".into()],
            ]
            .concat(),
            env: vec![],
            command: vec!["sh".into(), "-c".into(), script],
            dir: dir.path(),
        },
        |cmd| {
            // SAFETY: setrlimit is async-signal-safe and allocates nothing.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::resource::setrlimit(
                        nix::sys::resource::Resource::RLIMIT_NOFILE,
                        64,
                        64,
                    )
                    .map_err(std::io::Error::from)
                });
            }
        },
    );
    a.wait_http(Duration::from_secs(20));
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let count_runs = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_until(Duration::from_secs(10), || count_runs() >= 1).expect("the job runs");

    let mut flood = Vec::new();
    for i in 0..60 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", a.port)) {
            if i % 2 == 1 {
                // Half a request head, never finished.
                let _ = s.write_all(b"GET /leader HTTP/1.1\r\nHost: 127.0.0.1\r\n");
            }
            flood.push(s);
        }
    }
    let runs_at_flood = count_runs();
    wait_until(Duration::from_secs(30), || {
        matches!(a.get("/healthz"), Some((200, _)))
    })
    .unwrap_or_else(|| panic!("/healthz starved by idle connections:\n{}", a.log()));
    wait_until(Duration::from_secs(30), || count_runs() > runs_at_flood)
        .unwrap_or_else(|| panic!("the job was not restarted during the flood:\n{}", a.log()));
    // Every flood connection was closed by the server (end of file or reset),
    // none is still held open waiting.
    for mut s in flood {
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let mut answer = Vec::new();
        match s.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) => assert!(
                e.kind() == std::io::ErrorKind::ConnectionReset,
                "a flood connection is still open after 20 s: {e}"
            ),
        }
    }
}

/// Resign asked of an instance that does not lead: 409 `not_leader`, and it
/// changes nothing (no sit-out: it takes over as soon as the leader leaves).
#[test]
fn resign_on_a_follower_is_409_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = start(dir.path(), "a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let b = start(dir.path(), "b");
    let (status, body) = http(
        b.port,
        "POST",
        "/leader/web/resign",
        &[("Authorization", "Bearer s3cret")],
    )
    .expect("answer");
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["error"], "not_leader");
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(10)).expect("a exits");
    wait_until(Duration::from_secs(10), || b.is_leader()).expect("b leads");
    assert!(
        !b.log().contains("sitting out"),
        "a refused resign must not make b sit out:\n{}",
        b.log()
    );
}

/// Two elections on the command line and no primary named: the first is the
/// primary, `/leader` answers for it, and both lead.
#[test]
fn two_elections_without_a_primary_lead_and_leader_answers_for_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = common::daemon::sqlite_short_args(&dir.path().join("l.db"), "a");
    args.extend(["--election".to_owned(), "b".to_owned()]);
    let node = Leaderd::start(Spec {
        identity: "x",
        args,
        env: vec![],
        command: vec![],
        dir: dir.path(),
    });
    node.wait_http(Duration::from_secs(20));
    wait_until(Duration::from_secs(10), || node.is_leader())
        .unwrap_or_else(|| panic!("never led:\n{}", node.log()));
    let (status, body) = node.get("/leader").expect("answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["election"], "a", "{body}");
    wait_until(Duration::from_secs(10), || {
        matches!(node.get("/leader/b"), Some((200, _)))
    })
    .unwrap_or_else(|| panic!("b never led:\n{}", node.log()));
}
