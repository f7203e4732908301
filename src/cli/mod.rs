//! The command line: clap definitions, and the one-shot subcommands.
//!
//! `leaderd run [OPTIONS] [-- COMMAND [ARGS…]]`, `leaderd check`, `leaderd
//! status`, `leaderd table create|describe`, `leaderd lock
//! acquire|renew|release|status`, `leaderd --version`. Flags are the top layer of the
//! configuration; [`crate::config`] merges them over the file and the
//! environment. A usage error exits [`exit::USAGE`] with clap's message;
//! `--help` and `--version` print to stdout and exit 0.
//!
//! The hidden `__guard` helper is dispatched by `main` before clap sees the
//! arguments, so it is deliberately not defined here.
//!
//! The rooms: this file defines the command line; each one-shot subcommand
//! has a file, `table`, `lock` and `resign`, or a folder, `check/` and
//! `status/`; `tool` is what they share (their error and exit code, loading
//! the configuration, printing).

pub mod check;
pub mod lock;
pub mod resign;
pub mod status;
pub mod table;
mod tool;

pub use tool::ToolError;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::flags::parse_wait;
pub use crate::config::{RunArgs, StoreArgs};
use crate::exit;

/// `leaderd`: the whole command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "leaderd",
    version,
    about = "Leader election daemon: leases in DynamoDB or SQLite, a supervised child that is stopped before anyone else can lead",
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Campaign for the configured elections and supervise the child.
    Run(RunArgs),
    /// Say whether `run` would work here with the same configuration, and
    /// why not: one line per item (ok, warn, fail; for a failure what to
    /// do); exit 1 when one fails.
    Check(CheckArgs),
    /// Read the store and print each election's holder, fencing token and age.
    Status(StatusArgs),
    /// Manage the DynamoDB or PostgreSQL table.
    Table(TableArgs),
    /// A lock that outlives one command (pipeline steps): acquire, renew,
    /// release, status.
    Lock(LockArgs),
    /// Ask a running daemon to step down in one election, handing the lease
    /// to a named candidate (--to) or to whoever is fastest.
    Resign(ResignArgs),
}

/// `leaderd check [RUN OPTIONS] [--json] [-- COMMAND [ARGS…]]`: the
/// options of `run`, which it checks.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The configuration, as `leaderd run` takes it.
    #[command(flatten)]
    pub run: RunArgs,
    /// Print the report as JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// `leaderd resign ELECTION [--to IDENTITY] [--url URL]`.
#[derive(Debug, Clone, Args)]
pub struct ResignArgs {
    /// TOML configuration file: the daemon's, for http.listen and
    /// http.admin_token (also LEADERD_HTTP__ADMIN_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The election to step down in.
    #[arg(value_name = "ELECTION")]
    pub election: String,
    /// Hand the lease to this candidate: for one lease only it may take it
    /// at once.
    #[arg(long, value_name = "IDENTITY")]
    pub to: Option<String>,
    /// The daemon, http://HOST:PORT; default its http.listen on this host.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

/// `leaderd lock acquire|renew|release|status`.
#[derive(Debug, Clone, Args)]
pub struct LockArgs {
    /// What to do with the lock.
    #[command(subcommand)]
    pub action: LockAction,
}

/// The `lock` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum LockAction {
    /// Take the lock and print its token on stdout; exit 75 when not
    /// acquired (--no-wait, or --wait ran out).
    Acquire(LockAcquireArgs),
    /// Extend the lock and print its new token; exit 77 when it is not the
    /// token's any more.
    Renew(LockRenewArgs),
    /// Give the lock up; exit 77 (changing nothing) when it is not the
    /// token's any more.
    Release(LockReleaseArgs),
    /// Print the lock's holder, fencing token and age (a counting lock's:
    /// every holder and its remaining lease).
    Status(LockStatusArgs),
}

/// The longest lock lease.
const MAX_LOCK_LEASE: Duration = crate::config::limits::MAX_WAIT;

/// The shortest lock lease: the floor of every interval. A shorter one is
/// stored as a lease of 0 ms (whole milliseconds), which anyone takes at once.
const MIN_LOCK_LEASE: Duration = crate::config::limits::MIN_INTERVAL;

/// A lock's lease: at least 10 ms, at most a day.
fn parse_lock_lease(s: &str) -> Result<Duration, String> {
    let d = crate::config::flags::parse_duration(s)?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    if d < MIN_LOCK_LEASE {
        return Err(format!(
            "shorter than the minimum of {}",
            crate::text::duration(MIN_LOCK_LEASE)
        ));
    }
    if d > MAX_LOCK_LEASE {
        return Err(format!(
            "longer than the limit of {}",
            crate::text::duration(MAX_LOCK_LEASE)
        ));
    }
    Ok(d)
}

/// A counting lock's number of slots (`--slots N`): 1 to
/// [`crate::core::slots::MAX_SLOTS`].
fn parse_slots(s: &str) -> Result<u32, String> {
    let max = crate::core::slots::MAX_SLOTS;
    match s.trim().parse::<u64>() {
        Ok(0) => Err("a counting lock needs at least 1 slot".into()),
        Ok(n) if n > u64::from(max) => Err(format!("more than the limit of {max} slots")),
        Ok(n) => Ok(u32::try_from(n).expect("at most MAX_SLOTS, checked above")),
        Err(_) => Err(format!("not a whole number of slots (1 to {max})")),
    }
}

/// `leaderd lock acquire NAME`.
#[derive(Debug, Clone, Args)]
pub struct LockAcquireArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The lock's name (an election name: `leaderd run` for it waits too).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// How long the lock holds without a renew (like 15m, 15 minutes, 900s;
    /// 10ms to 24h).
    #[arg(long, value_name = "DURATION", value_parser = parse_lock_lease, default_value = "15m")]
    pub lease_duration: Duration,
    /// Give up (exit 75) after waiting this long; default: wait without limit.
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Try once; exit 75 if the lock is held (with --slots: if every slot
    /// is).
    #[arg(long)]
    pub no_wait: bool,
    /// A counting lock: up to N holders at once, each with its own token
    /// (1 to 500; every user of the lock gives the same N, else exit 64).
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<u32>,
}

/// `leaderd lock renew NAME TOKEN`.
#[derive(Debug, Clone, Args)]
pub struct LockRenewArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The lock's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The token `acquire` (or the last `renew`) printed.
    #[arg(value_name = "TOKEN")]
    pub token: String,
    /// The new lease, from now (like 15m, 15 minutes, 900s; 10ms to 24h).
    #[arg(long, value_name = "DURATION", value_parser = parse_lock_lease, default_value = "15m")]
    pub lease_duration: Duration,
    /// The counting lock's N, as given to `acquire`.
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<u32>,
}

/// `leaderd lock release NAME TOKEN`.
#[derive(Debug, Clone, Args)]
pub struct LockReleaseArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The lock's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The token `acquire` (or the last `renew`) printed.
    #[arg(value_name = "TOKEN")]
    pub token: String,
    /// The counting lock's N, as given to `acquire`.
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<u32>,
}

/// `leaderd lock status NAME`.
#[derive(Debug, Clone, Args)]
pub struct LockStatusArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The lock's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Check that the lock is a counting lock of N slots (exit 64 if it is
    /// not); a counting lock's holders are listed without it too.
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<u32>,
}

/// `leaderd status [ELECTION…] [--json]`, `leaderd status --members
/// [--json]`.
#[derive(Debug, Clone, Default, Args)]
pub struct StatusArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Elections to show; default every election found in the store.
    #[arg(value_name = "ELECTION")]
    pub elections: Vec<String>,
    /// Show the daemons instead (their session and member records): each
    /// one's set of elections, priorities and whether it is eligible.
    #[arg(long, conflicts_with = "elections")]
    pub members: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `leaderd table create|describe`.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// What to do with the table.
    #[command(subcommand)]
    pub action: TableAction,
}

/// The `table` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum TableAction {
    /// Create the DynamoDB table (on-demand billing) and wait until it is
    /// ACTIVE; or the PostgreSQL table (`--print`: print its SQL instead).
    Create(TableCreateArgs),
    /// Print the table's status, key schema and TTL setting (PostgreSQL:
    /// whether its columns, key and privileges are as leaderd needs).
    Describe(TableDescribeArgs),
}

/// `leaderd table create`.
#[derive(Debug, Clone, Args)]
pub struct TableCreateArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Also enable DynamoDB TTL on `expires_at` (cleans up abandoned items).
    #[arg(long)]
    pub ttl: bool,
    /// How long to wait for the table to become ACTIVE (at most 1 day).
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, default_value = "2m")]
    pub wait: Duration,
    /// PostgreSQL: print the CREATE TABLE statement and the grant leaderd's
    /// role needs, and connect to nothing (for a DBA who creates it by hand).
    #[arg(long)]
    pub print: bool,
}

/// `leaderd table describe`.
#[derive(Debug, Clone, Default, Args)]
pub struct TableDescribeArgs {
    /// Config file and store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The command line was not a request to run anything: help, version, or a
/// usage error. [`CliExit::exit`] prints clap's message and exits with
/// [`CliExit::exit_code`].
#[derive(Debug)]
pub struct CliExit(clap::Error);

impl CliExit {
    /// 0 for `--help` and `--version`, [`exit::USAGE`] for everything else
    /// (including `leaderd` with no subcommand, which prints help to stderr).
    pub fn exit_code(&self) -> i32 {
        match self.0.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
            _ => exit::USAGE,
        }
    }

    /// The text clap prints (help, version, or the usage error).
    pub fn message(&self) -> String {
        self.0.render().to_string()
    }

    /// Print the message (stdout for help and version, stderr for errors)
    /// and exit the process.
    pub fn exit(&self) -> ! {
        // Printing can only fail on a closed stdout/stderr; the exit code still
        // tells the caller what happened.
        let _ = self.0.print();
        std::process::exit(self.exit_code())
    }
}

impl std::fmt::Display for CliExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CliExit {}

/// Parse the process's command line.
pub fn parse() -> Result<Cli, CliExit> {
    parse_from(std::env::args_os())
}

/// Parse a command line (the first item is the program name).
pub fn parse_from<I, T>(args: I) -> Result<Cli, CliExit>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(args).map_err(CliExit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LogFormat, Mode, OnChildExit, StoreKind};
    use clap::CommandFactory;
    use std::path::PathBuf;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_every_flag_and_the_child_command() {
        let cli = parse_from([
            "leaderd",
            "run",
            "--config",
            "/etc/leaderd.toml",
            "--identity",
            "web-1",
            "--election",
            "a",
            "--election",
            "b",
            "--store",
            "dynamodb",
            "--store-path",
            "x.db",
            "--table",
            "t",
            "--region",
            "eu-west-1",
            "--endpoint-url",
            "http://127.0.0.1:8000",
            "--listen",
            "127.0.0.1:9000",
            "--lease-duration",
            "20s",
            "--renew-interval",
            "5s",
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
            "--config",
        ])
        .expect("valid command line");
        let Command::Run(run) = cli.command else {
            panic!("expected run, got {:?}", cli.command);
        };
        assert_eq!(run.store.config, Some(PathBuf::from("/etc/leaderd.toml")));
        assert_eq!(run.identity.as_deref(), Some("web-1"));
        assert_eq!(run.elections, ["a", "b"]);
        assert_eq!(run.store.store_kind, Some(StoreKind::Dynamodb));
        assert_eq!(run.store.store_path, Some(PathBuf::from("x.db")));
        assert_eq!(run.store.table.as_deref(), Some("t"));
        assert_eq!(run.store.region.as_deref(), Some("eu-west-1"));
        assert_eq!(
            run.store.endpoint_url.as_deref(),
            Some("http://127.0.0.1:8000")
        );
        assert_eq!(run.listen.as_deref(), Some("127.0.0.1:9000"));
        assert_eq!(run.lease_duration, Some(Duration::from_secs(20)));
        assert_eq!(run.renew_interval, Some(Duration::from_secs(5)));
        assert_eq!(run.retry_interval, Some(Duration::from_millis(500)));
        assert_eq!(run.kill_grace, Some(Duration::from_secs(3)));
        assert_eq!(run.mode, Some(Mode::Always));
        assert_eq!(run.on_child_exit, Some(OnChildExit::Restart));
        assert_eq!(run.acquire_timeout, Some(Duration::ZERO));
        assert_eq!(run.log_format, Some(LogFormat::Json));
        // Everything after `--` belongs to the child, flags included.
        assert_eq!(run.command, ["./job.sh", "--all", "--config"]);
    }

    #[test]
    fn status_and_table_parse() {
        let cli = parse_from(["leaderd", "status", "a", "b", "--json", "--table", "t"]).unwrap();
        let Command::Status(s) = cli.command else {
            panic!("expected status");
        };
        assert_eq!(s.elections, ["a", "b"]);
        assert!(s.json);
        assert_eq!(s.store.table.as_deref(), Some("t"));

        let cli = parse_from(["leaderd", "table", "create", "--ttl", "--wait", "30s"]).unwrap();
        let Command::Table(TableArgs {
            action: TableAction::Create(c),
        }) = cli.command
        else {
            panic!("expected table create");
        };
        assert!(c.ttl);
        assert_eq!(c.wait, Duration::from_secs(30));

        let cli = parse_from(["leaderd", "table", "create"]).unwrap();
        let Command::Table(TableArgs {
            action: TableAction::Create(c),
        }) = cli.command
        else {
            panic!("expected table create");
        };
        assert!(!c.ttl);
        assert_eq!(c.wait, Duration::from_secs(120));

        let cli = parse_from(["leaderd", "table", "describe", "--region", "r"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Table(TableArgs {
                action: TableAction::Describe(_)
            })
        ));
    }

    #[test]
    fn usage_errors_exit_64_and_help_version_exit_0() {
        for bad in [
            vec!["leaderd"],
            vec!["leaderd", "frobnicate"],
            vec!["leaderd", "run", "--lease-duration", "ten"],
            vec!["leaderd", "run", "--mode", "sometimes"],
            vec!["leaderd", "run", "--listen", "nowhere"],
            vec!["leaderd", "run", "--no-such-flag"],
            vec!["leaderd", "run", "./job.sh"],
            vec!["leaderd", "table"],
            vec![
                "leaderd",
                "lock",
                "acquire",
                "x",
                "--lease-duration",
                "500us",
            ],
            vec![
                "leaderd",
                "lock",
                "renew",
                "x",
                "t",
                "--lease-duration",
                "1ns",
            ],
        ] {
            let err = parse_from(&bad).expect_err(&format!("{bad:?} must be rejected"));
            assert_eq!(err.exit_code(), exit::USAGE, "{bad:?}: {}", err.message());
        }
        let err = parse_from(["leaderd", "run", "--lease-duration", "ten"]).unwrap_err();
        assert!(
            err.message().contains("--lease-duration"),
            "{}",
            err.message()
        );

        for ok in [
            vec!["leaderd", "--help"],
            vec!["leaderd", "--version"],
            vec!["leaderd", "run", "--help"],
            vec!["leaderd", "help", "status"],
        ] {
            let exit = parse_from(&ok).expect_err("help/version stop parsing");
            assert_eq!(exit.exit_code(), 0, "{ok:?}");
        }
        let version = parse_from(["leaderd", "--version"]).unwrap_err().message();
        assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    }
}
