//! What an election's input and its actions come to in the node: the
//! input reaches it after what must come first, its store requests go to
//! the driver (its reads of other daemons' sessions to what the node
//! knows of them first; its end of another daemon's session rides on
//! one on its way), its tenure's end moves the daemon's count, its wish
//! for the session keeps the session open.

use std::sync::Arc;

use super::rank::{SET_LABEL, outranks};
use super::{ALONE_AFTER_DENIED, ElectionId, Node, NodeAction, READ_MANY_LIMIT, RequestId, Slot};
use crate::core::election::{Action as CoreAction, Input, WriteOp};
use crate::core::keys::session_owner;
use crate::core::record::{Condition, Lease, Record, WriteOutcome};
use crate::core::session::{SessionAnswer, SessionInput};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

impl Node {
    /// Hand the queued inputs to their elections, in order, until none is
    /// left (an election's actions may queue inputs for others).
    pub(super) fn run_queue(&mut self) {
        while let Some((id, input)) = self.queue.pop_front() {
            self.feed(id, input);
        }
    }

    /// Hand `input` to election `id` (after the session view it has not
    /// been told yet), then route what it asks for. A command (a release,
    /// the end, a read-back's record) waits while the election has a
    /// request in flight: it is fed nothing but that answer and the state
    /// of the daemon (the app check's verdict, the session), which the
    /// core takes at any time.
    fn feed(&mut self, id: ElectionId, input: Input) {
        let Some(slot) = self.slots.get_mut(id.index()) else {
            return;
        };
        let command = matches!(
            input,
            Input::Release { .. } | Input::Orphaned | Input::Checked { .. }
        );
        if command && slot.core.awaits_answer() {
            slot.deferred.push_back(input);
            return;
        }
        // The session as it is now comes before anything else, answers
        // too (a round must not take through a session ended meanwhile),
        // but after the app check's verdict (a round that waits for the
        // session must not take once the check closed).
        let first = matches!(input, Input::Gate(_) | Input::Session(_));
        if slot.view_seq != self.view_seq && !first {
            let view = self.view.clone();
            self.slots[id.index()].view_seq = self.view_seq;
            self.step(id, Input::Session(view));
        }
        if let Input::Session(_) = &input {
            self.slots[id.index()].view_seq = self.view_seq;
        }
        self.step(id, input);
    }

    fn step(&mut self, id: ElectionId, input: Input) {
        let tick = self.tick();
        let slot = &mut self.slots[id.index()];
        slot.core.handle(&tick, input);
        let mut actions = Vec::new();
        while let Some(action) = slot.core.poll_action() {
            actions.push(action);
        }
        for action in actions {
            self.route(id, action);
        }
        self.after_step(id);
    }

    /// What follows any input to `id`: its wish for the session, a change
    /// of the store it now watches for, a hint it now takes, its next
    /// wake, its state published.
    fn after_step(&mut self, id: ElectionId) {
        let wants = self.slots[id.index()].core.wants_session();
        self.set_wanting(id, wants);
        let slot = &mut self.slots[id.index()];
        if slot.core.watches_store_changes() && slot.store_seen < self.store_gen {
            slot.store_seen = self.store_gen;
            self.queue.push_back((id, Input::StoreReplaced));
        }
        if !slot.core.awaits_answer()
            && let Some(command) = slot.deferred.pop_front()
        {
            self.queue.push_back((id, command));
        }
        self.deliver_hint(id);
        self.rewake(id);
        let slot = &self.slots[id.index()];
        self.tenures.note(id, slot.core.state(), slot.strict);
        self.dirty.insert(id);
    }

    fn route(&mut self, id: ElectionId, action: CoreAction) {
        let request = RequestId::Election(id);
        let action = match action {
            CoreAction::Read { budget, confirming } => {
                if !confirming {
                    self.slots[id.index()].count.read_sent();
                }
                if self.slots[id.index()].follows {
                    // Sent once the input is handled, with those of the
                    // other followers asked for meanwhile.
                    self.reads.push((id, budget, confirming));
                    return;
                }
                NodeAction::Read {
                    request,
                    key: self.slots[id.index()].core.config().name.clone(),
                    budget,
                    confirming,
                }
            }
            CoreAction::ReadSession {
                key,
                budget,
                not_before,
            } => {
                self.ask_session(id, key, budget, not_before);
                return;
            }
            CoreAction::Write {
                op,
                lease,
                condition,
                budget,
                deadline,
            } => {
                if op == WriteOp::EndSession && self.rides_on_an_end(id, &lease, &condition) {
                    return;
                }
                // A take that loses shows the record it lost to, and a
                // release the record it wrote, which the election takes as
                // its next round's read: its count is judged from here, as
                // from a read sent now.
                if matches!(op, WriteOp::Create | WriteOp::TakeOver | WriteOp::Release) {
                    self.slots[id.index()].count.read_sent();
                }
                NodeAction::Write {
                    request,
                    op,
                    lease: Box::new(lease),
                    condition,
                    budget,
                    deadline,
                }
            }
            CoreAction::Tell(event) => NodeAction::Tell {
                election: id,
                event,
            },
            CoreAction::TenureOver => {
                self.tenure_over(id);
                return;
            }
            CoreAction::Watch(address) => NodeAction::Watch {
                election: id,
                address,
            },
            CoreAction::Answer(released) => NodeAction::Answer {
                election: id,
                released,
            },
            CoreAction::ForgetStoreChanges => {
                self.slots[id.index()].store_seen = self.store_gen;
                return;
            }
            CoreAction::Note(note) => NodeAction::Note {
                election: Some(id),
                note,
            },
        };
        self.out.push_back(action);
    }

    /// Election `id` asks to end another daemon's session (`lease`, on
    /// `condition`): when an election's end of the same session on the
    /// same `rvn` is on its way, `id` takes that write's answer (it would
    /// have written the same, on the same condition) and nothing is sent.
    /// A dead daemon's thousand elections cost one end of its session, not
    /// one each. Returns whether it rides so.
    fn rides_on_an_end(&mut self, id: ElectionId, lease: &Lease, condition: &Condition) -> bool {
        let Condition::RvnIs(rvn) = condition else {
            return false;
        };
        let end = (lease.election.clone(), rvn.clone());
        match self.ending.get(&end) {
            Some(by) if *by != id => {
                self.slots[by.index()].riders.push(id);
                true
            }
            _ => {
                self.ending.insert(end, id);
                false
            }
        }
    }

    /// Election `id`'s write was answered: it takes the answer, and so do
    /// the elections that rode on it (an end of a session).
    pub(super) fn election_written(
        &mut self,
        id: ElectionId,
        outcome: Result<WriteOutcome, StoreError>,
    ) {
        let Some(slot) = self.slots.get_mut(id.index()) else {
            return;
        };
        let riders = std::mem::take(&mut slot.riders);
        self.ending.retain(|_, by| *by != id);
        self.queue.push_back((id, Input::Written(outcome.clone())));
        for rider in riders {
            self.queue
                .push_back((rider, Input::Written(outcome.clone())));
        }
    }

    /// A tenure of one of the elections is over: the count the session's
    /// next write carries moves.
    fn tenure_over(&mut self, id: ElectionId) {
        #[cfg(test)]
        if self.mutations.count_not_moved {
            return;
        }
        self.ended += 1;
        let ended = self.ended;
        #[allow(unused_mut)]
        let mut named = id;
        #[cfg(test)]
        if self.mutations.ends_misnamed {
            named = ElectionId((id.0 + 1) % self.slots.len() as u32);
        }
        let election = self.slots[named.index()].core.config().name.clone();
        self.feed_session(SessionInput::TenuresEnded(ended, election));
    }

    /// Election `id` asks for the session `key`: an answer that will do
    /// (read at or after `not_before`, see `Known::will_do`), or, past
    /// its due while the owner's stream flows, the answer of a read made
    /// once the next write is told (or a slack later), or else a read now
    /// (shared with any on its way).
    fn ask_session(
        &mut self,
        id: ElectionId,
        key: String,
        budget: std::time::Duration,
        not_before: Option<Instant>,
    ) {
        self.slots[id.index()].asking = Some((key.clone(), budget));
        let (now, drift, slack) = (self.now, self.timing.drift, self.timing.slack);
        let past_its_date = self.past_its_date();
        let known = self.known_entry(&key);
        if let Some(due) = not_before {
            if let Some((sent, record)) = known.will_do(due, now, drift, past_its_date) {
                let answer = known.answer(Ok(record), sent, now);
                self.answer(id, answer);
                return;
            }
            if known.flows(now) {
                known.parked.insert(id);
                self.slots[id.index()].parked = Some((due, due + slack));
                return;
            }
        }
        self.read_session(id, &key, budget);
    }

    fn past_its_date(&self) -> bool {
        #[cfg(test)]
        if self.mutations.cached_answer_past_its_date {
            return true;
        }
        false
    }

    /// Read the session `key` for `id`, with any read of it on its way.
    fn read_session(&mut self, id: ElectionId, key: &str, budget: std::time::Duration) {
        self.known_entry(key).waiting.push(id);
        self.send_session_read(key, budget);
    }

    /// Send a read of the session `key`, unless one is on its way.
    pub(super) fn send_session_read(&mut self, key: &str, budget: std::time::Duration) {
        let now = self.now;
        let stored = self.known_key(key);
        let known = self.known_entry(key);
        if known.in_flight.is_none() {
            known.in_flight = Some(now);
            self.out.push_back(NodeAction::Read {
                request: RequestId::SessionRecord(stored),
                key: key.to_owned(),
                budget,
                confirming: false,
            });
        }
    }

    /// Election `id`, parked, goes on: its wait for the next told write
    /// is over (told, or its slack passed).
    pub(super) fn unpark(&mut self, id: ElectionId) {
        let Some((due, _)) = self.slots[id.index()].parked.take() else {
            return;
        };
        if let Some((key, _)) = &self.slots[id.index()].asking {
            let stored = self.known_key(key);
            if let Some(known) = self.known.get_mut(&stored) {
                known.parked.remove(&id);
            }
        }
        self.proceed(id, due);
    }

    /// Election `id`, no longer parked, takes the answer that will do for
    /// its `due` now, or reads.
    pub(super) fn proceed(&mut self, id: ElectionId, due: Instant) {
        let Some((key, budget)) = self.slots[id.index()].asking.clone() else {
            return;
        };
        let (now, drift, past_its_date) = (self.now, self.timing.drift, self.past_its_date());
        let known = self.known_entry(&key);
        match known.will_do(due, now, drift, past_its_date) {
            Some((sent, record)) => {
                let answer = known.answer(Ok(record), sent, now);
                self.answer(id, answer);
            }
            None => self.read_session(id, &key, budget),
        }
        self.rewake(id);
    }

    /// The read of the session (stored under `stored`) was answered:
    /// learned, and handed to every election waiting for it.
    pub(super) fn session_answered(&mut self, stored: &str, record: Result<Record, StoreError>) {
        let now = self.now;
        let Some(known) = self.known.get_mut(stored) else {
            return;
        };
        let sent = known.in_flight.take().unwrap_or(now);
        let record = record.map(Arc::new);
        if let Ok(record) = &record {
            known.read(sent, record, now);
        }
        let waiting = std::mem::take(&mut known.waiting);
        let answer = known.answer(record, sent, now);
        for id in waiting {
            self.answer(id, answer.clone());
        }
        // Reported as the daemon's, under `#session` (the driver times it).
        if let Err(error) = &answer.record {
            self.out.push_back(NodeAction::Note {
                election: None,
                note: crate::core::election::Note::StoreError {
                    op: "read_session",
                    error: error.clone(),
                },
            });
        }
    }

    /// Hand `id` the answer to its session read, with whether the count
    /// moved as it judges it.
    fn answer(&mut self, id: ElectionId, mut answer: SessionAnswer) {
        let slot: &mut Slot = &mut self.slots[id.index()];
        let Some((key, _)) = slot.asking.take() else {
            return;
        };
        if let Ok(record) = &answer.record {
            let sent = slot.core.last_read_sent();
            let prior = self.known.get(&key).and_then(|k| k.count_before(sent));
            let slot: &mut Slot = &mut self.slots[id.index()];
            answer.moved = slot
                .count
                .answered(&key, record, &slot.core.config().name, prior);
        }
        answer.yields = self.outranked(id, &key);
        self.queue.push_back((id, Input::SessionRecord(answer)));
    }

    /// Whether another daemon than this one and the owner of the session
    /// `asked` ranks before this one for election `id`: its stream flows
    /// now, and its session's labels name the same set of elections as
    /// this daemon's (balance labels both so), so it campaigns for the
    /// election too and takes it first if it is free. Without that label
    /// nothing is known of what another daemon campaigns for: no one is
    /// waited for.
    fn outranked(&self, id: ElectionId, asked: &str) -> bool {
        let Some(set) = self.view.as_ref().and_then(|v| v.labels.get(SET_LABEL)) else {
            return false;
        };
        let election = &self.slots[id.index()].core.config().name;
        let holder = session_owner(asked);
        self.known.iter().any(|(key, known)| {
            key != asked
                && known.flows(self.now)
                && known.label(SET_LABEL) == Some(set.as_str())
                && session_owner(key).is_some_and(|other| {
                    other != self.identity
                        && Some(other) != holder
                        && outranks(other, &self.identity, election)
                })
        })
    }

    /// A period of the read-back starts: read the records of the held
    /// tenures it picks.
    pub(super) fn read_back(&mut self) {
        let now = self.now;
        let key = self.view.as_ref().map(|v| v.key.clone());
        if self.tenures.rekey(key.as_deref()) {
            for (i, slot) in self.slots.iter().enumerate() {
                self.tenures
                    .note(ElectionId(i as u32), slot.core.state(), slot.strict);
            }
        }
        let held = self.tenures.held();
        let Some(readback) = self.readback.as_mut() else {
            return;
        };
        let batches = if key.is_some() {
            readback.period(now, &held)
        } else {
            readback.next = now + self.timing.renew;
            Vec::new()
        };
        for (n, batch) in batches.into_iter().enumerate() {
            let n = n as u32;
            let keys = batch
                .iter()
                .map(|(id, _)| self.slots[id.index()].core.config().name.clone())
                .collect();
            self.out.push_back(NodeAction::ReadMany {
                request: RequestId::ReadBack(n),
                keys,
                budget: self.timing.renew,
            });
            if let Some(readback) = self.readback.as_mut() {
                readback.in_flight.insert(n, batch);
            }
        }
    }

    /// A read-back request was answered: each election is told its record
    /// as read, and judges it.
    pub(super) fn read_back_answered(&mut self, n: u32, records: Result<Vec<Record>, StoreError>) {
        let Some(batch) = self.readback.as_mut().and_then(|r| r.in_flight.remove(&n)) else {
            return;
        };
        let records = match records {
            Ok(records) => records,
            Err(error) => {
                self.out.push_back(NodeAction::Note {
                    election: None,
                    note: crate::core::election::Note::StoreError {
                        op: "read_check",
                        error,
                    },
                });
                return;
            }
        };
        for ((id, fencing_token), record) in batch.into_iter().zip(records) {
            if self.read_back_accepts(&record) {
                continue;
            }
            self.queue.push_back((
                id,
                Input::Checked {
                    fencing_token,
                    record,
                },
            ));
        }
    }

    /// Send the reads the elections asked for in the input just handled:
    /// one alone as it is, several in requests of up to
    /// [`READ_MANY_LIMIT`] records.
    pub(super) fn send_reads(&mut self) {
        let reads = std::mem::take(&mut self.reads);
        let alone = self.alone_until.is_some_and(|until| self.now < until);
        if reads.len() == 1 || alone {
            for (id, budget, confirming) in reads {
                self.out.push_back(NodeAction::Read {
                    request: RequestId::Election(id),
                    key: self.slots[id.index()].core.config().name.clone(),
                    budget,
                    confirming,
                });
            }
            return;
        }
        for chunk in reads.chunks(READ_MANY_LIMIT) {
            let n = (0..u32::MAX)
                .find(|n| !self.batches.contains_key(n))
                .unwrap_or(u32::MAX);
            let keys = chunk
                .iter()
                .map(|(id, _, _)| self.slots[id.index()].core.config().name.clone())
                .collect();
            let budget = chunk.iter().map(|(_, b, _)| *b).min().unwrap_or_default();
            self.batches
                .insert(n, chunk.iter().map(|(id, _, _)| *id).collect());
            self.out.push_back(NodeAction::ReadMany {
                request: RequestId::Reads(n),
                keys,
                budget,
            });
        }
    }

    /// A read of many elections' records was answered: each election is
    /// handed its record (or the error) as the answer to its own read.
    pub(super) fn reads_answered(&mut self, n: u32, records: Result<Vec<Record>, StoreError>) {
        let Some(ids) = self.batches.remove(&n) else {
            return;
        };
        let records = match records {
            Ok(records) if records.len() == ids.len() => records.into_iter().map(Ok).collect(),
            Ok(records) => {
                let error = StoreError::Server(format!(
                    "asked for {} records, the store answered {}",
                    ids.len(),
                    records.len()
                ));
                vec![Err(error); ids.len()]
            }
            Err(error) => {
                if matches!(error, StoreError::Denied { .. }) {
                    // Not allowed (a policy without the store's read of
                    // many): the elections read alone for a while, and
                    // their own errors name the missing permission.
                    self.alone_until = Some(self.now + ALONE_AFTER_DENIED);
                }
                vec![Err(error); ids.len()]
            }
        };
        for (id, record) in ids.into_iter().zip(records) {
            self.election_read(id, record);
        }
    }

    /// Whether the read-back takes `record` as still held without asking
    /// its election: never (the deliberate defect: whenever it names this
    /// daemon).
    fn read_back_accepts(&self, #[allow(unused)] record: &Record) -> bool {
        #[cfg(test)]
        if self.mutations.read_back_holder_only {
            return matches!(record, Record::Valid(l) if l.holder.as_deref() == Some(self.identity.as_str()));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::node::NodeInput;
    use crate::core::node::tests::{handle, node, requests, t};

    /// The reads among `actions`: how many keys each asks for, `0` for a
    /// read alone.
    fn reads(actions: &[NodeAction]) -> Vec<usize> {
        requests(actions)
            .iter()
            .map(|a| match a {
                NodeAction::Read { .. } => 0,
                NodeAction::ReadMany { keys, .. } => keys.len(),
                other => panic!("not a read: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_first_reads_of_elections_that_start_together_with_a_session_go_out_as_one_request() {
        let mut with = node(150, true);
        assert_eq!(reads(&handle(&mut with, 0, NodeInput::Timeout)), [100, 50]);
        // Without sessions each election is a lease of its own, read alone.
        let mut without = node(3, false);
        assert_eq!(
            reads(&handle(&mut without, 0, NodeInput::Timeout)),
            [0, 0, 0]
        );
    }

    #[test]
    fn a_read_of_many_the_store_refuses_as_not_allowed_has_the_elections_read_alone_for_a_minute() {
        let mut node = node(3, true);
        assert_eq!(reads(&handle(&mut node, 0, NodeInput::Timeout)), [3]);
        let denied = StoreError::Denied {
            action: "dynamodb:BatchGetItem",
            table: "leaderd".into(),
            detail: "AccessDeniedException".into(),
        };
        handle(
            &mut node,
            10,
            NodeInput::ReadMany {
                request: RequestId::Reads(0),
                records: Err(denied),
            },
        );
        for i in 0..3 {
            let state = node.state(ElectionId(i));
            assert_eq!(state.last_error.as_deref(), Some("denied"), "election {i}");
        }
        // Woken together (the last one's retry), their reads go out
        // alone until a minute after the refusal; then together again.
        let mut rounds = 0;
        loop {
            let wake = (0..3)
                .filter_map(|i| node.core(ElectionId(i)).next_wake())
                .max()
                .expect("a retry");
            // In whole milliseconds, rounded up: every one is due.
            let micros = (wake - t(0)).as_micros();
            let ms = u64::try_from(micros.div_ceil(1000)).unwrap_or(u64::MAX);
            let out = handle(&mut node, ms, NodeInput::Timeout);
            if ms >= 10 + 60_000 {
                assert_eq!(reads(&out), [3], "at {ms} ms");
                break;
            }
            assert_eq!(reads(&out), [0, 0, 0], "at {ms} ms: {out:?}");
            rounds += 1;
            let answers = requests(&out).into_iter().map(|asked| match asked {
                NodeAction::Read { request, .. } => NodeInput::Read {
                    request,
                    record: Err(StoreError::Transport("down".into())),
                },
                other => unreachable!("checked above: {other:?}"),
            });
            for answer in answers.collect::<Vec<_>>() {
                handle(&mut node, ms + 5, answer);
            }
        }
        assert!(rounds >= 10, "{rounds} rounds of retries in a minute");
    }
}
