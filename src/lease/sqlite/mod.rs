//! The SQLite lease store: one file, shared safely by every leaderd process
//! on the host.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction that reads the current
//! row, checks the condition and writes: the immediate transaction takes the
//! file's write lock before the read, so two processes can never both see the
//! same row and both win. Reads in WAL mode see the last committed write, which
//! is the strong consistency the election needs.
//!
//! SQLite is blocking, so requests run on tokio's blocking pool, in two
//! lanes of fixed size (one writer connection, a few readers), each request
//! bounded by its budget ([`lanes`]). A write that overran its budget may
//! still commit, which is what `StoreError::Timeout` says;
//! [`LeaseStore::write`] resolves it by reading back.
//!
//! The rooms: this file is the store (opening the file, noticing it was
//! replaced) and its queries; [`schema`] creates, upgrades and checks the
//! table; [`lanes`] hands out the connections; [`row`] reads a row,
//! whatever SQLite stored in it; `file_watch` watches the file's directory;
//! `tests` are its unit tests, `sweep_tests` those of the sweep of session
//! records.
//!
//! Columns are not type-checked by SQLite (no STRICT table), so a row written
//! by another tool may hold anything; such a row is read as
//! [`Record::Malformed`] and never panics anything.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::watch;

mod file_watch;
mod lanes;
mod row;
mod schema;
#[cfg(test)]
mod sweep_tests;
#[cfg(test)]
mod tests;

use lanes::{LaneKind, Lanes, configure};
use row::Row;
use schema::{COLUMNS, check_blocking, lacking_columns, missing_table, set_up};

use super::{
    Condition, Lease, LeaseStore, MEMBER_PREFIX, Record, SESSION_PREFIX, SessionJudge,
    StaleSession, StoreError, WriteOutcome, is_session_key, member_records,
};

/// The table every lease lives in.
pub const TABLE: &str = "leases";

/// The queries that read rows, on a file whose table may lack some of the
/// [`schema::ADDED_COLUMNS`] (made by an older leaderd and opened only to be
/// read): those read as null.
#[derive(Debug)]
struct Selects {
    /// One election's row: `?1`.
    one: Arc<str>,
    /// Every row.
    all: Arc<str>,
    /// The member or the session records: the keys from `?1` (the
    /// prefix) up to `?2` (the prefix with its last byte raised), a range
    /// of the key's index.
    range: Arc<str>,
}

impl Selects {
    /// The queries for a table that lacks the columns `lacking`.
    fn lacking(lacking: &[&str]) -> Selects {
        let list = COLUMNS
            .iter()
            .map(|c| if lacking.contains(c) { "NULL" } else { c })
            .collect::<Vec<_>>()
            .join(", ");
        Selects {
            one: format!("SELECT {list} FROM leases WHERE election = ?1").into(),
            all: format!("SELECT {list} FROM leases ORDER BY election").into(),
            range: format!(
                "SELECT {list} FROM leases WHERE election >= ?1 AND election < ?2 \
                 ORDER BY election"
            )
            .into(),
        }
    }
}

const UPSERT: &str = "INSERT OR REPLACE INTO leases (election, holder, rvn, fencing_token, \
     lease_ms, acquired_at, renewed_at, expires_at, holder_meta, successor, format, session) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// The most session records a sweep deletes in one transaction: each
/// holds the file's write lock (and the store's one writer connection)
/// for a few milliseconds at most, so renewals of every process on the
/// file go on in between.
const DELETES_PER_TRANSACTION: usize = 256;

/// How long opening a store may wait for other processes that hold the
/// file's lock: instances started together on a fresh file take turns
/// switching it to WAL and creating the table.
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// A lease store in one SQLite file, shared by the processes of one host.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// What a store may do to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// `leaderd run`: creates the file and the table, writes.
    ReadWrite,
    /// `leaderd status`: reads an existing file and changes nothing.
    ReadOnly,
}

/// The file a path names (device and inode): another value, or none, means
/// the file was deleted or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    access: Access,
    /// How rows are read: every column, or (a file made by an older
    /// leaderd, opened only to be read) null for the columns it lacks.
    selects: Selects,
    /// The connections, a writer and a few readers (see [`lanes`]).
    lanes: Lanes,
    /// The file the connections have open and its generation, which moves
    /// each time the path is found to name another file (or none) and the
    /// store reopens it. Connections of an older generation are dropped.
    file: Mutex<(FileId, u64)>,
    /// Counts the times the path was seen to name another file: a leader
    /// renews at once, and the renew, made against what the path names now,
    /// decides whether it still leads.
    changes: watch::Sender<u64>,
}

impl SqliteStore {
    /// Open (creating if missing) the store at `path`: the file, WAL mode and
    /// the `leases` table, waiting for other processes that are opening it
    /// at the same moment. Errors name the path. The store then watches the
    /// path: see [`LeaseStore::changes`].
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let conn = set_up(path, Instant::now() + OPEN_WAIT)?;
        let id = FileId::of(path).ok_or_else(|| {
            StoreError::Other(format!(
                "SQLite lease store {} vanished while it was opened",
                path.display()
            ))
        })?;
        let store = Self::with(path, Access::ReadWrite, &[], id, conn);
        if let Err(e) = file_watch::start(&store.inner) {
            // The per-request check still notices, at the next request.
            tracing::warn!(path = %path.display(), error = %e, "cannot watch the SQLite lease store's directory; a deleted file is noticed at the next request");
        }
        Ok(store)
    }

    /// Open an existing store to read it only (`leaderd status`): nothing is
    /// created or changed, and a user who may only read the file can use it.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        let Some(id) = FileId::of(path) else {
            return Err(StoreError::Other(format!(
                "SQLite lease store {} does not exist (`leaderd run` creates it)",
                path.display()
            )));
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags)
            .map_err(|e| open_error(path, "cannot open", &e))?;
        configure(&mut conn).map_err(|e| open_error(path, "cannot configure", &e))?;
        let lacking = lacking_columns(&conn)
            .map_err(|e| open_error(path, "cannot read the schema of", &e))?;
        Ok(Self::with(path, Access::ReadOnly, &lacking, id, conn))
    }

    fn with(
        path: &Path,
        access: Access,
        lacking: &[&str],
        id: FileId,
        conn: Connection,
    ) -> SqliteStore {
        SqliteStore {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                access,
                selects: Selects::lacking(lacking),
                lanes: Lanes::new(conn),
                file: Mutex::new((id, 0)),
                changes: watch::Sender::new(0),
            }),
        }
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Inner {
    /// The generation of the file the path names now. When the path no
    /// longer names the file the store has open (deleted, or replaced by
    /// another), it is opened anew (created if missing), as `leaderd run`
    /// would open it: every lease held in the old file is gone with it, and
    /// the conditional writes against the new one say so.
    fn current_file(&self, deadline: Instant) -> Result<u64, StoreError> {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if self.access == Access::ReadOnly || FileId::of(&self.path) == Some(file.0) {
            return Ok(file.1);
        }
        tracing::warn!(path = %self.path.display(), "the SQLite lease store file was deleted or replaced; opening what the path names now (leases held in the old file are lost)");
        let conn = set_up(&self.path, deadline)?;
        drop(conn);
        let id = FileId::of(&self.path).ok_or_else(|| {
            StoreError::Other(format!(
                "SQLite lease store {} vanished while it was reopened",
                self.path.display()
            ))
        })?;
        *file = (id, file.1 + 1);
        self.changes.send_modify(|n| *n += 1);
        Ok(file.1)
    }

    /// Whether the path still names the file the store has open.
    fn file_is_current(&self) -> bool {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        FileId::of(&self.path) == Some(file.0)
    }
}

fn open_error(path: &Path, what: &str, e: &rusqlite::Error) -> StoreError {
    StoreError::Other(format!("{what} SQLite lease store {}: {e}", path.display()))
}

/// Map a SQLite error to the store's error classes.
fn classify(path: &Path, budget: Duration, e: &rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Timeout(budget),
        // An I/O error during commit may or may not have made the write
        // durable: treat it like a 5xx so the caller reads back.
        Some(ErrorCode::SystemIoFailure) => {
            StoreError::Server(format!("SQLite I/O error on {}: {e}", path.display()))
        }
        _ if e.to_string().contains("no such table") => missing_table(path),
        _ => StoreError::Other(format!("SQLite error on {}: {e}", path.display())),
    }
}

/// Whether a write under `condition` applies to the row: the rules of
/// [`Condition::holds`], given the row's raw `rvn`.
fn holds(current: Option<&Row>, condition: &Condition) -> bool {
    match current {
        None => condition.holds(&Record::Absent, None),
        Some(row) => condition.holds(&row.to_record(), Some(&row.guard())),
    }
}

fn read_row(conn: &Connection, sql: &str, election: &str) -> rusqlite::Result<Option<Row>> {
    conn.query_row(sql, [election], Row::from_sql).optional()
}

/// The rows whose keys start with `prefix` (`#member/` or `#session/`),
/// read with the `range` query: one range of the key's index.
fn read_range(
    conn: &Connection,
    path: &Path,
    budget: Duration,
    sql: &str,
    prefix: &str,
) -> Result<Vec<Row>, StoreError> {
    let err = |e: rusqlite::Error| classify(path, budget, &e);
    // "#member/" .. "#member0": '0' follows '/'.
    let upper = format!("{}0", prefix.trim_end_matches('/'));
    let mut stmt = conn.prepare(sql).map_err(err)?;
    stmt.query_map([prefix, upper.as_str()], Row::from_sql)
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(err)
}

/// Delete the session records of `stale` that still have the `rvn` they
/// were judged by, in one transaction: how many went.
fn delete_stale_blocking(
    conn: &mut Connection,
    path: &Path,
    budget: Duration,
    deadline: Instant,
    select_one: &str,
    stale: &[StaleSession],
) -> Result<u64, StoreError> {
    let sql_err = |e: rusqlite::Error| classify(path, budget, &e);
    // IMMEDIATE, as for a write: nobody writes between a check and its
    // delete.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_err)?;
    if Instant::now() >= deadline {
        return Err(StoreError::Timeout(budget));
    }
    let mut deleted = 0;
    {
        let mut select = tx.prepare_cached(select_one).map_err(sql_err)?;
        let mut delete = tx
            .prepare_cached("DELETE FROM leases WHERE election = ?1")
            .map_err(sql_err)?;
        for s in stale.iter().filter(|s| is_session_key(&s.key)) {
            let current = select
                .query_row([&s.key], Row::from_sql)
                .optional()
                .map_err(sql_err)?;
            // The rules of a write conditional on that `rvn`: a record
            // written since, or of a format this build does not know,
            // stays.
            if !holds(current.as_ref(), &Condition::RvnIs(s.rvn.clone())) {
                continue;
            }
            deleted += delete.execute([&s.key]).map_err(sql_err)? as u64;
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(deleted)
}

fn to_i64(column: &str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| {
        StoreError::Other(format!(
            "`{column}` = {v} does not fit in SQLite's 64-bit signed integer"
        ))
    })
}

/// Write `lease` if `condition` holds on the row `select_one` reads.
fn put_blocking(
    conn: &mut Connection,
    path: &Path,
    budget: Duration,
    deadline: Instant,
    select_one: &str,
    lease: &Lease,
    condition: &Condition,
) -> Result<WriteOutcome, StoreError> {
    let sql_err = |e: rusqlite::Error| classify(path, budget, &e);
    let meta = lease
        .holder_meta
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Other(format!("cannot encode holder_meta: {e}")))?;
    let values = (
        to_i64("fencing_token", lease.fencing_token)?,
        to_i64("lease_ms", lease.stored_lease_ms())?,
        to_i64("acquired_at", lease.acquired_at_ms)?,
        to_i64("renewed_at", lease.renewed_at_ms)?,
        to_i64("expires_at", lease.expires_at_s)?,
        to_i64("format", lease.format())?,
    );
    // IMMEDIATE takes the write lock before the read: nobody can write
    // between our check and our write.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_err)?;
    // The caller stops waiting at the deadline; a write committed after that
    // would be one it cannot know about (its read-back may come first).
    if Instant::now() >= deadline {
        return Err(StoreError::Timeout(budget));
    }
    let current = read_row(&tx, select_one, &lease.election).map_err(sql_err)?;
    // A row of an unknown format fails every condition here (see
    // `Condition::holds`), so it is never replaced.
    if !holds(current.as_ref(), condition) {
        let current = current.map_or(Record::Absent, |row| row.to_record());
        // Dropping the transaction rolls it back; nothing was written.
        return Ok(WriteOutcome::ConditionFailed {
            current: Some(current),
        });
    }
    tx.execute(
        UPSERT,
        rusqlite::params![
            lease.election,
            lease.holder,
            lease.rvn,
            values.0,
            values.1,
            values.2,
            values.3,
            values.4,
            meta,
            lease.successor,
            values.5,
            lease.session,
        ],
    )
    .map_err(sql_err)?;
    tx.commit().map_err(sql_err)?;
    Ok(WriteOutcome::Applied)
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        let election = election.to_owned();
        let sql = self.inner.selects.one.clone();
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let row = read_row(conn, &sql, &election).map_err(|e| classify(path, budget, &e))?;
            Ok(row.map_or(Record::Absent, |r| r.to_record()))
        })
        .await
    }

    /// One turn of a reader for all of them: a local file reads a hundred
    /// rows in well under a millisecond.
    async fn read_many(
        &self,
        elections: &[String],
        budget: Duration,
    ) -> Result<Vec<Record>, StoreError> {
        let elections = elections.to_vec();
        let sql = self.inner.selects.one.clone();
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            elections
                .iter()
                .map(|election| {
                    let row =
                        read_row(conn, &sql, election).map_err(|e| classify(path, budget, &e))?;
                    Ok(row.map_or(Record::Absent, |r| r.to_record()))
                })
                .collect()
        })
        .await
    }

    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let lease = lease.clone();
        let condition = condition.clone();
        let sql = self.inner.selects.one.clone();
        self.run(LaneKind::Write, budget, move |conn, path, deadline| {
            put_blocking(conn, path, budget, deadline, &sql, &lease, &condition)
        })
        .await
    }

    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        let sql = self.inner.selects.all.clone();
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let err = |e: rusqlite::Error| classify(path, budget, &e);
            let mut stmt = conn.prepare(&sql).map_err(err)?;
            let rows = stmt
                .query_map([], Row::from_sql)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(err)?;
            Ok(rows.iter().map(Row::to_record).collect())
        })
        .await
    }

    async fn members(&self, budget: Duration) -> Result<Vec<Lease>, StoreError> {
        let sql = self.inner.selects.range.clone();
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let rows = read_range(conn, path, budget, &sql, MEMBER_PREFIX)?;
            Ok(member_records(rows.iter().map(Row::to_record)))
        })
        .await
    }

    /// One range read of the session records (a few per daemon: cheap
    /// whatever the number of elections), then, if the judge names any,
    /// transactions of conditional deletes.
    async fn sweep_sessions(
        &self,
        judge: &mut SessionJudge<'_>,
        budget: Duration,
    ) -> Result<u64, StoreError> {
        let started = Instant::now();
        let sql = self.inner.selects.range.clone();
        let records = self
            .run(LaneKind::Read, budget, move |conn, path, _| {
                let rows = read_range(conn, path, budget, &sql, SESSION_PREFIX)?;
                Ok(rows.iter().map(Row::to_record).collect::<Vec<_>>())
            })
            .await?;
        let stale = judge(&records);
        if stale.is_empty() {
            return Ok(0);
        }
        let mut deleted = 0;
        for chunk in stale.chunks(DELETES_PER_TRANSACTION) {
            let left = budget.saturating_sub(started.elapsed());
            let sql = self.inner.selects.one.clone();
            let chunk = chunk.to_vec();
            deleted += self
                .run(LaneKind::Write, left, move |conn, path, deadline| {
                    delete_stale_blocking(conn, path, left, deadline, &sql, &chunk)
                })
                .await?;
        }
        Ok(deleted)
    }

    async fn check(&self, budget: Duration) -> Result<(), StoreError> {
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            check_blocking(conn, path, budget)
        })
        .await
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.changes.subscribe())
    }

    async fn delete_check_record(
        &self,
        key: &str,
        rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        super::scratch_only(key)?;
        let (key, rvn) = (key.to_owned(), rvn.to_owned());
        self.run(LaneKind::Write, budget, move |conn, path, _| {
            // One statement: the condition and the delete are atomic.
            let deleted = conn
                .execute(
                    "DELETE FROM leases WHERE election = ?1 AND rvn = ?2",
                    [&key, &rvn],
                )
                .map_err(|e| classify(path, budget, &e))?;
            Ok(if deleted == 1 {
                WriteOutcome::Applied
            } else {
                WriteOutcome::ConditionFailed { current: None }
            })
        })
        .await
    }
}
