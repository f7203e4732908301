//! The SQLite file as operators treat it, with real processes: many
//! instances started at once on a fresh file, the file deleted under a
//! running leader, `leaderd status` on a missing file or as a read-only
//! user, and a `leases` table that belongs to another tool.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, sqlite_short_args, wait_until};

/// Instances started together at boot (systemd units, a shell loop) on a file
/// that does not exist yet all come up: store set-up waits for another
/// process's lock within a bound, like every request does.
#[test]
fn simultaneous_starts_on_a_fresh_file_all_stay_up() {
    const ROUNDS: usize = 20;
    const INSTANCES: usize = 5;
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..ROUNDS {
        let db = dir.path().join(format!("round-{round}.db"));
        let mut children: Vec<_> = (0..INSTANCES)
            .map(|i| {
                let log = std::fs::File::create(dir.path().join(format!("r{round}-{i}.log")))
                    .expect("log file");
                // Each one stops itself just before it becomes leaderd; all
                // are let go at once below, as close to simultaneous as
                // processes get.
                Command::new("sh")
                    .args([
                        "-c",
                        r#"kill -STOP $$; exec "$0" "$@""#,
                        leaderd_bin(),
                        "run",
                    ])
                    .args(sqlite_short_args(&db, "boot"))
                    .args(["--listen", "127.0.0.1:0", "--identity", &format!("i{i}")])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("start leaderd")
            })
            .collect();
        for child in &children {
            let pid = child.id() as i32;
            wait_until(Duration::from_secs(10), || {
                common::procfs::stat(pid).is_some_and(|s| s.state == 'T')
            })
            .expect("the instance stops before exec");
        }
        for child in &children {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
        std::thread::sleep(Duration::from_millis(1_500));
        let mut died = Vec::new();
        for (i, child) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.path().join(format!("r{round}-{i}.log")))
                    .unwrap_or_default();
                died.push(format!("instance {i} exited ({status}):\n{log}"));
            }
        }
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(died.is_empty(), "round {round}: {}", died.join("\n"));
    }
}

/// Deleting the file under a running leader: the leader notices that its
/// path no longer names the file it has open and stops leading at once, so
/// an instance that creates a fresh file never runs its job beside the old
/// one's.
#[test]
fn the_file_deleted_under_a_leader_never_makes_two_leaders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leaderd.db");
    let history = dir.path().join("history");
    let job = |h: &Path| common::job_command(h);
    let start = |id: &str| {
        let node = Leaderd::start(Spec {
            identity: id,
            args: sqlite_short_args(&db, "job"),
            env: vec![],
            command: job(&history),
            dir: dir.path(),
        });
        node.wait_http(Duration::from_secs(20));
        node
    };
    let a = start("a");
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    std::thread::sleep(Duration::from_millis(1_500));

    // A careless `rm leaderd.db*`, then a new instance on the same path.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let b = start("b");
    wait_until(Duration::from_secs(15), || b.is_leader() || a.is_leader())
        .expect("someone leads again");
    std::thread::sleep(Duration::from_secs(4));
    let both = a.is_leader() && b.is_leader();
    assert!(!both, "a and b both lead:\n{}\n{}", a.log(), b.log());
    assert!(
        a.log().contains("deleted or replaced"),
        "a must say what happened:\n{}",
        a.log()
    );
    drop(a);
    drop(b);
    let log = std::fs::read_to_string(&history).expect("history");
    if let Err(v) = common::history::check(&log) {
        panic!("{v}\n{log}");
    }
}

fn status(args: &[&str], setpriv: bool) -> std::process::Output {
    let mut cmd = if setpriv {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            leaderd_bin(),
        ]);
        c
    } else {
        Command::new(leaderd_bin())
    };
    cmd.arg("status")
        .args(args)
        .output()
        .expect("run leaderd status")
}

/// `leaderd status` only reads: a missing file is an error naming the path
/// (and stays missing), and a user who may only read the file can still see
/// who leads.
#[test]
fn status_is_read_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.db");
    let out = status(&["--store-path", missing.to_str().expect("utf-8")], false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(missing.to_str().expect("utf-8")),
        "{stderr}"
    );
    assert!(!missing.exists(), "status created the file");

    // A store written by root, read by nobody.
    let db = dir.path().join("leaderd.db");
    let a = Leaderd::start(Spec {
        identity: "a",
        args: sqlite_short_args(&db, "job"),
        env: vec![],
        command: vec![],
        dir: dir.path(),
    });
    wait_until(Duration::from_secs(10), || a.is_leader()).expect("a leads");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = status(&["--store-path", db.to_str().expect("utf-8")], true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("job") && stdout.contains("held"),
        "{stdout}"
    );
}

/// A `leases` table of another tool is not usable and will not become
/// usable: `leaderd run` exits 69 with one line naming what is wrong.
#[test]
fn a_foreign_leases_table_exits_69() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("other.db");
    rusqlite::Connection::open(&db)
        .and_then(|c| c.execute_batch("CREATE TABLE leases (id INTEGER PRIMARY KEY, owner TEXT)"))
        .expect("another tool's table");
    let (out, ended) = output_within(
        Command::new(leaderd_bin())
            .arg("run")
            .args(sqlite_short_args(&db, "job"))
            .args(["--listen", "127.0.0.1:0"]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(ended, "still running after 30 s:\n{stderr}");
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("rvn") && errors[0].contains("other.db"),
        "{stderr}"
    );
}
