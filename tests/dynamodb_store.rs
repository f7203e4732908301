//! DynamoDB store specifics that the cross-store contract suite
//! (`tests/store_contract.rs`) does not cover: table provisioning (create,
//! wait until ACTIVE, TTL, wrong schema), and the classification of failures
//! that decides what is retried and what is read back: credentials, refused
//! connections, throttling, 5xx, answers lost after the write was applied.
//!
//! Emulators: DynamoDB Local and dynalite, started on free loopback ports by
//! `tests/common/emulators.rs`. Failure modes no emulator produces come from a
//! scripted fake server and a forwarding proxy on loopback, defined below.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use common::emulators::{self, Emulator};
use leaderd::lease::dynamodb::{DynamoConfig, DynamoStore, TableInfo, TtlStatus};
use leaderd::lease::{Condition, Lease, LeaseStore, Record, StoreError, WriteOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous: the machine running the tests is shared and often busy.
const WAIT: Duration = Duration::from_secs(60);
const BUDGET: Duration = Duration::from_secs(10);

async fn shared(start: fn() -> &'static Emulator) -> &'static Emulator {
    emulators::fake_aws_env();
    tokio::task::spawn_blocking(start)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

async fn local() -> &'static Emulator {
    shared(emulators::shared_dynamodb_local).await
}

async fn dynalite() -> &'static Emulator {
    shared(emulators::shared_dynalite).await
}

async fn store_at(endpoint: &str, table: &str) -> DynamoStore {
    emulators::fake_aws_env();
    DynamoStore::new(&DynamoConfig {
        table: table.to_owned(),
        region: "us-east-1".into(),
        endpoint_url: Some(endpoint.to_owned()),
    })
    .await
}

async fn new_store(emulator: &Emulator) -> DynamoStore {
    store_at(&emulator.endpoint, &common::unique_name("lease")).await
}

fn lease(election: &str, holder: &str) -> Lease {
    Lease {
        election: election.to_owned(),
        holder: Some(holder.to_owned()),
        rvn: leaderd::lease::new_rvn(),
        fencing_token: 1,
        lease_ms: 10_000,
        acquired_at_ms: 1_700_000_000_000,
        renewed_at_ms: 1_700_000_000_000,
        expires_at_s: 1_700_000_010,
        holder_meta: None,
        successor: None,
        session: None,
    }
}

/// Create a table with any key, without waiting for it.
async fn create_raw_table(store: &DynamoStore, key: &str, ty: ScalarAttributeType) {
    store
        .client()
        .create_table()
        .table_name(store.table())
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
        .unwrap_or_else(|e| {
            panic!(
                "raw CreateTable: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        });
}

fn assert_fresh_table(info: &TableInfo, store: &DynamoStore) {
    assert_eq!(info.name, store.table());
    assert_eq!(info.status, "ACTIVE");
    assert_eq!(info.billing_mode.as_deref(), Some("PAY_PER_REQUEST"));
    assert!(info.key_schema_ok, "{info:?}");
}

// ------------------------------------------------------ table provisioning

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_is_idempotent_on_dynamodb_local() {
    let store = new_store(local().await).await;
    let first = store.create_table(false, WAIT).await.expect("create");
    assert_fresh_table(&first, &store);
    let again = store.create_table(false, WAIT).await.expect("create again");
    assert_fresh_table(&again, &store);
    store
        .check(BUDGET)
        .await
        .expect("a created table passes check");
    // The table is usable at once.
    let l = lease("e", "a");
    assert_eq!(
        store.write(&l, &Condition::NotExists, BUDGET).await,
        Ok(WriteOutcome::Applied)
    );
}

/// dynalite keeps a new table CREATING for a while
/// (`emulators::DYNALITE_CREATE_TABLE_MS`): create_table must wait it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_waits_until_active_on_dynalite() {
    let store = new_store(dynalite().await).await;
    let started = Instant::now();
    let info = store.create_table(false, WAIT).await.expect("create");
    assert_fresh_table(&info, &store);
    assert!(
        started.elapsed() >= Duration::from_millis(emulators::DYNALITE_CREATE_TABLE_MS / 2),
        "returned after {:?}, before dynalite could have made the table ACTIVE",
        started.elapsed()
    );
    let again = store.create_table(false, WAIT).await.expect("create again");
    assert_fresh_table(&again, &store);
    store
        .check(BUDGET)
        .await
        .expect("an ACTIVE table passes check");
}

/// A table someone else is creating: a short wait ends with the clear
/// "not ACTIVE yet" error, and reads say the same instead of "missing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_table_is_not_active_yet_on_dynalite() {
    let store = new_store(dynalite().await).await;
    create_raw_table(&store, "election", ScalarAttributeType::S).await;
    let creating = StoreError::TableNotActive {
        table: store.table().to_owned(),
        status: "CREATING".into(),
    };
    assert_eq!(
        store.create_table(false, Duration::from_millis(10)).await,
        Err(creating.clone())
    );
    assert_eq!(store.read("e", BUDGET).await, Err(creating.clone()));
    let info = store.create_table(false, WAIT).await.expect("wait for it");
    assert_eq!(info.status, "ACTIVE");
    assert_eq!(store.read("e", BUDGET).await, Ok(Record::Absent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_is_enabled_on_dynamodb_local() {
    let store = new_store(local().await).await;
    let info = store.create_table(true, WAIT).await.expect("create");
    assert_eq!(info.ttl, TtlStatus::Enabled);
    assert_eq!(
        store.describe_table().await.map(|i| i.ttl),
        Ok(TtlStatus::Enabled)
    );
    // Enabling again is no error (DynamoDB itself refuses a second enable).
    let again = store.create_table(true, WAIT).await.expect("create again");
    assert_eq!(again.ttl, TtlStatus::Enabled);

    let plain = new_store(local().await).await;
    let info = plain.create_table(false, WAIT).await.expect("create");
    assert_eq!(info.ttl, TtlStatus::Disabled);
}

/// dynalite answers DescribeTimeToLive (always DISABLED) but has no
/// UpdateTimeToLive: reported as unsupported, and the table is still created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_is_unsupported_on_dynalite() {
    let store = new_store(dynalite().await).await;
    let info = store.create_table(true, WAIT).await.expect("create");
    assert_fresh_table(&info, &store);
    match &info.ttl {
        TtlStatus::Unsupported(reason) => {
            assert!(reason.contains("TTL"), "reason: {reason}")
        }
        other => panic!("expected TTL to be reported unsupported, got {other:?}"),
    }
    store.check(BUDGET).await.expect("usable without TTL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_schema_is_reported() {
    for emulator in [local().await, dynalite().await] {
        for (key, ty, expect) in [
            ("id", ScalarAttributeType::S, "`id` (S, HASH)"),
            ("election", ScalarAttributeType::N, "`election` (N, HASH)"),
        ] {
            let store = new_store(emulator).await;
            create_raw_table(&store, key, ty).await;
            // create_table waits for ACTIVE (dynalite), then refuses the schema.
            let err = store.create_table(false, WAIT).await;
            let Err(StoreError::WrongSchema { table, detail }) = err else {
                panic!("{:?}: expected WrongSchema, got {err:?}", emulator.kind);
            };
            assert_eq!(table, store.table());
            assert!(detail.contains(expect), "detail: {detail}");
            assert!(matches!(
                store.check(BUDGET).await,
                Err(StoreError::WrongSchema { .. })
            ));
            let info = store.describe_table().await.expect("describe");
            assert!(!info.key_schema_ok, "{info:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_is_table_missing() {
    for emulator in [local().await, dynalite().await] {
        let store = new_store(emulator).await;
        let missing = StoreError::TableMissing(store.table().to_owned());
        assert_eq!(store.check(BUDGET).await, Err(missing.clone()));
        assert_eq!(store.describe_table().await, Err(missing.clone()));
        assert_eq!(store.read("e", BUDGET).await, Err(missing.clone()));
        assert_eq!(
            store
                .write(&lease("e", "a"), &Condition::NotExists, BUDGET)
                .await,
            Err(missing.clone())
        );
        assert_eq!(store.list(BUDGET).await, Err(missing));
    }
}

// ------------------------------------------------------------ conditions

/// The old item comes back with a failed condition when the server returns
/// it (DynamoDB Local does); dynalite does not, which must be fine too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_condition_carries_the_current_record_when_told() {
    for emulator in [local().await, dynalite().await] {
        let store = new_store(emulator).await;
        store.create_table(false, WAIT).await.expect("create");
        let mine = lease("e", "a");
        assert_eq!(
            store.write(&mine, &Condition::NotExists, BUDGET).await,
            Ok(WriteOutcome::Applied)
        );
        let theirs = lease("e", "b");
        let outcome = store
            .write(&theirs, &Condition::RvnIs("stale".into()), BUDGET)
            .await;
        match (emulator.kind, outcome) {
            (
                emulators::Kind::DynamoDbLocal,
                Ok(WriteOutcome::ConditionFailed {
                    current: Some(current),
                }),
            ) => assert_eq!(current, Record::Valid(mine.clone())),
            (emulators::Kind::Dynalite, Ok(WriteOutcome::ConditionFailed { current: None })) => {}
            (kind, other) => panic!("{kind:?}: unexpected {other:?}"),
        }
        // list() sees the one record.
        assert_eq!(store.list(BUDGET).await, Ok(vec![Record::Valid(mine)]));
    }
}

/// Takes of many elections at once: one transaction on DynamoDB Local,
/// one PutItem each on dynalite (which has no transactions, and says so);
/// either way each write is answered by its own condition, and a write
/// whose condition fails takes nothing from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writes_are_each_answered_by_their_own_condition() {
    for emulator in [local().await, dynalite().await] {
        let direct = new_store(emulator).await;
        direct.create_table(false, WAIT).await.expect("create");
        let (endpoint, _, transactions) = answer_losing_proxy(&emulator.endpoint).await;
        let store = store_at(&endpoint, direct.table()).await;
        let first: Vec<(Lease, Condition)> = ["a", "b", "c"]
            .iter()
            .map(|e| (lease(e, "x"), Condition::NotExists))
            .collect();
        assert_eq!(
            store.write_many(&first, BUDGET).await,
            vec![Ok(WriteOutcome::Applied); 3],
            "{:?}",
            emulator.kind
        );
        // a and c taken on the rvn each has; b on one it never had.
        let takes = vec![
            (lease("a", "y"), Condition::RvnIs(first[0].0.rvn.clone())),
            (lease("b", "y"), Condition::RvnIs("stale".into())),
            (lease("c", "y"), Condition::RvnIs(first[2].0.rvn.clone())),
        ];
        let outcomes = store.write_many(&takes, BUDGET).await;
        assert_eq!(
            outcomes[0],
            Ok(WriteOutcome::Applied),
            "{:?}",
            emulator.kind
        );
        assert_eq!(
            outcomes[2],
            Ok(WriteOutcome::Applied),
            "{:?}",
            emulator.kind
        );
        match (emulator.kind, &outcomes[1]) {
            (
                emulators::Kind::DynamoDbLocal,
                Ok(WriteOutcome::ConditionFailed {
                    current: Some(current),
                }),
            ) => assert_eq!(*current, Record::Valid(first[1].0.clone())),
            (emulators::Kind::Dynalite, Ok(WriteOutcome::ConditionFailed { current: None })) => {}
            (kind, other) => panic!("{kind:?}: unexpected {other:?}"),
        }
        // DynamoDB Local: both as transactions (then a and c again, one
        // PutItem each, after b's failed condition cancelled the second).
        // dynalite: the first refused, the second not tried.
        let expected = match emulator.kind {
            emulators::Kind::DynamoDbLocal => 2,
            _ => 1,
        };
        assert_eq!(
            transactions.load(Ordering::SeqCst),
            expected,
            "{:?}",
            emulator.kind
        );
        for (election, now) in [("a", &takes[0].0), ("b", &first[1].0), ("c", &takes[2].0)] {
            assert_eq!(
                store.read(election, BUDGET).await,
                Ok(Record::Valid(now.clone())),
                "{:?}: {election}",
                emulator.kind
            );
        }
    }
}

/// A transaction applied whose answer was lost is settled by reading the
/// records back: every write applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writes_with_a_lost_answer_are_settled_by_reading_back() {
    let emulator = local().await;
    let direct = new_store(emulator).await;
    direct.create_table(false, WAIT).await.expect("create");
    let (endpoint, lose_next_put, transactions) = answer_losing_proxy(&emulator.endpoint).await;
    let store = store_at(&endpoint, direct.table()).await;
    let writes: Vec<(Lease, Condition)> = ["a", "b"]
        .iter()
        .map(|e| (lease(e, "x"), Condition::NotExists))
        .collect();
    lose_next_put.store(true, Ordering::SeqCst);
    assert_eq!(
        store.write_many(&writes, BUDGET).await,
        vec![Ok(WriteOutcome::Applied); 2]
    );
    assert!(
        !lose_next_put.load(Ordering::SeqCst),
        "the proxy did lose an answer"
    );
    assert_eq!(transactions.load(Ordering::SeqCst), 1, "one transaction");
    for (lease, _) in &writes {
        assert_eq!(
            direct.read(&lease.election, BUDGET).await,
            Ok(Record::Valid(lease.clone()))
        );
    }
}

// ------------------------------------------------------------ credentials

fn client_with(
    endpoint: &str,
    provider: impl aws_sdk_dynamodb::config::ProvideCredentials + 'static,
) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(provider)
        .http_client(leaderd::lease::dynamodb::https_client())
        .build();
    Client::from_conf(config)
}

/// DynamoDB Local rejects access key ids that are not alphanumeric with
/// UnrecognizedClientException, as AWS rejects unknown keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_credentials_are_a_credentials_error() {
    let emulator = local().await;
    let good = new_store(emulator).await;
    good.create_table(false, WAIT).await.expect("create");
    let bad = DynamoStore::from_client(
        &client_with(
            &emulator.endpoint,
            Credentials::new("not-a-key!", "secret", None, None, "test"),
        ),
        good.table(),
    );
    for result in [
        bad.check(BUDGET).await.map(|_| ()),
        bad.read("e", BUDGET).await.map(|_| ()),
        bad.write(&lease("e", "a"), &Condition::NotExists, BUDGET)
            .await
            .map(|_| ()),
    ] {
        match result {
            Err(StoreError::Credentials(msg)) => {
                assert!(msg.contains("UnrecognizedClientException"), "{msg}")
            }
            other => panic!("expected a credentials error, got {other:?}"),
        }
    }
}

/// What the default chain does when no source has credentials.
#[derive(Debug)]
struct NoCredentials;

impl aws_sdk_dynamodb::config::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no providers in chain provided credentials",
            ),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_credentials_are_a_credentials_error() {
    let emulator = dynalite().await;
    let store = DynamoStore::from_client(&client_with(&emulator.endpoint, NoCredentials), "leases");
    let err = store.read("e", BUDGET).await;
    assert!(matches!(&err, Err(StoreError::Credentials(_))), "{err:?}");
    let err = store
        .write(&lease("e", "a"), &Condition::NotExists, BUDGET)
        .await;
    assert!(matches!(&err, Err(StoreError::Credentials(_))), "{err:?}");
}

// ------------------------------------------- transport, throttling, 5xx

/// A request that never left: not a timeout, nothing to read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_transport() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.local_addr().expect("bound").port()
    };
    let store = store_at(&format!("http://127.0.0.1:{closed}"), "leases").await;
    let started = Instant::now();
    let read = store.read("e", BUDGET).await;
    assert!(matches!(&read, Err(StoreError::Transport(_))), "{read:?}");
    let put = store
        .put(&lease("e", "a"), &Condition::NotExists, BUDGET)
        .await;
    assert!(matches!(&put, Err(StoreError::Transport(_))), "{put:?}");
    assert!(!put.unwrap_err().maybe_applied());
    assert!(started.elapsed() < BUDGET, "failed fast, not by timeout");
}

/// One scripted answer of the fake server.
#[derive(Clone)]
enum Answer {
    /// HTTP status and a DynamoDB JSON body.
    Reply(u16, &'static str),
    /// Read the request, then close the connection without answering.
    Hangup,
    /// Read the request and never answer.
    Silence,
}

const THROTTLED: Answer = Answer::Reply(
    400,
    r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#,
);

/// A loopback HTTP server that answers DynamoDB requests from a script (the
/// last answer repeats) and counts them. Returns its endpoint and the count.
async fn fake_server(script: Vec<Answer>) -> (String, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let count = Arc::new(AtomicU32::new(0));
    let requests = count.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let script = script.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                while read_http_message(&mut conn).await.is_some() {
                    let n = requests.fetch_add(1, Ordering::SeqCst) as usize;
                    let answer = script
                        .get(n)
                        .or(script.last())
                        .cloned()
                        .unwrap_or(Answer::Hangup);
                    match answer {
                        Answer::Reply(status, body) => {
                            let head = format!(
                                "HTTP/1.1 {status} X\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            let sent = conn.write_all(head.as_bytes()).await;
                            if sent.is_err() || conn.write_all(body.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Answer::Hangup => return,
                        Answer::Silence => std::future::pending::<()>().await,
                    }
                }
            });
        }
    });
    (endpoint, count)
}

/// One HTTP/1.1 message (head and Content-Length body) from `conn`, as raw
/// bytes; `None` at end of stream or on a message we cannot frame.
async fn read_http_message(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().ok())
        .unwrap_or(Some(0))?;
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_until_it_clears() {
    let (endpoint, requests) = fake_server(vec![
        THROTTLED,
        THROTTLED,
        THROTTLED,
        Answer::Reply(200, "{}"),
    ])
    .await;
    let store = store_at(&endpoint, "leases").await;
    assert_eq!(store.read("e", BUDGET).await, Ok(Record::Absent));
    assert_eq!(requests.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_only_within_the_budget() {
    let (endpoint, requests) = fake_server(vec![THROTTLED]).await;
    let store = store_at(&endpoint, "leases").await;
    let budget = Duration::from_secs(2);
    let started = Instant::now();
    let result = store
        .write(&lease("e", "a"), &Condition::NotExists, budget)
        .await;
    let elapsed = started.elapsed();
    assert!(
        matches!(&result, Err(StoreError::Throttled(_))),
        "{result:?}"
    );
    assert!(
        requests.load(Ordering::SeqCst) >= 3,
        "retried: {} requests",
        requests.load(Ordering::SeqCst)
    );
    // It gives up before the budget runs out (plus scheduling slack).
    assert!(
        elapsed < budget + Duration::from_secs(1),
        "took {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_lost_answers_may_have_been_applied() {
    for (answer, what) in [
        (
            Answer::Reply(
                500,
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"boom"}"#,
            ),
            "HTTP 500",
        ),
        (
            Answer::Reply(503, "<html>unavailable</html>"),
            "HTTP 503 from a proxy",
        ),
        (Answer::Hangup, "connection closed after the request"),
    ] {
        let (endpoint, _) = fake_server(vec![answer]).await;
        let store = store_at(&endpoint, "leases").await;
        let err = store
            .put(&lease("e", "a"), &Condition::NotExists, BUDGET)
            .await
            .expect_err(what);
        assert!(matches!(err, StoreError::Server(_)), "{what}: {err:?}");
        assert!(err.maybe_applied(), "{what}");
    }

    let (endpoint, _) = fake_server(vec![Answer::Silence]).await;
    let store = store_at(&endpoint, "leases").await;
    let budget = Duration::from_millis(500);
    let started = Instant::now();
    let err = store
        .put(&lease("e", "a"), &Condition::NotExists, budget)
        .await;
    assert!(
        matches!(err, Err(StoreError::Timeout(d)) if d <= budget),
        "{err:?}"
    );
    assert!(started.elapsed() < budget + Duration::from_secs(2));
}

/// A proxy in front of a real emulator that, when armed, forwards one
/// PutItem (or TransactWriteItems), lets the server apply it, and hangs up
/// instead of answering. It counts the TransactWriteItems it forwards.
async fn answer_losing_proxy(upstream: &str) -> (String, Arc<AtomicBool>, Arc<AtomicU32>) {
    let upstream = upstream
        .strip_prefix("http://")
        .expect("emulator endpoints are http://")
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let armed = Arc::new(AtomicBool::new(false));
    let lose = armed.clone();
    let transactions = Arc::new(AtomicU32::new(0));
    let counted = transactions.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let lose = lose.clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                while let Some(request) = read_http_message(&mut client).await {
                    let text = String::from_utf8_lossy(&request);
                    let transaction = text.contains("DynamoDB_20120810.TransactWriteItems");
                    if transaction {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let is_put = transaction || text.contains("DynamoDB_20120810.PutItem");
                    if server.write_all(&request).await.is_err() {
                        return;
                    }
                    let Some(response) = read_http_message(&mut server).await else {
                        return;
                    };
                    if is_put && lose.swap(false, Ordering::SeqCst) {
                        return; // applied upstream; the answer is lost
                    }
                    if client.write_all(&response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, armed, transactions)
}

/// An ambiguous write is resolved by a consistent read-back. The
/// store must classify the lost answer so that `write` reads back, and the
/// read-back must find our rvn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_write_with_lost_answer_is_resolved_by_read_back() {
    let emulator = dynalite().await;
    let direct = new_store(emulator).await;
    direct.create_table(false, WAIT).await.expect("create");
    let (endpoint, lose_next_put, _) = answer_losing_proxy(&emulator.endpoint).await;
    let store = store_at(&endpoint, direct.table()).await;

    let first = lease("e", "a");
    assert_eq!(
        store.write(&first, &Condition::NotExists, BUDGET).await,
        Ok(WriteOutcome::Applied)
    );
    let renewed = Lease {
        rvn: leaderd::lease::new_rvn(),
        ..first.clone()
    };
    let held_by = Condition::HeldBy {
        rvn: first.rvn.clone(),
        holder: "a".into(),
    };
    // Without read-back the answer is an error that may hide a success...
    lose_next_put.store(true, Ordering::SeqCst);
    let err = store.put(&renewed, &held_by, BUDGET).await;
    assert!(
        err.as_ref().is_err_and(StoreError::maybe_applied),
        "{err:?}"
    );
    assert_eq!(
        direct.read("e", BUDGET).await,
        Ok(Record::Valid(renewed.clone()))
    );

    // ...and with it the renewal is known to have happened.
    let again = Lease {
        rvn: leaderd::lease::new_rvn(),
        ..renewed.clone()
    };
    let held_by = Condition::HeldBy {
        rvn: renewed.rvn.clone(),
        holder: "a".into(),
    };
    lose_next_put.store(true, Ordering::SeqCst);
    assert_eq!(
        store.write(&again, &held_by, BUDGET).await,
        Ok(WriteOutcome::Applied)
    );
    assert!(
        !lose_next_put.load(Ordering::SeqCst),
        "the proxy did lose an answer"
    );
    assert_eq!(direct.read("e", BUDGET).await, Ok(Record::Valid(again)));
}

// ---------------------------------------------------------------- region
//
// Real `leaderd` processes with an environment of their own (`env_clear`):
// no AWS variable of this test process or of the machine, no real ~/.aws
// (HOME, AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE point into a
// temporary directory), and no instance metadata unless a case serves one.

/// A `leaderd` command that sees only `vars` and the fake credentials.
fn leaderd_isolated(home: &std::path::Path, vars: &[(&str, &str)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(common::daemon::leaderd_bin());
    cmd.env_clear()
        .env("HOME", home)
        .env("AWS_CONFIG_FILE", home.join("aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("aws-credentials"))
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .envs(vars.iter().copied());
    cmd
}

/// A loopback HTTP server on its own threads: `answer` gets each request
/// head and returns the whole response, or `None` to stay silent. Returns
/// `http://127.0.0.1:PORT`.
fn loopback_server(answer: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One message: the head, then a Content-Length body.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                    let length: usize = head
                        .to_ascii_lowercase()
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + length {
                        match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + length);
                    match answer(&head) {
                        Some(response) => {
                            if conn.write_all(response.as_bytes()).is_err() {
                                return;
                            }
                        }
                        // Hold the connection open, silent, until the client
                        // gives up.
                        None => while conn.read(&mut chunk).is_ok_and(|n| n > 0) {},
                    }
                }
            });
        }
    });
    endpoint
}

fn http_200(extra_headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\n{extra_headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A stand-in for DynamoDB that answers `DescribeTable` with a table
/// leaderd can use (`status` checks it first) and every other request with
/// an empty Scan, and keeps the region each request was signed for: the
/// third field of the credential scope in its `Authorization` header
/// (`Credential=KEY/DATE/REGION/dynamodb/aws4_request`).
fn signing_recorder() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let regions = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = regions.clone();
    let endpoint = loopback_server(move |head| {
        let region = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .find_map(|l| l.split_once("Credential=")?.1.split('/').nth(2))
            .unwrap_or("(unsigned)")
            .to_owned();
        seen.lock().expect("not poisoned").push(region);
        let describe = head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("x-amz-target:") && l.ends_with(".DescribeTable")
        });
        Some(http_200(
            "Content-Type: application/x-amz-json-1.0\r\n",
            if describe {
                r#"{"Table":{"TableName":"leaderd","TableStatus":"ACTIVE","KeySchema":[{"AttributeName":"election","KeyType":"HASH"}],"AttributeDefinitions":[{"AttributeName":"election","AttributeType":"S"}]}}"#
            } else {
                r#"{"Count":0,"Items":[],"ScannedCount":0}"#
            },
        ))
    });
    (endpoint, regions)
}

/// `leaderd status FLAGS` against a signing recorder: the regions its
/// requests were signed for, each once in a row, after checking it
/// succeeded.
fn status_signing_regions(cmd: &mut std::process::Command, flags: &[&str]) -> Vec<String> {
    let (endpoint, regions) = signing_recorder();
    let (out, ended) = common::daemon::output_within(
        cmd.args(["status", "--store", "dynamodb", "--endpoint-url", &endpoint])
            .args(flags),
        Duration::from_secs(30),
    );
    assert!(ended, "status still running after 30 s");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut regions = regions.lock().expect("not poisoned").clone();
    assert!(!regions.is_empty(), "no request reached the store");
    // Its check of the table and its scan: one region for both.
    regions.dedup();
    regions
}

/// A case: what it shows, its environment, its flags, the region expected.
type RegionCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
    &'static str,
);

const PROFILES: &str =
    "[default]\nregion = eu-west-3\n\n[profile other]\nregion = ap-southeast-2\n";

/// Flag > LEADERD_STORE__REGION > AWS_REGION > AWS_DEFAULT_REGION > the
/// profile's region (AWS_PROFILE's, else `default`; AWS_CONFIG_FILE, else
/// ~/.aws/config): each case shows the region the requests were signed for.
#[test]
fn region_comes_from_the_flag_the_environment_then_the_aws_profile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    std::fs::write(home.join("aws-config"), PROFILES).expect("write the AWS config file");
    let cases: [RegionCase; 7] = [
        ("the default profile", &[], &[], "eu-west-3"),
        (
            "AWS_PROFILE's profile",
            &[("AWS_PROFILE", "other")],
            &[],
            "ap-southeast-2",
        ),
        (
            "an empty AWS_REGION is unset",
            &[("AWS_REGION", ""), ("AWS_PROFILE", "other")],
            &[],
            "ap-southeast-2",
        ),
        (
            "AWS_DEFAULT_REGION over the profile",
            &[("AWS_DEFAULT_REGION", "sa-east-1")],
            &[],
            "sa-east-1",
        ),
        (
            "AWS_REGION over AWS_DEFAULT_REGION",
            &[
                ("AWS_DEFAULT_REGION", "sa-east-1"),
                ("AWS_REGION", "ca-central-1"),
            ],
            &[],
            "ca-central-1",
        ),
        (
            "the configuration over the environment",
            &[
                ("AWS_REGION", "ca-central-1"),
                ("LEADERD_STORE__REGION", "us-west-2"),
            ],
            &[],
            "us-west-2",
        ),
        (
            "the flag over everything",
            &[
                ("AWS_REGION", "ca-central-1"),
                ("LEADERD_STORE__REGION", "us-west-2"),
            ],
            &["--region", "eu-north-1"],
            "eu-north-1",
        ),
    ];
    for (case, vars, flags, expect) in cases {
        let regions = status_signing_regions(&mut leaderd_isolated(home, vars), flags);
        assert!(
            regions.iter().all(|r| r == expect),
            "{case}: signed for {regions:?}, expected {expect}"
        );
    }

    // Without AWS_CONFIG_FILE: ~/.aws/config.
    std::fs::create_dir(home.join(".aws")).expect("mkdir ~/.aws");
    std::fs::write(home.join(".aws/config"), "[default]\nregion = me-south-1\n")
        .expect("write ~/.aws/config");
    let mut cmd = leaderd_isolated(home, &[]);
    cmd.env_remove("AWS_CONFIG_FILE");
    assert_eq!(status_signing_regions(&mut cmd, &[]), ["me-south-1"]);
}

/// The daemon against DynamoDB Local with the region of a named profile: it
/// logs the region and where it came from, creates the table, leads, runs
/// its job and exits 0.
#[test]
fn daemon_uses_the_profile_region_on_dynamodb_local() {
    emulators::fake_aws_env();
    let emulator = emulators::shared_dynamodb_local();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("aws-config"), PROFILES).expect("write the AWS config file");
    let table = common::unique_name("region");
    let (out, ended) = common::daemon::output_within(
        leaderd_isolated(
            dir.path(),
            &[
                ("AWS_PROFILE", "other"),
                ("LEADERD_STORE__CREATE_TABLE", "true"),
            ],
        )
        .args(["run", "--store", "dynamodb", "--table", &table])
        .args(["--endpoint-url", &emulator.endpoint])
        .args(["--listen", "127.0.0.1:0", "--acquire-timeout", "30s"])
        .args(common::daemon::short_lease_args("job"))
        .args(["--", "true"]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(ended, "still running after 60 s:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("DynamoDB lease table"))
        .unwrap_or_else(|| panic!("no region line:\n{stderr}"));
    assert!(
        line.contains("region=ap-southeast-2")
            && line.contains(r#"region_from=AWS profile "other""#),
        "{line}"
    );
    assert!(stderr.contains("child started"), "{stderr}");
}

/// Exit 69 and one line naming the flag, key, variable, profile and file
/// looked at (for `status` and `table`), or one ERROR line saying as much
/// (`run`).
fn assert_no_region(out: &std::process::Output, needles: &[&str], run: bool) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    let lines: Vec<&str> = if run {
        stderr.lines().filter(|l| l.contains("ERROR")).collect()
    } else {
        stderr.lines().filter(|l| !l.trim().is_empty()).collect()
    };
    assert_eq!(lines.len(), 1, "one line expected:\n{stderr}");
    for n in [
        "no AWS region",
        "--region",
        "store.region",
        "AWS_REGION",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
    ]
    .iter()
    .chain(needles)
    {
        assert!(lines[0].contains(n), "`{n}` missing from: {}", lines[0]);
    }
}

/// No region anywhere: no flag or key, no variable, a config file whose
/// profile has none, instance metadata disabled.
#[test]
fn no_region_anywhere_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("aws-config");
    std::fs::write(
        &config,
        "[default]\noutput = json\n\n[profile other]\noutput = text\n",
    )
    .expect("write the AWS config file");
    let config = config.to_str().expect("utf-8 temp path");
    let store = [
        "--store",
        "dynamodb",
        "--endpoint-url",
        "http://127.0.0.1:9",
    ];
    for (vars, profile) in [
        (&[][..], r#"profile "default""#),
        (&[("AWS_PROFILE", "other")][..], r#"profile "other""#),
    ] {
        let needles = [profile, config, "AWS_EC2_METADATA_DISABLED=true"];
        for sub in [&["status"][..], &["table", "describe"][..]] {
            let (out, ended) = common::daemon::output_within(
                leaderd_isolated(dir.path(), vars).args(sub).args(store),
                Duration::from_secs(30),
            );
            assert!(ended, "{sub:?} still running after 30 s");
            assert_no_region(&out, &needles, false);
        }
        let (out, ended) = common::daemon::output_within(
            leaderd_isolated(dir.path(), vars)
                .args(["run", "--listen", "127.0.0.1:0"])
                .args(store),
            Duration::from_secs(30),
        );
        assert!(ended, "run still running after 30 s");
        assert_no_region(&out, &needles, true);
    }
}

/// With nothing else naming a region, the EC2 instance metadata does (here
/// a stand-in, through AWS_EC2_METADATA_SERVICE_ENDPOINT); one that does not
/// answer costs one short wait, then the clear error.
#[test]
fn region_from_instance_metadata_is_asked_last_and_briefly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let asked = Arc::new(AtomicU32::new(0));
    let counter = asked.clone();
    let imds = loopback_server(move |head| {
        counter.fetch_add(1, Ordering::SeqCst);
        let request_line = head.lines().next().unwrap_or_default();
        if request_line.starts_with("PUT /latest/api/token ") {
            Some(http_200(
                "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
                "test-token",
            ))
        } else if request_line.starts_with("GET /latest/meta-data/placement/region ") {
            Some(http_200("", "ap-northeast-3"))
        } else {
            Some("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned())
        }
    });
    let mut cmd = leaderd_isolated(dir.path(), &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds)]);
    cmd.env_remove("AWS_EC2_METADATA_DISABLED");
    assert_eq!(status_signing_regions(&mut cmd, &[]), ["ap-northeast-3"]);
    let asked_once = asked.load(Ordering::SeqCst);
    assert!(asked_once >= 2, "token and region: {asked_once} requests");

    // A profile that names a region comes first: the metadata is not asked.
    std::fs::write(dir.path().join("aws-config"), PROFILES).expect("write the AWS config file");
    let mut cmd = leaderd_isolated(dir.path(), &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds)]);
    cmd.env_remove("AWS_EC2_METADATA_DISABLED");
    assert_eq!(status_signing_regions(&mut cmd, &[]), ["eu-west-3"]);
    assert_eq!(asked.load(Ordering::SeqCst), asked_once);
    std::fs::remove_file(dir.path().join("aws-config")).expect("remove the AWS config file");

    let silent = loopback_server(|_| None);
    let t0 = Instant::now();
    let mut cmd = leaderd_isolated(
        dir.path(),
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &silent)],
    );
    cmd.env_remove("AWS_EC2_METADATA_DISABLED");
    let (out, ended) = common::daemon::output_within(
        cmd.args([
            "status",
            "--store",
            "dynamodb",
            "--endpoint-url",
            "http://127.0.0.1:9",
        ]),
        Duration::from_secs(30),
    );
    let took = t0.elapsed();
    assert!(ended, "status still running after 30 s");
    assert_no_region(&out, &["did not answer within 1s"], false);
    // One attempt of 1 s (the SDK's default chain takes up to 5 s); the rest
    // is process start on a busy machine.
    assert!(took < Duration::from_secs(4), "took {took:?}");
}
