//! What the configuration says of the PostgreSQL store, and the reading of
//! its `store.url`: a libpq-style URL, taken apart into what tokio-postgres
//! connects with and the TLS settings leaderd applies itself (`sslmode`,
//! `sslrootcert`), and where the password comes from.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::text;

/// The environment variable libpq reads a password from: leaderd reads it
/// too, when neither the URL nor `store.password_file` gives one.
pub const PASSWORD_ENV: &str = "PGPASSWORD";

/// Where the lease table is on PostgreSQL, as configured.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresSpec {
    /// `store.url`: `postgres://USER@HOST:PORT/DB?sslmode=…`. May hold a
    /// password, so it is never printed whole.
    pub url: String,
    /// `store.password_file`: the password, read at each connection (a
    /// rotated secret is picked up).
    pub password_file: Option<PathBuf>,
    /// `store.ca_file`: the CA certificates (PEM) the server's must chain
    /// to under `sslmode=verify-ca|verify-full`, instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// `store.table`: `NAME` or `SCHEMA.NAME`.
    pub table: String,
    /// The server-side bound of every statement (`statement_timeout`).
    pub statement_timeout: Duration,
}

impl fmt::Debug for PostgresSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSpec")
            .field("url", &redacted(&self.url))
            .field("password_file", &self.password_file)
            .field("ca_file", &self.ca_file)
            .field("table", &self.table)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

/// How the connection is secured: libpq's `sslmode` values but `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, unverified; else plain (libpq's
    /// default, so a URL behaves as it does with psql).
    Prefer,
    /// TLS, the server's certificate not verified.
    Require,
    /// TLS, the certificate chained to a trusted CA; any host name.
    VerifyCa,
    /// TLS, the certificate chained to a trusted CA and naming the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// Whether the server's certificate is verified against trusted CAs.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// The name as written in a URL.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A `store.url` taken apart.
#[derive(Clone)]
pub struct Target {
    /// What tokio-postgres connects with, without `sslmode`'s verification
    /// (ours) and without a password (see [`Target::password`]).
    pub pg: tokio_postgres::Config,
    /// The URL's `sslmode` (default `prefer`).
    pub ssl: SslMode,
    /// The URL's `sslrootcert`, if any.
    pub root_cert: Option<PathBuf>,
    /// Whether the URL holds the password.
    pub url_password: bool,
    /// `HOST:PORT/DB` for messages, never the password.
    pub shown: String,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("shown", &self.shown)
            .field("ssl", &self.ssl)
            .field("root_cert", &self.root_cert)
            .finish_non_exhaustive()
    }
}

/// URL parameters libpq knows that leaderd does not handle: client
/// certificates and revocation lists.
const UNSUPPORTED: [&str; 6] = [
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslsni",
];

/// Take `url` apart, or say in one line what is wrong with it (never
/// repeating its password).
pub fn parse_url(url: &str) -> Result<Target, String> {
    let url = url.trim();
    let shown_url = text::echo(&redacted(url));
    let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    else {
        return Err(format!(
            "store.url = {shown_url} is not a postgres:// URL (like postgres://leaderd@db.example.com:5432/app?sslmode=verify-full)"
        ));
    };
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, query),
        None => (rest, ""),
    };
    let mut ssl = SslMode::Prefer;
    let mut root_cert = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).ok_or_else(|| {
            format!("store.url = {shown_url}: the value of `{key}` is not validly %-encoded")
        })?;
        match key {
            "sslmode" => {
                ssl = SslMode::parse(&value).ok_or_else(|| {
                    format!(
                        "store.url = {shown_url}: sslmode={} is not one of disable, prefer, require, verify-ca, verify-full",
                        text::echo_plain(&value)
                    )
                })?;
            }
            "sslrootcert" => root_cert = Some(PathBuf::from(value)),
            key if UNSUPPORTED.contains(&key) => {
                return Err(format!(
                    "store.url = {shown_url}: `{key}` is not supported (leaderd authenticates with a password; the server's certificate is checked with sslmode and sslrootcert or store.ca_file)"
                ));
            }
            _ => kept.push(pair),
        }
    }
    let mut plain = format!("postgres://{base}");
    if !kept.is_empty() {
        plain.push('?');
        plain.push_str(&kept.join("&"));
    }
    let pg = tokio_postgres::Config::from_str(&plain).map_err(|e| {
        // tokio-postgres says what is wrong in the error's cause.
        let cause = std::error::Error::source(&e)
            .map(|c| format!(": {c}"))
            .unwrap_or_default();
        format!("store.url = {shown_url} is not a valid PostgreSQL URL: {e}{cause}")
    })?;
    if pg.get_hosts().is_empty() {
        return Err(format!(
            "store.url = {shown_url} names no host (like postgres://leaderd@db.example.com:5432/app)"
        ));
    }
    if ssl.verifies()
        && pg
            .get_hosts()
            .iter()
            .any(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)))
    {
        return Err(format!(
            "store.url = {shown_url}: sslmode={} needs a TCP host, not a Unix socket",
            ssl.name()
        ));
    }
    Ok(Target {
        url_password: pg.get_password().is_some(),
        shown: shown(&pg),
        pg,
        ssl,
        root_cert,
    })
}

impl Target {
    /// The password to connect with: the URL's, else `password_file`'s
    /// first line, else [`PASSWORD_ENV`]; `None`: none (the server may not
    /// ask for one).
    pub fn password(&self, password_file: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
        if let Some(p) = self.pg.get_password() {
            return Ok(Some(p.to_vec()));
        }
        if let Some(file) = password_file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                format!(
                    "cannot read store.password_file {}: {e}",
                    text::echo_plain(&file.display().to_string())
                )
            })?;
            // A file written by `echo` or a Secret ends with a newline that is
            // not part of the password.
            let password = text.lines().next().unwrap_or_default();
            return Ok(Some(password.as_bytes().to_vec()));
        }
        Ok(std::env::var_os(PASSWORD_ENV).map(|p| p.into_encoded_bytes()))
    }
}

/// `HOST:PORT/DB` (hosts joined with commas) of a parsed URL.
fn shown(pg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}:{port}", dir.display()),
            }
        })
        .collect();
    let db = pg.get_dbname().or(pg.get_user()).unwrap_or_default();
    format!("{}/{db}", hosts.join(","))
}

/// `url` with the password of its user information replaced by `***`.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((user_info, hosts)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match user_info.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{tail}"),
        None => url.to_owned(),
    }
}

/// `%XX` decoded; `None` for a bad escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The table name as PostgreSQL reads it: each of `SCHEMA.NAME`'s parts
/// quoted, so that it is taken as written (case and all).
pub fn quoted_table(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether `table` can name a PostgreSQL table for leaderd: `NAME` or
/// `SCHEMA.NAME`, each part 1 to 63 bytes (PostgreSQL's limit) of the
/// characters `store.table` allows.
pub fn table_name_problem(table: &str) -> Option<String> {
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 {
        return Some("has more than one `.` (PostgreSQL: NAME or SCHEMA.NAME)".into());
    }
    if parts.iter().any(|p| p.is_empty() || p.len() > 63) {
        return Some(
            "has a part that is empty or longer than 63 bytes (PostgreSQL: NAME or SCHEMA.NAME)"
                .into(),
        );
    }
    None
}
