//! The HTTP API of a running daemon: errors as JSON, resign
//! behind the admin token, `/metrics` accepted by promtool, and `leaderd
//! status --json` on DynamoDB Local.

use crate::common;

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
        common::daemon::open_files_limit(64),
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

/// One `HTTP/1.1` request with `Connection: close` and `body` (sent with
/// its `Content-Length`): `(status, content type, body)`, or `None` when the
/// server does not answer within 5 s.
fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<(u16, String, String)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    parse_answer(&raw)
}

/// `(status, content type, body)` of a raw HTTP/1.1 answer.
fn parse_answer(raw: &[u8]) -> Option<(u16, String, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Some((status, content_type, body.to_owned()))
}

/// Resign bodies that are JSON but not an object are 400 `bad_request` and
/// change nothing (serde would read `["b"]` as `{"to": "b"}`).
#[test]
fn resign_bodies_that_are_not_json_objects_are_400_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(dir.path(), "a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    let auth = [("Authorization", "Bearer s3cret")];
    for body in [r#"["b"]"#, r#""b""#, "null", "42", "[]", r#"{"to": ["b"]}"#] {
        let (status, content_type, text) =
            request(a.port, "POST", "/leader/web/resign", &auth, body.as_bytes())
                .expect("an answer");
        assert_eq!(status, 400, "{body}: {text}");
        assert_eq!(content_type, "application/json", "{body}: {text}");
        assert_eq!(json(&text)["error"], "bad_request", "{body}: {text}");
        assert!(a.is_leader(), "{body} made a step down:\n{}", a.log());
    }
    assert!(!a.log().contains("resign requested"), "{}", a.log());
}

/// A job that needs 3 s to stop after its stop signal, and says on stderr
/// (in leaderd's log) each time one comes.
const SLOW_TO_STOP: &str =
    "trap 'echo job: stop signal >&2; sleep 3; exit 0' TERM; while :; do sleep 0.1; done";

/// Where the leases of a test live.
#[derive(Debug, Clone, Copy)]
enum Store {
    /// A SQLite file in the test's directory.
    Sqlite,
    /// A table of its own in the shared DynamoDB Local.
    DynamoDbLocal,
}

impl Store {
    /// The arguments and environment that select this store.
    fn setup(self, dir: &std::path::Path) -> (Vec<String>, Vec<(String, String)>) {
        match self {
            Store::Sqlite => (
                vec![
                    "--store-path".into(),
                    dir.join("l.db").to_str().expect("utf-8 path").into(),
                ],
                vec![],
            ),
            Store::DynamoDbLocal => {
                let emulator = common::emulators::shared_dynamodb_local();
                (
                    vec![
                        "--store".into(),
                        "dynamodb".into(),
                        "--endpoint-url".into(),
                        emulator.endpoint.clone(),
                        "--table".into(),
                        common::unique_name("resign"),
                        "--region".into(),
                        "us-east-1".into(),
                    ],
                    vec![("LEADERD_STORE__CREATE_TABLE".into(), "true".into())],
                )
            }
        }
    }
}

/// An instance "a" with the admin token, leading election `web` and
/// running [`SLOW_TO_STOP`]. The lease (10 s) outlasts the job's stop: the
/// lease's own deadline never cuts it short.
fn leader_with_a_slow_job(dir: &std::path::Path, store: Store) -> Leaderd {
    let (mut args, mut env) = store.setup(dir);
    env.push(("LEADERD_HTTP__ADMIN_TOKEN".into(), "s3cret".into()));
    args.extend(
        [
            "--lease-duration",
            "10s",
            "--renew-interval",
            "2s",
            "--retry-interval",
            "250ms",
            "--election",
            "web",
        ]
        .map(String::from),
    );
    let a = Leaderd::start(Spec {
        identity: "a",
        args,
        env,
        command: vec!["sh".into(), "-c".into(), SLOW_TO_STOP.into()],
        dir,
    });
    wait_until(Duration::from_secs(20), || {
        a.is_leader() && a.log().contains("child started")
    })
    .unwrap_or_else(|| panic!("a does not lead with its job:\n{}", a.log()));
    a
}

/// `leaderd resign web --to TO` against `node`, started and left running.
fn resign_cli(node: &Leaderd, to: &str) -> std::process::Child {
    std::process::Command::new(common::daemon::leaderd_bin())
        .args(["resign", "web", "--to", to, "--url"])
        .arg(format!("http://127.0.0.1:{}", node.port))
        .env("LEADERD_HTTP__ADMIN_TOKEN", "s3cret")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start leaderd resign")
}

/// The exit code, stdout and stderr of a `leaderd resign` started by
/// [`resign_cli`]; it must end within 20 s.
fn resign_outcome(mut cli: std::process::Child) -> (Option<i32>, String, String) {
    wait_until(Duration::from_secs(20), || {
        matches!(cli.try_wait(), Ok(Some(_)))
    })
    .unwrap_or_else(|| {
        let _ = cli.kill();
        panic!("leaderd resign hung");
    });
    let out = cli.wait_with_output().expect("resign's output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until `node` is stopping its job for a resign.
fn wait_for_step_down(node: &Leaderd) {
    wait_until(Duration::from_secs(10), || {
        node.log()
            .contains("stopping the child before releasing the lease")
    })
    .unwrap_or_else(|| panic!("the resign did not start stopping the job:\n{}", node.log()));
}

/// SIGTERM while a resign waits for the job to stop: the resign is answered
/// (200: it stepped down as the daemon exited), its `to` is the successor
/// named by the release at exit, the job is not signalled twice, and the
/// daemon exits once the job is gone rather than after the HTTP drain
/// waiting for its own pending answer.
fn sigterm_during_a_resign_answers_it_keeps_its_successor_and_exits_with_the_job(store: Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = leader_with_a_slow_job(dir.path(), store);
    let cli = resign_cli(&a, "b");
    wait_for_step_down(&a);
    // The job's shell is in its trap by now: a second TERM would run the
    // trap again (another 3 s). The daemon sends none to a job it asked to
    // stop already.
    std::thread::sleep(Duration::from_millis(500));
    let sigterm = std::time::Instant::now();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a did not exit:\n{}", a.log()));
    let took = sigterm.elapsed();
    assert_eq!(status.code(), Some(0), "{}", a.log());
    let (code, stdout, stderr) = resign_outcome(cli);
    assert_eq!(code, Some(0), "stdout: {stdout} stderr: {stderr}");
    assert!(stdout.contains("shutting down"), "{stdout}");
    let log = a.log();
    assert_released_to(&log, "b");
    assert!(
        !log.contains("still open after the drain time"),
        "waited on its own resign:\n{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.trim() == "job: stop signal")
            .count(),
        1,
        "the job was signalled twice:\n{log}"
    );
    // The job needs 3 s from the resign's stop signal (2.5 s after the
    // SIGTERM); a second signal would add 3 s, the HTTP drain 5 s.
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM:\n{log}"
    );
}

#[test]
fn sigterm_during_a_resign_on_sqlite() {
    sigterm_during_a_resign_answers_it_keeps_its_successor_and_exits_with_the_job(Store::Sqlite);
}

#[test]
fn sigterm_during_a_resign_on_dynamodb_local() {
    sigterm_during_a_resign_answers_it_keeps_its_successor_and_exits_with_the_job(
        Store::DynamoDbLocal,
    );
}

/// A second resign while the first one waits for the job: the second is 409
/// `resign_in_progress` at once and changes nothing (the first one's `to`
/// wins); the first is answered 200 once the lease is released.
#[test]
fn a_second_resign_during_a_step_down_is_409_and_the_first_one_is_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = leader_with_a_slow_job(dir.path(), Store::Sqlite);
    let first = resign_cli(&a, "b");
    wait_for_step_down(&a);
    let (status, _, text) = request(
        a.port,
        "POST",
        "/leader/web/resign",
        &[("Authorization", "Bearer s3cret")],
        br#"{"to": "c"}"#,
    )
    .expect("an answer");
    assert_eq!(status, 409, "{text}");
    assert_eq!(json(&text)["error"], "resign_in_progress", "{text}");
    assert!(
        json(&text)["message"]
            .as_str()
            .unwrap_or("")
            .contains("`b`"),
        "{text}"
    );
    // The command line tool: 77, nothing changed.
    let (code, stdout, stderr) = resign_outcome(resign_cli(&a, "c"));
    assert_eq!(code, Some(77), "stdout: {stdout} stderr: {stderr}");

    let (code, stdout, stderr) = resign_outcome(first);
    assert_eq!(code, Some(0), "stdout: {stdout} stderr: {stderr}");
    assert_released_to(&a.log(), "b");
}

/// `log` tells of a release that named `successor`.
fn assert_released_to(log: &str, successor: &str) {
    let release = log
        .lines()
        .find(|l| l.contains("released the lease"))
        .unwrap_or_else(|| panic!("no release logged:\n{log}"));
    assert!(
        release.contains(&format!("successor=\"{successor}\"")),
        "{release}"
    );
}

/// Connections in the resign flood.
const FLOOD: usize = 200;
/// Each flood connection's chunked body: 2 MiB in 64 KiB chunks.
const FLOOD_CHUNK: usize = 64 * 1024;
const FLOOD_CHUNKS: usize = 32;
/// How far the daemon's resident memory may rise in a flood.
const FLOOD_RSS_SLACK_KIB: u64 = 20 * 1024;

/// `FLOOD` connections open at once, each sending a resign with `auth`
/// and a chunked 2 MiB body. Returns the answers read: `(status, content
/// type)`; a connection the server closed before its answer arrived has
/// none.
fn chunked_resign_flood(port: u16, auth: Option<&str>) -> Vec<(u16, String)> {
    use std::io::Read;
    use std::sync::{Arc, Barrier};
    let all_connected = Arc::new(Barrier::new(FLOOD));
    let mut head = "POST /leader/web/resign HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n".to_owned();
    if let Some(auth) = auth {
        head.push_str(&format!("Authorization: {auth}\r\n"));
    }
    head.push_str("\r\n");
    let mut chunk = format!("{FLOOD_CHUNK:x}\r\n").into_bytes();
    chunk.extend(std::iter::repeat_n(b' ', FLOOD_CHUNK));
    chunk.extend_from_slice(b"\r\n");
    let (head, chunk) = (Arc::new(head), Arc::new(chunk));
    let clients: Vec<_> = (0..FLOOD)
        .map(|_| {
            let (all_connected, head, chunk) = (all_connected.clone(), head.clone(), chunk.clone());
            std::thread::spawn(move || {
                let stream = std::net::TcpStream::connect(("127.0.0.1", port));
                all_connected.wait();
                let mut stream = stream.ok()?;
                stream
                    .set_write_timeout(Some(Duration::from_secs(10)))
                    .ok()?;
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .ok()?;
                // The server may answer and close at any point: write errors
                // end the sending, then the answer (if any) is read.
                let _ = (|| {
                    stream.write_all(head.as_bytes())?;
                    for _ in 0..FLOOD_CHUNKS {
                        stream.write_all(&chunk)?;
                    }
                    stream.write_all(b"0\r\n\r\n")
                })();
                let mut raw = Vec::new();
                let _ = stream.read_to_end(&mut raw);
                let (status, content_type, _) = parse_answer(&raw)?;
                Some((status, content_type))
            })
        })
        .collect();
    clients
        .into_iter()
        .filter_map(|c| c.join().expect("a flood client panicked"))
        .collect()
}

/// The daemon's resident memory in KiB: now, and its peak since `reset_peak`.
fn rss_kib(pid: i32) -> u64 {
    common::procfs::status_field(pid, "VmRSS").expect("VmRSS")
}

fn reset_peak_rss(pid: i32) {
    // 5: reset the peak resident set size (VmHWM) to the current one.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("cannot reset the peak RSS of {pid}: {e}"));
}

/// Run `chunked_resign_flood` against `node` and check its memory: the
/// peak during the flood and the resident size after it stay within
/// [`FLOOD_RSS_SLACK_KIB`] of where it started. Returns the answers.
fn flood_keeps_memory_flat(node: &Leaderd, auth: Option<&str>) -> Vec<(u16, String)> {
    let pid = node.pid();
    // Warm up: the first answers allocate what every later one reuses.
    for _ in 0..3 {
        let _ = node.get("/status");
        let _ = request(node.port, "POST", "/leader/web/resign", &[], b"");
    }
    let base = rss_kib(pid);
    reset_peak_rss(pid);
    let answers = chunked_resign_flood(node.port, auth);
    let peak = common::procfs::status_field(pid, "VmHWM").expect("VmHWM");
    let settled = wait_until(Duration::from_secs(5), || {
        rss_kib(pid) <= base + FLOOD_RSS_SLACK_KIB
    });
    let after = rss_kib(pid);
    eprintln!(
        "auth {auth:?}: RSS {base} KiB before, peak {peak} KiB, {after} KiB after; {} answers read",
        answers.len()
    );
    assert!(
        peak <= base + FLOOD_RSS_SLACK_KIB,
        "RSS peaked at {peak} KiB, from {base} KiB"
    );
    assert!(
        settled.is_some(),
        "RSS {after} KiB after the flood, from {base} KiB"
    );
    answers
}

/// 200 connections sending chunked 2 MiB resign bodies: without a token
/// nothing of the body is read (401 JSON); with the token it is cut off at
/// 64 KiB (413 JSON). Either way the daemon's memory stays flat, during and
/// after, and it keeps leading and answering.
#[test]
fn chunked_resign_floods_are_refused_before_the_body_and_keep_memory_flat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = start(dir.path(), "a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    for (auth, expected) in [(None, 401), (Some("Bearer s3cret"), 413)] {
        let answers = flood_keeps_memory_flat(&a, auth);
        for (status, content_type) in &answers {
            assert_eq!(
                (*status, content_type.as_str()),
                (expected, "application/json"),
                "auth {auth:?}"
            );
        }
        assert!(a.is_leader(), "{}", a.log());
    }
    // The answer to a body past the limit, read whole.
    let body = vec![b' '; 64 * 1024 + 1];
    let (status, content_type, text) = request(
        a.port,
        "POST",
        "/leader/web/resign",
        &[("Authorization", "Bearer s3cret")],
        &body,
    )
    .expect("an answer");
    assert_eq!((status, content_type.as_str()), (413, "application/json"));
    assert_eq!(json(&text)["error"], "payload_too_large");
}
