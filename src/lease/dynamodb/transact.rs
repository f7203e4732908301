//! Many conditional writes in one `TransactWriteItems`: how a daemon takes
//! the elections a dead daemon held, a hundred a request instead of one.
//!
//! A transaction applies every write or none. Each write keeps its own
//! condition, so nothing is taken that a write of its own would not have
//! taken; only the cost moves (one request, and on DynamoDB two write units
//! an item instead of one). What cannot be settled for the whole batch is
//! settled write by write, as `LeaseStore::write` does:
//!
//! - cancelled: a write whose condition failed is answered so (with the
//!   item, if the server returned it); the others, not applied, are made
//!   again one by one (another's write may have raced them);
//! - maybe applied (a timeout, a 5xx): one consistent read of the records
//!   tells, per write, as the read-back of a single write does;
//! - refused as a request (a server without transactions, such as
//!   dynalite; a policy that denies them by `dynamodb:EnclosingOperation`;
//!   IAM checks each `Put` of a transaction as `dynamodb:PutItem`): the
//!   writes go one by one, and so do later batches for
//!   [`TRANSACTIONS_OFF_FOR`] (warned of once, until a transaction works
//!   again).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Semaphore;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    CancellationReason, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use tokio::time::Instant;

use super::DynamoStore;
use super::codec::{condition_expression, lease_item, parse_item};
use super::errors::{Action, bounded, classify, retry_throttled};
use crate::lease::{Condition, Lease, StoreError, WriteOutcome, new_rvn, settle_many, write_each};

/// How long batches go one write at a time after the store refused a
/// transaction as a request: a policy may be fixed meanwhile.
pub(super) const TRANSACTIONS_OFF_FOR: Duration = Duration::from_secs(600);

/// Transactions of one store in flight at once. Each holds a hundred
/// items built, twice over while it is sent (the SDK's input and the
/// request's body): two keep a daemon's peak memory near what 32 single
/// writes cost, and DynamoDB Local, which makes one transaction at a
/// time, no slower than with more (the benchmark's pass of the store
/// alone, 10,000 takes: 7.6 s and 8.9 s with two in flight, 7.2 s and
/// 9.9 s with eight).
const TRANSACTIONS_IN_FLIGHT: usize = 2;

/// What one transaction came to.
enum Transacted {
    /// Every write applied.
    Applied,
    /// Cancelled: each write's reason, in order (`None` for a write that
    /// would have applied).
    Cancelled(Vec<CancellationReason>),
    /// Not applied, nor refused as a request: each write gets this error.
    Failed(StoreError),
    /// It may have applied: a read tells.
    Unknown(StoreError),
    /// The store will not make transactions for us.
    Refused(StoreError),
}

/// Whether batches go as transactions: off for a while after the store
/// refused one. Shared by a store's clones.
#[derive(Debug)]
pub(super) struct Transactions {
    off_until: Mutex<Option<Instant>>,
    /// One permit per transaction in flight (see [`TRANSACTIONS_IN_FLIGHT`]).
    turns: Semaphore,
}

impl Default for Transactions {
    fn default() -> Self {
        Transactions {
            off_until: Mutex::new(None),
            turns: Semaphore::new(TRANSACTIONS_IN_FLIGHT),
        }
    }
}

impl Transactions {
    /// Whether batches may go as transactions now.
    pub(super) fn allowed(&self, now: Instant) -> bool {
        self.off_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|until| now >= until)
    }

    /// The store refused a transaction with `error`: batches go one write
    /// at a time for a while; the first refusal after transactions worked
    /// is warned of.
    fn refused(&self, error: &StoreError, now: Instant) {
        let mut off = self
            .off_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if off.is_none() {
            tracing::warn!(
                %error,
                "the store refused a transaction of many takes; taking elections one write at a time (slower after a daemon holding many died), trying again in {} minutes",
                TRANSACTIONS_OFF_FOR.as_secs() / 60
            );
        }
        *off = Some(now + TRANSACTIONS_OFF_FOR);
    }

    /// A transaction went through: a later refusal is worth a warning again.
    fn worked(&self) {
        let mut off = self
            .off_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *off = None;
    }
}

impl DynamoStore {
    /// `writes` (two or more, distinct records) in one transaction, each
    /// answered as [`LeaseStore::write`] answers it; see the module docs.
    pub(super) async fn write_together(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        let deadline = Instant::now() + budget;
        let transacted = match tokio::time::timeout_at(deadline, self.transactions.turns.acquire())
            .await
        {
            Ok(_turn) => match self.slot(deadline, false).await {
                Ok(_slot) => Box::pin(self.transact(writes, deadline)).await,
                Err(e) => Transacted::Failed(e),
            },
            Err(_) => Transacted::Failed(StoreError::Transport(format!(
                "not sent: {TRANSACTIONS_IN_FLIGHT} other transactions to table {} were in flight for the whole budget",
                self.table
            ))),
        };
        match transacted {
            Transacted::Applied => {
                self.transactions.worked();
                writes.iter().map(|_| Ok(WriteOutcome::Applied)).collect()
            }
            Transacted::Failed(e) => writes.iter().map(|_| Err(e.clone())).collect(),
            Transacted::Cancelled(reasons) => self.after_cancel(writes, &reasons, deadline).await,
            Transacted::Unknown(e) => settle_many(self, writes, e, deadline).await,
            Transacted::Refused(e) => {
                self.transactions.refused(&e, Instant::now());
                self.one_by_one(writes, deadline).await
            }
        }
    }

    /// Each write by itself, all at once, by `deadline`.
    async fn one_by_one(
        &self,
        writes: &[(Lease, Condition)],
        deadline: Instant,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        let left = deadline.saturating_duration_since(Instant::now());
        write_each(self, writes, left).await
    }

    /// The transaction, sent now (again only if throttled, with the same
    /// token: DynamoDB applies a token's transaction at most once).
    async fn transact(&self, writes: &[(Lease, Condition)], deadline: Instant) -> Transacted {
        // Built again for each attempt rather than kept and copied: a
        // hundred items are the transaction's memory.
        let build = || {
            writes
                .iter()
                .map(|(lease, condition)| self.transact_item(lease, condition))
                .collect::<Result<Vec<_>, _>>()
        };
        let mut first = match build() {
            Ok(items) => Some(items),
            Err(e) => return Transacted::Failed(e),
        };
        // At most 36 characters.
        let token = new_rvn();
        let left = deadline.saturating_duration_since(Instant::now());
        let result = retry_throttled(left, |left| {
            let items = first.take().map_or_else(build, Ok);
            let req = items.map(|items| {
                self.client
                    .transact_write_items()
                    .set_transact_items(Some(items))
                    .client_request_token(&token)
                    .send()
            });
            async move {
                match bounded(left, req?).await? {
                    Ok(_) => Ok(None),
                    Err(e) => match e.as_service_error() {
                        Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                            Ok(Some(c.cancellation_reasons().to_vec()))
                        }
                        _ => Err(classify(&e, Action::PutItem, &self.table, left)),
                    },
                }
            }
        })
        .await;
        match result {
            Ok(None) => Transacted::Applied,
            Ok(Some(reasons)) => Transacted::Cancelled(reasons),
            Err(e) if e.maybe_applied() => Transacted::Unknown(e),
            Err(e @ (StoreError::Denied { .. } | StoreError::Other(_))) => Transacted::Refused(e),
            Err(e) => Transacted::Failed(self.refine_missing(e, deadline).await),
        }
    }

    /// One write of the transaction.
    fn transact_item(
        &self,
        lease: &Lease,
        condition: &Condition,
    ) -> Result<TransactWriteItem, StoreError> {
        let cond = condition_expression(condition)?;
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(lease_item(lease)))
            .condition_expression(cond.expression)
            .set_expression_attribute_names(Some(cond.names))
            .set_expression_attribute_values(cond.values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Other(format!("cannot build a transaction's write: {e}")))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// Cancelled with `reasons`: a failed condition answers its write; the
    /// rest were not applied and are made one by one.
    async fn after_cancel(
        &self,
        writes: &[(Lease, Condition)],
        reasons: &[CancellationReason],
        deadline: Instant,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        let mut answers: Vec<Option<Result<WriteOutcome, StoreError>>> = vec![None; writes.len()];
        let mut again = Vec::new();
        for (i, (lease, _)) in writes.iter().enumerate() {
            let reason = reasons.get(i);
            if reason.and_then(CancellationReason::code) == Some("ConditionalCheckFailed") {
                let current = reason
                    .and_then(CancellationReason::item)
                    .map(|item| parse_item(&lease.election, item));
                answers[i] = Some(Ok(WriteOutcome::ConditionFailed { current }));
            } else {
                again.push(i);
            }
        }
        if !again.is_empty() {
            let retry: Vec<(Lease, Condition)> = again.iter().map(|&i| writes[i].clone()).collect();
            let outcomes = self.one_by_one(&retry, deadline).await;
            for (i, outcome) in again.into_iter().zip(outcomes) {
                answers[i] = Some(outcome);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(StoreError::Other("no answer".into()))))
            .collect()
    }
}
