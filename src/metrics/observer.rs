//! What the election engines report, counted: campaign results,
//! transitions, lost leases, malformed records, records of an unknown
//! format, how late renewals went out, and the timing and errors of every
//! store request. An election without series of its own is counted under
//! the label of the others (see `scope`).

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
        self.table.with(self.own.label(election), |s| {
            s.request(op, took.as_secs_f64());
            if let Outcome::Failed(e) = outcome {
                s.error(e.metric_label());
            }
        });
    }

    fn acquire_attempt(&self, election: &str, outcome: Outcome<'_>) {
        self.table
            .with(self.own.label(election), |s| s.acquire(outcome.label()));
    }

    fn renew(&self, election: &str, outcome: Outcome<'_>) {
        self.table
            .with(self.own.label(election), |s| s.renew(outcome.label()));
    }

    fn transition(&self, election: &str, t: Transition) {
        let direction = match t {
            Transition::Gained => "gained",
            Transition::Lost => "lost",
        };
        self.table
            .with(self.own.label(election), |s| s.transition(direction));
    }

    fn lease_lost(&self, election: &str) {
        self.table
            .with(self.own.label(election), |s| s.lease_lost());
    }

    fn renew_sent(&self, _election: &str, late: Duration) {
        // One histogram for the daemon, whatever the election.
        self.renew_lag.observe(late.as_secs_f64());
    }

    fn preempted(&self, election: &str) {
        self.table.with(self.own.label(election), |s| s.preempted());
    }

    fn malformed_record(&self, election: &str) {
        self.table.with(self.own.label(election), |s| s.malformed());
    }

    fn unknown_format_record(&self, election: &str) {
        self.table
            .with(self.own.label(election), |s| s.unknown_format());
    }
}
