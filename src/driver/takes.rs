//! The takes one input asks for, sent together: up to a hundred to a
//! request where the store can make many writes in one
//! ([`crate::lease::LeaseStore::write_many`]), each with its own condition
//! and its own answer. A daemon that held ten thousand elections died:
//! its followers' takes cost a hundred requests, not ten thousand.

use std::time::Duration;

use super::{Answer, Done, Finished, NodeDriver};
use crate::clock::Instant;
use crate::core::node::RequestId;
use crate::lease::{Condition, Lease, StoreError, WRITE_MANY_LIMIT};

use super::report::Metric;

/// A take waiting for the end of the input, to go out with the others
/// the input brought (see [`NodeDriver::send_takes`]).
pub(super) struct Take {
    pub(super) request: RequestId,
    pub(super) metric: Metric,
    pub(super) lease: Lease,
    pub(super) condition: Condition,
    pub(super) budget: Duration,
    pub(super) deadline: Option<Instant>,
}

impl NodeDriver {
    /// Send the takes the input asked for: a hundred to a request where
    /// the store can make many writes in one (a daemon that held many
    /// elections died: ten thousand takes one by one cost ten thousand
    /// requests), each with its own condition and its own answer.
    pub(super) fn send_takes(&mut self) {
        let mut rest = std::mem::take(&mut self.takes);
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(WRITE_MANY_LIMIT));
            let batch = std::mem::replace(&mut rest, tail);
            let store = self.context.store.clone();
            let clock = self.context.clock.clone();
            self.inflight.spawn(async move {
                let sent = clock.now();
                let budget = batch.iter().map(|t| t.budget).min().unwrap_or_default();
                let deadline = batch.iter().filter_map(|t| t.deadline).min();
                let writes: Vec<_> = batch
                    .iter()
                    .map(|t| (t.lease.clone(), t.condition.clone()))
                    .collect();
                let write = store.write_many(&writes, budget);
                let outcomes = match deadline {
                    Some(at) => clock
                        .timeout_at(at, write)
                        .await
                        .unwrap_or_else(|| vec![Err(StoreError::Timeout(budget)); batch.len()]),
                    None => write.await,
                };
                let took = clock.now() - sent;
                let done = batch
                    .into_iter()
                    .zip(outcomes)
                    .map(|(take, outcome)| Done {
                        request: take.request,
                        answer: Answer::Written(outcome),
                        took,
                        metric: take.metric,
                        ending: None,
                        batch: Vec::new(),
                        campaign: true,
                    })
                    .collect();
                Finished::Many(done)
            });
        }
    }
}
