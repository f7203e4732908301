//! What the election engines report, counted: campaign results,
//! transitions, malformed records, records of an unknown format, and the
//! timing and errors of every store request.

use std::time::Duration;

use super::Metrics;
use crate::election::{Observer, Outcome, Transition};

impl Observer for Metrics {
    fn store_request(
        &self,
        election: &str,
        op: &'static str,
        took: Duration,
        outcome: Outcome<'_>,
    ) {
        self.table.with(election, |s| {
            s.request(op, took.as_secs_f64());
            if let Outcome::Failed(e) = outcome {
                s.error(e.metric_label());
            }
        });
    }

    fn acquire_attempt(&self, election: &str, outcome: Outcome<'_>) {
        self.table.with(election, |s| s.acquire(outcome.label()));
    }

    fn renew(&self, election: &str, outcome: Outcome<'_>) {
        self.table.with(election, |s| s.renew(outcome.label()));
    }

    fn transition(&self, election: &str, t: Transition) {
        let direction = match t {
            Transition::Gained => "gained",
            Transition::Lost => "lost",
        };
        self.table.with(election, |s| s.transition(direction));
    }

    fn malformed_record(&self, election: &str) {
        self.table.with(election, |s| s.malformed());
    }

    fn unknown_format_record(&self, election: &str) {
        self.table.with(election, |s| s.unknown_format());
    }
}
