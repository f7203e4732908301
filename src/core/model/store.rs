//! The model's store: the records, the requests in flight and their
//! answers, and the owners' streams telling of their sessions' writes.

use super::{ELECTIONS, NodeModel, World};
use crate::core::node::{NodeInput, RequestId};
use crate::core::record::{Condition, Lease, Record, WriteOutcome};
use crate::core::store_error::StoreError;

/// A store request in flight; `answer` once the store has processed it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // a few per state, never many
pub(super) enum Request {
    Read {
        key: String,
        answer: Option<Record>,
    },
    ReadMany {
        keys: Vec<String>,
        answer: Option<Vec<Record>>,
    },
    Write {
        lease: Lease,
        condition: Condition,
        answer: Option<WriteOutcome>,
    },
}

impl Request {
    pub(super) fn read(key: String) -> Request {
        Request::Read { key, answer: None }
    }

    pub(super) fn read_many(keys: Vec<String>) -> Request {
        Request::ReadMany { keys, answer: None }
    }

    pub(super) fn write(lease: Lease, condition: Condition) -> Request {
        Request::Write {
            lease,
            condition,
            answer: None,
        }
    }

    /// Whether the store has processed it.
    pub(super) fn served(&self) -> bool {
        match self {
            Request::Read { answer, .. } => answer.is_some(),
            Request::ReadMany { answer, .. } => answer.is_some(),
            Request::Write { answer, .. } => answer.is_some(),
        }
    }
}

impl World {
    /// What a consistent read of `key` finds now.
    pub(super) fn read(&self, key: &str) -> Record {
        self.records
            .get(key)
            .cloned()
            .map_or(Record::Absent, Record::Valid)
    }
}

impl NodeModel {
    /// The steps of daemon `n`'s requests: the store serves it (a frozen
    /// daemon's too: it hears of it once it thaws), it is answered, or
    /// its answer is lost.
    pub(super) fn request_steps(&self, w: &World, n: usize, steps: &mut Vec<super::Step>) {
        use super::Step;
        let daemon = &w.daemons[n];
        for (id, request) in &daemon.requests {
            if !request.served() {
                steps.push(Step::Store(n, id.clone(), false));
                if matches!(request, Request::Write { .. }) {
                    steps.push(Step::Store(n, id.clone(), true));
                }
            } else if !daemon.frozen {
                steps.push(Step::Answer(n, id.clone()));
            }
            if w.losses_left > 0 && !self.bounds.timely && !daemon.frozen {
                steps.push(Step::Lose(n, id.clone()));
            }
        }
    }

    /// The store processes daemon `n`'s request: a read sees the records
    /// now, a write applies if its condition holds (a failed one is
    /// answered with the record when `with_record`).
    pub(super) fn serve(
        &self,
        w: &mut World,
        n: usize,
        id: &RequestId,
        with_record: bool,
    ) -> Option<()> {
        let request = w.daemons[n].requests.get(id)?.clone();
        let served = match request {
            Request::Read { key, .. } => Request::Read {
                answer: Some(w.read(&key)),
                key,
            },
            Request::ReadMany { keys, .. } => Request::ReadMany {
                answer: Some(keys.iter().map(|k| w.read(k)).collect()),
                keys,
            },
            Request::Write {
                lease, condition, ..
            } => {
                let answer = match self.apply(w, &lease, &condition) {
                    None => WriteOutcome::Applied,
                    Some(current) => WriteOutcome::ConditionFailed {
                        current: with_record.then_some(current),
                    },
                };
                Request::Write {
                    lease,
                    condition,
                    answer: Some(answer),
                }
            }
        };
        w.daemons[n].requests.insert(id.clone(), served);
        Some(())
    }

    /// Daemon `n` gets the answer of its request `id`, or (`lost`) a
    /// timeout instead; a write that had not reached the store yet may
    /// still reach it then (a stray write).
    pub(super) fn answer(&self, w: &mut World, n: usize, id: &RequestId, lost: bool) -> Option<()> {
        let request = w.daemons[n].requests.remove(id)?;
        let timeout = StoreError::Timeout(self.cfg.renew_interval);
        let request_id = id.clone();
        let input = match request {
            Request::Read { answer, .. } => NodeInput::Read {
                request: request_id,
                record: answer.filter(|_| !lost).ok_or(timeout),
            },
            Request::ReadMany { answer, .. } => NodeInput::ReadMany {
                request: request_id,
                records: answer.filter(|_| !lost).ok_or(timeout),
            },
            Request::Write {
                lease,
                condition,
                answer,
            } => {
                if lost && answer.is_none() && w.stray.is_none() {
                    w.stray = Some((lease, condition));
                }
                NodeInput::Written {
                    request: request_id,
                    outcome: answer.filter(|_| !lost).ok_or(timeout),
                }
            }
        };
        self.feed(w, n, input);
        Some(())
    }

    /// The store applies `lease` under `condition` if it holds; else
    /// returns the record as it is. An owner's session write is told to
    /// the daemons that hear streams, as it reaches the store.
    pub(super) fn apply(
        &self,
        w: &mut World,
        lease: &Lease,
        condition: &Condition,
    ) -> Option<Record> {
        let current = w.read(&lease.election);
        if !condition.holds(&current, None) {
            return Some(current);
        }
        let election = ELECTIONS.iter().position(|e| *e == lease.election);
        if let Some(e) = election {
            self.track(w, e, lease);
        }
        w.records.insert(lease.election.clone(), lease.clone());
        if election.is_none() {
            self.tell(w, lease);
        }
        None
    }

    /// What the properties follow of election `e` as `lease` is written.
    fn track(&self, w: &mut World, e: usize, lease: &Lease) {
        let lease_ms = self.cfg.lease_duration.as_millis() as u64;
        let old = w.records.get(&lease.election).cloned();
        let watch = &mut w.elections[e];
        if let Some(holder) = &lease.holder {
            let tenure = (holder.clone(), lease.fencing_token);
            if watch.tenure.as_ref() != Some(&tenure) {
                if lease.fencing_token <= watch.top_token {
                    w.token_fell = true;
                }
                watch.tenure = Some(tenure);
            }
            if let Some(old) = &old
                && old.holder.is_none()
                && old.successor.as_ref().is_some_and(|s| s != holder)
                && w.t < watch.written_at + lease_ms
            {
                w.successor_passed_over = true;
            }
        } else if lease.successor.is_none() && self.bounds.timely {
            watch.released_at.get_or_insert(w.t);
        }
        watch.top_token = watch.top_token.max(lease.fencing_token);
        watch.written_at = w.t;
    }

    /// The owner's stream tells of its session's write `lease` (not of its
    /// end) to the daemons that hear streams, at once: the earliest anyone
    /// could name its `rvn`.
    fn tell(&self, w: &mut World, lease: &Lease) {
        if lease.holder.is_none() {
            return;
        }
        for m in 0..3 {
            let daemon = &w.daemons[m];
            let owner = self.bounds.identities[m] == lease.holder.as_deref().unwrap_or_default()
                && daemon
                    .node
                    .session()
                    .and_then(|s| s.record_key())
                    .is_some_and(|k| k == lease.election);
            if !self.bounds.streams[m] || owner || !daemon.alive || daemon.frozen {
                continue;
            }
            let input = NodeInput::SessionTold {
                key: lease.election.clone(),
                rvn: lease.rvn.clone(),
                labels: Default::default(),
                at: self.local(m, w.t),
                since: self.local(m, 0),
            };
            self.feed(w, m, input);
        }
    }
}
