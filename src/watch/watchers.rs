//! The sessions named by the daemons that watch this one.
//!
//! A follower daemon opening `GET /v1/watch` names its session in a header,
//! so that balance can learn of a member leading nothing yet without a Scan
//! of the table. Anyone can send that header, so what it says is only a
//! name to look up: it lives as long as the stream that carried it (the
//! watch slots bound how many there are), and balance counts the session
//! once a read of the store shows it held ([`Watchers::unchecked`],
//! [`Watchers::checked`]). A made-up name costs one read of the store per
//! stream, and occupies nothing once its stream ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The names of the open streams; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Watchers(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    open: Mutex<Open>,
    /// Woken when a stream opens with a name.
    named: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// By the order the streams opened in.
    streams: BTreeMap<u64, Named>,
}

#[derive(Debug)]
struct Named {
    key: String,
    /// Looked up in the store since the stream opened.
    checked: bool,
}

/// One open stream's name; it is forgotten when this is dropped (with the
/// stream).
#[derive(Debug)]
pub struct Watcher {
    id: u64,
    watchers: Watchers,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.watchers.lock().streams.remove(&self.id);
    }
}

impl Watchers {
    fn lock(&self) -> MutexGuard<'_, Open> {
        // Every update is one map operation: a panic cannot leave it torn.
        self.0
            .open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A stream opened naming the session `key`; keep the answer as long as
    /// the stream is open.
    pub fn opened(&self, key: &str) -> Watcher {
        let mut open = self.lock();
        let id = open.next;
        open.next += 1;
        open.streams.insert(
            id,
            Named {
                key: key.to_owned(),
                checked: false,
            },
        );
        drop(open);
        self.0.named.notify_one();
        Watcher {
            id,
            watchers: self.clone(),
        }
    }

    /// Up to `limit` distinct names of open streams not looked up yet,
    /// those of the oldest streams first.
    pub fn unchecked(&self, limit: usize) -> Vec<String> {
        let open = self.lock();
        let mut keys: Vec<String> = Vec::new();
        for named in open.streams.values().filter(|n| !n.checked) {
            if keys.len() == limit {
                break;
            }
            if !keys.contains(&named.key) {
                keys.push(named.key.clone());
            }
        }
        keys
    }

    /// `keys` were looked up: the streams open now that name them are not
    /// looked up again (a stream opened later with the same name is).
    pub fn checked(&self, keys: &[String]) {
        for named in self.lock().streams.values_mut() {
            if keys.contains(&named.key) {
                named.checked = true;
            }
        }
    }

    /// Resolves once a stream opened with a name since the last time it
    /// resolved (at once if one did meanwhile).
    pub async fn named(&self) {
        self.0.named.notified().await;
    }

    /// How many streams are open.
    pub fn len(&self) -> usize {
        self.lock().streams.len()
    }

    /// Whether no stream is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_lives_as_long_as_its_stream_and_is_looked_up_once() {
        let watchers = Watchers::default();
        let a = watchers.opened("#session/a/1");
        let b = watchers.opened("#session/b/1");
        let a_again = watchers.opened("#session/a/1");
        assert_eq!(watchers.unchecked(10), ["#session/a/1", "#session/b/1"]);
        assert_eq!(watchers.unchecked(1), ["#session/a/1"]);
        watchers.checked(&["#session/a/1".to_owned()]);
        assert_eq!(watchers.unchecked(10), ["#session/b/1"]);
        // A new stream with a name already looked up is looked up again.
        let a_later = watchers.opened("#session/a/1");
        assert_eq!(watchers.unchecked(10), ["#session/b/1", "#session/a/1"]);
        drop((a, a_again, a_later, b));
        // Each opening woke the waiter, once however many came meanwhile.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut named = std::pin::pin!(watchers.named());
        assert!(named.as_mut().poll(&mut cx).is_ready());
        let mut again = std::pin::pin!(watchers.named());
        assert!(again.as_mut().poll(&mut cx).is_pending());
        assert!(watchers.is_empty());
        assert!(watchers.unchecked(10).is_empty());
    }
}
