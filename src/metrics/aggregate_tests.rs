//! Unit tests of the elections counted together: which series exist on
//! either side of the limit, what the others' series count, and the size
//! of a scrape at ten thousand elections.

use std::time::Duration;

use super::tests::{sample, state};
use super::{Metrics, OTHERS_LABEL, OwnSeries, Shape, promtool_check};
use crate::clock::{Clock, Instant};
use crate::driver::board;
use crate::election::{ElectionState, Observer, Outcome, Role, Transition};

/// The sample lines of `text` (series), without the comments.
fn series(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect()
}

/// A follower whose holder's events reach it (watching).
fn watching(name: &str, now: Instant) -> ElectionState {
    ElectionState {
        hints_until: Some(now + Duration::from_secs(6)),
        ..state(name, Role::Follower, now, Some(2))
    }
}

/// The series of the elections counted together in the test below, and
/// their values: one label, their counts summed.
const OTHERS: [(&str, f64); 16] = [
    (
        r##"leaderd_transitions_total{direction="gained",election="#others"}"##,
        3.0,
    ),
    (
        r##"leaderd_transitions_total{direction="lost",election="#others"}"##,
        0.0,
    ),
    (r##"leaderd_leases_lost_total{election="#others"}"##, 1.0),
    (
        r##"leaderd_renew_total{election="#others",result="ok"}"##,
        1.0,
    ),
    (
        r##"leaderd_renew_total{election="#others",result="error"}"##,
        0.0,
    ),
    (
        r##"leaderd_acquire_attempts_total{election="#others",result="ok"}"##,
        0.0,
    ),
    (
        r##"leaderd_store_request_duration_seconds_count{election="#others",op="read"}"##,
        3.0,
    ),
    (r##"leaderd_watch_streams{election="#others"}"##, 1.0),
    (
        r##"leaderd_renew_total{election="#session",result="ok"}"##,
        1.0,
    ),
    // By state, every state present.
    (
        r##"leaderd_elections{election="#others",state="leading"}"##,
        2.0,
    ),
    (
        r##"leaderd_elections{election="#others",state="watching"}"##,
        1.0,
    ),
    (
        r##"leaderd_elections{election="#others",state="polling"}"##,
        1.0,
    ),
    (
        r##"leaderd_elections{election="#others",state="no_leader"}"##,
        1.0,
    ),
    (
        r##"leaderd_elections{election="#others",state="stopping"}"##,
        1.0,
    ),
    (
        r##"leaderd_elections{election="#others",state="confirming"}"##,
        1.0,
    ),
    // Led counts every election.
    ("leaderd_elections_led", 3.0),
];

#[tokio::test(start_paused = true)]
async fn above_the_limit_only_the_kept_elections_have_series_and_the_others_are_counted_together() {
    let clock = Clock::tokio();
    let now = clock.now();
    let elections = [
        state("report", Role::Leader, now, Some(9)),
        state("web", Role::Follower, now, Some(3)),
        state("a", Role::Leader, now, Some(1)),
        state("b", Role::Leader, now, Some(1)),
        watching("c", now),
        state("d", Role::Follower, now, Some(4)),
        state("e", Role::Follower, now, None),
        state("f", Role::Stopping, now, Some(5)),
        state("g", Role::Confirming, now, Some(6)),
    ];
    let channels: Vec<_> = elections.into_iter().map(board::channel).collect();
    let m = Metrics::shaped(Shape {
        sessions: false,
        job: Some("web".into()),
        own_series: OwnSeries::decide(channels.len(), 8, ["report", "web"]),
    });
    for e in ["a", "b", "c"] {
        m.transition(e, Transition::Gained);
        m.store_request(e, "read", Duration::from_millis(2), Outcome::Ok);
    }
    m.transition("report", Transition::Gained);
    m.lease_lost("a");
    m.renew("b", Outcome::Ok);
    m.renew("#session", Outcome::Ok);
    let _stream = m.watch_stream_opened("c");

    let text = m
        .render(channels.iter().map(|(_, rx)| rx), None, &clock)
        .unwrap();
    let at = |s: &str| sample(&text, s);
    // The kept elections as below the limit.
    assert_eq!(at(r#"leaderd_is_leader{election="report"}"#), Some(1.0));
    assert_eq!(at(r#"leaderd_is_leader{election="web"}"#), Some(0.0));
    assert_eq!(
        at(r#"leaderd_transitions_total{direction="gained",election="report"}"#),
        Some(1.0)
    );
    // The others: one label, their counts summed.
    for (series, value) in OTHERS {
        assert_eq!(at(series), Some(value), "{series} in\n{text}");
    }
    // No series names an election counted together.
    for name in ["a", "b", "c", "d", "e", "f", "g"] {
        let label = format!("election=\"{name}\"");
        assert!(!text.contains(&label), "{label} in\n{text}");
    }
    // Per-election gauges have no sum: only the kept ones have them.
    assert!(
        !text.contains(r##"leaderd_is_leader{election="#others"}"##),
        "{text}"
    );
    promtool_check(&text);
}

#[tokio::test(start_paused = true)]
async fn at_the_limit_every_election_has_its_own_series() {
    let clock = Clock::tokio();
    let now = clock.now();
    let channels: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| board::channel(state(n, Role::Leader, now, Some(1))))
        .collect();
    let m = Metrics::shaped(Shape {
        own_series: OwnSeries::decide(channels.len(), 3, ["a"]),
        ..Shape::default()
    });
    m.transition("c", Transition::Gained);
    let text = m
        .render(channels.iter().map(|(_, rx)| rx), None, &clock)
        .unwrap();
    assert!(!text.contains(OTHERS_LABEL), "{text}");
    assert!(!text.contains("leaderd_elections{"), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"leaderd_transitions_total{direction="gained",election="c"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"leaderd_is_leader{election="b"}"#),
        Some(1.0)
    );
}

/// A scrape of `n` elections, each of which led once (a read, a create
/// and a renew timed): the series an election without sessions has.
fn scrape_of(n: usize, own: OwnSeries, clock: &Clock) -> String {
    let now = clock.now();
    let names: Vec<String> = (0..n).map(|i| format!("election-{i:05}")).collect();
    let channels: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| board::channel(state(name, Role::Leader, now, Some(i as u64))))
        .collect();
    let m = Metrics::shaped(Shape {
        sessions: false,
        job: Some(names[0].clone()),
        own_series: own,
    });
    for name in &names {
        for op in ["read", "create", "renew"] {
            m.store_request(name, op, Duration::from_millis(3), Outcome::Ok);
        }
        m.acquire_attempt(name, Outcome::Ok);
        m.renew(name, Outcome::Ok);
        m.transition(name, Transition::Gained);
    }
    m.render(channels.iter().map(|(_, rx)| rx), None, clock)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_elections_scrape_within_a_megabyte_and_ten_thousand_series() {
    let clock = Clock::tokio();
    // By default: a limit of 100, and the primary kept.
    let by_default = |n: usize| OwnSeries::decide(n, 100, ["election-00000"]);
    for n in [100, 1_000, 10_000] {
        let every = scrape_of(n, OwnSeries::Every, &clock);
        let limited = scrape_of(n, by_default(n), &clock);
        // The figures (`--no-capture`): every election's own series against
        // the default.
        println!(
            "{n} elections: every election {} bytes, {} series; by default {} bytes, {} series",
            every.len(),
            series(&every).len(),
            limited.len(),
            series(&limited).len()
        );
        if n == 100 {
            assert_eq!(limited, every, "at the limit nothing changes");
        }
    }
    let text = scrape_of(10_000, by_default(10_000), &clock);
    assert!(text.len() <= 1_000_000, "{} bytes", text.len());
    assert!(
        series(&text).len() <= 10_000,
        "{} series",
        series(&text).len()
    );
    assert_eq!(sample(&text, "leaderd_elections_led"), Some(10_000.0));
    assert_eq!(
        sample(
            &text,
            r##"leaderd_elections{election="#others",state="leading"}"##
        ),
        Some(9_999.0)
    );
    assert_eq!(
        sample(
            &text,
            r##"leaderd_transitions_total{direction="gained",election="#others"}"##
        ),
        Some(9_999.0)
    );
    promtool_check(&text);
}
