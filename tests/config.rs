//! Configuration loading: layers, defaults, and every way a
//! configuration can be invalid. The environment is passed explicitly
//! (`load_with_env`), so no test mutates the process environment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leaderd::cli::{self, Command, RunArgs};
use leaderd::config::{Config, ConfigError, LogFormat, Mode, OnChildExit, StoreKind, ToolConfig};
use leaderd::exit::CONFIG as EX_CONFIG;
use nix::sys::signal::Signal;

fn run_args(flags: &[&str]) -> RunArgs {
    let mut argv = vec!["leaderd", "run"];
    argv.extend_from_slice(flags);
    match cli::parse_from(&argv).map(|c| c.command) {
        Ok(Command::Run(args)) => args,
        other => panic!("{argv:?} did not parse as run: {other:?}"),
    }
}

fn toml_file(content: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("create temp file");
    file.write_all(content.as_bytes()).expect("write temp file");
    file
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Load with an optional file (its content), an environment and flags.
fn load(file: Option<&str>, vars: &[(&str, &str)], flags: &[&str]) -> Result<Config, ConfigError> {
    let file = file.map(toml_file);
    let mut all: Vec<&str> = Vec::new();
    let path;
    if let Some(f) = &file {
        path = f.path().to_str().expect("temp path is UTF-8").to_string();
        all.extend(["--config", &path]);
    }
    all.extend_from_slice(flags);
    Config::load_with_env(&run_args(&all), env(vars))
}

fn load_ok(file: Option<&str>, vars: &[(&str, &str)], flags: &[&str]) -> Config {
    load(file, vars, flags).unwrap_or_else(|e| panic!("config must load: {e}"))
}

/// The error must be one line, name `key` in its text and as its key, and
/// map to exit code 64.
fn load_err(file: Option<&str>, vars: &[(&str, &str)], flags: &[&str], key: &str) -> String {
    let err = match load(file, vars, flags) {
        Ok(c) => panic!("config must be rejected, got {c:?}"),
        Err(e) => e,
    };
    check_err(&err, Some(key))
}

fn check_err(err: &ConfigError, key: Option<&str>) -> String {
    let text = err.to_string();
    assert!(!text.contains('\n'), "not one line: {text:?}");
    assert_eq!(err.exit_code(), 64);
    assert_eq!(EX_CONFIG, 64);
    if let Some(key) = key {
        assert!(text.contains(key), "message does not name {key}: {text}");
        assert_eq!(err.key(), Some(key), "{text}");
    }
    text
}

fn shipped_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/leaderd.toml")
}

// ---------------------------------------------------------------------------
// Defaults and the shipped file.

#[test]
fn defaults_without_file_or_environment() {
    let c = load_ok(None, &[], &[]);
    assert_eq!(c.store.kind, StoreKind::Sqlite);
    assert_eq!(c.store.path, PathBuf::from("leaderd.db"));
    assert_eq!(c.store.table, "leaderd");
    assert_eq!(c.store.region, None);
    assert_eq!(c.store.endpoint_url, None);
    assert!(!c.store.create_table);
    assert!(!c.store.fail_fast);

    assert_eq!(c.elections.len(), 1);
    let e = &c.elections[0];
    assert_eq!(e.name, "default");
    assert_eq!(c.primary, "default");
    assert_eq!(e.identity, c.identity);
    assert_eq!(e.lease_duration, Duration::from_secs(10));
    assert_eq!(e.renew_interval, Duration::from_secs(5));
    assert_eq!(e.retry_interval, Duration::from_secs(1));
    assert_eq!(e.kill_grace, Duration::from_secs(2));
    assert_eq!(e.max_clock_drift, 0.01);
    assert_eq!(e.safety_margin, Duration::from_millis(200));
    assert!(!e.strict_new_lease);

    assert_eq!(c.http.listen, "0.0.0.0:9777".parse().unwrap());
    assert_eq!(c.http.admin_token, None);
    assert!(c.child.command.is_empty());
    assert_eq!(c.child.mode, Mode::WhileLeader);
    assert_eq!(c.child.on_child_exit, OnChildExit::Exit);
    assert_eq!(c.child.stop_signal, Signal::SIGTERM);
    assert_eq!(c.child.kill_grace, Duration::from_secs(2));
    assert_eq!(c.child.shutdown_grace, Duration::from_secs(30));
    assert_eq!(c.child.signal_on_gain, None);
    assert_eq!(c.child.signal_on_loss, None);
    assert_eq!(c.log.format, LogFormat::Text);
    assert_eq!(c.log.level, "info");
    assert_eq!(c.health.store_timeout, None);
    assert_eq!(c.acquire_timeout, None);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn default_identity_is_host_name_plus_random_suffix() {
    let host = nix::unistd::gethostname().unwrap();
    let host = host.to_string_lossy();
    let a = load_ok(None, &[], &[]).identity;
    let (prefix, suffix) = a.rsplit_once('-').expect("host-suffix");
    assert_eq!(prefix, host);
    assert_eq!(suffix.len(), 4);
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    // Random: 20 draws of 16 bits do not all collide unless it is constant.
    let distinct: std::collections::HashSet<_> =
        (0..20).map(|_| load_ok(None, &[], &[]).identity).collect();
    assert!(distinct.len() > 1, "identity is not random: {distinct:?}");
}

#[test]
fn shipped_config_file_loads_and_yields_the_defaults() {
    let path = shipped_file();
    let args = run_args(&["--config", path.to_str().unwrap(), "--identity", "x"]);
    let from_file = Config::load_with_env(&args, env(&[])).expect("shipped file loads");
    let defaults = load_ok(None, &[], &["--identity", "x"]);
    assert_eq!(from_file, defaults);
}

#[test]
fn shipped_config_file_documents_every_key() {
    let text = std::fs::read_to_string(shipped_file()).unwrap();
    let mut documented = std::collections::HashSet::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(header) = line.strip_prefix("[[").and_then(|l| l.split("]]").next()) {
            section = header.to_string();
        } else if let Some(header) = line.strip_prefix('[').and_then(|l| l.split(']').next()) {
            section = header.to_string();
        } else if let Some((key, _)) = line.split_once(" = ") {
            if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                documented.insert(if section.is_empty() {
                    key.to_string()
                } else {
                    format!("{section}.{key}")
                });
            }
        }
    }
    let expected = [
        "identity",
        "balance",
        "sessions",
        "priority",
        "preempt",
        "preempt_after",
        "elections.priority",
        "store.kind",
        "store.path",
        "store.table",
        "store.region",
        "store.endpoint_url",
        "store.url",
        "store.password_file",
        "store.ca_file",
        "store.create_table",
        "store.fail_fast",
        "lease.duration",
        "lease.renew_interval",
        "lease.retry_interval",
        "lease.max_clock_drift",
        "lease.safety_margin",
        "lease.strict_new_lease",
        "elections.name",
        "http.listen",
        "http.primary",
        "http.admin_token",
        "child.command",
        "child.mode",
        "child.on_child_exit",
        "child.stop_signal",
        "child.kill_grace",
        "child.shutdown_grace",
        "child.signal_on_gain",
        "child.signal_on_loss",
        "log.format",
        "log.level",
        "health.store_timeout",
        "metrics.election_series_limit",
        "metrics.elections",
    ];
    for key in expected {
        assert!(
            documented.contains(key),
            "config/leaderd.toml does not document {key}"
        );
    }
}

#[test]
fn shipped_file_commented_examples_are_valid_values() {
    // Uncomment the optional keys' examples: they must load too.
    let text = std::fs::read_to_string(shipped_file()).unwrap();
    let uncommented: String = text
        .lines()
        .map(|l| {
            for example in [
                "# identity = ",
                "# renew_interval = ",
                "# [[elections]]",
                "# name = ",
                "# duration = ",
                "# store_timeout = ",
                "# priority = ",
                "# preempt = ",
                "# preempt_after = ",
            ] {
                if l.starts_with(example) {
                    return l[2..].to_string() + "\n";
                }
            }
            l.to_string() + "\n"
        })
        .collect();
    let c = load_ok(Some(&uncommented), &[], &[]);
    assert_eq!(c.identity, "web-7f9c");
    assert_eq!(c.primary, "report");
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(30));
    assert_eq!(c.elections[0].renew_interval, Duration::from_secs(5));
    assert_eq!(c.health.store_timeout, Some(Duration::from_secs(30)));
    assert!(c.priority.in_use && c.priority.preempt);
    assert_eq!((c.priority.default, c.priority.of("report")), (0, 5));
    assert_eq!(c.priority.preempt_after, Duration::from_secs(10));
}

#[test]
fn priorities_come_from_every_layer_and_bad_ones_are_one_line_each() {
    let c = load_ok(None, &[], &[]);
    assert!(!c.priority.in_use, "no priority configured");
    let c = load_ok(
        Some(
            "priority = 3\n[[elections]]\nname = \"a\"\npriority = -1\n[[elections]]\nname = \"b\"\n",
        ),
        &[("LEADERD_PREEMPT_AFTER", "4s")],
        &["--no-preempt"],
    );
    assert!(c.priority.in_use && !c.priority.preempt);
    assert_eq!((c.priority.of("a"), c.priority.of("b")), (-1, 3));
    assert_eq!(c.priority.preempt_after, Duration::from_secs(4));
    let c = load_ok(None, &[("LEADERD_PRIORITY", "1")], &["--priority", "-7"]);
    assert_eq!(c.priority.default, -7, "a flag over the environment");

    let e = load_err(None, &[], &["--priority", "2000000"], "priority");
    assert!(
        e.contains("from --priority") && e.contains("out of range"),
        "{e}"
    );
    let e = load_err(
        None,
        &[("LEADERD_PREEMPT_AFTER", "0s")],
        &[],
        "preempt_after",
    );
    assert!(e.contains("must be above zero"), "{e}");
    let e = load_err(None, &[], &["--preempt-after", "2h"], "preempt_after");
    assert!(e.contains("longer than the limit of 1h"), "{e}");
    // A priority that is not an integer never loads.
    assert!(load(Some("priority = \"high\"\n"), &[], &[]).is_err());
    assert!(load(Some("priority = 99999999999999999999\n"), &[], &[]).is_err());
}

// ---------------------------------------------------------------------------
// PostgreSQL.

#[test]
fn postgres_takes_its_url_from_any_layer_and_bounds_statements_by_the_renew_interval() {
    let url = "postgres://leaderd@db.example.com/app?sslmode=require";
    for (vars, flags) in [
        (
            vec![("LEADERD_STORE__URL", url)],
            vec!["--store", "postgres"],
        ),
        (vec![], vec!["--store", "postgres", "--store-url", url]),
    ] {
        let c = load_ok(None, &vars, &flags);
        assert_eq!(c.store.kind, StoreKind::Postgres);
        let pg = c.store.postgres.as_ref().expect("postgres settings");
        assert_eq!(pg.url, url);
        assert_eq!(pg.table, "leaderd");
        assert_eq!(pg.statement_timeout, Duration::from_secs(5));
    }
    let file = "[store]\nkind = \"postgres\"\nurl = \"postgres://u:secret@db/app\"\n\
                [[elections]]\nname = \"a\"\nduration = \"6s\"\n\
                [[elections]]\nname = \"b\"\n";
    let c = load_ok(Some(file), &[], &["--no-sessions"]);
    let pg = c.store.postgres.expect("postgres settings");
    assert_eq!(
        pg.statement_timeout,
        Duration::from_secs(3),
        "the shortest R"
    );
    assert!(
        !format!("{pg:?}").contains("secret"),
        "the password is never shown: {pg:?}"
    );
}

#[test]
fn postgres_settings_that_cannot_work_are_one_line_each() {
    let pg = ["--store", "postgres"];
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut flags = vec!["--store", "postgres"];
        flags.extend_from_slice(extra);
        flags
    }
    let text = load_err(None, &[], &pg, "store.url");
    assert!(text.contains("needs store.url"), "{text}");
    let text = load_err(
        None,
        &[],
        &with(&["--store-url", "postgres://u:secret@db:nope/app"]),
        "store.url",
    );
    assert!(text.contains("not a valid PostgreSQL URL"), "{text}");
    assert!(!text.contains("secret"), "{text}");
    let text = load_err(
        None,
        &[],
        &with(&["--store-url", "http://db/app"]),
        "store.url",
    );
    assert!(text.contains("is not a postgres:// URL"), "{text}");
    let pw = tempfile::NamedTempFile::new().expect("a file");
    let pw_path = pw.path().to_str().expect("UTF-8");
    let text = load_err(
        None,
        &[],
        &with(&[
            "--store-url",
            "postgres://u:pw@db/app",
            "--store-password-file",
            pw_path,
        ]),
        "store.password_file",
    );
    assert!(text.contains("keep one of them"), "{text}");
    let text = load_err(
        None,
        &[],
        &with(&[
            "--store-url",
            "postgres://u@db/app",
            "--store-password-file",
            "/nonexistent/pw",
        ]),
        "store.password_file",
    );
    assert!(text.contains("cannot be read"), "{text}");
    let text = load_err(
        None,
        &[],
        &with(&[
            "--store-url",
            "postgres://u@db/app?sslmode=require",
            "--store-ca-file",
            pw_path,
        ]),
        "store.ca_file",
    );
    assert!(text.contains("does not verify"), "{text}");
    let text = load_err(
        None,
        &[],
        &with(&["--store-url", "postgres://u@db/app", "--table", "a.b.c"]),
        "store.table",
    );
    assert!(text.contains("more than one"), "{text}");
    // Fine: the file exists, the mode verifies.
    load_ok(
        None,
        &[],
        &with(&[
            "--store-url",
            "postgres://u@db/app?sslmode=verify-full",
            "--store-ca-file",
            pw_path,
        ]),
    );
    // Another store's kind ignores the PostgreSQL keys.
    load_ok(None, &[("LEADERD_STORE__URL", "not a url")], &[]);
}

// ---------------------------------------------------------------------------
// Layers.

#[test]
fn layers_file_below_environment_below_flags() {
    let file = "[lease]\nduration = \"20s\"\n[store]\ntable = \"from-file\"\nkind = \"dynamodb\"\n";
    let vars = [
        ("LEADERD_LEASE__DURATION", "30s"),
        ("LEADERD_STORE__TABLE", "from-env"),
    ];
    let flags = ["--lease-duration", "40s", "--table", "from-flag"];

    let c = load_ok(Some(file), &vars, &flags);
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(40));
    assert_eq!(c.store.table, "from-flag");
    assert_eq!(
        c.store.kind,
        StoreKind::Dynamodb,
        "file value kept where nothing overrides it"
    );

    let c = load_ok(Some(file), &vars, &[]);
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(30));
    assert_eq!(c.store.table, "from-env");

    let c = load_ok(Some(file), &[], &[]);
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(20));
    assert_eq!(c.store.table, "from-file");
    // Renew defaults to half of the effective duration.
    assert_eq!(c.elections[0].renew_interval, Duration::from_secs(10));
}

#[test]
fn every_flag_reaches_the_config() {
    let c = load_ok(
        None,
        &[],
        &[
            "--identity",
            "me",
            "--election",
            "a",
            "--primary",
            "a",
            "--store",
            "dynamodb",
            "--store-path",
            "/var/lib/l.db",
            "--table",
            "tbl",
            "--region",
            "eu-west-1",
            "--endpoint-url",
            "http://127.0.0.1:8000",
            "--listen",
            "127.0.0.1:9100",
            "--lease-duration",
            "20s",
            "--renew-interval",
            "4s",
            "--retry-interval",
            "500ms",
            "--kill-grace",
            "3s",
            "--mode",
            "always",
            "--on-child-exit",
            "restart",
            "--acquire-timeout",
            "0s",
            "--log-format",
            "json",
            "--",
            "./job.sh",
            "--all",
        ],
    );
    assert_eq!(c.identity, "me");
    assert_eq!(c.primary, "a");
    assert_eq!(c.store.kind, StoreKind::Dynamodb);
    assert_eq!(c.store.path, PathBuf::from("/var/lib/l.db"));
    assert_eq!(c.store.table, "tbl");
    assert_eq!(c.store.region.as_deref(), Some("eu-west-1"));
    assert_eq!(
        c.store.endpoint_url.as_deref(),
        Some("http://127.0.0.1:8000")
    );
    assert_eq!(c.http.listen, "127.0.0.1:9100".parse().unwrap());
    let e = &c.elections[0];
    assert_eq!((e.name.as_str(), e.identity.as_str()), ("a", "me"));
    assert_eq!(e.lease_duration, Duration::from_secs(20));
    assert_eq!(e.renew_interval, Duration::from_secs(4));
    assert_eq!(e.retry_interval, Duration::from_millis(500));
    assert_eq!(e.kill_grace, Duration::from_secs(3));
    assert_eq!(c.child.kill_grace, Duration::from_secs(3));
    assert_eq!(c.child.mode, Mode::Always);
    assert_eq!(c.child.on_child_exit, OnChildExit::Restart);
    assert_eq!(c.child.command, ["./job.sh", "--all"]);
    assert_eq!(c.acquire_timeout, Some(Duration::ZERO));
    assert_eq!(c.log.format, LogFormat::Json);
}

#[test]
fn environment_values_are_typed_by_their_key() {
    let c = load_ok(
        None,
        &[
            ("LEADERD_IDENTITY", "1234"),
            ("LEADERD_STORE__CREATE_TABLE", "true"),
            ("LEADERD_STORE__FAIL_FAST", "1"),
            ("LEADERD_LEASE__MAX_CLOCK_DRIFT", "0.02"),
            ("LEADERD_LEASE__STRICT_NEW_LEASE", "yes"),
            ("LEADERD_HTTP__ADMIN_TOKEN", "0042"),
            ("LEADERD_CHILD__COMMAND", "[\"./job.sh\", \"--all\"]"),
            ("LEADERD_CHILD__STOP_SIGNAL", "int"),
            ("LEADERD_HEALTH__STORE_TIMEOUT", "1m30s"),
            ("LEADERD_LOG__LEVEL", "info,leaderd=debug"),
            ("OTHER_VARIABLE", "ignored"),
        ],
        &[],
    );
    assert_eq!(c.identity, "1234");
    assert!(c.store.create_table);
    assert!(c.store.fail_fast);
    assert_eq!(c.elections[0].max_clock_drift, 0.02);
    assert!(c.elections[0].strict_new_lease);
    assert_eq!(c.http.admin_token.as_deref(), Some("0042"));
    assert_eq!(c.child.command, ["./job.sh", "--all"]);
    assert_eq!(c.child.stop_signal, Signal::SIGINT);
    assert_eq!(c.health.store_timeout, Some(Duration::from_secs(90)));
    assert_eq!(c.log.level, "info,leaderd=debug");
}

#[test]
fn child_environment_and_test_hooks_are_not_config() {
    // What a parent leaderd puts in its child's environment, plus test hooks.
    let c = load_ok(
        None,
        &[
            ("LEADERD_ELECTION", "report"),
            ("LEADERD_IDENTITY", "parent-1"),
            ("LEADERD_FENCING_TOKEN", "17"),
            ("LEADERD_LEASE_MS", "10000"),
            ("LEADERD_TEST_FAULT", "whatever"),
            ("LEADERD_TEST_", "x"),
        ],
        &[],
    );
    // LEADERD_IDENTITY is the identity key; the others change nothing.
    assert_eq!(c.identity, "parent-1");
    assert_eq!(c.elections[0].name, "default");
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(10));
}

#[test]
fn election_flags_replace_the_list_and_keep_overrides() {
    let file = "[[elections]]\nname = \"a\"\nduration = \"30s\"\n[[elections]]\nname = \"b\"\n[http]\nprimary = \"a\"\n";
    let c = load_ok(Some(file), &[], &[]);
    let names: Vec<_> = c.elections.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(c.elections[0].lease_duration, Duration::from_secs(30));
    assert_eq!(c.elections[0].renew_interval, Duration::from_secs(15));
    assert_eq!(c.elections[1].lease_duration, Duration::from_secs(10));

    let c = load_ok(Some(file), &[], &["--election", "c", "--election", "a"]);
    let names: Vec<_> = c.elections.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["c", "a"]);
    assert_eq!(c.elections[1].lease_duration, Duration::from_secs(30));
    assert_eq!(c.primary, "a");
}

#[test]
fn per_election_overrides_beat_the_lease_section() {
    let file = "[lease]\nduration = \"20s\"\nrenew_interval = \"4s\"\nstrict_new_lease = true\n\
                [[elections]]\nname = \"x\"\nretry_interval = \"2s\"\nmax_clock_drift = 0.05\nsafety_margin = \"1s\"\nstrict_new_lease = false\n";
    let c = load_ok(Some(file), &[], &[]);
    let e = &c.elections[0];
    assert_eq!(e.lease_duration, Duration::from_secs(20));
    assert_eq!(e.renew_interval, Duration::from_secs(4));
    assert_eq!(e.retry_interval, Duration::from_secs(2));
    assert_eq!(e.max_clock_drift, 0.05);
    assert_eq!(e.safety_margin, Duration::from_secs(1));
    assert!(!e.strict_new_lease);
}

#[test]
fn signal_names_in_both_forms_any_case() {
    let file = "[child]\ncommand = [\"./app\"]\nmode = \"always\"\nstop_signal = \"quit\"\nsignal_on_gain = \"SIGusr1\"\nsignal_on_loss = \"USR2\"\n";
    let c = load_ok(Some(file), &[], &[]);
    assert_eq!(c.child.stop_signal, Signal::SIGQUIT);
    assert_eq!(c.child.signal_on_gain, Some(Signal::SIGUSR1));
    assert_eq!(c.child.signal_on_loss, Some(Signal::SIGUSR2));
}

#[test]
fn admin_token_primary_and_health() {
    let file = "[[elections]]\nname = \"a\"\n[[elections]]\nname = \"b\"\n[http]\nprimary = \"b\"\nadmin_token = \"s3cret\"\n[health]\nstore_timeout = \"45s\"\n";
    let c = load_ok(Some(file), &[], &[]);
    assert_eq!(c.primary, "b");
    assert_eq!(c.http.admin_token.as_deref(), Some("s3cret"));
    assert_eq!(c.health.store_timeout, Some(Duration::from_secs(45)));
}

#[test]
fn warns_when_fewer_than_two_retries_fit() {
    // L 6s, R 3s, G 2s: validity 5.74s, 0.74s left after R + G: no retry fits.
    let c = load_ok(None, &[], &["--lease-duration", "6s"]);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("default"), "{}", c.warnings[0]);
    assert!(
        c.warnings[0].contains("0 renew retries"),
        "{}",
        c.warnings[0]
    );
    // The defaults leave room for two retries.
    assert!(load_ok(None, &[], &[]).warnings.is_empty());
}

#[test]
fn load_reads_the_process_environment_without_breaking() {
    // The process environment of a test run holds no LEADERD_ config keys
    // (or only ignored ones), so this yields the file's values.
    let file = toml_file("[store]\ntable = \"proc-env\"\n");
    let c = Config::load(&run_args(&["--config", file.path().to_str().unwrap()])).unwrap();
    assert_eq!(c.store.table, "proc-env");
}

// ---------------------------------------------------------------------------
// Invalid configurations: one line, naming the key, exit 64.

#[test]
fn unknown_key_in_file() {
    let file = toml_file("[store]\ntabel = \"x\"\n");
    let path = file.path().to_str().unwrap().to_string();
    let err = Config::load_with_env(&run_args(&["--config", &path]), env(&[])).unwrap_err();
    let text = check_err(&err, Some("store.tabel"));
    assert!(
        text.starts_with(&format!("unknown key store.tabel in {path}")),
        "{text}"
    );
    assert!(text.contains("table"), "lists the known keys: {text}");
}

#[test]
fn unknown_top_level_key_and_section() {
    load_err(Some("colour = \"blue\"\n"), &[], &[], "colour");
    load_err(Some("[telemetry]\nport = 1\n"), &[], &[], "telemetry");
}

#[test]
fn unknown_key_in_an_election() {
    load_err(
        Some("[[elections]]\nname = \"a\"\nlease_duration = \"10s\"\n"),
        &[],
        &[],
        "elections[0].lease_duration",
    );
}

#[test]
fn unknown_key_in_environment() {
    let text = load_err(None, &[("LEADERD_STORE__TABEL", "x")], &[], "store.tabel");
    assert!(
        text.contains("environment variable LEADERD_STORE__TABEL"),
        "{text}"
    );
    // Not shaped like a setting: ignored, with a warning (Kubernetes and
    // users put other LEADERD_* variables into the environment).
    let cfg = load_ok(None, &[("LEADERD_COLOUR", "blue")], &[]);
    assert!(
        cfg.warnings.iter().any(|w| w.contains("LEADERD_COLOUR")),
        "{:?}",
        cfg.warnings
    );
    // A single underscore is part of the key, not a separator.
    load_err(None, &[("LEADERD_STORE_KIND", "sqlite")], &[], "store_kind");
    load_err(
        None,
        &[("LEADERD_STORE____KIND", "sqlite")],
        &[],
        "store..kind",
    );
}

#[test]
fn conflicting_environment_variables() {
    load_err(
        None,
        &[("LEADERD_STORE", "x"), ("LEADERD_STORE__KIND", "sqlite")],
        &[],
        "store",
    );
}

#[test]
fn renew_not_shorter_than_lease() {
    let text = load_err(
        Some("[lease]\nduration = \"10s\"\nrenew_interval = \"10s\"\n"),
        &[],
        &[],
        "lease.renew_interval",
    );
    assert!(text.contains("lease.duration = 10s"), "{text}");
    let text = load_err(
        None,
        &[],
        &["--renew-interval", "12s"],
        "lease.renew_interval",
    );
    assert!(text.contains("12s"), "{text}");
    load_err(
        Some("[[elections]]\nname = \"a\"\nduration = \"4s\"\nrenew_interval = \"5s\"\n"),
        &[],
        &[],
        "elections[0].renew_interval",
    );
}

#[test]
fn timing_invariant_violated_names_the_values() {
    // R 1.5s + G 2s + M 200ms + L·D 30ms = 3.73s is not below L 3s.
    let text = load_err(None, &[], &["--lease-duration", "3s"], "lease.duration");
    for value in [
        "R + G + M + L·D < L",
        "1s 500ms",
        "2s",
        "200ms",
        "30ms",
        "3s",
    ] {
        assert!(text.contains(value), "missing {value:?}: {text}");
    }
    // The same through kill_grace alone.
    load_err(
        Some("[child]\nkill_grace = \"6s\"\n"),
        &[],
        &[],
        "lease.duration",
    );
}

#[test]
fn zero_and_out_of_range_timing() {
    load_err(
        None,
        &[("LEADERD_LEASE__DURATION", "0s")],
        &[],
        "lease.duration",
    );
    load_err(
        None,
        &[],
        &["--retry-interval", "0s"],
        "lease.retry_interval",
    );
    load_err(
        Some("[lease]\nmax_clock_drift = 0.5\n"),
        &[],
        &[],
        "lease.max_clock_drift",
    );
    load_err(
        Some("[lease]\nmax_clock_drift = -0.1\n"),
        &[],
        &[],
        "lease.max_clock_drift",
    );
    load_err(
        Some("[lease]\nmax_clock_drift = \"1%\"\n"),
        &[],
        &[],
        "lease.max_clock_drift",
    );
    load_err(
        Some("[health]\nstore_timeout = \"0s\"\n"),
        &[],
        &[],
        "health.store_timeout",
    );
}

#[test]
fn bad_duration() {
    let file = toml_file("[lease]\nduration = \"ten\"\n");
    let path = file.path().to_str().unwrap().to_string();
    let err = Config::load_with_env(&run_args(&["--config", &path]), env(&[])).unwrap_err();
    let text = check_err(&err, Some("lease.duration"));
    assert_eq!(
        text,
        format!(
            "invalid config: lease.duration = \"ten\" is not a duration (like 10s, 1m30s), in {path}"
        )
    );

    let text = load_err(
        None,
        &[("LEADERD_CHILD__KILL_GRACE", "2 parsecs")],
        &[],
        "child.kill_grace",
    );
    assert!(
        text.contains("\"2 parsecs\"") && text.contains("LEADERD_CHILD__KILL_GRACE"),
        "{text}"
    );
    load_err(
        Some("[[elections]]\nname = \"a\"\nsafety_margin = \"soon\"\n"),
        &[],
        &[],
        "elections[0].safety_margin",
    );
}

#[test]
fn wrong_typed_values() {
    let text = load_err(Some("[lease]\nduration = 10\n"), &[], &[], "lease.duration");
    assert!(
        text.contains("lease.duration = 10 is not a duration"),
        "{text}"
    );
    load_err(
        None,
        &[("LEADERD_LEASE__DURATION", "10")],
        &[],
        "lease.duration",
    );
    load_err(
        Some("[store]\ncreate_table = \"maybe\"\n"),
        &[],
        &[],
        "store.create_table",
    );
    load_err(
        Some("[child]\ncommand = \"./job.sh\"\n"),
        &[],
        &[],
        "child.command",
    );
    load_err(Some("identity = 7\n"), &[], &[], "identity");
    load_err(Some("store = \"sqlite\"\n"), &[], &[], "store");
    load_err(
        Some("[[elections]]\nduration = \"10s\"\n"),
        &[],
        &[],
        "elections[0].name",
    );
}

#[test]
fn bad_enum_values() {
    let text = load_err(Some("[store]\nkind = \"mysql\"\n"), &[], &[], "store.kind");
    assert!(text.contains("\"sqlite\", \"dynamodb\""), "{text}");
    load_err(
        None,
        &[("LEADERD_CHILD__MODE", "sometimes")],
        &[],
        "child.mode",
    );
    load_err(
        Some("[child]\non_child_exit = \"panic\"\n"),
        &[],
        &[],
        "child.on_child_exit",
    );
    load_err(Some("[log]\nformat = \"xml\"\n"), &[], &[], "log.format");
}

#[test]
fn bad_signal_name() {
    let text = load_err(
        Some("[child]\nstop_signal = \"SIGFOO\"\n"),
        &[],
        &[],
        "child.stop_signal",
    );
    assert!(text.contains("\"SIGFOO\""), "{text}");
    load_err(
        Some("[child]\nstop_signal = \"\"\n"),
        &[],
        &[],
        "child.stop_signal",
    );
    load_err(
        None,
        &[("LEADERD_CHILD__SIGNAL_ON_LOSS", "USR3")],
        &[],
        "child.signal_on_loss",
    );
}

#[test]
fn unreadable_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("y.toml");
    let args = run_args(&["--config", missing.to_str().unwrap()]);
    let err = Config::load_with_env(&args, env(&[])).unwrap_err();
    let text = check_err(&err, None);
    assert_eq!(
        text,
        format!(
            "cannot read config file {}: No such file or directory",
            missing.display()
        )
    );

    // A directory is not a file either.
    let args = run_args(&["--config", dir.path().to_str().unwrap()]);
    let text = check_err(&Config::load_with_env(&args, env(&[])).unwrap_err(), None);
    assert!(text.starts_with("cannot read config file"), "{text}");
}

#[test]
fn truncated_or_garbled_toml() {
    for (content, line) in [
        ("[store]\nkind = \"sql", 2),
        ("[store\nkind = \"sqlite\"\n", 1),
        ("[lease]\nduration = \"10s\"\nduration = \"20s\"\n", 3),
        ("identity = \"a\"\n\n= 5\n", 3),
    ] {
        let file = toml_file(content);
        let args = run_args(&["--config", file.path().to_str().unwrap()]);
        let err = Config::load_with_env(&args, env(&[])).unwrap_err();
        let text = check_err(&err, None);
        assert!(
            text.starts_with(&format!("invalid TOML in {}", file.path().display())),
            "{text}"
        );
        assert!(
            text.contains(&format!("at line {line}")),
            "{content:?}: {text}"
        );
    }

    // Bytes that are not text at all.
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&[0xff, 0xfe, 0x00, 0x9c, b'\n']).unwrap();
    let args = run_args(&["--config", file.path().to_str().unwrap()]);
    let text = check_err(&Config::load_with_env(&args, env(&[])).unwrap_err(), None);
    assert!(text.contains("UTF-8"), "{text}");
}

#[test]
fn unknown_or_missing_primary() {
    let text = load_err(
        Some("[[elections]]\nname = \"a\"\n[http]\nprimary = \"b\"\n"),
        &[],
        &[],
        "http.primary",
    );
    assert!(text.contains("\"b\""), "{text}");
    // Not named: the first election listed.
    let c = load_ok(None, &[], &["--election", "a", "--election", "b"]);
    assert_eq!(c.primary, "a");
    // Named by the flag.
    let c = load_ok(
        None,
        &[],
        &["--election", "a", "--election", "b", "--primary", "b"],
    );
    assert_eq!(c.primary, "b");
    let text = load_err(
        None,
        &[],
        &["--election", "a", "--primary", "zzz"],
        "http.primary",
    );
    assert!(
        text.contains("--primary") && text.contains("\"zzz\""),
        "{text}"
    );
    // Named through the environment, it is accepted.
    let c = load_ok(
        None,
        &[("LEADERD_HTTP__PRIMARY", "b")],
        &["--election", "a", "--election", "b"],
    );
    assert_eq!(c.primary, "b");
}

#[test]
fn duplicate_or_bad_election_names() {
    let text = load_err(
        Some("[[elections]]\nname = \"a\"\n[[elections]]\nname = \"a\"\n"),
        &[],
        &[],
        "elections[1].name",
    );
    assert!(text.contains("\"a\""), "{text}");
    load_err(
        None,
        &[],
        &["--election", "x", "--election", "x"],
        "elections[1].name",
    );
    for bad in ["", "a b", "a/b", "tab\there", "q?", "frag#1", "100%"] {
        load_err(None, &[], &["--election", bad], "elections[0].name");
    }
}

#[test]
fn child_mode_combinations() {
    load_err(
        Some("[child]\ncommand = [\"./app\"]\nmode = \"always\"\non_child_exit = \"release\"\n"),
        &[],
        &[],
        "child.on_child_exit",
    );
    load_err(Some("[child]\nmode = \"always\"\n"), &[], &[], "child.mode");
    load_err(
        Some("[child]\ncommand = [\"./app\"]\nsignal_on_gain = \"USR1\"\n"),
        &[],
        &[],
        "child.signal_on_gain",
    );
    load_err(
        Some("[child]\ncommand = [\"\"]\n"),
        &[],
        &[],
        "child.command",
    );
    // Fine: always + restart, while-leader + release.
    load_ok(
        None,
        &[],
        &["--mode", "always", "--on-child-exit", "restart", "--", "x"],
    );
    load_ok(None, &[], &["--on-child-exit", "release", "--", "x"]);
}

#[test]
fn bad_store_listen_identity_and_log_values() {
    load_err(
        Some("[http]\nlisten = \"localhost\"\n"),
        &[],
        &[],
        "http.listen",
    );
    load_err(Some("[store]\ntable = \"a b\"\n"), &[], &[], "store.table");
    load_err(Some("[store]\npath = \"\"\n"), &[], &[], "store.path");
    load_err(
        None,
        &[("LEADERD_STORE__ENDPOINT_URL", "127.0.0.1:8000")],
        &[],
        "store.endpoint_url",
    );
    load_err(None, &[("LEADERD_IDENTITY", "")], &[], "identity");
    load_err(Some("[log]\nlevel = \"verbose\"\n"), &[], &[], "log.level");
    for token in ["pässwort", " s3cret", "s3cret ", "\ts3cret"] {
        let text = load_err(
            None,
            &[("LEADERD_HTTP__ADMIN_TOKEN", token)],
            &[],
            "http.admin_token",
        );
        assert!(!text.contains(token.trim()), "the token is echoed: {text}");
    }
    load_err(
        Some("[http]\nadmin_token = \" \"\n"),
        &[],
        &[],
        "http.admin_token",
    );
    let c = load_ok(None, &[("LEADERD_HTTP__ADMIN_TOKEN", "a b~!")], &[]);
    assert_eq!(c.http.admin_token.as_deref(), Some("a b~!"));
    for advertise in ["0.0.0.0:9777", "[::]:9777", "[::ffff:0.0.0.0]:9777"] {
        let text = load_err(
            None,
            &[("LEADERD_HTTP__ADVERTISE", advertise)],
            &[],
            "http.advertise",
        );
        assert!(text.contains("unspecified address"), "{text}");
    }
    load_err(Some("[log]\nlevel = \"info,=[\"\n"), &[], &[], "log.level");
}

// ---------------------------------------------------------------------------
// status / table: store settings only.

#[test]
fn tool_config_reads_store_settings_and_checks_election_names() {
    let file = toml_file(
        "[store]\nkind = \"dynamodb\"\ntable = \"tbl1\"\n[[elections]]\nname = \"a\"\n[[elections]]\nname = \"b\"\n[lease]\nduration = \"1s\"\n",
    );
    let argv = [
        "leaderd",
        "status",
        "--config",
        file.path().to_str().unwrap(),
        "--endpoint-url",
        "http://127.0.0.1:8000",
    ];
    let Ok(Command::Status(status)) = cli::parse_from(argv).map(|c| c.command) else {
        panic!("status must parse");
    };
    // The lease timing is irrelevant here (and invalid): only the store counts.
    let tool = ToolConfig::load_with_env(&status.store, env(&[("LEADERD_STORE__REGION", "r1")]))
        .expect("status config loads");
    assert_eq!(tool.store.kind, StoreKind::Dynamodb);
    assert_eq!(tool.store.table, "tbl1");
    assert_eq!(tool.store.region.as_deref(), Some("r1"));
    assert_eq!(
        tool.store.endpoint_url.as_deref(),
        Some("http://127.0.0.1:8000")
    );
    // The elections are the store's, not the file's: `status` shows every
    // one it finds. The file's name the set whose per-election priorities
    // `status` names (see `elections` below for a file without any), and
    // are still checked.
    assert_eq!(tool.elections, ["a", "b"]);
    let dup = toml_file("[[elections]]\nname = \"a\"\n[[elections]]\nname = \"a\"\n");
    let args = leaderd::cli::StoreArgs {
        config: Some(dup.path().to_path_buf()),
        ..Default::default()
    };
    let err = ToolConfig::load_with_env(&args, env(&[])).unwrap_err();
    assert_eq!(err.key(), Some("elections[1].name"), "{err}");

    let defaults = ToolConfig::load_with_env(&Default::default(), env(&[])).unwrap();
    assert_eq!(defaults.store.kind, StoreKind::Sqlite);
    assert_eq!(defaults.elections, ["default"], "as `run` without any");
}

#[test]
fn tool_config_rejects_unknown_keys_and_bad_store_values() {
    let file = toml_file("[child]\ncomand = [\"x\"]\n");
    let args = leaderd::cli::StoreArgs {
        config: Some(file.path().to_path_buf()),
        ..Default::default()
    };
    let err = ToolConfig::load_with_env(&args, env(&[])).unwrap_err();
    check_err(&err, Some("child.comand"));
    let err =
        ToolConfig::load_with_env(&Default::default(), env(&[("LEADERD_STORE__KIND", "etcd")]))
            .unwrap_err();
    check_err(&err, Some("store.kind"));
}

// ---------------------------------------------------------------------------
// Where a value came from, and durations that could mean two things.

/// A broken timing rule names where every value in it came from: the
/// variable, the file, the flag, or the default.
#[test]
fn a_timing_violation_names_the_source_of_every_value() {
    let text = load_err(
        None,
        &[("LEADERD_LEASE__DURATION", "4s")],
        &[],
        "lease.duration",
    );
    for part in [
        "lease.duration = 4s (from LEADERD_LEASE__DURATION)",
        "lease.renew_interval = 2s (default: half of lease.duration)",
        "child.kill_grace = 2s (default)",
        "lease.safety_margin = 200ms (default)",
        "lease.max_clock_drift = 0.01 (default)",
        "R + G + M + L·D < L",
    ] {
        assert!(text.contains(part), "missing {part:?}: {text}");
    }

    let file = toml_file("[lease]\nduration = \"4s\"\n[child]\nkill_grace = \"1s\"\n");
    let path = file
        .path()
        .to_str()
        .expect("temp path is UTF-8")
        .to_string();
    let err = Config::load_with_env(
        &run_args(&["--config", &path, "--renew-interval", "3s"]),
        env(&[("LEADERD_LEASE__SAFETY_MARGIN", "300ms")]),
    )
    .unwrap_err();
    let text = check_err(&err, Some("lease.duration"));
    for part in [
        format!("lease.duration = 4s (from {path})"),
        format!("child.kill_grace = 1s (from {path})"),
        "lease.renew_interval = 3s (from --renew-interval)".to_owned(),
        "lease.safety_margin = 300ms (from LEADERD_LEASE__SAFETY_MARGIN)".to_owned(),
    ] {
        assert!(text.contains(&part), "missing {part:?}: {text}");
    }

    // R not below L, each named with its source.
    let text = load_err(
        None,
        &[("LEADERD_LEASE__RENEW_INTERVAL", "10s")],
        &["--lease-duration", "10s"],
        "lease.renew_interval",
    );
    for part in [
        "lease.renew_interval = 10s (from LEADERD_LEASE__RENEW_INTERVAL)",
        "lease.duration = 10s (from --lease-duration)",
    ] {
        assert!(text.contains(part), "missing {part:?}: {text}");
    }
}

/// `sessions = true` with elections of differing timings names whatever
/// set it: the flag, the variable or the file.
#[test]
fn sessions_with_differing_timings_name_where_sessions_was_set() {
    let elections =
        "[[elections]]\nname = \"a\"\n[[elections]]\nname = \"b\"\nduration = \"20s\"\n";
    let text = load_err(Some(elections), &[], &["--sessions"], "sessions");
    assert!(text.contains("sessions = true (from --sessions)"), "{text}");
    let text = load_err(
        Some(elections),
        &[("LEADERD_SESSIONS", "true")],
        &[],
        "sessions",
    );
    assert!(
        text.contains("sessions = true (from LEADERD_SESSIONS)"),
        "{text}"
    );
    let file = toml_file(&format!("sessions = true\n{elections}"));
    let path = file
        .path()
        .to_str()
        .expect("temp path is UTF-8")
        .to_string();
    let err = Config::load_with_env(&run_args(&["--config", &path]), env(&[])).unwrap_err();
    let text = check_err(&err, Some("sessions"));
    assert!(
        text.contains(&format!("sessions = true (from {path})")),
        "{text}"
    );
}

/// Durations that humantime would add up (`1m1m` is 2m), or read with a
/// space inside a number (`1 0s` is 10s): refused wherever a duration is
/// read, naming the key, flag or variable and the value.
#[test]
fn ambiguous_durations_are_refused_everywhere() {
    for value in ["1m1m", "30s1m", "1m 1min", "1 0s", "2s 3s", "10s 1h"] {
        // The file.
        let file = toml_file(&format!("[lease]\nduration = \"{value}\"\n"));
        let path = file
            .path()
            .to_str()
            .expect("temp path is UTF-8")
            .to_string();
        let err = Config::load_with_env(&run_args(&["--config", &path]), env(&[])).unwrap_err();
        let text = check_err(&err, Some("lease.duration"));
        assert!(
            text.contains(&format!("{value:?}")) && text.contains(&path),
            "{value}: {text}"
        );
        // The environment.
        let text = load_err(
            None,
            &[("LEADERD_CHILD__KILL_GRACE", value)],
            &[],
            "child.kill_grace",
        );
        assert!(
            text.contains(&format!("{value:?}")) && text.contains("LEADERD_CHILD__KILL_GRACE"),
            "{value}: {text}"
        );
        // Every flag that takes a duration, `run`'s and the tools'.
        for argv in [
            vec!["run", "--lease-duration", value],
            vec!["run", "--renew-interval", value],
            vec!["run", "--acquire-timeout", value],
            vec!["lock", "acquire", "x", "--lease-duration", value],
            vec!["lock", "acquire", "x", "--wait", value],
            vec!["lock", "renew", "x", "t", "--lease-duration", value],
            vec!["table", "create", "--wait", value],
        ] {
            let flag = argv[argv.len() - 2];
            let mut full = vec!["leaderd"];
            full.extend(&argv);
            let err = cli::parse_from(&full).expect_err(&format!("{full:?} accepted"));
            assert_eq!(err.exit_code(), EX_CONFIG, "{full:?}");
            let first = err.message();
            let first = first.lines().next().unwrap_or_default();
            assert!(
                first.contains(flag) && first.contains(value),
                "{full:?}: {first}"
            );
        }
    }
    // What is not ambiguous keeps working, on every path.
    for (value, expected) in [
        ("1m30s", Duration::from_secs(90)),
        ("1m 30s", Duration::from_secs(90)),
        ("15 minutes", Duration::from_secs(900)),
        ("900s", Duration::from_secs(900)),
        ("200ms", Duration::from_millis(200)),
        ("1h 2m 3s 4ms", Duration::from_millis(3_723_004)),
        ("1.5h", Duration::from_secs(5400)),
    ] {
        let c = load_ok(
            None,
            &[("LEADERD_HEALTH__STORE_TIMEOUT", value)],
            &["--acquire-timeout", value],
        );
        assert_eq!(c.health.store_timeout, Some(expected), "{value}");
        assert_eq!(c.acquire_timeout, Some(expected), "{value}");
        let file = toml_file(&format!("[child]\nshutdown_grace = \"{value}\"\n"));
        let path = file
            .path()
            .to_str()
            .expect("temp path is UTF-8")
            .to_string();
        let c = Config::load_with_env(&run_args(&["--config", &path]), env(&[])).unwrap();
        assert_eq!(c.child.shutdown_grace, expected, "{value}");
        let Ok(Command::Lock(_)) =
            cli::parse_from(["leaderd", "lock", "acquire", "x", "--wait", value])
                .map(|c| c.command)
        else {
            panic!("lock acquire --wait {value} must parse");
        };
    }
}

// ---------------------------------------------------------------------------
// Metrics.

#[test]
fn metrics_limit_and_kept_elections_come_from_every_layer() {
    let c = load_ok(None, &[], &[]);
    assert_eq!(c.metrics.election_series_limit, 100);
    assert!(c.metrics.elections.is_empty());

    let file = "[metrics]\nelection_series_limit = 50\nelections = [\"a\"]\n\
                [[elections]]\nname = \"a\"\n[[elections]]\nname = \"b\"\n";
    let c = load_ok(Some(file), &[], &[]);
    assert_eq!(c.metrics.election_series_limit, 50);
    assert_eq!(c.metrics.elections, ["a"]);
    let vars = [
        ("LEADERD_METRICS__ELECTION_SERIES_LIMIT", "40"),
        ("LEADERD_METRICS__ELECTIONS", "[\"b\"]"),
    ];
    let c = load_ok(Some(file), &vars, &[]);
    assert_eq!(c.metrics.election_series_limit, 40);
    assert_eq!(c.metrics.elections, ["b"]);
    let c = load_ok(Some(file), &vars, &["--election-series-limit", "0"]);
    assert_eq!(c.metrics.election_series_limit, 0);
}

#[test]
fn metrics_settings_must_be_a_count_and_configured_elections() {
    let text = load_err(
        Some("[metrics]\nelections = [\"report\", \"nope\"]\n[[elections]]\nname = \"report\"\n"),
        &[],
        &[],
        "metrics.elections",
    );
    assert!(
        text.contains("metrics.elections[1] = \"nope\" is not a configured election"),
        "{text}"
    );
    load_err(
        Some("[metrics]\nelection_series_limit = -1\n"),
        &[],
        &[],
        "metrics.election_series_limit",
    );
    load_err(
        None,
        &[("LEADERD_METRICS__ELECTION_SERIES_LIMIT", "many")],
        &[],
        "metrics.election_series_limit",
    );
    load_err(
        Some("[metrics]\nelections = \"report\"\n"),
        &[],
        &[],
        "metrics.elections",
    );
    let err = cli::parse_from(["leaderd", "run", "--election-series-limit", "lots"]);
    assert!(err.is_err(), "a limit that is no number is a usage error");
}
