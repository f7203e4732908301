//! [`StoreError`]: everything that can go wrong talking to a store, by
//! class.

use std::time::Duration;

/// Everything that can go wrong talking to a store, kept apart by class
/// because each is logged, counted and retried differently.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq, Hash)]
pub enum StoreError {
    /// The store asked us to slow down; the request was not applied.
    #[error("throttled by the store: {0}")]
    Throttled(String),
    /// No answer within the time budget; the request may have been applied.
    #[error("store request timed out after {0:?}")]
    Timeout(Duration),
    /// Could not reach the store (connection refused, reset, DNS...).
    #[error("store unreachable: {0}")]
    Transport(String),
    /// The store failed internally (HTTP 5xx); the request may have been applied.
    #[error("store server error: {0}")]
    Server(String),
    /// Credentials missing, expired, unknown or badly signed.
    #[error("store refused our credentials: {0}")]
    Credentials(String),
    /// The credentials are fine, but their IAM policy does not allow this
    /// call; nothing was applied. Retried like any error: the policy may be
    /// fixed while leaderd runs.
    #[error(
        "not allowed to call {action} on table `{table}` ({detail}): add {action} to the IAM policy of leaderd's credentials (see config/iam/README.md)"
    )]
    Denied {
        /// The IAM action, e.g. `dynamodb:BatchGetItem`.
        action: &'static str,
        /// Table name.
        table: String,
        /// What the store said.
        detail: String,
    },
    /// The table does not exist.
    #[error(
        "table `{0}` does not exist (create it with `leaderd table create` or set store.create_table = true)"
    )]
    TableMissing(String),
    /// The table exists but cannot be used yet.
    #[error("table `{table}` is {status}, not ACTIVE yet")]
    TableNotActive {
        /// Table name.
        table: String,
        /// Its status, e.g. CREATING.
        status: String,
    },
    /// The table's key schema is not the one leaderd needs.
    #[error("table `{table}` has the wrong schema: {detail}")]
    WrongSchema {
        /// Table name.
        table: String,
        /// What differs.
        detail: String,
    },
    /// The store answers but will not do what leaderd needs, whoever asks
    /// again: a PostgreSQL server in recovery (a standby) or refusing
    /// writes, a role without the privileges on the table. The one line
    /// says what and how to fix it. Retried like any error (a grant may
    /// come while leaderd runs), but a store found so at start is refused.
    #[error("store unusable: {0}")]
    Unusable(String),
    /// The request was rejected as invalid, or another unexpected answer.
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            StoreError::Throttled(_) => "throttled",
            StoreError::Timeout(_) => "timeout",
            StoreError::Transport(_) => "transport",
            StoreError::Server(_) => "server",
            StoreError::Credentials(_) => "credentials",
            StoreError::Denied { .. } => "denied",
            StoreError::TableMissing(_) => "table_missing",
            StoreError::TableNotActive { .. } => "table_not_active",
            StoreError::WrongSchema { .. } => "wrong_schema",
            StoreError::Unusable(_) => "unusable",
            StoreError::Other(_) => "error",
        }
    }

    /// The label in the `result` of `renew_total` (the metric's): ok, lost,
    /// throttled, timeout, error.
    pub fn renew_label(&self) -> &'static str {
        match self {
            StoreError::Throttled(_) => "throttled",
            StoreError::Timeout(_) => "timeout",
            _ => "error",
        }
    }

    /// Whether a write that failed this way may nevertheless have been applied,
    /// so that only a consistent read-back can tell.
    pub fn maybe_applied(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Server(_))
    }
}
