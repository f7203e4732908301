//! Nodes run by their drivers over the in-memory store, in tokio's paused
//! time: each election led by one daemon, and led again after one is
//! killed; the app check followed; a release told on the stream taken at
//! once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};

use super::*;
use crate::core::election::{ElectionConfig, Role};
use crate::core::hints::Hint;
use crate::election::{Clients, NoObserver};
use crate::lease::LeaseStore;
use crate::lease::memory::MemoryStore;

const ELECTIONS: u32 = 6;

/// A daemon run through the driver: its elections, its node.
struct Daemon {
    elections: Vec<ElectionHandle>,
    running: Running,
    /// What its elections tell.
    told: broadcast::Sender<LeaseEvent>,
}

/// A node of `identity` campaigning for every election through its
/// session, driven over `store`.
fn start(identity: &str, store: &Arc<MemoryStore>) -> Daemon {
    start_with(identity, store, None, None)
}

/// [`start`], following the app check's verdict `gate` and taking hints
/// from `hints`, if given.
fn start_with(
    identity: &str,
    store: &Arc<MemoryStore>,
    gate: Option<watch::Receiver<Verdict>>,
    hints: Option<mpsc::Receiver<NodeInput>>,
) -> Daemon {
    let clock = Clock::tokio();
    let passes = gate.as_ref().is_none_or(|g| *g.borrow() == Verdict::Pass);
    let node = node(identity, &clock, passes, hints.is_some());
    let store: Arc<dyn LeaseStore> = store.clone();
    let context = TaskContext {
        store,
        clock,
        observer: Arc::new(NoObserver),
    };
    let (driver, elections, mut running) = NodeDriver::new(node, context);
    let (told, _) = broadcast::channel(64);
    let mut driver = driver.gated(gate).telling(told.clone());
    if let Some(hints) = hints {
        driver = driver.with_hints(hints, Box::new(Clients::default()));
    }
    driver.spawn(&mut running);
    Daemon {
        elections,
        running,
        told,
    }
}

/// The node of `identity`: every election through its session, each
/// advertising an address (so that its followers take its hints);
/// `has_feed`: its elections take hints.
fn node(identity: &str, clock: &Clock, may_campaign: bool, has_feed: bool) -> Node {
    let timing = ElectionConfig::with_defaults("-", identity);
    let mut node =
        Node::new(identity, &timing, clock.now(), may_campaign).with_session(timing, false);
    for i in 0..ELECTIONS {
        let cfg = ElectionConfig {
            holder_meta: Some(crate::lease::HolderMeta {
                address: Some(format!("{identity}:80")),
                ..Default::default()
            }),
            ..ElectionConfig::with_defaults(format!("e{i}"), identity)
        };
        node.add_election(cfg, Duration::ZERO, has_feed, |c| c);
    }
    node
}

/// For each election, the daemons (by index among `handles`, `None` for
/// a killed one) that lead it.
fn leaders(handles: &[Option<&Daemon>]) -> Vec<Vec<usize>> {
    (0..ELECTIONS as usize)
        .map(|e| {
            handles
                .iter()
                .enumerate()
                .filter_map(|(n, h)| {
                    let h = (*h)?;
                    (h.elections[e].state.borrow().role == Role::Leader).then_some(n)
                })
                .collect()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_election_is_led_by_one_daemon_and_led_again_after_a_kill() {
    let store = Arc::new(MemoryStore::new());
    let handles: Vec<Daemon> = ["a", "b", "c"]
        .into_iter()
        .map(|id| start(id, &store))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let all: Vec<Option<&Daemon>> = handles.iter().map(Some).collect();
    let led = leaders(&all);
    assert!(led.iter().all(|l| l.len() == 1), "leaders: {led:?}");
    for (n, h) in handles.iter().enumerate() {
        if led.iter().any(|l| l == &[n]) {
            assert!(
                h.running.session.borrow().is_some(),
                "a leader holds through its session"
            );
        }
    }
    // kill -9 of the daemon that leads the first election: its task ends
    // where it is, nothing released.
    let killed = led[0][0];
    handles[killed].running.abort();
    let living: Vec<Option<&Daemon>> = handles
        .iter()
        .enumerate()
        .map(|(n, h)| (n != killed).then_some(h))
        .collect();
    // L·(1+D) + a few P after the kill: every election led again, once.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let led = leaders(&living);
    assert!(
        led.iter().all(|l| l.len() == 1),
        "leaders after the kill of {killed}: {led:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_daemon_whose_app_check_fails_takes_nothing_and_what_it_released_goes_to_the_other() {
    let store = Arc::new(MemoryStore::new());
    let (verdict, gate) = watch::channel(Verdict::Pass);
    let a = start_with("a", &store, Some(gate), None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let led = leaders(&[Some(&a)]);
    assert!(led.iter().all(|l| l == &[0]), "a leads all: {led:?}");
    let b = start("b", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The app check fails: the daemon releases what it leads (its jobs
    // stopped first), and takes nothing back.
    verdict.send_replace(Verdict::Fail);
    for (e, h) in a.elections.iter().enumerate() {
        let released = h.release(AfterRelease::SitOut(Duration::ZERO)).await;
        assert!(released, "election {e} released");
    }
    // Within a lease and a few P, b leads every election; a none.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let led = leaders(&[Some(&a), Some(&b)]);
    assert!(led.iter().all(|l| l == &[1]), "b leads all: {led:?}");
}

#[tokio::test(start_paused = true)]
async fn a_follower_told_of_a_release_takes_the_election_at_once() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // b hears a's stream: every event a tells reaches b at once.
    let clock = Clock::tokio();
    let (hints_tx, hints) = mpsc::channel(64);
    let mut stream = a.told.subscribe();
    let hint_clock = clock.clone();
    tokio::spawn(async move {
        while let Ok(event) = stream.recv().await {
            let Some(e) = event
                .election()
                .and_then(|name| name.strip_prefix('e'))
                .and_then(|n| n.parse().ok())
            else {
                continue;
            };
            let hint = Hint::Event {
                at: hint_clock.now(),
                event: Box::new(event),
            };
            let input = NodeInput::Hint {
                election: ElectionId(e),
                hint,
            };
            if hints_tx.send(input).await.is_err() {
                return;
            }
        }
    });
    let b = start_with("b", &store, None, Some(hints));
    // Half a retry interval off b's polls (they come every P from its
    // start), so that only the hint can explain a take within 100 ms.
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    assert_eq!(leaders(&[Some(&a), Some(&b)])[0], [0], "a leads e0");
    // a resigns e0 to anyone (and sits out a lease): b, told, takes it
    // well within a retry interval (its poll would take up to one).
    let released = a.elections[0]
        .release(AfterRelease::SitOut(Duration::from_secs(10)))
        .await;
    assert!(released);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(leaders(&[Some(&a), Some(&b)])[0], [1], "b leads e0");
}

#[tokio::test(start_paused = true)]
async fn requests_are_carried_out_concurrently_so_a_slow_store_delays_each_election_once() {
    let store = Arc::new(MemoryStore::new());
    // Every answer comes a second late: one after another, the session's
    // open and six elections' reads and creates would take 13 s.
    store.set_fault(crate::lease::memory::Fault::Slow(Duration::from_secs(1)));
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let led = leaders(&[Some(&a)]);
    assert!(led.iter().all(|l| l == &[0]), "a leads all: {led:?}");
}

#[tokio::test(start_paused = true)]
async fn a_dead_daemons_session_is_ended_once_for_all_the_elections_held_through_it() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = start("b", &store);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let led = leaders(&[Some(&a), Some(&b)]);
    assert!(led.iter().all(|l| l == &[0]), "a leads all: {led:?}");
    let before = store.writes_to("#session/a/");
    a.running.abort();
    tokio::time::sleep(Duration::from_secs(16)).await;
    let led = leaders(&[None, Some(&b)]);
    assert!(led.iter().all(|l| l == &[1]), "b leads all: {led:?}");
    // Every election of b found a's session over at the same instant.
    assert_eq!(
        store.writes_to("#session/a/") - before,
        1,
        "ends of a's session written for {ELECTIONS} elections"
    );
}

#[tokio::test(start_paused = true)]
async fn a_daemon_of_many_free_elections_keeps_its_campaign_requests_within_the_bound() {
    let store = Arc::new(MemoryStore::new());
    store.set_fault(crate::lease::memory::Fault::Slow(Duration::from_millis(
        500,
    )));
    let n = 3 * CAMPAIGN_REQUESTS;
    let (led, running) = lead_free(&store, n, Duration::from_secs(20)).await;
    assert_eq!(led, n, "every election is led in the end");
    // The bound, and the session's own writes beside it, which never wait.
    let most = store.most_at_once();
    assert!(
        (CAMPAIGN_REQUESTS..=CAMPAIGN_REQUESTS + 2).contains(&most),
        "{most} requests in the store at once, for {n} elections"
    );
    assert!(
        running.session.borrow().is_some(),
        "the session stayed open"
    );
}

/// A daemon `a` of `n` elections, all free on `store`, driven for `run`:
/// how many it leads then, and its running node.
async fn lead_free(store: &Arc<MemoryStore>, n: usize, run: Duration) -> (usize, Running) {
    let clock = Clock::tokio();
    let timing = ElectionConfig::with_defaults("-", "a");
    let mut node = Node::new("a", &timing, clock.now(), true).with_session(timing, false);
    node.reserve(n);
    for i in 0..n {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), "a");
        node.add_election(cfg, Duration::ZERO, false, |c| c);
    }
    let context = TaskContext {
        store: store.clone(),
        clock,
        observer: Arc::new(NoObserver),
    };
    let (driver, elections, mut running) = NodeDriver::new(node, context);
    driver.spawn(&mut running);
    tokio::time::sleep(run).await;
    let led = elections
        .iter()
        .filter(|e| e.state.borrow().role == Role::Leader)
        .count();
    (led, running)
}

/// The takes one input asks for go to the store together, a hundred at
/// most to a request: 250 free elections are taken in three requests.
#[tokio::test(start_paused = true)]
async fn the_takes_an_input_asks_for_go_together_a_hundred_at_most() {
    let store = Arc::new(MemoryStore::new());
    let n = 250;
    let (led, _running) = lead_free(&store, n, Duration::from_secs(5)).await;
    assert_eq!(led, n, "every election is led");
    let batches = store.batches();
    assert_eq!(
        batches.iter().sum::<usize>(),
        n,
        "one take each: {batches:?}"
    );
    assert_eq!(batches, vec![100, 100, 50]);
}

#[tokio::test(start_paused = true)]
async fn the_labels_set_ride_on_the_sessions_next_write() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let key = a
        .running
        .session
        .borrow()
        .as_ref()
        .map(|v| v.key.clone())
        .expect("a's session is open");
    let labels = BTreeMap::from([("led".to_owned(), "6".to_owned())]);
    a.running.labels.send_replace(labels.clone());
    // Within a renew interval the session's record carries them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let crate::lease::Record::Valid(session) = store.get(&key) else {
        panic!("no session record under {key}");
    };
    let meta = session.holder_meta.expect("the session names its holder");
    assert_eq!(meta.labels, labels);
}

#[tokio::test(start_paused = true)]
async fn a_release_of_an_ended_election_is_answered_at_once() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(a.elections[0].release(AfterRelease::Exit).await);
    // Ended: nothing more to release, and nobody waits for an answer.
    let again = tokio::time::timeout(
        Duration::from_secs(1),
        a.elections[0].release(AfterRelease::Exit),
    )
    .await;
    assert_eq!(again, Ok(false));
}

#[tokio::test(start_paused = true)]
async fn closing_releases_what_is_left_ends_the_session_and_the_node() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let key = a
        .running
        .session
        .borrow()
        .as_ref()
        .map(|v| v.key.clone())
        .expect("a's session is open");
    let Daemon { running, .. } = a;
    tokio::time::timeout(Duration::from_secs(5), running.close())
        .await
        .expect("the node ends within a few seconds");
    let crate::lease::Record::Valid(session) = store.get(&key) else {
        panic!("no session record under {key}");
    };
    assert_eq!(session.holder, None, "the session was ended");
    for i in 0..ELECTIONS {
        let crate::lease::Record::Valid(e) = store.get(&format!("e{i}")) else {
            panic!("no record of e{i}");
        };
        assert_eq!(e.holder, None, "e{i} released");
    }
}

#[tokio::test(start_paused = true)]
async fn closing_after_every_election_was_released_ends_the_node() {
    let store = Arc::new(MemoryStore::new());
    let a = start("a", &store);
    let b = start("b", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    for d in [&a, &b] {
        for h in &d.elections {
            h.release(AfterRelease::Exit).await;
        }
    }
    for d in [a, b] {
        tokio::time::timeout(Duration::from_secs(5), d.running.close())
            .await
            .expect("the node ends within a few seconds");
    }
}
