//! Balance at scale: three leaderd instances with `balance = true` share
//! many elections on the benchmark's store (straight to it, no proxy, as
//! the footprint scenario does: requests are counted by leaderd's own
//! histogram). Measured: how long the shares take to settle after the last
//! start; over a quiet window each instance's share, store requests by
//! operation, CPU, peak RSS and renewal delays; the requests one `leaderd
//! resign` causes on each instance beyond its floor at rest; and after a
//! `kill -9` of one, how long until every election is led again and the
//! shares settle. [`takeover_all`] measures the other shape: one instance
//! leads every election, one follows, the leader is killed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{
    Env, Instance, cpu_seconds, http_get, mono_ns, ms_between, poll, sleep_until, status_kib,
};
use crate::scenarios::metric_sum;
use crate::{D, L, M, R};

/// How far from its fair share an instance may be and count as settled: 1 %
/// of the elections, and never less than 10.
pub fn settled_within(n: usize) -> usize {
    (n / 100).max(10)
}

/// How long after a `leaderd resign` its requests are counted.
const RESIGN_WINDOW: Duration = Duration::from_secs(30);

/// One instance over the quiet window.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its identity.
    pub identity: String,
    /// Elections it led at the end of the window.
    pub led: usize,
    /// Peak RSS (VmHWM), KiB.
    pub hwm_kib: u64,
    /// CPU seconds per minute over the window.
    pub cpu_per_min: f64,
    /// Renewals that did not succeed, whole run.
    pub renew_failures: f64,
    /// Successful renewals in the window, and the room an R-spaced schedule
    /// had for the elections it led.
    pub renewals: (f64, f64),
    /// Worst renewal delay seen by sampling `/status` (ms).
    pub worst_delay_ms: f64,
    /// Store reads and writes per minute over the quiet window, counted
    /// by its own `leaderd_store_request_duration_seconds_count`.
    pub requests_per_min: (f64, f64),
    /// The same requests per minute by record kind and operation
    /// (`#session write`, `election read`, ...).
    pub ops_per_min: BTreeMap<String, f64>,
    /// Requests in the [`RESIGN_WINDOW`] after one `leaderd resign`, beyond
    /// what the quiet window's rate makes in as long, by kind and operation
    /// (only those above it).
    pub resign_extra: BTreeMap<String, f64>,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct BalanceRun {
    /// The store's name.
    pub store: &'static str,
    /// N.
    pub elections: usize,
    /// Whether the instances held their elections through sessions.
    pub sessions: bool,
    /// Seconds from the first instance's start to it leading every election.
    pub first_leads_all_s: f64,
    /// Seconds from the last start until every instance was within
    /// [`settled_within`] of ceil(N/3).
    pub join_settle_s: f64,
    /// Seconds from the last start to the last move of balance (a release
    /// or take-over) or re-read of many before 3·L without one: the quiet
    /// window starts 3·L after.
    pub rest_after_s: f64,
    /// The quiet window.
    pub members: Vec<Member>,
    /// The election resigned, and the instance that led it.
    pub resigned: (String, String),
    /// Seconds from `kill -9` of one instance until every election was led
    /// again.
    pub crash_all_led_s: f64,
    /// Seconds from `kill -9` of one instance until both others were within
    /// [`settled_within`] of ceil(N/2).
    pub crash_settle_s: f64,
    /// Shares after the crash settled.
    pub after_crash: Vec<(String, usize)>,
}

/// Elections `body` (a `/status` answer) says are led, and the smallest
/// `lease_remaining_ms` among them.
fn led_and_margin(body: &str) -> Option<(usize, u64)> {
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    let mut led = 0;
    let mut least = u64::MAX;
    for e in json.get("elections")?.as_object()?.values() {
        if e.get("is_leader").and_then(serde_json::Value::as_bool) == Some(true) {
            led += 1;
            let left = e
                .get("lease_remaining_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            least = least.min(left);
        }
    }
    Some((led, least))
}

/// Elections `instance` leads, from its `leaderd_elections_led` (a scrape
/// stays small at any number of elections; `/status` does not).
fn led(instance: &Instance) -> usize {
    instance.get("/metrics").map_or(0, |(_, body)| {
        body.lines()
            .find_map(|l| l.strip_prefix("leaderd_elections_led "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as usize)
    })
}

/// Waits until every instance leads `each` ± [`settled_within`] (`each`
/// `None`: any share) and all `n` are led; seconds since `from_ns`.
fn settle(
    instances: &[&Instance],
    n: usize,
    each: Option<usize>,
    from_ns: u64,
    limit: Duration,
) -> Result<f64, String> {
    let within = settled_within(n);
    // The shares every 5 s on stderr: how the moves went.
    let mut shown_ns = from_ns;
    poll(limit, Duration::from_millis(100), || {
        let shares: Vec<usize> = instances.iter().map(|i| led(i)).collect();
        if mono_ns().saturating_sub(shown_ns) >= 5_000_000_000 {
            shown_ns = mono_ns();
            eprintln!(
                "    {:.0} s: shares {shares:?}",
                ms_between(from_ns, shown_ns) / 1e3
            );
        }
        (shares.iter().sum::<usize>() == n
            && each.is_none_or(|each| shares.iter().all(|s| s.abs_diff(each) <= within)))
        .then_some(())
    })
    .map(|()| ms_between(from_ns, mono_ns()) / 1e3)
    .ok_or_else(|| {
        let shares: Vec<usize> = instances.iter().map(|i| led(i)).collect();
        match each {
            Some(each) => format!("shares {shares:?} not {each} ± {within} within {limit:?}"),
            None => format!("shares {shares:?} do not add up to {n} within {limit:?}"),
        }
    })
}

/// Store reads and writes an instance made so far, from its own metrics.
fn requests(instance: &Instance) -> (f64, f64) {
    let body = http_get(instance.port, "/metrics").map_or(String::new(), |(_, b)| b);
    let count = |reads: bool| {
        metric_sum(&body, "leaderd_store_request_duration_seconds_count", |l| {
            l.contains("op=\"read") == reads
        })
    };
    (count(true), count(false))
}

/// Each instance's store requests so far, by `election` kind (an
/// election, `#session`, `#member`) and `op`.
fn requests_by_op(instance: &Instance) -> BTreeMap<String, f64> {
    let body = http_get(instance.port, "/metrics").map_or(String::new(), |(_, b)| b);
    let mut by_op = BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("leaderd_store_request_duration_seconds_count{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let election = label("election");
        let kind = if election.starts_with('#') {
            election
        } else {
            "election".into()
        };
        let count: f64 = value.trim().parse().unwrap_or(0.0);
        *by_op
            .entry(format!("{kind} {}", label("op")))
            .or_insert(0.0) += count;
    }
    by_op
}

/// A configuration of `n` elections named `PREFIX{n}[s]-RANDOM-i`, held
/// through sessions when `sessions`, with `balance` as given: (label, path).
fn write_config(
    env: &Env,
    store: SocketAddr,
    prefix: &str,
    n: usize,
    sessions: bool,
    balance: bool,
) -> Result<(String, std::path::PathBuf), String> {
    let label = format!(
        "{prefix}{n}{}-{:06x}",
        if sessions { "s" } else { "" },
        rand::random::<u32>() & 0xff_ffff
    );
    let elections: Vec<String> = (0..n).map(|i| format!("{label}-{i:05}")).collect();
    let config = env.write_config(
        &format!("{label}.toml"),
        &format!("http://{store}"),
        &elections,
        &[],
    )?;
    crate::harness::set_sessions(&config, sessions)?;
    if balance {
        // A top-level key goes before the first table.
        let text = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
        std::fs::write(&config, format!("balance = true\n{text}")).map_err(|e| e.to_string())?;
    }
    Ok((label, config))
}

/// The first instance (`LABEL-a`), started alone and waited for until it
/// leads all `n`.
fn start_leading_all(
    env: &Env,
    label: &str,
    config: &std::path::Path,
    n: usize,
) -> Result<Instance, String> {
    let mut first = Instance::start(env, &format!("{label}-a"), config, &[])?;
    first.wait_http(Duration::from_secs(30))?;
    let lead_limit = Duration::from_secs(60) + Duration::from_millis(100 * n as u64);
    poll(lead_limit, Duration::from_millis(200), || {
        (led(&first) == n).then_some(())
    })
    .ok_or_else(|| format!("{label}: the first instance did not lead all {n}"))?;
    Ok(first)
}

/// `n` elections over three balancing instances, held through sessions
/// when `sessions`.
pub fn measure(
    env: &Env,
    store: SocketAddr,
    n: usize,
    window: Duration,
    clock_ticks: f64,
    sessions: bool,
) -> Result<BalanceRun, String> {
    let (label, config) = write_config(env, store, "bal", n, sessions, true)?;
    let mut first = start_leading_all(env, &label, &config, n)?;
    let first_leads_all_s = ms_between(first.spawned_ns, mono_ns()) / 1e3;
    eprintln!("  first instance leads all {n} after {first_leads_all_s:.1} s");
    let mut second = Instance::start(env, &format!("{label}-b"), &config, &[])?;
    second.wait_http(Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(3));
    let mut third = Instance::start(env, &format!("{label}-c"), &config, &[])?;
    third.wait_http(Duration::from_secs(30))?;
    let settle_limit = Duration::from_secs(180) + Duration::from_millis(20 * n as u64);
    let join_settle_s = settle(
        &[&first, &second, &third],
        n,
        Some(n.div_ceil(3)),
        third.spawned_ns,
        settle_limit,
    )?;
    eprintln!("  settled after the last start: {join_settle_s:.1} s");

    let all = [&first, &second, &third];
    let rest_after_s = come_to_rest(&all, third.spawned_ns);
    eprintln!("  at rest {rest_after_s:.1} s after the last start");
    // Quiet window.
    let renew_ok = |i: &Instance| -> f64 {
        http_get(i.port, "/metrics").map_or(0.0, |(_, body)| {
            metric_sum(&body, "leaderd_renew_total", |l| {
                l.contains("result=\"ok\"")
            })
        })
    };
    let ok0: Vec<f64> = all.iter().map(|i| renew_ok(i)).collect();
    let req0: Vec<(f64, f64)> = all.iter().map(|i| requests(i)).collect();
    let ops0: Vec<_> = all.iter().map(|i| requests_by_op(i)).collect();
    let cpu0: Vec<f64> = all
        .iter()
        .map(|i| cpu_seconds(i.pid(), clock_ticks).unwrap_or(0.0))
        .collect();
    // CPU over a window with no HTTP traffic (a /status of 1,000
    // elections costs CPU of its own), then /status sampling.
    let t0 = mono_ns();
    std::thread::sleep(window);
    let minutes = ms_between(t0, mono_ns()) / 60e3;
    let cpu1: Vec<f64> = all
        .iter()
        .enumerate()
        .map(|(k, i)| cpu_seconds(i.pid(), clock_ticks).unwrap_or(cpu0[k]))
        .collect();
    let ok1: Vec<f64> = all.iter().map(|i| renew_ok(i)).collect();
    let req1: Vec<(f64, f64)> = all.iter().map(|i| requests(i)).collect();
    let ops_per_min: Vec<BTreeMap<String, f64>> = all
        .iter()
        .enumerate()
        .map(|(k, instance)| {
            let moved = difference(&requests_by_op(instance), &ops0[k], minutes);
            eprintln!("  quiet window, instance {k}: {}", by_op(&moved));
            moved
        })
        .collect();
    // The least lease left shows the latest renewal.
    let every = Duration::from_millis(250);
    let mut least = [u64::MAX; 3];
    let until = mono_ns() + window.as_nanos() as u64;
    while mono_ns() < until {
        let next = mono_ns() + every.as_nanos() as u64;
        for (k, instance) in all.iter().enumerate() {
            if let Some((_, margin)) = instance
                .get("/status")
                .and_then(|(_, body)| led_and_margin(&body))
            {
                least[k] = least[k].min(margin);
            }
        }
        sleep_until(next);
    }
    let due_remaining_ms =
        L.as_secs_f64() * 1e3 * (1.0 - D) - M.as_secs_f64() * 1e3 - R.as_secs_f64() * 1e3;
    let mut members = Vec::new();
    for (k, instance) in all.iter().enumerate() {
        let metrics = http_get(instance.port, "/metrics").map_or(String::new(), |(_, b)| b);
        let led_now = led(instance);
        members.push(Member {
            identity: instance.identity.clone(),
            led: led_now,
            hwm_kib: status_kib(instance.pid(), "VmHWM").unwrap_or(0),
            cpu_per_min: (cpu1[k] - cpu0[k]) / minutes,
            renew_failures: metric_sum(&metrics, "leaderd_renew_total", |l| {
                !l.contains("result=\"ok\"")
            }),
            // With sessions only the session is renewed (under #session).
            renewals: (
                ok1[k] - ok0[k],
                if sessions { 1.0 } else { led_now as f64 } * minutes * 60.0 / R.as_secs_f64(),
            ),
            worst_delay_ms: if least[k] == u64::MAX {
                0.0
            } else {
                (due_remaining_ms - least[k] as f64).max(0.0)
            },
            requests_per_min: (
                (req1[k].0 - req0[k].0) / minutes,
                (req1[k].1 - req0[k].1) / minutes,
            ),
            ops_per_min: ops_per_min[k].clone(),
            resign_extra: BTreeMap::new(),
        });
    }

    let resigned = resign_one(env, &all, &mut members)?;

    // kill -9 of the third: the other two take its elections and even out.
    let killed_ns = mono_ns();
    third.kill9();
    let crash_all_led_s = settle(&[&first, &second], n, None, killed_ns, settle_limit)?;
    eprintln!("  every election led again {crash_all_led_s:.1} s after kill -9");
    let crash_settle_s = settle(
        &[&first, &second],
        n,
        Some(n.div_ceil(2)),
        killed_ns,
        settle_limit,
    )?;
    eprintln!("  settled {crash_settle_s:.1} s after kill -9");
    let after_crash = vec![
        (first.identity.clone(), led(&first)),
        (second.identity.clone(), led(&second)),
    ];
    first.stop(Duration::from_secs(60));
    second.stop(Duration::from_secs(60));
    Ok(BalanceRun {
        store: env.store_name(),
        elections: n,
        sessions,
        first_leads_all_s,
        join_settle_s,
        rest_after_s,
        members,
        resigned,
        crash_all_led_s,
        crash_settle_s,
        after_crash,
    })
}

/// Waits until no instance has written an election's record (a move of
/// balance: release, take over) nor read many elections' records at once
/// for 3·L, at most 5 minutes; seconds from `from_ns` to the last such
/// request seen. A follower learns that a session's count of ended
/// tenures moved from its next read of that session (about one every two
/// leases), and a count that moved by more ends than the session record
/// names has it read again every election it follows through that
/// session: the re-read the last moves cause comes up to R + 2·L·(1+D)
/// after them, part of the churn, not of the rest.
fn come_to_rest(all: &[&Instance], from_ns: u64) -> f64 {
    let moves = || -> f64 {
        all.iter()
            .flat_map(|i| requests_by_op(i))
            .filter(|(op, _)| {
                let write = !op.starts_with("#session")
                    && !op.starts_with("#member")
                    && !op.split(' ').nth(1).is_some_and(|o| o.starts_with("read"));
                write || op == "#session read_elections"
            })
            .map(|(_, n)| n)
            .sum()
    };
    let mut last = (moves(), mono_ns());
    let until = mono_ns() + Duration::from_secs(300).as_nanos() as u64;
    while mono_ns() < until && mono_ns() - last.1 < (3 * L).as_nanos() as u64 {
        std::thread::sleep(Duration::from_secs(1));
        let now = moves();
        if now != last.0 {
            last = (now, mono_ns());
        }
    }
    ms_between(from_ns, last.1) / 1e3
}

/// `after - before` per key, per minute over `minutes` (keys that moved).
fn difference(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
    minutes: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (op.clone(), d / minutes))
        })
        .collect()
}

/// `#session write 12, election read 3` (rounded to one decimal).
fn by_op(ops: &BTreeMap<String, f64>) -> String {
    if ops.is_empty() {
        return "none".into();
    }
    ops.iter()
        .map(|(op, n)| format!("{op} {}", (n * 10.0).round() / 10.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `leaderd resign` of one election the first instance leads, as an
/// operator runs it; each instance's requests over the [`RESIGN_WINDOW`]
/// that follows, less what its rate at rest makes in as long, go into
/// `members[k].resign_extra`. Returns (election, its leader).
fn resign_one(
    env: &Env,
    all: &[&Instance],
    members: &mut [Member],
) -> Result<(String, String), String> {
    let leader = all[0];
    let (_, body) = leader
        .get("/status")
        .ok_or_else(|| format!("{} does not answer /status", leader.identity))?;
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("/status is not JSON: {e}"))?;
    let election = json
        .get("elections")
        .and_then(serde_json::Value::as_object)
        .and_then(|all| {
            all.iter().find(|(_, e)| {
                e.get("is_leader").and_then(serde_json::Value::as_bool) == Some(true)
            })
        })
        .map(|(name, _)| name.clone())
        .ok_or_else(|| format!("{} leads no election to resign", leader.identity))?;
    let before: Vec<_> = all.iter().map(|i| requests_by_op(i)).collect();
    let from = mono_ns();
    crate::scenarios::resign(env, leader, &election, None)?;
    sleep_until(from + RESIGN_WINDOW.as_nanos() as u64);
    let minutes = ms_between(from, mono_ns()) / 60e3;
    for (k, instance) in all.iter().enumerate() {
        let moved = difference(&requests_by_op(instance), &before[k], 1.0);
        let extra: BTreeMap<String, f64> = moved
            .into_iter()
            .filter_map(|(op, n)| {
                // Requests come whole; the floor is a rate: what lies
                // beyond it is counted in whole requests.
                let floor = members[k].ops_per_min.get(&op).copied().unwrap_or(0.0) * minutes;
                let beyond = (n - floor).round();
                (beyond >= 1.0).then_some((op, beyond))
            })
            .collect();
        eprintln!(
            "  after resign {election}, instance {k} beyond its floor: {}",
            by_op(&extra)
        );
        members[k].resign_extra = extra;
    }
    Ok((election, leader.identity.clone()))
}

/// One acceptance line: figure, target, what was measured, whether it holds.
pub type Check = (String, String, String, bool);

/// Targets at rest per instance, with sessions (reads and writes a minute
/// each, CPU s/min, peak RSS MiB), at any number of elections.
const REST_REQUESTS_TARGET: f64 = 15.0;
const REST_CPU_TARGET: f64 = 0.5;
const REST_RSS_TARGET_MIB: f64 = 64.0;
/// Balanced this long after the last start, at most.
const BALANCE_TARGET_S: f64 = 60.0;
/// Requests one resign may cost a follower beyond its floor.
const RESIGN_EXTRA_TARGET: f64 = 5.0;

/// The longest a crashed instance's elections may stay unled: L·(1+D)
/// plus `slack`.
fn crash_bound_s(slack: f64) -> f64 {
    L.as_secs_f64() * (1.0 + D) + slack
}

/// The report section, and its acceptance lines.
pub fn report(out: &mut String, run: &BalanceRun, window: Duration) -> Vec<Check> {
    use std::fmt::Write as _;
    let fair = run.elections.div_ceil(3);
    let within = settled_within(run.elections);
    let _ = writeln!(
        out,
        "## Balance, {} elections{}\n",
        run.elections,
        if run.sessions { ", with sessions" } else { "" }
    );
    let _ = writeln!(
        out,
        "{} elections, three leaderd instances with `balance = true` on {} (no proxy). The first starts alone and leads every election ({:.1} s); the second starts, then the third 3 s later. Settled = every instance within ±{within} (1 %, at least 10) of its fair share and every election led, checked every 100 ms on each instance's `leaderd_elections_led`.\n",
        run.elections, run.store, run.first_leads_all_s
    );
    let _ = writeln!(out, "| event | after |");
    let _ = writeln!(out, "|---|---:|");
    let _ = writeln!(
        out,
        "| last start → {fair} ± {within} each | {:.1} s |",
        run.join_settle_s
    );
    let _ = writeln!(
        out,
        "| last start → the last move of balance or re-read of many (then 3·L without one) | {:.1} s |",
        run.rest_after_s
    );
    let _ = writeln!(
        out,
        "| `kill -9` of one → every election led again | {:.1} s |",
        run.crash_all_led_s
    );
    let _ = writeln!(
        out,
        "| `kill -9` of one → {} ± {within} each for the other two | {:.1} s |",
        run.elections.div_ceil(2),
        run.crash_settle_s
    );
    let _ = writeln!(
        out,
        "\nEach instance over a {:.0} s quiet window with no HTTP traffic (CPU, renewals, store requests by record and operation as its own `leaderd_store_request_duration_seconds_count` counts them), then another as long with `/status` sampled every 250 ms (the renewal delay, as in the footprint):\n",
        window.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| instance | led | store reads/min | store writes/min | by record and operation (/min) | peak RSS (MiB) | CPU s/min | renewals ok / room | failed renewals (whole run) | worst renewal delay (ms) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|");
    for m in &run.members {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.3} | {:.0} / {:.0} | {:.0} | {:.0} |",
            m.identity,
            m.led,
            m.requests_per_min.0,
            m.requests_per_min.1,
            by_op(&m.ops_per_min),
            m.hwm_kib as f64 / 1024.0,
            m.cpu_per_min,
            m.renewals.0,
            m.renewals.1,
            m.renew_failures,
            m.worst_delay_ms
        );
    }
    let (election, leader) = &run.resigned;
    let _ = writeln!(
        out,
        "\n`leaderd resign {election}` on its leader {leader}: each instance's store requests in the {} s that followed, beyond what its rate at rest makes in as long:\n",
        RESIGN_WINDOW.as_secs()
    );
    let _ = writeln!(
        out,
        "| instance | requests beyond the floor | by record and operation |"
    );
    let _ = writeln!(out, "|---|---:|---|");
    for m in &run.members {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} |",
            m.identity,
            m.resign_extra.values().sum::<f64>(),
            by_op(&m.resign_extra)
        );
    }
    let shares: Vec<String> = run
        .after_crash
        .iter()
        .map(|(id, led)| format!("{id}: {led}"))
        .collect();
    let _ = writeln!(out, "\nAfter the crash settled: {}.\n", shares.join(", "));
    checks(run)
}

fn checks(run: &BalanceRun) -> Vec<Check> {
    let n = run.elections;
    let fair = n.div_ceil(3);
    let within = settled_within(n);
    let shares: Vec<String> = run.members.iter().map(|m| m.led.to_string()).collect();
    let worst = run
        .members
        .iter()
        .map(|m| m.worst_delay_ms)
        .fold(0.0, f64::max);
    let failed: f64 = run.members.iter().map(|m| m.renew_failures).sum();
    let p_ms = crate::P.as_secs_f64() * 1e3;
    let most = |f: &dyn Fn(&Member) -> f64| run.members.iter().map(f).fold(0.0, f64::max);
    let mut checks = vec![
        (
            format!("{n} elections over 3 instances: shares"),
            format!("{fair} ± {within} each"),
            shares.join(", "),
            run.members.iter().all(|m| m.led.abs_diff(fair) <= within),
        ),
        (
            format!("{n} elections, balance: every renewal on time"),
            format!("none failed, worst delay < P = {p_ms:.0} ms"),
            format!("{failed:.0} failed, worst {worst:.0} ms"),
            failed == 0.0 && worst < p_ms,
        ),
        (
            format!("{n} elections: balanced after the last start"),
            format!("≤ {BALANCE_TARGET_S:.0} s"),
            format!("{:.1} s", run.join_settle_s),
            run.join_settle_s <= BALANCE_TARGET_S,
        ),
        (
            format!("{n} elections: all led again after kill -9 of one of 3"),
            format!("≤ L·(1+D) + 2 s = {:.1} s", crash_bound_s(2.0)),
            format!("{:.1} s", run.crash_all_led_s),
            run.crash_all_led_s <= crash_bound_s(2.0),
        ),
    ];
    let leader = &run.resigned.1;
    let follower_extra = run
        .members
        .iter()
        .filter(|m| &m.identity != leader)
        .map(|m| m.resign_extra.values().sum::<f64>())
        .fold(0.0, f64::max);
    checks.push((
        format!("{n} elections: one resign, requests beyond the floor per follower"),
        format!("≤ {RESIGN_EXTRA_TARGET:.0}"),
        format!("{follower_extra:.0} at most"),
        follower_extra <= RESIGN_EXTRA_TARGET,
    ));
    if run.sessions {
        let reads = most(&|m| m.requests_per_min.0);
        let writes = most(&|m| m.requests_per_min.1);
        let cpu = most(&|m| m.cpu_per_min);
        let rss = most(&|m| m.hwm_kib as f64 / 1024.0);
        checks.extend([
            (
                format!("{n} elections at rest: store requests per instance"),
                format!("≤ {REST_REQUESTS_TARGET:.0} reads and ≤ {REST_REQUESTS_TARGET:.0} writes a minute"),
                format!("{reads:.1} reads, {writes:.1} writes at most"),
                reads <= REST_REQUESTS_TARGET && writes <= REST_REQUESTS_TARGET,
            ),
            (
                format!("{n} elections at rest: CPU per instance"),
                format!("≤ {REST_CPU_TARGET} s/min"),
                format!("{cpu:.3} s/min at most"),
                cpu <= REST_CPU_TARGET,
            ),
            (
                format!("{n} elections: peak RSS per instance"),
                format!("≤ {REST_RSS_TARGET_MIB:.0} MiB"),
                format!("{rss:.1} MiB at most"),
                rss <= REST_RSS_TARGET_MIB,
            ),
        ]);
    }
    checks
}

/// One instance leading every election, one following; the leader
/// `kill -9`ed.
#[derive(Debug, Clone)]
pub struct TakeoverAll {
    /// N.
    pub elections: usize,
    /// Whether held through sessions.
    pub sessions: bool,
    /// With sessions: from the leader's session renewal seen answered to
    /// the kill, in milliseconds.
    pub after_renewal_ms: Option<f64>,
    /// Seconds from the kill until the follower led its first election.
    pub began_s: f64,
    /// Seconds from the kill until it led every one.
    pub all_led_s: f64,
    /// The follower's peak RSS (MiB) at the end.
    pub follower_hwm_mib: f64,
    /// CPU seconds from its first election led to its last: the
    /// follower's, and the store server's (DynamoDB Local's JVM, or
    /// PostgreSQL's processes).
    pub follower_cpu_s: f64,
    pub server_cpu_s: f64,
    /// The follower's store requests by record and operation from its
    /// first election led to its last.
    pub taking_requests: BTreeMap<String, f64>,
}

/// One instance (balance off) leads all `n`; a second follows for 10 s;
/// the first is `kill -9`ed and the second's `leaderd_elections_led`
/// polled every 100 ms. `server_cpu`: the store server's CPU seconds so
/// far (where the takes' time goes).
pub fn takeover_all(
    env: &Env,
    store: SocketAddr,
    n: usize,
    sessions: bool,
    server_cpu: &dyn Fn() -> f64,
) -> Result<TakeoverAll, String> {
    let (label, config) = write_config(env, store, "all", n, sessions, false)?;
    let mut first = start_leading_all(env, &label, &config, n)?;
    let mut second = Instance::start(env, &format!("{label}-b"), &config, &[])?;
    second.wait_http(Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(10));
    if led(&second) != 0 {
        return Err(format!("{label}: the follower leads before the kill"));
    }
    // With sessions, the kill comes right after the leader's session was
    // renewed (its metrics count the renewal once answered): the worst
    // case, the follower's wait for the due starting from that renewal.
    let after_renewal_ms = if sessions {
        let renewals = |i: &Instance| {
            requests_by_op(i)
                .get("#session renew_session")
                .copied()
                .unwrap_or(0.0)
        };
        let before = renewals(&first);
        let seen = poll(
            R + Duration::from_secs(5),
            Duration::from_millis(10),
            || (renewals(&first) > before).then(mono_ns),
        )
        .ok_or_else(|| format!("{label}: the leader's session was not renewed"))?;
        Some(ms_between(seen, mono_ns()))
    } else {
        None
    };
    let killed_ns = mono_ns();
    first.kill9();
    let limit = Duration::from_secs(120) + Duration::from_millis(20 * n as u64);
    let ticks = crate::harness::clock_ticks()?;
    let cpu = |server_cpu: &dyn Fn() -> f64| {
        let follower = crate::harness::cpu_seconds(second.pid(), ticks).unwrap_or(0.0);
        (follower, server_cpu())
    };
    let mut began_s = None;
    let mut began_cpu = (0.0, 0.0);
    let mut began_requests = BTreeMap::new();
    poll(limit, Duration::from_millis(100), || {
        let now = led(&second);
        if now > 0 && began_s.is_none() {
            began_s = Some(ms_between(killed_ns, mono_ns()) / 1e3);
            began_cpu = cpu(server_cpu);
            began_requests = requests_by_op(&second);
        }
        (now == n).then_some(())
    })
    .ok_or_else(|| {
        format!(
            "{label}: the follower led {} of {n} within {limit:?}",
            led(&second)
        )
    })?;
    let all_led_s = ms_between(killed_ns, mono_ns()) / 1e3;
    let (follower_cpu, store_cpu) = cpu(server_cpu);
    let taking_requests = difference(&requests_by_op(&second), &began_requests, 1.0);
    eprintln!("  follower led all {n} {all_led_s:.1} s after kill -9");
    let follower_hwm_mib = status_kib(second.pid(), "VmHWM").unwrap_or(0) as f64 / 1024.0;
    second.stop(Duration::from_secs(60));
    Ok(TakeoverAll {
        elections: n,
        sessions,
        after_renewal_ms,
        began_s: began_s.unwrap_or(all_led_s),
        all_led_s,
        follower_hwm_mib,
        follower_cpu_s: follower_cpu - began_cpu.0,
        server_cpu_s: store_cpu - began_cpu.1,
        taking_requests,
    })
}

/// The report of [`takeover_all`], and its acceptance line.
pub fn report_takeover_all(out: &mut String, run: &TakeoverAll) -> Check {
    use std::fmt::Write as _;
    let bound = crash_bound_s(5.0);
    let taking = run.all_led_s - run.began_s;
    let rate = if taking > 0.0 {
        format!("{:.0}", run.elections.saturating_sub(1) as f64 / taking)
    } else {
        "–".to_owned()
    };
    // With the kill placed after a renewal: the earliest the protocol
    // allows the first take, and how long after it the last came.
    let floor_s = run
        .after_renewal_ms
        .map(|ms| L.as_secs_f64() * (1.0 + D) - ms / 1e3);
    let _ = writeln!(
        out,
        "## One instance leading all {} elections{}, `kill -9`\n\nOne leaderd (balance off) leads every election, a second follows for 10 s, then the first is killed with SIGKILL{}; times from the kill, on the follower's `leaderd_elections_led` polled every 100 ms. From its first election led to its last: elections led a second, and the CPU the follower and the store server used (cores: CPU seconds over those seconds).\n\n| led its first | led all {} | led a second after the first | follower's CPU | store server's CPU | follower's peak RSS (MiB) |\n|---:|---:|---:|---:|---:|---:|\n| {:.1} s | {:.1} s | {rate} | {:.1} s ({:.2} cores) | {:.1} s ({:.2} cores) | {:.1} |\n",
        run.elections,
        if run.sessions { ", with sessions" } else { "" },
        match run.after_renewal_ms {
            Some(ms) => format!(
                " right after its session was renewed ({ms:.0} ms after the renewal's answer showed in its metrics: the worst case, the follower waiting L·(1+D) from that renewal)"
            ),
            None => String::new(),
        },
        run.elections,
        run.began_s,
        run.all_led_s,
        run.follower_cpu_s,
        run.follower_cpu_s / taking.max(1e-3),
        run.server_cpu_s,
        run.server_cpu_s / taking.max(1e-3),
        run.follower_hwm_mib
    );
    if let Some(floor) = floor_s {
        let _ = writeln!(
            out,
            "Floor: no follower may take before the dead session's last `rvn` stayed unchanged for L·(1+D) on its clock, {floor:.1} s after this kill; the first take came {:.1} s after the floor, the last {:.1} s after it.\n",
            run.began_s - floor,
            run.all_led_s - floor
        );
    }
    let _ = writeln!(
        out,
        "The follower's store requests from its first election led to its last, by record and operation (each take counted once per election, also when a hundred went in one request; a read of many records counted once a request): {}.\n",
        by_op(&run.taking_requests)
    );
    (
        format!(
            "{} elections on one instance: all led again after its kill -9",
            run.elections
        ),
        format!("≤ L·(1+D) + 5 s = {bound:.1} s"),
        format!("{:.1} s", run.all_led_s),
        run.all_led_s <= bound,
    )
}
