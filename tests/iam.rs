//! The shipped IAM policies (config/iam/), enforced: leaderd runs against
//! moto's server mode, which checks every request against the calling IAM
//! user's policies, with users allowed exactly what the shipped files allow.
//! Every feature works with no call denied: `table create` under the create
//! policy; `table describe`, `run` with sessions (long enough for the check
//! of the records held through the session, a BatchGetItem), `run
//! --balance` with and without sessions (a Scan), `lock` and `status` under
//! the runtime policy. And a policy that lacks `dynamodb:BatchGetItem` is
//! named in the daemon's log, with the fix.
//!
//! moto authorises a DynamoDB call against the resource `*`, whatever table
//! it names, so the policies are loaded with their `Resource` widened to
//! `*`; their actions are the shipped ones. And moto checks a
//! `TransactWriteItems` as the action `dynamodb:TransactWriteItems`, where
//! AWS checks each of its `Put`s as `dynamodb:PutItem` (there is no IAM
//! action of that name): a policy that allows `dynamodb:PutItem` is given
//! it too, as AWS would let the transaction through; a test takes it away
//! to stand for a policy that denies transactions.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, short_lease_args, wait_until};
use common::emulators::{self, AccessKey, Emulator, IAM_USER_SETUP_REQUESTS};

/// The check of the records held through the session reads every R (1 s
/// here), the others' batch every 2R: this many reads take about 6 s.
const READ_CHECKS: f64 = 3.0;

/// How long a daemon may take to do what a test waits for: moto is slow,
/// and the machine is shared.
const LIMIT: Duration = Duration::from_secs(60);

/// A shipped policy file, its resources widened to `*` (see the module's
/// doc), without the actions in `without`.
fn policy(file: &str, without: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/iam")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut doc: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let statements = doc["Statement"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("{} has no Statement list", path.display()));
    for statement in statements {
        statement["Resource"] = "*".into();
        let actions = statement["Action"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("{}: an Action that is not a list", path.display()));
        if actions.iter().any(|a| a == "dynamodb:PutItem") {
            actions.push("dynamodb:TransactWriteItems".into());
        }
        actions.retain(|a| !without.iter().any(|w| a.as_str() == Some(w)));
    }
    doc.to_string()
}

/// One table on one moto server, and its users.
struct Setup {
    moto: Emulator,
    table: String,
    dir: tempfile::TempDir,
}

impl Setup {
    /// A moto server whose unchecked requests are exactly those that make
    /// `users` (name, policy document), and their keys, in that order.
    fn new(users: &[(&str, String)]) -> (Setup, Vec<AccessKey>) {
        let unchecked = IAM_USER_SETUP_REQUESTS * u32::try_from(users.len()).expect("a few users");
        let moto = emulators::moto(unchecked);
        let keys = users
            .iter()
            .map(|(name, doc)| moto.create_iam_user(name, doc))
            .collect();
        let setup = Setup {
            moto,
            table: common::unique_name("iam"),
            dir: tempfile::tempdir().expect("temp dir"),
        };
        (setup, keys)
    }

    fn store_args(&self) -> Vec<String> {
        [
            "--store",
            "dynamodb",
            "--endpoint-url",
            &self.moto.endpoint,
            "--table",
            &self.table,
            "--region",
            "us-east-1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `leaderd ARGS… STORE-ARGS` as the user of `key`, run to its end.
    fn cli(&self, key: &AccessKey, args: &[&str]) -> Output {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(args)
            .args(self.store_args())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(key.env());
        let (out, ended) = output_within(&mut cmd, LIMIT);
        assert!(ended, "leaderd {args:?} did not end");
        out
    }

    /// [`Setup::cli`], expected to succeed: its stdout.
    fn ok(&self, key: &AccessKey, args: &[&str]) -> String {
        let out = self.cli(key, args);
        assert!(
            out.status.success(),
            "leaderd {args:?}: {:?}\n{}\n--- moto ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.moto.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `leaderd run` as the user of `key` for `election` (short lease:
    /// L = 2 s, R = 1 s), with `extra` flags.
    fn run(&self, identity: &str, key: &AccessKey, election: &str, extra: &[&str]) -> Leaderd {
        let mut args = self.store_args();
        args.extend(short_lease_args(election));
        args.extend(extra.iter().map(|s| s.to_string()));
        Leaderd::start(Spec {
            identity,
            args,
            env: key.env(),
            command: vec![],
            dir: self.dir.path(),
        })
    }
}

/// Requests of `op` on the series of `election`.
fn requests(node: &Leaderd, election: &str, op: &str) -> f64 {
    node.metric(&format!(
        "leaderd_store_request_duration_seconds_count{{election=\"{election}\",op=\"{op}\"}}"
    ))
    .unwrap_or(0.0)
}

/// Every failed store request of `election`'s series, whatever its class.
fn errors(node: &Leaderd, election: &str) -> f64 {
    let (_, text) = node.get("/metrics").expect("metrics answer");
    text.lines()
        .filter(|l| {
            l.starts_with("leaderd_store_errors_total{")
                && l.contains(&format!("election=\"{election}\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// No call of `node` was denied: no log line names a missing permission,
/// and no store error is of the class `denied` (or a bare 403).
fn assert_nothing_denied(node: &Leaderd) {
    let log = node.log();
    for said in [
        "not allowed to call",
        "IAM policy",
        "HTTP 403",
        "AccessDenied",
    ] {
        assert!(
            !log.contains(said),
            "{} logged {said:?}:\n{log}",
            node.identity
        );
    }
    let (_, text) = node.get("/metrics").expect("metrics answer");
    let denied: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("leaderd_store_errors_total{") && l.contains("class=\"denied\""))
        .collect();
    assert!(denied.is_empty(), "{}: {denied:?}", node.identity);
}

/// Wait until `node` read back the records it holds through its session
/// [`READ_CHECKS`] times, and at least once successfully: its errors on
/// the session's series (which count every failed check) are fewer.
fn wait_read_checks(node: &Leaderd) {
    let done = wait_until(LIMIT, || {
        requests(node, "#session", "read_check") >= READ_CHECKS
    });
    assert!(
        done.is_some(),
        "{} made {} read checks in {LIMIT:?}",
        node.identity,
        requests(node, "#session", "read_check")
    );
    let checks = requests(node, "#session", "read_check");
    let failed = errors(node, "#session");
    assert!(
        failed < checks,
        "{}: {failed} session errors for {checks} read checks: none succeeded",
        node.identity
    );
}

fn wait_leads(node: &Leaderd, election: &str) {
    let series = format!("leaderd_is_leader{{election=\"{election}\"}}");
    assert!(
        wait_until(LIMIT, || node.metric(&series) == Some(1.0)).is_some(),
        "{} did not lead {election} within {LIMIT:?}",
        node.identity
    );
}

#[test]
fn every_feature_works_under_the_shipped_policies() {
    let (setup, keys) = Setup::new(&[
        ("creator", policy("leaderd-policy-with-create.json", &[])),
        ("runtime", policy("leaderd-policy.json", &[])),
    ]);
    let (creator, runtime) = (&keys[0], &keys[1]);

    let created = setup.ok(creator, &["table", "create", "--ttl"]);
    assert!(created.contains("enabled on expires_at"), "{created}");
    let described = setup.ok(runtime, &["table", "describe"]);
    assert!(described.contains("ACTIVE"), "{described}");

    // Sessions (the default), balance through sessions, and balance by
    // member records (a Scan every R).
    let sessions = setup.run("sessions", runtime, "held", &[]);
    let balanced = setup.run(
        "balanced",
        runtime,
        "shared-1",
        &["--election", "shared-2", "--balance"],
    );
    let scanning = setup.run(
        "scanning",
        runtime,
        "apart-1",
        &["--election", "apart-2", "--balance", "--no-sessions"],
    );

    let token = setup.ok(runtime, &["lock", "acquire", "deploy"]);
    let token = token.trim();
    let status = setup.ok(runtime, &["lock", "status", "deploy", "--json"]);
    assert!(status.contains("fencing_token"), "{status}");
    let renewed = setup.ok(runtime, &["lock", "renew", "deploy", token]);
    setup.ok(runtime, &["lock", "release", "deploy", renewed.trim()]);

    wait_leads(&sessions, "held");
    for election in ["shared-1", "shared-2"] {
        wait_leads(&balanced, election);
    }
    for election in ["apart-1", "apart-2"] {
        wait_leads(&scanning, election);
    }
    // Every election listed (a Scan), and one read by name (a GetItem).
    let listed = setup.ok(runtime, &["status", "--json"]);
    for election in ["held", "shared-1", "apart-2"] {
        assert!(listed.contains(&format!("\"{election}\"")), "{listed}");
    }
    let one = setup.ok(runtime, &["status", "held", "--json"]);
    // Its holder, the daemon named "sessions".
    assert!(one.contains("\"sessions\""), "{one}");
    // The daemons' records: the same Scan.
    let members = setup.ok(runtime, &["status", "--members", "--json"]);
    for record in ["#session/sessions/", "#member/scanning"] {
        assert!(members.contains(record), "{members}");
    }

    wait_read_checks(&sessions);
    wait_read_checks(&balanced);
    let members = wait_until(LIMIT, || {
        requests(&scanning, "#member", "read_members") >= READ_CHECKS
    });
    assert!(members.is_some(), "the member records were not read");
    // At least one read of them (a Scan) succeeded: fewer errors on the
    // members' series, which counts their writes too, than reads.
    let (reads, failed) = (
        requests(&scanning, "#member", "read_members"),
        errors(&scanning, "#member"),
    );
    assert!(failed < reads, "{failed} errors for {reads} member reads");
    for node in [&sessions, &balanced, &scanning] {
        assert_nothing_denied(node);
    }

    // And the server did enforce the policies: the runtime one cannot
    // create a table, and leaderd says which action it lacks.
    let out = setup.cli(runtime, &["table", "create"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{said}");
    assert!(
        said.contains("dynamodb:CreateTable") && said.contains("IAM policy"),
        "{said}"
    );
}

#[test]
fn a_policy_without_batch_get_item_is_named_in_the_log() {
    let (setup, keys) = Setup::new(&[
        ("creator", policy("leaderd-policy-with-create.json", &[])),
        (
            "lacking",
            policy("leaderd-policy.json", &["dynamodb:BatchGetItem"]),
        ),
    ]);
    setup.ok(&keys[0], &["table", "create"]);
    let node = setup.run("lacking", &keys[1], "held", &[]);
    wait_leads(&node, "held");
    let denied = "leaderd_store_errors_total{class=\"denied\",election=\"#session\"}";
    let done = wait_until(LIMIT, || node.metric(denied).unwrap_or(0.0) >= READ_CHECKS);
    assert!(done.is_some(), "no denied read check:\n{}", node.log());

    // One line names the action and the fix, logged once per change, not
    // once per failed check: again only after another error (a timeout on
    // a busy machine) came between.
    let log = node.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot check the records held through the session"))
        .collect();
    let (denials, others): (Vec<&str>, Vec<&str>) = lines
        .iter()
        .partition(|l| l.contains("not allowed to call dynamodb:BatchGetItem"));
    assert!(!denials.is_empty(), "{log}");
    assert!(denials.len() <= 1 + others.len(), "{log}");
    for line in &denials {
        assert!(
            line.contains("add dynamodb:BatchGetItem to the IAM policy"),
            "{line}"
        );
    }
    // Every other call is allowed: still the leader, nothing else denied.
    assert!(node.is_leader(), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("not allowed to call") && !l.contains("dynamodb:BatchGetItem")),
        "{log}"
    );
}

/// A policy that lets no transaction through: the takes that would have
/// gone together go one `PutItem` each, every election is led, and one log
/// line says so (naming what to allow).
#[test]
fn takes_go_one_by_one_where_transactions_are_denied() {
    let (setup, keys) = Setup::new(&[
        ("creator", policy("leaderd-policy-with-create.json", &[])),
        (
            "apart",
            policy("leaderd-policy.json", &["dynamodb:TransactWriteItems"]),
        ),
    ]);
    setup.ok(&keys[0], &["table", "create"]);
    let node = setup.run(
        "apart",
        &keys[1],
        "one",
        &["--election", "two", "--election", "three"],
    );
    for election in ["one", "two", "three"] {
        wait_leads(&node, election);
    }
    let log = node.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused a transaction of many takes"))
        .collect();
    assert_eq!(refused.len(), 1, "{log}");
    assert!(refused[0].contains("dynamodb:PutItem"), "{}", refused[0]);
}
