//! The alerts and the Grafana dashboard the chart ships, tested like code:
//! the rules pass `promtool check rules` and their unit tests
//! (tests/monitoring/alerts-test.yaml), every alert has a case where it fires
//! and one where it stays quiet, the dashboard is wired to its variables, and
//! every series the rules and the dashboard query is exported by a live
//! daemon with the labels and label values they use: one whose elections all
//! have series of their own, and one with more elections than
//! `metrics.election_series_limit`, which counts most together.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::{Leaderd, Spec, sqlite_short_args, wait_until};

const ALERTS: &str = "helm/leaderd/files/alerts.yaml";
const ALERT_TESTS: &str = "tests/monitoring/alerts-test.yaml";
const DASHBOARD: &str = "helm/leaderd/files/dashboard.json";

/// Labels Prometheus adds to every scraped series (`instance`, `job`) and
/// the Prometheus Operator adds in Kubernetes (`namespace`, `pod`): the rules
/// and the dashboard may group by them although leaderd does not export them.
const TARGET_LABELS: [&str; 4] = ["namespace", "job", "instance", "pod"];

/// Series without an `election` label that the dashboard shows: one per
/// daemon, so they cannot follow the election selector.
const PER_DAEMON: [&str; 2] = ["leaderd_build_info", "leaderd_renew_lag_seconds_bucket"];

/// The label under which a daemon with more elections than its limit counts
/// the others together (`leaderd::metrics::OTHERS_LABEL`).
const OTHERS: &str = "#others";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Run promtool with `args`; panics with its output when it fails, or with
/// how to install it when it is missing.
fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}); install it with `apt-get install prometheus` \
                 (Debian's package provides promtool; tests/run-all.sh does this)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let out = promtool(&["check", "rules", ALERTS], &repo_file("."));
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alert_names().len())),
        "{out}"
    );
    let tests = repo_file(ALERT_TESTS);
    let out = promtool(
        &["test", "rules", "alerts-test.yaml"],
        tests.parent().expect("the test file is in a directory"),
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The names of the alerts, in file order.
fn alert_names() -> Vec<String> {
    let names: Vec<String> = read(ALERTS)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect();
    assert!(!names.is_empty(), "no `- alert:` in {ALERTS}");
    names
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    // In the test file each `alertname:` is followed by its `exp_alerts:`;
    // a quiet case is written `exp_alerts: []`.
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in read(ALERT_TESTS).lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname:") {
            current = Some(name.trim().to_owned());
        } else if let Some(expected) = line.strip_prefix("exp_alerts:") {
            let name = current
                .take()
                .unwrap_or_else(|| panic!("`exp_alerts` without an `alertname` in {ALERT_TESTS}"));
            if expected.trim() == "[]" {
                quiet.insert(name);
            } else {
                firing.insert(name);
            }
        }
    }
    let names = alert_names();
    for name in &names {
        assert!(
            firing.contains(name),
            "no test in {ALERT_TESTS} where {name} fires"
        );
        assert!(
            quiet.contains(name),
            "no test in {ALERT_TESTS} where {name} stays quiet"
        );
    }
    for name in firing.union(&quiet) {
        assert!(
            names.contains(name),
            "{ALERT_TESTS} tests {name}, which {ALERTS} lacks"
        );
    }
}

/// The alerts' expressions: `expr:` on one line, or a block scalar
/// (`expr: >-`) over the lines indented below it.
fn alert_exprs() -> Vec<String> {
    let text = read(ALERTS);
    let lines: Vec<&str> = text.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        i += 1;
        let Some(value) = line.trim().strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if !matches!(value, ">-" | ">" | "|" | "|-") {
            exprs.push(value.to_owned());
            continue;
        }
        let mut block = Vec::new();
        while i < lines.len() {
            let next = lines[i];
            if !next.trim().is_empty() && next.len() - next.trim_start().len() <= indent {
                break;
            }
            block.push(next.trim());
            i += 1;
        }
        exprs.push(block.join(" "));
    }
    assert_eq!(
        exprs.len(),
        alert_names().len(),
        "one expression per alert in {ALERTS}: {exprs:#?}"
    );
    exprs
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every panel, including those inside collapsed rows.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// The queries of the dashboard: every target's `expr` and the variables'
/// queries.
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut exprs: Vec<String> = panels(dashboard)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_owned()
        })
        .collect();
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(q) = var["definition"].as_str() {
            exprs.push(q.to_owned());
        }
    }
    exprs
}

#[test]
fn the_dashboard_is_wired_to_its_data_source_and_election_variables() {
    let dash = dashboard();
    let vars = dash["templating"]["list"].as_array().expect("templating");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    let election = var("election");
    assert_eq!(election["type"], "query");
    assert_eq!(election["multi"], true);
    assert_eq!(election["includeAll"], true);
    assert_eq!(election["datasource"]["uid"], "${datasource}");

    let mut ids = BTreeSet::new();
    for panel in panels(&dash) {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "id of {title} reused"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{title}: gridPos");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} queries nothing");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().expect("expr");
            // Every election-labelled series follows the selector.
            for used in series_used(expr) {
                if !PER_DAEMON.contains(&used.metric.as_str()) {
                    assert!(
                        used.matchers.iter().any(|m| m.label == "election"
                            && m.op == "=~"
                            && m.value == "$election"),
                        "{title}: {} ignores the election selector in {expr}",
                        used.metric
                    );
                }
            }
        }
    }

    // What an operator looks for, per election.
    let all: String = dashboard_exprs(&dash).join("\n");
    for metric in [
        "leaderd_is_leader",
        "leaderd_lease_remaining_seconds",
        "leaderd_transitions_total",
        "leaderd_renew_total",
        "leaderd_store_request_duration_seconds_bucket",
        "leaderd_store_errors_total",
        "leaderd_child_running",
        "leaderd_child_exits_total",
        "leaderd_child_kills_total",
        "leaderd_leases_lost_total",
        "leaderd_renew_lag_seconds_bucket",
        "leaderd_elections",
    ] {
        assert!(all.contains(metric), "the dashboard does not show {metric}");
    }
}

/// A label matcher in a selector: `label op "value"`.
#[derive(Debug)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

/// One leaderd series selector in a query.
#[derive(Debug)]
struct Used {
    metric: String,
    matchers: Vec<Matcher>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `leaderd_*` selectors in `expr`, with their matchers.
fn series_used(expr: &str) -> Vec<Used> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("leaderd_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c| !is_ident(c)).unwrap_or(tail.len());
        rest = &tail[end..];
        if before.is_some_and(is_ident) {
            continue;
        }
        let mut used = Used {
            metric: tail[..end].to_owned(),
            matchers: Vec::new(),
        };
        if let Some(body) = rest.strip_prefix('{') {
            let close = body
                .find('}')
                .unwrap_or_else(|| panic!("unclosed selector in {expr}"));
            for part in body[..close].split(',').filter(|p| !p.trim().is_empty()) {
                let op_at = part
                    .find(['=', '!'])
                    .unwrap_or_else(|| panic!("matcher {part:?}"));
                let op_len = if part[op_at..].starts_with("=~")
                    || part[op_at..].starts_with("!~")
                    || part[op_at..].starts_with("!=")
                {
                    2
                } else {
                    1
                };
                used.matchers.push(Matcher {
                    label: part[..op_at].trim().to_owned(),
                    op: part[op_at..op_at + op_len].to_owned(),
                    value: part[op_at + op_len..].trim().trim_matches('"').to_owned(),
                });
            }
            rest = &body[close + 1..];
        }
        out.push(used);
    }
    out
}

/// The labels of every `by (...)` clause and `label_values(_, label)` in
/// `expr`.
fn grouping_labels(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for (key, close) in [("by", ')'), ("label_values", ')')] {
        let mut rest = expr;
        while let Some(at) = rest.find(key) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + key.len()..];
            if before.is_some_and(is_ident) {
                continue;
            }
            let Some(body) = rest.trim_start().strip_prefix('(') else {
                continue;
            };
            let end = body
                .find(close)
                .unwrap_or_else(|| panic!("unclosed {key} in {expr}"));
            let list = &body[..end];
            let list = if key == "label_values" {
                list.rsplit(',').next().unwrap_or("")
            } else {
                list
            };
            labels.extend(
                list.split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    labels
}

/// The series of a Prometheus text exposition: name -> label sets.
fn parse_exposition(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut series: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name_end = line.find(['{', ' ']).expect("a sample line has a name");
        let mut labels = BTreeMap::new();
        if line[name_end..].starts_with('{') {
            let body = &line[name_end + 1..line.rfind('}').expect("closing brace")];
            // leaderd's label values (election names, words) hold no quotes
            // or commas.
            for pair in body.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("label=value");
                labels.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
        series
            .entry(line[..name_end].to_owned())
            .or_default()
            .push(labels);
    }
    series
}

/// Whether `used` queries only what a daemon exports while it counts some
/// elections together: `leaderd_elections`, or any series of `#others`.
fn counted_together_only(used: &Used) -> bool {
    used.metric == "leaderd_elections"
        || used
            .matchers
            .iter()
            .any(|m| m.label == "election" && m.op == "=" && m.value == OTHERS)
}

/// Problems of `expr` against the series a daemon exports; `every_own`: the
/// daemon's elections all have series of their own, so what exists only
/// while some are counted together is not looked for.
fn check_expr(
    expr: &str,
    exported: &BTreeMap<String, Vec<BTreeMap<String, String>>>,
    every_own: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut used = series_used(expr);
    if every_own {
        used.retain(|u| !counted_together_only(u));
    }
    for u in &used {
        let Some(sets) = exported.get(&u.metric) else {
            problems.push(format!("{} is not exported (in {expr})", u.metric));
            continue;
        };
        for m in &u.matchers {
            let values: BTreeSet<&str> = sets
                .iter()
                .filter_map(|s| s.get(&m.label))
                .map(String::as_str)
                .collect();
            if values.is_empty() {
                problems.push(format!("{} has no label {} (in {expr})", u.metric, m.label));
                continue;
            }
            // A value asked for (`=`, or `=~` with an alternation of words)
            // must be one leaderd exports: a typo would match nothing,
            // silently.
            let literal = matches!(m.op.as_str(), "=" | "=~")
                && !m.value.contains('$')
                && m.value
                    .split('|')
                    .all(|w| !w.is_empty() && w.chars().all(|c| is_ident(c) || c == '#'));
            if literal {
                for word in m.value.split('|') {
                    if !values.contains(word) {
                        problems.push(format!(
                            "{}{{{}=\"{word}\"}} is never exported; values: {values:?} (in {expr})",
                            u.metric, m.label
                        ));
                    }
                }
            }
        }
    }
    for label in grouping_labels(expr) {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        for u in &used {
            let carried = label == "le" && u.metric.ends_with("_bucket")
                || exported
                    .get(&u.metric)
                    .is_some_and(|sets| sets.iter().any(|s| s.contains_key(&label)));
            if !carried {
                problems.push(format!(
                    "{} has no label {label} to group by (in {expr})",
                    u.metric
                ));
            }
        }
    }
    problems
}

/// The checker itself finds what it must: a wrong metric, label, value or
/// grouping.
#[test]
fn the_query_checker_finds_unknown_series_labels_and_values() {
    let exported = parse_exposition(
        "# TYPE leaderd_renew_total counter\n\
         leaderd_renew_total{election=\"web\",result=\"ok\"} 3\n\
         leaderd_renew_total{election=\"web\",result=\"error\"} 0\n\
         leaderd_build_info{version=\"1.0.0\"} 1\n",
    );
    let ok = r#"sum by (namespace, election, result) (rate(leaderd_renew_total{election=~"$election", result=~"ok|error"}[5m]))"#;
    assert_eq!(check_expr(ok, &exported, true), Vec::<String>::new());
    // Series of the elections counted together: looked for unless every
    // election has series of its own.
    let together = r##"sum by (state) (leaderd_elections{election="#others"}) + leaderd_renew_total{election="#others"}"##;
    assert_eq!(check_expr(together, &exported, true), Vec::<String>::new());
    let problems = check_expr(together, &exported, false);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    for bad in [
        "rate(leaderd_renew_totl[5m])",
        r#"leaderd_renew_total{reslt="ok"}"#,
        r#"leaderd_renew_total{result=~"ok|eror"}"#,
        "sum by (class) (leaderd_renew_total)",
        "count by (election) (leaderd_build_info)",
    ] {
        assert_eq!(
            check_expr(bad, &exported, true).len(),
            1,
            "{bad}: {:?}",
            check_expr(bad, &exported, true)
        );
    }
}

#[test]
fn every_series_the_alerts_and_dashboard_use_is_exported_by_a_live_daemon() {
    check_live_daemon(&[]);
}

/// With more elections than its limit, a daemon exports what the alerts and
/// the dashboard ask of the elections counted together (and of the primary,
/// which keeps series of its own).
#[test]
fn every_series_the_alerts_and_dashboard_use_is_exported_by_a_daemon_counting_elections_together() {
    check_live_daemon(&["more-1", "more-2"]);
}

/// A leader of election `web` and of `more` elections, with a job that keeps
/// exiting (restarted), whose store refused its renewals for a while: every
/// family it can export, with the labels values a transition, an exit and a
/// store error bring. With `more` elections, the limit is 1: only `web` (the
/// primary) keeps series of its own.
fn check_live_daemon(more: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    // The "app": answers every request with 200.
    let app = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the app");
    let app_addr = app.local_addr().expect("address");
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in app.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    // Create the table first, so the refusing trigger can be added to it.
    common::daemon::create_sqlite_store(&db);

    let mut args = sqlite_short_args(&db, "web");
    args.extend(["--on-child-exit".into(), "restart".into()]);
    for election in more {
        args.extend(["--election".into(), (*election).into()]);
    }
    if !more.is_empty() {
        args.extend(["--election-series-limit".into(), "1".into()]);
    }
    // An app check that passes, so its series exist too.
    args.extend(["--app-check".into(), format!("http://{app_addr}/")]);
    let node = Leaderd::start(Spec {
        identity: "a",
        args,
        env: vec![],
        command: vec!["sh".into(), "-c".into(), "sleep 0.2; exit 3".into()],
        dir: dir.path(),
    });
    let scrape = || parse_exposition(&node.get("/metrics").expect("metrics answer").1);
    let has = |metric: &str, label: &str, value: &str| {
        scrape().get(metric).is_some_and(|sets| {
            sets.iter()
                .any(|s| s.get(label).map(String::as_str) == Some(value))
        })
    };
    wait_until(Duration::from_secs(20), || {
        has("leaderd_child_exits_total", "reason", "exited")
            && has("leaderd_transitions_total", "direction", "gained")
    })
    .unwrap_or_else(|| panic!("no transition and job exit; log:\n{}", node.log()));
    // Renewals (the session's) are timed as they go out.
    wait_until(Duration::from_secs(20), || {
        node.metric("leaderd_renew_lag_seconds_count")
            .is_some_and(|n| n > 0.0)
    })
    .unwrap_or_else(|| panic!("no renewal timed; log:\n{}", node.log()));

    // Refuse renewals until one fails, then let them through again.
    let conn = rusqlite::Connection::open(&db).expect("open the store");
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON leases \
         BEGIN SELECT RAISE(ABORT, 'writes refused by policy'); END;",
    )
    .expect("add the trigger");
    let refused = wait_until(Duration::from_secs(20), || {
        scrape()
            .get("leaderd_store_errors_total")
            .is_some_and(|sets| !sets.is_empty())
    });
    conn.execute_batch("DROP TRIGGER refuse;")
        .expect("drop the trigger");
    refused.unwrap_or_else(|| panic!("no store error counted; log:\n{}", node.log()));

    let exported = scrape();
    let together = !more.is_empty();
    let others = exported.get("leaderd_elections").is_some_and(|sets| {
        sets.iter()
            .any(|s| s.get("election").map(String::as_str) == Some(OTHERS))
    });
    assert_eq!(others, together, "{exported:#?}");
    for metric in PER_DAEMON {
        let sets = exported
            .get(metric)
            .unwrap_or_else(|| panic!("{metric} is not exported"));
        assert!(
            sets.iter().all(|s| !s.contains_key("election")),
            "{metric} has an election label, so the dashboard must select it"
        );
    }
    let mut problems = Vec::new();
    for expr in alert_exprs().iter().chain(&dashboard_exprs(&dashboard())) {
        problems.extend(check_expr(expr, &exported, !together));
    }
    assert!(
        problems.is_empty(),
        "queries that a live daemon's /metrics cannot answer:\n{}\n--- exported ---\n{exported:#?}",
        problems.join("\n")
    );
}
