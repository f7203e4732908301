//! Members through sessions: with sessions, a daemon's session is its
//! member record. Its labels say how many elections the daemon leads and
//! which set it campaigns for; they ride on the session's renewals (no
//! write of their own) and on its daemon's stream.
//!
//! Members are found without reading every record: a daemon knows the
//! sessions of the daemons whose elections it follows (it times them
//! anyway), and those of the daemons that watch its stream (each names its
//! session when it opens the stream; anyone can name anything there, so a
//! name counts once a read of the store shows that session held). A member is live while an `rvn` of
//! its session was learned (a read, or its stream) within a lease
//! stretched by the clock drift, the takeover rule's wait; its stream is
//! watched, so that a member leading nothing costs no reads either. Only a
//! member whose session nobody told of lately is read, once a round, until
//! it is live again or plainly gone. As before, membership is advice: a
//! wrong count costs balance, never safety.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio::sync::watch;

use super::priority::PRIORITY_LABEL;
use super::{LED_LABEL, Membership, Peer, SET_LABEL, Worker};
use tokio_util::sync::CancellationToken;

use super::priority::sit_out_asked;
use crate::clock::{Clock, Instant};
use crate::driver::Sessions;
use crate::driver::SitOuts;
use crate::election::{KnownSession, takeover_wait};
use crate::lease::{READ_MANY_LIMIT, Record, session_owner};
use crate::watch::mux::Mux;
use crate::watch::watchers::Watchers;

/// What the balancer needs of the daemon's sessions.
pub struct SessionMembers {
    /// What the daemon's node knows of the sessions (its own elections'
    /// reads, and the streams).
    pub sessions: Sessions,
    /// The labels of the daemon's own session.
    pub labels: watch::Sender<BTreeMap<String, String>>,
    /// The daemon's streams of other daemons: members are watched there.
    pub mux: Mux,
    /// The sessions named by the daemons watching this one: looked up in
    /// the store before they count.
    pub watchers: Watchers,
}

/// Names of watchers looked up per round, at most: the streams that can be
/// open at once (half the HTTP connection limit) in a few requests.
const LOOK_UPS_PER_ROUND: usize = 3 * READ_MANY_LIMIT;

/// Looks at the members per R at most, and after a naming while nothing
/// was found.
const LOOKS: u32 = 8;

/// What the balancer waits for between rounds.
pub(super) struct Waits {
    /// The sit-outs asked (a sit-out takes our priority label away at once).
    sit_outs: Option<watch::Receiver<SitOuts>>,
    /// The names of the daemons watching ours (with sessions).
    watchers: Option<Watchers>,
    /// No look before this; looks left after the last naming.
    next_look: Instant,
    looks: u32,
}

impl Waits {
    pub(super) fn new(
        membership: &Membership,
        sit_outs: Option<watch::Receiver<SitOuts>>,
        now: Instant,
    ) -> Waits {
        let watchers = match membership {
            Membership::Sessions(members) => Some(members.watchers.clone()),
            Membership::Records => None,
        };
        Waits {
            sit_outs,
            watchers,
            next_look: now,
            looks: 0,
        }
    }
}

/// Resolves once a daemon watching ours named its session (true), or at
/// `next_look` while `again` (false); not before `next_look` either way (a
/// flood of streams wakes the balancer a few times an R at most); never
/// without `watchers` (no sessions).
async fn named(
    watchers: Option<&Watchers>,
    clock: &Clock,
    next_look: Instant,
    again: bool,
) -> bool {
    let Some(w) = watchers else {
        return std::future::pending().await;
    };
    let named = tokio::select! {
        () = w.named() => true,
        () = clock.sleep_until(next_look), if again => false,
    };
    clock.sleep_until(next_look).await;
    named
}

enum Wake {
    Stop,
    Round,
    /// A look at the members; true: a daemon watching ours named its
    /// session.
    Look(bool),
}

/// The members' streams the balancer keeps open: the address of each
/// session's daemon, watched through the mux.
#[derive(Default)]
pub(super) struct Watched(HashMap<String, String>);

impl Worker {
    /// Our session's labels: what we lead and which set, or nothing while
    /// we are no member (the app check fails).
    pub(super) fn label_session(&mut self, members: &SessionMembers, led: Option<usize>) {
        let labels = match led {
            Some(led) => self.member_labels(led),
            None => BTreeMap::new(),
        };
        members.labels.send_if_modified(|l| {
            let changed = *l != labels;
            *l = labels;
            changed
        });
    }

    /// Wait for the next round, due at `next` (or sooner, see
    /// [`Worker::look`]); false once `stop` is asked.
    pub(super) async fn between_rounds(
        &mut self,
        stop: &CancellationToken,
        mut next: Instant,
        waits: &mut Waits,
    ) -> bool {
        loop {
            let wake = tokio::select! {
                () = stop.cancelled() => Wake::Stop,
                () = self.clock.sleep_until(next) => Wake::Round,
                Some(()) = sit_out_asked(&mut waits.sit_outs) => Wake::Round,
                named = named(waits.watchers.as_ref(), &self.clock, waits.next_look, waits.looks > 0) => Wake::Look(named),
            };
            let named = match wake {
                Wake::Stop => return false,
                Wake::Round => return true,
                Wake::Look(named) => named,
            };
            // A member named moments ago may not have written its labels
            // yet: looked at again a few times within an R.
            waits.looks = if named { LOOKS } else { waits.looks - 1 };
            if let Some(due) = self.look().await {
                next = next.min(due);
                waits.looks = 0;
            }
            waits.next_look = self.clock.now() + self.config.renew_interval / LOOKS;
        }
    }

    /// Between rounds: look up the sessions that the daemons watching ours
    /// named since, and watch the streams of those that are members, so
    /// that a member is learned (and its eligibility dated) when it
    /// starts, not at our next round. Nothing is moved here; returns when
    /// a round should come to hand an election to a newly learned member
    /// of a priority, `preempt_after` after it was learned (before the
    /// next R when that is shorter).
    pub(super) async fn look(&mut self) -> Option<Instant> {
        let membership = self.membership.clone();
        let Membership::Sessions(members) = membership.as_ref() else {
            return None;
        };
        let mut watched = std::mem::take(&mut self.watched);
        let peers = self.session_peers(members, &mut watched, false).await;
        self.watched = watched;
        let after = self.config.preferences.priority.preempt_after;
        peers
            .iter()
            .filter(|p| p.priorities.is_some() && !self.preferred.knows(&p.identity))
            .map(|p| p.labels_at + after)
            .min()
    }

    /// The live members of our set other than us, among the sessions the
    /// daemon knows; reads those nobody told of lately (when `reread`),
    /// and watches the streams of the live ones.
    pub(super) async fn session_peers(
        &mut self,
        members: &SessionMembers,
        watched: &mut Watched,
        reread: bool,
    ) -> Vec<Peer> {
        self.look_up_watchers(members).await;
        let mut peers = Vec::new();
        let mut addresses = HashMap::new();
        for known in members.sessions.sessions().await {
            let Some(owner) = session_owner(&known.key).map(str::to_owned) else {
                continue;
            };
            if owner == self.config.identity {
                continue;
            }
            let known = match reread && self.stale(&known) {
                true => self.reread(members, known).await,
                false => known,
            };
            let Some(member) = self.member(&known) else {
                continue;
            };
            if let Some(address) = member.address {
                addresses.insert(known.key.clone(), address);
            }
            if member.same_set
                && let Some(led) = member.led
            {
                peers.push(Peer {
                    identity: owner,
                    led,
                    priorities: member.priorities,
                    gone_at: member.gone_at,
                    labels_at: member.labels_at,
                });
            }
        }
        watched.0.retain(|key, _| {
            let kept = addresses.contains_key(key);
            if !kept {
                members.mux.aim_member(key, None);
            }
            kept
        });
        for (key, address) in addresses {
            if watched.0.get(&key) != Some(&address) {
                members.mux.aim_member(&key, Some(address.clone()));
                watched.0.insert(key, address);
            }
        }
        peers
    }

    /// Look up in the store the sessions that the daemons watching ours
    /// named and that we do not know yet: a member leading nothing is found
    /// so, without a Scan. A name counts only once the store shows its
    /// session held; each stream's name is looked up once.
    async fn look_up_watchers(&self, members: &SessionMembers) {
        let sessions: HashSet<String> = members
            .sessions
            .sessions()
            .await
            .into_iter()
            .map(|k| k.key)
            .collect();
        let (known, names): (Vec<String>, Vec<String>) = members
            .watchers
            .unchecked(LOOK_UPS_PER_ROUND)
            .into_iter()
            .partition(|k| sessions.contains(k));
        members.watchers.checked(&known);
        for keys in names.chunks(READ_MANY_LIMIT) {
            match members.sessions.look_up(keys, self.budget()).await {
                Ok(_) => members.watchers.checked(keys),
                Err(e) => {
                    tracing::debug!(error = %e, "balance: cannot look up the sessions of the daemons watching this one");
                    return;
                }
            }
        }
    }

    /// The takeover rule's wait for our lease timing.
    fn member_wait(&self) -> std::time::Duration {
        let lease_ms = u64::try_from(self.config.lease_duration.as_millis()).unwrap_or(u64::MAX);
        takeover_wait(lease_ms, self.config.max_clock_drift)
    }

    /// Whether `known` is worth a read: nothing learned of it yet, or its
    /// latest `rvn` is almost too old to count it live (a stream tells of
    /// one every R, so a session whose stream flows is never read here),
    /// unless it has been silent so long that it is plainly gone.
    fn stale(&self, known: &KnownSession) -> bool {
        if matches!(&known.record, Some(Record::Valid(l)) if l.holder.is_none()) {
            return false; // ended: nothing more to learn
        }
        let now = self.clock.now();
        let wait = self.member_wait();
        match &known.latest {
            None => known.record.is_none(),
            Some((_, at)) => {
                let since = now.saturating_since(*at);
                since + self.config.retry_interval >= wait && since < wait * 3
            }
        }
    }

    async fn reread(&self, members: &SessionMembers, known: KnownSession) -> KnownSession {
        let budget = self.budget();
        if let Err(e) = members.sessions.read(&known.key, budget).await {
            tracing::debug!(session = %known.key, error = %e, "balance: cannot read a member's session");
        }
        members.sessions.session(&known.key).await.unwrap_or(known)
    }

    /// What `known` says of its daemon as a member, if it is live.
    fn member(&self, known: &KnownSession) -> Option<Member> {
        let record = match &known.record {
            Some(Record::Valid(l)) if l.holder.is_none() => return None,
            Some(Record::Valid(l)) => Some(l),
            _ => None,
        };
        let (_, at) = known.latest.as_ref()?;
        let gone_at = *at + self.member_wait();
        if self.clock.now() >= gone_at {
            return None;
        }
        let meta = record.and_then(|l| l.holder_meta.as_ref());
        let labels = known
            .told_labels
            .as_ref()
            .or_else(|| meta.map(|m| &m.labels))?;
        Some(Member {
            address: meta.and_then(|m| m.address.clone()),
            same_set: labels.get(SET_LABEL) == Some(&self.set),
            led: labels.get(LED_LABEL).and_then(|v| v.parse().ok()),
            priorities: Self::parse_priorities(labels.get(PRIORITY_LABEL)),
            gone_at,
            labels_at: known.labels_at.unwrap_or(*at).min(self.clock.now()),
        })
    }
}

/// A live member as its session says.
struct Member {
    address: Option<String>,
    same_set: bool,
    led: Option<usize>,
    priorities: Option<crate::core::priority::Priorities>,
    gone_at: crate::clock::Instant,
    labels_at: crate::clock::Instant,
}
