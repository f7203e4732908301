//! What the one-shot subcommands (`status`, `table`, `lock`) share: their
//! error, which carries the exit code, how they load their configuration,
//! check a name and print.

use std::io::Write as _;

use super::StoreArgs;
use crate::config::{ConfigError, ToolConfig};
use crate::exit;

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
