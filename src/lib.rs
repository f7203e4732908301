//! leaderd: a leader-election daemon.
//!
//! Data flows one way: configuration -> lease stores -> election engines ->
//! (child supervisor, HTTP, metrics) watching the engines' state.
//!
//! - [`clock`]: the boot-time clock every decision is timed with.
//! - [`lease`]: the lease record, the store interface and its backends.
//! - [`election`]: one task per election: campaign, renew, stop, release.
//! - [`supervisor`]: the child: start, signal, stop, kill, reap, exit codes.
//! - [`guard`]: the process that owns the child's kill deadline.
//! - [`reaper`]: a tiny init when leaderd runs as PID 1.

pub mod clock;
pub mod election;
pub mod guard;
pub mod lease;
pub mod reaper;
pub mod supervisor;
