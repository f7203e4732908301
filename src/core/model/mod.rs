//! The model checker of the daemons' nodes: three [`Node`]s (daemons),
//! each campaigning for one or two elections, a store, clocks that drift,
//! pauses, crashes, lost and late answers, the app check failing, and a
//! hostile network that forges, replays and drops hints, explored by
//! `stateright` over every interleaving within a horizon and budgets.
//!
//! - Time is real time in ms ([`World::t`]); each daemon reads its own
//!   clock, which runs at a fixed rate off real time: the first fast by
//!   D, the second slow by D, the third exact. The rules are monotone in
//!   the clock rates, so the extremes stand for every drift within D.
//!   Time moves on by [`Step::Advance`] to the next instant a node wants
//!   to be woken (or a retry interval, to let answers arrive late), once
//!   every node that is due has woken, except a frozen one (SIGSTOP, a
//!   stalled runtime: it does nothing until it thaws, and its clock keeps
//!   running, as the boot clock does).
//! - A node has many requests in flight (one per election, its session's,
//!   shared reads of other sessions, read-backs): the store applies each
//!   when it receives it, which may be long after it was sent; its answer
//!   may arrive late, or be lost (the node then gets a timeout, and a
//!   write still on its way may apply later: a stray write). A failed
//!   condition is answered with or without the record, as DynamoDB and
//!   its emulators differ.
//! - Sessions ([`Bounds::sessions`]): each node holds its tenures through
//!   its daemon's session; the store keeps the session records beside the
//!   elections'. The owners' streams are honest about sessions and tell
//!   each write of one at the earliest instant anyone could (as it reaches
//!   the store), to the daemons of [`Bounds::streams`]; they tell nothing
//!   of the elections (every release is hidden from the followers, but for
//!   what the hostile network replays).
//! - The app check: once a run, a daemon that holds a tenure may start
//!   failing it; its node is told with its next input, and the daemon
//!   then releases what it leads (its jobs stopped first), as the daemon
//!   does, and takes nothing.
//! - Preferred leaders ([`Bounds::preempts`], [`Bounds::gate_opens`]): a
//!   leader may preempt an election to any daemon it believes above it,
//!   and a gate may close for a hold-back and open again (`priority`).
//! - Hints: any follower may at any time receive a replay of the last
//!   event any daemon told for an election, or a forgery: `renewed` naming
//!   the store's live `rvn` or a made-up one with a 1 ms lease, `released`
//!   naming the live `rvn` (handed to nobody, or to the receiver),
//!   `not_leader`, or the stream's end.
//! - Properties, per election: no two jobs run at one real instant (a
//!   daemon's job runs while its election is `Leader` or `Stopping` and
//!   its own clock is before the tenure's `valid_until`: the guard kills
//!   it then, even if leaderd is paused); fencing tokens rise with every
//!   new tenure; a lease handed to a named successor is taken by no one
//!   else for one lease; no daemon sends a take while its app check fails;
//!   and, with [`Bounds::timely`], a follower leads within
//!   L·(1+D)² + 3·P of the leader's crash, and a released election is led
//!   again within 2·L·(1+D)² + 2·R + 3·P, whatever the stream tells.
//!
//! The rooms: this file is the world and its steps; `store` the store and
//! the requests; `checks` runs the searches and holds the deliberate
//! defects; `network` is the hostile network; `priority` the
//! preemptions, the hold-backs and the hand-overs; `trace` writes
//! counterexamples; `slots` is a world of its own, counting locks'
//! clients racing for the slots of one record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use stateright::{Model, Property};

use super::election::{ElectionConfig, Mutations, Role, Tick, WriteOp};
use super::hints::LeaseEvent;
use super::node::{
    ElectionId, Moment, Node, NodeAction, NodeInput, NodeMutations, RequestId, SET_LABEL,
};
use crate::core::record::{HolderMeta, Lease, Stamp};
use crate::core::time::Instant;

mod checks;
mod network;
mod priority;
mod slots;
mod store;
mod trace;

use network::Forged;
use store::Request;

/// Real time, ms.
type Ms = u64;

/// The elections' names.
const ELECTIONS: [&str; 2] = ["e0", "e1"];
/// The name of the example of a takeover after a crash.
pub(crate) const LED_AFTER_CRASH: &str = "a follower leads after a crash";
/// The name of the example of a released election led again.
pub(crate) const LED_AFTER_RELEASE: &str = "a released election is led again";
/// The name of the example of a daemon whose gate opened again leading.
pub(crate) const LED_AFTER_REOPEN: &str = "a daemon leads again after its gate reopened";
/// The name of the example of a preemption that reached its successor.
pub(crate) const LED_BY_PREFERRED: &str = "a preempted election is led by the daemon preferred";
/// Unix ms of real time 0 (record stamps only).
const EPOCH_MS: u64 = 1_700_000_000_000;

/// What the checker may do, and how far.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    /// The daemons' identities (two may share one: a restarted process
    /// while the old one is still paused).
    pub identities: [&'static str; 3],
    /// Elections each daemon campaigns for (1 or 2).
    pub elections: usize,
    /// Real time explored, ms.
    pub horizon: Ms,
    /// Hints delivered (replayed or forged).
    pub hints: u8,
    /// Answers lost (the node gets a timeout).
    pub losses: u8,
    /// Resigns (to anyone, or to a named successor).
    pub resigns: u8,
    /// Crashes (kill -9: the guard kills the jobs at once).
    pub crashes: u8,
    /// Pauses (SIGSTOP of leaderd, a stalled runtime): a frozen node does
    /// nothing until it thaws, while its clock keeps running.
    pub pauses: u8,
    /// Times time moves on while a request is in flight (a slow store, a
    /// late answer).
    pub delays: u8,
    /// Times a daemon's gate closes: its app check starts failing (once
    /// it holds a tenure), or, when gates may open again, a hold-back.
    pub gate_closes: u8,
    /// Times a closed gate opens again (a hold-back ends, an app check
    /// passes again).
    pub gate_opens: u8,
    /// Preemptions, each to whichever daemon the leader believes above it
    /// (see `priority`).
    pub preempts: u8,
    /// Times an election's record is deleted by hand (only with
    /// `strict`: otherwise deleting a live record voids the guarantee, as
    /// documented).
    pub deletes: u8,
    /// Timely mode, for the bounded-delay properties: the store answers
    /// at once and never loses an answer, no node pauses, and only a
    /// leader crashes.
    pub timely: bool,
    /// Deliberate defects in every election core.
    pub mutations: Mutations,
    /// Deliberate defects in every node.
    pub node_mutations: NodeMutations,
    /// Every election is held through its daemon's session.
    pub sessions: bool,
    /// Which daemons hear the owners' streams tell of their sessions'
    /// writes (the others poll).
    pub streams: [bool; 3],
    /// Every election has `strict_new_lease`.
    pub strict: bool,
    /// The daemons' sessions open at once and stay open whatever their
    /// elections want, as with balance (else each opens once an election
    /// wants it and ends a lease after the last stopped wanting it).
    pub always_session: bool,
    /// Real time before which no app check fails and no one resigns (the
    /// followers first time their leaders' sessions), ms.
    pub settle: Ms,
}

/// One daemon and what is in flight for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Daemon {
    /// Shared with the states it came from until a step changes it (a
    /// step changes one node or a few: the others are not copied).
    node: Arc<Node>,
    alive: bool,
    frozen: bool,
    /// When it froze last, real ms.
    frozen_at: Ms,
    /// Whether its app check passes.
    gate: bool,
    /// Its store requests in flight.
    requests: BTreeMap<RequestId, Request>,
    /// The last event it told of each election (replayed by the network).
    told: Vec<Option<LeaseEvent>>,
    /// When it last preempted each election, on its own clock.
    preempted_at: Vec<Option<Instant>>,
    /// Its gate has opened again since it closed.
    reopened: bool,
}

/// What the properties follow of one election.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Watch {
    /// The highest fencing token ever written, and the tenure (holder,
    /// token) of the last held record.
    top_token: u64,
    tenure: Option<(String, u64)>,
    /// When its record was last written, real ms.
    written_at: Ms,
    /// The crashed daemon led it: it is waited on to be led again.
    orphaned: bool,
    /// When it was last released to anyone, if nobody led it since.
    released_at: Option<Ms>,
    /// The successor it was last preempted to, if nobody led it since.
    preferred: Option<&'static str>,
}

/// The whole system at one real instant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct World {
    /// Real time, ms.
    pub t: Ms,
    daemons: Vec<Daemon>,
    /// The store's records (elections' and sessions'), by key.
    records: BTreeMap<String, Lease>,
    /// A write whose sender gave up on it, that may still apply.
    stray: Option<(Lease, crate::core::record::Condition)>,
    /// rvns handed out so far (they are `r0`, `r1`, ...).
    rvns: u32,
    hints_left: u8,
    losses_left: u8,
    resigns_left: u8,
    crashes_left: u8,
    pauses_left: u8,
    delays_left: u8,
    gate_closes_left: u8,
    gate_opens_left: u8,
    preempts_left: u8,
    deletes_left: u8,
    elections: Vec<Watch>,
    token_fell: bool,
    successor_passed_over: bool,
    took_while_failing: bool,
    /// When a leading daemon crashed (timely mode).
    crashed_at: Option<Ms>,
    /// Whether a daemon became leader of an orphaned or released election
    /// since.
    led_since_crash: bool,
    led_since_release: bool,
    led_after_reopen: bool,
    led_by_preferred: bool,
}

/// One step of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// Daemon `n`'s node handles the timeout it asked for.
    Wake(usize),
    /// The store processes daemon `n`'s request; a failed condition is
    /// answered with the record when the flag is set.
    Store(usize, RequestId, bool),
    /// Daemon `n` receives its answer.
    Answer(usize, RequestId),
    /// Daemon `n`'s answer is lost: it gets a timeout.
    Lose(usize, RequestId),
    /// Daemon `n` receives a hint for election `e`.
    Hint(usize, usize, Forged),
    /// Daemon `n` resigns election `e`, handing it to daemon `m`'s
    /// identity or anyone.
    Resign(usize, usize, Option<usize>),
    /// Daemon `n`'s gate closes: its app check starts failing, or it holds
    /// back (its node is told with its next input).
    GateCloses(usize),
    /// Daemon `n`'s closed gate opens again.
    GateOpens(usize),
    /// Daemon `n` preempts election `e`, handing it to daemon `m`.
    Preempt(usize, usize, usize),
    /// Daemon `n`, whose app check fails, releases election `e` it leads.
    ReleaseFailing(usize, usize),
    /// Election `e`'s record is deleted by hand.
    Delete(usize),
    /// Daemon `n` is killed (its jobs with it).
    Crash(usize),
    /// Daemon `n` freezes.
    Freeze(usize),
    /// Daemon `n` thaws.
    Thaw(usize),
    /// The stray write reaches the store.
    Stray,
    /// Real time moves to this instant.
    Advance(Ms),
}

/// The model: the elections' timing and the bounds.
pub(crate) struct NodeModel {
    pub cfg: ElectionConfig,
    pub bounds: Bounds,
}

/// Clock rate off real time, per mille, of daemon `n`: fast, slow, exact.
fn drift_per_mille(cfg: &ElectionConfig, n: usize) -> i64 {
    let d = (cfg.max_clock_drift * 1000.0).round() as i64;
    [d, -d, 0][n]
}

impl NodeModel {
    /// Defaults for the model: the built-in timing (L 10 s, R 5 s, P 1 s,
    /// G 2 s, M 200 ms, D 1 %).
    pub fn new(bounds: Bounds) -> NodeModel {
        NodeModel {
            cfg: ElectionConfig {
                strict_new_lease: bounds.strict,
                ..ElectionConfig::with_defaults(ELECTIONS[0], "a")
            },
            bounds,
        }
    }

    /// Daemon `n`'s clock at real time `t`.
    fn local(&self, n: usize, t: Ms) -> Instant {
        let rate = 1000 + drift_per_mille(&self.cfg, n);
        Instant::from_since_origin(Duration::from_micros(t * rate as u64))
    }

    /// The first real ms at which daemon `n`'s clock reads `at` or later.
    fn real(&self, n: usize, at: Instant) -> Ms {
        let rate = (1000 + drift_per_mille(&self.cfg, n)) as u128;
        let micros = at.since_origin().as_micros();
        u64::try_from(micros.div_ceil(rate)).unwrap_or(u64::MAX)
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    /// The bounded-delay limit after a crash: L·(1+D)² + 3·P, in real ms.
    pub fn takeover_bound(&self) -> Ms {
        let d = self.cfg.max_clock_drift;
        let l = Self::ms(self.cfg.lease_duration) * (1.0 + d) * (1.0 + d);
        (l + 3.0 * Self::ms(self.cfg.retry_interval)).ceil() as Ms
    }

    /// The limit after a release the stream hid:
    /// 2·L·(1+D)² + 2·R + 3·P, in real ms.
    pub fn release_bound(&self) -> Ms {
        let d = self.cfg.max_clock_drift;
        let l = Self::ms(self.cfg.lease_duration) * (1.0 + d) * (1.0 + d);
        let r = Self::ms(self.cfg.renew_interval);
        let p = Self::ms(self.cfg.retry_interval);
        (2.0 * l + 2.0 * r + 3.0 * p).ceil() as Ms
    }

    fn election_config(&self, n: usize, e: usize) -> ElectionConfig {
        let id = self.bounds.identities[n];
        ElectionConfig {
            name: ELECTIONS[e].into(),
            identity: id.into(),
            holder_meta: Some(HolderMeta {
                address: Some(format!("{id}-{n}:80")),
                ..Default::default()
            }),
            ..self.cfg.clone()
        }
    }

    /// Whether daemon `n`'s job of election `e` may run at `w.t`.
    pub fn runs_job(&self, w: &World, n: usize, e: usize) -> bool {
        let daemon = &w.daemons[n];
        let s = daemon.node.state(ElectionId(e as u32));
        daemon.alive
            && matches!(s.role, Role::Leader | Role::Stopping)
            && s.tenure
                .as_ref()
                .is_some_and(|t| self.local(n, w.t) < t.valid_until)
    }

    fn leads(w: &World, n: usize, e: usize) -> bool {
        w.daemons[n].node.state(ElectionId(e as u32)).role == Role::Leader
    }
}

impl World {
    /// Whether daemon `n` holds a tenure of any election.
    fn leads_any(&self, n: usize) -> bool {
        let node = &self.daemons[n].node;
        (0..node.len()).any(|e| node.state(ElectionId(e as u32)).tenure.is_some())
    }
}

impl NodeModel {
    /// What daemon `n` is told along with an input at `w.t`.
    fn moment(&self, w: &World, n: usize) -> Moment {
        Moment {
            tick: Tick {
                now: self.local(n, w.t),
                stamp: Stamp::new(format!("r{}", w.rvns), EPOCH_MS + w.t),
                jitter: 0.0,
            },
            may_campaign: w.daemons[n].gate,
        }
    }

    /// Hand `input` to daemon `n`'s node at `w.t` and collect what it asks
    /// for.
    fn feed(&self, w: &mut World, n: usize, input: NodeInput) {
        let moment = self.moment(w, n);
        let base = moment.tick.stamp.rvn();
        let led: Vec<bool> = (0..self.bounds.elections)
            .map(|e| Self::leads(w, n, e))
            .collect();
        let daemon = &mut w.daemons[n];
        let node = Arc::make_mut(&mut daemon.node);
        node.handle(&moment, input);
        let mut used = false;
        while let Some(action) = node.poll_action() {
            match action {
                NodeAction::Read { request, key, .. } => {
                    daemon.requests.insert(request, Request::read(key));
                }
                NodeAction::ReadMany { request, keys, .. } => {
                    daemon.requests.insert(request, Request::read_many(keys));
                }
                NodeAction::Write {
                    request,
                    op,
                    lease,
                    condition,
                    ..
                } => {
                    used |= lease.rvn == base || lease.rvn.starts_with(&format!("{base}."));
                    if !moment.may_campaign && matches!(op, WriteOp::Create | WriteOp::TakeOver) {
                        w.took_while_failing = true;
                    }
                    daemon
                        .requests
                        .insert(request, Request::write(*lease, condition));
                }
                NodeAction::Tell { election, event } => {
                    daemon.told[election.index()] = Some(event);
                }
                _ => {}
            }
        }
        w.rvns += u32::from(used);
        for (e, was) in led.into_iter().enumerate() {
            if !was && Self::leads(w, n, e) {
                let watch = &mut w.elections[e];
                if watch.orphaned {
                    w.led_since_crash = true;
                    watch.orphaned = false;
                }
                if watch.released_at.take().is_some() {
                    w.led_since_release = true;
                }
                self.led(w, n, e);
            }
        }
    }

    fn daemon_steps(&self, w: &World, n: usize, steps: &mut Vec<Step>) {
        let daemon = &w.daemons[n];
        let b = &self.bounds;
        if !daemon.alive {
            return;
        }
        self.request_steps(w, n, steps);
        if daemon.frozen {
            steps.push(Step::Thaw(n));
            return;
        }
        if w.pauses_left > 0 {
            steps.push(Step::Freeze(n));
        }
        if self.due(w, n) {
            steps.push(Step::Wake(n));
        }
        for e in 0..b.elections {
            self.election_steps(w, n, e, steps);
        }
        let holds = (0..b.elections).any(|e| {
            let s = daemon.node.state(ElectionId(e as u32));
            if b.timely {
                s.role == Role::Leader
            } else {
                s.tenure.is_some()
            }
        });
        if self.may_close_gate(w, n, holds) {
            steps.push(Step::GateCloses(n));
        }
        if w.gate_opens_left > 0 && !daemon.gate {
            steps.push(Step::GateOpens(n));
        }
        // Only a daemon with a tenure is worth killing: a follower that
        // dies only stops asking.
        let may_crash = holds && (!b.timely || w.crashed_at.is_none());
        if w.crashes_left > 0 && may_crash {
            steps.push(Step::Crash(n));
        }
    }

    /// What may happen to daemon `n`'s election `e`: a resign, a hint.
    fn election_steps(&self, w: &World, n: usize, e: usize, steps: &mut Vec<Step>) {
        let node = &w.daemons[n].node;
        let id = ElectionId(e as u32);
        if Self::leads(w, n, e) && !w.daemons[n].gate {
            steps.push(Step::ReleaseFailing(n, e));
        }
        if Self::leads(w, n, e) {
            self.preempt_steps(w, n, e, steps);
        }
        if Self::leads(w, n, e) && w.resigns_left > 0 && w.t >= self.bounds.settle {
            steps.push(Step::Resign(n, e, None));
            // Timely runs resign to anyone only: a handover to a daemon
            // that cannot take it waits a lease, by design.
            if !self.bounds.timely {
                for m in (0..3).filter(|m| *m != n) {
                    steps.push(Step::Resign(n, e, Some(m)));
                }
            }
        }
        if node.core(id).takes_hints() && w.hints_left > 0 {
            let kinds = [
                Forged::RenewedLive,
                Forged::RenewedMadeUp,
                Forged::ReleasedLive,
                Forged::ReleasedToReceiver,
                Forged::NotLeader,
                Forged::Ended,
            ];
            for kind in kinds.into_iter().chain((0..3).map(Forged::Replay)) {
                if self.forged_event(w, n, e, kind).is_some() {
                    steps.push(Step::Hint(n, e, kind));
                }
            }
        }
    }

    /// Whether daemon `n` is idle and due to wake.
    fn due(&self, w: &World, n: usize) -> bool {
        let daemon = &w.daemons[n];
        daemon.alive
            && !daemon.frozen
            && daemon
                .node
                .next_wake()
                .is_some_and(|at| at <= self.local(n, w.t))
    }

    /// Where time may move next, and whether that delays a request in
    /// flight: to the next instant a node wants to be woken, or one retry
    /// interval on when none does. Never while a node that is not frozen
    /// is due.
    fn next_instant(&self, w: &World) -> Option<(Ms, bool)> {
        if (0..3).any(|n| self.due(w, n)) {
            return None;
        }
        let delays = w
            .daemons
            .iter()
            .any(|d| d.alive && !d.frozen && !d.requests.is_empty());
        if delays && w.delays_left == 0 {
            return None;
        }
        let next = (0..3)
            .filter_map(|n| {
                let daemon = &w.daemons[n];
                let at = daemon.node.next_wake()?;
                (daemon.alive && !daemon.frozen).then(|| self.real(n, at))
            })
            .filter(|t| *t > w.t)
            .min()
            .unwrap_or(w.t + self.cfg.retry_interval.as_millis() as u64);
        (next <= self.bounds.horizon).then_some((next, delays))
    }

    fn crash(&self, w: &mut World, n: usize) {
        w.crashes_left -= 1;
        for e in 0..self.bounds.elections {
            if Self::leads(w, n, e) {
                w.crashed_at = Some(w.t);
                w.elections[e].orphaned = true;
            }
        }
        let daemon = &mut w.daemons[n];
        daemon.alive = false;
        for request in std::mem::take(&mut daemon.requests).into_values() {
            if let Request::Write {
                lease,
                condition,
                answer: None,
            } = request
                && w.stray.is_none()
            {
                w.stray = Some((lease, condition));
            }
        }
    }
}

impl Model for NodeModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let start = Instant::from_since_origin(Duration::ZERO);
        let b = &self.bounds;
        let daemons = (0..3)
            .map(|n| {
                let id = b.identities[n];
                let mut node = Node::new(id, &self.cfg, start, true).mutated(b.node_mutations);
                if b.sessions {
                    node = node.with_session(self.election_config(n, 0), b.always_session);
                }
                for e in 0..b.elections {
                    let mutations = b.mutations;
                    node.add_election(self.election_config(n, e), Duration::ZERO, true, |c| {
                        c.mutated(mutations)
                    });
                }
                Daemon {
                    node: Arc::new(node),
                    alive: true,
                    frozen: false,
                    frozen_at: 0,
                    gate: true,
                    requests: BTreeMap::new(),
                    told: vec![None; b.elections],
                    preempted_at: vec![None; b.elections],
                    reopened: false,
                }
            })
            .collect();
        let mut world = World {
            t: 0,
            daemons,
            records: BTreeMap::new(),
            stray: None,
            rvns: 0,
            hints_left: b.hints,
            losses_left: b.losses,
            resigns_left: b.resigns,
            crashes_left: b.crashes,
            pauses_left: b.pauses,
            delays_left: b.delays,
            gate_closes_left: b.gate_closes,
            gate_opens_left: b.gate_opens,
            preempts_left: b.preempts,
            deletes_left: b.deletes,
            elections: vec![Watch::default(); b.elections],
            token_fell: false,
            successor_passed_over: false,
            took_while_failing: false,
            crashed_at: None,
            led_since_crash: false,
            led_since_release: false,
            led_after_reopen: false,
            led_by_preferred: false,
        };
        // Every daemon's session names one set of elections, as balance
        // labels it (a takeover may then wait for a daemon that ranks
        // before the taker, where the taker knows that daemon's session
        // and its stream flows).
        if b.sessions {
            for n in 0..3 {
                let set = [(SET_LABEL.to_owned(), "model".to_owned())];
                self.feed(&mut world, n, NodeInput::Labels(set.into()));
            }
        }
        vec![world]
    }

    fn actions(&self, w: &World, steps: &mut Vec<Step>) {
        for n in 0..3 {
            self.daemon_steps(w, n, steps);
        }
        if w.deletes_left > 0 {
            for (e, name) in ELECTIONS.iter().enumerate().take(self.bounds.elections) {
                let live = w.records.get(*name).is_some_and(|l| l.holder.is_some());
                // Tokens rise across a deletion because a new item's token
                // is at least the wall clock's ms: deleted once the clock
                // passed every token written.
                let past = EPOCH_MS + w.t > w.elections[e].top_token;
                if live && past {
                    steps.push(Step::Delete(e));
                }
            }
        }
        if w.stray.is_some() {
            steps.push(Step::Stray);
        }
        if let Some((t, _)) = self.next_instant(w) {
            steps.push(Step::Advance(t));
        }
    }

    fn next_state(&self, last: &World, step: Step) -> Option<World> {
        let mut w = last.clone();
        match step {
            Step::Wake(n) => self.feed(&mut w, n, NodeInput::Timeout),
            Step::Store(n, request, with_record) => self.serve(&mut w, n, &request, with_record)?,
            Step::Answer(n, request) => self.answer(&mut w, n, &request, false)?,
            Step::Lose(n, request) => {
                w.losses_left -= 1;
                self.answer(&mut w, n, &request, true)?;
            }
            Step::Hint(n, e, kind) => {
                w.hints_left -= 1;
                let hint = self.forged_event(&w, n, e, kind)?;
                let election = ElectionId(e as u32);
                self.feed(&mut w, n, NodeInput::Hint { election, hint });
            }
            Step::Resign(n, e, to) => self.resign(&mut w, n, e, to),
            Step::GateCloses(n) => {
                w.gate_closes_left -= 1;
                w.daemons[n].gate = false;
            }
            Step::GateOpens(n) => Self::open_gate(&mut w, n),
            Step::Preempt(n, e, m) => self.preempt(&mut w, n, e, m)?,
            Step::ReleaseFailing(n, e) => self.release_failing(&mut w, n, e),
            Step::Delete(e) => {
                w.deletes_left -= 1;
                w.records.remove(ELECTIONS[e]);
                w.elections[e].written_at = w.t;
            }
            Step::Crash(n) => self.crash(&mut w, n),
            Step::Freeze(n) => {
                w.pauses_left -= 1;
                w.daemons[n].frozen = true;
                w.daemons[n].frozen_at = w.t;
            }
            Step::Thaw(n) => w.daemons[n].frozen = false,
            Step::Stray => {
                let (lease, condition) = w.stray.take()?;
                self.apply(&mut w, &lease, &condition);
            }
            Step::Advance(t) => {
                let (_, delays) = self.next_instant(&w)?;
                w.delays_left -= u8::from(delays);
                // A timely store serves what reached it at once: a write
                // the crashed leader left on the way applies now or never.
                if self.bounds.timely {
                    w.stray = None;
                }
                w.t = t;
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one job at a time", |m: &NodeModel, w: &World| {
                (0..m.bounds.elections)
                    .all(|e| (0..3).filter(|n| m.runs_job(w, *n, e)).count() <= 1)
            }),
            Property::always("fencing tokens rise", |_, w: &World| !w.token_fell),
            Property::always(
                "a handed-over lease waits a lease for others",
                |_, w: &World| !w.successor_passed_over,
            ),
            Property::always("no take while the app check fails", |_, w: &World| {
                !w.took_while_failing
            }),
            Property::always(
                "a follower leads in time after a crash",
                |m: &NodeModel, w: &World| {
                    let orphaned = w.elections.iter().any(|e| e.orphaned);
                    !m.bounds.timely
                        || !orphaned
                        || w.crashed_at.is_none_or(|c| w.t <= c + m.takeover_bound())
                },
            ),
            Property::always(
                "a released election is led again in time",
                |m: &NodeModel, w: &World| {
                    !m.bounds.timely
                        || w.elections
                            .iter()
                            .all(|e| e.released_at.is_none_or(|r| w.t <= r + m.release_bound()))
                },
            ),
            // Examples, so that the bounds above are seen to be reached.
            Property::sometimes(LED_AFTER_CRASH, |_, w: &World| w.led_since_crash),
            Property::sometimes(LED_AFTER_RELEASE, |_, w: &World| w.led_since_release),
            Property::sometimes(LED_AFTER_REOPEN, |_, w: &World| w.led_after_reopen),
            Property::sometimes(LED_BY_PREFERRED, |_, w: &World| w.led_by_preferred),
        ]
    }

    fn within_boundary(&self, w: &World) -> bool {
        w.t <= self.bounds.horizon
    }
}
