//! The HTTP API of a running daemon (DESIGN §4, §5): errors as JSON, resign
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
