//! The measurements. Each returns raw figures; bench.rs compares them with
//! their floors and targets and prints the report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::RngExt as _;

use crate::dynamo_local::free_port;
use crate::harness::{
    ADMIN_TOKEN, Env, Instance, JobLog, Watcher, children_of, cpu_seconds, http_get, mono_ns,
    ms_between, poll, set_sessions, sleep_until, smaps_kib, status_kib,
};
use crate::proxy::FaultProxy;
use crate::{D, L, M, P, R};

/// How long a stopped leaderd may take to exit (its child exits at once on
/// SIGTERM; the release is one write).
const EXIT_LIMIT: Duration = Duration::from_secs(40);

/// A short random tag that keeps names of this run apart from earlier runs
/// on the same emulator.
fn tag() -> String {
    format!("{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
}

/// One instance slot of a cluster: a proxy that stays, and the leaderd
/// process behind it, restarted (with a new identity) after each trial.
struct Slot {
    letter: char,
    proxy: Arc<FaultProxy>,
    config: PathBuf,
    instance: Option<Instance>,
    generation: u32,
}

/// Several leaderd instances campaigning for one election, each behind its
/// own counting proxy, all running job.py as their child.
struct Cluster<'a> {
    env: &'a Env,
    label: String,
    slots: Vec<Slot>,
    watcher: Watcher,
    job: JobLog,
}

impl<'a> Cluster<'a> {
    fn start(
        env: &'a Env,
        store: SocketAddr,
        label: &str,
        size: usize,
        mode: Mode,
    ) -> Result<Cluster<'a>, String> {
        let label = format!("{label}-{}{}", mode.tag(), tag());
        let election = label.clone();
        let mut slots = Vec::new();
        for letter in ('a'..='z').take(size) {
            let proxy = Arc::new(env.proxy(store));
            let advertise = match mode.hints {
                Hints::On => vec![],
                Hints::Off => vec![("advertise", format!("\"127.0.0.1:{}\"", free_port()?))],
            };
            let config = env.write_config(
                &format!("{label}-{letter}.toml"),
                &proxy.endpoint(),
                std::slice::from_ref(&election),
                &advertise,
            )?;
            set_sessions(&config, mode.sessions)?;
            slots.push(Slot {
                letter,
                proxy,
                config,
                instance: None,
                generation: 0,
            });
        }
        let watcher = Watcher::start(slots.iter().map(|s| s.proxy.clone()).collect());
        let job = JobLog::new(env.dir.join(format!("{label}.history")));
        let mut cluster = Cluster {
            env,
            label,
            slots,
            watcher,
            job,
        };
        for slot in 0..size {
            cluster.spawn(slot)?;
        }
        Ok(cluster)
    }

    /// (Re)starts the leaderd of `slot` under a new identity.
    fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let command = self.env.job_command(self.job.path());
        let s = &mut self.slots[slot];
        s.generation += 1;
        let identity = format!("{}-{}{}", self.label, s.letter, s.generation);
        let mut instance = Instance::start(self.env, &identity, &s.config, &command)?;
        instance.wait_http(Duration::from_secs(30))?;
        s.instance = Some(instance);
        Ok(())
    }

    /// The slot whose running leaderd has `identity`.
    fn slot_of(&self, identity: &str) -> Result<usize, String> {
        self.slots
            .iter()
            .position(|s| s.instance.as_ref().is_some_and(|i| i.identity == identity))
            .ok_or_else(|| format!("{}: no running leaderd is {identity}", self.label))
    }

    fn instance(&self, slot: usize) -> Result<&Instance, String> {
        self.slots[slot]
            .instance
            .as_ref()
            .ok_or_else(|| format!("slot {slot} has no running leaderd"))
    }

    /// Waits until exactly one instance answers 200 on `/leader` and its
    /// child has started; returns its slot.
    fn wait_leader(&mut self, limit: Duration) -> Result<usize, String> {
        let slots = &self.slots;
        let job = &mut self.job;
        poll(limit, Duration::from_millis(50), || {
            let leading: Vec<usize> = (0..slots.len())
                .filter(|&i| slots[i].instance.as_ref().is_some_and(Instance::is_leader))
                .collect();
            match leading[..] {
                [one] => {
                    let identity = &slots[one].instance.as_ref()?.identity;
                    job.last_start_by(identity).map(|_| one)
                }
                _ => None,
            }
        })
        .ok_or_else(|| {
            format!(
                "{}: no single leader with a running child within {limit:?}; logs in {}",
                self.label,
                self.env.dir.display()
            )
        })
    }

    /// Waits until every instance but `leader` has read the store since
    /// `since_ns` (the leader's takeover write; 0: any time) and the leader
    /// then renewed once more: a settled follower, which with hints watches
    /// the leader and has heard it, and without polls every P.
    fn wait_followers(&self, leader: usize, since_ns: u64) -> Result<(), String> {
        let mut latest = since_ns;
        for slot in (0..self.slots.len()).filter(|&s| s != leader) {
            let after = since_ns.max(self.instance(slot)?.spawned_ns);
            // With sessions a follower at rest reads once every two leases.
            let read = poll(
                L * 2 + Duration::from_secs(10),
                Duration::from_millis(20),
                || self.watcher.first(after, "GetItem", |s| s == slot),
            )
            .ok_or_else(|| format!("{}: slot {slot} does not read the store", self.label))?;
            latest = latest.max(read.at_ns);
        }
        poll(
            R + Duration::from_secs(5),
            Duration::from_millis(10),
            || self.watcher.first(latest, "PutItem", |s| s == leader),
        )
        .ok_or_else(|| format!("{}: the leader (slot {leader}) does not renew", self.label))?;
        // The renewal's event on its way to the followers.
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    }

    fn proxies(&self) -> impl Iterator<Item = &FaultProxy> {
        self.slots.iter().map(|s| s.proxy.as_ref())
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut instance) = slot.instance.take() {
                instance.stop(Duration::from_secs(10));
            }
        }
    }
}

/// Whether followers can hear the leader's hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Hints {
    /// Every instance advertises its own HTTP address (the default).
    On,
    /// Every instance advertises a loopback port nobody listens on: no hint
    /// ever flows and followers poll the store every P, as before hints.
    Off,
}

impl Hints {
    fn tag(self) -> &'static str {
        match self {
            Hints::On => "",
            Hints::Off => "nohints-",
        }
    }
}

/// How the instances of a failover or cost cluster run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Whether followers can hear the leader's hints.
    pub hints: Hints,
    /// Each instance holds its elections through its session (leaderd's
    /// default), or each election is its own lease (`sessions = false`).
    pub sessions: bool,
}

impl Mode {
    fn tag(self) -> String {
        format!(
            "{}{}",
            self.hints.tag(),
            if self.sessions { "" } else { "self-" }
        )
    }
}

/// Which way the leader goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// `kill -9` of leaderd.
    Crash,
    /// SIGTERM to leaderd: it stops its child, releases, exits.
    Graceful,
    /// `leaderd resign ELECTION --to FOLLOWER`: the leader stops its child,
    /// releases naming the follower, and follows.
    ResignTo,
}

/// One failover, all times in milliseconds from the signal.
#[derive(Debug, Clone)]
pub struct FailoverTrial {
    /// Signal → the new leader's child wrote its `start` line.
    pub total: f64,
    /// Signal → the new leader's takeover write reached its proxy.
    pub takeover: f64,
    /// Crash: how long after the old leader's last renewal the kill came.
    pub phase: Option<f64>,
    /// Crash: the earliest takeover the protocol allows after that
    /// renewal, L·(1+D) − phase.
    pub floor: Option<f64>,
    /// Graceful: signal → the old leader's release write.
    pub release: Option<f64>,
    /// Graceful and resign: signal → the old job's `end` line (its last).
    pub old_end: Option<f64>,
    /// Resign: whether the named follower is the one that took over.
    pub named_took_over: Option<bool>,
}

/// `trials` failovers in a cluster of `size` instances.
pub fn failover(
    env: &Env,
    store: SocketAddr,
    departure: Departure,
    mode: Mode,
    trials: usize,
    size: usize,
) -> Result<Vec<FailoverTrial>, String> {
    let label = match departure {
        Departure::Crash => "crash",
        Departure::Graceful => "graceful",
        Departure::ResignTo => "resign",
    };
    let mut cluster = Cluster::start(env, store, label, size, mode)?;
    let mut results = Vec::new();
    // The current leader's takeover write (0: the first leader's).
    let mut tenure_ns = 0;
    let mut attempts = 0;
    while results.len() < trials {
        attempts += 1;
        if attempts > trials * 2 + 5 {
            return Err(format!(
                "{label}: too many aborted trials; logs in {}",
                env.dir.display()
            ));
        }
        let leader = cluster.wait_leader(Duration::from_secs(60))?;
        cluster.wait_followers(leader, tenure_ns)?;
        let old_identity = cluster.instance(leader)?.identity.clone();
        let mut named = None;

        let (signalled, phase) = match departure {
            Departure::Crash => {
                // Kill at a random point of the renewal cycle, measured
                // from the renewal write seen by the leader's proxy.
                let from = mono_ns();
                let renewal = poll(R + Duration::from_secs(3), Duration::from_millis(1), || {
                    cluster.watcher.first(from, "PutItem", |s| s == leader)
                })
                .ok_or_else(|| format!("{label}: the leader (slot {leader}) does not renew"))?;
                let phase_ns = rand::rng().random_range(0..R.as_nanos() as u64);
                sleep_until(renewal.at_ns + phase_ns);
                let at = cluster.instance(leader)?.signal(Signal::SIGKILL);
                // The last write of the dead leader, now that it can send no
                // more: a renewal sent just before the kill may reach the
                // proxy (and the watcher) a moment after it.
                std::thread::sleep(Duration::from_millis(20));
                let last = cluster
                    .watcher
                    .last_between(renewal.at_ns - 1, u64::MAX, "PutItem", leader)
                    .map_or(renewal.at_ns, |e| e.at_ns);
                (at, Some(ms_between(last, at).max(0.0)))
            }
            Departure::Graceful => {
                // A random moment relative to the followers' polls.
                let pause = rand::rng().random_range(0..P.as_nanos() as u64);
                std::thread::sleep(Duration::from_nanos(pause));
                (cluster.instance(leader)?.signal(Signal::SIGTERM), None)
            }
            Departure::ResignTo => {
                let pause = rand::rng().random_range(0..P.as_nanos() as u64);
                std::thread::sleep(Duration::from_nanos(pause));
                let to = (leader + rand::rng().random_range(1..size)) % size;
                let to_identity = cluster.instance(to)?.identity.clone();
                let at = mono_ns();
                resign(
                    env,
                    cluster.instance(leader)?,
                    &cluster.label,
                    Some(&to_identity),
                )?;
                named = Some(to_identity);
                (at, None)
            }
        };

        let started = poll(Duration::from_secs(40), Duration::from_millis(5), || {
            cluster.job.start_after(signalled, Some(&old_identity))
        })
        .ok_or_else(|| format!("{label}: no new child started within 40 s of the signal"))?;
        // The new leader's last write before its child started: its take
        // of the election (with sessions, after ending the dead session
        // and opening its own). The watcher stamps a request within ~1 ms.
        let new_slot = cluster.slot_of(&started.identity)?;
        let takeover = cluster
            .watcher
            .last_between(signalled, started.at_ns + 2_000_000, "PutItem", new_slot)
            .ok_or_else(|| format!("{label}: a child started but no takeover write was seen"))?;
        // The old leader's release: its last write before the takeover
        // when each election is its own lease (a renewal may come between
        // the signal and the release); with sessions its first write after
        // the signal (its session's end, or a renewal, may follow the
        // release before the takeover).
        let release = match departure {
            Departure::Crash => None,
            Departure::Graceful | Departure::ResignTo if mode.sessions => cluster
                .watcher
                .first(signalled, "PutItem", |s| s == leader)
                .filter(|e| e.at_ns <= takeover.at_ns)
                .map(|e| ms_between(signalled, e.at_ns)),
            Departure::Graceful | Departure::ResignTo => cluster
                .watcher
                .last_between(signalled, takeover.at_ns, "PutItem", leader)
                .map(|e| ms_between(signalled, e.at_ns)),
        };
        let floor = phase.map(|phase| L.as_secs_f64() * 1e3 * (1.0 + D) - phase);
        let old_end = match departure {
            Departure::Crash => None,
            Departure::Graceful | Departure::ResignTo => cluster
                .job
                .end_after(signalled, &old_identity)
                .map(|e| ms_between(signalled, e.at_ns)),
        };
        let trial = FailoverTrial {
            total: ms_between(signalled, started.at_ns),
            takeover: ms_between(signalled, takeover.at_ns),
            phase,
            floor,
            release,
            old_end,
            named_took_over: named.as_ref().map(|n| *n == started.identity),
        };
        tenure_ns = takeover.at_ns;
        eprintln!(
            "  {label} trial {}: {:.3} s (takeover write {:.3} s{})",
            results.len() + 1,
            trial.total / 1e3,
            trial.takeover / 1e3,
            match (trial.phase, trial.floor, trial.release) {
                (Some(p), Some(f), _) => format!(
                    ", killed {:.3} s after a renewal, floor {:.3} s",
                    p / 1e3,
                    f / 1e3
                ),
                (_, _, Some(r)) => format!(", release write {:.3} s", r / 1e3),
                _ => String::new(),
            }
        );
        if trial.named_took_over == Some(false) {
            eprintln!(
                "  {label}: {} took over, not the named {named:?}",
                started.identity
            );
        }
        results.push(trial);

        // The old leaderd: reap it (crash) or wait for its exit (graceful),
        // then bring the slot back as a follower.
        let old = cluster.slots[leader]
            .instance
            .as_mut()
            .ok_or_else(|| format!("slot {leader} vanished"))?;
        match departure {
            // The old leader follows: nothing to bring back.
            Departure::ResignTo => continue,
            Departure::Crash => old.kill9(),
            Departure::Graceful => {
                if old.wait_exit(EXIT_LIMIT).is_none() {
                    return Err(format!(
                        "{label}: leaderd did not exit within {EXIT_LIMIT:?} of SIGTERM; see {}",
                        old.log_path().display()
                    ));
                }
            }
        }
        cluster.spawn(leader)?;
    }
    Ok(results)
}

/// Store requests of one instance at rest.
#[derive(Debug, Clone)]
pub struct RestCost {
    /// Whether it led throughout.
    pub leader: bool,
    /// Requests per minute, by operation.
    pub per_minute: BTreeMap<String, f64>,
}

/// Counts each instance's store requests over `window` while nothing
/// changes (one leader, the rest following).
pub fn cost_at_rest(
    env: &Env,
    store: SocketAddr,
    window: Duration,
    size: usize,
    mode: Mode,
) -> Result<Vec<RestCost>, String> {
    let mut cluster = Cluster::start(env, store, "rest", size, mode)?;
    let leader = cluster.wait_leader(Duration::from_secs(60))?;
    cluster.wait_followers(leader, 0)?;
    // Let the first poll cycles pass.
    std::thread::sleep(Duration::from_secs(3));
    for proxy in cluster.proxies() {
        proxy.clear_counts();
    }
    let t0 = mono_ns();
    std::thread::sleep(window);
    let counts: Vec<BTreeMap<String, u64>> = cluster.proxies().map(FaultProxy::counts).collect();
    let minutes = ms_between(t0, mono_ns()) / 60e3;
    // The window only counts if the leadership never moved.
    let still = cluster.wait_leader(Duration::from_secs(5))?;
    let identity = cluster.instance(leader)?.identity.clone();
    if still != leader || cluster.job.start_after(t0, None).is_some() {
        return Err(format!(
            "rest: the leadership moved during the window (was {identity})"
        ));
    }
    Ok(counts
        .into_iter()
        .enumerate()
        .map(|(slot, counts)| RestCost {
            leader: slot == leader,
            per_minute: counts
                .into_iter()
                .map(|(op, n)| (op, n as f64 / minutes))
                .collect(),
        })
        .collect())
}

/// One leaderd with many elections.
#[derive(Debug, Clone)]
pub struct Footprint {
    /// How many elections.
    pub elections: usize,
    /// Spawn → every election led.
    pub lead_all_ms: f64,
    /// leaderd's peak RSS (VmHWM) at the end, KiB.
    pub hwm_kib: u64,
    /// leaderd's RSS at the end, KiB: total, anonymous (heap, stacks),
    /// file-backed (the mapped binary and libraries).
    pub rss_kib: (u64, u64, u64),
    /// Proportional set size at the end, KiB: leaderd, and its helpers
    /// together (the guard is the same binary, so they share its pages).
    pub pss_kib: (u64, u64),
    /// leaderd's threads and open sockets at the end.
    pub threads_fds: (u64, usize),
    /// leaderd's CPU seconds per minute over the quiet window.
    pub cpu_per_min: f64,
    /// Helper processes leaderd started (not the child): (name, peak RSS
    /// KiB, CPU seconds per minute).
    pub helpers: Vec<(String, u64, f64)>,
    /// Store requests per minute over the quiet window, by operation.
    pub requests_per_min: BTreeMap<String, f64>,
    /// Successful renewals in the quiet window, and how many R-spaced
    /// renewals the window had room for.
    pub renewals: (f64, f64),
    /// Renewals that did not succeed (`lost`, `timeout`, ...), whole run.
    pub renew_failures: f64,
    /// Those failures by result label (`timeout: 40`, ...).
    pub renew_failure_kinds: Vec<String>,
    /// Slowest renew request, as the upper bound of its histogram bucket (s).
    pub slowest_renew_bucket: Option<f64>,
    /// Worst renewal delay seen by sampling `/status` (ms), how many samples.
    pub worst_delay_ms: f64,
    /// `/status` samples taken, and (election, sample) pairs not leading.
    pub samples: (usize, usize),
    /// Sampling interval (ms).
    pub sample_every_ms: f64,
}

/// Measures one leaderd with `n` elections (child: `sleep`).
pub fn footprint(
    env: &Env,
    store: SocketAddr,
    n: usize,
    window: Duration,
    sample_for: Duration,
    clock_ticks: f64,
) -> Result<Footprint, String> {
    let label = format!("fp{n}-{}", tag());
    let elections: Vec<String> = (0..n).map(|i| format!("{label}-{i:04}")).collect();
    // Straight to the emulator, no proxy: with hundreds of pooled
    // connections a proxy that forwards on an upstream connection the
    // emulator has closed as idle resets the client, a failure real
    // DynamoDB traffic would not see at that rate. Requests are counted by
    // leaderd's own histogram instead.
    let config = env.write_config(
        &format!("{label}.toml"),
        &format!("http://{store}"),
        &elections,
        &[],
    )?;
    let command: Vec<String> = vec!["sleep".into(), "86400".into()];
    let mut instance = Instance::start(env, &label, &config, &command)?;
    instance.wait_http(Duration::from_secs(30))?;
    let pid = instance.pid();

    let all_leading = |body: &str| -> Option<Vec<(bool, u64)>> {
        let json: serde_json::Value = serde_json::from_str(body).ok()?;
        let map = json.get("elections")?.as_object()?;
        Some(
            map.values()
                .map(|e| {
                    (
                        e.get("is_leader")
                            .and_then(serde_json::Value::as_bool)
                            .unwrap_or(false),
                        e.get("lease_remaining_ms")
                            .and_then(serde_json::Value::as_u64)
                            .unwrap_or(0),
                    )
                })
                .collect(),
        )
    };
    let lead_limit = Duration::from_secs(60) + Duration::from_millis(100 * n as u64);
    poll(lead_limit, Duration::from_millis(200), || {
        let (_, body) = instance.get("/status")?;
        let states = all_leading(&body)?;
        (states.len() == n && states.iter().all(|(leading, _)| *leading)).then_some(())
    })
    .ok_or_else(|| {
        format!(
            "{label}: not every election led within {lead_limit:?}; see {}",
            instance.log_path().display()
        )
    })?;
    let lead_all_ms = ms_between(instance.spawned_ns, mono_ns());
    std::thread::sleep(Duration::from_secs(5));

    // Quiet window: no HTTP traffic, only the renewals.
    let helpers: Vec<(i32, String)> = children_of(pid)
        .into_iter()
        .filter(|(_, name)| name != "sleep")
        .collect();
    let (renew_ok_before, requests_before) = renew_ok_total(instance.port)?;
    let t_metrics0 = mono_ns();
    let cpu0 = cpu_seconds(pid, clock_ticks).ok_or("cannot read leaderd's /proc stat")?;
    let helper_cpu0: Vec<f64> = helpers
        .iter()
        .map(|(p, _)| cpu_seconds(*p, clock_ticks).unwrap_or(0.0))
        .collect();
    let t0 = mono_ns();
    std::thread::sleep(window);
    let cpu1 = cpu_seconds(pid, clock_ticks).ok_or("leaderd exited during the window")?;
    let helper_cpu1: Vec<f64> = helpers
        .iter()
        .map(|(p, _)| cpu_seconds(*p, clock_ticks).unwrap_or(0.0))
        .collect();
    let t1 = mono_ns();
    let (renew_ok_after, requests_after) = renew_ok_total(instance.port)?;
    let counts: BTreeMap<String, f64> = requests_after
        .into_iter()
        .map(|(op, n)| {
            let before = requests_before.get(&op).copied().unwrap_or(0.0);
            (op, n - before)
        })
        .collect();
    let t_metrics1 = mono_ns();
    let minutes = ms_between(t0, t1) / 60e3;

    // Sampling window: how close to its end each lease got.
    let every = Duration::from_millis(100);
    let mut min_remaining = u64::MAX;
    let mut samples = 0;
    let mut not_leading = 0;
    let until = mono_ns() + sample_for.as_nanos() as u64;
    while mono_ns() < until {
        let next = mono_ns() + every.as_nanos() as u64;
        if let Some(states) = instance
            .get("/status")
            .and_then(|(_, body)| all_leading(&body))
        {
            samples += 1;
            for (leading, remaining) in states {
                if leading {
                    min_remaining = min_remaining.min(remaining);
                } else {
                    not_leading += 1;
                }
            }
        }
        sleep_until(next);
    }
    // Just before a renewal is due the lease has L·(1−D) − M − R left; how
    // much less than that was ever seen is how late a renewal completed.
    let due_remaining_ms =
        L.as_secs_f64() * 1e3 * (1.0 - D) - M.as_secs_f64() * 1e3 - R.as_secs_f64() * 1e3;
    let worst_delay_ms = (due_remaining_ms - min_remaining as f64).max(0.0);

    let metrics = instance
        .get("/metrics")
        .map(|(_, body)| body)
        .ok_or("leaderd does not answer /metrics")?;
    let renew_failure_kinds = ["lost", "throttled", "timeout", "error"]
        .iter()
        .filter_map(|result| {
            let label = format!("result=\"{result}\"");
            let n = metric_sum(&metrics, "leaderd_renew_total", |labels| {
                labels.contains(&label)
            });
            (n > 0.0).then(|| format!("{result}: {n}"))
        })
        .collect();
    let renew_failures = metric_sum(&metrics, "leaderd_renew_total", |labels| {
        !labels.contains("result=\"ok\"")
    });
    let slowest_renew_bucket = slowest_bucket(&metrics, "renew");
    let hwm_kib = status_kib(pid, "VmHWM").ok_or("cannot read leaderd's VmHWM")?;
    let rss_kib = (
        status_kib(pid, "VmRSS").ok_or("cannot read leaderd's VmRSS")?,
        status_kib(pid, "RssAnon").unwrap_or(0),
        status_kib(pid, "RssFile").unwrap_or(0),
    );
    let pss_kib = (
        smaps_kib(pid, "Pss").unwrap_or(0),
        helpers
            .iter()
            .map(|(p, _)| smaps_kib(*p, "Pss").unwrap_or(0))
            .sum(),
    );
    let threads_fds = (
        status_kib(pid, "Threads").unwrap_or(0),
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
            fds.flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
                })
                .count()
        }),
    );
    let helpers = helpers
        .iter()
        .zip(helper_cpu0.iter().zip(&helper_cpu1))
        .map(|((p, name), (c0, c1))| {
            (
                name.clone(),
                status_kib(*p, "VmHWM").unwrap_or(0),
                (c1 - c0) / minutes,
            )
        })
        .collect();
    let renewal_room = n as f64 * ms_between(t_metrics0, t_metrics1) / (R.as_secs_f64() * 1e3);
    instance.stop(Duration::from_secs(60));
    Ok(Footprint {
        elections: n,
        lead_all_ms,
        hwm_kib,
        rss_kib,
        pss_kib,
        threads_fds,
        cpu_per_min: (cpu1 - cpu0) / minutes,
        helpers,
        requests_per_min: counts
            .into_iter()
            .map(|(op, c)| (op, c / minutes))
            .collect(),
        renewals: (renew_ok_after - renew_ok_before, renewal_room),
        renew_failures,
        renew_failure_kinds,
        slowest_renew_bucket,
        worst_delay_ms,
        samples: (samples, not_leading),
        sample_every_ms: every.as_secs_f64() * 1e3,
    })
}

/// Successful renewals, and store requests by engine operation (`renew`,
/// `read`, ...), summed over every election.
fn renew_ok_total(port: u16) -> Result<(f64, BTreeMap<String, f64>), String> {
    let (_, body) = http_get(port, "/metrics").ok_or("leaderd does not answer /metrics")?;
    let ok = metric_sum(&body, "leaderd_renew_total", |labels| {
        labels.contains("result=\"ok\"")
    });
    let mut by_op: BTreeMap<String, f64> = BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("leaderd_store_request_duration_seconds_count{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let op = labels
            .split(',')
            .find_map(|pair| pair.strip_prefix("op=\"")?.strip_suffix('"'));
        if let (Some(op), Ok(n)) = (op, value.trim().parse::<f64>()) {
            *by_op.entry(op.to_owned()).or_default() += n;
        }
    }
    Ok((ok, by_op))
}

/// Sum of the samples of `name` whose label set passes `filter`.
pub fn metric_sum(text: &str, name: &str, filter: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            filter(labels)
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The smallest histogram bound that holds every `op` request of every
/// election: an upper bound on the slowest one.
fn slowest_bucket(text: &str, op: &str) -> Option<f64> {
    let op_label = format!("op=\"{op}\"");
    // election labels → [(le, cumulative count)]
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("leaderd_store_request_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        if !labels.contains(&op_label) {
            continue;
        }
        let mut le = None;
        let mut others = Vec::new();
        for pair in labels.split(',') {
            match pair.strip_prefix("le=\"").and_then(|v| v.strip_suffix('"')) {
                Some("+Inf") => le = Some(f64::INFINITY),
                Some(v) => le = v.parse().ok(),
                None => others.push(pair),
            }
        }
        let (Some(le), Ok(count)) = (le, value.trim().parse::<f64>()) else {
            continue;
        };
        buckets
            .entry(others.join(","))
            .or_default()
            .push((le, count));
    }
    buckets
        .into_values()
        .filter_map(|mut series| {
            series.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total = series.last()?.1;
            if total == 0.0 {
                return None;
            }
            series
                .iter()
                .find(|(_, count)| *count >= total)
                .map(|(le, _)| *le)
        })
        .reduce(f64::max)
}

/// Spawn → leading on an empty store, split at the store requests.
#[derive(Debug, Clone)]
pub struct Startup {
    /// Spawn → first store request reached the proxy.
    pub first_request: f64,
    /// Spawn → the create write reached the proxy.
    pub create: f64,
    /// Spawn → `/leader` answered 200 (polled every 5 ms).
    pub leading: f64,
    /// Spawn → the child's `start` line.
    pub child: f64,
    /// Store requests before leading, by operation.
    pub ops: BTreeMap<String, usize>,
}

/// `trials` starts of one leaderd for an election that has no item yet.
pub fn startup(env: &Env, store: SocketAddr, trials: usize) -> Result<Vec<Startup>, String> {
    let label = format!("start-{}", tag());
    let proxy = Arc::new(env.proxy(store));
    let watcher = Watcher::start(vec![proxy.clone()]);
    let mut job = JobLog::new(env.dir.join(format!("{label}.history")));
    let mut results = Vec::new();
    for trial in 0..trials {
        let election = format!("{label}-{trial}");
        let config = env.write_config(
            &format!("{election}.toml"),
            &proxy.endpoint(),
            std::slice::from_ref(&election),
            &[],
        )?;
        let mut instance = Instance::start(env, &election, &config, &env.job_command(job.path()))?;
        let spawned = instance.spawned_ns;
        let leading = poll(Duration::from_secs(30), Duration::from_millis(5), || {
            instance.is_leader().then(mono_ns)
        })
        .ok_or_else(|| {
            format!(
                "{election}: not leading within 30 s; see {}",
                instance.log_path().display()
            )
        })?;
        let child = poll(Duration::from_secs(10), Duration::from_millis(5), || {
            job.start_after(spawned, None)
        })
        .ok_or_else(|| format!("{election}: leading but no child within 10 s"))?;
        let before_leading = watcher.between(spawned, leading);
        let first = before_leading
            .first()
            .ok_or_else(|| format!("{election}: leading without a store request"))?;
        let create = before_leading
            .iter()
            .find(|e| e.op == "PutItem")
            .ok_or_else(|| format!("{election}: leading without a create write"))?;
        let mut ops: BTreeMap<String, usize> = BTreeMap::new();
        for event in &before_leading {
            *ops.entry(event.op.clone()).or_default() += 1;
        }
        let result = Startup {
            first_request: ms_between(spawned, first.at_ns),
            create: ms_between(spawned, create.at_ns),
            leading: ms_between(spawned, leading),
            child: ms_between(spawned, child.at_ns),
            ops,
        };
        eprintln!(
            "  startup trial {}: leading {:.3} s, child {:.3} s",
            trial + 1,
            result.leading / 1e3,
            result.child / 1e3
        );
        results.push(result);
        instance.stop(EXIT_LIMIT);
    }
    Ok(results)
}

/// `leaderd resign ELECTION [--to IDENTITY]` against `leader`: the command
/// line an operator uses, waited for to its end.
pub fn resign(
    env: &Env,
    leader: &Instance,
    election: &str,
    to: Option<&str>,
) -> Result<(), String> {
    let mut cmd = std::process::Command::new(&env.bin);
    cmd.args(["resign", election]);
    if let Some(to) = to {
        cmd.args(["--to", to]);
    }
    let out = cmd
        .arg("--url")
        .arg(format!("http://127.0.0.1:{}", leader.port))
        .env("LEADERD_HTTP__ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .map_err(|e| format!("cannot run leaderd resign: {e}"))?;
    if !out.status.success() {
        let to = to.map_or(String::new(), |to| format!(" --to {to}"));
        return Err(format!(
            "leaderd resign {election}{to} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}
