//! The record `format` with real processes, on SQLite and on DynamoDB
//! Local: a record of format 4 (as a later release writes it) whose
//! holder's lease ended long ago is never taken by `leaderd run`, whatever
//! time passes; `/leader` reports the format and the holder, the warning is
//! logged once and counted; `leaderd lock` waits on it or refuses it,
//! naming the format; `leaderd status` shows it; and the item is exactly as
//! planted afterwards.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, short_lease_args, wait_until};
use leaderd::lease::dynamodb::{DynamoConfig, DynamoStore};

/// The election the later release holds.
const ELECTION: &str = "e";
/// Its holder, and the token that holder's `leaderd lock` would print
/// (fencing token 41, rvn `laterrvn1`, the holder in hex).
const HOLDER: &str = "later-release";
const TOKEN: &str = "41.laterrvn1.6c617465722d72656c65617365";

/// Where the planted record lives, and how to read it raw.
enum Planted {
    Sqlite(std::path::PathBuf),
    Dynamo {
        rt: tokio::runtime::Runtime,
        store: DynamoStore,
    },
}

/// The attributes of the planted record: a lease of 1 s that ended in 2020.
fn attributes() -> Vec<(&'static str, AttributeValue)> {
    let n = |v: u64| AttributeValue::N(v.to_string());
    vec![
        ("election", AttributeValue::S(ELECTION.into())),
        ("holder", AttributeValue::S(HOLDER.into())),
        ("rvn", AttributeValue::S("laterrvn1".into())),
        ("fencing_token", n(41)),
        ("lease_ms", n(1_000)),
        ("acquired_at", n(1_600_000_000_000)),
        ("renewed_at", n(1_600_000_000_000)),
        ("expires_at", n(1_600_000_001)),
        ("format", n(4)),
    ]
}

impl Planted {
    /// A new SQLite file in `dir` with the record in it; the store's
    /// arguments.
    fn sqlite(dir: &Path) -> (Planted, Vec<String>) {
        let db = dir.join("leases.db");
        leaderd::lease::sqlite::SqliteStore::open(&db).expect("create the store");
        let conn = rusqlite::Connection::open(&db).expect("open the file");
        let (names, values): (Vec<_>, Vec<_>) = attributes()
            .into_iter()
            .map(|(name, v)| {
                let value = match v {
                    AttributeValue::S(s) => rusqlite::types::Value::Text(s),
                    AttributeValue::N(n) => rusqlite::types::Value::Integer(n.parse().unwrap()),
                    other => unreachable!("{other:?}"),
                };
                (name, value)
            })
            .unzip();
        let sql = format!(
            "INSERT INTO leases ({}) VALUES ({})",
            names.join(", "),
            vec!["?"; names.len()].join(", ")
        );
        conn.execute(&sql, rusqlite::params_from_iter(values))
            .expect("plant the row");
        let args = vec!["--store-path".into(), db.display().to_string()];
        (Planted::Sqlite(db), args)
    }

    /// A new table on the shared DynamoDB Local with the item in it; the
    /// store's arguments.
    fn dynamodb() -> (Planted, Vec<String>) {
        common::emulators::fake_aws_env();
        let emulator = common::emulators::shared_dynamodb_local();
        let table = common::unique_name("format");
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        let store = rt.block_on(async {
            let store = DynamoStore::new(&DynamoConfig {
                table: table.clone(),
                region: "us-east-1".into(),
                endpoint_url: Some(emulator.endpoint.clone()),
            })
            .await;
            store
                .create_table(false, Duration::from_secs(60))
                .await
                .expect("create the table");
            let item = attributes()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<HashMap<_, _>>();
            store
                .client()
                .put_item()
                .table_name(&table)
                .set_item(Some(item))
                .send()
                .await
                .expect("plant the item");
            store
        });
        let args = [
            "--store",
            "dynamodb",
            "--endpoint-url",
            &emulator.endpoint,
            "--table",
            &table,
            "--region",
            "us-east-1",
        ]
        .map(String::from)
        .to_vec();
        (Planted::Dynamo { rt, store }, args)
    }

    /// The record exactly as stored, every attribute with its type.
    fn raw(&self) -> String {
        match self {
            Planted::Sqlite(db) => {
                let conn = rusqlite::Connection::open(db).expect("open the file");
                let mut stmt = conn
                    .prepare("SELECT * FROM leases WHERE election = ?1")
                    .expect("prepare");
                let row = stmt
                    .query_row([ELECTION], |r| {
                        (0..r.as_ref().column_count())
                            .map(|i| r.get::<_, rusqlite::types::Value>(i))
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .expect("the row");
                format!("{row:?}")
            }
            Planted::Dynamo { rt, store } => rt.block_on(async {
                let out = store
                    .client()
                    .get_item()
                    .table_name(store.table())
                    .key("election", AttributeValue::S(ELECTION.into()))
                    .consistent_read(true)
                    .send()
                    .await
                    .expect("read the item");
                let mut item: Vec<_> = out.item().expect("the item").iter().collect();
                item.sort_by_key(|(k, _)| k.as_str());
                format!("{item:?}")
            }),
        }
    }
}

/// `leaderd ARGS… STORE-ARGS`, run to its end.
fn leaderd(args: &[&str], store: &[String]) -> Output {
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(args)
        .args(store)
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let (out, ended) = output_within(&mut cmd, Duration::from_secs(60));
    assert!(ended, "leaderd {args:?} did not end");
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// The daemon leaves the record alone and says why.
fn daemon_leaves_it_alone(dir: &Path, store: &[String]) {
    let mut args = store.to_vec();
    args.extend(short_lease_args(ELECTION));
    let node = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![],
        command: vec![],
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    wait_until(Duration::from_secs(10), || {
        node.leader()
            .is_some_and(|(_, b)| b["unknown_format"] == "4")
    })
    .expect("/leader reports the unknown format");
    // More than two leases of this daemon (2 s) and of the record (1 s).
    std::thread::sleep(Duration::from_secs(5));
    let (status, body) = node.leader().expect("/leader answers");
    assert_eq!(status, 503, "led over an unknown format: {body}");
    assert_eq!(body["leader"], HOLDER, "{body}");
    assert_eq!(body["fencing_token"], 41, "{body}");
    assert_eq!(body["unknown_format"], "4", "{body}");
    let (_, status) = node.get("/status").expect("/status answers");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(status["elections"][ELECTION]["unknown_format"], "4");
    let series = format!("leaderd_unknown_format_records_total{{election=\"{ELECTION}\"}}");
    assert_eq!(node.metric(&series), Some(1.0));
    let log = node.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains("lease record has format 4"))
        .collect::<Vec<_>>();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("knows formats 1, 2 and 3") && warnings[0].contains("upgrade"),
        "{}",
        warnings[0]
    );
}

/// `leaderd lock` and `leaderd status` on the record.
fn tools_leave_it_alone(store: &[String]) {
    let out = leaderd(&["lock", "acquire", ELECTION, "--no-wait"], store);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{said}");
    assert!(
        said.contains("format 4") && said.contains(HOLDER) && said.contains("not acquired"),
        "{said}"
    );
    // Waiting: one line naming the format, however many rounds.
    let out = leaderd(&["lock", "acquire", ELECTION, "--wait", "2s"], store);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{said}");
    let waiting: Vec<_> = said.lines().filter(|l| l.contains("waiting")).collect();
    assert_eq!(waiting.len(), 1, "{said}");
    assert!(waiting[0].contains("format 4"), "{said}");
    for action in ["renew", "release"] {
        let out = leaderd(&["lock", action, ELECTION, TOKEN], store);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(77), "{action}: {said}");
        assert!(said.contains("format 4"), "{action}: {said}");
    }
    let out = leaderd(&["status", ELECTION], store);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("unknown_format (format 4"), "{text}");
    assert!(text.contains(HOLDER), "{text}");
    let out = leaderd(&["status", ELECTION, "--json"], store);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(rows[0]["state"], "unknown_format", "{rows}");
    assert_eq!(rows[0]["format"], "4", "{rows}");
}

fn a_later_format_is_never_taken(planted: Planted, store: Vec<String>, dir: &Path) {
    let before = planted.raw();
    daemon_leaves_it_alone(dir, &store);
    tools_leave_it_alone(&store);
    assert_eq!(planted.raw(), before, "the record changed");
}

#[test]
fn sqlite_a_record_of_a_later_format_is_never_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (planted, store) = Planted::sqlite(dir.path());
    a_later_format_is_never_taken(planted, store, dir.path());
}

#[test]
fn dynamodb_a_record_of_a_later_format_is_never_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (planted, store) = Planted::dynamodb();
    a_later_format_is_never_taken(planted, store, dir.path());
}
