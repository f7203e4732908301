//! Balance: daemons that campaign for the same elections share them.
//!
//! With `balance = true` every daemon keeps a member record in the lease
//! store, under [`member_key`] (never an election's name), written every R
//! like a lease. Its labels say how many elections the daemon leads and
//! which set it campaigns for. Every R each daemon reads the member records
//! and counts the live members of its own set, K (itself included): a
//! member is live once its record was seen to change, and until it stays
//! unchanged for its lease stretched by the clock drift, on our clock (the
//! takeover rule; wall clocks are never compared). Its fair share of the N
//! elections is ceil(N/K).
//!
//! A daemon above its share hands surplus elections to members below
//! theirs, at most [`moves_per_round`] per R. Each move is an ordinary
//! handover (a release naming the successor, then the successor's
//! conditional takeover), so no move can make two leaders. A daemon below
//! its share does nothing special: its engines take what is released or
//! expired, as always.
//!
//! Membership is advice: a wrong count costs balance, never safety.
//!
//! Without sessions the member records are read and written as in
//! [`records`]; with sessions there is no member record: the session is
//! ([`sessions`]). Preferred leaders ride on the same membership
//! ([`priority`]). `tests.rs`: daemons balancing in one process, on the
//! memory store, in paused time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app_check::Verdict;
use crate::clock::{self, Clock, Instant};
use crate::driver::Steering;
use crate::driver::board::StateView;
use crate::election::{AfterRelease, Observer, Outcome, Role};
use crate::lease::{Condition, Lease, LeaseStore, Record, WriteOutcome, member_key};

mod priority;
mod records;
mod sessions;
pub use priority::{MemberPriority, PRIORITY_LABEL, Preferences, PriorityView, holding_gate};
pub use sessions::SessionMembers;

/// Label of a member record: how many elections the member leads.
const LED_LABEL: &str = "led";
/// Label of a member record: a digest of the set of elections it campaigns
/// for ([`set_digest`]); only members of the same set share.
pub const SET_LABEL: &str = crate::core::node::SET_LABEL;

/// How the members of a set know of each other.
pub enum Membership {
    /// Each member writes a member record every R and reads every member's
    /// (one scan of the table).
    Records,
    /// Each member's session is its member record (see [`sessions`]).
    Sessions(SessionMembers),
}

/// The `election` label of the member records' store requests in metrics
/// (no election can be named so).
pub const MEMBER_LABEL: &str = "#member";

/// What the balancer needs to know of this daemon.
#[derive(Debug, Clone)]
pub struct BalanceConfig {
    /// Our identity: the member record's holder.
    pub identity: String,
    /// L: the member record's lease.
    pub lease_duration: Duration,
    /// R: how often the member record is written and the others read.
    pub renew_interval: Duration,
    /// P: how long a handed-over election may take to reach its successor.
    pub retry_interval: Duration,
    /// D: clock drift tolerated when judging a member dead.
    pub max_clock_drift: f64,
    /// Our advertised HTTP address, for humans reading the record.
    pub address: Option<String>,
    /// Whether to hand surplus elections over (`balance`); without it the
    /// member layer serves preferred leaders only.
    pub share: bool,
    /// Preferred leaders: our priorities and how to act on them.
    pub preferences: Preferences,
}

/// One election as the balancer sees it.
#[derive(Debug, Clone)]
pub struct Elected {
    /// Its name.
    pub name: String,
    /// Its engine's state.
    pub state: StateView,
    /// How to hand it over; `None`: never moved (the election whose
    /// leadership runs the daemon's job moves only by resign or shutdown).
    pub steering: Option<Steering>,
}

/// Where this daemon stands, for `/status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Share {
    /// Elections this daemon leads.
    pub led: usize,
    /// ceil(elections / members): what it aims to lead.
    pub fair_share: usize,
    /// Live members of its set, itself included.
    pub members: usize,
    /// Elections it campaigns for.
    pub elections: usize,
}

/// A running balancer.
#[derive(Debug)]
pub struct Balancer {
    /// Its latest view.
    pub share: watch::Receiver<Share>,
    /// What it knows of priorities (preferred leaders).
    pub priorities: watch::Receiver<PriorityView>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Balancer {
    /// Stop moving elections (at once, without waiting).
    pub fn halt(&self) {
        self.stop.cancel();
    }

    /// Stop, and give the member record up so the others count one member
    /// less at their next read instead of one lease later.
    pub async fn leave(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// How many elections a daemon hands over per R, at most: a tenth of them,
/// at least 4. Gradual enough that a join or a return moves a few
/// leaderships at a time, quick enough to settle within a minute.
pub fn moves_per_round(elections: usize) -> usize {
    elections.div_ceil(10).max(4)
}

/// ceil(n / k), for k ≥ 1.
pub fn fair_share(elections: usize, members: usize) -> usize {
    elections.div_ceil(members.max(1))
}

/// How many elections above its fair share a member of `members` may
/// lead without handing any over: as many as leave the members below
/// room to be within 1 % of even (n/k), were every other member that far
/// above. None while a share is under 100 elections for each other
/// member. A resign or a failover that leaves one member an election
/// over its share then moves nothing more: each move is a leadership
/// change, a job stopped here and started there.
pub fn tolerance(elections: usize, members: usize) -> usize {
    let (n, k) = (elections as u128, members as u128);
    if k < 2 {
        return 0;
    }
    // The most each of k-1 members may lead so that the rest is at least
    // 99 % of n/k: (n - 0.99·n/k) / (k-1).
    let most = (100 * n * k - 99 * n) / (100 * k * (k - 1));
    usize::try_from(most)
        .unwrap_or(usize::MAX)
        .saturating_sub(fair_share(elections, members))
}

/// A stable digest of a set of election names (FNV-1a over the sorted
/// names): the same on every daemon and every build, unlike std's hasher.
pub fn set_digest<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = names.into_iter().collect();
    names.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in names {
        for byte in name.bytes().chain([b'\n']) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// Start balancing `elections` (every election this daemon campaigns for).
/// `gate` is the app check's verdict: a daemon whose app fails is no
/// member (it could not take what it is given).
pub fn spawn(
    store: Arc<dyn LeaseStore>,
    config: BalanceConfig,
    elections: Vec<Elected>,
    clock: Clock,
    gate: Option<watch::Receiver<Verdict>>,
    membership: Membership,
    observer: Arc<dyn Observer>,
) -> Balancer {
    let set = set_digest(elections.iter().map(|e| e.name.as_str()));
    let mut sorted: Vec<String> = elections.iter().map(|e| e.name.clone()).collect();
    sorted.sort_unstable();
    let (share_tx, share) = watch::channel(Share {
        elections: elections.len(),
        members: 1,
        fair_share: elections.len(),
        led: 0,
    });
    let (priorities_tx, priorities) = watch::channel(PriorityView::default());
    let stop = CancellationToken::new();
    let worker = Worker {
        store,
        key: member_key(&config.identity),
        config,
        set,
        sorted,
        elections,
        clock,
        gate,
        share: share_tx,
        own: None,
        joined_ms: clock::unix_ms(),
        seen: HashMap::new(),
        gifts: Vec::new(),
        moved_at: None,
        last_error: None,
        membership: Arc::new(membership),
        watched: sessions::Watched::default(),
        observer,
        preferred: priority::Preferred::default(),
        priorities: priorities_tx,
    };
    let task = tokio::spawn(worker.run(stop.clone()));
    Balancer {
        share,
        priorities,
        stop,
        task,
    }
}

/// A live member of our set other than us.
#[derive(Debug, Clone)]
struct Peer {
    identity: String,
    led: usize,
    /// Its priorities, while it publishes them (it is eligible).
    priorities: Option<crate::core::priority::Priorities>,
    /// When it stops counting as live unless we hear of it again.
    gone_at: Instant,
    /// When its labels were learned as they are (our clock): its
    /// eligibility counts from then.
    labels_at: Instant,
}

/// An election handed to a peer: counted as on its way to it until this
/// daemon's own follower of the election sees the peer lead it, or the
/// peer's label has had the time to count it.
struct Gift {
    to: String,
    /// Its place in [`Worker::elections`].
    election: usize,
    at: Instant,
}

struct Worker {
    store: Arc<dyn LeaseStore>,
    config: BalanceConfig,
    key: String,
    set: String,
    /// The names of our elections, sorted: a priority label names an
    /// election by its place here.
    sorted: Vec<String>,
    elections: Vec<Elected>,
    clock: Clock,
    gate: Option<watch::Receiver<Verdict>>,
    share: watch::Sender<Share>,
    /// Our member record as last written.
    own: Option<Lease>,
    joined_ms: u64,
    seen: HashMap<String, records::Seen>,
    /// Elections handed to peers lately, not yet seen led by them; when
    /// surplus was last handed over.
    gifts: Vec<Gift>,
    moved_at: Option<Instant>,
    /// The last store error, logged once per change.
    last_error: Option<String>,
    membership: Arc<Membership>,
    /// With sessions: the members' streams watched.
    watched: sessions::Watched,
    /// Counts the store requests of the member records.
    observer: Arc<dyn Observer>,
    /// Preferred leaders: the members' eligibility, the last preemptions.
    preferred: priority::Preferred,
    /// What `/status` shows of them.
    priorities: watch::Sender<PriorityView>,
}

impl Worker {
    async fn run(mut self, stop: CancellationToken) {
        tracing::info!(identity = %self.config.identity, elections = self.elections.len(), share = self.config.share, priority = self.config.preferences.priority.default, "balancing the elections with the other members of this set");
        let mut waits = sessions::Waits::new(
            &self.membership,
            self.config.preferences.sit_outs.clone(),
            self.clock.now(),
        );
        let every = self.config.renew_interval;
        loop {
            let started = self.clock.now();
            self.round().await;
            // Rounds start R apart: a long one (a thousand handovers, on a
            // busy store) does not stretch the period to R plus its
            // length. After a round longer than R, a quarter of R passes
            // before the next.
            let mut next = (started + every).max(self.clock.now() + every / 4);
            if let Some(due) = self.preferred.due {
                next = next.min(due);
            }
            if !self.between_rounds(&stop, next, &mut waits).await {
                self.leave().await;
                return;
            }
        }
    }

    fn led(&self) -> usize {
        self.elections
            .iter()
            .filter(|e| matches!(e.state.borrow().role, Role::Leader | Role::Confirming))
            .count()
    }

    /// How many of our elections each other daemon leads, as our own
    /// followers last saw them.
    fn led_as_seen(&self) -> HashMap<String, usize> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        for e in &self.elections {
            let state = e.state.borrow();
            if let Some(leader) = &state.leader
                && *leader != self.config.identity
            {
                *seen.entry(leader.clone()).or_default() += 1;
            }
        }
        seen
    }

    fn app_passes(&self) -> bool {
        self.gate
            .as_ref()
            .is_none_or(|g| *g.borrow() == Verdict::Pass)
    }

    /// Whether the last round that moved elections (at `moved`) began
    /// less than an R ago: rounds come early for preferred leaders, and
    /// move nothing more within that R.
    fn within_r(&self, moved: Option<Instant>, now: Instant) -> bool {
        moved.is_some_and(|at| now.saturating_since(at) < self.config.renew_interval * 9 / 10)
    }

    fn budget(&self) -> Duration {
        self.config.renew_interval
    }

    /// One R: write our record, read everyone's, move surplus elections.
    async fn round(&mut self) {
        let led = self.led();
        let member = self.app_passes();
        let peers = match self.membership.clone().as_ref() {
            Membership::Records => {
                if member {
                    self.heartbeat(led).await;
                } else {
                    self.leave().await;
                }
                let start = self.clock.now();
                let res = self.store.members(self.budget()).await;
                self.count("read_members", start, res.as_ref().map(|_| true));
                let records = match res {
                    Ok(records) => records,
                    Err(e) => {
                        self.failed("read the member records", &e.to_string());
                        return;
                    }
                };
                self.peers(records)
            }
            Membership::Sessions(members) => {
                self.label_session(members, member.then_some(led));
                let mut watched = std::mem::take(&mut self.watched);
                let peers = self.session_peers(members, &mut watched, true).await;
                self.watched = watched;
                peers
            }
        };
        let k = 1 + peers.len();
        let share = Share {
            led,
            fair_share: fair_share(self.elections.len(), k),
            members: k,
            elections: self.elections.len(),
        };
        let before = self.share.borrow().clone();
        if (before.members, before.fair_share) != (share.members, share.fair_share) {
            tracing::info!(identity = %self.config.identity, members = share.members, fair_share = share.fair_share, led, "balance: members of this set changed");
        }
        self.share.send_replace(share.clone());
        self.prefer(&peers).await;
        let now = self.clock.now();
        let moved_lately = self.within_r(self.moved_at, now);
        let over = share.fair_share + tolerance(share.elections, share.members);
        if self.config.share && member && led > over && !moved_lately {
            self.moved_at = Some(now);
            self.hand_surplus(&share, &peers).await;
        }
    }

    fn failed(&mut self, what: &str, error: &str) {
        if self.last_error.as_deref() != Some(error) {
            tracing::warn!(identity = %self.config.identity, error, "balance: cannot {what} (logged again only when the error changes)");
            self.last_error = Some(error.to_owned());
        }
    }

    fn succeeded(&mut self) {
        if self.last_error.take().is_some() {
            tracing::info!(identity = %self.config.identity, "balance: the member records can be read and written again");
        }
    }

    /// Count a store request of the member records for metrics, under the
    /// election label [`MEMBER_LABEL`].
    fn count(
        &self,
        op: &'static str,
        start: Instant,
        res: Result<bool, &crate::lease::StoreError>,
    ) {
        let outcome = match res {
            Ok(true) => Outcome::Ok,
            Ok(false) => Outcome::Lost,
            Err(e) => Outcome::Failed(e),
        };
        let took = self.clock.now() - start;
        self.observer.store_request(MEMBER_LABEL, op, took, outcome);
    }

    /// Give our member record up: the others stop counting us (with
    /// sessions, the session ends when the daemon stops).
    async fn leave(&mut self) {
        if let Membership::Sessions(members) = self.membership.clone().as_ref() {
            self.label_session(members, None);
            return;
        }
        let Some(own) = self.own.take() else {
            return;
        };
        let condition = Condition::HeldBy {
            rvn: own.rvn.clone(),
            holder: self.config.identity.clone(),
        };
        let start = self.clock.now();
        let res = self
            .store
            .write(&own.released(), &condition, self.budget())
            .await;
        self.count(
            "write_member",
            start,
            res.as_ref().map(|o| *o == WriteOutcome::Applied),
        );
        if let Err(e) = res {
            tracing::warn!(identity = %self.config.identity, error = %e, "balance: cannot release our member record; the others stop counting us one lease from now");
        }
    }

    /// Hand elections over to peers below their share, a few per round.
    async fn hand_surplus(&mut self, share: &Share, peers: &[Peer]) {
        let now = self.clock.now();
        // A gift shows in the receiver's label from its next write on,
        // within R + P of the handover (that write is a session renew, told
        // on its stream, with sessions; a member record's, read next round,
        // without).
        let settle = match self.membership.as_ref() {
            Membership::Records => self.config.renew_interval + self.config.retry_interval,
            Membership::Sessions(_) => self.config.renew_interval * 2 + self.config.retry_interval,
        };
        let elections = &self.elections;
        self.gifts.retain(|g| {
            now - g.at < settle
                && elections[g.election].state.borrow().leader.as_deref() != Some(&g.to)
        });
        // What a peer leads: its label, or more where our own followers
        // already see it lead more (a label is up to R + P old; a follower
        // reads an election handed over within P of its take).
        let seen = self.led_as_seen();
        let led = |p: &Peer| {
            p.led
                .max(seen.get(p.identity.as_str()).copied().unwrap_or(0))
        };
        // Members above their share (and its tolerance) give at once: each
        // gives a receiver only its part of what the receiver lacks.
        let over = share.fair_share + tolerance(share.elections, share.members);
        let givers = 1 + peers.iter().filter(|p| led(p) > over).count();
        let mut wants: Vec<(String, usize)> = peers
            .iter()
            .filter_map(|p| {
                let pending = self.gifts.iter().filter(|g| g.to == p.identity).count();
                let lacks = share.fair_share.saturating_sub(led(p) + pending);
                let part = lacks.div_ceil(givers);
                (part > 0).then(|| (p.identity.clone(), part))
            })
            .collect();
        if wants.is_empty() {
            return;
        }
        let mut movable: Vec<(usize, &Elected)> = self
            .elections
            .iter()
            .enumerate()
            .filter(|(_, e)| e.steering.is_some() && e.state.borrow().role == Role::Leader)
            .collect();
        movable.shuffle(&mut rand::rng());
        let limit = (share.led - share.fair_share).min(moves_per_round(share.elections));
        // Who gets what, first; then the handovers, several at a time.
        let mut planned: Vec<(String, usize, Steering)> = Vec::new();
        for (place, election) in movable {
            if planned.len() >= limit {
                break;
            }
            // The receiver that lacks the most, among those of the
            // highest priority for this election.
            wants.sort_by_key(|(_, left)| std::cmp::Reverse(*left));
            let index = self.index_of(&election.name);
            let Some((to, left)) = wants
                .iter_mut()
                .find(|(to, left)| *left > 0 && self.may_receive(to, index, peers))
            else {
                continue;
            };
            *left -= 1;
            let steering = election.steering.clone().expect("filtered on steering");
            planned.push((to.clone(), place, steering));
        }
        let mut moved: BTreeMap<String, usize> = BTreeMap::new();
        for (to, election) in hand_over_all(planned).await {
            *moved.entry(to.clone()).or_default() += 1;
            let at = self.clock.now();
            self.gifts.push(Gift { to, election, at });
        }
        if !moved.is_empty() {
            tracing::info!(identity = %self.config.identity, led = share.led, fair_share = share.fair_share, moved = ?moved, "balance: handed elections over to members below their share");
        }
    }
}

/// How many handovers of one round are on their way at once. A round of a
/// thousand (10,000 elections) took about 5 s one after another on
/// DynamoDB Local (2 CPUs), about 4 s 32 at a time, the rest the store's
/// own pace; all at once, a thousand writes would queue in the store's
/// client together.
const HANDOVERS_AT_ONCE: usize = 32;

/// Hand each election over to its receiver, [`HANDOVERS_AT_ONCE`] at a
/// time; the receivers of those released, with the elections' places.
async fn hand_over_all(planned: Vec<(String, usize, Steering)>) -> Vec<(String, usize)> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(planned)
        .map(|(to, place, steering)| async move {
            let released = steering
                .hand_over(AfterRelease::Follow, Some(to.clone()))
                .await;
            released.then_some((to, place))
        })
        .buffer_unordered(HANDOVERS_AT_ONCE)
        .filter_map(std::future::ready)
        .collect()
        .await
}

/// The condition to write our member record over what the store holds.
/// Nothing holds on a record of an unknown format (`Condition::holds`);
/// callers do not try.
fn condition_over(current: &Record) -> Condition {
    match current {
        Record::Absent => Condition::NotExists,
        Record::Valid(l) => Condition::RvnIs(l.rvn.clone()),
        Record::Malformed(m) => Condition::Unchanged(m.guard.clone()),
        Record::UnknownFormat(_) => Condition::NotExists,
    }
}

#[cfg(test)]
mod tests;
