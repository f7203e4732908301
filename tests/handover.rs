//! Planned handover through the leader's hints, with real processes on
//! SQLite: followers watch the leader (`/v1/elections/{election}/watch`)
//! and take over as soon as it releases, not at their next poll; `resign
//! --to` hands the lease to one candidate; and a watch stream that lies,
//! hangs or cannot be reached delays a takeover at most, never makes two
//! leaders (the jobs' history shows no overlap and rising tokens).
//!
//! The poll interval P is 8 s here, so that a takeover through a hint
//! (milliseconds) cannot be mistaken for one through a poll (up to 8 s).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaderd_bin, leaders, output_within, wait_until};
use common::history;
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

struct Cluster {
    dir: tempfile::TempDir,
    history: std::path::PathBuf,
    nodes: Vec<Leaderd>,
}

impl Cluster {
    fn new() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = dir.path().join("history.log");
        Cluster {
            dir,
            history,
            nodes: Vec::new(),
        }
    }

    fn start(&mut self, identity: &str, extra: &[&str]) {
        let mut args: Vec<String> = vec![
            "--store-path".into(),
            self.dir.path().join("leases.db").display().to_string(),
        ];
        args.extend(TIMING.iter().map(|s| s.to_string()));
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--election".into(), "report".into()]);
        let node = Leaderd::start(Spec {
            identity,
            args,
            env: vec![("LEADERD_HTTP__ADMIN_TOKEN".into(), TOKEN.into())],
            command: vec![
                "python3".into(),
                common::job_script().display().to_string(),
                self.history.display().to_string(),
            ],
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

    /// The jobs' history: no two tenures overlap, tokens rise.
    fn check_history(&self) -> history::Summary {
        let log = std::fs::read_to_string(&self.history).unwrap_or_default();
        history::check(&log).unwrap_or_else(|v| panic!("unsafe history: {v:?}\n{log}"))
    }
}

/// Wait until followers have heard the leader's hints at least once: its
/// renewals come every R.
fn let_hints_flow() {
    std::thread::sleep(Duration::from_secs(3));
}

#[test]
fn sigterm_of_the_leader_hands_over_without_waiting_for_a_poll() {
    let mut cluster = Cluster::new();
    for id in ["alpha", "bravo", "charlie"] {
        cluster.start(id, &[]);
    }
    for round in 0..3 {
        let leader = cluster.one_leader(L * 3 + P);
        let_hints_flow();
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

#[test]
fn resign_to_a_named_candidate_hands_it_the_lease_and_to_nobody_known_costs_one_lease() {
    let mut cluster = Cluster::new();
    for id in ["alpha", "bravo", "charlie"] {
        cluster.start(id, &[]);
    }
    for round in 0..2 {
        let leader = cluster.one_leader(L * 3 + P);
        let_hints_flow();
        // The candidate that follows the leader in name order, every round
        // another one.
        let to = ["alpha", "bravo", "charlie", "alpha"]
            .iter()
            .skip_while(|id| **id != leader)
            .nth(1)
            .expect("a next candidate");
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
    let_hints_flow();
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

/// A watch server of the test's own at `listener`, standing in for the
/// leader's advertised address. `behave` gets each follower's connection
/// (after its request head was read).
fn fake_watch_server(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    behave: impl Fn(TcpStream) + Send + Sync + Clone + 'static,
) {
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    let behave = behave.clone();
                    std::thread::spawn(move || {
                        conn.set_nonblocking(false).expect("blocking");
                        let mut head = [0u8; 4096];
                        let _ = conn.read(&mut head);
                        behave(conn);
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
}

fn send_chunk(conn: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let line = format!("{line}\n");
    write!(conn, "{:x}\r\n{line}\r\n", line.len())
}

/// A liar at the leader's advertised address: it relays the real leader's
/// events, and after each one sends a forged `released` carrying the live
/// rvn and a replay of the first event it ever saw; once the real stream
/// ends it announces made-up renewals every 200 ms for ever.
fn liar(upstream_port: u16) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let mut first: Option<String> = None;
        if let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream_port)) {
            let _ = write!(
                up,
                "GET /v1/elections/report/watch HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            );
            for line in BufReader::new(up).lines().map_while(Result::ok) {
                let event = match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(event @ serde_json::Value::Object(_)) => event,
                    _ => continue, // headers and chunk sizes
                };
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

/// alpha leads; while it lives nobody else does; killed with -9, it is
/// replaced within `limit`; the history stays safe.
fn crash_scenario(cluster: &mut Cluster, limit: Duration) {
    let leader = cluster.one_leader(L * 3 + P);
    assert_eq!(leader, "alpha", "alpha started first and leads");
    // While alpha lives (and lies, or cannot be watched), nobody else leads.
    for _ in 0..40 {
        assert_eq!(cluster.leaders(), ["alpha".to_string()]);
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut alpha = cluster.remove("alpha");
    alpha.kill9();
    let took = wait_until(limit, || cluster.leaders().len() == 1).unwrap_or_else(|| {
        panic!(
            "nobody took over within {limit:?} of kill -9; bravo's log:\n{}",
            cluster.node("bravo").log()
        )
    });
    eprintln!("takeover after kill -9: {took:?}");
    cluster.check_history();
}

#[test]
fn a_lying_watch_stream_never_makes_a_second_leader_and_cannot_keep_the_lease_from_moving() {
    let mut cluster = Cluster::new();
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
    crash_scenario(&mut cluster, L * 2 + P * 3 + Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn a_hanging_or_unreachable_watch_costs_nothing_but_speed() {
    // A server that accepts and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hanging = listener.local_addr().expect("address").to_string();
    let stop = Arc::new(AtomicBool::new(false));
    fake_watch_server(listener, stop.clone(), |conn| {
        std::thread::sleep(Duration::from_secs(60));
        drop(conn);
    });
    // A port nobody listens on.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("address").to_string()
    };
    for advertised in [hanging.as_str(), closed.as_str()] {
        let mut cluster = Cluster::new();
        cluster.start("alpha", &["--advertise", advertised]);
        cluster.one_leader(L * 3);
        cluster.start("bravo", &[]);
        cluster.start("charlie", &[]);
        // Polling as without hints: the rvn seen, then L·(1+D), then a poll.
        crash_scenario(
            &mut cluster,
            L.mul_f64(1.01) + P * 2 + Duration::from_secs(3),
        );
    }
    stop.store(true, Ordering::Relaxed);
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
    // The job needs 2 s to stop: more than kill_grace (1 s), less than
    // shutdown_grace (10 s).
    let script = format!(
        "trap 'sleep 2; touch {}; exit 0' TERM; while :; do sleep 0.1; done",
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
