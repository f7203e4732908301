//! Nodes run by their drivers over the in-memory store, in tokio's paused
//! time: each election led by one daemon, and led again after one is
//! killed; the app check followed; a release told on the stream taken at
//! once.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::core::election::{ElectionConfig, Role};
use crate::lease::memory::MemoryStore;

const ELECTIONS: u32 = 6;

/// A node of `identity` campaigning for every election through its
/// session, driven over `store`; its handle and task.
fn start(identity: &str, store: &Arc<MemoryStore>) -> (NodeHandle, tokio::task::JoinHandle<()>) {
    start_gated(identity, store, None)
}

/// [`start`], following the app check's verdict `gate` if given.
fn start_gated(
    identity: &str,
    store: &Arc<MemoryStore>,
    gate: Option<watch::Receiver<Verdict>>,
) -> (NodeHandle, tokio::task::JoinHandle<()>) {
    let clock = Clock::tokio();
    let passes = gate.as_ref().is_none_or(|g| *g.borrow() == Verdict::Pass);
    let node = node(identity, &clock, passes, false);
    let store: Arc<dyn LeaseStore> = store.clone();
    let (mut driver, handle) = NodeDriver::new(node, store, clock);
    if let Some(gate) = gate {
        driver = driver.gated(gate);
    }
    (handle, tokio::spawn(driver.run()))
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
                labels: Default::default(),
            }),
            ..ElectionConfig::with_defaults(format!("e{i}"), identity)
        };
        node.add_election(cfg, Duration::ZERO, has_feed, |c| c);
    }
    node
}

/// For each election, the daemons (by index among `handles`, `None` for
/// a killed one) that lead it.
fn leaders(handles: &[Option<&NodeHandle>]) -> Vec<Vec<usize>> {
    (0..ELECTIONS as usize)
        .map(|e| {
            handles
                .iter()
                .enumerate()
                .filter_map(|(n, h)| {
                    let h = (*h)?;
                    (h.states[e].borrow().role == Role::Leader).then_some(n)
                })
                .collect()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_election_is_led_by_one_daemon_and_led_again_after_a_kill() {
    let store = Arc::new(MemoryStore::new());
    let (handles, tasks): (Vec<_>, Vec<_>) = ["a", "b", "c"]
        .into_iter()
        .map(|id| start(id, &store))
        .unzip();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let all: Vec<Option<&NodeHandle>> = handles.iter().map(Some).collect();
    let led = leaders(&all);
    assert!(led.iter().all(|l| l.len() == 1), "leaders: {led:?}");
    for (n, h) in handles.iter().enumerate() {
        if led.iter().any(|l| l == &[n]) {
            assert!(
                h.session.borrow().is_some(),
                "a leader holds through its session"
            );
        }
    }
    // kill -9 of the daemon that leads the first election: its task ends
    // where it is, nothing released.
    let killed = led[0][0];
    tasks[killed].abort();
    let living: Vec<Option<&NodeHandle>> = handles
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
    let (a, _task_a) = start_gated("a", &store, Some(gate));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let led = leaders(&[Some(&a)]);
    assert!(led.iter().all(|l| l == &[0]), "a leads all: {led:?}");
    let (b, _task_b) = start("b", &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The app check fails: the daemon releases what it leads (its jobs
    // stopped first), and takes nothing back.
    verdict.send_replace(Verdict::Fail);
    for e in 0..ELECTIONS {
        let (done, released) = oneshot::channel();
        let input = NodeInput::Release {
            election: ElectionId(e),
            then: crate::core::election::AfterRelease::SitOut(Duration::ZERO),
            successor: None,
        };
        let command = Command {
            input,
            answer: Some(done),
        };
        assert!(a.commands.send(command).await.is_ok());
        assert_eq!(released.await, Ok(true), "election {e} released");
    }
    // Within a lease and a few P, b leads every election; a none.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let led = leaders(&[Some(&a), Some(&b)]);
    assert!(led.iter().all(|l| l == &[1]), "b leads all: {led:?}");
}

#[tokio::test(start_paused = true)]
async fn a_follower_told_of_a_release_takes_the_election_at_once() {
    let store = Arc::new(MemoryStore::new());
    let (a, _task_a) = start("a", &store);
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
            if hints_tx.send((ElectionId(e), hint)).await.is_err() {
                return;
            }
        }
    });
    let store_b: Arc<dyn LeaseStore> = store.clone();
    let (driver, b) = NodeDriver::new(node("b", &clock, true, true), store_b, clock);
    tokio::spawn(driver.with_hints(hints).run());
    // Half a retry interval off b's polls (they come every P from its
    // start), so that only the hint can explain a take within 100 ms.
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    assert_eq!(leaders(&[Some(&a), Some(&b)])[0], [0], "a leads e0");
    // a resigns e0 to anyone (and sits out a lease): b, told, takes it
    // well within a retry interval (its poll would take up to one).
    let (done, released) = oneshot::channel();
    let input = NodeInput::Release {
        election: ElectionId(0),
        then: crate::core::election::AfterRelease::SitOut(Duration::from_secs(10)),
        successor: None,
    };
    let command = Command {
        input,
        answer: Some(done),
    };
    assert!(a.commands.send(command).await.is_ok());
    assert_eq!(released.await, Ok(true));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(leaders(&[Some(&a), Some(&b)])[0], [1], "b leads e0");
}
