//! leaderd as PID 1 (it reaps zombies when it runs as PID 1), with a real
//! PID namespace (`unshare --pid --fork --mount-proc`, root only): orphans reparented to PID 1 are reaped, a signal sent to PID 1
//! reaches the real leaderd, and PID 1 exits with its exit code.
//!
//! [`leaderd::reaper::init_if_pid1`] must run before any thread exists, and a
//! libtest binary has threads before any test runs. So the process inside the
//! namespace is this test binary with `LEADERD_TEST_PID1` set, intercepted in
//! an `.init_array` constructor, which runs before `main` (single-threaded),
//! calls `init_if_pid1` and plays the real leaderd.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use leaderd::clock::boot_now;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::{Pid, getpid, getppid};

const PID1_ENV: &str = "LEADERD_TEST_PID1";
/// The real leaderd's exit code after the forwarded SIGTERM.
const EXIT_AFTER_TERM: i32 = 42;
const PATIENCE: Duration = Duration::from_secs(10);

#[used]
#[unsafe(link_section = ".init_array")]
static PID1_CONSTRUCTOR: extern "C" fn() = pid1_constructor;

extern "C" fn pid1_constructor() {
    if std::env::var_os(PID1_ENV).is_none() {
        return;
    }
    leaderd::reaper::init_if_pid1();
    std::process::exit(play_leaderd());
}

/// (pid, ppid, state, command name) of every process in this PID namespace.
fn processes() -> Vec<(i32, i32, String, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let mut fields = stat[close + 1..].split_ascii_whitespace();
        let state = fields.next().unwrap_or("?").to_owned();
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(-1);
        all.push((pid, ppid, state, stat[open + 1..close].to_owned()));
    }
    all
}

/// Waits until `cond` holds on the process list; returns the last list.
fn until(cond: impl Fn(&[(i32, i32, String, String)]) -> bool) -> Vec<(i32, i32, String, String)> {
    let start = boot_now();
    loop {
        let list = processes();
        if cond(&list) || boot_now() - start > PATIENCE {
            return list;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The real leaderd inside the namespace; prints what it observes, one fact
/// per line, for the test outside.
fn play_leaderd() -> i32 {
    println!("pid {} ppid {}", getpid(), getppid());
    // Leave orphans: a shell that starts three sleepers and exits at once.
    match Command::new("/bin/sh")
        .args(["-c", "sleep 1 & sleep 1 & sleep 1 & exit 0"])
        .status()
    {
        Ok(status) if status.success() => {}
        other => {
            println!("error: the orphan maker failed: {other:?}");
            return 1;
        }
    }
    let sleepers = |l: &[(i32, i32, String, String)]| {
        l.iter()
            .filter(|(_, ppid, _, comm)| comm == "sleep" && *ppid == 1)
            .count()
    };
    // (A sleeper is still named `sh` until its fork has exec'd.)
    println!(
        "orphans of pid 1: {}",
        sleepers(&until(|l| sleepers(l) >= 3))
    );
    // Once they exit, an init that does not reap keeps them as zombies.
    let list = until(|l| l.iter().all(|(_, _, _, comm)| comm != "sleep"));
    let left: Vec<String> = list
        .iter()
        .filter(|(pid, ..)| *pid != 1 && *pid != getpid().as_raw())
        .map(|(pid, ppid, state, comm)| format!("{pid}:{comm}:{state}:ppid={ppid}"))
        .collect();
    println!("left over: [{}]", left.join(" "));

    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    if term.thread_block().is_err() {
        println!("error: cannot block SIGTERM");
        return 1;
    }
    println!("ready");
    match term.wait() {
        Ok(Signal::SIGTERM) => EXIT_AFTER_TERM,
        other => {
            println!("error: sigwait: {other:?}");
            1
        }
    }
}

#[test]
fn as_pid1_orphans_are_reaped_signals_forwarded_and_the_exit_code_kept() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { nix::libc::geteuid() };
    assert!(
        euid == 0,
        "this test needs root (unshare --pid --mount-proc); run it as root"
    );
    // --kill-child: the namespace's init (and so the namespace) dies with
    // `unshare`, which `Namespace` kills when the test fails.
    let mut namespace = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
        .arg(std::env::current_exe().expect("test binary"))
        .env(PID1_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("`unshare` (util-linux) must be installed: apt-get install util-linux");
    let stdout = namespace.stdout.take().expect("piped stdout");
    let mut owner = Namespace(namespace);
    let namespace = &mut owner.0;
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    loop {
        // Longer than the inner waits, so their findings get reported.
        match lines.recv_timeout(3 * PATIENCE) {
            Ok(line) if line == "ready" => break,
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = namespace.kill();
                panic!("no `ready` from the namespace ({e}); it said: {seen:?}");
            }
        }
    }
    assert_eq!(seen[0], "pid 2 ppid 1", "leaderd runs under the init");
    assert_eq!(seen[1], "orphans of pid 1: 3", "the orphans went to PID 1");
    assert_eq!(seen[2], "left over: []", "no zombie (or anything) remains");

    // The init: the child of `unshare`, seen from here.
    let init = until(|_| true)
        .into_iter()
        .find(|(_, ppid, ..)| *ppid == namespace.id() as i32)
        .map(|(pid, ..)| pid)
        .expect("the namespace's init is a child of unshare");
    kill(Pid::from_raw(init), Signal::SIGTERM).expect("signal the init");

    let start = boot_now();
    let status = loop {
        if let Some(status) = namespace.try_wait().expect("wait for unshare") {
            break status;
        }
        if boot_now() - start > PATIENCE {
            let _ = namespace.kill();
            panic!("the namespace did not exit after SIGTERM to its init");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        Some(EXIT_AFTER_TERM),
        "SIGTERM reached leaderd and PID 1 exited with its code"
    );
}

/// Kills `unshare` (and with it the namespace) if the test ends early.
struct Namespace(std::process::Child);

impl Drop for Namespace {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
