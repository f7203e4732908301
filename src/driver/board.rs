//! Where the driver publishes what its elections do: a [`Board`] holds
//! one value per election (the state; the last event) behind one lock,
//! and one count for the whole board that moves at each publish. Readers
//! borrow a row through a [`View`]; one that waits for its election's
//! change wakes when the board's count moves and looks at its row's own.
//!
//! Before, each election had a watch channel per value: some 560 bytes
//! each besides the value, 11 MB at 10,000 elections.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use tokio::sync::watch;

use crate::core::election::ElectionState;
use crate::core::hints::LeaseEvent;

/// One row: the value and how often it changed.
struct Row<T> {
    value: T,
    moves: u64,
}

/// The rows, shared by the [`Publisher`] and every [`View`].
struct Rows<T> {
    rows: RwLock<Vec<Row<T>>>,
    /// A receiver of the board's count, to subscribe views from.
    moves: watch::Receiver<u64>,
}

/// The driver's end of a board: it writes the rows and moves the count.
/// Dropping it (the driver ended) closes every view.
pub struct Board<T> {
    rows: Arc<Rows<T>>,
    moves: watch::Sender<u64>,
    /// A row changed since the views were last told.
    staged: AtomicBool,
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
            .map(|value| Row { value, moves: 0 })
            .collect();
        let (moves, moves_rx) = watch::channel(0);
        let rows = Arc::new(Rows {
            rows: RwLock::new(rows),
            moves: moves_rx,
        });
        Board {
            rows,
            moves,
            staged: AtomicBool::new(false),
        }
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
            moves: self.rows.moves.clone(),
            seen,
        }
    }

    /// Change row `index` with `f`, which says whether it changed, without
    /// telling the views yet ([`Board::tell`] does). Returns what `f` said
    /// (`false` for no row).
    pub fn stage(&self, index: usize, f: impl FnOnce(&mut T) -> bool) -> bool {
        let mut rows = self.rows.rows.write();
        let Some(row) = rows.get_mut(index) else {
            return false;
        };
        if !f(&mut row.value) {
            return false;
        }
        row.moves += 1;
        self.staged.store(true, Ordering::Relaxed);
        true
    }

    /// Tell the views of what was staged since the last time, if anything:
    /// one move of the board's count for a whole batch of rows (every
    /// election held through a session changes at its write).
    pub fn tell(&self) {
        // After the rows: a view that saw the count move finds its row
        // changed.
        if self.staged.swap(false, Ordering::Relaxed) {
            self.moves.send_modify(|n| *n += 1);
        }
    }

    /// Change row `index` with `f`, which says whether it changed; views
    /// are told at once. Returns what `f` said.
    pub fn send_if_modified(&self, index: usize, f: impl FnOnce(&mut T) -> bool) -> bool {
        let changed = self.stage(index, f);
        self.tell();
        changed
    }

    /// Change row `index` with `f`; views are told.
    pub fn send_modify(&self, index: usize, f: impl FnOnce(&mut T)) {
        self.send_if_modified(index, |v| {
            f(v);
            true
        });
    }

    /// Replace row `index`'s value; views are told.
    pub fn send_replace(&self, index: usize, value: T) {
        self.send_modify(index, |v| *v = value);
    }
}

impl<T: Clone + PartialEq> Board<T> {
    /// Stage `value` as row `index`'s unless it is the one published,
    /// copied field by field into the last (buffers kept). Returns
    /// whether it changed. Views learn of it at the next [`Board::tell`].
    pub fn stage_value(&self, index: usize, value: &T) -> bool {
        self.stage(index, |v| {
            if v == value {
                return false;
            }
            v.clone_from(value);
            true
        })
    }

    /// [`Board::stage_value`] for each of `rows` (index, value), under one
    /// hold of the lock: the driver publishes what one input changed
    /// (thousands of elections at a session's write) in one go, and a
    /// reader borrowing rows meanwhile makes it wait once, not once a row.
    pub fn stage_values<'a>(&self, rows: impl IntoIterator<Item = (usize, &'a T)>)
    where
        T: 'a,
    {
        let mut table = self.rows.rows.write();
        let mut staged = false;
        for (index, value) in rows {
            let Some(row) = table.get_mut(index) else {
                continue;
            };
            if row.value != *value {
                row.value.clone_from(value);
                row.moves += 1;
                staged = true;
            }
        }
        drop(table);
        if staged {
            self.staged.store(true, Ordering::Relaxed);
        }
    }

    /// [`Board::stage_value`], and tell the views.
    pub fn publish(&self, index: usize, value: &T) -> bool {
        let changed = self.stage_value(index, value);
        self.tell();
        changed
    }
}

impl<T> Rows<T> {
    /// Recursive: a reader may borrow two rows at once (a view holds
    /// the whole table's lock), even while the driver waits to write.
    fn read(&self) -> RwLockReadGuard<'_, Vec<Row<T>>> {
        self.rows.read_recursive()
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
    moves: watch::Receiver<u64>,
    /// The row's count when this view last marked it seen.
    seen: u64,
}

impl<T> Clone for View<T> {
    fn clone(&self) -> View<T> {
        View {
            rows: self.rows.clone(),
            index: self.index,
            moves: self.moves.clone(),
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
    /// The row's count now.
    fn count(&self) -> u64 {
        self.rows.read()[self.index].moves
    }

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

    /// Whether the value changed since it was last marked seen; an error
    /// once the driver has ended.
    pub fn has_changed(&self) -> Result<bool, Closed> {
        self.moves.has_changed().map_err(|_| Closed)?;
        Ok(self.count() != self.seen)
    }

    /// Wait until the value changes from the one last marked seen, and
    /// mark it seen; an error once the driver has ended with nothing
    /// unseen. Cancel-safe: no change is lost.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            // Marked before the row is looked at: a publish after this
            // moves the count again and ends the wait below.
            self.moves.borrow_and_update();
            let now = self.count();
            if now != self.seen {
                self.seen = now;
                return Ok(());
            }
            self.moves.changed().await.map_err(|_| Closed)?;
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
    async fn staged_rows_are_told_together() {
        let board = Board::new([1, 2]);
        let (mut a, mut b) = (board.view(0), board.view(1));
        let waiting = tokio::spawn(async move {
            a.changed().await.unwrap();
            b.changed().await.unwrap();
            (*a.borrow(), *b.borrow())
        });
        tokio::task::yield_now().await;
        assert!(board.stage_value(0, &10));
        assert!(board.stage_value(1, &20));
        assert!(!board.stage_value(1, &20));
        board.stage_values([(1, &20), (7, &70)]);
        tokio::task::yield_now().await;
        // A view waiting for the count wakes at the tell (one that looks
        // finds its row changed at once).
        assert!(!waiting.is_finished());
        assert_eq!(*board.view(1).borrow(), 20);
        board.tell();
        assert_eq!(waiting.await.unwrap(), (10, 20));
    }
}
