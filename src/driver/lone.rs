//! One election run by a node of its own through the driver, for the
//! tests of one election's behaviour (`engine_tests`, `hint_tests`).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::{ElectionHandle, NodeDriver, Running};
use crate::app_check::Verdict;
use crate::clock::Clock;
use crate::core::election::ElectionConfig;
use crate::core::node::{Node, NodeInput};
use crate::election::{Clients, Observer, TaskContext};
use crate::lease::LeaseStore;

/// The election, and its node.
pub(super) struct Lone {
    handle: ElectionHandle,
    running: Running,
}

impl Deref for Lone {
    type Target = ElectionHandle;
    fn deref(&self) -> &ElectionHandle {
        &self.handle
    }
}

impl DerefMut for Lone {
    fn deref_mut(&mut self) -> &mut ElectionHandle {
        &mut self.handle
    }
}

impl Lone {
    /// Wait for the node to end.
    pub(super) async fn join(mut self) {
        if let Some(task) = self.running.task.take() {
            let _ = task.await;
        }
    }
}

/// What the election follows besides the store.
#[derive(Default)]
pub(super) struct Links {
    /// The app check's verdict.
    pub(super) gate: Option<watch::Receiver<Verdict>>,
    /// Its hints, and where it is told to watch.
    pub(super) hints: Option<(mpsc::Receiver<NodeInput>, watch::Sender<Option<String>>)>,
}

/// Start the election; it campaigns at once.
pub(super) fn spawn(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
) -> Lone {
    spawn_after(store, config, clock, observer, Duration::ZERO)
}

/// Start the election; its first store request waits `delay`.
pub(super) fn spawn_after(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
    delay: Duration,
) -> Lone {
    spawn_gated(store, config, clock, observer, delay, Links::default())
}

/// [`spawn_after`], following `links`.
pub(super) fn spawn_gated(
    store: Arc<dyn LeaseStore>,
    config: ElectionConfig,
    clock: Clock,
    observer: Arc<dyn Observer>,
    delay: Duration,
    links: Links,
) -> Lone {
    let passes = links
        .gate
        .as_ref()
        .is_none_or(|g| *g.borrow() == Verdict::Pass);
    let mut node = Node::new(&config.identity.clone(), &config, clock.now(), passes);
    node.add_election(config, delay, links.hints.is_some(), |c| c);
    let context = TaskContext {
        store,
        clock,
        observer,
    };
    let (mut driver, mut handles, mut running) = NodeDriver::new(node, context);
    driver = driver.gated(links.gate);
    if let Some((hints, target)) = links.hints {
        driver = driver.with_hints(hints, Box::new(Clients(vec![target])));
    }
    driver.spawn(&mut running);
    Lone {
        handle: handles.remove(0),
        running,
    }
}
