//! The DynamoDB lease store.
//!
//! One item per election in a table keyed by `election` (S). Every read is a
//! strongly consistent `GetItem`; every write is a `PutItem` of the whole
//! record under a condition expression. Ambiguous writes are resolved by the
//! provided [`LeaseStore::write`], which this module feeds by classifying SDK
//! errors carefully: only a failure that may have reached the server is a
//! `Timeout` or `Server` error.
//!
//! The SDK's own retries are off: a lease write must finish before the
//! leader's deadline, so the only retry here is for throttling, with jittered
//! exponential backoff, and only while the caller's budget lasts.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, Region, SharedHttpClient, StalledStreamProtectionConfig,
};
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableDescription, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_smithy_http_client::tls;
use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

use crate::text;

use super::{
    Condition, HolderMeta, Lease, LeaseStore, Malformed, Record, RvnGuard, StoreError, WriteOutcome,
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

/// The DynamoDB lease store. Clones share one SDK client (and its connection
/// pool).
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
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

/// What `describe_table` / `create_table` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Table status, e.g. `ACTIVE` or `CREATING`.
    pub status: String,
    /// `PAY_PER_REQUEST` or `PROVISIONED`, when the server says.
    pub billing_mode: Option<String>,
    /// Approximate item count (DynamoDB refreshes it about every six hours).
    pub item_count: Option<i64>,
    /// Whether the key schema is exactly `election` (S) as the partition key.
    pub key_schema_ok: bool,
    /// Time to live on `expires_at`.
    pub ttl: TtlStatus,
}

/// Whether DynamoDB's TTL cleanup is on for the `expires_at` attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TtlStatus {
    /// TTL is enabled (or being enabled) on `expires_at`.
    Enabled,
    /// TTL is off, or watches another attribute.
    Disabled,
    /// The server does not implement the TTL API; the reason says what it answered.
    Unsupported(String),
}

impl DynamoStore {
    /// A store for `cfg.table`, with credentials from the standard AWS chain
    /// (environment, profile, web identity/IRSA, ECS, IMDS), the given region
    /// and optional endpoint. Does no network I/O: credentials are resolved on
    /// the first request.
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

    /// Create the table on demand (`PAY_PER_REQUEST`, key `election` (S)) if it
    /// does not exist, wait up to `wait` until it is ACTIVE, and with `ttl`
    /// enable TTL on `expires_at`. An existing table with the right schema is
    /// fine; one with another key schema is a `WrongSchema` error. A server
    /// without the TTL API gives `TtlStatus::Unsupported`, not an error.
    pub async fn create_table(&self, ttl: bool, wait: Duration) -> Result<TableInfo, StoreError> {
        let deadline = Instant::now() + wait;
        let key = KeySchemaElement::builder()
            .attribute_name(KEY)
            .key_type(KeyType::Hash)
            .build()
            .map_err(|e| StoreError::Other(format!("building the key schema: {e}")))?;
        let attribute = AttributeDefinition::builder()
            .attribute_name(KEY)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| StoreError::Other(format!("building the key attribute: {e}")))?;
        let created = retry_throttled(CONTROL_TIMEOUT, |left| {
            let req = self
                .client
                .create_table()
                .table_name(&self.table)
                .billing_mode(BillingMode::PayPerRequest)
                .key_schema(key.clone())
                .attribute_definitions(attribute.clone())
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(_) => Ok(true),
                    // Exists already, or is being created by someone else.
                    Err(e) if service_code(&e) == Some("ResourceInUseException") => Ok(false),
                    Err(e) => Err(classify(&e, &self.table, left)),
                }
            }
        })
        .await?;
        if created {
            tracing::info!(table = %self.table, "created DynamoDB table (on-demand)");
        }

        let desc = self.wait_active(deadline).await?;
        if let Some(detail) = key_schema_problem(&desc) {
            return Err(StoreError::WrongSchema {
                table: self.table.clone(),
                detail,
            });
        }
        let ttl = if ttl {
            self.enable_ttl().await?
        } else {
            self.ttl_status().await?
        };
        Ok(table_info(&self.table, &desc, ttl))
    }

    /// Describe the table: status, billing mode, item count, whether the key
    /// schema is right, TTL. A missing table is `TableMissing`; a wrong schema
    /// is reported in `key_schema_ok`, not as an error.
    pub async fn describe_table(&self) -> Result<TableInfo, StoreError> {
        let desc = self.describe(CONTROL_TIMEOUT).await?;
        let ttl = self.ttl_status().await?;
        Ok(table_info(&self.table, &desc, ttl))
    }

    /// DescribeTable within `budget` (throttling retried).
    async fn describe(&self, budget: Duration) -> Result<TableDescription, StoreError> {
        retry_throttled(budget, |left| {
            let req = self.client.describe_table().table_name(&self.table).send();
            async move {
                match bounded(left, req).await? {
                    Ok(out) => out.table.ok_or_else(|| {
                        StoreError::Other(format!(
                            "DescribeTable for `{}` answered without a table description",
                            self.table
                        ))
                    }),
                    Err(e) => Err(classify(&e, &self.table, left)),
                }
            }
        })
        .await
    }

    /// Poll DescribeTable until the table is ACTIVE or `deadline` passes.
    async fn wait_active(&self, deadline: Instant) -> Result<TableDescription, StoreError> {
        let mut pause = Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Bounded by what is left of `wait`, but long enough to get an
            // answer that says why the table is not ACTIVE.
            let budget = left.clamp(Duration::from_secs(1), CONTROL_TIMEOUT);
            let status = match self.describe(budget).await {
                Ok(desc) if desc.table_status() == Some(&TableStatus::Active) => return Ok(desc),
                Ok(desc) => table_status(&desc),
                // Real DynamoDB may not list a table it just accepted for a
                // moment; keep waiting for it.
                Err(StoreError::TableMissing(_)) => "not yet visible".to_owned(),
                Err(e) => return Err(e),
            };
            if left.is_zero() {
                return Err(StoreError::TableNotActive {
                    table: self.table.clone(),
                    status,
                });
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// DescribeTimeToLive, mapped to our three states.
    async fn ttl_status(&self) -> Result<TtlStatus, StoreError> {
        retry_throttled(CONTROL_TIMEOUT, |left| {
            let req = self
                .client
                .describe_time_to_live()
                .table_name(&self.table)
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(out) => {
                        let desc = out.time_to_live_description();
                        let status = desc.and_then(|d| d.time_to_live_status());
                        let attribute = desc.and_then(|d| d.attribute_name());
                        let on = matches!(
                            status,
                            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
                        );
                        Ok(if on && attribute == Some(TTL_ATTRIBUTE) {
                            TtlStatus::Enabled
                        } else {
                            TtlStatus::Disabled
                        })
                    }
                    Err(e) => match ttl_unsupported(&e) {
                        Some(reason) => Ok(TtlStatus::Unsupported(reason)),
                        None => Err(classify(&e, &self.table, left)),
                    },
                }
            }
        })
        .await
    }

    /// Turn TTL on for `expires_at` unless it is on already.
    async fn enable_ttl(&self) -> Result<TtlStatus, StoreError> {
        // Enabling twice is an error in DynamoDB, so look first. The describe
        // call alone cannot prove support (dynalite answers it with DISABLED
        // but lacks UpdateTimeToLive).
        let current = retry_throttled(CONTROL_TIMEOUT, |left| {
            let req = self
                .client
                .describe_time_to_live()
                .table_name(&self.table)
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(out) => Ok(Ok(out.time_to_live_description().map(|d| {
                        (
                            d.time_to_live_status().cloned(),
                            d.attribute_name().map(str::to_owned),
                        )
                    }))),
                    Err(e) => match ttl_unsupported(&e) {
                        Some(reason) => Ok(Err(reason)),
                        None => Err(classify(&e, &self.table, left)),
                    },
                }
            }
        })
        .await?;
        let (status, attribute) = match current {
            Ok(Some(found)) => found,
            Ok(None) => (None, None),
            Err(unsupported) => return Ok(TtlStatus::Unsupported(unsupported)),
        };
        match status {
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
                return if attribute.as_deref() == Some(TTL_ATTRIBUTE) {
                    Ok(TtlStatus::Enabled)
                } else {
                    Err(StoreError::Other(format!(
                        "TTL on table `{}` is already enabled on attribute `{}`; leaderd's records expire by `{TTL_ATTRIBUTE}` (DynamoDB allows one TTL attribute per table)",
                        self.table,
                        attribute.as_deref().unwrap_or("?")
                    )))
                };
            }
            Some(TimeToLiveStatus::Disabling) => {
                return Err(StoreError::Other(format!(
                    "TTL on table `{}` is being disabled; try again in about an hour",
                    self.table
                )));
            }
            _ => {}
        }
        let spec = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(TTL_ATTRIBUTE)
            .build()
            .map_err(|e| StoreError::Other(format!("building the TTL specification: {e}")))?;
        retry_throttled(CONTROL_TIMEOUT, |left| {
            let req = self
                .client
                .update_time_to_live()
                .table_name(&self.table)
                .time_to_live_specification(spec.clone())
                .send();
            async move {
                match bounded(left, req).await? {
                    Ok(_) => {
                        tracing::info!(table = %self.table, "enabled TTL on `{TTL_ATTRIBUTE}`");
                        Ok(TtlStatus::Enabled)
                    }
                    Err(e) => match ttl_unsupported(&e) {
                        Some(reason) => {
                            tracing::warn!(table = %self.table, %reason, "TTL not enabled");
                            Ok(TtlStatus::Unsupported(reason))
                        }
                        None => Err(classify(&e, &self.table, left)),
                    },
                }
            }
        })
        .await
    }

    /// Turn a `TableMissing` from a data-plane call into `TableNotActive` when
    /// the table exists but is not ACTIVE yet (DynamoDB answers requests to a
    /// CREATING table with ResourceNotFoundException).
    async fn refine_missing(&self, err: StoreError, deadline: Instant) -> StoreError {
        if !matches!(err, StoreError::TableMissing(_)) {
            return err;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return err;
        }
        match self.describe(left).await {
            Ok(desc) if desc.table_status() != Some(&TableStatus::Active) => {
                StoreError::TableNotActive {
                    table: self.table.clone(),
                    status: table_status(&desc),
                }
            }
            _ => err,
        }
    }
}

#[async_trait]
impl LeaseStore for DynamoStore {
    fn kind(&self) -> &'static str {
        "dynamodb"
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        let deadline = Instant::now() + budget;
        let result = retry_throttled(budget, |left| {
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
                    Err(e) => Err(classify(&e, &self.table, left)),
                }
            }
        })
        .await;
        match result {
            Ok(record) => Ok(record),
            Err(e) => Err(self.refine_missing(e, deadline).await),
        }
    }

    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let deadline = Instant::now() + budget;
        let item = lease_item(lease);
        let cond = condition_expression(condition)?;
        let result = retry_throttled(budget, |left| {
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
                        None => Err(classify(&e, &self.table, left)),
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

    async fn list(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        let deadline = Instant::now() + budget;
        let mut records = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let page = retry_throttled(left, |left| {
                let req = self
                    .client
                    .scan()
                    .table_name(&self.table)
                    .consistent_read(true)
                    .set_exclusive_start_key(start.clone())
                    .send();
                async move {
                    match bounded(left, req).await? {
                        Ok(out) => Ok(out),
                        Err(e) => Err(classify(&e, &self.table, left)),
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

// ---------------------------------------------------------------------------
// Requests: time bounds, throttling retry, error classification.

/// What every client of this store is set to: no SDK retries (this store
/// retries throttling by itself, within each request's budget), the connect
/// limit as the only SDK timeout, and no stalled-stream protection. Each
/// request is bounded by [`bounded`] rather than by a per-request config
/// override, which rebuilds the client's configuration layers on every call.
fn lease_settings(builder: aws_sdk_dynamodb::config::Builder) -> aws_sdk_dynamodb::config::Builder {
    builder
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build(),
        )
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
}

/// Await an SDK request for at most `left`. The outer result is our own
/// timeout (nothing to inspect); the inner one is the SDK's answer. The
/// bound covers the whole call: credential resolution, connecting, sending
/// and reading the answer. A request cut off here is dropped with its
/// connection, so a late answer cannot be mistaken for another's.
async fn bounded<T, E>(
    left: Duration,
    request: impl Future<Output = Result<T, SdkError<E>>>,
) -> Result<Result<T, SdkError<E>>, StoreError> {
    if left.is_zero() {
        // Nothing was sent, but there is no time to send anything either.
        return Err(StoreError::Timeout(left));
    }
    tokio::time::timeout(left, request)
        .await
        .map_err(|_| StoreError::Timeout(left))
}

/// Run `attempt` (given the time left) until it succeeds, fails with anything
/// but `Throttled`, or the next pause would leave less than [`MIN_ATTEMPT`] of
/// `budget`. Pauses grow exponentially with full jitter. Throttled requests
/// were not applied, so repeating them is always safe.
async fn retry_throttled<T, F, Fut>(budget: Duration, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times();
    (|| attempt(deadline.saturating_duration_since(Instant::now())))
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| matches!(e, StoreError::Throttled(_)))
        .adjust(|_, pause| {
            let pause = pause?;
            let left = deadline.saturating_duration_since(Instant::now());
            (pause + MIN_ATTEMPT <= left).then_some(pause)
        })
        .notify(|e, pause| tracing::debug!(error = %e, ?pause, "throttled; retrying"))
        .await
}

/// The error code of a service error, if the server answered with one.
fn service_code<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<&str> {
    match err {
        SdkError::ServiceError(se) => se.err().code(),
        _ => None,
    }
}

/// `Some(old item)` if a PutItem failed its condition; the old item itself is
/// there only if the server returned it.
fn condition_failed(
    err: &SdkError<PutItemError>,
) -> Option<Option<&HashMap<String, AttributeValue>>> {
    match err {
        SdkError::ServiceError(se) => match se.err() {
            PutItemError::ConditionalCheckFailedException(e) => Some(e.item()),
            _ => None,
        },
        _ => None,
    }
}

/// A reason if this error says the server lacks the TTL API.
fn ttl_unsupported<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<String> {
    match service_code(err) {
        Some(code @ ("UnknownOperationException" | "UnsupportedOperationException")) => Some(
            format!("the server does not implement the DynamoDB TTL API (it answered {code})"),
        ),
        _ => None,
    }
}

/// Map an SDK error to our classes. `budget` is what the request was given.
fn classify<E>(err: &SdkError<E>, table: &str, budget: Duration) -> StoreError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    match err {
        SdkError::ServiceError(se) => classify_service(
            se.err().code(),
            se.err().message(),
            se.raw().status().as_u16(),
            table,
        ),
        SdkError::TimeoutError(_) => StoreError::Timeout(budget),
        SdkError::DispatchFailure(df) => {
            if chain(err).any(is_credentials_error) {
                return StoreError::Credentials(describe(err));
            }
            if chain(err).any(is_connect_error) {
                // Nothing reached the server.
                return StoreError::Transport(describe(err));
            }
            match df.as_connector_error() {
                Some(c) if c.is_user() => StoreError::Other(describe(err)),
                Some(c) if c.is_timeout() => StoreError::Timeout(budget),
                // The connection broke after it was established: the request
                // may have been sent and applied. Only a read-back can tell.
                _ => StoreError::Server(format!(
                    "connection lost after sending the request (it may have been applied): {}",
                    describe(err)
                )),
            }
        }
        SdkError::ResponseError(re) => {
            let status = re.raw().status().as_u16();
            if status == 429 {
                StoreError::Throttled(format!("HTTP 429: {}", describe(err)))
            } else {
                // The server got the request; its answer was unreadable.
                StoreError::Server(format!(
                    "unreadable answer (HTTP {status}): {}",
                    describe(err)
                ))
            }
        }
        SdkError::ConstructionFailure(_) if chain(err).any(is_credentials_error) => {
            StoreError::Credentials(describe(err))
        }
        _ => StoreError::Other(describe(err)),
    }
}

/// Map a DynamoDB error code (and HTTP status) to our classes.
fn classify_service(
    code: Option<&str>,
    message: Option<&str>,
    status: u16,
    table: &str,
) -> StoreError {
    let text = match (code, message.map(one_line)) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_owned(),
        (None, Some(m)) => format!("HTTP {status}: {m}"),
        (None, None) => format!("HTTP {status}"),
    };
    match code.unwrap_or_default() {
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "Throttling"
        | "RequestLimitExceeded"
        | "TooManyRequestsException" => StoreError::Throttled(text),
        "ResourceNotFoundException" => StoreError::TableMissing(table.to_owned()),
        "UnrecognizedClientException"
        | "AccessDeniedException"
        | "InvalidSignatureException"
        | "ExpiredTokenException"
        | "ExpiredToken"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "IncompleteSignatureException"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException" => StoreError::Credentials(text),
        "InternalServerError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "ServiceUnavailableException" => StoreError::Server(text),
        // The table's key is not `election` (S): no request can ever work.
        "ValidationException"
            if message.is_some_and(|m| m.contains("key element does not match the schema")) =>
        {
            StoreError::WrongSchema {
                table: table.to_owned(),
                detail: text,
            }
        }
        _ if status >= 500 => StoreError::Server(text),
        _ if status == 429 => StoreError::Throttled(text),
        _ => StoreError::Other(text),
    }
}

/// An error and its sources. Steps into an `io::Error`'s payload, which
/// `io::Error::source` skips.
fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|p| p as &(dyn StdError + 'static)),
        None => e.source(),
    })
}

/// One line for logs: each cause's message once, outermost first (the SDK's
/// own `DisplayErrorContext` appends a multi-line debug dump).
fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in chain(err) {
        let text = one_line(&e.to_string());
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Text from the SDK or a server on one line: a log line is one line, even
/// for the credential chain's list of every provider it tried.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_credentials_error(e: &(dyn StdError + 'static)) -> bool {
    e.is::<aws_credential_types::provider::error::CredentialsError>()
}

/// Whether this error proves the connection was never established.
fn is_connect_error(e: &(dyn StdError + 'static)) -> bool {
    use std::io::ErrorKind::*;
    if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        return h.is_connect();
    }
    match e.downcast_ref::<std::io::Error>() {
        Some(io) => matches!(
            io.kind(),
            ConnectionRefused | AddrNotAvailable | NetworkUnreachable | HostUnreachable
        ),
        None => false,
    }
}

// ---------------------------------------------------------------------------
// Table description.

fn table_status(desc: &TableDescription) -> String {
    desc.table_status()
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|| "UNKNOWN".to_owned())
}

fn table_info(table: &str, desc: &TableDescription, ttl: TtlStatus) -> TableInfo {
    TableInfo {
        name: desc.table_name().unwrap_or(table).to_owned(),
        status: table_status(desc),
        billing_mode: desc
            .billing_mode_summary()
            .and_then(|b| b.billing_mode())
            .map(|m| m.as_str().to_owned()),
        item_count: desc.item_count(),
        key_schema_ok: key_schema_problem(desc).is_none(),
        ttl,
    }
}

/// What is wrong with the key schema, if anything: it must be exactly
/// `election` (S) as the partition key, with no sort key.
fn key_schema_problem(desc: &TableDescription) -> Option<String> {
    let keys: Vec<String> = desc
        .key_schema()
        .iter()
        .map(|k| {
            let ty = desc
                .attribute_definitions()
                .iter()
                .find(|a| a.attribute_name() == k.attribute_name())
                .map(|a| a.attribute_type().as_str())
                .unwrap_or("?");
            format!("`{}` ({ty}, {})", k.attribute_name(), k.key_type().as_str())
        })
        .collect();
    let expected = format!("`{KEY}` (S, HASH)");
    if keys.len() == 1 && keys[0] == expected {
        return None;
    }
    let found = if keys.is_empty() {
        "none".to_owned()
    } else {
        keys.join(" + ")
    };
    Some(format!(
        "key is {found}; leaderd needs {expected} only (use another table name or recreate the table)"
    ))
}

// ---------------------------------------------------------------------------
// Items: the lease record <-> DynamoDB attributes.

fn lease_item(lease: &Lease) -> HashMap<String, AttributeValue> {
    let n = |v: u64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        (KEY.to_owned(), AttributeValue::S(lease.election.clone())),
        ("rvn".to_owned(), AttributeValue::S(lease.rvn.clone())),
        ("fencing_token".to_owned(), n(lease.fencing_token)),
        ("lease_ms".to_owned(), n(lease.lease_ms)),
        ("acquired_at".to_owned(), n(lease.acquired_at_ms)),
        ("renewed_at".to_owned(), n(lease.renewed_at_ms)),
        (TTL_ATTRIBUTE.to_owned(), n(lease.expires_at_s)),
    ]);
    // A released lease carries neither holder nor holder metadata.
    if let Some(holder) = &lease.holder {
        item.insert("holder".to_owned(), AttributeValue::S(holder.clone()));
        if let Some(meta) = &lease.holder_meta {
            let mut m = HashMap::new();
            if let Some(address) = &meta.address {
                m.insert("address".to_owned(), AttributeValue::S(address.clone()));
            }
            let labels = meta
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), AttributeValue::S(v.clone())))
                .collect();
            m.insert("labels".to_owned(), AttributeValue::M(labels));
            item.insert("holder_meta".to_owned(), AttributeValue::M(m));
        }
    }
    item
}

/// A read item as a record; never fails, never panics.
fn parse_item(election: &str, item: &HashMap<String, AttributeValue>) -> Record {
    match parse_lease(item) {
        Ok(lease) => Record::Valid(lease),
        Err(problem) => Record::Malformed(Malformed {
            election: match item.get(KEY) {
                Some(AttributeValue::S(name)) => name.clone(),
                _ => election.to_owned(),
            },
            problem,
            fingerprint: fingerprint(item),
            fencing_token: item.get("fencing_token").and_then(|v| number(v).ok()),
            guard: match item.get("rvn") {
                None => RvnGuard::Missing,
                Some(raw) => RvnGuard::Raw(encode_value(raw)),
            },
        }),
    }
}

fn parse_lease(item: &HashMap<String, AttributeValue>) -> Result<Lease, String> {
    let required = |name: &str| {
        item.get(name)
            .ok_or_else(|| format!("attribute `{name}` is missing"))
    };
    let string = |name: &str| {
        required(name).and_then(|v| match v {
            AttributeValue::S(s) => Ok(s.clone()),
            other => Err(wrong_type(name, other, "S")),
        })
    };
    let num = |name: &str| {
        required(name).and_then(|v| number(v).map_err(|e| format!("attribute `{name}` {e}")))
    };
    let holder = match item.get("holder") {
        None => None,
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("holder", other, "S")),
    };
    Ok(Lease {
        election: string(KEY)?,
        rvn: string("rvn")?,
        holder,
        fencing_token: num("fencing_token")?,
        lease_ms: num("lease_ms")?,
        acquired_at_ms: num("acquired_at")?,
        renewed_at_ms: num("renewed_at")?,
        expires_at_s: num(TTL_ATTRIBUTE)?,
        holder_meta: parse_meta(item.get("holder_meta"))?,
    })
}

fn parse_meta(value: Option<&AttributeValue>) -> Result<Option<HolderMeta>, String> {
    let m = match value {
        None => return Ok(None),
        Some(AttributeValue::M(m)) => m,
        Some(other) => return Err(wrong_type("holder_meta", other, "M")),
    };
    let address = match m.get("address") {
        None => None,
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("holder_meta.address", other, "S")),
    };
    let mut meta = HolderMeta {
        address,
        ..HolderMeta::default()
    };
    match m.get("labels") {
        None => {}
        Some(AttributeValue::M(labels)) => {
            for (k, v) in labels {
                match v {
                    AttributeValue::S(s) => {
                        meta.labels.insert(k.clone(), s.clone());
                    }
                    other => {
                        return Err(wrong_type(&format!("holder_meta.labels.{k}"), other, "S"));
                    }
                }
            }
        }
        Some(other) => return Err(wrong_type("holder_meta.labels", other, "M")),
    }
    Ok(Some(meta))
}

/// An N attribute holding a non-negative integer.
fn number(v: &AttributeValue) -> Result<u64, String> {
    match v {
        AttributeValue::N(n) => n
            .parse::<u64>()
            .map_err(|_| format!("is not a non-negative integer: {n:?}")),
        other => Err(format!("is {}, expected N", type_name(other))),
    }
}

fn wrong_type(name: &str, v: &AttributeValue, expected: &str) -> String {
    format!(
        "attribute `{name}` is {}, expected {expected}",
        type_name(v)
    )
}

fn type_name(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::S(_) => "S",
        AttributeValue::N(_) => "N",
        AttributeValue::B(_) => "B",
        AttributeValue::Ss(_) => "SS",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::M(_) => "M",
        AttributeValue::L(_) => "L",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::Bool(_) => "BOOL",
        _ => "an unknown type",
    }
}

/// A digest of the whole item that changes whenever any attribute does.
/// Compared only within one process, so a fixed-key SipHash suffices.
fn fingerprint(item: &HashMap<String, AttributeValue>) -> String {
    let mut keys: Vec<&String> = item.keys().collect();
    keys.sort();
    let canonical: serde_json::Map<String, serde_json::Value> = keys
        .into_iter()
        .map(|k| (k.clone(), to_json(&item[k])))
        .collect();
    let mut h = std::hash::DefaultHasher::new();
    serde_json::Value::Object(canonical)
        .to_string()
        .hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Our encoding of a raw attribute value (DynamoDB's JSON form, sets sorted)
/// for `RvnGuard::Raw`; [`decode_value`] inverts it.
fn encode_value(v: &AttributeValue) -> String {
    to_json(v).to_string()
}

fn decode_value(s: &str) -> Option<AttributeValue> {
    from_json(&serde_json::from_str(s).ok()?)
}

fn to_json(v: &AttributeValue) -> serde_json::Value {
    use serde_json::{Value, json};
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => json!({ "B": text::hex(b.as_ref()) }),
        AttributeValue::Ss(v) => json!({ "SS": sorted(v) }),
        AttributeValue::Ns(v) => json!({ "NS": sorted(v) }),
        AttributeValue::Bs(v) => {
            let mut v: Vec<String> = v.iter().map(|b| text::hex(b.as_ref())).collect();
            v.sort();
            json!({ "BS": v })
        }
        AttributeValue::M(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let map: serde_json::Map<String, Value> = keys
                .into_iter()
                .map(|k| (k.clone(), to_json(&m[k])))
                .collect();
            json!({ "M": map })
        }
        AttributeValue::L(l) => json!({ "L": l.iter().map(to_json).collect::<Vec<_>>() }),
        AttributeValue::Null(b) => json!({ "NULL": b }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        _ => json!({ "UNKNOWN": null }),
    }
}

fn from_json(v: &serde_json::Value) -> Option<AttributeValue> {
    let obj = v.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    let (ty, v) = obj.iter().next()?;
    let strings = |v: &serde_json::Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    Some(match ty.as_str() {
        "S" => AttributeValue::S(v.as_str()?.to_owned()),
        "N" => AttributeValue::N(v.as_str()?.to_owned()),
        "B" => AttributeValue::B(Blob::new(unhex(v.as_str()?)?)),
        "SS" => AttributeValue::Ss(strings(v)?),
        "NS" => AttributeValue::Ns(strings(v)?),
        "BS" => AttributeValue::Bs(
            strings(v)?
                .iter()
                .map(|s| unhex(s).map(Blob::new))
                .collect::<Option<_>>()?,
        ),
        "M" => AttributeValue::M(
            v.as_object()?
                .iter()
                .map(|(k, v)| Some((k.clone(), from_json(v)?)))
                .collect::<Option<_>>()?,
        ),
        "L" => AttributeValue::L(v.as_array()?.iter().map(from_json).collect::<Option<_>>()?),
        "NULL" => AttributeValue::Null(v.as_bool()?),
        "BOOL" => AttributeValue::Bool(v.as_bool()?),
        _ => return None,
    })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

// ---------------------------------------------------------------------------
// Conditions: the rules of `Condition::holds` as condition expressions.

/// A condition expression with its names and values.
struct ConditionExpression {
    expression: &'static str,
    names: HashMap<String, String>,
    /// `None` when empty: DynamoDB rejects an empty value map.
    values: Option<HashMap<String, AttributeValue>>,
}

fn condition_expression(condition: &Condition) -> Result<ConditionExpression, StoreError> {
    // Attribute names go through placeholders so that no name can collide
    // with a DynamoDB reserved word; unused placeholders are an error there.
    let names = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(p, n)| ((*p).to_owned(), (*n).to_owned()))
            .collect::<HashMap<_, _>>()
    };
    let s = |v: &str| AttributeValue::S(v.to_owned());
    Ok(match condition {
        Condition::NotExists => ConditionExpression {
            expression: "attribute_not_exists(#e)",
            names: names(&[("#e", KEY)]),
            values: None,
        },
        // The numeric attributes' types are part of the condition: an item
        // another tool corrupted is malformed, and only
        // `Unchanged` may overwrite it, as in every other store.
        Condition::RvnIs(rvn) => ConditionExpression {
            expression: "#r = :r AND attribute_type(#t, :n) AND attribute_type(#l, :n)",
            names: names(&[("#r", "rvn"), ("#t", "fencing_token"), ("#l", "lease_ms")]),
            values: Some(HashMap::from([
                (":r".to_owned(), s(rvn)),
                (":n".to_owned(), s("N")),
            ])),
        },
        Condition::HeldBy { rvn, holder } => ConditionExpression {
            expression: "#r = :r AND #h = :h AND attribute_type(#t, :n) AND attribute_type(#l, :n)",
            names: names(&[
                ("#r", "rvn"),
                ("#h", "holder"),
                ("#t", "fencing_token"),
                ("#l", "lease_ms"),
            ]),
            values: Some(HashMap::from([
                (":r".to_owned(), s(rvn)),
                (":h".to_owned(), s(holder)),
                (":n".to_owned(), s("N")),
            ])),
        },
        Condition::Unchanged(RvnGuard::Raw(raw)) => {
            let value = decode_value(raw).ok_or_else(|| {
                StoreError::Other(format!(
                    "rvn guard {raw:?} was not produced by the DynamoDB store"
                ))
            })?;
            ConditionExpression {
                expression: "#r = :raw",
                names: names(&[("#r", "rvn")]),
                values: Some(HashMap::from([(":raw".to_owned(), value)])),
            }
        }
        Condition::Unchanged(RvnGuard::Missing) => ConditionExpression {
            expression: "attribute_exists(#e) AND attribute_not_exists(#r)",
            names: names(&[("#e", KEY), ("#r", "rvn")]),
            values: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_sdk_dynamodb::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;

    use super::*;

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(status.try_into().expect("valid status code"), "".into())
    }

    fn service_error(code: &str, status: u16) -> SdkError<GetItemError> {
        let meta = ErrorMetadata::builder()
            .code(code)
            .message("said the server")
            .build();
        SdkError::service_error(GetItemError::generic(meta), response(status))
    }

    fn classified(err: SdkError<GetItemError>) -> StoreError {
        classify(&err, "leases", Duration::from_secs(1))
    }

    #[test]
    fn service_errors_are_classified_by_code() {
        for code in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
        ] {
            assert!(
                matches!(
                    classified(service_error(code, 400)),
                    StoreError::Throttled(_)
                ),
                "{code}"
            );
        }
        assert_eq!(
            classified(service_error("ResourceNotFoundException", 400)),
            StoreError::TableMissing("leases".into())
        );
        for code in [
            "UnrecognizedClientException",
            "AccessDeniedException",
            "InvalidSignatureException",
            "ExpiredTokenException",
        ] {
            let e = classified(service_error(code, 400));
            assert!(
                matches!(&e, StoreError::Credentials(m) if m.contains(code)),
                "{code}: {e:?}"
            );
        }
        for (code, status) in [
            ("InternalServerError", 500),
            ("ServiceUnavailable", 503),
            ("SomethingNew", 502),
        ] {
            assert!(
                matches!(
                    classified(service_error(code, status)),
                    StoreError::Server(_)
                ),
                "{code}"
            );
        }
        let e = classified(service_error("ValidationException", 400));
        assert_eq!(
            e,
            StoreError::Other("ValidationException: said the server".into())
        );
    }

    #[test]
    fn transport_failures_before_sending_are_not_ambiguous() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = classified(SdkError::dispatch_failure(ConnectorError::io(Box::new(
            refused,
        ))));
        assert!(matches!(e, StoreError::Transport(_)), "{e:?}");
        assert!(!e.maybe_applied());

        // A connection that broke later may have carried the request.
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = classified(SdkError::dispatch_failure(ConnectorError::io(Box::new(
            reset,
        ))));
        assert!(e.maybe_applied(), "{e:?}");

        let e = classified(SdkError::timeout_error("attempt timed out"));
        assert_eq!(e, StoreError::Timeout(Duration::from_secs(1)));
        assert!(e.maybe_applied());
    }

    #[test]
    fn missing_credentials_are_a_credentials_error() {
        let missing = aws_credential_types::provider::error::CredentialsError::not_loaded(
            "no providers in chain provided credentials",
        );
        let e = classified(SdkError::dispatch_failure(ConnectorError::other(
            Box::new(missing),
            None,
        )));
        assert!(matches!(e, StoreError::Credentials(_)), "{e:?}");
        assert!(!e.maybe_applied());
    }

    #[test]
    fn failed_condition_yields_the_old_item_when_given() {
        let old = lease_item(&sample_lease());
        let err = ConditionalCheckFailedException::builder()
            .set_item(Some(old.clone()))
            .build();
        let e: SdkError<PutItemError> = SdkError::service_error(
            PutItemError::ConditionalCheckFailedException(err),
            response(400),
        );
        assert_eq!(condition_failed(&e), Some(Some(&old)));
        let e: SdkError<PutItemError> = SdkError::service_error(
            PutItemError::ConditionalCheckFailedException(
                ConditionalCheckFailedException::builder().build(),
            ),
            response(400),
        );
        assert_eq!(condition_failed(&e), Some(None));
    }

    fn sample_lease() -> Lease {
        Lease {
            election: "report".into(),
            holder: Some("web-1".into()),
            rvn: "abc".into(),
            fencing_token: 7,
            lease_ms: 10_000,
            acquired_at_ms: 1_700_000_000_000,
            renewed_at_ms: 1_700_000_005_000,
            expires_at_s: 1_700_000_015,
            holder_meta: Some(HolderMeta {
                address: Some("10.0.0.1:9777".into()),
                labels: [("zone".to_owned(), "a".to_owned())].into(),
            }),
        }
    }

    #[test]
    fn lease_round_trips_and_release_drops_holder_meta() {
        let lease = sample_lease();
        assert_eq!(
            parse_item("report", &lease_item(&lease)),
            Record::Valid(lease.clone())
        );
        let released = Lease {
            holder: None,
            ..lease
        };
        let item = lease_item(&released);
        assert!(!item.contains_key("holder") && !item.contains_key("holder_meta"));
        assert_eq!(
            parse_item("report", &item),
            Record::Valid(Lease {
                holder_meta: None,
                ..released
            })
        );
    }

    fn malformed(item: &HashMap<String, AttributeValue>) -> Malformed {
        match parse_item("report", item) {
            Record::Malformed(m) => m,
            other => panic!("expected a malformed record, got {other:?}"),
        }
    }

    #[test]
    fn malformed_items_name_the_attribute() {
        let good = lease_item(&sample_lease());

        let mut item = good.clone();
        item.remove("rvn");
        let m = malformed(&item);
        assert_eq!(m.problem, "attribute `rvn` is missing");
        assert_eq!(m.guard, RvnGuard::Missing);
        assert_eq!(m.fencing_token, Some(7));
        assert_eq!(m.election, "report");

        let mut item = good.clone();
        item.insert("rvn".into(), AttributeValue::N("42".into()));
        item.insert("fencing_token".into(), AttributeValue::S("7".into()));
        let m = malformed(&item);
        assert_eq!(m.problem, "attribute `rvn` is N, expected S");
        assert_eq!(m.fencing_token, None);
        let RvnGuard::Raw(raw) = &m.guard else {
            panic!("guard should carry the raw rvn")
        };
        assert_eq!(decode_value(raw), Some(AttributeValue::N("42".into())));

        let mut item = good.clone();
        item.insert("lease_ms".into(), AttributeValue::N("-5".into()));
        assert!(malformed(&item).problem.contains("`lease_ms`"));

        let mut item = good.clone();
        item.insert(
            "holder_meta".into(),
            AttributeValue::M(HashMap::from([(
                "labels".into(),
                AttributeValue::M(HashMap::from([("zone".into(), AttributeValue::Bool(true))])),
            )])),
        );
        assert_eq!(
            malformed(&item).problem,
            "attribute `holder_meta.labels.zone` is BOOL, expected S"
        );

        let mut item = good;
        item.insert("holder".into(), AttributeValue::Null(true));
        assert_eq!(
            malformed(&item).problem,
            "attribute `holder` is NULL, expected S"
        );
    }

    #[test]
    fn fingerprint_changes_with_any_attribute_and_ignores_order() {
        let mut item = lease_item(&sample_lease());
        item.remove("rvn");
        item.insert(
            "tags".into(),
            AttributeValue::Ss(vec!["b".into(), "a".into()]),
        );
        let before = fingerprint(&item);
        let mut reordered = item.clone();
        reordered.insert(
            "tags".into(),
            AttributeValue::Ss(vec!["a".into(), "b".into()]),
        );
        assert_eq!(fingerprint(&reordered), before);
        item.insert("renewed_at".into(), AttributeValue::N("1".into()));
        assert_ne!(fingerprint(&item), before);
    }

    #[test]
    fn every_attribute_type_round_trips_through_the_guard_encoding() {
        let values = [
            AttributeValue::S("x".into()),
            AttributeValue::N("1.5".into()),
            AttributeValue::B(Blob::new(vec![0, 255, 16])),
            AttributeValue::Ss(vec!["a".into(), "b".into()]),
            AttributeValue::Ns(vec!["1".into(), "2".into()]),
            AttributeValue::Bs(vec![Blob::new(vec![1]), Blob::new(vec![2])]),
            AttributeValue::M(HashMap::from([("k".into(), AttributeValue::Bool(false))])),
            AttributeValue::L(vec![
                AttributeValue::Null(true),
                AttributeValue::S("y".into()),
            ]),
            AttributeValue::Null(true),
            AttributeValue::Bool(true),
        ];
        for v in values {
            assert_eq!(decode_value(&encode_value(&v)), Some(v.clone()));
        }
        assert_eq!(decode_value("not json"), None);
        assert_eq!(decode_value(r#"{"B":"abc"}"#), None);
        assert!(matches!(
            condition_expression(&Condition::Unchanged(RvnGuard::Raw("x".into()))),
            Err(StoreError::Other(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_is_retried_until_success() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let result = retry_throttled(Duration::from_secs(5), |left| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(left <= Duration::from_secs(5));
                if n < 3 {
                    Err(StoreError::Throttled("slow down".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(result, Ok(3));
        // Three pauses of at most 20, 40, 80 ms, each plus up to its own jitter.
        assert!(started.elapsed() <= Duration::from_millis(280));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_retries_stop_within_the_budget() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let budget = Duration::from_secs(2);
        let result: Result<(), _> = retry_throttled(budget, |left| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                // Every attempt is given what is left, and at least MIN_ATTEMPT.
                assert!(left >= MIN_ATTEMPT && left <= budget, "{left:?}");
                Err(StoreError::Throttled("slow down".into()))
            }
        })
        .await;
        assert_eq!(result, Err(StoreError::Throttled("slow down".into())));
        assert!(started.elapsed() <= budget);
        assert!(calls.load(Ordering::SeqCst) >= 4, "retried a few times");
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_are_not_retried() {
        for err in [
            StoreError::Timeout(Duration::from_secs(1)),
            StoreError::Transport("refused".into()),
            StoreError::Credentials("expired".into()),
        ] {
            let calls = AtomicU32::new(0);
            let result: Result<(), _> = retry_throttled(Duration::from_secs(5), |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                let err = err.clone();
                async move { Err(err) }
            })
            .await;
            assert_eq!(result, Err(err));
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
    }
}
