//! The session sweep on SQLite never deletes a live session, whatever the
//! sweeping daemon's wall clock says.
//!
//! Two `leaderd run --sessions` processes share one SQLite file: `steady`
//! leads ten elections through its session and runs the job; `skewed`,
//! whose wall clock is two days ahead (libfaketime, its monotonic and
//! boot-time clocks untouched), follows them and leads an election of its
//! own, so it opens a session and sweeps the session records at once. By
//! wall clock alone every record `steady` writes looks two days stale to
//! it. The sweep must leave `steady`'s session alone (it is renewed every
//! R, so its `rvn` never stays unchanged for a takeover wait); its debug
//! line shows that it ran, and timed that session rather than skip it.
//!
//! Timing (see `sessions::harness::TIMING`): L = 5 s, R = 1 s.

use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use crate::cluster::libfaketime;
use crate::common::daemon::{Leaderd, Spec, wait_until};
use crate::sessions::harness::{Cluster, Kind, L, TIMING, elections_of, sessions_opened};

/// The ten elections `steady` leads; the first is its primary (the job).
const TEN: [&str; 10] = [
    "e01", "e02", "e03", "e04", "e05", "e06", "e07", "e08", "e09", "e10",
];

/// How far ahead `skewed`'s wall clock runs.
const SKEW: Duration = Duration::from_secs(2 * 24 * 3600);

/// The shift must have taken, or the scenario proves nothing: the first
/// word of `node`'s log is leaderd's (wall-clock) timestamp.
fn assert_clock_ahead(node: &Leaderd) {
    let log = node.log();
    let stamp = log.split_whitespace().next().unwrap_or_default();
    let logged = humantime::parse_rfc3339(stamp).unwrap_or_else(|e| {
        panic!("the first log word {stamp:?} is not a timestamp ({e}); log:\n{log}")
    });
    let ahead = logged
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .as_secs_f64();
    assert!(
        (ahead - SKEW.as_secs_f64()).abs() < 300.0,
        "skewed logs a clock {ahead:.0} s ahead of the real one, not {} s \
         (libfaketime not applied?)",
        SKEW.as_secs()
    );
}

/// Whether `steady` leads each election of `tokens` now with its token
/// there; if not, what it shows instead.
fn leads_all_ten(steady: &Leaderd, tokens: &[(String, u64)]) -> Result<(), String> {
    let views =
        elections_of(steady).ok_or_else(|| "steady's /status does not answer".to_owned())?;
    for (name, token) in tokens {
        match views.get(name) {
            Some(v) if v.is_leader && v.token == Some(*token) => {}
            other => return Err(format!("election {name}: {other:?}, not led with {token}")),
        }
    }
    Ok(())
}

/// `(timing, deleted)` of each sweep `log` tells of (its debug lines).
fn sweeps(log: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` in {line:?}"))
    };
    log.lines()
        .filter(|l| l.contains("swept the session records"))
        .map(|l| (field(l, "timing"), field(l, "deleted")))
        .collect()
}

#[test]
fn a_daemon_whose_wall_clock_is_two_days_ahead_deletes_no_live_session() {
    let _ = libfaketime();
    let mut c = Cluster::new(Kind::Sqlite);
    c.start("steady", &TEN, None);
    wait_until(Duration::from_secs(30), || {
        c.tokens_of("steady").len() == TEN.len() && c.job_running("steady")
    })
    .unwrap_or_else(|| panic!("steady does not lead all ten elections with its job running"));
    let tokens: Vec<(String, u64)> = c.tokens_of("steady").into_iter().collect();
    let session = c.only_session("steady");

    let mut args = c.store.args(None);
    args.extend(TIMING.iter().map(|s| s.to_string()));
    args.push("--sessions".into());
    // Its own election first: it leads it at once, so it opens a session
    // (and sweeps); then it follows steady's ten.
    for e in std::iter::once("solo").chain(TEN) {
        args.extend(["--election".to_owned(), e.to_owned()]);
    }
    let env = [
        ("LD_PRELOAD", libfaketime().display().to_string()),
        ("FAKETIME", format!("+{}d", SKEW.as_secs() / 86_400)),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        // The sweep's line says what it read, timed and deleted.
        ("RUST_LOG", "info,leaderd::driver::session=debug".to_owned()),
    ];
    let skewed = Leaderd::start(Spec {
        identity: "skewed",
        args,
        env: env.map(|(k, v)| (k.to_owned(), v)).to_vec(),
        // No job: Python's sleep fails under libfaketime, and the skewed
        // daemon's own job is not what this is about.
        command: vec![],
        dir: c.dir.path(),
    });
    skewed.wait_http(Duration::from_secs(20));
    c.nodes.push(skewed);
    assert_clock_ahead(c.node("skewed"));
    wait_until(Duration::from_secs(20), || {
        sessions_opened(&c.node("skewed").log()).len() == 1
    })
    .unwrap_or_else(|| panic!("skewed did not open its session"));
    let opened = Instant::now();

    // Watched for three leases from the opening of the skewed daemon's
    // session: its first sweep runs then, and steady's renewals every R
    // would have failed within one.
    while opened.elapsed() < 3 * L {
        let waited = opened.elapsed();
        let row = c.store.row(&session);
        assert!(
            row.as_ref()
                .is_some_and(|r| r.holder.as_deref() == Some("steady")),
            "{waited:?} after skewed opened its session, steady's live session {session} \
             is {row:?}"
        );
        if let Err(e) = leads_all_ten(c.node("steady"), &tokens) {
            panic!("{waited:?} after skewed opened its session, a tenure was lost: {e}");
        }
        sleep(Duration::from_millis(200));
    }
    let sweeps = sweeps(&c.node("skewed").log());
    eprintln!("skewed's sweeps, (timing, deleted) each: {sweeps:?}");
    assert!(
        !sweeps.is_empty() && sweeps[0].0 >= 1 && sweeps.iter().all(|s| s.1 == 0),
        "skewed should have swept once its session was open, timing steady's session and \
         deleting nothing: (timing, deleted) of each sweep: {sweeps:?}"
    );
    let log = c.node("steady").log();
    for lost in ["lease lost", "session lost", "session not renewed in time"] {
        assert!(!log.contains(lost), "steady logged {lost:?}");
    }
    assert_eq!(sessions_opened(&log), [session]);
    assert!(c.job_running("steady"), "steady's job does not run");
    c.stop_all();
    c.check_history();
}
