//! DynamoDB Local runs in a JVM that compiles its hot paths over the first
//! few thousand requests: on a fresh server a consistent GetItem took
//! 8.6 ms and a conditional PutItem 13.9 ms here, against 2.9 ms and 3.5 ms
//! after 4,000 of them. Real DynamoDB has no such start, so before any
//! timed scenario the benchmark sends the kinds of requests leaderd sends
//! (consistent reads, conditional puts, transactions of takes) on scratch
//! records of their own, through leaderd's store, until the answers come
//! at their warm pace.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leaderd::lease::dynamodb::DynamoStore;
use leaderd::lease::{Condition, LeaseStore, WRITE_MANY_LIMIT, WriteOutcome};

use crate::dynamo_local::store;
use crate::request_cost::lease;
use crate::stats::Summary;

/// Scratch records read and renewed together in each round.
const RECORDS: usize = 20;
/// Rounds of one read and one renewal of each record (8,000 requests).
const ROUNDS: usize = 200;
/// Transactions of [`WRITE_MANY_LIMIT`] takes each.
const TRANSACTIONS: usize = 30;
/// Per-request budget.
const BUDGET: Duration = Duration::from_secs(5);

/// Median latencies of the first and the last rounds, in milliseconds.
pub struct WarmUp {
    pub first_read_ms: f64,
    pub last_read_ms: f64,
    pub first_put_ms: f64,
    pub last_put_ms: f64,
    pub seconds: f64,
}

/// Warms the server at `addr` up on scratch records of `table` (a table
/// of their own: the daemons of a run without sessions scan theirs).
pub fn run(addr: SocketAddr, table: &str) -> Result<WarmUp, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let store = store(addr, table);
    let started = Instant::now();
    runtime.block_on(async {
        let (first_read_ms, first_put_ms) = rounds(&store, 0, 1).await?;
        rounds(&store, 1, ROUNDS - 1).await?;
        transactions(&store).await?;
        let (last_read_ms, last_put_ms) = rounds(&store, ROUNDS, 1).await?;
        Ok(WarmUp {
            first_read_ms,
            last_read_ms,
            first_put_ms,
            last_put_ms,
            seconds: started.elapsed().as_secs_f64(),
        })
    })
}

fn name(i: usize) -> String {
    format!("bench-warm-up-{}-{i:03}", std::process::id())
}

fn rvn(i: usize, round: usize) -> String {
    format!("{}-{round}", name(i))
}

/// `count` rounds from round `from`: each record read, then renewed from
/// the rvn of the round before (created in round 0). Median milliseconds of
/// a read and of a put in the last round.
async fn rounds(store: &DynamoStore, from: usize, count: usize) -> Result<(f64, f64), String> {
    let mut medians = (0.0, 0.0);
    for round in from..from + count {
        let mut reads = Vec::with_capacity(RECORDS);
        let mut puts = Vec::with_capacity(RECORDS);
        for i in 0..RECORDS {
            let sent = Instant::now();
            store
                .read(&name(i), BUDGET)
                .await
                .map_err(|e| format!("warm-up read: {e}"))?;
            reads.push(sent.elapsed().as_secs_f64() * 1e3);
            let condition = if round == 0 {
                Condition::NotExists
            } else {
                Condition::HeldBy {
                    rvn: rvn(i, round - 1),
                    holder: "bench".to_owned(),
                }
            };
            let sent = Instant::now();
            match store
                .put(&lease(&name(i), &rvn(i, round)), &condition, BUDGET)
                .await
            {
                Ok(WriteOutcome::Applied) => puts.push(sent.elapsed().as_secs_f64() * 1e3),
                other => return Err(format!("warm-up write of {}: {other:?}", name(i))),
            }
        }
        let median = |values: &[f64]| Summary::of(values).map_or(0.0, |s| s.median);
        medians = (median(&reads), median(&puts));
    }
    Ok(medians)
}

/// [`TRANSACTIONS`] batches of takes of fresh scratch records, as a
/// daemon takes a dead one's elections.
async fn transactions(store: &DynamoStore) -> Result<(), String> {
    for t in 0..TRANSACTIONS {
        let writes: Vec<_> = (0..WRITE_MANY_LIMIT)
            .map(|i| {
                let n = RECORDS + t * WRITE_MANY_LIMIT + i;
                (lease(&name(n), &rvn(n, 0)), Condition::NotExists)
            })
            .collect();
        for (answer, (lease, _)) in store.write_many(&writes, BUDGET).await.iter().zip(&writes) {
            if !matches!(answer, Ok(WriteOutcome::Applied)) {
                return Err(format!("warm-up take of {}: {answer:?}", lease.election));
            }
        }
    }
    Ok(())
}
