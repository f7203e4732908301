//! Every metric family leaderd exports: names, help texts, labels and
//! buckets all in this file, grouped by what feeds them, so the exported
//! surface (listed again in docs/metrics.md) reads in one place.
//!
//! Families with a series per election are written by leaderd itself (the
//! per-election table and the readings of a scrape); the few others are
//! prometheus-crate collectors, registered into a registry of their own,
//! which checks their names and label sets.

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::gauges::Reading;
use super::table::Family;
use super::text::Head;

/// Every family, registered, grouped by what feeds it.
pub(super) struct Registered {
    /// Every family, sorted by name: what a scrape renders, one family at a
    /// time.
    pub(super) sections: Vec<Section>,
    /// Fed by the supervisor of the job.
    pub(super) child: Child,
    /// Fed by the app check.
    pub(super) app_check: AppCheck,
    /// `leaderd_session_valid_seconds` (sessions on), set before a scrape.
    pub(super) session_valid_seconds: GaugeVec,
    /// `leaderd_renew_lag_seconds`, fed as renewals go out.
    pub(super) renew_lag: Histogram,
}

/// Buckets for how late a renewal goes out: on time is within the timer's
/// millisecond; R (5 s by default) late is a renewal missed.
const LAG_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One family of a scrape and where its samples come from.
pub(super) enum Section {
    /// A prometheus-crate collector: families with a handful of series.
    Registered(Box<dyn Collector>),
    /// A family of the per-election table.
    Table(Head, Family),
    /// A reading the scrape takes from the engines' state as it starts.
    Reading(Head, Reading),
}

impl Section {
    /// The family's name.
    pub(super) fn name(&self) -> &str {
        match self {
            Section::Registered(c) => c.desc().first().map_or("", |d| d.fq_name.as_str()),
            Section::Table(head, _) | Section::Reading(head, _) => head.name,
        }
    }
}

/// The families with a series per election, counted in the table.
const TABLE: &[(Head, Family)] = &[
    (
        counter(
            "leaderd_transitions_total",
            "Leadership changes of this instance, by direction (gained, lost).",
        ),
        Family::Transitions,
    ),
    (
        counter(
            "leaderd_acquire_attempts_total",
            "Attempts to create or take over the lease, by result (ok, lost, throttled, timeout, error).",
        ),
        Family::AcquireAttempts,
    ),
    (
        counter(
            "leaderd_renew_total",
            "Lease renewals, by result (ok, lost, throttled, timeout, error).",
        ),
        Family::Renew,
    ),
    (
        Head {
            name: "leaderd_store_request_duration_seconds",
            help: "Duration of lease store requests in seconds, by operation.",
            kind: "histogram",
        },
        Family::StoreRequests,
    ),
    (
        counter(
            "leaderd_store_errors_total",
            "Failed lease store requests, by error class; a failed write condition is not an error.",
        ),
        Family::StoreErrors,
    ),
    (
        counter(
            "leaderd_leases_lost_total",
            "Tenures that ended because the lease was lost (no renewal in time, another writer, or the session it was held through gone), not given up.",
        ),
        Family::LeasesLost,
    ),
    (
        counter(
            "leaderd_preemptions_total",
            "Elections this instance handed to a live member of a higher priority for them (preferred leaders).",
        ),
        Family::Preemptions,
    ),
    (
        counter(
            "leaderd_malformed_records_total",
            "Times a malformed lease record (missing or mistyped attributes) was first seen.",
        ),
        Family::Malformed,
    ),
    (
        counter(
            "leaderd_unknown_format_records_total",
            "Times a lease record of a format this build does not know was first seen; such a record is never written: upgrade the instance.",
        ),
        Family::UnknownFormat,
    ),
    (
        gauge(
            "leaderd_watch_streams",
            "Watch streams this instance serves for the election (the followers that hear of its renewals while it leads).",
        ),
        Family::WatchStreams,
    ),
];

/// The gauges a scrape computes from the engines' current state and the
/// clock, never fed by events: a stalled engine leaves no stale value.
const READINGS: &[(Head, Reading)] = &[
    (
        gauge(
            "leaderd_is_leader",
            "1 while this instance leads the election and is inside its validity, else 0 (computed at scrape time).",
        ),
        Reading::IsLeader,
    ),
    (
        gauge(
            "leaderd_fencing_token",
            "Fencing token of the lease as last observed (this instance's own while leading); absent until the record has been read.",
        ),
        Reading::FencingToken,
    ),
    (
        gauge(
            "leaderd_lease_remaining_seconds",
            "Validity left of this instance's tenure in seconds; 0 when not leading (computed at scrape time).",
        ),
        Reading::LeaseRemaining,
    ),
    (
        gauge(
            "leaderd_watching_leader",
            "1 while this instance follows and the leader's events reach it (its watch stream spoke within R + P), 0 while it leads or polls the store instead (computed at scrape time).",
        ),
        Reading::WatchingLeader,
    ),
    (
        gauge(
            "leaderd_elections",
            "Elections counted together under election=\"#others\" (those beyond metrics.election_series_limit), by state: leading, confirming, stopping, watching, polling, no_leader (computed at scrape time); absent while every election has series of its own.",
        ),
        Reading::Elections,
    ),
    (
        gauge(
            "leaderd_elections_led",
            "Elections this instance leads, inside their validity (computed at scrape time).",
        ),
        Reading::ElectionsLed,
    ),
    (
        gauge(
            "leaderd_fair_share",
            "With balance on: the elections this instance aims to lead, ceil(elections / members); absent with balance off.",
        ),
        Reading::FairShare,
    ),
    (
        gauge(
            "leaderd_members",
            "With balance on: live instances campaigning for the same elections, this one included; absent with balance off.",
        ),
        Reading::Members,
    ),
];

const fn counter(name: &'static str, help: &'static str) -> Head {
    Head {
        name,
        help,
        kind: "counter",
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Head {
    Head {
        name,
        help,
        kind: "gauge",
    }
}

/// The job under the primary election.
pub(super) struct Child {
    /// `leaderd_child_running`.
    pub(super) running: IntGaugeVec,
    /// `leaderd_child_exits_total`.
    pub(super) exits_total: IntCounterVec,
    /// `leaderd_child_kills_total`.
    pub(super) kills_total: IntCounterVec,
    /// `leaderd_child_start_failures_total`.
    pub(super) start_failures_total: IntCounterVec,
}

/// The app check's verdicts and failed probes.
pub(super) struct AppCheck {
    /// `leaderd_app_check_up`.
    pub(super) up: IntGaugeVec,
    /// `leaderd_app_check_failures_total`.
    pub(super) failures_total: IntCounterVec,
}

/// Create every family; the prometheus-crate ones are registered into a
/// fresh registry, which checks names and label sets.
pub(super) fn register() -> Registered {
    let mut r = Families {
        registry: Registry::new(),
        list: Vec::new(),
    };
    let child = Child::register(&mut r);
    let app_check = AppCheck::register(&mut r);
    let session_valid_seconds = r.add(
        GaugeVec::new(
            Opts::new(
                "leaderd_session_valid_seconds",
                "With sessions on: validity left of this instance's session in seconds (and of every tenure held through it); 0 while none is open; absent with sessions off.",
            ),
            &[],
        )
        .expect("metric names and labels are valid constants (checked by tests)"),
    );
    let renew_lag = r.add(
        Histogram::with_opts(
            HistogramOpts::new(
                "leaderd_renew_lag_seconds",
                "How long after it was due each renewal was sent, in seconds: the session's renewals with sessions on, every election's own without.",
            )
            .buckets(LAG_BUCKETS.to_vec()),
        )
        .expect("metric name and buckets are valid constants (checked by tests)"),
    );
    r.build_info();
    let mut sections = r.list;
    sections.extend(TABLE.iter().map(|(h, f)| Section::Table(*h, *f)));
    sections.extend(READINGS.iter().map(|(h, g)| Section::Reading(*h, *g)));
    sections.sort_by(|a, b| a.name().cmp(b.name()));
    Registered {
        sections,
        child,
        app_check,
        session_valid_seconds,
        renew_lag,
    }
}

/// The prometheus-crate families while [`register`] creates them: each one
/// is registered into a registry, which checks names and label sets, and
/// kept for rendering.
struct Families {
    registry: Registry,
    list: Vec<Section>,
}

impl Families {
    fn add<C: Collector + Clone + 'static>(&mut self, family: C) -> C {
        self.registry
            .register(Box::new(family.clone()))
            .expect("each name is registered once into a fresh registry");
        self.list
            .push(Section::Registered(Box::new(family.clone())));
        family
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(
            IntCounterVec::new(Opts::new(name, help), labels)
                .expect("metric names and labels are valid constants (checked by tests)"),
        )
    }

    fn int_gauge(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(
            IntGaugeVec::new(Opts::new(name, help), labels)
                .expect("metric names and labels are valid constants (checked by tests)"),
        )
    }

    /// `leaderd_build_info`, always 1.
    fn build_info(&mut self) {
        let build_info = IntGauge::with_opts(
            Opts::new(
                "leaderd_build_info",
                "Always 1; the version label names the running leaderd build.",
            )
            .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("metric name and label are valid constants (checked by tests)");
        build_info.set(1);
        self.add(build_info);
    }
}

impl Child {
    fn register(r: &mut Families) -> Child {
        let running = r.int_gauge(
            "leaderd_child_running",
            "1 while the supervised child process runs, else 0.",
            &["election"],
        );
        let exits_total = r.counter(
            "leaderd_child_exits_total",
            "Exits of the supervised child process, by reason.",
            &["election", "reason"],
        );
        let kills_total = r.counter(
            "leaderd_child_kills_total",
            "Times the child's process group was killed (SIGKILL) at the end of validity or grace.",
            &["election"],
        );
        let start_failures_total = r.counter(
            "leaderd_child_start_failures_total",
            "Times the child command could not be started (not found, not executable, no resources).",
            &["election"],
        );
        Child {
            running,
            exits_total,
            kills_total,
            start_failures_total,
        }
    }
}

impl AppCheck {
    fn register(r: &mut Families) -> AppCheck {
        let up = r.int_gauge(
            "leaderd_app_check_up",
            "1 while the app check passes, 0 while it fails or has no verdict yet; absent without an app check.",
            &[],
        );
        let failures_total = r.counter(
            "leaderd_app_check_failures_total",
            "App check probes that failed (error, non-2xx answer, non-zero exit or timeout); absent without an app check.",
            &[],
        );
        AppCheck { up, failures_total }
    }
}
