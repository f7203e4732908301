//! The daemon's check of the records it holds through its session.
//!
//! A tenure held through a session never rewrites its record (the session
//! is renewed instead), so a record deleted or rewritten under it (by
//! hand, by another tool, from a restored backup) would go unnoticed for
//! as long as the session lives, while another daemon that finds it
//! missing creates it and leads too. So the daemon reads back, every R,
//! some of the records it holds through its session, all in one request
//! of up to [`READ_MANY_LIMIT`] records, and tells each election whose
//! record is no longer its tenure's (see `Input::Checked`): that tenure is
//! lost, its job stopped and `/leader` 503, as when a renew finds someone
//! else's write.
//!
//! - Elections with `strict_new_lease` are read every R, all of them: a
//!   taker that creates a missing record waits L·(1+D) before it leads,
//!   and the holder notices within R and stops its job within G, before
//!   that (R + G < L is checked at start).
//! - The others are read in turn, one batch every 2R: a record deleted
//!   under a live tenure is noticed within 2R·⌈held/100⌉ (2R for up to
//!   100 elections held). Without sessions a renew notices it within R.
//!
//! It decides nothing itself: a failed read is logged once per change and
//! tried again at the next turn; the election judges what was read. It
//! ends with the daemon's session.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error_log::{ErrorLog, RequestKind};
use super::session_task::SESSION_LABEL;
use super::{ElectionState, Observer, Outcome, Steering, TaskContext};
use crate::clock::Clock;
use crate::core::session::SessionView;
use crate::lease::{LeaseStore, READ_MANY_LIMIT, Record};

/// The metric `op` of the check's reads.
const OP: &str = "read_check";

/// One election the daemon may hold through its session.
pub struct CheckTarget {
    /// Its name.
    pub name: String,
    /// Whether a taker of its missing record waits a lease before leading.
    pub strict: bool,
    /// Its published state: the tenure, and the session it is held through.
    pub state: watch::Receiver<ElectionState>,
    /// Where to tell it what was found.
    pub steering: Steering,
}

/// Start the check of `targets`, held by `identity` through the session
/// `own` shows, every `every` (R).
pub fn spawn_record_check(
    context: TaskContext,
    targets: Vec<CheckTarget>,
    own: watch::Receiver<Option<SessionView>>,
    every: Duration,
    identity: String,
) -> JoinHandle<()> {
    let TaskContext {
        store,
        clock,
        observer,
    } = context;
    let check = RecordCheck {
        store,
        targets,
        own,
        clock,
        every,
        observer,
        identity,
        turn: 0,
        cursor: 0,
        errors: ErrorLog::default(),
    };
    tokio::spawn(check.run())
}

struct RecordCheck {
    store: Arc<dyn LeaseStore>,
    targets: Vec<CheckTarget>,
    own: watch::Receiver<Option<SessionView>>,
    clock: Clock,
    every: Duration,
    observer: Arc<dyn Observer>,
    identity: String,
    /// Counts the periods: the others' batch goes out every second one.
    turn: u64,
    /// Where the next batch of the others starts.
    cursor: usize,
    errors: ErrorLog,
}

/// One held tenure: the target's index and the tenure's fencing token.
type Held = (usize, u64);

impl RecordCheck {
    async fn run(mut self) {
        loop {
            let at = self.clock.now() + self.every;
            self.clock.sleep_until(at).await;
            // The session task is gone (the daemon shut down): so is this.
            if self.own.has_changed().is_err() {
                return;
            }
            self.turn += 1;
            let Some(key) = self.own.borrow().as_ref().map(|v| v.key.clone()) else {
                continue;
            };
            let batch = self.batch(&key);
            for chunk in batch.chunks(READ_MANY_LIMIT) {
                self.check(chunk, &key).await;
            }
        }
    }

    /// What this period reads: every strict tenure, and every second
    /// period the next batch of the others.
    fn batch(&mut self, key: &str) -> Vec<Held> {
        let held: Vec<(Held, bool)> = self
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let s = t.state.borrow();
                let token = s.tenure.as_ref()?.fencing_token;
                (s.session.as_deref() == Some(key)).then_some(((i, token), t.strict))
            })
            .collect();
        let mut batch: Vec<Held> = held.iter().filter(|(_, s)| *s).map(|(h, _)| *h).collect();
        let others: Vec<Held> = held.iter().filter(|(_, s)| !*s).map(|(h, _)| *h).collect();
        if self.turn % 2 == 0 && !others.is_empty() {
            let n = others.len().min(READ_MANY_LIMIT);
            let start = self.cursor % others.len();
            batch.extend(others.iter().cycle().skip(start).take(n));
            self.cursor = start + n;
        }
        batch
    }

    /// Read `chunk`'s records; tell each election whose record is no
    /// longer its tenure's.
    async fn check(&mut self, chunk: &[Held], key: &str) {
        let names: Vec<String> = chunk
            .iter()
            .map(|(i, _)| self.targets[*i].name.clone())
            .collect();
        let start = self.clock.now();
        let res = self.store.read_many(&names, self.every).await;
        let took = self.clock.now() - start;
        let outcome = match &res {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(SESSION_LABEL, OP, took, outcome);
        let records = match res {
            Ok(records) => {
                if let Some(streak) = self.errors.succeeded(RequestKind::Read) {
                    tracing::info!(identity = %self.identity, failures = streak.count, "the check of the records held through the session reads again");
                }
                records
            }
            Err(e) => {
                if let Some(previous) =
                    self.errors
                        .failed(RequestKind::Read, e.to_string(), self.clock.now())
                {
                    tracing::warn!(identity = %self.identity, previous_failures = previous, "cannot check the records held through the session (tried again in {:?}): {e}", self.every);
                }
                return;
            }
        };
        for (&(i, token), record) in chunk.iter().zip(records) {
            if !self.still_held(&record, key, token) {
                self.targets[i].steering.checked(token, record);
            }
        }
    }

    /// Whether `record` is still the tenure `token` held through `key`.
    fn still_held(&self, record: &Record, key: &str, token: u64) -> bool {
        matches!(record, Record::Valid(l)
            if l.holder.as_deref() == Some(self.identity.as_str())
                && l.session.as_deref() == Some(key)
                && l.fencing_token == token)
    }
}
