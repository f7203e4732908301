//! The election core: every rule of one election in one IO-free state machine.
//!
//! The core reads no clock, draws no random number and does no IO. Its
//! driver (`crate::election`'s, a tokio task; the model checker in the
//! tests) hands it what happened, each with a [`Tick`] (the boot-clock
//! instant now, and the stamp a write made now would carry), and carries
//! out what it asks for:
//!
//! - in: an [`Input`]: the answer to the store request it asked for (the
//!   instant is the tick's, the send instant the core noted itself when it
//!   asked), a hint, a command, the app check's verdict, the daemon's
//!   session, the check of a record held through it, or a timeout;
//! - out: [`Action`]s (read, conditional write, tell followers, watch an
//!   address, answer a command, notes for logs and metrics), the published
//!   [`ElectionState`], and the next instant it wants to be woken
//!   ([`Core::next_wake`]). At most one store request is in flight: while
//!   one is, the core wants no wake-up and is fed nothing but its answer.
//!
//! Its settings are in `config` ([`ElectionConfig`]), what it publishes
//! in `state` ([`ElectionState`]), what goes in and out in `protocol`. The rules (all instants on the
//! boot-time clock), each in its room:
//! - `follower`: a follower takes over a record held by, or handed to,
//!   someone else only once the takeover rule allows it ([`TakeoverTimer`],
//!   the one place that rule is written); a released record is taken at
//!   once; every takeover is a write conditional on the `rvn` read;
//! - `leader`: a leader's tenure is valid until the send instant of its
//!   last successful write + L·(1−D) − M; it renews every R (on a grid of
//!   R/20), retries every P, and at validity − G without a renew it stops
//!   the job ([`Role::Stopping`]) and follows once validity ends;
//! - `sessions`: tenures held through sessions (tested step by step in
//!   `session_tests`);
//! - hints only make a follower read sooner, never lead (see
//!   `crate::core::hints`).

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::core::hints::Hints;
use crate::core::record::Lease;
use crate::core::session::SessionView;
use crate::core::store_error::StoreError;
use crate::core::takeover::TakeoverTimer;
use crate::core::time::Instant;

/// Deliberate defects the model checker must find (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mutations {
    /// Date a write's validity from its answer instead of its send.
    pub validity_from_reply: bool,
    /// Take a record handed to someone else at once.
    pub successor_ignored: bool,
    /// Take over at once on a `released` hint, conditional on its `rvn`.
    pub released_hint_trusted: bool,
    /// Time a record with the lease a hint promised for its `rvn`.
    pub hint_lease_ms_used: bool,
    /// A renew conditional on the holder only, not on the `rvn`.
    pub renew_ignores_rvn: bool,
    /// Take an election over once its session timed out, without ending
    /// the session first.
    pub session_end_skipped: bool,
}

/// The leader's private view of its tenure.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Term {
    /// The record of its last successful write.
    lease: Lease,
    /// When that write was sent: validity counts from here.
    last_send: Instant,
    /// When it may lead (later than `since` after creating a missing item
    /// under `strict_new_lease`).
    leads_from: Instant,
    /// When the tenure's first write was sent.
    since: Instant,
    /// Counts tenures in this process.
    seq: u64,
}

/// Where the core stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Not campaigning before `until` (a daemon spaces its elections'
    /// starts).
    Delayed { until: Instant },
    /// Following: the next round reads at `poll_at` (or sooner or later
    /// as hints say).
    Following { poll_at: Instant },
    /// Holding a tenure: renew at `next_renew`.
    Leading {
        term: Box<Term>,
        role: Role,
        next_renew: Instant,
    },
    /// The job must stop; the tenure ends at `valid_until`.
    Stopping {
        term: Box<Term>,
        valid_until: Instant,
    },
    /// Not campaigning until `until` (after a resign).
    SittingOut { until: Instant },
    /// The election has ended.
    Exited,
}

/// The store request in flight, and what its answer is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pending {
    /// A campaign round's read.
    Round,
    /// An acquisition: `lease` under `op`, sent at `sent`.
    Acquire {
        op: WriteOp,
        lease: Lease,
        sent: Instant,
    },
    /// A renew of `renewed`, sent at `sent`.
    Renew { renewed: Lease, sent: Instant },
    /// Reading back after a renew whose condition failed.
    RenewConflict,
    /// A release of `term`'s lease, writing `lease`: `again` once it is the
    /// second try, from an `rvn` of ours found after the first failed its
    /// condition.
    Release {
        term: Box<Term>,
        lease: Lease,
        successor: Option<String>,
        then: AfterRelease,
        again: bool,
        sent: Instant,
    },
    /// Reading back after a release of `term` whose condition failed.
    ReleaseConflict {
        term: Box<Term>,
        successor: Option<String>,
        then: AfterRelease,
    },
    /// A round's read found `election` held through another daemon's
    /// session: reading that session.
    SessionRound { election: Followed },
    /// Ending the session `election` is held through, before taking it.
    EndSession { election: Followed },
}

/// The pause after a request that failed (a follower's round, the
/// opening of a session): P at first, doubling up to 4·P, each drawn from
/// [d, 2d) with the tick's jitter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(in crate::core) struct Backoff {
    failures: u32,
}

impl Backoff {
    pub(in crate::core) fn next_pause(&mut self, retry: Duration, jitter: f64) -> Duration {
        let base = retry * 2u32.saturating_pow(self.failures.min(2));
        self.failures = self.failures.saturating_add(1);
        base + base.mul_f64(jitter.clamp(0.0, 0.999))
    }
}

/// One election's rules; see the module docs.
#[derive(Debug, Clone)]
pub struct Core {
    /// Shared with the daemon's configuration (one copy per election, not
    /// one per holder of it).
    cfg: Arc<ElectionConfig>,
    phase: Phase,
    /// Boxed: it is set only while a request is in flight, and every idle
    /// election would otherwise keep room for the largest (a record).
    pending: Option<Box<Pending>>,
    /// Times the record version the follower read last.
    takeover: TakeoverTimer,
    /// rvns we wrote or may have written (an unanswered write): finding one
    /// of these in the record means nobody else wrote since.
    own_rvns: Vec<String>,
    /// Highest fencing token seen, to keep tokens rising across deletion
    /// of the item.
    last_token: Option<u64>,
    tenure_seq: u64,
    warned_malformed: Option<String>,
    /// The fingerprint of the unknown-format record warned about last.
    warned_unknown_format: Option<String>,
    hints: Hints,
    /// Whether the app check lets this instance campaign.
    may_campaign: bool,
    /// Whether tenures are held through the daemon's session (and not
    /// renewed one by one).
    sessions: bool,
    /// The daemon's own session, when `sessions`.
    own_session: Option<Arc<SessionView>>,
    /// A round found the election free for this daemon but no session to
    /// hold it through: it waits for one (see [`Core::wants_session`]).
    session_wanted: bool,
    /// The last round ended waiting for the session (and was not counted).
    waited_for_session: bool,
    /// The write that round would have made: made as the session opens.
    deferred_take: Option<Box<DeferredTake>>,
    /// The `rvn` of the record whose takeover waited for a daemon that
    /// ranks before this one (see `SessionAnswer::yields`).
    yielded: Option<String>,
    /// Following an election held through another daemon's session while
    /// that daemon's stream flows: the next round reads only the session.
    /// Boxed: an election led here keeps no room for it.
    session_watch: Option<Box<SessionWatch>>,
    backoff: Backoff,
    /// When the last round's read was sent, and answered (or failed).
    last_read_sent: Instant,
    last_read: Instant,
    /// The instant of the last input.
    now: Instant,
    state: ElectionState,
    out: VecDeque<Action>,
    #[cfg(test)]
    mutations: Mutations,
}

impl PartialEq for Core {
    fn eq(&self, other: &Core) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Core {}

impl Hash for Core {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// What a follower round came to.
enum Round {
    /// Nothing to take: look again at this instant.
    Wait(Instant),
    /// Someone else wrote first: look again at once.
    Lost,
    /// A store error: pause before the next round.
    Failed,
}

impl Core {
    /// A core for `cfg` that campaigns from `start + delay`; `has_feed`:
    /// a watch client brings it the leader's hints; `may_campaign`: the app
    /// check's verdict now (true without one).
    pub fn new(
        cfg: impl Into<Arc<ElectionConfig>>,
        start: Instant,
        delay: Duration,
        has_feed: bool,
        may_campaign: bool,
    ) -> Core {
        let cfg = cfg.into();
        let state = ElectionState {
            election: cfg.name.clone(),
            identity: cfg.identity.clone(),
            role: Role::Follower,
            tenure: None,
            leader: None,
            fencing_token: None,
            observed_at: None,
            observed_at_unix_ms: None,
            last_error: None,
            malformed: None,
            unknown_format: None,
            session: None,
            heartbeat: start,
            first_observation_done: false,
            finished: false,
            rounds: 0,
            hints_until: None,
        };
        Core {
            takeover: TakeoverTimer::new(cfg.max_clock_drift),
            cfg,
            phase: Phase::Delayed {
                until: start + delay,
            },
            pending: None,
            own_rvns: Vec::new(),
            last_token: None,
            tenure_seq: 0,
            warned_malformed: None,
            warned_unknown_format: None,
            hints: Hints::new(has_feed),
            may_campaign,
            sessions: false,
            own_session: None,
            session_wanted: false,
            waited_for_session: false,
            deferred_take: None,
            yielded: None,
            session_watch: None,
            backoff: Backoff::default(),
            last_read_sent: start,
            last_read: start,
            now: start,
            state,
            out: VecDeque::new(),
            #[cfg(test)]
            mutations: Mutations::default(),
        }
    }

    /// The same core, holding its tenures through the daemon's session
    /// (told by [`Input::Session`]) instead of renewing its own record.
    pub fn through_sessions(mut self) -> Core {
        self.sessions = true;
        self
    }

    /// The same core with deliberate defects (model checker only).
    #[cfg(test)]
    pub fn mutated(mut self, mutations: Mutations) -> Core {
        self.mutations = mutations;
        self
    }

    /// Everything that changes, for equality and hashing (the config is
    /// fixed for a core's life).
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        &Phase,
        &Option<Box<Pending>>,
        (&TakeoverTimer, &Vec<String>, Option<u64>, u64),
        (&Hints, bool, &Backoff, Instant, Instant),
        (
            bool,
            &Option<Arc<SessionView>>,
            &Option<Box<SessionWatch>>,
            (bool, bool, &Option<Box<DeferredTake>>, &Option<String>),
        ),
        &ElectionState,
        &VecDeque<Action>,
    ) {
        (
            &self.phase,
            &self.pending,
            (
                &self.takeover,
                &self.own_rvns,
                self.last_token,
                self.tenure_seq,
            ),
            (
                &self.hints,
                self.may_campaign,
                &self.backoff,
                self.last_read_sent,
                self.last_read,
            ),
            (
                self.sessions,
                &self.own_session,
                &self.session_watch,
                (
                    self.session_wanted,
                    self.waited_for_session,
                    &self.deferred_take,
                    &self.yielded,
                ),
            ),
            &self.state,
            &self.out,
        )
    }

    /// The election's settings.
    pub fn config(&self) -> &ElectionConfig {
        &self.cfg
    }

    /// The state to publish.
    pub fn state(&self) -> &ElectionState {
        &self.state
    }

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.out.pop_front();
        if self.out.is_empty() {
            // An idle election keeps no room for actions: a few hundred
            // bytes each, a thousand elections over.
            self.out = VecDeque::new();
        }
        action
    }

    /// Whether the election has ended.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Exited
    }

    /// Whether a store request is in flight: it is then fed nothing but
    /// its answer (and the daemon's state: the app check's verdict, the
    /// session), never a command.
    pub fn awaits_answer(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether hints are taken now (only while following between rounds).
    pub fn takes_hints(&self) -> bool {
        self.pending.is_none() && matches!(self.phase, Phase::Following { .. })
    }

    /// Whether it holds a tenure (leading, or confirming one it created):
    /// only then does each renew of the daemon's session matter at once.
    pub fn holds_tenure(&self) -> bool {
        matches!(self.phase, Phase::Leading { .. })
    }

    /// Whether a replacement of the store's data matters now (only while
    /// holding a tenure).
    pub fn watches_store_changes(&self) -> bool {
        self.pending.is_none() && matches!(self.phase, Phase::Leading { .. })
    }

    /// When its last read of its record was sent.
    pub fn last_read_sent(&self) -> Instant {
        self.last_read_sent
    }

    /// When the core wants a [`Input::Timeout`]; `None`: never (a request
    /// is in flight, or the election ended).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.pending.is_some() {
            return None;
        }
        match &self.phase {
            Phase::Delayed { until } => Some(*until),
            Phase::Following { poll_at } => Some(self.follower_wake(*poll_at)),
            Phase::Leading {
                term,
                role,
                next_renew,
            } => {
                let stop_at = self.stop_at(term);
                // Held through a session: nothing to renew here.
                let wake = if self.sessions {
                    stop_at
                } else {
                    (*next_renew).min(stop_at)
                };
                Some(if *role == Role::Confirming {
                    wake.min(term.leads_from)
                } else {
                    wake
                })
            }
            Phase::Stopping { valid_until, .. } => {
                Some((self.now + self.cfg.retry_interval).min(*valid_until))
            }
            Phase::SittingOut { until } => Some((self.now + self.cfg.retry_interval).min(*until)),
            Phase::Exited => None,
        }
    }

    /// Take `input` in at `tick`.
    pub fn handle(&mut self, tick: &Tick, input: Input) {
        self.now = self.now.max(tick.now);
        let now = self.now;
        match input {
            Input::Read(res) => self.on_read(tick, res),
            Input::Written(res) => self.on_written(tick, res),
            Input::Timeout => self.on_timeout(tick),
            Input::Hint(hint) => self.on_hint(tick, hint),
            Input::HintsClosed => self.hints.closed(),
            Input::Release { then, successor } => self.on_release(tick, then, successor),
            Input::Orphaned => self.on_orphaned(tick),
            Input::Gate(pass) => self.on_gate(tick, pass),
            Input::StoreReplaced => self.on_store_replaced(),
            Input::Session(view) => self.on_session(tick, view),
            Input::Checked {
                fencing_token,
                record,
            } => self.on_checked(fencing_token, record),
            Input::SessionRecord(res) => self.on_session_record(tick, res),
        }
        if let Some(target) = self.hints.take_retarget() {
            self.out.push_back(Action::Watch(target));
        }
        self.state.heartbeat = now;
        // While the owner's stream flows, until it counts as quiet; else
        // as the hints say.
        let until = self
            .session_watch
            .as_ref()
            .and_then(|w| w.flow_until)
            .or_else(|| self.hints.quiet_at(self.cfg.hint_quiet()));
        if matches!(self.phase, Phase::Following { .. }) && self.pending.is_none() {
            self.state.hints_until = until;
        }
        if self.phase == Phase::Exited {
            self.state.role = Role::Follower;
            self.state.tenure = None;
            self.state.finished = true;
        }
    }

    pub(super) fn on_timeout(&mut self, tick: &Tick) {
        let now = self.now;
        // Decided on a borrow: a phase holds a lease (its labels too), and
        // every election of a daemon wakes at once.
        let due = match &self.phase {
            Phase::Delayed { until } | Phase::SittingOut { until } if now >= *until => Due::Round,
            Phase::Following { poll_at } if now >= self.follower_wake(*poll_at) => Due::Poll,
            Phase::Leading { .. } => Due::Renew,
            Phase::Stopping { term, valid_until } if now >= *valid_until => {
                Due::Stopped(term.lease.fencing_token)
            }
            _ => Due::Nothing,
        };
        match due {
            Due::Round => self.start_round(),
            Due::Poll => {
                // A read a hint asked for reads the election itself.
                let asked = self.hints.deferred_read().is_some_and(|d| d <= now);
                self.hints.waking(now);
                match self.session_watch.take() {
                    Some(watch) if !asked => self.start_session_round(*watch),
                    _ => self.start_round(),
                }
            }
            Due::Renew => self.leading_tick(tick),
            Due::Stopped(token) => {
                self.state.role = Role::Follower;
                self.state.tenure = None;
                self.note(Note::TenureEnded(token));
                self.start_round();
            }
            Due::Nothing => {}
        }
    }

    pub(super) fn note(&mut self, note: Note) {
        self.out.push_back(Action::Note(note));
    }

    pub(super) fn store_error(&mut self, op: &'static str, error: StoreError) {
        self.state.last_error = Some(error.metric_label().to_owned());
        self.note(Note::StoreError { op, error });
    }

    pub(super) fn observed_ok(
        &mut self,
        tick: &Tick,
        leader: Option<String>,
        token: Option<u64>,
        malformed: Option<String>,
    ) {
        let s = &mut self.state;
        s.observed_at = Some(self.now);
        s.observed_at_unix_ms = Some(tick.stamp.unix_ms);
        s.last_error = None;
        s.first_observation_done = true;
        s.leader = leader;
        s.fencing_token = token;
        s.malformed = malformed;
        s.unknown_format = None;
        s.session = None;
    }

    pub(super) fn remember_own(&mut self, rvn: &str) {
        self.own_rvns.push(rvn.to_owned());
        if self.own_rvns.len() > 4 {
            self.own_rvns.remove(0);
        }
    }

    pub(super) fn note_token(&mut self, token: u64) {
        self.last_token = Some(self.last_token.map_or(token, |t| t.max(token)));
    }
}

mod config;
mod follower;
mod leader;
mod protocol;
#[cfg(test)]
mod session_tests;
mod sessions;
mod state;

pub use config::{ElectionConfig, defaults};
pub use protocol::{Action, Input, Note, Tick, WriteOp};
use sessions::{DeferredTake, Followed, SessionWatch};
pub use state::{AfterRelease, ElectionState, Role, Tenure};

/// What a timeout finds due (see `Core::on_timeout`).
enum Due {
    /// A new round: a delay or a sit-out is over.
    Round,
    /// A follower's poll.
    Poll,
    /// A leader's tick.
    Renew,
    /// A stopped tenure's validity is over (its fencing token).
    Stopped(u64),
    /// Nothing yet.
    Nothing,
}
