//! The lease record and the store interface every backend implements with
//! the same semantics.
//!
//! A store knows nothing about timing: it reads one record consistently and
//! writes one record conditionally. Deciding *when* to write is the election
//! engine's job (`crate::election`).
//!
//! The rooms: this file holds the record, the conditions, the
//! [`LeaseStore`] trait and the opening of a store; [`sqlite`] and
//! [`dynamodb`] are the stores; `error` is [`StoreError`], every class of
//! failure a store can answer; `keys` names the member and session
//! records and `leaderd check`'s scratch records; `memory` is the in-process store of the engine's tests;
//! `tests` tests the record and the conditions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub mod dynamodb;
mod error;
mod keys;
#[cfg(test)]
pub(crate) mod memory;
pub mod sqlite;

pub use error::StoreError;
pub use keys::{
    CHECK_PREFIX, MEMBER_PREFIX, SESSION_PREFIX, check_key, is_check_key, is_member_key,
    is_session_key, member_key, member_records, scratch_only, session_key, session_owner,
};

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
}

/// How long opening waits for a table it creates to become ACTIVE.
const CREATE_TABLE_WAIT: Duration = Duration::from_secs(60);

/// Open the store for `leaderd run`: the SQLite file is created (and set up)
/// if missing; the DynamoDB table too when asked. No AWS region found is an
/// error (see [`dynamodb::region`]).
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
    }
}

/// Open the store only to read it (`leaderd status`): no file, table or item
/// is created, and a missing SQLite file is an error naming the path.
pub async fn open_to_read(spec: &StoreSpec) -> Result<Arc<dyn LeaseStore>, String> {
    match spec {
        StoreSpec::Sqlite(path) => sqlite::SqliteStore::open_read_only(path)
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| e.to_string()),
        StoreSpec::Dynamodb { config, .. } => {
            let config = config.resolve().await.map_err(|e| e.to_string())?;
            Ok(Arc::new(dynamodb::DynamoStore::new(&config).await))
        }
    }
}

/// What every write of a record is stamped with: a fresh `rvn` and the
/// wall-clock time (for humans and TTL only; never for a decision). The
/// election core gets its stamps from its driver, so that it reads no clock
/// and draws no random number of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The record version of the write.
    pub rvn: String,
    /// Unix ms of the write.
    pub unix_ms: u64,
}

impl Stamp {
    /// A fresh random `rvn`, at the wall clock's time now.
    pub fn now() -> Stamp {
        Stamp {
            rvn: new_rvn(),
            unix_ms: crate::clock::unix_ms(),
        }
    }
}

/// One election's lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The election's name (the key).
    pub election: String,
    /// Identity of the current leader; `None` once released.
    pub holder: Option<String>,
    /// Record version: fresh random value on every write.
    pub rvn: String,
    /// +1 (at least) on every new tenure, never on renew, never decreasing.
    pub fencing_token: u64,
    /// The lease duration the holder promises to honour, in ms.
    pub lease_ms: u64,
    /// Unix ms of the start of the tenure (for humans).
    pub acquired_at_ms: u64,
    /// Unix ms of the last write (for humans).
    pub renewed_at_ms: u64,
    /// Unix seconds after which the record is stale (for humans and TTL only).
    pub expires_at_s: u64,
    /// The holder's advertised address and labels, if any.
    pub holder_meta: Option<HolderMeta>,
    /// On a released record only: the identity the previous holder handed
    /// the lease to. For one lease only that candidate may take it at once;
    /// the others wait as if it were still held.
    pub successor: Option<String>,
    /// The key of the holder's session, when the election is held through
    /// one (see `crate::election::session`): the record's `rvn` then
    /// changes only on a new tenure, a release or a handover, and the
    /// tenure lasts as long as the session. `None`: the record is its own
    /// lease, renewed by rewriting it.
    pub session: Option<String>,
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

    /// [`Lease::stamped`], stamped with `stamp`.
    pub fn stamped_with(
        election: &str,
        holder: &str,
        fencing_token: u64,
        lease_ms: u64,
        acquired_at_ms: u64,
        holder_meta: Option<HolderMeta>,
        stamp: &Stamp,
    ) -> Lease {
        Lease {
            election: election.to_owned(),
            holder: Some(holder.to_owned()),
            rvn: stamp.rvn.clone(),
            fencing_token,
            lease_ms,
            acquired_at_ms,
            renewed_at_ms: stamp.unix_ms,
            expires_at_s: stamp.unix_ms.saturating_add(lease_ms).div_ceil(1000),
            holder_meta,
            successor: None,
            session: None,
        }
    }

    /// The next write of this tenure (a renew): a fresh `rvn`, stamped now,
    /// expiring `lease_ms` from now.
    pub fn renewed(&self) -> Lease {
        self.renewed_with(&Stamp::now())
    }

    /// [`Lease::renewed`], stamped with `stamp`.
    pub fn renewed_with(&self, stamp: &Stamp) -> Lease {
        self.clone()
            .restamped(stamp, stamp.unix_ms.saturating_add(self.lease_ms))
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

    /// [`Lease::handed_to`], stamped with `stamp`.
    pub fn handed_to_with(&self, successor: Option<String>, stamp: &Stamp) -> Lease {
        let expires_ms = if successor.is_some() {
            stamp.unix_ms.saturating_add(self.lease_ms)
        } else {
            stamp.unix_ms
        };
        Lease {
            holder: None,
            holder_meta: None,
            successor,
            session: None,
            ..self.clone()
        }
        .restamped(stamp, expires_ms)
    }

    /// This record written anew under `stamp`, stale (for humans and TTL)
    /// at unix ms `expires_ms`.
    fn restamped(self, stamp: &Stamp, expires_ms: u64) -> Lease {
        Lease {
            rvn: stamp.rvn.clone(),
            renewed_at_ms: stamp.unix_ms,
            expires_at_s: expires_ms.div_ceil(1000),
            ..self
        }
    }

    /// This record held through the session `key`: it names the session,
    /// and never goes stale by its own `expires_at` (9999-12-31), since it
    /// is not rewritten on renew; its session's does. A store's TTL must
    /// never delete a live tenure's record.
    pub fn held_through(self, key: &str) -> Lease {
        Lease {
            session: Some(key.to_owned()),
            expires_at_s: HELD_THROUGH_SESSION_EXPIRES_AT_S,
            ..self
        }
    }

    /// The `lease_ms` this record is stored with: its own, but
    /// [`HELD_THROUGH_SESSION_LEASE_MS`] for an election held through a
    /// session. Its `rvn` does not change while the tenure lasts, so a
    /// reader that does not know sessions (a build from before the
    /// `format` attribute, or another tool reading it as a plain lease)
    /// would take a live tenure over once the record stayed unchanged for
    /// its `lease_ms`: stored as a hundred years, such a reader waits
    /// instead. Readers that know sessions time the session, never this.
    pub fn stored_lease_ms(&self) -> u64 {
        if self.session.is_some() {
            HELD_THROUGH_SESSION_LEASE_MS
        } else {
            self.lease_ms
        }
    }

    /// The format this record is written in: [`FORMAT_SESSIONS`] for a
    /// session record or a record held through one, else [`FORMAT`].
    pub fn format(&self) -> u64 {
        if self.session.is_some() || is_session_key(&self.election) {
            FORMAT_SESSIONS
        } else {
            FORMAT
        }
    }

    /// Whether `candidate` may take this record at once: it is released,
    /// and handed to no one or to `candidate`. A record handed to someone
    /// else is taken like a held one, after the takeover wait.
    pub fn free_for(&self, candidate: &str) -> bool {
        self.holder.is_none() && self.successor.as_deref().is_none_or(|s| s == candidate)
    }
}

/// What a holder advertises about itself in the lease record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HolderMeta {
    /// Where the holder can be reached (e.g. its HTTP address).
    pub address: Option<String>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
}

/// The format of a record that is its own lease (renewed by rewriting
/// it): an election's or a lock's without a session, a member record. The
/// format names the layout of a record and the rules its writers follow. A
/// later release that changes them writes another number, so that a build
/// that does not know that number leaves such a record alone instead of
/// misreading it (during a rolling upgrade, a misread live lease could be
/// taken over: two leaders). Records without the `format` attribute, as
/// written before it existed, are format 1.
pub const FORMAT: u64 = 1;

/// The `expires_at` of a record held through a session: 9999-12-31
/// 23:59:59 UTC, never (see [`Lease::held_through`]).
pub const HELD_THROUGH_SESSION_EXPIRES_AT_S: u64 = 253_402_300_799;

/// The `lease_ms` an election's record held through a session is stored
/// with: a hundred years of 365.25 days (see [`Lease::stored_lease_ms`]). Small enough
/// for any reader's arithmetic (SQLite's signed integers, a duration added
/// to a monotonic instant), long enough that no live tenure outlasts it.
pub const HELD_THROUGH_SESSION_LEASE_MS: u64 = 3_155_760_000_000;

/// The format of an election's record held through a session (its `rvn`
/// does not change on renew: the session's does) and of a session record.
/// A build that knows only format 1 would time such a record by its own
/// `rvn`, and take a live one over: it must leave it alone.
pub const FORMAT_SESSIONS: u64 = 2;

/// The formats this build knows, for humans: "1 and 2".
pub fn known_formats() -> String {
    format!("{FORMAT} and {FORMAT_SESSIONS}")
}

/// Whether this build reads and writes records of `format`.
pub fn known_format(format: u64) -> bool {
    format == FORMAT || format == FORMAT_SESSIONS
}

/// A record of a format this build does not know (see [`FORMAT`]): never
/// taken over, overwritten or deleted by this build, however long it stays.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnknownFormat {
    /// The election's name.
    pub election: String,
    /// The `format` attribute as stored, for humans: `2`, or `"x"` for a
    /// string.
    pub format: String,
    /// The holder, when that attribute could be read as this build reads it.
    pub holder: Option<String>,
    /// The fencing token, likewise.
    pub fencing_token: Option<u64>,
    /// A digest of the whole stored item: changes whenever anything changes.
    pub fingerprint: String,
}

/// A record whose attributes are missing or of the wrong type.
///
/// leaderd reports it and never overwrites it unless it stayed unchanged (same
/// `fingerprint`) for a full lease; the write is then conditional on `guard`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Malformed {
    /// The election's name.
    pub election: String,
    /// What is wrong, naming the attribute, e.g. "attribute `rvn` is missing".
    pub problem: String,
    /// A digest of the whole stored item: changes whenever anything changes.
    pub fingerprint: String,
    /// The fencing token, when that one attribute could still be read.
    pub fencing_token: Option<u64>,
    /// Store-specific encoding of the item's `rvn` attribute, to make an
    /// overwrite conditional on it.
    pub guard: RvnGuard,
}

/// The raw `rvn` of a malformed record, in the store's own encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RvnGuard {
    /// The item has no `rvn` attribute.
    Missing,
    /// The item's `rvn`, encoded by the store that read it.
    Raw(String),
}

/// What a consistent read found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Record {
    /// No item for this election.
    Absent,
    /// A well-formed lease (held or released).
    Valid(Lease),
    /// An item leaderd cannot interpret.
    Malformed(Malformed),
    /// An item of a later format: see [`UnknownFormat`].
    UnknownFormat(UnknownFormat),
}

impl Record {
    /// The item's key, `None` for an absent one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Record::Absent => None,
            Record::Valid(l) => Some(&l.election),
            Record::Malformed(m) => Some(&m.election),
            Record::UnknownFormat(u) => Some(&u.election),
        }
    }
}

/// The condition a write is made under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Create: no item exists.
    NotExists,
    /// Take over a released or expired lease: the item still has this `rvn`.
    RvnIs(String),
    /// Renew or release: the item has this `rvn` and this holder.
    HeldBy {
        /// The rvn of the holder's last write.
        rvn: String,
        /// The holder's identity.
        holder: String,
    },
    /// Overwrite a malformed item that still has this raw `rvn`.
    Unchanged(RvnGuard),
    /// The item names this holder, whatever its `rvn`: a defect the
    /// election core's model checker must catch (tests only; no store
    /// writes under it).
    #[cfg(test)]
    HolderIs(String),
}

impl Condition {
    /// Whether a write under this condition would apply to `current`: the
    /// one statement of the rules, which every store implements and the
    /// stores' tests check against. `raw_rvn` is the item's `rvn` in the
    /// store's own encoding (`None` when unknown: then `Unchanged` matches
    /// only a malformed item, by its guard).
    ///
    /// `Unchanged` matches any item whose raw `rvn` is the guard, valid or
    /// not: DynamoDB can only test the raw attribute, so every store does
    /// the same. That is safe: every write of a candidate brings a fresh
    /// `rvn`, so an item that still has the observed one was written by no
    /// candidate since.
    ///
    /// No condition holds on an item of an unknown format, whatever its
    /// raw `rvn`: what this build would write over it could end a live
    /// lease it cannot read.
    pub fn holds(&self, current: &Record, raw_rvn: Option<&RvnGuard>) -> bool {
        match (self, current) {
            (_, Record::UnknownFormat(_)) => false,
            (Condition::NotExists, Record::Absent) => true,
            (Condition::RvnIs(rvn), Record::Valid(l)) => &l.rvn == rvn,
            (Condition::HeldBy { rvn, holder }, Record::Valid(l)) => {
                &l.rvn == rvn && l.holder.as_deref() == Some(holder.as_str())
            }
            (Condition::Unchanged(guard), Record::Malformed(m)) => &m.guard == guard,
            (Condition::Unchanged(guard), Record::Valid(_)) => raw_rvn == Some(guard),
            #[cfg(test)]
            (Condition::HolderIs(holder), Record::Valid(l)) => {
                l.holder.as_deref() == Some(holder.as_str())
            }
            _ => false,
        }
    }
}

/// The answer to a conditional write. A failed condition is an answer, not an
/// error: someone else wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // One per write answered, never kept in bulk: boxing would buy nothing.
pub enum WriteOutcome {
    /// The write happened.
    Applied,
    /// The condition did not hold. `current` is the record the store returned
    /// with its refusal, when it returns one (not every server does).
    ConditionFailed {
        /// The record as the store saw it, if it said.
        current: Option<Record>,
    },
}

/// What a sweep ([`LeaseStore::sweep_sessions`]) asks of the session
/// records it read: those to delete.
pub type SessionJudge<'a> = dyn FnMut(&[Record]) -> Vec<StaleSession> + Send + 'a;

/// A session record a sweep deletes, if it still has the `rvn` it was
/// judged by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StaleSession {
    /// The session record's key.
    pub key: String,
    /// The `rvn` it was judged by.
    pub rvn: String,
}

/// The most records [`LeaseStore::read_many`] is asked for at once (a
/// DynamoDB `BatchGetItem` reads at most 100 items).
pub const READ_MANY_LIMIT: usize = 100;

/// A lease store. Every implementation gives the same semantics: reads are
/// strongly consistent, writes are conditional ([`Condition::holds`]) and
/// atomic.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Short name for logs and metrics ("sqlite", "dynamodb", "memory").
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

    /// Read every session record (see `crate::election::session`) in one
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
                Ok(Record::Valid(current)) if current.rvn == lease.rvn => {
                    tracing::debug!(election = %lease.election, "ambiguous write resolved by read-back: applied");
                    return Ok(WriteOutcome::Applied);
                }
                // A writer of a later format owns the record now, whatever
                // became of ours: lost, never retried over it.
                Ok(current @ Record::UnknownFormat(_)) => {
                    return Ok(WriteOutcome::ConditionFailed {
                        current: Some(current),
                    });
                }
                // Not applied, and the condition still holds: nobody else
                // wrote, so this is the original (retryable) error, not a
                // lost lease.
                Ok(current) if condition.holds(&current, None) => return Err(err),
                Ok(current) => {
                    return Ok(WriteOutcome::ConditionFailed {
                        current: Some(current),
                    });
                }
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

/// A fresh random record version.
pub fn new_rvn() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests;
