//! Preemption: a leaderd of priority 1 leads one election and runs the job;
//! a leaderd of priority 2 starts; once the leader has seen it eligible for
//! `preempt_after` it hands the election over with the planned handover
//! (its job stopped first, then a release naming the newcomer). Measured
//! per trial: the old job's end → the new job's start (the gap a planned
//! handover leaves), and the newcomer's spawn → its job's start (its wait:
//! until the leader counts it eligible, then `preempt_after`). bench.rs
//! prints the report right after the graceful handover's of the same mode.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::RngExt as _;

use crate::dynamo_local::free_port;
use crate::harness::{Env, Instance, JobLog, Watcher, ms_between, poll, set_sessions};
use crate::scenarios::{FailoverTrial, Hints, Mode, metric_sum};
use crate::stats::Summary;
use crate::{
    HANDOVER_MEDIAN_TARGET_MS, HANDOVER_P95_TARGET_MS, P, R, Verdict, handover_rows, mode_note,
    mode_words, verdict,
};

/// `preempt_after` of both daemons: short, so that a trial takes seconds
/// rather than the default's 10 s of waiting.
pub const PREEMPT_AFTER: Duration = Duration::from_secs(1);

/// What the newcomer's spawn → its job's start may take beyond its waits
/// (see [`wait_bound`]): its
/// start-up, its session and stream, and the handover itself, a few store
/// round trips and a job's exec (the graceful target's order, 1.2 s).
const WAIT_SLACK: Duration = Duration::from_secs(1);

/// One preemption.
#[derive(Debug, Clone)]
pub struct PreemptTrial {
    /// In the failover's shape, every time from the priority-2 leaderd's
    /// spawn: `total` its job's start, `takeover` its takeover write,
    /// `release` the old leader's release write, `old_end` the old job's
    /// `end` line.
    pub handover: FailoverTrial,
    /// Whether the old leader counted the handover as a preemption
    /// (`leaderd_preemptions_total` is 1).
    pub counted: bool,
}

/// Why `mode` cannot preempt at all, if it cannot.
pub fn unsupported(mode: Mode) -> Option<&'static str> {
    (mode.hints == Hints::Off && mode.sessions).then_some(
        "with sessions and no hints a follower that leads nothing never opens a stream on the leader, so the leader never learns of it and never hands it anything (docs/leadership.md, \"Preferred leaders\"). Run `--hints on`, or `--sessions off` for the hints-off figures.",
    )
}

/// The newcomer's spawn → its job's start may take at most this in `mode`.
/// With sessions its session writes its priority label at once and its
/// stream names the session to the leader, which looks it up at once and
/// hands over `preempt_after` after it learned the label: whatever R, the
/// issue's bound of `preempt_after` + 1 s. Without sessions its member
/// record counts once the leader has seen it change, so from its second
/// write, R after its start, and the leader reads the records at its
/// rounds (every R); without hints the newcomer finds the released record
/// at its next poll (P).
pub fn wait_bound(mode: Mode) -> Duration {
    if mode.sessions {
        return PREEMPT_AFTER + WAIT_SLACK;
    }
    let poll = if mode.hints == Hints::Off {
        P
    } else {
        Duration::ZERO
    };
    R * 2 + PREEMPT_AFTER + poll + WAIT_SLACK
}

/// `trials` preemptions in `mode`, each with two fresh leaderd processes
/// and a fresh election.
pub fn measure(
    env: &Env,
    store: SocketAddr,
    mode: Mode,
    trials: usize,
) -> Result<Vec<PreemptTrial>, String> {
    let label = format!(
        "preempt-{}{}{:06x}",
        if mode.hints == Hints::Off {
            "nohints-"
        } else {
            ""
        },
        if mode.sessions { "" } else { "self-" },
        rand::rng().random::<u32>() & 0xff_ffff
    );
    // Slot 0: priority 1, the first leader; slot 1: priority 2.
    let proxies: Vec<_> = (0..2).map(|_| Arc::new(env.proxy(store))).collect();
    let watcher = Watcher::start(proxies.clone());
    let mut job = JobLog::new(env.dir.join(format!("{label}.history")));
    let command = env.job_command(job.path());
    let mut results = Vec::new();
    for trial in 1..=trials {
        let election = format!("{label}-{trial}");
        let configs = [(1, &proxies[0]), (2, &proxies[1])]
            .into_iter()
            .map(|(priority, proxy)| config(env, &election, priority, &proxy.endpoint(), mode))
            .collect::<Result<Vec<_>, _>>()?;
        let old_identity = format!("{election}-p1");
        let new_identity = format!("{election}-p2");

        let mut old = Instance::start(env, &old_identity, &configs[0], &command)?;
        old.wait_http(Duration::from_secs(30))?;
        poll(Duration::from_secs(30), Duration::from_millis(20), || {
            job.last_start_by(&old_identity)
        })
        .ok_or_else(|| {
            format!(
                "{label}: {old_identity} did not start its job within 30 s; see {}",
                old.log_path().display()
            )
        })?;
        // A random point of the leader's round (every R), which decides how
        // long the newcomer waits to be seen.
        let pause = rand::rng().random_range(0..R.as_nanos() as u64);
        std::thread::sleep(Duration::from_nanos(pause));

        let mut new = Instance::start(env, &new_identity, &configs[1], &command)?;
        let spawned = new.spawned_ns;
        new.wait_http(Duration::from_secs(30))?;
        let limit = wait_bound(mode) + Duration::from_secs(20);
        let started = poll(limit, Duration::from_millis(5), || {
            job.start_after(spawned, Some(&old_identity))
        })
        .ok_or_else(|| {
            format!(
                "{label}: {new_identity} did not start its job within {limit:?} of its spawn; see {}",
                new.log_path().display()
            )
        })?;
        // Its last write before its job started: its take of the election.
        let takeover = watcher
            .last_between(spawned, started.at_ns + 2_000_000, "PutItem", 1)
            .ok_or_else(|| format!("{label}: a job started but no takeover write was seen"))?;
        let old_end = job.end_after(spawned, &old_identity);
        // The job is stopped first, then the record released: the old
        // leader's first write after its job's end.
        let release = old_end.as_ref().and_then(|end| {
            watcher
                .first(end.at_ns, "PutItem", |s| s == 0)
                .filter(|e| e.at_ns <= takeover.at_ns)
        });
        let counted = old.get("/metrics").is_some_and(|(_, body)| {
            metric_sum(&body, "leaderd_preemptions_total", |_| true) == 1.0
        });
        let handover = FailoverTrial {
            total: ms_between(spawned, started.at_ns),
            takeover: ms_between(spawned, takeover.at_ns),
            phase: None,
            floor: None,
            release: release.map(|e| ms_between(spawned, e.at_ns)),
            old_end: old_end.as_ref().map(|e| ms_between(spawned, e.at_ns)),
            named_took_over: None,
        };
        eprintln!(
            "  preempt trial {trial}: spawn → job {:.3} s, old job's end → new job's start {}{}",
            handover.total / 1e3,
            handover.old_end.map_or("(no end line)".into(), |e| format!(
                "{:.0} ms",
                handover.total - e
            )),
            if counted {
                ""
            } else {
                " (not counted as a preemption)"
            }
        );
        results.push(PreemptTrial { handover, counted });
        // The old leader follows (sitting out a lease); stop it, then the
        // new leader, which releases on the way out.
        old.stop(Duration::from_secs(10));
        new.stop(Duration::from_secs(10));
    }
    Ok(results)
}

/// A configuration for `election` through the proxy at `endpoint`, with
/// `priority` and the benchmark's `preempt_after`.
fn config(
    env: &Env,
    election: &str,
    priority: i64,
    endpoint: &str,
    mode: Mode,
) -> Result<PathBuf, String> {
    let advertise = match mode.hints {
        Hints::On => vec![],
        Hints::Off => vec![("advertise", format!("\"127.0.0.1:{}\"", free_port()?))],
    };
    let path = env.write_config(
        &format!("{election}-p{priority}.toml"),
        endpoint,
        &[election.to_owned()],
        &advertise,
    )?;
    set_sessions(&path, mode.sessions)?;
    // Top-level keys, so before the first table.
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = format!(
        "priority = {priority}\npreempt_after = \"{}ms\"\n{text}",
        PREEMPT_AFTER.as_millis()
    );
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The report of one mode, with the graceful handover of the same mode in
/// this run (if it ran) beside it.
pub fn report(
    out: &mut String,
    verdicts: &mut Vec<Verdict>,
    trials: &[PreemptTrial],
    mode: Mode,
    graceful: Option<&[FailoverTrial]>,
) {
    let after_s = PREEMPT_AFTER.as_secs_f64();
    let _ = writeln!(
        out,
        "A leaderd of priority 1 leads the election and runs the job; at a random point of its renewal cycle a leaderd of priority 2 starts (`preempt_after = \"{after_s}s\"` on both, `preempt` on). Once the leader has seen the newcomer eligible for preempt_after it hands the election over as `leaderd resign --to` does: it stops its job, writes the record released with the newcomer as `successor`, and follows → the newcomer's job writes its `start` line. 2 instances and a fresh election per trial; times from the priority-2 leaderd's spawn.\n"
    );
    mode_note(out, mode);
    let handovers: Vec<FailoverTrial> = trials.iter().map(|t| t.handover.clone()).collect();
    handover_rows(out, &handovers, "priority-2 spawn");
    let counted = trials.iter().filter(|t| t.counted).count();
    let _ = writeln!(
        out,
        "\nThe old leader counted the handover as a preemption (`leaderd_preemptions_total` 1) in {counted} of {} trials.",
        trials.len()
    );
    let wait = if mode.sessions {
        format!(
            "the newcomer's session writes its priority label as soon as it has one, and its stream to the leader names the session, which the leader looks up at once; the leader times its eligibility from then and hands over preempt_after = {after_s} s later, whatever R (here {} s); so priority-2 spawn → new child started is preempt_after plus start-up and the handover",
            R.as_secs()
        )
    } else {
        format!(
            "the newcomer's member record, written at its start and every R = {} s, counts once the leader has seen it change (a record left behind by a dead daemon never changes), so from its second write; the leader reads the member records at each round (every R) and hands over preempt_after = {after_s} s later; so priority-2 spawn → new child started lies between R + preempt_after and 2R + preempt_after, plus start-up and the handover{}",
            R.as_secs(),
            if mode.hints == Hints::Off {
                ", and one poll P for the newcomer to find the released record"
            } else {
                ""
            },
        )
    };
    let _ = writeln!(
        out,
        "\nWait: {wait} (bound: {:.1} s).",
        wait_bound(mode).as_secs_f64()
    );
    let gaps: Vec<f64> = handovers
        .iter()
        .filter_map(|t| t.old_end.map(|e| t.total - e))
        .collect();
    let gap = Summary::of(&gaps);
    match mode.hints {
        Hints::On => {
            let _ = writeln!(
                out,
                "Floor of the gap: the planned handover's, as for `resign --to`: the newcomer hears the `released` event, reads the record, finds itself the successor and takes it, a few store round trips after the old job's end; then its job's exec."
            );
        }
        Hints::Off => {
            let _ = writeln!(
                out,
                "Floor of the gap: the newcomer finds the released record at its next poll, 0 to P = {} s after the release write.",
                P.as_secs()
            );
        }
    }
    let graceful_gap = graceful.and_then(|g| {
        Summary::of(
            &g.iter()
                .filter_map(|t| t.old_end.map(|e| t.total - e))
                .collect::<Vec<_>>(),
        )
    });
    if let (Some(p), Some(g)) = (gap, graceful_gap) {
        let _ = writeln!(
            out,
            "Beside the graceful handover above (same mode, same run), old job's end → new job's start: preemption {:.0} ms median / {:.0} ms p95, graceful {:.0} ms / {:.0} ms.",
            p.median, p.p95, g.median, g.p95
        );
    }
    out.push('\n');

    let words = mode_words(mode);
    verdicts.push(Verdict {
        figure: format!("preemption ({words}): counted by the old leader"),
        target: "every trial".into(),
        measured: format!("{counted} of {}", trials.len()),
        margin: if counted == trials.len() {
            "inside"
        } else {
            "OUTSIDE"
        }
        .into(),
        pass: counted == trials.len(),
    });
    // The graceful handover's targets: a preemption is a planned handover.
    if let (Hints::On, Some(s)) = (mode.hints, gap) {
        verdicts.push(verdict(
            &format!("preemption ({words}), old job's end → new job's start, median"),
            HANDOVER_MEDIAN_TARGET_MS,
            s.median,
            "ms",
            s.n,
        ));
        verdicts.push(verdict(
            &format!("preemption ({words}), old job's end → new job's start, p95"),
            HANDOVER_P95_TARGET_MS,
            s.p95,
            "ms",
            s.n,
        ));
    }
    if let Some(s) = Summary::of(&handovers.iter().map(|t| t.total).collect::<Vec<_>>()) {
        verdicts.push(verdict(
            &format!(
                "preemption ({words}), priority-2 spawn → its job's start (preempt_after {after_s} s), max"
            ),
            wait_bound(mode).as_secs_f64(),
            s.max / 1e3,
            "s",
            s.n,
        ));
    }
}
