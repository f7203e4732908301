//! Configuration: figment layers -> a validated, immutable [`Config`].
//!
//! Layers, lowest first: built-in defaults < config file (`--config`, TOML) <
//! environment (`LEADERD_` + key path joined by `__`, e.g.
//! `LEADERD_STORE__KIND`, `LEADERD_LEASE__DURATION`) < command-line flags.
//! Unknown keys are errors wherever they come from. Every error is one line
//! naming the key (and, for a bad value, the value and where it was set), and
//! `leaderd` exits [`EX_CONFIG`] (64) with it.
//!
//! Decisions worth knowing:
//! - leaderd puts `LEADERD_ELECTION`, `LEADERD_IDENTITY`,
//!   `LEADERD_FENCING_TOKEN` and `LEADERD_LEASE_MS` into its child's
//!   environment. A leaderd started inside such a child must not choke on
//!   them, so `LEADERD_ELECTION`, `LEADERD_FENCING_TOKEN` and
//!   `LEADERD_LEASE_MS` are ignored (they are not config keys).
//!   `LEADERD_IDENTITY` *is* the `identity` key, so a nested leaderd inherits
//!   its parent's identity unless it sets one; that is harmless because a
//!   lease is never taken back by identity alone. `LEADERD_TEST_*` variables
//!   are test hooks and are ignored too.
//! - No election configured: one election named `default`.
//! - `--election NAME` (repeatable) replaces the configured list; a name also
//!   configured under `[[elections]]` keeps that entry's overrides.
//! - `http.primary` (`--primary`) defaults to the first election listed.
//! - `child.mode = "always"`: the child is not tied to the lease, so
//!   `on_child_exit = "release"` has no meaning there and is rejected; `exit`
//!   (release every lease, exit with the child's code) and `restart` apply.
//!   `signal_on_gain` / `signal_on_loss` are only valid in that mode, which
//!   also needs a command.
//! - PostgreSQL (`store.kind = "postgres"`): `store.url` is required and
//!   read at once (a malformed one is a configuration error); a password
//!   in it and `store.password_file` together are an error. Each statement
//!   runs under a `statement_timeout` of the shortest renew interval (5 s
//!   for the tools), the longest a renewal waits for its write.
//! - `store.path` is relative to the working directory; `store.region` unset
//!   means the standard AWS sources decide when the store is opened
//!   (`AWS_REGION`, the AWS profile, the EC2 instance metadata: see
//!   `lease::dynamodb::region`), and none naming one is an error then.
//!
//! The rooms: this file holds [`Config`] and loads it; `raw` is what the
//! file and the environment may say, with the value types; `file`, `env`
//! and `flags` are the layers; `extract` merges the file and the
//! environment and words their errors; `build` applies the defaults and
//! validates; `duration` reads every duration (file, environment, flags);
//! `app_check` checks the app check's settings, `metrics` the `[metrics]`
//! ones, `postgres` the PostgreSQL store's, `priority` the preferred
//! leaders'.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Deserialize;
use tracing_subscriber::filter::{LevelFilter, Targets};

use crate::app_check::AppCheckConfig;
use crate::election::ElectionConfig;
use crate::exit::CONFIG as EX_CONFIG;
use crate::lease::StoreSpec;
use crate::lease::dynamodb::DynamoSpec;
use crate::lease::postgres::PostgresSpec;

mod app_check;
mod build;
mod duration;
mod env;
mod extract;
mod file;
pub(crate) mod flags;
mod metrics;
mod postgres;
mod priority;
mod raw;

use build::{
    build, build_admin_token, build_identity, build_listen, build_store, check_election_name,
    check_range, check_unique,
};
use env::process_env;
use extract::extract;
pub use flags::{RunArgs, StoreArgs};
use flags::{apply_run_flags, apply_store_flags};
pub use priority::{DEFAULT_PREEMPT_AFTER, PriorityConfig};
use raw::RawConfig;

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "LEADERD_";

/// Prefix of test-hook variables, never configuration.
pub const TEST_ENV_PREFIX: &str = "LEADERD_TEST_";

/// The top-level configuration keys. An environment variable is read as
/// configuration when its first segment names one of them, or when it has
/// the `SECTION__KEY` shape (so a misspelt section is still an error).
const TOP_LEVEL_KEYS: [&str; 15] = [
    "identity",
    "balance",
    "sessions",
    "priority",
    "preempt",
    "preempt_after",
    "store",
    "lease",
    "elections",
    "http",
    "child",
    "log",
    "health",
    "app_check",
    "metrics",
];

/// The election run when none is configured.
pub const DEFAULT_ELECTION: &str = "default";

/// Which lease store to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// An embedded SQLite file (the default).
    Sqlite,
    /// Amazon DynamoDB.
    Dynamodb,
    /// A PostgreSQL table.
    Postgres,
}

/// When the child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Start on becoming leader, stop on losing the lease (the default).
    WhileLeader,
    /// Start at once; only signal transitions.
    Always,
}

/// What happens when the child exits on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnChildExit {
    /// Release the lease and exit with the child's code (the default).
    Exit,
    /// Restart the child with backoff.
    Restart,
    /// Release the lease, wait, campaign again (`while-leader` only).
    Release,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line.
    Json,
}

/// `[store]`: where the leases live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `store.kind`.
    pub kind: StoreKind,
    /// `store.path`: the SQLite file (relative to the working directory).
    pub path: PathBuf,
    /// `store.table`: the DynamoDB table.
    pub table: String,
    /// `store.region`; `None`: the standard AWS sources decide (see
    /// `lease::dynamodb::region`).
    pub region: Option<String>,
    /// `store.endpoint_url`; `None`: the region's AWS endpoint.
    pub endpoint_url: Option<String>,
    /// `store.url`, `store.password_file`, `store.ca_file` and the
    /// statement timeout: the PostgreSQL store (`None` unless `store.kind`
    /// is `postgres`; the table is [`StoreConfig::table`]).
    pub postgres: Option<PostgresSpec>,
    /// `store.create_table`: create the DynamoDB or PostgreSQL table at
    /// start if missing.
    pub create_table: bool,
    /// `store.fail_fast`: exit 69 if the store is unreachable at start.
    pub fail_fast: bool,
}

impl StoreConfig {
    /// The store these settings name.
    pub fn spec(&self) -> StoreSpec {
        match self.kind {
            StoreKind::Sqlite => StoreSpec::Sqlite(self.path.clone()),
            StoreKind::Dynamodb => StoreSpec::Dynamodb {
                config: self.dynamo(),
                create_table: self.create_table,
            },
            StoreKind::Postgres => StoreSpec::Postgres {
                config: self
                    .postgres
                    .clone()
                    .expect("build_store sets it whenever store.kind is postgres"),
                create_table: self.create_table,
            },
        }
    }

    /// The DynamoDB table these settings name; its region, when unset, is
    /// found when the store is opened ([`DynamoSpec::resolve`]).
    pub fn dynamo(&self) -> DynamoSpec {
        DynamoSpec {
            table: self.table.clone(),
            region: self.region.clone(),
            endpoint_url: self.endpoint_url.clone(),
        }
    }
}

/// `[http]` (the primary election is [`Config::primary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// `http.listen`.
    pub listen: SocketAddr,
    /// `http.admin_token`: enables `POST /leader/{e}/resign`; `None` when empty.
    pub admin_token: Option<String>,
    /// `http.advertise`: the `HOST:PORT` written into the record while
    /// leading. `None`: derived from the bound address (see
    /// `daemon::advertise`).
    pub advertise: Option<String>,
}

/// `[child]`: the supervised process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildConfig {
    /// `child.command` or the arguments after `--`; empty: no child.
    pub command: Vec<String>,
    /// `child.mode`.
    pub mode: Mode,
    /// `child.on_child_exit`.
    pub on_child_exit: OnChildExit,
    /// `child.stop_signal`.
    pub stop_signal: Signal,
    /// `child.kill_grace` (G): also every election's `kill_grace`.
    pub kill_grace: Duration,
    /// `child.shutdown_grace`: how long SIGTERM to leaderd waits for the child.
    pub shutdown_grace: Duration,
    /// `child.signal_on_gain` (mode `always` only).
    pub signal_on_gain: Option<Signal>,
    /// `child.signal_on_loss` (mode `always` only).
    pub signal_on_loss: Option<Signal>,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `log.format`.
    pub format: LogFormat,
    /// `log.level`: a level (`info`) or a list of `TARGET=LEVEL` directives
    /// with an optional default level (`info,leaderd=debug`); validated.
    pub level: String,
}

impl LogConfig {
    /// What to log: `RUST_LOG` when it is set and valid (for debugging),
    /// else `log.level`, else `info`. Both are read as [`log_filter`] reads
    /// them.
    pub fn filter(&self) -> Targets {
        std::env::var("RUST_LOG")
            .ok()
            .and_then(|v| log_filter(&v))
            .or_else(|| log_filter(&self.level))
            .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
    }
}

/// A log filter: comma-separated `TARGET=LEVEL` directives and at most one
/// bare level, the default (`info,leaderd=debug`); a target covers the
/// targets it prefixes, the longest match wins. `RUST_LOG`'s syntax without
/// its span and field filters (`target[span{field=value}]=level`), which
/// would need a regex engine in the binary: those are `None`, as are empty
/// and malformed lists.
pub fn log_filter(directives: &str) -> Option<Targets> {
    let directives = directives.trim();
    if directives.is_empty() || directives.contains(['[', ']', '{', '}']) {
        return None;
    }
    directives.parse().ok()
}

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthConfig {
    /// `health.store_timeout`: `/healthz` fails when the store has been
    /// unreachable for longer; `None`: the store never fails `/healthz`.
    pub store_timeout: Option<Duration>,
}

/// `[metrics]`: which elections have series of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `metrics.election_series_limit`: with more elections than this, only
    /// those in `elections` and the primary have series of their own.
    pub election_series_limit: usize,
    /// `metrics.elections`: elections that keep series of their own above
    /// the limit (each one configured).
    pub elections: Vec<String>,
}

/// The validated configuration of `leaderd run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Our identity in every lease record.
    pub identity: String,
    /// The lease store.
    pub store: StoreConfig,
    /// One entry per election, timing checked, ready for the daemon's node
    /// (which shares them: one copy of each in the daemon).
    pub elections: Vec<Arc<ElectionConfig>>,
    /// The election behind `GET /leader` (one of `elections`).
    pub primary: String,
    /// HTTP server.
    pub http: HttpConfig,
    /// The child.
    pub child: ChildConfig,
    /// Logging.
    pub log: LogConfig,
    /// `/healthz` settings.
    pub health: HealthConfig,
    /// `[app_check]`; `None` when no probe is set.
    pub app_check: Option<AppCheckConfig>,
    /// `[metrics]`.
    pub metrics: MetricsConfig,
    /// `--acquire-timeout`: `Some(0)` = try once, `None` = wait forever.
    pub acquire_timeout: Option<Duration>,
    /// `balance`: share the elections with the other live daemons that
    /// campaign for the same set (docs/balance.md).
    pub balance: bool,
    /// `priority`, `preempt`, `preempt_after`: preferred leaders
    /// (docs/leadership.md).
    pub priority: PriorityConfig,
    /// `sessions`: hold every election through one session record per
    /// process, renewed for all of them (docs/leadership.md).
    pub sessions: bool,
    /// Valid but risky settings, one line each, for the caller to log.
    pub warnings: Vec<String>,
}

/// What `leaderd status` and `leaderd table` need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolConfig {
    /// The lease store.
    pub store: StoreConfig,
    /// The elections the file and the environment list, or
    /// [`DEFAULT_ELECTION`] alone when they list none: the set a daemon of
    /// this configuration campaigns for (unless its `--election` replaces
    /// it), by which `status` names a member's per-election priorities.
    pub elections: Vec<String>,
    /// Valid but questionable input, one line each, for the caller to print.
    pub warnings: Vec<String>,
}

/// An invalid configuration. Display is one line naming the key; the process
/// exits [`ConfigError::exit_code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read config file {}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why, e.g. "No such file or directory".
        reason: String,
    },
    /// The `--config` file is not valid TOML.
    #[error("invalid TOML in {}{position}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// " at line L, column C", or empty when unknown.
        position: String,
        /// The parser's message.
        message: String,
    },
    /// A key that is not part of the configuration.
    #[error("unknown key {key} in {origin} (known keys here: {known})")]
    UnknownKey {
        /// Full key path, e.g. `store.tabel`.
        key: String,
        /// The file, or `environment variable LEADERD_…`.
        origin: String,
        /// The valid keys at that level.
        known: String,
    },
    /// A key with a bad value, or settings that contradict each other.
    #[error("invalid config: {message}")]
    Invalid {
        /// The (first) key at fault, e.g. `lease.duration`.
        key: String,
        /// One line naming the key and the value.
        message: String,
    },
}

impl ConfigError {
    /// The process exit code for this error: always [`EX_CONFIG`] (64).
    pub fn exit_code(&self) -> i32 {
        EX_CONFIG
    }

    /// The key at fault, when one is known.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::Unreadable { .. } | ConfigError::Syntax { .. } => None,
        }
    }

    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Load `leaderd run`'s configuration from `args`, the file it names and
    /// the process environment.
    pub fn load(args: &RunArgs) -> Result<Config, ConfigError> {
        Self::load_with_env(args, process_env()?)
    }

    /// Like [`Config::load`] with an explicit environment (name, value) list
    /// instead of the process's; only `LEADERD_*` entries are looked at.
    pub fn load_with_env(
        args: &RunArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut raw = extract(args.store.config.as_deref(), env)?;
        apply_store_flags(&mut raw.store, &args.store);
        apply_run_flags(&mut raw, args);
        build(raw, args.acquire_timeout)
    }
}

/// What `leaderd lock` needs: the store, who holds a lock it takes, and the
/// timing of waiting for one.
#[derive(Debug, Clone, PartialEq)]
pub struct LockConfig {
    /// The lease store.
    pub store: StoreConfig,
    /// The holder written into a lock it takes (`identity`).
    pub identity: String,
    /// D (`lease.max_clock_drift`), which stretches the lease a waiter
    /// waits out before it takes a lock over (the takeover rule).
    pub max_clock_drift: f64,
    /// P (`lease.retry_interval`): how often a waiter reads the record.
    pub retry_interval: Duration,
    /// Valid but questionable input, one line each, for the caller to print.
    pub warnings: Vec<String>,
}

/// What `leaderd resign` needs: where the daemon listens and its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResignConfig {
    /// `http.listen`.
    pub listen: SocketAddr,
    /// `http.admin_token`; `None` when empty.
    pub admin_token: Option<String>,
}

impl ResignConfig {
    /// Load from the file `config` names (if any) and the process
    /// environment, as the daemon would.
    pub fn load(config: Option<&Path>) -> Result<ResignConfig, ConfigError> {
        let raw = extract(config, process_env()?)?;
        Ok(ResignConfig {
            listen: build_listen(&raw)?,
            admin_token: build_admin_token(&raw)?,
        })
    }
}

/// Whether `id` may be an identity: printable text of 1 to 255 bytes. A
/// successor named in a resign is checked by the same rule.
pub fn is_valid_identity(id: &str) -> bool {
    !id.trim().is_empty() && !id.chars().any(char::is_control) && id.len() <= limits::MAX_NAME_BYTES
}

/// Check a lock's name as election names are checked (it is one).
pub fn check_lock_name(name: &str) -> Result<(), ConfigError> {
    check_election_name("NAME", name)
}

impl LockConfig {
    /// Load from `args`, the file it names and the process environment.
    pub fn load(args: &StoreArgs) -> Result<LockConfig, ConfigError> {
        let mut raw = extract(args.config.as_deref(), process_env()?)?;
        let tool = ToolConfig::from_raw(&mut raw, args)?;
        let identity = build_identity(&raw)?;
        let max_clock_drift = raw
            .lease
            .max_clock_drift
            .map_or(crate::election::defaults::MAX_CLOCK_DRIFT, |f| f.0);
        crate::election::check_drift(max_clock_drift).map_err(|_| {
            ConfigError::invalid(
                "lease.max_clock_drift",
                format!(
                    "{} must be at least 0 and below 0.5",
                    raw.show("lease.max_clock_drift", &max_clock_drift.to_string())
                ),
            )
        })?;
        let retry_interval = raw
            .lease
            .retry_interval
            .map_or(crate::election::defaults::RETRY_INTERVAL, |d| d.0);
        check_range(
            "lease.retry_interval",
            &raw.origin("lease.retry_interval"),
            retry_interval,
            limits::MIN_INTERVAL,
            limits::MAX_LEASE,
        )?;
        Ok(LockConfig {
            store: tool.store,
            identity,
            max_clock_drift,
            retry_interval,
            warnings: tool.warnings,
        })
    }
}

impl ToolConfig {
    /// Load what `status` and `table` need from `args`, the file it names and
    /// the process environment. The whole file is still checked for unknown
    /// keys and bad values of the store section; other sections are only
    /// type-checked.
    pub fn load(args: &StoreArgs) -> Result<ToolConfig, ConfigError> {
        Self::load_with_env(args, process_env()?)
    }

    /// Like [`ToolConfig::load`] with an explicit environment.
    pub fn load_with_env(
        args: &StoreArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ToolConfig, ConfigError> {
        let mut raw = extract(args.config.as_deref(), env)?;
        Self::from_raw(&mut raw, args)
    }

    /// The tools' part of an extracted configuration, with the store flags
    /// of `args` applied.
    fn from_raw(raw: &mut RawConfig, args: &StoreArgs) -> Result<ToolConfig, ConfigError> {
        apply_store_flags(&mut raw.store, args);
        let store = build_store(std::mem::take(&mut raw.store))?;
        // Checked like `run` checks them, though the tools read every
        // election in the store.
        let mut names = Vec::new();
        for (i, e) in raw.elections.iter().enumerate() {
            check_election_name(&format!("elections[{i}].name"), &e.name)?;
            names.push(e.name.clone());
        }
        check_unique(&names)?;
        if names.is_empty() {
            names.push(DEFAULT_ELECTION.to_owned());
        }
        Ok(ToolConfig {
            store,
            elections: names,
            warnings: std::mem::take(&mut raw.warnings),
        })
    }
}

// ---------------------------------------------------------------------------
// Defaults and validation.

/// Built-in defaults. The timing ones are the election engine's.
pub mod defaults {
    pub use crate::election::defaults::{
        KILL_GRACE, LEASE_DURATION, MAX_CLOCK_DRIFT, RETRY_INTERVAL, SAFETY_MARGIN, renew_interval,
    };
    use std::time::Duration;

    /// `store.path`.
    pub const STORE_PATH: &str = "leaderd.db";
    /// `store.table`.
    pub const TABLE: &str = "leaderd";
    /// `http.listen`.
    pub const LISTEN: &str = "0.0.0.0:9777";
    /// `child.shutdown_grace`.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// `log.level`.
    pub const LOG_LEVEL: &str = "info";
    /// `metrics.election_series_limit`.
    pub const ELECTION_SERIES_LIMIT: u32 = 100;
}

/// The bounds every setting is checked against: far beyond any sane value,
/// but small enough that no arithmetic on them can overflow.
pub mod limits {
    use std::time::Duration;

    /// The longest lease; also the longest renew and retry interval, kill
    /// grace and safety margin.
    pub const MAX_LEASE: Duration = Duration::from_secs(60 * 60);
    /// The shortest renew and retry interval: anything shorter polls the
    /// store in a loop.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
    /// The longest wait: shutdown grace, acquire timeout, store timeout of
    /// `/healthz`, table creation.
    pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);
    /// The most consecutive results an app check threshold may ask for.
    pub const MAX_THRESHOLD: u32 = 1000;
    /// The longest identity or election name, in bytes.
    pub const MAX_NAME_BYTES: usize = 255;
}

/// The default identity: host name + "-" + four random hex digits, so that a
/// restarted process is a new candidate.
pub fn default_identity() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "leaderd".to_string());
    format!("{host}-{:04x}", rand::random::<u16>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn log_filters_are_target_level_lists() {
        let f = log_filter(" info,leaderd=debug,aws_config=off ").expect("valid");
        assert!(f.would_enable("leaderd::daemon", &Level::DEBUG));
        assert!(!f.would_enable("leaderd::daemon", &Level::TRACE));
        assert!(f.would_enable("hyper", &Level::INFO));
        assert!(!f.would_enable("hyper", &Level::DEBUG));
        assert!(!f.would_enable("aws_config::imds", &Level::ERROR));
        // A target alone: only that target, as RUST_LOG reads it.
        let f = log_filter("leaderd=warn").expect("valid");
        assert!(f.would_enable("leaderd", &Level::WARN));
        assert!(!f.would_enable("hyper", &Level::ERROR));
        for bad in [
            "",
            " ",
            "info,leaderd[run]=debug",
            "leaderd[{x}]=debug",
            "a=b=c",
            "x=loud",
        ] {
            assert!(log_filter(bad).is_none(), "{bad:?}");
        }
    }
}
