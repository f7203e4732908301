//! The `leases` table: its columns, creating it in a new file (in WAL
//! mode), adding what an older leaderd's file lacks, and checking that a
//! file's table is one leaderd can use.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::lanes::{DeadlineScope, configure};
use super::{TABLE, classify, open_error};
use crate::lease::StoreError;

/// Columns in the order every query selects them.
pub(super) const COLUMNS: [&str; 12] = [
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
    "format",
    "session",
];

/// Columns added after the first release, with their types: a file made
/// before them gets them when `leaderd run` opens it, and reads as if they
/// were null until then. `format` is an INTEGER column so that SQLite keeps
/// the numbers written to it as numbers (a TEXT column would turn them into
/// text).
const ADDED_COLUMNS: [(&str, &str); 3] = [
    ("successor", "TEXT"),
    ("format", "INTEGER"),
    ("session", "TEXT"),
];

/// Whether `column` is one of the [`ADDED_COLUMNS`].
fn added(column: &str) -> bool {
    ADDED_COLUMNS.iter().any(|(c, _)| *c == column)
}

/// The table, as `leaderd run` creates it in a new file.
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
    successor     TEXT,
    format        INTEGER,
    session       TEXT
)";

/// Open (creating if missing) the file at `path` in WAL mode with the
/// `leases` table, waiting until `deadline` for other processes that hold
/// its lock. SQLite answers some of those waits with an immediate
/// `SQLITE_BUSY` instead of calling the busy handler (two connections both
/// upgrading a read lock to switch the journal mode): the whole set-up is
/// then tried again after a short pause.
pub(super) fn set_up(path: &Path, deadline: Instant) -> Result<Connection, StoreError> {
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

/// One attempt of [`set_up`]; an error says what failed.
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
        let ty = ADDED_COLUMNS
            .iter()
            .find_map(|(c, ty)| (*c == column).then_some(*ty))
            .expect("lacking_columns names only added columns");
        let added = conn.execute(&format!("ALTER TABLE leases ADD COLUMN {column} {ty}"), []);
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
pub(super) fn lacking_columns(conn: &Connection) -> rusqlite::Result<Vec<&'static str>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('leases')")?;
    let names = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let has = |c: &str| names.iter().any(|n| n == c);
    let ours = COLUMNS.iter().filter(|c| !added(c)).all(|c| has(c));
    if !ours {
        return Ok(Vec::new());
    }
    Ok(ADDED_COLUMNS
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| !has(c))
        .collect())
}

/// Another connection holds the lock this one needs.
fn is_locked(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// The `leases` table is not in the file at `path`.
pub(super) fn missing_table(path: &Path) -> StoreError {
    StoreError::TableMissing(format!("{TABLE} (in {})", path.display()))
}

/// Whether the file has a `leases` table leaderd can use: every column it
/// reads (the [`ADDED_COLUMNS`] may still be missing; `leaderd run` adds
/// them), keyed by `election` alone.
pub(super) fn check_blocking(
    conn: &Connection,
    path: &Path,
    budget: Duration,
) -> Result<(), StoreError> {
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
        .filter(|c| !added(c))
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
