//! Process signals as the daemon handles them: a shutdown signal starts the
//! shutdown (forwarded to the child, which gets `shutdown_grace`; a second
//! one kills it now); any other signal is forwarded to the child.

use nix::sys::signal::Signal;

use super::Daemon;
use crate::clock::Instant;
use crate::shutdown;

/// A shutdown under way: the child winds down, then every lease is released.
#[derive(Debug)]
pub(super) struct Shutdown {
    /// When to stop waiting for the child and kill it.
    kill_at: Instant,
    killed: bool,
}

impl Shutdown {
    /// `kill_at` has come and the child was not killed yet.
    pub(super) fn kill_due(&self, now: Instant) -> bool {
        now >= self.kill_at && !self.killed
    }

    /// When the child is to be killed, unless it was already.
    pub(super) fn kill_deadline(&self) -> Option<Instant> {
        (!self.killed).then_some(self.kill_at)
    }

    /// The child was killed: not again.
    pub(super) fn killed(&mut self) {
        self.killed = true;
    }
}

impl Daemon {
    /// A signal came: start the shutdown, hurry it, or forward the signal.
    pub(super) async fn on_signal(&mut self, sig: Signal) {
        if shutdown::is_shutdown(sig) {
            match &mut self.shutdown {
                None => self.begin_shutdown(sig).await,
                Some(s) => {
                    tracing::warn!(signal = %sig, "second shutdown signal: killing the child now");
                    s.kill_at = self.clock.now();
                }
            }
            return;
        }
        match self.job.child_mut() {
            Some(child) => {
                tracing::info!(signal = %sig, "forwarding signal to the child");
                if let Err(e) = child.signal(sig).await {
                    tracing::warn!(error = %e, "cannot forward the signal to the child");
                }
            }
            None => tracing::info!(signal = %sig, "no child to forward the signal to"),
        }
    }

    /// The first shutdown signal: no more handovers, the child gets the
    /// signal and `shutdown_grace`, and the loop ends once it is gone.
    async fn begin_shutdown(&mut self, sig: Signal) {
        // Leaving: no more handovers to balance the others.
        if let Some(b) = &self.balancer {
            b.halt();
        }
        let grace = self.cfg.child.shutdown_grace;
        if self.job.is_stopping() {
            tracing::info!(signal = %sig, grace_ms = grace.as_millis() as u64, "shutting down: the child is stopping already, then releasing");
        } else if self.job.is_running() {
            tracing::info!(signal = %sig, grace_ms = grace.as_millis() as u64, "shutting down: forwarding the signal to the child, then releasing");
        } else {
            tracing::info!(signal = %sig, "shutting down: releasing");
        }
        self.shutdown = Some(Shutdown {
            kill_at: self.clock.now() + grace,
            killed: false,
        });
        // Nothing runs (maybe a restart was pending): the job forgets it,
        // and leaderd exits 0.
        if let Some(child) = self.job.shutting_down() {
            // No deadline from the lease while we wind down: the
            // engine keeps renewing; shutdown_grace bounds it.
            if let Err(e) = child.signal(sig).await {
                tracing::warn!(error = %e, "cannot forward the signal to the child");
            }
        }
    }
}
