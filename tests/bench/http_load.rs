//! Read-only HTTP load on a leader of many elections: one leaderd instance
//! (default timing, sessions on) leads N elections, then clients loop on
//! `/status`, `/metrics` and `/leader` for a window. Measured: whether any
//! tenure was lost, how close the session's validity came to running out
//! (every `/status` answer shows it), how fast `/leader` answered (each on
//! a new connection, as a readiness probe asks, with a 1 s timeout), the
//! answers and bytes served, and leaderd's CPU over the window.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{Env, Instance, cpu_seconds, http_get, mono_ns, ms_between, poll};
use crate::scenarios::metric_sum;
use crate::stats::Summary;
use crate::{D, L, M, R};

/// The store under the instance.
#[derive(Debug, Clone, Copy)]
pub enum Store {
    /// A SQLite file in the working directory.
    Sqlite,
    /// The benchmark's DynamoDB Local.
    DynamoLocal(SocketAddr),
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "SQLite",
            Store::DynamoLocal(_) => "DynamoDB Local",
        }
    }
}

/// What one kind of request got over the window.
#[derive(Debug, Default, Clone)]
pub struct Served {
    /// Complete answers.
    pub answers: u64,
    /// Their bodies, bytes.
    pub bytes: u64,
    /// Requests that got no complete answer (refused, timed out, cut).
    pub failures: u64,
}

/// One run.
#[derive(Debug, Clone)]
pub struct HttpLoadRun {
    /// The store's name.
    pub store: &'static str,
    /// N.
    pub elections: usize,
    /// Clients looping.
    pub clients: usize,
    /// The window.
    pub window: Duration,
    /// Seconds from start to leading all N.
    pub lead_all_s: f64,
    /// `/status`, `/metrics`, `/leader`.
    pub served: [Served; 3],
    /// `/leader` latencies, ms, answered or not (a failure counts as 1 s).
    pub leader_ms: Vec<f64>,
    /// `/leader` answered 200 within 1 s.
    pub leader_within_1s: u64,
    /// The least `session.valid_for_ms` any `/status` answer showed.
    pub least_session_valid_ms: Option<u64>,
    /// Elections led at the end.
    pub led_at_end: usize,
    /// "lease lost" lines in the log over the whole run.
    pub lost_lines: usize,
    /// Renewals that did not succeed, whole run (`leaderd_renew_total`).
    pub renew_failures: f64,
    /// leaderd's CPU seconds per minute over the window.
    pub cpu_per_min: f64,
    /// The largest `/metrics` and `/status` answers, bytes.
    pub largest: (u64, u64),
    /// Renewals timed by `leaderd_renew_lag_seconds` over the whole run,
    /// and the smallest bucket bound (s) that holds them all.
    pub renew_lag: (f64, Option<f64>),
}

const PATHS: [&str; 3] = ["/status", "/metrics", "/leader"];

/// Runs one instance leading `n` elections on `store` and loads it with
/// `clients` looping clients for `window`.
pub fn measure(
    env: &Env,
    store: Store,
    n: usize,
    clients: usize,
    window: Duration,
    clock_ticks: f64,
) -> Result<HttpLoadRun, String> {
    let names: Vec<String> = (0..n).map(|i| format!("load-{i:05}")).collect();
    let config = write_config(env, store, &names)?;
    let started = mono_ns();
    let mut instance = Instance::start(env, "loaded", &config, &[])?;
    instance.wait_http(Duration::from_secs(60))?;
    poll(Duration::from_secs(600), Duration::from_secs(1), || {
        (led(&instance) == n).then_some(())
    })
    .ok_or_else(|| {
        format!(
            "{} did not lead all {n} elections within 600 s",
            store.name()
        )
    })?;
    let lead_all_s = ms_between(started, mono_ns()) / 1e3;
    // Let the first renewals of every election pass before loading.
    std::thread::sleep(R);

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let port = instance.port;
    let cpu_before = cpu_seconds(instance.pid(), clock_ticks);
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (stop, tally) = (stop.clone(), tally.clone());
            std::thread::spawn(move || client(port, i % PATHS.len(), &stop, &tally))
        })
        .collect();
    std::thread::sleep(window);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let cpu_after = cpu_seconds(instance.pid(), clock_ticks);
    let cpu_per_min = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => (b - a) * 60.0 / window.as_secs_f64(),
        _ => f64::NAN,
    };

    let led_at_end = led(&instance);
    let metrics = http_get(port, "/metrics").map_or(String::new(), |(_, b)| b);
    let renew_failures = metric_sum(&metrics, "leaderd_renew_total", |l| {
        !l.contains("result=\"ok\"")
    });
    let renew_lag = renew_lag(&metrics);
    let log = std::fs::read_to_string(instance.log_path()).unwrap_or_default();
    let lost_lines = log.lines().filter(|l| l.contains("lease lost")).count();
    instance.stop(Duration::from_secs(60));
    let tally = std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(HttpLoadRun {
        store: store.name(),
        elections: n,
        clients,
        window,
        lead_all_s,
        served: tally.served,
        leader_ms: tally.leader_ms,
        leader_within_1s: tally.leader_within_1s,
        least_session_valid_ms: tally.least_session_valid_ms,
        led_at_end,
        lost_lines,
        renew_failures,
        cpu_per_min,
        largest: tally.largest,
        renew_lag,
    })
}

/// From `leaderd_renew_lag_seconds`: how many renewals, and the smallest
/// bucket bound that holds every one of them.
fn renew_lag(metrics: &str) -> (f64, Option<f64>) {
    let total = metric_sum(metrics, "leaderd_renew_lag_seconds_count", |_| true)
        + metrics
            .lines()
            .find_map(|l| l.strip_prefix("leaderd_renew_lag_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    let mut bounds: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("leaderd_renew_lag_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.parse().ok()?, count.trim().parse().ok()?))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let all_within = bounds
        .iter()
        .find(|(_, count)| *count >= total && total > 0.0)
        .map(|(le, _)| *le);
    (total, all_within)
}

/// The instance's config: `names` on `store`, default timing, sessions on.
fn write_config(env: &Env, store: Store, names: &[String]) -> Result<std::path::PathBuf, String> {
    let mut toml = match store {
        Store::Sqlite => format!(
            "[store]\nkind = \"sqlite\"\npath = {:?}\n",
            env.dir.join("http-load.db").display().to_string()
        ),
        Store::DynamoLocal(addr) => format!(
            "[store]\nkind = \"dynamodb\"\ntable = \"{}\"\nregion = \"us-east-1\"\nendpoint_url = \"http://{addr}\"\n",
            env.table
        ),
    };
    toml.push_str("\n[log]\nlevel = \"info\"\n");
    for name in names {
        toml.push_str(&format!("\n[[elections]]\nname = \"{name}\"\n"));
    }
    let path = env
        .dir
        .join(format!("http-load-{}.toml", store.name().replace(' ', "-")));
    std::fs::write(&path, toml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

fn led(instance: &Instance) -> usize {
    instance
        .get("/status")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .and_then(|json| {
            Some(
                json.get("elections")?
                    .as_object()?
                    .values()
                    .filter(|e| e["is_leader"] == true)
                    .count(),
            )
        })
        .unwrap_or(0)
}

#[derive(Debug, Default)]
struct Tally {
    served: [Served; 3],
    leader_ms: Vec<f64>,
    leader_within_1s: u64,
    least_session_valid_ms: Option<u64>,
    largest: (u64, u64),
}

/// One client: loops on `PATHS[which]` until `stop`.
fn client(port: u16, which: usize, stop: &AtomicBool, tally: &Mutex<Tally>) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        // `/leader` as a probe asks: a new connection each time, 1 s.
        let fresh = which == 2 || conn.is_none();
        if fresh {
            conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok();
        }
        let Some(c) = conn.as_mut() else {
            record(tally, which, start.elapsed(), None);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let timeout = if which == 2 { 1 } else { 30 };
        let _ = c.set_read_timeout(Some(Duration::from_secs(timeout)));
        let answer = get(c, PATHS[which]);
        if answer.is_none() {
            conn = None;
        }
        record(tally, which, start.elapsed(), answer);
    }
}

fn record(tally: &Mutex<Tally>, which: usize, took: Duration, answer: Option<(u16, Vec<u8>)>) {
    let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
    let served = &mut t.served[which];
    match &answer {
        Some((_, body)) => {
            served.answers += 1;
            served.bytes += body.len() as u64;
        }
        None => served.failures += 1,
    }
    match (which, answer) {
        (0, Some((_, body))) => {
            t.largest.1 = t.largest.1.max(body.len() as u64);
            if let Some(v) = session_valid_ms(&body) {
                t.least_session_valid_ms = Some(t.least_session_valid_ms.map_or(v, |l| l.min(v)));
            }
        }
        (1, Some((_, body))) => t.largest.0 = t.largest.0.max(body.len() as u64),
        (2, answer) => {
            let ok = matches!(answer, Some((200, _))) && took < Duration::from_secs(1);
            t.leader_within_1s += u64::from(ok);
            t.leader_ms.push(took.as_secs_f64().min(1.0) * 1e3);
        }
        _ => {}
    }
}

/// `"valid_for_ms":N` of `/status`'s session object.
fn session_valid_ms(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body.get(..body.len().min(4096))?).ok()?;
    let at = text.find("\"valid_for_ms\":")? + "\"valid_for_ms\":".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// One GET on a kept-alive connection: (status, body), or `None`.
fn get(conn: &mut TcpStream, path: &str) -> Option<(u16, Vec<u8>)> {
    write!(conn, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = Vec::with_capacity(512);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 || head.len() > 64 * 1024 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    Some((status, body))
}

/// The report's section; the acceptance lines (figure, target, measured,
/// pass).
pub fn report(out: &mut String, runs: &[HttpLoadRun]) -> Vec<(String, String, String, bool)> {
    use std::fmt::Write as _;
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let validity = L.mul_f64(1.0 - D) - M;
    let _ = writeln!(
        out,
        "One instance leads {} elections (L = {} s, R = {} s, sessions on); {} clients loop for {} s, \
         a third each on `/status`, `/metrics` (kept-alive connections) and `/leader` (a new \
         connection per request, 1 s timeout, as a readiness probe). The session's validity runs \
         {:.1} s from each renewal's send; every `/status` answer shows what is left of it, so its \
         least value over the window shows how late a renewal came (R = {} s of it are used up \
         before each renewal is due).\n",
        first.elections,
        L.as_secs(),
        R.as_secs(),
        first.clients,
        first.window.as_secs(),
        validity.as_secs_f64(),
        R.as_secs(),
    );
    let _ = writeln!(
        out,
        "| store | led all after (s) | `/status` answers (MB) | `/metrics` answers (MB) | largest `/status`, `/metrics` (KB) | `/leader`: within 1 s | `/leader` ms: median, p95, max | least session validity left (ms) | renewals: all sent within (s of their due) | tenures lost | renew failures | led at end | CPU s/min |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    for run in runs {
        let probes = run.served[2].answers + run.served[2].failures;
        let s = Summary::of(&run.leader_ms).unwrap_or(Summary {
            n: 0,
            min: f64::NAN,
            median: f64::NAN,
            p95: f64::NAN,
            max: f64::NAN,
        });
        let _ = writeln!(
            out,
            "| {} | {:.1} | {} ({}) | {} ({}) | {}, {} | {} of {} | {:.1}, {:.1}, {:.1} | {} | {}: {} | {} | {} | {} of {} | {:.1} |",
            run.store,
            run.lead_all_s,
            run.served[0].answers,
            run.served[0].bytes / 1_000_000,
            run.served[1].answers,
            run.served[1].bytes / 1_000_000,
            run.largest.1 / 1_000,
            run.largest.0 / 1_000,
            run.leader_within_1s,
            probes,
            s.median,
            s.p95,
            s.max,
            run.least_session_valid_ms
                .map_or("no answer".to_owned(), |v| v.to_string()),
            run.renew_lag.0,
            run.renew_lag
                .1
                .map_or("?".to_owned(), |le| format!("≤ {le}")),
            run.lost_lines,
            run.renew_failures,
            run.led_at_end,
            run.elections,
            run.cpu_per_min,
        );
        let store = run.store;
        verdicts.push((
            format!("HTTP load, {store}: tenures lost"),
            "0".to_owned(),
            format!(
                "{} (led {} of {} at the end)",
                run.lost_lines, run.led_at_end, run.elections
            ),
            run.lost_lines == 0 && run.led_at_end == run.elections,
        ));
        // On time: the least validity left stayed above what is left when a
        // renewal due at R comes a retry late.
        let floor = validity.saturating_sub(R + crate::P).as_millis() as u64;
        verdicts.push((
            format!("HTTP load, {store}: every renewal on time"),
            format!("session validity left ≥ {floor} ms throughout"),
            run.least_session_valid_ms
                .map_or("no answer".to_owned(), |v| format!("{v} ms")),
            run.least_session_valid_ms.is_some_and(|v| v >= floor) && run.renew_failures == 0.0,
        ));
        verdicts.push((
            format!("HTTP load, {store}: renewals sent late (leaderd_renew_lag_seconds)"),
            "every one within 1 s of its due".to_owned(),
            run.renew_lag.1.map_or_else(
                || format!("{} renewals, not all within 10 s", run.renew_lag.0),
                |le| format!("{} renewals, all within {le} s", run.renew_lag.0),
            ),
            run.renew_lag.0 > 0.0 && run.renew_lag.1.is_some_and(|le| le <= 1.0),
        ));
        let within = if probes == 0 {
            0.0
        } else {
            run.leader_within_1s as f64 / probes as f64
        };
        verdicts.push((
            format!("HTTP load, {store}: `/leader` within 1 s"),
            "≥ 49 in 50 (98 %)".to_owned(),
            format!("{:.2} % of {probes}", within * 100.0),
            probes > 0 && within >= 0.98,
        ));
        verdicts.push((
            format!("HTTP load, {store}: one `/metrics` answer"),
            "≤ 1 MB".to_owned(),
            format!("{} KB", run.largest.0 / 1_000),
            run.largest.0 <= 1_000_000,
        ));
    }
    let _ = writeln!(out);
    verdicts
}
