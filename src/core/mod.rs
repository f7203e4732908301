//! The pure part of leaderd: every decision, and nothing that performs
//! one. Nothing here reads a clock, draws a random number, starts a
//! thread, takes a lock or does IO; it imports nothing outside this folder
//! but std and plain-data crates (`.ci/core-purity.py` checks). Its
//! drivers (`crate::election`, `crate::balance`, `leaderd lock`) do the
//! IO and hand it what happened, with the instant now.
//!
//! - `election`: one election's rules: its settings, published state, and
//!   the core, a state machine (observations in, actions out), with
//!   its tests;
//! - `takeover`: the takeover rule, the one place it is written (the
//!   core, the session, the sweep, `leaderd lock` and balance use it);
//! - `hints`: what a leader tells its followers, and a follower's
//!   bookkeeping of that stream;
//! - `session`: a daemon's session, one record whose renewals keep every
//!   election held through it (its tests in `session/tests.rs`);
//! - `priority`: preferred leaders: whom a leader hands an election to
//!   because it prefers it (the preemption rule), and the priority label;
//! - `slots`: counting locks (`leaderd lock acquire --slots N`): the
//!   holder table in one record, and which slot may be taken, renewed,
//!   released or evicted (its tests in `slots/tests.rs`);
//! - `sweep`: which ended or abandoned session records the daemon's sweep
//!   deletes (its tests in `sweep/tests.rs`);
//! - `node`: one daemon's decisions in one state machine over its
//!   election cores, its session, what it knows of other daemons'
//!   sessions, the count of ended tenures, the read-back schedule and the
//!   order of inputs (driven by the model checker; the daemon's tasks do
//!   not run it yet);
//! - `model` (tests only): the model checker of the nodes (their election
//!   cores and sessions), with `stateright`;
//! - `record`: the lease record and the conditions of its writes (tested
//!   in `record/tests.rs`);
//! - `keys`: the keys of the records that are not elections' (members,
//!   sessions, `leaderd check`'s scratch records);
//! - `store_error`: `StoreError`, every class of failure a store can
//!   answer (the core is told them as values);
//! - `time`: instants on the boot-time clock, as plain values.

pub mod election;
pub mod hints;
pub mod keys;
#[cfg(test)]
mod model;
pub mod node;
pub mod priority;
pub mod record;
pub mod session;
pub mod slots;
pub mod store_error;
pub mod sweep;
pub mod takeover;
pub mod time;
