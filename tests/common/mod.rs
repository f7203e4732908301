//! The integration tests' one toolbox: the module `common` of the test
//! binary `it` (tests/it.rs), used from the other modules as `crate::common`.
//!
//! - [`daemon`]: start a real leaderd (`Leaderd`), talk HTTP to it, wait.
//! - [`emulators`]: DynamoDB Local, dynalite and moto (IAM enforced) on
//!   loopback.
//! - [`postgres`]: PostgreSQL servers (TLS on) started in temporary
//!   directories, their faults (SIGSTOP, kill -9 and restart) and a
//!   standby.
//! - [`proxy`]: a TCP proxy between a leaderd and its store that injects
//!   faults (blackhole, latency, resets, refused writes) and counts requests.
//! - [`history`]: the checker of the history `job.py` children record: no
//!   two leaders' jobs overlap, fencing tokens only rise.
//! - [`procfs`]: what `/proc` says of a process and its tree.
//! - `job.py`: the child job ([`job_script`]).

// Not every helper has a user (`FaultProxy::upstream`, for one).
#![allow(dead_code)]

pub mod app;
pub mod daemon;
pub mod emulators;
pub mod history;
pub mod postgres;
pub mod procfs;
pub mod proxy;
pub mod stream;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A name no other test (in this run or a concurrent one) uses: for tables,
/// elections and identities.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}-{:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
}

/// The child job (`python3 job.py [LOG] [--ignore-term] [--grandchild]`).
pub fn job_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/job.py")
}

/// The child command that runs the job, writing its history to `history`.
pub fn job_command(history: &std::path::Path) -> Vec<String> {
    vec![
        "python3".to_owned(),
        job_script().display().to_string(),
        history.display().to_string(),
    ]
}
