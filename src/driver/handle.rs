//! What the rest of the daemon holds of a running node: each election's
//! [`ElectionHandle`] (its published state and events, and a way to hand
//! its lease over), the [`Running`] node (its session's labels, its
//! close), and [`Sessions`], what balance learns of other daemons'
//! sessions through the node.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::Command;
use super::board::{EventView, StateView};
use crate::core::election::AfterRelease;
use crate::core::node::{ElectionId, KnownSession, NodeInput};
use crate::core::session::SessionView;
use crate::election::{Outcome, SESSION_LABEL, TaskContext};
use crate::lease::{READ_MANY_LIMIT, Record, StoreError, is_session_key};

/// One election of a running node.
#[derive(Debug)]
pub struct ElectionHandle {
    /// The published state.
    pub state: StateView,
    /// What this instance tells its followers: the last event of its
    /// tenure (`None` before the first).
    pub events: EventView,
    /// The configured lease duration (also how long a resign sits out).
    pub lease_duration: Duration,
    pub(super) steering: Steering,
}

impl ElectionHandle {
    /// Release the lease if held, then act as said. Returns whether a lease
    /// was released; `false` also when the node is gone.
    pub async fn release(&self, then: AfterRelease) -> bool {
        self.hand_over(then, None).await
    }

    /// [`ElectionHandle::release`], handing the lease to `successor` (to
    /// anyone when `None`).
    pub async fn hand_over(&self, then: AfterRelease, successor: Option<String>) -> bool {
        self.steering.hand_over(then, successor).await
    }

    /// A handle that can only hand the lease over, for a task that moves
    /// leaderships (`crate::balance`) while the daemon keeps this one.
    pub fn steering(&self) -> Steering {
        self.steering.clone()
    }
}

/// Hands an election's lease over; see [`ElectionHandle::steering`].
#[derive(Debug, Clone)]
pub struct Steering {
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) election: ElectionId,
    /// Told of every sit-out asked of the node's elections.
    pub(super) sit_outs: Arc<watch::Sender<SitOuts>>,
}

/// The sit-outs asked of a node's elections (a resign, a job released on
/// its exit): how many so far and how long the last one lasts. Preferred
/// leaders publish no priority while any election sits out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SitOuts {
    /// Sit-outs asked so far.
    pub count: u64,
    /// The length of the last one.
    pub last: Duration,
}

impl Steering {
    /// Release the lease if held, handing it to `successor` (to anyone when
    /// `None`), then act as said. Returns whether a lease was released.
    pub async fn hand_over(&self, then: AfterRelease, successor: Option<String>) -> bool {
        let (answer, rx) = oneshot::channel();
        let command = Command::Release {
            election: self.election,
            then,
            successor,
            answer,
        };
        if let AfterRelease::SitOut(d) = then
            && !d.is_zero()
        {
            // Told before the release: the priority label goes at once.
            self.sit_outs.send_modify(|s| {
                s.count += 1;
                s.last = d;
            });
        }
        if self.commands.send(command).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// A running node: its session's labels and view, its end.
pub struct Running {
    /// The daemon's session as its elections see it: `None` while none is
    /// open and valid (always, without sessions).
    pub session: watch::Receiver<Option<SessionView>>,
    /// The labels the session's record carries from its next write on.
    pub labels: watch::Sender<std::collections::BTreeMap<String, String>>,
    /// The sit-outs asked of its elections.
    pub sit_outs: watch::Receiver<SitOuts>,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) task: Option<JoinHandle<()>>,
}

impl Running {
    /// End the session (once the elections held through it were released)
    /// and wait until the node has ended: every election released or
    /// ended (one still running is released now), the session's end
    /// written.
    pub async fn close(mut self) {
        for input in [NodeInput::Orphaned, NodeInput::CloseSession] {
            let _ = self.commands.send(Command::Input(Box::new(input))).await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stop the node where it is, releasing nothing (a kill -9, in tests).
    pub fn abort(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }

    /// What balance learns of other daemons' sessions through this node.
    pub fn sessions(&self, context: TaskContext) -> Sessions {
        Sessions {
            commands: self.commands.clone(),
            context,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Dropped without `close` (a test, an aborted start): the node must
        // not renew for ever.
        self.abort();
    }
}

/// What the node knows of other daemons' sessions, for balance: listed,
/// and taught by reads balance makes itself.
#[derive(Clone)]
pub struct Sessions {
    commands: mpsc::Sender<Command>,
    context: TaskContext,
}

impl Sessions {
    /// Every session the node knows (none once it is gone).
    pub async fn sessions(&self) -> Vec<KnownSession> {
        let (answer, rx) = oneshot::channel();
        if self.commands.send(Command::Known(answer)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// The session `key` as [`Self::sessions`] lists it, if known.
    pub async fn session(&self, key: &str) -> Option<KnownSession> {
        self.sessions().await.into_iter().find(|k| k.key == key)
    }

    /// Read the session `key` within `budget` (counted as `read_session`
    /// under `#session`), and teach the node what was found.
    pub async fn read(&self, key: &str, budget: Duration) -> Result<Record, StoreError> {
        let clock = &self.context.clock;
        let sent = clock.now();
        let res = self.context.store.read(key, budget).await;
        self.count("read_session", clock.now() - sent, res.as_ref().err());
        if let Ok(record) = &res {
            self.learn(key, sent, record.clone()).await;
        }
        res
    }

    /// Look up, in one request, sessions named by the daemons that watch
    /// this one (at most [`READ_MANY_LIMIT`]): those the store shows held
    /// are known from now on (balance counts them as members), the others
    /// are not told to the node at all, so a made-up name occupies
    /// nothing. With how many were held.
    pub async fn look_up(&self, keys: &[String], budget: Duration) -> Result<usize, StoreError> {
        let keys: Vec<String> = keys
            .iter()
            .filter(|k| is_session_key(k))
            .take(READ_MANY_LIMIT)
            .cloned()
            .collect();
        if keys.is_empty() {
            return Ok(0);
        }
        let clock = &self.context.clock;
        let sent = clock.now();
        let res = self.context.store.read_many(&keys, budget).await;
        self.count("look_up_sessions", clock.now() - sent, res.as_ref().err());
        let mut held = 0;
        for (key, record) in keys.iter().zip(res?) {
            let Record::Valid(session) = &record else {
                continue;
            };
            if session.holder.is_none() || session.election != *key {
                continue;
            }
            held += 1;
            self.learn(key, sent, record).await;
        }
        Ok(held)
    }

    async fn learn(&self, key: &str, sent: crate::clock::Instant, record: Record) {
        let input = NodeInput::SessionRead {
            key: key.to_owned(),
            sent,
            record,
        };
        let _ = self.commands.send(Command::Input(Box::new(input))).await;
    }

    fn count(&self, op: &'static str, took: Duration, error: Option<&StoreError>) {
        let outcome = error.map_or(Outcome::Ok, Outcome::Failed);
        self.context
            .observer
            .store_request(SESSION_LABEL, op, took, outcome);
    }
}
