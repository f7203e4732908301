//! How fast the store server itself takes many elections, with no daemon in
//! the way: the benchmark creates `n` scratch records, then takes each of
//! them once under the condition a daemon's takeover carries (`rvn` as
//! read), through leaderd's DynamoDB store, a hundred to a transaction,
//! with a given number of transactions in flight. This is the pace no
//! daemon can beat on that server: the takeover of all elections is
//! reported beside it, so a slow takeover shows whether the daemon or the
//! server set its pace.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leaderd::lease::dynamodb::DynamoStore;
use leaderd::lease::{Condition, Lease, LeaseStore, WRITE_MANY_LIMIT, WriteOutcome};

use crate::dynamo_local::store;
use crate::request_cost::lease;

/// Per-transaction budget.
const BUDGET: Duration = Duration::from_secs(30);

/// One timed pass of takes.
pub struct Pace {
    /// Transactions in flight at once.
    pub in_flight: usize,
    /// Takes made.
    pub takes: usize,
    /// Wall-clock seconds for all of them.
    pub seconds: f64,
    /// CPU seconds the store server used meanwhile.
    pub server_cpu_s: f64,
}

/// `n` takes with each of `in_flight` transactions in flight, each pass on
/// records of its own in `table` (created first, untimed).
pub fn measure(
    addr: SocketAddr,
    table: &str,
    n: usize,
    in_flight: &[usize],
    server_cpu: &dyn Fn() -> f64,
) -> Result<Vec<Pace>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut passes = Vec::new();
    for (pass, &k) in in_flight.iter().enumerate() {
        let k = k.max(1);
        // One store per lane: a store lets two of its transactions fly at
        // once, so each lane sends its own, one after another.
        let stores: Vec<DynamoStore> = (0..k).map(|_| store(addr, table)).collect();
        let names: Vec<String> = (0..n)
            .map(|i| format!("bench-pace-{}-{pass}-{i:05}", std::process::id()))
            .collect();
        let created: Vec<(Lease, Condition)> = names
            .iter()
            .map(|name| (lease(name, &format!("{name}-0")), Condition::NotExists))
            .collect();
        runtime.block_on(send(&stores, &created))?;
        let takes: Vec<(Lease, Condition)> = names
            .iter()
            .map(|name| {
                let condition = Condition::RvnIs(format!("{name}-0"));
                (lease(name, &format!("{name}-1")), condition)
            })
            .collect();
        let cpu_before = server_cpu();
        let started = Instant::now();
        runtime.block_on(send(&stores, &takes))?;
        passes.push(Pace {
            in_flight: k,
            takes: n,
            seconds: started.elapsed().as_secs_f64(),
            server_cpu_s: server_cpu() - cpu_before,
        });
    }
    Ok(passes)
}

/// Every write of `writes`, in transactions of [`WRITE_MANY_LIMIT`], the
/// transactions dealt to `stores` in turn, each store sending its share
/// one after another and all stores at once. Any write not applied is an
/// error: the records are the benchmark's own.
async fn send(stores: &[DynamoStore], writes: &[(Lease, Condition)]) -> Result<(), String> {
    let chunks: Vec<&[(Lease, Condition)]> = writes.chunks(WRITE_MANY_LIMIT).collect();
    let lanes = stores.iter().enumerate().map(|(lane, store)| {
        let mine: Vec<&[(Lease, Condition)]> = chunks
            .iter()
            .skip(lane)
            .step_by(stores.len())
            .copied()
            .collect();
        async move {
            for chunk in mine {
                let answers = store.write_many(chunk, BUDGET).await;
                for (answer, (lease, _)) in answers.iter().zip(chunk) {
                    if !matches!(answer, Ok(WriteOutcome::Applied)) {
                        return Err(format!("take of {}: {answer:?}", lease.election));
                    }
                }
            }
            Ok(())
        }
    });
    futures_util::future::try_join_all(lanes).await.map(|_| ())
}

/// The passes as a paragraph and a table, beside the takeover they bound.
pub fn report(out: &mut String, passes: &[Pace]) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "The store server alone, right before: the benchmark created {} scratch records and took each once as a daemon takes a dead one's elections (condition `rvn` as read, a hundred to a transaction, through leaderd's DynamoDB store), with no daemon running. The pace no daemon can beat on this server:\n\n| transactions in flight | {} takes in | takes a second | store server's CPU a take |\n|---:|---:|---:|---:|",
        passes.first().map_or(0, |p| p.takes),
        passes.first().map_or(0, |p| p.takes),
    );
    for p in passes {
        let per_s = p.takes as f64 / p.seconds.max(1e-3);
        let cpu_ms = p.server_cpu_s * 1e3 / (p.takes.max(1) as f64);
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {per_s:.0} | {cpu_ms:.2} ms ({:.2} cores) |",
            p.in_flight,
            p.seconds,
            p.server_cpu_s / p.seconds.max(1e-3)
        );
    }
    let _ = writeln!(out);
}
