//! `leaderd table create|describe`: provision and inspect the DynamoDB table.

use std::time::Duration;

use super::tool::{self, ToolError};
use super::{TableAction, TableArgs};
use crate::config::StoreKind;
use crate::exit;
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

/// `leaderd table create|describe`: manage the DynamoDB table. A table with
/// the wrong key schema is an error (exit 69): leaderd cannot use it, and it
/// will not fix itself.
pub async fn run(args: TableArgs) -> Result<(), ToolError> {
    let store_args = match &args.action {
        TableAction::Create(a) => &a.store,
        TableAction::Describe(a) => &a.store,
    };
    let cfg = tool::config(store_args)?;
    if cfg.store.kind != StoreKind::Dynamodb {
        return Err(ToolError::new(
            exit::CONFIG,
            "`leaderd table` manages a DynamoDB table: set --store dynamodb (or store.kind = \"dynamodb\")",
        ));
    }
    let config = cfg
        .store
        .dynamo()
        .resolve()
        .await
        .map_err(|e| ToolError::new(exit::UNAVAILABLE, e.to_string()))?;
    let store = DynamoStore::new(&config).await;
    let info = match &args.action {
        TableAction::Create(a) => create(&store, a.ttl, a.wait).await,
        TableAction::Describe(_) => describe(&store).await,
    }
    .map_err(|e| ToolError::new(exit::UNAVAILABLE, e.to_string()))?;
    print!("{}", render_text(&info));
    if !info.key_schema_ok {
        return Err(ToolError::new(
            exit::UNAVAILABLE,
            format!(
                "table `{}` has the wrong key schema: leaderd needs the partition key `election` (S) and no sort key",
                info.name
            ),
        ));
    }
    Ok(())
}
