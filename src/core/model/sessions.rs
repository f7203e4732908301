//! The model's sessions: each core's daemon session beside it, with its
//! own store requests, and the store's session records.

use super::{ElectionModel, Lane, Node, Request, World};
use crate::core::election::{Action as CoreAction, Input};
use crate::core::record::{Condition, Lease, Record};
use crate::core::session::{Flow, SessionAnswer, SessionCore, SessionInput};
use crate::core::store_error::StoreError;

impl Node {
    /// The request slot of `lane`.
    pub(super) fn slot(&mut self, lane: Lane) -> &mut Option<Request> {
        match lane {
            Lane::Election => &mut self.request,
            Lane::Session => &mut self.session_request,
        }
    }
}

impl World {
    /// What a consistent read of `key` finds now.
    pub(super) fn read(&self, key: &str) -> Record {
        let found = if key == super::ELECTION {
            self.record.clone()
        } else {
            self.sessions.get(key).cloned()
        };
        found.map_or(Record::Absent, Record::Valid)
    }
}

/// The store applies a write of a session record if its condition holds;
/// else returns the record as it is.
pub(super) fn apply_session(w: &mut World, lease: &Lease, condition: &Condition) -> Option<Record> {
    let current = w.read(&lease.election);
    if !condition.holds(&current, None) {
        return Some(current);
    }
    w.sessions.insert(lease.election.clone(), lease.clone());
    w.session_written.insert(lease.election.clone(), w.t);
    None
}

impl ElectionModel {
    /// What core `n` is told with `res`, its read of the session `key`: as
    /// its daemon's streams could tell it at the earliest. An `rvn` still in
    /// the store is dated from its write (the first moment a stream could
    /// name it); a later write than the answer shows is told, dated the
    /// same way (the answer was late). Cores 0 and 2 are told their
    /// holder's stream flows since the start (so they read the session
    /// alone between an election's events); core 1 polls.
    pub(super) fn session_answer(
        &self,
        w: &World,
        n: usize,
        key: &str,
        res: Result<Record, StoreError>,
    ) -> SessionAnswer {
        let current = w.sessions.get(key);
        let written = w.session_written.get(key).map(|&t| self.local(n, t));
        let (learned, told) = match (&res, current) {
            (Ok(Record::Valid(s)), Some(c)) if s.rvn == c.rvn => (written, None),
            (Ok(Record::Valid(_)), Some(c)) => (None, written.map(|at| (c.rvn.clone(), at))),
            _ => (None, None),
        };
        let flow = (n != 1).then(|| Flow {
            since: self.local(n, 0),
            until: self.local(n, w.t + self.cfg.hint_quiet().as_millis() as u64),
        });
        SessionAnswer {
            record: res,
            learned,
            flow,
            told,
            moved: true,
        }
    }

    /// Whether core `n`'s session core is idle and due to wake.
    pub(super) fn session_due(&self, w: &World, n: usize) -> bool {
        let node = &w.nodes[n];
        node.alive
            && !node.frozen
            && node.session_request.is_none()
            && node
                .session
                .as_ref()
                .and_then(SessionCore::next_wake)
                .is_some_and(|at| at <= self.local(n, w.t))
    }

    /// Hand `input` to core `n`'s session core, collect what it asks
    /// for, and tell the election core when the session it sees changed.
    pub(super) fn feed_session(&self, w: &mut World, n: usize, input: SessionInput) {
        let tick = self.tick(w, n);
        let Some(session) = w.nodes[n].session.as_mut() else {
            return;
        };
        session.handle(&tick, input);
        let mut request = None;
        while let Some(action) = session.poll_action() {
            match action {
                CoreAction::Read { .. } => {
                    request = Some(Request::Read {
                        key: session.record_key().unwrap_or_default().to_owned(),
                        session: false,
                        answer: None,
                    });
                }
                CoreAction::Write {
                    lease, condition, ..
                } => {
                    request = Some(Request::Write {
                        lease,
                        condition,
                        answer: None,
                    })
                }
                _ => {}
            }
        }
        let view = session.view();
        if let Some(Request::Write { lease, .. }) = &request
            && lease.rvn == tick.stamp.rvn
        {
            w.rvns += 1;
        }
        let node = &mut w.nodes[n];
        if request.is_some() {
            node.session_request = request;
        }
        if view != node.view {
            node.view = view.clone();
            self.feed(w, n, Input::Session(view));
        }
    }
}
