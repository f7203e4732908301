//! The daemon's session as the driver carries it: each change of it
//! logged ([`SessionLog`]), and the sweep of the session records that are
//! over ([`Sweeper`]), run beside the node, never in its way.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Instant};
use crate::core::session::{SessionCore, SessionView};
use crate::core::sweep::SessionSweep;
use crate::lease::{LeaseStore, Record};

/// How often a daemon sweeps the session records that are over (the first
/// time once its session is open; see [`SessionSweep`]). A session nobody
/// renews any more, or ended, is deleted at the second sweep that finds it
/// unchanged (when its lease is shorter than this).
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// How long one sweep (its read and its deletes) may take.
const SWEEP_BUDGET: Duration = Duration::from_secs(5);

/// What the log of the session's changes remembers.
#[derive(Debug, Default)]
pub(super) struct SessionLog {
    /// The view as last logged.
    last: Option<SessionView>,
    /// The session whose validity ran out while it was still being renewed.
    lapsed: Option<String>,
}

impl SessionLog {
    /// The session's end was written: log it.
    pub(super) fn ended(identity: &str, key: &str, retired: bool) {
        let why = if retired {
            "this instance held nothing through it for a lease; "
        } else {
            ""
        };
        tracing::info!(identity = %identity, session = %key, "session ended: {why}nobody has to wait it out");
    }

    /// Log what changed since the last call: `view` is the session as its
    /// elections see it now, `core` the session's state.
    pub(super) fn changed(
        &mut self,
        identity: &str,
        core: &SessionCore,
        view: Option<&SessionView>,
    ) {
        let id = identity;
        // A lapsed session found ended or gone when its renew was answered.
        if let Some(key) = self.lapsed.take_if(|k| {
            core.record_key() != Some(k.as_str()) && !core.is_closing() && !core.is_retired()
        }) {
            tracing::warn!(identity = %id, session = %key, "session lost (ended by another instance, or gone from the store) while it was not renewed in time; a new one opens once an election needs it");
        }
        if self.last.as_ref() == view {
            return;
        }
        match (&self.last, view) {
            (None, Some(v)) if self.lapsed.as_deref() == Some(v.key.as_str()) => {
                tracing::info!(identity = %id, session = %v.key, "session renewed again after it lapsed: the elections held through it are campaigned for anew");
            }
            (None, Some(v)) => {
                tracing::info!(identity = %id, session = %v.key, "session opened: the elections this instance leads are held through it");
            }
            (Some(_), None) if core.is_closing() => {}
            // Ended for nothing wanting it (logged with its end write).
            (Some(_), None) if core.is_retired() => {}
            // Still ours, only not renewed within its validity.
            (Some(o), None) if core.record_key() == Some(o.key.as_str()) => {
                tracing::warn!(identity = %id, session = %o.key, "session not renewed in time: every election held through it stops; still trying to renew it");
                self.lapsed = Some(o.key.clone());
            }
            (Some(o), None) => {
                tracing::warn!(identity = %id, session = %o.key, "session lost (ended by another instance, or gone from the store): every election held through it stops; a new one opens once an election needs it");
            }
            (Some(o), Some(v)) if o.key != v.key => {
                tracing::warn!(identity = %id, old = %o.key, session = %v.key, "session replaced: every election held through the old one stopped");
            }
            _ => {}
        }
        if view.is_some() {
            self.lapsed = None;
        }
        self.last = view.cloned();
    }
}

/// The sweeps of the session records that are over: the first once the
/// daemon's session is open, then every [`SWEEP_EVERY`].
pub(super) struct Sweeper {
    identity: String,
    /// What the sweeps remember from one to the next, shared with the
    /// sweep under way.
    memory: Arc<Mutex<Memory>>,
    /// When the next sweep is due; `None` before the session first opened.
    next: Option<Instant>,
}

/// The sweep's memory.
struct Memory {
    sweep: SessionSweep,
    /// The error the last sweep failed with, logged once per change.
    failure: Option<String>,
}

/// Lock `memory`, even if a sweep panicked holding it: it is then at worst
/// out of date, which only makes a record wait longer.
fn lock(memory: &Mutex<Memory>) -> MutexGuard<'_, Memory> {
    memory.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sweeper {
    /// The sweeps of the daemon `identity`, judged with the clock drift
    /// `drift`.
    pub(super) fn new(identity: String, drift: f64) -> Sweeper {
        Sweeper {
            identity,
            memory: Arc::new(Mutex::new(Memory {
                sweep: SessionSweep::new(drift),
                failure: None,
            })),
            next: None,
        }
    }

    /// When the next sweep is due: `now` once the session is open the
    /// first time (`open`), then as planned.
    pub(super) fn due(&mut self, open: bool, now: Instant) -> Option<Instant> {
        if self.next.is_none() && open {
            self.next = Some(now);
        }
        self.next
    }

    /// Start a sweep beside the node (a slow sweep must not delay a
    /// renew), and plan the next.
    pub(super) fn start(&mut self, store: Arc<dyn LeaseStore>, clock: Clock) {
        self.next = Some(clock.now() + SWEEP_EVERY);
        tokio::spawn(sweep(
            store,
            self.identity.clone(),
            self.memory.clone(),
            clock,
        ));
    }
}

/// Delete the session records that are over (see [`SessionSweep`]),
/// judged on `clock` when the store's read answers.
async fn sweep(
    store: Arc<dyn LeaseStore>,
    identity: String,
    memory: Arc<Mutex<Memory>>,
    clock: Clock,
) {
    let mut read = 0;
    let mut judge = |records: &[Record]| {
        read = records.len();
        let unix_s = crate::clock::unix_ms() / 1000;
        lock(&memory).sweep.judge(records, clock.now(), unix_s)
    };
    let res = store.sweep_sessions(&mut judge, SWEEP_BUDGET).await;
    let mut memory = lock(&memory);
    match res {
        Ok(n) => {
            tracing::debug!(identity = %identity, read, timing = memory.sweep.timing(), deleted = n, "swept the session records");
            if n > 0 {
                tracing::info!(identity = %identity, deleted = n, "deleted session records that stayed unchanged (ended, or not renewed) for a takeover wait");
            }
            if memory.failure.take().is_some() {
                tracing::info!(identity = %identity, "session records can be swept again");
            }
        }
        Err(e) => {
            let e = e.to_string();
            if memory.failure.as_ref() != Some(&e) {
                tracing::warn!(identity = %identity, "cannot sweep the session records that are over (tried again in an hour): {e}");
                memory.failure = Some(e);
            }
        }
    }
}
