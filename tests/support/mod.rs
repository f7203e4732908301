//! Test support for the fault and safety tests: a fault-injection proxy for
//! the store traffic of one leaderd, the child job that records who ran when,
//! and the checker that reads that record.
//!
//! Use from a file in `tests/` with `mod support;`.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

pub mod history;
pub mod proxy;

use std::path::PathBuf;

/// The child job (`python3 job.py [LOG] [--ignore-term] [--grandchild]`).
pub fn job_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/job.py")
}
