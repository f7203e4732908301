//! The child policy: what the job's starts and exits under the primary
//! election mean, and what the daemon does about them.
//!
//! The job is always in exactly one [`Slot`]: not running, running (under a
//! tenure, or under none in mode `always`), or waiting out a restart delay.
//! [`Job`] decides, and never does I/O: the daemon starts, signals and stops
//! processes and releases leases as the decisions say, so every rule here
//! is tested on paused time with no process at all. The daemon never sets
//! the slot itself: it tells the job what happened (started, exited, asked
//! to stop, shutting down) through the methods below, and reads it through
//! [`JobView`], which is what the reconcile policy (`reconcile.rs`) sees.
//!
//! - A child that ends while its tenure has lapsed (the lease was lost, the
//!   guard stopped it on its own deadline, a new tenure began) was stopped
//!   for the lease: in mode `while-leader` it waits for the next tenure,
//!   whatever `on_child_exit` says.
//! - Otherwise `on_child_exit` decides: `exit` ends leaderd with the child's
//!   code; `restart` starts it again after a delay that doubles from
//!   [`RESTART_FIRST`] to [`RESTART_CAP`] (and starts over after a run longer
//!   than the cap); `release` gives the lease up and sits out one lease.
//! - A command that cannot run at all (127 not found, 126 not executable) is
//!   the job failing: `exit` ends leaderd with that code, `release` releases;
//!   under `restart`, and for every passing failure, it is retried with the
//!   same back-off, and the lease is given up once the failures have lasted a
//!   whole lease, so that another instance can run the job.

use std::time::Duration;

use crate::clock::Instant;
use crate::config::{Mode, OnChildExit};
use crate::supervisor::ChildExit;

/// First restart delay of `on_child_exit = "restart"`.
const RESTART_FIRST: Duration = Duration::from_secs(1);
/// Longest restart delay; a run longer than this starts the delays over.
const RESTART_CAP: Duration = Duration::from_secs(30);
/// Runs in a row that fail (end on their own, non-zero, shorter than
/// [`RESTART_CAP`]) before `/healthz` reports the job as crash-looping.
const CRASH_LOOP: u32 = 3;

/// Where the job is. `C` is the handle of a running child (the supervisor's
/// `Child` in the daemon, `()` in tests).
#[derive(Debug)]
enum Slot<C> {
    /// Nothing runs and nothing is scheduled.
    Idle,
    /// The child runs.
    Running {
        /// Its handle.
        child: C,
        /// The tenure it runs under (none in mode `always`).
        seq: Option<u64>,
        /// When it started.
        started: Instant,
        /// Set once it was asked to stop (lease lost, resign, shutdown).
        stopping: bool,
    },
    /// A restart is due at `until`.
    Backoff {
        /// When to start it again.
        until: Instant,
    },
}

/// What the reconcile policy sees of the job: its slot, without the child's
/// handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobView {
    /// Nothing runs and nothing is scheduled.
    Idle,
    /// The child runs under tenure `seq` (none in mode `always`);
    /// `stopping` once it was asked to stop.
    Running {
        /// The tenure it runs under.
        seq: Option<u64>,
        /// It was asked to stop.
        stopping: bool,
    },
    /// A restart is scheduled; `over` once its delay has ended.
    Backoff {
        /// The delay has ended: the restart is due.
        over: bool,
    },
}

/// What the daemon does after the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterExit {
    /// Nothing more: a restart is scheduled, the job waits for a tenure, or
    /// the daemon is winding down anyway.
    Nothing,
    /// Release and exit with this code.
    ExitWith(i32),
    /// Give the primary lease up and sit out one lease.
    Release(&'static str),
}

/// What the daemon does after the child could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterStartFailure {
    /// Try again when the slot's back-off ends.
    Retry,
    /// Release and exit with this code (127 or 126).
    ExitWith(i32),
    /// Give the primary lease up and sit out one lease.
    Release(&'static str),
}

/// The job under the primary election: its slot, restart delay and recent
/// failures.
#[derive(Debug)]
pub(super) struct Job<C> {
    /// Where the job is.
    slot: Slot<C>,
    /// How the last child ended.
    last_exit: Option<ChildExit>,
    mode: Mode,
    on_child_exit: OnChildExit,
    /// The primary election's lease duration.
    lease: Duration,
    restart_delay: Duration,
    trouble: Trouble,
}

impl<C> Job<C> {
    pub(super) fn new(mode: Mode, on_child_exit: OnChildExit, lease: Duration) -> Self {
        Job {
            slot: Slot::Idle,
            last_exit: None,
            mode,
            on_child_exit,
            lease,
            restart_delay: RESTART_FIRST,
            trouble: Trouble::default(),
        }
    }

    /// The child started under tenure `seq` (none in mode `always`).
    pub(super) fn started(&mut self, child: C, seq: Option<u64>, now: Instant) {
        self.trouble.started();
        self.slot = Slot::Running {
            child,
            seq,
            started: now,
            stopping: false,
        };
    }

    /// The primary election's lease duration.
    pub(super) fn lease(&self) -> Duration {
        self.lease
    }

    /// True when a restart delay is running and has ended.
    fn backoff_over(&self, now: Instant) -> bool {
        matches!(self.slot, Slot::Backoff { until } if now >= until)
    }

    /// Where the job is at `now`, for the reconcile policy.
    pub(super) fn view(&self, now: Instant) -> JobView {
        match &self.slot {
            Slot::Idle => JobView::Idle,
            Slot::Running { seq, stopping, .. } => JobView::Running {
                seq: *seq,
                stopping: *stopping,
            },
            Slot::Backoff { .. } => JobView::Backoff {
                over: self.backoff_over(now),
            },
        }
    }

    /// Whether a child runs (it may have been asked to stop).
    pub(super) fn is_running(&self) -> bool {
        matches!(self.slot, Slot::Running { .. })
    }

    /// The running child's handle, to wait for, signal or arm it.
    pub(super) fn child_mut(&mut self) -> Option<&mut C> {
        match &mut self.slot {
            Slot::Running { child, .. } => Some(child),
            _ => None,
        }
    }

    /// When a scheduled restart is due, if one is.
    pub(super) fn restart_due(&self) -> Option<Instant> {
        match self.slot {
            Slot::Backoff { until } => Some(until),
            _ => None,
        }
    }

    /// The running child is asked to stop (lease lost, resign, failing app
    /// check). Returns its handle the first time, to send the stop; `None`
    /// when nothing runs or it was asked before.
    pub(super) fn stop(&mut self) -> Option<&mut C> {
        match &mut self.slot {
            Slot::Running {
                child, stopping, ..
            } if !*stopping => {
                *stopping = true;
                Some(child)
            }
            _ => None,
        }
    }

    /// The lease a scheduled restart waited for is gone: the restart is
    /// dropped, and the job waits for the next tenure.
    pub(super) fn cancel_restart(&mut self) {
        if matches!(self.slot, Slot::Backoff { .. }) {
            self.slot = Slot::Idle;
        }
    }

    /// Whether the running child was asked to stop (and is still running).
    pub(super) fn is_stopping(&self) -> bool {
        matches!(self.slot, Slot::Running { stopping: true, .. })
    }

    /// The daemon shuts down. Returns the running child, to forward the
    /// signal to, unless it was asked to stop already: a second stop signal
    /// means "quit now" to many programs (and restarts a shell's trap), so
    /// the stop under way is left to finish within the shutdown's grace.
    /// When none runs, a scheduled restart is dropped and the last exit
    /// forgotten, so that leaderd exits 0.
    pub(super) fn shutting_down(&mut self) -> Option<&mut C> {
        if !self.is_running() {
            self.slot = Slot::Idle;
            self.last_exit = None;
        }
        match &mut self.slot {
            Slot::Running {
                child,
                stopping: false,
                ..
            } => Some(child),
            _ => None,
        }
    }

    /// The daemon ends and killed the child, which ended with `status`
    /// (`None` when none ran): nothing runs or is scheduled any more.
    pub(super) fn killed(&mut self, status: Option<ChildExit>) {
        if let Some(status) = status {
            self.last_exit = Some(status);
        }
        self.slot = Slot::Idle;
    }

    /// leaderd's exit code once the job is over: the last child's, 0 when
    /// none ran (or a shutdown found none running).
    pub(super) fn exit_code(&self) -> i32 {
        self.last_exit.map_or(0, |e| e.exit_code())
    }

    /// The child ended with `status`. `leading_seq` is the tenure the
    /// primary election leads under at `now`, if it leads; `winding_down` is
    /// set while the daemon shuts down or finishes a resign (the daemon then
    /// decides). Returns the handle of the child that ended (`None` if none
    /// was running) and what to do.
    pub(super) fn exited(
        &mut self,
        status: ChildExit,
        now: Instant,
        leading_seq: Option<u64>,
        winding_down: bool,
    ) -> Option<(C, AfterExit)> {
        let Slot::Running {
            child,
            seq,
            started,
            stopping,
        } = std::mem::replace(&mut self.slot, Slot::Idle)
        else {
            return None;
        };
        let ran_for = now - started;
        self.last_exit = Some(status);
        tracing::info!(
            exit_code = status.exit_code(),
            reason = status.reason(),
            ran_ms = ran_for.as_millis() as u64,
            "child exited"
        );
        if winding_down {
            return Some((child, AfterExit::Nothing));
        }
        // Did the lease end under it? The guard stops and kills on its own
        // deadline, e.g. while leaderd itself was stopped or stalled, so the
        // exit can arrive before the daemon saw the loss: then it is a stop
        // for the lost lease, not the child ending on its own.
        let lease_ended = leading_seq.is_none() || leading_seq != seq;
        if self.mode == Mode::WhileLeader
            && (stopping || lease_ended || matches!(status, ChildExit::Killed))
        {
            tracing::info!(
                exit_code = status.exit_code(),
                "child stopped with the lease; waiting for a new tenure"
            );
            return Some((child, AfterExit::Nothing));
        }
        let after = match self.on_child_exit {
            OnChildExit::Exit => {
                tracing::info!(
                    exit_code = status.exit_code(),
                    "child exited on its own; releasing and exiting with its code"
                );
                AfterExit::ExitWith(status.exit_code())
            }
            OnChildExit::Restart => {
                self.trouble.ran(status, ran_for);
                let delay = self.bump_restart_delay(ran_for);
                tracing::info!(
                    delay_ms = delay.as_millis() as u64,
                    "restarting the child after a delay"
                );
                self.slot = Slot::Backoff { until: now + delay };
                AfterExit::Nothing
            }
            OnChildExit::Release => {
                if self.mode == Mode::Always {
                    let delay = self.bump_restart_delay(ran_for);
                    self.slot = Slot::Backoff { until: now + delay };
                }
                AfterExit::Release("child exited on its own")
            }
        };
        Some((child, after))
    }

    /// The child could not be started: `why` in words, and the shell's exit
    /// code when the command cannot run at all (127, 126).
    pub(super) fn start_failed(
        &mut self,
        now: Instant,
        why: String,
        cannot_run: Option<i32>,
    ) -> AfterStartFailure {
        self.trouble.start_failed(now, why);
        if let Some(code) = cannot_run {
            match self.on_child_exit {
                OnChildExit::Exit => return AfterStartFailure::ExitWith(code),
                OnChildExit::Release => {
                    self.slot = Slot::Idle;
                    return AfterStartFailure::Release("the job cannot run");
                }
                OnChildExit::Restart => {}
            }
        }
        let failing = self
            .trouble
            .failing_since
            .map_or(Duration::ZERO, |t| now - t);
        if self.mode == Mode::WhileLeader && failing >= self.lease {
            // Keep trying here, but not while keeping everyone else out.
            self.trouble.failing_since = None;
            self.slot = Slot::Idle;
            return AfterStartFailure::Release("the job has not started for a whole lease");
        }
        let delay = self.bump_restart_delay(Duration::ZERO);
        self.slot = Slot::Backoff { until: now + delay };
        AfterStartFailure::Retry
    }

    /// What `/healthz` reports of the job, if anything.
    pub(super) fn problem(&self) -> Option<String> {
        self.trouble.problem()
    }

    fn bump_restart_delay(&mut self, ran_for: Duration) -> Duration {
        if ran_for > RESTART_CAP {
            self.restart_delay = RESTART_FIRST;
        }
        let d = self.restart_delay;
        self.restart_delay = (self.restart_delay * 2).min(RESTART_CAP);
        d
    }
}

/// How the job has been failing lately: reported by `/healthz`, and under
/// `on_child_exit = "restart"` the reason to give the lease up.
#[derive(Debug, Default)]
struct Trouble {
    /// Starts in a row that failed: the command could not be run.
    start_failures: u32,
    /// When the first of those failed.
    failing_since: Option<Instant>,
    /// Runs in a row that failed on their own, each shorter than
    /// [`RESTART_CAP`].
    crashes: u32,
    /// The last failure, in words.
    last: String,
}

impl Trouble {
    fn start_failed(&mut self, now: Instant, why: String) {
        self.start_failures += 1;
        self.failing_since.get_or_insert(now);
        self.last = why;
    }

    fn started(&mut self) {
        self.start_failures = 0;
        self.failing_since = None;
    }

    /// A run ended on its own: a failure if it was short and not a success.
    fn ran(&mut self, exit: ChildExit, ran_for: Duration) {
        if exit == ChildExit::Exited(0) || ran_for > RESTART_CAP {
            self.crashes = 0;
        } else {
            self.crashes += 1;
            self.last = exit.to_string();
        }
    }

    fn problem(&self) -> Option<String> {
        if self.start_failures > 0 {
            Some(format!(
                "the job cannot start ({} attempt{} in a row): {}",
                self.start_failures,
                if self.start_failures == 1 { "" } else { "s" },
                self.last
            ))
        } else if self.crashes >= CRASH_LOOP {
            Some(format!(
                "the job keeps failing: {} ({} runs in a row)",
                self.last, self.crashes
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;

    const LEASE: Duration = Duration::from_secs(10);

    fn job(mode: Mode, on_exit: OnChildExit) -> Job<()> {
        Job::new(mode, on_exit, LEASE)
    }

    /// Starts the child under `seq`, lets `ran` pass on the paused clock and
    /// ends it with `status` while the primary leads under `leading`.
    async fn run_once(
        job: &mut Job<()>,
        clock: &Clock,
        seq: Option<u64>,
        ran: Duration,
        status: ChildExit,
        leading: Option<u64>,
    ) -> AfterExit {
        job.started((), seq, clock.now());
        tokio::time::advance(ran).await;
        let ((), after) = job
            .exited(status, clock.now(), leading, false)
            .expect("a child was running");
        after
    }

    /// [`run_once`] under tenure 1, still leading under it when it ends.
    async fn crash(
        job: &mut Job<()>,
        clock: &Clock,
        status: ChildExit,
        ran: Duration,
    ) -> AfterExit {
        run_once(job, clock, Some(1), ran, status, Some(1)).await
    }

    fn backoff_left(job: &Job<()>, now: Instant) -> Duration {
        match job.slot {
            Slot::Backoff { until } => until - now,
            ref other => panic!("expected a back-off, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn restart_delays_double_to_the_cap_and_start_over_after_a_long_run() {
        let clock = Clock::tokio();
        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        let short = Duration::from_millis(100);
        let mut delays = Vec::new();
        for _ in 0..7 {
            let after = crash(&mut j, &clock, ChildExit::Exited(1), short).await;
            assert_eq!(after, AfterExit::Nothing);
            let left = backoff_left(&j, clock.now());
            assert!(!j.backoff_over(clock.now()));
            delays.push(left.as_secs());
            tokio::time::advance(left).await;
            assert!(j.backoff_over(clock.now()));
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        let long = RESTART_CAP + Duration::from_secs(1);
        crash(&mut j, &clock, ChildExit::Exited(1), long).await;
        assert_eq!(backoff_left(&j, clock.now()), RESTART_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_ending_on_its_own_follows_on_child_exit() {
        let clock = Clock::tokio();
        let s = Duration::from_secs(1);
        let mut j = job(Mode::WhileLeader, OnChildExit::Exit);
        let after = run_once(&mut j, &clock, Some(4), s, ChildExit::Exited(3), Some(4)).await;
        assert_eq!(after, AfterExit::ExitWith(3));
        assert_eq!(j.last_exit, Some(ChildExit::Exited(3)));
        let after = run_once(&mut j, &clock, Some(4), s, ChildExit::Signaled(11), Some(4)).await;
        assert_eq!(after, AfterExit::ExitWith(139));

        let mut j = job(Mode::WhileLeader, OnChildExit::Release);
        let after = run_once(&mut j, &clock, Some(4), s, ChildExit::Exited(0), Some(4)).await;
        assert!(matches!(after, AfterExit::Release(_)), "{after:?}");
        assert!(matches!(j.slot, Slot::Idle));

        // Mode always: release, and run again after the delay.
        let mut j = job(Mode::Always, OnChildExit::Release);
        let after = run_once(&mut j, &clock, None, s, ChildExit::Exited(0), Some(4)).await;
        assert!(matches!(after, AfterExit::Release(_)), "{after:?}");
        assert_eq!(backoff_left(&j, clock.now()), RESTART_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_after_the_tenure_lapsed_is_a_stop_for_the_lease() {
        let clock = Clock::tokio();
        let s = Duration::from_secs(1);
        for on_exit in [
            OnChildExit::Exit,
            OnChildExit::Restart,
            OnChildExit::Release,
        ] {
            let mut j = job(Mode::WhileLeader, on_exit);
            // Not leading any more (the guard stopped it on its deadline).
            let after = run_once(&mut j, &clock, Some(4), s, ChildExit::Exited(3), None).await;
            assert_eq!(after, AfterExit::Nothing, "{on_exit:?}");
            assert!(matches!(j.slot, Slot::Idle), "waits for a tenure");
            // Leading again, but under a newer tenure.
            let after = run_once(&mut j, &clock, Some(4), s, ChildExit::Exited(3), Some(5)).await;
            assert_eq!(after, AfterExit::Nothing, "{on_exit:?}");
            // Killed by leaderd (deadline, grace), or asked to stop.
            let after = run_once(&mut j, &clock, Some(5), s, ChildExit::Killed, Some(5)).await;
            assert_eq!(after, AfterExit::Nothing, "{on_exit:?}");
            j.started((), Some(5), clock.now());
            assert!(j.stop().is_some(), "asked to stop");
            let ((), after) = j
                .exited(ChildExit::Exited(0), clock.now(), Some(5), false)
                .unwrap();
            assert_eq!(after, AfterExit::Nothing, "{on_exit:?}");
        }
        // In mode always the lease does not govern the child.
        let mut j = job(Mode::Always, OnChildExit::Exit);
        let after = run_once(&mut j, &clock, None, s, ChildExit::Exited(2), None).await;
        assert_eq!(after, AfterExit::ExitWith(2));
    }

    #[tokio::test(start_paused = true)]
    async fn winding_down_decides_nothing_and_no_exit_without_a_child() {
        let clock = Clock::tokio();
        let mut j = job(Mode::WhileLeader, OnChildExit::Exit);
        assert!(
            j.exited(ChildExit::Exited(1), clock.now(), Some(1), false)
                .is_none()
        );
        j.started((), Some(1), clock.now());
        let ((), after) = j
            .exited(ChildExit::Exited(7), clock.now(), Some(1), true)
            .unwrap();
        assert_eq!(after, AfterExit::Nothing);
        assert_eq!(j.last_exit, Some(ChildExit::Exited(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_cannot_run_exits_releases_or_retries_until_a_lease_passed() {
        let clock = Clock::tokio();
        let why = || "./exprot.sh: No such file or directory".to_owned();
        let mut j = job(Mode::WhileLeader, OnChildExit::Exit);
        assert_eq!(
            j.start_failed(clock.now(), why(), Some(127)),
            AfterStartFailure::ExitWith(127)
        );
        let mut j = job(Mode::WhileLeader, OnChildExit::Release);
        assert!(matches!(
            j.start_failed(clock.now(), why(), Some(126)),
            AfterStartFailure::Release(_)
        ));
        assert!(matches!(j.slot, Slot::Idle));

        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        let mut waited = Duration::ZERO;
        let mut delays = Vec::new();
        loop {
            match j.start_failed(clock.now(), why(), Some(127)) {
                AfterStartFailure::Retry => {
                    let left = backoff_left(&j, clock.now());
                    delays.push(left.as_secs());
                    tokio::time::advance(left).await;
                    waited += left;
                }
                AfterStartFailure::Release(_) => break,
                AfterStartFailure::ExitWith(c) => panic!("restart never exits ({c})"),
            }
            assert!(waited <= LEASE + RESTART_CAP, "never released");
        }
        assert_eq!(
            delays,
            [1, 2, 4, 8],
            "released once failures lasted a lease"
        );
        assert!(waited >= LEASE);
        let p = j.problem().expect("reported while failing");
        assert!(
            p.contains("cannot start (5 attempts in a row)") && p.contains("exprot.sh"),
            "{p}"
        );
        j.started((), Some(2), clock.now());
        assert_eq!(j.problem(), None);

        // A passing failure (no shell code) is retried in every mode.
        let mut j = job(Mode::WhileLeader, OnChildExit::Exit);
        assert_eq!(
            j.start_failed(clock.now(), "EAGAIN".into(), None),
            AfterStartFailure::Retry
        );
    }

    #[tokio::test(start_paused = true)]
    async fn crash_loops_are_reported_and_a_success_or_long_run_ends_them() {
        let clock = Clock::tokio();
        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        let short = Duration::from_millis(200);
        for _ in 1..CRASH_LOOP {
            crash(&mut j, &clock, ChildExit::Exited(3), short).await;
            assert_eq!(j.problem(), None, "a crash or two is not a loop yet");
        }
        crash(&mut j, &clock, ChildExit::Exited(3), short).await;
        let p = j.problem().expect("a crash loop");
        assert!(
            p.contains("exited with code 3") && p.contains("3 runs"),
            "{p}"
        );
        crash(&mut j, &clock, ChildExit::Exited(0), short).await;
        assert_eq!(j.problem(), None, "a success ends it");
        for _ in 0..CRASH_LOOP {
            crash(&mut j, &clock, ChildExit::Signaled(11), short).await;
        }
        assert!(j.problem().is_some());
        let long = RESTART_CAP + Duration::from_secs(1);
        crash(&mut j, &clock, ChildExit::Exited(1), long).await;
        assert_eq!(j.problem(), None, "a long run ends it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_view_follows_the_slot_and_a_stop_is_asked_once() {
        let clock = Clock::tokio();
        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        assert_eq!(j.view(clock.now()), JobView::Idle);
        assert!(!j.is_running() && j.child_mut().is_none() && j.stop().is_none());
        j.started((), Some(3), clock.now());
        let running = JobView::Running {
            seq: Some(3),
            stopping: false,
        };
        assert_eq!(j.view(clock.now()), running);
        assert!(j.is_running() && j.child_mut().is_some());
        assert!(j.stop().is_some());
        assert!(j.stop().is_none(), "asked once");
        let stopping = JobView::Running {
            seq: Some(3),
            stopping: true,
        };
        assert_eq!(j.view(clock.now()), stopping);

        crash(
            &mut j,
            &clock,
            ChildExit::Exited(1),
            Duration::from_millis(100),
        )
        .await;
        let until = j.restart_due().expect("a restart is scheduled");
        assert_eq!(until, clock.now() + RESTART_FIRST);
        assert_eq!(j.view(clock.now()), JobView::Backoff { over: false });
        tokio::time::advance(RESTART_FIRST).await;
        assert_eq!(j.view(clock.now()), JobView::Backoff { over: true });
        j.cancel_restart();
        assert_eq!(j.view(clock.now()), JobView::Idle);
        assert_eq!(j.restart_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_exit_code_is_the_last_childs_unless_a_shutdown_found_none_running() {
        let clock = Clock::tokio();
        let s = Duration::from_secs(1);
        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        assert_eq!(j.exit_code(), 0, "none ran");
        run_once(&mut j, &clock, Some(1), s, ChildExit::Exited(4), Some(1)).await;
        assert_eq!(j.exit_code(), 4);
        // Shutting down with a restart pending: dropped, and exit 0.
        assert!(j.shutting_down().is_none());
        assert_eq!(j.view(clock.now()), JobView::Idle);
        assert_eq!(j.exit_code(), 0);

        // Shutting down while it runs: its handle, to forward the signal.
        j.started((), Some(2), clock.now());
        assert!(j.shutting_down().is_some());
        assert!(j.is_running());
        // Killed as the daemon ends: its status is the exit code.
        j.killed(Some(ChildExit::Killed));
        assert_eq!(j.view(clock.now()), JobView::Idle);
        assert_eq!(j.exit_code(), 137);
        // Nothing ran: the last exit stands.
        j.killed(None);
        assert_eq!(j.exit_code(), 137);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_asked_to_stop_already_gets_no_second_signal_at_shutdown() {
        let clock = Clock::tokio();
        let mut j = job(Mode::WhileLeader, OnChildExit::Restart);
        j.started((), Some(1), clock.now());
        assert!(!j.is_stopping());
        assert!(j.stop().is_some(), "the first stop sends the signal");
        assert!(j.is_stopping());
        assert!(j.stop().is_none(), "asked once");
        assert!(j.shutting_down().is_none(), "the stop under way suffices");
        assert!(j.is_running(), "it still runs until it exits");
    }
}
