//! What a daemon of a thousand elections logs when many of them meet the
//! same trouble at once: a line for them all, not one each.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::core::election::{ElectionConfig, Role};
use crate::election::NoObserver;
use crate::lease::LeaseStore;
use crate::lease::memory::{Fault, MemoryStore};

const MANY: u32 = 1_000;

/// The lines logged while it lives, at INFO and above.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Logs of this thread (the test's runtime) go here until the guard
    /// is dropped.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Lines that contain every one of `parts`.
    fn count(&self, parts: &[&str]) -> usize {
        self.text()
            .lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .count()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

/// `identity`'s node of [`MANY`] elections through its session, driven
/// over `store`: its elections' handles, its running node.
fn start(identity: &str, store: &Arc<MemoryStore>) -> (Vec<ElectionHandle>, Running) {
    let clock = Clock::tokio();
    let timing = ElectionConfig::with_defaults("-", identity);
    let mut node = Node::new(identity, &timing, clock.now(), true).with_session(timing, false);
    node.reserve(MANY as usize);
    for i in 0..MANY {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), identity);
        node.add_election(cfg, Duration::ZERO, false, |c| c);
    }
    let store: Arc<dyn LeaseStore> = store.clone();
    let context = TaskContext {
        store,
        clock,
        observer: Arc::new(NoObserver),
    };
    let (driver, elections, mut running) = NodeDriver::new(node, context);
    driver.spawn(&mut running);
    (elections, running)
}

/// "a" started over `store` and leading every election.
async fn a_leads_all(store: &Arc<MemoryStore>) -> (Vec<ElectionHandle>, Running) {
    let (elections, running) = start("a", store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(led(&elections), MANY as usize, "a leads every election");
    (elections, running)
}

fn led(elections: &[ElectionHandle]) -> usize {
    elections
        .iter()
        .filter(|e| e.state.borrow().role == Role::Leader)
        .count()
}

/// A daemon stopped while the store refuses every request: each release
/// fails, the first is logged with its election and the rest together.
#[tokio::test(start_paused = true)]
async fn releases_failing_alike_at_shutdown_are_logged_once_and_summed() {
    let store = Arc::new(MemoryStore::new());
    let (_elections, running) = a_leads_all(&store).await;
    let log = Captured::default();
    let _guard = log.install();
    store.set_fault(Fault::Unreachable);
    running.close().await;
    let all = log.text();
    assert_eq!(
        log.count(&["WARN", "release failed"]),
        1,
        "one release failure logged with its election:\n{all}"
    );
    let summed = format!("{} more releases failed with transport errors", MANY - 1);
    assert_eq!(log.count(&["WARN", &summed]), 1, "the rest summed:\n{all}");
}

/// A follower of a thousand elections whose store goes down: its
/// elections' reads fail together, logged once, and once more when they
/// work again.
#[tokio::test(start_paused = true)]
async fn a_store_down_under_a_thousand_followers_is_logged_once() {
    let store = Arc::new(MemoryStore::new());
    let (_held, _a) = a_leads_all(&store).await;
    let (followed, _b) = start("b", &store);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(led(&followed), 0, "b follows");
    let log = Captured::default();
    let _guard = log.install();
    store.set_fault(Fault::Unreachable);
    tokio::time::sleep(Duration::from_secs(8)).await;
    store.set_fault(Fault::None);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let all = log.text();
    let failed = log.count(&["WARN", "identity=b", "store request failed"]);
    let again = log.count(&["INFO", "identity=b", "work again"]);
    assert!(
        (1..=2).contains(&failed),
        "{failed} lines of b's elections' failures:\n{all}"
    );
    assert!(
        (1..=2).contains(&again),
        "{again} lines of their end:\n{all}"
    );
}

/// A session that lapses stops every election held through it at once:
/// a few losses are logged with their elections, the rest summed.
#[tokio::test(start_paused = true)]
async fn a_lapsed_session_logs_a_few_losses_and_the_sum() {
    let store = Arc::new(MemoryStore::new());
    let (held, _a) = a_leads_all(&store).await;
    let log = Captured::default();
    let _guard = log.install();
    store.set_fault(Fault::Unreachable);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(led(&held), 0, "every election stopped");
    let all = log.text();
    let each = usize::try_from(super::error_log::BURST_LOGGED).unwrap_or(usize::MAX);
    assert_eq!(
        log.count(&["WARN", "lease lost: stopping the child"]),
        each,
        "{all}"
    );
    let summed = format!(
        "lease lost by {} more elections at the same moment",
        MANY as usize - each
    );
    assert_eq!(log.count(&["WARN", &summed]), 1, "{all}");
}
