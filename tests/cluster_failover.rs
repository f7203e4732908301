//! Three real `leaderd` processes campaign for one election, on SQLite, on
//! DynamoDB Local and on PostgreSQL: exactly one answers 200 on `/leader` at every sample, a
//! crashed leader (kill -9) is replaced within L·(1+D) + P + 1 s, a leader
//! stopped with SIGTERM within P + 1 s (it releases the lease).

use crate::common;

use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaders, wait_until};
use nix::sys::signal::Signal;

/// L = 3 s, R = 1 s, P = 500 ms, G = 1 s: short enough for a quick test,
/// valid under R + G + M + L·D < L.
const TIMING: [&str; 8] = [
    "--lease-duration",
    "3s",
    "--renew-interval",
    "1s",
    "--retry-interval",
    "500ms",
    "--kill-grace",
    "1s",
];
const L: Duration = Duration::from_secs(3);
const P: Duration = Duration::from_millis(500);

fn crash_bound() -> Duration {
    L.mul_f64(1.01) + P + Duration::from_secs(1)
}

fn graceful_bound() -> Duration {
    P + Duration::from_secs(1)
}

fn start_three(
    dir: &std::path::Path,
    store_args: &[String],
    env: &[(String, String)],
) -> Vec<Leaderd> {
    ["alpha", "bravo", "charlie"]
        .iter()
        .map(|id| {
            let mut args: Vec<String> = store_args.to_vec();
            args.extend(TIMING.iter().map(|s| s.to_string()));
            args.extend(["--election".into(), "report".into()]);
            Leaderd::start(Spec {
                identity: id,
                args,
                env: env.to_vec(),
                command: vec![],
                dir,
            })
        })
        .collect()
}

fn scenario(mut nodes: Vec<Leaderd>) {
    for n in &nodes {
        n.wait_http(Duration::from_secs(20));
    }
    let refs = || nodes.iter().collect::<Vec<_>>();
    assert!(
        wait_until(Duration::from_secs(15), || leaders(&refs()).len() == 1).is_some(),
        "no single leader emerged: {:?}",
        leaders(&refs())
    );

    // Every 100 ms for 10 s, exactly one instance answers 200.
    for i in 0..100 {
        let now = leaders(&refs());
        assert_eq!(now.len(), 1, "sample {i}: leaders {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The 503 body of a follower names the leader.
    let leader_id = leaders(&refs())[0].clone();
    let follower = nodes
        .iter()
        .find(|n| n.identity != leader_id)
        .expect("two followers");
    let (status, body) = follower.leader().expect("follower answers");
    assert_eq!(status, 503);
    assert_eq!(body["leader"], leader_id.as_str(), "{body}");
    assert_eq!(body["is_leader"], false);

    // kill -9 of the leader: a new leader within L·(1+D) + P + 1 s.
    let idx = nodes
        .iter()
        .position(|n| n.identity == leader_id)
        .expect("leader");
    let mut crashed = nodes.remove(idx);
    crashed.kill9();
    let took = wait_until(crash_bound() + Duration::from_secs(5), || {
        leaders(&nodes.iter().collect::<Vec<_>>()).len() == 1
    })
    .expect("a new leader after kill -9");
    assert!(
        took <= crash_bound(),
        "failover after kill -9 took {took:?} > {:?}",
        crash_bound()
    );
    eprintln!("failover after kill -9: {took:?}");

    // SIGTERM of the new leader: it releases, the last one leads within P + 1 s.
    let leader_id = leaders(&nodes.iter().collect::<Vec<_>>())[0].clone();
    let idx = nodes
        .iter()
        .position(|n| n.identity == leader_id)
        .expect("leader");
    let mut stopped = nodes.remove(idx);
    stopped.signal(Signal::SIGTERM);
    let took = wait_until(graceful_bound() + Duration::from_secs(5), || {
        nodes[0].is_leader()
    })
    .expect("the last instance leads after SIGTERM of the leader");
    assert!(
        took <= graceful_bound(),
        "handover after SIGTERM took {took:?} > {:?}",
        graceful_bound()
    );
    eprintln!("handover after SIGTERM: {took:?}");
    let status = stopped
        .wait_exit(Duration::from_secs(10))
        .expect("leaderd exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
}

#[test]
fn three_instances_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let store = vec![
        "--store".to_string(),
        "sqlite".into(),
        "--store-path".into(),
        db.display().to_string(),
    ];
    scenario(start_three(dir.path(), &store, &[]));
}

#[test]
fn three_instances_on_dynamodb_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    let emulator = common::emulators::dynamodb_local();
    let table = format!("cluster{}", std::process::id());
    let store = vec![
        "--store".to_string(),
        "dynamodb".into(),
        "--endpoint-url".into(),
        emulator.endpoint.clone(),
        "--table".into(),
        table,
    ];
    // Each instance may create the table: creation is idempotent.
    let env = [(
        "LEADERD_STORE__CREATE_TABLE".to_string(),
        "true".to_string(),
    )];
    scenario(start_three(dir.path(), &store, &env));
}

#[test]
fn three_instances_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = common::postgres::shared_postgres().args(&common::unique_name("cluster"));
    // All three create the table at once: one creates it, the others find
    // it, none fails.
    let env = [(
        "LEADERD_STORE__CREATE_TABLE".to_string(),
        "true".to_string(),
    )];
    scenario(start_three(dir.path(), &store, &env));
}
