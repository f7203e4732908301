//! Helpers shared by the integration tests: emulators, names, leases.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

pub mod daemon;
pub mod emulators;
pub mod procfs;

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
