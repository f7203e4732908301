//! Giving leases up on purpose: a resign asked over HTTP (with a successor,
//! or to anyone), a failing app check, and the release of every lease as
//! the daemon exits.
//!
//! The job must be gone before the primary election's lease is released:
//! when it runs, it is stopped first (it gets `shutdown_grace`, the lease
//! still renewed meanwhile) and the step-down waits in
//! `Daemon::pending_step_down` until the child's exit, then goes ahead.

use std::time::Duration;

use super::Daemon;
use crate::app_check::Verdict;
use crate::config::Mode;
use crate::election::AfterRelease;
use crate::resign::{ResignError, ResignRequest, Resigned};

/// Why the primary election is being given up once the child is gone.
pub(super) enum StepDown {
    /// `POST /leader/{election}/resign`: answer the caller, sit out one lease.
    Resign(ResignRequest),
    /// The app check failed: release and campaign again once it passes.
    AppFailing,
}

impl StepDown {
    /// For the log.
    fn why(&self) -> &'static str {
        match self {
            StepDown::Resign(_) => "resign requested",
            StepDown::AppFailing => "app check failing",
        }
    }
}

impl Daemon {
    /// `POST /leader/{election}/resign`.
    pub(super) async fn on_resign(&mut self, req: ResignRequest) {
        if self.shutdown.is_some() {
            // Every lease is released as the daemon exits, to whoever is
            // fastest (or to the successor of a resign already under way).
            let _ = req.done.send(Err(ResignError::ShuttingDown));
            return;
        }
        if let Some(StepDown::Resign(earlier)) = &self.pending_step_down
            && earlier.election == req.election
        {
            // The first resign stands, its successor with it: replacing it
            // would leave its caller without an answer.
            tracing::info!(election = %req.election, to = req.to.as_deref().unwrap_or("(anyone)"), "resign refused: an earlier resign is still stepping down");
            let _ = req.done.send(Err(ResignError::InProgress {
                election: req.election.clone(),
                to: earlier.to.clone(),
            }));
            return;
        }
        let leading = self
            .handles
            .get(&req.election)
            .is_some_and(|h| h.state.borrow().is_leader_at(self.clock.now()));
        if !leading {
            // Not ours to give up: change nothing (no stop, no sit-out).
            let _ = req.done.send(Err(ResignError::NotLeader(req.election)));
            return;
        }
        let election = req.election.clone();
        if let Err(StepDown::Resign(req)) = self
            .stop_child_first(&election, StepDown::Resign(req))
            .await
        {
            self.finish_resign(req).await;
        }
    }

    /// Giving up `election`: when its job runs (the primary, mode
    /// while-leader), stop it and keep `step` for when it has exited, since
    /// the job must be gone before the lease is released. `Err(step)`: no job
    /// to wait for, release now.
    async fn stop_child_first(&mut self, election: &str, step: StepDown) -> Result<(), StepDown> {
        if !self.job.is_running() {
            return Err(step);
        }
        if election != self.cfg.primary || self.cfg.child.mode != Mode::WhileLeader {
            return Err(step);
        }
        tracing::info!(election = %election, why = step.why(), "stopping the child before releasing the lease");
        // Asked once only: a resign after a failing app check (or the
        // reverse) finds it stopping already.
        if let Some(child) = self.job.stop() {
            // A planned step-down, like SIGTERM: the job gets
            // shutdown_grace. The lease stays ours meanwhile (still
            // renewed), and the guard's deadline moves with each renewal
            // (see reconcile.rs), so a job slower to stop than the
            // lease is not killed while the lease is ours.
            if let Err(e) = child.stop(self.cfg.child.shutdown_grace).await {
                tracing::error!(error = %e, "cannot stop the child; killing its process group");
                let _ = child.kill().await;
            }
        }
        self.pending_step_down = Some(step);
        Ok(())
    }

    /// The child exited: a step-down that waited for it goes ahead. True
    /// when one did.
    pub(super) async fn step_down_after_exit(&mut self) -> bool {
        match self.pending_step_down.take() {
            Some(StepDown::Resign(req)) => {
                self.finish_resign(req).await;
                true
            }
            Some(StepDown::AppFailing) => {
                self.release_for_app(&self.cfg.primary.clone()).await;
                true
            }
            None => false,
        }
    }

    /// Whether the app check (if any) passes.
    pub(super) fn app_ok(&self) -> bool {
        self.app_check
            .as_ref()
            .is_none_or(|rx| *rx.borrow() == Verdict::Pass)
    }

    /// After every event of the daemon's loop: while the app fails, give
    /// up every lease this instance holds, the primary's child stopped
    /// first; the gate keeps the elections from campaigning until it
    /// passes again (a lease won as the verdict changed is given up at the
    /// next event, within a second).
    pub(super) async fn on_app_check(&mut self) {
        if self.app_ok() {
            return;
        }
        let now = self.clock.now();
        let leading: Vec<String> = self
            .handles
            .iter()
            .filter(|(_, h)| h.state.borrow().is_leader_at(now))
            .map(|(name, _)| name.clone())
            .collect();
        for name in leading {
            let primary = name == self.cfg.primary;
            if primary && self.pending_step_down.is_some() {
                // A resign is stopping the child; it releases after.
                continue;
            }
            if self
                .stop_child_first(&name, StepDown::AppFailing)
                .await
                .is_err()
            {
                self.release_for_app(&name).await;
            }
        }
    }

    /// Release `election` because the app fails; campaigning resumes when
    /// the app check passes (no sit-out).
    async fn release_for_app(&self, election: &str) {
        if let Some(h) = self.handles.get(election) {
            tracing::warn!(election = %election, "app check failing: releasing the lease");
            h.release(AfterRelease::SitOut(Duration::ZERO)).await;
        }
    }

    /// Release the resigned lease, naming the successor, and answer.
    async fn finish_resign(&mut self, req: ResignRequest) {
        let Some(h) = self.handles.get(&req.election) else {
            let _ = req.done.send(Err(ResignError::Failed(format!(
                "unknown election `{}`",
                req.election
            ))));
            return;
        };
        let sit_out = h.lease_duration;
        tracing::info!(election = %req.election, to = req.to.as_deref().unwrap_or("(anyone)"), "resigning: releasing the lease and sitting out one lease");
        let released = h
            .hand_over(AfterRelease::SitOut(sit_out), req.to.clone())
            .await;
        let _ = req.done.send(if released {
            Ok(Resigned::SittingOut)
        } else {
            Err(ResignError::NotLeader(req.election.clone()))
        });
    }

    /// Final step of every exit path: the child is gone; give up every lease.
    /// A resign that was waiting for the child (SIGTERM came meanwhile) is
    /// honoured by the release, its successor named, and answered; resigns
    /// still queued are answered `ShuttingDown`. Nothing is left waiting for
    /// an answer, so the HTTP drain that follows has nothing of ours to
    /// wait for.
    pub(super) async fn release_all(&mut self) {
        if let Some(b) = self.balancer.take() {
            b.leave().await;
        }
        self.kill_child().await;
        let resign = match self.pending_step_down.take() {
            Some(StepDown::Resign(req)) => Some(req),
            Some(StepDown::AppFailing) | None => None,
        };
        let releases = self.handles.iter().map(|(name, h)| {
            let successor = resign
                .as_ref()
                .filter(|r| r.election == *name)
                .and_then(|r| r.to.clone());
            async move { (name, h.hand_over(AfterRelease::Exit, successor).await) }
        });
        let released = futures_util::future::join_all(releases).await;
        if let Some(req) = resign {
            let done = released
                .iter()
                .any(|(name, released)| **name == req.election && *released);
            answer_resign_at_exit(req, done);
        }
        self.resign_rx.close();
        while let Ok(req) = self.resign_rx.try_recv() {
            let _ = req.done.send(Err(ResignError::ShuttingDown));
        }
    }
}

/// Answer the resign that was under way when the daemon exited: `released`
/// says whether its lease was given up (to its successor, if it named one).
fn answer_resign_at_exit(req: ResignRequest, released: bool) {
    tracing::info!(election = %req.election, released = released, "answering the resign that was under way at shutdown");
    let _ = req.done.send(if released {
        Ok(Resigned::Exiting)
    } else {
        Err(ResignError::Failed(format!(
            "the daemon is shutting down and could not release the lease of election `{}` (lost, or the store failed): it expires on its own",
            req.election
        )))
    });
}
