//! `http.advertise`: the address a leader writes into its record
//! (`holder_meta.address`) for other instances to reach it, as `leaderd
//! status` shows it; bad values are configuration errors; a follower tells
//! (metric and log) whether the leader's address lets it watch.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, sqlite_short_args, wait_until};

/// The `holder_address` `leaderd status --json` shows for `election`.
fn holder_address(db: &Path, election: &str) -> Option<String> {
    let out = Command::new(leaderd_bin())
        .args(["status", "--json", "--store-path"])
        .arg(db)
        .arg(election)
        .output()
        .expect("leaderd status");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    rows[0]["holder_address"].as_str().map(str::to_owned)
}

fn lead(dir: &Path, db: &Path, extra: &[&str]) -> Leaderd {
    let mut args: Vec<String> = vec!["--store-path".into(), db.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--election".into(), "web".into()]);
    let node = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![],
        command: vec![],
        dir,
    });
    wait_until(Duration::from_secs(15), || node.is_leader())
        .unwrap_or_else(|| panic!("does not lead; log:\n{}", node.log()));
    node
}

#[test]
fn the_advertised_address_is_in_the_record_while_leading() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Default with a specific listen address: that address, bound port.
    let db = dir.path().join("default.db");
    let node = lead(dir.path(), &db, &[]);
    assert_eq!(
        holder_address(&db, "web"),
        Some(format!("127.0.0.1:{}", node.port))
    );
    drop(node);

    // Set explicitly, by flag or environment; an IPv6 address without
    // brackets gets them.
    let db = dir.path().join("flag.db");
    let _node = lead(dir.path(), &db, &["--advertise", "10.1.2.3:9777"]);
    assert_eq!(holder_address(&db, "web").as_deref(), Some("10.1.2.3:9777"));
    let db = dir.path().join("v6.db");
    let _node = lead(dir.path(), &db, &["--advertise", "::1:9777"]);
    assert_eq!(holder_address(&db, "web").as_deref(), Some("[::1]:9777"));
}

#[test]
fn bad_advertise_values_are_config_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (value, says) in [
        ("example", "is not HOST:PORT"),
        ("10.0.0.1", "is not HOST:PORT"),
        ("10.0.0.1:0", "has port 0"),
        ("no-such-host.invalid:9777", "does not resolve"),
        ("0.0.0.0:9777", "unspecified address"),
        ("[::]:9777", "unspecified address"),
        (":::9777", "unspecified address"),
    ] {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(["run", "--listen", "127.0.0.1:0", "--store-path"])
            .arg(dir.path().join("leases.db"))
            .args(["--advertise", value, "--", "true"]);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(ended, "{value}: kept running");
        assert_eq!(out.status.code(), Some(64), "{value}: {stderr}");
        assert!(
            stderr.contains("http.advertise = ")
                && stderr.contains("(from --advertise)")
                && stderr.contains(says),
            "{value}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{value}: {stderr}");
    }
}

/// An unspecified address is refused from the environment and the file
/// too, naming the key.
#[test]
fn an_unspecified_advertise_address_is_refused_wherever_it_is_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("leaderd.toml");
    std::fs::write(&file, "[http]\nadvertise = \"0.0.0.0:9777\"\n").expect("write config");
    let run = || {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(["run", "--listen", "127.0.0.1:0", "--store-path"])
            .arg(dir.path().join("leases.db"));
        cmd
    };
    let mut from_env = run();
    from_env.env("LEADERD_HTTP__ADVERTISE", "[::]:9777");
    let mut from_file = run();
    from_file.arg("--config").arg(&file);
    for (what, mut cmd) in [("environment", from_env), ("file", from_file)] {
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(ended, "{what}: kept running");
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        assert!(
            stderr.contains("http.advertise") && stderr.contains("unspecified address"),
            "{what}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
    }
}

/// `leaderd_watching_leader{election="web"}` of `node`, if it answers.
fn watching(node: &Leaderd) -> Option<f64> {
    node.metric("leaderd_watching_leader{election=\"web\"}")
}

/// A pair on one SQLite file with short timing (P = 250 ms): `a` leads
/// with `extra`, then `b` follows.
fn pair(dir: &Path, db: &Path, extra: &[&str]) -> (Leaderd, Leaderd) {
    let start = |identity, extra: &[&str]| {
        let mut args = sqlite_short_args(db, "web");
        args.extend(extra.iter().map(|s| s.to_string()));
        Leaderd::start(Spec {
            identity,
            args,
            env: vec![],
            command: vec![],
            dir,
        })
    };
    let a = start("a", extra);
    wait_until(Duration::from_secs(15), || a.is_leader())
        .unwrap_or_else(|| panic!("a does not lead; log:\n{}", a.log()));
    let b = start("b", &[]);
    b.wait_http(Duration::from_secs(15));
    (a, b)
}

#[test]
fn a_follower_tells_whether_it_hears_the_leader() {
    let dir = tempfile::tempdir().expect("tempdir");

    // A reachable leader: its follower watches (within one renewal, R = 1 s)
    // and says nothing about it; the leader itself does not count.
    let (a, b) = pair(dir.path(), &dir.path().join("reachable.db"), &[]);
    wait_until(Duration::from_secs(5), || watching(&b) == Some(1.0))
        .unwrap_or_else(|| panic!("b does not watch a; b's log:\n{}", b.log()));
    assert_eq!(watching(&a), Some(0.0));
    assert!(!b.log().contains("cannot watch the leader"), "{}", b.log());
    drop((a, b));

    // A leader advertising a port nobody listens on: its follower polls,
    // says so once (the same failure again and again is no news), and the
    // gauge stays 0.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = pair(
        dir.path(),
        &dir.path().join("closed.db"),
        &["--advertise", &closed],
    );
    // Failures at 0, P, 3P, 7P, 15P (the retry pause doubles from P).
    let warned = |log: &str| {
        log.lines()
            .filter(|l| l.contains("cannot watch the leader") && l.contains(&closed))
            .count()
    };
    wait_until(Duration::from_secs(5), || warned(&b.log()) > 0)
        .unwrap_or_else(|| panic!("b did not say it cannot watch; log:\n{}", b.log()));
    std::thread::sleep(Duration::from_secs(3));
    let log = b.log();
    assert_eq!(warned(&log), 1, "{log}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("cannot watch the leader")
            && l.contains("polling the store every 250ms")),
        "{log}"
    );
    assert_eq!(watching(&b), Some(0.0));
    assert!(a.is_leader() && !b.is_leader());
}
