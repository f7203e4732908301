//! The model checker of the election core: three [`Core`]s of one election,
//! a store, clocks that drift, pauses, crashes, lost and late answers, and a
//! hostile network that forges, replays and drops hints, explored by
//! `stateright` over every interleaving within a horizon and budgets.
//!
//! - Time is real time in ms ([`World::t`]); each core reads its own clock,
//!   which runs at a fixed rate off real time: `a` fast by D, `b` slow by
//!   D, `c` exact. The rules are monotone in the clock rates, so the
//!   extremes stand for every drift within D. Time moves on by
//!   [`Step::Advance`] to the next instant a core wants to be woken (or a
//!   retry interval, to let answers arrive late), once every core that is
//!   due has woken, except a frozen one (SIGSTOP, a stalled runtime: it
//!   does nothing until it thaws, and its clock keeps running, as the boot
//!   clock does).
//! - The store applies a conditional write when it receives it, which may
//!   be long after it was sent; its answer may arrive late, or be lost (the
//!   core then gets a timeout, and a write still on its way may apply
//!   later: a stray write). A failed condition is answered with or
//!   without the record, as DynamoDB and its emulators differ.
//! - Hints: any follower may at any time receive a replay of the last event
//!   any core told, or a forgery: `renewed` naming the store's live `rvn`
//!   or a made-up one with a 1 ms lease, `released` naming the live `rvn`
//!   (handed to nobody, or to the receiver), `not_leader`, or the stream's
//!   end. The core reads no other field of a hint (holder, token) for a
//!   decision, so those carry fixed made-up values.
//! - Sessions ([`Bounds::sessions`]): each core holds its tenures through
//!   its daemon's [`SessionCore`], which has requests of its own beside
//!   the core's (a lane each); the store keeps the session records beside
//!   the election's. A frozen or crashed daemon freezes or loses both.
//! - Properties: no two jobs run at one real instant (a core's job runs
//!   while it is `Leader` or `Stopping` and its own clock is before the
//!   tenure's `valid_until`: the guard kills it then, even if leaderd is
//!   paused); fencing tokens rise with every new tenure; a lease handed to
//!   a named successor is taken by no one else for one lease; and, with
//!   [`Bounds::timely`], a follower leads within L·(1+D)² + 3·P of the
//!   leader's crash whatever the hints say.
//!
//! The rooms: this file is the world and its steps; `checks` runs the
//! searches and holds the deliberate defects; `network` is the hostile
//! network; `sessions` the daemons' sessions and the store's session
//! records; `trace` writes counterexamples.

use std::time::Duration;

use stateright::{Model, Property};

use std::collections::BTreeMap;

use super::election::{
    Action as CoreAction, AfterRelease, Core, ElectionConfig, Input, Mutations, Role, Tick,
};
use super::hints::LeaseEvent;
use super::session::{SessionCore, SessionView};
use crate::core::record::{Condition, HolderMeta, Lease, Record, Stamp, WriteOutcome};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

mod checks;
mod network;
mod sessions;
mod trace;

use super::session::SessionInput;
use sessions::apply_session;

/// Real time, ms.
type Ms = u64;

const ELECTION: &str = "e";
/// The name of the example of a takeover after a crash.
pub(crate) const LED_AFTER_CRASH: &str = "a follower leads after a crash";
/// Unix ms of real time 0 (record stamps only).
const EPOCH_MS: u64 = 1_700_000_000_000;

/// What the checker may do, and how far.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    /// The cores' identities (two may share one: a restarted process
    /// while the old one is still paused).
    pub identities: [&'static str; 3],
    /// Real time explored, ms.
    pub horizon: Ms,
    /// Hints delivered (replayed or forged).
    pub hints: u8,
    /// Answers lost (the core gets a timeout).
    pub losses: u8,
    /// Resigns (to anyone, or to a named successor).
    pub resigns: u8,
    /// Crashes (kill -9: the guard kills the job at once).
    pub crashes: u8,
    /// Pauses (SIGSTOP of leaderd, a stalled runtime): a frozen core does
    /// nothing until it thaws, while its clock keeps running. Cores that
    /// are not frozen wake when they are due.
    pub pauses: u8,
    /// Times time moves on while a request is in flight (a slow store, a
    /// late answer).
    pub delays: u8,
    /// Timely mode for the bounded-delay property: only a leader crashes
    /// (with no pauses, delays or losses: the store answers and the
    /// followers are alive).
    pub timely: bool,
    /// Deliberate defects in every core.
    pub mutations: Mutations,
    /// Each core holds its tenures through its daemon's session (a
    /// [`SessionCore`] beside it, with its own requests).
    pub sessions: bool,
}

/// One core and what is in flight for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Node {
    core: Core,
    /// The daemon's session, with sessions.
    session: Option<SessionCore>,
    /// The session as the core was last told of it.
    view: Option<SessionView>,
    alive: bool,
    frozen: bool,
    /// When it froze last, real ms.
    frozen_at: Ms,
    request: Option<Request>,
    /// The session core's request in flight.
    session_request: Option<Request>,
    /// The last event it told its followers (replayed by the network).
    told: Option<LeaseEvent>,
    /// The count of ended tenures of the session its election is held
    /// through, as its daemon judges it.
    count: crate::core::node::CountBasis,
}

/// A store request in flight; `answer` once the store has processed it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // a few per state, never many
enum Request {
    /// A read of the record under `key`; `session`: the answer is a
    /// session record the election core asked for.
    Read {
        key: String,
        session: bool,
        answer: Option<Result<Record, StoreError>>,
    },
    Write {
        lease: Lease,
        condition: Condition,
        answer: Option<Result<WriteOutcome, StoreError>>,
    },
}

/// The whole system at one real instant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct World {
    /// Real time, ms.
    pub t: Ms,
    nodes: Vec<Node>,
    /// The store's record (`None`: no item).
    record: Option<Lease>,
    /// The store's session records, by key.
    sessions: BTreeMap<String, Lease>,
    /// When each session record was last written, real ms: the earliest a
    /// stream could have named its `rvn`.
    session_written: BTreeMap<String, Ms>,
    /// When the record was last written, real ms.
    written_at: Ms,
    /// A write whose sender gave up on it, that may still apply.
    stray: Option<(Lease, Condition)>,
    /// rvns handed out so far (they are `r0`, `r1`, ...).
    rvns: u32,
    hints_left: u8,
    losses_left: u8,
    resigns_left: u8,
    crashes_left: u8,
    pauses_left: u8,
    delays_left: u8,
    /// The highest fencing token ever written, and the tenure (holder,
    /// token) of the last held record.
    top_token: u64,
    tenure: Option<(String, u64)>,
    token_fell: bool,
    successor_passed_over: bool,
    /// When a leading core crashed (timely mode).
    crashed_at: Option<Ms>,
    /// Whether a core became leader since.
    led_since_crash: bool,
}

/// A hint the network delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Forged {
    /// `renewed` naming the store's live rvn, promising a 1 ms lease.
    RenewedLive,
    /// `renewed` naming an rvn nobody wrote.
    RenewedMadeUp,
    /// `released` naming the live rvn, handed to nobody.
    ReleasedLive,
    /// `released` naming the live rvn, handed to the receiver.
    ReleasedToReceiver,
    /// `not_leader`.
    NotLeader,
    /// The stream ends.
    Ended,
    /// The last event core `n` told, again.
    Replay(usize),
}

/// Whose request: the election core's or its session core's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    Election,
    Session,
}

/// One step of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// Core `n` handles the timeout it asked for.
    Wake(usize),
    /// Core `n`'s session core handles the timeout it asked for.
    WakeSession(usize),
    /// The store processes core `n`'s request on a lane; a failed
    /// condition is answered with the record when the flag is set.
    Store(usize, Lane, bool),
    /// Core `n` receives its answer on a lane.
    Answer(usize, Lane),
    /// Core `n`'s answer on a lane is lost: it gets a timeout.
    Lose(usize, Lane),
    /// Core `n` receives a hint.
    Hint(usize, Forged),
    /// Core `n` resigns, handing the lease to core `m`'s identity or anyone.
    Resign(usize, Option<usize>),
    /// Core `n` is killed (its job with it).
    Crash(usize),
    /// Core `n` freezes.
    Freeze(usize),
    /// Core `n` thaws.
    Thaw(usize),
    /// The stray write reaches the store.
    Stray,
    /// Real time moves to this instant.
    Advance(Ms),
}

/// The model: the election's timing and the bounds.
pub(crate) struct ElectionModel {
    pub cfg: ElectionConfig,
    pub bounds: Bounds,
}

/// Clock rate off real time, per mille, of core `n`: fast, slow, exact.
fn drift_per_mille(cfg: &ElectionConfig, n: usize) -> i64 {
    let d = (cfg.max_clock_drift * 1000.0).round() as i64;
    [d, -d, 0][n]
}

impl ElectionModel {
    /// Defaults for the model: the built-in timing (L 10 s, R 5 s, P 1 s,
    /// G 2 s, M 200 ms, D 1 %).
    pub fn new(bounds: Bounds) -> ElectionModel {
        ElectionModel {
            cfg: ElectionConfig::with_defaults(ELECTION, "a"),
            bounds,
        }
    }

    /// Core `n`'s clock at real time `t`.
    fn local(&self, n: usize, t: Ms) -> Instant {
        let rate = 1000 + drift_per_mille(&self.cfg, n);
        Instant::from_since_origin(Duration::from_micros(t * rate as u64))
    }

    /// The first real ms at which core `n`'s clock reads `at` or later.
    fn real(&self, n: usize, at: Instant) -> Ms {
        let rate = (1000 + drift_per_mille(&self.cfg, n)) as u128;
        let micros = at.since_origin().as_micros();
        u64::try_from(micros.div_ceil(rate)).unwrap_or(u64::MAX)
    }

    /// The bounded-delay limit after a crash: L·(1+D)² + 3·P, in real ms.
    pub fn takeover_bound(&self) -> Ms {
        let d = self.cfg.max_clock_drift;
        let l = self.cfg.lease_duration.as_secs_f64() * (1.0 + d) * (1.0 + d);
        let p = self.cfg.retry_interval.as_secs_f64() * 3.0;
        ((l + p) * 1000.0).ceil() as Ms
    }

    fn node_config(&self, n: usize) -> ElectionConfig {
        let id = self.bounds.identities[n];
        ElectionConfig {
            identity: id.into(),
            holder_meta: Some(HolderMeta {
                address: Some(format!("{id}-{n}:80")),
                labels: Default::default(),
            }),
            ..self.cfg.clone()
        }
    }

    /// Whether core `n`'s job may run at `w.t`.
    pub fn runs_job(&self, w: &World, n: usize) -> bool {
        let node = &w.nodes[n];
        let s = node.core.state();
        node.alive
            && matches!(s.role, Role::Leader | Role::Stopping)
            && s.tenure
                .as_ref()
                .is_some_and(|t| self.local(n, w.t) < t.valid_until)
    }

    /// What core `n` is told along with an input at `w.t`.
    fn tick(&self, w: &World, n: usize) -> Tick {
        Tick {
            now: self.local(n, w.t),
            stamp: Stamp {
                rvn: format!("r{}", w.rvns),
                unix_ms: EPOCH_MS + w.t,
            },
            jitter: 0.0,
        }
    }

    /// Hand `input` to core `n` at `w.t` and collect what it asks for.
    fn feed(&self, w: &mut World, n: usize, input: Input) {
        let tick = self.tick(w, n);
        let was_leader = w.nodes[n].core.state().role == Role::Leader;
        let node = &mut w.nodes[n];
        node.core.handle(&tick, input);
        let mut ended = false;
        while let Some(action) = node.core.poll_action() {
            match action {
                CoreAction::Read { confirming, .. } => {
                    if !confirming {
                        node.count.read_sent();
                    }
                    node.request = Some(Request::Read {
                        key: ELECTION.into(),
                        session: false,
                        answer: None,
                    })
                }
                CoreAction::ReadSession { key, .. } => {
                    node.request = Some(Request::Read {
                        key,
                        session: true,
                        answer: None,
                    })
                }
                CoreAction::Write {
                    lease, condition, ..
                } => {
                    if lease.rvn == tick.stamp.rvn {
                        w.rvns += 1;
                    }
                    node.request = Some(Request::Write {
                        lease,
                        condition,
                        answer: None,
                    });
                }
                CoreAction::Tell(event) => node.told = Some(event),
                // A tenure's end moves the count its session's next write
                // carries.
                CoreAction::TenureOver => ended = true,
                _ => {}
            }
        }
        if !was_leader && node.core.state().role == Role::Leader && w.crashed_at.is_some() {
            w.led_since_crash = true;
        }
        // The daemon keeps its session open while its election wants it.
        let wants = node.core.wants_session();
        let session = node.session.as_ref();
        let count = session.map(SessionCore::tenures_ended).filter(|_| ended);
        if session.is_some_and(|s| s.is_wanted() != wants) {
            self.feed_session(w, n, SessionInput::Wanted(wants));
        }
        if let Some(count) = count {
            self.feed_session(w, n, SessionInput::TenuresEnded(count + 1));
        }
    }

    /// The store applies `lease` under `condition` if it holds.
    fn apply(&self, w: &mut World, lease: &Lease, condition: &Condition) -> Option<Record> {
        if lease.election != ELECTION {
            return apply_session(w, lease, condition);
        }
        let current = w.record.clone().map_or(Record::Absent, Record::Valid);
        if !condition.holds(&current, None) {
            return Some(current);
        }
        if let Some(holder) = &lease.holder {
            let tenure = (holder.clone(), lease.fencing_token);
            if w.tenure.as_ref() != Some(&tenure) {
                if lease.fencing_token <= w.top_token {
                    w.token_fell = true;
                }
                w.tenure = Some(tenure);
            }
            if let Some(old) = &w.record
                && old.holder.is_none()
                && old.successor.as_ref().is_some_and(|s| s != holder)
                && w.t < w.written_at + self.cfg.lease_duration.as_millis() as u64
            {
                w.successor_passed_over = true;
            }
        }
        w.top_token = w.top_token.max(lease.fencing_token);
        w.record = Some(lease.clone());
        w.written_at = w.t;
        None
    }

    fn node_steps(&self, w: &World, n: usize, steps: &mut Vec<Step>) {
        let node = &w.nodes[n];
        let b = &self.bounds;
        if !node.alive {
            return;
        }
        // The store serves a frozen core's request; the core hears of it
        // once it thaws.
        for (lane, request) in [
            (Lane::Election, &node.request),
            (Lane::Session, &node.session_request),
        ] {
            match request {
                Some(Request::Read { answer: None, .. }) => steps.push(Step::Store(n, lane, false)),
                Some(Request::Write { answer: None, .. }) => {
                    steps.push(Step::Store(n, lane, false));
                    steps.push(Step::Store(n, lane, true));
                }
                Some(_) if !node.frozen => steps.push(Step::Answer(n, lane)),
                Some(_) => {}
                None => {}
            }
            if request.is_some() && w.losses_left > 0 && !b.timely && !node.frozen {
                steps.push(Step::Lose(n, lane));
            }
        }
        if node.frozen {
            steps.push(Step::Thaw(n));
            return;
        }
        if w.pauses_left > 0 {
            steps.push(Step::Freeze(n));
        }
        if self.session_due(w, n) {
            steps.push(Step::WakeSession(n));
        }
        if node.request.is_none() {
            if node
                .core
                .next_wake()
                .is_some_and(|at| at <= self.local(n, w.t))
            {
                steps.push(Step::Wake(n));
            }
            let role = node.core.state().role;
            if role == Role::Leader && w.resigns_left > 0 && !b.timely {
                steps.push(Step::Resign(n, None));
                for m in (0..3).filter(|m| *m != n) {
                    steps.push(Step::Resign(n, Some(m)));
                }
            }
            if node.core.takes_hints() && w.hints_left > 0 {
                let kinds = [
                    Forged::RenewedLive,
                    Forged::RenewedMadeUp,
                    Forged::ReleasedLive,
                    Forged::ReleasedToReceiver,
                    Forged::NotLeader,
                    Forged::Ended,
                ];
                for kind in kinds.into_iter().chain((0..3).map(Forged::Replay)) {
                    if self.forged_event(w, n, kind).is_some() {
                        steps.push(Step::Hint(n, kind));
                    }
                }
            }
        }
        // Only a core with a tenure is worth killing: a follower that dies
        // only stops asking.
        let may_crash = if b.timely {
            node.core.state().role == Role::Leader && w.crashed_at.is_none()
        } else {
            node.core.state().tenure.is_some()
        };
        if w.crashes_left > 0 && may_crash {
            steps.push(Step::Crash(n));
        }
    }

    /// The store processes core `n`'s request: a read sees the record
    /// now, a write applies if its condition holds (a failed one is
    /// answered with the record when `with_record`).
    fn serve(&self, w: &mut World, n: usize, lane: Lane, with_record: bool) -> Option<()> {
        let processed = match w.nodes[n].slot(lane).clone()? {
            Request::Read { key, session, .. } => Request::Read {
                answer: Some(Ok(w.read(&key))),
                key,
                session,
            },
            Request::Write {
                lease, condition, ..
            } => {
                let answer = match self.apply(w, &lease, &condition) {
                    None => WriteOutcome::Applied,
                    Some(current) => WriteOutcome::ConditionFailed {
                        current: with_record.then_some(current),
                    },
                };
                Request::Write {
                    lease,
                    condition,
                    answer: Some(Ok(answer)),
                }
            }
        };
        *w.nodes[n].slot(lane) = Some(processed);
        Some(())
    }

    /// Core `n`'s answer is lost: it gets a timeout; a write that had not
    /// reached the store yet may still reach it (a stray write).
    fn lose(&self, w: &mut World, n: usize, lane: Lane) -> Option<()> {
        w.losses_left -= 1;
        let timeout = Err(StoreError::Timeout(self.cfg.renew_interval));
        let request = w.nodes[n].slot(lane).take()?;
        if let Request::Write {
            lease,
            condition,
            answer: None,
        } = &request
            && w.stray.is_none()
        {
            w.stray = Some((lease.clone(), condition.clone()));
        }
        self.answer(w, n, lane, request, Some(timeout))
    }

    /// Core `n` gets the answer of `request` on `lane` (or `timeout`
    /// instead).
    fn answer(
        &self,
        w: &mut World,
        n: usize,
        lane: Lane,
        request: Request,
        timeout: Option<Result<(), StoreError>>,
    ) -> Option<()> {
        let error = timeout.map(|t| t.expect_err("a timeout is an error"));
        match (lane, request) {
            (
                Lane::Election,
                Request::Read {
                    session,
                    answer,
                    key,
                },
            ) => {
                let res = error.map_or_else(|| answer.expect("answered"), Err);
                let input = if session {
                    let mut answer = self.session_answer(w, n, &key, res);
                    if let Ok(record) = &answer.record {
                        answer.moved = w.nodes[n].count.answered(&key, record);
                    }
                    Input::SessionRecord(answer)
                } else {
                    Input::Read(res)
                };
                self.feed(w, n, input);
            }
            (Lane::Election, Request::Write { answer, .. }) => {
                let res = error.map_or_else(|| answer.expect("answered"), Err);
                self.feed(w, n, Input::Written(res));
            }
            (Lane::Session, Request::Read { answer, .. }) => {
                let res = error.map_or_else(|| answer.expect("answered"), Err);
                self.feed_session(w, n, SessionInput::Read(res));
            }
            (Lane::Session, Request::Write { answer, .. }) => {
                let res = error.map_or_else(|| answer.expect("answered"), Err);
                self.feed_session(w, n, SessionInput::Written(res));
            }
        }
        Some(())
    }

    /// Whether core `n` is idle and due to wake.
    fn due(&self, w: &World, n: usize) -> bool {
        let node = &w.nodes[n];
        if self.session_due(w, n) {
            return true;
        }
        node.alive
            && !node.frozen
            && node.request.is_none()
            && node
                .core
                .next_wake()
                .is_some_and(|at| at <= self.local(n, w.t))
    }

    /// Where time may move next, and whether that delays a request in
    /// flight: to the next instant an idle core wants to be woken, or one
    /// retry interval on when none does. Never while a core that is not
    /// frozen is due.
    fn next_instant(&self, w: &World) -> Option<(Ms, bool)> {
        if (0..3).any(|n| self.due(w, n)) {
            return None;
        }
        let delays = w
            .nodes
            .iter()
            .any(|n| n.alive && !n.frozen && (n.request.is_some() || n.session_request.is_some()));
        if delays && w.delays_left == 0 {
            return None;
        }
        let next = (0..3)
            .flat_map(|n| {
                let node = &w.nodes[n];
                let idle = node.alive && !node.frozen;
                let core = (idle && node.request.is_none())
                    .then(|| node.core.next_wake())
                    .flatten();
                let session = (idle && node.session_request.is_none())
                    .then(|| node.session.as_ref().and_then(SessionCore::next_wake))
                    .flatten();
                [core, session]
                    .into_iter()
                    .flatten()
                    .map(move |at| self.real(n, at))
            })
            .filter(|t| *t > w.t)
            .min()
            .unwrap_or(w.t + self.cfg.retry_interval.as_millis() as u64);
        (next <= self.bounds.horizon).then_some((next, delays))
    }
}

impl Model for ElectionModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let start = Instant::from_since_origin(Duration::ZERO);
        let nodes = (0..3)
            .map(|n| {
                let core = Core::new(self.node_config(n), start, Duration::ZERO, true, true)
                    .mutated(self.bounds.mutations);
                let (core, session) = if self.bounds.sessions {
                    // Opened once its election wants it, as in a daemon
                    // without balance.
                    let session = SessionCore::new(self.node_config(n), start, false);
                    (core.through_sessions(), Some(session))
                } else {
                    (core, None)
                };
                Node {
                    core,
                    session,
                    view: None,
                    alive: true,
                    frozen: false,
                    frozen_at: 0,
                    request: None,
                    session_request: None,
                    told: None,
                    count: Default::default(),
                }
            })
            .collect();
        vec![World {
            t: 0,
            nodes,
            record: None,
            sessions: BTreeMap::new(),
            session_written: BTreeMap::new(),
            written_at: 0,
            stray: None,
            rvns: 0,
            hints_left: self.bounds.hints,
            losses_left: self.bounds.losses,
            resigns_left: self.bounds.resigns,
            crashes_left: self.bounds.crashes,
            pauses_left: self.bounds.pauses,
            delays_left: self.bounds.delays,
            top_token: 0,
            tenure: None,
            token_fell: false,
            successor_passed_over: false,
            crashed_at: None,
            led_since_crash: false,
        }]
    }

    fn actions(&self, w: &World, steps: &mut Vec<Step>) {
        for n in 0..3 {
            self.node_steps(w, n, steps);
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
            Step::Wake(n) => self.feed(&mut w, n, Input::Timeout),
            Step::WakeSession(n) => self.feed_session(&mut w, n, SessionInput::Timeout),
            Step::Store(n, lane, with_record) => self.serve(&mut w, n, lane, with_record)?,
            Step::Answer(n, lane) => {
                let request = w.nodes[n].slot(lane).take()?;
                self.answer(&mut w, n, lane, request, None)?;
            }
            Step::Lose(n, lane) => self.lose(&mut w, n, lane)?,
            Step::Hint(n, kind) => {
                w.hints_left -= 1;
                let hint = self.forged_event(&w, n, kind)?;
                self.feed(&mut w, n, Input::Hint(hint));
            }
            Step::Resign(n, to) => {
                w.resigns_left -= 1;
                let (then, successor) = match to {
                    Some(m) => (
                        AfterRelease::Follow,
                        Some(self.bounds.identities[m].to_owned()),
                    ),
                    None => (AfterRelease::SitOut(self.cfg.lease_duration), None),
                };
                self.feed(&mut w, n, Input::Release { then, successor });
            }
            Step::Crash(n) => {
                w.crashes_left -= 1;
                if w.nodes[n].core.state().role == Role::Leader {
                    w.crashed_at = Some(w.t);
                }
                let node = &mut w.nodes[n];
                node.alive = false;
                for request in [node.request.take(), node.session_request.take()] {
                    if let Some(Request::Write {
                        lease,
                        condition,
                        answer: None,
                    }) = request
                        && w.stray.is_none()
                    {
                        w.stray = Some((lease, condition));
                    }
                }
            }
            Step::Freeze(n) => {
                w.pauses_left -= 1;
                w.nodes[n].frozen = true;
                w.nodes[n].frozen_at = w.t;
            }
            Step::Thaw(n) => w.nodes[n].frozen = false,
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
            Property::always("one job at a time", |m: &ElectionModel, w: &World| {
                (0..3).filter(|n| m.runs_job(w, *n)).count() <= 1
            }),
            Property::always("fencing tokens rise", |_, w: &World| !w.token_fell),
            Property::always(
                "a handed-over lease waits a lease for others",
                |_, w: &World| !w.successor_passed_over,
            ),
            Property::always(
                "a follower leads in time after a crash",
                |m: &ElectionModel, w: &World| {
                    !m.bounds.timely
                        || w.led_since_crash
                        || w.crashed_at.is_none_or(|c| w.t <= c + m.takeover_bound())
                },
            ),
            // An example, so that the bound above is seen to be reached.
            Property::sometimes(LED_AFTER_CRASH, |_, w: &World| w.led_since_crash),
        ]
    }

    fn within_boundary(&self, w: &World) -> bool {
        w.t <= self.bounds.horizon
    }
}
