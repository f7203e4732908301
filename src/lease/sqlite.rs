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

use super::{
    Condition, HolderMeta, Lease, LeaseStore, Malformed, Record, RvnGuard, StoreError, WriteOutcome,
};

/// The table every lease lives in.
pub const TABLE: &str = "leases";

/// Columns in the order every query selects them.
const COLUMNS: [&str; 9] = [
    "election",
    "holder",
    "rvn",
    "fencing_token",
    "lease_ms",
    "acquired_at",
    "renewed_at",
    "expires_at",
    "holder_meta",
];

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leases (
    election      TEXT PRIMARY KEY NOT NULL,
    holder        TEXT,
    rvn           TEXT,
    fencing_token INTEGER,
    lease_ms      INTEGER,
    acquired_at   INTEGER,
    renewed_at    INTEGER,
    expires_at    INTEGER,
    holder_meta   TEXT
)";

const SELECT_ONE: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, acquired_at, \
     renewed_at, expires_at, holder_meta FROM leases WHERE election = ?1";

const SELECT_ALL: &str = "SELECT election, holder, rvn, fencing_token, lease_ms, acquired_at, \
     renewed_at, expires_at, holder_meta FROM leases ORDER BY election";

const UPSERT: &str = "INSERT OR REPLACE INTO leases (election, holder, rvn, fencing_token, \
     lease_ms, acquired_at, renewed_at, expires_at, holder_meta) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

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
    Ok(conn)
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
        let store = Self::with(path, Access::ReadWrite, id, conn);
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
        Ok(Self::with(path, Access::ReadOnly, id, conn))
    }

    fn with(path: &Path, access: Access, id: FileId, conn: Connection) -> SqliteStore {
        SqliteStore {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                access,
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

/// Watching the store's directory, so that a leader learns at once, not at
/// its next renew, that its file was deleted or replaced.
mod file_watch {
    use std::ffi::OsString;
    use std::os::fd::AsFd;
    use std::sync::{Arc, Weak};

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

    use super::Inner;

    /// Start a thread that watches the directory of `inner`'s file for the
    /// file being deleted, renamed or replaced, and bumps `inner.changes`
    /// when the path no longer names the open file. The thread ends within
    /// a second of the store being dropped.
    pub(super) fn start(inner: &Arc<Inner>) -> std::io::Result<()> {
        let path = &inner.path;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => std::path::PathBuf::from("."),
        };
        let name: OsString = path.file_name().map(OsString::from).unwrap_or_default();
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(
            &dir,
            AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )?;
        let weak: Weak<Inner> = Arc::downgrade(inner);
        std::thread::Builder::new()
            .name("leaderd-sqlite-watch".into())
            .spawn(move || run(&inotify, &weak, &name))?;
        Ok(())
    }

    fn run(inotify: &Inotify, store: &Weak<Inner>, name: &OsString) {
        loop {
            let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
            // Wakes at least once a second to notice a dropped store.
            let _ = poll(&mut fds, PollTimeout::from(1_000u16));
            let Some(inner) = store.upgrade() else { return };
            let Ok(events) = inotify.read_events() else {
                continue;
            };
            let ours = events.iter().any(|e| {
                e.name.as_ref() == Some(name)
                    || e.mask
                        .intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF)
            });
            if ours && !inner.file_is_current() {
                tracing::warn!(path = %inner.path.display(), "the SQLite lease store file was deleted or replaced");
                inner.changes.send_modify(|n| *n += 1);
            }
        }
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

/// One column's value exactly as stored.
#[derive(Debug, Clone, Default, PartialEq)]
enum Raw {
    #[default]
    Null,
    Integer(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl Raw {
    fn from_ref(v: ValueRef<'_>) -> Raw {
        match v {
            ValueRef::Null => Raw::Null,
            ValueRef::Integer(i) => Raw::Integer(i),
            ValueRef::Real(f) => Raw::Real(f),
            ValueRef::Text(t) => Raw::Text(t.to_vec()),
            ValueRef::Blob(b) => Raw::Blob(b.to_vec()),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Integer(_) => "integer",
            Raw::Real(_) => "real",
            Raw::Text(_) => "text",
            Raw::Blob(_) => "blob",
        }
    }

    /// Unambiguous text form, with the type: `text:abc`, `integer:5`,
    /// `real:1.5`, `blob:00ff`, `null`.
    fn encode(&self) -> String {
        match self {
            Raw::Null => "null".into(),
            Raw::Integer(i) => format!("integer:{i}"),
            // Bits, not the decimal form: two different reals never collide.
            Raw::Real(f) => format!("real:{:016x}", f.to_bits()),
            Raw::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => format!("text:{s}"),
                Err(_) => format!("text-bytes:{}", text::hex(t)),
            },
            Raw::Blob(b) => format!("blob:{}", text::hex(b)),
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Raw::Text(t) => std::str::from_utf8(t).ok(),
            _ => None,
        }
    }
}

/// A whole row as stored, one value per entry of [`COLUMNS`].
#[derive(Debug, Clone, PartialEq)]
struct Row([Raw; 9]);

impl Row {
    fn from_sql(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        let mut vals: [Raw; 9] = Default::default();
        for (i, v) in vals.iter_mut().enumerate() {
            *v = Raw::from_ref(row.get_ref(i)?);
        }
        Ok(Row(vals))
    }

    fn get(&self, column: &str) -> &Raw {
        let i = COLUMNS
            .iter()
            .position(|c| *c == column)
            .expect("callers only name columns listed in COLUMNS");
        &self.0[i]
    }

    /// The guard an `Unchanged` condition compares against.
    fn guard(&self) -> RvnGuard {
        match self.get("rvn") {
            Raw::Null => RvnGuard::Missing,
            raw => RvnGuard::Raw(raw.encode()),
        }
    }

    /// Interpret the row as a lease, or describe everything wrong with it.
    fn to_record(&self) -> Record {
        let mut problems = Vec::new();
        let election = match self.get("election") {
            Raw::Text(t) => {
                if std::str::from_utf8(t).is_err() {
                    problems.push("attribute `election` is not valid UTF-8".into());
                }
                String::from_utf8_lossy(t).into_owned()
            }
            other => {
                problems.push(text_problem("election", other));
                other.encode()
            }
        };
        let holder = match self.get("holder") {
            Raw::Null => None,
            raw => match raw.text() {
                Some(s) => Some(s.to_owned()),
                None => {
                    problems.push(text_problem("holder", raw));
                    None
                }
            },
        };
        let rvn = match self.get("rvn") {
            Raw::Null => {
                problems.push("attribute `rvn` is missing".into());
                String::new()
            }
            raw => match raw.text() {
                Some(s) => s.to_owned(),
                None => {
                    problems.push(text_problem("rvn", raw));
                    String::new()
                }
            },
        };
        let mut number = |column: &str| match self.get(column) {
            Raw::Integer(i) => u64::try_from(*i).unwrap_or_else(|_| {
                problems.push(format!("attribute `{column}` is negative ({i})"));
                0
            }),
            Raw::Null => {
                problems.push(format!("attribute `{column}` is missing"));
                0
            }
            raw => {
                problems.push(format!(
                    "attribute `{column}` is not a whole number (type {}: {})",
                    raw.type_name(),
                    text::shorten(&raw.encode(), 40)
                ));
                0
            }
        };
        let fencing_token = number("fencing_token");
        let lease_ms = number("lease_ms");
        let acquired_at_ms = number("acquired_at");
        let renewed_at_ms = number("renewed_at");
        let expires_at_s = number("expires_at");
        let holder_meta = match self.get("holder_meta") {
            Raw::Null => None,
            raw => match raw.text().map(serde_json::from_str::<HolderMeta>) {
                Some(Ok(meta)) => Some(meta),
                Some(Err(e)) => {
                    problems.push(format!(
                        "attribute `holder_meta` is not a valid holder description: {e}"
                    ));
                    None
                }
                None => {
                    problems.push(text_problem("holder_meta", raw));
                    None
                }
            },
        };
        if problems.is_empty() {
            return Record::Valid(Lease {
                election,
                holder,
                rvn,
                fencing_token,
                lease_ms,
                acquired_at_ms,
                renewed_at_ms,
                expires_at_s,
                holder_meta,
            });
        }
        let fencing_token = match self.get("fencing_token") {
            Raw::Integer(i) => u64::try_from(*i).ok(),
            _ => None,
        };
        Record::Malformed(Malformed {
            election,
            problem: problems.join("; "),
            fingerprint: self.fingerprint(),
            fencing_token,
            guard: self.guard(),
        })
    }

    /// A digest of every column (name, type and value). Only ever compared
    /// with another fingerprint taken by the same process, so std's hasher
    /// (stable within one build) is enough; two successive versions of one
    /// item colliding in 64 bits is not a practical concern.
    fn fingerprint(&self) -> String {
        let mut h = DefaultHasher::new();
        for (name, value) in COLUMNS.iter().zip(&self.0) {
            name.hash(&mut h);
            value.encode().hash(&mut h);
        }
        format!("{:016x}", h.finish())
    }
}

fn text_problem(column: &str, raw: &Raw) -> String {
    match raw {
        Raw::Text(_) => format!("attribute `{column}` is not valid UTF-8"),
        _ => format!(
            "attribute `{column}` has type {}, expected text",
            raw.type_name()
        ),
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

fn read_row(conn: &Connection, election: &str) -> rusqlite::Result<Option<Row>> {
    conn.query_row(SELECT_ONE, [election], Row::from_sql)
        .optional()
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
    let current = read_row(&tx, &lease.election).map_err(sql_err)?;
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
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let row = read_row(conn, &election).map_err(|e| classify(path, budget, &e))?;
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

    async fn list(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        self.run(LaneKind::Read, budget, move |conn, path, _| {
            let err = |e: rusqlite::Error| classify(path, budget, &e);
            let mut stmt = conn.prepare(SELECT_ALL).map_err(err)?;
            let rows = stmt
                .query_map([], Row::from_sql)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(err)?;
            Ok(rows.iter().map(Row::to_record).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: [Raw; 9]) -> Row {
        Row(values)
    }

    fn good() -> [Raw; 9] {
        [
            Raw::Text(b"e".to_vec()),
            Raw::Text(b"me".to_vec()),
            Raw::Text(b"r1".to_vec()),
            Raw::Integer(7),
            Raw::Integer(10_000),
            Raw::Integer(1),
            Raw::Integer(2),
            Raw::Integer(3),
            Raw::Null,
        ]
    }

    #[test]
    fn a_well_formed_row_is_a_lease() {
        let Record::Valid(l) = row(good()).to_record() else {
            panic!("expected a valid lease");
        };
        assert_eq!(l.rvn, "r1");
        assert_eq!(l.fencing_token, 7);
        assert_eq!(l.holder.as_deref(), Some("me"));
    }

    #[test]
    fn every_bad_column_is_named_and_nothing_panics() {
        let cases: [(usize, Raw, &str); 8] = [
            (2, Raw::Null, "`rvn` is missing"),
            (2, Raw::Integer(5), "`rvn` has type integer"),
            (
                3,
                Raw::Text(b"abc".to_vec()),
                "`fencing_token` is not a whole number",
            ),
            (3, Raw::Integer(-1), "`fencing_token` is negative"),
            (4, Raw::Real(1.5), "`lease_ms` is not a whole number"),
            (1, Raw::Blob(vec![0xff]), "`holder` has type blob"),
            (8, Raw::Text(b"{not json".to_vec()), "`holder_meta`"),
            (
                1,
                Raw::Text(vec![0xff, 0xfe]),
                "`holder` is not valid UTF-8",
            ),
        ];
        for (i, bad, expected) in cases {
            let mut values = good();
            values[i] = bad.clone();
            let Record::Malformed(m) = row(values).to_record() else {
                panic!("{bad:?} in column {i} must be malformed");
            };
            assert!(m.problem.contains(expected), "{} vs {expected}", m.problem);
        }
    }

    #[test]
    fn guard_and_fingerprint_follow_the_raw_values() {
        let mut a = good();
        a[3] = Raw::Text(b"x".to_vec());
        let mut b = a.clone();
        b[5] = Raw::Integer(99);
        let (Record::Malformed(ma), Record::Malformed(mb)) =
            (row(a.clone()).to_record(), row(b).to_record())
        else {
            panic!("both rows are malformed");
        };
        assert_ne!(ma.fingerprint, mb.fingerprint);
        assert_eq!(ma.guard, RvnGuard::Raw("text:r1".into()));
        assert_eq!(ma.fencing_token, None);
        let Record::Malformed(again) = row(a.clone()).to_record() else {
            panic!("same row, same answer");
        };
        assert_eq!(again.fingerprint, ma.fingerprint);
        // Text "5" and integer 5 are different raw values.
        let mut t = a.clone();
        t[2] = Raw::Text(b"5".to_vec());
        let mut i = a;
        i[2] = Raw::Integer(5);
        assert_ne!(row(t).guard(), row(i).guard());
    }

    #[test]
    fn conditions_match_the_memory_store() {
        let valid = row(good());
        let mut bad = good();
        bad[2] = Raw::Null;
        let missing_rvn = row(bad);
        let held = Condition::HeldBy {
            rvn: "r1".into(),
            holder: "me".into(),
        };
        assert!(holds(None, &Condition::NotExists));
        assert!(!holds(Some(&valid), &Condition::NotExists));
        assert!(holds(Some(&valid), &Condition::RvnIs("r1".into())));
        assert!(!holds(Some(&valid), &Condition::RvnIs("r2".into())));
        assert!(holds(Some(&valid), &held));
        assert!(!holds(
            Some(&valid),
            &Condition::HeldBy {
                rvn: "r1".into(),
                holder: "you".into()
            }
        ));
        assert!(!holds(None, &held));
        assert!(!holds(Some(&missing_rvn), &Condition::RvnIs(String::new())));
        assert!(holds(
            Some(&missing_rvn),
            &Condition::Unchanged(RvnGuard::Missing)
        ));
        assert!(!holds(None, &Condition::Unchanged(RvnGuard::Missing)));
        assert!(!holds(
            Some(&valid),
            &Condition::Unchanged(RvnGuard::Missing)
        ));
        assert!(holds(
            Some(&valid),
            &Condition::Unchanged(RvnGuard::Raw("text:r1".into()))
        ));
    }

    fn sample(election: &str) -> Lease {
        Lease {
            election: election.into(),
            holder: Some("me".into()),
            rvn: crate::lease::new_rvn(),
            fencing_token: 1,
            lease_ms: 10_000,
            acquired_at_ms: 1,
            renewed_at_ms: 1,
            expires_at_s: 1,
            holder_meta: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_locked_file_is_a_timeout_within_the_budget() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        let store = SqliteStore::open(&path).expect("open");
        // Another process holds the write lock.
        let other = Connection::open(&path).expect("second connection");
        other
            .execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");

        let budget = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let res = store.put(&sample("e"), &Condition::NotExists, budget).await;
        assert_eq!(res, Err(StoreError::Timeout(budget)));
        // Generous: only "bounded", not "punctual", on a busy machine.
        assert!(started.elapsed() < Duration::from_secs(10));
        // WAL: readers are not blocked by the writer.
        assert_eq!(store.read("e", budget).await, Ok(Record::Absent));

        other.execute_batch("ROLLBACK").expect("release the lock");
        let lease = sample("e");
        assert_eq!(
            store
                .put(&lease, &Condition::NotExists, Duration::from_secs(10))
                .await,
            Ok(WriteOutcome::Applied)
        );
        assert_eq!(
            store.read("e", Duration::from_secs(10)).await,
            Ok(Record::Valid(lease))
        );
        assert_eq!(
            store.read("e", Duration::ZERO).await,
            Err(StoreError::Timeout(Duration::ZERO))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_waits_for_another_process_lock_then_applies() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        let store = SqliteStore::open(&path).expect("open");
        let other = Connection::open(&path).expect("second connection");
        other
            .execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put(&sample("e"), &Condition::NotExists, Duration::from_secs(30))
                    .await
            })
        };
        // The busy handler keeps retrying while the lock is held...
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writer.is_finished(), "the write gave up while waiting");
        other.execute_batch("ROLLBACK").expect("release the lock");
        // ...and takes it once released.
        let res = writer.await.expect("the write task ran");
        assert_eq!(res, Ok(WriteOutcome::Applied));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_share_a_fixed_set_of_connections() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        let store = SqliteStore::open(&path).expect("open");
        let budget = Duration::from_secs(60);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            let store = store.clone();
            tasks.spawn(async move {
                let name = format!("e{}", i % 20);
                if i % 3 == 0 {
                    // Only one per election can win; the rest fail the condition.
                    store
                        .put(&sample(&name), &Condition::NotExists, budget)
                        .await
                        .map(|_| ())
                } else {
                    store.read(&name, budget).await.map(|_| ())
                }
            });
        }
        while let Some(res) = tasks.join_next().await {
            assert_eq!(res.expect("the request task ran"), Ok(()));
        }
        assert_eq!(store.list(budget).await.map(|l| l.len()), Ok(20));
        // Every connection is back and none beyond the lanes' sizes was opened.
        assert_eq!(store.inner.writes.lock_idle().len(), WRITERS);
        let readers = store.inner.reads.lock_idle().len();
        assert!(
            (1..=READERS).contains(&readers),
            "{readers} reader connections"
        );
    }

    #[test]
    fn open_errors_name_the_path() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("no-such-dir").join("l.db");
        match SqliteStore::open(&path) {
            Err(StoreError::Other(msg)) => {
                assert!(msg.contains(&path.display().to_string()), "{msg}")
            }
            other => panic!("expected an error naming the path, got {other:?}"),
        }
    }

    #[test]
    fn open_waits_for_another_process_that_holds_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        let other = Connection::open(&path).expect("another process's connection");
        other
            .execute_batch("BEGIN EXCLUSIVE")
            .expect("hold the file's lock");
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").expect("let go");
        });
        let store = SqliteStore::open(&path).expect("open waits for the lock");
        holder.join().expect("the holder ran");
        assert_eq!(store.path(), path);
    }

    #[test]
    fn reading_a_missing_file_names_it_and_creates_nothing() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("missing.db");
        match SqliteStore::open_read_only(&path) {
            Err(StoreError::Other(msg)) => {
                assert!(msg.contains(&path.display().to_string()), "{msg}")
            }
            other => panic!("expected an error naming the path, got {other:?}"),
        }
        assert!(!path.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_file_is_noticed_and_what_the_path_names_now_is_used() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        let store = SqliteStore::open(&path).expect("open");
        let mut changes = store.changes().expect("SQLite tells of replacements");
        let budget = Duration::from_secs(10);
        let mine = sample("e");
        assert_eq!(
            store.put(&mine, &Condition::NotExists, budget).await,
            Ok(WriteOutcome::Applied)
        );
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        // The directory watch tells at once, before any request.
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .expect("the deletion is noticed within seconds")
            .expect("the store lives");
        // A renew of the lease held in the deleted file fails its condition:
        // the path now names a new, empty file.
        let mut renewed = mine.clone();
        renewed.rvn = crate::lease::new_rvn();
        let held = Condition::HeldBy {
            rvn: mine.rvn.clone(),
            holder: "me".into(),
        };
        assert_eq!(
            store.put(&renewed, &held, budget).await,
            Ok(WriteOutcome::ConditionFailed {
                current: Some(Record::Absent)
            })
        );
        assert!(path.exists(), "opened anew at the same path");
        assert_eq!(store.read("e", budget).await, Ok(Record::Absent));
    }

    #[tokio::test]
    async fn check_reports_a_foreign_table() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("l.db");
        Connection::open(&path)
            .and_then(|c| c.execute_batch("CREATE TABLE leases (election TEXT, owner TEXT)"))
            .expect("a table of another tool");
        let store = SqliteStore::open(&path).expect("open keeps the existing table");
        let res = store.check(Duration::from_secs(10)).await;
        match res {
            Err(StoreError::WrongSchema { detail, .. }) => {
                assert!(detail.contains("rvn"), "{detail}")
            }
            other => panic!("expected WrongSchema, got {other:?}"),
        }
    }
}
