//! The configuration's items: loaded as `leaderd run` loads it (same file,
//! environment and flags, same validation), then every setting `run`
//! derives from it: the timing of each election with the values behind the
//! rule R + G + M + L·D < L, sessions and why, balance, the elections, the
//! admin token, the job. An invalid configuration is one failed item named
//! by its key, and the store is still checked, for the features a
//! configuration has by default.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{Config, ConfigError, RunArgs, StoreConfig, ToolConfig, default_identity};
use crate::election::{ElectionConfig, takeover_wait};
use crate::text::duration;

use super::report::{Item, Report, fail, ok, warn};

/// The features of the configuration that decide which store calls `run`
/// makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `sessions`: the daemon reads the records it holds in batches.
    pub sessions: bool,
    /// `balance`: without sessions, the member records are scanned.
    pub balance: bool,
}

/// What the rest of the check needs from the configuration.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The store, unless its settings are invalid.
    pub store: Option<StoreConfig>,
    /// The identity the scratch record is named after.
    pub identity: String,
    /// Which store calls to try.
    pub features: Features,
    /// `http.listen`, when the configuration is valid.
    pub listen: Option<SocketAddr>,
}

/// Load the configuration as `run` does and report on it.
pub fn check(args: &RunArgs, report: &mut Report) -> Plan {
    match Config::load(args) {
        Ok(cfg) => {
            report_config(args, &cfg, report);
            Plan {
                store: Some(cfg.store.clone()),
                identity: cfg.identity.clone(),
                features: Features {
                    sessions: cfg.sessions,
                    balance: cfg.balance,
                },
                listen: Some(cfg.http.listen),
            }
        }
        Err(e) => {
            report.add(invalid(&e));
            // The store's own settings may still be fine: check it for
            // what `run` does by default.
            let store = match ToolConfig::load(&args.store) {
                Ok(tool) => Some(tool.store),
                Err(other) if other == e => None,
                Err(other) => {
                    report
                        .add(fail("config", other.to_string()).fix("correct the setting it names"));
                    None
                }
            };
            let features = Features {
                sessions: !args.no_sessions,
                balance: args.balance,
            };
            if store.is_some() {
                report.add(
                    warn(
                        "features",
                        format!(
                            "the store is checked for sessions {} and balance {}, as the flags say or by default, since the configuration is invalid",
                            on_off(features.sessions),
                            on_off(features.balance)
                        ),
                    )
                    .fix("check again once the configuration is valid"),
                );
            }
            Plan {
                store,
                identity: args.identity.clone().unwrap_or_else(default_identity),
                features,
                listen: None,
            }
        }
    }
}

/// The item of an invalid configuration: `timing` when a lease timing
/// setting is at fault, else `config` and the key.
fn invalid(e: &ConfigError) -> Item {
    let key = e.key().unwrap_or_default();
    let field = key.rsplit('.').next().unwrap_or_default();
    let timing = key == "child.kill_grace"
        || ((key.starts_with("lease.") || key.starts_with("elections["))
            && TIMING_FIELDS.contains(&field));
    let message = e.to_string();
    let fix = if message.contains("R + G + M + L·D") {
        "lengthen the lease (L), or shorten renew_interval (R), kill_grace (G) or safety_margin (M), until R + G + M + L·D < L: `leaderd run` refuses to start without that margin (exit 64)"
    } else {
        "correct the setting it names (in the file, a LEADERD_* variable or a flag): `leaderd run` refuses to start with it (exit 64)"
    };
    let name = match (timing, key) {
        (true, key) => format!("timing {key}"),
        (false, "") => "config".to_owned(),
        (false, key) => format!("config {key}"),
    };
    fail(name, message).fix(fix)
}

/// The per-election timing settings (`lease.*`, `elections[i].*`).
const TIMING_FIELDS: [&str; 5] = [
    "duration",
    "renew_interval",
    "retry_interval",
    "max_clock_drift",
    "safety_margin",
];

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn report_config(args: &RunArgs, cfg: &Config, report: &mut Report) {
    let source = match &args.store.config {
        Some(path) => format!(
            "file {}, the LEADERD_* environment and the flags",
            path.display()
        ),
        None => "no file: the defaults, the LEADERD_* environment and the flags".to_owned(),
    };
    report.add(ok("config", format!("valid ({source})")));
    for w in &cfg.warnings {
        report.add(warn("config", w.clone()));
    }
    report.add(ok(
        "identity",
        format!("{} (the holder it writes)", cfg.identity),
    ));
    let names: Vec<&str> = cfg.elections.iter().map(|e| e.name.as_str()).collect();
    report.add(
        ok(
            "elections",
            format!(
                "{} ({}; GET /leader answers for {})",
                names.join(", "),
                match names.len() {
                    1 => "1 election".to_owned(),
                    n => format!("{n} elections"),
                },
                cfg.primary
            ),
        )
        .with("count", names.len())
        .with("primary", cfg.primary.clone()),
    );
    for (elections, e) in timing_groups(&cfg.elections) {
        let name = if elections.len() == cfg.elections.len() {
            "timing".to_owned()
        } else {
            format!("timing of {}", elections.join(", "))
        };
        report.add(timing(name, e));
    }
    report.add(sessions(cfg));
    report.add(ok(
        "balance",
        match (cfg.balance, cfg.sessions) {
            (false, _) => "off: each instance campaigns for every election".to_owned(),
            (true, true) => "on: the live instances are known by their session records".to_owned(),
            (true, false) => {
                "on: the live instances are known by their member records, read with a scan every renew interval".to_owned()
            }
        },
    ));
    report.add(ok(
        "admin token",
        match cfg.http.admin_token {
            Some(_) => "set (not shown): POST /leader/{election}/resign is on",
            None => "not set: POST /leader/{election}/resign is off",
        },
    ));
    let child = &cfg.child;
    report.add(ok(
        "job",
        if child.command.is_empty() {
            "none: leaderd runs no command (the sidecar pattern)".to_owned()
        } else {
            format!(
                "{} (mode {:?}, on exit {:?}, kill grace {})",
                crate::text::echo(&child.command.join(" ")),
                child.mode,
                child.on_child_exit,
                duration(child.kill_grace)
            )
        },
    ));
}

/// The elections grouped by their lease timing, in the order listed.
fn timing_groups(elections: &[Arc<ElectionConfig>]) -> Vec<(Vec<&str>, &ElectionConfig)> {
    let key = |e: &ElectionConfig| {
        (
            e.lease_duration,
            e.renew_interval,
            e.retry_interval,
            e.kill_grace,
            e.max_clock_drift.to_bits(),
            e.safety_margin,
        )
    };
    let mut groups: Vec<(Vec<&str>, &ElectionConfig)> = Vec::new();
    for e in elections {
        match groups.iter_mut().find(|(_, first)| key(first) == key(e)) {
            Some((names, _)) => names.push(&e.name),
            None => groups.push((vec![&e.name], e)),
        }
    }
    groups
}

/// Every timing value of `e` and what follows from them, as `run`
/// validated them: R + G + M + L·D < L holds (or the configuration would
/// have failed to load).
pub fn timing(name: String, e: &ElectionConfig) -> Item {
    let drift = e.lease_duration.mul_f64(e.max_clock_drift);
    let sum = e.renew_interval + e.kill_grace + e.safety_margin + drift;
    let spare = e.lease_duration.saturating_sub(sum);
    let validity = e.validity();
    let takeover = takeover_wait(
        u64::try_from(e.lease_duration.as_millis()).unwrap_or(u64::MAX),
        e.max_clock_drift,
    );
    let retries = e.retries_that_fit();
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let detail = format!(
        "L {}, R {}, P {}, G {}, M {}, D {}; R + G + M + L·D = {} < L by {}; a write keeps the leader valid L·(1−D) − M = {}, the job's stop signal comes G before that; a follower takes over after L·(1+D) = {} unchanged; {retries} renew retr{} fit before the stop signal",
        duration(e.lease_duration),
        duration(e.renew_interval),
        duration(e.retry_interval),
        duration(e.kill_grace),
        duration(e.safety_margin),
        e.max_clock_drift,
        duration(sum),
        duration(spare),
        duration(validity),
        duration(takeover),
        if retries == 1 { "y" } else { "ies" },
    );
    ok(name, detail)
        .with("lease_ms", ms(e.lease_duration))
        .with("renew_interval_ms", ms(e.renew_interval))
        .with("retry_interval_ms", ms(e.retry_interval))
        .with("kill_grace_ms", ms(e.kill_grace))
        .with("safety_margin_ms", ms(e.safety_margin))
        .with("max_clock_drift", e.max_clock_drift)
        .with("margin_sum_ms", ms(sum))
        .with("spare_ms", ms(spare))
        .with("validity_ms", ms(validity))
        .with("takeover_wait_ms", ms(takeover))
        .with("retries", retries)
}

/// Sessions on or off, and why: on when asked or (left unset) when every
/// election shares one lease timing; off when asked, or when the timings
/// differ (the configuration's warning then says which).
fn sessions(cfg: &Config) -> Item {
    let differ = cfg
        .warnings
        .iter()
        .any(|w| w.starts_with("sessions are off"));
    let detail = match (cfg.sessions, differ) {
        (true, _) => {
            "on: every election shares one lease timing, so one session record per process is renewed for all of them"
        }
        (false, true) => "off: the elections' lease timings differ, so each is its own lease",
        (false, false) => {
            "off (sessions = false or --no-sessions): each election is its own lease, renewed on its own"
        }
    };
    ok("sessions", detail).with("on", cfg.sessions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timing_shows_every_value_and_what_follows() {
        let e = ElectionConfig::with_defaults("a", "me");
        let item = timing("timing".into(), &e);
        // L 10s, R 5s, G 2s, M 200ms, D 0.01: 7.3s, 2.7s to spare.
        assert!(
            item.detail
                .starts_with("L 10s, R 5s, P 1s, G 2s, M 200ms, D 0.01; R + G + M + L·D = 7s 300ms < L by 2s 700ms;"),
            "{}",
            item.detail
        );
        assert!(
            item.detail.contains("L·(1−D) − M = 9s 700ms"),
            "{}",
            item.detail
        );
        assert!(
            item.detail.contains("L·(1+D) = 10s 100ms"),
            "{}",
            item.detail
        );
        assert_eq!(item.values["spare_ms"], 2_700);
        assert_eq!(item.values["takeover_wait_ms"], 10_100);
        assert_eq!(item.values["retries"], e.retries_that_fit());
    }

    #[test]
    fn elections_of_one_timing_share_a_line() {
        let a = ElectionConfig::with_defaults("a", "me");
        let b = ElectionConfig::with_defaults("b", "me");
        let c = ElectionConfig {
            lease_duration: Duration::from_secs(20),
            ..ElectionConfig::with_defaults("c", "me")
        };
        let all = [a, c, b].map(Arc::new);
        let groups = timing_groups(&all);
        let names: Vec<Vec<&str>> = groups.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names, [vec!["a", "b"], vec!["c"]]);
    }
}
