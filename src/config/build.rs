//! Defaults and validation: the raw layers (with the flags applied) become
//! one validated [`Config`].

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::app_check::build_app_check;
use super::metrics::build_metrics;
use super::postgres;
use super::raw::{
    DurationValue, RawConfig, RawElection, RawStore, SignalName, resolve_listen, split_host_port,
};
use super::{
    ChildConfig, Config, ConfigError, DEFAULT_ELECTION, HealthConfig, HttpConfig, LogConfig,
    LogFormat, Mode, OnChildExit, StoreConfig, StoreKind, default_identity, defaults,
    is_valid_identity, limits, log_filter,
};
use crate::election::{ElectionConfig, TimingError};
use crate::text;
use crate::text::echo;

pub(super) fn build_store(raw: RawStore) -> Result<StoreConfig, ConfigError> {
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
    let postgres = postgres::build(raw.kind, raw.url, raw.password_file, raw.ca_file, &table)?;
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
        postgres,
        create_table: raw.create_table.unwrap_or(false),
        fail_fast: raw.fail_fast.unwrap_or(false),
    })
}

pub(super) fn non_empty(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Names appear in URLs (`/leader/{election}`) and in the store's key.
pub(super) fn check_election_name(key: &str, name: &str) -> Result<(), ConfigError> {
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

pub(super) fn check_unique(names: &[String]) -> Result<(), ConfigError> {
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

/// `value` of the setting `key`, which came from `origin` (`from
/// LEADERD_LEASE__DURATION`, `default`: see [`RawConfig::origin`]), lies
/// within `min..=max`; zero is "must be above zero" when `min` is not zero.
pub(super) fn check_range(
    key: &str,
    origin: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    let problem = if value > max {
        format!("is longer than the limit of {}", text::duration(max))
    } else if value.is_zero() && !min.is_zero() {
        "must be above zero".to_owned()
    } else if value < min {
        format!("is shorter than the minimum of {}", text::duration(min))
    } else {
        return Ok(());
    };
    Err(ConfigError::invalid(
        key,
        format!("{key} = {} ({origin}) {problem}", text::duration(value)),
    ))
}

/// A setting's effective value, the key it came from and where its value
/// was set (see [`RawConfig::origin`]).
struct Setting<T> {
    value: T,
    key: String,
    origin: String,
}

impl<T> Setting<T> {
    /// `key = value (origin)`, with the value as `shown`.
    fn show(&self, shown: impl std::fmt::Display) -> String {
        format!("{} = {shown} ({})", self.key, self.origin)
    }
}

impl Setting<Duration> {
    /// Checked against `min..=max` (see [`check_range`]).
    fn check_range(&self, min: Duration, max: Duration) -> Result<(), ConfigError> {
        check_range(&self.key, &self.origin, self.value, min, max)
    }
}

/// A setting's built-in default, and how its origin reads.
struct Builtin<'a, T> {
    value: T,
    origin: &'a str,
}

impl<T> Builtin<'_, T> {
    /// A default that is a constant: its origin reads `default`.
    fn constant(value: T) -> Self {
        Builtin {
            value,
            origin: "default",
        }
    }
}

/// The election's own override, else the `[lease]` value, else the default.
fn pick<T: Copy>(
    over: Option<T>,
    over_key: String,
    base: Option<T>,
    base_key: &str,
    default: Builtin<'_, T>,
    raw: &RawConfig,
) -> Setting<T> {
    match (over, base) {
        (Some(value), _) => Setting {
            value,
            origin: raw.origin(&over_key),
            key: over_key,
        },
        (None, Some(value)) => Setting {
            value,
            key: base_key.to_string(),
            origin: raw.origin(base_key),
        },
        (None, None) => Setting {
            value: default.value,
            key: base_key.to_string(),
            origin: default.origin.to_owned(),
        },
    }
}

/// One election's timing settings, each with where it was set.
struct Timing {
    duration: Setting<Duration>,
    renew: Setting<Duration>,
    retry: Setting<Duration>,
    drift: Setting<f64>,
    margin: Setting<Duration>,
}

/// Election `i`'s timing: its own override, else the `[lease]` section,
/// else the default (R: half of this election's own L).
fn pick_timing(i: usize, raw: &RawConfig) -> Timing {
    let e = &raw.elections[i];
    let lease = &raw.lease;
    let over = |field: &str| format!("elections[{i}].{field}");
    let d = |v: Option<DurationValue>| v.map(|v| v.0);
    let duration = pick(
        d(e.duration),
        over("duration"),
        d(lease.duration),
        "lease.duration",
        Builtin::constant(defaults::LEASE_DURATION),
        raw,
    );
    let renew = pick(
        d(e.renew_interval),
        over("renew_interval"),
        d(lease.renew_interval),
        "lease.renew_interval",
        Builtin {
            value: defaults::renew_interval(duration.value),
            origin: &format!("default: half of {}", duration.key),
        },
        raw,
    );
    let retry = pick(
        d(e.retry_interval),
        over("retry_interval"),
        d(lease.retry_interval),
        "lease.retry_interval",
        Builtin::constant(defaults::RETRY_INTERVAL),
        raw,
    );
    let drift = pick(
        e.max_clock_drift.map(|f| f.0),
        over("max_clock_drift"),
        lease.max_clock_drift.map(|f| f.0),
        "lease.max_clock_drift",
        Builtin::constant(defaults::MAX_CLOCK_DRIFT),
        raw,
    );
    let margin = pick(
        d(e.safety_margin),
        over("safety_margin"),
        d(lease.safety_margin),
        "lease.safety_margin",
        Builtin::constant(defaults::SAFETY_MARGIN),
        raw,
    );
    Timing {
        duration,
        renew,
        retry,
        drift,
        margin,
    }
}

/// Every duration within its bounds, so that no arithmetic on them can
/// overflow.
fn check_timing_ranges(t: &Timing) -> Result<(), ConfigError> {
    t.duration
        .check_range(Duration::from_nanos(1), limits::MAX_LEASE)?;
    for s in [&t.renew, &t.retry] {
        s.check_range(limits::MIN_INTERVAL, limits::MAX_LEASE)?;
    }
    t.margin.check_range(Duration::ZERO, limits::MAX_LEASE)
}

/// A broken timing rule (the election engine owns them), named by the key
/// that breaks it; every value in it says where it was set. `grace` is G.
fn timing_error(e: TimingError, t: &Timing, grace: &Setting<Duration>, name: &str) -> ConfigError {
    let d = text::duration;
    let lease = t.duration.show(d(t.duration.value));
    match e {
        TimingError::Drift(value) => ConfigError::invalid(
            &t.drift.key,
            format!(
                "{} must be at least 0 and below 0.5 (election {name})",
                t.drift.show(value)
            ),
        ),
        TimingError::RenewNotShorter { renew, .. } => ConfigError::invalid(
            &t.renew.key,
            format!(
                "{} must be shorter than {lease} (election {name})",
                t.renew.show(d(renew)),
            ),
        ),
        TimingError::Zero => ConfigError::invalid(
            &t.duration.key,
            format!("{lease} is too short for the other settings: {e} (election {name})"),
        ),
        TimingError::Invariant {
            renew,
            kill_grace,
            safety_margin,
            drift,
            lease: l,
        } => ConfigError::invalid(
            &t.duration.key,
            format!(
                "{lease} is too short for the other settings of election {name}: the rule R + G + M + L·D < L is broken, as R + G + M + L·D = {} + {} + {} + {} = {}, not below {}, with R {}, G {}, M {}, D {}",
                d(renew),
                d(kill_grace),
                d(safety_margin),
                d(drift),
                d(renew + kill_grace + safety_margin + drift),
                d(l),
                t.renew.show(d(renew)),
                grace.show(d(kill_grace)),
                t.margin.show(d(safety_margin)),
                t.drift.show(t.drift.value),
            ),
        ),
    }
}

/// Election `i` of the file (after the flags), checked.
fn election_config(
    i: usize,
    raw: &RawConfig,
    identity: &str,
    kill_grace: Duration,
) -> Result<ElectionConfig, ConfigError> {
    let e = &raw.elections[i];
    let timing = pick_timing(i, raw);
    check_timing_ranges(&timing)?;
    let grace = Setting {
        value: kill_grace,
        key: "child.kill_grace".to_owned(),
        origin: raw.origin("child.kill_grace"),
    };
    let config = ElectionConfig {
        name: e.name.clone(),
        identity: identity.to_string(),
        lease_duration: timing.duration.value,
        renew_interval: timing.renew.value,
        retry_interval: timing.retry.value,
        kill_grace,
        max_clock_drift: timing.drift.value,
        safety_margin: timing.margin.value,
        strict_new_lease: e
            .strict_new_lease
            .or(raw.lease.strict_new_lease)
            .unwrap_or(false),
        holder_meta: None,
    };
    config
        .validate()
        .map_err(|err| timing_error(err, &timing, &grace, &e.name))?;
    Ok(config)
}

fn check_log_level(level: &str) -> Result<(), ConfigError> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let simple = !level.contains(['=', ',', '[']);
    let ok = if simple {
        LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level.trim()))
    } else {
        log_filter(level).is_some()
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            "log.level",
            format!(
                "log.level = {} is not a log level (trace, debug, info, warn, error, off) or filter (TARGET=LEVEL directives, like info,leaderd=debug)",
                echo(level)
            ),
        ))
    }
}

/// `http.listen`, resolved.
pub(super) fn build_listen(raw: &RawConfig) -> Result<SocketAddr, ConfigError> {
    let listen_text = raw
        .http
        .listen
        .as_ref()
        .map_or(defaults::LISTEN, |l| l.0.as_str());
    resolve_listen(listen_text).map_err(|why| {
        ConfigError::invalid(
            "http.listen",
            format!(
                "{} is not an address to listen on: {why}",
                raw.show("http.listen", &echo(listen_text))
            ),
        )
    })
}

/// `http.admin_token`: empty or unset = resign disabled. Otherwise printable
/// ASCII with no space at either end: the token travels in an
/// `Authorization: Bearer` header, which carries only ASCII and whose token
/// is read without the spaces around it, so any other token could never be
/// presented and resign would refuse every caller (401 or 403). The value is
/// never echoed: it is a secret.
pub(super) fn build_admin_token(raw: &RawConfig) -> Result<Option<String>, ConfigError> {
    let Some(token) = raw.http.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let why = if !token.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        "has characters other than printable ASCII"
    } else if token.starts_with(' ') || token.ends_with(' ') {
        "starts or ends with a space"
    } else {
        return Ok(Some(token.to_owned()));
    };
    Err(ConfigError::invalid(
        "http.admin_token",
        format!(
            "{} {why}: an `Authorization: Bearer` header cannot carry it, so resign would refuse every caller (use printable ASCII without spaces at either end; the value is not shown)",
            raw.label("http.admin_token")
        ),
    ))
}

pub(super) fn build_identity(raw: &RawConfig) -> Result<String, ConfigError> {
    let Some(id) = &raw.identity else {
        return Ok(default_identity());
    };
    if !is_valid_identity(id) {
        return Err(ConfigError::invalid(
            "identity",
            format!(
                "{} must be printable text of 1 to {} bytes (leave it unset for host name + random suffix)",
                raw.show("identity", &echo(id)),
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
        &raw.origin("child.kill_grace"),
        kill_grace,
        Duration::ZERO,
        limits::MAX_LEASE,
    )?;
    let shutdown_grace = c.shutdown_grace.map_or(defaults::SHUTDOWN_GRACE, |d| d.0);
    check_range(
        "child.shutdown_grace",
        &raw.origin("child.shutdown_grace"),
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
    let child = ChildConfig {
        command,
        mode,
        on_child_exit,
        stop_signal,
        kill_grace,
        shutdown_grace,
        signal_on_gain,
        signal_on_loss,
    };
    check_child_mode(raw, &child)?;
    Ok(child)
}

/// The settings that only fit one `child.mode`: `always` needs a command
/// and cannot `release`; the transition signals need `always`.
fn check_child_mode(raw: &RawConfig, child: &ChildConfig) -> Result<(), ConfigError> {
    let ChildConfig {
        command,
        mode,
        on_child_exit,
        signal_on_gain,
        signal_on_loss,
        ..
    } = child;
    // The settings as messages name them: with where they were set.
    let mode_is = |value: &str| raw.show("child.mode", value);
    match mode {
        Mode::Always => {
            if command.is_empty() {
                return Err(ConfigError::invalid(
                    "child.mode",
                    format!(
                        "{} needs a child command (child.command or `-- COMMAND`)",
                        mode_is("\"always\"")
                    ),
                ));
            }
            if *on_child_exit == OnChildExit::Release {
                return Err(ConfigError::invalid(
                    "child.on_child_exit",
                    format!(
                        "{} does not go with {}: with \"always\" the child is not tied to the lease (use \"exit\" or \"restart\", or child.mode = \"while-leader\")",
                        raw.show("child.on_child_exit", "\"release\""),
                        mode_is("\"always\"")
                    ),
                ));
            }
        }
        Mode::WhileLeader => {
            for (key, signal) in [
                ("child.signal_on_gain", *signal_on_gain),
                ("child.signal_on_loss", *signal_on_loss),
            ] {
                if let Some(signal) = signal {
                    return Err(ConfigError::invalid(
                        key,
                        format!(
                            "{} does not go with {}: it needs child.mode = \"always\" (in \"while-leader\" mode the child is started and stopped instead)",
                            raw.show(key, &format!("\"{}\"", signal.as_str())),
                            mode_is("\"while-leader\"")
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every election, checked; with the warnings for elections where fewer
/// than two renew retries fit.
fn build_elections(
    raw: &mut RawConfig,
    identity: &str,
    kill_grace: Duration,
) -> Result<(Vec<Arc<ElectionConfig>>, Vec<String>), ConfigError> {
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
                text::duration(config.retry_interval),
            ));
        }
        elections.push(Arc::new(config));
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
                        "{} is not a configured election (configured: {})",
                        raw.show("http.primary", &echo(&primary)),
                        names.join(", ")
                    ),
                ));
            }
            Ok(primary)
        }
        // Not set: the first election listed (names is never empty).
        None => Ok(names.first().cloned().unwrap_or_default()),
    }
}

/// The `[health]` section: `store_timeout`, if set, within its bounds.
fn build_health(raw: &RawConfig) -> Result<HealthConfig, ConfigError> {
    let store_timeout = raw.health.store_timeout.map(|d| d.0);
    if let Some(t) = store_timeout {
        check_range(
            "health.store_timeout",
            &raw.origin("health.store_timeout"),
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
    Ok(HealthConfig { store_timeout })
}

pub(super) fn build(
    mut raw: RawConfig,
    acquire_timeout: Option<Duration>,
) -> Result<Config, ConfigError> {
    let identity = build_identity(&raw)?;
    let mut store = build_store(std::mem::take(&mut raw.store))?;
    let child = build_child(&raw)?;
    let (elections, mut warnings) = build_elections(&mut raw, &identity, child.kill_grace)?;
    let names: Vec<String> = elections.iter().map(|e| e.name.clone()).collect();
    let primary = build_primary(&raw, &names)?;
    if let Some(t) = acquire_timeout {
        check_range(
            "acquire_timeout",
            "from --acquire-timeout",
            t,
            Duration::ZERO,
            limits::MAX_WAIT,
        )?;
    }
    let listen = build_listen(&raw)?;
    let advertise = match non_empty(raw.http.advertise.clone()) {
        Some(a) => Some(check_advertise(&a, &raw.origin("http.advertise"))?),
        None => None,
    };
    let http = HttpConfig {
        listen,
        admin_token: build_admin_token(&raw)?,
        advertise,
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

    let health = build_health(&raw)?;
    let app_check = build_app_check(&raw)?;
    let metrics = build_metrics(&raw, &names)?;
    warnings.append(&mut raw.warnings);

    let sessions = check_sessions(&raw, &elections, &mut warnings)?;
    postgres::bound_statements(&mut store, &elections);
    Ok(Config {
        identity,
        store,
        elections,
        primary,
        http,
        child,
        log,
        health,
        app_check,
        metrics,
        acquire_timeout,
        balance: raw.balance.unwrap_or(false),
        priority: super::priority::build_priority(&raw)?,
        sessions,
        warnings,
    })
}

/// With `sessions`, one session carries every election, so they must share
/// one lease timing (L, R, P, D, M): the session is renewed on it. Left
/// unset, sessions are on when the elections share one timing, and off
/// (with a warning saying why) when they do not; set to `true`, differing
/// timings are an error, naming where it was set.
fn check_sessions(
    raw: &RawConfig,
    elections: &[Arc<ElectionConfig>],
    warnings: &mut Vec<String>,
) -> Result<bool, ConfigError> {
    let sessions = raw.sessions;
    let Some(first) = elections.first().filter(|_| sessions != Some(false)) else {
        return Ok(false);
    };
    let timing = |e: &ElectionConfig| {
        (
            e.lease_duration,
            e.renew_interval,
            e.retry_interval,
            e.max_clock_drift.to_bits(),
            e.safety_margin,
        )
    };
    let Some(other) = elections.iter().find(|e| timing(e) != timing(first)) else {
        return Ok(true);
    };
    let differ = format!(
        "`{}` and `{}` differ in lease timing (duration, renew, retry, drift or margin)",
        first.name, other.name
    );
    if sessions == Some(true) {
        return Err(ConfigError::invalid(
            "sessions",
            format!(
                "{} needs one lease timing for every election, but {differ}: use the same [lease] for all",
                raw.show("sessions", "true")
            ),
        ));
    }
    warnings.push(format!(
        "sessions are off: {differ}, and one session renews every election on one timing; every election is its own lease (set sessions = false to say so, or give all the same [lease])"
    ));
    Ok(false)
}

/// `http.advertise`: `HOST:PORT` with a port above 0 and a host that
/// resolves to addresses other instances can connect to: not the
/// unspecified address (`0.0.0.0`, `::`), which is only good for listening.
/// `origin`: where it was set.
fn check_advertise(addr: &str, origin: &str) -> Result<String, ConfigError> {
    use std::net::ToSocketAddrs;
    let bad = |why: String| {
        ConfigError::invalid(
            "http.advertise",
            format!("http.advertise = {} ({origin}) {why}", echo(addr)),
        )
    };
    match split_host_port(addr) {
        Some((_, 0)) => Err(bad(
            "has port 0: other instances cannot connect to that".into()
        )),
        Some((host, port)) => {
            // An IPv6 address written without brackets (`$(POD_IP):9777` in
            // an IPv6 cluster) gets them.
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                addr.trim().to_owned()
            };
            match addr
                .as_str()
                .to_socket_addrs()
                .map(|found| found.collect::<Vec<_>>())
            {
                Ok(found) if found.is_empty() => Err(bad("resolves to no address".into())),
                Ok(found) if found.iter().any(|a| a.ip().to_canonical().is_unspecified()) => {
                    Err(bad(
                        "is an unspecified address (0.0.0.0 or ::), good for listening only: other instances cannot connect to it (name this host's own address, like 10.0.3.7:9777)".into(),
                    ))
                }
                Ok(_) => Ok(addr),
                Err(e) => Err(bad(format!("does not resolve: {e}"))),
            }
        }
        None => Err(bad(
            "is not HOST:PORT (like 10.0.3.7:9777 or leaderd-0.leaderd:9777)".into(),
        )),
    }
}
