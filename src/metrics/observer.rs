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
        self.campaign
            .store_request_duration_seconds
            .with_label_values(&[election, op])
            .observe(took.as_secs_f64());
        if let Outcome::Failed(e) = outcome {
            self.campaign
                .store_errors_total
                .with_label_values(&[election, e.metric_label()])
                .inc();
        }
    }

    fn acquire_attempt(&self, election: &str, outcome: Outcome<'_>) {
        self.campaign
            .acquire_attempts_total
            .with_label_values(&[election, outcome.label()])
            .inc();
    }

    fn renew(&self, election: &str, outcome: Outcome<'_>) {
        self.campaign
            .renew_total
            .with_label_values(&[election, outcome.label()])
            .inc();
    }

    fn transition(&self, election: &str, t: Transition) {
        let direction = match t {
            Transition::Gained => "gained",
            Transition::Lost => "lost",
        };
        self.campaign
            .transitions_total
            .with_label_values(&[election, direction])
            .inc();
    }

    fn malformed_record(&self, election: &str) {
        self.campaign
            .malformed_records_total
            .with_label_values(&[election])
            .inc();
    }

    fn unknown_format_record(&self, election: &str) {
        self.campaign
            .unknown_format_records_total
            .with_label_values(&[election])
            .inc();
    }
}
