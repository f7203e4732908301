//! `leaderd lock` with real processes, on SQLite, on DynamoDB Local and on
//! PostgreSQL:
//! acquire, renew and release; `--no-wait` on a held lock; a waiter that
//! takes a lock nobody renews only after its lease · (1 + D); a stale token
//! that neither renews nor releases the new holder's lock; a CLI lock and
//! `leaderd run` keeping each other out; a lock a daemon handed to a named
//! successor, which others wait one lease for; a waiter naming a daemon's
//! session lease, not the hundred years its election's record stores; a
//! token that cannot be written to stdout (a full disk, a closed pipe)
//! gives the lock up again; bad input as clear errors.

use crate::common;

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, wait_until};
use nix::sys::signal::Signal;

/// How a test reaches its store (`lock_slots` reaches it so too).
#[derive(Clone)]
pub(crate) struct Store {
    args: Vec<String>,
}

impl Store {
    pub(crate) fn sqlite(dir: &Path) -> Store {
        Store {
            args: vec![
                "--store-path".into(),
                dir.join("locks.db").display().to_string(),
            ],
        }
    }

    /// A fresh table on the shared DynamoDB Local.
    pub(crate) fn dynamodb() -> Store {
        let emulator = common::emulators::shared_dynamodb_local();
        let store = Store {
            args: vec![
                "--store".into(),
                "dynamodb".into(),
                "--endpoint-url".into(),
                emulator.endpoint.clone(),
                "--table".into(),
                common::unique_name("locks"),
                "--region".into(),
                "us-east-1".into(),
            ],
        };
        let out = store.leaderd(&["table", "create"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        store
    }

    /// A fresh table on the shared PostgreSQL server.
    pub(crate) fn postgres() -> Store {
        let table = common::unique_name("locks");
        let store = Store {
            args: common::postgres::shared_postgres().args(&table),
        };
        let out = store.leaderd(&["table", "create"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        store
    }

    /// `leaderd SUBCOMMAND… STORE-ARGS EXTRA…`, not started yet.
    pub(crate) fn command(&self, subcommand: &[&str], extra: &[&str]) -> Command {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(subcommand)
            .args(&self.args)
            .args(extra)
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        cmd
    }

    /// `leaderd SUBCOMMAND… STORE-ARGS EXTRA…`, run to its end (60 s at most).
    pub(crate) fn leaderd(&self, subcommand: &[&str], extra: &[&str]) -> Output {
        let mut cmd = self.command(subcommand, extra);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(60));
        assert!(ended, "leaderd {subcommand:?} did not end");
        out
    }

    pub(crate) fn lock(&self, action: &str, args: &[&str]) -> Output {
        self.leaderd(&["lock", action], args)
    }
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// `lock acquire`, expected to succeed: the token.
fn acquire(store: &Store, name: &str, extra: &[&str]) -> String {
    let mut args = vec![name];
    args.extend(extra);
    let out = store.lock("acquire", &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "acquire {name}: {}",
        stderr(&out)
    );
    let token = stdout(&out);
    assert!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "{token:?}"
    );
    token
}

fn status_json(store: &Store, name: &str) -> serde_json::Value {
    let out = store.lock("status", &[name, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status JSON");
    rows[0].clone()
}

fn holder(store: &Store, name: &str) -> Option<String> {
    status_json(store, name)["holder"]
        .as_str()
        .map(str::to_owned)
}

fn cycle(store: &Store) {
    let token = acquire(store, "deploy", &["--lease-duration", "15 minutes"]);
    let row = status_json(store, "deploy");
    assert!(row["holder"].is_string(), "{row}");
    // The fencing token is in the token, and in status.
    let fencing = row["fencing_token"].as_u64().expect("fencing token");
    assert!(
        token.starts_with(&format!("{fencing}.")),
        "{token} vs {row}"
    );

    let out = store.lock("acquire", &["deploy", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    // One line: who holds it, and that it was not acquired; --no-wait never
    // says it waits.
    let said = stderr(&out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("held by") && said.contains("not acquired"),
        "{said}"
    );
    assert!(!said.contains("waiting"), "{said}");

    let out = store.lock("renew", &["deploy", &token, "--lease-duration", "900s"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let renewed = stdout(&out);
    assert_ne!(renewed, token, "a renew gives a new token");
    assert_eq!(
        status_json(store, "deploy")["fencing_token"].as_u64(),
        Some(fencing),
        "same tenure"
    );

    let out = store.lock("release", &["deploy", &renewed]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(holder(store, "deploy"), None);
    // Released: free at once, with a higher fencing token.
    let again = acquire(store, "deploy", &["--no-wait"]);
    let next = status_json(store, "deploy")["fencing_token"]
        .as_u64()
        .expect("token");
    assert!(next > fencing, "{next} after {fencing}");
    let out = store.lock("release", &["deploy", &again]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn acquire_renew_release_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    cycle(&Store::sqlite(dir.path()));
}

#[test]
fn acquire_renew_release_on_dynamodb_local() {
    cycle(&Store::dynamodb());
}

#[test]
fn acquire_renew_release_on_postgres() {
    cycle(&Store::postgres());
}

/// A 3 s lock nobody renews: the waiter takes it after 3 s · (1 + 1 %) and
/// not before, and said who held it while it waited.
fn waiter_takes_an_expired_lock_only_after_its_lease(store: &Store) {
    let first = acquire(store, "nightly", &["--lease-duration", "3s"]);
    let started = Instant::now();
    let out = store.lock(
        "acquire",
        &["nightly", "--lease-duration", "3s", "--wait", "20s"],
    );
    let waited = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    eprintln!("the waiter took the 3 s lock after {waited:?}");
    assert!(
        waited >= Duration::from_millis(3030),
        "taken after {waited:?}: too early"
    );
    assert!(
        waited <= Duration::from_secs(5),
        "taken after {waited:?}: too late"
    );
    let said = stderr(&out);
    assert_eq!(said.matches("held by").count(), 1, "said once: {said}");
    let second = stdout(&out);

    // The first holder's token is stale: it neither renews nor releases.
    for action in ["renew", "release"] {
        let out = store.lock(action, &["nightly", &first]);
        assert_eq!(out.status.code(), Some(77), "{action}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("nothing was changed"),
            "{}",
            stderr(&out)
        );
    }
    let row = status_json(store, "nightly");
    assert!(row["holder"].is_string(), "still held: {row}");
    assert!(
        second.starts_with(&format!("{}.", row["fencing_token"])),
        "{second} vs {row}"
    );
    let out = store.lock("renew", &["nightly", &second]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_waiter_takes_an_expired_lock_only_after_its_lease_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    waiter_takes_an_expired_lock_only_after_its_lease(&Store::sqlite(dir.path()));
}

#[test]
fn a_waiter_takes_an_expired_lock_only_after_its_lease_on_dynamodb_local() {
    waiter_takes_an_expired_lock_only_after_its_lease(&Store::dynamodb());
}

#[test]
fn a_waiter_takes_an_expired_lock_only_after_its_lease_on_postgres() {
    waiter_takes_an_expired_lock_only_after_its_lease(&Store::postgres());
}

/// A CLI lock keeps `leaderd run` out, and the reverse.
fn lock_and_daemon_exclude_each_other(store: &Store, dir: &Path) {
    let token = acquire(store, "report", &["--lease-duration", "1m"]);
    let mut args = store.args.clone();
    args.extend(
        [
            "--lease-duration",
            "2s",
            "--retry-interval",
            "250ms",
            "--kill-grace",
            "500ms",
            "--election",
            "report",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let mut node = Leaderd::start(Spec {
        identity: "daemon",
        args,
        env: vec![],
        command: vec![],
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    let from = Instant::now();
    while from.elapsed() < Duration::from_secs(3) {
        assert!(!node.is_leader(), "the daemon leads a locked name");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = store.lock("release", &["report", &token]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(Duration::from_secs(5), || node.is_leader()).unwrap_or_else(|| {
        panic!(
            "the daemon does not lead once released; log:\n{}",
            node.log()
        )
    });

    // The daemon holds it: the CLI cannot take it.
    let out = store.lock("acquire", &["report", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("daemon"),
        "names the holder: {}",
        stderr(&out)
    );
    let out = store.lock("acquire", &["report", "--wait", "3s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "renewed all along: {}",
        stderr(&out)
    );
    // SIGTERM releases it: the CLI takes it at once.
    node.signal(Signal::SIGTERM);
    node.wait_exit(Duration::from_secs(20))
        .expect("the daemon exits");
    let token = acquire(store, "report", &["--no-wait"]);
    let out = store.lock("release", &["report", &token]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_cli_lock_and_the_daemon_exclude_each_other_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    lock_and_daemon_exclude_each_other(&Store::sqlite(dir.path()), dir.path());
}

#[test]
fn a_cli_lock_and_the_daemon_exclude_each_other_on_dynamodb_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    lock_and_daemon_exclude_each_other(&Store::dynamodb(), dir.path());
}

#[test]
fn a_cli_lock_and_the_daemon_exclude_each_other_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    lock_and_daemon_exclude_each_other(&Store::postgres(), dir.path());
}

fn bad_input(store: &Store) {
    let token = acquire(store, "tidy", &[]);
    let cases: [(&str, Vec<&str>, i32, &str); 14] = [
        (
            "renew",
            vec!["tidy", "not-a-token"],
            64,
            "is not a lock token",
        ),
        ("release", vec!["tidy", "1.2"], 64, "is not a lock token"),
        (
            "release",
            vec!["no-such-lock", &token],
            77,
            "there is no such lock",
        ),
        (
            "acquire",
            vec!["tidy", "--lease-duration=-5s"],
            64,
            "--lease-duration",
        ),
        (
            "acquire",
            vec!["tidy", "--lease-duration", "0s"],
            64,
            "must be above zero",
        ),
        (
            "acquire",
            vec!["tidy", "--no-wait", "--wait", "1s"],
            64,
            "cannot be used with",
        ),
        ("acquire", vec!["a/b", "--no-wait"], 64, "NAME"),
        // Under 10 ms a lease is stored as 0 ms, which anyone takes at once.
        (
            "acquire",
            vec!["tidy", "--no-wait", "--lease-duration", "500us"],
            64,
            "--lease-duration",
        ),
        (
            "acquire",
            vec!["tidy", "--no-wait", "--lease-duration", "1ns"],
            64,
            "shorter than the minimum of 10ms",
        ),
        (
            "renew",
            vec!["tidy", &token, "--lease-duration", "9ms"],
            64,
            "shorter than the minimum of 10ms",
        ),
        (
            "acquire",
            vec!["tidy", "--lease-duration", "25h"],
            64,
            "longer than the limit of 24h",
        ),
        // No election (so no lock) is named with `/` or `#`; member records
        // are never shown or taken.
        ("status", vec!["#member/Q"], 64, "\"#member/Q\""),
        ("release", vec!["#member/Q", &token], 64, "\"#member/Q\""),
        ("renew", vec!["a/b", &token], 64, "\"a/b\""),
    ];
    for (action, args, code, says) in cases {
        let out = store.lock(action, &args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{action} {args:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(says),
            "{action} {args:?}: {}",
            stderr(&out)
        );
    }
    // `leaderd status` checks the names it is given the same way.
    for name in ["a/b", "#member/Q"] {
        let out = store.leaderd(&["status", name], &[]);
        assert_eq!(
            out.status.code(),
            Some(64),
            "status {name}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "status {name}: {}", stdout(&out));
        let said = stderr(&out);
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.contains(&format!("{name:?}")) && said.contains("not a valid election name"),
            "{said}"
        );
    }
    // None of that touched the lock.
    let out = store.lock("release", &["tidy", &token]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn bad_input_is_a_clear_error_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    bad_input(&Store::sqlite(dir.path()));
}

#[test]
fn bad_input_is_a_clear_error_on_dynamodb_local() {
    bad_input(&Store::dynamodb());
}

#[test]
fn bad_input_is_a_clear_error_on_postgres() {
    bad_input(&Store::postgres());
}

/// A clock drift outside [0, 0.5) is refused before any waiting (it would
/// make the takeover wait meaningless).
#[test]
fn a_bad_clock_drift_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(["lock", "acquire", "drift", "--wait", "1s", "--store-path"])
        .arg(dir.path().join("locks.db"))
        .env("LEADERD_LEASE__MAX_CLOCK_DRIFT", "-5");
    let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
    assert!(ended);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lease.max_clock_drift"),
        "{}",
        stderr(&out)
    );
}

/// Where a command's stdout goes when it cannot be written.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sink {
    /// `/dev/full`: every write fails with ENOSPC.
    Full,
    /// A pipe whose reader is gone before anything is written: EPIPE.
    ClosedPipe,
}

/// Run `cmd` with its stdout on `sink`: (exit code, stderr).
pub(crate) fn run_into(mut cmd: Command, sink: Sink) -> (Option<i32>, String) {
    cmd.stdin(Stdio::null()).stderr(Stdio::piped());
    match sink {
        Sink::Full => cmd.stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("open /dev/full"),
        ),
        Sink::ClosedPipe => cmd.stdout(Stdio::piped()),
    };
    let mut child = cmd.spawn().expect("start leaderd");
    // Closed long before leaderd has read its configuration and the store.
    drop(child.stdout.take());
    let from = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if from.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("leaderd did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut said = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut said)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    (status.code(), said.trim().to_owned())
}

/// `acquire` and `renew` whose token cannot reach stdout: exit 74 with one
/// line that says so, and the lock is released again, so that someone else
/// takes it at once (not after the 15 minutes nobody could renew).
fn an_undeliverable_token_leaves_the_lock_free(store: &Store) {
    for sink in [Sink::Full, Sink::ClosedPipe] {
        let (code, said) = run_into(store.command(&["lock", "acquire", "gate"], &[]), sink);
        assert_eq!(code, Some(74), "acquire into {sink:?}: {said}");
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.contains("cannot write the token") && said.contains("released the lock again"),
            "{said}"
        );
        let taken = acquire(store, "gate", &["--no-wait"]);

        // A renew's new token lost: the old one is stale, so nobody could
        // renew or release the lock; it is released too.
        let (code, said) = run_into(store.command(&["lock", "renew", "gate", &taken], &[]), sink);
        assert_eq!(code, Some(74), "renew into {sink:?}: {said}");
        assert!(said.contains("released the lock again"), "{said}");
        assert_eq!(holder(store, "gate"), None, "renew into {sink:?}");
        let out = store.lock("renew", &["gate", &taken]);
        assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
        let again = acquire(store, "gate", &["--no-wait"]);
        let out = store.lock("release", &["gate", &again]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

#[test]
fn an_undeliverable_token_leaves_the_lock_free_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    an_undeliverable_token_leaves_the_lock_free(&Store::sqlite(dir.path()));
}

#[test]
fn an_undeliverable_token_leaves_the_lock_free_on_dynamodb_local() {
    an_undeliverable_token_leaves_the_lock_free(&Store::dynamodb());
}

#[test]
fn an_undeliverable_token_leaves_the_lock_free_on_postgres() {
    an_undeliverable_token_leaves_the_lock_free(&Store::postgres());
}

const ADMIN_TOKEN: &str = "lock-test-admin";

/// `leaderd run` for `election` on `store` with a 3 s lease, leading once
/// this returns.
fn leading_daemon(store: &Store, dir: &Path, election: &str) -> Leaderd {
    let mut args = store.args.clone();
    args.extend(
        [
            "--lease-duration",
            "3s",
            "--retry-interval",
            "250ms",
            "--kill-grace",
            "500ms",
            "--election",
            election,
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let node = Leaderd::start(Spec {
        identity: "daemon",
        args,
        env: vec![("LEADERD_HTTP__ADMIN_TOKEN".into(), ADMIN_TOKEN.into())],
        command: vec![],
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    wait_until(Duration::from_secs(10), || node.is_leader())
        .unwrap_or_else(|| panic!("the daemon does not lead; log:\n{}", node.log()));
    node
}

/// `leaderd resign ELECTION --to TO` against `node`, then stop `node`
/// (it does not lead any more: it writes nothing on its way out).
fn hand_over_and_stop(mut node: Leaderd, election: &str, to: &str) {
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(["resign", election, "--to", to, "--url"])
        .arg(format!("http://127.0.0.1:{}", node.port))
        .env("LEADERD_HTTP__ADMIN_TOKEN", ADMIN_TOKEN);
    let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
    assert!(ended, "leaderd resign hung");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    node.signal(Signal::SIGTERM);
    node.wait_exit(Duration::from_secs(20))
        .expect("the daemon exits");
}

/// A lock a daemon handed to a named successor (`resign --to`) follows the
/// daemon's rule: anyone else waits one lease (3 s · (1 + 1 %) on its own
/// clock) as if it were held, and `--no-wait` does not get it; the
/// successor itself (`LEADERD_IDENTITY`) takes it at once.
fn a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else(store: &Store, dir: &Path) {
    let node = leading_daemon(store, dir, "handed");
    hand_over_and_stop(node, "handed", "nobody");
    let row = status_json(store, "handed");
    assert_eq!(row["state"], "released", "{row}");
    let released_token = row["fencing_token"].as_u64().expect("fencing token");

    for _ in 0..2 {
        let out = store.lock("acquire", &["handed", "--no-wait"]);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(75), "{said}");
        assert!(said.contains("handed to nobody"), "{said}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let started = Instant::now();
    let out = store.lock("acquire", &["handed", "--wait", "30s"]);
    let waited = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    eprintln!("the waiter took the lock handed to nobody after {waited:?}");
    assert!(
        waited >= Duration::from_millis(3030),
        "taken after {waited:?}: before a lease passed"
    );
    assert!(
        waited <= Duration::from_secs(5),
        "taken after {waited:?}: too late"
    );
    let token = stdout(&out);
    assert!(
        token.starts_with(&format!("{}.", released_token + 1)),
        "{token}"
    );
    let out = store.lock("release", &["handed", &token]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Handed to B: B takes it at once.
    let node = leading_daemon(store, dir, "handed");
    hand_over_and_stop(node, "handed", "B");
    let mut cmd = store.command(&["lock", "acquire", "handed", "--no-wait"], &[]);
    cmd.env("LEADERD_IDENTITY", "B");
    let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
    assert!(ended);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(holder(store, "handed").as_deref(), Some("B"));
}

#[test]
fn a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else(
        &Store::sqlite(dir.path()),
        dir.path(),
    );
}

#[test]
fn a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else_on_dynamodb_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else(&Store::dynamodb(), dir.path());
}

#[test]
fn a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_lock_handed_to_a_successor_waits_a_lease_for_anyone_else(&Store::postgres(), dir.path());
}

/// A daemon holds its elections through its session (the default), whose
/// record carries the real lease; the election's own record says a hundred
/// years so that older builds never take it over. A waiter names the
/// holder with the session's lease (3 s), as `lock status` does, while it
/// waits and when it gives up.
#[test]
fn a_waiter_names_the_session_lease_of_a_daemon_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::sqlite(dir.path());
    let node = leading_daemon(&store, dir.path(), "nightly");
    let row = status_json(&store, "nightly");
    assert_eq!(
        row["session_state"], "live",
        "held through a session: {row}"
    );
    assert_eq!(row["lease_ms"], 3000, "{row}");
    for extra in [&["--wait", "2s"][..], &["--no-wait"][..]] {
        let mut args = vec!["nightly"];
        args.extend(extra);
        let out = store.lock("acquire", &args);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(75), "{extra:?}: {said}");
        assert!(
            said.contains("held by daemon") && said.contains("lease 3s"),
            "{extra:?}: {said}"
        );
        assert!(!said.contains("876600h"), "{extra:?}: {said}");
    }
    drop(node);
}
