//! Unit tests of the metrics: names, labels, order, scrape-time gauges
//! and promtool.

use std::time::Duration;

use super::{Metrics, Shape, promtool_check};
use crate::balance::Share;
use crate::clock::{Clock, Instant};
use crate::driver::board;
use crate::election::{ElectionState, Observer, Outcome, Role, Transition};
use crate::lease::StoreError;

pub(super) fn state(name: &str, role: Role, now: Instant, token: Option<u64>) -> ElectionState {
    let s = ElectionState::example(name, "me", now);
    match (role, token) {
        (Role::Follower, None) => s,
        (Role::Follower, Some(t)) => s.seeing("me", t),
        (role, t) => s.in_tenure(role, t.unwrap_or(1), now),
    }
}

/// The value of the sample line starting with `series ` (exact name and labels).
pub(super) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("sample value is a number"))
}

#[tokio::test(start_paused = true)]
async fn gauges_are_computed_at_scrape_time() {
    let clock = Clock::tokio();
    let now = clock.now();
    let (_tx, leader) = board::channel(state("report", Role::Leader, now, Some(42)));
    let (_tx2, follower) = board::channel(state("backup", Role::Follower, now, None));
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
    let (_tx, follower) = board::channel(watching.clone());
    // A stale value left from before it led does not count.
    let (_tx2, leader) = board::channel(ElectionState {
        hints_until: Some(quiet_at),
        ..state("backup", Role::Leader, now, Some(4))
    });
    let (_tx3, polling) = board::channel(state("web", Role::Follower, now, Some(5)));
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
        .map(|n| board::channel(state(n, Role::Leader, now, Some(1))))
        .collect();
    let m = Metrics::shaped(Shape {
        sessions: false,
        job: Some("mid".into()),
        ..Shape::default()
    });
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
    assert_eq!(families.len(), 18, "families with a series: {families:?}");
    // Every election has series of its own: nothing is counted together.
    assert!(!families.contains(&"leaderd_elections"), "{families:?}");
    assert!(!text.contains("#others"), "{text}");
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

/// One event of every kind the observer and the supervisor report, for
/// "report".
fn feed_every_kind_of_event(m: &Metrics) {
    let throttled = StoreError::Throttled("slow down".into());
    m.acquire_attempt("report", Outcome::Ok);
    m.renew("report", Outcome::Ok);
    m.renew("report", Outcome::Ok);
    m.renew("report", Outcome::Lost);
    m.renew("report", Outcome::Failed(&throttled));
    m.transition("report", Transition::Gained);
    m.transition("report", Transition::Lost);
    m.lease_lost("report");
    m.preempted("report");
    m.renew_sent("report", Duration::from_millis(3));
    m.renew_sent("report", Duration::from_millis(700));
    m.store_request("report", "renew", Duration::from_millis(3), Outcome::Ok);
    m.store_request(
        "report",
        "read",
        Duration::from_millis(120),
        Outcome::Failed(&throttled),
    );
    m.malformed_record("report");
    m.unknown_format_record("report");
    m.unknown_format_record("report");
    m.child_started("report");
    m.child_exited("report", "exited");
    m.child_killed("report");
}

/// The series [`feed_every_kind_of_event`] moves, and their values after it.
const EVENT_COUNTS: &[(&str, Option<f64>)] = &[
    (
        "leaderd_renew_total{election=\"report\",result=\"ok\"}",
        Some(2.0),
    ),
    (
        "leaderd_renew_total{election=\"report\",result=\"lost\"}",
        Some(1.0),
    ),
    (
        "leaderd_renew_total{election=\"report\",result=\"throttled\"}",
        Some(1.0),
    ),
    (
        "leaderd_renew_total{election=\"report\",result=\"timeout\"}",
        Some(0.0),
    ),
    (
        "leaderd_acquire_attempts_total{election=\"report\",result=\"ok\"}",
        Some(1.0),
    ),
    (
        "leaderd_transitions_total{direction=\"gained\",election=\"report\"}",
        Some(1.0),
    ),
    (
        "leaderd_transitions_total{direction=\"lost\",election=\"report\"}",
        Some(1.0),
    ),
    (
        "leaderd_store_errors_total{class=\"throttled\",election=\"report\"}",
        Some(1.0),
    ),
    (
        "leaderd_store_request_duration_seconds_count{election=\"report\",op=\"read\"}",
        Some(1.0),
    ),
    (
        "leaderd_store_request_duration_seconds_bucket{election=\"report\",op=\"renew\",le=\"0.005\"}",
        Some(1.0),
    ),
    (
        "leaderd_malformed_records_total{election=\"report\"}",
        Some(1.0),
    ),
    (
        "leaderd_unknown_format_records_total{election=\"report\"}",
        Some(2.0),
    ),
    ("leaderd_child_running{election=\"report\"}", Some(0.0)),
    (
        "leaderd_child_exits_total{election=\"report\",reason=\"exited\"}",
        Some(1.0),
    ),
    ("leaderd_child_kills_total{election=\"report\"}", Some(1.0)),
    ("leaderd_leases_lost_total{election=\"report\"}", Some(1.0)),
    ("leaderd_preemptions_total{election=\"report\"}", Some(1.0)),
    ("leaderd_renew_lag_seconds_bucket{le=\"0.005\"}", Some(1.0)),
    ("leaderd_renew_lag_seconds_bucket{le=\"0.5\"}", Some(1.0)),
    ("leaderd_renew_lag_seconds_bucket{le=\"1\"}", Some(2.0)),
    ("leaderd_renew_lag_seconds_count", Some(2.0)),
];

#[tokio::test(start_paused = true)]
async fn observer_events_count_and_render_passes_promtool() {
    let clock = Clock::tokio();
    let now = clock.now();
    let (_tx, rx) = board::channel(state("report", Role::Leader, now, Some(7)));
    let m = Metrics::new();
    feed_every_kind_of_event(&m);

    let text = m.render([&rx], None, &clock).unwrap();
    let at = |s: &str| sample(&text, s);
    for &(series, value) in EVENT_COUNTS {
        assert_eq!(at(series), value, "{series}");
    }
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
        "leaderd_unknown_format_records_total",
        "leaderd_child_running",
        "leaderd_child_exits_total",
        "leaderd_child_kills_total",
        "leaderd_leases_lost_total",
        "leaderd_preemptions_total",
        "leaderd_renew_lag_seconds",
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

#[tokio::test(start_paused = true)]
async fn only_series_that_can_move_exist_before_their_first_event() {
    let clock = Clock::tokio();
    let now = clock.now();
    let channels: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| board::channel(state(n, Role::Follower, now, Some(1))))
        .collect();
    let lines = |shape: Shape| {
        let m = Metrics::shaped(shape);
        let text = m
            .render(channels.iter().map(|(_, rx)| rx), None, &clock)
            .unwrap();
        let series = |prefix: &str| {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        };
        (
            series("leaderd_child_running{"),
            series("leaderd_renew_total{"),
        )
    };
    // Without sessions, each election is renewed on its own; the job runs
    // under "b" only.
    let (child, renew) = lines(Shape {
        sessions: false,
        job: Some("b".into()),
        ..Shape::default()
    });
    assert_eq!(child, [r#"leaderd_child_running{election="b"}"#]);
    assert_eq!(renew.len(), 10, "{renew:?}");
    // With sessions, only the session is renewed; no job, no child series.
    let (child, renew) = lines(Shape {
        sessions: true,
        job: None,
        ..Shape::default()
    });
    assert!(child.is_empty(), "{child:?}");
    assert_eq!(renew.len(), 5, "{renew:?}");
    assert!(
        renew.iter().all(|s| s.contains(r##"election="#session""##)),
        "{renew:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_scrape_comes_in_pieces_with_each_family_whole() {
    let clock = Clock::tokio();
    let now = clock.now();
    let channels: Vec<_> = (0..2_000)
        .map(|i| board::channel(state(&format!("e-{i:04}"), Role::Follower, now, Some(i))))
        .collect();
    let m = Metrics::new();
    for i in 0..2_000 {
        m.store_request(
            &format!("e-{i:04}"),
            "read",
            Duration::from_millis(2),
            Outcome::Ok,
        );
    }
    let pieces: Vec<String> = Metrics::scrape(&m, channels.iter().map(|(_, rx)| rx), None, &clock)
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(pieces.len() > 20, "{} pieces", pieces.len());
    // A piece stops after the election that fills it: at most one
    // election's lines (a histogram's 16) past the mark.
    for piece in &pieces {
        assert!(piece.len() < 36 * 1024, "a piece of {} bytes", piece.len());
        assert!(piece.ends_with('\n'));
    }
    let text = pieces.concat();
    // Each family's lines together, under one head.
    let mut seen = Vec::new();
    let mut current = "";
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| f.ends_with("_seconds"))
            .unwrap_or(name);
        if family != current {
            assert!(!seen.contains(&family), "{family} split in two");
            seen.push(family);
            current = family;
        }
    }
    let heads = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert_eq!(heads, seen.len());
    let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("leaderd_is_leader{"), 2_000);
    assert_eq!(count("leaderd_acquire_attempts_total{"), 10_000);
    assert_eq!(
        count("leaderd_store_request_duration_seconds_bucket{"),
        28_000
    );
    assert_eq!(
        m.render(channels.iter().map(|(_, rx)| rx), None, &clock)
            .unwrap(),
        text
    );
    promtool_check(&text);
}

#[test]
fn the_table_writes_what_the_prometheus_encoder_writes() {
    use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

    let registry = Registry::new();
    let buckets = vec![
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let latency = HistogramVec::new(
        HistogramOpts::new(
            "leaderd_store_request_duration_seconds",
            "Duration of lease store requests in seconds, by operation.",
        )
        .buckets(buckets),
        &["election", "op"],
    )
    .unwrap();
    let errors = IntCounterVec::new(
        Opts::new(
            "leaderd_store_errors_total",
            "Failed lease store requests, by error class; a failed write condition is not an error.",
        ),
        &["election", "class"],
    )
    .unwrap();
    registry.register(Box::new(latency.clone())).unwrap();
    registry.register(Box::new(errors.clone())).unwrap();

    let m = Metrics::new();
    let throttled = StoreError::Throttled("slow down".into());
    let timings = [
        ("b", "read", 0.0004),
        ("a", "renew", 0.003),
        ("a", "read", 0.01),
        ("a", "read", 0.7),
        ("b", "read", 42.0),
    ];
    for (election, op, secs) in timings {
        let outcome = if secs > 1.0 {
            Outcome::Failed(&throttled)
        } else {
            Outcome::Ok
        };
        m.store_request(election, op, Duration::from_secs_f64(secs), outcome);
        latency.with_label_values(&[election, op]).observe(secs);
        if secs > 1.0 {
            errors.with_label_values(&[election, "throttled"]).inc();
        }
    }
    let mut expected = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut expected)
        .unwrap();
    let expected = String::from_utf8(expected).unwrap();
    let ours = m.render([], None, &Clock::boot()).unwrap();
    let part = |text: &str| {
        text.lines()
            .filter(|l| l.contains("leaderd_store_"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(part(&ours), part(&expected));
}
