//! The binary's answers to bad input: every invalid configuration exits 64
//! with one line naming the key; `fail_fast` with an unreachable store exits
//! 69; usage errors exit 64.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// `leaderd run` in a temporary directory, stopped with SIGTERM after
/// `settle` if it is still running: `(exit code or None if it was killed by a
/// signal, stderr)`, and whether it was still running at `settle`.
fn run_briefly(
    args: &[&str],
    env: &[(&str, &str)],
    settle: Duration,
) -> (Option<i32>, String, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_leaderd"))
        .args(args)
        .args(["--store-path", db.to_str().expect("utf-8 temp path")])
        .envs(env.iter().copied())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("start leaderd");
    let t0 = Instant::now();
    let mut running = true;
    while t0.elapsed() < settle {
        if child.try_wait().expect("try_wait").is_some() {
            running = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if running {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let t1 = Instant::now();
        while child.try_wait().expect("try_wait").is_none() {
            if t1.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let status = child.wait().expect("wait for leaderd");
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    (status.code(), stderr, running)
}

#[test]
fn service_links_and_child_variables_are_not_configuration() {
    // What Kubernetes puts into every pod of a namespace with Services named
    // `leaderd` and `leaderd-metrics`, and what leaderd gives its own child.
    let env = [
        ("LEADERD_SERVICE_HOST", "10.96.0.12"),
        ("LEADERD_SERVICE_PORT", "9777"),
        ("LEADERD_SERVICE_PORT_HTTP", "9777"),
        ("LEADERD_PORT", "tcp://10.96.0.12:9777"),
        ("LEADERD_PORT_9777_TCP", "tcp://10.96.0.12:9777"),
        ("LEADERD_PORT_9777_TCP_ADDR", "10.96.0.12"),
        ("LEADERD_PORT_9777_TCP_PORT", "9777"),
        ("LEADERD_PORT_9777_TCP_PROTO", "tcp"),
        ("LEADERD_METRICS_SERVICE_HOST", "10.96.0.13"),
        ("LEADERD_METRICS_PORT_9777_TCP_ADDR", "10.96.0.13"),
        ("LEADERD_ELECTION", "report"),
        ("LEADERD_FENCING_TOKEN", "1763790000123"),
        ("LEADERD_LEASE_MS", "10000"),
        ("LEADERD_IS_LEADER", "true"),
    ];
    let (code, stderr, running) = run_briefly(
        &["run", "--listen", "127.0.0.1:0"],
        &env,
        Duration::from_millis(1_500),
    );
    assert!(running, "leaderd exited ({code:?}) at start: {stderr}");
    assert_eq!(code, Some(0), "{stderr}");

    // A misspelt real key is still an error, in a known section or not.
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_LEASE__DURATON", "5s")]),
        &["lease.duraton", "LEADERD_LEASE__DURATON"],
    );
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_LAESE__DURATION", "5s")]),
        &["laese", "LEADERD_LAESE__DURATION"],
    );
}

#[test]
fn absurd_durations_are_config_errors_never_panics() {
    let huge = ["18446744073709551615s", "10000000000000h", "100000000000h"];
    let flags = [
        "--lease-duration",
        "--renew-interval",
        "--retry-interval",
        "--kill-grace",
        "--acquire-timeout",
    ];
    for value in huge {
        for flag in flags {
            let (code, stderr, running) = run_briefly(
                &["run", "--listen", "127.0.0.1:0", flag, value],
                &[],
                Duration::from_secs(5),
            );
            assert!(!running, "{flag} {value} was accepted: {stderr}");
            assert_eq!(code, Some(64), "{flag} {value}: {stderr}");
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(
                lines.len(),
                1,
                "{flag} {value}: one line expected: {stderr}"
            );
            assert!(
                lines[0].contains(flag.trim_start_matches("--"))
                    || lines[0].contains(&flag.trim_start_matches("--").replace('-', "_")),
                "{flag} {value}: {stderr}"
            );
        }
        for (var, key) in [
            ("LEADERD_LEASE__SAFETY_MARGIN", "lease.safety_margin"),
            ("LEADERD_CHILD__SHUTDOWN_GRACE", "child.shutdown_grace"),
            ("LEADERD_HEALTH__STORE_TIMEOUT", "health.store_timeout"),
        ] {
            let (code, stderr, running) = run_briefly(
                &["run", "--listen", "127.0.0.1:0"],
                &[(var, value)],
                Duration::from_secs(5),
            );
            assert!(!running, "{var}={value} was accepted: {stderr}");
            assert_eq!(code, Some(64), "{var}={value}: {stderr}");
            assert!(stderr.contains(key), "{var}={value}: {stderr}");
        }
        let out = leaderd(
            &["table", "create", "--store", "dynamodb", "--wait", value],
            &[],
        );
        assert_eq!(
            out.status.code(),
            Some(64),
            "table create --wait {value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A limit in a message reads as the configuration writes durations (`24h`,
/// like `1h 30m` and `250ms`), never `1day`: from the configuration's
/// checks and from the flags' own.
#[test]
fn limits_are_written_as_the_configuration_reads_them() {
    let (code, stderr, running) = run_briefly(
        &["run", "--listen", "127.0.0.1:0"],
        &[("LEADERD_CHILD__SHUTDOWN_GRACE", "25h")],
        Duration::from_secs(5),
    );
    assert!(!running, "accepted: {stderr}");
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(
            "child.shutdown_grace = 25h (from LEADERD_CHILD__SHUTDOWN_GRACE) is longer than the limit of 24h"
        ),
        "{stderr}"
    );
    let cases: [&[&str]; 3] = [
        &["lock", "acquire", "x", "--lease-duration", "2days"],
        &["lock", "acquire", "x", "--wait", "2days"],
        &["table", "create", "--wait", "2days"],
    ];
    for args in cases {
        let out = leaderd(args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains("longer than the limit of 24h"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_port_in_use_is_a_usage_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("local address").to_string();
    let (code, stderr, running) =
        run_briefly(&["run", "--listen", &addr], &[], Duration::from_secs(10));
    assert!(!running, "leaderd kept running on a taken port: {stderr}");
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(&addr) && stderr.contains("in use"),
        "{stderr}"
    );
}

#[test]
fn listen_accepts_a_host_name() {
    let (code, stderr, running) = run_briefly(
        &["run", "--listen", "localhost:0"],
        &[],
        Duration::from_millis(1_500),
    );
    assert!(running, "leaderd exited ({code:?}): {stderr}");
    assert!(stderr.contains("leaderd running"), "{stderr}");
}

#[test]
fn oversized_names_are_rejected_and_not_echoed_whole() {
    let long_election = "e".repeat(100_000);
    let long_identity = "i".repeat(10_000);
    for args in [
        vec!["run", "--election", long_election.as_str()],
        vec!["run", "--identity", long_identity.as_str()],
    ] {
        let out = leaderd(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{}",
            &stderr[..stderr.len().min(300)]
        );
        assert!(stderr.len() < 1_000, "{} bytes echoed", stderr.len());
    }
}

/// Admin tokens no `Authorization: Bearer` header can carry (not ASCII,
/// spaces at either end) are config errors for the daemon and for
/// `leaderd resign` alike, from the environment or the file; the value is
/// never echoed. They used to start fine and refuse every resign (401 for
/// `pässwort`, 403 for ` s3cret `).
#[test]
fn admin_tokens_that_could_never_authenticate_are_config_errors() {
    let bad = ["pässwort", " s3cret", "s3cret ", " ", "tab\there"];
    for token in bad {
        let env = [("LEADERD_HTTP__ADMIN_TOKEN", token)];
        let (code, stderr, running) = run_briefly(
            &["run", "--listen", "127.0.0.1:0"],
            &env,
            Duration::from_secs(5),
        );
        assert!(!running, "{token:?}: leaderd started: {stderr}");
        assert_eq!(code, Some(64), "{token:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{token:?}: {stderr}");
        assert!(lines[0].contains("http.admin_token"), "{token:?}: {stderr}");
        assert!(
            token.trim().is_empty() || !lines[0].contains(token.trim()),
            "{token:?} echoed: {stderr}"
        );

        // `leaderd resign` reads the same token: the same error, before it
        // talks to anyone (nothing listens on port 9).
        let out = leaderd(&["resign", "web", "--url", "http://127.0.0.1:9"], &env);
        assert_config_error(&out, &["http.admin_token"]);
    }
    with_file("[http]\nadmin_token = \"pässwort\"\n", |p| {
        assert_config_error(
            &leaderd(
                &[
                    "resign",
                    "web",
                    "--config",
                    p,
                    "--url",
                    "http://127.0.0.1:9",
                ],
                &[],
            ),
            &["http.admin_token", "printable ASCII"],
        );
        let (code, stderr, running) = run_briefly(
            &["run", "--config", p, "--listen", "127.0.0.1:0"],
            &[],
            Duration::from_secs(5),
        );
        assert!(!running && code == Some(64), "{stderr}");
        assert!(stderr.contains("http.admin_token"), "{stderr}");
    });
    // Spaces inside are carried, and accepted.
    let (code, stderr, running) = run_briefly(
        &["run", "--listen", "127.0.0.1:0"],
        &[("LEADERD_HTTP__ADMIN_TOKEN", "correct horse")],
        Duration::from_millis(1_500),
    );
    assert!(running, "leaderd exited ({code:?}): {stderr}");
}

#[test]
fn child_settings_that_do_not_fit_name_the_flags_that_set_them() {
    let out = leaderd(
        &[
            "run",
            "--mode",
            "always",
            "--on-child-exit",
            "release",
            "--",
            "sleep",
            "1",
        ],
        &[],
    );
    assert_config_error(
        &out,
        &[
            "child.on_child_exit = \"release\" (from --on-child-exit)",
            "child.mode = \"always\" (from --mode)",
        ],
    );
    // Set in the file: named with the file.
    with_file(
        "[child]\nmode = \"always\"\non_child_exit = \"release\"\ncommand = [\"sleep\", \"1\"]\n",
        |p| {
            let out = leaderd(&["run", "--config", p], &[]);
            assert_config_error(
                &out,
                &[
                    format!("child.on_child_exit = \"release\" (from {p})").as_str(),
                    format!("child.mode = \"always\" (from {p})").as_str(),
                ],
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("from --"), "{stderr}");
        },
    );
}

/// A value that breaks the configuration is named with where it came from,
/// on the one line leaderd prints: the variable, the flag, the file.
#[test]
fn config_errors_name_the_source_of_the_value() {
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_LEASE__DURATION", "4s")]),
        &[
            "lease.duration = 4s (from LEADERD_LEASE__DURATION)",
            "child.kill_grace = 2s (default)",
        ],
    );
    assert_config_error(
        &leaderd(&["run"], &[("LEADERD_LEASE__DURATION", "1m1m")]),
        &["lease.duration", "\"1m1m\"", "LEADERD_LEASE__DURATION"],
    );
    with_file(
        "[[elections]]\nname = \"a\"\n[[elections]]\nname = \"b\"\nduration = \"20s\"\n",
        |p| {
            assert_config_error(
                &leaderd(&["run", "--config", p, "--sessions"], &[]),
                &["sessions = true (from --sessions)"],
            );
        },
    );
    // A flag's value is refused by the command line, naming the flag.
    for args in [
        vec!["run", "--lease-duration", "1m1m"],
        vec!["lock", "acquire", "x", "--wait", "1m1m"],
    ] {
        let out = leaderd(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains(args[args.len() - 2]) && first.contains("1m1m"),
            "{args:?}: {stderr}"
        );
    }
}
