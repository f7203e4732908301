//! The one IO driver of a daemon's [`Node`]: it performs the node's store
//! requests concurrently (a slow answer for one election never delays
//! another; the takes one input asks for go together, up to 100 to a
//! request, each with its own condition and answer), feeds their
//! answers, the time, the hints of every election (one channel from
//! every watch client), the app check's verdict, the store's changes and
//! the commands back, and publishes each election's state and events (on
//! one board each) and the daemon's session (on a watch channel), which
//! HTTP, the metrics, the job's supervision and balance follow. It
//! decides nothing: an election is data in the node, not a task.
//!
//! The rooms: this file is the driver's loop and what it carries out;
//! `board` where each election's state and last event are published;
//! `takes` the takes of one input sent together; `handle` what the rest
//! of the daemon holds of a running node (each
//! election's handle, the node's session and end, the sessions it knows
//! for balance); `report` the metrics and logs of its requests and of
//! what the node noted; `error_log` store errors logged once per change
//! (once for the many elections that meet one together);
//! `session` the session's changes logged and the sweep of sessions that
//! are over; `tests` nodes run through it over the in-memory store;
//! `engine_tests` and `hint_tests` one election run through it (by
//! `lone`), step by step and with hints; `log_tests` what a thousand
//! elections that meet one trouble log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::app_check::Verdict;
use crate::clock::{Clock, Instant};
use crate::core::election::{AfterRelease, Tick, WriteOp};
use crate::core::hints::LeaseEvent;
use crate::core::node::{ElectionId, KnownSession, Moment, Node, NodeAction, NodeInput, RequestId};
use crate::core::session::SessionView;
use crate::election::{Aim, Outcome, TaskContext};
use crate::lease::{Record, Stamp, StoreError, WriteOutcome};

pub mod board;
mod error_log;
mod handle;
mod report;
mod session;
mod takes;

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod hint_tests;
#[cfg(test)]
mod log_tests;
#[cfg(test)]
mod lone;
#[cfg(test)]
mod tests;

pub use handle::{ElectionHandle, Running, Sessions, SitOuts, Steering};
pub use session::SWEEP_EVERY;

use board::{EventBoard, StateBoard};
use report::{Metric, Report};
use session::{SessionLog, Sweeper};
use takes::Take;

/// What the node is told by the rest of the daemon.
pub enum Command {
    /// An input as it is.
    Input(Box<NodeInput>),
    /// Give an election's lease up (the caller stopped the job first),
    /// handing it to `successor` if named, then act as said; `answer`
    /// hears whether a lease was released.
    Release {
        /// The election.
        election: ElectionId,
        /// What to do afterwards.
        then: AfterRelease,
        /// Hand the lease to this identity.
        successor: Option<String>,
        /// Where the answer goes.
        answer: oneshot::Sender<bool>,
    },
    /// List the sessions of other daemons the node knows.
    Known(oneshot::Sender<Vec<KnownSession>>),
}

/// Campaign requests (a round's read of an election's record, the
/// followers' reads together, a take) in flight at most; more wait their
/// turn in order. A daemon of ten thousand elections that finds them all
/// free (its session just opened, another daemon died) would otherwise
/// send ten thousand requests at once: a connection and a request's
/// buffers each. Measured on DynamoDB Local, 10,000 elections: one daemon
/// led them all 5.5 s after its start with 400 in flight as with no bound,
/// and 19.7 s with 128. Renewals, releases, the session's writes and
/// reads that confirm a write never wait: a tenure's requests are not
/// queued behind anyone's campaign.
const CAMPAIGN_REQUESTS: usize = 512;

/// What the store answered to one of the node's requests.
enum Answer {
    Read(Result<Record, StoreError>),
    ReadMany(Result<Vec<Record>, StoreError>),
    Written(Result<WriteOutcome, StoreError>),
}

/// What a request's task comes back with: the answer of one request, or
/// those of the takes it made together.
enum Finished {
    One(Box<Done>),
    Many(Vec<Done>),
}

/// A request answered: what, how long it took, how it is counted, for
/// the session's end its key (logged), for a read of many elections'
/// records whose they are.
struct Done {
    request: RequestId,
    answer: Answer,
    took: Duration,
    metric: Metric,
    ending: Option<String>,
    batch: Vec<ElectionId>,
    /// It counted among [`CAMPAIGN_REQUESTS`].
    campaign: bool,
}

/// Where the driver publishes.
struct Published {
    states: StateBoard,
    /// Elections whose state the input being handled may have changed.
    changed: Vec<ElectionId>,
    events: EventBoard,
    session: watch::Sender<Option<SessionView>>,
    /// The daemon's stream, told every event too (with sessions).
    told: Option<broadcast::Sender<LeaseEvent>>,
}

/// What the driver follows besides its commands and requests; each is
/// optional.
#[derive(Default)]
struct Links {
    /// The app check's verdict: the node campaigns only while it passes.
    gate: Option<watch::Receiver<Verdict>>,
    /// What the watch clients bring, for every election.
    hints: Option<mpsc::Receiver<NodeInput>>,
    /// Where the elections say they watch.
    aim: Option<Box<dyn Aim>>,
    /// Moves when the store notices its data was replaced under it.
    changes: Option<watch::Receiver<u64>>,
    /// The labels the session's record carries.
    labels: Option<watch::Receiver<BTreeMap<String, String>>>,
}

/// The driver; see the module docs.
pub struct NodeDriver {
    node: Node,
    context: TaskContext,
    out: Published,
    commands: mpsc::Receiver<Command>,
    /// The store requests on their way.
    inflight: JoinSet<Finished>,
    /// Answers of takes made together, not yet handed to the node.
    ready: VecDeque<Done>,
    /// Takes the input being handled asked for.
    takes: Vec<Take>,
    /// Campaign requests among them, and those waiting their turn.
    campaigns: usize,
    waiting: VecDeque<NodeAction>,
    /// Release commands waiting for their answer, by election, in order.
    answers: HashMap<ElectionId, VecDeque<oneshot::Sender<bool>>>,
    links: Links,
    report: Report,
    session_log: SessionLog,
    /// With a session: its sweeps of sessions that are over.
    sweeper: Option<Sweeper>,
}

impl NodeDriver {
    /// A driver of `node` with `context` (the store, the clock, the
    /// metrics), the handles of its elections (in their order) and of the
    /// running node (its task is set by [`NodeDriver::spawn`]).
    pub fn new(node: Node, context: TaskContext) -> (NodeDriver, Vec<ElectionHandle>, Running) {
        let (commands_tx, commands) = mpsc::channel(64);
        let states =
            StateBoard::new((0..node.len()).map(|i| node.state(ElectionId(i as u32)).clone()));
        let events = EventBoard::new((0..node.len()).map(|_| None));
        let mut handles = Vec::with_capacity(node.len());
        let (sit_outs, sit_outs_rx) = watch::channel(SitOuts::default());
        let sit_outs = std::sync::Arc::new(sit_outs);
        for i in 0..node.len() {
            let id = ElectionId(i as u32);
            handles.push(ElectionHandle {
                state: states.view(i),
                events: events.view(i),
                lease_duration: node.config(id).lease_duration,
                steering: Steering {
                    commands: commands_tx.clone(),
                    election: id,
                    sit_outs: sit_outs.clone(),
                },
            });
        }
        let (session, session_rx) = watch::channel(node.session_view().cloned());
        let (labels, labels_rx) = watch::channel(BTreeMap::new());
        let timing = node
            .session()
            .map(|s| (s.config().renew_interval, s.config().max_clock_drift));
        let every = timing.map_or(Duration::from_secs(5), |t| t.0);
        let sweeper = timing.map(|(_, drift)| Sweeper::new(node.identity().to_owned(), drift));
        let report = Report::new(context.observer.clone(), node.identity().to_owned(), every);
        let links = Links {
            changes: context.store.changes(),
            labels: Some(labels_rx),
            ..Links::default()
        };
        let driver = NodeDriver {
            node,
            context,
            out: Published {
                states,
                changed: Vec::new(),
                events,
                session,
                told: None,
            },
            commands,
            inflight: JoinSet::new(),
            ready: VecDeque::new(),
            takes: Vec::new(),
            campaigns: 0,
            waiting: VecDeque::new(),
            answers: HashMap::new(),
            links,
            report,
            session_log: SessionLog::default(),
            sweeper,
        };
        let running = Running {
            session: session_rx,
            labels,
            sit_outs: sit_outs_rx,
            commands: commands_tx,
            task: None,
        };
        (driver, handles, running)
    }

    /// The same driver, campaigning only while `gate` (the app check's
    /// verdict) passes. The node must have been made with that verdict.
    #[must_use]
    pub fn gated(mut self, gate: Option<watch::Receiver<Verdict>>) -> NodeDriver {
        self.links.gate = gate;
        self
    }

    /// The same driver, taking what the watch clients bring from `hints`
    /// and telling them where to watch through `aim`.
    #[must_use]
    pub fn with_hints(mut self, hints: mpsc::Receiver<NodeInput>, aim: Box<dyn Aim>) -> NodeDriver {
        self.links.hints = Some(hints);
        self.links.aim = Some(aim);
        self
    }

    /// The same driver, telling every event of its elections on `told`
    /// too (the daemon's stream).
    #[must_use]
    pub fn telling(mut self, told: broadcast::Sender<LeaseEvent>) -> NodeDriver {
        self.out.told = Some(told);
        self
    }

    /// Run the driver as a task of its own; `running` learns of it.
    pub fn spawn(self, running: &mut Running) {
        running.task = Some(tokio::spawn(self.run()));
    }

    /// Whether the app check lets the node campaign now (true without
    /// one).
    fn may_campaign(&self) -> bool {
        self.links
            .gate
            .as_ref()
            .is_none_or(|g| *g.borrow() == Verdict::Pass)
    }

    /// Whether there is more to do: an election or the session not ended,
    /// or (a node of no election, no session: what balance asks of the
    /// sessions) someone may still command it.
    fn goes_on(&self, orphaned: bool) -> bool {
        !self.node.is_finished() || (self.node.is_empty() && !orphaned)
    }

    /// Run until every election and the session have ended.
    pub async fn run(mut self) {
        let mut orphaned = false;
        self.feed(NodeInput::Timeout);
        while self.goes_on(orphaned) {
            let input = self.next_input(&mut orphaned).await;
            if let Some(input) = input {
                self.feed(input);
            }
        }
        self.report.tallies_due(None);
    }

    /// Wait for what comes next: an input for the node, or `None` when
    /// what came was handled here.
    async fn next_input(&mut self, orphaned: &mut bool) -> Option<NodeInput> {
        if let Some(done) = self.ready.pop_front() {
            return Some(self.answered(done));
        }
        let wake = self.node.next_wake();
        let clock = self.context.clock.clone();
        let now = clock.now();
        let open = self
            .node
            .session()
            .is_some_and(|s| s.record_key().is_some());
        let sweep = self.sweeper.as_mut().and_then(|s| s.due(open, now));
        tokio::select! {
            Some(finished) = self.inflight.join_next(), if !self.inflight.is_empty() => {
                // A request's task only ends by answering (it is never
                // aborted while the driver runs).
                match finished.ok()? {
                    Finished::One(done) => Some(self.answered(*done)),
                    Finished::Many(done) => {
                        self.ready.extend(done);
                        let first = self.ready.pop_front()?;
                        Some(self.answered(first))
                    }
                }
            }
            command = self.commands.recv(), if !*orphaned => match command {
                Some(command) => self.command(command),
                None => {
                    *orphaned = true;
                    Some(NodeInput::Orphaned)
                }
            },
            () = sleep_until(&clock, wake) => Some(NodeInput::Timeout),
            // The new verdict comes with the next input: this one.
            () = gate_changed(&mut self.links.gate) => Some(NodeInput::Timeout),
            hint = next_hint(&mut self.links.hints) => {
                if hint.is_none() {
                    self.links.hints = None;
                }
                hint
            }
            () = store_changed(&mut self.links.changes) => Some(NodeInput::StoreReplaced),
            labels = labels_changed(&mut self.links.labels) => labels.map(NodeInput::Labels),
            () = sleep_until(&clock, sweep) => {
                if let Some(s) = self.sweeper.as_mut() {
                    s.start(self.context.store.clone(), clock.clone());
                }
                None
            }
        }
    }

    /// A command: the input it makes, if any.
    fn command(&mut self, command: Command) -> Option<NodeInput> {
        match command {
            Command::Input(input) => Some(*input),
            Command::Release {
                election,
                then,
                successor,
                answer,
            } => {
                if election.index() >= self.node.len() || self.node.core(election).is_finished() {
                    let _ = answer.send(false);
                    return None;
                }
                self.answers.entry(election).or_default().push_back(answer);
                Some(NodeInput::Release {
                    election,
                    then,
                    successor,
                })
            }
            Command::Known(answer) => {
                let _ = answer.send(self.node.known_sessions());
                None
            }
        }
    }

    /// A request was answered: counted, then the input it makes.
    fn answered(&mut self, done: Done) -> NodeInput {
        let Done {
            request,
            answer,
            took,
            metric,
            ending,
            batch,
            campaign,
        } = done;
        if campaign {
            self.campaigns -= 1;
            while self.campaigns < CAMPAIGN_REQUESTS
                && let Some(action) = self.waiting.pop_front()
            {
                self.carry_out(action);
            }
            // The queue of a burst (every election free at once) is not
            // kept for good.
            if self.waiting.is_empty() && self.waiting.capacity() > 4 * CAMPAIGN_REQUESTS {
                self.waiting.shrink_to(CAMPAIGN_REQUESTS);
            }
        }
        let outcome = match &answer {
            Answer::Read(Err(e)) | Answer::ReadMany(Err(e)) | Answer::Written(Err(e)) => {
                Outcome::Failed(e)
            }
            Answer::Written(Ok(WriteOutcome::ConditionFailed { .. })) => Outcome::Lost,
            _ => Outcome::Ok,
        };
        let cfg = match metric {
            Metric::Election(id, _) => Some(self.node.config(id)),
            _ => None,
        };
        let now = self.context.clock.now();
        self.report.request(metric, cfg, took, outcome, now);
        if outcome == Outcome::Ok {
            for id in batch {
                self.report
                    .election_answered(id, self.node.config(id), "read", now);
            }
        }
        if let (Some(key), Outcome::Ok) = (&ending, outcome) {
            let retired = self.node.session().is_some_and(|s| s.is_retired());
            SessionLog::ended(self.node.identity(), key, retired);
        }
        match answer {
            Answer::Read(record) => NodeInput::Read { request, record },
            Answer::ReadMany(records) => NodeInput::ReadMany { request, records },
            Answer::Written(outcome) => NodeInput::Written { request, outcome },
        }
    }

    /// Hand `input` to the node with the moment now, then carry out what
    /// it asks.
    fn feed(&mut self, input: NodeInput) {
        let moment = Moment {
            tick: Tick {
                now: self.context.clock.now(),
                stamp: Stamp::now(),
                jitter: rand::random::<f64>(),
            },
            may_campaign: self.may_campaign(),
        };
        self.node.handle(&moment, input);
        while let Some(action) = self.node.poll_action() {
            self.carry_out(action);
        }
        // What the input changed, under one hold of the board's lock.
        let node = &self.node;
        let changed = self
            .out
            .changed
            .drain(..)
            .map(|id| (id.index(), node.state(id)));
        self.out.states.publish_all(changed);
        // The takes of a batch's answers go out once all of them were
        // handed over: together, not one by one.
        if self.ready.is_empty() {
            self.send_takes();
        }
        if let Some(core) = self.node.session() {
            self.session_log
                .changed(self.node.identity(), core, self.node.session_view());
        }
        // The answers of one request are one moment, as one input is.
        if self.ready.is_empty() {
            self.report.input_handled();
        }
        self.report.tallies_due(Some(moment.tick.now));
    }

    fn carry_out(&mut self, action: NodeAction) {
        let campaign = is_campaign(&action);
        if campaign {
            if self.campaigns >= CAMPAIGN_REQUESTS {
                self.waiting.push_back(action);
                return;
            }
            self.campaigns += 1;
        }
        match action {
            NodeAction::Read {
                request,
                key,
                budget,
                confirming,
            } => self.read(request, key, budget, confirming),
            NodeAction::ReadMany {
                request,
                keys,
                budget,
            } => self.read_many(request, keys, budget),
            NodeAction::Write {
                request,
                op,
                lease,
                condition,
                budget,
                deadline,
            } => self.write(request, op, *lease, condition, budget, deadline),
            other => self.publish(other),
        }
    }

    /// Read the records under `keys` for `request`, within `budget`.
    fn read_many(&mut self, request: RequestId, keys: Vec<String>, budget: Duration) {
        let (metric, batch) = match &request {
            RequestId::Reads(_) => {
                let ids = keys.iter().filter_map(|k| self.node.election(k)).collect();
                (Metric::Reads, ids)
            }
            _ => (Metric::Check, Vec::new()),
        };
        let campaign = is_campaign_read(&request, false);
        let store = self.context.store.clone();
        let clock = self.context.clock.clone();
        self.inflight.spawn(async move {
            let sent = clock.now();
            let answer = Answer::ReadMany(store.read_many(&keys, budget).await);
            let took = clock.now() - sent;
            Finished::One(Box::new(Done {
                request,
                answer,
                took,
                metric,
                ending: None,
                batch,
                campaign,
            }))
        });
    }

    /// Read `key` for `request`, within `budget`.
    fn read(&mut self, request: RequestId, key: String, budget: Duration, confirming: bool) {
        let metric = match &request {
            RequestId::Election(_) if confirming => Metric::None,
            RequestId::Election(id) => Metric::Election(*id, "read"),
            RequestId::Session => Metric::Own("read_session"),
            RequestId::SessionRecord(_) => Metric::Shared,
            RequestId::ReadBack(_) => Metric::Check,
            RequestId::Reads(_) => Metric::Reads,
        };
        let campaign = is_campaign_read(&request, confirming);
        let store = self.context.store.clone();
        let clock = self.context.clock.clone();
        self.inflight.spawn(async move {
            let sent = clock.now();
            let answer = Answer::Read(store.read(&key, budget).await);
            let took = clock.now() - sent;
            Finished::One(Box::new(Done {
                request,
                answer,
                took,
                metric,
                ending: None,
                batch: Vec::new(),
                campaign,
            }))
        });
    }

    /// Write `lease` if `condition` holds, for `request`, within `budget`,
    /// giving up at `deadline`.
    #[allow(clippy::too_many_arguments)] // a write as the node asks for it
    fn write(
        &mut self,
        request: RequestId,
        op: WriteOp,
        lease: crate::lease::Lease,
        condition: crate::lease::Condition,
        budget: Duration,
        deadline: Option<Instant>,
    ) {
        let (metric, ending) = match &request {
            RequestId::Election(id) => (Metric::Election(*id, op.label()), None),
            _ => (
                Metric::Own(op.label()),
                (op == WriteOp::EndSession).then(|| lease.election.clone()),
            ),
        };
        let campaign = is_campaign_write(&request, op);
        if campaign {
            self.takes.push(Take {
                request,
                metric,
                lease,
                condition,
                budget,
                deadline,
            });
            return;
        }
        let store = self.context.store.clone();
        let clock = self.context.clock.clone();
        self.inflight.spawn(async move {
            let sent = clock.now();
            let write = store.write(&lease, &condition, budget);
            let outcome = match deadline {
                Some(at) => clock
                    .timeout_at(at, write)
                    .await
                    .unwrap_or(Err(StoreError::Timeout(budget))),
                None => write.await,
            };
            Finished::One(Box::new(Done {
                request,
                answer: Answer::Written(outcome),
                took: clock.now() - sent,
                metric,
                ending,
                batch: Vec::new(),
                campaign,
            }))
        });
    }

    /// Carry out what is no store request: publish, tell, aim, answer,
    /// report.
    fn publish(&mut self, action: NodeAction) {
        match action {
            NodeAction::Publish(id) => {
                // Published together at the end of the input (`feed`).
                self.out.changed.push(id);
            }
            NodeAction::PublishSession => {
                self.out
                    .session
                    .send_replace(self.node.session_view().cloned());
            }
            NodeAction::Answer { election, released } => {
                if let Some(tx) = self
                    .answers
                    .get_mut(&election)
                    .and_then(VecDeque::pop_front)
                {
                    let _ = tx.send(released);
                }
                if self.answers.get(&election).is_some_and(VecDeque::is_empty) {
                    self.answers.remove(&election);
                }
            }
            NodeAction::Note { election, note } => {
                let now = self.context.clock.now();
                let election = election.map(|id| (id, self.node.config(id)));
                self.report.note(election, note, now);
            }
            NodeAction::Tell { election, event } => {
                if let Some(told) = &self.out.told {
                    // No follower daemon listening: nobody to tell.
                    let _ = told.send(event.clone());
                }
                self.out.events.send_replace(election.index(), Some(event));
            }
            NodeAction::Watch { election, address } => {
                if let Some(aim) = &self.links.aim {
                    aim.aim(election, &self.node.config(election).name, address);
                }
            }
            // Store requests are `carry_out`'s.
            NodeAction::Read { .. } | NodeAction::ReadMany { .. } | NodeAction::Write { .. } => {}
        }
    }
}

/// Whether `action` is a campaign request (see [`CAMPAIGN_REQUESTS`]).
fn is_campaign(action: &NodeAction) -> bool {
    match action {
        NodeAction::Read {
            request,
            confirming,
            ..
        } => is_campaign_read(request, *confirming),
        NodeAction::ReadMany { request, .. } => is_campaign_read(request, false),
        NodeAction::Write { request, op, .. } => is_campaign_write(request, *op),
        _ => false,
    }
}

/// A round's read of an election's record, or the followers' reads
/// together; not a read that confirms a write.
fn is_campaign_read(request: &RequestId, confirming: bool) -> bool {
    match request {
        RequestId::Election(_) => !confirming,
        RequestId::Reads(_) => true,
        _ => false,
    }
}

/// An election's take: of a missing record, or of a free one.
fn is_campaign_write(request: &RequestId, op: WriteOp) -> bool {
    matches!(request, RequestId::Election(_)) && matches!(op, WriteOp::Create | WriteOp::TakeOver)
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

/// The next input from the watch clients; `None` once they are all gone;
/// never without them.
async fn next_hint(hints: &mut Option<mpsc::Receiver<NodeInput>>) -> Option<NodeInput> {
    match hints {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the store's change counter moves; never without one.
async fn store_changed(changes: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = changes {
        if rx.changed().await.is_ok() {
            return;
        }
        // Its store is gone: nothing will ever change.
        *changes = None;
    }
    std::future::pending().await
}

/// The session's labels once they change; `None` once nobody can change
/// them any more (then never again).
async fn labels_changed(
    labels: &mut Option<watch::Receiver<BTreeMap<String, String>>>,
) -> Option<BTreeMap<String, String>> {
    if let Some(rx) = labels {
        if rx.changed().await.is_ok() {
            return Some(rx.borrow_and_update().clone());
        }
        *labels = None;
        return None;
    }
    std::future::pending().await
}

/// Sleep until `wake` on `clock`; forever without one.
async fn sleep_until(clock: &Clock, wake: Option<Instant>) {
    match wake {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}
