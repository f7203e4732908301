//! Balance at scale: three leaderd instances with `balance = true` share
//! many elections on the benchmark's store (straight to it, no proxy, as
//! the footprint scenario does: requests are counted by leaderd's own
//! histogram). Measured: how long the shares take to settle after the last
//! start and after a `kill -9`, and over a quiet window each instance's
//! share, CPU, peak RSS and renewal delays.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{
    Env, Instance, cpu_seconds, http_get, mono_ns, ms_between, poll, sleep_until, status_kib,
};
use crate::scenarios::metric_sum;
use crate::{D, L, M, R};

/// How far from its fair share an instance may be and count as settled.
pub const SETTLED_WITHIN: usize = 10;

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
    /// [`SETTLED_WITHIN`] of ceil(N/3).
    pub join_settle_s: f64,
    /// The quiet window.
    pub members: Vec<Member>,
    /// Seconds from `kill -9` of one instance until both others were within
    /// [`SETTLED_WITHIN`] of ceil(N/2).
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

fn led(instance: &Instance) -> usize {
    instance
        .get("/status")
        .and_then(|(_, body)| led_and_margin(&body))
        .map_or(0, |(led, _)| led)
}

/// Waits until every instance leads `each` ± [`SETTLED_WITHIN`] and all `n`
/// are led; seconds taken.
fn settle(instances: &[&Instance], n: usize, each: usize, limit: Duration) -> Result<f64, String> {
    let from = mono_ns();
    poll(limit, Duration::from_millis(250), || {
        let shares: Vec<usize> = instances.iter().map(|i| led(i)).collect();
        (shares.iter().sum::<usize>() == n
            && shares.iter().all(|s| s.abs_diff(each) <= SETTLED_WITHIN))
        .then_some(())
    })
    .map(|()| ms_between(from, mono_ns()) / 1e3)
    .ok_or_else(|| {
        let shares: Vec<usize> = instances.iter().map(|i| led(i)).collect();
        format!("shares {shares:?} not {each} ± {SETTLED_WITHIN} within {limit:?}")
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
fn requests_by_op(instance: &Instance) -> std::collections::BTreeMap<String, f64> {
    let body = http_get(instance.port, "/metrics").map_or(String::new(), |(_, b)| b);
    let mut by_op = std::collections::BTreeMap::new();
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
    let label = format!(
        "bal{n}{}-{:06x}",
        if sessions { "s" } else { "" },
        rand::random::<u32>() & 0xff_ffff
    );
    let elections: Vec<String> = (0..n).map(|i| format!("{label}-{i:04}")).collect();
    let config = env.write_config(
        &format!("{label}.toml"),
        &format!("http://{store}"),
        &elections,
        &[],
    )?;
    crate::harness::set_sessions(&config, sessions)?;
    // A top-level key goes before the first table.
    let text = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
    std::fs::write(&config, format!("balance = true\n{text}")).map_err(|e| e.to_string())?;

    let mut first = Instance::start(env, &format!("{label}-a"), &config, &[])?;
    first.wait_http(Duration::from_secs(30))?;
    let lead_limit = Duration::from_secs(60) + Duration::from_millis(100 * n as u64);
    let first_leads_all_s = {
        poll(lead_limit, Duration::from_millis(200), || {
            (led(&first) == n).then_some(())
        })
        .ok_or_else(|| format!("{label}: the first instance did not lead all {n}"))?;
        ms_between(first.spawned_ns, mono_ns()) / 1e3
    };
    eprintln!("  first instance leads all {n} after {first_leads_all_s:.1} s");
    let mut second = Instance::start(env, &format!("{label}-b"), &config, &[])?;
    second.wait_http(Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(3));
    let mut third = Instance::start(env, &format!("{label}-c"), &config, &[])?;
    third.wait_http(Duration::from_secs(30))?;
    let join_settle_s = settle(
        &[&first, &second, &third],
        n,
        n.div_ceil(3),
        Duration::from_secs(180),
    )?;
    eprintln!("  settled after the last start: {join_settle_s:.1} s");

    // Quiet window.
    std::thread::sleep(Duration::from_secs(5));
    let all = [&first, &second, &third];
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
    for (k, instance) in all.iter().enumerate() {
        let ops = requests_by_op(instance);
        let moved: Vec<String> = ops
            .iter()
            .filter_map(|(op, n)| {
                let d = n - ops0[k].get(op).copied().unwrap_or(0.0);
                (d > 0.0).then(|| format!("{op} {d}"))
            })
            .collect();
        eprintln!("  quiet window, instance {k}: {}", moved.join(", "));
    }
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
        });
    }

    // kill -9 of the third: the other two take its elections and even out.
    third.kill9();
    let crash_settle_s = settle(
        &[&first, &second],
        n,
        n.div_ceil(2),
        Duration::from_secs(180),
    )?;
    eprintln!("  settled after kill -9: {crash_settle_s:.1} s");
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
        members,
        crash_settle_s,
        after_crash,
    })
}

/// One acceptance line: figure, target, what was measured, whether it holds.
pub type Check = (String, String, String, bool);

/// The report section, and its acceptance lines.
pub fn report(out: &mut String, run: &BalanceRun, window: Duration) -> Vec<Check> {
    use std::fmt::Write as _;
    let fair = run.elections.div_ceil(3);
    let _ = writeln!(
        out,
        "## Balance{}\n",
        if run.sessions { ", with sessions" } else { "" }
    );
    let _ = writeln!(
        out,
        "{} elections, three leaderd instances with `balance = true` on {} (no proxy). The first starts alone and leads every election ({:.1} s); the second starts, then the third 3 s later. Settled = every instance within ±{SETTLED_WITHIN} of its fair share and every election led, checked every 250 ms.\n",
        run.elections, run.store, run.first_leads_all_s
    );
    let _ = writeln!(out, "| event | settled after |");
    let _ = writeln!(out, "|---|---:|");
    let _ = writeln!(
        out,
        "| last start → {fair} ± {SETTLED_WITHIN} each | {:.1} s |",
        run.join_settle_s
    );
    let _ = writeln!(
        out,
        "| `kill -9` of one → {} ± {SETTLED_WITHIN} each for the other two | {:.1} s |",
        run.elections.div_ceil(2),
        run.crash_settle_s
    );
    let _ = writeln!(
        out,
        "\nEach instance over a {:.0} s quiet window with no HTTP traffic (CPU, renewals), then another as long with `/status` sampled every 250 ms (the renewal delay, as in the footprint):\n",
        window.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| instance | led | store reads/min | store writes/min | peak RSS (MiB) | CPU s/min | renewals ok / room | failed renewals (whole run) | worst renewal delay (ms) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in &run.members {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.1} | {:.3} | {:.0} / {:.0} | {:.0} | {:.0} |",
            m.identity,
            m.led,
            m.requests_per_min.0,
            m.requests_per_min.1,
            m.hwm_kib as f64 / 1024.0,
            m.cpu_per_min,
            m.renewals.0,
            m.renewals.1,
            m.renew_failures,
            m.worst_delay_ms
        );
    }
    let shares: Vec<String> = run
        .after_crash
        .iter()
        .map(|(id, led)| format!("{id}: {led}"))
        .collect();
    let _ = writeln!(out, "\nAfter the crash settled: {}.\n", shares.join(", "));
    let shares: Vec<String> = run.members.iter().map(|m| m.led.to_string()).collect();
    let worst = run
        .members
        .iter()
        .map(|m| m.worst_delay_ms)
        .fold(0.0, f64::max);
    let failed: f64 = run.members.iter().map(|m| m.renew_failures).sum();
    let p_ms = crate::P.as_secs_f64() * 1e3;
    vec![
        (
            format!("{} elections over 3 instances: shares", run.elections),
            format!("{fair} ± {SETTLED_WITHIN} each"),
            shares.join(", "),
            run.members
                .iter()
                .all(|m| m.led.abs_diff(fair) <= SETTLED_WITHIN),
        ),
        (
            "balance: every renewal on time".into(),
            format!("none failed, worst delay < P = {p_ms:.0} ms"),
            format!("{failed:.0} failed, worst {worst:.0} ms"),
            failed == 0.0 && worst < p_ms,
        ),
    ]
}
