//! The PostgreSQL store's settings (`store.kind = "postgres"`): `store.url`
//! read at once, the files it names there to be read, and every
//! statement's time limit.

use std::path::PathBuf;
use std::sync::Arc;

use super::build::non_empty;
use super::{ConfigError, StoreConfig, StoreKind, defaults};
use crate::election::ElectionConfig;
use crate::lease::postgres::spec::table_name_problem;
use crate::lease::postgres::{PostgresSpec, parse_url};
use crate::text::echo;

/// `store.url` and what goes with it when `store.kind = "postgres"` (else
/// `None`): the URL read now, the files there to be read.
pub(super) fn build(
    kind: Option<StoreKind>,
    url: Option<String>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    table: &str,
) -> Result<Option<PostgresSpec>, ConfigError> {
    if kind != Some(StoreKind::Postgres) {
        return Ok(None);
    }
    if let Some(problem) = table_name_problem(table) {
        return Err(ConfigError::invalid(
            "store.table",
            format!("store.table = {} {problem}", echo(table)),
        ));
    }
    let Some(url) = non_empty(url) else {
        return Err(ConfigError::invalid(
            "store.url",
            "store.kind = \"postgres\" needs store.url (--store-url, LEADERD_STORE__URL), like postgres://leaderd@db.example.com:5432/app?sslmode=verify-full",
        ));
    };
    let target = parse_url(&url).map_err(|message| ConfigError::invalid("store.url", message))?;
    let readable = |key: &str, path: &std::path::Path| {
        std::fs::File::open(path).map(drop).map_err(|e| {
            ConfigError::invalid(
                key,
                format!(
                    "{key} = {} cannot be read: {e}",
                    echo(&path.display().to_string())
                ),
            )
        })
    };
    if let Some(file) = &password_file {
        if target.url_password {
            return Err(ConfigError::invalid(
                "store.password_file",
                "store.url holds a password and store.password_file is set too: keep one of them",
            ));
        }
        readable("store.password_file", file)?;
    }
    if let Some(file) = ca_file.as_ref().or(target.root_cert.as_ref()) {
        if !target.ssl.verifies() {
            return Err(ConfigError::invalid(
                "store.ca_file",
                format!(
                    "a CA file is set (store.ca_file or sslrootcert), but store.url's sslmode={} does not verify the server's certificate: add sslmode=verify-full (or verify-ca) to store.url",
                    target.ssl.name()
                ),
            ));
        }
        let key = if ca_file.is_some() {
            "store.ca_file"
        } else {
            "store.url"
        };
        readable(key, file)?;
    }
    Ok(Some(PostgresSpec {
        url,
        password_file,
        ca_file,
        table: table.to_owned(),
        statement_timeout: defaults::renew_interval(defaults::LEASE_DURATION),
    }))
}

/// Each statement's `statement_timeout`: the shortest renew interval of
/// `elections`, the longest a renewal waits for its write, so that no
/// statement outlives it.
pub(super) fn bound_statements(store: &mut StoreConfig, elections: &[Arc<ElectionConfig>]) {
    if let Some(pg) = &mut store.postgres
        && let Some(shortest) = elections.iter().map(|e| e.renew_interval).min()
    {
        pg.statement_timeout = shortest;
    }
}
