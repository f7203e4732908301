//! The guard owns the kill deadline, with real processes: the
//! stop signal at `stop_at` and SIGKILL to the whole group (including a
//! grandchild that ignores SIGTERM) at `kill_at`; re-arming keeps the child
//! alive; leaderd kills the group when the guard dies. The same with the real
//! daemon (kill -9 of leaderd, SIGSTOP of leaderd alone) is in
//! tests/child_faults.rs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;

use common::procfs;
use leaderd::clock::{Instant, boot_now};
use leaderd::supervisor::{self, ChildExit, ChildSpec};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Generous bound for anything that should take milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);
/// Allowed lateness of a deadline action. Generous: the machine is shared.
const SLACK: Duration = Duration::from_secs(1);
/// /proc/uptime has a resolution of 10 ms and is truncated.
const UPTIME_RESOLUTION: Duration = Duration::from_millis(20);

fn spec(dir: &Path) -> ChildSpec {
    // The child traps the stop signal (records when it came, by the boot-time
    // clock, and keeps running) and has a grandchild that ignores it: only
    // SIGKILL to the whole group ends them.
    let d = dir.display();
    let script = format!(
        r#"exec 2>/dev/null
trap '' TERM
sleep 1000 &
gc=$!
trap 'read up rest < /proc/uptime; echo $up > {d}/stopped' TERM
echo "$$ $gc" > {d}/ready
while :; do sleep 0.05; done
"#
    );
    ChildSpec {
        command: vec!["/bin/sh".into(), "-c".into(), script],
        env: vec![("LEADERD_ELECTION".into(), "report".into())],
        stop_signal: Signal::SIGTERM,
        guard_exe: PathBuf::from(env!("CARGO_BIN_EXE_leaderd")),
    }
}

fn read_when_present(path: &Path, within: Duration) -> String {
    let start = boot_now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            boot_now() - start < within,
            "timed out waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (child pid, grandchild pid) from the ready file.
fn ready(dir: &Path) -> (i32, i32) {
    let text = read_when_present(&dir.join("ready"), PATIENCE);
    let mut pids = text
        .split_ascii_whitespace()
        .map(|p| p.parse().expect("pid"));
    let pair = (
        pids.next().expect("child pid"),
        pids.next().expect("grandchild pid"),
    );
    assert!(procfs::alive(pair.0) && procfs::alive(pair.1));
    pair
}

/// When the child saw the stop signal, on the boot-time clock.
fn stopped_at(dir: &Path, within: Duration) -> Instant {
    let text = read_when_present(&dir.join("stopped"), within);
    let secs: f64 = text.trim().parse().expect("uptime seconds");
    Instant::from_since_origin(Duration::from_secs_f64(secs))
}

/// Polls until both processes are gone; returns when that was seen.
fn gone(pids: (i32, i32), within: Duration) -> Instant {
    let start = boot_now();
    loop {
        if !procfs::alive(pids.0) && !procfs::alive(pids.1) {
            return boot_now();
        }
        assert!(
            boot_now() - start < within,
            "child {} or grandchild {} still alive after {within:?}",
            pids.0,
            pids.1
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test]
async fn unrenewed_deadline_stops_then_kills_the_whole_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let now = boot_now();
    let (stop_at, kill_at) = (
        now + Duration::from_secs(2),
        now + Duration::from_millis(3500),
    );
    let mut child = supervisor::spawn(&spec(dir.path()), Some((stop_at, kill_at)))
        .await
        .expect("child starts");
    let pids = ready(dir.path());

    let stop_seen = stopped_at(dir.path(), PATIENCE);
    assert!(
        stop_seen + UPTIME_RESOLUTION >= stop_at,
        "stop signal {:?} before stop_at",
        stop_at - stop_seen
    );
    assert!(
        stop_seen <= stop_at + SLACK,
        "stop signal {:?} after stop_at",
        stop_seen - stop_at
    );

    let dead = gone(pids, PATIENCE);
    assert!(
        dead >= kill_at,
        "killed {:?} before kill_at",
        kill_at - dead
    );
    assert!(
        dead <= kill_at + SLACK,
        "still alive {:?} after kill_at",
        dead - kill_at
    );
    assert_eq!(child.wait().await, ChildExit::Killed);
}

#[tokio::test]
async fn rearming_keeps_the_child_alive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (stop_in, kill_in) = (Duration::from_secs(3), Duration::from_secs(4));
    let now = boot_now();
    let mut child = supervisor::spawn(&spec(dir.path()), Some((now + stop_in, now + kill_in)))
        .await
        .expect("child starts");
    let pids = ready(dir.path());

    let mut last_kill_at = now + kill_in;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = boot_now();
        last_kill_at = now + kill_in;
        child.arm(now + stop_in, last_kill_at).await.expect("arm");
        assert!(
            procfs::alive(pids.0) && procfs::alive(pids.1),
            "killed although re-armed"
        );
        assert!(
            !dir.path().join("stopped").exists(),
            "stop signal although re-armed"
        );
    }
    // No more renewals: the last deadline applies.
    let dead = gone(pids, PATIENCE);
    assert!(dead >= last_kill_at);
    assert!(
        dead <= last_kill_at + SLACK,
        "{:?} late",
        dead - last_kill_at
    );
    assert!(dir.path().join("stopped").exists(), "no stop signal first");
    assert_eq!(child.wait().await, ChildExit::Killed);
}

#[tokio::test]
async fn disarm_removes_the_deadline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let now = boot_now();
    let kill_at = now + Duration::from_secs(4);
    let mut child = supervisor::spawn(
        &spec(dir.path()),
        Some((now + Duration::from_secs(3), kill_at)),
    )
    .await
    .expect("child starts");
    child.disarm().await.expect("disarm");
    let pids = ready(dir.path());
    tokio::time::sleep(kill_at - boot_now() + Duration::from_secs(1)).await;
    assert!(
        procfs::alive(pids.0) && procfs::alive(pids.1),
        "killed after disarm"
    );
    assert!(!dir.path().join("stopped").exists(), "stopped after disarm");
    child.kill().await.expect("kill");
    assert_eq!(child.wait().await, ChildExit::Killed);
    assert!(!procfs::alive(pids.0) && !procfs::alive(pids.1));
}

#[tokio::test]
async fn a_stop_never_kills_later_than_the_armed_kill_at() {
    let dir = tempfile::tempdir().expect("temp dir");
    let now = boot_now();
    let kill_at = now + Duration::from_secs(3);
    let mut child = supervisor::spawn(
        &spec(dir.path()),
        Some((now + Duration::from_secs(60), kill_at)),
    )
    .await
    .expect("child starts");
    let pids = ready(dir.path());
    let asked = boot_now();
    child.stop(Duration::from_secs(60)).await.expect("stop");
    let stop_seen = stopped_at(dir.path(), PATIENCE);
    assert!(stop_seen + UPTIME_RESOLUTION >= asked);
    let dead = gone(pids, PATIENCE);
    assert!(dead >= kill_at, "killed {:?} early", kill_at - dead);
    assert!(dead <= kill_at + SLACK, "{:?} late", dead - kill_at);
    assert_eq!(child.wait().await, ChildExit::Killed);
}

#[tokio::test]
async fn guard_death_makes_leaderd_kill_the_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = supervisor::spawn(&spec(dir.path()), None)
        .await
        .expect("child starts");
    let pids = ready(dir.path());
    let guard = procfs::stat(pids.0).expect("process exists").ppid;
    assert_ne!(guard, std::process::id() as i32, "the guard is the parent");
    kill(Pid::from_raw(guard), Signal::SIGKILL).expect("kill the guard");
    let exit = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("wait() notices the guard's death");
    assert_eq!(exit, ChildExit::Killed);
    gone(pids, PATIENCE);
}
