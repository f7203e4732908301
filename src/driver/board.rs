//! Where the driver publishes what its elections do: a [`Board`] holds
//! one value per election (the state; the last event) behind one lock.
//! Readers borrow a row through a [`View`]; one that waits for its
//! election's change is woken by that row's change only. A row keeps the
//! means to wake anyone (a `Notify`) only once someone has waited on it:
//! most rows are read, never waited on.
//!
//! Before, each election had a watch channel per value: some 560 bytes
//! each besides the value, 11 MB at 10,000 elections.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard};
use tokio::sync::Notify;

use crate::core::election::ElectionState;
use crate::core::hints::LeaseEvent;

/// One row: the value, how often it changed, and who waits for that.
struct Row<T> {
    value: T,
    moves: u64,
    /// Set by the first view that waits on this row.
    waiters: OnceLock<Arc<Notify>>,
}

impl<T> Row<T> {
    /// Count a change and wake whoever waits for one.
    fn moved(&mut self) {
        self.moves += 1;
        if let Some(waiters) = self.waiters.get() {
            waiters.notify_waiters();
        }
    }
}

/// The rows, shared by the [`Board`] and every [`View`].
struct Rows<T> {
    rows: RwLock<Vec<Row<T>>>,
    /// The board is gone: nothing more will change.
    closed: AtomicBool,
}

impl<T> Rows<T> {
    /// Recursive: a reader may borrow two rows at once (a view holds
    /// the whole table's lock), even while the driver waits to write.
    fn read(&self) -> RwLockReadGuard<'_, Vec<Row<T>>> {
        self.rows.read_recursive()
    }
}

/// The driver's end of a board: it writes the rows. Dropping it (the
/// driver ended) closes every view.
pub struct Board<T> {
    rows: Arc<Rows<T>>,
}

/// Each election's published state.
pub type StateBoard = Board<ElectionState>;
/// Each election's last event (`None` before the first).
pub type EventBoard = Board<Option<LeaseEvent>>;
/// One election's published state.
pub type StateView = View<ElectionState>;
/// One election's last event.
pub type EventView = View<Option<LeaseEvent>>;

/// A board of one row and a view of it, as `watch::channel` gives a
/// sender and a receiver (tests, and the daemon's own stand-ins).
pub fn channel<T>(value: T) -> (Board<T>, View<T>) {
    let board = Board::new([value]);
    let view = board.view(0);
    (board, view)
}

impl<T> Board<T> {
    /// A board of `values`, one row each, in order.
    pub fn new(values: impl IntoIterator<Item = T>) -> Board<T> {
        let rows = values
            .into_iter()
            .map(|value| Row {
                value,
                moves: 0,
                waiters: OnceLock::new(),
            })
            .collect();
        let rows = Arc::new(Rows {
            rows: RwLock::new(rows),
            closed: AtomicBool::new(false),
        });
        Board { rows }
    }

    /// A view of row `index`, its value marked seen.
    ///
    /// # Panics
    /// When the board has no row `index`: a view of no row is a bug.
    pub fn view(&self, index: usize) -> View<T> {
        let seen = self.rows.read()[index].moves;
        View {
            rows: self.rows.clone(),
            index,
            seen,
        }
    }

    /// Change row `index` with `f`, which says whether it changed; its
    /// views are told then. Returns what `f` said (`false` for no row).
    pub fn send_if_modified(&self, index: usize, f: impl FnOnce(&mut T) -> bool) -> bool {
        let mut rows = self.rows.rows.write();
        let Some(row) = rows.get_mut(index) else {
            return false;
        };
        if !f(&mut row.value) {
            return false;
        }
        row.moved();
        true
    }

    /// Change row `index` with `f`; its views are told.
    pub fn send_modify(&self, index: usize, f: impl FnOnce(&mut T)) {
        self.send_if_modified(index, |v| {
            f(v);
            true
        });
    }

    /// Replace row `index`'s value; its views are told.
    pub fn send_replace(&self, index: usize, value: T) {
        self.send_modify(index, |v| *v = value);
    }
}

impl<T: Clone + PartialEq> Board<T> {
    /// Publish `value` as row `index`'s unless it is the one published,
    /// copied field by field into the last (buffers kept). Returns
    /// whether it changed.
    pub fn publish(&self, index: usize, value: &T) -> bool {
        self.send_if_modified(index, |v| {
            if v == value {
                return false;
            }
            v.clone_from(value);
            true
        })
    }

    /// [`Board::publish`] each of `rows` (index, value) under one hold of
    /// the lock: the driver publishes what one input changed (thousands
    /// of elections at a session's write) in one go, and a reader
    /// borrowing rows meanwhile makes it wait once, not once a row.
    pub fn publish_all<'a>(&self, rows: impl IntoIterator<Item = (usize, &'a T)>)
    where
        T: 'a,
    {
        let mut table = self.rows.rows.write();
        for (index, value) in rows {
            let Some(row) = table.get_mut(index) else {
                continue;
            };
            if row.value != *value {
                row.value.clone_from(value);
                row.moved();
            }
        }
    }
}

impl<T> Drop for Board<T> {
    fn drop(&mut self) {
        // Under the write lock: a view that looked before finds its
        // waiters woken here, one that looks after finds the board closed.
        let table = self.rows.rows.write();
        self.rows.closed.store(true, Ordering::Release);
        for row in table.iter() {
            if let Some(waiters) = row.waiters.get() {
                waiters.notify_waiters();
            }
        }
    }
}

/// The driver ended: nothing more will be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// One row of a board, as a watch receiver shows its value: borrow it,
/// or wait until it changes. Each view remembers what it has seen.
pub struct View<T> {
    rows: Arc<Rows<T>>,
    index: usize,
    /// The row's count when this view last marked it seen.
    seen: u64,
}

impl<T> Clone for View<T> {
    fn clone(&self) -> View<T> {
        View {
            rows: self.rows.clone(),
            index: self.index,
            seen: self.seen,
        }
    }
}

impl<T> std::fmt::Debug for View<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("index", &self.index)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

/// A borrowed value. Hold it briefly (never across an await): the
/// driver's next publish waits for it.
pub struct Ref<'a, T> {
    rows: RwLockReadGuard<'a, Vec<Row<T>>>,
    index: usize,
}

impl<T> Deref for Ref<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.rows[self.index].value
    }
}

impl<T> View<T> {
    /// The value now, not marked seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref {
            rows: self.rows.read(),
            index: self.index,
        }
    }

    /// The value now, marked seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let rows = self.rows.read();
        self.seen = rows[self.index].moves;
        Ref {
            rows,
            index: self.index,
        }
    }

    fn closed(&self) -> bool {
        self.rows.closed.load(Ordering::Acquire)
    }

    /// Whether the value changed since it was last marked seen; an error
    /// once the driver has ended.
    pub fn has_changed(&self) -> Result<bool, Closed> {
        if self.closed() {
            return Err(Closed);
        }
        Ok(self.rows.read()[self.index].moves != self.seen)
    }

    /// Wait until the value changes from the one last marked seen, and
    /// mark it seen; an error once the driver has ended with nothing
    /// unseen. Cancel-safe: no change is lost.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let waiters = {
                let rows = self.rows.read();
                let row = &rows[self.index];
                if row.moves != self.seen {
                    self.seen = row.moves;
                    return Ok(());
                }
                if self.closed() {
                    return Err(Closed);
                }
                row.waiters.get_or_init(Arc::default).clone()
            };
            let notified = waiters.notified();
            tokio::pin!(notified);
            // Waiting from here on: a change (or the end) after the look
            // below wakes it; both are made under the write lock.
            notified.as_mut().enable();
            let idle = {
                let rows = self.rows.read();
                rows[self.index].moves == self.seen && !self.closed()
            };
            if idle {
                notified.await;
            }
        }
    }

    /// Wait until `f` holds of the value (it may already), marking it
    /// seen.
    pub async fn wait_for(&mut self, mut f: impl FnMut(&T) -> bool) -> Result<(), Closed> {
        loop {
            if f(&self.borrow_and_update()) {
                return Ok(());
            }
            self.changed().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_view_wakes_for_its_own_row_only() {
        let board = Board::new([1, 2]);
        let mut a = board.view(0);
        let b = board.view(1);
        assert_eq!(a.has_changed(), Ok(false));
        assert!(board.publish(1, &20));
        assert!(!board.publish(1, &20), "the same value publishes nothing");
        assert_eq!(a.has_changed(), Ok(false));
        assert_eq!(b.has_changed(), Ok(true));
        assert_eq!(*b.borrow(), 20);
        let waiting = tokio::spawn(async move {
            a.changed().await.unwrap();
            *a.borrow()
        });
        tokio::task::yield_now().await;
        board.publish(1, &200);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "another row's change wakes no one");
        board.publish(0, &10);
        assert_eq!(waiting.await.unwrap(), 10);
    }

    #[tokio::test]
    async fn views_close_with_the_board_after_the_last_change() {
        let (board, mut view) = channel(0);
        let mut other = view.clone();
        let mut waiting = view.clone();
        board.send_replace(0, 1);
        drop(board);
        assert!(view.has_changed().is_err());
        assert_eq!(view.changed().await, Ok(()), "the last change is seen");
        assert_eq!(*view.borrow(), 1);
        assert_eq!(view.changed().await, Err(Closed));
        assert_eq!(other.wait_for(|v| *v == 1).await, Ok(()));
        assert_eq!(waiting.wait_for(|v| *v == 2).await, Err(Closed));
    }

    #[test]
    fn a_reader_may_borrow_two_rows_while_the_driver_waits_to_write() {
        let board = Arc::new(Board::new([1, 2]));
        let (a, b) = (board.view(0), board.view(1));
        let first = a.borrow();
        let writer = {
            let board = board.clone();
            std::thread::spawn(move || board.publish(0, &10))
        };
        // Give the writer time to queue behind the held borrow.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(*b.borrow(), 2, "a second borrow does not wait");
        assert_eq!(*first, 1);
        drop(first);
        assert!(writer.join().unwrap());
        assert_eq!(*a.borrow(), 10);
    }

    #[tokio::test]
    async fn rows_published_together_wake_their_own_waiters() {
        let board = Board::new([1, 2, 3]);
        let (mut a, mut b, mut c) = (board.view(0), board.view(1), board.view(2));
        let waiting = tokio::spawn(async move {
            a.changed().await.unwrap();
            b.changed().await.unwrap();
            (*a.borrow(), *b.borrow())
        });
        let third = tokio::spawn(async move { c.changed().await });
        tokio::task::yield_now().await;
        board.publish_all([(0, &10), (1, &20), (7, &70)]);
        assert_eq!(waiting.await.unwrap(), (10, 20));
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "a row not published wakes no one");
        drop(board);
        assert_eq!(third.await.unwrap(), Err(Closed), "the end wakes everyone");
    }
}
