//! What a daemon publishes for preferred leaders on its session record (or,
//! without sessions, its member record): the digest of the set of elections
//! it campaigns for, and its priority label while it is eligible. A label
//! names the elections whose priority differs by their place in the set's
//! sorted names, so `status` names them only when it knows that set: the
//! one the configuration it was given lists.

use std::collections::BTreeMap;

use crate::balance::{PRIORITY_LABEL, SET_LABEL, set_digest};
use crate::core::priority::Priorities;
use crate::lease::Lease;

/// The set of elections of the configuration `status` was given: its
/// digest, and its names sorted as every member of it sorts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownSet {
    digest: String,
    sorted: Vec<String>,
}

impl KnownSet {
    /// The set of `names` (in any order).
    pub fn new(names: &[String]) -> KnownSet {
        let mut sorted = names.to_vec();
        sorted.sort_unstable();
        KnownSet {
            digest: set_digest(sorted.iter().map(String::as_str)),
            sorted,
        }
    }

    /// The sorted names of the set whose digest is `digest`, when it is
    /// this one.
    fn names_of(&self, digest: Option<&str>) -> Option<&[String]> {
        (digest == Some(self.digest.as_str())).then_some(self.sorted.as_slice())
    }

    /// Whether `digest` is this set's.
    pub fn is(&self, digest: Option<&str>) -> bool {
        self.names_of(digest).is_some()
    }
}

/// A record's priority label, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// None: the daemon is not eligible now, or has no priorities.
    Absent,
    /// A label this build reads.
    Readable(Priorities),
    /// Anything else (garbage, another writer's, a later format): the
    /// problem, in one line.
    Unreadable(String),
}

/// The longest part of an unreadable label that is shown.
const SHOWN_CHARS: usize = 40;

/// What a session or member record publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The `elections` label: the digest of the daemon's set, as stored.
    pub set: Option<String>,
    /// The priority label.
    pub priority: Label,
}

/// A member's per-election priorities, named when its set is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrides {
    /// By election name.
    Named(BTreeMap<String, i64>),
    /// By place in the set's sorted names (the set is not the config's).
    Indexed(BTreeMap<u32, i64>),
}

impl Published {
    /// What `record` (a session's or a member's) publishes.
    pub fn of(record: &Lease) -> Published {
        let labels = record.holder_meta.as_ref().map(|m| &m.labels);
        let set = labels.and_then(|l| l.get(SET_LABEL)).cloned();
        let priority = match labels.and_then(|l| l.get(PRIORITY_LABEL)) {
            None => Label::Absent,
            Some(text) => match Priorities::decode(text) {
                Some(p) => Label::Readable(p),
                None => Label::Unreadable(format!(
                    "priority label {:?} cannot be read",
                    text.chars().take(SHOWN_CHARS).collect::<String>()
                )),
            },
        };
        Published { set, priority }
    }

    /// The priority for `election`, and whether it is exact: without the
    /// set's names an election's own priority cannot be told from the
    /// default, which then stands in for it (`false`). `None` without a
    /// readable label.
    pub fn priority_for(&self, election: &str, known: &KnownSet) -> Option<(i64, bool)> {
        let Label::Readable(p) = &self.priority else {
            return None;
        };
        if p.overrides.is_empty() {
            return Some((p.default, true));
        }
        let index = known
            .names_of(self.set.as_deref())
            .and_then(|sorted| sorted.binary_search_by(|n| n.as_str().cmp(election)).ok())
            .and_then(|i| u32::try_from(i).ok());
        Some(match index {
            Some(i) => (p.of(i), true),
            None => (p.default, false),
        })
    }

    /// The per-election priorities of a readable label, by name when its
    /// set is `known`'s (an index past the set's end is kept as an index).
    pub fn overrides(&self, known: &KnownSet) -> Option<Overrides> {
        let Label::Readable(p) = &self.priority else {
            return None;
        };
        let Some(sorted) = known.names_of(self.set.as_deref()) else {
            return Some(Overrides::Indexed(p.overrides.clone()));
        };
        let named = p
            .overrides
            .iter()
            .map(|(i, v)| match sorted.get(*i as usize) {
                Some(name) => (name.clone(), *v),
                None => (format!("#{i}"), *v),
            })
            .collect();
        Some(Overrides::Named(named))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(labels: &[(&str, &str)]) -> Lease {
        crate::cli::status::tests::publishing("#member/web-1", "web-1", labels)
    }

    #[test]
    fn overrides_are_named_only_for_the_configs_set() {
        let names = ["c", "a", "b"].map(String::from);
        let known = KnownSet::new(&names);
        let digest = set_digest(["a", "b", "c"]);
        let ours = Published::of(&record(&[("elections", &digest), ("priority", "1;2=5")]));
        assert_eq!(ours.priority_for("c", &known), Some((5, true)));
        assert_eq!(ours.priority_for("a", &known), Some((1, true)));
        assert_eq!(
            ours.overrides(&known),
            Some(Overrides::Named(BTreeMap::from([("c".to_owned(), 5)])))
        );
        let other = Published::of(&record(&[("elections", "0123"), ("priority", "1;2=5")]));
        assert_eq!(other.priority_for("c", &known), Some((1, false)));
        assert_eq!(
            other.overrides(&known),
            Some(Overrides::Indexed(BTreeMap::from([(2, 5)])))
        );
        // No overrides: the default is the priority of every election.
        let plain = Published::of(&record(&[("elections", "0123"), ("priority", "-4")]));
        assert_eq!(plain.priority_for("c", &known), Some((-4, true)));
    }

    #[test]
    fn a_garbage_or_missing_label_is_no_priority() {
        let known = KnownSet::new(&["a".to_owned()]);
        let garbage = Published::of(&record(&[("priority", "high;x")]));
        assert_eq!(
            garbage.priority,
            Label::Unreadable("priority label \"high;x\" cannot be read".into())
        );
        assert_eq!(garbage.priority_for("a", &known), None);
        assert_eq!(garbage.overrides(&known), None);
        let none = Published::of(&record(&[]));
        assert_eq!((none.set, none.priority), (None, Label::Absent));
    }
}
