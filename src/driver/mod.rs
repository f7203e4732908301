//! The one IO driver of a daemon's [`Node`]: it performs the node's store
//! requests concurrently (a slow answer for one election never delays
//! another), feeds their answers, the time and the commands back, and
//! publishes each election's state and the daemon's session on watch
//! channels.
//!
//! A first step: the daemon does not use it yet (it still runs a task per
//! election, `crate::election`). It takes hints from one channel for all
//! its elections and tells its events on one broadcast, but the watch
//! client is not wired (where an election asks to watch is dropped), nor
//! are the owners' streams of sessions, the job's deadline, logs and
//! metrics.
//!
//! The rooms: this file is the driver; `tests` runs nodes through it over
//! the in-memory store.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::app_check::Verdict;
use crate::clock::Clock;
use crate::core::election::{ElectionState, Tick};
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::node::{ElectionId, Moment, Node, NodeAction, NodeInput, RequestId};
use crate::core::session::SessionView;
use crate::lease::{LeaseStore, Record, Stamp, StoreError, WriteOutcome};

#[cfg(test)]
mod tests;

/// What the store answered to one of the node's requests.
enum Answer {
    Read(Result<Record, StoreError>),
    ReadMany(Result<Vec<Record>, StoreError>),
    Written(Result<WriteOutcome, StoreError>),
}

/// A command for the node, and where its answer goes (a release is
/// answered with whether a lease was released).
pub struct Command {
    /// What the node is told.
    pub input: NodeInput,
    /// Where the answer goes, for a release.
    pub answer: Option<oneshot::Sender<bool>>,
}

/// The channels a running node is watched and commanded through.
pub struct NodeHandle {
    /// Each election's published state, by [`ElectionId`].
    pub states: Vec<watch::Receiver<ElectionState>>,
    /// The daemon's session as its elections see it.
    pub session: watch::Receiver<Option<SessionView>>,
    /// Commands for the node; dropping it orphans every election.
    pub commands: mpsc::Sender<Command>,
    /// Every event the node's elections tell their followers.
    pub told: broadcast::Sender<LeaseEvent>,
}

/// The driver; see the module docs.
pub struct NodeDriver {
    node: Node,
    store: Arc<dyn LeaseStore>,
    clock: Clock,
    states: Vec<watch::Sender<ElectionState>>,
    session: watch::Sender<Option<SessionView>>,
    commands: mpsc::Receiver<Command>,
    /// The store requests on their way.
    inflight: JoinSet<(RequestId, Answer)>,
    /// Release commands waiting for their answer, by election.
    answers: Vec<Option<oneshot::Sender<bool>>>,
    /// The app check's verdict; `None`: no app check.
    gate: Option<watch::Receiver<Verdict>>,
    /// What the leaders' streams bring, for every election; `None`: no
    /// hints (or their source is gone).
    hints: Option<mpsc::Receiver<(ElectionId, Hint)>>,
    /// Where the elections' events go.
    told: broadcast::Sender<LeaseEvent>,
}

impl NodeDriver {
    /// A driver of `node` over `store`, timed by `clock`, and its handle.
    pub fn new(node: Node, store: Arc<dyn LeaseStore>, clock: Clock) -> (NodeDriver, NodeHandle) {
        let (states, receivers): (Vec<_>, Vec<_>) = (0..node.len())
            .map(|i| watch::channel(node.state(ElectionId(i as u32)).clone()))
            .unzip();
        let (session, session_rx) = watch::channel(node.session_view().cloned());
        let (commands_tx, commands) = mpsc::channel(16);
        let answers = (0..node.len()).map(|_| None).collect();
        let (told, _) = broadcast::channel(64);
        let driver = NodeDriver {
            node,
            store,
            clock,
            states,
            session,
            commands,
            inflight: JoinSet::new(),
            answers,
            gate: None,
            hints: None,
            told: told.clone(),
        };
        let handle = NodeHandle {
            states: receivers,
            session: session_rx,
            commands: commands_tx,
            told,
        };
        (driver, handle)
    }

    /// The same driver, campaigning only while `gate` (the app check's
    /// verdict) passes. The node must have been made with that verdict.
    #[must_use]
    pub fn gated(mut self, gate: watch::Receiver<Verdict>) -> NodeDriver {
        self.gate = Some(gate);
        self
    }

    /// The same driver, taking the hints of its elections from `hints`.
    #[must_use]
    pub fn with_hints(mut self, hints: mpsc::Receiver<(ElectionId, Hint)>) -> NodeDriver {
        self.hints = Some(hints);
        self
    }

    /// Whether the app check lets the node campaign now (true without
    /// one).
    fn may_campaign(&self) -> bool {
        self.gate
            .as_ref()
            .is_none_or(|g| *g.borrow() == Verdict::Pass)
    }

    /// Run until every election and the session have ended.
    pub async fn run(mut self) {
        let mut orphaned = false;
        self.feed(NodeInput::Timeout);
        while !self.node.is_finished() {
            let wake = self.node.next_wake();
            let clock = self.clock.clone();
            tokio::select! {
                Some(done) = self.inflight.join_next(), if !self.inflight.is_empty() => {
                    // A request's task only ends by answering (it is never
                    // aborted while the driver runs).
                    if let Ok((request, answer)) = done {
                        self.answered(request, answer);
                    }
                }
                command = self.commands.recv(), if !orphaned => match command {
                    Some(command) => self.command(command),
                    None => {
                        orphaned = true;
                        self.feed(NodeInput::Orphaned);
                    }
                },
                () = sleep_until(&clock, wake) => self.feed(NodeInput::Timeout),
                // The new verdict comes with the next input: this one.
                () = gate_changed(&mut self.gate) => self.feed(NodeInput::Timeout),
                hint = next_hint(&mut self.hints) => match hint {
                    Some((election, hint)) => self.feed(NodeInput::Hint { election, hint }),
                    None => self.hints = None,
                },
            }
        }
    }

    fn command(&mut self, command: Command) {
        if let NodeInput::Release { election, .. } = &command.input
            && let Some(slot) = self.answers.get_mut(election.index())
        {
            *slot = command.answer;
        }
        self.feed(command.input);
    }

    fn answered(&mut self, request: RequestId, answer: Answer) {
        let input = match answer {
            Answer::Read(record) => NodeInput::Read { request, record },
            Answer::ReadMany(records) => NodeInput::ReadMany { request, records },
            Answer::Written(outcome) => NodeInput::Written { request, outcome },
        };
        self.feed(input);
    }

    /// Hand `input` to the node with the moment now, then carry out what
    /// it asks.
    fn feed(&mut self, input: NodeInput) {
        let moment = Moment {
            tick: Tick {
                now: self.clock.now(),
                stamp: Stamp::now(),
                jitter: rand::random::<f64>(),
            },
            may_campaign: self.may_campaign(),
        };
        self.node.handle(&moment, input);
        while let Some(action) = self.node.poll_action() {
            self.carry_out(action);
        }
    }

    fn carry_out(&mut self, action: NodeAction) {
        let store = self.store.clone();
        match action {
            NodeAction::Read {
                request,
                key,
                budget,
                ..
            } => {
                self.inflight
                    .spawn(async move { (request, Answer::Read(store.read(&key, budget).await)) });
            }
            NodeAction::ReadMany {
                request,
                keys,
                budget,
            } => {
                self.inflight.spawn(async move {
                    (
                        request,
                        Answer::ReadMany(store.read_many(&keys, budget).await),
                    )
                });
            }
            NodeAction::Write {
                request,
                lease,
                condition,
                budget,
                deadline,
                ..
            } => {
                let clock = self.clock.clone();
                self.inflight.spawn(async move {
                    let write = store.write(&lease, &condition, budget);
                    let outcome = match deadline {
                        Some(at) => clock
                            .timeout_at(at, write)
                            .await
                            .unwrap_or(Err(StoreError::Timeout(budget))),
                        None => write.await,
                    };
                    (request, Answer::Written(outcome))
                });
            }
            NodeAction::Publish(id) => {
                if let Some(tx) = self.states.get(id.index()) {
                    tx.send_replace(self.node.state(id).clone());
                }
            }
            NodeAction::PublishSession => {
                self.session.send_replace(self.node.session_view().cloned());
            }
            NodeAction::Answer { election, released } => {
                if let Some(tx) = self
                    .answers
                    .get_mut(election.index())
                    .and_then(Option::take)
                {
                    let _ = tx.send(released);
                }
            }
            NodeAction::Note { election, note } => {
                let election = election.map(|id| self.node.config(id).name.clone());
                tracing::debug!(?election, ?note, "node");
            }
            NodeAction::Tell { event, .. } => {
                // Nobody listening is no error.
                let _ = self.told.send(event);
            }
            // Not wired yet: see the module docs.
            NodeAction::Watch { .. } => {}
        }
    }
}

/// Resolves when the app check's verdict changes; never without an app
/// check, or once it is gone.
async fn gate_changed(gate: &mut Option<watch::Receiver<Verdict>>) {
    if let Some(g) = gate {
        if g.changed().await.is_ok() {
            return;
        }
        *gate = None;
    }
    std::future::pending().await
}

/// The next hint from `hints`; `None` once its source is gone; never
/// without one.
async fn next_hint(
    hints: &mut Option<mpsc::Receiver<(ElectionId, Hint)>>,
) -> Option<(ElectionId, Hint)> {
    match hints {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleep until `wake` on `clock`; forever without one.
async fn sleep_until(clock: &Clock, wake: Option<crate::core::time::Instant>) {
    match wake {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}
