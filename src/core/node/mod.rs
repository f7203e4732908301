//! The node: every decision of one daemon, in one IO-free state machine
//! (quinn-proto's `Endpoint` over its `Connection`s, raft-rs's `RawNode`).
//!
//! A daemon campaigns for many elections; each is an election [`Core`].
//! What they share is the node's: the daemon's own session (a
//! [`SessionCore`]), what it learned of other daemons' sessions and when
//! (`known`), the demand that keeps its session open and the count of
//! ended tenures its session's writes carry (both outputs of the cores:
//! [`Core::wants_session`], [`CoreAction::TenureOver`]), the read-back of
//! the records held through the session (`readback`), and the order in
//! which inputs reach each election.
//!
//! Like the cores it reads no clock, draws no random number and does no
//! IO: its driver (the daemon's, `crate::driver`; the model checker's,
//! `super::model`) hands it what happened with the [`Moment`] now, carries out the
//! [`NodeAction`]s it asks for (store requests concurrently, each
//! answered with its [`RequestId`]), and wakes it at
//! [`Node::next_wake`]. `Node::handle(moment, input)`,
//! `Node::poll_action()`, `Node::next_wake()`.
//!
//! The order of inputs, per election:
//! - a change of the app check's verdict reaches every election before
//!   the input it came with (a round that waited for the session to take
//!   an election must not take it once the app check closed);
//! - a change of the daemon's session reaches at once every election that
//!   holds a tenure through it or waits for it, and every other one before
//!   anything else it is told (a follower is not woken for each renew);
//! - hints wait while the election has a request in flight, and reach it
//!   in the order they came.
//!
//! Reads of their own records that elections following another daemon's
//! session ask for in the same input (they poll together once its count
//! of ended tenures moved), and the first reads of elections that start
//! together with a session, go out as one request of up to
//! [`READ_MANY_LIMIT`] records; any other read goes out alone.
//!
//! The rooms: this file is the node and its inputs; `protocol` what goes
//! in and out; `route` what an election's actions come to; `known` what
//! the daemon knows of other sessions; `count` how an election judges a
//! session's count of ended tenures; `session` the daemon's own session
//! and what its streams tell of others; `readback` the read-back's
//! schedule; `rank` which daemon takes a free election first; `tests`
//! the node step by step; `stream_tests` the node and the streams of
//! the sessions it follows through.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::core::election::{Core, ElectionConfig, ElectionState, Input, Tick};
use crate::core::hints::Hint;
use crate::core::record::Record;
use crate::core::session::{SessionCore, SessionInput, SessionView};
use crate::core::time::Instant;

mod count;
mod known;
mod protocol;
mod rank;
mod readback;
mod route;
mod session;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

pub use count::CountBasis;
pub use known::KnownSession;
pub use protocol::{ElectionId, Moment, NodeAction, NodeInput, RequestId};
pub use rank::SET_LABEL;
pub use readback::READ_MANY_LIMIT;

use known::Known;
use readback::{ReadBack, Tenures};

/// Deliberate defects of the multiplexing layer the model checker must
/// find (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NodeMutations {
    /// Serve a cached session answer whatever its date.
    pub cached_answer_past_its_date: bool,
    /// Leave the count of ended tenures where it was when a tenure ends.
    pub count_not_moved: bool,
    /// The read-back takes a record naming this daemon as still held,
    /// without asking the election (holder only, no `rvn`).
    pub read_back_holder_only: bool,
    /// Tell the elections of a change of the app check's verdict only
    /// after the input it came with.
    pub gate_after_input: bool,
    /// Share session answers among the sessions of one owner, not of one
    /// key (a restarted daemon's old and new sessions mixed up).
    pub sessions_by_owner: bool,
    /// Name another election than the one whose tenure ended among the
    /// session's latest ends.
    pub ends_misnamed: bool,
}

/// Hints queued for an election before it can take them; beyond this
/// newer ones are dropped (it reads the store anyway).
const HINT_QUEUE: usize = 16;
/// How long every read goes out alone after the store refused a read of
/// many records as not allowed; then one is tried again (the permission
/// may have been added meanwhile).
const ALONE_AFTER_DENIED: Duration = Duration::from_secs(60);

/// What came from an election's stream, held until it takes hints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Held {
    Hint(Hint),
    Closed,
}

/// One election and the node's bookkeeping of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Slot {
    core: Core,
    /// Its entry in [`Node::wakes`].
    wake: Option<Instant>,
    /// Whether it is counted as wanting the session.
    wanting: bool,
    /// The [`Node::view_seq`] of the session view it was told last.
    view_seq: u64,
    /// The [`Node::store_gen`] of the last change of the store it was told
    /// of (or that was old news to it).
    store_seen: u64,
    /// What its stream brought while it could not take it.
    hints: VecDeque<Held>,
    /// Commands that came while it had a request in flight.
    deferred: VecDeque<Input>,
    /// How it judges the count of the session it is held through.
    count: CountBasis,
    /// The session whose answer it waits for (asked, parked or read).
    asking: Option<(String, std::time::Duration)>,
    /// Parked until the owner's stream tells of a write at or after
    /// `.0`, or until `.1`.
    parked: Option<(Instant, Instant)>,
    /// Whether it has `strict_new_lease` (read back every R).
    strict: bool,
    /// Whether its record, as last read, is held by another daemon through
    /// a session, or was never read by a daemon with sessions (its reads
    /// then go out with those of the others: the first reads of elections
    /// that start together come to one request).
    follows: bool,
    /// Elections that asked for the same end of a session as the one this
    /// election's write on its way makes: they take its answer.
    riders: Vec<ElectionId>,
}

/// The daemon's decisions; see the module docs.
#[derive(Debug, Clone)]
pub struct Node {
    identity: String,
    slots: Vec<Slot>,
    names: BTreeMap<String, ElectionId>,
    /// The daemon's session, with sessions.
    session: Option<SessionCore>,
    /// Whether the session stays open whatever the elections want
    /// (balance counts on it).
    always: bool,
    /// The session view as last published, and how often it changed.
    /// Shared by every election told of it (one copy per write of the
    /// session, not one per election).
    view: Option<Arc<SessionView>>,
    view_seq: u64,
    /// Elections that want the session now.
    wanting: usize,
    /// Tenures of this daemon's elections ended so far.
    ended: u64,
    known: BTreeMap<String, Known>,
    readback: Option<ReadBack>,
    /// The tenures held through the session, for the read-back.
    tenures: Tenures,
    /// The app check's verdict as the elections were told it.
    may_campaign: bool,
    /// How often the store said its data was replaced.
    store_gen: u64,
    /// Every election's next wake, in order.
    wakes: BTreeSet<(Instant, ElectionId)>,
    /// R + P, min(R, 2·P), D, L·(1-D) ... of the daemon's timing.
    timing: Timing,
    now: Instant,
    /// The moment of the input being handled, and the stamps handed out
    /// of it so far.
    moment: Option<Moment>,
    stamps: u32,
    /// Inputs for the elections, handled in order before the node's
    /// input returns.
    queue: VecDeque<(ElectionId, Input)>,
    /// Elections whose state may have changed since the last publish.
    dirty: BTreeSet<ElectionId>,
    /// Reads of their records the elections asked for in the input being
    /// handled: the election, the budget, whether it only confirms.
    reads: Vec<(ElectionId, Duration, bool)>,
    /// The reads of many records on their way, by number: whose records.
    batches: BTreeMap<u32, Vec<ElectionId>>,
    /// Until when every election's read goes out alone: the store refused
    /// a read of many records as not allowed.
    alone_until: Option<Instant>,
    /// The ends of other daemons' sessions on their way: the session's key
    /// and the `rvn` the end is conditional on, and whose write it is.
    ending: BTreeMap<(String, String), ElectionId>,
    out: VecDeque<NodeAction>,
    #[cfg(test)]
    mutations: NodeMutations,
}

/// What the node needs of the daemon's timing.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Timing {
    /// R + P: a stream quiet this long has stopped.
    quiet: Duration,
    /// min(R, 2·P): how long an election parked past its due waits for
    /// the next write to be told.
    slack: Duration,
    /// D.
    drift: f64,
    /// R.
    renew: Duration,
}

// D is checked finite (`check_drift`), so equality is total.
impl Eq for Timing {}

impl std::hash::Hash for Timing {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.quiet, self.slack, self.drift.to_bits(), self.renew).hash(state);
    }
}

impl PartialEq for Node {
    fn eq(&self, other: &Node) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Node {}

impl std::hash::Hash for Node {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Node {
    /// A node for the daemon of `identity`, started at `start`, timed
    /// like `timing` (the daemon's session's timing: every election's,
    /// with sessions); `may_campaign`: the app check's verdict now.
    pub fn new(
        identity: &str,
        timing: &ElectionConfig,
        start: Instant,
        may_campaign: bool,
    ) -> Node {
        Node {
            identity: identity.to_owned(),
            slots: Vec::new(),
            names: BTreeMap::new(),
            session: None,
            always: false,
            view: None,
            view_seq: 0,
            wanting: 0,
            ended: 0,
            known: BTreeMap::new(),
            readback: None,
            tenures: Tenures::default(),
            may_campaign,
            store_gen: 0,
            wakes: BTreeSet::new(),
            timing: Timing {
                quiet: timing.hint_quiet(),
                slack: timing.due_read_slack(),
                drift: timing.max_clock_drift,
                renew: timing.renew_interval,
            },
            now: start,
            moment: None,
            stamps: 0,
            queue: VecDeque::new(),
            dirty: BTreeSet::new(),
            reads: Vec::new(),
            batches: BTreeMap::new(),
            alone_until: None,
            ending: BTreeMap::new(),
            out: VecDeque::new(),
            #[cfg(test)]
            mutations: NodeMutations::default(),
        }
    }

    /// The same node with the daemon's session (timed by `cfg`): its
    /// elections hold their tenures through it. With `always` it opens
    /// at once and stays open; else it opens once an election wants it
    /// and ends a lease after the last stopped wanting it. Before any
    /// election is added.
    #[must_use]
    pub fn with_session(mut self, cfg: ElectionConfig, always: bool) -> Node {
        self.readback = Some(ReadBack::new(self.now, cfg.renew_interval));
        self.session = Some(SessionCore::new(cfg, self.now, always));
        self.always = always;
        self
    }

    /// The same node with deliberate defects in it and its elections'
    /// cores (model checker only).
    #[cfg(test)]
    #[must_use]
    pub fn mutated(mut self, mutations: NodeMutations) -> Node {
        self.mutations = mutations;
        self
    }

    /// Make room for `additional` more elections at once (a daemon of
    /// thousands would otherwise hold the old and the doubled table at the
    /// same instant as it grows).
    pub fn reserve(&mut self, additional: usize) {
        self.slots.reserve_exact(additional);
    }

    /// Add the election `cfg`, campaigning from `delay` after the node's
    /// start; `has_feed`: a watch client brings it its leader's hints.
    /// Returns its id. `core` may change the core first (tests: its
    /// deliberate defects).
    pub fn add_election(
        &mut self,
        cfg: impl Into<Arc<ElectionConfig>>,
        delay: Duration,
        has_feed: bool,
        core: impl FnOnce(Core) -> Core,
    ) -> ElectionId {
        let id = ElectionId(u32::try_from(self.slots.len()).unwrap_or(u32::MAX));
        let cfg = cfg.into();
        let strict = cfg.strict_new_lease;
        self.names.insert(cfg.name.clone(), id);
        let start = Core::new(cfg, self.now, delay, has_feed, self.may_campaign);
        let start = if self.session.is_some() {
            start.through_sessions()
        } else {
            start
        };
        self.slots.push(Slot {
            core: core(start),
            wake: None,
            wanting: false,
            view_seq: 0,
            store_seen: 0,
            hints: VecDeque::new(),
            deferred: VecDeque::new(),
            count: CountBasis::default(),
            asking: None,
            parked: None,
            strict,
            follows: self.session.is_some(),
            riders: Vec::new(),
        });
        self.rewake(id);
        id
    }

    /// Everything that changes, for equality and hashing (the wake index
    /// is derived from the slots, the timing fixed).
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        &Vec<Slot>,
        (
            &Option<SessionCore>,
            &Option<Arc<SessionView>>,
            u64,
            usize,
            u64,
        ),
        &BTreeMap<String, Known>,
        (
            &Option<ReadBack>,
            bool,
            u64,
            (
                &BTreeMap<u32, Vec<ElectionId>>,
                &BTreeMap<(String, String), ElectionId>,
            ),
        ),
        &VecDeque<NodeAction>,
    ) {
        (
            &self.slots,
            (
                &self.session,
                &self.view,
                self.view_seq,
                self.wanting,
                self.ended,
            ),
            &self.known,
            (
                &self.readback,
                self.may_campaign,
                self.store_gen,
                (&self.batches, &self.ending),
            ),
            &self.out,
        )
    }

    /// The daemon's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How many elections it has.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it has no election.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The election named so, if it has it.
    pub fn election(&self, name: &str) -> Option<ElectionId> {
        self.names.get(name).copied()
    }

    /// An election's published state.
    pub fn state(&self, id: ElectionId) -> &ElectionState {
        self.slots[id.index()].core.state()
    }

    /// An election's settings.
    pub fn config(&self, id: ElectionId) -> &ElectionConfig {
        self.slots[id.index()].core.config()
    }

    /// An election's core (its rules' state), for tests and the model.
    pub fn core(&self, id: ElectionId) -> &Core {
        &self.slots[id.index()].core
    }

    /// The daemon's session as its elections see it: `None` while none
    /// is open and valid, or without sessions.
    pub fn session_view(&self) -> Option<&SessionView> {
        self.view.as_deref()
    }

    /// The daemon's session core, with sessions.
    pub fn session(&self) -> Option<&SessionCore> {
        self.session.as_ref()
    }

    /// Tenures of this daemon's elections ended so far (what its
    /// session's next write carries).
    pub fn tenures_ended(&self) -> u64 {
        self.ended
    }

    /// Whether every election has ended and the session (if any) is over.
    pub fn is_finished(&self) -> bool {
        self.slots.iter().all(|s| s.core.is_finished())
            && self.session.as_ref().is_none_or(SessionCore::is_finished)
    }

    /// Every session of another daemon it knows of.
    pub fn known_sessions(&self) -> Vec<KnownSession> {
        self.known.iter().map(|(k, s)| s.listed(k)).collect()
    }

    /// The session `key` as [`Self::known_sessions`] lists it, if known.
    pub fn known_session(&self, key: &str) -> Option<KnownSession> {
        self.known.get(key).map(|s| s.listed(key))
    }

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<NodeAction> {
        let action = self.out.pop_front();
        if action.is_none() {
            shrink(&mut self.out);
        }
        action
    }

    /// When the node wants a [`NodeInput::Timeout`], if ever.
    pub fn next_wake(&self) -> Option<Instant> {
        let elections = self.wakes.first().map(|(at, _)| *at);
        let session = self.session.as_ref().and_then(SessionCore::next_wake);
        // Nothing to read back while no session is open.
        let readback = self
            .readback
            .as_ref()
            .filter(|_| self.view.is_some())
            .map(|r| r.next);
        [elections, session, readback].into_iter().flatten().min()
    }

    /// Take `input` in at `moment`.
    pub fn handle(&mut self, moment: &Moment, input: NodeInput) {
        self.now = self.now.max(moment.tick.now);
        self.moment = Some(moment.clone());
        self.stamps = 0;
        let late_gate = self.gate_after_input();
        if !late_gate {
            self.catch_up_on_gate(moment.may_campaign);
        }
        self.take(input);
        self.run_queue();
        if late_gate {
            self.catch_up_on_gate(moment.may_campaign);
            self.run_queue();
        }
        self.send_reads();
        shrink(&mut self.queue);
        for id in std::mem::take(&mut self.dirty) {
            self.out.push_back(NodeAction::Publish(id));
        }
    }

    fn gate_after_input(&self) -> bool {
        #[cfg(test)]
        if self.mutations.gate_after_input {
            return true;
        }
        false
    }

    /// Tell every election of a change of the app check's verdict.
    fn catch_up_on_gate(&mut self, may_campaign: bool) {
        if may_campaign == self.may_campaign {
            return;
        }
        self.may_campaign = may_campaign;
        for i in 0..self.slots.len() {
            self.queue
                .push_back((ElectionId(i as u32), Input::Gate(may_campaign)));
        }
        self.run_queue();
    }

    fn take(&mut self, input: NodeInput) {
        match input {
            NodeInput::Timeout => self.on_timeout(),
            NodeInput::Read { request, record } => self.on_read(request, record),
            NodeInput::ReadMany { request, records } => self.on_read_many(request, records),
            NodeInput::Written { request, outcome } => match request {
                RequestId::Election(id) => self.election_written(id, outcome),
                RequestId::Session => self.feed_session(SessionInput::Written(outcome)),
                _ => {}
            },
            NodeInput::Hint { election, hint } => self.hold_hint(election, Held::Hint(hint)),
            NodeInput::HintsClosed { election } => self.hold_hint(election, Held::Closed),
            NodeInput::SessionTold {
                key,
                rvn,
                labels,
                at,
                since,
            } => self.on_told(&key, &rvn, labels, at, since),
            NodeInput::SessionStreamEnded { key } => self.on_stream_ended(&key),
            NodeInput::SessionRead { key, sent, record } => {
                let now = self.now;
                self.known_entry(&key).read(sent, &Arc::new(record), now);
            }
            NodeInput::Release {
                election,
                then,
                successor,
            } => self
                .queue
                .push_back((election, Input::Release { then, successor })),
            NodeInput::Orphaned => {
                for i in 0..self.slots.len() {
                    self.queue
                        .push_back((ElectionId(i as u32), Input::Orphaned));
                }
            }
            NodeInput::StoreReplaced => self.on_store_replaced(),
            NodeInput::Labels(labels) => self.feed_session(SessionInput::Labels(labels)),
            NodeInput::CloseSession => self.feed_session(SessionInput::Close),
        }
    }

    /// Wake what is due: elections (or their parked asks), the session,
    /// the read-back.
    fn on_timeout(&mut self) {
        let now = self.now;
        let due: Vec<ElectionId> = self
            .wakes
            .range(..=(now, ElectionId(u32::MAX)))
            .map(|(_, id)| *id)
            .collect();
        for id in due {
            let slot = &mut self.slots[id.index()];
            match slot.parked {
                Some((_, until)) if until <= now => self.unpark(id),
                Some(_) => {}
                None => self.queue.push_back((id, Input::Timeout)),
            }
        }
        self.run_queue();
        if self
            .session
            .as_ref()
            .and_then(SessionCore::next_wake)
            .is_some_and(|at| at <= now)
        {
            self.feed_session(SessionInput::Timeout);
        }
        if self.readback.as_ref().is_some_and(|r| r.next <= now) {
            self.read_back();
        }
    }

    fn on_read(
        &mut self,
        request: RequestId,
        record: Result<Record, crate::core::store_error::StoreError>,
    ) {
        match request {
            RequestId::Election(id) => self.election_read(id, record),
            RequestId::Session => self.feed_session(SessionInput::Read(record)),
            RequestId::SessionRecord(key) => self.session_answered(&key, record),
            RequestId::ReadBack(_) | RequestId::Reads(_) => {}
        }
    }

    /// Election `id`'s record, as read, goes to it; noted is whether
    /// another daemon holds it through a session.
    pub(super) fn election_read(
        &mut self,
        id: ElectionId,
        record: Result<Record, crate::core::store_error::StoreError>,
    ) {
        if let (Ok(record), Some(slot)) = (&record, self.slots.get_mut(id.index())) {
            slot.follows = matches!(record, Record::Valid(l)
                if l.session.is_some() && l.holder.as_deref() != Some(self.identity.as_str()));
        }
        self.queue.push_back((id, Input::Read(record)));
    }

    fn on_read_many(
        &mut self,
        request: RequestId,
        records: Result<Vec<Record>, crate::core::store_error::StoreError>,
    ) {
        match request {
            RequestId::ReadBack(n) => self.read_back_answered(n, records),
            RequestId::Reads(n) => self.reads_answered(n, records),
            _ => {}
        }
    }

    fn on_store_replaced(&mut self) {
        self.store_gen += 1;
        self.feed_session(SessionInput::StoreReplaced);
        for i in 0..self.slots.len() {
            let id = ElectionId(i as u32);
            if self.slots[i].core.watches_store_changes() {
                self.slots[i].store_seen = self.store_gen;
                self.queue.push_back((id, Input::StoreReplaced));
            }
        }
    }

    /// Hold what came from `id`'s stream until it takes hints.
    fn hold_hint(&mut self, id: ElectionId, held: Held) {
        let Some(slot) = self.slots.get_mut(id.index()) else {
            return;
        };
        if slot.hints.len() < HINT_QUEUE {
            slot.hints.push_back(held);
        }
        self.deliver_hint(id);
    }

    /// Hand `id` the next hint it holds, if it takes hints now.
    fn deliver_hint(&mut self, id: ElectionId) {
        let slot = &mut self.slots[id.index()];
        if !slot.core.takes_hints() {
            return;
        }
        let input = match slot.hints.pop_front() {
            Some(Held::Hint(hint)) => Input::Hint(hint),
            Some(Held::Closed) => Input::HintsClosed,
            None => return,
        };
        if slot.hints.is_empty() {
            // An idle election keeps no room for hints.
            slot.hints = VecDeque::new();
        }
        self.queue.push_back((id, input));
    }

    /// The tick for one state machine's input: the moment's, with a stamp
    /// of its own (each write gets a fresh `rvn`: the moment's, then the
    /// moment's with a suffix) and its own jitter.
    fn tick(&mut self) -> Tick {
        let moment = self.moment.as_ref().expect("set as each input is handled");
        let base = &moment.tick;
        let k = self.stamps;
        self.stamps += 1;
        if k == 0 {
            return base.clone();
        }
        Tick {
            now: self.now,
            stamp: base.stamp.nth(k),
            // Spread over [0, 1) by the golden ratio: elections that failed
            // together retry apart.
            jitter: (base.jitter + f64::from(k) * 0.618_033_988_75).fract(),
        }
    }

    /// Move `id`'s entry in the wake index to its next wake.
    fn rewake(&mut self, id: ElectionId) {
        let slot = &mut self.slots[id.index()];
        let wake = match slot.parked {
            Some((_, until)) => Some(until),
            None => slot.core.next_wake(),
        };
        if wake == slot.wake {
            return;
        }
        if let Some(old) = slot.wake {
            self.wakes.remove(&(old, id));
        }
        if let Some(new) = wake {
            self.wakes.insert((new, id));
        }
        slot.wake = wake;
    }
}

/// Give back the room of an empty queue grown far beyond its usual size
/// (one input for every election, as a session opens): a daemon of ten
/// thousand elections would keep megabytes of it for good.
fn shrink<T>(queue: &mut VecDeque<T>) {
    const KEPT: usize = 256;
    if queue.is_empty() && queue.capacity() > 4 * KEPT {
        queue.shrink_to(KEPT);
    }
}
