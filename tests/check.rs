//! `leaderd check`, run as users run it: one line per item, exit 0 when
//! `leaderd run` would work and 1 when something fails.
//!
//! - Under IAM enforced by moto's server mode: the shipped runtime policy
//!   passes; a policy without each action `run` (or `check`) needs fails,
//!   naming that action and the fix.
//! - On DynamoDB Local: a table with the wrong key, a missing table, an
//!   endpoint nobody listens on, each named with exit 1; a clock an hour
//!   off (libfaketime) is a warning only.
//! - On SQLite: a directory the user cannot write to, timings without
//!   margin, an HTTP address in use, each named with exit 1; `--json`.
//! - Every time: no scratch record is left in the table or file (read
//!   raw, not through `leaderd status`, which hides them), and the record
//!   of an election a lock holds is exactly as it was.

use crate::common;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use common::daemon::{leaderd_bin, output_within};
use common::emulators::{self, AccessKey, Emulator, IAM_USER_SETUP_REQUESTS};

/// How long one `leaderd` command may take: moto is slow, and the machine
/// is shared.
const LIMIT: Duration = Duration::from_secs(90);

type Item = HashMap<String, AttributeValue>;

/// `leaderd ARGS…` with `env`, run to its end, in `dir`.
fn leaderd(args: &[&str], env: &[(String, String)], dir: &Path) -> Output {
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .current_dir(dir);
    let (out, ended) = output_within(&mut cmd, LIMIT);
    assert!(ended, "leaderd {args:?} did not end within {LIMIT:?}");
    out
}

/// What a run printed, for failure messages.
fn said(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The report's item lines of `status` (`ok`, `warn`, `fail`).
fn lines<'a>(out: &'a str, status: &str) -> Vec<&'a str> {
    let prefix = format!("{status:<4}  ");
    out.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// `out` failed (exit 1) on exactly one item, `item`, and the line says
/// `needles`.
fn assert_fails_on(out: &Output, item: &str, needles: &[&str]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", said(out));
    let failed = lines(&stdout, "fail");
    assert_eq!(failed.len(), 1, "one failed item expected:\n{}", said(out));
    assert!(
        failed[0].starts_with(&format!("fail  {item}: ")),
        "the failed item should be {item}:\n{}",
        said(out)
    );
    for needle in needles {
        assert!(
            failed[0].contains(needle),
            "{needle:?} missing:\n{}",
            said(out)
        );
    }
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("check: 1 of ")),
        "{}",
        said(out)
    );
}

/// `out` passed: exit 0, no failed item.
fn assert_passes(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", said(out));
    assert!(lines(&stdout, "fail").is_empty(), "{}", said(out));
    assert!(
        stdout.contains("`leaderd run` would work here"),
        "{}",
        said(out)
    );
}

/// A client of `endpoint` with `key`'s credentials (else the fake ones).
async fn client(endpoint: &str, key: Option<&AccessKey>) -> Client {
    emulators::fake_aws_env();
    let (id, secret) = key.map_or(("leaderdtest", "leaderdtest"), |k| {
        (k.id.as_str(), k.secret.as_str())
    });
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(id, secret, None, None, "test"))
        .http_client(leaderd::lease::dynamodb::https_client())
        .build();
    Client::from_conf(config)
}

/// Every item of `table`, raw.
async fn scan(client: &Client, table: &str) -> Vec<Item> {
    let out = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "scan {table}: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        });
    assert!(
        out.last_evaluated_key.is_none(),
        "a test table fits one page"
    );
    out.items.unwrap_or_default()
}

/// The item of `key` among `items`.
fn item<'a>(items: &'a [Item], key: &str) -> Option<&'a Item> {
    items
        .iter()
        .find(|i| i.get("election") == Some(&AttributeValue::S(key.to_owned())))
}

/// No key of `items` is a scratch record's.
fn assert_no_scratch(items: &[Item]) {
    let scratch: Vec<&AttributeValue> = items
        .iter()
        .filter_map(|i| i.get("election"))
        .filter(|k| matches!(k, AttributeValue::S(s) if s.starts_with("#check/")))
        .collect();
    assert!(
        scratch.is_empty(),
        "scratch records left behind: {scratch:?}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a runtime")
}

// ------------------------------------------------------------------ IAM

/// A shipped policy file, its resources widened to `*` (moto authorises
/// DynamoDB calls against `*`), without the actions in `without`.
fn policy(file: &str, without: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/iam")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut doc: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let statements = doc["Statement"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("{} has no Statement list", path.display()));
    for statement in statements.iter_mut() {
        statement["Resource"] = "*".into();
        let actions = statement["Action"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("{}: an Action that is not a list", path.display()));
        actions.retain(|a| !without.iter().any(|w| a.as_str() == Some(w)));
    }
    // A statement left with no action is no statement.
    statements.retain(|s| s["Action"].as_array().is_some_and(|a| !a.is_empty()));
    doc.to_string()
}

/// Under moto with IAM enforced: the shipped runtime policy passes; a
/// policy without each action that `run` with the configured features
/// (or `check` itself) needs fails on exactly that action, naming the fix;
/// no scratch record is ever left, and the record of an election a lock
/// holds is untouched.
#[test]
fn each_missing_permission_is_named_and_the_shipped_policy_passes() {
    const RUNTIME: &str = "leaderd-policy.json";
    const CREATE: &str = "leaderd-policy-with-create.json";
    // (user, policy, extra flags or settings, the action its check must
    // name; None: it passes).
    let cases: Vec<(&str, String, Vec<&str>, Option<&str>)> = vec![
        ("runtime", policy(RUNTIME, &[]), vec![], None),
        (
            "balancer",
            policy(RUNTIME, &[]),
            vec!["--balance", "--no-sessions"],
            None,
        ),
        ("creator", policy(CREATE, &[]), vec!["create"], None),
        (
            "no-describe",
            policy(RUNTIME, &["dynamodb:DescribeTable"]),
            vec![],
            Some("dynamodb:DescribeTable"),
        ),
        (
            "no-get",
            policy(RUNTIME, &["dynamodb:GetItem"]),
            vec![],
            Some("dynamodb:GetItem"),
        ),
        (
            "no-put",
            policy(RUNTIME, &["dynamodb:PutItem"]),
            vec![],
            Some("dynamodb:PutItem"),
        ),
        (
            "no-batch",
            policy(RUNTIME, &["dynamodb:BatchGetItem"]),
            vec![],
            Some("dynamodb:BatchGetItem"),
        ),
        (
            "no-scan",
            policy(RUNTIME, &["dynamodb:Scan"]),
            vec!["--balance", "--no-sessions"],
            Some("dynamodb:Scan"),
        ),
        (
            "no-delete",
            policy(RUNTIME, &["dynamodb:DeleteItem"]),
            vec![],
            Some("dynamodb:DeleteItem"),
        ),
        // store.create_table = true: `run` calls CreateTable at each start.
        (
            "no-create",
            policy(RUNTIME, &[]),
            vec!["create"],
            Some("dynamodb:CreateTable"),
        ),
        (
            "create-no-ttl",
            policy(CREATE, &["dynamodb:DescribeTimeToLive"]),
            vec!["create"],
            Some("dynamodb:DescribeTimeToLive"),
        ),
    ];
    let unchecked = IAM_USER_SETUP_REQUESTS * u32::try_from(cases.len()).expect("a few users");
    let moto = emulators::moto(unchecked);
    let keys: Vec<AccessKey> = cases
        .iter()
        .map(|(name, doc, _, _)| moto.create_iam_user(name, doc))
        .collect();
    let (runtime_key, creator_key) = (&keys[0], &keys[2]);
    let table = common::unique_name("check");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = [
        "--store",
        "dynamodb",
        "--endpoint-url",
        &moto.endpoint,
        "--table",
        &table,
        "--region",
        "us-east-1",
    ];
    let run = |args: &[&str], key: &AccessKey, extra_env: &[(String, String)]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(store);
        let mut env = key.env();
        env.extend(extra_env.iter().cloned());
        leaderd(&all, &env, dir.path())
    };
    let created = run(&["table", "create", "--ttl"], creator_key, &[]);
    assert!(
        created.status.success(),
        "{}\n{}",
        said(&created),
        moto.log()
    );
    // An election's record, held by a lock: no check may touch it.
    let token = run(&["lock", "acquire", "deploy"], runtime_key, &[]);
    assert!(token.status.success(), "{}\n{}", said(&token), moto.log());

    let rt = runtime();
    let raw = rt.block_on(client(&moto.endpoint, Some(creator_key)));
    let before = rt.block_on(scan(&raw, &table));
    let deploy = item(&before, "deploy").expect("the lock's record").clone();

    for ((name, _, extra, names), key) in cases.iter().zip(&keys) {
        let mut args = vec!["check", "--listen", "127.0.0.1:0", "--election", "deploy"];
        let mut env = vec![];
        for flag in extra {
            if *flag == "create" {
                env.push(("LEADERD_STORE__CREATE_TABLE".to_owned(), "true".to_owned()));
            } else {
                args.push(flag);
            }
        }
        let out = run(&args, key, &env);
        match names {
            None => assert_passes(&out),
            Some(action) => {
                assert_fails_on(&out, action, &[&format!("add {action} to the IAM policy")])
            }
        }
        let after = rt.block_on(scan(&raw, &table));
        assert_no_scratch(&after);
        assert_eq!(
            item(&after, "deploy"),
            Some(&deploy),
            "{name}: the election's record changed\n{}",
            said(&out)
        );
        eprintln!(
            "{name}: {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
}

// --------------------------------------------------------- DynamoDB Local

fn local() -> &'static Emulator {
    emulators::fake_aws_env();
    emulators::shared_dynamodb_local()
}

fn dynamodb_args<'a>(endpoint: &'a str, table: &'a str) -> Vec<&'a str> {
    vec![
        "check",
        "--store",
        "dynamodb",
        "--endpoint-url",
        endpoint,
        "--table",
        table,
        "--region",
        "us-east-1",
        "--listen",
        "127.0.0.1:0",
    ]
}

async fn create_table(client: &Client, table: &str, key: &str) {
    client
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
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("name and type are set"),
        )
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "create {table}: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        });
}

/// A table leaderd can use passes, and is left as it was; a table keyed
/// otherwise, a missing table and an endpoint nobody listens on each fail
/// on one item that says what to do.
#[test]
fn the_table_is_checked_and_left_as_it_was() {
    let emulator = local();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = runtime();
    let raw = rt.block_on(client(&emulator.endpoint, None));

    let good = common::unique_name("check");
    let mut create = vec!["table", "create"];
    let store = dynamodb_args(&emulator.endpoint, &good);
    create.extend(&store[1..store.len() - 2]);
    let out = leaderd(&create, &[], dir.path());
    assert!(out.status.success(), "{}", said(&out));
    let mut lock = vec!["lock", "acquire", "deploy"];
    lock.extend(&store[1..store.len() - 2]);
    let out = leaderd(&lock, &[], dir.path());
    assert!(out.status.success(), "{}", said(&out));
    let before = rt.block_on(scan(&raw, &good));

    let mut args = store.clone();
    args.extend(["--election", "deploy"]);
    let out = leaderd(&args, &[], dir.path());
    assert_passes(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for item in [
        "ok    region: us-east-1",
        "ok    table: ",
        "ok    dynamodb:PutItem: created the scratch record #check/",
        "ok    dynamodb:GetItem: ",
        "ok    dynamodb:BatchGetItem: ",
        "ok    dynamodb:DeleteItem: deleted it",
        "ok    clock: within 1s",
        "ok    http: 127.0.0.1:0 is free",
    ] {
        assert!(stdout.contains(item), "{item:?} missing:\n{}", said(&out));
    }
    assert_eq!(rt.block_on(scan(&raw, &good)), before, "the table changed");

    let wrong = common::unique_name("check");
    rt.block_on(create_table(&raw, &wrong, "id"));
    let out = leaderd(&dynamodb_args(&emulator.endpoint, &wrong), &[], dir.path());
    assert_fails_on(
        &out,
        "table",
        &["wrong schema", "`id`", "fix: use another table"],
    );

    let missing = common::unique_name("check");
    let out = leaderd(
        &dynamodb_args(&emulator.endpoint, &missing),
        &[],
        dir.path(),
    );
    assert_fails_on(&out, "table", &["does not exist", "leaderd table create"]);

    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let out = leaderd(&dynamodb_args(&nowhere, &good), &[], dir.path());
    assert_fails_on(
        &out,
        "store",
        &["unreachable", "fix: check store.endpoint_url"],
    );
}

/// This host's clock an hour ahead of the store's (libfaketime, with the
/// monotonic clock left alone): a warning naming the clock, not a failure.
#[test]
fn a_clock_an_hour_off_is_a_warning() {
    let emulator = local();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let table = common::unique_name("check");
    let args = dynamodb_args(&emulator.endpoint, &table);
    let mut create = vec!["table", "create"];
    create.extend(&args[1..args.len() - 2]);
    let out = leaderd(&create, &[], dir.path());
    assert!(out.status.success(), "{}", said(&out));
    let shifted = [
        (
            "LD_PRELOAD".to_owned(),
            crate::cluster::libfaketime().display().to_string(),
        ),
        ("FAKETIME".to_owned(), "+1h".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
    ];
    let out = leaderd(&args, &shifted, dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let clock = lines(&stdout, "warn")
        .into_iter()
        .find(|l| l.starts_with("warn  clock: "))
        .unwrap_or_else(|| panic!("no clock warning:\n{}", said(&out)));
    assert!(
        clock.contains("ahead")
            && clock.contains("59m")
            && clock.contains("fix: sync this host's clock"),
        "{clock}"
    );
    assert!(lines(&stdout, "fail").is_empty(), "{}", said(&out));
}

// ------------------------------------------------------------------ SQLite

/// The effective user id of this process (the owner of `/proc/self`).
fn euid() -> u32 {
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

/// A directory the user `leaderd check` runs as cannot write to: the store
/// fails, saying to make it writable. As root (who may write anywhere),
/// leaderd runs as `nobody`.
#[test]
fn an_unwritable_directory_fails_the_store() {
    let outer = tempfile::tempdir().expect("a temporary directory");
    let locked = outer.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let db = locked.join("leaderd.db");
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(["check", "--listen", "127.0.0.1:0", "--store-path"])
        .arg(&db)
        .current_dir(outer.path());
    if euid() == 0 {
        cmd.uid(65534).gid(65534);
    }
    let (out, ended) = output_within(&mut cmd, LIMIT);
    assert!(ended, "check did not end");
    assert_fails_on(&out, "store", &["fix: make", "writable"]);
    let left: Vec<_> = std::fs::read_dir(&locked).expect("read dir").collect();
    assert!(left.is_empty(), "{left:?}");
}

/// An existing SQLite file with an election's record: the check passes,
/// leaves no scratch row, and leaves the election's row as it was.
#[test]
fn a_sqlite_file_is_checked_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("leases.db");
    let db_arg = db.to_str().expect("utf-8 temp path");
    let out = leaderd(
        &["lock", "acquire", "deploy", "--store-path", db_arg],
        &[],
        dir.path(),
    );
    assert!(out.status.success(), "{}", said(&out));
    let rows = || -> Vec<(String, Option<String>)> {
        let conn = rusqlite::Connection::open(&db).expect("open");
        let mut stmt = conn
            .prepare("SELECT election, rvn FROM leases ORDER BY election")
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .expect("rows")
    };
    let before = rows();
    let out = leaderd(
        &[
            "check",
            "--store-path",
            db_arg,
            "--election",
            "deploy",
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
        dir.path(),
    );
    assert_passes(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for item in [
        "ok    store: SQLite file",
        "ok    write: created the scratch record #check/",
        "ok    batch read: ",
        "ok    delete: deleted it",
    ] {
        assert!(stdout.contains(item), "{item:?} missing:\n{}", said(&out));
    }
    assert_eq!(rows(), before, "the file's rows changed");
    // No file besides the store's own is left.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("check"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// Timings without margin (R + G + M + L·D ≥ L) fail on the timing item,
/// with the values; the store and the HTTP address are still checked; the
/// JSON says the same.
#[test]
fn timings_without_margin_fail_and_the_rest_is_still_checked() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = [
        "check",
        "--lease-duration",
        "2s",
        "--renew-interval",
        "1500ms",
        "--listen",
        "127.0.0.1:0",
    ];
    let out = leaderd(&args, &[], dir.path());
    assert_fails_on(
        &out,
        "timing lease.duration",
        &["R + G + M + L·D", "3s 720ms", "fix: lengthen the lease"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok    store: SQLite file"),
        "{}",
        said(&out)
    );

    let mut json = args.to_vec();
    json.push("--json");
    let out = leaderd(&json, &[], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", said(&out)));
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["failed"], 1);
    let items = doc["items"].as_array().expect("items");
    let timing = items
        .iter()
        .find(|i| i["status"] == "fail")
        .expect("the failed item");
    assert_eq!(timing["item"], "timing lease.duration");
    assert!(
        timing["fix"]
            .as_str()
            .is_some_and(|f| f.contains("R + G + M + L·D < L"))
    );

    // With a margin: every derived value, in the JSON too.
    let out = leaderd(
        &["check", "--listen", "127.0.0.1:0", "--json"],
        &[],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["ok"], true);
    let timing = doc["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["item"] == "timing")
        .expect("the timing item");
    for (key, value) in [
        ("lease_ms", 10_000),
        ("renew_interval_ms", 5_000),
        ("retry_interval_ms", 1_000),
        ("kill_grace_ms", 2_000),
        ("safety_margin_ms", 200),
        ("margin_sum_ms", 7_300),
        ("spare_ms", 2_700),
        ("validity_ms", 9_700),
        ("takeover_wait_ms", 10_100),
    ] {
        assert_eq!(timing["values"][key], value, "{key}: {timing}");
    }
}

/// The HTTP listen address in use fails the `http` item.
#[test]
fn a_listen_address_in_use_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address").to_string();
    let out = leaderd(&["check", "--listen", &addr], &[], dir.path());
    assert_fails_on(&out, "http", &["in use", "fix: stop what listens there"]);
}

/// A SQLite file whose `leases` table another tool made: the store fails,
/// naming the missing columns, and nothing is tried (or written) on it.
#[test]
fn a_foreign_sqlite_table_fails_the_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("foreign.db");
    rusqlite::Connection::open(&db)
        .and_then(|c| c.execute_batch("CREATE TABLE leases (id INTEGER PRIMARY KEY);"))
        .expect("a foreign table");
    let db_arg = db.to_str().expect("utf-8 temp path");
    let out = leaderd(
        &["check", "--store-path", db_arg, "--listen", "127.0.0.1:0"],
        &[],
        dir.path(),
    );
    assert_fails_on(
        &out,
        "store",
        &[
            "missing column",
            "fix: set store.path (--store-path) to another file",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("scratch"), "{}", said(&out));
    let rows: i64 = rusqlite::Connection::open(&db)
        .and_then(|c| c.query_row("SELECT count(*) FROM leases", [], |r| r.get(0)))
        .expect("count");
    assert_eq!(rows, 0);
}
