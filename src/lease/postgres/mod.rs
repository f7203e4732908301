//! The PostgreSQL lease store: one row per record in one table (default
//! `leaderd`), shared by any number of hosts.
//!
//! Every write is one statement that says whether it applied and, when it
//! did not, returns the record its condition was found false on: it locks
//! the row (`SELECT … FOR UPDATE`, which waits for a write in progress and
//! then holds the latest committed version), then inserts (no row) or
//! updates (the condition holds on the locked row). No one can write
//! between the test and the write, so two writers can never both win.
//! Takeovers that come together go up to a hundred in one statement of
//! the same three parts, each row under its own condition
//! ([`PostgresStore::take_many`]). A read is a plain `SELECT` on the primary,
//! which sees every committed write. The rules of the conditions are
//! [`Condition::holds`]'s, written in SQL in `codec`.
//!
//! Ambiguous failures (a timeout, a connection lost mid-statement) are
//! `Timeout` and `Server` errors, which [`LeaseStore::write`] resolves by
//! reading back. PostgreSQL has no TTL: ended daemons' session records are
//! deleted by [`LeaseStore::sweep_sessions`], judged by the election's
//! rule.
//!
//! The rooms: this file is the store and its requests; [`spec`] is what
//! the configuration says and the reading of `store.url`; `client` the
//! connections (two at most, reopened with back-off, checked to be a
//! writable primary); `tls` rustls behind tokio-postgres; `codec` the
//! rows and the statements; [`schema`] creating and checking the table;
//! `errors` the error classes; `tests` the unit tests of what needs no
//! server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_postgres::types::Type;

mod client;
mod codec;
mod errors;
pub mod schema;
pub mod spec;
#[cfg(test)]
mod tests;
mod tls;

use client::{LaneKind, Pool};
use codec::{ManyValues, Statements, Stored, Values, Written};
pub use spec::{PostgresSpec, SslMode, Target, parse_url, quoted_table};

use super::{
    Condition, Lease, LeaseStore, MEMBER_PREFIX, Record, SESSION_PREFIX, SessionJudge, StoreError,
    WriteOutcome, is_session_key, member_records, scratch_only, settle_many, write_each,
};

/// How long opening a store waits for its first connection.
const OPEN_WAIT: Duration = Duration::from_secs(5);

/// The most stale session records one statement deletes.
const DELETES_PER_STATEMENT: usize = 256;

/// The PostgreSQL lease store. Clones share the connections.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.inner.pool.names().server)
            .field("table", &self.inner.table)
            .finish()
    }
}

struct Inner {
    pool: Pool,
    sql: Statements,
    /// The table as configured.
    table: String,
    /// The table as SQL reads it.
    quoted: String,
    /// The privileges [`LeaseStore::check`] requires: all of them, or
    /// SELECT for a store opened to read only.
    needed: &'static [&'static str],
}

/// Whether a store error found while opening means the store can never be
/// used as configured, rather than not yet: refused at start.
fn refused_at_start(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Unusable(_) | StoreError::Credentials(_) | StoreError::WrongSchema { .. }
    )
}

impl PostgresStore {
    /// A store for `spec`; connects only when a request needs it.
    pub fn new(spec: &PostgresSpec) -> Result<PostgresStore, StoreError> {
        let target = parse_url(&spec.url).map_err(StoreError::Other)?;
        let connector = client::Connector::new(
            target,
            spec.password_file.clone(),
            spec.ca_file.clone(),
            spec.statement_timeout,
            &spec.table,
        )?;
        let quoted = quoted_table(&spec.table);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool: Pool::new(connector),
                sql: Statements::new(&quoted),
                table: spec.table.clone(),
                quoted,
                needed: &schema::PRIVILEGES,
            }),
        })
    }

    /// A store for `spec`, as `leaderd run` and the tools open it: one
    /// connection is tried at once. A server that answers but can never
    /// serve as configured (a standby, a read-only session, refused
    /// credentials, a table of the wrong shape or without leaderd's
    /// privileges) is an error; one that does not answer yet is not (the
    /// requests connect later). `create_table`: create the table if
    /// missing. `read_only` (`leaderd status`): SELECT is the one privilege
    /// its checks require.
    pub async fn open(
        spec: &PostgresSpec,
        create_table: bool,
        read_only: bool,
    ) -> Result<PostgresStore, StoreError> {
        let mut store = PostgresStore::new(spec)?;
        if read_only {
            Arc::get_mut(&mut store.inner)
                .expect("a store just made has no other handle")
                .needed = &schema::PRIVILEGES[..1];
        }
        if create_table {
            store.create_table(OPEN_WAIT).await?;
        }
        match store.check(OPEN_WAIT).await {
            Err(e) if refused_at_start(&e) => Err(e),
            Err(e) => {
                // Not yet: `run` checks again in the background and says so.
                tracing::debug!(error = %e, "PostgreSQL lease store not usable yet");
                Ok(store)
            }
            Ok(()) => Ok(store),
        }
    }

    /// Create the table unless it exists (then change nothing).
    pub async fn create_table(&self, budget: Duration) -> Result<(), StoreError> {
        let quoted = self.inner.quoted.clone();
        self.inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                schema::create(&conn.client, &quoted).await
            })
            .await
    }

    /// A writable primary, a table of leaderd's shape, and the role's
    /// privileges `needed` (of [`schema::PRIVILEGES`]) on it.
    pub async fn check_for(&self, needed: &[&str], budget: Duration) -> Result<(), StoreError> {
        let quoted = self.inner.quoted.clone();
        let names = self.inner.pool.names().clone();
        self.inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                match schema::check(&conn.client, &quoted, &names, needed).await {
                    Ok(()) => Ok(Ok(())),
                    Err(schema::CheckError::Found(e)) => Ok(Err(e)),
                    Err(schema::CheckError::Request(e)) => Err(e),
                }
            })
            .await?
    }

    /// The table as configured.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The server as messages name it: `HOST:PORT/DB`.
    pub fn server(&self) -> &str {
        &self.inner.pool.names().server
    }

    /// The server's wall clock, as unix ms (`leaderd check` compares it
    /// with this host's).
    pub async fn server_unix_ms(&self, budget: Duration) -> Result<i64, StoreError> {
        self.inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                conn.client
                    .query_typed_one(
                        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
                        &[],
                    )
                    .await?
                    .try_get(0)
            })
            .await
    }

    /// The rows `sql` returns with `params`, read as records.
    async fn select(
        &self,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
        budget: Duration,
    ) -> Result<Vec<Stored>, StoreError> {
        self.inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                let rows = conn.client.query_typed(sql, params).await?;
                rows.iter().map(Stored::from_row).collect()
            })
            .await
    }

    /// The records whose keys start with `prefix` (`#member/` or
    /// `#session/`): one range of the key.
    async fn range(&self, prefix: &str, budget: Duration) -> Result<Vec<Record>, StoreError> {
        // "#member/" .. "#member0": '0' follows '/'.
        let upper = format!("{}0", prefix.trim_end_matches('/'));
        let prefix = prefix.to_owned();
        let rows = self
            .select(
                &self.inner.sql.select_range,
                &[(&prefix, Type::TEXT), (&upper, Type::TEXT)],
                budget,
            )
            .await?;
        Ok(rows.iter().map(Stored::to_record).collect())
    }
}

impl PostgresStore {
    /// `writes` (distinct records, each under `RvnIs`) in one statement:
    /// planned once for all of them, each row written only if its own
    /// condition holds (so nothing is taken that a write of its own would
    /// not have taken), each answered as a single write answers. The
    /// statement commits as one: a failure that may have come after the
    /// commit is settled by reading the records back, as for one write.
    async fn take_many(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        let deadline = Instant::now() + budget;
        let each_err = |e: StoreError| writes.iter().map(|_| Err(e.clone())).collect();
        let expected = writes.iter().map(|(lease, condition)| match condition {
            Condition::RvnIs(rvn) => Ok((lease, rvn.as_str())),
            _ => Err(StoreError::Other(
                "a takeover of many under another condition than RvnIs".into(),
            )),
        });
        let values = match expected
            .collect::<Result<Vec<_>, _>>()
            .and_then(|pairs| ManyValues::of(pairs.into_iter()))
        {
            Ok(values) => values,
            Err(e) => return each_err(e),
        };
        let sql = &self.inner.sql.update_many_rvn_is;
        let answered = self
            .inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                let rows = conn.client.query_typed(sql, &values.params()).await?;
                rows.iter()
                    .map(Written::from_row)
                    .collect::<Result<Vec<_>, _>>()
            })
            .await;
        match answered {
            Ok(written) if written.len() == writes.len() => written
                .into_iter()
                .zip(writes)
                .map(|(w, (_, condition))| Ok(w.outcome(condition)))
                .collect(),
            Ok(written) => {
                let e = StoreError::Server(format!(
                    "the statement of {} takeovers answered {} rows",
                    writes.len(),
                    written.len()
                ));
                settle_many(self, writes, e, deadline).await
            }
            Err(e) if e.maybe_applied() => settle_many(self, writes, e, deadline).await,
            Err(e) => each_err(e),
        }
    }
}

/// Whether writing `lease` under `condition` renews it: the holder the
/// condition names keeps it (a release or a handover writes no holder).
fn renews(lease: &Lease, condition: &Condition) -> bool {
    matches!(condition, Condition::HeldBy { holder, .. } if lease.holder.as_deref() == Some(holder))
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        let key = election.to_owned();
        let rows = self
            .select(&self.inner.sql.select_one, &[(&key, Type::TEXT)], budget)
            .await?;
        Ok(rows.first().map_or(Record::Absent, Stored::to_record))
    }

    /// One query for all of them (`election = ANY($1)`).
    async fn read_many(
        &self,
        elections: &[String],
        budget: Duration,
    ) -> Result<Vec<Record>, StoreError> {
        let keys = elections.to_vec();
        let rows = self
            .select(
                &self.inner.sql.select_many,
                &[(&keys, Type::TEXT_ARRAY)],
                budget,
            )
            .await?;
        Ok(elections
            .iter()
            .map(|e| {
                rows.iter()
                    .find(|r| &r.election == e)
                    .map_or(Record::Absent, Stored::to_record)
            })
            .collect())
    }

    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let values = Values::of(lease)?;
        let (sql, extra) = self.inner.sql.write(condition)?;
        let lane = if renews(lease, condition) {
            LaneKind::Renew
        } else {
            LaneKind::Other
        };
        let written = self
            .inner
            .pool
            .run(lane, budget, |conn| async move {
                let row = conn
                    .client
                    .query_typed_one(sql, &values.params(&extra))
                    .await?;
                Written::from_row(&row)
            })
            .await?;
        Ok(written.outcome(condition))
    }

    /// Takeovers (`RvnIs`) of distinct records, as a dead daemon's
    /// elections are taken, go in one statement (see
    /// [`PostgresStore::take_many`]); a batch with any other condition goes
    /// one write each, as [`LeaseStore::write`] makes it.
    async fn write_many(
        &self,
        writes: &[(Lease, Condition)],
        budget: Duration,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        let mut keys: Vec<&str> = writes.iter().map(|(l, _)| l.election.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let takeovers = writes.len() >= 2
            && keys.len() == writes.len()
            && writes.iter().all(|(_, c)| matches!(c, Condition::RvnIs(_)));
        if takeovers {
            self.take_many(writes, budget).await
        } else {
            write_each(self, writes, budget).await
        }
    }

    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        let rows = self.select(&self.inner.sql.select_all, &[], budget).await?;
        Ok(rows.iter().map(Stored::to_record).collect())
    }

    async fn members(&self, budget: Duration) -> Result<Vec<Lease>, StoreError> {
        Ok(member_records(self.range(MEMBER_PREFIX, budget).await?))
    }

    /// One range read of the session records (a few per daemon), then,
    /// if the judge names any, conditional deletes, many per statement.
    async fn sweep_sessions(
        &self,
        judge: &mut SessionJudge<'_>,
        budget: Duration,
    ) -> Result<u64, StoreError> {
        let started = Instant::now();
        let records = self.range(SESSION_PREFIX, budget).await?;
        let stale: Vec<_> = judge(&records)
            .into_iter()
            .filter(|s| is_session_key(&s.key))
            .collect();
        let mut deleted = 0;
        for chunk in stale.chunks(DELETES_PER_STATEMENT) {
            let keys: Vec<String> = chunk.iter().map(|s| s.key.clone()).collect();
            let rvns: Vec<String> = chunk.iter().map(|s| s.rvn.clone()).collect();
            let left = budget.saturating_sub(started.elapsed());
            let sql = &self.inner.sql.delete_stale;
            deleted += self
                .inner
                .pool
                .run(LaneKind::Other, left, |conn| async move {
                    conn.client
                        .execute_typed(sql, &[(&keys, Type::TEXT_ARRAY), (&rvns, Type::TEXT_ARRAY)])
                        .await
                })
                .await?;
        }
        Ok(deleted)
    }

    async fn delete_check_record(
        &self,
        key: &str,
        rvn: &str,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        scratch_only(key)?;
        let (key, rvn) = (key.to_owned(), rvn.to_owned());
        let sql = &self.inner.sql.delete_check;
        // One statement: the condition and the delete are atomic.
        let deleted = self
            .inner
            .pool
            .run(LaneKind::Other, budget, |conn| async move {
                conn.client
                    .execute_typed(sql, &[(&key, Type::TEXT), (&rvn, Type::TEXT)])
                    .await
            })
            .await?;
        Ok(if deleted == 1 {
            WriteOutcome::Applied
        } else {
            WriteOutcome::ConditionFailed { current: None }
        })
    }

    /// A writable primary (each connection checks), a table of leaderd's
    /// shape, and the role's privileges on it.
    async fn check(&self, budget: Duration) -> Result<(), StoreError> {
        self.check_for(self.inner.needed, budget).await
    }
}
