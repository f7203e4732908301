//! leaderd as PID 1 of a new PID namespace (a container's init): orphans of
//! the child are reaped, no zombie remains, and SIGTERM to PID 1 reaches the
//! child through leaderd.

use crate::common;

use common::procfs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn as_pid1_no_zombie_remains_and_sigterm_reaches_the_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("l.db");
    let marker = dir.path().join("started");
    // The child leaves short-lived orphans behind (background jobs of
    // subshells that exit at once), then waits.
    let script = r#"for i in 1 2 3 4; do (sleep 0.2 &); done; touch "$0"; exec sleep 1000"#;
    let mut ns = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_leaderd"))
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "sqlite",
            "--store-path",
        ])
        .arg(&db)
        .args(["--", "sh", "-c", script])
        .arg(&marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) is needed: apt-get install util-linux");
    let unshare_pid = ns.id() as i32;
    assert!(
        wait_for(Duration::from_secs(20), || marker.exists()),
        "the child never started under PID-1 leaderd"
    );
    // Orphans exit after 0.2 s; give the reapers time.
    std::thread::sleep(Duration::from_millis(1_500));
    let procs = procfs::descendants(unshare_pid);
    let zombies: Vec<_> = procs.iter().filter(|(_, s)| *s == 'Z').collect();
    assert!(zombies.is_empty(), "zombies left: {zombies:?} of {procs:?}");
    assert!(
        procs.len() >= 3,
        "init, leaderd, guard and child expected: {procs:?}"
    );

    // PID 1 of the namespace is unshare's only child.
    let init = procs
        .iter()
        .map(|(p, _)| *p)
        .find(|p| procfs::stat(*p).is_some_and(|s| s.ppid == unshare_pid))
        .expect("namespace init");
    kill(Pid::from_raw(init), Signal::SIGTERM).expect("signal PID 1");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = ns.try_wait().expect("wait unshare") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "PID-1 leaderd did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = ns.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    // The child (sleep) died of the forwarded SIGTERM: 128 + 15.
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(
        !Path::new(&format!("/proc/{init}")).exists()
            || procfs::stat(init).is_none_or(|s| s.state == 'Z')
    );
}
