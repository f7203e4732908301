//! What one lease write costs in CPU, taken apart: the same conditional
//! PutItem sent (a) through leaderd's DynamoDB store, that is the AWS SDK,
//! and (b) as bare HTTP/1.1 from hyper with the same body and no signing
//! (DynamoDB Local does not check signatures). Both run in this process on a
//! runtime shaped like leaderd's (one worker thread; the work in a spawned
//! task, hyper's connections in tasks of their own) and send their requests
//! in batches of [`BATCH`] (about what one tick of leaderd's renewal grid
//! carries at 1,000 elections), [`BATCH_EVERY`] apart. The difference
//! between (a) and (b) is what the SDK adds per request; (b) is HTTP,
//! loopback TCP and waking up for the answer.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use leaderd::lease::{Condition, Lease, LeaseStore, WriteOutcome};

use crate::harness::cpu_seconds;

/// Requests in flight together, as in one tick of leaderd's renewal grid.
const BATCH: usize = 50;
/// Pause between batches: long enough for every answer to be in, short
/// enough to keep the run short.
const BATCH_EVERY: Duration = Duration::from_millis(50);
/// Per-request budget; DynamoDB Local answers in a few milliseconds.
const BUDGET: Duration = Duration::from_secs(5);

/// CPU per request of each path, in microseconds.
pub struct RequestCost {
    /// Requests measured per path.
    pub requests: usize,
    /// Through `DynamoStore::put` (the AWS SDK, signed).
    pub sdk_us: f64,
    /// Bare HTTP from hyper, same body, unsigned.
    pub http_us: f64,
}

/// User plus system CPU seconds of this process so far.
fn own_cpu_seconds(clock_ticks: f64) -> Result<f64, String> {
    let pid = i32::try_from(std::process::id()).map_err(|e| format!("own pid: {e}"))?;
    cpu_seconds(pid, clock_ticks).ok_or_else(|| "cannot read /proc/self/stat".to_owned())
}

/// Run `round(0..=rounds)` one after another, [`BATCH_EVERY`] apart, and
/// return the CPU seconds of rounds 1 and later: round 0 warms the
/// connection pool up to the batch size and is not timed.
async fn timed_rounds<F, Fut>(rounds: usize, clock_ticks: f64, mut round: F) -> Result<f64, String>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut timed_from = None;
    for i in 0..=rounds {
        if i == 1 {
            timed_from = Some(own_cpu_seconds(clock_ticks)?);
        }
        round(i).await?;
        tokio::time::sleep(BATCH_EVERY).await;
    }
    let from = timed_from.ok_or("no timed round (rounds must be at least 1)")?;
    Ok(own_cpu_seconds(clock_ticks)? - from)
}

pub fn lease(election: &str, rvn: &str) -> Lease {
    Lease {
        election: election.to_owned(),
        holder: Some("bench".to_owned()),
        rvn: rvn.to_owned(),
        fencing_token: 1,
        lease_ms: 10_000,
        acquired_at_ms: 1,
        renewed_at_ms: 1,
        expires_at_s: 1,
        holder_meta: None,
        successor: None,
        session: None,
    }
}

/// Measure both paths with `requests` requests each (rounded to whole batches).
pub fn measure(
    store: SocketAddr,
    table: &str,
    requests: usize,
    clock_ticks: f64,
) -> Result<RequestCost, String> {
    let rounds = requests.div_ceil(BATCH).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let table = table.to_owned();
    let task = runtime.spawn(async move {
        let sdk = sdk_path(store, &table, rounds, clock_ticks).await?;
        let http = http_path(store, &table, rounds, clock_ticks).await?;
        Ok::<_, String>((sdk, http))
    });
    let (sdk, http) = runtime
        .block_on(task)
        .map_err(|e| format!("the measuring task failed: {e}"))??;
    Ok(RequestCost {
        requests: rounds * BATCH,
        sdk_us: sdk / (rounds * BATCH) as f64 * 1e6,
        http_us: http / (rounds * BATCH) as f64 * 1e6,
    })
}

/// Renew [`BATCH`] leases `rounds` times through the store; CPU seconds used.
async fn sdk_path(
    store: SocketAddr,
    table: &str,
    rounds: usize,
    clock_ticks: f64,
) -> Result<f64, String> {
    let store = crate::dynamo_local::store(store, table);
    let tag = format!("cost-{}", std::process::id());
    let names: Vec<String> = (0..BATCH).map(|i| format!("{tag}-{i:02}")).collect();
    let mut rvns: Vec<String> = Vec::with_capacity(BATCH);
    for name in &names {
        let rvn = format!("{name}-0");
        match store
            .put(&lease(name, &rvn), &Condition::NotExists, BUDGET)
            .await
        {
            Ok(WriteOutcome::Applied) => rvns.push(rvn),
            other => return Err(format!("creating {name}: {other:?}")),
        }
    }
    // Each round renews from the rvns the previous one wrote.
    let rvns = Mutex::new(rvns);
    timed_rounds(rounds, clock_ticks, |round| {
        let current = rvns.lock().expect("never held across an await").clone();
        let (names, store, rvns) = (&names, &store, &rvns);
        async move {
            let writes = names.iter().zip(current).map(|(name, rvn)| async move {
                let next = format!("{name}-{}", round + 1);
                let cond = Condition::HeldBy {
                    rvn,
                    holder: "bench".to_owned(),
                };
                match store.put(&lease(name, &next), &cond, BUDGET).await {
                    Ok(WriteOutcome::Applied) => Ok(next),
                    other => Err(format!("renewing {name}: {other:?}")),
                }
            });
            let written = futures_util::future::join_all(writes)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
            *rvns.lock().expect("never held across an await") = written;
            Ok(())
        }
    })
    .await
}

/// The same PutItem, as bare HTTP; CPU seconds used.
async fn http_path(
    store: SocketAddr,
    table: &str,
    rounds: usize,
    clock_ticks: f64,
) -> Result<f64, String> {
    let client: Client<_, Full<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let tag = format!("cost-http-{}", std::process::id());
    let body = |i: usize| {
        // A condition that always holds: each round overwrites the same
        // items, and the server evaluates a condition as for a renewal.
        hyper::body::Bytes::from(format!(
            r##"{{"TableName":"{table}","Item":{{"election":{{"S":"{tag}-{i:02}"}},"rvn":{{"S":"0123456789abcdef0123456789abcdef"}},"holder":{{"S":"bench"}},"fencing_token":{{"N":"1"}},"lease_ms":{{"N":"10000"}},"acquired_at":{{"N":"1"}},"renewed_at":{{"N":"1"}},"expires_at":{{"N":"1"}}}},"ConditionExpression":"attribute_not_exists(#e) OR #e = :e","ExpressionAttributeNames":{{"#e":"election"}},"ExpressionAttributeValues":{{":e":{{"S":"{tag}-{i:02}"}}}},"ReturnValuesOnConditionCheckFailure":"ALL_OLD"}}"##
        ))
    };
    let request = |i: usize| {
        hyper::Request::post(format!("http://{store}/"))
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", "DynamoDB_20120810.PutItem")
            .header("x-amz-date", "20260101T000000Z")
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=bench/20260101/us-east-1/dynamodb/aws4_request, \
                 SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=00",
            )
            .body(Full::new(body(i)))
            .map_err(|e| format!("building the request: {e}"))
    };
    timed_rounds(rounds, clock_ticks, |_| {
        let sends = (0..BATCH).map(|i| {
            let client = &client;
            async move {
                let response = client
                    .request(request(i)?)
                    .await
                    .map_err(|e| format!("bare PutItem: {e}"))?;
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("bare PutItem answer: {e}"))?
                    .to_bytes();
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!(
                        "bare PutItem answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    ))
                }
            }
        });
        async move {
            futures_util::future::join_all(sends)
                .await
                .into_iter()
                .collect::<Result<Vec<()>, _>>()
                .map(drop)
        }
    })
    .await
}
