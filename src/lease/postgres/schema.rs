//! The lease table: the SQL that creates it (`leaderd table create --store
//! postgres`, `--print` for a DBA), and the check that a table is one
//! leaderd can use: its columns and their types, keyed by `election`
//! alone, and the privileges leaderd's role holds on it.

use tokio_postgres::Client;

use super::codec::COLUMNS;
use super::errors::Names;
use crate::lease::StoreError;

/// Each column's type as `format_type` names it. The key is compared byte
/// by byte (`COLLATE "C"`), so that the ranges that find member and
/// session records are the same on every database, whatever its locale.
pub(super) const TYPES: [(&str, &str); 12] = [
    ("election", "text"),
    ("holder", "text"),
    ("rvn", "text"),
    ("fencing_token", "bigint"),
    ("lease_ms", "bigint"),
    ("acquired_at", "bigint"),
    ("renewed_at", "bigint"),
    ("expires_at", "bigint"),
    ("holder_meta", "jsonb"),
    ("successor", "text"),
    ("format", "bigint"),
    ("session", "text"),
];

/// The privileges leaderd's role needs on the table: reads, conditional
/// writes (an insert that meets a row updates it to itself), and the
/// deletion of ended sessions and of `leaderd check`'s scratch records.
pub const PRIVILEGES: [&str; 4] = ["SELECT", "INSERT", "UPDATE", "DELETE"];

/// `CREATE TABLE IF NOT EXISTS` for `table` (quoted as SQL reads it).
pub fn create_sql(table: &str) -> String {
    debug_assert!(TYPES.iter().map(|(c, _)| *c).eq(COLUMNS));
    let columns = TYPES
        .iter()
        .map(|(column, ty)| match *column {
            "election" => format!("    {column:<13} {ty} COLLATE \"C\" PRIMARY KEY"),
            _ => format!("    {column:<13} {ty}"),
        })
        .collect::<Vec<_>>()
        .join(",\n");
    format!("CREATE TABLE IF NOT EXISTS {table} (\n{columns}\n)")
}

/// Create the table unless it exists. An existing one is left alone
/// without a `CREATE`, which would need the privilege to create in its
/// schema even when it skips the table. `CREATE TABLE IF NOT EXISTS` is not
/// safe against itself: of several run at once, PostgreSQL can fail all but
/// one with a duplicate key in its catalog (the table's name, or its row
/// type's). So creators of the same table queue on a transaction-scoped
/// advisory lock named after it, and the statement runs in the lock's
/// transaction; a duplicate error that still comes (a creator that is not
/// leaderd) means the table was made, once that is seen.
pub async fn create(client: &Client, table: &str) -> Result<(), tokio_postgres::Error> {
    use tokio_postgres::error::SqlState;
    if exists(client, table).await? {
        return Ok(());
    }
    // One simple query of two statements is one transaction: the lock is
    // held until the `CREATE` commits.
    let batch = format!(
        "SELECT pg_advisory_xact_lock({}); {}",
        lock_key(table),
        create_sql(table)
    );
    match client.batch_execute(&batch).await {
        Err(e)
            if matches!(
                e.code(),
                Some(
                    &SqlState::UNIQUE_VIOLATION
                        | &SqlState::DUPLICATE_TABLE
                        | &SqlState::DUPLICATE_OBJECT
                )
            ) && exists(client, table).await? =>
        {
            Ok(())
        }
        other => other,
    }
}

/// The advisory lock key of creating `table` (quoted): FNV-1a of the name,
/// the same in every build, so any two leaderd versions queue on it.
fn lock_key(table: &str) -> i64 {
    let hash = format!("leaderd table create {table}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Whether the table `table` (quoted) exists.
async fn exists(client: &Client, table: &str) -> Result<bool, tokio_postgres::Error> {
    client
        .query_typed_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[(&table, tokio_postgres::types::Type::TEXT)],
        )
        .await?
        .try_get(0)
}

/// What is wrong with the table `quoted` for leaderd's role, which needs
/// the privileges `needed` (of [`PRIVILEGES`]) on it, if anything.
pub async fn check(
    client: &Client,
    quoted: &str,
    names: &Names,
    needed: &[&str],
) -> Result<(), CheckError> {
    let table = &names.table;
    let oid: Option<i64> = client
        .query_typed_one(
            "SELECT to_regclass($1)::oid::int8",
            &[(&quoted, tokio_postgres::types::Type::TEXT)],
        )
        .await?
        .try_get(0)?;
    let Some(oid) = oid else {
        return Err(StoreError::TableMissing(table.clone()).into());
    };
    let rows = client
        .query_typed(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
               coalesce((SELECT array_agg(k.attname::text ORDER BY k.attnum) \
                 FROM pg_index i JOIN pg_attribute k \
                   ON k.attrelid = i.indrelid AND k.attnum = ANY(i.indkey) \
                 WHERE i.indrelid = a.attrelid AND i.indisprimary), '{}') \
             FROM pg_attribute a \
             WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[(&oid, tokio_postgres::types::Type::INT8)],
        )
        .await?;
    let mut columns = Vec::new();
    let mut key: Vec<String> = Vec::new();
    for row in &rows {
        columns.push((row.try_get::<_, String>(0)?, row.try_get::<_, String>(1)?));
        key = row.try_get(2)?;
    }
    let problems = shape_problems(&columns, &key);
    if !problems.is_empty() {
        return Err(StoreError::WrongSchema {
            table: table.clone(),
            detail: format!(
                "{} (the table leaderd needs: `leaderd table create --store postgres --print`)",
                problems.join("; ")
            ),
        }
        .into());
    }
    check_privileges(client, oid, names, needed).await
}

/// What is wrong with a table of `columns` (name, type) keyed by `key`,
/// against the table leaderd makes: one line per problem.
fn shape_problems(columns: &[(String, String)], key: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut missing = Vec::new();
    for (column, ty) in TYPES {
        match columns.iter().find(|(name, _)| name == column) {
            None => missing.push(format!("`{column}`")),
            Some((_, found)) if found != ty => {
                problems.push(format!("column `{column}` is {found}, expected {ty}"))
            }
            Some(_) => {}
        }
    }
    match missing.len() {
        0 => {}
        1 => problems.insert(0, format!("column {} is missing", missing[0])),
        n => problems.insert(
            0,
            format!(
                "{n} of leaderd's {} columns are missing ({})",
                TYPES.len(),
                missing.join(", ")
            ),
        ),
    }
    if key != ["election"] {
        problems.push(if key.is_empty() {
            "it has no primary key, expected (election)".to_owned()
        } else {
            format!(
                "its primary key is ({}), expected (election)",
                key.join(", ")
            )
        });
    }
    problems
}

/// Whether leaderd's role holds the privileges `needed` on the table `oid`.
async fn check_privileges(
    client: &Client,
    oid: i64,
    names: &Names,
    needed: &[&str],
) -> Result<(), CheckError> {
    let table = &names.table;
    let row = client
        .query_typed_one(
            "SELECT has_table_privilege($1::int8::oid, 'SELECT'), \
               has_table_privilege($1::int8::oid, 'INSERT'), \
               has_table_privilege($1::int8::oid, 'UPDATE'), \
               has_table_privilege($1::int8::oid, 'DELETE')",
            &[(&oid, tokio_postgres::types::Type::INT8)],
        )
        .await?;
    let mut lacking = Vec::new();
    for (i, privilege) in PRIVILEGES.iter().enumerate() {
        if needed.contains(privilege) && !row.try_get::<_, bool>(i)? {
            lacking.push(*privilege);
        }
    }
    if !lacking.is_empty() {
        return Err(StoreError::Unusable(format!(
            "role `{}` lacks {} on table `{table}` at {}: {}",
            names.user,
            lacking.join(", "),
            names.server,
            names.grant()
        ))
        .into());
    }
    Ok(())
}

/// Why a table cannot be used: a finding, or a failed request.
#[derive(Debug)]
pub enum CheckError {
    /// What the check found.
    Found(StoreError),
    /// A request failed.
    Request(tokio_postgres::Error),
}

impl From<StoreError> for CheckError {
    fn from(e: StoreError) -> Self {
        CheckError::Found(e)
    }
}

impl From<tokio_postgres::Error> for CheckError {
    fn from(e: tokio_postgres::Error) -> Self {
        CheckError::Request(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn a_table_of_the_made_shape_has_no_problem() {
        let columns = owned(&TYPES);
        assert!(shape_problems(&columns, &["election".to_owned()]).is_empty());
    }

    #[test]
    fn each_difference_from_the_made_shape_is_named() {
        let mut columns = owned(&TYPES);
        columns.retain(|(c, _)| c != "rvn" && c != "session");
        columns[1].1 = "character varying".to_owned();
        let problems = shape_problems(&columns, &["election".to_owned(), "holder".to_owned()]);
        assert_eq!(
            problems,
            [
                "2 of leaderd's 12 columns are missing (`rvn`, `session`)",
                "column `holder` is character varying, expected text",
                "its primary key is (election, holder), expected (election)",
            ]
        );
        assert_eq!(
            shape_problems(&owned(&TYPES[1..]), &[]),
            [
                "column `election` is missing",
                "it has no primary key, expected (election)"
            ]
        );
    }

    #[test]
    fn the_create_statement_names_every_column_once() {
        let sql = create_sql("\"leaderd\"");
        assert!(
            sql.starts_with("CREATE TABLE IF NOT EXISTS \"leaderd\" ("),
            "{sql}"
        );
        for column in COLUMNS {
            assert_eq!(
                sql.matches(&format!("    {column} ")).count(),
                1,
                "{column}: {sql}"
            );
        }
        assert!(
            sql.contains("election      text COLLATE \"C\" PRIMARY KEY"),
            "{sql}"
        );
    }
}
