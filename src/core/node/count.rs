//! The count of ended tenures a session's record carries, as one
//! election following through that session judges it: whether a tenure
//! of the session's owner may have ended since the election was last
//! read (its release left out of the owner's stream), so that it must be
//! read again.

use crate::core::record::Record;

/// One election's view of the count: the session key and count the last
/// session answer showed, and those answered before the election's last
/// read was sent (its basis).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CountBasis {
    seen: Option<(String, u64)>,
    basis: Option<(String, u64)>,
}

impl CountBasis {
    /// The election's record is read now (a campaign round's read): the
    /// count seen so far is what that read is judged against.
    pub fn read_sent(&mut self) {
        self.basis.clone_from(&self.seen);
    }

    /// A read of the session `key` answered `record`: whether the count
    /// moved since before the election's last read (or is not known to
    /// have stayed), so that the election is to be read again.
    pub fn answered(&mut self, key: &str, record: &Record) -> bool {
        let seen = match record {
            Record::Valid(s) => Some((key.to_owned(), s.fencing_token)),
            _ => None,
        };
        let moved = seen.is_none() || seen != self.basis;
        self.seen = seen;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::record::Lease;

    fn session(count: u64) -> Record {
        Record::Valid(Lease::stamped_with(
            "#session/b/n",
            "b",
            count,
            10_000,
            1,
            None,
            &crate::core::record::Stamp {
                rvn: "s".into(),
                unix_ms: 1,
            },
        ))
    }

    #[test]
    fn a_count_is_judged_against_the_one_seen_before_the_last_read() {
        let mut basis = CountBasis::default();
        // Nothing seen before the first read: moved.
        basis.read_sent();
        assert!(basis.answered("#session/b/n", &session(3)));
        // Read once 3 was seen; 3 still: not moved.
        basis.read_sent();
        assert!(!basis.answered("#session/b/n", &session(3)));
        assert!(basis.answered("#session/b/n", &session(4)));
        // Another session, or none: moved.
        basis.read_sent();
        assert!(basis.answered("#session/b/m", &session(4)));
        assert!(basis.answered("#session/b/n", &Record::Absent));
    }
}
