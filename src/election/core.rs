//! The election core: every rule of one election in one state machine,
//! without IO.
//!
//! The core reads no clock, draws no random number and does no IO. Its
//! driver (`driver.rs`, a tokio task; the model checker in the tests)
//! hands it what happened, each with a [`Tick`] (the boot-clock instant now,
//! and the stamp a write made now would carry), and carries out what it
//! asks for:
//!
//! - in: the answer to the store request it asked for (a read's record, a
//!   write's outcome: the instant is the tick's, the send instant the core
//!   noted itself when it asked), a hint and when it arrived, a command,
//!   the app check's verdict, the store's data replaced, or a timeout;
//! - out: [`Action`]s (read, conditional write, tell followers, watch an
//!   address, answer a command, notes for logs and metrics), the published
//!   [`ElectionState`], and the next instant it wants to be woken
//!   ([`Core::next_wake`]).
//!
//! At most one store request is in flight: while one is, the core wants no
//! wake-up and the driver feeds it nothing but that request's answer.
//!
//! The rules (all instants on the boot-time clock):
//! - a follower takes over a record held by someone else (or handed to
//!   someone else) only once its `rvn` stayed unchanged for `lease_ms·(1+D)`
//!   ([`TakeoverTimer`], the one place that wait is written); a released
//!   record is taken at once; every takeover is a write conditional on the
//!   `rvn` read;
//! - a leader's tenure is valid until the send instant of its last
//!   successful write + L·(1−D) − M; it renews every R (on a grid of R/20),
//!   retries every P, and at validity − G without a renew it stops the job
//!   ([`Role::Stopping`]) and follows once validity ends;
//! - hints only make a follower read sooner, never lead (see `hints.rs`).

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::hints::{AfterHint, Hint, Hints, LeaseEvent};
use super::takeover::TakeoverTimer;
use super::{AfterRelease, ElectionConfig, ElectionState, Role, Tenure};
use crate::clock::Instant;
use crate::lease::{Condition, Lease, Malformed, Record, Stamp, StoreError, WriteOutcome};

/// What the driver tells the core along with every input: the instant now
/// on the boot-time clock, and what a write made now is stamped with.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Now, on the boot-time clock.
    pub now: Instant,
    /// The stamp of a write made now (a fresh `rvn`, unix ms): the core
    /// uses it for at most one write, and its unix ms for the tokens of
    /// new items and the published state's wall-clock fields.
    pub stamp: Stamp,
    /// A number in [0, 1) that spreads retries of instances that failed
    /// together.
    pub jitter: f64,
}

/// What happened, as the core is told.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The instant asked for by [`Core::next_wake`] came (or any later one;
    /// an earlier one is harmless).
    Timeout,
    /// The answer to the read asked for.
    Read(Result<Record, StoreError>),
    /// The answer to the write asked for (a timeout is an error).
    Written(Result<WriteOutcome, StoreError>),
    /// Something came from the leader's watch stream.
    Hint(Hint),
    /// The watch client is gone for good.
    HintsClosed,
    /// Give the lease up (the caller stopped the job first), then act as
    /// said; answered with [`Action::Answer`].
    Release {
        /// What to do afterwards.
        then: AfterRelease,
        /// Hand the lease to this identity.
        successor: Option<String>,
    },
    /// Nobody can command this election any more: release and end.
    Orphaned,
    /// The app check's verdict: whether it lets this instance campaign.
    Gate(bool),
    /// The store noticed its data was replaced under it.
    StoreReplaced,
}

/// Which write the core asks for; also the label of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteOp {
    /// Create the missing item.
    Create,
    /// Take over a released, expired or malformed record.
    TakeOver,
    /// Renew our lease.
    Renew,
    /// Release our lease.
    Release,
}

impl WriteOp {
    /// The `op` label of metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            WriteOp::Create => "create",
            WriteOp::TakeOver => "take_over",
            WriteOp::Renew => "renew",
            WriteOp::Release => "release",
        }
    }
}

/// What the core asks its driver to do, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Read the record, within `budget`. A `confirming` read only looks
    /// whether a write whose condition failed applied before after all: it
    /// is not a campaign round (not timed for metrics, its error not
    /// logged).
    Read {
        /// Longest the request may take.
        budget: Duration,
        /// See above.
        confirming: bool,
    },
    /// Write `lease` if `condition` holds, within `budget`, and give up at
    /// `deadline` (its answer no longer matters then).
    Write {
        /// Which write.
        op: WriteOp,
        /// The record to write.
        lease: Lease,
        /// Its condition.
        condition: Condition,
        /// Longest the request may take.
        budget: Duration,
        /// When to stop waiting for the answer, if ever.
        deadline: Option<Instant>,
    },
    /// Tell the followers this (the last event replaces the one before).
    Tell(LeaseEvent),
    /// Watch the leader's stream at this address, or none.
    Watch(Option<String>),
    /// Answer the pending release command: whether a lease was released.
    Answer(bool),
    /// Changes of the store's data noticed so far are old news (a new
    /// tenure's first write went to the store as it is now).
    ForgetStoreChanges,
    /// For logs and metrics.
    Note(Note),
}

/// What happened that logs and metrics show.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Note {
    /// A store request of the campaign failed (logged once per change).
    StoreError {
        /// Its `op` label.
        op: &'static str,
        /// The error.
        error: StoreError,
    },
    /// An acquisition attempt (create, take over) ended: `Ok(true)` won,
    /// `Ok(false)` lost the race.
    Acquire {
        /// Create or take over.
        op: WriteOp,
        /// How it ended.
        outcome: Result<bool, StoreError>,
    },
    /// A renew ended: `Ok(true)` applied, `Ok(false)` someone else wrote.
    Renew(Result<bool, StoreError>),
    /// Became leader under this fencing token.
    Gained(u64),
    /// Stopped leading (lost, expired, released or resigned).
    Lost,
    /// Renewed under this fencing token.
    Renewed(u64),
    /// A renew whose answer was lost had applied; carrying on from it.
    AdoptedEarlierWrite,
    /// The store's data was replaced: renewing at once.
    RenewingAfterReplacement(u64),
    /// The lease is lost: the job must stop.
    LeaseLost {
        /// The tenure's fencing token.
        fencing_token: u64,
        /// Who wrote the record instead, when someone did; `None`: no
        /// renew succeeded in time.
        written_by: Option<String>,
    },
    /// The validity of a stopped tenure ended.
    TenureEnded(u64),
    /// The lease was released (to `successor`, or anyone).
    Released {
        /// The tenure's fencing token.
        fencing_token: u64,
        /// Whom it was handed to.
        successor: Option<String>,
    },
    /// Nothing to release: someone else wrote since our last write.
    NothingToRelease(u64),
    /// The release failed: the lease will expire on its own.
    ReleaseFailed(StoreError),
    /// Sitting out this long before campaigning again.
    SittingOut(Duration),
    /// A malformed record, first seen in this form.
    Malformed(String),
    /// Overwriting a malformed record that stayed unchanged for a lease.
    OverwritingMalformed,
    /// The leader's stream contradicts the store: polling for this tenure.
    StreamDistrusted {
        /// The record's holder.
        holder: Option<String>,
        /// The address it advertised.
        address: Option<String>,
    },
}

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
    /// A renew whose condition failed writes again over what it finds.
    pub renew_ignores_rvn: bool,
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
        term: Term,
        role: Role,
        next_renew: Instant,
    },
    /// The job must stop; the tenure ends at `valid_until`.
    Stopping { term: Term, valid_until: Instant },
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
    },
    /// Reading back after a release of `term` whose condition failed.
    ReleaseConflict {
        term: Box<Term>,
        successor: Option<String>,
        then: AfterRelease,
    },
}

/// The follower's pause after a round that failed: P at first, doubling
/// up to 4·P, each drawn from [d, 2d) with the tick's jitter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next_pause(&mut self, retry: Duration, jitter: f64) -> Duration {
        let base = retry * 2u32.saturating_pow(self.failures.min(2));
        self.failures = self.failures.saturating_add(1);
        base + base.mul_f64(jitter.clamp(0.0, 0.999))
    }
}

/// One election's rules; see the module docs.
#[derive(Debug, Clone)]
pub struct Core {
    cfg: ElectionConfig,
    phase: Phase,
    pending: Option<Pending>,
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
    hints: Hints,
    /// Whether the app check lets this instance campaign.
    may_campaign: bool,
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
        cfg: ElectionConfig,
        start: Instant,
        delay: Duration,
        has_feed: bool,
        may_campaign: bool,
    ) -> Core {
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
            hints: Hints::new(has_feed),
            may_campaign,
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
        &Option<Pending>,
        (&TakeoverTimer, &Vec<String>, Option<u64>, u64),
        (&Hints, bool, &Backoff, Instant, Instant),
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
        self.out.pop_front()
    }

    /// Whether the election has ended.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Exited
    }

    /// Whether a store request is in flight (the driver feeds nothing but
    /// its answer meanwhile).
    pub fn awaits_answer(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether hints are taken now (only while following between rounds).
    pub fn takes_hints(&self) -> bool {
        self.pending.is_none() && matches!(self.phase, Phase::Following { .. })
    }

    /// Whether a replacement of the store's data matters now (only while
    /// holding a tenure).
    pub fn watches_store_changes(&self) -> bool {
        self.pending.is_none() && matches!(self.phase, Phase::Leading { .. })
    }

    /// The tenure held now, with whether it has begun leading: for the
    /// model checker's invariants.
    #[cfg(test)]
    pub(crate) fn tenure_valid_until(&self) -> Option<(u64, Instant, Instant)> {
        match &self.phase {
            Phase::Leading { term, .. } => Some((
                term.lease.fencing_token,
                term.leads_from,
                term.last_send + self.cfg.validity(),
            )),
            Phase::Stopping { term, valid_until } => {
                Some((term.lease.fencing_token, term.leads_from, *valid_until))
            }
            _ => None,
        }
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
                let wake = (*next_renew).min(stop_at);
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
        }
        if let Some(target) = self.hints.take_retarget() {
            self.out.push_back(Action::Watch(target));
        }
        self.state.heartbeat = now;
        let until = self.hints.quiet_at(self.cfg.hint_quiet());
        if matches!(self.phase, Phase::Following { .. }) && self.pending.is_none() {
            self.state.hints_until = until;
        }
        if self.phase == Phase::Exited {
            self.state.role = Role::Follower;
            self.state.tenure = None;
            self.state.finished = true;
        }
    }

    // ---- follower ------------------------------------------------------

    /// The follower's wake between rounds: at `poll_at`, or, while the
    /// leader's hints flow, at the next read they cannot spare.
    fn follower_wake(&self, poll_at: Instant) -> Instant {
        let quiet = self.cfg.hint_quiet();
        let wake = if self.hints.flowing(self.now, quiet) && !self.hints.doubted() {
            // Past the due, the read waits for the next renewal the stream
            // tells of (so that it finds a fresh rvn, timed from its hint),
            // a slack at most.
            let due_read = self.unread_due().map(|d| d + self.cfg.due_read_slack());
            let confirm = self.last_read + self.cfg.hint_confirm_interval();
            [due_read, self.hints.quiet_at(quiet), Some(confirm)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(poll_at)
        } else {
            poll_at
        };
        self.hints.deferred_read().map_or(wake, |d| d.min(wake))
    }

    /// The end of the takeover wait of the rvn the store showed last, if no
    /// read happened since it passed: hints never move it (only a read
    /// does), so whatever a stream says, a lease left unchanged is read
    /// again then, and taken.
    fn unread_due(&self) -> Option<Instant> {
        self.takeover.due().filter(|d| self.last_read < *d)
    }

    /// Start a round: read the record.
    fn start_round(&mut self) {
        self.last_read_sent = self.now;
        self.pending = Some(Pending::Round);
        self.phase = Phase::Following { poll_at: self.now };
        self.out.push_back(Action::Read {
            budget: self.cfg.renew_interval,
            confirming: false,
        });
    }

    /// A round ended: wait as it says.
    fn end_round(&mut self, round: Round, tick: &Tick) {
        let poll_at = match round {
            Round::Lost => {
                self.backoff = Backoff::default();
                self.now
            }
            // An error, not an answer: never retried in a loop.
            Round::Failed => {
                self.now
                    + self
                        .backoff
                        .next_pause(self.cfg.retry_interval, tick.jitter)
            }
            Round::Wait(until) => {
                self.backoff = Backoff::default();
                until
            }
        };
        self.state.rounds += 1;
        self.phase = Phase::Following { poll_at };
    }

    fn on_timeout(&mut self, tick: &Tick) {
        let now = self.now;
        match self.phase.clone() {
            Phase::Delayed { until } if now >= until => self.start_round(),
            Phase::Following { poll_at } if now >= self.follower_wake(poll_at) => {
                self.hints.waking(now);
                self.start_round();
            }
            Phase::Leading { .. } => self.leading_tick(tick),
            Phase::Stopping { term, valid_until } if now >= valid_until => {
                self.state.role = Role::Follower;
                self.state.tenure = None;
                self.note(Note::TenureEnded(term.lease.fencing_token));
                self.start_round();
            }
            Phase::SittingOut { until } if now >= until => self.start_round(),
            _ => {}
        }
    }

    fn on_read(&mut self, tick: &Tick, res: Result<Record, StoreError>) {
        match self.pending.take() {
            Some(Pending::Round) => {
                self.last_read = self.now;
                let round = match res {
                    Err(error) => {
                        self.store_error("read", error);
                        Some(Round::Failed)
                    }
                    Ok(record) => self.consider(record, tick),
                };
                if let Some(round) = round {
                    self.end_round(round, tick);
                }
            }
            Some(Pending::RenewConflict) => self.renew_conflict(res.ok()),
            Some(Pending::ReleaseConflict {
                term,
                successor,
                then,
            }) => self.release_conflict(tick, *term, res.ok(), successor, then),
            other => self.pending = other,
        }
    }

    /// One round after a successful read: take the lease if it is free (a
    /// write goes out: `None`), or say when to look again.
    fn consider(&mut self, record: Record, tick: &Tick) -> Option<Round> {
        let at = self.now;
        let poll = at + self.cfg.retry_interval;
        match record {
            Record::Absent => {
                self.observed_ok(tick, None, None, None);
                self.takeover.forget();
                self.hints.stop();
                if !self.may_campaign {
                    return Some(Round::Wait(poll));
                }
                let token = self.next_token(None, tick);
                let lease = self.new_lease(token, tick);
                self.acquire(WriteOp::Create, lease, Condition::NotExists);
                None
            }
            Record::Valid(current) => self.consider_valid(current, tick),
            Record::Malformed(m) => self.consider_malformed(m, tick),
        }
    }

    fn consider_valid(&mut self, current: Lease, tick: &Tick) -> Option<Round> {
        let at = self.now;
        let poll = at + self.cfg.retry_interval;
        self.note_token(current.fencing_token);
        self.observed_ok(
            tick,
            current.holder.clone(),
            Some(current.fencing_token),
            None,
        );
        let me = self.cfg.identity.clone();
        // Before the stream is judged: a stream found lying is dropped
        // with what it named, but an rvn cannot be named before it was
        // written, whoever named it.
        let learned = self.hints.learned_at(&current.rvn);
        let sent = self.last_read_sent;
        if self
            .hints
            .after_read(&current, &me, sent, at, self.cfg.hint_quiet())
        {
            self.note(Note::StreamDistrusted {
                holder: current.holder.clone(),
                address: current.holder_meta.as_ref().and_then(|m| m.address.clone()),
            });
        }
        let ours =
            current.holder.as_deref() == Some(me.as_str()) && self.own_rvns.contains(&current.rvn);
        let lease_ms = self.timing_lease_ms(&current);
        let expired = self.takeover.observe(&current.rvn, lease_ms, at, learned) <= at;
        // Released to anyone or to us; a lease handed to someone else
        // waits like a held one.
        let free = self.free_for_me(&current) || ours || expired;
        if free && !self.may_campaign {
            return Some(Round::Wait(poll));
        }
        if free {
            let token = self.next_token(Some(current.fencing_token), tick);
            let lease = self.new_lease(token, tick);
            self.acquire(WriteOp::TakeOver, lease, Condition::RvnIs(current.rvn));
            return None;
        }
        Some(match self.takeover.due() {
            // Wake exactly when the takeover becomes allowed.
            Some(due) => Round::Wait(poll.min(due.max(at))),
            None => Round::Wait(poll),
        })
    }

    /// The lease a record is timed with: the one it promises.
    fn timing_lease_ms(&self, current: &Lease) -> u64 {
        #[cfg(test)]
        if self.mutations.hint_lease_ms_used
            && let Some(ms) = self.hints.hinted_lease_ms(&current.rvn)
        {
            return ms;
        }
        current.lease_ms
    }

    /// Whether the record is released to anyone or to us.
    fn free_for_me(&self, current: &Lease) -> bool {
        #[cfg(test)]
        if self.mutations.successor_ignored {
            return current.holder.is_none();
        }
        current.free_for(&self.cfg.identity)
    }

    fn consider_malformed(&mut self, m: Malformed, tick: &Tick) -> Option<Round> {
        let at = self.now;
        self.hints.stop();
        if self.warned_malformed.as_deref() != Some(m.fingerprint.as_str()) {
            self.note(Note::Malformed(m.problem.clone()));
            self.warned_malformed = Some(m.fingerprint.clone());
        }
        if let Some(t) = m.fencing_token {
            self.note_token(t);
        }
        self.observed_ok(tick, None, m.fencing_token, Some(m.problem.clone()));
        let key = format!("malformed:{}", m.fingerprint);
        let lease_ms = u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let expired = self.takeover.observe(&key, lease_ms, at, None) <= at;
        if !expired || !self.may_campaign {
            return Some(Round::Wait(at + self.cfg.retry_interval));
        }
        // Treat an unreadable token as absent: unix ms keeps the new token
        // above any sane earlier one.
        let token = self
            .next_token(None, tick)
            .max(m.fencing_token.map_or(0, |t| t + 1));
        let lease = self.new_lease(token, tick);
        self.note(Note::OverwritingMalformed);
        self.acquire(WriteOp::TakeOver, lease, Condition::Unchanged(m.guard));
        None
    }

    /// Try to start a tenure with `lease` under `condition`.
    fn acquire(&mut self, op: WriteOp, lease: Lease, condition: Condition) {
        self.remember_own(&lease.rvn);
        self.pending = Some(Pending::Acquire {
            op,
            lease: lease.clone(),
            sent: self.now,
        });
        self.out.push_back(Action::Write {
            op,
            lease,
            condition,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    fn acquired(
        &mut self,
        tick: &Tick,
        op: WriteOp,
        lease: Lease,
        sent: Instant,
        res: Result<WriteOutcome, StoreError>,
    ) {
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Ok(true),
                });
                self.note_token(lease.fencing_token);
                self.takeover.forget();
                self.tenure_seq += 1;
                let since = self.validity_origin(sent);
                let leads_from = if op == WriteOp::Create && self.cfg.strict_new_lease {
                    since + self.cfg.takeover_wait(lease.lease_ms)
                } else {
                    since
                };
                let term = Term {
                    since,
                    leads_from,
                    last_send: since,
                    seq: self.tenure_seq,
                    lease,
                };
                self.enter_lead(term, tick);
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Ok(false),
                });
                self.takeover.forget();
                self.end_round(Round::Lost, tick);
            }
            Err(error) => {
                self.note(Note::Acquire {
                    op,
                    outcome: Err(error.clone()),
                });
                self.store_error(op.label(), error);
                self.end_round(Round::Failed, tick);
            }
        }
    }

    /// The instant a write's validity counts from: its send.
    fn validity_origin(&self, sent: Instant) -> Instant {
        #[cfg(test)]
        if self.mutations.validity_from_reply {
            return self.now;
        }
        sent
    }

    fn on_hint(&mut self, #[allow(unused)] tick: &Tick, hint: Hint) {
        let Phase::Following { poll_at } = self.phase else {
            return;
        };
        #[cfg(test)]
        if self.mutations.released_hint_trusted
            && let Hint::Event {
                event: LeaseEvent::Released { rvn, .. },
                ..
            } = &hint
            && self.may_campaign
        {
            let token = self.next_token(self.last_token, tick);
            let lease = self.new_lease(token, tick);
            self.acquire(WriteOp::TakeOver, lease, Condition::RvnIs(rvn.clone()));
            return;
        }
        #[cfg(test)]
        if let Hint::Event {
            event: LeaseEvent::Renewed { rvn, lease_ms, .. },
            ..
        } = &hint
        {
            self.hints.remember_lease_ms(rvn, *lease_ms);
        }
        let due = self.unread_due();
        let now = self.now;
        match self.hints.take(hint, now, self.cfg.retry_interval) {
            AfterHint::ReadNow => self.start_round(),
            AfterHint::Renewed if due.is_some_and(|d| now >= d) => self.start_round(),
            AfterHint::Renewed | AfterHint::Wait => {
                self.phase = Phase::Following { poll_at };
            }
        }
    }

    fn on_gate(&mut self, _tick: &Tick, pass: bool) {
        let opened = pass && !self.may_campaign;
        self.may_campaign = pass;
        // May campaign again: look at the record now.
        if opened
            && self.pending.is_none()
            && matches!(self.phase, Phase::Delayed { .. } | Phase::Following { .. })
        {
            self.start_round();
        }
    }

    // ---- leader --------------------------------------------------------

    fn stop_at(&self, term: &Term) -> Instant {
        (term.last_send + self.cfg.validity()).saturating_sub(self.cfg.kill_grace)
    }

    /// When to renew after a write sent at `send`: R later, rounded down to
    /// a grid of R/20 shared by every election of this process. Only the
    /// first renewal of a tenure moves (earlier, by less than R/20, which
    /// is always safe); the later ones are R apart on the grid. Elections
    /// whose renewals fall in the same tick are renewed in one wake-up, and
    /// their requests and answers are handled in batches (see
    /// docs/benchmarks.md for what other grids cost).
    fn renew_due(&self, send: Instant) -> Instant {
        (send + self.cfg.renew_interval).floor_to(self.cfg.renew_interval / 20)
    }

    fn enter_lead(&mut self, term: Term, tick: &Tick) {
        self.hints.stop();
        let role = if self.now < term.leads_from {
            Role::Confirming
        } else {
            Role::Leader
        };
        self.publish_term(&term, role, tick);
        if role == Role::Leader {
            self.note(Note::Gained(term.lease.fencing_token));
        }
        // Replacements noticed before this tenure's first write are old
        // news: that write went to what the store names now.
        self.out.push_back(Action::ForgetStoreChanges);
        let next_renew = self.renew_due(term.last_send);
        self.phase = Phase::Leading {
            term,
            role,
            next_renew,
        };
    }

    fn tenure_of(term: &Term, valid_until: Instant, stop_at: Instant) -> Tenure {
        Tenure {
            fencing_token: term.lease.fencing_token,
            since_unix_ms: term.lease.acquired_at_ms,
            since: term.since,
            valid_until,
            stop_at,
            seq: term.seq,
            lease_ms: term.lease.lease_ms,
        }
    }

    fn publish_term(&mut self, term: &Term, role: Role, tick: &Tick) {
        let valid_until = term.last_send + self.cfg.validity();
        let tenure = Self::tenure_of(term, valid_until, self.stop_at(term));
        let me = self.cfg.identity.clone();
        // Followers hear of the write only after it succeeded.
        self.out.push_back(Action::Tell(LeaseEvent::Renewed {
            election: self.cfg.name.clone(),
            holder: me.clone(),
            rvn: term.lease.rvn.clone(),
            fencing_token: term.lease.fencing_token,
            lease_ms: term.lease.lease_ms,
        }));
        let s = &mut self.state;
        s.role = role;
        s.tenure = Some(tenure);
        s.leader = Some(me);
        s.fencing_token = Some(term.lease.fencing_token);
        s.observed_at = Some(self.now);
        s.observed_at_unix_ms = Some(tick.stamp.unix_ms);
        s.last_error = None;
        s.malformed = None;
        s.first_observation_done = true;
        // Holding a tenure, it watches nobody: a stream it heard as a
        // follower must not count once it follows again (after a resign's
        // sit-out) until it hears one anew.
        s.hints_until = None;
    }

    /// While leading, at any input: begin leading once confirmed, stop
    /// when no renew succeeded by validity − G, renew when due.
    fn leading_tick(&mut self, tick: &Tick) {
        let Phase::Leading {
            term,
            mut role,
            next_renew,
        } = self.phase.clone()
        else {
            return;
        };
        let now = self.now;
        if role == Role::Confirming && now >= term.leads_from {
            role = Role::Leader;
            self.publish_term(&term, role, tick);
            self.note(Note::Gained(term.lease.fencing_token));
            self.phase = Phase::Leading {
                term: term.clone(),
                role,
                next_renew,
            };
        }
        let stop_at = self.stop_at(&term);
        let valid_until = term.last_send + self.cfg.validity();
        if now >= stop_at {
            self.note(Note::LeaseLost {
                fencing_token: term.lease.fencing_token,
                written_by: None,
            });
            self.enter_stopping(term, valid_until);
            return;
        }
        if now < next_renew {
            return;
        }
        // Renew. The request may not outlive the stop time: past it the
        // answer no longer matters to this tenure.
        let renewed = term.lease.renewed_with(&tick.stamp);
        let condition = Condition::HeldBy {
            rvn: term.lease.rvn.clone(),
            holder: self.cfg.identity.clone(),
        };
        self.remember_own(&renewed.rvn);
        self.pending = Some(Pending::Renew {
            renewed: renewed.clone(),
            sent: now,
        });
        self.out.push_back(Action::Write {
            op: WriteOp::Renew,
            lease: renewed,
            condition,
            budget: self.cfg.renew_interval.min(stop_at - now),
            deadline: Some(stop_at),
        });
    }

    fn renewed(
        &mut self,
        tick: &Tick,
        renewed: Lease,
        sent: Instant,
        res: Result<WriteOutcome, StoreError>,
    ) {
        let Phase::Leading { mut term, role, .. } = self.phase.clone() else {
            return;
        };
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Renew(Ok(true)));
                term.lease = renewed;
                term.last_send = self.validity_origin(sent);
                let next_renew = self.renew_due(sent);
                self.publish_term(&term, role, tick);
                self.note(Note::Renewed(term.lease.fencing_token));
                self.phase = Phase::Leading {
                    term,
                    role,
                    next_renew,
                };
            }
            Ok(WriteOutcome::ConditionFailed { current }) => {
                #[cfg(test)]
                if self.mutations.renew_ignores_rvn
                    && let Some(Record::Valid(l)) = &current
                {
                    // The defect: write again over whatever is there.
                    term.lease.rvn = l.rvn.clone();
                    self.phase = Phase::Leading {
                        term,
                        role,
                        next_renew: self.now,
                    };
                    return;
                }
                match current {
                    Some(record) => self.renew_conflict(Some(record)),
                    None => {
                        // An earlier renew whose answer was lost may have
                        // applied: read back to know.
                        let stop_at = self.stop_at(&term);
                        self.pending = Some(Pending::RenewConflict);
                        self.out.push_back(Action::Read {
                            budget: self.cfg.renew_interval.min(stop_at - self.now),
                            confirming: true,
                        });
                    }
                }
            }
            Err(error) => {
                self.note(Note::Renew(Err(error.clone())));
                self.store_error("renew", error);
                self.phase = Phase::Leading {
                    term,
                    role,
                    next_renew: self.now + self.cfg.retry_interval,
                };
            }
        }
    }

    /// A renew failed its condition and `current` is the record after it
    /// (`None`: unknown). If it is still ours (a renew whose answer was
    /// lost applied after all), carry on from it and renew again at once;
    /// validity still counts from the last write known to have succeeded.
    /// Else the lease is lost.
    fn renew_conflict(&mut self, current: Option<Record>) {
        let Phase::Leading { mut term, role, .. } = self.phase.clone() else {
            return;
        };
        if let Some(rvn) = self.still_ours(current.as_ref(), &term) {
            self.note(Note::AdoptedEarlierWrite);
            term.lease.rvn = rvn;
            self.phase = Phase::Leading {
                term,
                role,
                next_renew: self.now,
            };
            return;
        }
        self.note(Note::Renew(Ok(false)));
        let written_by = match &current {
            Some(Record::Valid(l)) => l.holder.clone().unwrap_or_else(|| "(released)".into()),
            Some(Record::Absent) => "(item deleted)".into(),
            Some(Record::Malformed(m)) => format!("(malformed: {})", m.problem),
            None => "(unknown)".into(),
        };
        self.note(Note::LeaseLost {
            fencing_token: term.lease.fencing_token,
            written_by: Some(written_by),
        });
        self.takeover.forget();
        let valid_until = term.last_send + self.cfg.validity();
        let kill_at = (self.now + self.cfg.kill_grace).min(valid_until);
        self.enter_stopping(term, kill_at);
    }

    /// The rvn to continue from when `current` is still `term`'s: our
    /// identity, its token, an rvn we wrote.
    fn still_ours(&self, current: Option<&Record>, term: &Term) -> Option<String> {
        match current {
            Some(Record::Valid(l))
                if l.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && l.fencing_token == term.lease.fencing_token
                    && self.own_rvns.contains(&l.rvn) =>
            {
                Some(l.rvn.clone())
            }
            _ => None,
        }
    }

    fn on_store_replaced(&mut self) {
        if let Phase::Leading {
            term,
            role,
            next_renew: _,
        } = self.phase.clone()
        {
            self.note(Note::RenewingAfterReplacement(term.lease.fencing_token));
            self.phase = Phase::Leading {
                term,
                role,
                next_renew: self.now,
            };
        }
    }

    fn enter_stopping(&mut self, term: Term, kill_at: Instant) {
        // Stop now; the job must be dead by `kill_at`, never after validity.
        let valid_until = kill_at.min(term.last_send + self.cfg.validity());
        let tenure = Self::tenure_of(&term, valid_until, self.now.min(valid_until));
        let was_leader = self.state.role == Role::Leader;
        self.state.role = Role::Stopping;
        self.state.tenure = Some(tenure);
        if was_leader {
            self.note(Note::Lost);
        }
        self.tell_not_leader();
        self.phase = Phase::Stopping { term, valid_until };
    }

    fn tell_not_leader(&mut self) {
        self.out.push_back(Action::Tell(LeaseEvent::NotLeader {
            election: self.cfg.name.clone(),
        }));
    }

    // ---- commands and release -----------------------------------------

    fn on_release(&mut self, tick: &Tick, then: AfterRelease, successor: Option<String>) {
        match self.phase.clone() {
            Phase::Leading { term, role, .. } => self.release(tick, term, role, successor, then),
            Phase::Stopping { term, .. } => {
                // The caller stopped the job; the record may still be ours,
                // so release it if we can.
                self.release(tick, term, Role::Stopping, successor, then);
            }
            // Not leading: nothing to release, and a step-down (resign)
            // changes nothing either; only an exit ends the election.
            _ => {
                self.out.push_back(Action::Answer(false));
                if then == AfterRelease::Exit {
                    self.phase = Phase::Exited;
                }
            }
        }
    }

    fn on_orphaned(&mut self, tick: &Tick) {
        match self.phase.clone() {
            Phase::Leading { term, role, .. } => {
                self.release(tick, term, role, None, AfterRelease::Exit)
            }
            _ => self.phase = Phase::Exited,
        }
    }

    fn release(
        &mut self,
        tick: &Tick,
        term: Term,
        role: Role,
        successor: Option<String>,
        then: AfterRelease,
    ) {
        let lease = term.lease.handed_to_with(successor.clone(), &tick.stamp);
        let condition = Condition::HeldBy {
            rvn: term.lease.rvn.clone(),
            holder: self.cfg.identity.clone(),
        };
        // Not leading from here on, whatever the store answers.
        self.state.role = Role::Follower;
        self.state.tenure = None;
        self.state.leader = None;
        if role == Role::Leader {
            self.note(Note::Lost);
        }
        self.pending = Some(Pending::Release {
            term: Box::new(term),
            lease: lease.clone(),
            successor,
            then,
            again: false,
        });
        self.out.push_back(Action::Write {
            op: WriteOp::Release,
            lease,
            condition,
            budget: self.cfg.renew_interval,
            deadline: None,
        });
    }

    fn on_written(&mut self, tick: &Tick, res: Result<WriteOutcome, StoreError>) {
        match self.pending.take() {
            Some(Pending::Acquire { op, lease, sent }) => self.acquired(tick, op, lease, sent, res),
            Some(Pending::Renew { renewed, sent }) => self.renewed(tick, renewed, sent, res),
            Some(Pending::Release {
                term,
                lease,
                successor,
                then,
                again,
            }) => match res {
                Ok(WriteOutcome::ConditionFailed { current }) if !again => match current {
                    Some(record) => {
                        self.release_conflict(tick, *term, Some(record), successor, then)
                    }
                    None => {
                        self.pending = Some(Pending::ReleaseConflict {
                            term,
                            successor,
                            then,
                        });
                        self.out.push_back(Action::Read {
                            budget: self.cfg.renew_interval,
                            confirming: true,
                        });
                    }
                },
                res => self.released(res, &term, &lease, successor, then),
            },
            other => self.pending = other,
        }
    }

    /// A release failed its condition; `current` is the record after it.
    /// A renew whose answer was lost may have applied after all: the record
    /// then carries an rvn we wrote. Release that one instead.
    fn release_conflict(
        &mut self,
        tick: &Tick,
        term: Term,
        current: Option<Record>,
        successor: Option<String>,
        then: AfterRelease,
    ) {
        match self.still_ours(current.as_ref(), &term) {
            Some(rvn) => {
                let lease = term.lease.handed_to_with(successor.clone(), &tick.stamp);
                let condition = Condition::HeldBy {
                    rvn,
                    holder: self.cfg.identity.clone(),
                };
                self.pending = Some(Pending::Release {
                    term: Box::new(term),
                    lease: lease.clone(),
                    successor,
                    then,
                    again: true,
                });
                self.out.push_back(Action::Write {
                    op: WriteOp::Release,
                    lease,
                    condition,
                    budget: self.cfg.renew_interval,
                    deadline: None,
                });
            }
            None => self.released(
                Ok(WriteOutcome::ConditionFailed { current: None }),
                &term,
                &term.lease,
                successor,
                then,
            ),
        }
    }

    /// The release's last write ended with `res` (`lease`: what it wrote).
    fn released(
        &mut self,
        res: Result<WriteOutcome, StoreError>,
        term: &Term,
        lease: &Lease,
        successor: Option<String>,
        then: AfterRelease,
    ) {
        let token = term.lease.fencing_token;
        match res {
            Ok(WriteOutcome::Applied) => {
                self.note(Note::Released {
                    fencing_token: token,
                    successor: successor.clone(),
                });
                // Only now: a follower that acts on it finds it released.
                self.out.push_back(Action::Tell(LeaseEvent::Released {
                    election: self.cfg.name.clone(),
                    rvn: lease.rvn.clone(),
                    fencing_token: token,
                    successor,
                }));
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                self.note(Note::NothingToRelease(token));
                self.tell_not_leader();
            }
            Err(error) => {
                self.note(Note::ReleaseFailed(error));
                self.tell_not_leader();
            }
        }
        self.own_rvns.clear();
        self.takeover.forget();
        self.out.push_back(Action::Answer(true));
        match then {
            AfterRelease::Exit => self.phase = Phase::Exited,
            AfterRelease::SitOut(d) => {
                self.takeover.forget();
                self.note(Note::SittingOut(d));
                self.phase = Phase::SittingOut {
                    until: self.now + d,
                };
            }
            AfterRelease::Follow => self.start_round(),
        }
    }

    // ---- bookkeeping ---------------------------------------------------

    fn note(&mut self, note: Note) {
        self.out.push_back(Action::Note(note));
    }

    fn store_error(&mut self, op: &'static str, error: StoreError) {
        self.state.last_error = Some(error.metric_label().to_owned());
        self.note(Note::StoreError { op, error });
    }

    fn observed_ok(
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
    }

    fn remember_own(&mut self, rvn: &str) {
        self.own_rvns.push(rvn.to_owned());
        if self.own_rvns.len() > 4 {
            self.own_rvns.remove(0);
        }
    }

    fn note_token(&mut self, token: u64) {
        self.last_token = Some(self.last_token.map_or(token, |t| t.max(token)));
    }

    /// The token for a new tenure: above every token seen, and when there
    /// is no previous item, at least the unix ms so it also exceeds tokens
    /// of items deleted before this process started.
    fn next_token(&self, previous: Option<u64>, tick: &Tick) -> u64 {
        let floor = self.last_token.map_or(0, |t| t + 1);
        match previous {
            Some(p) => (p + 1).max(floor),
            None => tick.stamp.unix_ms.max(floor),
        }
    }

    fn new_lease(&self, token: u64, tick: &Tick) -> Lease {
        Lease::stamped_with(
            &self.cfg.name,
            &self.cfg.identity,
            token,
            u64::try_from(self.cfg.lease_duration.as_millis()).unwrap_or(u64::MAX),
            tick.stamp.unix_ms,
            self.cfg.holder_meta.clone(),
            &tick.stamp,
        )
    }
}
