//! The child under supervision, with real processes: its process group and
//! environment, forwarded signals, exit codes, start failures, stop, kill,
//! and drop. Deadlines and the loss of leaderd or the guard are in
//! `tests/guard.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;

use common::procfs;
use leaderd::clock::boot_now;
use leaderd::supervisor::{self, ChildExit, ChildSpec, SupervisorError};
use nix::sys::signal::Signal;

/// Generous bound for anything that should take milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

fn spec(script: &str) -> ChildSpec {
    ChildSpec {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![
            ("LEADERD_ELECTION".into(), "report".into()),
            ("LEADERD_IDENTITY".into(), "web-7f9c".into()),
            ("LEADERD_FENCING_TOKEN".into(), "1700000000042".into()),
            ("LEADERD_LEASE_MS".into(), "10000".into()),
        ],
        stop_signal: Signal::SIGTERM,
        guard_exe: PathBuf::from(env!("CARGO_BIN_EXE_leaderd")),
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = boot_now();
    while !cond() {
        assert!(boot_now() - start < PATIENCE, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn read_when_present(path: &Path) -> String {
    let start = boot_now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            boot_now() - start < PATIENCE,
            "timed out waiting for {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn child_runs_in_its_own_group_with_the_leaderd_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("env");
    let script = format!(
        r#"printf '%s\n' "$LEADERD_ELECTION" "$LEADERD_IDENTITY" "$LEADERD_FENCING_TOKEN" "$LEADERD_LEASE_MS" > {out}.tmp && mv {out}.tmp {out}; exec sleep 1000"#,
        out = out.display()
    );
    let mut child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    let env = read_when_present(&out).await;
    assert_eq!(env, "report\nweb-7f9c\n1700000000042\n10000\n");

    let pid = child.pid();
    // stat fields after the name: 0 state, 1 ppid, 2 pgrp, 3 session.
    assert_eq!(
        procfs::stat(pid).expect("process exists").pgrp,
        pid,
        "the child leads its own process group"
    );
    let guard = procfs::stat(pid).expect("process exists").ppid;
    let own_group = nix::unistd::getpgrp().as_raw();
    assert_ne!(
        procfs::stat(guard).expect("process exists").pgrp,
        own_group,
        "the guard is outside leaderd's group"
    );
    assert_ne!(
        procfs::stat(guard).expect("process exists").pgrp,
        pid,
        "the guard is outside the child's group"
    );

    // The guard's end of the control socket is not inherited by the child.
    let cmdline = std::fs::read(format!("/proc/{guard}/cmdline")).expect("guard cmdline");
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let fd_at = args
        .iter()
        .position(|a| a == "--control-fd")
        .expect("guard has --control-fd");
    let control = std::fs::read_link(format!("/proc/{guard}/fd/{}", args[fd_at + 1]))
        .expect("guard holds its control socket");
    let control = control.to_string_lossy().into_owned();
    assert!(control.starts_with("socket:"), "{control}");
    procfs::open_fds(pid).expect("the child's descriptors are readable");
    assert!(
        !procfs::socket_inodes(pid).contains(&control),
        "the child inherited the guard's control socket {control}"
    );

    child.kill().await.expect("kill");
    assert_eq!(child.wait().await, ChildExit::Killed);
    assert!(!procfs::alive(pid));
}

#[tokio::test]
async fn forwarded_signals_reach_the_child() {
    let dir = tempfile::tempdir().expect("temp dir");
    let got = dir.path().join("got");
    let ready = dir.path().join("ready");
    let names = ["HUP", "QUIT", "USR1", "USR2", "WINCH", "TERM", "INT"];
    // stderr off: the shell reports each `sleep` the signals end.
    let mut script = String::from("exec 2>/dev/null\n");
    for name in names {
        script.push_str(&format!("trap 'echo {name} >> {}' {name}\n", got.display()));
    }
    script.push_str(&format!(
        "echo $$ > {}\nwhile :; do sleep 0.05; done\n",
        ready.display()
    ));
    let mut child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    read_when_present(&ready).await;

    let signals = [
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
        Signal::SIGTERM,
        Signal::SIGINT,
    ];
    for (i, sig) in signals.into_iter().enumerate() {
        child.signal(sig).await.expect("signal forwarded");
        let want: String = names[..=i].iter().map(|n| format!("{n}\n")).collect();
        eventually(&format!("the child traps {sig}"), || {
            std::fs::read_to_string(&got).is_ok_and(|t| t == want)
        })
        .await;
    }
    assert!(procfs::alive(child.pid()), "every signal was trapped");
    child.kill().await.expect("kill");
    assert_eq!(child.wait().await, ChildExit::Killed);
}

#[tokio::test]
async fn exit_code_is_passed_on() {
    let mut child = supervisor::spawn(&spec("exit 3"), None)
        .await
        .expect("child starts");
    let exit = child.wait().await;
    assert_eq!(exit, ChildExit::Exited(3));
    assert_eq!(exit.exit_code(), 3);
    assert_eq!(exit.reason(), "exited");
    // wait() is idempotent, and there is nothing left to signal.
    assert_eq!(child.wait().await, ChildExit::Exited(3));
    assert!(matches!(
        child.signal(Signal::SIGTERM).await,
        Err(SupervisorError::Gone)
    ));
}

#[tokio::test]
async fn death_by_signal_is_128_plus_n() {
    let mut child = supervisor::spawn(&spec("ulimit -c 0; kill -SEGV $$"), None)
        .await
        .expect("child starts");
    let exit = child.wait().await;
    assert_eq!(exit, ChildExit::Signaled(Signal::SIGSEGV as i32));
    assert_eq!(exit.exit_code(), 139);
    assert_eq!(exit.reason(), "signaled");
}

#[tokio::test]
async fn stop_sends_the_stop_signal_to_the_group() {
    let mut child = supervisor::spawn(&spec("exec sleep 1000"), None)
        .await
        .expect("child starts");
    child.stop(Duration::from_secs(60)).await.expect("stop");
    let exit = child.wait().await;
    assert_eq!(exit, ChildExit::Signaled(Signal::SIGTERM as i32));
    assert_eq!(exit.exit_code(), 143);
}

#[tokio::test]
async fn stop_wakes_a_paused_child_so_it_can_exit_gracefully() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("ready");
    let script = format!(
        "exec 2>/dev/null; trap 'exit 7' TERM; echo > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    read_when_present(&ready).await;
    let pid = child.pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGSTOP).expect("pause");
    eventually("the child is stopped", || {
        procfs::stat(pid).is_some_and(|s| s.state == 'T')
    })
    .await;
    // A grace far beyond the wait below: only a graceful exit passes.
    child.stop(Duration::from_secs(300)).await.expect("stop");
    let exit = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the paused child ran its TERM handler");
    assert_eq!(exit, ChildExit::Exited(7));
}

#[tokio::test]
async fn stop_kills_after_the_grace_when_the_child_ignores_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("ready");
    let stopped = dir.path().join("stopped");
    let script = format!(
        "exec 2>/dev/null; trap 'echo > {stopped}' TERM; echo $$ > {ready}; while :; do sleep 0.05; done",
        stopped = stopped.display(),
        ready = ready.display()
    );
    let mut child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    read_when_present(&ready).await;
    let grace = Duration::from_millis(800);
    let asked = boot_now();
    child.stop(grace).await.expect("stop");
    read_when_present(&stopped).await;
    let exit = child.wait().await;
    let took = boot_now() - asked;
    assert_eq!(exit, ChildExit::Killed);
    assert_eq!(exit.exit_code(), 137);
    assert!(took >= grace, "killed before the grace ended: {took:?}");
    assert!(took < grace + PATIENCE, "killed far too late: {took:?}");
}

#[tokio::test]
async fn kill_ends_the_whole_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; sleep 1000 & echo $! > {ready}.tmp; mv {ready}.tmp {ready}; while :; do sleep 0.05; done",
        ready = ready.display()
    );
    let mut child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    let grandchild: i32 = read_when_present(&ready).await.trim().parse().expect("pid");
    assert!(procfs::alive(grandchild));
    child.kill().await.expect("kill");
    assert_eq!(child.wait().await, ChildExit::Killed);
    // wait() resolves only once the group is gone.
    assert!(!procfs::alive(child.pid()));
    assert!(!procfs::alive(grandchild));
}

#[tokio::test]
async fn dropping_the_child_kills_the_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; sleep 1000 & echo $! > {ready}.tmp; mv {ready}.tmp {ready}; while :; do sleep 0.05; done",
        ready = ready.display()
    );
    let child = supervisor::spawn(&spec(&script), None)
        .await
        .expect("child starts");
    let grandchild: i32 = read_when_present(&ready).await.trim().parse().expect("pid");
    let pid = child.pid();
    drop(child);
    eventually("the group is gone after drop", || {
        !procfs::alive(pid) && !procfs::alive(grandchild)
    })
    .await;
}

#[tokio::test]
async fn start_failures_are_errors() {
    let mut empty = spec("true");
    empty.command.clear();
    assert!(matches!(
        supervisor::spawn(&empty, None).await,
        Err(SupervisorError::EmptyCommand)
    ));

    let mut missing = spec("true");
    missing.command = vec!["/nonexistent/leaderd-test-command".into()];
    match supervisor::spawn(&missing, None).await {
        Err(SupervisorError::Spawn(failure)) => {
            assert!(
                failure
                    .message
                    .contains("/nonexistent/leaderd-test-command"),
                "{failure:?}"
            );
            assert_eq!(failure.exit_code, Some(127), "not found, as a shell says");
        }
        other => panic!("expected a spawn error, got {other:?}"),
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let plain = dir.path().join("job.sh");
    std::fs::write(&plain, "#!/bin/sh\n").expect("write a file without x bits");
    let mut not_executable = spec("true");
    not_executable.command = vec![plain.display().to_string()];
    match supervisor::spawn(&not_executable, None).await {
        Err(SupervisorError::Spawn(failure)) => {
            assert_eq!(failure.exit_code, Some(126), "{failure:?}")
        }
        other => panic!("expected a spawn error, got {other:?}"),
    }

    let mut no_guard = spec("true");
    no_guard.guard_exe = PathBuf::from("/nonexistent/leaderd");
    assert!(matches!(
        supervisor::spawn(&no_guard, None).await,
        Err(SupervisorError::GuardStart { .. })
    ));
}

#[tokio::test]
async fn a_passed_deadline_never_starts_the_child() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let script = format!("echo > {}", ran.display());
    let now = boot_now();
    let late = supervisor::spawn(
        &spec(&script),
        Some((
            now.saturating_sub(Duration::from_millis(1)),
            now + Duration::from_secs(1),
        )),
    )
    .await;
    assert!(
        matches!(late, Err(SupervisorError::DeadlinePassed)),
        "{late:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ran.exists(), "the command ran after its deadline");
}
