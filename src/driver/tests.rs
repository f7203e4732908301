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
    let clock = Clock::tokio();
    let timing = ElectionConfig::with_defaults("-", identity);
    let mut node = Node::new(identity, &timing, clock.now(), true).with_session(timing, false);
    for i in 0..ELECTIONS {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), identity);
        node.add_election(cfg, Duration::ZERO, false, |c| c);
    }
    let store: Arc<dyn LeaseStore> = store.clone();
    let (driver, handle) = NodeDriver::new(node, store, clock);
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
