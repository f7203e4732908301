//! Load (issue 5 item 6): 1,000 elections spread over 3 leaderd instances,
//! with no missed renewal and no growth in open file descriptors or memory.
//!
//! Every instance campaigns for every election (so each election has one
//! leader and two followers; whoever starts first wins most of them, so one
//! instance carries nearly all renewals: the harder case for the store), with
//! The default timing (L = 10 s, R = 5 s, P = 1 s): about 2,000 follower
//! reads and 200 renewals a second in all.
//!
//! The store is SQLite (one file shared by the three processes): this test
//! measures leaderd, and SQLite answers in microseconds without a JVM and an
//! HTTP stack in between. DynamoDB Local on the 2-core test machine would
//! spend the CPU on its own request handling and turn the test into a
//! benchmark of the emulator.
//!
//! `LEADERD_TEST_LOAD_SECS` (default 60: CI) sets the measured run after warm-up;
//! the figure is 300. `LEADERD_TEST_LOAD_ELECTIONS` (default 1000).
//!
//! Checked: every sample of `/status` on the three instances shows exactly
//! one leader per election and the same leader throughout (no handover: no
//! lapsed validity); `leaderd_renew_total{result!="ok"}` and
//! `leaderd_transitions_total{direction="lost"}` stay 0; open fds
//! (/proc/PID/fd) and RSS (/proc/PID/status VmRSS) at the end are no higher
//! than after warm-up, within a small tolerance.

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, wait_until};
use common::procfs;

/// Allowed end-of-run excess over the post-warm-up sample.
const FD_TOLERANCE: usize = 16;
const RSS_TOLERANCE_KIB: u64 = 16 * 1024;
const RSS_TOLERANCE_FRACTION: f64 = 0.25;

fn env_u64(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={text:?} is not a whole number")),
        Err(_) => default,
    }
}

fn open_fds(pid: i32) -> usize {
    procfs::open_fds(pid).unwrap_or_else(|| panic!("cannot list /proc/{pid}/fd"))
}

fn rss_kib(pid: i32) -> u64 {
    procfs::status_field(pid, "VmRSS").unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

fn threads(pid: i32) -> usize {
    procfs::status_field(pid, "Threads").map_or(0, |n| n as usize)
}

/// Election name -> holder, from one instance's `/status` (only the
/// elections it leads).
fn led_by(node: &Leaderd) -> Option<Vec<String>> {
    let (status, body) = common::daemon::http(node.port, "GET", "/status", &[])?;
    if status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let elections = json["elections"].as_object()?;
    Some(
        elections
            .iter()
            .filter(|(_, v)| v["is_leader"].as_bool() == Some(true))
            .map(|(k, _)| k.clone())
            .collect(),
    )
}

/// Who leads each election according to the three `/status` answers;
/// `Err` names an election with zero or several leaders.
fn leadership(nodes: &[Leaderd], names: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut map: BTreeMap<String, Vec<String>> =
        names.iter().map(|n| (n.clone(), Vec::new())).collect();
    for node in nodes {
        let led =
            led_by(node).ok_or_else(|| format!("{} did not answer /status", node.identity))?;
        for e in led {
            map.entry(e).or_default().push(node.identity.clone());
        }
    }
    let mut out = BTreeMap::new();
    let mut bad = Vec::new();
    for (e, leaders) in map {
        if leaders.len() == 1 {
            out.insert(e, leaders[0].clone());
        } else {
            bad.push(format!("{e}: {leaders:?}"));
        }
    }
    if bad.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "{} election(s) without exactly one leader, e.g. {}",
            bad.len(),
            bad.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        ))
    }
}

/// Sum of the samples of `metric` whose labels satisfy `keep`.
fn metric_sum(text: &str, metric: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (labels, value)
                }
                None => ("", rest),
            };
            if !value.starts_with(' ') || !keep(labels) {
                return None;
            }
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

struct Sample {
    at: Duration,
    fds: Vec<usize>,
    rss: Vec<u64>,
    threads: Vec<usize>,
}

#[test]
fn a_thousand_elections_over_three_instances() {
    let secs = env_u64("LEADERD_TEST_LOAD_SECS", 60);
    let count = env_u64("LEADERD_TEST_LOAD_ELECTIONS", 1000) as usize;
    assert!(count >= 1, "LEADERD_TEST_LOAD_ELECTIONS must be at least 1");
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let names: Vec<String> = (1..=count).map(|i| format!("e{i:04}")).collect();
    let mut toml = String::new();
    let db = dir.path().join("leases.db");
    let _ = writeln!(
        toml,
        "[store]\nkind = \"sqlite\"\npath = {:?}\n",
        db.display().to_string()
    );
    for n in &names {
        let _ = writeln!(toml, "[[elections]]\nname = \"{n}\"");
    }
    let _ = writeln!(toml, "\n[http]\nprimary = \"{}\"", names[0]);
    let config = dir.path().join("load.toml");
    std::fs::write(&config, toml).expect("write the config file");

    let nodes: Vec<Leaderd> = ["alpha", "bravo", "charlie"]
        .iter()
        .map(|id| {
            Leaderd::start(Spec {
                identity: id,
                args: vec!["--config".into(), config.display().to_string()],
                env: vec![("RUST_LOG".into(), "leaderd=info".into())],
                command: vec![],
                dir: dir.path(),
            })
        })
        .collect();
    for n in &nodes {
        n.wait_http(Duration::from_secs(30));
    }
    let pids: Vec<i32> = nodes.iter().map(Leaderd::pid).collect();

    // Every election acquired once (creations race: one wins each).
    let mut last_err = String::new();
    let settled = wait_until(Duration::from_secs(60), || {
        match leadership(&nodes, &names) {
            Ok(_) => true,
            Err(e) => {
                last_err = e;
                false
            }
        }
    });
    assert!(
        settled.is_some(),
        "elections did not settle within 60 s: {last_err}"
    );
    let first = leadership(&nodes, &names).expect("settled just above");
    let mut spread: BTreeMap<&str, usize> = BTreeMap::new();
    for who in first.values() {
        *spread.entry(who.as_str()).or_default() += 1;
    }
    eprintln!(
        "load: {count} elections settled in {:?}; leaders per instance {spread:?}",
        settled.unwrap_or_default()
    );

    // Warm-up: allocator arenas, connection pool and blocking threads reach
    // their working size; then the baseline.
    let warm_up = Duration::from_secs(15);
    std::thread::sleep(warm_up);
    let t0 = Instant::now();
    let sample = |t0: Instant| Sample {
        at: t0.elapsed(),
        fds: pids.iter().map(|&p| open_fds(p)).collect(),
        rss: pids.iter().map(|&p| rss_kib(p)).collect(),
        threads: pids.iter().map(|&p| threads(p)).collect(),
    };
    let mut samples = vec![sample(t0)];
    let mut checks = 0u32;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(2));
        match leadership(&nodes, &names) {
            Ok(now) => {
                if now != first {
                    let moved: Vec<String> = now
                        .iter()
                        .filter(|(e, who)| first.get(*e) != Some(*who))
                        .take(5)
                        .map(|(e, who)| format!("{e}: {} -> {who}", first[e]))
                        .collect();
                    panic!("leadership moved without a fault (a missed renewal), e.g. {moved:?}");
                }
            }
            Err(e) => panic!("after {:?}: {e}", t0.elapsed()),
        }
        checks += 1;
        if samples
            .last()
            .is_some_and(|s| t0.elapsed() - s.at >= Duration::from_secs(10))
        {
            samples.push(sample(t0));
        }
    }
    samples.push(sample(t0));

    let mut failures = Vec::new();
    for n in &nodes {
        let (status, text) = n.get("/metrics").expect("metrics answer");
        assert_eq!(status, 200);
        let not_ok = metric_sum(&text, "leaderd_renew_total", |l| {
            !l.contains("result=\"ok\"")
        });
        let ok = metric_sum(&text, "leaderd_renew_total", |l| {
            l.contains("result=\"ok\"")
        });
        let lost = metric_sum(&text, "leaderd_transitions_total", |l| {
            l.contains("direction=\"lost\"")
        });
        eprintln!(
            "load: {}: renew ok {ok}, renew not ok {not_ok}, transitions lost {lost}",
            n.identity
        );
        if not_ok != 0.0 || lost != 0.0 {
            failures.push(format!(
                "{}: {not_ok} renewal(s) not ok, {lost} leadership(s) lost",
                n.identity
            ));
        }
        let led = spread.get(n.identity.as_str()).copied().unwrap_or(0);
        if led > 0 && ok == 0.0 {
            failures.push(format!(
                "{} leads {led} election(s) but renewed none",
                n.identity
            ));
        }
    }

    for s in &samples {
        eprintln!(
            "load: +{:>4} s  fds {:?}  rss KiB {:?}  threads {:?}",
            s.at.as_secs(),
            s.fds,
            s.rss,
            s.threads
        );
    }
    let (base, last) = (&samples[0], samples.last().expect("two samples at least"));
    for (i, n) in nodes.iter().enumerate() {
        if last.fds[i] > base.fds[i] + FD_TOLERANCE {
            failures.push(format!(
                "{}: open fds grew from {} to {}",
                n.identity, base.fds[i], last.fds[i]
            ));
        }
        let allowed =
            base.rss[i] + RSS_TOLERANCE_KIB + (base.rss[i] as f64 * RSS_TOLERANCE_FRACTION) as u64;
        if last.rss[i] > allowed {
            failures.push(format!(
                "{}: RSS grew from {} KiB to {} KiB",
                n.identity, base.rss[i], last.rss[i]
            ));
        }
    }
    eprintln!(
        "load: {checks} /status checks over {} s after a {} s warm-up",
        t0.elapsed().as_secs(),
        warm_up.as_secs()
    );
    assert!(
        failures.is_empty(),
        "load run failed:\n{}",
        failures.join("\n")
    );
}
