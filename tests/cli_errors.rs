//! The binary's answers to bad input: every invalid configuration exits 64
//! with one line naming the key; `fail_fast` with an unreachable store exits
//! 69; usage errors exit 64.

use std::process::{Command, Output};

fn leaderd(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leaderd"))
        .args(args)
        .envs(env.iter().copied())
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run leaderd")
}

/// Exit code 64 and exactly one line on stderr that contains every `needle`.
fn assert_config_error(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` missing from: {}", lines[0]);
    }
}

fn with_file(toml: &str, f: impl FnOnce(&str)) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("leaderd.toml");
    std::fs::write(&path, toml).expect("write config");
    f(path.to_str().expect("utf-8 path"));
}

#[test]
fn unknown_key_in_file_and_environment() {
    with_file("[store]\ntabel = \"x\"\n", |p| {
        assert_config_error(&leaderd(&["run", "--config", p], &[]), &["store.tabel"]);
    });
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_STORE__TABEL", "x")]),
        &["store.tabel", "LEADERD_STORE__TABEL"],
    );
}

#[test]
fn renew_not_shorter_than_lease() {
    let out = leaderd(
        &["run", "--lease-duration", "5s", "--renew-interval", "5s"],
        &[],
    );
    assert_config_error(&out, &["renew_interval", "5s"]);
}

#[test]
fn timing_invariant_violated_names_the_values() {
    let out = leaderd(
        &[
            "run",
            "--lease-duration",
            "4s",
            "--renew-interval",
            "2s",
            "--kill-grace",
            "2s",
        ],
        &[],
    );
    assert_config_error(&out, &["R + G + M + L·D < L", "2s", "4s"]);
}

#[test]
fn bad_duration_and_bad_signal_name() {
    with_file("[lease]\nduration = \"ten\"\n", |p| {
        assert_config_error(
            &leaderd(&["run", "--config", p], &[]),
            &["lease.duration", "ten"],
        );
    });
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_CHILD__STOP_SIGNAL", "SIGBOGUS")]),
        &["child.stop_signal", "SIGBOGUS"],
    );
}

#[test]
fn unreadable_truncated_or_wrong_typed_config_file() {
    assert_config_error(
        &leaderd(&["run", "--config", "/nonexistent/leaderd.toml"], &[]),
        &["/nonexistent/leaderd.toml"],
    );
    with_file("[lease\nduration = ", |p| {
        assert_config_error(&leaderd(&["run", "--config", p], &[]), &[p]);
    });
    with_file("[lease]\nduration = 10\n", |p| {
        assert_config_error(&leaderd(&["run", "--config", p], &[]), &["lease.duration"]);
    });
}

#[test]
fn usage_error_exits_64() {
    let out = leaderd(&["run", "--no-such-flag"], &[]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = leaderd(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn fail_fast_with_an_unreachable_store_exits_69() {
    // Nothing listens on port 9 of loopback: connection refused at once.
    let out = leaderd(
        &[
            "run",
            "--store",
            "dynamodb",
            "--endpoint-url",
            "http://127.0.0.1:9",
            "--region",
            "us-east-1",
            "--listen",
            "127.0.0.1:0",
        ],
        &[("LEADERD_STORE__FAIL_FAST", "true")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("unreachable"), "{stderr}");
}

#[test]
fn table_command_needs_the_dynamodb_store() {
    let out = leaderd(&["table", "describe", "--store", "sqlite"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DynamoDB"));
}
