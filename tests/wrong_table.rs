//! The command-line tools on a DynamoDB table leaderd cannot use: keyed
//! `id`, keyed `election` of type N, or with a sort key added. Every
//! subcommand that reads or writes records (`status` with and without
//! names, `lock acquire` with and without `--no-wait`, `lock renew`,
//! `release`, `status`) exits 69 with one line naming the table and what is
//! wrong with its key, instead of listing another application's items,
//! printing an empty table, or waiting for a lock it can never take. On
//! DynamoDB Local and on dynalite.

use crate::common;

use std::process::Command;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use common::daemon::{leaderd_bin, output_within};
use common::emulators::Emulator;

/// One wrong table: its key attributes (name, type, HASH or RANGE), an
/// item of another application in it, and how the error describes the key.
struct WrongTable {
    keys: &'static [(&'static str, ScalarAttributeType, KeyType)],
    item: &'static [(&'static str, &'static str)],
    says: &'static str,
}

fn wrong_tables() -> [WrongTable; 3] {
    use ScalarAttributeType::{N, S};
    [
        WrongTable {
            keys: &[("id", S, KeyType::Hash)],
            item: &[("id", "order-17"), ("election", "nightly")],
            says: "key is `id` (S, HASH)",
        },
        WrongTable {
            keys: &[("election", N, KeyType::Hash)],
            item: &[("election", "42")],
            says: "key is `election` (N, HASH)",
        },
        WrongTable {
            keys: &[("election", S, KeyType::Hash), ("at", S, KeyType::Range)],
            item: &[("election", "nightly"), ("at", "2024-01-01")],
            says: "key is `election` (S, HASH) + `at` (S, RANGE)",
        },
    ]
}

/// Create `table` as `wrong` describes it on `emulator`, with its item.
async fn create(emulator: &Emulator, table: &str, wrong: &WrongTable) {
    common::emulators::fake_aws_env();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(leaderd::lease::dynamodb::https_client())
        .endpoint_url(&emulator.endpoint)
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let mut create = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest);
    for (name, ty, key_type) in wrong.keys {
        create = create
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*name)
                    .key_type(key_type.clone())
                    .build()
                    .expect("name and key type are set"),
            )
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(ty.clone())
                    .build()
                    .expect("name and type are set"),
            );
    }
    create.send().await.expect("create the table");
    // dynalite creates a table CREATING, then ACTIVE.
    for _ in 0..100 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .expect("describe the table");
        let status = described.table().and_then(|t| t.table_status());
        if status == Some(&aws_sdk_dynamodb::types::TableStatus::Active) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut put = client.put_item().table_name(table);
    for (name, value) in wrong.item {
        let is_number = wrong
            .keys
            .iter()
            .any(|(key, ty, _)| key == name && *ty == ScalarAttributeType::N);
        let value = if is_number {
            AttributeValue::N((*value).to_owned())
        } else {
            AttributeValue::S((*value).to_owned())
        };
        put = put.item(*name, value);
    }
    put.send().await.expect("put another application's item");
}

/// Every tool command on `table`: exit 69, one line naming the table and
/// what is wrong with its key.
fn every_command_refuses(emulator: &Emulator, table: &str, says: &str) {
    let store = [
        "--store",
        "dynamodb",
        "--endpoint-url",
        &emulator.endpoint,
        "--region",
        "us-east-1",
        "--table",
        table,
    ];
    let token = "1.abc.6869";
    let commands: [&[&str]; 8] = [
        &["status"],
        &["status", "nightly"],
        &["status", "--json"],
        &["lock", "acquire", "nightly", "--no-wait"],
        &["lock", "acquire", "nightly"],
        &["lock", "renew", "nightly", token],
        &["lock", "release", "nightly", token],
        &["lock", "status", "nightly"],
    ];
    // Every command is tried, and every one that fails is reported.
    let mut wrong = Vec::new();
    for command in commands {
        let (out, ended) = output_within(
            Command::new(leaderd_bin())
                .args(command)
                .args(store)
                .env("AWS_ACCESS_KEY_ID", "leaderdtest")
                .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
                .env("AWS_EC2_METADATA_DISABLED", "true"),
            Duration::from_secs(30),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let named = lines.len() == 1
            && lines[0].contains(&format!("table `{table}`"))
            && lines[0].contains(says);
        if !ended || out.status.code() != Some(69) || !named || !stdout.is_empty() {
            wrong.push(format!(
                "{:?} {command:?}: {}, exit {:?}\n  stdout: {stdout:?}\n  stderr: {stderr:?}",
                emulator.kind,
                if ended {
                    "ended"
                } else {
                    "still running after 30 s"
                },
                out.status.code()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "want exit 69 and one line naming table `{table}` and {says:?}:\n{}",
        wrong.join("\n")
    );
}

fn on(emulator: &Emulator) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for wrong in wrong_tables() {
        let table = common::unique_name("wrongkey");
        runtime.block_on(create(emulator, &table, &wrong));
        every_command_refuses(emulator, &table, wrong.says);
    }
}

#[test]
fn every_tool_refuses_a_table_with_the_wrong_key_on_dynamodb_local() {
    on(common::emulators::shared_dynamodb_local());
}

#[test]
fn every_tool_refuses_a_table_with_the_wrong_key_on_dynalite() {
    on(common::emulators::shared_dynalite());
}
