//! `[metrics]`: up to how many elections every one has series of its own,
//! and which keep them above that, checked into a [`MetricsConfig`].

use super::raw::RawConfig;
use super::{ConfigError, MetricsConfig, defaults};
use crate::text::echo;

/// `[metrics]` of `raw`; `names` are the configured elections, which
/// `metrics.elections` must name.
pub(super) fn build_metrics(
    raw: &RawConfig,
    names: &[String],
) -> Result<MetricsConfig, ConfigError> {
    let m = &raw.metrics;
    let elections = m.elections.clone().unwrap_or_default();
    for (i, name) in elections.iter().enumerate() {
        if !names.contains(name) {
            // Not the list of configured elections: it may be thousands long.
            return Err(ConfigError::invalid(
                "metrics.elections",
                format!(
                    "metrics.elections[{i}] = {} is not a configured election",
                    echo(name)
                ),
            ));
        }
    }
    let limit = m
        .election_series_limit
        .unwrap_or(defaults::ELECTION_SERIES_LIMIT);
    Ok(MetricsConfig {
        election_series_limit: usize::try_from(limit).unwrap_or(usize::MAX),
        elections,
    })
}
