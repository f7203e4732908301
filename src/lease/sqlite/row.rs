//! A row of the `leases` table as SQLite stored it, whatever its types, and
//! its reading as a lease record or as a malformed one that names what is
//! wrong.

use std::hash::{DefaultHasher, Hash, Hasher};

use rusqlite::types::ValueRef;

use super::schema::COLUMNS;
use crate::lease::{HolderMeta, Lease, Malformed, Record, RvnGuard, UnknownFormat, known_format};
use crate::text;

/// One column's value exactly as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) enum Raw {
    #[default]
    Null,
    Integer(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl Raw {
    fn from_ref(v: ValueRef<'_>) -> Raw {
        match v {
            ValueRef::Null => Raw::Null,
            ValueRef::Integer(i) => Raw::Integer(i),
            ValueRef::Real(f) => Raw::Real(f),
            ValueRef::Text(t) => Raw::Text(t.to_vec()),
            ValueRef::Blob(b) => Raw::Blob(b.to_vec()),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Integer(_) => "integer",
            Raw::Real(_) => "real",
            Raw::Text(_) => "text",
            Raw::Blob(_) => "blob",
        }
    }

    /// Unambiguous text form, with the type: `text:abc`, `integer:5`,
    /// `real:1.5`, `blob:00ff`, `null`.
    fn encode(&self) -> String {
        match self {
            Raw::Null => "null".into(),
            Raw::Integer(i) => format!("integer:{i}"),
            // Bits, not the decimal form: two different reals never collide.
            Raw::Real(f) => format!("real:{:016x}", f.to_bits()),
            Raw::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => format!("text:{s}"),
                Err(_) => format!("text-bytes:{}", text::hex(t)),
            },
            Raw::Blob(b) => format!("blob:{}", text::hex(b)),
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Raw::Text(t) => std::str::from_utf8(t).ok(),
            _ => None,
        }
    }
}

/// A whole row as stored, one value per entry of [`COLUMNS`].
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Row(pub(super) [Raw; COLUMNS.len()]);

impl Row {
    pub(super) fn from_sql(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        let mut vals: [Raw; COLUMNS.len()] = Default::default();
        for (i, v) in vals.iter_mut().enumerate() {
            *v = Raw::from_ref(row.get_ref(i)?);
        }
        Ok(Row(vals))
    }

    fn get(&self, column: &str) -> &Raw {
        let i = COLUMNS
            .iter()
            .position(|c| *c == column)
            .expect("callers only name columns listed in COLUMNS");
        &self.0[i]
    }

    /// The guard an `Unchanged` condition compares against.
    pub(super) fn guard(&self) -> RvnGuard {
        match self.get("rvn") {
            Raw::Null => RvnGuard::Missing,
            raw => RvnGuard::Raw(raw.encode()),
        }
    }

    /// Interpret the row as a lease, or describe everything wrong with it.
    /// The format comes first: a row of another format is never judged by
    /// this one's layout.
    pub(super) fn to_record(&self) -> Record {
        let mut problems = Vec::new();
        let election = self.election(&mut problems);
        if let Some(format) = self.unknown_format() {
            return Record::UnknownFormat(UnknownFormat {
                election,
                format,
                holder: self.get("holder").text().map(str::to_owned),
                fencing_token: self.token(),
                fingerprint: self.fingerprint(),
            });
        }
        let holder = self.optional_text("holder", &mut problems);
        let successor = self.optional_text("successor", &mut problems);
        let session = self.optional_text("session", &mut problems);
        let rvn = self.rvn(&mut problems);
        let fencing_token = self.number("fencing_token", &mut problems);
        let lease_ms = self.number("lease_ms", &mut problems);
        let acquired_at_ms = self.number("acquired_at", &mut problems);
        let renewed_at_ms = self.number("renewed_at", &mut problems);
        let expires_at_s = self.number("expires_at", &mut problems);
        let holder_meta = self.holder_meta(&mut problems);
        if problems.is_empty() {
            return Record::Valid(Lease {
                election,
                holder,
                rvn,
                fencing_token,
                lease_ms,
                acquired_at_ms,
                renewed_at_ms,
                expires_at_s,
                holder_meta,
                successor,
                session,
            });
        }
        Record::Malformed(Malformed {
            election,
            problem: problems.join("; "),
            fingerprint: self.fingerprint(),
            fencing_token: self.token(),
            guard: self.guard(),
        })
    }

    /// The fencing token, when that one column can be read.
    fn token(&self) -> Option<u64> {
        match self.get("fencing_token") {
            Raw::Integer(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The `format` column, as humans read it, unless it is null (a row
    /// written before the column existed) or this build's: a number as
    /// stored, text quoted, a blob in hex.
    fn unknown_format(&self) -> Option<String> {
        let shown = match self.get("format") {
            Raw::Null => return None,
            Raw::Integer(i) if u64::try_from(*i).is_ok_and(known_format) => return None,
            Raw::Integer(i) => i.to_string(),
            Raw::Real(f) => f.to_string(),
            Raw::Text(t) => format!("{:?}", String::from_utf8_lossy(t)),
            Raw::Blob(b) => format!("blob {}", text::hex(b)),
        };
        Some(text::shorten(&shown, 40))
    }

    /// The `election` column as text, whatever it holds.
    fn election(&self, problems: &mut Vec<String>) -> String {
        match self.get("election") {
            Raw::Text(t) => {
                if std::str::from_utf8(t).is_err() {
                    problems.push("attribute `election` is not valid UTF-8".into());
                }
                String::from_utf8_lossy(t).into_owned()
            }
            other => {
                problems.push(text_problem("election", other));
                other.encode()
            }
        }
    }

    /// A text column that may be null.
    fn optional_text(&self, column: &str, problems: &mut Vec<String>) -> Option<String> {
        match self.get(column) {
            Raw::Null => None,
            raw => match raw.text() {
                Some(s) => Some(s.to_owned()),
                None => {
                    problems.push(text_problem(column, raw));
                    None
                }
            },
        }
    }

    /// The `rvn` column: text, never null.
    fn rvn(&self, problems: &mut Vec<String>) -> String {
        match self.get("rvn") {
            Raw::Null => {
                problems.push("attribute `rvn` is missing".into());
                String::new()
            }
            raw => match raw.text() {
                Some(s) => s.to_owned(),
                None => {
                    problems.push(text_problem("rvn", raw));
                    String::new()
                }
            },
        }
    }

    /// A whole, non-negative number column, never null.
    fn number(&self, column: &str, problems: &mut Vec<String>) -> u64 {
        match self.get(column) {
            Raw::Integer(i) => u64::try_from(*i).unwrap_or_else(|_| {
                problems.push(format!("attribute `{column}` is negative ({i})"));
                0
            }),
            Raw::Null => {
                problems.push(format!("attribute `{column}` is missing"));
                0
            }
            raw => {
                problems.push(format!(
                    "attribute `{column}` is not a whole number (type {}: {})",
                    raw.type_name(),
                    text::shorten(&raw.encode(), 40)
                ));
                0
            }
        }
    }

    /// The `holder_meta` column: JSON text, or null.
    fn holder_meta(&self, problems: &mut Vec<String>) -> Option<HolderMeta> {
        match self.get("holder_meta") {
            Raw::Null => None,
            raw => match raw.text().map(serde_json::from_str::<HolderMeta>) {
                Some(Ok(meta)) => Some(meta),
                Some(Err(e)) => {
                    problems.push(format!(
                        "attribute `holder_meta` is not a valid holder description: {e}"
                    ));
                    None
                }
                None => {
                    problems.push(text_problem("holder_meta", raw));
                    None
                }
            },
        }
    }

    /// A digest of every column (name, type and value). Only ever compared
    /// with another fingerprint taken by the same process, so std's hasher
    /// (stable within one build) is enough; two successive versions of one
    /// item colliding in 64 bits is not a practical concern.
    fn fingerprint(&self) -> String {
        let mut h = DefaultHasher::new();
        for (name, value) in COLUMNS.iter().zip(&self.0) {
            name.hash(&mut h);
            value.encode().hash(&mut h);
        }
        format!("{:016x}", h.finish())
    }
}

fn text_problem(column: &str, raw: &Raw) -> String {
    match raw {
        Raw::Text(_) => format!("attribute `{column}` is not valid UTF-8"),
        _ => format!(
            "attribute `{column}` has type {}, expected text",
            raw.type_name()
        ),
    }
}
