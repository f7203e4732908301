//! The daemon's hands on the job: it carries out what the reconcile policy
//! decided (start, arm, stop, signal, kill), starts the child, and acts on
//! what the job's policy makes of a start that failed or a child that
//! exited (restart later, release the lease, or end leaderd).

use std::time::Duration;

use super::Daemon;
use super::child::{AfterExit, AfterStartFailure};
use super::reconcile::{Action, Seen};
use crate::election::{AfterRelease, ElectionState, Tenure};
use crate::exit;
use crate::supervisor::{self, ChildExit, ChildSpec, SupervisorError};

impl Daemon {
    /// Bring the child in line with the primary election's state: the
    /// policy decides, this carries it out. Returns an exit code when the
    /// daemon should end.
    pub(super) async fn reconcile(&mut self) -> Option<i32> {
        let now = self.clock.now();
        let state = self.primary.borrow().clone();
        let seen = Seen {
            now,
            state: &state,
            job: self.job.view(now),
            shutting_down: self.shutdown.is_some(),
            kill_due: self.shutdown.as_ref().is_some_and(|s| s.kill_due(now)),
            stepping_down: self.pending_step_down.is_some(),
            app_ok: self.app_ok(),
        };
        for action in self.policy.decide(&seen) {
            if let Some(code) = self.carry_out(action, &state).await {
                return Some(code);
            }
        }
        None
    }

    /// Do what the policy decided. Returns an exit code when the daemon
    /// should end.
    async fn carry_out(&mut self, action: Action, state: &ElectionState) -> Option<i32> {
        match action {
            Action::Finish => return Some(self.job.exit_code()),
            Action::GiveUpAcquiring => {
                tracing::warn!(election = %state.election, leader = state.leader.as_deref().unwrap_or("none"), "lease not acquired within --acquire-timeout");
                return Some(exit::TEMPFAIL);
            }
            Action::KillForShutdown => {
                tracing::warn!(
                    "child still running after shutdown_grace; killing its process group"
                );
                if let Some(s) = &mut self.shutdown {
                    s.killed();
                }
                if let Some(child) = self.job.child_mut() {
                    let _ = child.kill().await;
                }
            }
            Action::Arm {
                stop_at,
                valid_until,
            } => {
                if let Some(child) = self.job.child_mut() {
                    match child.arm(stop_at, valid_until).await {
                        // Exited: its exit report is on the way.
                        Ok(()) | Err(SupervisorError::Gone) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot extend the child's deadline"),
                    }
                }
            }
            Action::Stop { grace } => self.stop_for_lost_lease(state, grace).await,
            Action::Start(tenure) => return self.start_child(tenure.as_ref()).await,
            Action::CancelRestart => self.job.cancel_restart(),
            Action::Signal { signal, transition } => {
                if let Some(child) = self.job.child_mut() {
                    tracing::info!(election = %state.election, signal = %signal, transition = transition, "signalling the child of a leadership change");
                    if let Err(e) = child.signal(signal).await {
                        tracing::warn!(error = %e, "cannot signal the child");
                    }
                }
            }
        }
        None
    }

    /// Not leader any more: stop the child within `grace`; the guard kills
    /// the group at the end of the old validity at the latest.
    async fn stop_for_lost_lease(&mut self, state: &ElectionState, grace: Duration) {
        let Some(child) = self.job.stop() else {
            return;
        };
        tracing::warn!(election = %state.election, identity = %state.identity, grace_ms = grace.as_millis() as u64, "not leader any more: stopping the child");
        if let Err(e) = child.stop(grace).await {
            tracing::error!(error = %e, "cannot stop the child; killing its process group");
            let _ = child.kill().await;
        }
    }

    /// Start the child under `tenure` (none in mode "always"). Returns an
    /// exit code when the command cannot run at all and the configured
    /// `on_child_exit` is `exit`.
    async fn start_child(&mut self, tenure: Option<&Tenure>) -> Option<i32> {
        let cfg = &self.cfg.child;
        let state = self.primary.borrow().clone();
        let lease_ms = match tenure {
            Some(t) => t.lease_ms,
            None => self.job.lease().as_millis() as u64,
        };
        let env = supervisor::child_env::vars(
            &state.election,
            &state.identity,
            state.is_leader_at(self.clock.now()),
            tenure.map(|t| t.fencing_token),
            lease_ms,
        );
        // The running binary itself, even if a package upgrade replaced the
        // file since we started.
        let guard_exe = std::path::PathBuf::from("/proc/self/exe");
        let spec = ChildSpec {
            command: cfg.command.clone(),
            env,
            stop_signal: cfg.stop_signal,
            guard_exe,
        };
        let deadline = tenure.map(|t| (t.stop_at, t.valid_until));
        match supervisor::spawn(&spec, deadline).await {
            Ok(child) => {
                match tenure {
                    Some(t) => {
                        tracing::info!(election = %state.election, identity = %state.identity, fencing_token = t.fencing_token, pid = child.pid(), command = ?cfg.command, "child started")
                    }
                    None => {
                        tracing::info!(election = %state.election, identity = %state.identity, pid = child.pid(), command = ?cfg.command, "child started")
                    }
                }
                self.metrics.child_started(&self.cfg.primary);
                let now = self.clock.now();
                self.job
                    .started(Box::new(child), tenure.map(|t| t.seq), now);
                self.publish_job_health();
                None
            }
            Err(e) => self.start_failed(e).await,
        }
    }

    /// The child could not be started: the job's policy decides (see
    /// `child.rs`).
    async fn start_failed(&mut self, e: SupervisorError) -> Option<i32> {
        let now = self.clock.now();
        let primary = self.cfg.primary.clone();
        self.metrics.child_start_failed(&primary);
        let cannot_run = match &e {
            SupervisorError::Spawn(f) => f.exit_code,
            _ => None,
        };
        tracing::error!(election = %primary, error = %e, command = ?self.cfg.child.command, "cannot start the child");
        let after = self.job.start_failed(now, e.to_string(), cannot_run);
        self.publish_job_health();
        match after {
            AfterStartFailure::Retry => None,
            AfterStartFailure::ExitWith(code) => {
                tracing::error!(election = %primary, exit_code = code, "the job cannot run; releasing and exiting");
                Some(code)
            }
            AfterStartFailure::Release(why) => {
                self.release_and_sit_out(why).await;
                None
            }
        }
    }

    /// Give the primary lease up and sit out one lease.
    async fn release_and_sit_out(&mut self, why: &str) {
        let primary = self.cfg.primary.clone();
        if let Some(h) = self.handles.get(&primary) {
            let sit_out = h.lease_duration;
            tracing::warn!(election = %primary, "{why}: releasing the lease and sitting out one lease");
            h.release(AfterRelease::SitOut(sit_out)).await;
        }
    }

    /// Tell `/healthz` what the job's trouble is, if it changed.
    fn publish_job_health(&self) {
        let problem = self.job.problem();
        self.job_health.send_if_modified(|current| {
            let changed = *current != problem;
            if changed {
                current.clone_from(&problem);
            }
            changed
        });
    }

    /// The child exited: count it, let a step-down waiting for it go ahead,
    /// else do what the job's policy says. Returns an exit code when the
    /// daemon should end.
    pub(super) async fn on_child_exit(&mut self, status: ChildExit) -> Option<i32> {
        let now = self.clock.now();
        let leading_seq = {
            let state = self.primary.borrow();
            state
                .tenure
                .as_ref()
                .filter(|_| state.is_leader_at(now))
                .map(|t| t.seq)
        };
        let winding_down = self.shutdown.is_some() || self.pending_step_down.is_some();
        let (_, after) = self.job.exited(status, now, leading_seq, winding_down)?;
        self.metrics
            .child_exited(&self.cfg.primary, status.reason());
        if matches!(status, ChildExit::Killed) {
            self.metrics.child_killed(&self.cfg.primary);
        }
        self.publish_job_health();
        if self.shutdown.is_some() || self.step_down_after_exit().await {
            return None;
        }
        match after {
            AfterExit::Nothing => None,
            AfterExit::ExitWith(code) => Some(code),
            AfterExit::Release(why) => {
                self.release_and_sit_out(why).await;
                None
            }
        }
    }

    /// Kill the child, if one runs, and wait for it: the daemon ends.
    pub(super) async fn kill_child(&mut self) {
        let status = match self.job.child_mut() {
            Some(child) => {
                let _ = child.kill().await;
                Some(child.wait().await)
            }
            None => None,
        };
        self.job.killed(status);
    }
}
