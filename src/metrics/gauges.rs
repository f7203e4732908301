//! The gauges computed at scrape time: read from the engines' current state
//! and the clock once, as the scrape starts, and written from that reading.

use tokio::sync::watch;

use super::Metrics;
use super::text::Lines;
use crate::balance::Share;
use crate::clock::Clock;
use crate::election::ElectionState;

/// A gauge a scrape reads as it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// `leaderd_is_leader`, per election.
    IsLeader,
    /// `leaderd_fencing_token`, per election (absent until read).
    FencingToken,
    /// `leaderd_lease_remaining_seconds`, per election.
    LeaseRemaining,
    /// `leaderd_watching_leader`, per election.
    WatchingLeader,
    /// `leaderd_elections_led`.
    ElectionsLed,
    /// `leaderd_fair_share` (balance on).
    FairShare,
    /// `leaderd_members` (balance on).
    Members,
}

/// What a scrape read as it started.
#[derive(Debug, Default)]
pub(super) struct Readings {
    /// One row per election, sorted by election.
    rows: Vec<Row>,
    /// Elections led, inside their validity.
    led: usize,
    /// Balance's view, with balance on.
    share: Option<Share>,
}

/// One election's gauges.
#[derive(Debug)]
struct Row {
    election: String,
    leading: bool,
    remaining: f64,
    watching: bool,
    /// Absent until the record was read, rather than a made-up 0.
    token: Option<u64>,
}

impl Metrics {
    /// Read the leadership gauges from `elections`' current state at
    /// `clock.now()`, and balance's from `share`; make sure each election's
    /// fixed series exist.
    pub(super) fn read_gauges<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a watch::Receiver<ElectionState>>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Readings {
        let mut rows: Vec<Row> = elections
            .into_iter()
            .map(|rx| {
                // Read out at once: holding the borrow would block the engine.
                let state = rx.borrow();
                let now = clock.now();
                Row {
                    election: state.election.clone(),
                    leading: state.is_leader_at(now),
                    remaining: state.lease_remaining(now).as_secs_f64(),
                    watching: state.watching_leader_at(now),
                    token: state.fencing_token,
                }
            })
            .collect();
        rows.sort_by(|a, b| a.election.cmp(&b.election));
        for row in &rows {
            // With sessions only the session is renewed (marked at start).
            self.table
                .with(&row.election, |s| s.election(!self.sessions));
        }
        Readings {
            led: rows.iter().filter(|r| r.leading).count(),
            rows,
            share: share.cloned(),
        }
    }

    /// Set `leaderd_session_valid_seconds` (sessions on, at scrape time):
    /// the validity `left` of this instance's session.
    pub fn set_session_valid(&self, left: std::time::Duration) {
        let no_labels: &[&str] = &[];
        self.session_valid_seconds
            .with_label_values(no_labels)
            .set(left.as_secs_f64());
    }
}

impl Readings {
    /// Write `reading` for the elections from row `from` on, until `out`
    /// holds at least `budget` bytes. Returns the next row if the family may
    /// go on, `None` once it is written.
    pub(super) fn render(
        &self,
        reading: Reading,
        from: usize,
        out: &mut Lines<'_>,
        budget: usize,
    ) -> Option<usize> {
        let count = |n: usize| n as f64;
        let scalar = match (reading, &self.share) {
            (Reading::ElectionsLed, _) => Some(count(self.led)),
            (Reading::FairShare, Some(share)) => Some(count(share.fair_share)),
            (Reading::Members, Some(share)) => Some(count(share.members)),
            (Reading::FairShare | Reading::Members, None) => None,
            _ => return self.render_rows(reading, from, out, budget),
        };
        if let Some(value) = scalar {
            out.sample("", &[], value);
        }
        None
    }

    fn render_rows(
        &self,
        reading: Reading,
        from: usize,
        out: &mut Lines<'_>,
        budget: usize,
    ) -> Option<usize> {
        let flag = |b: bool| f64::from(u8::from(b));
        for (i, row) in self.rows.iter().enumerate().skip(from) {
            let value = match reading {
                Reading::IsLeader => Some(flag(row.leading)),
                Reading::LeaseRemaining => Some(row.remaining),
                Reading::WatchingLeader => Some(flag(row.watching)),
                Reading::FencingToken => row.token.map(|t| t as f64),
                _ => None,
            };
            if let Some(value) = value {
                out.sample("", &[("election", &row.election)], value);
            }
            if out.len() >= budget {
                return Some(i + 1);
            }
        }
        None
    }
}
