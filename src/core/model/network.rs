//! The hostile network: what a follower may be told at any time.

use super::{ELECTIONS, NodeModel, World};
use crate::core::hints::{Hint, LeaseEvent};

impl NodeModel {
    /// The hint of `kind` daemon `receiver` may be told now of election
    /// `e`, if there is one.
    pub(super) fn forged_event(
        &self,
        w: &World,
        receiver: usize,
        e: usize,
        kind: Forged,
    ) -> Option<Hint> {
        let at = self.local(receiver, w.t);
        let name = ELECTIONS[e];
        let live = w.records.get(name).map(|l| l.rvn.clone());
        let me = self.bounds.identities[receiver].to_owned();
        let event = match kind {
            Forged::RenewedLive | Forged::RenewedMadeUp => LeaseEvent::Renewed {
                election: name.into(),
                holder: me,
                rvn: if kind == Forged::RenewedLive {
                    live?
                } else {
                    "forged".into()
                },
                fencing_token: u64::MAX,
                lease_ms: 1,
            },
            Forged::ReleasedLive | Forged::ReleasedToReceiver => LeaseEvent::Released {
                election: name.into(),
                rvn: live?,
                fencing_token: u64::MAX,
                successor: (kind == Forged::ReleasedToReceiver).then_some(me),
            },
            Forged::NotLeader => LeaseEvent::NotLeader {
                election: name.into(),
            },
            Forged::Ended => return Some(Hint::Ended),
            Forged::Replay(m) => w.daemons[m].told.get(e)?.clone()?,
        };
        Some(Hint::Event {
            at,
            event: Box::new(event),
        })
    }
}

/// A hint the network delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Forged {
    /// `renewed` naming the store's live rvn, promising a 1 ms lease.
    RenewedLive,
    /// `renewed` naming an rvn nobody wrote.
    RenewedMadeUp,
    /// `released` naming the live rvn, handed to nobody.
    ReleasedLive,
    /// `released` naming the live rvn, handed to the receiver.
    ReleasedToReceiver,
    /// `not_leader`.
    NotLeader,
    /// The stream ends.
    Ended,
    /// The last event daemon `n` told of the election, again.
    Replay(usize),
}
