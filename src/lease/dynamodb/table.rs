//! Table administration: create (on demand, with TTL), describe, wait until
//! ACTIVE, and the key-schema check that tells a table leaderd cannot use.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
};
use tokio::time::Instant;

use super::errors::{Action, bounded, classify, retry_throttled, service_code, ttl_unsupported};
use super::{CONTROL_TIMEOUT, DynamoStore, KEY, TTL_ATTRIBUTE};
use crate::lease::StoreError;

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

/// What DescribeTimeToLive reported: its status and attribute, if any.
type TtlState = Option<(Option<TimeToLiveStatus>, Option<String>)>;

impl DynamoStore {
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
                    Err(e) => Err(classify(&e, Action::CreateTable, &self.table, left)),
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

    /// Whether TTL is on for `expires_at` (DescribeTimeToLive).
    pub async fn ttl(&self) -> Result<TtlStatus, StoreError> {
        self.ttl_status().await
    }

    /// DescribeTable within `budget` (throttling retried).
    pub(super) async fn describe(&self, budget: Duration) -> Result<TableDescription, StoreError> {
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
                    Err(e) => Err(classify(&e, Action::DescribeTable, &self.table, left)),
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

    /// DescribeTimeToLive: the status and attribute it reports (`None` for
    /// no description), or why the server has no TTL API.
    async fn describe_ttl(&self) -> Result<Result<TtlState, String>, StoreError> {
        retry_throttled(CONTROL_TIMEOUT, |left| {
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
                        None => Err(classify(&e, Action::DescribeTimeToLive, &self.table, left)),
                    },
                }
            }
        })
        .await
    }

    /// DescribeTimeToLive, mapped to our three states.
    async fn ttl_status(&self) -> Result<TtlStatus, StoreError> {
        Ok(match self.describe_ttl().await? {
            Err(reason) => TtlStatus::Unsupported(reason),
            Ok(Some((
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling),
                Some(attribute),
            ))) if attribute == TTL_ATTRIBUTE => TtlStatus::Enabled,
            Ok(_) => TtlStatus::Disabled,
        })
    }

    /// Turn TTL on for `expires_at` unless it is on already.
    async fn enable_ttl(&self) -> Result<TtlStatus, StoreError> {
        // Enabling twice is an error in DynamoDB, so look first. The describe
        // call alone cannot prove support (dynalite answers it with DISABLED
        // but lacks UpdateTimeToLive).
        let current = self.describe_ttl().await?;
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
                        None => Err(classify(&e, Action::UpdateTimeToLive, &self.table, left)),
                    },
                }
            }
        })
        .await
    }

    /// Turn a `TableMissing` from a data-plane call into `TableNotActive` when
    /// the table exists but is not ACTIVE yet (DynamoDB answers requests to a
    /// CREATING table with ResourceNotFoundException).
    pub(super) async fn refine_missing(&self, err: StoreError, deadline: Instant) -> StoreError {
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

// ---------------------------------------------------------------------------
// Table description.

pub(super) fn table_status(desc: &TableDescription) -> String {
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
pub(super) fn key_schema_problem(desc: &TableDescription) -> Option<String> {
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
