//! The DynamoDB lease store.
//!
//! - this file: the store (`DynamoStore`) and its `LeaseStore` requests;
//! - [`table`]: creating, describing and checking the table;
//! - [`region`]: the region when none is configured (environment, AWS
//!   profile, EC2 instance metadata);
//! - [`server_clock`]: the server's clock from its answers' `Date` header
//!   (for `leaderd check`);
//! - `errors`: time bounds, throttling retry, error classification;
//! - `codec`: the record as attributes, malformed items, conditions;
//! - `transact`: many takes in one transaction;
//! - `tests`: the unit tests of the pieces that need no server.
//!
//! One item per election in a table keyed by `election` (S). Every read is a
//! strongly consistent `GetItem`; every write is a `PutItem` of the whole
//! record under a condition expression (takes of many elections at once
//! go a hundred to a `TransactWriteItems`, each under its own
//! condition). The one `DeleteItem` removes `leaderd check`'s scratch
//! record, never an election's. Ambiguous writes are resolved by the
//! provided [`LeaseStore::write`], which this module feeds by classifying
//! SDK errors carefully: only a failure that may have reached the server is a
//! `Timeout` or `Server` error.
//!
//! The SDK's own retries are off: a lease write must finish before the
//! leader's deadline, so the only retry here is for throttling, with jittered
//! exponential backoff, and only while the caller's budget lasts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Region, SharedHttpClient};
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValuesOnConditionCheckFailure, TableStatus,
};
use aws_smithy_http_client::tls;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

mod codec;
mod errors;
pub mod region;
pub mod server_clock;
mod table;
#[cfg(test)]
mod tests;
mod transact;

use codec::{condition_expression, lease_item, parse_item};
use errors::{Action, bounded, classify, condition_failed, lease_settings, retry_throttled};
pub use region::NoRegion;
pub use server_clock::{DatedAnswer, ServerClock};
pub use table::{TableInfo, TtlStatus};
use table::{key_schema_problem, table_status};
use transact::Transactions;

use super::{
    Condition, Lease, LeaseStore, MEMBER_PREFIX, Record, StoreError, WriteOutcome, member_records,
    scratch_only, write_each,
};

/// The partition key of the lease table.
const KEY: &str = "election";
/// The attribute DynamoDB's TTL cleanup watches.
const TTL_ATTRIBUTE: &str = "expires_at";
/// TCP (and TLS) connect limit. Kept below typical request budgets so that a
/// server we cannot reach is reported as a transport failure (nothing sent)
/// rather than a timeout (maybe applied).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Per-request limit for table management calls (not on the lease path).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// A throttled request is retried only if at least this much of the budget
/// remains after the backoff pause: a shorter attempt would only time out.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
/// Requests of one store in flight at once, renewals aside (see
/// [`DynamoStore::slot`]).
const IN_FLIGHT: usize = 32;

/// Where the lease table lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoConfig {
    /// Table name (default `leaderd`).
    pub table: String,
    /// AWS region, e.g. `us-east-1`.
    pub region: String,
    /// Endpoint override (DynamoDB Local, dynalite, a VPC endpoint...).
    pub endpoint_url: Option<String>,
}

/// Where the lease table lives, as configured: the region may be left to the
/// standard AWS sources, asked when the store is opened
/// ([`DynamoSpec::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoSpec {
    /// Table name.
    pub table: String,
    /// `--region` (`store.region`); `None`: see [`region::resolve`].
    pub region: Option<String>,
    /// Endpoint override.
    pub endpoint_url: Option<String>,
}

impl DynamoSpec {
    /// The table with its region: the configured one, else the first the
    /// standard AWS sources name (environment, profile, EC2 instance
    /// metadata). Logs the region and where it came from.
    pub async fn resolve(&self) -> Result<DynamoConfig, NoRegion> {
        let (region, source) = region::resolve(self.region.as_deref()).await?;
        tracing::info!(
            table = %self.table,
            region = %region,
            region_from = %source,
            "DynamoDB lease table"
        );
        Ok(DynamoConfig {
            table: self.table.clone(),
            region,
            endpoint_url: self.endpoint_url.clone(),
        })
    }
}

/// The DynamoDB lease store. Clones share one SDK client (and its connection
/// pool) and its request slots.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    /// One permit per request in flight (renewals aside).
    slots: Arc<Semaphore>,
    /// Whether many writes go in one transaction.
    transactions: Arc<Transactions>,
}

/// The HTTPS client for DynamoDB and for the credential providers that call
/// AWS (STS for web identity, ECS, instance metadata): hyper with rustls on
/// ring and the platform's root certificates. The SDK's default client is the
/// same stack on aws-lc; ring does the same TLS in 1.8 MiB less binary.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

impl DynamoStore {
    /// A store for `cfg.table`, with credentials from the standard AWS chain
    /// (environment, profile, web identity/IRSA, ECS, IMDS), the given region
    /// (see [`DynamoSpec::resolve`]) and optional endpoint. Does no network
    /// I/O: credentials are resolved on the first request.
    pub async fn new(cfg: &DynamoConfig) -> DynamoStore {
        let shared = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(cfg.region.clone()))
            .http_client(https_client())
            .load()
            .await;
        let mut builder = lease_settings(aws_sdk_dynamodb::config::Builder::from(&shared));
        if let Some(url) = &cfg.endpoint_url {
            builder = builder.endpoint_url(url);
        }
        DynamoStore {
            client: Client::from_conf(builder.build()),
            table: cfg.table.clone(),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            transactions: Arc::default(),
        }
    }

    /// A store using a client built elsewhere (its credentials, endpoint and
    /// HTTP client are kept; build it with [`https_client`]). Its retries,
    /// connect timeout and stalled-stream protection are set as in
    /// [`DynamoStore::new`]: this store retries by itself and bounds every
    /// request by its own budget.
    pub fn from_client(client: &Client, table: impl Into<String>) -> DynamoStore {
        let config = lease_settings(client.config().to_builder()).build();
        DynamoStore {
            client: Client::from_conf(config),
            table: table.into(),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            transactions: Arc::default(),
        }
    }

    /// The underlying SDK client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl DynamoStore {
    /// Wait, until `deadline`, for a request slot; a renewal (`renews`)
    /// never waits.
    ///
    /// A burst of requests (the first reads of a thousand elections, the
    /// takeovers of every election a crashed daemon held) queues here, in
    /// arrival order, instead of opening a connection each: a request costs
    /// tens of KiB while it lasts, and its connection stays pooled after.
    /// A renewal keeps a lease this process holds, so it goes first, as on
    /// SQLite's writer lane.
    async fn slot(
        &self,
        deadline: Instant,
        renews: bool,
    ) -> Result<Option<SemaphorePermit<'_>>, StoreError> {
        if renews {
            return Ok(None);
        }
        match tokio::time::timeout_at(deadline, self.slots.acquire()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            // Never closed; without a permit the request still goes.
            Ok(Err(_closed)) => Ok(None),
            Err(_) => Err(StoreError::Transport(format!(
                "not sent: {IN_FLIGHT} other requests to table {} were in flight for the whole budget",
                self.table
            ))),
        }
    }

    /// One consistent read, sent now, by `deadline`.
    async fn read_now(&self, election: &str, deadline: Instant) -> Result<Record, StoreError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let result = retry_throttled(left, |left| {
            let req = self
                .client
                .get_item()
                .table_name(&self.table)
                .key(KEY, AttributeValue::S(election.to_owned()))
                .consistent_read(true)
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(out) => Ok(match out.item() {
                        None => Record::Absent,
                        Some(item) => parse_item(election, item),
                    }),
                    Err(e) => Err(classify(&e, Action::GetItem, &self.table, left)),
                }
            }
        })
        .await;
        match result {
            Ok(record) => Ok(record),
            Err(e) => Err(self.refine_missing(e, deadline).await),
        }
    }

    /// One conditional write, sent now, by `deadline`.
    async fn put_now(
        &self,
        lease: &Lease,
        condition: &Condition,
        deadline: Instant,
    ) -> Result<WriteOutcome, StoreError> {
        let item = lease_item(lease);
        let cond = condition_expression(condition)?;
        let left = deadline.saturating_duration_since(Instant::now());
        let result = retry_throttled(left, |left| {
            let req = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item.clone()))
                .condition_expression(cond.expression)
                .set_expression_attribute_names(Some(cond.names.clone()))
                .set_expression_attribute_values(cond.values.clone())
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(_) => Ok(WriteOutcome::Applied),
                    Err(e) => match condition_failed(&e) {
                        // Not every server returns the old item (dynalite
                        // does not), and none does when there is no item.
                        Some(old) => Ok(WriteOutcome::ConditionFailed {
                            current: old.map(|item| parse_item(&lease.election, item)),
                        }),
                        None => Err(classify(&e, Action::PutItem, &self.table, left)),
                    },
                }
            }
        })
        .await;
        match result {
            Ok(outcome) => Ok(outcome),
            Err(e) => Err(self.refine_missing(e, deadline).await),
        }
    }

    /// Delete the scratch record `key` if its `rvn` is `rvn`, by `deadline`.
    async fn delete_now(
        &self,
        key: &str,
        rvn: &str,
        deadline: Instant,
    ) -> Result<WriteOutcome, StoreError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let result = retry_throttled(left, |left| {
            let req = self
                .client
                .delete_item()
                .table_name(&self.table)
                .key(KEY, AttributeValue::S(key.to_owned()))
                .condition_expression("#r = :r")
                .expression_attribute_names("#r", "rvn")
                .expression_attribute_values(":r", AttributeValue::S(rvn.to_owned()))
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(_) => Ok(WriteOutcome::Applied),
                    Err(e)
                        if e.as_service_error()
                            .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
                    {
                        Ok(WriteOutcome::ConditionFailed { current: None })
                    }
                    Err(e) => Err(classify(&e, Action::DeleteItem, &self.table, left)),
                }
            }
        })
        .await;
        match result {
            Ok(outcome) => Ok(outcome),
            Err(e) => Err(self.refine_missing(e, deadline).await),
        }
    }

    /// Every item, read consistently; or, given a key prefix, only the
    /// items under it, read eventually consistently.
    async fn scan_table(
        &self,
        budget: Duration,
        prefix: Option<&str>,
    ) -> Result<Vec<Record>, StoreError> {
        let deadline = Instant::now() + budget;
        let mut records = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let _slot = self.slot(deadline, false).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            let page = retry_throttled(left, |left| {
                let mut req = self
                    .client
                    .scan()
                    .table_name(&self.table)
                    .consistent_read(prefix.is_none())
                    .set_exclusive_start_key(start.clone());
                if let Some(prefix) = prefix {
                    req = req
                        .filter_expression("begins_with(#k, :p)")
                        .expression_attribute_names("#k", KEY)
                        .expression_attribute_values(":p", AttributeValue::S(prefix.to_owned()));
                }
                let req = req.send();
                async move {
                    match bounded(left, req).await? {
                        Ok(out) => Ok(out),
                        Err(e) => Err(classify(&e, Action::Scan, &self.table, left)),
                    }
                }
            })
            .await;
            let page = match page {
                Ok(page) => page,
                Err(e) => return Err(self.refine_missing(e, deadline).await),
            };
            for item in page.items() {
                let election = match item.get(KEY) {
                    Some(AttributeValue::S(name)) => name.as_str(),
                    _ => "",
                };
                records.push(parse_item(election, item));
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(records),
            }
        }
    }

    /// Consistent reads of `elections` (at most 100, no repeats) in one
    /// `BatchGetItem`, again for the keys it leaves unprocessed, by
    /// `deadline`; a record it does not return is absent.
    async fn batch_read(
        &self,
        elections: &[String],
        deadline: Instant,
    ) -> Result<HashMap<String, Record>, StoreError> {
        let mut found = HashMap::with_capacity(elections.len());
        let mut pending: Vec<String> = elections.to_vec();
        while !pending.is_empty() {
            let _slot = self.slot(deadline, false).await?;
            let keys = pending
                .iter()
                .map(|e| HashMap::from([(KEY.to_owned(), AttributeValue::S(e.clone()))]))
                .collect();
            let wanted = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true)
                .build()
                .map_err(|e| StoreError::Other(format!("cannot build a batch read: {e}")))?;
            let left = deadline.saturating_duration_since(Instant::now());
            let out = retry_throttled(left, |left| {
                let req = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, wanted.clone())
                    .send();
                async move {
                    match bounded(left, req).await? {
                        Ok(out) => Ok(out),
                        Err(e) => Err(classify(&e, Action::BatchGetItem, &self.table, left)),
                    }
                }
            })
            .await;
            let out = match out {
                Ok(out) => out,
                Err(e) => return Err(self.refine_missing(e, deadline).await),
            };
            let items = out.responses.as_ref().and_then(|r| r.get(&self.table));
            for item in items.into_iter().flatten() {
                if let Some(AttributeValue::S(name)) = item.get(KEY) {
                    found.insert(name.clone(), parse_item(name, item));
                }
            }
            // Keys the table could not serve now (throttled): asked again
            // after a pause, within the budget.
            pending = out
                .unprocessed_keys
                .as_ref()
                .and_then(|u| u.get(&self.table))
                .map(|k| {
                    k.keys()
                        .iter()
                        .filter_map(|key| match key.get(KEY) {
                            Some(AttributeValue::S(name)) => Some(name.clone()),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !pending.is_empty() {
                let pause = Instant::now() + Duration::from_millis(50);
                if pause >= deadline {
                    return Err(StoreError::Timeout(
                        deadline.saturating_duration_since(Instant::now()),
                    ));
                }
                tokio::time::sleep_until(pause).await;
            }
        }
        Ok(found)
    }
}

#[async_trait]
impl LeaseStore for DynamoStore {
    fn kind(&self) -> &'static str {
        "dynamodb"
    }

    async fn read_many(
        &self,
        elections: &[String],
        budget: Duration,
    ) -> Result<Vec<Record>, StoreError> {
        let deadline = Instant::now() + budget;
        let mut unique = elections.to_vec();
        unique.sort();
        unique.dedup();
        let mut found = HashMap::new();
        for chunk in unique.chunks(super::READ_MANY_LIMIT) {
            found.extend(Box::pin(self.batch_read(chunk, deadline)).await?);
        }
        Ok(elections
            .iter()
            .map(|e| found.get(e).cloned().unwrap_or(Record::Absent))
            .collect())
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        let deadline = Instant::now() + budget;
        let _slot = self.slot(deadline, false).await?;
        // Boxed once a slot is free: a request in progress is ~17 KiB of
        // SDK state, which a request waiting for its slot does not hold.
        Box::pin(self.read_now(election, deadline)).await
    }

    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let deadline = Instant::now() + budget;
        let _slot = self.slot(deadline, renews(lease, condition)).await?;
        Box::pin(self.put_now(lease, condition, deadline)).await
    }

    async fn write_many(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        if writes.len() < 2 || !self.transactions.allowed(Instant::now()) {
            return write_each(self, writes, budget).await;
        }
        self.write_together(writes, budget).await
    }

    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        self.scan_table(budget, None).await
    }

    /// Only the member items come back, read eventually consistently (half
    /// the read units of a consistent scan); DynamoDB still counts every
    /// item it scans.
    async fn members(&self, budget: Duration) -> Result<Vec<Lease>, StoreError> {
        let records = self.scan_table(budget, Some(MEMBER_PREFIX)).await?;
        Ok(member_records(records))
    }

    async fn delete_check_record(
        &self,
        key: &str,
        rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        scratch_only(key)?;
        let deadline = Instant::now() + budget;
        let _slot = self.slot(deadline, false).await?;
        Box::pin(self.delete_now(key, rvn, deadline)).await
    }

    async fn check(&self, budget: Duration) -> Result<(), StoreError> {
        let desc = self.describe(budget).await?;
        if desc.table_status() != Some(&TableStatus::Active) {
            return Err(StoreError::TableNotActive {
                table: self.table.clone(),
                status: table_status(&desc),
            });
        }
        if let Some(detail) = key_schema_problem(&desc) {
            return Err(StoreError::WrongSchema {
                table: self.table.clone(),
                detail,
            });
        }
        Ok(())
    }
}

/// Whether writing `lease` under `condition` renews it: the holder the
/// condition names keeps it (a release or a handover writes no holder).
fn renews(lease: &Lease, condition: &Condition) -> bool {
    matches!(condition, Condition::HeldBy { holder, .. } if lease.holder.as_deref() == Some(holder))
}
