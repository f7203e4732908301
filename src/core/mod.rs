//! The pure part of leaderd: every decision, and nothing that performs
//! one. Nothing here reads a clock, draws a random number, starts a
//! thread, takes a lock or does IO; it imports nothing outside this folder
//! but std and plain-data crates (`.ci/core-purity.py` checks). Its
//! drivers (`crate::election`, `crate::balance`, `leaderd lock`) do the
//! IO and hand it what happened, with the instant now.
//!
//! - `time`: instants on the boot-time clock, as plain values.

pub mod time;
