//! The leaderd benchmark: failover time, store cost at rest, footprint,
//! start-up time and binary size, each printed next to its floor and its
//! target. docs/benchmarks.md publishes a run of it.
//!
//! ```text
//! cargo build --release
//! cargo run --release --example bench -- [--store dynamodb|postgres] [--quick] [--trials N] [--only crash,graceful,preempt,resign,cost,footprint,requests,startup,size,balance,takeover-all,http-load] [--http-load-elections N] [--hints on,off] [--sessions off,on] [--elections 1,100,1000 (the footprint's sizes; balance's, default 1000)]
//! ```
//!
//! It runs the release `leaderd` binary (target/release/leaderd, or under
//! CARGO_TARGET_DIR) against a DynamoDB Local it starts itself (`--store
//! postgres`: a PostgreSQL server it starts itself, tests/common/postgres.rs,
//! reached without TLS so that the proxies can read the statements), each instance
//! behind its own counting proxy (tests/common/proxy.rs), with
//! tests/common/job.py as the child: the child writes a CLOCK_MONOTONIC
//! timestamp when it starts, the same clock the benchmark reads when it sends
//! a signal. The report (Markdown) goes to stdout, progress to stderr.

mod balance;
mod dynamo_local;
#[allow(dead_code)] // the benchmark starts no emulator of these; postgres.rs uses its helpers
#[path = "../common/emulators.rs"]
mod emulators;
mod harness;
mod http_load;
#[allow(dead_code)] // the benchmark starts the server, no fault of it
#[path = "../common/postgres.rs"]
mod postgres;
mod preempt;
#[path = "../common/procfs.rs"]
mod procfs;
#[allow(dead_code)] // the benchmark uses the proxy's request counts only
#[path = "../common/proxy.rs"]
mod proxy;
mod request_cost;
mod scenarios;
mod stats;
mod store_pace;
mod warm_up;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::{Parser, ValueEnum};

use harness::{Env, Store};
use scenarios::{Departure, FailoverTrial, Footprint, Hints, Mode, RestCost, Startup};
use stats::{HEADER_S, Summary};

/// The allocator leaderd uses (src/main.rs), so that the request-cost
/// scenario, which runs leaderd's store in this process, costs what it costs
/// inside leaderd.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// L: lease duration.
pub const L: Duration = Duration::from_secs(10);
/// R: renew interval (the default, L/2).
pub const R: Duration = Duration::from_secs(5);
/// P: follower poll and renew retry interval.
pub const P: Duration = Duration::from_secs(1);
/// D: tolerated clock drift (the default).
pub const D: f64 = 0.01;
/// M: safety margin (the default).
pub const M: Duration = Duration::from_millis(200);

/// Instances per failover cluster: the leader and two followers.
const CLUSTER: usize = 3;

/// Acceptance targets of issue 7.
const CRASH_MAX_TARGET_S: f64 = 11.5;
const GRACEFUL_MEDIAN_TARGET_S: f64 = 1.2;
/// Targets with the leader's hints: old job's end → new job's start.
const HANDOVER_MEDIAN_TARGET_MS: f64 = 100.0;
const HANDOVER_P95_TARGET_MS: f64 = 250.0;
/// `resign --to`: old job's end → the named candidate's job start, every trial.
const RESIGN_TO_TARGET_MS: f64 = 250.0;
/// Store reads of a follower at rest, per minute, with hints flowing.
const FOLLOWER_READS_TARGET: f64 = 6.0;
const RSS_ONE_TARGET_MIB: f64 = 15.0;
const RSS_THOUSAND_TARGET_MIB: f64 = 64.0;
const CPU_THOUSAND_TARGET: f64 = 3.0;
/// The stripped release binary, at most (with both remote stores).
const BINARY_TARGET_MIB: f64 = 13.0;

#[derive(Debug, Parser)]
#[command(about = "Measure leaderd's failover time, store cost and footprint")]
struct Args {
    /// The store [default: dynamodb, DynamoDB Local]. The CPU per request
    /// and the HTTP load are DynamoDB's and SQLite's only.
    #[arg(long, value_name = "STORE", default_value = "dynamodb")]
    store: Store,
    /// Fewer trials and shorter windows: for trying the benchmark out, not
    /// for publishing figures.
    #[arg(long)]
    quick: bool,
    /// Trials per failover scenario [default: 20, 5 with --quick].
    #[arg(long, value_name = "N")]
    trials: Option<usize>,
    /// Run only these scenarios [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Vec<Scenario>,
    /// The leaderd binary [default: target/release/leaderd].
    #[arg(long, value_name = "PATH")]
    leaderd: Option<PathBuf>,
    /// Keep the working directory (configs, logs, child histories).
    #[arg(long)]
    keep: bool,
    /// Election counts for the footprint scenario [default: 1,100,1000] and
    /// for the balance scenario [default: 1000].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    elections: Vec<usize>,
    /// Run the crash, graceful, preempt, resign and cost scenarios with the
    /// leader's hints on, off (every instance advertising an address nobody listens
    /// on, as before hints existed), or both [default: on,off].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    hints: Vec<Hints>,
    /// Run the crash, graceful, preempt, resign, cost and balance scenarios with
    /// each instance's elections held through its session (on), each
    /// election its own lease (off), or both, in the order given
    /// [default: on, the default of leaderd].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    sessions: Vec<Switch>,
    /// Elections of the instance the HTTP load scenario loads.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    http_load_elections: usize,
}

/// A setting on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    Off,
    On,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Scenario {
    Crash,
    Graceful,
    Preempt,
    Resign,
    Cost,
    Footprint,
    Requests,
    Startup,
    Size,
    Balance,
    /// Balance's second part alone: one instance leading all, `kill -9`.
    TakeoverAll,
    HttpLoad,
}

/// Windows and counts for one run.
struct Plan {
    trials: usize,
    rest_window: Duration,
    cpu_window: Duration,
    sample_window: Duration,
    startups: usize,
    elections: Vec<usize>,
    /// Requests per path in the request-cost scenario.
    requests: usize,
}

impl Plan {
    fn new(args: &Args) -> Plan {
        let (trials, rest, cpu, sample, startups, requests) = if args.quick {
            (5, 30, 20, 10, 3, 2_000)
        } else {
            (20, 120, 60, 30, 10, 10_000)
        };
        Plan {
            trials: args.trials.unwrap_or(trials),
            rest_window: Duration::from_secs(rest),
            cpu_window: Duration::from_secs(cpu),
            sample_window: Duration::from_secs(sample),
            startups,
            elections: if args.elections.is_empty() {
                vec![1, 100, 1000]
            } else {
                args.elections.clone()
            },
            requests,
        }
    }
}

/// One line of the acceptance summary.
struct Verdict {
    figure: String,
    target: String,
    measured: String,
    /// How far inside (positive) or outside (negative) the target, in words.
    margin: String,
    pass: bool,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(2);
        }
    }
}

/// Runs the selected scenarios; `Ok(false)` if one of them failed to run.
fn run(args: &Args) -> Result<bool, String> {
    let plan = Plan::new(args);
    if plan.trials == 0 {
        return Err("--trials must be at least 1".into());
    }
    let selected = |s: Scenario| args.only.is_empty() || args.only.contains(&s);
    let bin = match &args.leaderd {
        Some(path) => path.clone(),
        None => default_binary(),
    };
    check_binary(&bin)?;
    let job_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/job.py");
    if !job_py.is_file() {
        return Err(format!("{} is missing", job_py.display()));
    }
    let workdir = tempfile::Builder::new()
        .prefix("leaderd-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a working directory: {e}"))?;
    eprintln!("bench: working directory {}", workdir.path().display());

    let mut out = String::new();
    let mut verdicts = Vec::new();
    let mut failed = false;
    header(&mut out, args, &bin);

    let needs_store = [
        Scenario::Crash,
        Scenario::Graceful,
        Scenario::Preempt,
        Scenario::Resign,
        Scenario::Cost,
        Scenario::Footprint,
        Scenario::Requests,
        Scenario::Startup,
        Scenario::Balance,
        Scenario::TakeoverAll,
        Scenario::HttpLoad,
    ]
    .into_iter()
    .any(selected);
    let dynamodb_only = [Scenario::Requests, Scenario::HttpLoad];
    if args.store == Store::Postgres
        && let Some(scenario) = dynamodb_only.into_iter().find(|s| args.only.contains(s))
    {
        return Err(format!(
            "--only {scenario:?} measures DynamoDB's (and SQLite's) store: run it without --store postgres"
        ));
    }
    let selected =
        |s: Scenario| selected(s) && !(args.store == Store::Postgres && dynamodb_only.contains(&s));
    if needs_store {
        let store = match args.store {
            Store::Dynamodb => {
                eprintln!("bench: starting DynamoDB Local");
                StoreServer::Dynamo(dynamo_local::DynamoLocal::start(workdir.path())?)
            }
            Store::Postgres => {
                eprintln!("bench: starting PostgreSQL");
                StoreServer::Postgres(std::panic::catch_unwind(postgres::PgServer::start).map_err(
                    |e| match e.downcast::<String>() {
                        Ok(why) => *why,
                        Err(_) => "PostgreSQL did not start".to_owned(),
                    },
                )?)
            }
        };
        let env = Env {
            store: args.store,
            bin: bin.clone(),
            dir: workdir.path().to_path_buf(),
            table: "leaderd_bench".into(),
            job_py,
            python: harness::python()?,
        };
        let table_config =
            env.write_config("table.toml", &format!("http://{}", store.addr()), &[], &[])?;
        env.create_table(&table_config)?;
        if let StoreServer::Dynamo(server) = &store {
            eprintln!("bench: warming DynamoDB Local up");
            let warm_env = Env {
                table: format!("{}_warm_up", env.table),
                ..env.clone()
            };
            let warm_table = warm_env.write_config(
                "warm-up-table.toml",
                &format!("http://{}", server.addr),
                &[],
                &[],
            )?;
            warm_env.create_table(&warm_table)?;
            let warm = warm_up::run(server.addr, &warm_env.table)?;
            eprintln!(
                "bench: warm in {:.1} s: GetItem median {:.1} → {:.1} ms, PutItem {:.1} → {:.1} ms",
                warm.seconds,
                warm.first_read_ms,
                warm.last_read_ms,
                warm.first_put_ms,
                warm.last_put_ms
            );
            let _ = writeln!(
                out,
                "- DynamoDB Local warmed up first ({:.0} s of reads, conditional writes and transactions on scratch records, as its JVM compiles its hot paths): a read's median {:.1} → {:.1} ms, a conditional write's {:.1} → {:.1} ms\n",
                warm.seconds,
                warm.first_read_ms,
                warm.last_read_ms,
                warm.first_put_ms,
                warm.last_put_ms
            );
        }
        let clock_ticks = harness::clock_ticks()?;

        let mut section = |name: &str, result: Result<(), String>| {
            if let Err(e) = result {
                eprintln!("bench: {name} failed: {e}");
                let _ = writeln!(out, "## {name}\n\nFAILED: {e}\n");
                failed = true;
            }
        };
        let mut body = String::new();
        let mut thousand: Option<Footprint> = None;
        let hint_modes = if args.hints.is_empty() {
            vec![Hints::On, Hints::Off]
        } else {
            args.hints.clone()
        };
        let session_modes = if args.sessions.is_empty() {
            vec![Switch::On]
        } else {
            args.sessions.clone()
        };
        let modes: Vec<Mode> = hint_modes
            .iter()
            .flat_map(|&hints| {
                session_modes.iter().map(move |&s| Mode {
                    hints,
                    sessions: s == Switch::On,
                })
            })
            .collect();
        for (scenario, departure) in [
            (Scenario::Crash, Departure::Crash),
            (Scenario::Graceful, Departure::Graceful),
            (Scenario::Resign, Departure::ResignTo),
        ] {
            // Preemption is a planned handover: its rows follow the
            // graceful handover's of each mode.
            let preempt_here = scenario == Scenario::Graceful && selected(Scenario::Preempt);
            if !selected(scenario) && !preempt_here {
                continue;
            }
            for &mode in &modes {
                let mut graceful = None;
                if selected(scenario) {
                    let title = format!("{} ({})", departure_title(departure), mode_words(mode));
                    eprintln!("bench: {title}, {} trials", plan.trials);
                    let r = scenarios::failover(
                        &env,
                        store.addr(),
                        departure,
                        mode,
                        plan.trials,
                        CLUSTER,
                    )
                    .map(|trials| {
                        let _ = writeln!(body, "## {title}\n");
                        match departure {
                            Departure::Crash => {
                                report_crash(&mut body, &mut verdicts, &trials, mode)
                            }
                            Departure::Graceful => {
                                report_graceful(&mut body, &mut verdicts, &trials, mode);
                                graceful = Some(trials);
                            }
                            Departure::ResignTo => {
                                report_resign(&mut body, &mut verdicts, &trials, mode)
                            }
                        }
                    });
                    section(&title, r);
                }
                if preempt_here {
                    let title = format!("Preemption ({})", mode_words(mode));
                    if let Some(why) = preempt::unsupported(mode) {
                        eprintln!("bench: {title}: not run");
                        let _ = writeln!(body, "## {title}\n\nNot run: {why}\n");
                        continue;
                    }
                    eprintln!("bench: {title}, {} trials", plan.trials);
                    let r = preempt::measure(&env, store.addr(), mode, plan.trials).map(|trials| {
                        let _ = writeln!(body, "## {title}\n");
                        preempt::report(
                            &mut body,
                            &mut verdicts,
                            &trials,
                            mode,
                            graceful.as_deref(),
                        )
                    });
                    section(&title, r);
                }
            }
        }
        if selected(Scenario::Cost) {
            for &mode in &modes {
                let title = format!("Store cost at rest ({})", mode_words(mode));
                eprintln!("bench: {title} over {:?}", plan.rest_window);
                let r =
                    scenarios::cost_at_rest(&env, store.addr(), plan.rest_window, CLUSTER, mode)
                        .map(|costs| {
                            let _ = writeln!(body, "## {title}\n");
                            report_cost(
                                &mut body,
                                &mut verdicts,
                                &costs,
                                plan.rest_window,
                                mode,
                                args.store,
                            )
                        });
                section(&title, r);
            }
        }
        if selected(Scenario::Footprint) {
            let mut footprints = Vec::new();
            let mut result = Ok(());
            for &n in &plan.elections {
                eprintln!("bench: footprint with {n} elections");
                match scenarios::footprint(
                    &env,
                    store.addr(),
                    n,
                    plan.cpu_window,
                    plan.sample_window,
                    clock_ticks,
                ) {
                    Ok(f) => footprints.push(f),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            report_footprint(
                &mut body,
                &mut verdicts,
                &footprints,
                &plan,
                env.store_name(),
            );
            section("Footprint", result);
            thousand = footprints.into_iter().find(|f| f.elections == 1000);
        }
        if selected(Scenario::Requests) {
            eprintln!("bench: CPU per store request, {} per path", plan.requests);
            let r = request_cost::measure(store.addr(), &env.table, plan.requests, clock_ticks)
                .map(|cost| report_request_cost(&mut body, &cost, thousand.as_ref()));
            section("CPU per store request", r);
        }
        if selected(Scenario::Startup) {
            eprintln!("bench: start to leading, {} trials", plan.startups);
            let r = scenarios::startup(&env, store.addr(), plan.startups)
                .map(|starts| report_startup(&mut body, &starts));
            section("Start to leading", r);
        }
        let balance = selected(Scenario::Balance);
        if balance || selected(Scenario::TakeoverAll) {
            // `--elections` names the sizes; the footprint's default list
            // is not this scenario's (1,000).
            let sizes = if args.elections.is_empty() {
                vec![1000]
            } else {
                args.elections.clone()
            };
            for (&n, &sessions) in sizes
                .iter()
                .flat_map(|n| session_modes.iter().map(move |s| (n, s)))
            {
                let sessions = sessions == Switch::On;
                let mut checks = Vec::new();
                if balance {
                    eprintln!(
                        "bench: balance, {n} elections over 3 instances, sessions {sessions}"
                    );
                    let window = plan.cpu_window;
                    let r = balance::measure(&env, store.addr(), n, window, clock_ticks, sessions)
                        .map(|run| checks.extend(balance::report(&mut body, &run, window)));
                    section("Balance", r);
                }
                let server_cpu = || store.cpu_seconds(clock_ticks);
                let pace = match &store {
                    StoreServer::Dynamo(server) => {
                        eprintln!("bench: the store alone, {n} takes");
                        let table = format!("{}_warm_up", env.table);
                        Some(store_pace::measure(
                            server.addr,
                            &table,
                            n,
                            &[2, 8],
                            &server_cpu,
                        ))
                    }
                    StoreServer::Postgres(_) => None,
                };
                eprintln!("bench: one instance leading all {n}, kill -9, sessions {sessions}");
                let r = balance::takeover_all(&env, store.addr(), n, sessions, &server_cpu)
                    .map(|run| checks.push(balance::report_takeover_all(&mut body, &run)));
                section("One instance leading all, kill -9", r);
                match pace {
                    Some(Ok(passes)) => store_pace::report(&mut body, &passes),
                    Some(Err(e)) => section("The store alone", Err::<(), _>(e)),
                    None => {}
                }
                for (figure, target, measured, pass) in checks {
                    verdicts.push(Verdict {
                        figure,
                        target,
                        measured,
                        margin: if pass { "inside" } else { "OUTSIDE" }.into(),
                        pass,
                    });
                }
            }
        }
        if selected(Scenario::HttpLoad) {
            let (n, clients) = (args.http_load_elections, 64);
            let window = plan.cpu_window;
            let mut runs = Vec::new();
            let mut result = Ok(());
            for store in [
                http_load::Store::Sqlite,
                http_load::Store::DynamoLocal(store.addr()),
            ] {
                eprintln!("bench: HTTP load, {n} elections, {clients} clients, {store:?}");
                match http_load::measure(&env, store, n, clients, window, clock_ticks) {
                    Ok(run) => runs.push(run),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            let _ = writeln!(
                body,
                "## Read-only HTTP load on a leader of many elections\n"
            );
            for (figure, target, measured, pass) in http_load::report(&mut body, &runs) {
                verdicts.push(Verdict {
                    figure,
                    target,
                    measured,
                    margin: if pass { "inside" } else { "OUTSIDE" }.into(),
                    pass,
                });
            }
            section("Read-only HTTP load", result);
        }
        out.push_str(&body);
    }
    if selected(Scenario::Size) {
        report_size(&mut out, &mut verdicts, &bin)?;
    }
    report_verdicts(&mut out, &verdicts);
    println!("{out}");

    if args.keep || failed {
        let kept = workdir.keep();
        eprintln!("bench: logs kept in {}", kept.display());
    }
    Ok(!failed)
}

/// The store server the benchmark started.
enum StoreServer {
    Dynamo(dynamo_local::DynamoLocal),
    Postgres(postgres::PgServer),
}

impl StoreServer {
    /// Where it listens.
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            StoreServer::Dynamo(d) => d.addr,
            StoreServer::Postgres(p) => std::net::SocketAddr::from(([127, 0, 0, 1], p.port)),
        }
    }

    /// The CPU time its processes have used so far, in seconds (a
    /// PostgreSQL backend that exited is no longer counted).
    fn cpu_seconds(&self, clock_ticks: f64) -> f64 {
        let pids = match self {
            StoreServer::Dynamo(d) => d.pid().into_iter().collect(),
            StoreServer::Postgres(p) => p.processes(),
        };
        pids.into_iter()
            .filter_map(|pid| harness::cpu_seconds(pid, clock_ticks))
            .sum()
    }
}

fn default_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("release/leaderd")
}

/// The binary must exist and be newer than every source file, so the figures
/// are those of the code in the tree.
fn check_binary(bin: &Path) -> Result<(), String> {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .map_err(|e| {
            format!(
                "no leaderd binary at {} ({e}); build it with `cargo build --release`",
                bin.display()
            )
        })?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![
        root.join("src"),
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ];
    while let Some(path) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&path) {
            stack.extend(entries.flatten().map(|e| e.path()));
        } else if let Ok(modified) = std::fs::metadata(&path).and_then(|m| m.modified()) {
            if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
                newest = Some((modified, path));
            }
        }
    }
    match newest {
        Some((modified, path)) if modified > built => Err(format!(
            "{} is older than {}; rebuild it with `cargo build --release`",
            bin.display(),
            path.display()
        )),
        _ => Ok(()),
    }
}

fn header(out: &mut String, args: &Args, bin: &Path) {
    let command: Vec<String> = std::env::args().skip(1).collect();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let kib: f64 = l
                    .strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()?;
                Some(format!("{:.1} GiB", kib / 1024.0 / 1024.0))
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let version = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "# leaderd benchmark{}\n",
        if args.quick {
            " (--quick: not for publishing)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "- command: `cargo run --release --example bench -- {}`",
        command.join(" ")
    );
    let _ = writeln!(out, "- binary: `{}` ({version})", bin.display());
    let _ = writeln!(
        out,
        "- machine: {cores} CPUs ({cpu}), {memory} memory, Linux {}",
        kernel.trim()
    );
    let _ = writeln!(
        out,
        "- load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        out,
        "- timing: L = {} s, R = {} s, P = {} s, D = {} %, M = {} ms, G = 2 s (kill grace, default)",
        L.as_secs(),
        R.as_secs(),
        P.as_secs(),
        D * 100.0,
        M.as_millis()
    );
    let store = match args.store {
        Store::Dynamodb => "DynamoDB Local (in memory) on loopback; every leaderd talks to it through its own counting proxy".to_owned(),
        Store::Postgres => {
            let version = postgres::server_version().unwrap_or_else(|| "version unknown".into());
            format!(
                "PostgreSQL ({version}; a cluster of its own, `fsync = off`, data in a temporary directory) on loopback, without TLS; every leaderd talks to it through its own proxy, which reads the statements and counts each under the DynamoDB call it stands for (a one-record SELECT as GetItem, a conditional write as PutItem, `= ANY` as BatchGetItem)"
            )
        }
    };
    let _ = writeln!(
        out,
        "- store: {store}; child: tests/common/job.py, run with `python3 -S` (`sleep` for the footprint)\n"
    );
}

fn summary_row(out: &mut String, label: &str, values: impl Iterator<Item = f64>) {
    let values: Vec<f64> = values.collect();
    if let Some(s) = Summary::of(&values) {
        let _ = writeln!(out, "{}", s.row_s(label));
    }
}

fn departure_title(departure: Departure) -> &'static str {
    match departure {
        Departure::Crash => "Crash failover",
        Departure::Graceful => "Graceful handover",
        Departure::ResignTo => "Handover to a named successor",
    }
}

fn hints_words(hints: Hints) -> &'static str {
    match hints {
        Hints::On => "with hints",
        Hints::Off => "hints off",
    }
}

fn mode_words(mode: Mode) -> String {
    format!(
        "{}, {}",
        hints_words(mode.hints),
        if mode.sessions {
            "sessions"
        } else {
            "self-leased"
        }
    )
}

/// What "hints off" and the way elections are held mean, under a heading.
fn mode_note(out: &mut String, mode: Mode) {
    hints_off_note(out, mode.hints);
    let _ = if mode.sessions {
        writeln!(
            out,
            "Sessions (leaderd's default): each leaderd holds its elections through its session record, renewed every R; an election's record is written only on a new tenure, a release or a handover. Followers time the session's rvn by the same rule as a lease's. A takeover after a crash writes three times (the dead session ended, the new leader's session opened, the election taken); a follower that takes over after a release writes twice (its session opened, the election taken). \"Takeover write\" is the last of them, the one right before the child starts.\n"
        )
    } else {
        writeln!(
            out,
            "Self-leased (`sessions = false`): each election's record is its own lease, renewed every R.\n"
        )
    };
}

/// What "hints off" means, under a heading.
fn hints_off_note(out: &mut String, hints: Hints) {
    if hints == Hints::Off {
        let _ = writeln!(
            out,
            "Hints off: every instance advertises a loopback port nobody listens on, so no follower can watch the leader and each polls the store every P = {} s, as leaderd did before hints.\n",
            P.as_secs()
        );
    }
}

fn report_crash(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    trials: &[FailoverTrial],
    mode: Mode,
) {
    let l_ms = L.as_secs_f64() * 1e3;
    let _ = writeln!(
        out,
        "`kill -9` of the leader's leaderd at a random point of its renewal cycle → the new leader's child writes its `start` line. {CLUSTER} instances; the killed one comes back as a follower before the next trial.\n"
    );
    mode_note(out, mode);
    let _ = writeln!(out, "{HEADER_S}");
    summary_row(
        out,
        "kill → new child started",
        trials.iter().map(|t| t.total),
    );
    summary_row(
        out,
        "kill → takeover write",
        trials.iter().map(|t| t.takeover),
    );
    summary_row(
        out,
        "takeover write → child started",
        trials.iter().map(|t| t.total - t.takeover),
    );
    summary_row(
        out,
        "kill after the last renewal (phase)",
        trials.iter().filter_map(|t| t.phase),
    );
    summary_row(
        out,
        "floor: L·(1+D) − phase",
        trials.iter().filter_map(|t| t.floor),
    );
    summary_row(
        out,
        "above the floor: total − floor",
        trials.iter().filter_map(|t| t.floor.map(|f| t.total - f)),
    );
    let learned = match mode.hints {
        Hints::On => {
            "The follower starts that wait when it learns the renewed rvn, from the leader's `renewed` event milliseconds after the write; then come a confirming read, the takeover write and the child's exec. So the excess over the floor is a few store round trips"
        }
        Hints::Off => {
            "The follower starts that wait when its poll first shows the renewed rvn, which adds 0 to P; then come a takeover write and the child's exec. So the excess over the floor lies between 0 and P plus a few tens of milliseconds"
        }
    };
    let _ = writeln!(
        out,
        "\nFloor: a follower may take over only once the last rvn it saw stayed unchanged for L·(1+D) = {:.1} s on its own clock, so no failover beats L·(1+D) − (time from the last renewal to the crash): between L·(1+D) − R = {:.1} s (crash just before a renewal) and L·(1+D) = {:.1} s (just after). \
         {learned}; the worst case without hints is L·(1+D) + P ≈ {:.1} s plus that.",
        l_ms * (1.0 + D) / 1e3,
        (l_ms * (1.0 + D) - R.as_secs_f64() * 1e3) / 1e3,
        l_ms * (1.0 + D) / 1e3,
        (l_ms * (1.0 + D) + P.as_secs_f64() * 1e3) / 1e3
    );
    if let Some(s) = Summary::of(&trials.iter().map(|t| t.total).collect::<Vec<_>>()) {
        verdicts.push(verdict(
            &format!("crash failover ({}), max", mode_words(mode)),
            CRASH_MAX_TARGET_S,
            s.max / 1e3,
            "s",
            trials.len(),
        ));
    }
    out.push('\n');
}

/// The rows shared by the graceful and resign reports: from the signal
/// (or request) through the release to the new job.
fn handover_rows(out: &mut String, trials: &[FailoverTrial], cause: &str) {
    let _ = writeln!(out, "{HEADER_S}");
    summary_row(
        out,
        "old job's end → new job's start",
        trials.iter().filter_map(|t| t.old_end.map(|e| t.total - e)),
    );
    summary_row(
        out,
        &format!("{cause} → new child started"),
        trials.iter().map(|t| t.total),
    );
    summary_row(
        out,
        &format!("{cause} → old job's end"),
        trials.iter().filter_map(|t| t.old_end),
    );
    summary_row(
        out,
        &format!("{cause} → release write"),
        trials.iter().filter_map(|t| t.release),
    );
    summary_row(
        out,
        "release write → takeover write",
        trials
            .iter()
            .filter_map(|t| t.release.map(|r| t.takeover - r)),
    );
    summary_row(
        out,
        "takeover write → child started",
        trials.iter().map(|t| t.total - t.takeover),
    );
    let missing = trials.iter().filter(|t| t.release.is_none()).count();
    if missing > 0 {
        let _ = writeln!(
            out,
            "\n{missing} trial(s) showed no release write before the takeover."
        );
    }
}

fn report_graceful(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    trials: &[FailoverTrial],
    mode: Mode,
) {
    let _ = writeln!(
        out,
        "SIGTERM to the leader's leaderd (it stops its child, releases the lease, exits) at a random moment → the new leader's child writes its `start` line. {CLUSTER} instances.\n"
    );
    mode_note(out, mode);
    handover_rows(out, trials, "SIGTERM");
    match mode.hints {
        Hints::On => {
            let _ = writeln!(
                out,
                "\nFloor: the followers watch the leader (`/v1/elections/{{election}}/watch`); its `released` event, sent once the release write succeeded, makes them read the record at once instead of at their next poll (up to P = {} s later, the floor without hints). \
                 So between the old job's end and the new job's start come the release write, the event's trip, one read, the takeover write and the new job's exec: a few store round trips.",
                P.as_secs()
            );
            let handover: Vec<f64> = trials
                .iter()
                .filter_map(|t| t.old_end.map(|e| t.total - e))
                .collect();
            if let Some(s) = Summary::of(&handover) {
                verdicts.push(verdict(
                    &format!(
                        "graceful handover ({}), old job's end → new job's start, median",
                        mode_words(mode)
                    ),
                    HANDOVER_MEDIAN_TARGET_MS,
                    s.median,
                    "ms",
                    s.n,
                ));
                verdicts.push(verdict(
                    &format!(
                        "graceful handover ({}), old job's end → new job's start, p95",
                        mode_words(mode)
                    ),
                    HANDOVER_P95_TARGET_MS,
                    s.p95,
                    "ms",
                    s.n,
                ));
            }
        }
        Hints::Off => {
            let _ = writeln!(
                out,
                "\nFloor: nobody hears of the release until a follower's next poll, 0 to P = {} s after it (about P/2 on average); then one takeover write and the new job's exec.",
                P.as_secs()
            );
        }
    }
    if let Some(s) = Summary::of(&trials.iter().map(|t| t.total).collect::<Vec<_>>()) {
        let _ = writeln!(
            out,
            "Median {:.3} s against one poll interval: {:+.3} s.",
            s.median / 1e3,
            s.median / 1e3 - P.as_secs_f64()
        );
        verdicts.push(verdict(
            &format!(
                "graceful handover ({}), SIGTERM → new job, median",
                mode_words(mode)
            ),
            GRACEFUL_MEDIAN_TARGET_S,
            s.median / 1e3,
            "s",
            trials.len(),
        ));
    }
    out.push('\n');
}

fn report_resign(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    trials: &[FailoverTrial],
    mode: Mode,
) {
    let _ = writeln!(
        out,
        "`leaderd resign ELECTION --to FOLLOWER` (a follower picked at random) at a random moment: the leader stops its child, writes the record released with that follower as `successor`, and follows → the named follower's child writes its `start` line. {CLUSTER} instances; times from the moment `leaderd resign` was started.\n"
    );
    mode_note(out, mode);
    handover_rows(out, trials, "resign");
    let named = trials
        .iter()
        .filter(|t| t.named_took_over == Some(true))
        .count();
    let _ = writeln!(
        out,
        "\nThe named follower took over in {named} of {} trials.",
        trials.len()
    );
    verdicts.push(Verdict {
        figure: format!(
            "resign --to ({}): the named follower takes over",
            mode_words(mode)
        ),
        target: "every trial".into(),
        measured: format!("{named} of {}", trials.len()),
        margin: if named == trials.len() {
            "inside"
        } else {
            "OUTSIDE"
        }
        .into(),
        pass: named == trials.len(),
    });
    match mode.hints {
        Hints::On => {
            let _ = writeln!(
                out,
                "\nFloor: the named follower hears the `released` event (sent after the release write), reads the record, finds itself the successor and takes it: a few store round trips after the old job's end. Others wait L·(1+D) as if the lease were held, so only the named one can be this fast."
            );
            let handover: Vec<f64> = trials
                .iter()
                .filter_map(|t| t.old_end.map(|e| t.total - e))
                .collect();
            if let Some(s) = Summary::of(&handover) {
                verdicts.push(verdict(
                    &format!(
                        "resign --to ({}), old job's end → named job's start, max",
                        mode_words(mode)
                    ),
                    RESIGN_TO_TARGET_MS,
                    s.max,
                    "ms",
                    s.n,
                ));
            }
        }
        Hints::Off => {
            let _ = writeln!(
                out,
                "\nFloor: the named follower finds the released record at its next poll, 0 to P = {} s after the release write.",
                P.as_secs()
            );
        }
    }
    out.push('\n');
}

/// The requests an instance at rest cannot do without, per minute, by
/// operation: (leader, follower, the floors in words, why).
struct CostFloors {
    leader: Vec<(&'static str, f64)>,
    follower: Vec<(&'static str, f64)>,
    words: &'static str,
    why: String,
}

fn cost_floors(mode: Mode, store: Store) -> CostFloors {
    let per_min = |d: Duration| 60.0 / d.as_secs_f64();
    let charged = match store {
        Store::Dynamodb => {
            "Reads and writes are both charged per request in DynamoDB on-demand mode (a strongly consistent read of an item under 4 KB is one read request unit, a write under 1 KB one write request unit; a batch read is charged per item)."
        }
        Store::Postgres => {
            "On PostgreSQL each request is one statement (one round trip, its own transaction); GetItem here is a one-record SELECT, PutItem a conditional write, BatchGetItem one SELECT of up to 100 records."
        }
    };
    match (mode.sessions, mode.hints) {
        (false, hints) => CostFloors {
            leader: vec![("PutItem", per_min(R))],
            follower: vec![(
                "GetItem",
                if hints == Hints::On {
                    per_min(L)
                } else {
                    per_min(P)
                },
            )],
            words: if hints == Hints::On {
                "60/R writes (leader), 60/L reads (follower)"
            } else {
                "60/R writes (leader), 60/P reads (follower)"
            },
            why: format!(
                "Floor: a leader must write once per R ({:.0}/min) to keep its lease. A follower that hears the leader's hints reads the store once per lease, when the lease it read last would run out ({:.0}/min: hints never spare that read, so that no stream can keep a dead leader's lease from moving); without hints it reads once per P ({:.0}/min). {charged}",
                per_min(R),
                per_min(L),
                per_min(P)
            ),
        },
        (true, Hints::On) => CostFloors {
            leader: vec![("PutItem", per_min(R)), ("BatchGetItem", per_min(R * 2))],
            follower: vec![("GetItem", per_min(L * 2))],
            words: "60/R writes + 60/(2R) read-backs (leader), 60/(2L) reads (follower)",
            why: format!(
                "Floor: a leader renews its session once per R ({:.0}/min) and reads back the records it holds once per 2R ({:.0}/min, one batch request for up to 100 of them), so that a record deleted or rewritten under it ends its tenure. A follower writes nothing; it reads the leader's session record about once every two leases ({:.0}/min): the stream dates each renewal, and a read is due a lease after the last one it timed. {charged}",
                per_min(R),
                per_min(R * 2),
                per_min(L * 2)
            ),
        },
        (true, Hints::Off) => CostFloors {
            leader: vec![("PutItem", per_min(R)), ("BatchGetItem", per_min(R * 2))],
            follower: vec![("GetItem", per_min(P) + per_min(L))],
            words: "60/R writes + 60/(2R) read-backs (leader), 60/P + 60/L reads (follower)",
            why: format!(
                "Floor: the leader as with hints. Without a stream a follower reads the election's record every P ({:.0}/min) and the session record once per lease ({:.0}/min), since nothing dates the session's renewals in between. {charged}",
                per_min(P),
                per_min(L)
            ),
        },
    }
}

fn report_cost(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    costs: &[RestCost],
    window: Duration,
    mode: Mode,
    store: Store,
) {
    let floors = cost_floors(mode, store);
    let minutes = window.as_secs_f64() / 60.0;
    // A window of finite length counts whole requests: ±1 per window.
    let slack = 1.0 / minutes;
    let _ = writeln!(
        out,
        "One election, {CLUSTER} instances, counted by each instance's proxy over {:.0} s with no leadership change (requests per minute; one election, so also per election). \
         Counting whole requests in a finite window is exact to ±{slack:.2}/min.\n",
        window.as_secs_f64()
    );
    mode_note(out, mode);
    let _ = writeln!(
        out,
        "| instance | role | GetItem/min | PutItem/min | other/min | floor/min | beyond the floor/min |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|");
    let mut worst_excess: f64 = 0.0;
    for (i, cost) in costs.iter().enumerate() {
        let count = |op: &str| cost.per_minute.get(op).copied().unwrap_or(0.0);
        let other: f64 = cost
            .per_minute
            .iter()
            .filter(|(op, _)| op.as_str() != "GetItem" && op.as_str() != "PutItem")
            .fold(0.0, |sum, (_, n)| sum + n);
        let (role, floor) = if cost.leader {
            ("leader", &floors.leader)
        } else {
            ("follower", &floors.follower)
        };
        // Each operation beyond its floor, and any operation without one.
        let excess: f64 = cost
            .per_minute
            .iter()
            .map(|(op, n)| {
                let allowed = floor.iter().find(|(o, _)| o == op).map_or(0.0, |f| f.1);
                (n - allowed).max(0.0)
            })
            .sum();
        worst_excess = worst_excess.max(excess);
        let floor_text: Vec<String> = floor.iter().map(|(op, n)| format!("{n:.0} {op}")).collect();
        let _ = writeln!(
            out,
            "| {} | {role} | {:.2} | {:.2} | {other:.2} | {} | {excess:.2} |",
            (b'a' + i as u8) as char,
            count("GetItem"),
            count("PutItem"),
            floor_text.join(" + ")
        );
    }
    let _ = writeln!(out, "\n{}\n", floors.why);
    if mode.hints == Hints::On {
        let worst_follower = costs
            .iter()
            .filter(|c| !c.leader)
            .map(|c| c.per_minute.values().sum::<f64>())
            .fold(0.0, f64::max);
        verdicts.push(verdict(
            &format!(
                "at rest ({}): store requests of a follower per minute (its proxy)",
                mode_words(mode)
            ),
            FOLLOWER_READS_TARGET,
            worst_follower,
            "/min",
            costs.len() - 1,
        ));
    }
    verdicts.push(Verdict {
        figure: format!(
            "at rest ({}): requests beyond {}",
            mode_words(mode),
            floors.words
        ),
        target: format!("none (±{slack:.2}/min counting)"),
        measured: format!("{worst_excess:.2}/min"),
        margin: if worst_excess <= slack {
            "at the floor".into()
        } else {
            format!("{:.2}/min beyond", worst_excess)
        },
        pass: worst_excess <= slack,
    });
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn report_footprint(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    footprints: &[Footprint],
    plan: &Plan,
    store: &str,
) {
    if footprints.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Footprint\n");
    let _ = writeln!(
        out,
        "One leaderd leading every election (child `sleep`, so the supervisor and its guard run too), talking to {store} directly (store requests counted by leaderd's own `leaderd_store_request_duration_seconds` histogram). CPU over a {:.0} s window with no HTTP traffic; then `/status` sampled every {:.0} ms for {:.0} s; peak RSS (VmHWM) at the end.\n",
        plan.cpu_window.as_secs_f64(),
        footprints[0].sample_every_ms,
        plan.sample_window.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| elections | peak RSS (MiB) | RSS at end: anon + file (MiB) | PSS at end: leaderd + guard (MiB) | threads, sockets | CPU s/min | CPU ms per store request | guard: peak RSS (MiB), CPU s/min | renew writes/min (floor n·60/R) | other requests/min | time to lead all (s) |"
    );
    let _ = writeln!(
        out,
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    );
    for f in footprints {
        let helpers: Vec<String> = f
            .helpers
            .iter()
            .map(|(name, hwm, cpu)| format!("{name}: {:.1}, {cpu:.3}", mib(*hwm)))
            .collect();
        let put = f.requests_per_min.get("renew").copied().unwrap_or(0.0);
        let all: f64 = f.requests_per_min.values().fold(0.0, |sum, n| sum + n);
        let floor = f.elections as f64 * 60.0 / R.as_secs_f64();
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} + {:.1} | {:.1} + {:.1} | {}, {} | {:.3} | {:.2} | {} | {put:.0} ({floor:.0}) | {:.1} | {:.1} |",
            f.elections,
            mib(f.hwm_kib),
            mib(f.rss_kib.1),
            mib(f.rss_kib.2),
            mib(f.pss_kib.0),
            mib(f.pss_kib.1),
            f.threads_fds.0,
            f.threads_fds.1,
            f.cpu_per_min,
            if all > 0.0 {
                f.cpu_per_min * 1e3 / all
            } else {
                0.0
            },
            if helpers.is_empty() {
                "none".into()
            } else {
                helpers.join("; ")
            },
            all - put,
            f.lead_all_ms / 1e3
        );
    }
    let _ = writeln!(
        out,
        "\nRSS counts every resident page a process maps, file-backed pages of the binary included; the guard is the same binary (`leaderd __guard`), so summing the two RSS figures counts those shared pages twice. PSS divides each shared page among the processes that map it, so the PSS sum is what the pair costs the machine."
    );
    let _ = writeln!(out, "\nRenewals:\n");
    let _ = writeln!(
        out,
        "| elections | renewals ok / room | failed renewals (whole run) | slowest renew request ≤ | worst renewal delay (ms) | /status samples (not leading) |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|");
    for f in footprints {
        let _ = writeln!(
            out,
            "| {} | {:.0} / {:.0} | {:.0}{} | {} | {:.0} | {} ({}) |",
            f.elections,
            f.renewals.0,
            f.renewals.1,
            f.renew_failures,
            if f.renew_failure_kinds.is_empty() {
                String::new()
            } else {
                format!(" ({})", f.renew_failure_kinds.join(", "))
            },
            f.slowest_renew_bucket
                .map_or("-".into(), |b| format!("{} ms", b * 1e3)),
            f.worst_delay_ms,
            f.samples.0,
            f.samples.1
        );
    }
    let due_ms = L.as_secs_f64() * 1e3 * (1.0 - D) - M.as_secs_f64() * 1e3 - R.as_secs_f64() * 1e3;
    let _ = writeln!(
        out,
        "\nWorst renewal delay, measured from outside: a renewal is due R after the previous write was sent, when the lease has L·(1−D) − M − R = {due_ms:.0} ms left; `lease_remaining_ms` in `/status` shows how much is left, so {due_ms:.0} ms minus the smallest value ever sampled is how long after its due time the latest renewal took effect (scheduling delay plus the write's round trip). \
         Sampling every {:.0} ms can miss up to that much of the true worst. `renewals ok / room` compares `leaderd_renew_total{{result=\"ok\"}}` over the quiet window with the renewals an R-spaced schedule has room for; `slowest renew request` is the upper bound of the highest non-empty `leaderd_store_request_duration_seconds{{op=\"renew\"}}` bucket.\n",
        footprints[0].sample_every_ms
    );
    for f in footprints {
        let total_hwm = f.hwm_kib + f.helpers.iter().map(|h| h.1).sum::<u64>();
        if f.elections == 1 {
            verdicts.push(verdict(
                "1 election: peak RSS, leaderd process",
                RSS_ONE_TARGET_MIB,
                mib(f.hwm_kib),
                "MiB",
                1,
            ));
            verdicts.push(verdict(
                "1 election: peak RSS leaderd + guard, summed",
                RSS_ONE_TARGET_MIB,
                mib(total_hwm),
                "MiB",
                1,
            ));
            verdicts.push(verdict(
                "1 election: PSS leaderd + guard (shared pages once)",
                RSS_ONE_TARGET_MIB,
                mib(f.pss_kib.0 + f.pss_kib.1),
                "MiB",
                1,
            ));
        }
        if f.elections == 1000 {
            verdicts.push(verdict(
                "1,000 elections: peak RSS, leaderd process",
                RSS_THOUSAND_TARGET_MIB,
                mib(f.hwm_kib),
                "MiB",
                1,
            ));
            verdicts.push(verdict(
                "1,000 elections: peak RSS leaderd + guard, summed",
                RSS_THOUSAND_TARGET_MIB,
                mib(total_hwm),
                "MiB",
                1,
            ));
            let cpu = f.cpu_per_min + f.helpers.iter().map(|h| h.2).sum::<f64>();
            verdicts.push(verdict(
                "1,000 elections: CPU s/min, leaderd + guard",
                CPU_THOUSAND_TARGET,
                cpu,
                "s",
                1,
            ));
            verdicts.push(verdict(
                "1,000 elections: worst renewal delay",
                P.as_secs_f64() * 1e3,
                f.worst_delay_ms,
                "ms",
                1,
            ));
            if f.renew_failures > 0.0 || f.samples.1 > 0 {
                verdicts.push(Verdict {
                    figure: "1,000 elections: every renewal on time".into(),
                    target: "no failed renewal, always leading".into(),
                    measured: format!(
                        "{} failed, {} not-leading samples",
                        f.renew_failures, f.samples.1
                    ),
                    margin: "missed".into(),
                    pass: false,
                });
            }
        }
    }
}

fn report_request_cost(
    out: &mut String,
    cost: &request_cost::RequestCost,
    thousand: Option<&Footprint>,
) {
    let _ = writeln!(out, "## CPU per store request\n");
    let _ = writeln!(
        out,
        "One conditional PutItem (a renewal), {} per path, in batches of 50 (about one tick of leaderd's renewal grid at 1,000 elections) 50 ms apart, on a runtime shaped like leaderd's (one worker thread), in the benchmark's own process: through leaderd's DynamoDB store (the AWS SDK: request building, endpoint, SigV4 signing, interceptors, HTTP) and as bare HTTP/1.1 from hyper with the same body, unsigned (DynamoDB Local does not check signatures). CPU is user + system time of the process.\n",
        cost.requests
    );
    let _ = writeln!(
        out,
        "| path | CPU µs per request | × 12,000 renewals/min (s/min) |"
    );
    let _ = writeln!(out, "|---|---:|---:|");
    let per_min = |us: f64| us * 12_000.0 / 1e6;
    if let Some(f) = thousand {
        let all: f64 = f.requests_per_min.values().fold(0.0, |sum, n| sum + n);
        if all > 0.0 {
            let us = f.cpu_per_min / all * 1e6;
            let _ = writeln!(
                out,
                "| leaderd at 1,000 elections (footprint above: CPU / store requests) | {us:.0} | {:.2} |",
                per_min(us)
            );
        }
    }
    let _ = writeln!(
        out,
        "| AWS SDK PutItem (leaderd's store alone) | {:.0} | {:.2} |",
        cost.sdk_us,
        per_min(cost.sdk_us)
    );
    let _ = writeln!(
        out,
        "| bare HTTP PutItem (hyper, unsigned) | {:.0} | {:.2} |",
        cost.http_us,
        per_min(cost.http_us)
    );
    let _ = writeln!(
        out,
        "\nThe SDK adds {:.0} µs per request over bare HTTP. At the default R = 5 s a leader of 1,000 elections makes 12,000 renewals a minute, so the SDK path alone costs {:.2} CPU s/min against the {CPU_THOUSAND_TARGET} s target.\n",
        cost.sdk_us - cost.http_us,
        per_min(cost.sdk_us)
    );
}

fn report_startup(out: &mut String, starts: &[Startup]) {
    let _ = writeln!(out, "## Start to leading\n");
    let _ = writeln!(
        out,
        "A fresh leaderd for an election that has no item in the (existing) table: spawn → first store request, → the create write, → `/leader` answers 200 (polled every 5 ms), → the child's `start` line.\n"
    );
    let _ = writeln!(out, "{HEADER_S}");
    summary_row(
        out,
        "spawn → first store request",
        starts.iter().map(|s| s.first_request),
    );
    summary_row(out, "spawn → create write", starts.iter().map(|s| s.create));
    summary_row(
        out,
        "spawn → leading (/leader 200)",
        starts.iter().map(|s| s.leading),
    );
    summary_row(out, "spawn → child started", starts.iter().map(|s| s.child));
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    for s in starts {
        for (op, n) in &s.ops {
            *ops.entry(op.clone()).or_default() += n;
        }
    }
    let ops: Vec<String> = ops
        .iter()
        .map(|(op, n)| format!("{op} × {:.1}", *n as f64 / starts.len() as f64))
        .collect();
    let _ = writeln!(
        out,
        "\nStore requests before leading, per start: {}. Floor: one consistent read (finds no item) and one conditional write; everything before the first request is process start-up (runtime, configuration, the AWS SDK's client).\n",
        ops.join(", ")
    );
}

fn report_size(out: &mut String, verdicts: &mut Vec<Verdict>, bin: &Path) -> Result<(), String> {
    let bytes = std::fs::read(bin).map_err(|e| format!("cannot read {}: {e}", bin.display()))?;
    let symbols = has_symbol_table(&bytes);
    let size_mib = bytes.len() as f64 / 1024.0 / 1024.0;
    let _ = writeln!(out, "## Binary\n");
    let _ = writeln!(
        out,
        "`{}`: {} bytes = {size_mib:.2} MiB, {} (release profile: opt-level 3 (SQLite's C code at `-Os`), fat LTO, one codegen unit, `panic = \"abort\"`, `strip = \"symbols\"`).\n",
        bin.display(),
        bytes.len(),
        match symbols {
            Some(false) => "no symbol table (stripped)",
            Some(true) => "WITH a symbol table (not stripped)",
            None => "not an ELF64 file this benchmark can read",
        }
    );
    let mut v = verdict(
        "release binary, stripped",
        BINARY_TARGET_MIB,
        size_mib,
        "MiB",
        1,
    );
    if symbols != Some(false) {
        v.pass = false;
        v.margin = "not stripped".into();
    }
    verdicts.push(v);
    Ok(())
}

/// Whether an ELF64 little-endian file has a `.symtab` (SHT_SYMTAB) section;
/// `None` if it is not such a file.
fn has_symbol_table(elf: &[u8]) -> Option<bool> {
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?));
    let table = usize::try_from(u64_at(0x28)?).ok()?;
    let entry = usize::from(u16_at(0x3a)?);
    let count = usize::from(u16_at(0x3c)?);
    const SHT_SYMTAB: u32 = 2;
    let mut found = false;
    for i in 0..count {
        found |= u32_at(table + i * entry + 4)? == SHT_SYMTAB;
    }
    Some(found)
}

/// A "lower is better" figure against its target.
fn verdict(figure: &str, target: f64, measured: f64, unit: &str, n: usize) -> Verdict {
    let pass = measured <= target;
    let diff = (target - measured).abs();
    let pct = if target > 0.0 {
        diff / target * 100.0
    } else {
        0.0
    };
    let precision = if unit == "ms" { 0 } else { 2 };
    Verdict {
        figure: figure.to_owned(),
        target: format!("≤ {target} {unit}"),
        measured: format!(
            "{measured:.precision$} {unit}{}",
            if n > 1 {
                format!(" (n = {n})")
            } else {
                String::new()
            }
        ),
        margin: format!(
            "{diff:.precision$} {unit} ({pct:.0} %) {}",
            if pass { "inside" } else { "OVER" }
        ),
        pass,
    }
}

fn report_verdicts(out: &mut String, verdicts: &[Verdict]) {
    if verdicts.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Acceptance\n");
    let _ = writeln!(out, "| figure | target | measured | margin | |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for v in verdicts {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            v.figure,
            v.target,
            v.measured,
            v.margin,
            if v.pass { "pass" } else { "MISS" }
        );
    }
}
