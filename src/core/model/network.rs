//! The hostile network: what a follower may be told at any time.

use super::{ELECTION, ElectionModel, Forged, World};
use crate::core::hints::{Hint, LeaseEvent};

impl ElectionModel {
    pub(super) fn forged_event(&self, w: &World, receiver: usize, kind: Forged) -> Option<Hint> {
        let at = self.local(receiver, w.t);
        let live = w.record.as_ref().map(|l| l.rvn.clone());
        let me = self.bounds.identities[receiver].to_owned();
        let event = match kind {
            Forged::RenewedLive | Forged::RenewedMadeUp => LeaseEvent::Renewed {
                election: ELECTION.into(),
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
                election: ELECTION.into(),
                rvn: live?,
                fencing_token: u64::MAX,
                successor: (kind == Forged::ReleasedToReceiver).then_some(me),
            },
            Forged::NotLeader => LeaseEvent::NotLeader {
                election: ELECTION.into(),
            },
            Forged::Ended => return Some(Hint::Ended),
            Forged::Replay(m) => w.nodes[m].told.clone()?,
        };
        Some(Hint::Event {
            at,
            event: Box::new(event),
        })
    }
}
