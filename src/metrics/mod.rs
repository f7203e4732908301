//! Prometheus metrics.
//!
//! Counters and the store latency histogram are fed by the election engines
//! through [`Observer`](crate::election::Observer) and by the child supervisor through
//! [`Metrics::child_started`] and friends. The leadership gauges
//! (`is_leader`, `fencing_token`, `lease_remaining_seconds`) are not fed at
//! all: a scrape reads them from the engines' current state and the clock
//! as it starts, so a stalled engine can never leave a stale "leader = 1"
//! behind.
//!
//! The rooms: this file holds [`Metrics`] and the events of the job, the app
//! check and the watch streams; `families` names every family; `table` keeps
//! the counters of every election; `observer` counts what the election
//! engines report, store request timings included; `gauges` reads the
//! per-election gauges at scrape time; `render` writes a scrape in pieces,
//! `text` the lines of the format; `scope` decides which elections have
//! series of their own (above a limit, most are counted together);
//! `promtool` runs `promtool check metrics` for the tests, and `tests` and
//! `aggregate_tests` are the unit tests.

use prometheus::{GaugeVec, Histogram};

use crate::app_check::{self, Verdict};

#[cfg(test)]
mod aggregate_tests;
mod families;
mod gauges;
mod observer;
#[cfg(any(test, feature = "testing"))]
mod promtool;
mod render;
mod scope;
mod table;
#[cfg(test)]
mod tests;
mod text;

use families::{AppCheck, Child, Section};
#[cfg(any(test, feature = "testing"))]
pub use promtool::promtool_check;
pub use render::Scrape;
pub use scope::{OTHERS_LABEL, OwnSeries};

/// Content type of a scrape's text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every leaderd metric. Create one per process and share it (`Arc`).
pub struct Metrics {
    /// Every metric family, sorted by name: what a scrape renders, one family
    /// at a time (see [`Scrape`]).
    sections: Vec<Section>,
    /// The counters of every election, fed by the election engines and the
    /// watch streams.
    table: table::Table,
    /// Fed by the daemon as it runs the job.
    child: Child,
    /// Fed by the app check.
    app_check: AppCheck,
    /// `leaderd_session_valid_seconds`, set before a scrape.
    session_valid_seconds: GaugeVec,
    /// `leaderd_renew_lag_seconds`, fed by the election engines.
    renew_lag: Histogram,
    /// Tenures are held through the session: no election is renewed on
    /// its own (see [`Shape::sessions`]).
    sessions: bool,
    /// Which elections have series of their own.
    own: OwnSeries,
}

/// What a daemon's elections can report, so that only series that can
/// move are created at zero before their first event (each costs memory
/// and a line of every scrape, a thousand times over with many elections).
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// Tenures are held through the daemon's session: an election is never
    /// renewed on its own; the session's renewals are counted under
    /// `election="#session"` instead.
    pub sessions: bool,
    /// The election whose leader runs the job, if there is a job: only its
    /// child series exist from the start.
    pub job: Option<String>,
    /// Which elections have series of their own; the others are counted
    /// together under [`OTHERS_LABEL`].
    pub own_series: OwnSeries,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One open watch stream, counted in `leaderd_watch_streams` while it lives.
#[derive(Debug)]
pub struct OpenWatchStream(table::Shared);

impl Drop for OpenWatchStream {
    fn drop(&mut self) {
        table::lock(&self.0).stream(-1);
    }
}

impl Metrics {
    /// Create every metric and register it into a fresh registry.
    pub fn new() -> Self {
        Self::shaped(Shape::default())
    }

    /// A daemon's metrics, with the series of `shape` created at zero.
    pub fn shaped(shape: Shape) -> Self {
        let r = families::register();
        let table = table::Table::default();
        // The series known before any election is: created once, here.
        if shape.sessions {
            table.with(crate::election::SESSION_LABEL, table::Series::renewed);
        }
        if let Some(election) = &shape.job {
            r.child.running.with_label_values(&[election]);
            r.child.kills_total.with_label_values(&[election]);
            r.child.start_failures_total.with_label_values(&[election]);
        }
        if let OwnSeries::Only(kept) = &shape.own_series {
            let mut kept: Vec<&str> = kept.iter().map(String::as_str).collect();
            kept.sort_unstable();
            tracing::info!(own_series = %kept.join(", "), "more elections than metrics.election_series_limit: only these have series of their own; the others are counted together under election=\"{OTHERS_LABEL}\"");
        }
        Metrics {
            sections: r.sections,
            table,
            child: r.child,
            app_check: r.app_check,
            session_valid_seconds: r.session_valid_seconds,
            renew_lag: r.renew_lag,
            sessions: shape.sessions,
            own: shape.own_series,
        }
    }

    /// The child of `election` was started.
    pub fn child_started(&self, election: &str) {
        self.child.running.with_label_values(&[election]).set(1);
    }

    /// The child of `election` exited; `reason` is a short stable word
    /// (`exited`, `signaled`, `killed`).
    pub fn child_exited(&self, election: &str, reason: &str) {
        self.child.running.with_label_values(&[election]).set(0);
        self.child
            .exits_total
            .with_label_values(&[election, reason])
            .inc();
    }

    /// The child command of `election` could not be started.
    pub fn child_start_failed(&self, election: &str) {
        self.child
            .start_failures_total
            .with_label_values(&[election])
            .inc();
    }

    /// The child's process group of `election` was sent SIGKILL.
    pub fn child_killed(&self, election: &str) {
        self.child.kills_total.with_label_values(&[election]).inc();
    }

    /// A watch stream of `election` opened; it counts until the returned
    /// guard drops (when the stream ends or its client goes away).
    pub fn watch_stream_opened(&self, election: &str) -> OpenWatchStream {
        let series = self.table.get(self.own.label(election));
        table::lock(&series).stream(1);
        OpenWatchStream(series)
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("families", &self.sections.len())
            .finish_non_exhaustive()
    }
}

impl app_check::Report for Metrics {
    fn probed(&self, up: bool) {
        let failures = self
            .app_check
            .failures_total
            .with_label_values(&[] as &[&str]);
        if !up {
            failures.inc();
        }
    }

    fn verdict(&self, verdict: Verdict) {
        self.app_check
            .up
            .with_label_values(&[] as &[&str])
            .set(i64::from(verdict == Verdict::Pass));
    }
}
