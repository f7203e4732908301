//! Which session records a daemon's sweep deletes, so that ended and
//! abandoned sessions do not pile up in a store without TTL (SQLite; see
//! `LeaseStore::sweep_sessions`). Pure: the records one read found, the
//! boot-time instant its answer arrived and the wall clock then in; the
//! records to delete out. Its tests are in `tests` (`sweep/tests.rs`).
//!
//! A session record is deleted once its `rvn` stayed unchanged for the
//! **takeover wait** of its `lease_ms` (L·(1+D), D this daemon's) on this
//! daemon's own boot-time clock, counted from the read that first showed
//! it that `rvn`:
//! - a live record (it has a holder) is then over by the takeover rule's
//!   own test, after which any follower could end it;
//! - an **ended** one (no holder) can never be renewed again, and could go
//!   at once; it is kept for the wait too, so that the followers of the
//!   elections held through it read it ended (free at once) rather than
//!   missing (timed for a lease).
//!
//! Every delete is conditional on the `rvn` judged, so a session renewed
//! in between stays; a late renew of an owner whose session was deleted
//! fails, as it would had a follower ended it. No wall clock is compared
//! across processes to decide a delete: `expires_at`, written by the
//! holder on its own wall clock, only lets the sweep skip (and not even
//! time) a live record that is obviously fresh. A wall clock that is
//! wrong either way can delay a delete, never bring one before the wait.

use std::collections::HashMap;

use super::takeover::takeover_wait;
use crate::core::keys::is_session_key;
use crate::core::record::{Record, StaleSession};
use crate::core::time::Instant;

/// The most session records a sweep times at once (key, `rvn`, first
/// sight: about 150 bytes each with a short identity). Forgetting a record
/// only makes it wait longer, never shorter: one not remembered is timed
/// from its next sight. Those already timed are kept first, so the oldest
/// are deleted and make room; each sweep can delete this many.
pub const SWEEP_MEMORY: usize = 10_000;

/// An `rvn` being timed, and when it was first seen.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    rvn: String,
    since: Instant,
}

/// What the sweep remembers between two runs: the session records it is
/// timing (see the module docs).
#[derive(Debug, Clone)]
pub struct SessionSweep {
    max_clock_drift: f64,
    seen: HashMap<String, Seen>,
}

impl SessionSweep {
    /// A sweep with drift D = `max_clock_drift`, timing nothing yet.
    pub fn new(max_clock_drift: f64) -> SessionSweep {
        SessionSweep {
            max_clock_drift,
            seen: HashMap::new(),
        }
    }

    /// How many records it is timing.
    pub fn timing(&self) -> usize {
        self.seen.len()
    }

    /// Judge `records`, every session record one read found; `at` is the
    /// arrival of its answer on the boot-time clock, `unix_s` the wall
    /// clock then (only to skip obviously fresh records). Returns those to
    /// delete; remembers the rest it times. Records it did not find any
    /// more, or found rewritten, are forgotten (a new `rvn` starts anew).
    pub fn judge(&mut self, records: &[Record], at: Instant, unix_s: u64) -> Vec<StaleSession> {
        let mut previous = std::mem::take(&mut self.seen);
        let (known, new): (Vec<_>, Vec<_>) = records
            .iter()
            .filter_map(|record| match record {
                // A malformed record, or one of a format this build does
                // not know, is never deleted: nothing says when it is over.
                Record::Valid(s) if is_session_key(&s.election) => Some(s),
                _ => None,
            })
            .filter(|s| s.holder.is_none() || s.expires_at_s <= unix_s)
            .map(|s| {
                let since = previous
                    .remove(&s.election)
                    .filter(|seen| seen.rvn == s.rvn)
                    .map(|seen| seen.since);
                (since, s)
            })
            // Those timed already first, so that a full memory never
            // forgets them for newcomers.
            .partition(|(since, _)| since.is_some());
        let mut stale = Vec::new();
        for (since, s) in known.into_iter().chain(new) {
            let since = since.unwrap_or(at);
            if since + takeover_wait(s.lease_ms, self.max_clock_drift) <= at {
                stale.push(StaleSession {
                    key: s.election.clone(),
                    rvn: s.rvn.clone(),
                });
            } else if self.seen.len() < SWEEP_MEMORY {
                self.seen.insert(
                    s.election.clone(),
                    Seen {
                        rvn: s.rvn.clone(),
                        since,
                    },
                );
            }
        }
        stale
    }
}

#[cfg(test)]
mod tests;
