//! The gauges computed at scrape time from the engines' current state and
//! the clock, one election at a time, and the series created at zero so they
//! exist before the first event.

use tokio::sync::watch;

use super::Metrics;
use super::families::RESULTS;
use crate::balance::Share;
use crate::clock::Clock;
use crate::election::ElectionState;

impl Metrics {
    /// Set the leadership gauges from `elections`' current state at
    /// `clock.now()`, and the balance gauges from `share`.
    pub(super) fn refresh_gauges<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a watch::Receiver<ElectionState>>,
        share: Option<&Share>,
        clock: &Clock,
    ) {
        let gauges = &self.gauges;
        let mut led = 0;
        let (mut leader, mut remaining, mut watching, mut token) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rx in elections {
            let (name, leading, left, watches, fencing) = {
                // Read out at once: holding the borrow would block the engine.
                let state = rx.borrow();
                let now = clock.now();
                (
                    state.election.clone(),
                    state.is_leader_at(now),
                    state.lease_remaining(now).as_secs_f64(),
                    state.watching_leader_at(now),
                    state.fencing_token,
                )
            };
            self.touch(&name);
            led += i64::from(leading);
            leader.push((name.clone(), f64::from(u8::from(leading))));
            remaining.push((name.clone(), left));
            watching.push((name.clone(), f64::from(u8::from(watches))));
            // Absent until the record was read, rather than a made-up 0.
            if let Some(t) = fencing {
                token.push((name, t as f64));
            }
        }
        gauges.is_leader.set(leader);
        gauges.lease_remaining_seconds.set(remaining);
        gauges.watching_leader.set(watching);
        gauges.fencing_token.set(token);
        let no_labels: &[&str] = &[];
        gauges.elections_led.with_label_values(no_labels).set(led);
        if let Some(share) = share {
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            gauges
                .fair_share
                .with_label_values(no_labels)
                .set(count(share.fair_share));
            gauges
                .members
                .with_label_values(no_labels)
                .set(count(share.members));
        }
    }

    /// Set `leaderd_session_valid_seconds` (sessions on, at scrape time):
    /// the validity `left` of this instance's session.
    pub fn set_session_valid(&self, left: std::time::Duration) {
        let no_labels: &[&str] = &[];
        self.gauges
            .session_valid_seconds
            .with_label_values(no_labels)
            .set(left.as_secs_f64());
    }

    /// Create the series of `election` that have a fixed label set, at zero,
    /// so they exist before the first event. Idempotent.
    fn touch(&self, election: &str) {
        let campaign = &self.campaign;
        for direction in ["gained", "lost"] {
            campaign
                .transitions_total
                .with_label_values(&[election, direction]);
        }
        for result in RESULTS {
            campaign
                .acquire_attempts_total
                .with_label_values(&[election, result]);
            // With sessions only the session is renewed (created at start).
            if !self.sessions {
                campaign.renew_total.with_label_values(&[election, result]);
            }
        }
        campaign
            .malformed_records_total
            .with_label_values(&[election]);
        campaign
            .unknown_format_records_total
            .with_label_values(&[election]);
        self.watch_streams.with_label_values(&[election]);
    }
}
