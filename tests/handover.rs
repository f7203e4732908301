//! Planned handover through the leader's hints, with real processes on
//! SQLite, on DynamoDB Local and on PostgreSQL: followers watch the leader
//! (`/v1/elections/{election}/watch`) and take over as soon as it releases,
//! not at their next poll; `resign --to` hands the lease to one candidate;
//! and hints that are lost, late, replayed or forged, a watch that hangs and
//! addresses nobody can reach delay a takeover at most, never make two
//! leaders (the jobs' history shows no overlap and rising tokens).
//!
//! The poll interval P is 8 s here, so that a takeover through a hint
//! (milliseconds) cannot be mistaken for one through a poll (up to 8 s).

use crate::common;
#[path = "handover/forged.rs"]
mod forged;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, leaderd_bin, leaders, output_within, wait_until};
use common::history;
use common::stream::{self, fake_watch_server, send_chunk, stream_head};
use nix::sys::signal::Signal;

/// L = 4 s, R = 2 s, P = 8 s, G = 1 s (R + G + M + L·D < L).
const TIMING: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--renew-interval",
    "2s",
    "--retry-interval",
    "8s",
    "--kill-grace",
    "1s",
];
const L: Duration = Duration::from_secs(4);
const P: Duration = Duration::from_secs(8);
const TOKEN: &str = "handover-test-token";

/// A handover through a hint takes milliseconds; through a poll, up to P.
const HINT_BOUND: Duration = Duration::from_secs(2);

/// Where the leases live.
#[derive(Debug, Clone, Copy)]
enum Store {
    Sqlite,
    DynamoDbLocal,
    Postgres,
}

struct Cluster {
    /// Declared before `dir`: fields drop in order, and a failing test
    /// prints each instance's log as it drops, from files in `dir`.
    nodes: Vec<Leaderd>,
    dir: tempfile::TempDir,
    history: std::path::PathBuf,
    /// The store arguments and environment every instance gets.
    store_args: Vec<String>,
    store_env: Vec<(String, String)>,
    /// The timing flags every instance gets.
    timing: Vec<String>,
}

impl Cluster {
    /// Instances with the timing of [`TIMING`].
    fn new(store: Store) -> Cluster {
        Cluster::with_timing(store, &TIMING)
    }

    /// Instances with these timing flags.
    fn with_timing(store: Store, timing: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = dir.path().join("history.log");
        let (store_args, store_env) = match store {
            Store::Sqlite => (
                vec![
                    "--store-path".to_string(),
                    dir.path().join("leases.db").display().to_string(),
                ],
                vec![],
            ),
            Store::DynamoDbLocal => {
                let emulator = common::emulators::shared_dynamodb_local();
                (
                    vec![
                        "--store".to_string(),
                        "dynamodb".into(),
                        "--endpoint-url".into(),
                        emulator.endpoint.clone(),
                        "--table".into(),
                        common::unique_name("handover"),
                    ],
                    // Every instance may create the table: creation is
                    // idempotent.
                    vec![(
                        "LEADERD_STORE__CREATE_TABLE".to_string(),
                        "true".to_string(),
                    )],
                )
            }
            Store::Postgres => (
                common::postgres::shared_postgres().args(&common::unique_name("handover")),
                // Every instance may create the table, as on DynamoDB.
                vec![(
                    "LEADERD_STORE__CREATE_TABLE".to_string(),
                    "true".to_string(),
                )],
            ),
        };
        Cluster {
            dir,
            history,
            store_args,
            store_env,
            timing: timing.iter().map(|s| s.to_string()).collect(),
            nodes: Vec::new(),
        }
    }

    fn start(&mut self, identity: &str, extra: &[&str]) {
        let mut args = self.store_args.clone();
        args.extend(self.timing.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--election".into(), "report".into()]);
        let mut env = self.store_env.clone();
        env.push(("LEADERD_HTTP__ADMIN_TOKEN".into(), TOKEN.into()));
        let node = Leaderd::start(Spec {
            identity,
            args,
            env,
            command: common::job_command(&self.history),
            dir: self.dir.path(),
        });
        node.wait_http(Duration::from_secs(20));
        self.nodes.push(node);
    }

    fn leaders(&self) -> Vec<String> {
        leaders(&self.nodes.iter().collect::<Vec<_>>())
    }

    /// Wait for exactly one leader; its identity.
    fn one_leader(&self, limit: Duration) -> String {
        wait_until(limit, || self.leaders().len() == 1)
            .unwrap_or_else(|| panic!("no single leader: {:?}", self.leaders()));
        self.leaders()[0].clone()
    }

    fn node(&self, identity: &str) -> &Leaderd {
        self.nodes
            .iter()
            .find(|n| n.identity == identity)
            .expect("a node of that identity")
    }

    fn remove(&mut self, identity: &str) -> Leaderd {
        let i = self
            .nodes
            .iter()
            .position(|n| n.identity == identity)
            .expect("a node of that identity");
        self.nodes.remove(i)
    }

    /// Whether `identity`'s last job wrote its `start` line and not yet its
    /// `end` line.
    fn job_running(&self, identity: &str) -> bool {
        let log = std::fs::read_to_string(&self.history).unwrap_or_default();
        let last = log
            .lines()
            .rev()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() >= 3 && f[2] == identity)
            .filter_map(|f| match f[1] {
                "start" => Some(true),
                "end" => Some(false),
                _ => None,
            })
            .next();
        last == Some(true)
    }

    /// The jobs' history: no two tenures overlap, tokens rise.
    fn check_history(&self) -> history::Summary {
        let log = std::fs::read_to_string(&self.history).unwrap_or_default();
        history::check(&log).unwrap_or_else(|v| panic!("unsafe history: {v:?}\n{log}"))
    }
}

/// `name{election="report"}` of `node`, if it answers.
fn gauge(node: &Leaderd, name: &str) -> Option<f64> {
    node.metric(&format!("{name}{{election=\"report\"}}"))
}

/// `leaderd_watching_leader{election="report"}` of `node`, if it answers.
fn watching(node: &Leaderd) -> Option<f64> {
    gauge(node, "leaderd_watching_leader")
}

/// Wait until the leader's job runs (it wrote its `start` line, so it
/// handles SIGTERM) and every follower hears the leader's hints, as its
/// metric says: one renewal (R = 2 s) after it found the leader, or after
/// sitting out a lease when it has just resigned; a relay may add its delay.
/// A follower that asked a moment before the leader took office (or whose
/// first attempt timed out on a busy machine) tries again after P, then 2P:
/// the limit lets two attempts fail.
fn let_hints_flow(cluster: &Cluster) {
    let limit = P * 3 + L;
    wait_until(limit, || {
        let leaders = cluster.leaders();
        leaders.len() == 1
            && cluster.job_running(&leaders[0])
            && cluster
                .nodes
                .iter()
                .filter(|n| n.identity != leaders[0])
                .all(|n| watching(n) == Some(1.0))
    })
    .unwrap_or_else(|| {
        let seen: Vec<_> = cluster
            .nodes
            .iter()
            .map(|n| (n.identity.clone(), watching(n)))
            .collect();
        panic!(
            "the followers do not all watch the leader {:?} within {limit:?}: {seen:?}",
            cluster.leaders()
        )
    });
    // The leader counts them too (a stream whose follower has just gone
    // may count until the leader's next event finds it closed).
    let leader = cluster.leaders()[0].clone();
    // With sessions (the default) the followers hold the daemon's stream,
    // counted under `#session`; without, the election's own.
    let streams = ["report", "#session"]
        .iter()
        .filter_map(|e| {
            cluster
                .node(&leader)
                .metric(&format!("leaderd_watch_streams{{election=\"{e}\"}}"))
        })
        .reduce(|a, b| a + b);
    let followers = (cluster.nodes.len() - 1) as f64;
    assert!(
        streams.is_some_and(|n| n >= followers),
        "the leader {leader} counts {streams:?} watch streams, {followers} followers watch it"
    );
}

fn sigterm_of_the_leader_hands_over_without_waiting_for_a_poll(store: Store) {
    let mut cluster = Cluster::new(store);
    for id in ["alpha", "bravo", "charlie"] {
        cluster.start(id, &[]);
    }
    for round in 0..3 {
        let leader = cluster.one_leader(L * 3 + P);
        let_hints_flow(&cluster);
        let mut old = cluster.remove(&leader);
        old.signal(Signal::SIGTERM);
        let took = wait_until(P, || cluster.leaders().len() == 1)
            .unwrap_or_else(|| panic!("round {round}: nobody took over from {leader}"));
        assert!(
            took < HINT_BOUND,
            "round {round}: took {took:?} after SIGTERM of {leader} (a poll, not a hint?)"
        );
        let status = old.wait_exit(Duration::from_secs(20)).expect("it exits");
        assert_eq!(status.code(), Some(0), "{}", old.log());
        cluster.start(&leader, &[]);
    }
    // The last leader's job has started and written its first lines.
    std::thread::sleep(Duration::from_secs(1));
    let summary = cluster.check_history();
    assert!(summary.tenures.len() >= 4, "{summary:?}");
}

/// `leaderd resign ELECTION` against `node`: (exit code, stderr).
fn resign(node: &Leaderd, to: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(leaderd_bin());
    cmd.args(["resign", "report", "--url"])
        .arg(format!("http://127.0.0.1:{}", node.port))
        .env("LEADERD_HTTP__ADMIN_TOKEN", TOKEN);
    if let Some(to) = to {
        cmd.args(["--to", to]);
    }
    let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
    assert!(ended, "leaderd resign hung");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease(
    store: Store,
) {
    let mut cluster = Cluster::new(store);
    for id in ["alpha", "bravo", "charlie"] {
        cluster.start(id, &[]);
    }
    for round in 0..2 {
        let leader = cluster.one_leader(L * 3 + P);
        let_hints_flow(&cluster);
        // The candidate that follows the leader in name order, every round
        // another one.
        let to = next_candidate(&leader);
        let (code, stderr) = resign(cluster.node(&leader), Some(to));
        assert_eq!(code, Some(0), "round {round}: {stderr}");
        let took = wait_until(P, || cluster.leaders() == [to.to_string()]).unwrap_or_else(|| {
            panic!("round {round}: {to} does not lead: {:?}", cluster.leaders())
        });
        assert!(took < HINT_BOUND, "round {round}: {to} led after {took:?}");
    }
    // Asking a follower is refused and changes nothing.
    let leader = cluster.one_leader(L);
    let follower = cluster
        .nodes
        .iter()
        .find(|n| n.identity != leader)
        .expect("a follower");
    assert_eq!(resign(follower, Some(&leader)).0, Some(77));
    assert_eq!(cluster.leaders(), std::slice::from_ref(&leader));

    // Handed to a candidate that does not exist: the others wait one lease
    // (as if it were held), then one of them leads.
    let_hints_flow(&cluster);
    let (code, stderr) = resign(cluster.node(&leader), Some("nobody"));
    assert_eq!(code, Some(0), "{stderr}");
    let took = wait_until(L * 2 + P * 2, || cluster.leaders().len() == 1)
        .expect("someone leads after a lease handed to nobody known");
    assert!(
        took + Duration::from_millis(500) >= L,
        "led {took:?} after a handover to someone else"
    );
    assert!(
        took <= L.mul_f64(1.01) + P + Duration::from_secs(2),
        "leaderless for {took:?}"
    );
    cluster.check_history();
}

/// The real leader's events on its stream of the election `report`.
fn upstream_events(upstream_port: u16) -> impl Iterator<Item = (String, serde_json::Value)> {
    stream::upstream_events(upstream_port, "/v1/elections/report/watch")
}

/// A liar at the leader's advertised address: it relays the real leader's
/// events, and after each one sends a forged `released` carrying the live
/// rvn and a replay of the first event it ever saw; once the real stream
/// ends it announces made-up renewals every 200 ms for ever.
fn liar(upstream_port: u16) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        if stream_head(&mut conn).is_err() {
            return;
        }
        let mut first: Option<String> = None;
        for (line, event) in upstream_events(upstream_port) {
            let first = first.get_or_insert_with(|| line.clone());
            let mut forged = event.clone();
            forged["event"] = "released".into();
            forged["successor"] = serde_json::Value::Null;
            for out in [line.clone(), forged.to_string(), first.clone()] {
                if send_chunk(&mut conn, &out).is_err() {
                    return;
                }
            }
        }
        loop {
            let made_up = serde_json::json!({
                "event": "renewed", "election": "report", "holder": "alpha",
                "rvn": format!("{:032x}", rand::random::<u128>()),
                "fencing_token": 1u64 << 50, "lease_ms": 4000,
            });
            if send_chunk(&mut conn, &made_up.to_string()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// How a relay between the leader and its followers spoils the hints.
#[derive(Debug, Clone, Copy)]
enum Spoil {
    /// `released` and `not_leader` never arrive; `renewed` does. With
    /// `hold_open`, the stream does not end with the real one either: it
    /// just goes quiet.
    LoseReleases { hold_open: bool },
    /// Every event, and the stream's end, arrive this much late.
    Delay(Duration),
}

/// A relay at the leader's advertised address: the real leader's stream,
/// spoilt as `spoil` says; it ends (late, if delayed) when the real one
/// does.
fn relay(upstream_port: u16, spoil: Spoil) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        if stream_head(&mut conn).is_err() {
            return;
        }
        // Each line with its arrival; `None`: the real stream ended.
        let (tx, rx) = mpsc::channel::<(Instant, Option<String>)>();
        std::thread::spawn(move || {
            for (line, event) in upstream_events(upstream_port) {
                let lost =
                    matches!(spoil, Spoil::LoseReleases { .. }) && event["event"] != "renewed";
                if !lost && tx.send((Instant::now(), Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((Instant::now(), None));
        });
        let (delay, hold_open) = match spoil {
            Spoil::Delay(d) => (d, false),
            Spoil::LoseReleases { hold_open } => (Duration::ZERO, hold_open),
        };
        for (arrived, line) in rx {
            std::thread::sleep((arrived + delay).saturating_duration_since(Instant::now()));
            let sent = match line {
                Some(line) => send_chunk(&mut conn, &line),
                // The real stream ended: so does this one, as late (or
                // it stays open, silent, until the follower leaves).
                None if hold_open => {
                    // Until the follower hangs up.
                    let _ = conn.read(&mut [0u8; 1]);
                    return;
                }
                None => write!(conn, "0\r\n\r\n"),
            };
            if sent.is_err() {
                return;
            }
        }
    }
}

/// A loopback address nobody listens on.
fn closed_address() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").to_string()
}

/// The candidate after `leader` in name order, round the three.
fn next_candidate(leader: &str) -> &'static str {
    match leader {
        "alpha" => "bravo",
        "bravo" => "charlie",
        _ => "alpha",
    }
}

/// `leader` leads; while it lives nobody else does; killed with -9, it is
/// replaced within `limit`; the history stays safe.
fn crash_scenario(cluster: &mut Cluster, leader: &str, limit: Duration) {
    let leading = cluster.one_leader(L * 3 + P);
    assert_eq!(leading, leader, "{leader} was meant to lead");
    // While it lives (and lies, or cannot be watched), nobody else leads.
    for _ in 0..40 {
        assert_eq!(cluster.leaders(), [leader.to_string()]);
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut old = cluster.remove(leader);
    old.kill9();
    let took = wait_until(limit, || cluster.leaders().len() == 1).unwrap_or_else(|| {
        panic!(
            "nobody took over within {limit:?} of kill -9; a follower's log:\n{}",
            cluster.nodes[0].log()
        )
    });
    eprintln!("takeover after kill -9 of {leader}: {took:?}");
    cluster.check_history();
}

fn a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving(
    store: Store,
) {
    let mut cluster = Cluster::new(store);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let fake = listener.local_addr().expect("address").to_string();
    cluster.start("alpha", &["--advertise", &fake]);
    let stop = Arc::new(AtomicBool::new(false));
    fake_watch_server(listener, stop.clone(), liar(cluster.node("alpha").port));
    cluster.one_leader(L * 3);
    cluster.start("bravo", &[]);
    cluster.start("charlie", &[]);
    // Up to: two reads a P apart that find an rvn the liar never named,
    // then the takeover wait.
    crash_scenario(
        &mut cluster,
        "alpha",
        L * 2 + P * 3 + Duration::from_secs(4),
    );
    stop.store(true, Ordering::Relaxed);
}

fn a_hanging_or_unreachable_watch_costs_nothing_but_speed(store: Store) {
    // A server that accepts and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hanging = listener.local_addr().expect("address").to_string();
    let stop = Arc::new(AtomicBool::new(false));
    fake_watch_server(listener, stop.clone(), |conn| {
        std::thread::sleep(Duration::from_secs(60));
        drop(conn);
    });
    let closed = closed_address();
    for advertised in [hanging.as_str(), closed.as_str()] {
        let mut cluster = Cluster::new(store);
        cluster.start("alpha", &["--advertise", advertised]);
        cluster.one_leader(L * 3);
        cluster.start("bravo", &[]);
        cluster.start("charlie", &[]);
        // Polling as without hints: the rvn seen, then L·(1+D), then a poll.
        crash_scenario(
            &mut cluster,
            "alpha",
            L.mul_f64(1.01) + P * 2 + Duration::from_secs(3),
        );
    }
    stop.store(true, Ordering::Relaxed);
}

/// Every instance advertises an address nobody listens on: no hint ever
/// flows, and leadership moves as it did before hints, at poll speed.
fn with_every_address_unreachable_leadership_moves_at_poll_speed(store: Store) {
    let mut cluster = Cluster::new(store);
    for id in ["alpha", "bravo", "charlie"] {
        cluster.start(id, &["--advertise", &closed_address()]);
    }
    // SIGTERM: the released record is found at a follower's next poll.
    let leader = cluster.one_leader(L * 3 + P);
    // Give the job time to set up its SIGTERM handler (it exits 0 on it).
    std::thread::sleep(Duration::from_secs(1));
    let mut old = cluster.remove(&leader);
    old.signal(Signal::SIGTERM);
    let took = wait_until(P * 2, || cluster.leaders().len() == 1)
        .unwrap_or_else(|| panic!("nobody took over from {leader} after SIGTERM"));
    eprintln!("takeover after SIGTERM, no hints: {took:?}");
    assert!(took <= P + Duration::from_secs(3), "took {took:?}");
    let status = old.wait_exit(Duration::from_secs(20)).expect("it exits");
    assert_eq!(status.code(), Some(0), "{}", old.log());
    cluster.start(&leader, &["--advertise", &closed_address()]);

    // resign --to: the named candidate finds the lease at its next poll.
    let leader = cluster.one_leader(L);
    let to = next_candidate(&leader);
    let (code, stderr) = resign(cluster.node(&leader), Some(to));
    assert_eq!(code, Some(0), "{stderr}");
    let took = wait_until(P * 2, || cluster.leaders() == [to.to_string()])
        .unwrap_or_else(|| panic!("{to} does not lead: {:?}", cluster.leaders()));
    eprintln!("takeover by the named {to}, no hints: {took:?}");
    assert!(took <= P + Duration::from_secs(3), "took {took:?}");

    // kill -9: the rvn seen, then L·(1+D), then a poll.
    crash_scenario(
        &mut cluster,
        to,
        L.mul_f64(1.01) + P * 2 + Duration::from_secs(3),
    );
}

/// alpha's hints reach its followers through a relay that loses or delays
/// them: SIGTERM, then (alpha back, handed the lease by `resign --to`)
/// kill -9. Each handover is slower at most, never unsafe.
fn lost_or_late_hints_delay_a_handover_never_make_two_leaders(store: Store) {
    const LATE: Duration = Duration::from_secs(3);
    // (how, limit after SIGTERM, limit after kill -9)
    let cases = [
        // The end of a stream that spoke sends the followers to the store
        // at once.
        (
            Spoil::LoseReleases { hold_open: false },
            HINT_BOUND,
            L.mul_f64(1.01) + P * 2 + Duration::from_secs(3),
        ),
        // A stream gone quiet: the takeover timer of the last rvn hinted
        // runs out and the read finds the record released.
        (
            Spoil::LoseReleases { hold_open: true },
            L.mul_f64(1.01) + Duration::from_secs(3),
            L.mul_f64(1.01) + P * 2 + Duration::from_secs(3),
        ),
        // Late hints start the takeover timer late; reads that keep finding
        // an rvn not hinted yet turn the followers to polling.
        (
            Spoil::Delay(LATE),
            P + LATE + Duration::from_secs(3),
            L.mul_f64(1.01) + P * 2 + LATE + Duration::from_secs(3),
        ),
    ];
    for (spoil, term_limit, crash_limit) in cases {
        let mut cluster = Cluster::new(store);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let relay_at = listener.local_addr().expect("address").to_string();
        cluster.start("alpha", &["--advertise", &relay_at]);
        let stop = Arc::new(AtomicBool::new(false));
        // The relay serves whichever alpha runs: each new one listens on a
        // new port, so it looks the port up at each follower's connection.
        let alpha_port = Arc::new(std::sync::atomic::AtomicU16::new(
            cluster.node("alpha").port,
        ));
        let port = alpha_port.clone();
        fake_watch_server(listener, stop.clone(), move |conn| {
            relay(port.load(Ordering::Relaxed), spoil)(conn)
        });
        assert_eq!(cluster.one_leader(L * 3), "alpha");
        cluster.start("bravo", &[]);
        cluster.start("charlie", &[]);
        let_hints_flow(&cluster);
        std::thread::sleep(LATE);

        let mut alpha = cluster.remove("alpha");
        alpha.signal(Signal::SIGTERM);
        let took = wait_until(term_limit, || cluster.leaders().len() == 1).unwrap_or_else(|| {
            panic!("{spoil:?}: nobody took over within {term_limit:?} of SIGTERM")
        });
        eprintln!("{spoil:?}: takeover after SIGTERM: {took:?}");
        let status = alpha.wait_exit(Duration::from_secs(20)).expect("it exits");
        assert_eq!(status.code(), Some(0), "{}", alpha.log());

        cluster.start("alpha", &["--advertise", &relay_at]);
        alpha_port.store(cluster.node("alpha").port, Ordering::Relaxed);
        let leader = cluster.one_leader(L);
        let (code, stderr) = resign(cluster.node(&leader), Some("alpha"));
        assert_eq!(code, Some(0), "{stderr}");
        wait_until(P * 2, || cluster.leaders() == ["alpha".to_string()])
            .unwrap_or_else(|| panic!("alpha does not lead: {:?}", cluster.leaders()));
        let_hints_flow(&cluster);
        std::thread::sleep(LATE);
        crash_scenario(&mut cluster, "alpha", crash_limit);
        stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn resign_gives_the_job_its_shutdown_grace_not_the_kill_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let done = dir.path().join("done");
    let mut args: Vec<String> = vec![
        "--store-path".into(),
        dir.path().join("leases.db").display().to_string(),
    ];
    args.extend(TIMING.iter().map(|s| s.to_string()));
    args.extend(["--election".into(), "report".into()]);
    // The job needs 6 s to stop: more than kill_grace (1 s) and than the
    // lease (4 s), less than shutdown_grace (10 s). The lease is renewed
    // meanwhile, and the kill deadline moves with it.
    let script = format!(
        "trap 'sleep 6; touch {}; exit 0' TERM; while :; do sleep 0.1; done",
        done.display()
    );
    let node = Leaderd::start(Spec {
        identity: "alpha",
        args,
        env: vec![
            ("LEADERD_HTTP__ADMIN_TOKEN".into(), TOKEN.into()),
            ("LEADERD_CHILD__SHUTDOWN_GRACE".into(), "10s".into()),
        ],
        command: vec!["sh".into(), "-c".into(), script],
        dir: dir.path(),
    });
    wait_until(L * 3, || node.is_leader()).expect("alpha leads");
    std::thread::sleep(Duration::from_millis(500));
    let (code, stderr) = resign(&node, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        done.exists(),
        "the job was killed before it finished stopping; log:\n{}",
        node.log()
    );
}

/// The scenarios above, on one store.
macro_rules! handover_tests {
    ($module:ident, $store:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn sigterm_of_the_leader_hands_over_without_waiting_for_a_poll() {
                super::sigterm_of_the_leader_hands_over_without_waiting_for_a_poll($store);
            }

            #[test]
            fn resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease()
            {
                super::resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease($store);
            }

            #[test]
            fn a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving()
             {
                super::a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving($store);
            }

            #[test]
            fn a_hanging_or_unreachable_watch_costs_nothing_but_speed() {
                super::a_hanging_or_unreachable_watch_costs_nothing_but_speed($store);
            }

            #[test]
            fn with_every_address_unreachable_leadership_moves_at_poll_speed() {
                super::with_every_address_unreachable_leadership_moves_at_poll_speed($store);
            }

            #[test]
            fn lost_or_late_hints_delay_a_handover_never_make_two_leaders() {
                super::lost_or_late_hints_delay_a_handover_never_make_two_leaders($store);
            }
        }
    };
}

handover_tests!(sqlite, Store::Sqlite);
handover_tests!(dynamodb_local, Store::DynamoDbLocal);

/// On PostgreSQL, the handovers themselves; what a hint stream does wrong
/// (hanging, unreachable, lost, late, forged) is the same whatever the
/// store, and is covered on the two above.
mod postgres {
    use super::*;

    #[test]
    fn sigterm_of_the_leader_hands_over_without_waiting_for_a_poll() {
        super::sigterm_of_the_leader_hands_over_without_waiting_for_a_poll(Store::Postgres);
    }

    #[test]
    fn resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease() {
        super::resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease(
            Store::Postgres,
        );
    }

    #[test]
    fn a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving() {
        super::a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving(
            Store::Postgres,
        );
    }
}
forged::forged_hint_tests!(sqlite_forged, Store::Sqlite);
forged::forged_hint_tests!(dynamodb_local_forged, Store::DynamoDbLocal);
