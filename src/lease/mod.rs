//! The store interface every backend implements with the same semantics,
//! and the opening of a store.
//!
//! A store knows nothing about timing: it reads one record consistently and
//! writes one record conditionally. Deciding *when* to write is the election
//! engine's job (`crate::election`). The record, its conditions, its keys
//! and [`StoreError`] are plain data and live in the pure core
//! (`crate::core::record`, `keys`, `store_error`); they are re-exported
//! here, where the stores use them.
//!
//! The rooms: this file holds the [`LeaseStore`] trait, the opening of a
//! store, and the record's writes stamped now (a random `rvn`, the wall
//! clock); [`sqlite`], [`dynamodb`] and [`postgres`] are the stores;
//! `memory` is the in-process store of the engine's tests; `tests` tests
//! what every store does alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub mod dynamodb;
#[cfg(test)]
pub(crate) mod memory;
pub mod postgres;
pub mod sqlite;

pub use crate::core::keys::{
    CHECK_PREFIX, MEMBER_PREFIX, SESSION_PREFIX, check_key, is_check_key, is_member_key,
    is_session_key, member_key, member_records, scratch_only, session_key, session_owner,
};
pub use crate::core::record::{
    Condition, FORMAT, FORMAT_SESSIONS, FORMAT_SLOTS, HELD_THROUGH_SESSION_EXPIRES_AT_S,
    HELD_THROUGH_SESSION_LEASE_MS, HolderMeta, KNOWN_FORMATS, Lease, Malformed, Record, RvnGuard,
    StaleSession, Stamp, UnknownFormat, WriteOutcome, known_format, known_formats,
};
pub use crate::core::store_error::StoreError;

/// Which store to open: what the configuration's `[store]` section comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The SQLite file at this path.
    Sqlite(PathBuf),
    /// A DynamoDB table; `create_table`: create it at start if missing.
    Dynamodb {
        /// Where the table is (its region is resolved on opening).
        config: dynamodb::DynamoSpec,
        /// Create the table at start if it is missing.
        create_table: bool,
    },
    /// A PostgreSQL table.
    Postgres {
        /// The server, the table and how to connect.
        config: postgres::PostgresSpec,
        /// Create the table at start if it is missing.
        create_table: bool,
    },
}

/// How long opening waits for a table it creates to become ACTIVE.
const CREATE_TABLE_WAIT: Duration = Duration::from_secs(60);

/// Open the store for `leaderd run`: the SQLite file is created (and set up)
/// if missing; the DynamoDB or PostgreSQL table too when asked. No AWS
/// region found is an error (see [`dynamodb::region`]), and so is a
/// PostgreSQL server that answers but cannot serve (see
/// [`postgres::PostgresStore::open`]).
pub async fn open(spec: &StoreSpec) -> Result<Arc<dyn LeaseStore>, String> {
    match spec {
        StoreSpec::Sqlite(path) => sqlite::SqliteStore::open(path)
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| e.to_string()),
        StoreSpec::Dynamodb {
            config,
            create_table,
        } => {
            let config = config.resolve().await.map_err(|e| e.to_string())?;
            let store = dynamodb::DynamoStore::new(&config).await;
            if *create_table {
                store
                    .create_table(false, CREATE_TABLE_WAIT)
                    .await
                    .map_err(|e| format!("cannot create table `{}`: {e}", config.table))?;
            }
            Ok(Arc::new(store))
        }
        StoreSpec::Postgres {
            config,
            create_table,
        } => postgres::PostgresStore::open(config, *create_table, false)
            .await
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| e.to_string()),
    }
}

/// Open the store only to read it (`leaderd status`): no file, table or item
/// is created, and a missing SQLite file is an error naming the path.
/// PostgreSQL: as [`open`] checks it.
pub async fn open_to_read(spec: &StoreSpec) -> Result<Arc<dyn LeaseStore>, String> {
    match spec {
        StoreSpec::Sqlite(path) => sqlite::SqliteStore::open_read_only(path)
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| e.to_string()),
        StoreSpec::Dynamodb { config, .. } => {
            let config = config.resolve().await.map_err(|e| e.to_string())?;
            Ok(Arc::new(dynamodb::DynamoStore::new(&config).await))
        }
        StoreSpec::Postgres { config, .. } => postgres::PostgresStore::open(config, false, true)
            .await
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| e.to_string()),
    }
}

// The record's writes stamped now: a fresh random `rvn` and the wall
// clock. Here, beside the stores, because the core reads no clock and
// draws no random number; it is handed its stamps.
impl Stamp {
    /// A fresh random `rvn`, at the wall clock's time now.
    pub fn now() -> Stamp {
        Stamp::new(new_rvn(), crate::clock::unix_ms())
    }
}

impl Lease {
    /// A new write of `holder`'s lease: a fresh `rvn`, stamped now, expiring
    /// `lease_ms` from now (for humans and TTL).
    pub fn stamped(
        election: &str,
        holder: &str,
        fencing_token: u64,
        lease_ms: u64,
        acquired_at_ms: u64,
        holder_meta: Option<HolderMeta>,
    ) -> Lease {
        Lease::stamped_with(
            election,
            holder,
            fencing_token,
            lease_ms,
            acquired_at_ms,
            holder_meta,
            &Stamp::now(),
        )
    }

    /// The next write of this tenure (a renew): a fresh `rvn`, stamped now,
    /// expiring `lease_ms` from now.
    pub fn renewed(&self) -> Lease {
        self.renewed_with(&Stamp::now())
    }

    /// This lease given up: no holder, a fresh `rvn`, stamped now, the same
    /// fencing token (the next holder's is higher).
    pub fn released(&self) -> Lease {
        self.handed_to(None)
    }

    /// This lease given up to `successor` (to anyone when `None`): like
    /// [`Lease::released`], with the successor recorded. The lease still
    /// counts for one `lease_ms` against everyone else.
    pub fn handed_to(&self, successor: Option<String>) -> Lease {
        self.handed_to_with(successor, &Stamp::now())
    }
}

/// What a sweep ([`LeaseStore::sweep_sessions`]) asks of the session
/// records it read: those to delete.
pub type SessionJudge<'a> = dyn FnMut(&[Record]) -> Vec<StaleSession> + Send + 'a;

/// The most records [`LeaseStore::read_many`] is asked for at once (a
/// DynamoDB `BatchGetItem` reads at most 100 items).
pub const READ_MANY_LIMIT: usize = 100;

/// Writes in one [`LeaseStore::write_many`] at most: DynamoDB's limit of
/// items in one transaction.
pub const WRITE_MANY_LIMIT: usize = 100;

/// A lease store. Every implementation gives the same semantics: reads are
/// strongly consistent, writes are conditional ([`Condition::holds`]) and
/// atomic.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Short name for logs and metrics ("sqlite", "dynamodb", "postgres",
    /// "memory").
    fn kind(&self) -> &'static str;

    /// Strongly consistent read of one election's record, within `budget`.
    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError>;

    /// Strongly consistent reads of the records of `elections` (at most
    /// [`READ_MANY_LIMIT`]), in that order, within `budget` for all of
    /// them: what a daemon holding elections through its session checks
    /// them with (a record deleted or rewritten under it). By default one
    /// [`LeaseStore::read`] each; a store that can read many in one request
    /// does so.
    async fn read_many(
        &self,
        elections: &[String],
        budget: Duration,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records = Vec::with_capacity(elections.len());
        for election in elections {
            records.push(self.read(election, budget).await?);
        }
        Ok(records)
    }

    /// Conditional writes of distinct records (at most
    /// [`WRITE_MANY_LIMIT`]), each answered as [`LeaseStore::write`]
    /// answers it, ambiguity resolved, within `budget` for all of them:
    /// what a daemon takes many free elections with at once (a daemon that
    /// held them died). By default one [`LeaseStore::write`] each, all at
    /// once; a store that can make many in one request does so, and may
    /// then apply all of them or none, never some.
    async fn write_many(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        write_each(self, writes, budget).await
    }

    /// One conditional write of the whole record, within `budget`. Does not
    /// resolve ambiguity: use [`LeaseStore::write`].
    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError>;

    /// Every item in the store, election and member records alike, read
    /// consistently.
    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError>;

    /// Every election's record (for `leaderd status` with no names): the
    /// store's items without the member and session records and the
    /// scratch records of `leaderd check`.
    async fn list(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        let mut records = self.scan(budget).await?;
        records.retain(|r| {
            !r.key()
                .is_some_and(|k| is_member_key(k) || is_session_key(k) || is_check_key(k))
        });
        Ok(records)
    }

    /// Every well-formed member record (see `crate::balance`). May be read
    /// eventually consistently: membership is advice, never a reason to
    /// write an election's record.
    async fn members(&self, budget: Duration) -> Result<Vec<Lease>, StoreError> {
        Ok(member_records(self.scan(budget).await?))
    }

    /// Read every session record (see `crate::core::session`) in one
    /// go, hand them to `judge` once the read has answered, and delete
    /// those it names, each only if it still has the `rvn` it was judged
    /// by (a session renewed or ended meanwhile stays, and so does a record
    /// of a format this build does not know); say how many went. The store
    /// judges nothing itself: when a session is over is the election's
    /// rule. An election that still names a deleted session is then timed
    /// like one whose session is missing: safe, one lease slower.
    ///
    /// By default nothing is read, judged or deleted: DynamoDB's TTL
    /// deletes expired items itself.
    async fn sweep_sessions(
        &self,
        _judge: &mut SessionJudge<'_>,
        _budget: Duration,
    ) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Delete `leaderd check`'s scratch record `key` if its `rvn` is still
    /// `rvn`: `Applied`, else `ConditionFailed` (absent, or another `rvn`).
    /// Only a scratch record's key ([`is_check_key`]) is deleted; any other
    /// is refused before a request is made (see [`scratch_only`]): leaderd
    /// deletes no election's record, whose fencing token must survive. By
    /// default refused: the stores `leaderd check` uses implement it.
    async fn delete_check_record(
        &self,
        key: &str,
        _rvn: &str,
        _budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        scratch_only(key)?;
        Err(StoreError::Other(format!(
            "the {} store cannot delete records",
            self.kind()
        )))
    }

    /// Check that the store is reachable and usable (table exists, is ACTIVE,
    /// has the right schema). Used at start and by `fail_fast`.
    async fn check(&self, budget: Duration) -> Result<(), StoreError>;

    /// A counter that moves each time the store notices that the data it
    /// works on was replaced under it (a SQLite file deleted or swapped for
    /// another). A leader then renews at once: that conditional write,
    /// against what the store names now, decides whether it still leads.
    /// `None`: this store cannot tell (a deleted DynamoDB item is noticed
    /// by the next renew's condition).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// A conditional write whose ambiguous failure (timeout, 5xx after sending)
    /// is resolved by a consistent read-back: if the record carries our new
    /// `rvn`, the write happened (every write brings a fresh one).
    async fn write(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let started = tokio::time::Instant::now();
        let err = match self.put(lease, condition, budget).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) if e.maybe_applied() => e,
            Err(e) => return Err(e),
        };
        // Read back until one read answers or the budget is spent. A read never
        // changes anything, so retrying it is always safe.
        loop {
            let left = budget.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(err);
            }
            match self.read(&lease.election, left).await {
                Ok(current) => return settle(lease, condition, current, &err),
                Err(_) => {
                    let pause =
                        Duration::from_millis(50).min(budget.saturating_sub(started.elapsed()));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Create the record: succeeds only if no item exists.
    async fn create(&self, lease: &Lease, budget: Duration) -> Result<WriteOutcome, StoreError> {
        self.write(lease, &Condition::NotExists, budget).await
    }

    /// Take over a released or expired lease last seen with `observed_rvn`.
    async fn take_over(
        &self,
        lease: &Lease,
        observed_rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        self.write(lease, &Condition::RvnIs(observed_rvn.to_owned()), budget)
            .await
    }

    /// Renew: `lease` carries the new rvn; `my_rvn` is the one of our last write.
    async fn renew(
        &self,
        lease: &Lease,
        my_rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let holder = lease.holder.clone().unwrap_or_default();
        let cond = Condition::HeldBy {
            rvn: my_rvn.to_owned(),
            holder,
        };
        self.write(lease, &cond, budget).await
    }

    /// Release: `released` has no holder and a fresh rvn; the item is kept so
    /// the fencing token survives.
    async fn release(
        &self,
        released: &Lease,
        my_rvn: &str,
        me: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let cond = Condition::HeldBy {
            rvn: my_rvn.to_owned(),
            holder: me.to_owned(),
        };
        self.write(released, &cond, budget).await
    }
}

/// `writes` each by itself ([`LeaseStore::write`]), all at once, within
/// `budget`.
pub(crate) async fn write_each<S: LeaseStore + ?Sized>(
    store: &S,
    writes: &[(Lease, Condition)],
    budget: Duration,
) -> Vec<Result<WriteOutcome, StoreError>> {
    futures_util::future::join_all(
        writes
            .iter()
            .map(|(lease, condition)| store.write(lease, condition, budget)),
    )
    .await
}

/// Writes made together that failed with `error` after they may have been
/// applied: read their records (again, 50 ms apart, until a read answers
/// or `deadline` passes) and answer each as [`LeaseStore::write`]'s
/// read-back answers one.
pub(crate) async fn settle_many(
    store: &dyn LeaseStore,
    writes: &[(Lease, Condition)],
    error: StoreError,
    deadline: tokio::time::Instant,
) -> Vec<Result<WriteOutcome, StoreError>> {
    let keys: Vec<String> = writes.iter().map(|(l, _)| l.election.clone()).collect();
    let records = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return writes.iter().map(|_| Err(error.clone())).collect();
        }
        match store.read_many(&keys, left).await {
            Ok(records) => break records,
            Err(_) => tokio::time::sleep(Duration::from_millis(50).min(left)).await,
        }
    };
    writes
        .iter()
        .zip(records)
        .map(|((lease, condition), current)| settle(lease, condition, current, &error))
        .collect()
}

/// What an ambiguous write of `lease` under `condition`, which failed with
/// `err`, came to, from `current`, the record read back after it.
pub(crate) fn settle(
    lease: &Lease,
    condition: &Condition,
    current: Record,
    err: &StoreError,
) -> Result<WriteOutcome, StoreError> {
    match current {
        Record::Valid(ref now) if now.rvn == lease.rvn => {
            tracing::debug!(election = %lease.election, "ambiguous write resolved by read-back: applied");
            Ok(WriteOutcome::Applied)
        }
        // A writer of a later format owns the record now, whatever became
        // of ours: lost, never retried over it.
        current @ Record::UnknownFormat(_) => Ok(WriteOutcome::ConditionFailed {
            current: Some(current),
        }),
        // Not applied, and the condition still holds: nobody else wrote, so
        // this is the original (retryable) error, not a lost lease.
        current if condition.holds(&current, None) => Err(err.clone()),
        current => Ok(WriteOutcome::ConditionFailed {
            current: Some(current),
        }),
    }
}

/// A fresh random record version.
pub fn new_rvn() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests;
