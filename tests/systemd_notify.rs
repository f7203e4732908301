//! `Type=notify`: leaderd sends READY=1 once HTTP is up and every
//! election was observed once, STATUS= on leadership changes, WATCHDOG=1 when
//! systemd asks for it, STOPPING=1 on shutdown; the child never sees
//! NOTIFY_SOCKET.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec};
use nix::sys::signal::Signal;

#[test]
fn ready_status_watchdog_stopping_in_order_and_child_env_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let env_dump = dir.path().join("child.env");
    let mut node = Leaderd::start(Spec {
        identity: "unit",
        args: [
            "--store",
            "sqlite",
            "--store-path",
            dir.path().join("l.db").to_str().expect("utf-8"),
            "--election",
            "job",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        env: vec![
            ("NOTIFY_SOCKET".into(), sock_path.display().to_string()),
            ("WATCHDOG_USEC".into(), "600000".into()),
        ],
        command: vec![
            "sh".into(),
            "-c".into(),
            "env > \"$0\"; exec sleep 1000".into(),
            env_dump.display().to_string(),
        ],
        dir: dir.path(),
    });

    let mut messages: Vec<String> = Vec::new();
    let recv_until = |pred: &dyn Fn(&[String]) -> bool, limit: Duration, msgs: &mut Vec<String>| {
        let t0 = Instant::now();
        let mut buf = [0u8; 4096];
        while !pred(msgs) && t0.elapsed() < limit {
            if let Ok(n) = sock.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                msgs.extend(text.lines().map(String::from));
            }
        }
        assert!(pred(msgs), "notifications so far: {msgs:?}");
    };
    recv_until(
        &|m: &[String]| m.iter().filter(|l| *l == "WATCHDOG=1").count() >= 2,
        Duration::from_secs(10),
        &mut messages,
    );
    node.wait_http(Duration::from_secs(5));
    common::daemon::wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&env_dump).is_ok_and(|e| e.contains("LEADERD_"))
    })
    .expect("the child ran and wrote its environment");
    node.signal(Signal::SIGTERM);
    recv_until(
        &|m: &[String]| m.iter().any(|l| l == "STOPPING=1"),
        Duration::from_secs(10),
        &mut messages,
    );
    node.wait_exit(Duration::from_secs(10))
        .expect("leaderd exits");

    let pos = |pred: &dyn Fn(&String) -> bool| messages.iter().position(pred);
    let ready = pos(&|l| l == "READY=1").expect("READY=1");
    let status =
        pos(&|l| l.starts_with("STATUS=") && l.contains("leader of job")).expect("STATUS= leader");
    let watchdog = pos(&|l| l == "WATCHDOG=1").expect("WATCHDOG=1");
    let stopping = pos(&|l| l == "STOPPING=1").expect("STOPPING=1");
    assert!(
        ready < status && status <= watchdog + 1 && watchdog < stopping,
        "{messages:?}"
    );
    assert_eq!(messages.iter().filter(|l| *l == "READY=1").count(), 1);

    let child_env = std::fs::read_to_string(&env_dump).expect("the child ran");
    assert!(child_env.contains("LEADERD_FENCING_TOKEN="), "{child_env}");
    assert!(
        !child_env.contains("NOTIFY_SOCKET"),
        "child must not inherit NOTIFY_SOCKET"
    );
    assert!(
        !child_env.contains("WATCHDOG_USEC"),
        "child must not inherit WATCHDOG_USEC"
    );
}
