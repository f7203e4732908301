//! Preferred leaders in the model, and the hand-overs they share with a
//! resign.
//!
//! - A preemption: a leader hands an election over by the rule of
//!   [`crate::core::priority::successor`], to whichever daemon it believes
//!   of a higher priority and eligible for `preempt_after`. What it
//!   believes is whatever a member's label said: true, stale (the daemon
//!   crashed since) or forged (it never was eligible), so any other
//!   daemon, live or dead, may be the one. The rule's pause of one
//!   preemption per `preempt_after` per election is the daemon's own.
//! - A hold-back: a daemon that may be about to take over from a member
//!   above it closes its gate, whether it holds anything or not, and opens
//!   it again later; so may an app check that passes again. While the gate
//!   is closed the node takes nothing, and once it opens it campaigns as
//!   ever.

use std::time::Duration;

use super::{NodeModel, Step, World};
use crate::core::election::AfterRelease;
use crate::core::node::{ElectionId, NodeInput};
use crate::core::priority::{Contender, successor};
use crate::core::time::Instant;

/// `preempt_after`, the built-in default.
const PREEMPT_AFTER: Duration = Duration::from_secs(10);

impl NodeModel {
    /// The preemptions daemon `n` may make of election `e` now (it leads
    /// it): one to each other daemon the rule names, believed above it and
    /// eligible since the start.
    pub(super) fn preempt_steps(&self, w: &World, n: usize, e: usize, steps: &mut Vec<Step>) {
        if w.preempts_left == 0 || w.t < self.bounds.settle || self.bounds.timely {
            return;
        }
        for m in (0..3).filter(|m| *m != n) {
            if self.preferred(w, n, e, m).is_some() {
                steps.push(Step::Preempt(n, e, m));
            }
        }
    }

    /// Whom the rule names when daemon `n` believes daemon `m` a step
    /// above it for election `e`, eligible since the start.
    fn preferred(&self, w: &World, n: usize, e: usize, m: usize) -> Option<&'static str> {
        let believed = [Contender {
            identity: self.bounds.identities[m],
            priority: 1,
            eligible_since: Instant::from_since_origin(Duration::ZERO),
        }];
        let now = self.local(n, w.t);
        let last = w.daemons[n].preempted_at[e];
        successor(0, &believed, now, PREEMPT_AFTER, last)
    }

    /// Daemon `n` hands election `e` to daemon `m`, as the daemon does: a
    /// resign naming the successor, then following.
    pub(super) fn preempt(&self, w: &mut World, n: usize, e: usize, m: usize) -> Option<()> {
        let to = self.preferred(w, n, e, m)?;
        w.preempts_left -= 1;
        w.daemons[n].preempted_at[e] = Some(self.local(n, w.t));
        w.elections[e].preferred = Some(to);
        self.hand_over(w, n, e, AfterRelease::Follow, Some(to));
        Some(())
    }

    /// Daemon `n` resigns election `e`, to daemon `m`'s identity or to
    /// anyone.
    pub(super) fn resign(&self, w: &mut World, n: usize, e: usize, to: Option<usize>) {
        w.resigns_left -= 1;
        match to {
            Some(m) => {
                let successor = self.bounds.identities[m];
                self.hand_over(w, n, e, AfterRelease::Follow, Some(successor));
            }
            None => self.hand_over(w, n, e, AfterRelease::SitOut(self.cfg.lease_duration), None),
        }
    }

    /// Daemon `n`, whose app check fails, releases election `e` (its job
    /// stopped first), as the daemon does, and takes nothing while the
    /// check fails.
    pub(super) fn release_failing(&self, w: &mut World, n: usize, e: usize) {
        self.hand_over(w, n, e, AfterRelease::SitOut(Duration::ZERO), None);
    }

    fn hand_over(
        &self,
        w: &mut World,
        n: usize,
        e: usize,
        then: AfterRelease,
        successor: Option<&str>,
    ) {
        let release = NodeInput::Release {
            election: ElectionId(e as u32),
            then,
            successor: successor.map(str::to_owned),
        };
        self.feed(w, n, release);
    }

    /// Whether daemon `n`'s gate may close now: once it holds a tenure
    /// (an app check that starts failing), or at any time when gates may
    /// open again (a hold-back, which a follower makes).
    pub(super) fn may_close_gate(&self, w: &World, n: usize, holds: bool) -> bool {
        let settled = w.t >= self.bounds.settle;
        w.gate_closes_left > 0
            && w.daemons[n].gate
            && settled
            && (holds || self.bounds.gate_opens > 0)
    }

    /// Daemon `n`'s closed gate opens (the hold-back is over, or the app
    /// check passes again).
    pub(super) fn open_gate(w: &mut World, n: usize) {
        w.gate_opens_left -= 1;
        w.daemons[n].gate = true;
        w.daemons[n].reopened = true;
    }

    /// Daemon `n` has just become the leader of election `e`: the examples
    /// of a reopened gate and of a preemption that reached its successor.
    pub(super) fn led(&self, w: &mut World, n: usize, e: usize) {
        if w.daemons[n].reopened {
            w.led_after_reopen = true;
        }
        if let Some(to) = w.elections[e].preferred.take() {
            w.led_by_preferred |= to == self.bounds.identities[n];
        }
    }
}
