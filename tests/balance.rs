//! Balance with real processes: three leaderd instances with `--balance`
//! campaign for the same 300 elections at the default timing (L = 10 s,
//! R = 5 s, P = 1 s), on SQLite, on DynamoDB Local and on PostgreSQL.
//!
//! Started a few seconds apart, they lead 100 ± 5 each within 60 s of the
//! last start and stay there. kill -9 of one: the other two lead 150 ± 5
//! each within 2·L·(1+D) + 30 s; it comes back: 100 ± 5 each within 60 s.
//! One leaves by SIGTERM: the other two lead 150 ± 5 each within 60 s.
//!
//! Throughout, a sampler reads every instance's `/status` in turn and the
//! test fails on any election two instances led at once, or whose fencing
//! token went down (see [`Samples::check`]).

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, http, wait_until};
use nix::sys::signal::Signal;

/// Elections.
const N: usize = 300;
/// The default lease.
const L: Duration = Duration::from_secs(10);
/// The share each of `k` instances should reach, ± this.
const TOLERANCE: usize = 5;

/// Within 60 s of a start, the shares settle.
const SETTLE: Duration = Duration::from_secs(60);

/// After kill -9: the dead instance's leases expire (L·(1+D) after the
/// followers last saw them renewed), its member record too; then the
/// survivors even out: 2·L·(1+D) + 30 s.
fn after_crash() -> Duration {
    L.mul_f64(2.0 * 1.01) + Duration::from_secs(30)
}

/// One `/status` reading of one instance: the elections it led, with their
/// fencing tokens, and when the request was sent and answered.
struct Sample {
    identity: String,
    sent: Instant,
    answered: Instant,
    led: BTreeMap<String, u64>,
}

/// Every reading the sampler took.
#[derive(Default)]
struct Samples(Vec<Sample>);

impl Samples {
    /// No election led by two instances at once, no fencing token going
    /// down. Readings of different instances are not simultaneous, so two
    /// leaders are proven only by brackets: X led E under token t in two
    /// consecutive readings of X (a tenure is one unbroken stretch, so X led
    /// E throughout), and a reading of Y ≠ X taken entirely between them
    /// shows Y leading E too. Tokens: a reading answered before another was
    /// sent may not show a higher token for the same election.
    fn check(&self) -> Result<usize, String> {
        // The sampler reads one instance at a time, so readings are in
        // order and those between two readings of X (by index) were taken
        // entirely between them.
        let mut by_identity: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, s) in self.0.iter().enumerate() {
            by_identity.entry(&s.identity).or_default().push(i);
        }
        let mut brackets = 0;
        for (x, readings) in &by_identity {
            for pair in readings.windows(2) {
                let (before, after) = (&self.0[pair[0]], &self.0[pair[1]]);
                let between = &self.0[pair[0] + 1..pair[1]];
                for (election, token) in &before.led {
                    if after.led.get(election) != Some(token) {
                        continue;
                    }
                    brackets += 1;
                    if let Some(other) = between.iter().find(|s| s.led.contains_key(election)) {
                        return Err(format!(
                            "{election}: {x} led it under token {token} before and after {} led it under token {}",
                            other.identity, other.led[election]
                        ));
                    }
                }
            }
        }
        let mut highest: BTreeMap<&str, (u64, Instant, &str)> = BTreeMap::new();
        for s in &self.0 {
            for (election, token) in &s.led {
                if let Some((top, at, who)) = highest.get(election.as_str())
                    && *at < s.sent
                    && token < top
                {
                    return Err(format!(
                        "{election}: token {token} led by {} after token {top} led by {who}",
                        s.identity
                    ));
                }
                let entry = highest
                    .entry(election)
                    .or_insert((*token, s.answered, &s.identity));
                if *token >= entry.0 {
                    *entry = (*token, s.answered, &s.identity);
                }
            }
        }
        Ok(brackets)
    }
}

/// The elections `body` (a `/status` answer) says this instance leads.
fn led_in(body: &str) -> Option<BTreeMap<String, u64>> {
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(
        json.get("elections")?
            .as_object()?
            .iter()
            .filter(|(_, v)| v["is_leader"] == true)
            .map(|(name, v)| (name.clone(), v["fencing_token"].as_u64().unwrap_or(0)))
            .collect(),
    )
}

struct Cluster {
    /// Declared before `dir`: fields drop in order, and a failing test
    /// prints each instance's log as it drops, from files in `dir`.
    nodes: BTreeMap<String, Leaderd>,
    dir: tempfile::TempDir,
    config: PathBuf,
    store_args: Vec<String>,
    env: Vec<(String, String)>,
    /// Where the sampler finds each running instance.
    ports: Arc<Mutex<BTreeMap<String, u16>>>,
    samples: Arc<Mutex<Samples>>,
    stop: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    fn new(dir: tempfile::TempDir, store_args: Vec<String>, env: Vec<(String, String)>) -> Self {
        let mut toml = String::from("balance = true\n");
        for i in 0..N {
            toml.push_str(&format!("\n[[elections]]\nname = \"shard-{i:03}\"\n"));
        }
        let config = dir.path().join("leaderd.toml");
        std::fs::write(&config, toml).expect("write the config");
        let ports = Arc::new(Mutex::new(BTreeMap::new()));
        let samples = Arc::new(Mutex::new(Samples::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (ports, samples, stop) = (ports.clone(), samples.clone(), stop.clone());
            std::thread::spawn(move || sample(&ports, &samples, &stop))
        };
        Cluster {
            dir,
            config,
            store_args,
            env,
            nodes: BTreeMap::new(),
            ports,
            samples,
            stop,
            sampler: Some(sampler),
        }
    }

    fn start(&mut self, identity: &str) {
        let mut args = vec!["--config".to_string(), self.config.display().to_string()];
        args.extend(self.store_args.iter().cloned());
        let node = Leaderd::start(Spec {
            identity,
            args,
            env: self.env.clone(),
            command: vec![],
            dir: self.dir.path(),
        });
        node.wait_http(Duration::from_secs(30));
        lock(&self.ports).insert(identity.to_owned(), node.port);
        self.nodes.insert(identity.to_owned(), node);
    }

    fn remove(&mut self, identity: &str) -> Leaderd {
        lock(&self.ports).remove(identity);
        self.nodes.remove(identity).expect("a running instance")
    }

    /// Elections each running instance leads now.
    fn shares(&self) -> BTreeMap<String, usize> {
        self.nodes
            .iter()
            .map(|(id, node)| {
                let led = node
                    .get("/status")
                    .and_then(|(_, body)| led_in(&body))
                    .map_or(0, |led| led.len());
                (id.clone(), led)
            })
            .collect()
    }

    /// Wait until every running instance leads `each` ± TOLERANCE and every
    /// election is led; then check that it stays so for 10 s.
    fn settles(&self, each: usize, limit: Duration, what: &str) {
        let near = |shares: &BTreeMap<String, usize>| {
            shares.values().all(|n| n.abs_diff(each) <= TOLERANCE)
                && shares.values().sum::<usize>() == N
        };
        let took = wait_until(limit, || near(&self.shares())).unwrap_or_else(|| {
            panic!(
                "{what}: not {each} ± {TOLERANCE} each within {limit:?}: {:?}\n{}",
                self.shares(),
                self.logs()
            )
        });
        eprintln!("{what}: {each} ± {TOLERANCE} each after {took:?}");
        for _ in 0..10 {
            std::thread::sleep(Duration::from_secs(1));
            let shares = self.shares();
            assert!(
                shares.values().all(|n| n.abs_diff(each) <= TOLERANCE),
                "{what}: left {each} ± {TOLERANCE}: {shares:?}"
            );
        }
        eprintln!("{what}: shares {:?}", self.shares());
    }

    fn logs(&self) -> String {
        self.nodes
            .values()
            .map(|n| {
                let log = n.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                format!(
                    "--- {} (last lines) ---\n{}\n",
                    n.identity,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect()
    }

    /// Stop sampling; check the samples.
    fn check_history(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sampler.take() {
            let _ = t.join();
        }
        let samples = lock(&self.samples);
        let brackets = samples
            .check()
            .unwrap_or_else(|e| panic!("two leaders at once: {e}"));
        eprintln!(
            "{} /status readings, {brackets} tenures bracketed, no overlap",
            samples.0.len()
        );
        assert!(
            brackets > 10 * N,
            "too few readings to judge overlap: {brackets} brackets"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Read every instance's `/status` in turn until told to stop.
fn sample(ports: &Mutex<BTreeMap<String, u16>>, samples: &Mutex<Samples>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let targets: Vec<(String, u16)> = lock(ports)
            .iter()
            .map(|(id, port)| (id.clone(), *port))
            .collect();
        if targets.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (identity, port) in targets {
            let sent = Instant::now();
            let Some((200, body)) = http(port, "GET", "/status", &[]) else {
                continue;
            };
            let answered = Instant::now();
            if let Some(led) = led_in(&body) {
                lock(samples).0.push(Sample {
                    identity,
                    sent,
                    answered,
                    led,
                });
            }
        }
    }
}

fn scenario(mut cluster: Cluster) {
    // Started a few seconds apart.
    cluster.start("alpha");
    std::thread::sleep(Duration::from_secs(3));
    cluster.start("bravo");
    std::thread::sleep(Duration::from_secs(3));
    cluster.start("charlie");
    cluster.settles(N / 3, SETTLE, "three started");

    // /status shows the share.
    let (_, body) = cluster.nodes["alpha"].get("/status").expect("status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(status["balance"]["members"], 3, "{}", status["balance"]);
    assert_eq!(
        status["balance"]["fair_share"],
        N / 3,
        "{}",
        status["balance"]
    );
    assert_eq!(status["balance"]["elections"], N, "{}", status["balance"]);

    // kill -9 of one; then it comes back.
    cluster.remove("charlie").kill9();
    cluster.settles(N / 2, after_crash(), "charlie killed");
    let (_, metrics) = cluster.nodes["bravo"].get("/metrics").expect("metrics");
    assert!(metrics.contains("leaderd_members 2"), "{metrics}");
    assert!(metrics.contains("leaderd_fair_share 150"), "{metrics}");
    cluster.start("charlie");
    cluster.settles(N / 3, SETTLE, "charlie back");

    // One leaves by SIGTERM.
    let mut bravo = cluster.remove("bravo");
    bravo.signal(Signal::SIGTERM);
    let status = bravo
        .wait_exit(Duration::from_secs(30))
        .expect("bravo exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", bravo.log());
    cluster.settles(N / 2, SETTLE, "bravo left");
    cluster.check_history();
}

#[test]
fn three_instances_share_300_elections_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let store = vec!["--store-path".to_string(), db.display().to_string()];
    scenario(Cluster::new(dir, store, vec![]));
}

#[test]
fn three_instances_share_300_elections_on_dynamodb_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    let emulator = common::emulators::shared_dynamodb_local();
    let store = vec![
        "--store".to_string(),
        "dynamodb".into(),
        "--endpoint-url".into(),
        emulator.endpoint.clone(),
        "--table".into(),
        common::unique_name("balance"),
    ];
    let env = vec![(
        "LEADERD_STORE__CREATE_TABLE".to_string(),
        "true".to_string(),
    )];
    scenario(Cluster::new(dir, store, env));
}

#[test]
fn three_instances_share_300_elections_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = common::postgres::shared_postgres().args(&common::unique_name("balance"));
    // Every instance may create the table, at the same moment.
    let env = vec![(
        "LEADERD_STORE__CREATE_TABLE".to_string(),
        "true".to_string(),
    )];
    scenario(Cluster::new(dir, store, env));
}

/// The checker itself: it finds two leaders only when a bracket proves
/// them, and a token that goes down.
#[test]
fn the_overlap_checker_tells_proven_overlap_from_sampling_skew() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let reading = |identity: &str, ms: u64, led: &[(&str, u64)]| Sample {
        identity: identity.into(),
        sent: at(ms),
        answered: at(ms + 1),
        led: led.iter().map(|(e, t)| (e.to_string(), *t)).collect(),
    };
    // a leads e under 5 before and after b's reading shows b leading it.
    let overlap = Samples(vec![
        reading("a", 0, &[("e", 5)]),
        reading("b", 10, &[("e", 6)]),
        reading("a", 20, &[("e", 5)]),
    ]);
    assert!(overlap.check().is_err());
    // A handover between readings: a no longer leads it afterwards.
    let handover = Samples(vec![
        reading("a", 0, &[("e", 5)]),
        reading("b", 10, &[("e", 6)]),
        reading("a", 20, &[]),
    ]);
    assert_eq!(handover.check(), Ok(0));
    // A token going down.
    let backwards = Samples(vec![
        reading("a", 0, &[("e", 6)]),
        reading("b", 10, &[("e", 5)]),
    ]);
    assert!(backwards.check().is_err());
}

/// A flood of `GET /v1/watch` requests naming made-up sessions: the leader
/// remembers none of them, counts none as a member, and a real newcomer
/// still gets its share.
#[test]
fn made_up_session_names_keep_no_newcomer_out() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().expect("tempdir");
    let mut toml = String::from("balance = true\n");
    for i in 0..20 {
        toml.push_str(&format!("\n[[elections]]\nname = \"shard-{i:02}\"\n"));
    }
    let config = dir.path().join("leaderd.toml");
    std::fs::write(&config, toml).expect("write the config");
    let args = [
        "--config",
        &config.display().to_string(),
        "--store-path",
        &dir.path().join("l.db").display().to_string(),
    ]
    .map(String::from)
    .into_iter()
    .chain(common::daemon::short_timing_args())
    .collect::<Vec<_>>();
    let start = |identity| {
        let node = Leaderd::start(Spec {
            identity,
            args: args.clone(),
            env: vec![],
            command: vec![],
            dir: dir.path(),
        });
        node.wait_http(Duration::from_secs(30));
        node
    };
    let led = |node: &Leaderd| {
        node.get("/status")
            .and_then(|(_, body)| led_in(&body))
            .map_or(0, |led| led.len())
    };
    let members = |node: &Leaderd| {
        node.get("/status")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|s| s["balance"]["members"].as_u64())
    };
    let a = start("a");
    wait_until(Duration::from_secs(20), || led(&a) == 20).expect("a leads all 20");

    // 1,100 streams, each naming a session nobody holds, opened and closed;
    // and 100 more held open while the newcomer starts.
    let open = |n: usize| {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", a.port)).expect("connect");
        write!(
            conn,
            "GET /v1/watch HTTP/1.1\r\nHost: x\r\nx-leaderd-session: #session/ghost-{n}/g{n}\r\n\r\n"
        )
        .expect("send");
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut first = [0u8; 12];
        conn.read_exact(&mut first).expect("an answer");
        assert_eq!(&first, b"HTTP/1.1 200", "the stream opens");
        conn
    };
    for n in 0..1_100 {
        drop(open(n));
    }
    let held: Vec<_> = (1_100..1_200).map(open).collect();
    // A few balance rounds: the made-up names are looked up, and dropped.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(members(&a), Some(1), "made-up sessions are no members");

    let b = start("b");
    wait_until(Duration::from_secs(30), || {
        led(&b) >= 8 && members(&a) == Some(2)
    })
    .unwrap_or_else(|| {
        panic!(
            "the newcomer leads {} of 20 and a counts {:?} members:\n{}\n{}",
            led(&b),
            members(&a),
            a.log(),
            b.log()
        )
    });
    drop(held);
    let (_, metrics) = a.get("/metrics").expect("metrics");
    eprintln!(
        "newcomer leads {}; a's session look-ups: {:?}",
        led(&b),
        metrics
            .lines()
            .filter(|l| l.contains("look_up_sessions") && l.contains("_count"))
            .collect::<Vec<_>>()
    );
}
