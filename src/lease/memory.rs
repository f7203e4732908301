//! An in-process lease store with the exact condition semantics of the real
//! ones, plus fault injection. It backs the election engine's paused-clock
//! tests; it is not selectable in the configuration.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Condition, Lease, LeaseStore, Record, RvnGuard, StoreError, UnknownFormat, WriteOutcome,
};

/// How the store misbehaves, set by tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Answer normally.
    #[default]
    None,
    /// Refuse every request with a transport error.
    Unreachable,
    /// Never answer (the caller's budget runs out).
    Blackhole,
    /// Apply writes but answer with a timeout.
    LoseWriteAnswers,
    /// Answer writes with a timeout without applying them.
    TimeOutWrites,
    /// Answer reads; refuse every write with a credentials error (a policy
    /// that lacks the write permission).
    RefuseWrites,
    /// Answer normally, this much later.
    Slow(Duration),
}

/// In-memory store; clones share the same data.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    items: BTreeMap<String, Record>,
    fault: Fault,
    writes: u64,
    reads: u64,
    /// Writes asked for, by key.
    written: BTreeMap<String, u64>,
    /// Requests waiting out [`Fault::Slow`] now, and at most so far.
    slowed: usize,
    most_slowed: usize,
    /// The size of each [`LeaseStore::write_many`] asked for, in order.
    batches: Vec<usize>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the fault mode.
    pub fn set_fault(&self, fault: Fault) {
        self.lock().fault = fault;
    }

    /// The stored record, bypassing faults.
    pub fn get(&self, election: &str) -> Record {
        self.lock()
            .items
            .get(election)
            .cloned()
            .unwrap_or(Record::Absent)
    }

    /// Replace or delete (with `Record::Absent`) an item, as another tool
    /// (or a later release: `Record::UnknownFormat`) would.
    pub fn set(&self, election: &str, record: Record) {
        let mut inner = self.lock();
        match record {
            Record::Absent => inner.items.remove(election),
            r => inner.items.insert(election.to_owned(), r),
        };
    }

    /// Put a record of format `format` (one this build does not know) for
    /// `election`, held by `holder` under `token`, as a later release would
    /// write it; returns it. The same arguments give the same record.
    pub fn plant_unknown_format(
        &self,
        election: &str,
        format: &str,
        holder: Option<&str>,
        token: Option<u64>,
    ) -> Record {
        let record = Record::UnknownFormat(UnknownFormat {
            election: election.to_owned(),
            format: format.to_owned(),
            holder: holder.map(str::to_owned),
            fencing_token: token,
            fingerprint: format!("{format}/{holder:?}/{token:?}"),
        });
        self.set(election, record.clone());
        record
    }

    /// The most requests that were in the store at once, as far as
    /// [`Fault::Slow`] shows (it holds each for its delay).
    pub fn most_at_once(&self) -> usize {
        self.lock().most_slowed
    }

    /// Writes asked for so far of the records whose keys start with
    /// `prefix`, applied or not.
    pub fn writes_to(&self, prefix: &str) -> u64 {
        let inner = self.lock();
        inner
            .written
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }

    /// The size of each [`LeaseStore::write_many`] asked for so far, in
    /// order (its writes are made one by one, as by default).
    pub fn batches(&self) -> Vec<usize> {
        self.lock().batches.clone()
    }

    /// Number of (reads, writes) answered so far.
    pub fn counts(&self) -> (u64, u64) {
        let inner = self.lock();
        (inner.reads, inner.writes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock is a test failure already; keep going
        // with the data as it is rather than poisoning every later call.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn fault(&self, budget: Duration) -> Result<Fault, StoreError> {
        let fault = self.lock().fault;
        match fault {
            Fault::Unreachable => Err(StoreError::Transport(
                "connection refused (injected)".into(),
            )),
            Fault::Blackhole => {
                tokio::time::sleep(budget).await;
                Err(StoreError::Timeout(budget))
            }
            Fault::Slow(d) => {
                {
                    let mut inner = self.lock();
                    inner.slowed += 1;
                    inner.most_slowed = inner.most_slowed.max(inner.slowed);
                }
                tokio::time::sleep(d).await;
                self.lock().slowed -= 1;
                Ok(fault)
            }
            f => Ok(f),
        }
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn write_many(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        self.lock().batches.push(writes.len());
        super::write_each(self, writes, budget).await
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        self.fault(budget).await?;
        let mut inner = self.lock();
        inner.reads += 1;
        Ok(inner.items.get(election).cloned().unwrap_or(Record::Absent))
    }

    /// One request, as a store's read of many is: one wait of a fault,
    /// then every record (each counted as a read).
    async fn read_many(
        &self,
        elections: &[String],
        budget: Duration,
    ) -> Result<Vec<Record>, StoreError> {
        self.fault(budget).await?;
        let mut inner = self.lock();
        inner.reads += elections.len() as u64;
        Ok(elections
            .iter()
            .map(|e| inner.items.get(e).cloned().unwrap_or(Record::Absent))
            .collect())
    }

    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let fault = self.fault(budget).await?;
        let mut inner = self.lock();
        inner.writes += 1;
        *inner.written.entry(lease.election.clone()).or_default() += 1;
        if fault == Fault::RefuseWrites {
            return Err(StoreError::Credentials(
                "not authorized to write (injected)".into(),
            ));
        }
        if fault == Fault::TimeOutWrites {
            return Err(StoreError::Timeout(budget));
        }
        let current = inner
            .items
            .get(&lease.election)
            .cloned()
            .unwrap_or(Record::Absent);
        let raw_rvn = match &current {
            Record::Valid(l) => Some(RvnGuard::Raw(l.rvn.clone())),
            _ => None,
        };
        if !condition.holds(&current, raw_rvn.as_ref()) {
            return Ok(WriteOutcome::ConditionFailed {
                current: Some(current),
            });
        }
        // Stored as the other stores store it.
        let stored = Lease {
            lease_ms: lease.stored_lease_ms(),
            ..lease.clone()
        };
        inner
            .items
            .insert(lease.election.clone(), Record::Valid(stored));
        if fault == Fault::LoseWriteAnswers {
            return Err(StoreError::Timeout(budget));
        }
        Ok(WriteOutcome::Applied)
    }

    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        self.fault(budget).await?;
        Ok(self.lock().items.values().cloned().collect())
    }

    async fn check(&self, budget: Duration) -> Result<(), StoreError> {
        self.fault(budget).await.map(|_| ())
    }

    async fn delete_check_record(
        &self,
        key: &str,
        rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        super::scratch_only(key)?;
        let fault = self.fault(budget).await?;
        let mut inner = self.lock();
        inner.writes += 1;
        if fault == Fault::RefuseWrites {
            return Err(StoreError::Credentials(
                "not authorized to write (injected)".into(),
            ));
        }
        match inner.items.get(key) {
            Some(Record::Valid(l)) if l.rvn == rvn => {
                inner.items.remove(key);
                Ok(WriteOutcome::Applied)
            }
            current => Ok(WriteOutcome::ConditionFailed {
                current: Some(current.cloned().unwrap_or(Record::Absent)),
            }),
        }
    }
}
