//! The child is gone before anyone else can lead, under faults: the
//! leader's store traffic blackholed, the leader killed with SIGKILL, the leader process alone stopped with SIGSTOP.
//! Every child records its life in a shared history; the checker proves no two
//! tenures overlap and fencing tokens only grow.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::daemon::{Leaderd, Spec, wait_until};
use common::proxy::{Fault, FaultProxy};
use nix::sys::signal::Signal;

/// L = 2 s, R = 1 s, P = 250 ms, G = 500 ms, M = 200 ms, D = 1 %:
/// validity = L·(1−D) − M = 1.78 s after the last successful renew was sent;
/// stop signal at 1.28 s.
const L: Duration = Duration::from_secs(2);
const VALIDITY: Duration = Duration::from_millis(1_780);
const GRACE: Duration = Duration::from_millis(500);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(250);

fn timing() -> Vec<String> {
    common::daemon::short_lease_args("job")
}

fn monotonic_ns() -> u64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("monotonic clock");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

fn job(history: &Path, extra: &[&str]) -> Vec<String> {
    let mut cmd = vec![
        "python3".to_string(),
        common::job_script().display().to_string(),
        history.display().to_string(),
    ];
    cmd.extend(extra.iter().map(|s| s.to_string()));
    cmd
}

fn start(dir: &Path, id: &str, store: &[String], command: Vec<String>) -> Leaderd {
    let mut args = store.to_vec();
    args.extend(timing());
    let node = Leaderd::start(Spec {
        identity: id,
        args,
        env: vec![],
        command,
        dir,
    });
    node.wait_http(Duration::from_secs(20));
    node
}

/// Lines of one identity: (ns, event, pid).
fn lines_of(history: &str, identity: &str) -> Vec<(u64, String, u32)> {
    history
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[2] == identity).then(|| {
                (
                    f[0].parse().unwrap_or(0),
                    f[1].to_string(),
                    f[4].parse().unwrap_or(0),
                )
            })
        })
        .collect()
}

fn leader_of(nodes: &[Leaderd]) -> Option<usize> {
    nodes.iter().position(|n| n.is_leader())
}

#[test]
fn store_unreachable_for_the_leader_only_stops_its_child_before_anyone_else_leads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    let emulator = common::emulators::shared_dynamodb_local();
    let upstream: std::net::SocketAddr = emulator
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("emulator endpoint is ip:port");
    let table = common::unique_name("faults");
    let ids = ["alpha", "bravo", "charlie"];
    let proxies: Vec<FaultProxy> = ids.iter().map(|_| FaultProxy::start(upstream)).collect();
    let mut nodes = Vec::new();
    for (id, proxy) in ids.iter().zip(&proxies) {
        let store = vec![
            "--store".to_string(),
            "dynamodb".into(),
            "--endpoint-url".into(),
            proxy.endpoint(),
            "--table".into(),
            table.clone(),
        ];
        let mut args = store;
        args.extend(timing());
        let node = Leaderd::start(Spec {
            identity: id,
            args,
            env: vec![("LEADERD_STORE__CREATE_TABLE".into(), "true".into())],
            command: job(&history, &["--grandchild"]),
            dir: dir.path(),
        });
        node.wait_http(Duration::from_secs(30));
        nodes.push(node);
    }
    wait_until(Duration::from_secs(20), || leader_of(&nodes).is_some()).expect("a leader");
    std::thread::sleep(Duration::from_millis(1_500));
    let old = leader_of(&nodes).expect("a leader");
    let old_id = nodes[old].identity.clone();

    let cut = monotonic_ns();
    proxies[old].set(Fault::Blackhole);
    wait_until(Duration::from_secs(10), || {
        nodes
            .iter()
            .enumerate()
            .any(|(i, n)| i != old && n.is_leader())
    })
    .expect("another instance leads");
    std::thread::sleep(Duration::from_secs(1));

    let log = std::fs::read_to_string(&history).expect("history");
    let summary = common::history::check(&log).unwrap_or_else(|v| panic!("{v}\n{log}"));
    let old_lines = lines_of(&log, &old_id);
    let end = old_lines
        .iter()
        .find(|(_, e, _)| e == "end")
        .expect("the old child got the stop signal and wrote `end`");
    let last = old_lines.iter().map(|l| l.0).max().expect("old lines");
    let stop_bound = cut + (VALIDITY - GRACE + SLACK).as_nanos() as u64;
    let kill_bound = cut + (VALIDITY + SLACK).as_nanos() as u64;
    assert!(
        end.0 <= stop_bound,
        "stop signal {} ms after the cut, allowed {} ms",
        (end.0 - cut) / 1_000_000,
        (stop_bound - cut) / 1_000_000
    );
    assert!(
        last <= kill_bound,
        "old tenure (with its TERM-ignoring grandchild) still ran {} ms after the cut, allowed {} ms",
        (last - cut) / 1_000_000,
        (kill_bound - cut) / 1_000_000
    );
    for (_, _, pid) in &old_lines {
        assert!(
            common::procfs::gone(*pid as i32),
            "old child process {pid} still alive"
        );
    }
    assert!(summary.tenures.len() >= 2, "{summary:?}");
    assert!(!nodes[old].is_leader());
}

#[test]
fn kill_9_of_leaderd_takes_its_child_and_grandchildren_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    let store = vec![
        "--store".to_string(),
        "sqlite".into(),
        "--store-path".into(),
        dir.path().join("l.db").display().to_string(),
    ];
    let mut node = start(
        dir.path(),
        "alpha",
        &store,
        job(&history, &["--grandchild"]),
    );
    wait_until(Duration::from_secs(10), || {
        let log = std::fs::read_to_string(&history).unwrap_or_default();
        lines_of(&log, "alpha")
            .iter()
            .filter(|l| l.1 == "start")
            .count()
            >= 2
    })
    .expect("child and grandchild started");
    let log = std::fs::read_to_string(&history).expect("history");
    let pids: std::collections::BTreeSet<u32> =
        lines_of(&log, "alpha").iter().map(|l| l.2).collect();
    assert_eq!(pids.len(), 2, "child and grandchild: {pids:?}");
    node.kill9();
    let took = wait_until(Duration::from_secs(5), || {
        pids.iter().all(|p| common::procfs::gone(*p as i32))
    })
    .expect("child and grandchild die with leaderd");
    assert!(took <= Duration::from_secs(1), "took {took:?}");
}

#[test]
fn sigstop_of_leaderd_alone_still_kills_its_child_by_the_end_of_validity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    let store = vec![
        "--store".to_string(),
        "sqlite".into(),
        "--store-path".into(),
        dir.path().join("l.db").display().to_string(),
    ];
    let mut nodes: Vec<Leaderd> = ["alpha", "bravo", "charlie"]
        .iter()
        .map(|id| start(dir.path(), id, &store, job(&history, &["--grandchild"])))
        .collect();
    wait_until(Duration::from_secs(10), || leader_of(&nodes).is_some()).expect("a leader");
    std::thread::sleep(Duration::from_millis(1_500));
    let old = leader_of(&nodes).expect("a leader");
    let old_id = nodes[old].identity.clone();

    let stopped_at = monotonic_ns();
    nodes[old].signal(Signal::SIGSTOP);
    std::thread::sleep(L.mul_f64(1.5));
    let log = std::fs::read_to_string(&history).expect("history");
    let last = lines_of(&log, &old_id)
        .iter()
        .map(|l| l.0)
        .max()
        .expect("old lines");
    let kill_bound = stopped_at + (VALIDITY + SLACK).as_nanos() as u64;
    assert!(
        last <= kill_bound,
        "child of the stopped leaderd ran {} ms after SIGSTOP, allowed {} ms",
        (last - stopped_at) / 1_000_000,
        (kill_bound - stopped_at) / 1_000_000
    );
    nodes[old].signal(Signal::SIGCONT);
    wait_until(Duration::from_secs(10), || {
        nodes
            .iter()
            .enumerate()
            .any(|(i, n)| i != old && n.is_leader())
    })
    .expect("another instance leads");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !nodes[old].is_leader(),
        "the thawed leaderd must not claim leadership"
    );
    // Its child ended because the guard stopped it for the lost lease, not on
    // its own: with on_child_exit = "exit" (the default) leaderd must go on
    // campaigning, not exit.
    assert!(
        nodes[old].wait_exit(Duration::from_millis(500)).is_none(),
        "the thawed leaderd exited instead of campaigning again:\n{}",
        nodes[old].log()
    );
    let log = std::fs::read_to_string(&history).expect("history");
    let summary = common::history::check(&log).unwrap_or_else(|v| panic!("{v}\n{log}"));
    assert!(summary.tenures.len() >= 2, "{summary}");
    for n in &mut nodes {
        n.kill9();
    }
}
