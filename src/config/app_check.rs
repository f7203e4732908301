//! The app check's settings: the one probe it runs (HTTP, TCP or a
//! command) and its timing, checked into an [`AppCheckConfig`].

use super::build::check_range;
use super::raw::{RawConfig, split_host_port};
use super::{ConfigError, limits};
use crate::app_check::{self, AppCheckConfig, Probe};
use crate::text::echo;
/// The one probe the app check runs; `None` when none is set (and then no
/// other app check setting may be).
fn app_check_probe(raw: &RawConfig) -> Result<Option<Probe>, ConfigError> {
    let a = &raw.app_check;
    let mut probes = Vec::new();
    if let Some(url) = &a.http {
        probes.push((
            "app_check.http",
            http_probe(url, &raw.origin("app_check.http"))?,
        ));
    }
    if let Some(addr) = &a.tcp {
        probes.push(("app_check.tcp", tcp_probe(addr)?));
    }
    if let Some(argv) = &a.command {
        if argv.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(ConfigError::invalid(
                "app_check.command",
                "app_check.command must name a program, like [\"/app/check\"]",
            ));
        }
        probes.push(("app_check.command", Probe::Command(argv.clone())));
    }
    match probes.len() {
        0 => {
            let timing = [
                ("app_check.interval", a.interval.is_some()),
                ("app_check.timeout", a.timeout.is_some()),
                ("app_check.failure_threshold", a.failure_threshold.is_some()),
                ("app_check.success_threshold", a.success_threshold.is_some()),
            ];
            if let Some((key, _)) = timing.iter().find(|(_, set)| *set) {
                return Err(ConfigError::invalid(
                    *key,
                    format!(
                        "{key} is set but no probe is: set app_check.http, app_check.tcp or app_check.command"
                    ),
                ));
            }
            Ok(None)
        }
        1 => Ok(Some(probes.pop().expect("one probe").1)),
        _ => {
            let keys: Vec<&str> = probes.iter().map(|(k, _)| *k).collect();
            Err(ConfigError::invalid(
                keys[1],
                format!("set only one app check probe; found {}", keys.join(" and ")),
            ))
        }
    }
}

/// `[app_check]`: one probe (http, tcp or command) and its timing, or none.
pub(super) fn build_app_check(raw: &RawConfig) -> Result<Option<AppCheckConfig>, ConfigError> {
    let Some(probe) = app_check_probe(raw)? else {
        return Ok(None);
    };
    let a = &raw.app_check;
    let interval = a.interval.map_or(app_check::defaults::INTERVAL, |d| d.0);
    check_range(
        "app_check.interval",
        &raw.origin("app_check.interval"),
        interval,
        limits::MIN_INTERVAL,
        limits::MAX_LEASE,
    )?;
    let timeout = a.timeout.map_or(app_check::defaults::TIMEOUT, |d| d.0);
    check_range(
        "app_check.timeout",
        &raw.origin("app_check.timeout"),
        timeout,
        limits::MIN_INTERVAL,
        limits::MAX_LEASE,
    )?;
    let threshold = |key: &str, value: Option<u32>, default: u32| {
        let v = value.unwrap_or(default);
        if (1..=limits::MAX_THRESHOLD).contains(&v) {
            Ok(v)
        } else {
            Err(ConfigError::invalid(
                key,
                format!(
                    "{key} = {v} must be between 1 and {}",
                    limits::MAX_THRESHOLD
                ),
            ))
        }
    };
    Ok(Some(AppCheckConfig {
        probe,
        interval,
        timeout,
        failure_threshold: threshold(
            "app_check.failure_threshold",
            a.failure_threshold,
            app_check::defaults::FAILURE_THRESHOLD,
        )?,
        success_threshold: threshold(
            "app_check.success_threshold",
            a.success_threshold,
            app_check::defaults::SUCCESS_THRESHOLD,
        )?,
    }))
}

/// An `http://HOST[:PORT]/PATH` URL to probe, set at `origin`.
fn http_probe(url: &str, origin: &str) -> Result<Probe, ConfigError> {
    let bad = |why: &str| {
        ConfigError::invalid(
            "app_check.http",
            format!("app_check.http = {} ({origin}) {why}", echo(url)),
        )
    };
    let uri: hyper::Uri = url
        .trim()
        .parse()
        .map_err(|_| bad("is not a URL (like http://127.0.0.1:8080/healthz)"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "is https: the check speaks plain http, to the app next to leaderd (like http://127.0.0.1:8080/healthz)",
            ));
        }
        _ => {
            return Err(bad(
                "is not an http:// URL (like http://127.0.0.1:8080/healthz)",
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("has no host (like http://127.0.0.1:8080/healthz)"));
    }
    Ok(Probe::Http(uri))
}

/// A `HOST:PORT` to connect to.
fn tcp_probe(addr: &str) -> Result<Probe, ConfigError> {
    match split_host_port(addr) {
        Some((host, _)) if !host.is_empty() => Ok(Probe::Tcp(addr.trim().to_owned())),
        _ => Err(ConfigError::invalid(
            "app_check.tcp",
            format!(
                "app_check.tcp = {} is not HOST:PORT (like 127.0.0.1:5432)",
                echo(addr)
            ),
        )),
    }
}
