//! Prometheus metrics, registered once into a registry of our own.
//!
//! Counters and the store latency histogram are fed by the election engines
//! through [`Observer`] and by the child supervisor through
//! [`Metrics::child_started`] and friends. The leadership gauges
//! (`is_leader`, `fencing_token`, `lease_remaining_seconds`) are not fed at
//! all: [`Metrics::render`] computes them from the engines' current state and
//! the clock at scrape time, so a stalled engine can never leave a stale
//! "leader = 1" behind.

use std::cmp::Ordering as CmpOrdering;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use tokio::sync::watch;

use crate::app_check::{self, Verdict};
use crate::balance::Share;
use crate::clock::Clock;
use crate::election::{ElectionState, Observer, Outcome, Transition};

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets for store latencies: DynamoDB answers in a few ms, SQLite in less,
/// and a request is cut off at the renew interval (seconds).
const STORE_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Results of acquire attempts and renews, pre-created at zero so that rates
/// and alerts work before the first event.
const RESULTS: &[&str] = &["ok", "lost", "throttled", "timeout", "error"];

/// Every leaderd metric. Create one per process and share it (`Arc`).
pub struct Metrics {
    /// Every metric family, sorted by name: what a scrape renders, one family
    /// at a time (see [`Metrics::render`]).
    families: Vec<Box<dyn Collector>>,
    is_leader: IntGaugeVec,
    fencing_token: IntGaugeVec,
    lease_remaining_seconds: GaugeVec,
    transitions_total: IntCounterVec,
    acquire_attempts_total: IntCounterVec,
    renew_total: IntCounterVec,
    store_request_duration_seconds: HistogramVec,
    store_errors_total: IntCounterVec,
    malformed_records_total: IntCounterVec,
    child_running: IntGaugeVec,
    child_exits_total: IntCounterVec,
    child_kills_total: IntCounterVec,
    child_start_failures_total: IntCounterVec,
    app_check_up: IntGaugeVec,
    app_check_failures_total: IntCounterVec,
    elections_led: IntGaugeVec,
    fair_share: IntGaugeVec,
    members: IntGaugeVec,
    watching_leader: IntGaugeVec,
    watch_streams: IntGaugeVec,
    /// Serialises renders: each one sets the leadership gauges, then gathers;
    /// two interleaved renders could otherwise mix their readings.
    render_lock: Mutex<()>,
    /// Length of the last rendering: the next one reserves that much at once
    /// instead of doubling its way up (at 1,000 elections the text is 5 MB).
    last_render_len: AtomicUsize,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One open watch stream, counted in `leaderd_watch_streams` while it lives.
#[derive(Debug)]
pub struct OpenWatchStream(IntGauge);

impl Drop for OpenWatchStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The metric families while [`Metrics::new`] creates them: each one is
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

    /// Every family, sorted by name (the order `Registry::gather` gives).
    fn into_sorted(mut self) -> Vec<Box<dyn Collector>> {
        self.list
            .sort_by_key(|c| c.desc().first().map(|d| d.fq_name.clone()));
        self.list
    }
}

impl Metrics {
    /// Create every metric and register it into a fresh registry.
    pub fn new() -> Self {
        let mut r = Families {
            registry: Registry::new(),
            list: Vec::new(),
        };
        let is_leader = r.int_gauge(
            "leaderd_is_leader",
            "1 while this instance leads the election and is inside its validity, else 0 (computed at scrape time).",
            &["election"],
        );
        let fencing_token = r.int_gauge(
            "leaderd_fencing_token",
            "Fencing token of the lease as last observed (this instance's own while leading); absent until the record has been read.",
            &["election"],
        );
        let lease_remaining_seconds = r.add(
            GaugeVec::new(
                Opts::new(
                    "leaderd_lease_remaining_seconds",
                    "Validity left of this instance's tenure in seconds; 0 when not leading (computed at scrape time).",
                ),
                &["election"],
            )
            .expect("metric names and labels are valid constants (checked by tests)"),
        );
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
        let child_running = r.int_gauge(
            "leaderd_child_running",
            "1 while the supervised child process runs, else 0.",
            &["election"],
        );
        let child_exits_total = r.counter(
            "leaderd_child_exits_total",
            "Exits of the supervised child process, by reason.",
            &["election", "reason"],
        );
        let child_kills_total = r.counter(
            "leaderd_child_kills_total",
            "Times the child's process group was killed (SIGKILL) at the end of validity or grace.",
            &["election"],
        );
        let child_start_failures_total = r.counter(
            "leaderd_child_start_failures_total",
            "Times the child command could not be started (not found, not executable, no resources).",
            &["election"],
        );
        let app_check_up = r.int_gauge(
            "leaderd_app_check_up",
            "1 while the app check passes, 0 while it fails or has no verdict yet; absent without an app check.",
            &[],
        );
        let app_check_failures_total = r.counter(
            "leaderd_app_check_failures_total",
            "App check probes that failed (error, non-2xx answer, non-zero exit or timeout); absent without an app check.",
            &[],
        );
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
        let watching_leader = r.int_gauge(
            "leaderd_watching_leader",
            "1 while this instance follows and the leader's events reach it (its watch stream spoke within R + P), 0 while it leads or polls the store instead (computed at scrape time).",
            &["election"],
        );
        let watch_streams = r.int_gauge(
            "leaderd_watch_streams",
            "Watch streams this instance serves for the election (the followers that hear of its renewals while it leads).",
            &["election"],
        );
        let build_info = IntGauge::with_opts(
            Opts::new(
                "leaderd_build_info",
                "Always 1; the version label names the running leaderd build.",
            )
            .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("metric name and label are valid constants (checked by tests)");
        build_info.set(1);
        r.add(build_info);

        Metrics {
            families: r.into_sorted(),
            is_leader,
            fencing_token,
            lease_remaining_seconds,
            transitions_total,
            acquire_attempts_total,
            renew_total,
            store_request_duration_seconds,
            store_errors_total,
            malformed_records_total,
            child_running,
            child_exits_total,
            child_kills_total,
            child_start_failures_total,
            app_check_up,
            app_check_failures_total,
            elections_led,
            fair_share,
            members,
            watching_leader,
            watch_streams,
            render_lock: Mutex::new(()),
            last_render_len: AtomicUsize::new(0),
        }
    }

    /// The child of `election` was started.
    pub fn child_started(&self, election: &str) {
        self.child_running.with_label_values(&[election]).set(1);
    }

    /// The child of `election` exited; `reason` is a short stable word
    /// (e.g. `exited`, `signaled`, `stopped`).
    pub fn child_exited(&self, election: &str, reason: &str) {
        self.child_running.with_label_values(&[election]).set(0);
        self.child_exits_total
            .with_label_values(&[election, reason])
            .inc();
    }

    /// The child command of `election` could not be started.
    pub fn child_start_failed(&self, election: &str) {
        self.child_start_failures_total
            .with_label_values(&[election])
            .inc();
    }

    /// The child's process group of `election` was sent SIGKILL.
    pub fn child_killed(&self, election: &str) {
        self.child_kills_total.with_label_values(&[election]).inc();
    }

    /// A watch stream of `election` opened; it counts until the returned
    /// guard drops (when the stream ends or its client goes away).
    pub fn watch_stream_opened(&self, election: &str) -> OpenWatchStream {
        let gauge = self.watch_streams.with_label_values(&[election]);
        gauge.inc();
        OpenWatchStream(gauge)
    }

    /// Create the series of `election` that have a fixed label set, at zero,
    /// so they exist before the first event. Idempotent.
    fn touch(&self, election: &str) {
        for direction in ["gained", "lost"] {
            self.transitions_total
                .with_label_values(&[election, direction]);
        }
        for result in RESULTS {
            self.acquire_attempts_total
                .with_label_values(&[election, result]);
            self.renew_total.with_label_values(&[election, result]);
        }
        self.malformed_records_total.with_label_values(&[election]);
        self.child_running.with_label_values(&[election]);
        self.child_kills_total.with_label_values(&[election]);
        self.child_start_failures_total
            .with_label_values(&[election]);
        self.watch_streams.with_label_values(&[election]);
    }

    /// Every metric in the Prometheus text format, with the leadership gauges
    /// computed from `elections`' current state at `clock.now()`.
    pub fn render<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a watch::Receiver<ElectionState>>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Result<String, prometheus::Error> {
        // A poisoned lock only means another render panicked midway; the
        // gauges are fully rewritten below, so its state does not matter.
        let _guard = self
            .render_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut led = 0;
        for rx in elections {
            // Clone out at once: holding the borrow would block the engine.
            let state = rx.borrow().clone();
            let now = clock.now();
            let name = state.election.as_str();
            self.touch(name);
            let leading = state.is_leader_at(now);
            led += i64::from(leading);
            self.is_leader
                .with_label_values(&[name])
                .set(i64::from(leading));
            self.lease_remaining_seconds
                .with_label_values(&[name])
                .set(state.lease_remaining(now).as_secs_f64());
            self.watching_leader
                .with_label_values(&[name])
                .set(i64::from(state.watching_leader_at(now)));
            match state.fencing_token {
                Some(token) => self
                    .fencing_token
                    .with_label_values(&[name])
                    .set(i64::try_from(token).unwrap_or(i64::MAX)),
                None => {
                    // Absent rather than a made-up 0; an error only means the
                    // series did not exist yet.
                    let _ = self.fencing_token.remove_label_values(&[name]);
                }
            }
        }
        let no_labels: &[&str] = &[];
        self.elections_led.with_label_values(no_labels).set(led);
        if let Some(share) = share {
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.fair_share
                .with_label_values(no_labels)
                .set(count(share.fair_share));
            self.members
                .with_label_values(no_labels)
                .set(count(share.members));
        }
        // One family at a time rather than `Registry::gather`, which builds
        // every family's protobuf form first: at 1,000 elections that is
        // tens of MiB for a moment on every scrape, the largest peak in the
        // daemon's memory. Same output: families by name, series by label
        // values, empty families left out.
        let encoder = TextEncoder::new();
        let mut out = String::with_capacity(self.last_render_len.load(Ordering::Relaxed) * 9 / 8);
        for family in &self.families {
            for mut mf in family.collect() {
                if mf.get_metric().is_empty() {
                    continue;
                }
                mf.mut_metric().sort_by(by_label_values);
                encoder.encode_utf8(std::slice::from_ref(&mf), &mut out)?;
            }
        }
        self.last_render_len.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

/// The order `Registry::gather` gives the series of one family.
fn by_label_values(a: &prometheus::proto::Metric, b: &prometheus::proto::Metric) -> CmpOrdering {
    a.get_label()
        .iter()
        .map(|l| l.value())
        .cmp(b.get_label().iter().map(|l| l.value()))
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("families", &self.families.len())
            .finish_non_exhaustive()
    }
}

impl app_check::Report for Metrics {
    fn probed(&self, up: bool) {
        let failures = self
            .app_check_failures_total
            .with_label_values(&[] as &[&str]);
        if !up {
            failures.inc();
        }
    }

    fn verdict(&self, verdict: Verdict) {
        self.app_check_up
            .with_label_values(&[] as &[&str])
            .set(i64::from(verdict == Verdict::Pass));
    }
}

impl Observer for Metrics {
    fn store_request(
        &self,
        election: &str,
        op: &'static str,
        took: Duration,
        outcome: Outcome<'_>,
    ) {
        self.store_request_duration_seconds
            .with_label_values(&[election, op])
            .observe(took.as_secs_f64());
        if let Outcome::Failed(e) = outcome {
            self.store_errors_total
                .with_label_values(&[election, e.metric_label()])
                .inc();
        }
    }

    fn acquire_attempt(&self, election: &str, outcome: Outcome<'_>) {
        self.acquire_attempts_total
            .with_label_values(&[election, outcome.label()])
            .inc();
    }

    fn renew(&self, election: &str, outcome: Outcome<'_>) {
        self.renew_total
            .with_label_values(&[election, outcome.label()])
            .inc();
    }

    fn transition(&self, election: &str, t: Transition) {
        let direction = match t {
            Transition::Gained => "gained",
            Transition::Lost => "lost",
        };
        self.transitions_total
            .with_label_values(&[election, direction])
            .inc();
    }

    fn malformed_record(&self, election: &str) {
        self.malformed_records_total
            .with_label_values(&[election])
            .inc();
    }
}

/// Run `promtool check metrics` on `text` (tests); panics with its output on
/// problems, or with how to install promtool when it is missing.
#[cfg(any(test, feature = "testing"))]
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot run promtool ({e}); install it with `apt-get install prometheus` (Debian's package provides promtool)"
        ),
    };
    child
        .stdin
        .take()
        .expect("stdin was piped")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "promtool check metrics found problems ({}):\n{stdout}{stderr}\n--- input ---\n{text}",
        out.status
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Instant;
    use crate::election::Role;
    use crate::lease::StoreError;

    fn state(name: &str, role: Role, now: Instant, token: Option<u64>) -> ElectionState {
        let s = ElectionState::example(name, "me", now);
        match (role, token) {
            (Role::Follower, None) => s,
            (Role::Follower, Some(t)) => s.seeing("me", t),
            (role, t) => s.in_tenure(role, t.unwrap_or(1), now),
        }
    }

    /// The value of the sample line starting with `series ` (exact name and labels).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.trim().parse().expect("sample value is a number"))
    }

    #[tokio::test(start_paused = true)]
    async fn gauges_are_computed_at_scrape_time() {
        let clock = Clock::tokio();
        let now = clock.now();
        let (_tx, leader) = watch::channel(state("report", Role::Leader, now, Some(42)));
        let (_tx2, follower) = watch::channel(state("backup", Role::Follower, now, None));
        let m = Metrics::new();

        let text = m.render([&leader, &follower], None, &clock).unwrap();
        assert_eq!(
            sample(&text, "leaderd_is_leader{election=\"report\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "leaderd_is_leader{election=\"backup\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "leaderd_fencing_token{election=\"report\"}"),
            Some(42.0)
        );
        assert_eq!(
            sample(&text, "leaderd_fencing_token{election=\"backup\"}"),
            None
        );
        assert_eq!(
            sample(
                &text,
                "leaderd_lease_remaining_seconds{election=\"report\"}"
            ),
            Some(9.7)
        );

        // The engine publishes nothing, yet past stop_at the gauges drop.
        tokio::time::advance(Duration::from_millis(7_700)).await;
        let text = m.render([&leader, &follower], None, &clock).unwrap();
        assert_eq!(
            sample(&text, "leaderd_is_leader{election=\"report\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "leaderd_lease_remaining_seconds{election=\"report\"}"
            ),
            Some(0.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn watching_leader_holds_while_the_stream_speaks_and_never_while_leading() {
        let clock = Clock::tokio();
        let now = clock.now();
        let quiet_at = now + Duration::from_secs(6);
        let watching = ElectionState {
            hints_until: Some(quiet_at),
            ..state("report", Role::Follower, now, Some(3))
        };
        let (_tx, follower) = watch::channel(watching.clone());
        // A stale value left from before it led does not count.
        let (_tx2, leader) = watch::channel(ElectionState {
            hints_until: Some(quiet_at),
            ..state("backup", Role::Leader, now, Some(4))
        });
        let (_tx3, polling) = watch::channel(state("web", Role::Follower, now, Some(5)));
        let m = Metrics::new();
        let series = |e: &str| format!("leaderd_watching_leader{{election=\"{e}\"}}");

        let text = m
            .render([&follower, &leader, &polling], None, &clock)
            .unwrap();
        assert_eq!(sample(&text, &series("report")), Some(1.0), "{text}");
        assert_eq!(sample(&text, &series("backup")), Some(0.0), "{text}");
        assert_eq!(sample(&text, &series("web")), Some(0.0), "{text}");

        // The engine publishes nothing, yet once the stream went quiet the
        // gauge drops.
        tokio::time::advance(Duration::from_secs(6)).await;
        let text = m.render([&follower], None, &clock).unwrap();
        assert_eq!(sample(&text, &series("report")), Some(0.0), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn render_orders_families_by_name_and_series_by_labels() {
        let clock = Clock::tokio();
        let now = clock.now();
        // Created in an order that neither sort gives.
        let names = ["mid", "zed", "alpha", "beta"];
        let channels: Vec<_> = names
            .iter()
            .map(|n| watch::channel(state(n, Role::Leader, now, Some(1))))
            .collect();
        let m = Metrics::new();
        let text = m
            .render(channels.iter().map(|(_, rx)| rx), None, &clock)
            .unwrap();

        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .collect();
        let mut sorted = families.clone();
        sorted.sort_unstable();
        assert_eq!(families, sorted, "families out of order");
        assert!(families.contains(&"leaderd_build_info"), "{families:?}");
        // Without balance: no fair share, no member count.
        assert_eq!(families.len(), 14, "families with a series: {families:?}");
        assert_eq!(sample(&text, "leaderd_elections_led"), Some(4.0));
        let share = Share {
            led: 4,
            fair_share: 2,
            members: 2,
            elections: 4,
        };
        let with_share = m
            .render(channels.iter().map(|(_, rx)| rx), Some(&share), &clock)
            .unwrap();
        assert_eq!(sample(&with_share, "leaderd_fair_share"), Some(2.0));
        assert_eq!(sample(&with_share, "leaderd_members"), Some(2.0));

        let elections: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("leaderd_is_leader{election=\"")?
                    .split('"')
                    .next()
            })
            .collect();
        assert_eq!(elections, ["alpha", "beta", "mid", "zed"]);
        let results: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("leaderd_renew_total{election=\"alpha\",result=\"")?
                    .split('"')
                    .next()
            })
            .collect();
        assert_eq!(results, ["error", "lost", "ok", "throttled", "timeout"]);
    }

    #[tokio::test(start_paused = true)]
    async fn observer_events_count_and_render_passes_promtool() {
        let clock = Clock::tokio();
        let now = clock.now();
        let (_tx, rx) = watch::channel(state("report", Role::Leader, now, Some(7)));
        let m = Metrics::new();
        let throttled = StoreError::Throttled("slow down".into());
        m.acquire_attempt("report", Outcome::Ok);
        m.renew("report", Outcome::Ok);
        m.renew("report", Outcome::Ok);
        m.renew("report", Outcome::Lost);
        m.renew("report", Outcome::Failed(&throttled));
        m.transition("report", Transition::Gained);
        m.transition("report", Transition::Lost);
        m.store_request("report", "renew", Duration::from_millis(3), Outcome::Ok);
        m.store_request(
            "report",
            "read",
            Duration::from_millis(120),
            Outcome::Failed(&throttled),
        );
        m.malformed_record("report");
        m.child_started("report");
        m.child_exited("report", "exited");
        m.child_killed("report");

        let text = m.render([&rx], None, &clock).unwrap();
        let at = |s: &str| sample(&text, s);
        assert_eq!(
            at("leaderd_renew_total{election=\"report\",result=\"ok\"}"),
            Some(2.0)
        );
        assert_eq!(
            at("leaderd_renew_total{election=\"report\",result=\"lost\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_renew_total{election=\"report\",result=\"throttled\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_renew_total{election=\"report\",result=\"timeout\"}"),
            Some(0.0)
        );
        assert_eq!(
            at("leaderd_acquire_attempts_total{election=\"report\",result=\"ok\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_transitions_total{direction=\"gained\",election=\"report\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_transitions_total{direction=\"lost\",election=\"report\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_store_errors_total{class=\"throttled\",election=\"report\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_store_request_duration_seconds_count{election=\"report\",op=\"read\"}"),
            Some(1.0)
        );
        assert_eq!(
            at(
                "leaderd_store_request_duration_seconds_bucket{election=\"report\",op=\"renew\",le=\"0.005\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_malformed_records_total{election=\"report\"}"),
            Some(1.0)
        );
        assert_eq!(at("leaderd_child_running{election=\"report\"}"), Some(0.0));
        assert_eq!(
            at("leaderd_child_exits_total{election=\"report\",reason=\"exited\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("leaderd_child_kills_total{election=\"report\"}"),
            Some(1.0)
        );
        let version = concat!(
            "leaderd_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"}"
        );
        assert_eq!(at(version), Some(1.0));
        for name in [
            "leaderd_is_leader",
            "leaderd_fencing_token",
            "leaderd_lease_remaining_seconds",
            "leaderd_transitions_total",
            "leaderd_acquire_attempts_total",
            "leaderd_renew_total",
            "leaderd_store_request_duration_seconds",
            "leaderd_store_errors_total",
            "leaderd_malformed_records_total",
            "leaderd_child_running",
            "leaderd_child_exits_total",
            "leaderd_child_kills_total",
            "leaderd_build_info",
        ] {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "no help for {name}"
            );
        }
        promtool_check(&text);
    }

    #[test]
    fn promtool_rejects_a_bad_counter_name() {
        // Proves the check above can fail: a counter without `_total`.
        let bad = "# HELP bad_counter A counter.\n# TYPE bad_counter counter\nbad_counter 1\n";
        let result = std::panic::catch_unwind(|| promtool_check(bad));
        assert!(
            result.is_err(),
            "promtool accepted a counter without _total"
        );
    }
}
