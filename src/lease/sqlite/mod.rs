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
//! lanes of fixed size: one writer connection (writes queue in arrival order
//! inside the process, so a renewal never waits behind hundreds of follower
//! reads or other writers of this process) and a few reader connections.
//! Connections are kept for the store's life. Each request is bounded by its
//! budget three times: waiting for its lane, the busy handler (short pauses,
//! never past the deadline, while another process holds the lock), and the
//! caller, who stops waiting when the budget is spent (a write that overran
//! may still commit, which is what `StoreError::Timeout` says;
//! [`LeaseStore::write`] resolves it by reading back).
//!
//! Columns are not type-checked by SQLite (no STRICT table), so a row written
//! by another tool may hold anything; such a row is read as
//! [`Record::Malformed`] and never panics anything.

use std::cell::Cell;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::{Semaphore, watch};

use crate::text;

mod file_watch;
mod row;
#[cfg(test)]
mod tests;

use row::*;

use super::{
    Condition, HolderMeta, Lease, LeaseStore, MEMBER_PREFIX, Malformed, Record, RvnGuard,
    StoreError, WriteOutcome, member_records,
};

/// The table every lease lives in.
pub const TABLE: &str = "leases";

/// Columns in the order every query selects them.
const COLUMNS: [&str; 10] = [
    "election",
    "holder",
    "rvn",
    "fencing_token",
    "lease_ms",
    "acquired_at",
    "renewed_at",
    "expires_at",
    "holder_meta",
    "successor",
];

/// Columns added after the first release: a file made before them gets them
/// when `leaderd run` opens it, and reads as if they were null until then.
const ADDED_COLUMNS: [&str; 1] = ["successor"];

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leases (
    election      TEXT PRIMARY KEY NOT NULL,
    holder        TEXT,
    rvn           TEXT,
    fencing_token INTEGER,
    lease_ms      INTEGER,
    acquired_at   INTEGER,
    renewed_at    INTEGER,
    expires_at    INTEGER,
    holder_meta   TEXT,
    successor     TEXT
)";

const SELECT_ONE: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, acquired_at, \
     renewed_at, expires_at, holder_meta, successor FROM leases WHERE election = ?1";

const SELECT_ALL: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, acquired_at, \
     renewed_at, expires_at, holder_meta, successor FROM leases ORDER BY election";

/// The member records (`crate::balance`): the keys from `?1` (the prefix)
/// up to `?2` (the prefix with its last byte raised), a range of the key's
/// index.
const SELECT_RANGE: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, acquired_at, \
     renewed_at, expires_at, holder_meta, successor FROM leases \
     WHERE election >= ?1 AND election < ?2 ORDER BY election";

/// [`SELECT_ONE`] and [`SELECT_ALL`] on a file without the
/// [`ADDED_COLUMNS`], opened only to be read.
const SELECT_ONE_OLD: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, \
     acquired_at, renewed_at, expires_at, holder_meta, NULL FROM leases WHERE election = ?1";
const SELECT_ALL_OLD: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, \
     acquired_at, renewed_at, expires_at, holder_meta, NULL FROM leases ORDER BY election";

const UPSERT: &str = "INSERT OR REPLACE INTO leases (election, holder, rvn, fencing_token, \
     lease_ms, acquired_at, renewed_at, expires_at, holder_meta, successor) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// How long opening a store may wait for other processes that hold the
/// file's lock: instances started together on a fresh file take turns
/// switching it to WAL and creating the table.
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// Connections (and so blocking threads) writing at once: one. SQLite lets
/// only one writer hold the file anyway; more writers in one process would
/// only fight each other in the busy handler instead of queueing in order.
const WRITERS: usize = 1;

/// Connections reading at once. WAL readers do not block each other or the
/// writer; two keep one slow read from stalling the others without letting
/// hundreds of follower reads flood the blocking pool.
const READERS: usize = 2;

/// The busy handler's first and longest pause while another process holds
/// the lock. SQLite's default handler sleeps up to 100 ms per retry, which
/// leaves the lock idle most of the time when three processes take turns;
/// a write holds it for well under a millisecond plus one fsync.
const BUSY_FIRST_PAUSE: Duration = Duration::from_millis(1);
const BUSY_MAX_PAUSE: Duration = Duration::from_millis(5);

thread_local! {
    /// The deadline of the request running on this thread, read by
    /// [`busy_wait`] (SQLite's busy handler is a plain function pointer and
    /// carries no state). Set and restored by [`DeadlineScope`].
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Sets this thread's request deadline for the busy handler; puts the
/// previous one back on drop, also when the work panics.
struct DeadlineScope(Option<Instant>);

impl DeadlineScope {
    fn enter(deadline: Instant) -> DeadlineScope {
        DeadlineScope(DEADLINE.replace(Some(deadline)))
    }
}

impl Drop for DeadlineScope {
    fn drop(&mut self) {
        DEADLINE.set(self.0);
    }
}

/// SQLite's busy handler: called while another connection holds the lock
/// this one needs; `true` retries, `false` gives up with `SQLITE_BUSY`
/// (which `classify` turns into `Timeout`). Short pauses, and never past the
/// request's deadline; outside a request there is nobody to wait for.
fn busy_wait(attempt: i32) -> bool {
    let Some(deadline) = DEADLINE.get() else {
        return false;
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    let shift = u32::try_from(attempt).unwrap_or(0).min(8);
    let pause = (BUSY_FIRST_PAUSE * (1u32 << shift))
        .min(BUSY_MAX_PAUSE)
        .min(left);
    std::thread::sleep(pause);
    true
}

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
    /// The file lacks the [`ADDED_COLUMNS`] (made by an older leaderd and
    /// opened only to be read): they read as null.
    legacy: bool,
    /// Conditional writes: one at a time, in arrival order.
    writes: Lane,
    /// Reads, lists and schema checks.
    reads: Lane,
    /// The file the connections have open and its generation, which moves
    /// each time the path is found to name another file (or none) and the
    /// store reopens it. Connections of an older generation are dropped.
    file: Mutex<(FileId, u64)>,
    /// Counts the times the path was seen to name another file: a leader
    /// renews at once, and the renew, made against what the path names now,
    /// decides whether it still leads.
    changes: watch::Sender<u64>,
}

/// A fixed set of connections and a semaphore with one permit per
/// connection: a request waits (FIFO, within its budget) for a permit
/// before it takes a blocking thread, so a store never runs more than
/// `size` blocking threads or holds more than `size` connections per lane.
#[derive(Debug)]
struct Lane {
    permits: Arc<Semaphore>,
    /// Connections not in use, with the file generation they belong to. A
    /// permit holder always finds one here or opens the lane's next one (at
    /// most `size` ever exist). The lock is held only to push or pop, never
    /// while SQLite works.
    idle: Mutex<Vec<(u64, Connection)>>,
}

#[derive(Debug, Clone, Copy)]
enum LaneKind {
    Write,
    Read,
}

impl Lane {
    fn new(size: usize, idle: Vec<(u64, Connection)>) -> Lane {
        Lane {
            permits: Arc::new(Semaphore::new(size)),
            idle: Mutex::new(idle),
        }
    }

    fn checkout(
        &self,
        path: &Path,
        access: Access,
        generation: u64,
    ) -> Result<Connection, StoreError> {
        while let Some((g, conn)) = self.lock_idle().pop() {
            if g == generation {
                return Ok(conn);
            }
            // Open on a file the path no longer names: closed here.
        }
        // No CREATE flag: opening made the file; if it vanished since, the
        // next request notices and reopens.
        let flags = match access {
            Access::ReadWrite => OpenFlags::SQLITE_OPEN_READ_WRITE,
            Access::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
        } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags)
            .map_err(|e| open_error(path, "cannot open", &e))?;
        configure(&mut conn).map_err(|e| open_error(path, "cannot configure", &e))?;
        Ok(conn)
    }

    fn checkin(&self, generation: u64, conn: Connection) {
        // Never more than the permits allow, so always kept.
        self.lock_idle().push((generation, conn));
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Connection)>> {
        // The lock only guards a Vec push/pop, which cannot leave it
        // inconsistent; a poisoned lock is safe to keep using.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Open (creating if missing) the file at `path` in WAL mode with the
/// `leases` table, waiting until `deadline` for other processes that hold
/// its lock. SQLite answers some of those waits with an immediate
/// `SQLITE_BUSY` instead of calling the busy handler (two connections both
/// upgrading a read lock to switch the journal mode): the whole set-up is
/// then tried again after a short pause.
fn set_up(path: &Path, deadline: Instant) -> Result<Connection, StoreError> {
    let _scope = DeadlineScope::enter(deadline);
    let mut pause = Duration::from_millis(2);
    loop {
        match try_set_up(path) {
            Ok(conn) => return Ok(conn),
            Err((_, e)) if is_locked(&e) && Instant::now() < deadline => {
                let jitter = Duration::from_micros(rand::random::<u64>() % 2_000);
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep((pause + jitter).min(left));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err((what, e)) => return Err(open_error(path, what, &e)),
        }
    }
}

fn try_set_up(path: &Path) -> Result<Connection, (&'static str, rusqlite::Error)> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(|e| ("cannot open", e))?;
    configure(&mut conn).map_err(|e| ("cannot configure", e))?;
    // Reading the mode takes no write lock: a file already in WAL mode
    // (every start but the first) is not switched again.
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .map_err(|e| ("cannot read the journal mode of", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(|e| ("cannot switch to WAL mode", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            // Still correct (every write is an immediate transaction), only
            // readers and writers block each other more.
            tracing::warn!(path = %path.display(), journal_mode = %mode, "SQLite lease store is not in WAL mode (file system without shared memory?)");
        }
    }
    conn.execute(CREATE_TABLE, [])
        .map_err(|e| ("cannot create the `leases` table in", e))?;
    // A file made by an older leaderd: add what it lacks. Two instances
    // doing it at once: the second finds the column there (or waits on the
    // write lock and then fails with "duplicate column", checked again).
    for column in lacking_columns(&conn).map_err(|e| ("cannot read the schema of", e))? {
        let added = conn.execute(&format!("ALTER TABLE leases ADD COLUMN {column} TEXT"), []);
        if let Err(e) = added
            && lacking_columns(&conn)
                .map_err(|e| ("cannot read the schema of", e))?
                .contains(&column)
        {
            return Err(("cannot add a column to the `leases` table in", e));
        }
    }
    Ok(conn)
}

/// Which of the [`ADDED_COLUMNS`] the `leases` table lacks: none when there
/// is no table, or when it is not leaderd's (it lacks one of the first
/// columns too; the schema check reports it, and it is left as it is).
fn lacking_columns(conn: &Connection) -> rusqlite::Result<Vec<&'static str>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('leases')")?;
    let names = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let has = |c: &str| names.iter().any(|n| n == c);
    let ours = COLUMNS
        .iter()
        .filter(|c| !ADDED_COLUMNS.contains(c))
        .all(|c| has(c));
    if !ours {
        return Ok(Vec::new());
    }
    Ok(ADDED_COLUMNS.into_iter().filter(|c| !has(c)).collect())
}

fn is_locked(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
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
        let store = Self::with(path, Access::ReadWrite, false, id, conn);
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
        let legacy = !lacking_columns(&conn)
            .map_err(|e| open_error(path, "cannot read the schema of", &e))?
            .is_empty();
        Ok(Self::with(path, Access::ReadOnly, legacy, id, conn))
    }

    fn with(
        path: &Path,
        access: Access,
        legacy: bool,
        id: FileId,
        conn: Connection,
    ) -> SqliteStore {
        SqliteStore {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                access,
                legacy,
                writes: Lane::new(WRITERS, vec![(0, conn)]),
                reads: Lane::new(READERS, Vec::new()),
                file: Mutex::new((id, 0)),
                changes: watch::Sender::new(0),
            }),
        }
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run `work` on one of `lane`'s connections on the blocking pool, within
    /// `budget` (waiting for the lane included). `work` gets the deadline (on
    /// the blocking thread's clock).
    async fn run<T, F>(&self, lane: LaneKind, budget: Duration, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path, Instant) -> Result<T, StoreError> + Send + 'static,
    {
        if budget.is_zero() {
            return Err(StoreError::Timeout(budget));
        }
        let deadline = Instant::now() + budget;
        let caller_deadline = tokio::time::Instant::now() + budget;
        let permits = match lane {
            LaneKind::Write => self.inner.writes.permits.clone(),
            LaneKind::Read => self.inner.reads.permits.clone(),
        };
        let permit = match tokio::time::timeout_at(caller_deadline, permits.acquire_owned()).await {
            Err(_) => return Err(StoreError::Timeout(budget)),
            Ok(Err(closed)) => {
                // The semaphores are never closed; say so rather than panic.
                return Err(StoreError::Other(format!(
                    "SQLite lease store {}: {closed}",
                    self.inner.path.display()
                )));
            }
            Ok(Ok(permit)) => permit,
        };
        let inner = self.inner.clone();
        let task = tokio::task::spawn_blocking(move || {
            // Held until the work is done, even if the caller stopped
            // waiting: the lane's bound counts running work, not waiters.
            let _permit = permit;
            let lane = match lane {
                LaneKind::Write => &inner.writes,
                LaneKind::Read => &inner.reads,
            };
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout(budget));
            }
            let _scope = DeadlineScope::enter(deadline);
            let generation = inner.current_file(deadline)?;
            let mut conn = lane.checkout(&inner.path, inner.access, generation)?;
            let res = work(&mut conn, &inner.path, deadline);
            lane.checkin(generation, conn);
            res
        });
        match tokio::time::timeout_at(caller_deadline, task).await {
            Err(_) => Err(StoreError::Timeout(budget)),
            Ok(Err(join)) => Err(StoreError::Other(format!(
                "SQLite request on {} failed: {join}",
                self.inner.path.display()
            ))),
            Ok(Ok(res)) => res,
        }
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

/// Per-connection settings.
fn configure(conn: &mut Connection) -> rusqlite::Result<()> {
    // Replaces any busy timeout: waits are bounded by the request instead.
    conn.busy_handler(Some(busy_wait))?;
    // FULL: a committed write survives power loss. Losing the last write of
    // a tenure could hand out its fencing token a second time.
    conn.pragma_update(None, "synchronous", "FULL")
}

fn open_error(path: &Path, what: &str, e: &rusqlite::Error) -> StoreError {
    StoreError::Other(format!("{what} SQLite lease store {}: {e}", path.display()))
}

fn missing_table(path: &Path) -> StoreError {
    StoreError::TableMissing(format!("{TABLE} (in {})", path.display()))
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

fn read_row(conn: &Connection, election: &str, legacy: bool) -> rusqlite::Result<Option<Row>> {
    let sql = if legacy { SELECT_ONE_OLD } else { SELECT_ONE };
    conn.query_row(sql, [election], Row::from_sql).optional()
}

fn to_i64(column: &str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| {
        StoreError::Other(format!(
            "`{column}` = {v} does not fit in SQLite's 64-bit signed integer"
        ))
    })
}

fn put_blocking(
    conn: &mut Connection,
    path: &Path,
    budget: Duration,
    deadline: Instant,
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
        to_i64("lease_ms", lease.lease_ms)?,
        to_i64("acquired_at", lease.acquired_at_ms)?,
        to_i64("renewed_at", lease.renewed_at_ms)?,
        to_i64("expires_at", lease.expires_at_s)?,
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
    let current = read_row(&tx, &lease.election, false).map_err(sql_err)?;
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
        ],
    )
    .map_err(sql_err)?;
    tx.commit().map_err(sql_err)?;
    Ok(WriteOutcome::Applied)
}

fn check_blocking(conn: &Connection, path: &Path, budget: Duration) -> Result<(), StoreError> {
    let mut stmt = conn
        .prepare("SELECT name, pk FROM pragma_table_info('leases')")
        .map_err(|e| classify(path, budget, &e))?;
    let columns = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(|e| classify(path, budget, &e))?;
    if columns.is_empty() {
        return Err(missing_table(path));
    }
    let missing: Vec<&str> = COLUMNS
        .iter()
        .copied()
        .filter(|c| !ADDED_COLUMNS.contains(c))
        .filter(|c| !columns.iter().any(|(name, _)| name == c))
        .collect();
    if !missing.is_empty() {
        return Err(StoreError::WrongSchema {
            table: TABLE.into(),
            detail: format!(
                "missing column(s) {} in {}",
                missing.join(", "),
                path.display()
            ),
        });
    }
    let key: Vec<&str> = columns
        .iter()
        .filter(|(_, pk)| *pk > 0)
        .map(|(name, _)| name.as_str())
        .collect();
    if key != ["election"] {
        return Err(StoreError::WrongSchema {
            table: TABLE.into(),
            detail: format!(
                "primary key is ({}), expected (election) in {}",
                key.join(", "),
                path.display()
            ),
        });
    }
    Ok(())
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        let election = election.to_owned();
        let legacy = self.inner.legacy;
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let row = read_row(conn, &election, legacy).map_err(|e| classify(path, budget, &e))?;
            Ok(row.map_or(Record::Absent, |r| r.to_record()))
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
        self.run(LaneKind::Write, budget, move |conn, path, deadline| {
            put_blocking(conn, path, budget, deadline, &lease, &condition)
        })
        .await
    }

    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        let sql = if self.inner.legacy {
            SELECT_ALL_OLD
        } else {
            SELECT_ALL
        };
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let err = |e: rusqlite::Error| classify(path, budget, &e);
            let mut stmt = conn.prepare(sql).map_err(err)?;
            let rows = stmt
                .query_map([], Row::from_sql)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(err)?;
            Ok(rows.iter().map(Row::to_record).collect())
        })
        .await
    }

    async fn members(&self, budget: Duration) -> Result<Vec<Lease>, StoreError> {
        if self.inner.legacy {
            // A file without the newer columns has no member records:
            // `run` adds the columns before anything writes one.
            return Ok(Vec::new());
        }
        // "#member/" .. "#member0": '0' follows '/'.
        let upper = format!("{}0", MEMBER_PREFIX.trim_end_matches('/'));
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let err = |e: rusqlite::Error| classify(path, budget, &e);
            let mut stmt = conn.prepare(SELECT_RANGE).map_err(err)?;
            let rows = stmt
                .query_map([MEMBER_PREFIX, upper.as_str()], Row::from_sql)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(err)?;
            Ok(member_records(rows.iter().map(Row::to_record)))
        })
        .await
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
}
