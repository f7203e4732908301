//! What a daemon knows of other daemons' sessions, shared by all its
//! elections: the answers of its reads of their records, and what the
//! owners' streams told of them, each dated as the takeover rule dates
//! everything (an `rvn` from the first instant this daemon learned it).
//!
//! Every election held through one session times that session, and their
//! rounds come together (they time the same `rvn` from the same instant,
//! so they wake at the same instants): one read answers every election
//! that asked for the same session while it was on its way, or that will
//! take an answer from a read sent at or after an instant it names
//! ([`Known::will_do`]), instead of one read per election.
//!
//! The owner's stream tells of each write of its session: that dates the
//! `rvn` it names (an `rvn` is random, so it cannot be named before it
//! was written), and it tells whether the stream flows. An election asking
//! once the session is due waits for the next write to be told (a moment
//! at most: the node parks it), so that its read finds an `rvn` timed from
//! its event: about one read a lease per session, whatever the number of
//! elections.
//!
//! Sharing an answer is safe: the rule times a session's `rvn` from the
//! earliest instant this daemon knew it, never earlier, and the end of a
//! session is a write conditional on the `rvn` it timed; an answer that
//! is a moment old can only make a follower wait longer, or end nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::ElectionId;
use crate::core::record::Record;
use crate::core::session::{ENDED_LABEL, Flow, SessionAnswer};
use crate::core::store_error::StoreError;
use crate::core::takeover::takeover_wait;
use crate::core::time::Instant;

/// How many `rvn`s of one session are remembered with when they were
/// first learned.
const REMEMBERED: usize = 8;

/// A session nobody asked about or told of for this long is forgotten
/// (its owner restarted under a new key, or it was ended).
pub(super) const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What is known of one session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Known {
    /// When the read on its way was sent, if one is.
    pub(super) in_flight: Option<Instant>,
    /// The elections waiting for that read's answer.
    pub(super) waiting: Vec<ElectionId>,
    /// The elections waiting for the next write the stream tells (see
    /// the module docs).
    pub(super) parked: BTreeSet<ElectionId>,
    /// The last store answer: when its read was sent, and the record.
    pub(super) last: Option<(Instant, Arc<Record>)>,
    /// `rvn`s with the instant this daemon first learned each.
    learned: VecDeque<(String, Instant)>,
    /// The owner's stream: the first event on its connection, and when it
    /// counts as quiet.
    pub(super) flow: Option<Flow>,
    /// The latest write its owner's stream told: its `rvn` and arrival.
    pub(super) told: Option<(String, Instant)>,
    /// The labels its owner's stream told last, if it did.
    pub(super) labels: Option<BTreeMap<String, String>>,
    /// When the labels it shows (see [`KnownSession::labels_at`]) were
    /// first learned with their present values.
    labels_at: Option<Instant>,
    /// When anyone last asked about it or told of it.
    pub(super) touched: Instant,
    /// The counts of ended tenures the last two reads found, each with
    /// when it was answered, the older first: a count answered before an
    /// election's read was sent is a basis for judging that read (see
    /// [`Known::count_before`]).
    counts: [Option<(Instant, u64)>; 2],
}

/// A session as the node lists it (balance counts members so).
#[derive(Debug, Clone, PartialEq)]
pub struct KnownSession {
    /// Its key.
    pub key: String,
    /// Its record as last read, if it was.
    pub record: Option<Record>,
    /// The latest `rvn` learned, and when.
    pub latest: Option<(String, Instant)>,
    /// The labels its owner's stream told last, if it did.
    pub told_labels: Option<BTreeMap<String, String>>,
    /// When the labels it shows (the stream's, else the last read's; the
    /// list of ended tenures aside) were first learned with their present
    /// values: balance dates a member's eligibility from it, on this
    /// daemon's clock.
    pub labels_at: Option<Instant>,
}

impl Known {
    pub(super) fn new(now: Instant) -> Known {
        Known {
            in_flight: None,
            waiting: Vec::new(),
            parked: BTreeSet::new(),
            last: None,
            learned: VecDeque::new(),
            flow: None,
            told: None,
            labels: None,
            labels_at: None,
            touched: now,
            counts: [None, None],
        }
    }

    /// Whether nothing of this daemon waits on it now.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.is_none() && self.waiting.is_empty() && self.parked.is_empty()
    }

    /// `rvn` was learned at `at` (kept if it was learned before).
    pub(super) fn learn(&mut self, rvn: &str, at: Instant) {
        if self.learned.iter().any(|(r, _)| r == rvn) {
            return;
        }
        if self.learned.len() == REMEMBERED {
            self.learned.pop_front();
        }
        self.learned.push_back((rvn.to_owned(), at));
    }

    /// A read sent at `sent` found `record` at `now`: its `rvn` is learned,
    /// and it is the last answer unless a read sent later answered first.
    pub(super) fn read(&mut self, sent: Instant, record: &Arc<Record>, now: Instant) {
        if let Record::Valid(s) = &**record {
            self.learn(&s.rvn, now);
            self.counts = [self.counts[1], Some((now, s.fencing_token))];
        }
        if self.last.as_ref().is_none_or(|(s, _)| *s <= sent) {
            let before = self.shown_labels();
            self.last = Some((sent, record.clone()));
            self.date_labels(before, now);
        }
    }

    /// The latest count of ended tenures a read found that was answered
    /// before `sent` (an election's read of its record): any end of a
    /// tenure held through the session after that read counts above it,
    /// so it is as good a basis for that election's read as a count the
    /// election itself was answered before it read (the count only
    /// rises).
    pub(super) fn count_before(&self, sent: Instant) -> Option<u64> {
        self.counts
            .iter()
            .rev()
            .flatten()
            .find(|(answered, _)| *answered < sent)
            .map(|(_, count)| *count)
    }

    /// The labels it shows: the stream's, else the last read's.
    fn shown(&self) -> Option<&BTreeMap<String, String>> {
        match (&self.labels, self.last.as_ref().map(|(_, r)| &**r)) {
            (Some(told), _) => Some(told),
            (None, Some(Record::Valid(s))) => Some(&s.holder_meta.as_ref()?.labels),
            (None, _) => None,
        }
    }

    /// The label `name` it shows.
    pub(super) fn label(&self, name: &str) -> Option<&str> {
        self.shown()?.get(name).map(String::as_str)
    }

    /// The labels it shows, without the list of ended tenures (it moves
    /// as tenures end).
    fn shown_labels(&self) -> Option<BTreeMap<String, String>> {
        let mut labels = self.shown()?.clone();
        labels.remove(ENDED_LABEL);
        Some(labels)
    }

    /// The labels shown were `before` until `at`: dated anew if changed.
    fn date_labels(&mut self, before: Option<BTreeMap<String, String>>, at: Instant) {
        if self.shown_labels() != before {
            self.labels_at = Some(at);
        }
    }

    /// The owner's stream told, at `at`, of a write with `rvn`; `since`:
    /// its first event on the same connection; `quiet`: how long a stream
    /// that tells nothing flows on.
    pub(super) fn told(
        &mut self,
        rvn: &str,
        labels: BTreeMap<String, String>,
        at: Instant,
        since: Instant,
        quiet: Duration,
    ) {
        self.touched = self.touched.max(at);
        self.learn(rvn, at);
        let before = self.shown_labels();
        self.labels = Some(labels);
        self.date_labels(before, at);
        self.flow = Some(Flow {
            since,
            until: at + quiet,
        });
        self.told = Some((rvn.to_owned(), at));
    }

    /// Whether the owner's stream flows at `now`.
    pub(super) fn flows(&self, now: Instant) -> bool {
        self.flow.is_some_and(|f| now < f.until)
    }

    /// This session as the node lists it.
    pub(super) fn listed(&self, key: &str) -> KnownSession {
        KnownSession {
            key: key.to_owned(),
            record: self.last.as_ref().map(|(_, r)| Record::clone(r)),
            latest: self.learned.back().cloned(),
            told_labels: self.labels.clone(),
            labels_at: self.labels_at,
        }
    }

    /// The last answer, if it will do for an election due at `due`: its
    /// read was sent since, or it shows an `rvn` not due yet (the
    /// election then waits for that one: the elections of a session come
    /// to time the same `rvn`, and to read together). `drift`: D.
    ///
    /// It will also do, once, when the stream told of a later write since
    /// its read was sent, and that write is not due yet, and the read is
    /// less than one and a half waits old: the election then waits for
    /// that write (see [`SessionAnswer::told`]), and reads when it is due,
    /// the last read being about two waits old by then. So a session whose
    /// stream flows is read about once every two leases.
    pub(super) fn will_do(
        &self,
        due: Instant,
        now: Instant,
        drift: f64,
        #[allow(unused)] past_its_date: bool,
    ) -> Option<(Instant, Arc<Record>)> {
        let (sent, record) = self.last.as_ref()?;
        // The deliberate defect: any answer will do, however old.
        #[cfg(test)]
        if past_its_date {
            return Some((*sent, record.clone()));
        }
        if *sent >= due {
            return Some((*sent, record.clone()));
        }
        let Record::Valid(s) = &**record else {
            return None;
        };
        let wait = takeover_wait(s.lease_ms, drift);
        let learned = self.learned.iter().find(|(r, _)| *r == s.rvn);
        if learned.is_some_and(|(_, at)| now < *at + wait) {
            return Some((*sent, record.clone()));
        }
        let told_later = self.told.as_ref().is_some_and(|(rvn, at)| {
            // The read is about one wait old at the first due after it,
            // about two at the next: served at the first only.
            *rvn != s.rvn && *at > *sent && now < *at + wait && now < *sent + wait * 3 / 2
        });
        told_later.then(|| (*sent, record.clone()))
    }

    /// What an election is told of `record`, read by a request sent at
    /// `sent`, at `now` (whether the count moved is the election's to
    /// judge: left `true` here).
    pub(super) fn answer(
        &self,
        record: Result<Arc<Record>, StoreError>,
        sent: Instant,
        now: Instant,
    ) -> SessionAnswer {
        let (learned, told) = match record.as_deref() {
            Ok(Record::Valid(s)) => (
                self.learned
                    .iter()
                    .find(|(r, _)| *r == s.rvn)
                    .map(|(_, at)| *at),
                self.told
                    .clone()
                    .filter(|(rvn, at)| *rvn != s.rvn && *at > sent),
            ),
            _ => (None, None),
        };
        SessionAnswer {
            record,
            learned,
            flow: self.flow.filter(|f| now < f.until),
            told,
            moved: true,
            yields: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::node::tests::{t, their_session};

    #[test]
    fn a_count_is_a_basis_for_reads_sent_after_it_was_answered() {
        let mut known = Known::new(t(0));
        assert_eq!(known.count_before(t(100)), None);
        known.read(t(10), &Arc::new(their_session("s1", 3)), t(20));
        known.read(t(30), &Arc::new(their_session("s2", 4)), t(40));
        // Sent at 20 ms or before: no count answered before it.
        assert_eq!(known.count_before(t(20)), None);
        assert_eq!(known.count_before(t(21)), Some(3));
        assert_eq!(known.count_before(t(41)), Some(4));
        // A third answer: the first is forgotten.
        known.read(t(50), &Arc::new(their_session("s3", 5)), t(60));
        assert_eq!(known.count_before(t(30)), None);
        assert_eq!(known.count_before(t(45)), Some(4));
        // A record without a count (missing) changes nothing.
        known.read(t(70), &Arc::new(Record::Absent), t(80));
        assert_eq!(known.count_before(t(90)), Some(5));
    }
}
