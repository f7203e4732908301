//! What to do with the job now, given the primary election's state, where
//! the job is, and whether the daemon shuts down: the rules the daemon
//! applies before it waits for each next event.
//!
//! [`Policy::decide`] is pure: it takes what the daemon sees ([`Seen`]) and
//! returns [`Action`]s, which the daemon carries out (`supervise.rs`); so
//! every rule is tested below with no process, no store and no clock.
//!
//! - Shutting down: once the child is gone the daemon ends with the job's
//!   exit code. Until then the lease rules still apply (in mode
//!   `while-leader` the guard's deadline follows the renewals and a lost
//!   lease stops the child), nothing new starts, and the child is killed
//!   once `shutdown_grace` has passed.
//! - `--acquire-timeout`: the daemon ends when no lease was held in time
//!   (`0`: after one campaign round). Once a lease was held it no longer
//!   applies.
//! - Without a command there is no job: nothing more to do.
//! - Mode `while-leader`: start when leading (not while a step-down waits
//!   for the child, nor while the app check fails); while leading under the
//!   child's tenure, move the guard's deadline with every renewal; once not
//!   (the lease was lost, or a new tenure began unnoticed), stop it, within
//!   what is left of the validity when the engine is stopping, else
//!   `kill_grace`; a restart whose lease is gone is dropped.
//! - Mode `always`: start once the first campaign round settled whether we
//!   lead (the child learns its initial role from `LEADERD_IS_LEADER`, and
//!   is signalled only of later changes: a signal racing its start could
//!   kill it before it installs its handler); start again when a restart is
//!   due; signal each gain and loss once (`signal_on_gain`,
//!   `signal_on_loss`).

use std::time::Duration;

use nix::sys::signal::Signal;

use super::child::JobView;
use crate::clock::Instant;
use crate::config::{ChildConfig, Mode};
use crate::election::{ElectionState, Role, Tenure};

/// What the daemon sees when it reconciles.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen<'a> {
    /// The clock's reading.
    pub(super) now: Instant,
    /// The primary election's state.
    pub(super) state: &'a ElectionState,
    /// Where the job is.
    pub(super) job: JobView,
    /// The daemon is shutting down.
    pub(super) shutting_down: bool,
    /// Shutting down, `shutdown_grace` has passed, and the child was not
    /// killed yet.
    pub(super) kill_due: bool,
    /// A planned step-down (resign, failing app check) waits for the child
    /// to exit before it releases the lease.
    pub(super) stepping_down: bool,
    /// The app check passes, or there is none.
    pub(super) app_ok: bool,
}

/// One thing for the daemon to do, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// The shutdown is complete, the child gone: end with the job's exit
    /// code.
    Finish,
    /// `--acquire-timeout` passed without a lease: end with
    /// `exit::TEMPFAIL`.
    GiveUpAcquiring,
    /// `shutdown_grace` passed and the child still runs: kill its process
    /// group.
    KillForShutdown,
    /// Still leading under the child's tenure: move the guard's deadlines
    /// to the tenure's.
    Arm {
        /// When the stop signal is due unless renewed.
        stop_at: Instant,
        /// When the child must be dead.
        valid_until: Instant,
    },
    /// Not leading under the child's tenure any more: stop it, killing its
    /// process group after `grace`.
    Stop {
        /// How long it may take.
        grace: Duration,
    },
    /// Start the child, under `tenure` (none in mode `always`).
    Start(Option<Tenure>),
    /// Drop the scheduled restart: the lease it was for is gone.
    CancelRestart,
    /// Tell the child of a leadership change.
    Signal {
        /// The configured signal.
        signal: Signal,
        /// `gain` or `loss`, for the log.
        transition: &'static str,
    },
}

/// The reconcile rules, with the settings they follow and what they
/// remember from one event to the next.
#[derive(Debug)]
pub(super) struct Policy {
    mode: Mode,
    /// A command is configured: without one there is no job.
    has_command: bool,
    /// `--acquire-timeout`.
    acquire_timeout: Option<Duration>,
    /// When `--acquire-timeout` runs out.
    acquire_by: Option<Instant>,
    kill_grace: Duration,
    signal_on_gain: Option<Signal>,
    signal_on_loss: Option<Signal>,
    /// Once a lease was held, `--acquire-timeout` no longer applies.
    acquired_once: bool,
    /// Mode `always`: the child was started once (restarts go via the
    /// job's back-off).
    always_started: bool,
    /// Mode `always`: the tenure last seen leading, to signal gains and
    /// losses once.
    seen_seq: Option<u64>,
}

impl Policy {
    /// The rules for `child`, with `--acquire-timeout` counted from
    /// `started`.
    pub(super) fn new(
        child: &ChildConfig,
        acquire_timeout: Option<Duration>,
        started: Instant,
    ) -> Policy {
        Policy {
            mode: child.mode,
            has_command: !child.command.is_empty(),
            acquire_timeout,
            acquire_by: acquire_timeout.map(|t| started + t),
            kill_grace: child.kill_grace,
            signal_on_gain: child.signal_on_gain,
            signal_on_loss: child.signal_on_loss,
            acquired_once: false,
            always_started: false,
            seen_seq: None,
        }
    }

    /// When `--acquire-timeout` runs out, while it still applies.
    pub(super) fn acquire_deadline(&self) -> Option<Instant> {
        self.acquire_by.filter(|_| !self.acquired_once)
    }

    /// What to do now, in order.
    pub(super) fn decide(&mut self, seen: &Seen<'_>) -> Vec<Action> {
        if seen.shutting_down {
            return self.winding_down(seen);
        }
        if seen.state.tenure.is_some() {
            self.acquired_once = true;
        }
        if self.acquire_timed_out(seen) {
            return vec![Action::GiveUpAcquiring];
        }
        if !self.has_command {
            return Vec::new();
        }
        match self.mode {
            Mode::Always => self.always(seen),
            Mode::WhileLeader => self.while_leader(seen, true).into_iter().collect(),
        }
    }

    /// Shutting down: done once the child is gone; until then it may be
    /// killed, and in mode `while-leader` the lease still governs it.
    fn winding_down(&self, seen: &Seen<'_>) -> Vec<Action> {
        if !matches!(seen.job, JobView::Running { .. }) {
            return vec![Action::Finish];
        }
        let mut actions = Vec::new();
        if seen.kill_due {
            actions.push(Action::KillForShutdown);
        }
        if self.mode == Mode::WhileLeader {
            // Starts nothing, so it never asks to end.
            actions.extend(self.while_leader(seen, false));
        }
        actions
    }

    /// `--acquire-timeout` (0: one attempt) passed while not leading and
    /// before any lease was held.
    fn acquire_timed_out(&self, seen: &Seen<'_>) -> bool {
        let Some(by) = self.acquire_by else {
            return false;
        };
        if self.acquired_once || seen.state.is_leader_at(seen.now) {
            return false;
        }
        let tried_once = seen.state.rounds >= 1;
        let zero = self.acquire_timeout == Some(Duration::ZERO);
        (zero && tried_once) || (!zero && seen.now >= by)
    }

    /// Mode `always`: start once, restart when due, signal transitions.
    fn always(&mut self, seen: &Seen<'_>) -> Vec<Action> {
        let state = seen.state;
        let seq = state
            .tenure
            .as_ref()
            .filter(|_| state.is_leader_at(seen.now))
            .map(|t| t.seq);
        let due = match seen.job {
            JobView::Idle => !self.always_started && (state.rounds >= 1 || seq.is_some()),
            JobView::Backoff { over } => over,
            JobView::Running { .. } => false,
        };
        if due {
            self.always_started = true;
            self.seen_seq = seq;
            return vec![Action::Start(None)];
        }
        if seq == self.seen_seq {
            return Vec::new();
        }
        let lost = self.seen_seq.is_some();
        let gained = seq.is_some();
        self.seen_seq = seq;
        if !matches!(seen.job, JobView::Running { .. }) {
            return Vec::new();
        }
        let signals = [
            (lost, self.signal_on_loss, "loss"),
            (gained, self.signal_on_gain, "gain"),
        ];
        signals
            .into_iter()
            .filter_map(|(happened, signal, transition)| {
                signal
                    .filter(|_| happened)
                    .map(|signal| Action::Signal { signal, transition })
            })
            .collect()
    }

    /// Mode `while-leader`. `may_start`: false while shutting down (never
    /// start a new child then).
    fn while_leader(&self, seen: &Seen<'_>, may_start: bool) -> Option<Action> {
        let state = seen.state;
        let leading = state.is_leader_at(seen.now);
        let start = || {
            let t = state.tenure.clone().expect("leading implies a tenure");
            Action::Start(Some(t))
        };
        match seen.job {
            JobView::Running { seq, stopping } => {
                let same_tenure = state.tenure.as_ref().map(|t| t.seq) == seq;
                // The guard's deadline follows every renewal, also while a
                // planned step-down (resign, a failing app check) stops the
                // job: the lease is still ours, so the job may take its
                // shutdown_grace. The stop's own grace still bounds the
                // kill (re-arming never moves a stop's kill later).
                if leading && same_tenure {
                    let t = state.tenure.as_ref().expect("leading implies a tenure");
                    Some(Action::Arm {
                        stop_at: t.stop_at,
                        valid_until: t.valid_until,
                    })
                } else if !stopping {
                    // Lost the lease (or a new tenure began without us
                    // noticing the end of the old one): stop now; the guard
                    // kills the group at the end of the old validity at the
                    // latest.
                    let grace = match &state.tenure {
                        Some(t) if state.role == Role::Stopping => t.valid_until - seen.now,
                        _ => self.kill_grace,
                    };
                    Some(Action::Stop { grace })
                } else {
                    None
                }
            }
            JobView::Idle => {
                (leading && may_start && !seen.stepping_down && seen.app_ok).then(start)
            }
            JobView::Backoff { over } => {
                if !leading {
                    Some(Action::CancelRestart)
                } else if may_start && over {
                    Some(start())
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OnChildExit;

    const KILL_GRACE: Duration = Duration::from_secs(3);

    fn child(mode: Mode) -> ChildConfig {
        ChildConfig {
            command: vec!["./job.sh".into()],
            mode,
            on_child_exit: OnChildExit::Exit,
            stop_signal: Signal::SIGTERM,
            kill_grace: KILL_GRACE,
            shutdown_grace: Duration::from_secs(30),
            signal_on_gain: None,
            signal_on_loss: None,
        }
    }

    fn policy(mode: Mode) -> Policy {
        Policy::new(&child(mode), None, origin())
    }

    fn origin() -> Instant {
        Instant::from_since_origin(Duration::from_secs(100))
    }

    fn at(secs: f64) -> Instant {
        origin() + Duration::from_secs_f64(secs)
    }

    /// A follower after `rounds` campaign rounds.
    fn following(rounds: u64) -> ElectionState {
        ElectionState {
            rounds,
            ..ElectionState::example("report", "me", origin())
        }
    }

    /// Leading under tenure `seq` since the origin: stop at 7.7 s, valid
    /// until 9.7 s.
    fn leading(seq: u64) -> ElectionState {
        in_role(Role::Leader, seq)
    }

    fn in_role(role: Role, seq: u64) -> ElectionState {
        let mut s = following(1).in_tenure(role, seq, origin());
        if let Some(t) = &mut s.tenure {
            t.seq = seq;
        }
        s
    }

    fn seen(now: Instant, state: &ElectionState, job: JobView) -> Seen<'_> {
        Seen {
            now,
            state,
            job,
            shutting_down: false,
            kill_due: false,
            stepping_down: false,
            app_ok: true,
        }
    }

    fn running(seq: Option<u64>) -> JobView {
        JobView::Running {
            seq,
            stopping: false,
        }
    }

    /// The deadlines of `state`'s tenure, armed.
    fn arm(state: &ElectionState) -> Action {
        let t = state.tenure.as_ref().expect("a tenure");
        Action::Arm {
            stop_at: t.stop_at,
            valid_until: t.valid_until,
        }
    }

    const STOPPING: JobView = JobView::Running {
        seq: Some(1),
        stopping: true,
    };

    #[test]
    fn while_leader_starts_under_the_tenure_it_leads() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(1);
        let tenure = state.tenure.clone();
        let actions = p.decide(&seen(at(1.0), &state, JobView::Idle));
        assert_eq!(actions, [Action::Start(tenure)]);
        // Following: nothing to start.
        let state = following(3);
        assert_eq!(p.decide(&seen(at(1.0), &state, JobView::Idle)), []);
        // Past the stop time the engine has not published yet: not leading.
        let state = leading(1);
        assert_eq!(p.decide(&seen(at(7.7), &state, JobView::Idle)), []);
    }

    #[test]
    fn no_start_while_a_step_down_waits_or_the_app_fails() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(1);
        let mut s = seen(at(1.0), &state, JobView::Idle);
        s.stepping_down = true;
        assert_eq!(p.decide(&s), []);
        s.stepping_down = false;
        s.app_ok = false;
        assert_eq!(p.decide(&s), []);
    }

    #[test]
    fn the_deadline_follows_each_renewal_of_the_same_tenure() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(1);
        let actions = p.decide(&seen(at(1.0), &state, running(Some(1))));
        assert_eq!(actions, [arm(&state)]);
        // Also while a planned step-down stops it.
        let actions = p.decide(&seen(at(1.0), &state, STOPPING));
        assert_eq!(actions, [arm(&state)]);
    }

    #[test]
    fn a_lost_lease_stops_the_child_once() {
        let mut p = policy(Mode::WhileLeader);
        // Lost: the engine follows again.
        let state = following(2);
        let actions = p.decide(&seen(at(1.0), &state, running(Some(1))));
        assert_eq!(actions, [Action::Stop { grace: KILL_GRACE }]);
        // Asked before: not again.
        assert_eq!(p.decide(&seen(at(1.0), &state, STOPPING)), []);
        // Past the stop time: the grace is still kill_grace.
        let state = leading(1);
        let actions = p.decide(&seen(at(8.0), &state, running(Some(1))));
        assert_eq!(actions, [Action::Stop { grace: KILL_GRACE }]);
    }

    #[test]
    fn a_stopping_engine_gives_the_child_what_is_left_of_the_validity() {
        let mut p = policy(Mode::WhileLeader);
        let state = in_role(Role::Stopping, 1);
        let actions = p.decide(&seen(at(8.7), &state, running(Some(1))));
        let grace = Duration::from_secs(1);
        assert_eq!(actions, [Action::Stop { grace }]);
    }

    #[test]
    fn a_child_of_an_older_tenure_is_stopped_though_we_lead_again() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(2);
        let actions = p.decide(&seen(at(1.0), &state, running(Some(1))));
        assert_eq!(actions, [Action::Stop { grace: KILL_GRACE }]);
    }

    #[test]
    fn a_restart_waits_for_its_delay_and_is_dropped_with_the_lease() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(1);
        let waiting = JobView::Backoff { over: false };
        assert_eq!(p.decide(&seen(at(1.0), &state, waiting)), []);
        let due = JobView::Backoff { over: true };
        let actions = p.decide(&seen(at(1.0), &state, due));
        assert_eq!(actions, [Action::Start(state.tenure.clone())]);
        let state = following(2);
        let actions = p.decide(&seen(at(1.0), &state, waiting));
        assert_eq!(actions, [Action::CancelRestart]);
    }

    #[test]
    fn without_a_command_nothing_runs() {
        for mode in [Mode::WhileLeader, Mode::Always] {
            let mut config = child(mode);
            config.command.clear();
            let mut p = Policy::new(&config, None, origin());
            let state = leading(1);
            assert_eq!(p.decide(&seen(at(1.0), &state, JobView::Idle)), []);
        }
    }

    #[test]
    fn shutdown_ends_once_the_child_is_gone_and_starts_nothing() {
        for mode in [Mode::WhileLeader, Mode::Always] {
            let mut p = policy(mode);
            let state = leading(1);
            for job in [JobView::Idle, JobView::Backoff { over: true }] {
                let mut s = seen(at(1.0), &state, job);
                s.shutting_down = true;
                assert_eq!(p.decide(&s), [Action::Finish], "{mode:?} {job:?}");
            }
        }
    }

    #[test]
    fn shutdown_kills_after_its_grace_and_the_lease_still_governs_the_child() {
        let mut p = policy(Mode::WhileLeader);
        let state = leading(1);
        let mut s = seen(at(1.0), &state, running(Some(1)));
        s.shutting_down = true;
        assert_eq!(p.decide(&s), [arm(&state)]);
        s.kill_due = true;
        assert_eq!(p.decide(&s), [Action::KillForShutdown, arm(&state)]);
        // The lease lost while winding down: stopped as usual.
        let lost = following(2);
        let mut s = seen(at(1.0), &lost, running(Some(1)));
        s.shutting_down = true;
        assert_eq!(p.decide(&s), [Action::Stop { grace: KILL_GRACE }]);

        // Mode always: only the kill.
        let mut p = policy(Mode::Always);
        let mut s = seen(at(1.0), &state, running(None));
        s.shutting_down = true;
        assert_eq!(p.decide(&s), []);
        s.kill_due = true;
        assert_eq!(p.decide(&s), [Action::KillForShutdown]);
    }

    #[test]
    fn acquire_timeout_ends_the_daemon_unless_a_lease_was_held() {
        let config = child(Mode::WhileLeader);
        let timeout = Some(Duration::from_secs(5));
        let mut p = Policy::new(&config, timeout, origin());
        assert_eq!(p.acquire_deadline(), Some(at(5.0)));
        let state = following(4);
        assert_eq!(p.decide(&seen(at(4.9), &state, JobView::Idle)), []);
        let actions = p.decide(&seen(at(5.0), &state, JobView::Idle));
        assert_eq!(actions, [Action::GiveUpAcquiring]);

        // A lease held once: the timeout no longer applies.
        let mut p = Policy::new(&config, timeout, origin());
        let lead = leading(1);
        p.decide(&seen(at(1.0), &lead, running(Some(1))));
        assert_eq!(p.acquire_deadline(), None);
        assert_eq!(p.decide(&seen(at(9.0), &state, JobView::Idle)), []);
    }

    #[test]
    fn a_zero_acquire_timeout_allows_one_campaign_round() {
        let config = child(Mode::WhileLeader);
        let mut p = Policy::new(&config, Some(Duration::ZERO), origin());
        let first = following(0);
        assert_eq!(p.decide(&seen(at(2.0), &first, JobView::Idle)), []);
        let tried = following(1);
        let actions = p.decide(&seen(at(0.0), &tried, JobView::Idle));
        assert_eq!(actions, [Action::GiveUpAcquiring]);
        // Leading after the one round: no timeout.
        let mut p = Policy::new(&config, Some(Duration::ZERO), origin());
        let lead = leading(1);
        let actions = p.decide(&seen(at(0.0), &lead, JobView::Idle));
        assert_eq!(actions, [Action::Start(lead.tenure.clone())]);
    }

    #[test]
    fn always_starts_once_the_first_round_settled_whether_we_lead() {
        let mut p = policy(Mode::Always);
        let unsettled = following(0);
        assert_eq!(p.decide(&seen(at(0.0), &unsettled, JobView::Idle)), []);
        let settled = following(1);
        let actions = p.decide(&seen(at(0.1), &settled, JobView::Idle));
        assert_eq!(actions, [Action::Start(None)]);
        // Once: an idle job after that waits for a scheduled restart.
        assert_eq!(p.decide(&seen(at(0.2), &settled, JobView::Idle)), []);
        let waiting = JobView::Backoff { over: false };
        assert_eq!(p.decide(&seen(at(0.3), &settled, waiting)), []);
        let due = JobView::Backoff { over: true };
        let actions = p.decide(&seen(at(0.4), &settled, due));
        assert_eq!(actions, [Action::Start(None)]);

        // Leading before the first round ended: started at once.
        let mut p = policy(Mode::Always);
        let lead = in_role(Role::Leader, 1);
        let lead = ElectionState { rounds: 0, ..lead };
        let actions = p.decide(&seen(at(0.0), &lead, JobView::Idle));
        assert_eq!(actions, [Action::Start(None)]);
    }

    #[test]
    fn always_signals_each_gain_and_loss_once() {
        let mut config = child(Mode::Always);
        config.signal_on_gain = Some(Signal::SIGUSR1);
        config.signal_on_loss = Some(Signal::SIGUSR2);
        let mut p = Policy::new(&config, None, origin());
        let follow = following(1);
        let actions = p.decide(&seen(at(0.0), &follow, JobView::Idle));
        assert_eq!(actions, [Action::Start(None)]);
        let child = running(None);
        let gain = || Action::Signal {
            signal: Signal::SIGUSR1,
            transition: "gain",
        };
        let loss = || Action::Signal {
            signal: Signal::SIGUSR2,
            transition: "loss",
        };
        let lead = leading(1);
        assert_eq!(p.decide(&seen(at(1.0), &lead, child)), [gain()]);
        assert_eq!(p.decide(&seen(at(2.0), &lead, child)), []);
        // Past the stop time: lost.
        assert_eq!(p.decide(&seen(at(7.7), &lead, child)), [loss()]);
        assert_eq!(p.decide(&seen(at(7.8), &follow, child)), []);
        // From one tenure straight into the next: both, loss first.
        assert_eq!(p.decide(&seen(at(1.0), &lead, child)), [gain()]);
        let next = leading(2);
        assert_eq!(p.decide(&seen(at(1.0), &next, child)), [loss(), gain()]);
    }

    #[test]
    fn always_without_signals_or_child_only_notes_the_transition() {
        let mut p = policy(Mode::Always);
        let follow = following(1);
        p.decide(&seen(at(0.0), &follow, JobView::Idle));
        let lead = leading(1);
        assert_eq!(p.decide(&seen(at(1.0), &lead, running(None))), []);

        // No child running when the change comes: noted, nothing sent.
        let mut config = child(Mode::Always);
        config.signal_on_gain = Some(Signal::SIGUSR1);
        let mut p = Policy::new(&config, None, origin());
        p.decide(&seen(at(0.0), &follow, JobView::Idle));
        let waiting = JobView::Backoff { over: false };
        assert_eq!(p.decide(&seen(at(1.0), &lead, waiting)), []);
        assert_eq!(p.decide(&seen(at(1.0), &lead, running(None))), []);
    }
}
