//! leaderd: a leader-election daemon.
//!
//! Data flows one way: configuration -> lease stores -> election engines ->
//! (child supervisor, HTTP, metrics) watching the engines' state.
//!
//! - [`clock`]: the boot-time clock every decision is timed with.
//! - [`lease`]: the lease record, the store interface and its backends.
//! - [`election`]: one task per election: campaign, renew, stop, release.
//! - [`http`]: the HTTP API (`/leader`, `/status`, `/healthz`, `/metrics`, resign).
//! - [`metrics`]: Prometheus metrics, registered once.

pub mod clock;
pub mod election;
pub mod http;
pub mod lease;
pub mod metrics;
