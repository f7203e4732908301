//! leaderd: a leader-election daemon.
//!
//! Data flows one way: configuration -> lease stores -> election engines ->
//! (child supervisor, HTTP, metrics) watching the engines' state.
//!
//! - [`clock`]: the boot-time clock every decision is timed with.
//! - [`lease`]: the lease record, the store interface and its backends.
//! - [`election`]: one task per election: campaign, renew, stop, release.
//! - [`config`]: figment layers -> validated, immutable configuration.
//! - [`cli`]: the command line (clap) and the process exit codes.

pub mod cli;
pub mod clock;
pub mod config;
pub mod election;
pub mod lease;
