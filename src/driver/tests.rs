//! Nodes run by their drivers over the in-memory store, in tokio's paused
//! time: each election led by one daemon, and led again after one is
//! killed.

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
    let timing = ElectionConfig::with_defaults("-", identity);
    let passes = gate.as_ref().is_none_or(|g| *g.borrow() == Verdict::Pass);
    let mut node = Node::new(identity, &timing, clock.now(), passes).with_session(timing, false);
    for i in 0..ELECTIONS {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), identity);
        node.add_election(cfg, Duration::ZERO, false, |c| c);
    }
    let store: Arc<dyn LeaseStore> = store.clone();
    let (mut driver, handle) = NodeDriver::new(node, store, clock);
    if let Some(gate) = gate {
        driver = driver.gated(gate);
    }
    (handle, tokio::spawn(driver.run()))
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
