//! The store's connections, in two lanes of fixed size, and the deadline
//! every request runs under.
//!
//! SQLite is blocking, so requests run on tokio's blocking pool. A lane is a
//! fixed set of connections and a semaphore with one permit per connection:
//! one writer lane (writes queue in arrival order inside the process, so a
//! renewal never waits behind hundreds of follower reads or other writers of
//! this process) and a reader lane of a few connections. Connections are
//! kept for the store's life. Each request is bounded by its budget three
//! times: waiting for its lane, the busy handler (short pauses, never past
//! the deadline, while another process holds the lock), and the caller, who
//! stops waiting when the budget is spent.
//!
//! What the connections do (the schema and the SQL) is the store's, in
//! `mod.rs`; this file only hands them out.

use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use super::{Access, SqliteStore, open_error};
use crate::lease::StoreError;

/// Connections (and so blocking threads) writing at once: one. SQLite lets
/// only one writer hold the file anyway; more writers in one process would
/// only fight each other in the busy handler instead of queueing in order.
pub(super) const WRITERS: usize = 1;

/// Connections reading at once. WAL readers do not block each other or the
/// writer; two keep one slow read from stalling the others without letting
/// hundreds of follower reads flood the blocking pool.
pub(super) const READERS: usize = 2;

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
pub(super) struct DeadlineScope(Option<Instant>);

impl DeadlineScope {
    pub(super) fn enter(deadline: Instant) -> DeadlineScope {
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

/// The two lanes of one store.
#[derive(Debug)]
pub(super) struct Lanes {
    /// Conditional writes: one at a time, in arrival order.
    writes: Lane,
    /// Reads, lists and schema checks.
    reads: Lane,
}

/// Which lane a request runs in.
#[derive(Debug, Clone, Copy)]
pub(super) enum LaneKind {
    /// [`Lanes::writes`].
    Write,
    /// [`Lanes::reads`].
    Read,
}

impl Lanes {
    /// Both lanes, with `writer` (open on the file of generation 0) kept as
    /// the writer lane's connection.
    pub(super) fn new(writer: Connection) -> Lanes {
        Lanes {
            writes: Lane::new(WRITERS, vec![(0, writer)]),
            reads: Lane::new(READERS, Vec::new()),
        }
    }

    fn get(&self, kind: LaneKind) -> &Lane {
        match kind {
            LaneKind::Write => &self.writes,
            LaneKind::Read => &self.reads,
        }
    }

    /// Connections of `kind`'s lane not in use (tests).
    #[cfg(test)]
    pub(super) fn idle(&self, kind: LaneKind) -> usize {
        self.get(kind).lock_idle().len()
    }
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

impl SqliteStore {
    /// Run `work` on one of `lane`'s connections on the blocking pool, within
    /// `budget` (waiting for the lane included). `work` gets the deadline (on
    /// the blocking thread's clock).
    pub(super) async fn run<T, F>(
        &self,
        lane: LaneKind,
        budget: Duration,
        work: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path, Instant) -> Result<T, StoreError> + Send + 'static,
    {
        if budget.is_zero() {
            return Err(StoreError::Timeout(budget));
        }
        let deadline = Instant::now() + budget;
        let caller_deadline = tokio::time::Instant::now() + budget;
        let permits = self.inner.lanes.get(lane).permits.clone();
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
            let lane = inner.lanes.get(lane);
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

/// Per-connection settings.
pub(super) fn configure(conn: &mut Connection) -> rusqlite::Result<()> {
    // Replaces any busy timeout: waits are bounded by the request instead.
    conn.busy_handler(Some(busy_wait))?;
    // FULL: a committed write survives power loss. Losing the last write of
    // a tenure could hand out its fencing token a second time.
    conn.pragma_update(None, "synchronous", "FULL")
}
