//! Which elections have series of their own.
//!
//! Up to a limit (`metrics.election_series_limit`) every election does.
//! Above it only the elections the configuration names and the primary do;
//! the others are counted together under the label [`OTHERS_LABEL`], so a
//! scrape keeps a few hundred lines however many elections a daemon runs
//! (each election's own series are about seventy lines).
//!
//! Decided once, at start, from the configuration: the set of elections
//! does not change while the daemon runs, so an election never moves
//! between its own series and the others', and no counter loses its
//! history.

use std::collections::HashSet;

/// The `election` label under which the elections without series of their
/// own are counted together (no election can be named so: names never
/// hold `#`).
pub const OTHERS_LABEL: &str = "#others";

/// Which elections have series of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OwnSeries {
    /// Every election.
    #[default]
    Every,
    /// Only these; the others are counted under [`OTHERS_LABEL`].
    Only(HashSet<String>),
}

impl OwnSeries {
    /// Every election when there are at most `limit`; else only those
    /// in `kept` (the ones the configuration names, and the primary).
    pub fn decide<'a>(
        elections: usize,
        limit: usize,
        kept: impl IntoIterator<Item = &'a str>,
    ) -> OwnSeries {
        if elections <= limit {
            return OwnSeries::Every;
        }
        OwnSeries::Only(kept.into_iter().map(str::to_owned).collect())
    }

    /// The label `election` is counted under: its own name, or
    /// [`OTHERS_LABEL`]. Labels that name no election (`#session`,
    /// `#member`) are kept as they are.
    pub fn label<'a>(&self, election: &'a str) -> &'a str {
        match self {
            OwnSeries::Only(kept) if !election.starts_with('#') && !kept.contains(election) => {
                OTHERS_LABEL
            }
            _ => election,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_election_keeps_its_series_up_to_the_limit_and_only_the_kept_ones_above() {
        let kept = ["report", "web"];
        assert_eq!(OwnSeries::decide(100, 100, kept), OwnSeries::Every);
        assert_eq!(OwnSeries::decide(0, 0, kept), OwnSeries::Every);
        let every = OwnSeries::decide(3, 100, kept);
        assert_eq!(every.label("other"), "other");

        let only = OwnSeries::decide(101, 100, kept);
        assert_eq!(only.label("report"), "report");
        assert_eq!(only.label("web"), "web");
        assert_eq!(only.label("other"), OTHERS_LABEL);
        // Not elections: never folded in.
        assert_eq!(only.label("#session"), "#session");
        assert_eq!(only.label("#member"), "#member");
        // A limit of 0 keeps only the named ones whenever there is any
        // election.
        assert_eq!(OwnSeries::decide(1, 0, []).label("a"), OTHERS_LABEL);
    }
}
