//! The node's side of sessions: its own session (fed its inputs, kept
//! open while an election wants it, its changes told to the elections)
//! and what it learns of other daemons' sessions from their streams.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::known::FORGET_AFTER;
use super::{ElectionId, Known, Node, NodeAction, RequestId};
use crate::core::election::{Action as CoreAction, Input};
use crate::core::session::SessionInput;
use crate::core::time::Instant;

impl Node {
    /// Hand the daemon's session `input`, carry out what it asks, and
    /// tell the elections when the session they see changed.
    pub(super) fn feed_session(&mut self, input: SessionInput) {
        let tick = self.tick();
        let Some(session) = self.session.as_mut() else {
            return;
        };
        session.handle(&tick, input);
        while let Some(action) = session.poll_action() {
            let action = match action {
                CoreAction::Write {
                    op,
                    lease,
                    condition,
                    budget,
                    deadline,
                } => NodeAction::Write {
                    request: RequestId::Session,
                    op,
                    lease: Box::new(lease),
                    condition,
                    budget,
                    deadline,
                },
                CoreAction::Read { budget, .. } => NodeAction::Read {
                    request: RequestId::Session,
                    key: session.record_key().unwrap_or_default().to_owned(),
                    budget,
                    confirming: true,
                },
                CoreAction::Note(note) => NodeAction::Note {
                    election: None,
                    note,
                },
                _ => continue,
            };
            self.out.push_back(action);
        }
        let view = session.view();
        if view.as_ref() != self.view.as_deref() {
            let view = view.map(Arc::new);
            self.view = view.clone();
            self.view_seq += 1;
            self.out.push_back(NodeAction::PublishSession);
            // At once to what holds a tenure through it or waits for it;
            // to the others before anything else they are told. (Room made
            // for them at once: thousands at each of the session's writes.)
            let told =
                |core: &crate::core::election::Core| core.holds_tenure() || core.wants_session();
            let many = self.slots.iter().filter(|s| told(&s.core)).count();
            self.queue.reserve(many);
            for i in 0..self.slots.len() {
                if told(&self.slots[i].core) {
                    self.slots[i].view_seq = self.view_seq;
                    self.queue
                        .push_back((ElectionId(i as u32), Input::Session(view.clone())));
                }
            }
        }
    }

    /// Keep the session open while an election wants it.
    pub(super) fn set_wanting(&mut self, id: ElectionId, wants: bool) {
        let slot = &mut self.slots[id.index()];
        if slot.wanting == wants {
            return;
        }
        slot.wanting = wants;
        let before = self.wanting > 0;
        if wants {
            self.wanting += 1;
        } else {
            self.wanting -= 1;
        }
        if before != (self.wanting > 0) {
            let wanted = self.always || self.wanting > 0;
            self.feed_session(SessionInput::Wanted(wanted));
        }
    }

    /// The entry of the session `key`, made if need be (forgetting stale
    /// ones then).
    pub(super) fn known_entry(&mut self, key: &str) -> &mut Known {
        let now = self.now;
        let key = self.known_key(key);
        if !self.known.contains_key(&key) {
            self.known
                .retain(|_, k| now - k.touched < FORGET_AFTER || !k.idle());
        }
        let known = self.known.entry(key).or_insert_with(|| Known::new(now));
        known.touched = now;
        known
    }

    /// Under which key what is known of the session `key` is kept: its
    /// own (the deliberate defect: its owner's).
    pub(super) fn known_key(&self, key: &str) -> String {
        #[cfg(test)]
        if self.mutations.sessions_by_owner
            && let Some(owner) = crate::core::keys::session_owner(key)
        {
            return owner.to_owned();
        }
        key.to_owned()
    }

    pub(super) fn on_told(
        &mut self,
        key: &str,
        rvn: &str,
        labels: BTreeMap<String, String>,
        at: Instant,
        since: Instant,
    ) {
        let quiet = self.timing.quiet;
        let stored = self.known_key(key);
        let Some(known) = self.known.get_mut(&stored) else {
            return;
        };
        known.told(rvn, labels, at, since, quiet);
        // Elections parked for a write at or after their due: this one.
        // (The others stay parked, where they are.)
        let slots = &self.slots;
        let ready: Vec<ElectionId> = known
            .parked
            .iter()
            .copied()
            .filter(|id| slots[id.index()].parked.is_none_or(|(due, _)| due <= at))
            .collect();
        for id in &ready {
            known.parked.remove(id);
        }
        for id in ready {
            if let Some((due, _)) = self.slots[id.index()].parked.take() {
                self.proceed(id, due);
            }
        }
    }

    /// The owner's stream of the session `key` ended (or broke): the
    /// session is read at once, one read whoever follows through it. A
    /// daemon killed between a write of its session and the event telling
    /// it leaves its followers knowing an older `rvn`; the newer one is
    /// timed from when they first see it, so this read, not the next one
    /// an election makes (up to its due later), is the one that starts
    /// their wait. A stream that comes and goes costs at most one read
    /// each time it ends (it is opened again after P or more).
    pub(super) fn on_stream_ended(&mut self, key: &str) {
        let stored = self.known_key(key);
        let Some(known) = self.known.get_mut(&stored) else {
            return;
        };
        known.flow = None;
        self.send_session_read(key, self.timing.renew);
    }
}
