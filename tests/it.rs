//! leaderd's integration tests, built as one test binary, `it`: each file
//! `tests/NAME.rs` is the module `NAME` here, so a test's full name is
//! `NAME::test_name` (`cargo nextest run --test it lock::`, or
//! `cargo nextest run -E 'binary(it) and test(/^lock::/)'`).
//!
//! One binary links the crate and the AWS SDK once instead of once per file
//! (`autotests = false` and the one `[[test]]` in Cargo.toml). A new
//! `tests/NAME.rs` is built only once it is listed below; tests/run-all.sh
//! fails while one is not.
//!
//! nextest runs every test in a process of its own, as before; under plain
//! `cargo test` every test of every module shares one process.

// The shared toolbox, and the cluster harness of `safety` and `soak`.
mod cluster;
mod common;

mod advertise;
mod app_check;
mod bad_input;
mod balance;
mod check;
mod child_faults;
mod child_supervision;
mod cli_errors;
mod cluster_failover;
mod config;
mod daemon_stream;
mod dynamodb_store;
mod faults_selftest;
mod guard;
mod handover;
mod http_api;
mod http_live;
mod http_load;
mod iam;
mod load;
mod lock;
mod lock_slots;
mod monitoring;
mod pid1;
mod postgres_store;
mod priority;
mod reaper;
mod record_format;
mod safety;
mod session_sweep;
mod sessions;
mod soak;
mod sqlite_file;
mod store_contract;
mod store_errors;
mod supervisor;
mod systemd_notify;
mod wrong_table;
