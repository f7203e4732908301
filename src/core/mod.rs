//! The pure part of leaderd: every decision, and nothing that performs
//! one. Nothing here reads a clock, draws a random number, starts a
//! thread, takes a lock or does IO; it imports nothing outside this folder
//! but std and plain-data crates (`.ci/core-purity.py` checks). Its
//! drivers (`crate::election`, `crate::balance`, `leaderd lock`) do the
//! IO and hand it what happened, with the instant now.
//!
//! - `record`: the lease record and the conditions of its writes (tested
//!   in `record/tests.rs`);
//! - `keys`: the keys of the records that are not elections' (members,
//!   sessions, `leaderd check`'s scratch records);
//! - `store_error`: `StoreError`, every class of failure a store can
//!   answer (the core is told them as values);
//! - `time`: instants on the boot-time clock, as plain values.

pub mod keys;
pub mod record;
pub mod store_error;
pub mod time;
