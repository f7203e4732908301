//! Preferred leaders on the member layer: each member publishes its
//! priorities in a label while it is eligible (its app check passes, it
//! sits out no election after a resign, it is not leaving), and a leader
//! that knows of a live member of a higher priority for an election it
//! leads, eligible for `preempt_after` without a break on the leader's own
//! clock, hands the election to it with the planned handover (the rule:
//! [`crate::core::priority`]).
//!
//! A member's label is advice, like the rest of membership: a forged one
//! can cost one planned handover per election per `preempt_after`, which
//! the store decides as any handover; never two leaders or none.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use super::{LED_LABEL, Peer, SET_LABEL, Worker};
use crate::app_check::Verdict;
use crate::clock::Instant;
use crate::config::PriorityConfig;
use crate::core::priority::{Above, Contender, Priorities, holding, next_due, successor};
use crate::driver::SitOuts;
use crate::election::{AfterRelease, Role};
use crate::resign::ResignRequest;

/// Label of a member: its priorities (see [`Priorities::encode`]), present
/// only while it is eligible.
pub const PRIORITY_LABEL: &str = "priority";

/// What the balancer needs for preferred leaders.
#[derive(Debug, Clone, Default)]
pub struct Preferences {
    /// Our priorities, and whether and when to preempt.
    pub priority: PriorityConfig,
    /// The sit-outs asked of our elections (no priority is published
    /// while one lasts).
    pub sit_outs: Option<watch::Receiver<SitOuts>>,
    /// How to hand over an election whose job the daemon must stop first
    /// (one without steering): as a resign naming the successor.
    pub resign: Option<mpsc::Sender<ResignRequest>>,
    /// Holds the daemon's elections back from taking anything (see
    /// [`holding_gate`]) while a member of a higher priority that went
    /// quiet may be about to be taken over from.
    pub hold: Option<std::sync::Arc<watch::Sender<bool>>>,
}

/// Resolves when a sit-out is asked; never without a receiver, or once
/// its sender is gone.
pub(super) async fn sit_out_asked(rx: &mut Option<watch::Receiver<SitOuts>>) -> Option<()> {
    if let Some(r) = rx.as_mut()
        && r.changed().await.is_ok()
    {
        return Some(());
    }
    *rx = None;
    std::future::pending().await
}

/// What `/status` shows of preferred leaders (`priority`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PriorityView {
    /// This instance's priority (`priority`).
    pub priority: i64,
    /// Its elections whose priority differs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub elections: BTreeMap<String, i64>,
    /// Whether it hands elections to a higher priority (`preempt`).
    pub preempt: bool,
    /// `preempt_after`, ms.
    pub preempt_after_ms: u64,
    /// Whether it publishes its priorities now (it is eligible).
    pub eligible: bool,
    /// Whether it holds back from taking anything now (a member of a
    /// higher priority went quiet).
    pub holding_back: bool,
    /// Elections it handed over for priority since it started.
    pub preemptions: u64,
    /// The live members publishing priorities that it knows, by identity.
    pub members: Vec<MemberPriority>,
}

/// A live member's priorities as this instance knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberPriority {
    /// Its identity.
    pub identity: String,
    /// Its priority.
    pub priority: i64,
    /// Its elections whose priority differs from `priority`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub elections: BTreeMap<String, i64>,
    /// How long it has been seen eligible without a break, ms.
    pub eligible_for_ms: u64,
}

/// What the balancer keeps of preferred leaders.
#[derive(Debug, Default)]
pub(super) struct Preferred {
    /// Each member publishing priorities: its label as first seen, and
    /// since when (our clock) it has been seen with it without a break.
    since: HashMap<String, (String, Instant)>,
    /// When each election was last handed over by preemption.
    last: HashMap<String, Instant>,
    /// When members' eligibility was last timed (the last round).
    timed_at: Option<Instant>,
    /// When the last round that handed elections over began.
    moved_at: Option<Instant>,
    /// Sit-outs seen so far, and until when the last one lasts.
    sit_outs_seen: u64,
    sitting_out_until: Option<Instant>,
    /// The next instant a preemption or the hold may fall due without
    /// news.
    pub(super) due: Option<Instant>,
    /// The members of a higher priority than ours, as last heard of.
    above: HashMap<String, Above>,
    /// Whether we hold back (see [`holding_gate`]).
    holding: bool,
    /// Elections handed over for priority so far.
    preemptions: u64,
}

impl Preferred {
    /// Whether `identity` is timed as an eligible member already.
    pub(super) fn knows(&self, identity: &str) -> bool {
        self.since.contains_key(identity)
    }
}

/// The gate the daemon's elections campaign by: the app check's verdict
/// (passing without one), closed while the balancer holds back after a
/// member of a higher priority went quiet; and the handle the balancer
/// holds back with.
pub fn holding_gate(
    app: Option<watch::Receiver<Verdict>>,
) -> (
    watch::Receiver<Verdict>,
    std::sync::Arc<watch::Sender<bool>>,
) {
    let (hold, mut held) = watch::channel(false);
    let verdict = |app: &Option<watch::Receiver<Verdict>>, held: bool| match app {
        _ if held => Verdict::Unknown,
        Some(a) => *a.borrow(),
        None => Verdict::Pass,
    };
    let (gate, rx) = watch::channel(verdict(&app, false));
    tokio::spawn(async move {
        let mut app = app;
        loop {
            tokio::select! {
                changed = async { app.as_mut()?.changed().await.ok() }, if app.is_some() => {
                    if changed.is_none() {
                        app = None;
                    }
                }
                changed = held.changed() => {
                    if changed.is_err() {
                        return; // the balancer is gone: nothing holds
                    }
                }
                () = gate.closed() => return,
            }
            let now = verdict(&app, *held.borrow());
            gate.send_if_modified(|v| std::mem::replace(v, now) != now);
        }
    });
    (rx, std::sync::Arc::new(hold))
}

impl Worker {
    /// The priority label's text while we are eligible, `None` otherwise
    /// or when priorities are not in use.
    pub(super) fn priority_label(&mut self) -> Option<String> {
        if !self.config.preferences.priority.in_use || !self.app_passes() {
            return None;
        }
        let now = self.clock.now();
        if let Some(rx) = &self.config.preferences.sit_outs {
            let told = *rx.borrow();
            if told.count != self.preferred.sit_outs_seen {
                self.preferred.sit_outs_seen = told.count;
                self.preferred.sitting_out_until = Some(now + told.last);
            }
        }
        if self.preferred.sitting_out_until.is_some_and(|t| now < t) {
            return None;
        }
        Some(
            self.config
                .preferences
                .priority
                .published(&self.sorted)
                .encode(),
        )
    }

    /// Our member labels: what we lead, our set, and our priorities while
    /// we are eligible.
    pub(super) fn member_labels(&mut self, led: usize) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (LED_LABEL.to_owned(), led.to_string()),
            (SET_LABEL.to_owned(), self.set.clone()),
        ]);
        if let Some(p) = self.priority_label() {
            labels.insert(PRIORITY_LABEL.to_owned(), p);
        }
        labels
    }

    /// A peer's priorities, from its labels.
    pub(super) fn parse_priorities(label: Option<&String>) -> Option<Priorities> {
        label.and_then(|l| Priorities::decode(l))
    }

    /// The index of `name` among the sorted names of our set.
    pub(super) fn index_of(&self, name: &str) -> Option<u32> {
        let i = self
            .sorted
            .binary_search_by(|n| n.as_str().cmp(name))
            .ok()?;
        u32::try_from(i).ok()
    }

    /// Whether balance may hand the election at `index` to `to`: never to
    /// a member of a lower priority for it than another live member (or
    /// us). A member without a known priority counts as the default, 0.
    pub(super) fn may_receive(&self, to: &str, index: Option<u32>, peers: &[Peer]) -> bool {
        let Some(index) = index else { return true };
        let of = |p: &Peer| p.priorities.as_ref().map_or(0, |pr| pr.of(index));
        let name = &self.sorted[index as usize];
        let best = peers
            .iter()
            .map(of)
            .chain([self.config.preferences.priority.of(name)])
            .max()
            .unwrap_or(0);
        peers.iter().any(|p| p.identity == to && of(p) >= best)
    }

    /// Steps of priority `peer` stands above us, at most over our
    /// elections (zero or less: not above).
    fn steps_above(&self, theirs: &Priorities) -> i64 {
        let ours = &self.config.preferences.priority;
        (0..self.sorted.len())
            .filter_map(|i| {
                let index = u32::try_from(i).ok()?;
                Some(theirs.of(index) - ours.of(&self.sorted[i]))
            })
            .max()
            .unwrap_or(0)
    }

    /// Hold the elections back from taking anything while a member of a
    /// higher priority went quiet (see `core::priority::holding`): after
    /// a crash, the next priority down takes over first.
    fn hold_back(&mut self, peers: &[Peer]) -> Option<Instant> {
        let hold = self.config.preferences.hold.clone()?;
        let now = self.clock.now();
        for p in peers {
            match &p.priorities {
                Some(theirs) => {
                    let diff = self.steps_above(theirs);
                    let above = Above {
                        gone_at: p.gone_at,
                        diff,
                    };
                    self.preferred.above.insert(p.identity.clone(), above);
                }
                // Live and not eligible: nothing to wait for.
                None => {
                    self.preferred.above.remove(&p.identity);
                }
            }
        }
        let wait = crate::election::takeover_wait(
            u64::try_from(self.config.lease_duration.as_millis()).unwrap_or(u64::MAX),
            self.config.max_clock_drift,
        );
        let retry = self.config.retry_interval;
        self.preferred.above.retain(|_, a| {
            a.diff > 0 && now < a.gone_at + crate::core::priority::hold_back(a.diff, retry)
        });
        let above: Vec<Above> = self.preferred.above.values().copied().collect();
        let (holding, next) = holding(now, &above, wait, retry);
        if holding != self.preferred.holding {
            self.preferred.holding = holding;
            if holding {
                tracing::info!(identity = %self.config.identity, "a member of a higher priority went quiet: taking nothing until it may have been taken over from");
            } else {
                tracing::info!(identity = %self.config.identity, "no member of a higher priority to wait for: campaigning again");
            }
            hold.send_replace(holding);
        }
        next
    }

    /// Time the members' eligibility, and hand over the elections a
    /// member of a higher priority should lead.
    pub(super) async fn prefer(&mut self, peers: &[Peer]) {
        let hold_due = self.hold_back(peers);
        self.prefer_leaders(peers).await;
        if let Some(at) = hold_due {
            self.preferred.due = Some(self.preferred.due.map_or(at, |d| d.min(at)));
        }
        if self.config.preferences.priority.in_use {
            let view = self.priority_view(peers);
            self.priorities
                .send_if_modified(|v| std::mem::replace(v, view.clone()) != view);
        }
    }

    /// What `/status` shows: our priorities, and each live member's.
    fn priority_view(&mut self, peers: &[Peer]) -> PriorityView {
        let now = self.clock.now();
        let named = |p: &Priorities| -> BTreeMap<String, i64> {
            p.overrides
                .iter()
                .filter_map(|(i, v)| Some((self.sorted.get(*i as usize)?.clone(), *v)))
                .collect()
        };
        let mut members: Vec<MemberPriority> = peers
            .iter()
            .filter_map(|p| {
                let theirs = p.priorities.as_ref()?;
                let since = self.preferred.since.get(&p.identity).map(|(_, at)| *at);
                let eligible_for = since.map_or(Duration::ZERO, |at| now.saturating_since(at));
                Some(MemberPriority {
                    identity: p.identity.clone(),
                    priority: theirs.default,
                    elections: named(theirs),
                    eligible_for_ms: u64::try_from(eligible_for.as_millis()).unwrap_or(u64::MAX),
                })
            })
            .collect();
        members.sort_by(|a, b| a.identity.cmp(&b.identity));
        let c = &self.config.preferences.priority;
        PriorityView {
            priority: c.default,
            elections: c.overrides.clone(),
            preempt: c.preempt,
            preempt_after_ms: u64::try_from(c.preempt_after.as_millis()).unwrap_or(u64::MAX),
            eligible: self.priority_label().is_some(),
            holding_back: self.preferred.holding,
            preemptions: self.preferred.preemptions,
            members,
        }
    }

    /// Time each member's eligibility: since when it has been seen with
    /// its priority label as it is, without a break.
    fn time_eligibility(&mut self, peers: &[Peer], now: Instant) {
        let labels: HashMap<&str, (String, Instant)> = peers
            .iter()
            .filter_map(|p| {
                let label = p.priorities.as_ref()?.encode();
                Some((p.identity.as_str(), (label, p.labels_at.min(now))))
            })
            .collect();
        // A break (not live, label gone or changed) starts the clock anew.
        self.preferred
            .since
            .retain(|id, (label, _)| labels.get(id.as_str()).map(|(l, _)| l) == Some(label));
        // Seen eligible since its label was learned as it is, when that
        // was after the last round (a member is learned between rounds);
        // else from now: it may have been gone in between.
        let timed_at = self.preferred.timed_at.replace(now);
        for (id, (label, at)) in &labels {
            let at = match timed_at {
                Some(t) if *at <= t => now,
                _ => *at,
            };
            self.preferred
                .since
                .entry((*id).to_owned())
                .or_insert_with(|| (label.clone(), at));
        }
    }

    async fn prefer_leaders(&mut self, peers: &[Peer]) {
        let now = self.clock.now();
        self.time_eligibility(peers, now);
        self.preferred.due = None;
        if !self.config.preferences.priority.preempt || self.priority_label().is_none() {
            return;
        }
        let mut due: Option<Instant> = None;
        // A few per R, as balance moves them, however early a round comes.
        let mut moves = match self.within_r(self.preferred.moved_at, now) {
            true => 0,
            false => super::moves_per_round(self.elections.len()),
        };
        for i in 0..self.elections.len() {
            let name = self.elections[i].name.clone();
            if self.elections[i].state.borrow().role != Role::Leader {
                continue;
            }
            let Some(index) = self.index_of(&name) else {
                continue;
            };
            let contenders: Vec<Contender<'_>> = peers
                .iter()
                .filter_map(|p| {
                    let (_, since) = self.preferred.since.get(&p.identity)?;
                    Some(Contender {
                        identity: &p.identity,
                        priority: p.priorities.as_ref()?.of(index),
                        eligible_since: *since,
                    })
                })
                .collect();
            let mine = self.config.preferences.priority.of(&name);
            let after = self.config.preferences.priority.preempt_after;
            let last = self.preferred.last.get(&name).copied();
            let Some(to) = successor(mine, &contenders, now, after, last).map(str::to_owned) else {
                if let Some(at) = next_due(mine, &contenders, now, after, last) {
                    due = Some(due.map_or(at, |d| d.min(at)));
                }
                continue;
            };
            if moves == 0 {
                // The rest next round: a few per R, as balance moves them.
                break;
            }
            moves -= 1;
            self.preferred.moved_at = Some(now);
            let theirs = contenders
                .iter()
                .find(|c| c.identity == to)
                .map(|c| c.priority);
            tracing::info!(election = %name, identity = %self.config.identity, priority = mine, to = %to, their_priority = ?theirs, "preempting: handing the election to a member of a higher priority");
            self.preferred.last.insert(name.clone(), now);
            self.hand_preferred(i, to).await;
            self.observer.preempted(&name);
            self.preferred.preemptions += 1;
        }
        self.preferred.last.retain(|_, at| {
            now.saturating_since(*at) < self.config.preferences.priority.preempt_after
        });
        self.preferred.due = due;
    }

    /// The planned handover of election `i` to `to`: the election that
    /// runs the job goes as a resign does (its job stopped first).
    async fn hand_preferred(&self, i: usize, to: String) {
        let election = &self.elections[i];
        if let Some(steering) = &election.steering {
            steering.hand_over(AfterRelease::Follow, Some(to)).await;
            return;
        }
        let Some(resign) = &self.config.preferences.resign else {
            return;
        };
        // The answer is not awaited: the job may take its shutdown grace.
        let (done, _) = oneshot::channel();
        let request = ResignRequest {
            election: election.name.clone(),
            to: Some(to),
            done,
        };
        let _ = resign.send(request).await;
    }
}
