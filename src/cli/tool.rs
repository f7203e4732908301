//! What the one-shot subcommands (`status`, `table`, `lock`) share: their
//! error, which carries the exit code, how they load their configuration,
//! check a name and print.

use std::io::Write as _;
use std::time::Duration;

use super::StoreArgs;
use crate::config::{ConfigError, ToolConfig};
use crate::exit;
use crate::lease::LeaseStore;

/// A one-shot subcommand failed: the exit code and the one line to print.
#[derive(Debug)]
pub struct ToolError {
    /// The process exit code.
    pub code: i32,
    /// What went wrong, for stderr.
    pub message: String,
}

impl ToolError {
    /// An error with this exit code and message.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
        }
    }
}

/// The configuration of a one-shot subcommand; its warnings go to stderr.
pub(crate) fn config(args: &StoreArgs) -> Result<ToolConfig, ToolError> {
    let cfg = ToolConfig::load(args).map_err(|e| ToolError::new(e.exit_code(), e.to_string()))?;
    for w in &cfg.warnings {
        eprintln!("leaderd: warning: {w}");
    }
    Ok(cfg)
}

/// How long the store's check may take.
const CHECK_BUDGET: Duration = Duration::from_secs(10);

/// The check `leaderd run` starts with ([`LeaseStore::check`]: a DynamoDB
/// table that exists, is ACTIVE and is keyed by `election` (S) alone; a
/// SQLite file with leaderd's table): every subcommand that reads or writes
/// records makes it once, before it does (one `DescribeTable`). Without
/// it, a table of another key would be read as leaderd's: another
/// application's items listed as malformed elections, or nothing at all.
/// Any failure is [`exit::UNAVAILABLE`], with the store's one line.
pub(crate) async fn check_store(store: &dyn LeaseStore) -> Result<(), ToolError> {
    store
        .check(CHECK_BUDGET)
        .await
        .map_err(|e| ToolError::new(exit::UNAVAILABLE, e.to_string()))
}

/// `name`, given on the command line, as an election name (a lock's name is
/// one): checked by the rule the configuration checks `[[elections]]` names
/// by, so no name the daemon could never campaign for is read, and no
/// member record (`#member/…`) is ever shown or taken as an election.
pub(crate) fn check_name(name: &str) -> Result<(), ToolError> {
    crate::config::check_lock_name(name).map_err(|e| match e {
        // A command-line argument, not the configuration.
        ConfigError::Invalid { message, .. } => ToolError::new(exit::USAGE, message),
        e => ToolError::new(e.exit_code(), e.to_string()),
    })
}

/// `text` on stdout, flushed: an error instead of `print!`'s panic when
/// stdout is a full disk or a closed pipe (like every Rust program, leaderd
/// ignores SIGPIPE, so a closed pipe is EPIPE).
pub(crate) fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Milliseconds as seconds with one decimal, for humans.
pub(crate) fn seconds(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

/// `lines` (the header first) as columns, two spaces apart.
pub(crate) fn aligned(lines: &[Vec<String>]) -> String {
    let columns = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            lines
                .iter()
                .map(|l| l.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
