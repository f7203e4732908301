//! Store errors as the engine logs them: once per change (reads and writes
//! apart), with a count, and once more when requests work again; an error
//! many elections meet at once (the store down, under ten thousand of
//! them) once for them all ([`Crowd`]); so the warnings many elections
//! give for one cause within seconds ([`Tallies`]: the releases that fail
//! at shutdown, a lying stream) and the leases one moment loses
//! ([`Burst`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Instant;

/// How long a kind of error may go unmet by any election before the next
/// election to meet it logs it again, as a new trouble.
pub(super) const CROWD_QUIET: Duration = Duration::from_secs(60);

/// Which kind of store request failed: reads and writes are told apart so
/// that a read that works between two writes that fail does not count as
/// the end of the writes' trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum RequestKind {
    Read,
    Write,
}

impl RequestKind {
    pub(super) fn of(op: &str) -> RequestKind {
        if op.starts_with("read") {
            RequestKind::Read
        } else {
            RequestKind::Write
        }
    }

    pub(super) fn plural(self) -> &'static str {
        match self {
            RequestKind::Read => "reads",
            RequestKind::Write => "writes",
        }
    }
}

/// An error that keeps coming back: logged when it starts, when it turns
/// into another error, and when it ends, with how often it came in between;
/// never once per attempt.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    pub(super) reads: Option<Streak>,
    pub(super) writes: Option<Streak>,
}

#[derive(Debug)]
pub(super) struct Streak {
    /// The error's text: the same text is the same error.
    pub(super) error: String,
    /// The error's class (`StoreError::metric_label`): what [`Crowd`]
    /// groups elections by.
    pub(super) class: &'static str,
    /// Failures in a row with this text.
    pub(super) count: u64,
    /// When the streak (of any error) began.
    pub(super) since: Instant,
}

impl ErrorLog {
    pub(super) fn streak(&mut self, kind: RequestKind) -> &mut Option<Streak> {
        match kind {
            RequestKind::Read => &mut self.reads,
            RequestKind::Write => &mut self.writes,
        }
    }

    /// Counts a failure; `Some(previous)` when it is worth a log line: a new
    /// error (`previous` is how often the one before it came, 0 if none).
    pub(super) fn failed(
        &mut self,
        kind: RequestKind,
        error: String,
        class: &'static str,
        now: Instant,
    ) -> Option<u64> {
        let streak = self.streak(kind);
        match streak {
            Some(s) if s.error == error => {
                s.count += 1;
                None
            }
            Some(s) => {
                let previous = s.count;
                s.error = error;
                s.class = class;
                s.count = 1;
                Some(previous)
            }
            None => {
                *streak = Some(Streak {
                    error,
                    class,
                    count: 1,
                    since: now,
                });
                Some(0)
            }
        }
    }

    /// A request of this kind succeeded: the streak that ended, if any.
    pub(super) fn succeeded(&mut self, kind: RequestKind) -> Option<Streak> {
        self.streak(kind).take()
    }
}

/// The elections in a streak of one kind of error, daemon-wide (by kind of
/// request and class of error): the first to meet it logs it, the others
/// are counted, and the last to work again logs the end for them all. Ten
/// thousand elections that find the store down make two lines, not twenty
/// thousand. A kind no election met for [`CROWD_QUIET`] is logged anew by
/// the next to meet it (an election whose streak never ended, because it
/// made no such request since, does not silence it for ever).
#[derive(Debug, Default)]
pub(super) struct Crowd {
    tallies: HashMap<(RequestKind, &'static str), Tally>,
}

/// One kind of error's elections.
#[derive(Debug)]
pub(super) struct Tally {
    /// Elections in a streak of it now.
    pub(super) now: u64,
    /// Elections that joined since it was last logged.
    pub(super) joined: u64,
    /// When an election last met it.
    last: Instant,
}

impl Crowd {
    /// An election met an error of `class` on a request of `kind` (its
    /// streak began or went on): whether this is worth a log line (no
    /// election had met it within [`CROWD_QUIET`]). `joins`: the election
    /// was not in a streak of this class before.
    pub(super) fn met(
        &mut self,
        kind: RequestKind,
        class: &'static str,
        joins: bool,
        now: Instant,
    ) -> bool {
        let tally = self.tallies.entry((kind, class)).or_insert(Tally {
            now: 0,
            joined: 0,
            last: now,
        });
        let fresh = tally.joined == 0 || now.saturating_since(tally.last) > CROWD_QUIET;
        if fresh {
            tally.joined = 0;
        }
        if joins {
            tally.now += 1;
            tally.joined += 1;
        }
        tally.last = now;
        fresh && joins
    }

    /// Elections in a streak of `class` on requests of `kind` now.
    pub(super) fn size(&self, kind: RequestKind, class: &'static str) -> u64 {
        self.tallies.get(&(kind, class)).map_or(0, |t| t.now)
    }

    /// An election's streak of `class` on requests of `kind` ended (it
    /// works again, or meets another class now): the tally when it was the
    /// last in it, or when the error had gone unmet for [`CROWD_QUIET`]
    /// (worth a log line), else `None`.
    pub(super) fn left(
        &mut self,
        kind: RequestKind,
        class: &'static str,
        now: Instant,
    ) -> Option<Tally> {
        let key = (kind, class);
        let tally = self.tallies.get_mut(&key)?;
        tally.now = tally.now.saturating_sub(1);
        let quiet = now.saturating_since(tally.last) > CROWD_QUIET;
        if tally.now == 0 {
            return self.tallies.remove(&key);
        }
        quiet.then(|| Tally {
            now: tally.now,
            joined: std::mem::take(&mut tally.joined).max(1),
            last: tally.last,
        })
    }
}

/// How long a [`Tallies`] line must go unrepeated before its count is
/// logged, and the next of its kind is logged by itself again.
pub(super) const TALLY_QUIET: Duration = Duration::from_secs(5);

/// Warnings many elections give for one cause over a few seconds (at
/// shutdown under ten thousand elections, a store that cannot keep up
/// fails thousands of releases between releases that work; a leader's
/// stream found lying is distrusted by each election it leads, read by
/// read): by kind and key (the error's class, the stream's address), the
/// first is logged with its election, the next are counted, and the count
/// is logged once none came for [`TALLY_QUIET`], or at the node's end.
#[derive(Debug, Default)]
pub(super) struct Tallies {
    /// Kind, key, lines not logged, when the last came.
    open: Vec<(&'static str, String, u64, Instant)>,
}

impl Tallies {
    /// A line of `kind` for `key` at `now`: whether it is logged by itself
    /// (the first since the last quiet spell).
    pub(super) fn seen(&mut self, kind: &'static str, key: &str, now: Instant) -> bool {
        match self.open.iter_mut().find(|(k, key_, _, last)| {
            *k == kind && key_ == key && now.saturating_since(*last) <= TALLY_QUIET
        }) {
            Some((_, _, n, last)) => {
                *n += 1;
                *last = now;
                false
            }
            None => {
                self.open
                    .retain(|(k, key_, n, _)| *k != kind || key_ != key || *n > 0);
                self.open.push((kind, key.to_owned(), 0, now));
                true
            }
        }
    }

    /// The counts due at `now` (quiet for [`TALLY_QUIET`]; `None`: all, at
    /// the node's end), by kind and key; lines of none counted are
    /// dropped with them.
    pub(super) fn due(&mut self, now: Option<Instant>) -> Vec<(&'static str, String, u64)> {
        let quiet = |last: Instant| now.is_none_or(|now| now.saturating_since(last) > TALLY_QUIET);
        let (due, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|(_, _, _, last)| quiet(*last));
        self.open = open;
        due.into_iter()
            .filter(|(_, _, n, _)| *n > 0)
            .map(|(k, key, n, _)| (k, key, n))
            .collect()
    }
}

/// Lines a single cause makes many elections log at once (a session that
/// lapsed stops every election held through it): the first
/// [`BURST_LOGGED`] of each kind by themselves, the rest counted and summed
/// once the input that caused them was handled.
pub(super) const BURST_LOGGED: u64 = 3;

/// The lines of the input being handled, by kind (see [`BURST_LOGGED`]).
#[derive(Debug, Default)]
pub(super) struct Burst {
    counts: Vec<(&'static str, u64)>,
}

impl Burst {
    /// One more line of `kind`: whether it is logged by itself.
    pub(super) fn one(&mut self, kind: &'static str) -> bool {
        let n = match self.counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.counts.push((kind, 1));
                1
            }
        };
        n <= BURST_LOGGED
    }

    /// The input was handled: the lines of each kind not logged by
    /// themselves, if any.
    pub(super) fn end(&mut self) -> Vec<(&'static str, u64)> {
        std::mem::take(&mut self.counts)
            .into_iter()
            .filter(|(_, n)| *n > BURST_LOGGED)
            .map(|(k, n)| (k, n - BURST_LOGGED))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_logs_a_few_of_each_kind_and_sums_the_rest() {
        let mut burst = Burst::default();
        for n in 1..=1_000 {
            assert_eq!(burst.one("session"), n <= BURST_LOGGED);
        }
        assert!(burst.one("written"));
        assert_eq!(burst.end(), vec![("session", 1_000 - BURST_LOGGED)]);
        // Each input is a burst of its own.
        assert!(burst.one("session"));
        assert_eq!(burst.end(), vec![]);
    }

    #[test]
    fn a_crowd_logs_its_first_election_and_its_last() {
        let t0 = Instant::from_since_origin(Duration::from_secs(100));
        let mut crowd = Crowd::default();
        let kind = RequestKind::Read;
        assert!(crowd.met(kind, "transport", true, t0));
        for _ in 1..10_000 {
            assert!(!crowd.met(kind, "transport", true, t0));
        }
        // Repeats of a streak are not joins.
        assert!(!crowd.met(kind, "transport", false, t0));
        // Another class is another trouble.
        assert!(crowd.met(kind, "timeout", true, t0));
        // Writes are apart from reads.
        assert!(crowd.met(RequestKind::Write, "transport", true, t0));
        for _ in 1..10_000 {
            assert!(crowd.left(kind, "transport", t0).is_none());
        }
        let last = crowd.left(kind, "transport", t0).expect("the last logs");
        assert_eq!(last.joined, 10_000);
        // Gone with its last election: the next meeting is logged.
        assert!(crowd.met(kind, "transport", true, t0));
    }

    #[test]
    fn a_crowd_unmet_for_a_while_is_logged_anew() {
        let t0 = Instant::from_since_origin(Duration::from_secs(100));
        let later = t0 + CROWD_QUIET + Duration::from_secs(1);
        let mut crowd = Crowd::default();
        let kind = RequestKind::Write;
        assert!(crowd.met(kind, "timeout", true, t0));
        // One election stays in its streak (it made no write since) ...
        assert!(!crowd.met(kind, "timeout", true, t0));
        assert!(crowd.left(kind, "timeout", t0).is_none());
        // ... and does not silence the same error a while later.
        assert!(crowd.met(kind, "timeout", true, later));
        assert!(!crowd.met(kind, "timeout", true, later));
        // Nor the end of a streak met again since: the last logs it.
        assert!(crowd.left(kind, "timeout", later).is_none());
        assert!(crowd.left(kind, "timeout", later).is_none());
        assert!(crowd.left(kind, "timeout", later).is_some());
    }

    #[test]
    fn a_crowd_whose_stale_member_stays_still_logs_an_end() {
        let t0 = Instant::from_since_origin(Duration::from_secs(100));
        let later = t0 + CROWD_QUIET + Duration::from_secs(1);
        let mut crowd = Crowd::default();
        let kind = RequestKind::Read;
        assert!(crowd.met(kind, "transport", true, t0));
        assert!(!crowd.met(kind, "transport", true, t0));
        // The other never reads again; this one works again a while later.
        let end = crowd.left(kind, "transport", later).expect("quiet: logged");
        assert_eq!(end.now, 1);
    }

    #[test]
    fn lines_alike_are_logged_once_and_counted_until_a_quiet_spell() {
        let t0 = Instant::from_since_origin(Duration::from_secs(100));
        let mut tallies = Tallies::default();
        assert!(tallies.seen("release", "timeout", t0));
        for n in 0..4_999u64 {
            let at = t0 + Duration::from_millis(n);
            assert!(!tallies.seen("release", "timeout", at));
        }
        // Another key, or kind, is logged by itself.
        assert!(tallies.seen("release", "transport", t0));
        assert!(tallies.seen("stream", "timeout", t0));
        let busy = t0 + Duration::from_secs(4);
        assert_eq!(tallies.due(Some(busy)), vec![]);
        let quiet = t0 + Duration::from_millis(4_999) + TALLY_QUIET + Duration::from_millis(1);
        assert_eq!(
            tallies.due(Some(quiet)),
            vec![("release", "timeout".to_owned(), 4_999)]
        );
        // After its count, the next is logged by itself again.
        assert!(tallies.seen("release", "timeout", quiet));
        assert!(!tallies.seen("release", "timeout", quiet));
        assert_eq!(
            tallies.due(None),
            vec![("release", "timeout".to_owned(), 1)]
        );
        assert_eq!(tallies.due(None), vec![]);
    }
}
