//! The raw layer: what figment extracts from the file and the environment,
//! every field optional, and the value types that parse durations, fractions,
//! signal names and listen addresses.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, de};

use super::duration::DurationError;
use super::{LogFormat, Mode, OnChildExit, StoreKind};
use crate::text::echo;

// ---------------------------------------------------------------------------
// Raw layer: what figment extracts. Every field optional so that defaults and
// flags are applied in one place (`build`), and so that "unset" stays
// distinguishable from "set to the default" (renew_interval, overrides).

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) identity: Option<String>,
    pub(super) balance: Option<bool>,
    pub(super) sessions: Option<bool>,
    pub(super) priority: Option<i64>,
    pub(super) preempt: Option<bool>,
    pub(super) preempt_after: Option<DurationValue>,
    pub(super) store: RawStore,
    pub(super) lease: RawLease,
    pub(super) elections: Vec<RawElection>,
    pub(super) http: RawHttp,
    pub(super) child: RawChild,
    pub(super) log: RawLog,
    pub(super) health: RawHealth,
    pub(super) app_check: RawAppCheck,
    pub(super) metrics: RawMetrics,
    /// Keys set by a command-line flag, and the flag: messages name both.
    #[serde(skip)]
    pub(super) flags: BTreeMap<&'static str, &'static str>,
    /// Keys set by the file or the environment, and which: the file's path
    /// or the variable's name (the environment's where both set one). An
    /// array (`elections`, `child.command`) is one key: it comes whole from
    /// one layer.
    #[serde(skip)]
    pub(super) sources: BTreeMap<String, String>,
    /// Valid but questionable input met while loading (unknown variables).
    #[serde(skip)]
    pub(super) warnings: Vec<String>,
}

impl RawConfig {
    /// Where `key`'s value came from, for messages: `from --lease-duration`,
    /// `from LEADERD_LEASE__DURATION`, `from /etc/leaderd.toml`, or
    /// `default`. A key inside an array (`elections[0].duration`) came from
    /// where the array did.
    pub(super) fn origin(&self, key: &str) -> String {
        let whole = key.split('[').next().unwrap_or(key);
        if let Some(flag) = self.flags.get(key) {
            return format!("from {flag}");
        }
        match self.sources.get(key).or_else(|| self.sources.get(whole)) {
            Some(source) => format!("from {source}"),
            None => "default".to_owned(),
        }
    }

    /// `key` with where its value came from, for a message that does not
    /// repeat the value: `http.admin_token (from LEADERD_HTTP__ADMIN_TOKEN)`.
    pub(super) fn label(&self, key: &str) -> String {
        format!("{key} ({})", self.origin(key))
    }

    /// `key = value (from SOURCE)`: a setting's value, as written for a
    /// message, with where it came from.
    pub(super) fn show(&self, key: &str, value: &str) -> String {
        format!("{key} = {value} ({})", self.origin(key))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) kind: Option<StoreKind>,
    pub(super) path: Option<PathBuf>,
    pub(super) table: Option<String>,
    pub(super) region: Option<String>,
    pub(super) endpoint_url: Option<String>,
    pub(super) url: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) create_table: Option<bool>,
    pub(super) fail_fast: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) duration: Option<DurationValue>,
    pub(super) renew_interval: Option<DurationValue>,
    pub(super) retry_interval: Option<DurationValue>,
    pub(super) max_clock_drift: Option<Fraction>,
    pub(super) safety_margin: Option<DurationValue>,
    pub(super) strict_new_lease: Option<bool>,
}

// serde's `flatten` does not combine with `deny_unknown_fields`, hence the
// repeated [lease] keys.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawElection {
    pub(super) name: String,
    #[serde(default)]
    pub(super) duration: Option<DurationValue>,
    #[serde(default)]
    pub(super) renew_interval: Option<DurationValue>,
    #[serde(default)]
    pub(super) retry_interval: Option<DurationValue>,
    #[serde(default)]
    pub(super) max_clock_drift: Option<Fraction>,
    #[serde(default)]
    pub(super) safety_margin: Option<DurationValue>,
    #[serde(default)]
    pub(super) strict_new_lease: Option<bool>,
    #[serde(default)]
    pub(super) priority: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) listen: Option<ListenAddr>,
    pub(super) advertise: Option<String>,
    pub(super) primary: Option<String>,
    pub(super) admin_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawChild {
    pub(super) command: Option<Vec<String>>,
    pub(super) mode: Option<Mode>,
    pub(super) on_child_exit: Option<OnChildExit>,
    pub(super) stop_signal: Option<SignalName>,
    pub(super) kill_grace: Option<DurationValue>,
    pub(super) shutdown_grace: Option<DurationValue>,
    pub(super) signal_on_gain: Option<SignalName>,
    pub(super) signal_on_loss: Option<SignalName>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) format: Option<LogFormat>,
    pub(super) level: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) store_timeout: Option<DurationValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawAppCheck {
    pub(super) http: Option<String>,
    pub(super) tcp: Option<String>,
    pub(super) command: Option<Vec<String>>,
    pub(super) interval: Option<DurationValue>,
    pub(super) timeout: Option<DurationValue>,
    pub(super) failure_threshold: Option<u32>,
    pub(super) success_threshold: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) election_series_limit: Option<u32>,
    pub(super) elections: Option<Vec<String>>,
}

/// A duration string (`10s`, `1m30s`, `200ms`), read as every duration is
/// (see [`super::duration`]). Bare numbers are rejected: a unit is required.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct DurationValue(pub(super) Duration);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration (like 10s, 1m30s)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DurationValue, E> {
                match super::duration::parse(s) {
                    Ok(d) => Ok(DurationValue(d)),
                    Err(DurationError::Syntax(_)) => {
                        Err(E::invalid_value(de::Unexpected::Str(s), &self))
                    }
                    Err(e @ DurationError::Ambiguous(_)) => Err(E::invalid_value(
                        de::Unexpected::Str(s),
                        &format!("a duration: {e}").as_str(),
                    )),
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// A fraction such as `0.01` (1%).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fraction(pub(super) f64);

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
pub(super) struct SignalName(pub(super) Option<Signal>);

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
pub(super) struct ListenAddr(pub(super) String);

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
pub(super) fn resolve_listen(s: &str) -> Result<SocketAddr, String> {
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
