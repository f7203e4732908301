//! `leaderd table create|describe`: provision and inspect the DynamoDB or
//! PostgreSQL table (`create --print`: the PostgreSQL table's SQL, for a
//! DBA who creates it by hand).

use std::time::Duration;

use super::tool::{self, ToolError};
use super::{TableAction, TableArgs};
use crate::config::StoreKind;
use crate::exit;
use crate::lease::StoreError;
use crate::lease::dynamodb::{DynamoStore, TableInfo, TtlStatus};
use crate::lease::postgres::{PostgresStore, quoted_table, schema};
use crate::lease::{LeaseStore, StoreSpec};

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

/// The PostgreSQL table's SQL: the statement that creates it and the grant
/// leaderd's role needs (`ROLE`: put the role's name there).
pub fn postgres_sql(table: &str) -> String {
    format!(
        "{};\nGRANT {} ON {} TO ROLE;\n",
        schema::create_sql(&quoted_table(table)),
        schema::PRIVILEGES.join(", "),
        quoted_table(table)
    )
}

/// How long creating or checking the PostgreSQL table may take.
const POSTGRES_BUDGET: Duration = Duration::from_secs(30);

/// `leaderd table create|describe` on PostgreSQL: create the table (or
/// find it there) and check it as `run` does, or describe it.
async fn postgres(cfg: &crate::config::ToolConfig, create: bool) -> Result<(), ToolError> {
    let unavailable = |e: StoreError| ToolError::new(exit::UNAVAILABLE, e.to_string());
    let StoreSpec::Postgres { config, .. } = cfg.store.spec() else {
        unreachable!("called for store.kind = postgres only");
    };
    let store = PostgresStore::new(&config).map_err(unavailable)?;
    if create {
        store
            .create_table(POSTGRES_BUDGET)
            .await
            .map_err(unavailable)?;
    }
    store.check(POSTGRES_BUDGET).await.map_err(unavailable)?;
    let what = if create { "created or found" } else { "found" };
    tool::print(&format!(
        "table:        {}\nserver:       {}\nstatus:       {what}: columns, key (election) and privileges ({}) as leaderd needs\n",
        store.table(),
        store.server(),
        schema::PRIVILEGES.join(", ")
    ))
    .map_err(|e| ToolError::new(exit::IOERR, format!("cannot write the description: {e}")))
}

/// `leaderd table create|describe`: manage the DynamoDB or PostgreSQL table.
/// A table with the wrong key schema is an error (exit 69): leaderd cannot
/// use it, and it will not fix itself.
pub async fn run(args: TableArgs) -> Result<(), ToolError> {
    let (store_args, print) = match &args.action {
        TableAction::Create(a) => (&a.store, a.print),
        TableAction::Describe(a) => (&a.store, false),
    };
    if print {
        // The SQL needs only the table's name: a URL is not asked for.
        let mut store_args = store_args.clone();
        store_args
            .store_url
            .get_or_insert_with(|| "postgres://localhost/".to_owned());
        let cfg = tool::config(&store_args)?;
        if cfg.store.kind != StoreKind::Postgres {
            return Err(ToolError::new(
                exit::CONFIG,
                "`leaderd table create --print` prints the PostgreSQL table's SQL: set --store postgres (or store.kind = \"postgres\")",
            ));
        }
        return tool::print(&postgres_sql(&cfg.store.table))
            .map_err(|e| ToolError::new(exit::IOERR, format!("cannot write the SQL: {e}")));
    }
    let cfg = tool::config(store_args)?;
    match cfg.store.kind {
        StoreKind::Dynamodb => {}
        StoreKind::Postgres => {
            return postgres(&cfg, matches!(args.action, TableAction::Create(_))).await;
        }
        StoreKind::Sqlite => {
            return Err(ToolError::new(
                exit::CONFIG,
                "`leaderd table` manages a DynamoDB or PostgreSQL table (`leaderd run` creates the SQLite file's): set --store dynamodb or --store postgres (or store.kind)",
            ));
        }
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
