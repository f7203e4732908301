//! The flags layer: the command-line flags that carry settings (clap
//! definitions shared by `run`, `status` and `table`), applied over the file
//! and the environment after extraction. The command line itself
//! (subcommands, help, exit on a usage error) is [`crate::cli`]'s; it embeds
//! these.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::raw::{DurationValue, ListenAddr, RawConfig, RawElection, RawStore, split_host_port};
use super::{LogFormat, Mode, OnChildExit, StoreKind, limits};
use crate::text;

/// Where the configuration file and the lease store are: the flags every
/// subcommand that touches the store shares.
#[derive(Debug, Clone, Default, Args)]
pub struct StoreArgs {
    /// TOML configuration file (see config/leaderd.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Lease store kind [config: store.kind].
    #[arg(long = "store", value_name = "KIND")]
    pub store_kind: Option<StoreKind>,
    /// SQLite database file [config: store.path].
    #[arg(long, value_name = "FILE")]
    pub store_path: Option<PathBuf>,
    /// DynamoDB table [config: store.table].
    #[arg(long, value_name = "NAME")]
    pub table: Option<String>,
    /// AWS region; default from the standard AWS chain: AWS_REGION, the AWS
    /// profile, EC2 instance metadata [config: store.region].
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// DynamoDB endpoint, e.g. http://127.0.0.1:8000 [config: store.endpoint_url].
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// PostgreSQL URL, e.g. postgres://leaderd@db:5432/app?sslmode=verify-full
    /// [config: store.url].
    #[arg(long, value_name = "URL")]
    pub store_url: Option<String>,
    /// File holding the PostgreSQL password; default PGPASSWORD
    /// [config: store.password_file].
    #[arg(long, value_name = "FILE")]
    pub store_password_file: Option<PathBuf>,
    /// CA certificates (PEM) the PostgreSQL server's must chain to under
    /// sslmode=verify-ca|verify-full; default the system's [config: store.ca_file].
    #[arg(long, value_name = "FILE")]
    pub store_ca_file: Option<PathBuf>,
}

/// `leaderd run [OPTIONS] [-- COMMAND [ARGS…]]`.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Our identity in the lease record; default host name + random suffix [config: identity].
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,
    /// Campaign for this election (repeatable); replaces the configured list,
    /// keeping the overrides of a configured election of the same name.
    #[arg(long = "election", value_name = "NAME")]
    pub elections: Vec<String>,
    /// The election behind `GET /leader` and the one the child runs for;
    /// default the first election listed [config: http.primary].
    #[arg(long, value_name = "NAME")]
    pub primary: Option<String>,
    /// HTTP listen address, HOST:PORT (a host name is resolved) [config: http.listen].
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<String>,
    /// Lease duration L, e.g. 10s [config: lease.duration].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease_duration: Option<Duration>,
    /// Renew interval R; default L/2 [config: lease.renew_interval].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub renew_interval: Option<Duration>,
    /// Follower poll and renew retry interval P [config: lease.retry_interval].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub retry_interval: Option<Duration>,
    /// Time between the stop signal and the kill G [config: child.kill_grace].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub kill_grace: Option<Duration>,
    /// When the child runs [config: child.mode].
    #[arg(long, value_name = "MODE")]
    pub mode: Option<Mode>,
    /// What to do when the child exits on its own [config: child.on_child_exit].
    #[arg(long, value_name = "ACTION")]
    pub on_child_exit: Option<OnChildExit>,
    /// Exit 75 unless a lease is acquired within this time; 0 = try once;
    /// absent = wait forever.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub acquire_timeout: Option<Duration>,
    /// Log format [config: log.format].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// HOST:PORT other instances reach this one's HTTP API at, written into
    /// the lease record while leading; default the listen address, or the
    /// first non-loopback address when listening on a wildcard
    /// [config: http.advertise].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// Campaign only while GET URL answers 2xx [config: app_check.http].
    #[arg(long, value_name = "URL")]
    pub app_check: Option<String>,
    /// Share the elections with the other live instances that campaign for
    /// the same ones, each leading its fair share [config: balance].
    #[arg(long)]
    pub balance: bool,
    /// Hold every election through one session record, renewed for all of
    /// them at the cost of one; the default when every election shares one
    /// lease timing [config: sessions].
    #[arg(long, conflicts_with = "no_sessions")]
    pub sessions: bool,
    /// Make every election its own lease, renewed on its own (as releases
    /// before sessions did) [config: sessions = false].
    #[arg(long)]
    pub no_sessions: bool,
    /// This instance's priority in every election (higher leads; default 0)
    /// [config: priority].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub priority: Option<i64>,
    /// How long a live member of a higher priority must have been eligible
    /// before the leader hands it the election (default 10s) [config: preempt_after].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub preempt_after: Option<Duration>,
    /// Never hand an election over for priority alone; priority then only
    /// orders who tries first [config: preempt = false].
    #[arg(long)]
    pub no_preempt: bool,
    /// With more elections than this, only those named in metrics.elections
    /// and the primary have series of their own in /metrics; the others
    /// are counted together [config: metrics.election_series_limit].
    #[arg(long, value_name = "N")]
    pub election_series_limit: Option<u32>,
    /// The child command, run without a shell [config: child.command].
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// A duration flag, read as every duration is (see [`super::duration`]).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    super::duration::parse(s).map_err(|e| e.to_string())
}

/// A duration of at most [`limits::MAX_WAIT`].
pub(crate) fn parse_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > limits::MAX_WAIT {
        return Err(format!(
            "longer than the limit of {}",
            text::duration(limits::MAX_WAIT)
        ));
    }
    Ok(d)
}

/// `HOST:PORT`; the host is resolved when the configuration is loaded.
fn parse_listen(s: &str) -> Result<String, String> {
    match split_host_port(s) {
        Some(_) => Ok(s.trim().to_owned()),
        None => Err("expected HOST:PORT, like 0.0.0.0:9777, [::1]:9777 or localhost:9777".into()),
    }
}

pub(super) fn apply_store_flags(store: &mut RawStore, args: &StoreArgs) {
    if let Some(kind) = args.store_kind {
        store.kind = Some(kind);
    }
    if let Some(path) = &args.store_path {
        store.path = Some(path.clone());
    }
    if let Some(table) = &args.table {
        store.table = Some(table.clone());
    }
    if let Some(region) = &args.region {
        store.region = Some(region.clone());
    }
    if let Some(url) = &args.endpoint_url {
        store.endpoint_url = Some(url.clone());
    }
    if let Some(url) = &args.store_url {
        store.url = Some(url.clone());
    }
    if let Some(file) = &args.store_password_file {
        store.password_file = Some(file.clone());
    }
    if let Some(file) = &args.store_ca_file {
        store.ca_file = Some(file.clone());
    }
}

/// The `leaderd run` flags, over the file and environment layers.
pub(super) fn apply_run_flags(raw: &mut RawConfig, args: &RunArgs) {
    note_flags(raw, args);
    if let Some(identity) = &args.identity {
        raw.identity = Some(identity.clone());
    }
    if args.balance {
        raw.balance = Some(true);
    }
    if args.sessions {
        raw.sessions = Some(true);
    }
    if args.no_sessions {
        raw.sessions = Some(false);
    }
    if let Some(p) = args.priority {
        raw.priority = Some(p);
    }
    if let Some(d) = args.preempt_after {
        raw.preempt_after = Some(DurationValue(d));
    }
    if args.no_preempt {
        raw.preempt = Some(false);
    }
    if !args.elections.is_empty() {
        raw.elections = named_elections(raw, &args.elections);
    }
    if let Some(listen) = &args.listen {
        raw.http.listen = Some(ListenAddr(listen.clone()));
    }
    let lease = &mut raw.lease;
    if let Some(d) = args.lease_duration {
        lease.duration = Some(DurationValue(d));
    }
    if let Some(d) = args.renew_interval {
        lease.renew_interval = Some(DurationValue(d));
    }
    if let Some(d) = args.retry_interval {
        lease.retry_interval = Some(DurationValue(d));
    }
    if let Some(d) = args.kill_grace {
        raw.child.kill_grace = Some(DurationValue(d));
    }
    if let Some(mode) = args.mode {
        raw.child.mode = Some(mode);
    }
    if let Some(action) = args.on_child_exit {
        raw.child.on_child_exit = Some(action);
    }
    if let Some(primary) = &args.primary {
        raw.http.primary = Some(primary.clone());
    }
    if let Some(addr) = &args.advertise {
        raw.http.advertise = Some(addr.clone());
    }
    if let Some(url) = &args.app_check {
        raw.app_check.http = Some(url.clone());
    }
    if let Some(format) = args.log_format {
        raw.log.format = Some(format);
    }
    if let Some(limit) = args.election_series_limit {
        raw.metrics.election_series_limit = Some(limit);
    }
    if !args.command.is_empty() {
        raw.child.command = Some(args.command.clone());
    }
}

/// Remember which keys the flags set, so that messages name the flag.
fn note_flags(raw: &mut RawConfig, args: &RunArgs) {
    let set = [
        (args.identity.is_some(), "identity", "--identity"),
        (args.listen.is_some(), "http.listen", "--listen"),
        (args.primary.is_some(), "http.primary", "--primary"),
        (args.app_check.is_some(), "app_check.http", "--app-check"),
        (args.advertise.is_some(), "http.advertise", "--advertise"),
        (args.balance, "balance", "--balance"),
        (args.sessions, "sessions", "--sessions"),
        (args.no_sessions, "sessions", "--no-sessions"),
        (args.priority.is_some(), "priority", "--priority"),
        (
            args.preempt_after.is_some(),
            "preempt_after",
            "--preempt-after",
        ),
        (args.no_preempt, "preempt", "--no-preempt"),
        (
            args.lease_duration.is_some(),
            "lease.duration",
            "--lease-duration",
        ),
        (
            args.renew_interval.is_some(),
            "lease.renew_interval",
            "--renew-interval",
        ),
        (
            args.retry_interval.is_some(),
            "lease.retry_interval",
            "--retry-interval",
        ),
        (
            args.kill_grace.is_some(),
            "child.kill_grace",
            "--kill-grace",
        ),
        (args.mode.is_some(), "child.mode", "--mode"),
        (
            args.on_child_exit.is_some(),
            "child.on_child_exit",
            "--on-child-exit",
        ),
        (args.log_format.is_some(), "log.format", "--log-format"),
        (
            args.election_series_limit.is_some(),
            "metrics.election_series_limit",
            "--election-series-limit",
        ),
    ];
    for (given, key, flag) in set {
        if given {
            raw.flags.insert(key, flag);
        }
    }
}

/// `--election NAME` (repeatable): the elections, each with the overrides
/// its `[[elections]]` entry configures, if any.
fn named_elections(raw: &RawConfig, names: &[String]) -> Vec<RawElection> {
    names
        .iter()
        .map(|name| {
            raw.elections
                .iter()
                .find(|e| &e.name == name)
                .cloned()
                .unwrap_or_else(|| RawElection {
                    name: name.clone(),
                    ..RawElection::default()
                })
        })
        .collect()
}
