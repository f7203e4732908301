//! The gauges computed at scrape time: read from the engines' current state
//! and the clock once, as the scrape starts, and written from that reading.

use super::Metrics;
use super::scope::OTHERS_LABEL;
use super::text::Lines;
use crate::balance::Share;
use crate::clock::{Clock, Instant};
use crate::driver::board::StateView;
use crate::election::{ElectionState, Role};

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
    /// `leaderd_elections`: the elections counted together, by state.
    Elections,
    /// `leaderd_elections_led`.
    ElectionsLed,
    /// `leaderd_fair_share` (balance on).
    FairShare,
    /// `leaderd_members` (balance on).
    Members,
}

/// The labels of [`State`], in its order (which is label order).
const STATES: [&str; 6] = [
    "confirming",
    "leading",
    "no_leader",
    "polling",
    "stopping",
    "watching",
];

/// An election's state as `leaderd_elections` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Holds a new tenure it may not lead yet (`strict_new_lease`).
    Confirming,
    /// Leads, inside its validity.
    Leading,
    /// Follows, and no holder is known (record absent, released, not
    /// usable, or not read yet).
    NoLeader,
    /// Follows a holder, reading the store every P.
    Polling,
    /// Holds a tenure it no longer leads: the job is being stopped.
    Stopping,
    /// Follows a holder whose events reach this instance.
    Watching,
}

impl State {
    fn at(state: &ElectionState, now: Instant) -> State {
        if state.is_leader_at(now) {
            return State::Leading;
        }
        match state.role {
            Role::Confirming => State::Confirming,
            Role::Leader | Role::Stopping => State::Stopping,
            Role::Follower if state.leader.is_none() => State::NoLeader,
            Role::Follower if state.watching_leader_at(now) => State::Watching,
            Role::Follower => State::Polling,
        }
    }
}

/// What a scrape read as it started.
#[derive(Debug, Default)]
pub(super) struct Readings {
    /// One row per election with series of its own, sorted by election.
    rows: Vec<Row>,
    /// Elections led, inside their validity (all of them).
    led: usize,
    /// The elections counted together, by state (see [`STATES`]); `None`
    /// while every election has series of its own.
    others: Option<[usize; STATES.len()]>,
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
    /// `clock.now()`, and balance's from `share`; make sure the fixed
    /// series of each election (or of the elections counted together)
    /// exist.
    pub(super) fn read_gauges<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a StateView>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Readings {
        let mut rows = Vec::new();
        let mut led = 0;
        let mut others: Option<[usize; STATES.len()]> = None;
        for rx in elections {
            // Read out at once: holding the borrow would block the engine.
            let state = rx.borrow();
            let now = clock.now();
            let leading = state.is_leader_at(now);
            led += usize::from(leading);
            if self.own.label(&state.election) == OTHERS_LABEL {
                others.get_or_insert_default()[State::at(&state, now) as usize] += 1;
                continue;
            }
            rows.push(Row {
                election: state.election.clone(),
                leading,
                remaining: state.lease_remaining(now).as_secs_f64(),
                watching: state.watching_leader_at(now),
                token: state.fencing_token,
            });
        }
        rows.sort_by(|a, b| a.election.cmp(&b.election));
        // With sessions only the session is renewed (marked at start).
        let labels = rows.iter().map(|r| r.election.as_str());
        for label in labels.chain(others.map(|_| OTHERS_LABEL)) {
            self.table.with(label, |s| s.election(!self.sessions));
        }
        Readings {
            rows,
            led,
            others,
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
            (Reading::Elections, _) => {
                for (state, n) in STATES.iter().zip(self.others.iter().flatten()) {
                    out.sample(
                        "",
                        &[("election", OTHERS_LABEL), ("state", state)],
                        count(*n),
                    );
                }
                None
            }
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
