//! The connections to the server: at most two per store, one for the
//! writes that renew a lease this process holds and one for everything
//! else (as SQLite's writer lane and DynamoDB's renewal slot: a burst of
//! reads never queues ahead of a renewal). Requests on one connection are
//! pipelined by tokio-postgres.
//!
//! A connection is opened when a request needs one, one attempt at a time
//! per lane; after a failed attempt the next waits, growing from
//! [`BACKOFF_MIN`] to [`BACKOFF_MAX`] with jitter, and requests in between
//! fail with the last error unless the pause ends within their budget. A
//! request that runs out of its budget drops its connection (the server
//! may be stopped: anything queued behind it would wait as long), so the
//! next opens a fresh one. Every connection runs its statements under
//! `statement_timeout`, so the server too gives up on a statement leaderd
//! stopped waiting for.
//!
//! Each new connection is checked before use: a server in recovery (a
//! standby: its reads lag, it takes no writes) or a read-only session is
//! refused; the replication settings are logged once per change, and a
//! `synchronous_commit` of `off` or `local` is raised to `on` for
//! leaderd's session (an acknowledged lease write must survive a crash of
//! the server, and reach a synchronous standby when there is one).

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::Client;

use super::errors::{Names, connect_error, request_error};
use super::spec::{SslMode, Target};
use super::tls::Tls;
use crate::lease::StoreError;
use crate::text;

/// The first pause after a failed connection attempt.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest pause between attempts: below the default retry interval,
/// so a server back from a restart is found within a retry or two.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The longest one connection attempt may take (TCP, TLS, authentication
/// and the checks), within a request's budget.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One open connection. Dropping it (or [`Conn::discard`]) closes it.
pub struct Conn {
    /// The client half; its connection runs in a task of its own.
    pub client: Client,
    task: AbortHandle,
}

impl Conn {
    /// Close the connection now, whatever is in flight on it.
    pub fn discard(&self) {
        self.task.abort();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The replication settings a connection found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServerFacts {
    version: String,
    synchronous_commit: String,
    synchronous_standby_names: String,
}

/// How to open connections to one server.
pub struct Connector {
    target: Target,
    password_file: Option<PathBuf>,
    tls: Tls,
    statement_timeout: Duration,
    names: Names,
    /// The settings last logged: logged again only when they change.
    logged: Mutex<Option<ServerFacts>>,
}

impl Connector {
    /// A connector for `target`, its TLS set up (CA file read) now.
    pub fn new(
        target: Target,
        password_file: Option<PathBuf>,
        ca_file: Option<PathBuf>,
        statement_timeout: Duration,
        table: &str,
    ) -> Result<Connector, StoreError> {
        let ca_file = ca_file.or_else(|| target.root_cert.clone());
        let tls = Tls::new(target.ssl, ca_file.as_deref()).map_err(StoreError::Other)?;
        let names = Names {
            server: target.shown.clone(),
            table: table.to_owned(),
            user: target.pg.get_user().unwrap_or("").to_owned(),
        };
        Ok(Connector {
            target,
            password_file,
            tls,
            statement_timeout,
            names,
            logged: Mutex::new(None),
        })
    }

    /// What messages name.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Open and check one connection.
    pub async fn connect(&self) -> Result<Conn, StoreError> {
        let mut pg = self.target.pg.clone();
        if let Some(password) = self
            .target
            .password(self.password_file.as_deref())
            .map_err(StoreError::Other)?
        {
            pg.password(password);
        }
        let options = format!(
            "{} -c statement_timeout={}",
            pg.get_options().unwrap_or_default(),
            self.statement_timeout.as_millis().max(1)
        );
        pg.options(options.trim());
        if pg.get_application_name().is_none() {
            pg.application_name("leaderd");
        }
        pg.ssl_mode(match self.target.ssl {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let (client, connection) = pg
            .connect(self.tls.clone())
            .await
            .map_err(|e| connect_error(&e, &self.names))?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL connection ended");
            }
        })
        .abort_handle();
        let conn = Conn { client, task };
        self.check_server(&conn.client).await?;
        Ok(conn)
    }

    /// Refuse a standby or a read-only session; raise a weak
    /// `synchronous_commit`; log the replication settings.
    async fn check_server(&self, client: &Client) -> Result<(), StoreError> {
        let server = &self.names.server;
        let asked = |e: tokio_postgres::Error| request_error(&e, &self.names, CONNECT_TIMEOUT);
        let row = client
            .query_typed_one(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), \
                 current_setting('synchronous_commit'), \
                 current_setting('synchronous_standby_names'), current_setting('server_version')",
                &[],
            )
            .await
            .map_err(asked)?;
        let in_recovery: bool = row.try_get(0).map_err(asked)?;
        let read_only: String = row.try_get(1).map_err(asked)?;
        let mut facts = ServerFacts {
            synchronous_commit: row.try_get(2).map_err(asked)?,
            synchronous_standby_names: row.try_get(3).map_err(asked)?,
            version: row.try_get(4).map_err(asked)?,
        };
        if in_recovery {
            return Err(StoreError::Unusable(format!(
                "PostgreSQL at {server} is in recovery (pg_is_in_recovery() is true: a standby); leaderd reads and writes leases only on the primary: point store.url at it"
            )));
        }
        if read_only == "on" {
            return Err(StoreError::Unusable(format!(
                "PostgreSQL at {server} opens read-only sessions for role `{}` (transaction_read_only = on: default_transaction_read_only for the role or database); leaderd needs to write",
                self.names.user
            )));
        }
        if matches!(facts.synchronous_commit.as_str(), "off" | "local") {
            client
                .batch_execute("SET synchronous_commit = on")
                .await
                .map_err(asked)?;
            facts.synchronous_commit = format!("on (raised from {})", facts.synchronous_commit);
        }
        self.log_once(facts);
        Ok(())
    }

    fn log_once(&self, facts: ServerFacts) {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.as_ref() == Some(&facts) {
            return;
        }
        let standbys = if facts.synchronous_standby_names.is_empty() {
            "none: safe on one server; a failover to an asynchronous replica can lose lease writes and make two leaders"
        } else {
            "a commit waits for them"
        };
        tracing::info!(
            server = %self.names.server,
            version = %facts.version,
            synchronous_commit = %facts.synchronous_commit,
            synchronous_standby_names = %facts.synchronous_standby_names,
            synchronous_standbys = standbys,
            "PostgreSQL lease store: the primary, and its replication settings"
        );
        *logged = Some(facts);
    }
}

/// One lane's connection, opened on demand.
#[derive(Default)]
struct Slot {
    conn: Option<Arc<Conn>>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<StoreError>,
}

/// Which connection a request goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    /// Writes that renew a lease this process holds.
    Renew,
    /// Everything else.
    Other,
}

/// The store's connections and how requests run on them.
pub struct Pool {
    connector: Connector,
    renew: tokio::sync::Mutex<Slot>,
    other: tokio::sync::Mutex<Slot>,
}

impl Pool {
    /// A pool with no connection open yet.
    pub fn new(connector: Connector) -> Pool {
        Pool {
            connector,
            renew: tokio::sync::Mutex::new(Slot::default()),
            other: tokio::sync::Mutex::new(Slot::default()),
        }
    }

    /// What messages name.
    pub fn names(&self) -> &Names {
        self.connector.names()
    }

    /// The lane's connection, opened if need be, by `deadline`.
    pub async fn conn(&self, lane: LaneKind, deadline: Instant) -> Result<Arc<Conn>, StoreError> {
        let slot = match lane {
            LaneKind::Renew => &self.renew,
            LaneKind::Other => &self.other,
        };
        let server = &self.names().server;
        let Ok(mut slot) = tokio::time::timeout_at(deadline, slot.lock()).await else {
            return Err(StoreError::Transport(format!(
                "not sent: no connection to PostgreSQL at {server} could be opened within the budget"
            )));
        };
        if let Some(conn) = &slot.conn {
            if !conn.client.is_closed() {
                return Ok(conn.clone());
            }
            slot.conn = None;
        }
        if let Some(at) = slot.retry_at
            && at > Instant::now()
        {
            if at >= deadline {
                return Err(slot.last_error.clone().unwrap_or_else(|| {
                    StoreError::Transport(format!("not sent: reconnecting to {server}"))
                }));
            }
            tokio::time::sleep_until(at).await;
        }
        let attempt_end = deadline.min(Instant::now() + CONNECT_TIMEOUT);
        let result = match tokio::time::timeout_at(attempt_end, self.connector.connect()).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Transport(format!(
                "PostgreSQL at {server} did not accept a connection within {}",
                text::duration(
                    attempt_end
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1))
                )
            ))),
        };
        match result {
            Ok(conn) => {
                if slot.failures > 0 {
                    tracing::info!(server = %server, lane = ?lane, "connected to the PostgreSQL lease store again");
                }
                let conn = Arc::new(conn);
                *slot = Slot {
                    conn: Some(conn.clone()),
                    ..Slot::default()
                };
                Ok(conn)
            }
            Err(e) => {
                slot.failures = slot.failures.saturating_add(1);
                let doubled =
                    BACKOFF_MIN.saturating_mul(1 << slot.failures.min(16).saturating_sub(1));
                let pause = doubled.min(BACKOFF_MAX);
                // Full jitter in the upper half: instances that lost the
                // server together do not all come back at one instant.
                let pause = pause.mul_f64(0.5 + rand::random::<f64>() / 2.0);
                slot.retry_at = Some(Instant::now() + pause);
                if slot.last_error.as_ref() != Some(&e) {
                    tracing::debug!(server = %server, lane = ?lane, error = %e, ?pause, "cannot connect to the PostgreSQL lease store; trying again after a pause");
                }
                slot.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Run `request` on the lane's connection within `budget`. Past the
    /// budget the connection is dropped and the answer is a timeout (the
    /// statement may still commit: see `LeaseStore::write`).
    pub async fn run<T, F, Fut>(
        &self,
        lane: LaneKind,
        budget: Duration,
        request: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        if budget.is_zero() {
            return Err(StoreError::Timeout(budget));
        }
        let deadline = Instant::now() + budget;
        let conn = self.conn(lane, deadline).await?;
        match tokio::time::timeout_at(deadline, request(conn.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                let error = request_error(&e, self.names(), budget);
                if matches!(error, StoreError::Server(_)) {
                    conn.discard();
                }
                Err(error)
            }
            Err(_) => {
                conn.discard();
                Err(StoreError::Timeout(budget))
            }
        }
    }
}
