//! The sweep of session records on SQLite: what the store deletes of what
//! its judge names, and the daemon's judge (`crate::core::sweep`) over a
//! real file.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::SqliteStore;
use crate::core::sweep::SessionSweep;
use crate::core::time::Instant;
use crate::lease::{Condition, Lease, LeaseStore, Record, StaleSession, is_session_key};

const MS: Duration = Duration::from_millis(1);
const D: f64 = 0.01;
/// L·(1+D) of a session record promising 10 s.
const WAIT: Duration = Duration::from_millis(10_100);

fn t0() -> Instant {
    Instant::from_since_origin(Duration::from_secs(100))
}

/// A store at `path` with a record under each of `keys`, held by `me`.
async fn store_with(path: &Path, keys: &[&str]) -> (SqliteStore, Vec<Lease>) {
    let store = SqliteStore::open(path).expect("open");
    let leases: Vec<Lease> = keys
        .iter()
        .map(|key| Lease::stamped(key, "me", 1, 10_000, 1, None))
        .collect();
    for lease in &leases {
        store
            .put(lease, &Condition::NotExists, Duration::from_secs(10))
            .await
            .expect("put");
    }
    (store, leases)
}

/// `keys` judged stale, each by the `rvn` its lease among `leases` has.
fn stale_of(leases: &[Lease], keys: &[&str]) -> Vec<StaleSession> {
    keys.iter()
        .map(|key| StaleSession {
            key: (*key).to_owned(),
            rvn: leases
                .iter()
                .find(|l| l.election == *key)
                .map(|l| l.rvn.clone())
                .expect("one of the leases"),
        })
        .collect()
}

/// The keys of every record left in `store`, in order.
async fn keys_left(store: &SqliteStore) -> Vec<String> {
    store
        .scan(Duration::from_secs(10))
        .await
        .expect("scan")
        .iter()
        .filter_map(|r| r.key().map(str::to_owned))
        .collect()
}

/// The sweep reads the session records only (one range), and deletes
/// those its judge names only while they still have the `rvn` judged, of a
/// format this build knows, under a session key.
#[tokio::test]
async fn a_sweep_deletes_what_its_judge_names_only_if_unchanged_and_a_session() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let budget = Duration::from_secs(10);
    let (store, leases) = store_with(
        &path,
        &[
            "#session/a/named",
            "#session/b/kept",
            "#session/c/renewed",
            "#session/d/later-format",
            "#sessions-are-not-this",
            "e",
            "#member/a",
        ],
    )
    .await;
    // Another process, with a connection of its own.
    let other = || Connection::open(&path).expect("a second connection");
    other()
        .execute(
            "UPDATE leases SET format = 4 WHERE election = '#session/d/later-format'",
            [],
        )
        .expect("a later release's session");
    let named = stale_of(
        &leases,
        &[
            "#session/a/named",
            "#session/c/renewed",
            "#session/d/later-format",
            "e",
        ],
    );
    let mut judged = Vec::new();
    let mut judge = |records: &[Record]| {
        judged = records
            .iter()
            .filter_map(|r| r.key().map(str::to_owned))
            .collect();
        // Renewed by its owner after the read, before the delete.
        other()
            .execute(
                "UPDATE leases SET rvn = 'fresh' WHERE election = '#session/c/renewed'",
                [],
            )
            .expect("a renew");
        named.clone()
    };
    assert_eq!(store.sweep_sessions(&mut judge, budget).await, Ok(1));
    assert_eq!(
        judged,
        [
            "#session/a/named",
            "#session/b/kept",
            "#session/c/renewed",
            "#session/d/later-format"
        ]
    );
    assert_eq!(
        keys_left(&store).await,
        [
            "#member/a",
            "#session/b/kept",
            "#session/c/renewed",
            "#session/d/later-format",
            "#sessions-are-not-this",
            "e"
        ]
    );
    // A judge that names nothing: nothing is written.
    let mut none = |_: &[Record]| Vec::new();
    assert_eq!(store.sweep_sessions(&mut none, budget).await, Ok(0));
}

/// The session records left in `store`.
async fn session_keys(store: &SqliteStore) -> Vec<String> {
    let mut keys = keys_left(store).await;
    keys.retain(|k| is_session_key(k));
    keys
}

/// Sweep `store` with `sweep`, judged at `at` with the wall clock two days
/// ahead of every `expires_at` (the skewed daemon of the defect report).
async fn sweep_at(store: &SqliteStore, sweep: &mut SessionSweep, at: Instant) -> u64 {
    let two_days_ahead = crate::clock::unix_ms() / 1000 + 2 * 24 * 3600;
    let mut judge = |records: &[Record]| sweep.judge(records, at, two_days_ahead);
    store
        .sweep_sessions(&mut judge, Duration::from_secs(10))
        .await
        .expect("sweep")
}

#[tokio::test]
async fn on_sqlite_only_sessions_unchanged_for_the_wait_are_deleted() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(&dir.path().join("l.db")).expect("open");
    let budget = Duration::from_secs(10);
    let open = |key: &str| Lease::stamped(key, "owner", 1, 10_000, 1_000, None);
    let (live, renewed, ended, later) = (
        open("#session/live/1"),
        open("#session/renewed/1"),
        open("#session/ended/1"),
        open("#session/later/1"),
    );
    for lease in [&live, &renewed, &ended, &later] {
        store.create(lease, budget).await.expect("create");
    }
    store
        .release(&ended.released(), &ended.rvn, "owner", budget)
        .await
        .expect("end the session");
    let path = store.path().to_owned();
    rusqlite::Connection::open(&path)
        .and_then(|c| {
            c.execute(
                "UPDATE leases SET format = 4 WHERE election = '#session/later/1'",
                [],
            )
        })
        .expect("a later release's session");
    let mut sweep = SessionSweep::new(D);

    // Every record is timed, none goes at first sight.
    assert_eq!(sweep_at(&store, &mut sweep, t0()).await, 0);
    // Observed for less than the wait: kept.
    assert_eq!(sweep_at(&store, &mut sweep, t0() + (WAIT - MS)).await, 0);
    // Renewed in between: timed anew; the live one and the ended one,
    // unchanged for the wait, go.
    let renewal = renewed.renewed();
    store
        .renew(&renewal, &renewed.rvn, budget)
        .await
        .expect("renew");
    assert_eq!(sweep_at(&store, &mut sweep, t0() + WAIT).await, 2);
    assert_eq!(
        session_keys(&store).await,
        ["#session/later/1", "#session/renewed/1"]
    );
    assert_eq!(
        sweep_at(&store, &mut sweep, t0() + (2 * WAIT - MS)).await,
        0
    );
    assert_eq!(sweep_at(&store, &mut sweep, t0() + 2 * WAIT).await, 1);
    // A later format's record is never touched, however long it stays.
    assert_eq!(sweep_at(&store, &mut sweep, t0() + 100 * WAIT).await, 0);
    assert_eq!(session_keys(&store).await, ["#session/later/1"]);
    let stored = store.read("#session/later/1", budget).await.expect("read");
    assert!(
        matches!(stored, Record::UnknownFormat(_)),
        "{stored:?} is not the later format's record"
    );
}

/// More records than one delete transaction takes: all go, in turns.
#[tokio::test]
async fn on_sqlite_many_stale_sessions_all_go() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(&dir.path().join("l.db")).expect("open");
    let budget = Duration::from_secs(10);
    for i in 0..600 {
        let key = format!("#session/node-{i:03}/0123456789abcdef");
        let lease = Lease::stamped(&key, "node", 1, 10_000, 1_000, None);
        store.create(&lease, budget).await.expect("create");
    }
    let mut sweep = SessionSweep::new(D);
    assert_eq!(sweep_at(&store, &mut sweep, t0()).await, 0);
    assert_eq!(sweep.timing(), 600);
    assert_eq!(sweep_at(&store, &mut sweep, t0() + WAIT).await, 600);
    assert_eq!(session_keys(&store).await, Vec::<String>::new());
}
