//! The `leaderd` command: parse, load the configuration, run.
//!
//! This file stays thin: every behaviour lives in the library. It is the only
//! place that uses `anyhow`, and the only place that exits the process.

// No function over 80 lines (.clippy.toml): a longer one hides its steps.
#![warn(clippy::too_many_lines)]

use std::time::Duration;

use anyhow::Context;
use leaderd::cli::{self, Command, ToolError};
use leaderd::clock::Clock;
use leaderd::config::{Config, LogConfig, LogFormat};
use leaderd::daemon;
use leaderd::exit;
use leaderd::http;
use leaderd::notify::Notifier;
use leaderd::shutdown::Signals;

/// mimalloc instead of the C library's malloc: every store request goes
/// through the AWS SDK, which allocates a few hundred small objects per
/// request, and at a thousand elections glibc's malloc was a fifth of
/// leaderd's CPU (musl's, in the container image, is slower still).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option, as numbered in the `mi_option_t` of the
/// mimalloc that libmimalloc-sys 0.1.49 bundles (the binding names no
/// constant for it); a test below checks its default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Hand memory freed back to the system at once rather than a second
/// later. leaderd's heap moves in bursts (a `/status` of ten thousand
/// elections, a batch of takes, the elections told of each session
/// write), and with the delay each burst's pages stayed resident while the
/// next one allocated. Three daemons of 10,000 elections: 75–80 MiB peak
/// instead of 94–105, for about 0.2 CPU s/min more at rest, pages given
/// back and faulted in again (docs/benchmarks.md).
fn purge_at_once() {
    // SAFETY: sets one integer option of the allocator; no memory of ours.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() {
    purge_at_once();
    // As PID 1 (a container's init), fork first, before any thread exists:
    // PID 1 then only reaps zombies and forwards signals, and this process
    // goes on as leaderd.
    leaderd::reaper::init_if_pid1();
    // The guard (`leaderd __guard`, started by leaderd itself for each child)
    // runs before anything else: no async runtime, no threads.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| leaderd::supervisor::is_subcommand(&a))
    {
        std::process::exit(leaderd::supervisor::guard::main());
    }
    // SAFETY: first thing in main: no other thread exists yet.
    let notifier = unsafe { Notifier::from_env() };
    let cli = cli::parse().unwrap_or_else(|e| e.exit());
    let code = match cli.command {
        Command::Run(args) => match Config::load(&args) {
            Ok(cfg) => run(cfg, notifier),
            Err(e) => {
                eprintln!("leaderd: {e}");
                e.exit_code()
            }
        },
        Command::Check(args) => tool(|rt| rt.block_on(cli::check::run(args))),
        Command::Status(args) => tool(|rt| rt.block_on(cli::status::run(args))),
        Command::Table(args) => tool(|rt| rt.block_on(cli::table::run(args))),
        Command::Resign(args) => tool(|rt| rt.block_on(cli::resign::run(args))),
        Command::Lock(cli::LockArgs { action }) => tool(|rt| {
            rt.block_on(async {
                match action {
                    cli::LockAction::Acquire(a) => cli::lock::acquire(a).await,
                    cli::LockAction::Renew(a) => cli::lock::renew(a).await,
                    cli::LockAction::Release(a) => cli::lock::release(a).await,
                    cli::LockAction::Status(a) => cli::lock::status(a).await,
                }
            })
        }),
    };
    std::process::exit(code);
}

/// One worker thread: leaderd's work is waiting on the store and timers, a
/// few milliseconds of CPU per second even at a thousand elections;
/// blocking work (SQLite) runs on the blocking pool, the HTTP server on a
/// runtime of its own (`http::Server`), and the kill deadline is kept by
/// the guard process, not by this runtime. A second worker only added
/// cross-thread wake-ups (14 % more CPU at 1,000 elections).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("leaderd")
        .build()
        .context("cannot start the async runtime")
}

fn run(cfg: Config, notifier: Notifier) -> i32 {
    init_logging(&cfg.log);
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("leaderd: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    match runtime() {
        Ok(rt) => {
            let code = rt.block_on(async {
                let listener = match http::bind(cfg.http.listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(listen = %cfg.http.listen, "{e}");
                        return exit::USAGE;
                    }
                };
                daemon::run(cfg, notifier, signals, Clock::boot(), listener).await
            });
            // Do not wait for stray blocking tasks (e.g. a stuck SQLite call).
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
        Err(e) => {
            eprintln!("leaderd: {e:#}");
            exit::SOFTWARE
        }
    }
}

/// Run a one-shot subcommand on its own runtime; errors become exit codes.
fn tool(f: impl FnOnce(&tokio::runtime::Runtime) -> Result<(), ToolError>) -> i32 {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leaderd: {e:#}");
            return exit::SOFTWARE;
        }
    };
    match f(&rt) {
        Ok(()) => 0,
        Err(ToolError { code, message }) => {
            eprintln!("leaderd: {message}");
            code
        }
    }
}

fn init_logging(cfg: &LogConfig) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // The filter layer decides alone: the formatter passes every level.
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let filter = cfg.filter();
    let _ = match cfg.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .finish()
            .with(filter)
            .try_init(),
        LogFormat::Text => builder.finish().with(filter).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number set in `purge_at_once` is the purge delay's: in the
    /// bundled mimalloc its default is 1000 ms, and setting it is read
    /// back. A binding that renumbered the options fails here.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads and sets integer options of the allocator.
        let (before, after) = unsafe {
            let before = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
            purge_at_once();
            (
                before,
                libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY),
            )
        };
        assert_eq!(before, 1000, "mimalloc's default purge delay");
        assert_eq!(after, 0);
    }
}
