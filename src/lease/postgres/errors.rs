//! tokio-postgres errors as the store's error classes, each in one line
//! naming the server, the table or the role, and what to do.
//!
//! Where a request failed matters: before anything was sent (connecting,
//! authenticating) nothing can have been applied; once a statement is on
//! the wire, a lost connection may or may not have let it commit, which
//! only a read-back can tell (`Server`, `Timeout`). An error the server
//! answers to a statement means its transaction was rolled back.

use std::time::Duration;

use tokio_postgres::error::{DbError, SqlState};

use crate::lease::StoreError;

/// What the messages name.
#[derive(Debug, Clone)]
pub struct Names {
    /// `HOST:PORT/DB`.
    pub server: String,
    /// The table as configured (`store.table`).
    pub table: String,
    /// The role leaderd connects as.
    pub user: String,
}

impl Names {
    /// The grant that gives leaderd's role what it needs on the table.
    pub fn grant(&self) -> String {
        let table: Vec<String> = self.table.split('.').map(sql_name).collect();
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}",
            table.join("."),
            sql_name(&self.user)
        )
    }
}

/// A name as SQL reads it: bare when it is plain lower case, else quoted.
fn sql_name(name: &str) -> String {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && name.bytes().next().is_some_and(|b| !b.is_ascii_digit());
    if plain {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// The server's message with its code, and its detail when it has one.
fn db_text(db: &DbError) -> String {
    let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str(": ");
        text.push_str(detail);
    }
    text
}

/// An error that is not the server's answer, with its causes.
fn chain(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A failure to open a connection (nothing was sent).
pub fn connect_error(e: &tokio_postgres::Error, names: &Names) -> StoreError {
    let server = &names.server;
    let Some(db) = e.as_db_error() else {
        let text = chain(e);
        // The server asked for a password and none was given, or refused
        // the authentication method: not a transport problem.
        if text.starts_with("authentication error") {
            return StoreError::Credentials(format!(
                "PostgreSQL at {server}, user `{}`: {text} (give the password in store.url, store.password_file or PGPASSWORD)",
                names.user
            ));
        }
        return StoreError::Transport(format!("PostgreSQL at {server}: {text}"));
    };
    let code = db.code();
    let text = db_text(db);
    if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        StoreError::Credentials(format!("PostgreSQL at {server}: {text}"))
    } else if *code == SqlState::TOO_MANY_CONNECTIONS || code.code().starts_with("53") {
        StoreError::Throttled(format!("PostgreSQL at {server}: {text}"))
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        StoreError::Other(format!(
            "PostgreSQL at {server}: {text} (the database is the path of store.url)"
        ))
    } else {
        // Starting up, shutting down, in recovery without hot standby...
        StoreError::Transport(format!("PostgreSQL at {server}: {text}"))
    }
}

/// A failure of a statement that was sent within `budget`.
pub fn request_error(e: &tokio_postgres::Error, names: &Names, budget: Duration) -> StoreError {
    let server = &names.server;
    let table = &names.table;
    let Some(db) = e.as_db_error() else {
        if e.is_closed() || e.to_string().starts_with("error communicating") {
            return StoreError::Server(format!(
                "connection to PostgreSQL at {server} lost during the request: {}",
                chain(e)
            ));
        }
        if e.to_string().starts_with("error deserializing") {
            return StoreError::WrongSchema {
                table: table.clone(),
                detail: format!("a column is not of the type leaderd needs ({})", chain(e)),
            };
        }
        return StoreError::Other(format!("PostgreSQL at {server}: {}", chain(e)));
    };
    let code = db.code();
    let text = db_text(db);
    let class = &code.code()[..2];
    if *code == SqlState::UNDEFINED_TABLE {
        StoreError::TableMissing(table.clone())
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        StoreError::Unusable(format!(
            "role `{}` lacks a privilege on table `{table}` at {server}: {text}; {}",
            names.user,
            names.grant()
        ))
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        StoreError::Unusable(format!(
            "PostgreSQL at {server} refuses writes: {text} (a standby, or default_transaction_read_only for this role or database); point store.url at the primary, writable for leaderd's role"
        ))
    } else if [
        SqlState::UNDEFINED_COLUMN,
        SqlState::DATATYPE_MISMATCH,
        SqlState::INVALID_COLUMN_REFERENCE,
        SqlState::UNDEFINED_FUNCTION,
        SqlState::WRONG_OBJECT_TYPE,
    ]
    .contains(code)
    {
        StoreError::WrongSchema {
            table: table.clone(),
            detail: format!("{text} (see `leaderd table create --store postgres --print`)"),
        }
    } else if *code == SqlState::QUERY_CANCELED {
        // statement_timeout: rolled back, but read back like any timeout.
        StoreError::Timeout(budget)
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || class == "53"
    {
        StoreError::Throttled(format!("PostgreSQL at {server}: {text}"))
    } else if matches!(class, "08" | "57" | "58" | "XX") {
        StoreError::Server(format!("PostgreSQL at {server}: {text}"))
    } else {
        StoreError::Other(format!("PostgreSQL at {server}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grant_quotes_a_role_only_when_it_must() {
        let names = |user: &str| Names {
            server: "db:5432/app".into(),
            table: "leaderd".into(),
            user: user.into(),
        };
        assert_eq!(
            names("leaderd").grant(),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON leaderd TO leaderd"
        );
        assert_eq!(
            names("Lead-er").grant(),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON leaderd TO \"Lead-er\""
        );
        assert_eq!(
            names("9x").grant(),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON leaderd TO \"9x\""
        );
    }
}
