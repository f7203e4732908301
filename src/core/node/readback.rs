//! The read-back of the records a daemon holds through its session: when
//! and which.
//!
//! A tenure held through a session never rewrites its record (the session
//! is renewed instead), so a record deleted or rewritten under it (by
//! hand, by another tool, from a restored backup) would go unnoticed for
//! as long as the session lives, while another daemon that finds it
//! missing creates it and leads too. So the node reads back, every R,
//! some of the records it holds through its session, up to
//! [`READ_MANY_LIMIT`] in one request, and hands each election its record
//! as read (`Input::Checked`): the election core judges it (the one
//! judgement: still this tenure's record, by holder, fencing token and an
//! `rvn` it wrote), and a tenure whose record is no longer its own is
//! lost, its job stopped, as when a renew finds someone else's write.
//!
//! - Elections with `strict_new_lease` are read every R, all of them: a
//!   taker that creates a missing record waits L·(1+D) before it leads,
//!   and the holder notices within R and stops its job within G, before
//!   that (R + G < L is checked at start).
//! - The others are read in turn, one batch every 2R: a record deleted
//!   under a live tenure is noticed within 2R·⌈held/100⌉ (2R for up to
//!   100 elections held). Without sessions a renew notices it within R.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ElectionId;
use crate::core::election::ElectionState;
use crate::core::time::Instant;

/// The most records one read-back request reads (a DynamoDB
/// `BatchGetItem` reads at most 100 items).
pub const READ_MANY_LIMIT: usize = 100;

/// One held tenure: its election and fencing token.
pub(super) type Held = (ElectionId, u64);

/// The schedule; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct ReadBack {
    /// R.
    every: Duration,
    /// When the next period starts.
    pub(super) next: Instant,
    /// Counts the periods: the others' batch goes out every second one.
    turn: u64,
    /// Where the next batch of the others starts.
    cursor: usize,
    /// The requests of the period under way, by their number in it.
    pub(super) in_flight: BTreeMap<u32, Vec<Held>>,
}

impl ReadBack {
    /// A schedule every `every`, the first period ending at `start + every`.
    pub(super) fn new(start: Instant, every: Duration) -> ReadBack {
        ReadBack {
            every,
            next: start + every,
            turn: 0,
            cursor: 0,
            in_flight: BTreeMap::new(),
        }
    }

    /// A period starts at `now` (at or after [`Self::next`]): of the held
    /// tenures (`held`: each with whether it is strict), the batches to
    /// read now, at most [`READ_MANY_LIMIT`] each. None while the last
    /// period's requests are still on their way.
    pub(super) fn period(&mut self, now: Instant, held: &[(Held, bool)]) -> Vec<Vec<Held>> {
        self.next = now + self.every;
        self.turn += 1;
        if !self.in_flight.is_empty() {
            return Vec::new();
        }
        let mut batch: Vec<Held> = held.iter().filter(|(_, s)| *s).map(|(h, _)| *h).collect();
        let others: Vec<Held> = held.iter().filter(|(_, s)| !*s).map(|(h, _)| *h).collect();
        if self.turn % 2 == 0 && !others.is_empty() {
            let n = others.len().min(READ_MANY_LIMIT);
            let start = self.cursor % others.len();
            batch.extend(others.iter().cycle().skip(start).take(n));
            self.cursor = start + n;
        }
        batch
            .chunks(READ_MANY_LIMIT)
            .map(<[Held]>::to_vec)
            .collect()
    }
}

/// Which elections hold a tenure through the daemon's session, and with
/// which fencing token, kept as each election steps: a period reads this
/// small table instead of every election's state (at 10,000 elections
/// that scan touched megabytes every R and was a fifth of a leader's CPU
/// at rest).
#[derive(Debug, Clone, Default)]
pub(super) struct Tenures {
    /// The session the entries were judged against.
    key: Option<String>,
    /// By election: the fencing token of its tenure through `key`, and
    /// whether it is strict.
    entries: Vec<(Option<u64>, bool)>,
}

impl Tenures {
    /// Election `id` stepped: judge its `state` again.
    pub(super) fn note(&mut self, id: ElectionId, state: &ElectionState, strict: bool) {
        let index = id.index();
        if self.entries.len() <= index {
            self.entries.resize(index + 1, (None, false));
        }
        let token = self.key.as_deref().and_then(|key| {
            let token = state.tenure.as_ref()?.fencing_token;
            (state.session.as_deref() == Some(key)).then_some(token)
        });
        self.entries[index] = (token, strict);
    }

    /// Judge from now on against the session `key`. Returns whether it is
    /// a new key: then every election must be noted again.
    pub(super) fn rekey(&mut self, key: Option<&str>) -> bool {
        if self.key.as_deref() == key {
            return false;
        }
        self.key = key.map(str::to_owned);
        true
    }

    /// The tenures held through the session, each with whether it is
    /// strict, in the order of the elections.
    pub(super) fn held(&self) -> Vec<(Held, bool)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, (token, strict))| Some(((ElectionId(i as u32), (*token)?), *strict)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: u32, strict: bool) -> (Held, bool) {
        ((ElectionId(n), u64::from(n) + 100), strict)
    }

    #[test]
    fn strict_tenures_every_period_and_the_others_in_turn_every_second() {
        let start = Instant::default();
        let r = Duration::from_secs(5);
        let mut schedule = ReadBack::new(start, r);
        assert_eq!(schedule.next, start + r);
        let mut tenures: Vec<(Held, bool)> = (0..150).map(|n| held(n, false)).collect();
        tenures.push(held(150, true));
        let first = schedule.period(start + r, &tenures);
        assert_eq!(first, vec![vec![(ElectionId(150), 250)]]);
        assert_eq!(schedule.next, start + r * 2);
        let second = schedule.period(start + r * 2, &tenures);
        assert_eq!(second.len(), 2, "101 records: two requests");
        assert_eq!(second[0].len(), READ_MANY_LIMIT);
        assert_eq!(second[0][0], (ElectionId(150), 250));
        assert_eq!(second[0][1], (ElectionId(0), 100));
        assert_eq!(second[1], vec![(ElectionId(99), 199)]);
        // The next batch of the others goes on from there, round the list.
        schedule.period(start + r * 3, &tenures);
        let fourth = schedule.period(start + r * 4, &tenures);
        assert_eq!(fourth[0][1], (ElectionId(100), 200));
        assert_eq!(fourth[1].last(), Some(&(ElectionId(49), 149)));
        // While a request is on its way, a period reads nothing.
        schedule.in_flight.insert(0, Vec::new());
        assert!(schedule.period(start + r * 5, &tenures).is_empty());
    }
}
