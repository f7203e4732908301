//! Reads of session records shared by a daemon's elections.
//!
//! Every election held through one session times that session, and their
//! rounds come together (they wake at the same instants): one store read
//! answers every election that asked for the same session while it was on
//! its way, instead of one read per election.
//!
//! Sharing an answer is safe: the rule times a session's `rvn` from when
//! an election's core *handles* the answer, never earlier than the read
//! that produced it, and the end of a session is a write conditional on
//! the `rvn` it timed; an answer that is a moment old can only make a
//! follower wait longer, or end nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::lease::{LeaseStore, Record, StoreError};

/// One read on its way, and its answer once it came.
type Shared = Arc<OnceCell<Result<Record, StoreError>>>;

/// See the module docs.
pub struct SessionReads {
    store: Arc<dyn LeaseStore>,
    on_the_way: Mutex<HashMap<String, Shared>>,
}

impl SessionReads {
    /// Shared reads of `store`'s session records.
    pub fn new(store: Arc<dyn LeaseStore>) -> SessionReads {
        SessionReads {
            store,
            on_the_way: Mutex::new(HashMap::new()),
        }
    }

    /// The session record under `key`: the answer of the read on its way
    /// if there is one, else of a new read within `budget`. The flag says
    /// whether this call made the store request (for metrics).
    pub async fn read(&self, key: &str, budget: Duration) -> (Result<Record, StoreError>, bool) {
        let shared = self
            .on_the_way
            .lock()
            // A panic elsewhere mid-insert leaves a map that is still whole.
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(key.to_owned())
            .or_default()
            .clone();
        let mut made = false;
        let answer = shared
            .get_or_init(|| {
                made = true;
                self.store.read(key, budget)
            })
            .await
            .clone();
        if made {
            // Later askers make a read of their own.
            let mut map = self
                .on_the_way
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if map.get(key).is_some_and(|s| Arc::ptr_eq(s, &shared)) {
                map.remove(key);
            }
        }
        (answer, made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::memory::{Fault, MemoryStore};

    #[tokio::test]
    async fn reads_asked_together_are_answered_by_one_and_later_ones_read_again() {
        let store = MemoryStore::new();
        store.set_fault(Fault::Slow(Duration::from_millis(50)));
        let reads = Arc::new(SessionReads::new(Arc::new(store.clone())));
        let budget = Duration::from_secs(1);
        let asks: Vec<_> = (0..50)
            .map(|_| {
                let reads = reads.clone();
                tokio::spawn(async move { reads.read("#session/a/n", budget).await })
            })
            .collect();
        let answers = join_all(asks).await;
        assert!(answers.iter().all(|(a, _)| *a == Ok(Record::Absent)));
        let made = answers.iter().filter(|(_, m)| *m).count();
        assert!(
            (1..10).contains(&made),
            "one read answers those asked together ({made} made)"
        );
        assert_eq!(store.counts().0, made as u64, "reads the store saw");
        // Once answered, the next ask reads anew.
        let (_, made_again) = reads.read("#session/a/n", budget).await;
        assert!(made_again);
        assert_eq!(store.counts().0, made as u64 + 1);
    }

    async fn join_all(
        handles: Vec<tokio::task::JoinHandle<(Result<Record, StoreError>, bool)>>,
    ) -> Vec<(Result<Record, StoreError>, bool)> {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("the task ran"));
        }
        out
    }
}
