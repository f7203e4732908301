//! The takeover rule, the one place it is written: a record held by
//! someone else may be taken over once its `rvn` stayed unchanged for
//! `lease_ms·(1+D)` on the taker's own clock, counted from when the taker
//! first learned that `rvn` (a store read's arrival, or earlier if a hint
//! named it: an `rvn` cannot be named before it was written). The lease is
//! the one the store's record promises.
//!
//! The election core, `leaderd lock` and balance's member liveness time
//! records with [`TakeoverTimer`]; nothing else restates the rule.

use std::time::Duration;

use crate::core::time::Instant;

/// How long a record whose holder promised `lease_ms` must stay unchanged
/// before it may be taken over: the lease stretched by the clock drift D
/// (checked by `check_drift`).
pub fn takeover_wait(lease_ms: u64, max_clock_drift: f64) -> Duration {
    Duration::from_millis(lease_ms).mul_f64(1.0 + max_clock_drift)
}

/// The record version being timed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Timed {
    /// The `rvn`, or a stand-in key for a malformed record.
    key: String,
    /// When it was first learned.
    since: Instant,
    /// The lease its record promises, ms.
    lease_ms: u64,
}

/// Whether `key` is `parts` one after another.
fn is_joined(key: &str, parts: &[&str]) -> bool {
    let mut rest = key;
    for part in parts {
        match rest.strip_prefix(part) {
            Some(after) => rest = after,
            None => return false,
        }
    }
    rest.is_empty()
}

/// Times the record version a taker last read (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct TakeoverTimer {
    max_clock_drift: f64,
    timed: Option<Timed>,
}

// D is checked finite (`check_drift`), so equality is total.
impl Eq for TakeoverTimer {}

impl std::hash::Hash for TakeoverTimer {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.max_clock_drift.to_bits().hash(state);
        self.timed.hash(state);
    }
}

impl TakeoverTimer {
    /// A timer for drift D = `max_clock_drift`, timing nothing yet.
    pub fn new(max_clock_drift: f64) -> TakeoverTimer {
        TakeoverTimer {
            max_clock_drift,
            timed: None,
        }
    }

    /// A read answered at `at` found `key`, whose record promises
    /// `lease_ms`; `learned` is an earlier instant the key was known, if
    /// any. The same key keeps the instant it was first learned; another
    /// starts anew. Returns the instant from which it may be taken over
    /// (at or before `at`: now).
    pub fn observe(
        &mut self,
        key: &str,
        lease_ms: u64,
        at: Instant,
        learned: Option<Instant>,
    ) -> Instant {
        self.observe_joined(&[key], lease_ms, at, learned)
    }

    /// [`TakeoverTimer::observe`] of the key `parts` make one after
    /// another, written out only when it is new (a follower of thousands
    /// of elections times the same session version for each).
    pub fn observe_joined(
        &mut self,
        parts: &[&str],
        lease_ms: u64,
        at: Instant,
        learned: Option<Instant>,
    ) -> Instant {
        match &mut self.timed {
            Some(t) if is_joined(&t.key, parts) => t.lease_ms = lease_ms,
            _ => {
                self.timed = Some(Timed {
                    key: parts.concat(),
                    since: learned.map_or(at, |l| l.min(at)),
                    lease_ms,
                });
            }
        }
        self.due().expect("a key is timed")
    }

    /// When the key timed last may be taken over, if one is timed.
    pub fn due(&self) -> Option<Instant> {
        self.timed
            .as_ref()
            .map(|t| t.since + takeover_wait(t.lease_ms, self.max_clock_drift))
    }

    /// When the key timed last was first learned, if one is timed.
    pub fn since(&self) -> Option<Instant> {
        self.timed.as_ref().map(|t| t.since)
    }

    /// Time nothing (after a write of ours, or a change of role).
    pub fn forget(&mut self) {
        self.timed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_unchanged_key_is_due_a_drift_stretched_lease_after_it_was_first_learned() {
        let t0 = Instant::from_since_origin(Duration::from_secs(1));
        let mut timer = TakeoverTimer::new(0.01);
        assert_eq!(timer.due(), None);
        assert_eq!(timer.observe("a", 10_000, t0, None), t0 + 10_100 * MS);
        // Read again later: the first sight counts, and the store's lease.
        assert_eq!(
            timer.observe("a", 20_000, t0 + 5_000 * MS, None),
            t0 + 20_200 * MS
        );
        // Another key starts anew; a hint that named it earlier dates it
        // back, one that arrived after the read does not.
        let t1 = t0 + 6_000 * MS;
        assert_eq!(
            timer.observe("b", 10_000, t1, Some(t1.saturating_sub(300 * MS))),
            t1 + 9_800 * MS
        );
        assert_eq!(timer.since(), Some(t1.saturating_sub(300 * MS)));
        assert_eq!(
            timer.observe("c", 10_000, t1, Some(t1 + MS)),
            t1 + 10_100 * MS
        );
        timer.forget();
        assert_eq!(timer.due(), None);
    }

    #[test]
    fn a_key_in_parts_is_the_key_they_make() {
        let t0 = Instant::from_since_origin(Duration::from_secs(1));
        let mut timer = TakeoverTimer::new(0.0);
        assert_eq!(timer.observe("s@r1", 10_000, t0, None), t0 + 10_000 * MS);
        // The same key, in parts: still timed from its first sight.
        let later = t0 + 4_000 * MS;
        let due = timer.observe_joined(&["s", "@", "r1"], 10_000, later, None);
        assert_eq!(due, t0 + 10_000 * MS);
        assert_eq!(
            timer.observe_joined(&["s@", "r1", ""], 10_000, later, None),
            due
        );
        // A key that only begins like it, or is shorter, is another.
        let other = timer.observe_joined(&["s", "@", "r10"], 10_000, later, None);
        assert_eq!(other, later + 10_000 * MS);
        assert_eq!(
            timer.observe("s@r1", 10_000, later, None),
            later + 10_000 * MS
        );
        assert_eq!(
            timer.observe_joined(&["s@r"], 10_000, later, None),
            later + 10_000 * MS
        );
        assert_eq!(timer.since(), Some(later));
    }
}
