//! `leaderd table create|describe`: provision and inspect the DynamoDB table.

use std::time::Duration;

use serde_json::json;

use crate::lease::StoreError;
use crate::lease::dynamodb::{DynamoStore, TableInfo, TtlStatus};

/// Create the table (on-demand, key `election`), wait until ACTIVE, and
/// optionally enable TTL on `expires_at`. Returns the description to print.
pub async fn create(
    store: &DynamoStore,
    ttl: bool,
    wait: Duration,
) -> Result<TableInfo, StoreError> {
    store.create_table(ttl, wait).await
}

/// Describe the table.
pub async fn describe(store: &DynamoStore) -> Result<TableInfo, StoreError> {
    store.describe_table().await
}

/// Human-readable description.
pub fn render_text(info: &TableInfo) -> String {
    let ttl = match &info.ttl {
        TtlStatus::Enabled => "enabled on expires_at".to_owned(),
        TtlStatus::Disabled => "disabled".to_owned(),
        TtlStatus::Unsupported(why) => format!("not supported by this server ({why})"),
    };
    format!(
        "table:        {}\nstatus:       {}\nbilling:      {}\nkey schema:   {}\nitems:        {}\nttl:          {}\n",
        info.name,
        info.status,
        info.billing_mode.as_deref().unwrap_or("-"),
        if info.key_schema_ok {
            "ok (election: S, HASH)"
        } else {
            "WRONG (leaderd needs partition key `election` of type S)"
        },
        info.item_count
            .map_or_else(|| "-".to_owned(), |c| c.to_string()),
        ttl,
    )
}

/// JSON description.
pub fn render_json(info: &TableInfo) -> String {
    let ttl = match &info.ttl {
        TtlStatus::Enabled => json!({"status": "enabled", "attribute": "expires_at"}),
        TtlStatus::Disabled => json!({"status": "disabled"}),
        TtlStatus::Unsupported(why) => json!({"status": "unsupported", "reason": why}),
    };
    let v = json!({
        "table": info.name,
        "status": info.status,
        "billing_mode": info.billing_mode,
        "key_schema_ok": info.key_schema_ok,
        "item_count": info.item_count,
        "ttl": ttl,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}
