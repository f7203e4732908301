//! `leaderd check`: whether `leaderd run` would work here with this
//! configuration, and if not, why and what to do. It reads the same file,
//! environment and flags as `run` and prints one item per line (`ok`,
//! `warn`, `fail`), or JSON with `--json`; exit 0 when nothing failed,
//! [`exit::CHECK_FAILED`] otherwise.
//!
//! What is checked, in order: the configuration and everything derived
//! from it; the store (reachable, its table or file as leaderd needs it);
//! every store call the configured features make, tried on a scratch
//! record that is deleted again; this host's clock against the store's;
//! the HTTP listen address.
//!
//! The rooms: this file runs the checks in order; `config` checks the
//! configuration; `store` the store, its table or file and the clock;
//! `scratch` the store calls on the scratch record; `report` is the
//! report and how it is printed.

mod config;
mod report;
mod scratch;
mod store;

pub use report::{Item, Report, Status};

use super::CheckArgs;
use super::tool::{self, ToolError};
use crate::config::RunArgs;
use crate::exit;

/// `leaderd check`: print the report; fail with exit 1 when an item failed.
pub async fn run(args: CheckArgs) -> Result<(), ToolError> {
    let report = check(&args.run).await;
    let out = if args.json {
        report.json()
    } else {
        report.text()
    };
    tool::print(&out)
        .map_err(|e| ToolError::new(exit::IOERR, format!("cannot write the report: {e}")))?;
    if report.passed() {
        Ok(())
    } else {
        Err(ToolError::new(exit::CHECK_FAILED, report.summary()))
    }
}

/// Every check, in order, with the configuration `args` gives.
pub async fn check(args: &RunArgs) -> Report {
    let mut report = Report::default();
    let plan = config::check(args, &mut report);
    if let Some(store) = &plan.store {
        store::check(&plan, store, &mut report).await;
    }
    if let Some(addr) = plan.listen {
        report.add(listen(addr).await);
    }
    report
}

/// The HTTP listen address: free to bind now.
async fn listen(addr: std::net::SocketAddr) -> Item {
    match crate::http::bind(addr).await {
        Ok(listener) => {
            drop(listener);
            report::ok("http", format!("{addr} is free to listen on"))
        }
        Err(e) => report::fail("http", e)
            .fix("stop what listens there, or set http.listen (--listen) to a free address"),
    }
}
