//! Configuration (DESIGN §6): figment layers -> a validated, immutable [`Config`].
//!
//! Layers, lowest first: built-in defaults < config file (`--config`, TOML) <
//! environment (`LEADERD_` + key path joined by `__`, e.g.
//! `LEADERD_STORE__KIND`, `LEADERD_LEASE__DURATION`) < command-line flags.
//! Unknown keys are errors wherever they come from. Every error is one line
//! naming the key (and, for a bad value, the value and where it was set), and
//! `leaderd` exits [`EX_CONFIG`] (64) with it.
//!
//! Decisions the contract leaves open:
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
//! - `http.primary` defaults to the only election and is required when there
//!   are several.
//! - `child.mode = "always"`: the child is not tied to the lease, so
//!   `on_child_exit = "release"` has no meaning there and is rejected; `exit`
//!   (release every lease, exit with the child's code) and `restart` apply.
//!   `signal_on_gain` / `signal_on_loss` are only valid in that mode, which
//!   also needs a command.
//! - `store.path` is relative to the working directory; `store.region` unset
//!   means the standard AWS chain decides.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::error::{Actual, Kind};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};
use nix::sys::signal::Signal;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::cli::{EX_CONFIG, RunArgs, StoreArgs};
use crate::election::ElectionConfig;

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "LEADERD_";

/// Prefix of test-hook variables, never configuration.
pub const TEST_ENV_PREFIX: &str = "LEADERD_TEST_";

/// The top-level configuration keys. An environment variable is read as
/// configuration when its first segment names one of them, or when it has
/// the `SECTION__KEY` shape (so a misspelt section is still an error).
const TOP_LEVEL_KEYS: [&str; 8] = [
    "identity",
    "store",
    "lease",
    "elections",
    "http",
    "child",
    "log",
    "health",
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
    /// `store.region`; `None`: the standard AWS chain decides.
    pub region: Option<String>,
    /// `store.endpoint_url`; `None`: the region's AWS endpoint.
    pub endpoint_url: Option<String>,
    /// `store.create_table`: create the DynamoDB table at start if missing.
    pub create_table: bool,
    /// `store.fail_fast`: exit 69 if the store is unreachable at start.
    pub fail_fast: bool,
}

/// `[http]` (the primary election is [`Config::primary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// `http.listen`.
    pub listen: SocketAddr,
    /// `http.admin_token`: enables `POST /leader/{e}/resign`; `None` when empty.
    pub admin_token: Option<String>,
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
    /// `log.level`: a level (`info`) or an `EnvFilter` directive list
    /// (`info,leaderd=debug`); validated.
    pub level: String,
}

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthConfig {
    /// `health.store_timeout`: `/healthz` fails when the store has been
    /// unreachable for longer; `None`: the store never fails `/healthz`.
    pub store_timeout: Option<Duration>,
}

/// The validated configuration of `leaderd run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Our identity in every lease record.
    pub identity: String,
    /// The lease store.
    pub store: StoreConfig,
    /// One entry per election, timing checked, ready for `election::spawn`.
    pub elections: Vec<ElectionConfig>,
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
    /// `--acquire-timeout`: `Some(0)` = try once, `None` = wait forever.
    pub acquire_timeout: Option<Duration>,
    /// Valid but risky settings, one line each, for the caller to log.
    pub warnings: Vec<String>,
}

/// What `leaderd status` and `leaderd table` need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolConfig {
    /// The lease store.
    pub store: StoreConfig,
    /// The configured election names (`default` when none is configured).
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
        apply_store_flags(&mut raw.store, args);
        let store = build_store(std::mem::take(&mut raw.store))?;
        let mut elections = Vec::new();
        for (i, e) in raw.elections.iter().enumerate() {
            check_election_name(&format!("elections[{i}].name"), &e.name)?;
            elections.push(e.name.clone());
        }
        check_unique(&elections)?;
        if elections.is_empty() {
            elections.push(DEFAULT_ELECTION.to_string());
        }
        Ok(ToolConfig {
            store,
            elections,
            warnings: raw.warnings,
        })
    }
}

// ---------------------------------------------------------------------------
// Raw layer: what figment extracts. Every field optional so that defaults and
// flags are applied in one place (`build`), and so that "unset" stays
// distinguishable from "set to the default" (renew_interval, overrides).

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    identity: Option<String>,
    store: RawStore,
    lease: RawLease,
    elections: Vec<RawElection>,
    http: RawHttp,
    child: RawChild,
    log: RawLog,
    health: RawHealth,
    /// Keys set by a command-line flag, and the flag: messages name both.
    #[serde(skip)]
    flags: BTreeMap<&'static str, &'static str>,
    /// Valid but questionable input met while loading (unknown variables).
    #[serde(skip)]
    warnings: Vec<String>,
}

impl RawConfig {
    /// `key`, followed by the flag that set it, if one did:
    /// `lease.duration (--lease-duration)`.
    fn label(&self, key: &str) -> String {
        match self.flags.get(key) {
            Some(flag) => format!("{key} ({flag})"),
            None => key.to_owned(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawStore {
    kind: Option<StoreKind>,
    path: Option<PathBuf>,
    table: Option<String>,
    region: Option<String>,
    endpoint_url: Option<String>,
    create_table: Option<bool>,
    fail_fast: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLease {
    duration: Option<DurationValue>,
    renew_interval: Option<DurationValue>,
    retry_interval: Option<DurationValue>,
    max_clock_drift: Option<Fraction>,
    safety_margin: Option<DurationValue>,
    strict_new_lease: Option<bool>,
}

// serde's `flatten` does not combine with `deny_unknown_fields`, hence the
// repeated [lease] keys.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawElection {
    name: String,
    #[serde(default)]
    duration: Option<DurationValue>,
    #[serde(default)]
    renew_interval: Option<DurationValue>,
    #[serde(default)]
    retry_interval: Option<DurationValue>,
    #[serde(default)]
    max_clock_drift: Option<Fraction>,
    #[serde(default)]
    safety_margin: Option<DurationValue>,
    #[serde(default)]
    strict_new_lease: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawHttp {
    listen: Option<ListenAddr>,
    primary: Option<String>,
    admin_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawChild {
    command: Option<Vec<String>>,
    mode: Option<Mode>,
    on_child_exit: Option<OnChildExit>,
    stop_signal: Option<SignalName>,
    kill_grace: Option<DurationValue>,
    shutdown_grace: Option<DurationValue>,
    signal_on_gain: Option<SignalName>,
    signal_on_loss: Option<SignalName>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLog {
    format: Option<LogFormat>,
    level: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawHealth {
    store_timeout: Option<DurationValue>,
}

/// A humantime duration string (`10s`, `1m30s`, `200ms`). Bare numbers are
/// rejected: a unit is required.
#[derive(Debug, Clone, Copy, PartialEq)]
struct DurationValue(Duration);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration (like 10s, 1m30s)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DurationValue, E> {
                humantime::parse_duration(s.trim())
                    .map(DurationValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_str(V)
    }
}

/// A fraction such as `0.01` (1%).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fraction(f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Fraction;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a fraction (like 0.01 for 1%)")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Fraction, E> {
                Ok(Fraction(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fraction, E> {
                Ok(Fraction(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fraction, E> {
                Ok(Fraction(v as f64))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Fraction, E> {
                s.trim()
                    .parse()
                    .map(Fraction)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        // Not deserialize_f64: figment's lossy mode would turn "0.02" from
        // the environment into an f32 first. Strings are parsed here.
        d.deserialize_any(V)
    }
}

/// A signal name: `SIGTERM` or `TERM`, any case; empty = none.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SignalName(Option<Signal>);

impl<'de> Deserialize<'de> for SignalName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SignalName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a signal name (like SIGTERM or TERM)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<SignalName, E> {
                parse_signal(s)
                    .map(SignalName)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_str(V)
    }
}

/// Parse `SIGTERM`, `TERM`, `sigterm`, `term`; `Some(None)` for an empty
/// string; `None` for anything else.
pub fn parse_signal(s: &str) -> Option<Option<Signal>> {
    let s = s.trim();
    if s.is_empty() {
        return Some(None);
    }
    let upper = s.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&full).ok().map(Some)
}

/// An HTTP listen address as written, `HOST:PORT`; resolved by
/// [`resolve_listen`] when the configuration is built.
#[derive(Debug, Clone, PartialEq)]
struct ListenAddr(String);

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ListenAddr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address like 0.0.0.0:9777, [::1]:9777 or localhost:9777")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ListenAddr, E> {
                match split_host_port(s) {
                    Some(_) => Ok(ListenAddr(s.trim().to_owned())),
                    None => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// `HOST:PORT` (`[IPv6]:PORT` too) split into its parts, if it has that
/// shape; the host may be a name.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.trim().rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port.parse().ok()?;
    (!host.is_empty()).then_some((host, port))
}

/// The address to bind for `HOST:PORT`: an IP as it is, a host name
/// resolved (its first address).
fn resolve_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = s.trim().parse() {
        return Ok(addr);
    }
    let (host, port) = split_host_port(s).ok_or("not HOST:PORT")?;
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{} has no address", echo(host))),
        Err(e) => Err(format!("cannot resolve {}: {e}", echo(host))),
    }
}

// ---------------------------------------------------------------------------
// Layers.

/// The process's `LEADERD_*` variables. Non-Unicode names are skipped (they
/// cannot be config keys); a non-Unicode value of a config variable is an error.
fn process_env() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        match value.into_string() {
            Ok(value) => vars.push((name.to_string(), value)),
            Err(_) if env_role(name) != EnvRole::Config => {}
            Err(_) => {
                return Err(ConfigError::invalid(
                    env_key(name),
                    format!("environment variable {} is not valid UTF-8", echo(name)),
                ));
            }
        }
    }
    Ok(vars)
}

/// What a `LEADERD_*` variable is to the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EnvRole {
    /// A setting: `LEADERD_IDENTITY`, `LEADERD_STORE__KIND`, and anything
    /// shaped `SECTION__KEY` (a misspelt one is an error).
    Config,
    /// Not ours to read, silently: what leaderd gives its child, the
    /// service links Kubernetes adds for a Service named `leaderd…`, test
    /// hooks.
    Foreign,
    /// Neither a setting nor anything known: ignored with a warning (it may
    /// be a misspelt `LEADERD_IDENTITY`).
    Unknown,
}

fn env_role(name: &str) -> EnvRole {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return EnvRole::Foreign;
    };
    if name.starts_with(TEST_ENV_PREFIX) {
        return EnvRole::Foreign;
    }
    let first = rest.split("__").next().unwrap_or("").to_ascii_lowercase();
    if rest.contains("__") || TOP_LEVEL_KEYS.contains(&first.as_str()) {
        return EnvRole::Config;
    }
    if crate::supervisor::child_env::ALL.contains(&name) || is_service_link(rest) {
        return EnvRole::Foreign;
    }
    // `LEADERD_STORE_KIND`: a setting with one underscore too few, which
    // must not pass silently.
    let first_word = rest.split('_').next().unwrap_or("").to_ascii_lowercase();
    if TOP_LEVEL_KEYS.contains(&first_word.as_str()) {
        EnvRole::Config
    } else {
        EnvRole::Unknown
    }
}

/// Kubernetes' service-link variables, after the `LEADERD_` of a Service
/// named `leaderd` or `leaderd-…`: `SERVICE_HOST`, `SERVICE_PORT[_NAME]`,
/// `PORT`, `PORT_9777_TCP[_ADDR|_PORT|_PROTO]`, with the rest of the
/// Service's name in front (`METRICS_PORT`).
fn is_service_link(rest: &str) -> bool {
    let words: Vec<&str> = rest.split('_').collect();
    words.windows(2).any(|w| {
        (w[0] == "SERVICE" && (w[1] == "HOST" || w[1] == "PORT"))
            || (w[0] == "PORT" && w[1].bytes().all(|b| b.is_ascii_digit()) && !w[1].is_empty())
    }) || words.last() == Some(&"PORT")
}

/// `LEADERD_STORE__KIND` -> `store.kind`.
fn env_key(name: &str) -> String {
    name.strip_prefix(ENV_PREFIX)
        .unwrap_or(name)
        .to_ascii_lowercase()
        .replace("__", ".")
}

const ENV_SOURCE: &str = "environment";

/// The environment layer, built from an explicit list so that tests need not
/// touch the process environment.
struct EnvLayer {
    /// (variable name, key path, value), sorted by name.
    vars: Vec<(String, Vec<String>, String)>,
    /// `LEADERD_*` variables that are neither settings nor known: the
    /// caller warns about them.
    unknown: Vec<String>,
}

impl EnvLayer {
    fn new(env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        let mut unknown = Vec::new();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            match env_role(&name) {
                EnvRole::Config => {}
                EnvRole::Foreign => continue,
                EnvRole::Unknown => {
                    unknown.push(name);
                    continue;
                }
            }
            let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
            if path.iter().any(String::is_empty) {
                return Err(ConfigError::UnknownKey {
                    key: echo_plain(&env_key(&name)),
                    origin: format!("environment variable {}", echo_plain(&name)),
                    known: TOP_LEVEL_KEYS.join(", "),
                });
            }
            vars.push((name, path, value));
        }
        unknown.sort();
        vars.sort();
        // A variable naming a section and one naming a key inside it cannot
        // both be honoured.
        for (i, (a, pa, _)) in vars.iter().enumerate() {
            for (b, pb, _) in &vars[i + 1..] {
                let nested = (pa.len() < pb.len() && pb.starts_with(pa))
                    || (pb.len() < pa.len() && pa.starts_with(pb));
                if nested {
                    return Err(ConfigError::invalid(
                        env_key(a),
                        format!(
                            "environment variables {a} ({}) and {b} ({}) conflict: one names a section, the other a key inside it",
                            env_key(a),
                            env_key(b)
                        ),
                    ));
                }
            }
        }
        Ok(EnvLayer { vars, unknown })
    }

    /// One warning per unknown variable.
    fn warnings(&self) -> Vec<String> {
        self.unknown
            .iter()
            .map(|name| {
                format!(
                    "environment variable {} is not a setting and is ignored (settings are LEADERD_IDENTITY and LEADERD_<SECTION>__<KEY>, like LEADERD_STORE__KIND)",
                    echo_plain(name)
                )
            })
            .collect()
    }
}

impl Provider for EnvLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_SOURCE).interpolater(|_: &Profile, keys: &[&str]| {
            format!("{ENV_PREFIX}{}", keys.join("__").to_ascii_uppercase())
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut root = Dict::new();
        for (_, path, value) in &self.vars {
            // Values stay strings (so `LEADERD_IDENTITY=1234` is an identity,
            // not a number); extract_lossy turns "true"/"0.02" into bools and
            // numbers where the key wants one. A value in brackets is an
            // array, e.g. LEADERD_CHILD__COMMAND='["./job.sh", "--all"]'.
            let leaf = if value.trim_start().starts_with('[') {
                value
                    .parse::<Value>()
                    .expect("figment's Value::from_str is infallible")
            } else {
                Value::from(value.clone())
            };
            insert(&mut root, path, leaf);
        }
        Ok(Profile::Default.collect(root))
    }
}

fn insert(dict: &mut Dict, path: &[String], leaf: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), leaf);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, leaf);
            }
            // A non-dict here is ruled out by EnvLayer::new's conflict check.
        }
    }
}

/// The config file layer: read and parsed by us so that a missing file is an
/// error (figment's file provider treats it as empty) and parse errors are
/// one line.
struct FileLayer {
    path: PathBuf,
    dict: Dict,
}

impl FileLayer {
    fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Unreadable {
            path: path.to_path_buf(),
            reason: io_reason(&e),
        })?;
        let dict: Dict = toml::from_str(&text).map_err(|e| {
            let position = e
                .span()
                .map(|span| {
                    let (line, column) = line_column(&text, span.start);
                    format!(" at line {line}, column {column}")
                })
                .unwrap_or_default();
            ConfigError::Syntax {
                path: path.to_path_buf(),
                position,
                message: one_line(e.message()),
            }
        })?;
        Ok(FileLayer {
            path: path.to_path_buf(),
            dict,
        })
    }
}

impl Provider for FileLayer {
    fn metadata(&self) -> Metadata {
        Metadata::from("config file", Source::File(self.path.clone()))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// "No such file or directory (os error 2)" -> "No such file or directory".
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Defaults (serde) < file < environment, extracted into the raw layer.
fn extract(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<RawConfig, ConfigError> {
    let mut figment = Figment::new();
    if let Some(path) = file {
        figment = figment.merge(FileLayer::read(path)?);
    }
    let env = EnvLayer::new(env)?;
    let warnings = env.warnings();
    let names: Vec<(String, Vec<String>)> = env
        .vars
        .iter()
        .map(|(name, path, _)| (name.clone(), path.clone()))
        .collect();
    figment = figment.merge(env);
    let mut raw = figment
        .extract_lossy::<RawConfig>()
        .map_err(|e| figment_error(e, &names))?;
    raw.warnings = warnings;
    Ok(raw)
}

/// Turn figment's (possibly multi-error, multi-line) error into one line
/// about the first problem.
fn figment_error(error: figment::Error, env: &[(String, Vec<String>)]) -> ConfigError {
    let key = echo_plain(&key_path(&error.path));
    let origin = error.metadata.as_ref().map(|md| match &md.source {
        Some(Source::File(path)) => path.display().to_string(),
        _ if md.name == ENV_SOURCE => {
            // The variable itself, not the key path figment stopped at (an
            // unknown section stops at its first segment).
            let name = env
                .iter()
                .find(|(_, path)| path.starts_with(&error.path))
                .map_or_else(
                    || md.interpolate(&Profile::Default, &error.path),
                    |(name, _)| name.clone(),
                );
            format!("environment variable {}", echo_plain(&name))
        }
        _ => md.name.to_string(),
    });
    let at = origin
        .as_ref()
        .map(|o| format!(", in {o}"))
        .unwrap_or_default();
    let message = match &error.kind {
        Kind::UnknownField(_, known) => {
            return ConfigError::UnknownKey {
                key,
                origin: origin.unwrap_or_else(|| "the configuration".into()),
                known: known.join(", "),
            };
        }
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!(
                "{key} = {} is not {}{at}",
                show(actual),
                plain_expected(expected)
            )
        }
        Kind::UnknownVariant(value, known) => format!(
            "{key} = {value:?} is not one of {}{at}",
            known
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Kind::MissingField(field) => {
            let key = if key.is_empty() {
                field.to_string()
            } else {
                format!("{key}.{field}")
            };
            return ConfigError::invalid(key.clone(), format!("{key} is missing{at}"));
        }
        other => format!("{key}: {}{at}", one_line(&other.to_string())),
    };
    ConfigError::invalid(key, message)
}

/// ["elections", "0", "duration"] -> "elections[0].duration".
fn key_path(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(segment);
        }
    }
    out
}

/// serde's names for what it wanted, in TOML words.
fn plain_expected(expected: &str) -> String {
    if expected.starts_with("struct ") || expected == "a map" {
        "a table".to_string()
    } else if expected == "a sequence" {
        "an array".to_string()
    } else if expected == "a boolean" {
        "a boolean (true or false)".to_string()
    } else {
        expected.to_string()
    }
}

/// A value as the user wrote it.
fn show(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => echo(s),
        Actual::Bool(b) => b.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Signed(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Char(c) => format!("{:?}", c.to_string()),
        Actual::Seq => "an array".into(),
        Actual::Map => "a table".into(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Flags: the top layer, applied to the raw layer after extraction.

fn apply_store_flags(store: &mut RawStore, args: &StoreArgs) {
    if let Some(kind) = args.store_kind {
        store.kind = Some(kind);
    }
    if let Some(path) = &args.store_path {
        store.path = Some(path.clone());
    }
    if let Some(table) = &args.table {
        store.table = Some(table.clone());
    }
    if let Some(region) = &args.region {
        store.region = Some(region.clone());
    }
    if let Some(url) = &args.endpoint_url {
        store.endpoint_url = Some(url.clone());
    }
}

fn apply_run_flags(raw: &mut RawConfig, args: &RunArgs) {
    let set = [
        (args.identity.is_some(), "identity", "--identity"),
        (args.listen.is_some(), "http.listen", "--listen"),
        (
            args.lease_duration.is_some(),
            "lease.duration",
            "--lease-duration",
        ),
        (
            args.renew_interval.is_some(),
            "lease.renew_interval",
            "--renew-interval",
        ),
        (
            args.retry_interval.is_some(),
            "lease.retry_interval",
            "--retry-interval",
        ),
        (
            args.kill_grace.is_some(),
            "child.kill_grace",
            "--kill-grace",
        ),
    ];
    for (given, key, flag) in set {
        if given {
            raw.flags.insert(key, flag);
        }
    }
    if let Some(identity) = &args.identity {
        raw.identity = Some(identity.clone());
    }
    if !args.elections.is_empty() {
        raw.elections = args
            .elections
            .iter()
            .map(|name| {
                raw.elections
                    .iter()
                    .find(|e| &e.name == name)
                    .cloned()
                    .unwrap_or_else(|| RawElection {
                        name: name.clone(),
                        ..RawElection::default()
                    })
            })
            .collect();
    }
    if let Some(listen) = &args.listen {
        raw.http.listen = Some(ListenAddr(listen.clone()));
    }
    let lease = &mut raw.lease;
    if let Some(d) = args.lease_duration {
        lease.duration = Some(DurationValue(d));
    }
    if let Some(d) = args.renew_interval {
        lease.renew_interval = Some(DurationValue(d));
    }
    if let Some(d) = args.retry_interval {
        lease.retry_interval = Some(DurationValue(d));
    }
    if let Some(d) = args.kill_grace {
        raw.child.kill_grace = Some(DurationValue(d));
    }
    if let Some(mode) = args.mode {
        raw.child.mode = Some(mode);
    }
    if let Some(action) = args.on_child_exit {
        raw.child.on_child_exit = Some(action);
    }
    if let Some(format) = args.log_format {
        raw.log.format = Some(format);
    }
    if !args.command.is_empty() {
        raw.child.command = Some(args.command.clone());
    }
}

// ---------------------------------------------------------------------------
// Defaults and validation.

/// Built-in defaults.
pub mod defaults {
    use std::time::Duration;

    /// `store.path`.
    pub const STORE_PATH: &str = "leaderd.db";
    /// `store.table`.
    pub const TABLE: &str = "leaderd";
    /// `lease.duration` (L).
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);
    /// `lease.retry_interval` (P).
    pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
    /// `lease.max_clock_drift` (D).
    pub const MAX_CLOCK_DRIFT: f64 = 0.01;
    /// `lease.safety_margin` (M).
    pub const SAFETY_MARGIN: Duration = Duration::from_millis(200);
    /// `http.listen`.
    pub const LISTEN: &str = "0.0.0.0:9777";
    /// `child.kill_grace` (G).
    pub const KILL_GRACE: Duration = Duration::from_secs(2);
    /// `child.shutdown_grace`.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// `log.level`.
    pub const LOG_LEVEL: &str = "info";
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
    /// The longest identity or election name, in bytes.
    pub const MAX_NAME_BYTES: usize = 255;
    /// The most of a user's value an error message repeats, in characters.
    pub const ECHO_CHARS: usize = 64;
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

/// A user's value, quoted, cut to [`limits::ECHO_CHARS`] characters (with
/// its full length when cut): errors and logs never repeat a huge input.
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(limits::ECHO_CHARS) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &s[..at], s.len()),
        None => format!("{s:?}"),
    }
}

/// Like [`echo`], without quotes (for variable names and keys).
fn echo_plain(s: &str) -> String {
    match s.char_indices().nth(limits::ECHO_CHARS) {
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
        None => s.to_owned(),
    }
}

fn build_store(raw: RawStore) -> Result<StoreConfig, ConfigError> {
    let path = raw
        .path
        .unwrap_or_else(|| PathBuf::from(defaults::STORE_PATH));
    if path.as_os_str().is_empty() {
        return Err(ConfigError::invalid(
            "store.path",
            "store.path must not be empty",
        ));
    }
    let table = raw.table.unwrap_or_else(|| defaults::TABLE.to_string());
    // DynamoDB's own rule: 3-255 of [A-Za-z0-9_.-].
    let table_ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !table_ok {
        return Err(ConfigError::invalid(
            "store.table",
            format!(
                "store.table = {} is not a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ . -)",
                echo(&table)
            ),
        ));
    }
    let region = non_empty(raw.region);
    let endpoint_url = non_empty(raw.endpoint_url);
    if let Some(url) = &endpoint_url {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
            return Err(ConfigError::invalid(
                "store.endpoint_url",
                format!(
                    "store.endpoint_url = {} is not an http:// or https:// URL (like http://127.0.0.1:8000)",
                    echo(url)
                ),
            ));
        }
    }
    Ok(StoreConfig {
        kind: raw.kind.unwrap_or(StoreKind::Sqlite),
        path,
        table,
        region,
        endpoint_url,
        create_table: raw.create_table.unwrap_or(false),
        fail_fast: raw.fail_fast.unwrap_or(false),
    })
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Names appear in URLs (`/leader/{election}`) and in the store's key.
fn check_election_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let bad = name.is_empty()
        || name.len() > limits::MAX_NAME_BYTES
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "/?#%".contains(c));
    if bad {
        return Err(ConfigError::invalid(
            key,
            format!(
                "{key} = {} is not a valid election name (1 to {} bytes, no whitespace, /, ?, # or %)",
                echo(name),
                limits::MAX_NAME_BYTES
            ),
        ));
    }
    Ok(())
}

fn check_unique(names: &[String]) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, name) in names.iter().enumerate() {
        if !seen.insert(name) {
            return Err(ConfigError::invalid(
                format!("elections[{i}].name"),
                format!(
                    "elections[{i}].name = {} is configured more than once",
                    echo(name)
                ),
            ));
        }
    }
    Ok(())
}

/// `value` of the setting `label` (its key, and the flag that set it) lies
/// within `min..=max`; zero is "must be above zero" when `min` is not zero.
fn check_range(
    key: &str,
    label: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    let problem = if value > max {
        format!("is longer than the limit of {}", fmt_duration(max))
    } else if value.is_zero() && !min.is_zero() {
        "must be above zero".to_owned()
    } else if value < min {
        format!("is shorter than the minimum of {}", fmt_duration(min))
    } else {
        return Ok(());
    };
    Err(ConfigError::invalid(
        key,
        format!("{label} = {} {problem}", fmt_duration(value)),
    ))
}

/// A setting's effective value, the key it came from and how messages name it.
struct Setting<T> {
    value: T,
    key: String,
    label: String,
}

/// The election's own override, else the `[lease]` value, else the default.
fn pick<T: Copy>(
    over: Option<T>,
    over_key: String,
    base: Option<T>,
    base_key: &str,
    default: T,
    raw: &RawConfig,
) -> Setting<T> {
    match over {
        Some(value) => Setting {
            value,
            label: over_key.clone(),
            key: over_key,
        },
        None => Setting {
            value: base.unwrap_or(default),
            key: base_key.to_string(),
            label: raw.label(base_key),
        },
    }
}

/// A duration as the configuration writes it (`0s`, `1h 30m`, `250ms`).
pub fn fmt_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_string()
    } else {
        humantime::format_duration(d).to_string()
    }
}

fn election_config(
    i: usize,
    raw: &RawConfig,
    identity: &str,
    kill_grace: Duration,
) -> Result<ElectionConfig, ConfigError> {
    let e = &raw.elections[i];
    let lease = &raw.lease;
    let over = |field: &str| format!("elections[{i}].{field}");
    let d = |v: Option<DurationValue>| v.map(|v| v.0);
    let duration = pick(
        d(e.duration),
        over("duration"),
        d(lease.duration),
        "lease.duration",
        defaults::LEASE_DURATION,
        raw,
    );
    // Default R = L/2 of this election's own L.
    let renew = pick(
        d(e.renew_interval),
        over("renew_interval"),
        d(lease.renew_interval),
        "lease.renew_interval",
        duration.value / 2,
        raw,
    );
    let retry = pick(
        d(e.retry_interval),
        over("retry_interval"),
        d(lease.retry_interval),
        "lease.retry_interval",
        defaults::RETRY_INTERVAL,
        raw,
    );
    let drift = pick(
        e.max_clock_drift.map(|f| f.0),
        over("max_clock_drift"),
        lease.max_clock_drift.map(|f| f.0),
        "lease.max_clock_drift",
        defaults::MAX_CLOCK_DRIFT,
        raw,
    );
    let margin = pick(
        d(e.safety_margin),
        over("safety_margin"),
        d(lease.safety_margin),
        "lease.safety_margin",
        defaults::SAFETY_MARGIN,
        raw,
    );
    let strict = e
        .strict_new_lease
        .or(lease.strict_new_lease)
        .unwrap_or(false);

    let name = &e.name;
    check_range(
        &duration.key,
        &duration.label,
        duration.value,
        Duration::from_nanos(1),
        limits::MAX_LEASE,
    )?;
    for s in [&renew, &retry] {
        check_range(
            &s.key,
            &s.label,
            s.value,
            limits::MIN_INTERVAL,
            limits::MAX_LEASE,
        )?;
    }
    check_range(
        &margin.key,
        &margin.label,
        margin.value,
        Duration::ZERO,
        limits::MAX_LEASE,
    )?;
    if !(0.0..0.5).contains(&drift.value) {
        return Err(ConfigError::invalid(
            &drift.key,
            format!(
                "{} = {} must be at least 0 and below 0.5 (election {name})",
                drift.label, drift.value
            ),
        ));
    }
    if renew.value >= duration.value {
        return Err(ConfigError::invalid(
            &renew.key,
            format!(
                "{} = {} must be shorter than {} = {} (election {name})",
                renew.label,
                fmt_duration(renew.value),
                duration.label,
                fmt_duration(duration.value)
            ),
        ));
    }
    let config = ElectionConfig {
        name: name.clone(),
        identity: identity.to_string(),
        lease_duration: duration.value,
        renew_interval: renew.value,
        retry_interval: retry.value,
        kill_grace,
        max_clock_drift: drift.value,
        safety_margin: margin.value,
        strict_new_lease: strict,
        holder_meta: None,
    };
    config.validate().map_err(|message| {
        ConfigError::invalid(
            &duration.key,
            format!(
                "{} = {} is too short for the other settings: {message}",
                duration.label,
                fmt_duration(duration.value)
            ),
        )
    })?;
    Ok(config)
}

fn check_log_level(level: &str) -> Result<(), ConfigError> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let simple = !level.contains(['=', ',', '[']);
    let ok = if simple {
        LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level.trim()))
    } else {
        tracing_subscriber::EnvFilter::try_new(level).is_ok()
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            "log.level",
            format!(
                "log.level = {} is not a log level (trace, debug, info, warn, error, off) or filter (like info,leaderd=debug)",
                echo(level)
            ),
        ))
    }
}

fn build_identity(raw: &RawConfig) -> Result<String, ConfigError> {
    let Some(id) = &raw.identity else {
        return Ok(default_identity());
    };
    if id.trim().is_empty() || id.chars().any(char::is_control) || id.len() > limits::MAX_NAME_BYTES
    {
        return Err(ConfigError::invalid(
            "identity",
            format!(
                "{} = {} must be printable text of 1 to {} bytes (leave it unset for host name + random suffix)",
                raw.label("identity"),
                echo(id),
                limits::MAX_NAME_BYTES
            ),
        ));
    }
    Ok(id.clone())
}

fn build_child(raw: &RawConfig) -> Result<ChildConfig, ConfigError> {
    let c = &raw.child;
    let kill_grace = c.kill_grace.map_or(defaults::KILL_GRACE, |d| d.0);
    check_range(
        "child.kill_grace",
        &raw.label("child.kill_grace"),
        kill_grace,
        Duration::ZERO,
        limits::MAX_LEASE,
    )?;
    let shutdown_grace = c.shutdown_grace.map_or(defaults::SHUTDOWN_GRACE, |d| d.0);
    check_range(
        "child.shutdown_grace",
        "child.shutdown_grace",
        shutdown_grace,
        Duration::ZERO,
        limits::MAX_WAIT,
    )?;
    let mode = c.mode.unwrap_or(Mode::WhileLeader);
    let on_child_exit = c.on_child_exit.unwrap_or(OnChildExit::Exit);
    let command = c.command.clone().unwrap_or_default();
    let stop_signal = match c.stop_signal {
        None => Signal::SIGTERM,
        Some(SignalName(Some(s))) => s,
        Some(SignalName(None)) => {
            return Err(ConfigError::invalid(
                "child.stop_signal",
                "child.stop_signal = \"\" must name a signal (like SIGTERM)",
            ));
        }
    };
    let signal_on_gain = c.signal_on_gain.and_then(|s| s.0);
    let signal_on_loss = c.signal_on_loss.and_then(|s| s.0);
    if command.first().is_some_and(|program| program.is_empty()) {
        return Err(ConfigError::invalid(
            "child.command",
            "child.command: the program (first item) must not be empty",
        ));
    }
    match mode {
        Mode::Always => {
            if command.is_empty() {
                return Err(ConfigError::invalid(
                    "child.mode",
                    "child.mode = \"always\" needs a child command (child.command or `-- COMMAND`)",
                ));
            }
            if on_child_exit == OnChildExit::Release {
                return Err(ConfigError::invalid(
                    "child.on_child_exit",
                    "child.on_child_exit = \"release\" needs child.mode = \"while-leader\" (with \"always\" the child is not tied to the lease: use \"exit\" or \"restart\")",
                ));
            }
        }
        Mode::WhileLeader => {
            for (key, signal) in [
                ("child.signal_on_gain", signal_on_gain),
                ("child.signal_on_loss", signal_on_loss),
            ] {
                if let Some(signal) = signal {
                    return Err(ConfigError::invalid(
                        key,
                        format!(
                            "{key} = \"{}\" needs child.mode = \"always\" (in \"while-leader\" mode the child is started and stopped instead)",
                            signal.as_str()
                        ),
                    ));
                }
            }
        }
    }
    Ok(ChildConfig {
        command,
        mode,
        on_child_exit,
        stop_signal,
        kill_grace,
        shutdown_grace,
        signal_on_gain,
        signal_on_loss,
    })
}

/// Every election, checked; with the warnings for elections where fewer
/// than two renew retries fit.
fn build_elections(
    raw: &mut RawConfig,
    identity: &str,
    kill_grace: Duration,
) -> Result<(Vec<ElectionConfig>, Vec<String>), ConfigError> {
    if raw.elections.is_empty() {
        raw.elections.push(RawElection {
            name: DEFAULT_ELECTION.to_string(),
            ..RawElection::default()
        });
    }
    let names: Vec<String> = raw.elections.iter().map(|e| e.name.clone()).collect();
    for (i, name) in names.iter().enumerate() {
        check_election_name(&format!("elections[{i}].name"), name)?;
    }
    check_unique(&names)?;
    let mut elections = Vec::with_capacity(names.len());
    let mut warnings = Vec::new();
    for i in 0..names.len() {
        let config = election_config(i, raw, identity, kill_grace)?;
        let retries = config.retries_that_fit();
        if retries < 2 {
            warnings.push(format!(
                "election {}: only {retries} renew retr{} (every retry_interval {}) fit between a missed renew and the stop signal; a short store outage will stop the child (lengthen lease.duration or shorten lease.retry_interval)",
                config.name,
                if retries == 1 { "y" } else { "ies" },
                fmt_duration(config.retry_interval),
            ));
        }
        elections.push(config);
    }
    Ok((elections, warnings))
}

fn build_primary(raw: &RawConfig, names: &[String]) -> Result<String, ConfigError> {
    match non_empty(raw.http.primary.clone()) {
        Some(primary) => {
            if !names.contains(&primary) {
                return Err(ConfigError::invalid(
                    "http.primary",
                    format!(
                        "http.primary = {} is not a configured election (configured: {})",
                        echo(&primary),
                        names.join(", ")
                    ),
                ));
            }
            Ok(primary)
        }
        None if names.len() == 1 => Ok(names[0].clone()),
        None => Err(ConfigError::invalid(
            "http.primary",
            format!(
                "http.primary is required when several elections are configured ({}): it names the election behind GET /leader",
                names.join(", ")
            ),
        )),
    }
}

fn build(mut raw: RawConfig, acquire_timeout: Option<Duration>) -> Result<Config, ConfigError> {
    let identity = build_identity(&raw)?;
    let store = build_store(std::mem::take(&mut raw.store))?;
    let child = build_child(&raw)?;
    let (elections, mut warnings) = build_elections(&mut raw, &identity, child.kill_grace)?;
    let names: Vec<String> = elections.iter().map(|e| e.name.clone()).collect();
    let primary = build_primary(&raw, &names)?;
    if let Some(t) = acquire_timeout {
        check_range(
            "acquire_timeout",
            "--acquire-timeout",
            t,
            Duration::ZERO,
            limits::MAX_WAIT,
        )?;
    }

    let listen_text = raw
        .http
        .listen
        .as_ref()
        .map_or(defaults::LISTEN, |l| l.0.as_str());
    let listen = resolve_listen(listen_text).map_err(|why| {
        ConfigError::invalid(
            "http.listen",
            format!(
                "{} = {} is not an address to listen on: {why}",
                raw.label("http.listen"),
                echo(listen_text)
            ),
        )
    })?;
    let http = HttpConfig {
        listen,
        admin_token: raw.http.admin_token.clone().filter(|t| !t.is_empty()),
    };

    let level = raw
        .log
        .level
        .clone()
        .unwrap_or_else(|| defaults::LOG_LEVEL.to_string());
    check_log_level(&level)?;
    let log = LogConfig {
        format: raw.log.format.unwrap_or(LogFormat::Text),
        level,
    };

    let store_timeout = raw.health.store_timeout.map(|d| d.0);
    if let Some(t) = store_timeout {
        check_range(
            "health.store_timeout",
            "health.store_timeout",
            t,
            Duration::from_nanos(1),
            limits::MAX_WAIT,
        )
        .map_err(|e| match e {
            ConfigError::Invalid { key, message } => ConfigError::Invalid {
                key,
                message: format!("{message} (leave it unset to ignore the store in /healthz)"),
            },
            other => other,
        })?;
    }
    let health = HealthConfig { store_timeout };
    warnings.append(&mut raw.warnings);

    Ok(Config {
        identity,
        store,
        elections,
        primary,
        http,
        child,
        log,
        health,
        acquire_timeout,
        warnings,
    })
}
