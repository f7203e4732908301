//! The daemon's one loop: act on the current state (reconcile), wait for
//! the next event (the primary election's state, the child, a signal, a
//! resign, the store check, the app check, a timer), dispatch it; until
//! something says the daemon ends, with which exit code.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::Daemon;
use crate::clock::Instant;
use crate::exit;
use crate::lease::StoreError;
use crate::resign::ResignRequest;
use crate::supervisor::ChildExit;

/// What woke the loop.
enum Event {
    /// The app check's verdict changed.
    AppCheck,
    /// The primary election published a new state.
    State,
    /// The primary election's state is no longer published (the node's
    /// driver is gone).
    StateGone,
    /// The child exited.
    ChildExited(ChildExit),
    /// A signal (`None`: the signal channel closed).
    Signal(Option<Signal>),
    /// A resign request (`None`: the channel closed).
    Resign(Option<ResignRequest>),
    /// The store can never work (`Some`), or the check ended well (`None`).
    StoreCheck(Option<StoreError>),
    /// Something is due by the clock (see [`Daemon::next_timer`]).
    Timer,
}

impl Daemon {
    /// Run until the daemon should end; returns the exit code.
    pub(super) async fn run(&mut self) -> i32 {
        loop {
            // Act on the current state first, then wait for the next event.
            if let Some(code) = self.reconcile().await {
                return code;
            }
            let event = self.next_event().await;
            if let Some(code) = self.dispatch(event).await {
                return code;
            }
            // While the app fails, nothing stays led here: an election
            // that won a lease as the verdict changed is released too.
            self.on_app_check().await;
        }
    }

    /// Wait for whatever happens first.
    async fn next_event(&mut self) -> Event {
        let timer = self.next_timer();
        // Split the borrows: each select arm owns one field.
        let Daemon {
            job,
            primary,
            signals,
            resign_rx,
            store_check,
            clock,
            app_check,
            ..
        } = self;
        let verdict_changed = async {
            match app_check {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        let store_verdict = async {
            match store_check {
                Some(rx) => rx.await.ok(),
                None => std::future::pending().await,
            }
        };
        let child_wait = async {
            match job.child_mut() {
                Some(child) => child.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = primary.changed() => if r.is_ok() { Event::State } else { Event::StateGone },
            exit = child_wait => Event::ChildExited(exit),
            sig = signals.recv() => Event::Signal(sig),
            req = resign_rx.recv() => Event::Resign(req),
            verdict = store_verdict => Event::StoreCheck(verdict),
            _ = verdict_changed => Event::AppCheck,
            _ = clock.sleep_until(timer) => Event::Timer,
        }
    }

    /// Act on `event`. Returns an exit code when the daemon should end.
    async fn dispatch(&mut self, event: Event) -> Option<i32> {
        match event {
            Event::State => tracing::debug!("event: state"),
            // Acted on after every event (see `run`).
            Event::AppCheck => tracing::debug!("event: app check"),
            Event::Timer => tracing::debug!("event: timer"),
            Event::StateGone => {
                tracing::error!(election = %self.cfg.primary, "election task ended unexpectedly");
                self.kill_child().await;
                return Some(exit::SOFTWARE);
            }
            Event::ChildExited(status) => return self.on_child_exit(status).await,
            Event::Signal(None) => tracing::debug!("event: signal channel closed"),
            Event::Signal(Some(sig)) => self.on_signal(sig).await,
            Event::Resign(None) => tracing::debug!("event: resign channel closed"),
            Event::Resign(Some(req)) => self.on_resign(req).await,
            Event::StoreCheck(None) => self.store_check = None,
            Event::StoreCheck(Some(e)) => {
                tracing::error!(error = %e, "the lease store cannot be used; stopping");
                self.kill_child().await;
                return Some(exit::UNAVAILABLE);
            }
        }
        None
    }

    /// The next instant something is due without an event: the acquire
    /// timeout, a restart backoff, the shutdown kill, a validity edge.
    fn next_timer(&self) -> Instant {
        let now = self.clock.now();
        let mut t = now + Duration::from_secs(1);
        if let Some(a) = self.policy.acquire_deadline() {
            // Never in the past: the zero timeout is decided by `rounds`.
            t = t.min(a.max(now + Duration::from_millis(10)));
        }
        if let Some(until) = self.job.restart_due() {
            t = t.min(until);
        }
        if let Some(kill_at) = self.shutdown.as_ref().and_then(|s| s.kill_deadline()) {
            t = t.min(kill_at);
        }
        if let Some(tenure) = &self.primary.borrow().tenure {
            // Wake at the stop time even if the engine is late publishing it.
            if tenure.stop_at > now {
                t = t.min(tenure.stop_at);
            }
        }
        t
    }
}
