//! Preferred leaders: which live follower, if any, a leader hands an
//! election to because it prefers it (the preemption rule), and the
//! priority label daemons publish on their member record or session.
//!
//! Priorities are advice read from other daemons' records: a forged or
//! stale one can at worst make a leader hand an election over once per
//! `preempt_after` (an ordinary planned handover, which the store decides),
//! never two leaders or none. So the rule only has to be bounded, not
//! trusting: ties never move, one move per election per `preempt_after`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::time::Instant;

/// The most per-election overrides a daemon may configure: the label that
/// carries them stays small (a few KiB at most on every session renew).
pub const MAX_OVERRIDES: usize = 100;

/// The largest priority, in either direction: far beyond any sane ranking,
/// small enough that comparing and printing are trivial.
pub const MAX_PRIORITY: i64 = 1_000_000;

/// A daemon's priorities: one for every election, and the elections that
/// differ. Elections are named by their place in the sorted list of the
/// set's names, which every member of one set shares (members of different
/// sets never compare priorities), so any name can be carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Priorities {
    /// The daemon's priority.
    pub default: i64,
    /// Election index (in the sorted names) -> its priority, where it
    /// differs from `default`.
    pub overrides: BTreeMap<u32, i64>,
}

impl Priorities {
    /// The priority for the election at `index` of the sorted names.
    pub fn of(&self, index: u32) -> i64 {
        self.overrides.get(&index).copied().unwrap_or(self.default)
    }

    /// The label's text: `DEFAULT`, or `DEFAULT;INDEX=P,INDEX=P`.
    pub fn encode(&self) -> String {
        let mut text = self.default.to_string();
        for (i, (index, p)) in self.overrides.iter().enumerate() {
            text.push(if i == 0 { ';' } else { ',' });
            text.push_str(&format!("{index}={p}"));
        }
        text
    }

    /// Read a label written by [`Priorities::encode`]. Anything else (out
    /// of range, too many overrides, garbage) is `None`: that member has no
    /// known priority, as if it published none.
    pub fn decode(text: &str) -> Option<Priorities> {
        let (default, rest) = match text.split_once(';') {
            Some((d, rest)) => (d, Some(rest)),
            None => (text, None),
        };
        let default = parse_priority(default)?;
        let mut overrides = BTreeMap::new();
        for pair in rest.into_iter().flat_map(|r| r.split(',')) {
            let (index, p) = pair.split_once('=')?;
            let index: u32 = index.parse().ok()?;
            if overrides.insert(index, parse_priority(p)?).is_some()
                || overrides.len() > MAX_OVERRIDES
            {
                return None;
            }
        }
        Some(Priorities { default, overrides })
    }
}

fn parse_priority(text: &str) -> Option<i64> {
    let p: i64 = text.parse().ok()?;
    (-MAX_PRIORITY..=MAX_PRIORITY).contains(&p).then_some(p)
}

/// A live follower as the leader sees it, for one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contender<'a> {
    /// Its identity (the successor named in the handover).
    pub identity: &'a str,
    /// Its priority for the election.
    pub priority: i64,
    /// Since when, on the leader's clock, it has been seen live and
    /// eligible without a break.
    pub eligible_since: Instant,
}

/// Whom the leader of an election hands it to, if anyone: among the
/// contenders of a higher priority than `mine` that have been eligible for
/// `preempt_after` without a break, the highest, then the lowest identity.
/// Equal priorities never preempt; and no election is preempted again
/// within `preempt_after` of its last preemption (`last`), so a contender
/// whose eligibility flaps moves it at most once per `preempt_after`.
pub fn successor<'a>(
    mine: i64,
    contenders: &[Contender<'a>],
    now: Instant,
    preempt_after: Duration,
    last: Option<Instant>,
) -> Option<&'a str> {
    if last.is_some_and(|at| now.saturating_since(at) < preempt_after) {
        return None;
    }
    contenders
        .iter()
        .filter(|c| c.priority > mine && now.saturating_since(c.eligible_since) >= preempt_after)
        // Highest priority first, then the lowest identity.
        .min_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.identity.cmp(b.identity))
        })
        .map(|c| c.identity)
}

/// When [`successor`] may next answer differently for lack of time alone:
/// the earliest instant a higher contender completes `preempt_after`, or
/// the end of the pause after the last preemption. `None`: only news can.
pub fn next_due(
    mine: i64,
    contenders: &[Contender<'_>],
    now: Instant,
    preempt_after: Duration,
    last: Option<Instant>,
) -> Option<Instant> {
    let earliest = contenders
        .iter()
        .filter(|c| c.priority > mine)
        .map(|c| c.eligible_since + preempt_after)
        .min()?;
    let pause_end = last.map(|at| at + preempt_after);
    Some(earliest.max(pause_end.unwrap_or(earliest)).max(now))
}

/// How long a daemon waits, beyond the takeover rule's wait, before it
/// takes anything held by a member `diff` steps of priority above it that
/// went quiet: half a retry interval per step, at most four steps. So
/// after a crash the next priority down tries first. A delay only: what
/// may be taken is still decided by the takeover rule and the store.
pub fn hold_back(diff: i64, retry_interval: Duration) -> Duration {
    let steps = u32::try_from(diff.clamp(0, 4)).unwrap_or(0);
    (retry_interval / 2) * steps
}

/// A member of a higher priority, as last heard of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Above {
    /// When it stops counting as live unless heard of again (its last
    /// news plus the takeover rule's wait).
    pub gone_at: Instant,
    /// How many steps of priority above us it is (at most, over the
    /// elections).
    pub diff: i64,
}

/// Whether to hold back from taking anything now, and when that may next
/// change without news. A member above us that has been quiet for three
/// quarters of the takeover wait `wait` (a live one tells of itself every
/// renew interval) is about to be taken over from: from then until its
/// `gone_at` plus [`hold_back`], we take nothing.
pub fn holding(
    now: Instant,
    above: &[Above],
    wait: Duration,
    retry_interval: Duration,
) -> (bool, Option<Instant>) {
    let mut hold = false;
    let mut next: Option<Instant> = None;
    let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
    for a in above.iter().filter(|a| a.diff > 0) {
        let from = a.gone_at.saturating_sub(wait / 4);
        let until = a.gone_at + hold_back(a.diff, retry_interval);
        if now < from {
            at(from);
        } else if now < until {
            hold = true;
            at(until);
        }
    }
    (hold, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const AFTER: Duration = Duration::from_secs(10);

    fn at(secs: u64) -> Instant {
        Instant::from_since_origin(S * u32::try_from(secs).unwrap())
    }

    fn c(identity: &str, priority: i64, since: u64) -> Contender<'_> {
        Contender {
            identity,
            priority,
            eligible_since: at(since),
        }
    }

    #[test]
    fn a_higher_contender_eligible_long_enough_is_the_successor() {
        let cs = [c("b", 2, 0)];
        assert_eq!(successor(1, &cs, at(9), AFTER, None), None, "too soon");
        assert_eq!(successor(1, &cs, at(10), AFTER, None), Some("b"));
        assert_eq!(next_due(1, &cs, at(3), AFTER, None), Some(at(10)));
    }

    #[test]
    fn equal_and_lower_priorities_never_preempt() {
        let cs = [c("a", 5, 0), c("b", 4, 0), c("c", -1, 0)];
        assert_eq!(successor(5, &cs, at(1000), AFTER, None), None);
        assert_eq!(next_due(5, &cs, at(1000), AFTER, None), None);
    }

    #[test]
    fn the_highest_wins_then_the_lowest_identity() {
        let cs = [c("d", 3, 0), c("c", 7, 0), c("b", 7, 0), c("a", 6, 0)];
        assert_eq!(successor(0, &cs, at(10), AFTER, None), Some("b"));
        // The highest not yet eligible long enough: the best of the others
        // goes now (a flapping favourite cannot hold the rest back).
        let cs = [c("a", 9, 5), c("b", 3, 0)];
        assert_eq!(successor(0, &cs, at(10), AFTER, None), Some("b"));
        assert_eq!(successor(0, &cs, at(15), AFTER, None), Some("a"));
    }

    #[test]
    fn one_preemption_per_election_per_preempt_after() {
        let cs = [c("b", 2, 0)];
        assert_eq!(successor(1, &cs, at(20), AFTER, Some(at(11))), None);
        assert_eq!(successor(1, &cs, at(21), AFTER, Some(at(11))), Some("b"));
        assert_eq!(next_due(1, &cs, at(20), AFTER, Some(at(11))), Some(at(21)));
    }

    #[test]
    fn a_lower_priority_holds_back_longer_after_a_member_above_went_quiet() {
        let retry = S;
        assert_eq!(hold_back(0, retry), Duration::ZERO);
        assert_eq!(hold_back(-3, retry), Duration::ZERO);
        assert_eq!(hold_back(1, retry), S / 2);
        assert_eq!(hold_back(2, retry), S);
        assert_eq!(hold_back(1_000_000, retry), S * 2, "bounded");
        // Last heard of at 0, gone at 8 (wait 8): quiet from 6 on.
        let above = [Above {
            gone_at: at(8),
            diff: 2,
        }];
        let wait = S * 8;
        assert_eq!(holding(at(5), &above, wait, retry), (false, Some(at(6))));
        assert_eq!(holding(at(6), &above, wait, retry), (true, Some(at(9))));
        assert_eq!(holding(at(9), &above, wait, retry), (false, None));
        // One step above: half as long.
        let one = [Above {
            gone_at: at(8),
            diff: 1,
        }];
        assert_eq!(
            holding(at(8), &one, wait, retry),
            (true, Some(at(8) + S / 2))
        );
        // Equal priorities never hold anyone back.
        let equal = [Above {
            gone_at: at(8),
            diff: 0,
        }];
        assert_eq!(holding(at(7), &equal, wait, retry), (false, None));
    }

    #[test]
    fn labels_round_trip_and_garbage_is_no_priority() {
        let p = Priorities {
            default: 2,
            overrides: BTreeMap::from([(0, -3), (17, 1_000_000)]),
        };
        assert_eq!(p.encode(), "2;0=-3,17=1000000");
        assert_eq!(Priorities::decode(&p.encode()), Some(p.clone()));
        assert_eq!((p.of(0), p.of(1), p.of(17)), (-3, 2, 1_000_000));
        assert_eq!(Priorities::decode("-7").map(|p| p.of(3)), Some(-7));
        for bad in [
            "",
            "x",
            "1;",
            "1;a=2",
            "1;2",
            "1;2=3,2=4",
            "1000001",
            "1;0=-1000001",
            "99999999999999999999",
        ] {
            assert_eq!(Priorities::decode(bad), None, "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_OVERRIDES).map(|i| format!("{i}=1")).collect();
        assert_eq!(Priorities::decode(&format!("0;{}", many.join(","))), None);
    }
}
