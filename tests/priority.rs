//! Preferred leaders with real processes, on SQLite and on DynamoDB Local:
//! the live eligible daemon of the highest priority leads, a leader hands
//! the election to a daemon of a higher priority once it has been eligible
//! for `preempt_after` (a planned handover: the old job ends, the new one
//! starts within milliseconds), equal priorities never move it, a daemon
//! whose app check flaps moves it at most once per `preempt_after`, and
//! `--no-preempt` moves nothing. Every run passes the history checker (no
//! two jobs at once, tokens rise).

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::app::App;
use common::daemon::{Leaderd, Spec, leaders, wait_until};
use common::history;

/// L = 2 s, R = 250 ms, P = 2 s, G = 500 ms (R + G + M + L·D < L): a
/// short R so that a leader learns of a newcomer within a few renewals, a
/// long P so that a handover through the leader's stream (milliseconds,
/// plus the job's start) cannot be mistaken for one found by a poll.
const TIMING: [&str; 8] = [
    "--lease-duration",
    "2s",
    "--renew-interval",
    "250ms",
    "--retry-interval",
    "2s",
    "--kill-grace",
    "500ms",
];
/// For the checks that nothing moves, where R's length matters not: a
/// store's request has R to answer, so a loaded machine (SQLite's lock, a
/// busy emulator) cannot cost a lease that the check would count.
const CALM: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--renew-interval",
    "1s",
    "--retry-interval",
    "2s",
    "--kill-grace",
    "500ms",
];
const L: Duration = Duration::from_secs(2);
const P: Duration = Duration::from_secs(2);
/// `--preempt-after` in these tests.
const PREEMPT_AFTER: Duration = Duration::from_secs(2);
/// How long equal priorities are watched for a handover that must not come
/// (the figure).
const EQUALS_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
enum Store {
    Sqlite,
    DynamoDbLocal,
}

struct Cluster {
    /// Declared before `dir`: a failing test prints the logs from `dir`.
    nodes: Vec<Leaderd>,
    apps: Vec<App>,
    dir: tempfile::TempDir,
    history: PathBuf,
    store_args: Vec<String>,
    store_env: Vec<(String, String)>,
    /// The lease timing flags of every daemon started ([`TIMING`] unless
    /// told otherwise).
    timing: Vec<String>,
}

impl Cluster {
    fn new(store: Store) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = dir.path().join("history.log");
        let (store_args, store_env) = match store {
            Store::Sqlite => (
                vec![
                    "--store-path".to_owned(),
                    dir.path().join("leases.db").display().to_string(),
                ],
                vec![],
            ),
            Store::DynamoDbLocal => {
                let emulator = common::emulators::shared_dynamodb_local();
                (
                    vec![
                        "--store".to_owned(),
                        "dynamodb".into(),
                        "--endpoint-url".into(),
                        emulator.endpoint.clone(),
                        "--table".into(),
                        common::unique_name("priority"),
                    ],
                    vec![("LEADERD_STORE__CREATE_TABLE".into(), "true".into())],
                )
            }
        };
        Cluster {
            nodes: Vec::new(),
            apps: Vec::new(),
            dir,
            history,
            store_args,
            store_env,
            timing: TIMING.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The same, its daemons started with `timing`'s flags.
    fn with_timing(mut self, timing: [&str; 8]) -> Cluster {
        self.timing = timing.map(str::to_owned).to_vec();
        self
    }

    /// Start `identity` with `--priority priority` and `extra`; returns
    /// when it answers HTTP, with that instant.
    fn start(&mut self, identity: &str, priority: i64, extra: &[String]) -> Instant {
        let mut args = self.store_args.clone();
        args.extend(self.timing.iter().cloned());
        args.extend([
            "--election".to_owned(),
            "report".to_owned(),
            "--priority".to_owned(),
            priority.to_string(),
            "--preempt-after".to_owned(),
            format!("{}ms", PREEMPT_AFTER.as_millis()),
        ]);
        args.extend(extra.iter().cloned());
        let node = Leaderd::start(Spec {
            identity,
            args,
            env: self.store_env.clone(),
            command: common::job_command(&self.history),
            dir: self.dir.path(),
        });
        node.wait_http(Duration::from_secs(20));
        let up = Instant::now();
        self.nodes.push(node);
        up
    }

    /// Start `identity` with `--priority priority` and require that it
    /// alone leads within `preempt_after` + 1 s of being up.
    fn start_and_lead(&mut self, identity: &str, priority: i64) {
        let up = self.start(identity, priority, &[]);
        self.led_by(identity, PREEMPT_AFTER * 5).unwrap_or_else(|| {
            panic!(
                "{identity} ({priority}) does not lead: {:?}",
                self.leaders()
            )
        });
        let took = up.elapsed();
        eprintln!("{identity} ({priority}) led {took:?} after it was up");
        assert!(
            took <= PREEMPT_AFTER + Duration::from_secs(1),
            "{identity} ({priority}) led {took:?} after it was up; preempt_after is {PREEMPT_AFTER:?}"
        );
    }

    fn leaders(&self) -> Vec<String> {
        leaders(&self.nodes.iter().collect::<Vec<_>>())
    }

    /// How long until `identity` alone leads, within `limit`.
    fn led_by(&self, identity: &str, limit: Duration) -> Option<Duration> {
        wait_until(limit, || self.leaders() == [identity.to_owned()])
    }

    fn node(&self, identity: &str) -> &Leaderd {
        self.nodes
            .iter()
            .find(|n| n.identity == identity)
            .expect("a node of that identity")
    }

    fn kill9(&mut self, identity: &str) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.identity == identity)
            .expect("a node of that identity");
        let mut node = self.nodes.remove(i);
        node.kill9();
    }

    /// The jobs' history so far (they still run: a line may be on its
    /// way): no two tenures overlap, tokens rise.
    fn check_history(&self) -> history::Summary {
        let log = std::fs::read_to_string(&self.history).unwrap_or_default();
        history::check(history::complete_lines(&log))
            .unwrap_or_else(|v| panic!("unsafe history: {v:?}\n{log}"))
    }

    /// Tenures of `identity`'s jobs so far.
    fn tenures_of(&self, identity: &str) -> usize {
        self.check_history()
            .tenures
            .iter()
            .filter(|t| t.id.identity == identity)
            .count()
    }

    /// What `leaderd status ARGS` prints for the cluster's store.
    fn cli_status(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(common::daemon::leaderd_bin())
            .arg("status")
            .args(&self.store_args)
            .args(args)
            // What the daemons are given (the emulator takes any).
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(self.store_env.iter().cloned())
            .output()
            .expect("run leaderd status");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "leaderd status {args:?}: {stderr}");
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// `leaderd status ARGS --json`, parsed.
    fn cli_status_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli_status(&[args, &["--json"]].concat());
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// `leaderd_preemptions_total{election="report"}` of `identity`.
    fn preemptions(&self, identity: &str) -> f64 {
        self.node(identity)
            .metric("leaderd_preemptions_total{election=\"report\"}")
            .unwrap_or_else(|| panic!("{identity} has no preemption counter"))
    }
}

/// The daemons of priorities 2, 1 and 0, started lowest first: the highest
/// leads within `preempt_after` + 1 s of being up; killed, the next leads;
/// back, it leads again through a planned handover.
fn the_highest_priority_leads_and_takes_it_back_after_a_crash(store: Store) {
    let mut c = Cluster::new(store);
    c.start("charlie", 0, &[]);
    c.led_by("charlie", L * 3).expect("charlie leads alone");
    c.start_and_lead("bravo", 1);
    c.start_and_lead("alpha", 2);
    assert_eq!(c.preemptions("bravo"), 1.0);
    // The leader's /status shows each candidate's priority it knows.
    let members = || -> Vec<(String, i64)> {
        let (_, body) = c.node("alpha").get("/status").unwrap_or_default();
        let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        status["priority"]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| Some((m["identity"].as_str()?.to_owned(), m["priority"].as_i64()?)))
            .collect()
    };
    wait_until(L * 3, || {
        members() == [("bravo".to_owned(), 1), ("charlie".to_owned(), 0)]
    })
    .unwrap_or_else(|| panic!("alpha's /status shows {:?}", members()));

    // So does `leaderd status`: the holder's priority per election, and
    // with --members every daemon's, named by the set of the config given.
    let rows = c.cli_status_json(&[]);
    assert_eq!(rows[0]["holder"], "alpha", "{rows}");
    assert_eq!(rows[0]["holder_priority"], 2, "{rows}");
    assert_eq!(rows[0]["holder_priority_exact"], true, "{rows}");
    let text = c.cli_status(&["report"]);
    let row = text.lines().find(|l| l.starts_with("report")).unwrap_or("");
    assert!(row.ends_with("  2"), "{text}");
    let config = c.dir.path().join("status.toml");
    std::fs::write(&config, "[[elections]]\nname = \"report\"\n").expect("write config");
    let config = config.display().to_string();
    let cli_members = || -> Vec<(String, i64, bool)> {
        let members = c.cli_status_json(&["--members", "--config", &config]);
        members
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let eligible = m["eligible"].as_bool()? && m["set_known"].as_bool()?;
                Some((
                    m["identity"].as_str()?.to_owned(),
                    m["priority"].as_i64()?,
                    eligible,
                ))
            })
            .collect()
    };
    let all = [("alpha", 2), ("bravo", 1), ("charlie", 0)].map(|(i, p)| (i.to_owned(), p, true));
    wait_until(L * 3, || {
        cli_members() == all || {
            std::thread::sleep(Duration::from_millis(200));
            false
        }
    })
    .unwrap_or_else(|| panic!("leaderd status --members shows {:?}", cli_members()));

    // kill -9: its session expires; bravo, one step below it, holds back
    // half a poll after the takeover rule's wait, charlie (two steps) a
    // whole one: bravo takes over first.
    c.kill9("alpha");
    let killed = Instant::now();
    let bound = L.mul_f64(1.01) + P;
    c.led_by("bravo", bound * 2)
        .unwrap_or_else(|| panic!("bravo does not lead after the kill: {:?}", c.leaders()));
    let took = killed.elapsed();
    eprintln!("bravo led {took:?} after alpha's kill");
    assert!(took <= bound, "bravo led {took:?} after alpha's kill");
    assert_eq!(c.tenures_of("charlie"), 1, "charlie led after the kill");

    // Back: it leads again within preempt_after + 1 s, through a handover.
    c.start_and_lead("alpha", 2);
    // Its job's start follows bravo's end by a handover's gap (the
    // release told on the stream, the takeover, the job's start), well
    // under one poll.
    wait_until(Duration::from_secs(5), || {
        c.check_history()
            .tenures
            .last()
            .is_some_and(|t| t.id.identity == "alpha" && t.beats > 0)
    })
    .expect("alpha's job runs");
    let summary = c.check_history();
    let last = summary
        .gaps
        .last()
        .expect("a gap before alpha's last tenure");
    assert_eq!(
        (last.from.identity.as_str(), last.to.identity.as_str()),
        ("bravo", "alpha"),
        "{summary:?}"
    );
    eprintln!("gap between bravo's job and alpha's: {:?}", last.gap);
    assert!(
        last.gap < P / 2,
        "bravo's job ended {:?} before alpha's started: not a handover's gap",
        last.gap
    );
}

/// A newcomer's priority goes out with its session's first writes and the
/// leader times it from when it learned of it, not from its next round:
/// with R longer than `preempt_after` + 1 s (so that a wait of even one R
/// would fail), each of 1 then 2, started in turn, leads within
/// `preempt_after` + 1 s of starting.
fn a_newcomer_leads_within_preempt_after_whatever_r(store: Store) {
    let mut c = Cluster::new(store).with_timing([
        "--lease-duration",
        "8s",
        "--renew-interval",
        "4s",
        "--retry-interval",
        "2s",
        "--kill-grace",
        "500ms",
    ]);
    c.start("charlie", 0, &[]);
    c.led_by("charlie", Duration::from_secs(30))
        .expect("charlie leads alone");
    c.start_and_lead("bravo", 1);
    c.start_and_lead("alpha", 2);
    // Each through a planned handover: the history checker (no overlap,
    // tokens rise) sees charlie's, bravo's and alpha's jobs in turn.
    wait_until(Duration::from_secs(5), || {
        c.check_history().tenures.len() == 3
    })
    .unwrap_or_else(|| panic!("three tenures: {:?}", c.check_history()));
    let who: Vec<String> = c
        .check_history()
        .tenures
        .iter()
        .map(|t| t.id.identity.clone())
        .collect();
    assert_eq!(who, ["charlie", "bravo", "alpha"]);
}

/// Two daemons of one priority: the first leads the whole window.
fn equal_priorities_never_hand_over(store: Store) {
    let mut c = Cluster::new(store).with_timing(CALM);
    c.start("alpha", 1, &[]);
    c.led_by("alpha", L * 3).expect("alpha leads");
    c.start("bravo", 1, &[]);
    let t0 = Instant::now();
    while t0.elapsed() < EQUALS_WINDOW {
        assert_eq!(c.leaders(), ["alpha"], "after {:?}", t0.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.check_history().tenures.len(), 1);
    assert_eq!(c.preemptions("alpha"), 0.0);
}

/// The preferred daemon's app check passes and fails in turn: each of its
/// eligible stretches may bring it the election once, never more often
/// than once per `preempt_after`.
fn a_flapping_preferred_daemon_moves_it_at_most_once_per_preempt_after(store: Store) {
    let mut c = Cluster::new(store);
    c.start("bravo", 1, &[]);
    c.led_by("bravo", L * 3).expect("bravo leads");
    let app = App::start(c.dir.path(), "alpha-app", "ok");
    let url = app.url();
    c.apps.push(app);
    c.store_env.extend([
        ("LEADERD_APP_CHECK__INTERVAL".to_owned(), "200ms".to_owned()),
        ("LEADERD_APP_CHECK__TIMEOUT".to_owned(), "100ms".to_owned()),
        (
            "LEADERD_APP_CHECK__FAILURE_THRESHOLD".to_owned(),
            "1".to_owned(),
        ),
    ]);
    c.start("alpha", 2, &["--app-check".to_owned(), url]);
    let t0 = Instant::now();
    // Passing 2.5 s, failing 0.5 s: eligible just long enough to be
    // preferred each time.
    let window = Duration::from_secs(15);
    while t0.elapsed() < window {
        std::thread::sleep(Duration::from_millis(2500));
        c.apps[0].set("fail");
        std::thread::sleep(Duration::from_millis(500));
        c.apps[0].set("ok");
    }
    let elapsed = t0.elapsed();
    let bound = (elapsed.as_secs_f64() / PREEMPT_AFTER.as_secs_f64()).floor() + 1.0;
    let preempted = c.preemptions("bravo");
    assert!(
        preempted <= bound,
        "{preempted} preemptions in {elapsed:?} (at most {bound})"
    );
    let alpha = c.tenures_of("alpha") as f64;
    eprintln!("{preempted} preemptions, {alpha} tenures of alpha in {elapsed:?}");
    assert!(alpha <= bound, "alpha led {alpha} times in {elapsed:?}");
    assert!(preempted >= 1.0, "alpha was never preferred");
}

/// `--no-preempt`: a daemon of a higher priority that joins late waits.
fn without_preemption_nothing_moves(store: Store) {
    let mut c = Cluster::new(store).with_timing(CALM);
    let off = ["--no-preempt".to_owned()];
    c.start("bravo", 1, &off);
    c.led_by("bravo", L * 3).expect("bravo leads");
    c.start("alpha", 2, &off);
    let t0 = Instant::now();
    while t0.elapsed() < PREEMPT_AFTER * 4 {
        assert_eq!(c.leaders(), ["bravo"], "after {:?}", t0.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.check_history().tenures.len(), 1);
    assert_eq!(c.preemptions("bravo"), 0.0);
}

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(super::Store::Sqlite);
            })*
        }
        mod dynamodb_local {
            $(#[test]
            fn $name() {
                super::$name(super::Store::DynamoDbLocal);
            })*
        }
    };
}

on_every_store!(
    the_highest_priority_leads_and_takes_it_back_after_a_crash,
    a_newcomer_leads_within_preempt_after_whatever_r,
    equal_priorities_never_hand_over,
    a_flapping_preferred_daemon_moves_it_at_most_once_per_preempt_after,
    without_preemption_nothing_moves,
);
