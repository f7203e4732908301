//! `http.advertise`: the address a leader writes into its record
//! (`holder_meta.address`) for other instances to reach it, as `leaderd
//! status` shows it; bad values are configuration errors.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, wait_until};

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
            stderr.contains("http.advertise (--advertise)") && stderr.contains(says),
            "{value}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{value}: {stderr}");
    }
}
