//! The toolbox of `tests/sessions.rs`: a store read and written by hand
//! (SQLite through rusqlite, DynamoDB Local through the SDK, PostgreSQL
//! through psql), a cluster of
//! `leaderd run --sessions` processes sharing one job history, and what
//! their `/status` and logs say.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use leaderd::lease::dynamodb::{DynamoConfig, DynamoStore};
use nix::sys::signal::Signal;

use crate::common;
use common::daemon::{Leaderd, Spec, leaderd_bin, output_within, wait_until};
use common::history;
use common::postgres::{PgServer, shared_postgres};
use common::proxy::FaultProxy;

/// L = 5 s, R = 1 s, P = 500 ms, G = 500 ms (M = 200 ms, D = 1 %):
/// R + G + M + L·D = 1.75 s < L. A tenure stops 4.25 s after the send of
/// the session's last successful write, so one renew lost or stalled for
/// a whole R and retried after P still lands with a second to spare on a
/// loaded machine.
pub const TIMING: [&str; 8] = [
    "--lease-duration",
    "5s",
    "--renew-interval",
    "1s",
    "--retry-interval",
    "500ms",
    "--kill-grace",
    "500ms",
];
pub const L: Duration = Duration::from_secs(5);
pub const R: Duration = Duration::from_secs(1);
pub const P: Duration = Duration::from_millis(500);
pub const G: Duration = Duration::from_millis(500);
const D: f64 = 0.01;
const M: Duration = Duration::from_millis(200);

/// What a bound on real time allows on top of the protocol's own figure:
/// the machine is two cores shared with other builds and tests.
pub const SLACK: Duration = Duration::from_secs(3);

/// L·(1+D): how long a follower times a session's unchanged `rvn`.
pub fn takeover_wait() -> Duration {
    L.mul_f64(1.0 + D)
}

/// L·(1−D) − M: how long one successful session write keeps its tenures.
pub fn validity() -> Duration {
    L.mul_f64(1.0 - D) - M
}

/// The elections every daemon campaigns for; the first is the primary,
/// whose leader runs the job.
pub const ELECTIONS: [&str; 5] = ["alpha", "bravo", "charlie", "delta", "echo"];

/// CLOCK_MONOTONIC in ns: the clock of the job history's timestamps.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable on Linux");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// One record as stored, read without leaderd's parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub holder: Option<String>,
    pub rvn: Option<String>,
    pub session: Option<String>,
    pub format: Option<i64>,
    pub fencing_token: Option<i64>,
}

enum Backend {
    Postgres {
        server: &'static PgServer,
        table: String,
    },
    Sqlite(PathBuf),
    Dynamo {
        rt: tokio::runtime::Runtime,
        store: DynamoStore,
        endpoint: String,
    },
}

/// Where the records live, and how to read or delete them by hand.
pub struct Store {
    backend: Backend,
}

/// Which store a scenario runs on.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Sqlite,
    DynamoDbLocal,
    Postgres,
}

impl Store {
    /// A fresh store of `kind` (a new file in `dir`, or a new table on the
    /// shared DynamoDB Local).
    pub fn new(kind: Kind, dir: &Path) -> Store {
        match kind {
            Kind::Sqlite => Store {
                backend: Backend::Sqlite(dir.join("leases.db")),
            },
            Kind::DynamoDbLocal => Store::dynamodb(),
            Kind::Postgres => {
                let server = shared_postgres();
                let table = common::unique_name("sessions");
                let out = Command::new(leaderd_bin())
                    .args(["table", "create"])
                    .args(server.args(&table))
                    .output()
                    .expect("run `leaderd table create`");
                assert!(
                    out.status.success(),
                    "`leaderd table create`: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Store {
                    backend: Backend::Postgres { server, table },
                }
            }
        }
    }

    fn dynamodb() -> Store {
        common::emulators::fake_aws_env();
        let endpoint = common::emulators::shared_dynamodb_local().endpoint.clone();
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        let store = rt.block_on(async {
            let store = DynamoStore::new(&DynamoConfig {
                table: common::unique_name("sessions"),
                region: "us-east-1".into(),
                endpoint_url: Some(endpoint.clone()),
            })
            .await;
            store
                .create_table(false, Duration::from_secs(60))
                .await
                .expect("create the table");
            store
        });
        Store {
            backend: Backend::Dynamo {
                rt,
                store,
                endpoint,
            },
        }
    }

    /// The emulator's address, for a fault proxy in front of it.
    pub fn upstream(&self) -> Option<SocketAddr> {
        match &self.backend {
            Backend::Sqlite(_) | Backend::Postgres { .. } => None,
            Backend::Dynamo { endpoint, .. } => endpoint
                .strip_prefix("http://")
                .and_then(|a| a.parse().ok()),
        }
    }

    /// The SQLite file, if that is the store.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(path) => Some(path),
            Backend::Dynamo { .. } | Backend::Postgres { .. } => None,
        }
    }

    /// The store flags of `leaderd run` and `leaderd lock`; through
    /// `proxy` when given (DynamoDB only).
    pub fn args(&self, proxy: Option<&FaultProxy>) -> Vec<String> {
        match &self.backend {
            Backend::Postgres { server, table } => {
                assert!(
                    proxy.is_none(),
                    "no fault proxy in front of PostgreSQL here"
                );
                server.args(table)
            }
            Backend::Sqlite(path) => vec![
                "--store".into(),
                "sqlite".into(),
                "--store-path".into(),
                path.display().to_string(),
            ],
            Backend::Dynamo {
                store, endpoint, ..
            } => vec![
                "--store".into(),
                "dynamodb".into(),
                "--endpoint-url".into(),
                proxy.map_or_else(|| endpoint.clone(), FaultProxy::endpoint),
                "--table".into(),
                store.table().to_owned(),
                "--region".into(),
                "us-east-1".into(),
            ],
        }
    }

    /// Every record, as stored.
    pub fn rows(&self) -> Vec<Row> {
        match &self.backend {
            Backend::Postgres { server, table } => server
                .query(&format!(
                    "SELECT election, holder, rvn, session, format, fencing_token FROM \"{table}\""
                ))
                .into_iter()
                .map(|r| {
                    let n = |i: usize| r[i].as_deref().and_then(|v| v.parse().ok());
                    Row {
                        key: r[0].clone().unwrap_or_default(),
                        holder: r[1].clone(),
                        rvn: r[2].clone(),
                        session: r[3].clone(),
                        format: n(4),
                        fencing_token: n(5),
                    }
                })
                .collect(),
            Backend::Sqlite(path) => sqlite_rows(path),
            Backend::Dynamo { rt, store, .. } => rt.block_on(async {
                let out = store
                    .client()
                    .scan()
                    .table_name(store.table())
                    .consistent_read(true)
                    .send()
                    .await
                    .expect("scan the table");
                out.items().iter().map(dynamo_row).collect()
            }),
        }
    }

    /// The record under `key`, if there is one.
    pub fn row(&self, key: &str) -> Option<Row> {
        self.rows().into_iter().find(|r| r.key == key)
    }

    /// The session records (`#session/…`).
    pub fn sessions(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .rows()
            .into_iter()
            .filter(|r| r.key.starts_with("#session/"))
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }

    /// Delete the record under `key` by hand.
    pub fn delete(&self, key: &str) {
        match &self.backend {
            Backend::Postgres { server, table } => {
                let deleted = server.query(&format!(
                    "DELETE FROM \"{table}\" WHERE election = '{}' RETURNING 1",
                    key.replace('\'', "''")
                ));
                assert_eq!(deleted.len(), 1, "no row {key}");
            }
            Backend::Sqlite(path) => {
                let conn = sqlite(path);
                let n = conn
                    .execute("DELETE FROM leases WHERE election = ?1", [key])
                    .expect("delete the row");
                assert_eq!(n, 1, "no row {key}");
            }
            Backend::Dynamo { rt, store, .. } => rt.block_on(async {
                store
                    .client()
                    .delete_item()
                    .table_name(store.table())
                    .key("election", AttributeValue::S(key.to_owned()))
                    .send()
                    .await
                    .expect("delete the item");
            }),
        }
    }

    /// `leaderd ARGS… STORE-FLAGS EXTRA…`, not started yet.
    pub fn command(&self, args: &[&str], extra: &[&str]) -> Command {
        let mut cmd = Command::new(leaderd_bin());
        cmd.args(args)
            .args(self.args(None))
            .args(extra)
            .env("AWS_ACCESS_KEY_ID", "leaderdtest")
            .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        cmd
    }

    /// `leaderd ARGS… STORE-FLAGS EXTRA…`, run to its end (60 s at most).
    pub fn leaderd(&self, args: &[&str], extra: &[&str]) -> Output {
        let (out, ended) = output_within(&mut self.command(args, extra), Duration::from_secs(60));
        assert!(ended, "leaderd {args:?} did not end");
        out
    }
}

/// A connection that waits for the daemons' write locks instead of failing.
pub fn sqlite(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the SQLite file");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("set a busy timeout");
    conn
}

fn sqlite_rows(path: &Path) -> Vec<Row> {
    let conn = sqlite(path);
    let mut stmt = conn
        .prepare("SELECT election, holder, rvn, session, format, fencing_token FROM leases")
        .expect("prepare");
    stmt.query_map([], |r| {
        Ok(Row {
            key: r.get(0)?,
            holder: r.get(1)?,
            rvn: r.get(2)?,
            session: r.get(3)?,
            format: r.get(4)?,
            fencing_token: r.get(5)?,
        })
    })
    .expect("query")
    .collect::<rusqlite::Result<Vec<_>>>()
    .expect("read the rows")
}

fn dynamo_row(item: &std::collections::HashMap<String, AttributeValue>) -> Row {
    let s = |k: &str| match item.get(k) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    };
    let n = |k: &str| match item.get(k) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    };
    Row {
        key: s("election").unwrap_or_default(),
        holder: s("holder"),
        rvn: s("rvn"),
        session: s("session"),
        format: n("format"),
        fencing_token: n("fencing_token"),
    }
}

/// One election as a daemon's `/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub is_leader: bool,
    pub role: String,
    pub leader: Option<String>,
    pub token: Option<u64>,
}

/// Every election of `node`'s `/status`; `None` if it does not answer.
pub fn elections_of(node: &Leaderd) -> Option<BTreeMap<String, View>> {
    let (status, body) = node.get("/status")?;
    if status != 200 && status != 503 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let elections = json["elections"].as_object()?;
    Some(
        elections
            .iter()
            .map(|(name, e)| {
                let view = View {
                    is_leader: e["is_leader"].as_bool().unwrap_or(false),
                    role: e["role"].as_str().unwrap_or_default().to_owned(),
                    leader: e["leader"].as_str().map(str::to_owned),
                    token: e["fencing_token"].as_u64(),
                };
                (name.clone(), view)
            })
            .collect(),
    )
}

/// The token `node` leads its primary election with, if it leads it.
pub fn primary_token(node: &Leaderd) -> Option<u64> {
    let (_, body) = node.get("/status")?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let primary = json["primary"].as_str()?;
    let view = &json["elections"][primary];
    if view["is_leader"].as_bool() != Some(true) {
        return None;
    }
    view["fencing_token"].as_u64()
}

/// Who leads each election among `nodes`, with the token each leads with.
pub fn who_leads(nodes: &[&Leaderd]) -> BTreeMap<String, Vec<(String, u64)>> {
    let mut led: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for node in nodes {
        for (name, view) in elections_of(node).unwrap_or_default() {
            if view.is_leader {
                led.entry(name)
                    .or_default()
                    .push((node.identity.clone(), view.token.unwrap_or(0)));
            }
        }
    }
    led
}

/// Whether each of `elections` has exactly one leader among `nodes`.
pub fn all_led_once(nodes: &[&Leaderd], elections: &[&str]) -> bool {
    let led = who_leads(nodes);
    elections
        .iter()
        .all(|e| led.get(*e).is_some_and(|l| l.len() == 1))
}

/// The keys of the sessions `log` says were opened, in order.
pub fn sessions_opened(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("session opened:"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("session="))
                .map(|k| k.trim_matches('"').to_owned())
        })
        .collect()
}

/// A cluster of `leaderd run --sessions` processes, each running `job.py`
/// for the primary election into one shared history.
pub struct Cluster {
    /// Declared first: fields drop in order, and a failing test prints each
    /// instance's log as it drops, from files in `dir`.
    pub nodes: Vec<Leaderd>,
    pub store: Store,
    pub history: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    pub fn new(kind: Kind) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        Cluster {
            nodes: Vec::new(),
            store: Store::new(kind, dir.path()),
            history: dir.path().join("history.log"),
            dir,
        }
    }

    /// Start `identity` with `--sessions`, campaigning for `elections`
    /// (the first is the primary), talking to the store through `proxy`
    /// when given.
    pub fn start(&mut self, identity: &str, elections: &[&str], proxy: Option<&FaultProxy>) {
        self.start_with(identity, elections, proxy, &[], vec![]);
    }

    /// [`Cluster::start`] with more arguments and environment.
    pub fn start_with(
        &mut self,
        identity: &str,
        elections: &[&str],
        proxy: Option<&FaultProxy>,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) {
        let mut args = self.store.args(proxy);
        args.extend(TIMING.iter().map(|s| s.to_string()));
        args.push("--sessions".into());
        for e in elections {
            args.extend(["--election".to_string(), e.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let node = Leaderd::start(Spec {
            identity,
            args,
            env,
            command: common::job_command(&self.history),
            dir: self.dir.path(),
        });
        node.wait_http(Duration::from_secs(20));
        self.nodes.push(node);
    }

    pub fn node(&self, identity: &str) -> &Leaderd {
        self.nodes
            .iter()
            .find(|n| n.identity == identity)
            .unwrap_or_else(|| panic!("no node {identity}"))
    }

    /// The nodes but `skip`.
    pub fn others(&self, skip: &str) -> Vec<&Leaderd> {
        self.nodes.iter().filter(|n| n.identity != skip).collect()
    }

    pub fn all(&self) -> Vec<&Leaderd> {
        self.nodes.iter().collect()
    }

    /// `node-a` leads every election and runs its job; `node-b` and
    /// `node-c` follow it everywhere. `node-a` talks to the store through
    /// `proxy` when given. Returns `node-a`'s token of each election.
    pub fn settle(&mut self, proxy: Option<&FaultProxy>) -> BTreeMap<String, u64> {
        self.start("node-a", &ELECTIONS, proxy);
        self.settle_started()
    }

    /// [`Cluster::settle`] once `node-a` was started.
    pub fn settle_started(&mut self) -> BTreeMap<String, u64> {
        wait_until(Duration::from_secs(30), || {
            all_led_once(&[self.node("node-a")], &ELECTIONS) && self.job_running("node-a")
        })
        .unwrap_or_else(|| panic!("node-a does not lead every election with its job running"));
        for id in ["node-b", "node-c"] {
            self.start(id, &ELECTIONS, None);
        }
        wait_until(Duration::from_secs(30), || {
            self.others("node-a").iter().all(|n| {
                elections_of(n).is_some_and(|v| {
                    v.len() == ELECTIONS.len()
                        && v.values()
                            .all(|e| !e.is_leader && e.leader.as_deref() == Some("node-a"))
                })
            })
        })
        .unwrap_or_else(|| panic!("node-b and node-c do not follow node-a everywhere"));
        let tokens = self.tokens_of("node-a");
        assert_eq!(tokens.len(), ELECTIONS.len(), "{tokens:?}");
        tokens
    }

    /// The token of every election `identity` leads now.
    pub fn tokens_of(&self, identity: &str) -> BTreeMap<String, u64> {
        elections_of(self.node(identity))
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| v.is_leader)
            .map(|(e, v)| (e, v.token.unwrap_or(0)))
            .collect()
    }

    /// The only session `identity`'s log says it opened so far.
    pub fn only_session(&self, identity: &str) -> String {
        let opened = sessions_opened(&self.node(identity).log());
        assert_eq!(opened.len(), 1, "{identity} opened {opened:?}");
        opened[0].clone()
    }

    /// Remove `identity` from the cluster (to kill it or stop it alone).
    pub fn take(&mut self, identity: &str) -> Leaderd {
        let i = self
            .nodes
            .iter()
            .position(|n| n.identity == identity)
            .unwrap_or_else(|| panic!("no node {identity}"));
        self.nodes.remove(i)
    }

    pub fn history_text(&self) -> String {
        std::fs::read_to_string(&self.history).unwrap_or_default()
    }

    /// Whether the job of `identity`'s current tenure of its primary
    /// election runs: it wrote its `start` line and not yet its `end` line.
    /// (An earlier job of the same identity, killed with its daemon, may
    /// have left a `start` line without an `end` one.)
    pub fn job_running(&self, identity: &str) -> bool {
        let Some(token) = primary_token(self.node(identity)) else {
            return false;
        };
        let token = token.to_string();
        let log = self.history_text();
        let events: Vec<&str> = log
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| f.len() == 5 && f[2] == identity && f[3] == token)
            .map(|f| f[1])
            .collect();
        events.contains(&"start") && !events.contains(&"end")
    }

    /// SIGTERM every node left, and check each stops with its child's code
    /// (job.py exits 0 on SIGTERM) and ends the last session it opened
    /// unless the others ended it first (a node that never led opened
    /// none).
    pub fn stop_all(&mut self) {
        for node in &self.nodes {
            node.signal(Signal::SIGTERM);
        }
        for node in &mut self.nodes {
            let status = node
                .wait_exit(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("{} does not exit after SIGTERM", node.identity));
            assert_eq!(status.code(), Some(0), "{}: {status:?}", node.identity);
            let log = node.log();
            // Ended by itself (its end write tried, if the store was cut
            // off), or lost to the others (who ended it).
            if let Some(opened) = log.rfind("session opened") {
                let after = &log[opened..];
                assert!(
                    after.contains("session ended")
                        || after.contains("session lost")
                        || after.contains("op=\"end_session\""),
                    "{} did not end its session",
                    node.identity
                );
            }
        }
    }

    /// The jobs' history: no two tenures overlap, tokens rise.
    pub fn check_history(&self) -> history::Summary {
        let log = self.history_text();
        let summary = history::check(&log).unwrap_or_else(|v| panic!("unsafe history: {v}\n{log}"));
        eprintln!("{summary}");
        summary
    }
}
