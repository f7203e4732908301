//! The count of ended tenures a session's record carries, as one
//! election following through that session judges it: whether a tenure
//! of the session's owner may have ended since the election was last
//! read (its release left out of the owner's stream), so that it must be
//! read again.
//!
//! The record also names its latest ends by number ([`ENDED_LABEL`]):
//! when they reach back to the count the election's last read was judged
//! against, only an election named there is read again; a list that does
//! not reach back that far (or none: an older daemon) has every election
//! read again.

use crate::core::record::{Lease, Record};
use crate::core::session::ENDED_LABEL;

/// One election's view of the count: the count the last session answer
/// showed, and the one answered before the election's last read was sent
/// (its basis), both of the session `key` (one copy of the key: thousands
/// of elections judge the answers of one session).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CountBasis {
    key: String,
    seen: Option<u64>,
    /// `None` also when the basis was of another session than `key`: the
    /// count is then judged moved, as it is against no basis.
    basis: Option<u64>,
}

impl CountBasis {
    /// The election's record is read now (a campaign round's read): the
    /// count seen so far is what that read is judged against.
    pub fn read_sent(&mut self) {
        self.basis = self.seen;
    }

    /// A read of the session `key` answered `record`: whether a tenure of
    /// `election` (the election judging) may have ended since before its
    /// last read (the count moved and the record does not name every end
    /// since, or names one of `election`), so that it is to be read again.
    /// `prior`: a count of `key` the daemon was answered before the
    /// election's last read was sent, the basis when the election judges
    /// `key` for the first time.
    pub fn answered(
        &mut self,
        key: &str,
        record: &Record,
        election: &str,
        prior: Option<u64>,
    ) -> bool {
        if self.key != key {
            key.clone_into(&mut self.key);
            self.basis = prior;
        }
        let session = match record {
            Record::Valid(s) => Some(s),
            _ => None,
        };
        let moved = match (self.basis, session) {
            (Some(basis), Some(s)) if basis == s.fencing_token => false,
            (Some(basis), Some(s)) if basis < s.fencing_token => {
                ends_since(s, basis).is_none_or(|ends| ends.contains(&election))
            }
            _ => true,
        };
        let count = session.map(|s| s.fencing_token);
        if !moved {
            // Nothing of this election ended up to this count: its last
            // read stands for a read made now, and later ends are judged
            // from here (the list names only the latest).
            self.basis = count;
        }
        self.seen = count;
        moved
    }
}

/// The elections whose tenures ended after number `basis` (below the
/// count), as the session record `s` names them; `None` when it does not
/// name every one.
fn ends_since(s: &Lease, basis: u64) -> Option<Vec<&str>> {
    let label = s.holder_meta.as_ref()?.labels.get(ENDED_LABEL)?;
    let mut ends = Vec::new();
    let (mut first, mut last) = (None, None::<u64>);
    for end in label.split(' ') {
        let (n, election) = end.split_once(':')?;
        let n: u64 = n.parse().ok()?;
        if last.is_some_and(|l| l.checked_add(1) != Some(n)) {
            return None;
        }
        first.get_or_insert(n);
        last = Some(n);
        if n > basis {
            ends.push(election);
        }
    }
    // Every number from basis + 1 to the count is named.
    (first? <= basis + 1 && last? == s.fencing_token).then_some(ends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::record::Lease;

    fn session(count: u64, ends: Option<&str>) -> Record {
        let meta = ends.map(|e| crate::core::record::HolderMeta {
            labels: [(ENDED_LABEL.to_owned(), e.to_owned())].into(),
            ..Default::default()
        });
        Record::Valid(Lease::stamped_with(
            "#session/b/n",
            "b",
            count,
            10_000,
            1,
            meta,
            &crate::core::record::Stamp::new("s", 1),
        ))
    }

    #[test]
    fn a_count_is_judged_against_the_one_seen_before_the_last_read() {
        let mut basis = CountBasis::default();
        // Nothing seen before the first read: moved.
        basis.read_sent();
        assert!(basis.answered("#session/b/n", &session(3, None), "e1", None));
        // Read once 3 was seen; 3 still: not moved.
        basis.read_sent();
        assert!(!basis.answered("#session/b/n", &session(3, None), "e1", None));
        assert!(basis.answered("#session/b/n", &session(4, None), "e1", None));
        // Another session, or none: moved.
        basis.read_sent();
        assert!(basis.answered("#session/b/m", &session(4, None), "e1", None));
        assert!(basis.answered("#session/b/n", &Record::Absent, "e1", None));
    }

    #[test]
    fn only_an_election_named_among_the_ends_since_its_read_is_read_again() {
        let judged = |ends: &str, election: &str| {
            let mut basis = CountBasis::default();
            basis.answered("#session/b/n", &session(3, None), election, None);
            basis.read_sent();
            basis.answered("#session/b/n", &session(5, Some(ends)), election, None)
        };
        // 4 and 5 named, neither e1: e1 stands.
        assert!(!judged("2:e9 3:e8 4:e2 5:e3", "e1"));
        assert!(!judged("4:e2 5:e3", "e1"));
        assert!(judged("4:e2 5:e1", "e1"));
        // Not reaching back to 4, a gap, not ending at the count, garbage:
        // every election is read again.
        assert!(judged("5:e3", "e1"));
        assert!(judged("3:e8 5:e3", "e1"));
        assert!(judged("3:e2 4:e3", "e1"));
        assert!(judged("4:e2 five:e3", "e1"));
        assert!(judged("", "e1"));
    }

    #[test]
    fn an_election_judged_unmoved_is_judged_from_that_count_on() {
        let mut basis = CountBasis::default();
        basis.answered("#session/b/n", &session(3, None), "e1", None);
        basis.read_sent();
        assert!(!basis.answered("#session/b/n", &session(4, Some("4:e2")), "e1", None));
        // The list moved on past 4: judged from 4, not from 3.
        assert!(!basis.answered("#session/b/n", &session(5, Some("5:e3")), "e1", None));
        assert!(basis.answered("#session/b/n", &session(6, Some("6:e1")), "e1", None));
    }

    #[test]
    fn a_count_answered_before_the_read_is_the_basis_for_a_session_new_to_the_election() {
        let key = "#session/b/n";
        // 3 answered before its read: 3 stands, 4 moved, 4 naming only
        // another's end stands.
        assert!(!CountBasis::default().answered(key, &session(3, None), "e1", Some(3)));
        assert!(CountBasis::default().answered(key, &session(4, None), "e1", Some(3)));
        let mut basis = CountBasis::default();
        assert!(!basis.answered(key, &session(4, Some("4:e2")), "e1", Some(3)));
        // Only for a session new to the election.
        basis.read_sent();
        assert!(!basis.answered(key, &session(4, Some("4:e2")), "e1", Some(0)));
        assert!(basis.answered("#session/b/m", &session(4, None), "e1", None));
    }
}
