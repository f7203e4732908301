//! A row of the lease table as PostgreSQL stored it, its reading as a
//! record (well-formed, malformed or of an unknown format), and the
//! statements that read and write rows, each condition of
//! [`Condition::holds`] written in SQL.
//!
//! The columns are typed, so a row cannot hold a string where a number
//! belongs; another tool can still leave a column null, write a negative
//! number, a `holder_meta` that describes no holder, or a later `format`.
//! The SQL test of a well-formed row (`valid`) and [`Stored::to_record`]
//! say the same thing, column by column: a row that reads as malformed
//! here is one no write but `Unchanged` replaces.

use std::hash::{DefaultHasher, Hash, Hasher};

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::schema::TYPES;
use crate::lease::{
    Condition, HolderMeta, KNOWN_FORMATS, Lease, Malformed, Record, RvnGuard, StoreError,
    UnknownFormat, WriteOutcome,
};
use crate::text;

/// The columns in the order every statement returns them.
pub const COLUMNS: [&str; 12] = [
    "election",
    "holder",
    "rvn",
    "fencing_token",
    "lease_ms",
    "acquired_at",
    "renewed_at",
    "expires_at",
    "holder_meta",
    "successor",
    "format",
    "session",
];

/// The columns of the row `alias`, as every statement returns them
/// (`holder_meta` as text).
fn returned(alias: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| match *c {
            "holder_meta" => format!("{alias}.{c}::text"),
            _ => format!("{alias}.{c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The row `alias` is of a format this build knows (null: written before
/// the column existed).
fn known_format(alias: &str) -> String {
    let known = KNOWN_FORMATS.map(|f| f.to_string()).join(", ");
    format!("({alias}.format IS NULL OR {alias}.format IN ({known}))")
}

/// The row `alias` reads as a well-formed lease: what
/// [`Stored::to_record`] accepts, in SQL. A null anywhere makes the whole
/// test null, which a `WHERE` takes as false.
fn valid(alias: &str) -> String {
    let a = alias;
    format!(
        "{known} AND {a}.rvn IS NOT NULL AND {a}.fencing_token >= 0 AND {a}.lease_ms >= 0 \
         AND {a}.acquired_at >= 0 AND {a}.renewed_at >= 0 AND {a}.expires_at >= 0 \
         AND ({a}.holder_meta IS NULL OR (jsonb_typeof({a}.holder_meta) = 'object' \
           AND coalesce(jsonb_typeof({a}.holder_meta -> 'address'), 'null') IN ('null', 'string') \
           AND jsonb_typeof({a}.holder_meta -> 'labels') = 'object' \
           AND NOT jsonb_path_exists({a}.holder_meta, '$.labels.* ? (@.type() != \"string\")') \
           AND coalesce(jsonb_typeof({a}.holder_meta -> 'slots'), 'null') IN ('null', 'string')))",
        known = known_format(a)
    )
}

/// The statements of one table, written once when the store is opened.
///
/// A write is one statement of three parts: `cur` locks the record's row
/// (`FOR UPDATE`: after waiting for any write in progress, it holds the
/// latest committed version); `w` writes, if the condition holds on `cur`
/// (the insert, if there is no `cur`); and the answer is one row, whether
/// `w` wrote and `cur`'s columns. So a refusal comes with the record as it
/// was when the condition was found false, and no one can write between
/// the test and the write.
#[derive(Debug)]
pub struct Statements {
    /// One row: `$1` the key.
    pub select_one: String,
    /// The rows of `$1` (a text array).
    pub select_many: String,
    /// Every row.
    pub select_all: String,
    /// The rows whose key is at least `$1` and below `$2`, compared byte
    /// by byte whatever the database's collation.
    pub select_range: String,
    /// Create the row unless one exists.
    pub insert: String,
    /// Write the row if it still has the `rvn` `$13`.
    pub update_rvn_is: String,
    /// Write the row if it still has the `rvn` `$13` and the holder `$14`.
    pub update_held_by: String,
    /// Write the row if its raw `rvn` is `$13` (null: none).
    pub update_unchanged: String,
    /// Delete the rows of the keys `$1` still having the `rvn`s `$2` (two
    /// text arrays, pairwise).
    pub delete_stale: String,
    /// Delete the row `$1` if its `rvn` is `$2`.
    pub delete_check: String,
    /// Write many rows, each if it still has its `rvn`: the columns as
    /// arrays (`$1` to `$12`), `$13` the `rvn` each must have; one answer
    /// row per write, in their order (see [`ManyValues`]).
    pub update_many_rvn_is: String,
}

impl Statements {
    /// The statements of the table `table` (quoted as SQL reads it).
    pub fn new(table: &str) -> Statements {
        let value = |i: usize| match COLUMNS[i - 1] {
            "holder_meta" => format!("${i}::jsonb"),
            _ => format!("${i}"),
        };
        let cur =
            format!("WITH cur AS (SELECT * FROM {table} AS t WHERE t.election = $1 FOR UPDATE)");
        let answer = format!(
            "SELECT EXISTS (SELECT 1 FROM w), {} FROM (SELECT 1) AS one LEFT JOIN cur ON true",
            returned("cur")
        );
        let update = |condition: &str| {
            let set = (2..=COLUMNS.len())
                .map(|i| format!("{} = {}", COLUMNS[i - 1], value(i)))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "{cur}, w AS (UPDATE {table} AS t SET {set} FROM cur \
                 WHERE t.election = cur.election AND {condition} RETURNING 1) {answer}"
            )
        };
        let values = (1..=COLUMNS.len())
            .map(value)
            .collect::<Vec<_>>()
            .join(", ");
        Statements {
            select_one: format!(
                "SELECT {} FROM {table} AS t WHERE t.election = $1",
                returned("t")
            ),
            select_many: format!(
                "SELECT {} FROM {table} AS t WHERE t.election = ANY($1)",
                returned("t")
            ),
            select_all: format!(
                "SELECT {} FROM {table} AS t ORDER BY t.election",
                returned("t")
            ),
            select_range: format!(
                "SELECT {} FROM {table} AS t \
                 WHERE t.election COLLATE \"C\" >= $1 AND t.election COLLATE \"C\" < $2 \
                 ORDER BY t.election",
                returned("t")
            ),
            // A row another writer inserted after this statement's snapshot
            // is no `cur`: the insert then meets it and does nothing.
            insert: format!(
                "{cur}, w AS (INSERT INTO {table} ({}) SELECT {values} \
                 WHERE NOT EXISTS (SELECT 1 FROM cur) \
                 ON CONFLICT (election) DO NOTHING RETURNING 1) {answer}",
                COLUMNS.join(", ")
            ),
            update_rvn_is: update(&format!("({} AND cur.rvn = $13)", valid("cur"))),
            update_held_by: update(&format!(
                "({} AND cur.rvn = $13 AND cur.holder = $14)",
                valid("cur")
            )),
            update_unchanged: update(&format!(
                "({} AND cur.rvn IS NOT DISTINCT FROM $13)",
                known_format("cur")
            )),
            delete_stale: format!(
                "DELETE FROM {table} AS t USING unnest($1::text[], $2::text[]) AS s(election, rvn) \
                 WHERE t.election = s.election AND t.rvn = s.rvn AND {}",
                valid("t")
            ),
            delete_check: format!("DELETE FROM {table} AS t WHERE t.election = $1 AND t.rvn = $2"),
            update_many_rvn_is: update_many(table),
        }
    }

    /// The statement that writes under `condition`, and its condition's
    /// parameters (`$13`, `$14`).
    pub fn write(&self, condition: &Condition) -> Result<(&str, Vec<Option<String>>), StoreError> {
        Ok(match condition {
            Condition::NotExists => (&self.insert, vec![]),
            Condition::RvnIs(rvn) => (&self.update_rvn_is, vec![Some(rvn.clone())]),
            Condition::HeldBy { rvn, holder } => (
                &self.update_held_by,
                vec![Some(rvn.clone()), Some(holder.clone())],
            ),
            Condition::Unchanged(RvnGuard::Missing) => (&self.update_unchanged, vec![None]),
            Condition::Unchanged(RvnGuard::Raw(rvn)) => {
                (&self.update_unchanged, vec![Some(rvn.clone())])
            }
            #[cfg(test)]
            Condition::HolderIs(_) => {
                return Err(StoreError::Other(
                    "the PostgreSQL store writes under no HolderIs condition".into(),
                ));
            }
        })
    }
}

/// The statement of many takeovers: the writes are the rows of `i` (the
/// arrays unnested, numbered in their order); `cur` locks the rows they
/// name, in the order of their keys, so that two such statements over
/// the same rows never wait for each other in a circle; `w` writes each
/// row whose condition holds on `cur`; the answer is one row per write, in
/// the writes' order, as a single write answers.
fn update_many(table: &str) -> String {
    // The table's bigint columns as int8 arrays; the rest, and `expect`,
    // as text (`holder_meta` is cast to jsonb where it is set).
    let arrays = COLUMNS
        .iter()
        .chain(&["expect"])
        .enumerate()
        .map(|(i, c)| {
            let bigint = TYPES
                .iter()
                .any(|(column, ty)| column == c && *ty == "bigint");
            format!("${}::{}[]", i + 1, if bigint { "int8" } else { "text" })
        })
        .collect::<Vec<_>>()
        .join(", ");
    let set = COLUMNS[1..]
        .iter()
        .map(|c| match *c {
            "holder_meta" => format!("{c} = i.{c}::jsonb"),
            _ => format!("{c} = i.{c}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH i AS (SELECT * FROM unnest({arrays}) WITH ORDINALITY AS i({}, expect, n)), \
         cur AS (SELECT * FROM {table} AS t WHERE t.election = ANY($1::text[]) \
         ORDER BY t.election FOR UPDATE), \
         w AS (UPDATE {table} AS t SET {set} FROM i JOIN cur ON cur.election = i.election \
         WHERE t.election = i.election AND ({} AND cur.rvn = i.expect) RETURNING t.election) \
         SELECT EXISTS (SELECT 1 FROM w WHERE w.election = i.election), {} \
         FROM i LEFT JOIN cur ON cur.election = i.election ORDER BY i.n",
        COLUMNS.join(", "),
        valid("cur"),
        returned("cur")
    )
}

/// Many writes' values as the arrays of [`Statements::update_many_rvn_is`]:
/// one array per column, the writes in order, and the `rvn` each requires.
pub struct ManyValues {
    columns: Columns<Vec<String>, Vec<Option<String>>, Vec<i64>>,
    expect: Vec<String>,
}

impl ManyValues {
    /// The leases of `writes`, each with the `rvn` its condition requires.
    pub fn of<'a>(
        writes: impl Iterator<Item = (&'a Lease, &'a str)>,
    ) -> Result<ManyValues, StoreError> {
        let mut many = ManyValues {
            columns: Columns::default(),
            expect: Vec::new(),
        };
        let c = &mut many.columns;
        for (lease, expect) in writes {
            let one = Values::of(lease)?.columns;
            c.election.push(one.election);
            c.holder.push(one.holder);
            c.rvn.push(one.rvn);
            for (column, n) in c.numbers.iter_mut().zip(one.numbers) {
                column.push(n);
            }
            c.holder_meta.push(one.holder_meta);
            c.successor.push(one.successor);
            c.format.push(one.format);
            c.session.push(one.session);
            many.expect.push(expect.to_owned());
        }
        Ok(many)
    }

    /// The parameters `$1` to `$13`, each with its type.
    pub fn params(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        let mut params = self.columns.params(Type::TEXT_ARRAY, Type::INT8_ARRAY);
        params.push((&self.expect, Type::TEXT_ARRAY));
        params
    }
}

/// A write's columns in [`COLUMNS`] order: `S` a value that is never
/// null, `O` one that may be, `N` a number; one lease's values, or many
/// leases' as arrays.
#[derive(Default)]
struct Columns<S, O, N> {
    election: S,
    holder: O,
    rvn: S,
    numbers: [N; 5],
    holder_meta: O,
    successor: O,
    format: N,
    session: O,
}

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

impl<S: ToSql + Sync, O: ToSql + Sync, N: ToSql + Sync> Columns<S, O, N> {
    /// The parameters `$1` to `$12`, text columns typed `text`, numbers
    /// `int` (the statement is sent unprepared, typed by these).
    fn params(&self, text: Type, int: Type) -> Vec<Param<'_>> {
        let mut params: Vec<Param<'_>> = vec![
            (&self.election, text.clone()),
            (&self.holder, text.clone()),
            (&self.rvn, text.clone()),
        ];
        params.extend(self.numbers.iter().map(|n| (n as _, int.clone())));
        params.push((&self.holder_meta, text.clone()));
        params.push((&self.successor, text.clone()));
        params.push((&self.format, int));
        params.push((&self.session, text));
        params
    }
}

/// A lease's values as statement parameters, in [`COLUMNS`] order.
pub struct Values {
    columns: Columns<String, Option<String>, i64>,
}

impl Values {
    /// `lease` as stored: numbers as signed 64-bit integers (an error for
    /// one that does not fit), `holder_meta` as JSON.
    pub fn of(lease: &Lease) -> Result<Values, StoreError> {
        let int = |column: &str, v: u64| {
            i64::try_from(v).map_err(|_| {
                StoreError::Other(format!(
                    "`{column}` = {v} does not fit in PostgreSQL's bigint"
                ))
            })
        };
        let holder_meta = lease
            .holder_meta
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Other(format!("cannot encode holder_meta: {e}")))?;
        let columns = Columns {
            election: lease.election.clone(),
            holder: lease.holder.clone(),
            rvn: lease.rvn.clone(),
            numbers: [
                int("fencing_token", lease.fencing_token)?,
                int("lease_ms", lease.stored_lease_ms())?,
                int("acquired_at", lease.acquired_at_ms)?,
                int("renewed_at", lease.renewed_at_ms)?,
                int("expires_at", lease.expires_at_s)?,
            ],
            holder_meta,
            successor: lease.successor.clone(),
            format: int("format", lease.format())?,
            session: lease.session.clone(),
        };
        Ok(Values { columns })
    }

    /// The parameters `$1` to `$12`, then `extra` (`$13`, …), each with its
    /// type.
    pub fn params<'a>(&'a self, extra: &'a [Option<String>]) -> Vec<Param<'a>> {
        let mut params = self.columns.params(Type::TEXT, Type::INT8);
        params.extend(extra.iter().map(|v| (v as _, Type::TEXT)));
        params
    }
}

/// A row as stored: every column, null or not.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Stored {
    /// The key.
    pub election: String,
    holder: Option<String>,
    /// The `rvn`, as raw as it gets.
    pub rvn: Option<String>,
    fencing_token: Option<i64>,
    lease_ms: Option<i64>,
    acquired_at: Option<i64>,
    renewed_at: Option<i64>,
    expires_at: Option<i64>,
    holder_meta: Option<String>,
    successor: Option<String>,
    format: Option<i64>,
    session: Option<String>,
}

impl Stored {
    /// The row a select returned. A column of another type than
    /// leaderd's (a table made by hand) is an error.
    pub fn from_row(row: &Row) -> Result<Stored, tokio_postgres::Error> {
        Ok(Stored::from_columns(row, 0)?.expect("the key of a selected row is never null"))
    }

    /// The row whose columns start at `at` in `row`; `None` when its key
    /// is null (no row: a write's answer without `cur`).
    fn from_columns(row: &Row, at: usize) -> Result<Option<Stored>, tokio_postgres::Error> {
        let Some(election) = row.try_get(at)? else {
            return Ok(None);
        };
        Ok(Some(Stored {
            election,
            holder: row.try_get(at + 1)?,
            rvn: row.try_get(at + 2)?,
            fencing_token: row.try_get(at + 3)?,
            lease_ms: row.try_get(at + 4)?,
            acquired_at: row.try_get(at + 5)?,
            renewed_at: row.try_get(at + 6)?,
            expires_at: row.try_get(at + 7)?,
            holder_meta: row.try_get(at + 8)?,
            successor: row.try_get(at + 9)?,
            format: row.try_get(at + 10)?,
            session: row.try_get(at + 11)?,
        }))
    }

    /// The guard an `Unchanged` condition compares against: the `rvn`
    /// column as stored.
    pub fn guard(&self) -> RvnGuard {
        match &self.rvn {
            None => RvnGuard::Missing,
            Some(rvn) => RvnGuard::Raw(rvn.clone()),
        }
    }

    /// Read the row as a lease, or describe everything wrong with it. The
    /// format comes first: a row of another format is never judged by this
    /// one's layout.
    pub fn to_record(&self) -> Record {
        if let Some(format) = self
            .format
            .filter(|f| !u64::try_from(*f).is_ok_and(crate::lease::known_format))
        {
            return Record::UnknownFormat(UnknownFormat {
                election: self.election.clone(),
                format: format.to_string(),
                holder: self.holder.clone(),
                fencing_token: self.token(),
                fingerprint: self.fingerprint(),
            });
        }
        let mut problems = Vec::new();
        let rvn = self.rvn.clone().unwrap_or_else(|| {
            problems.push("attribute `rvn` is missing".to_owned());
            String::new()
        });
        let mut number = |column: &str, v: Option<i64>| match v {
            None => {
                problems.push(format!("attribute `{column}` is missing"));
                0
            }
            Some(v) => u64::try_from(v).unwrap_or_else(|_| {
                problems.push(format!("attribute `{column}` is negative ({v})"));
                0
            }),
        };
        let fencing_token = number("fencing_token", self.fencing_token);
        let lease_ms = number("lease_ms", self.lease_ms);
        let acquired_at_ms = number("acquired_at", self.acquired_at);
        let renewed_at_ms = number("renewed_at", self.renewed_at);
        let expires_at_s = number("expires_at", self.expires_at);
        let holder_meta = match self.holder_meta.as_deref().map(holder_meta) {
            None => None,
            Some(Ok(meta)) => Some(meta),
            Some(Err(problem)) => {
                problems.push(format!(
                    "attribute `holder_meta` is not a valid holder description: {problem}"
                ));
                None
            }
        };
        if !problems.is_empty() {
            return Record::Malformed(Malformed {
                election: self.election.clone(),
                problem: problems.join("; "),
                fingerprint: self.fingerprint(),
                fencing_token: self.token(),
                guard: self.guard(),
            });
        }
        Record::Valid(Lease {
            election: self.election.clone(),
            holder: self.holder.clone(),
            rvn,
            fencing_token,
            lease_ms,
            acquired_at_ms,
            renewed_at_ms,
            expires_at_s,
            holder_meta,
            successor: self.successor.clone(),
            session: self.session.clone(),
        })
    }

    /// The fencing token, when that one column can be read.
    fn token(&self) -> Option<u64> {
        self.fencing_token.and_then(|t| u64::try_from(t).ok())
    }

    /// A digest of every column. Only ever compared with another taken by
    /// the same process, so std's hasher (stable within one build) does.
    fn fingerprint(&self) -> String {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        format!("{:016x}", h.finish())
    }
}

#[cfg(test)]
impl Stored {
    /// A well-formed row of format 1, to spoil.
    pub fn for_tests() -> Stored {
        Stored {
            election: "e".into(),
            holder: Some("h".into()),
            rvn: Some("r".into()),
            fencing_token: Some(41),
            lease_ms: Some(10_000),
            acquired_at: Some(1),
            renewed_at: Some(2),
            expires_at: Some(3),
            holder_meta: Some(r#"{"address": "10.0.0.7:9777", "labels": {"zone": "a"}}"#.into()),
            successor: None,
            format: None,
            session: None,
        }
    }

    pub fn set_rvn(&mut self, rvn: Option<&str>) {
        self.rvn = rvn.map(str::to_owned);
    }

    /// The `i`th number column (fencing_token, lease_ms, ...).
    pub fn set_number(&mut self, i: usize, v: Option<i64>) {
        *[
            &mut self.fencing_token,
            &mut self.lease_ms,
            &mut self.acquired_at,
            &mut self.renewed_at,
            &mut self.expires_at,
        ][i] = v;
    }

    pub fn set_meta(&mut self, meta: Option<&str>) {
        self.holder_meta = meta.map(str::to_owned);
    }

    pub fn set_format(&mut self, format: Option<i64>) {
        self.format = format;
    }
}

/// A `holder_meta` as the SQL test `valid` reads it: an object whose
/// `address` is absent, null or a string, whose `labels` is an object of
/// strings, and whose `slots` is absent, null or a string; other members
/// are ignored.
fn holder_meta(json: &str) -> Result<HolderMeta, String> {
    use serde_json::Value;
    let value: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let Value::Object(object) = value else {
        return Err(format!("not an object: {}", text::shorten(json, 40)));
    };
    let address = match object.get("address") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`address` is not a string".into()),
    };
    let Some(Value::Object(labels)) = object.get("labels") else {
        return Err("`labels` is missing or not an object".into());
    };
    let labels = labels
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(format!("label `{}` is not a string", text::shorten(k, 40))),
        })
        .collect::<Result<_, String>>()?;
    let slots = match object.get("slots") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`slots` is not a string".into()),
    };
    Ok(HolderMeta {
        address,
        labels,
        slots,
    })
}

/// What a write answered: whether it applied, and the row it found.
#[derive(Debug)]
pub struct Written {
    applied: bool,
    found: Option<Stored>,
}

impl Written {
    /// The one row a write statement answers.
    pub fn from_row(row: &Row) -> Result<Written, tokio_postgres::Error> {
        Ok(Written {
            applied: row.try_get(0)?,
            found: Stored::from_columns(row, 1)?,
        })
    }

    /// The outcome of a write under `condition`. A create refused with no
    /// row found met a row inserted after the statement began, which it
    /// did not see: the record is then not known.
    pub fn outcome(self, condition: &Condition) -> WriteOutcome {
        if self.applied {
            return WriteOutcome::Applied;
        }
        let current = match (self.found, condition) {
            (Some(row), _) => Some(row.to_record()),
            (None, Condition::NotExists) => None,
            (None, _) => Some(Record::Absent),
        };
        WriteOutcome::ConditionFailed { current }
    }
}
