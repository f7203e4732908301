//! PostgreSQL specifics that the cross-store contract suite
//! (`tests/store_contract.rs`) does not cover, with the real binary on a
//! real server (TLS on, verified against the test's CA): the table's SQL
//! and its creation, a daemon leading on it, `leaderd check`, and every
//! bad input a user can give it, each a clear exit code and one line that
//! names it, in bounded time: a malformed URL, a refused password, a
//! certificate that does not verify, a missing table, a table of another
//! shape, a role that may only read, and a standby.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::daemon::{leaderd_bin, output_within, short_lease_args};
use common::postgres::{PgServer, ROLE, shared_postgres};

/// Long enough for a loaded machine; a spinning command would hit it.
const LIMIT: Duration = Duration::from_secs(60);

/// `leaderd ARGS` with the environment `env`, to its end: exit code,
/// stdout, stderr.
fn leaderd(args: &[String], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let (out, ended) = output_within(
        Command::new(leaderd_bin())
            .args(args)
            .envs(env.iter().copied())
            .env_remove("PGPASSWORD"),
        LIMIT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        ended,
        "leaderd {args:?} did not end within {LIMIT:?}:\n{stderr}"
    );
    (out.status.code(), stdout, stderr)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// `leaderd run` once for election `e` (exits 75 unless it leads at once).
fn run_once(store_args: Vec<String>, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut args = strings(&["run", "--listen", "127.0.0.1:0", "--acquire-timeout", "0"]);
    args.extend(store_args);
    args.extend(short_lease_args("e"));
    args.extend(strings(&["--", "true"]));
    leaderd(&args, env)
}

fn table() -> String {
    common::unique_name("pg")
}

/// The store flags of `table` with `url` instead of the verified one.
fn with_url(server: &PgServer, table: &str, url: &str) -> Vec<String> {
    let mut args = server.args(table);
    let at = args
        .iter()
        .position(|a| a == "--store-url")
        .expect("the flags name the URL");
    args[at + 1] = url.to_owned();
    args
}

fn server() -> &'static PgServer {
    shared_postgres()
}

#[test]
fn the_table_is_created_as_printed_and_a_daemon_leads_on_it() {
    let server = server();
    // The SQL a DBA runs by hand: the table, then the grant for the role.
    let printed = table();
    let mut args = strings(&["table", "create", "--store", "postgres", "--print"]);
    args.extend(strings(&["--table", &printed]));
    let (code, sql, err) = leaderd(&args, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        sql.contains(&format!("CREATE TABLE IF NOT EXISTS \"{printed}\"")),
        "{sql}"
    );
    assert!(
        sql.contains(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON \"{printed}\" TO ROLE;"
        )),
        "{sql}"
    );
    server.psql(&sql.replace("TO ROLE", &format!("TO {}", ROLE.0)));
    let mut describe = strings(&["table", "describe"]);
    describe.extend(server.args(&printed));
    let (code, out, err) = leaderd(&describe, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("as leaderd needs"), "{out}");

    // `table create` twice: created, then found.
    let made = table();
    let mut create = strings(&["table", "create"]);
    create.extend(server.args(&made));
    for _ in 0..2 {
        let (code, out, err) = leaderd(&create, &[]);
        assert_eq!(code, Some(0), "{out}{err}");
    }

    // A daemon leads on it, over TLS verified against the test's CA, runs
    // its child and releases the lease at the end.
    let (code, _, err) = run_once(server.args(&made), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("PostgreSQL lease store"),
        "the replication settings are logged: {err}"
    );
    assert!(err.contains("synchronous_commit"), "{err}");
    let mut status = strings(&["status", "--json"]);
    status.extend(server.args(&made));
    let (code, out, err) = leaderd(&status, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"election\": \"e\""), "{out}");

    // store.create_table at start, and the password from a file.
    let dir = tempfile::tempdir().expect("a directory");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{}\n", ROLE.1)).expect("write the password");
    let url = format!(
        "postgres://{}@127.0.0.1:{}/leaderd?sslmode=verify-full",
        ROLE.0, server.port
    );
    let mut args = with_url(server, &table(), &url);
    args.extend(strings(&[
        "--store-password-file",
        pw.to_str().expect("UTF-8"),
    ]));
    let (code, _, err) = run_once(args, &[("LEADERD_STORE__CREATE_TABLE", "true")]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn leaderd_check_passes_and_names_what_a_read_only_role_lacks() {
    let server = server();
    let t = table();
    let mut create = strings(&["table", "create"]);
    create.extend(server.args(&t));
    let (code, _, err) = leaderd(&create, &[]);
    assert_eq!(code, Some(0), "{err}");
    let mut check = strings(&["check", "--listen", "127.0.0.1:0"]);
    check.extend(server.args(&t));
    let (code, out, err) = leaderd(&check, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    for says in [
        "ok    table:",
        "ok    write:",
        "ok    delete:",
        "ok    clock:",
    ] {
        assert!(out.contains(says), "{says}: {out}");
    }
    assert!(out.contains("clock_timestamp()"), "{out}");

    let reader = read_only_role(server, &t);
    let mut check = strings(&["check", "--listen", "127.0.0.1:0"]);
    check.extend(with_url(server, &t, &server.url_as(reader, "verify-full")));
    let (code, out, _) = leaderd(&check, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("lacks INSERT, UPDATE, DELETE"), "{out}");
    assert!(
        out.contains(&format!("TO {}", reader.0)),
        "the grant that fixes it: {out}"
    );
}

/// A role that may only read `table`.
fn read_only_role(server: &PgServer, table: &str) -> (&'static str, &'static str) {
    let role = ("leaderd_reader", "reader-test-password");
    server.psql_admin(&format!(
        "DO $$ BEGIN CREATE ROLE {} LOGIN PASSWORD '{}'; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        role.0, role.1
    ));
    server.psql(&format!("GRANT SELECT ON \"{table}\" TO {}", role.0));
    role
}

/// Every bad input: the exit code, the one line, and nothing spins.
#[test]
fn bad_input_is_a_clear_exit_code_and_one_line() {
    let server = server();
    let good = table();
    let mut create = strings(&["table", "create"]);
    create.extend(server.args(&good));
    let (code, _, err) = leaderd(&create, &[]);
    assert_eq!(code, Some(0), "{err}");

    // A malformed URL: a configuration error, without the password.
    let bad_url = format!(
        "postgres://leaderd:hunter2@127.0.0.1:{}x/leaderd",
        server.port
    );
    let (code, _, err) = run_once(with_url(server, &good, &bad_url), &[]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("store.url") && err.contains("not a valid PostgreSQL URL"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "the password is shown: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // A refused password.
    let wrong = server.url_as((ROLE.0, "not-the-password"), "verify-full");
    let (code, _, err) = run_once(with_url(server, &good, &wrong), &[]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");

    // A certificate that does not chain to the trusted CAs (the system's,
    // without the test's CA file): with fail_fast, 69 at start.
    let mut args = server.args(&good);
    let at = args
        .iter()
        .position(|a| a == "--store-ca-file")
        .expect("a CA flag");
    args.drain(at..at + 2);
    let (code, _, err) = run_once(args, &[("LEADERD_STORE__FAIL_FAST", "true")]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("certificate"), "{err}");

    // A missing table: 69 with fail_fast, naming it and how to create it.
    let missing = table();
    let (code, _, err) = run_once(
        server.args(&missing),
        &[("LEADERD_STORE__FAIL_FAST", "true")],
    );
    assert_eq!(code, Some(69), "{err}");
    assert!(
        err.contains(&format!("table `{missing}` does not exist")),
        "{err}"
    );
    let mut status = strings(&["status"]);
    status.extend(server.args(&missing));
    let (code, _, err) = leaderd(&status, &[]);
    assert_eq!(code, Some(69), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // Tables of another shape: a column of another type, another key.
    for (sql, says) in [
        (
            "(election text PRIMARY KEY, holder text, rvn text, fencing_token text, lease_ms bigint, \
             acquired_at bigint, renewed_at bigint, expires_at bigint, holder_meta jsonb, \
             successor text, format bigint, session text)",
            "column `fencing_token` is text, expected bigint",
        ),
        (
            "(id bigint PRIMARY KEY, election text)",
            "its primary key is (id), expected (election)",
        ),
    ] {
        let other = table();
        server.psql(&format!("CREATE TABLE \"{other}\" {sql}"));
        let (code, _, err) = run_once(server.args(&other), &[]);
        assert_eq!(code, Some(69), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        let mut status = strings(&["status"]);
        status.extend(server.args(&other));
        let (code, _, err) = leaderd(&status, &[]);
        assert_eq!(code, Some(69), "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }

    // A role that may only read: `run` is refused, naming the grant;
    // `status` needs no more.
    let reader = read_only_role(server, &good);
    let as_reader = with_url(server, &good, &server.url_as(reader, "verify-full"));
    let (code, _, err) = run_once(as_reader.clone(), &[]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("lacks INSERT, UPDATE, DELETE"), "{err}");
    assert!(
        err.contains(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {good:?} TO {}",
            reader.0
        )),
        "{err}"
    );
    let mut status = strings(&["status"]);
    status.extend(as_reader);
    let (code, _, err) = leaderd(&status, &[]);
    assert_eq!(code, Some(0), "{err}");
}

/// A standby made with pg_basebackup: refused at start (exit 69 naming
/// the recovery), by `run` and by `status` alike.
#[test]
fn a_standby_is_refused() {
    let primary = PgServer::start();
    let t = table();
    let mut create = strings(&["table", "create"]);
    create.extend(primary.args(&t));
    let (code, _, err) = leaderd(&create, &[]);
    assert_eq!(code, Some(0), "{err}");
    let standby = primary.standby();
    let (code, _, err) = run_once(standby.args(&t), &[]);
    assert_eq!(
        code,
        Some(69),
        "{err}\n--- the standby's log ---\n{}",
        standby.log()
    );
    assert!(
        err.contains("is in recovery") && err.contains("pg_is_in_recovery()"),
        "{err}"
    );
    assert!(
        err.contains(&format!("127.0.0.1:{}", standby.port)),
        "names the server: {err}"
    );
    let mut status = strings(&["status"]);
    status.extend(standby.args(&t));
    let (code, _, err) = leaderd(&status, &[]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("is in recovery"), "{err}");
    // The primary itself is fine.
    let (code, _, err) = run_once(primary.args(&t), &[]);
    assert_eq!(code, Some(0), "{err}");
}

/// Many instances creating the table at the same moment (every one started
/// with `store.create_table`): one creates it, the others find it; none
/// fails. PostgreSQL's own `CREATE TABLE IF NOT EXISTS` can fail the
/// others of such a race with a duplicate key.
#[test]
fn a_table_created_by_many_at_once_is_created_once() {
    let server = server();
    for _ in 0..10 {
        let t = table();
        let mut create = strings(&["table", "create"]);
        create.extend(server.args(&t));
        let racers: Vec<_> = (0..8)
            .map(|_| {
                Command::new(leaderd_bin())
                    .args(&create)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("start leaderd")
            })
            .collect();
        for racer in racers {
            let out = racer.wait_with_output().expect("wait for leaderd");
            assert!(
                out.status.success(),
                "a racing `table create` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
