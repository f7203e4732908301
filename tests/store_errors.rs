//! A store that refuses, with real processes: writes that keep failing with
//! an error (not a lost race) are retried with back-off and logged once per
//! change, never in a loop; a table whose schema is wrong is reported as
//! final.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, short_lease_args, wait_until};
use common::proxy::{Fault, FaultProxy};

/// How long the failing writes are watched, and the most that may happen in
/// that time for one election.
const WATCH: Duration = Duration::from_secs(10);
const MAX_REQUESTS: u64 = 15;
const MAX_LOG_LINES: usize = 15;

/// Lines logged so far.
fn log_lines(node: &Leaderd) -> usize {
    node.log().lines().count()
}

/// Watches `node` for [`WATCH`] while its writes fail: (log lines added, CPU
/// seconds used).
fn watch(node: &Leaderd) -> (usize, f64) {
    let lines0 = log_lines(node);
    let cpu0 = common::procfs::cpu_seconds(node.pid()).expect("leaderd's CPU time");
    std::thread::sleep(WATCH);
    let cpu = common::procfs::cpu_seconds(node.pid()).expect("leaderd's CPU time") - cpu0;
    (log_lines(node) - lines0, cpu)
}

/// The default timing (P = 1 s), one election.
fn default_timing() -> Vec<String> {
    vec!["--election".into(), "job".into()]
}

/// An IAM policy without `dynamodb:PutItem`: every acquisition is refused.
#[test]
fn refused_writes_on_dynamodb_back_off_and_log_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let emulator = common::emulators::shared_dynamodb_local();
    let proxy = FaultProxy::start(
        emulator
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("emulator endpoint is ip:port"),
    );
    let table = common::unique_name("refused");
    let mut args: Vec<String> = [
        "--store",
        "dynamodb",
        "--endpoint-url",
        &proxy.endpoint(),
        "--table",
        &table,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(default_timing());
    // leaderd may create its table; every PutItem is refused.
    proxy.set_for(&["PutItem"], Fault::AccessDenied);
    let node = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![("LEADERD_STORE__CREATE_TABLE".into(), "true".into())],
        command: vec![],
        dir: dir.path(),
    });
    wait_until(Duration::from_secs(30), || {
        proxy.counts().get("PutItem").copied().unwrap_or(0) >= 1
    })
    .expect("leaderd tries to acquire");
    std::thread::sleep(Duration::from_secs(2));
    proxy.clear_counts();
    let (lines, cpu) = watch(&node);
    let counts = proxy.counts();
    let requests: u64 = counts.values().sum();
    eprintln!("in {WATCH:?}: {counts:?}, {lines} log lines, {cpu:.2} CPU s");
    assert!(
        requests <= MAX_REQUESTS,
        "{requests} store requests in {WATCH:?}: {counts:?}\n{}",
        node.log()
    );
    assert!(
        lines <= MAX_LOG_LINES,
        "{lines} log lines in {WATCH:?}:\n{}",
        node.log()
    );
    assert!(cpu < 1.0, "{cpu:.2} CPU seconds in {WATCH:?}: not idle");
    assert!(!node.is_leader());
    let log = node.log();
    assert!(
        log.contains("AccessDeniedException"),
        "the error is logged:\n{log}"
    );

    // Permission restored: it leads, and says the errors are over.
    proxy.set_for(&["PutItem"], Fault::None);
    wait_until(Duration::from_secs(30), || node.is_leader()).expect("leads once writes work");
}

/// A SQLite file that refuses writes (here: a trigger of another tool that
/// aborts every insert).
#[test]
fn refused_writes_on_sqlite_back_off_and_log_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let db_arg = db.to_str().expect("utf-8 temp path").to_owned();
    // Let leaderd create its table first, then refuse every insert.
    common::daemon::create_sqlite_store(&db);
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON leases \
                 BEGIN SELECT RAISE(ABORT, 'writes refused by policy'); END;",
            )
        })
        .expect("add the trigger");
    let mut args = vec!["--store-path".to_string(), db_arg];
    args.extend(default_timing());
    let node = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![],
        command: vec![],
        dir: dir.path(),
    });
    std::thread::sleep(Duration::from_secs(2));
    let attempts = |node: &Leaderd| -> f64 {
        let (_, text) = node.get("/metrics").expect("metrics");
        text.lines()
            .filter(|l| l.starts_with("leaderd_store_request_duration_seconds_count{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = attempts(&node);
    let (lines, cpu) = watch(&node);
    let requests = attempts(&node) - before;
    eprintln!("in {WATCH:?}: {requests} store requests, {lines} log lines, {cpu:.2} CPU s");
    assert!(
        requests <= MAX_REQUESTS as f64,
        "{requests} store requests in {WATCH:?}:\n{}",
        node.log()
    );
    assert!(
        lines <= MAX_LOG_LINES,
        "{lines} log lines in {WATCH:?}:\n{}",
        node.log()
    );
    assert!(cpu < 1.0, "{cpu:.2} CPU seconds in {WATCH:?}: not idle");
    assert!(
        node.log().contains("writes refused by policy"),
        "{}",
        node.log()
    );
}

async fn create_table(endpoint: &str, table: &str, key: &str, ty: ScalarAttributeType) {
    common::emulators::fake_aws_env();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(leaderd::lease::dynamodb::https_client())
        .endpoint_url(endpoint)
        .load()
        .await;
    aws_sdk_dynamodb::Client::new(&config)
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .expect("name and key type are set"),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ty)
                .build()
                .expect("name and type are set"),
        )
        .send()
        .await
        .expect("create the table");
}

/// A table keyed `id`, or `election` of type N, never becomes usable: `run`
/// exits 69 with one line naming what is wrong (not "retrying" forever), and
/// `table describe` exits non-zero.
#[test]
fn a_table_with_the_wrong_key_is_final() {
    let emulator = common::emulators::shared_dynamodb_local();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for (key, ty) in [
        ("id", ScalarAttributeType::S),
        ("election", ScalarAttributeType::N),
    ] {
        let table = common::unique_name("wrongkey");
        runtime.block_on(create_table(&emulator.endpoint, &table, key, ty.clone()));
        let store = [
            "--store",
            "dynamodb",
            "--endpoint-url",
            &emulator.endpoint,
            "--region",
            "us-east-1",
            "--table",
            &table,
        ];
        let t0 = Instant::now();
        let (out, ended) = output_within(
            Command::new(leaderd_bin())
                .arg("run")
                .args(store)
                .args(short_lease_args("job"))
                .args(["--listen", "127.0.0.1:0"]),
            Duration::from_secs(30),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            ended,
            "key {key} ({ty:?}): still running after 30 s:\n{stderr}"
        );
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(errors.len(), 1, "one error line expected:\n{stderr}");
        assert!(
            errors[0].contains(&table) && errors[0].contains("key"),
            "{}",
            errors[0]
        );
        eprintln!("exit 69 after {:?}", t0.elapsed());

        let (out, _) = output_within(
            Command::new(leaderd_bin())
                .args(["table", "describe"])
                .args(store),
            Duration::from_secs(30),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_ne!(
            out.status.code(),
            Some(0),
            "describe of a wrong table: {stdout}"
        );
        assert!(stdout.contains("WRONG"), "{stdout}");
    }
}
