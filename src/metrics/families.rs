//! Every metric family leaderd exports, registered once: names, help texts,
//! labels and buckets all in this file, grouped by what feeds them, so the
//! exported surface (listed again in docs/metrics.md) reads in one place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Buckets for store latencies: DynamoDB answers in a few ms, SQLite in less,
/// and a request is cut off at the renew interval (seconds).
const STORE_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Results of acquire attempts and renews, pre-created at zero so that rates
/// and alerts work before the first event.
pub(super) const RESULTS: &[&str] = &["ok", "lost", "throttled", "timeout", "error"];

/// Every family, registered, grouped by what feeds it.
pub(super) struct Registered {
    /// Every family, sorted by name: what a scrape renders, one family at a
    /// time.
    pub(super) all: Vec<Box<dyn Collector>>,
    /// Computed from the engines' state at scrape time.
    pub(super) gauges: ScrapeGauges,
    /// Fed by the election engines' observer.
    pub(super) campaign: Campaign,
    /// Fed by the supervisor of the job.
    pub(super) child: Child,
    /// Fed by the app check.
    pub(super) app_check: AppCheck,
    /// `leaderd_watch_streams`: counted by the watch streams themselves.
    pub(super) watch_streams: IntGaugeVec,
}

/// The gauges a scrape computes from the engines' current state and the
/// clock, never fed by events: a stalled engine leaves no stale value.
pub(super) struct ScrapeGauges {
    /// `leaderd_is_leader`.
    pub(super) is_leader: PerElection,
    /// `leaderd_fencing_token`.
    pub(super) fencing_token: PerElection,
    /// `leaderd_lease_remaining_seconds`.
    pub(super) lease_remaining_seconds: PerElection,
    /// `leaderd_watching_leader`.
    pub(super) watching_leader: PerElection,
    /// `leaderd_elections_led`.
    pub(super) elections_led: IntGaugeVec,
    /// `leaderd_fair_share` (balance on).
    pub(super) fair_share: IntGaugeVec,
    /// `leaderd_members` (balance on).
    pub(super) members: IntGaugeVec,
    /// `leaderd_session_valid_seconds` (sessions on).
    pub(super) session_valid_seconds: GaugeVec,
}

/// What the election engines report: campaign results, transitions, store
/// requests and what they found in the store.
pub(super) struct Campaign {
    /// `leaderd_transitions_total`.
    pub(super) transitions_total: IntCounterVec,
    /// `leaderd_acquire_attempts_total`.
    pub(super) acquire_attempts_total: IntCounterVec,
    /// `leaderd_renew_total`.
    pub(super) renew_total: IntCounterVec,
    /// `leaderd_store_request_duration_seconds`.
    pub(super) store_request_duration_seconds: HistogramVec,
    /// `leaderd_store_errors_total`.
    pub(super) store_errors_total: IntCounterVec,
    /// `leaderd_malformed_records_total`.
    pub(super) malformed_records_total: IntCounterVec,
    /// `leaderd_unknown_format_records_total`.
    pub(super) unknown_format_records_total: IntCounterVec,
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

/// Create every family and register it into a fresh registry, which checks
/// names and label sets.
pub(super) fn register() -> Registered {
    let mut r = Families {
        registry: Registry::new(),
        list: Vec::new(),
    };
    let gauges = ScrapeGauges::register(&mut r);
    let campaign = Campaign::register(&mut r);
    let child = Child::register(&mut r);
    let app_check = AppCheck::register(&mut r);
    let watch_streams = r.int_gauge(
        "leaderd_watch_streams",
        "Watch streams this instance serves for the election (the followers that hear of its renewals while it leads).",
        &["election"],
    );
    r.build_info();
    Registered {
        all: r.into_sorted(),
        gauges,
        campaign,
        child,
        app_check,
        watch_streams,
    }
}

/// The metric families while [`register`] creates them: each one is
/// registered into a registry, which checks names and label sets, and kept
/// for rendering.
struct Families {
    registry: Registry,
    list: Vec<Box<dyn Collector>>,
}

impl Families {
    fn add<C: Collector + Clone + 'static>(&mut self, family: C) -> C {
        self.registry
            .register(Box::new(family.clone()))
            .expect("each name is registered once into a fresh registry");
        self.list.push(Box::new(family.clone()));
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

    /// Every family, sorted by name (the order `Registry::gather` gives).
    fn into_sorted(mut self) -> Vec<Box<dyn Collector>> {
        self.list
            .sort_by_key(|c| c.desc().first().map(|d| d.fq_name.clone()));
        self.list
    }
}

impl ScrapeGauges {
    fn register(r: &mut Families) -> ScrapeGauges {
        let is_leader = r.add(PerElection::new(
            "leaderd_is_leader",
            "1 while this instance leads the election and is inside its validity, else 0 (computed at scrape time).",
        ));
        let fencing_token = r.add(PerElection::new(
            "leaderd_fencing_token",
            "Fencing token of the lease as last observed (this instance's own while leading); absent until the record has been read.",
        ));
        let lease_remaining_seconds = r.add(PerElection::new(
            "leaderd_lease_remaining_seconds",
            "Validity left of this instance's tenure in seconds; 0 when not leading (computed at scrape time).",
        ));
        let watching_leader = r.add(PerElection::new(
            "leaderd_watching_leader",
            "1 while this instance follows and the leader's events reach it (its watch stream spoke within R + P), 0 while it leads or polls the store instead (computed at scrape time).",
        ));
        let elections_led = r.int_gauge(
            "leaderd_elections_led",
            "Elections this instance leads, inside their validity (computed at scrape time).",
            &[],
        );
        let fair_share = r.int_gauge(
            "leaderd_fair_share",
            "With balance on: the elections this instance aims to lead, ceil(elections / members); absent with balance off.",
            &[],
        );
        let members = r.int_gauge(
            "leaderd_members",
            "With balance on: live instances campaigning for the same elections, this one included; absent with balance off.",
            &[],
        );
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
        ScrapeGauges {
            is_leader,
            fencing_token,
            lease_remaining_seconds,
            watching_leader,
            elections_led,
            fair_share,
            members,
            session_valid_seconds,
        }
    }
}

impl Campaign {
    fn register(r: &mut Families) -> Campaign {
        let transitions_total = r.counter(
            "leaderd_transitions_total",
            "Leadership changes of this instance, by direction (gained, lost).",
            &["election", "direction"],
        );
        let acquire_attempts_total = r.counter(
            "leaderd_acquire_attempts_total",
            "Attempts to create or take over the lease, by result (ok, lost, throttled, timeout, error).",
            &["election", "result"],
        );
        let renew_total = r.counter(
            "leaderd_renew_total",
            "Lease renewals, by result (ok, lost, throttled, timeout, error).",
            &["election", "result"],
        );
        let store_request_duration_seconds = r.add(
            HistogramVec::new(
                HistogramOpts::new(
                    "leaderd_store_request_duration_seconds",
                    "Duration of lease store requests in seconds, by operation.",
                )
                .buckets(STORE_LATENCY_BUCKETS.to_vec()),
                &["election", "op"],
            )
            .expect("metric names, labels and buckets are valid constants (checked by tests)"),
        );
        let store_errors_total = r.counter(
            "leaderd_store_errors_total",
            "Failed lease store requests, by error class; a failed write condition is not an error.",
            &["election", "class"],
        );
        let malformed_records_total = r.counter(
            "leaderd_malformed_records_total",
            "Times a malformed lease record (missing or mistyped attributes) was first seen.",
            &["election"],
        );
        let unknown_format_records_total = r.counter(
            "leaderd_unknown_format_records_total",
            "Times a lease record of a format this build does not know was first seen; such a record is never written: upgrade the instance.",
            &["election"],
        );
        Campaign {
            transitions_total,
            acquire_attempts_total,
            renew_total,
            store_request_duration_seconds,
            store_errors_total,
            malformed_records_total,
            unknown_format_records_total,
        }
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

/// A gauge family with one value per election, all computed at scrape
/// time: it keeps no series between scrapes, only the values of the one
/// being rendered (a gauge vector would keep a series per election for
/// ever, a few hundred bytes each, a thousand times over).
#[derive(Clone)]
pub(super) struct PerElection {
    desc: Desc,
    values: Arc<Mutex<Vec<(String, f64)>>>,
}

impl PerElection {
    fn new(name: &str, help: &str) -> PerElection {
        PerElection {
            desc: Desc::new(
                name.to_owned(),
                help.to_owned(),
                vec!["election".to_owned()],
                HashMap::new(),
            )
            .expect("metric names and labels are valid constants (checked by tests)"),
            values: Arc::default(),
        }
    }

    /// The values the next render shows, by election.
    pub(super) fn set(&self, values: Vec<(String, f64)>) {
        *self.lock() = values;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, f64)>> {
        // Whole values are swapped in: a poisoned lock holds no half-state.
        self.values
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Collector for PerElection {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::GAUGE);
        for (election, value) in std::mem::take(&mut *self.lock()) {
            let mut label = LabelPair::default();
            label.set_name("election".to_owned());
            label.set_value(election);
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            let mut metric = Metric::default();
            metric.set_label(vec![label]);
            metric.set_gauge(gauge);
            family.mut_metric().push(metric);
        }
        vec![family]
    }
}
