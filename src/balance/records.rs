//! Members through member records, without sessions: each member writes
//! `#member/IDENTITY` every R with its labels, and reads every member's
//! record (one scan of the table) to count the live ones.

use super::{LED_LABEL, Peer, SET_LABEL, Worker, condition_over, priority};
use crate::election;
use crate::lease::{Condition, HolderMeta, Lease, Record, WriteOutcome, member_key};

/// A member record as last read, and what we make of it.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// Times its rvn by the takeover rule: a member whose record stayed
    /// unchanged as long as a lease would is gone.
    timer: election::TakeoverTimer,
    /// The rvn first read, until the record changes.
    first_rvn: Option<String>,
}

impl Worker {
    /// Write our member record: renew it, or take it over from an earlier
    /// run of ours (same identity), or create it.
    pub(super) async fn heartbeat(&mut self, led: usize) {
        let labels = self.member_labels(led);
        let record = Lease::stamped(
            &self.key,
            &self.config.identity,
            0,
            self.config.lease_duration.as_millis() as u64,
            self.joined_ms,
            Some(HolderMeta {
                address: self.config.address.clone(),
                labels,
                slots: None,
            }),
        );
        let condition = match &self.own {
            Some(own) => Condition::HeldBy {
                rvn: own.rvn.clone(),
                holder: self.config.identity.clone(),
            },
            None => match self.read_own().await {
                Ok(Record::UnknownFormat(u)) => {
                    // A later release's record under our identity: not ours
                    // to overwrite. Without it we are simply no member.
                    self.failed(
                        "write our member record",
                        &format!("it has format {}, which this build does not know", u.format),
                    );
                    return;
                }
                Ok(current) => condition_over(&current),
                Err(e) => {
                    self.failed("read our member record", &e.to_string());
                    return;
                }
            },
        };
        let start = self.clock.now();
        let res = self.store.write(&record, &condition, self.budget()).await;
        self.count(
            "write_member",
            start,
            res.as_ref().map(|o| *o == WriteOutcome::Applied),
        );
        match res {
            Ok(WriteOutcome::Applied) => {
                self.own = Some(record);
                self.succeeded();
            }
            // Written by someone else since (another daemon under our
            // identity, or an old answer): read it again next round.
            Ok(WriteOutcome::ConditionFailed { .. }) => self.own = None,
            Err(e) => self.failed("write our member record", &e.to_string()),
        }
    }

    /// Our member record as the store holds it.
    pub(super) async fn read_own(&self) -> Result<Record, crate::lease::StoreError> {
        let start = self.clock.now();
        let res = self.store.read(&self.key, self.budget()).await;
        self.count("read_member", start, res.as_ref().map(|_| true));
        res
    }

    /// The live members of our set other than us, from the records just
    /// read.
    pub(super) fn peers(&mut self, records: Vec<Lease>) -> Vec<Peer> {
        let now = self.clock.now();
        let mut peers = Vec::new();
        let mut present = Vec::new();
        for record in records {
            let Some(holder) = record.holder.clone() else {
                continue; // released: that member left
            };
            if holder == self.config.identity || member_key(&holder) != record.election {
                continue;
            }
            present.push(holder.clone());
            let drift = self.config.max_clock_drift;
            let seen = self.seen.entry(holder.clone()).or_insert_with(|| Seen {
                timer: election::TakeoverTimer::new(drift),
                first_rvn: Some(record.rvn.clone()),
            });
            // Counted only once its record was seen to change: a record
            // left behind by a daemon that died long ago never changes.
            if seen.first_rvn.as_ref().is_some_and(|r| *r != record.rvn) {
                seen.first_rvn = None;
            }
            let gone_at = seen.timer.observe(&record.rvn, record.lease_ms, now, None);
            let live = seen.first_rvn.is_none() && now < gone_at;
            let labels = record.holder_meta.as_ref().map(|m| &m.labels);
            let same_set = labels.and_then(|l| l.get(SET_LABEL)) == Some(&self.set);
            let led = labels
                .and_then(|l| l.get(LED_LABEL))
                .and_then(|v| v.parse().ok());
            let priorities =
                Self::parse_priorities(labels.and_then(|l| l.get(priority::PRIORITY_LABEL)));
            if let (true, true, Some(led)) = (live, same_set, led) {
                peers.push(Peer {
                    identity: holder,
                    led,
                    priorities,
                    gone_at,
                    labels_at: now,
                });
            }
        }
        self.seen.retain(|identity, _| present.contains(identity));
        peers
    }
}
