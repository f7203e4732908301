//! Preferred leaders: `priority` (per daemon and per election), `preempt`
//! and `preempt_after`, checked into a [`PriorityConfig`].

use std::collections::BTreeMap;
use std::time::Duration;

use super::build::check_range;
use super::raw::RawConfig;
use super::{ConfigError, limits};
use crate::core::priority::{MAX_OVERRIDES, MAX_PRIORITY, Priorities};

/// `preempt_after` when unset.
pub const DEFAULT_PREEMPT_AFTER: Duration = Duration::from_secs(10);

/// The shortest `preempt_after`: shorter would hand an election over on a
/// glimpse of a follower.
pub const MIN_PREEMPT_AFTER: Duration = Duration::from_millis(100);

/// `priority`, `preempt`, `preempt_after` and the elections' own
/// `priority` (docs/leadership.md, "Preferred leaders").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityConfig {
    /// `priority` (`--priority`): this daemon's priority in every election
    /// (default 0).
    pub default: i64,
    /// `elections[].priority` where it differs from `default`: at most
    /// [`MAX_OVERRIDES`].
    pub overrides: BTreeMap<String, i64>,
    /// `preempt` (default true; `--no-preempt`): a leader hands an election
    /// to a live eligible member of a higher priority for it.
    pub preempt: bool,
    /// `preempt_after` (`--preempt-after`): how long such a member must
    /// have been eligible without a break first.
    pub preempt_after: Duration,
    /// Whether any of these was configured: the daemon then publishes its
    /// priorities and learns the others' (even without balance).
    pub in_use: bool,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig {
            default: 0,
            overrides: BTreeMap::new(),
            preempt: true,
            preempt_after: DEFAULT_PREEMPT_AFTER,
            in_use: false,
        }
    }
}

impl PriorityConfig {
    /// The priority for `election`.
    pub fn of(&self, election: &str) -> i64 {
        self.overrides
            .get(election)
            .copied()
            .unwrap_or(self.default)
    }

    /// The priorities as published, elections named by their place in
    /// `sorted` (the sorted names of every election campaigned for).
    pub fn published(&self, sorted: &[String]) -> Priorities {
        let overrides = self
            .overrides
            .iter()
            .filter_map(|(name, p)| {
                let index = sorted.binary_search(name).ok()?;
                Some((u32::try_from(index).ok()?, *p))
            })
            .collect();
        Priorities {
            default: self.default,
            overrides,
        }
    }
}

/// A priority, within ±[`MAX_PRIORITY`].
fn check_priority(raw: &RawConfig, key: &str, value: i64) -> Result<i64, ConfigError> {
    if (-MAX_PRIORITY..=MAX_PRIORITY).contains(&value) {
        return Ok(value);
    }
    Err(ConfigError::invalid(
        key,
        format!(
            "{} is out of range (a priority lies within -{MAX_PRIORITY}..={MAX_PRIORITY}; higher leads)",
            raw.show(key, &value.to_string())
        ),
    ))
}

/// The preferred-leader settings of `raw`, whose elections are final
/// (after `--election`).
pub(super) fn build_priority(raw: &RawConfig) -> Result<PriorityConfig, ConfigError> {
    let default = match raw.priority {
        Some(p) => check_priority(raw, "priority", p)?,
        None => 0,
    };
    let mut overrides = BTreeMap::new();
    for (i, e) in raw.elections.iter().enumerate() {
        let Some(p) = e.priority else { continue };
        let p = check_priority(raw, &format!("elections[{i}].priority"), p)?;
        if p != default {
            overrides.insert(e.name.clone(), p);
        }
    }
    if overrides.len() > MAX_OVERRIDES {
        return Err(ConfigError::invalid(
            "elections.priority",
            format!(
                "{} elections have a priority of their own that differs from priority = {default} ({}); at most {MAX_OVERRIDES} may (each member carries them on every renewal): give the daemon the priority most of them share",
                overrides.len(),
                raw.origin("elections")
            ),
        ));
    }
    let preempt_after = raw.preempt_after.map_or(DEFAULT_PREEMPT_AFTER, |d| d.0);
    check_range(
        "preempt_after",
        &raw.origin("preempt_after"),
        preempt_after,
        MIN_PREEMPT_AFTER,
        limits::MAX_LEASE,
    )?;
    let in_use = raw.priority.is_some()
        || raw.elections.iter().any(|e| e.priority.is_some())
        || raw.preempt.is_some()
        || raw.preempt_after.is_some();
    Ok(PriorityConfig {
        default,
        overrides,
        preempt: raw.preempt.unwrap_or(true),
        preempt_after,
        in_use,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::{DurationValue, RawElection};

    fn raw(priority: Option<i64>, elections: &[(&str, Option<i64>)]) -> RawConfig {
        RawConfig {
            priority,
            elections: elections
                .iter()
                .map(|(name, p)| RawElection {
                    name: (*name).to_owned(),
                    priority: *p,
                    ..RawElection::default()
                })
                .collect(),
            ..RawConfig::default()
        }
    }

    fn message(e: ConfigError) -> String {
        e.to_string()
    }

    #[test]
    fn unset_means_priority_zero_preempting_after_ten_seconds_not_in_use() {
        let c = build_priority(&raw(None, &[("a", None)])).unwrap();
        assert_eq!(c, PriorityConfig::default());
        assert!(!c.in_use);
    }

    #[test]
    fn overrides_are_kept_where_they_differ_and_published_by_index() {
        let c = build_priority(&raw(
            Some(2),
            &[("b", Some(2)), ("a", Some(-1)), ("c", None)],
        ))
        .unwrap();
        assert!(c.in_use);
        assert_eq!(c.overrides, BTreeMap::from([("a".to_owned(), -1)]));
        assert_eq!((c.of("a"), c.of("b"), c.of("c")), (-1, 2, 2));
        let sorted = ["a", "b", "c"].map(String::from);
        assert_eq!(c.published(&sorted).encode(), "2;0=-1");
        // An election's own priority alone puts priorities in use.
        assert!(
            build_priority(&raw(None, &[("a", Some(0))]))
                .unwrap()
                .in_use
        );
    }

    #[test]
    fn huge_priorities_are_rejected_naming_the_key() {
        let e = message(build_priority(&raw(Some(1_000_001), &[])).unwrap_err());
        assert!(
            e.contains("priority = 1000001 (default)") && e.contains("out of range"),
            "{e}"
        );
        let e =
            message(build_priority(&raw(None, &[("a", None), ("b", Some(i64::MIN))])).unwrap_err());
        assert!(
            e.contains("elections[1].priority = -9223372036854775808"),
            "{e}"
        );
    }

    #[test]
    fn too_many_overrides_are_rejected_with_the_bound() {
        let names: Vec<String> = (0..=MAX_OVERRIDES).map(|i| format!("e{i}")).collect();
        let elections: Vec<(&str, Option<i64>)> =
            names.iter().map(|n| (n.as_str(), Some(1))).collect();
        let e = message(build_priority(&raw(None, &elections)).unwrap_err());
        assert!(
            e.contains("101 elections") && e.contains("at most 100"),
            "{e}"
        );
        // The same priority everywhere is no override at all.
        assert!(build_priority(&raw(Some(1), &elections)).is_ok());
    }

    #[test]
    fn preempt_after_of_zero_or_absurd_length_is_rejected() {
        for (d, says) in [
            (Duration::ZERO, "must be above zero"),
            (Duration::from_millis(50), "shorter than the minimum"),
            (Duration::from_secs(86_400), "longer than the limit"),
        ] {
            let mut r = raw(None, &[]);
            r.preempt_after = Some(DurationValue(d));
            let e = message(build_priority(&r).unwrap_err());
            assert!(e.contains("preempt_after =") && e.contains(says), "{e}");
        }
        let mut r = raw(None, &[]);
        r.preempt = Some(false);
        let c = build_priority(&r).unwrap();
        assert!(c.in_use && !c.preempt);
    }
}
