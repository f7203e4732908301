//! Elections as the rest of leaderd sees them: the pure core's types
//! (`crate::core`: the election core, the takeover rule, hints, the
//! session, the sweep), re-exported here, and what the IO driver that runs
//! a daemon's node (`crate::driver`) reports ([`Observer`]) and runs with
//! ([`TaskContext`]).
//!
//! - this file: the observer, the context, the re-exports;
//! - `timing`: the timing rules an election's settings must keep, checked
//!   as the configuration is built;
//! - `hint_feed`: the one channel the watch clients hand their hints to,
//!   and how the elections say where to watch.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::lease::{LeaseStore, StoreError};

/// The `election` label of the session's store requests in metrics (no
/// election can be named so).
pub const SESSION_LABEL: &str = "#session";

/// What a renew, acquire or store call came to, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Done.
    Ok,
    /// Someone else wrote (condition failed).
    Lost,
    /// A store error.
    Failed(&'a StoreError),
}

impl Outcome<'_> {
    /// Label of `leaderd_renew_total{result}`: ok, lost, throttled, timeout, error.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Lost => "lost",
            Outcome::Failed(e) => e.renew_label(),
        }
    }
}

/// Leadership changes, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Became leader.
    Gained,
    /// Stopped leading (lost, expired, released or resigned).
    Lost,
}

/// Receives the engine's events; `crate::metrics` implements it. Methods are
/// called from the node's driver and must not block.
pub trait Observer: Send + Sync + 'static {
    /// A store request finished after `took`.
    fn store_request(
        &self,
        _election: &str,
        _op: &'static str,
        _took: Duration,
        _outcome: Outcome<'_>,
    ) {
    }
    /// An acquisition attempt (create, take over) ended.
    fn acquire_attempt(&self, _election: &str, _outcome: Outcome<'_>) {}
    /// A renew ended.
    fn renew(&self, _election: &str, _outcome: Outcome<'_>) {}
    /// Leadership changed.
    fn transition(&self, _election: &str, _t: Transition) {}
    /// A tenure ended because its lease was lost (no renew in time,
    /// another writer, or the session it was held through gone), not
    /// given up.
    fn lease_lost(&self, _election: &str) {}
    /// A renew went out `late` after it was due: under `election`'s name,
    /// or the session's label for the daemon's session.
    fn renew_sent(&self, _election: &str, _late: Duration) {}
    /// A malformed record was seen.
    fn malformed_record(&self, _election: &str) {}
    /// A record of a format this build does not know was seen.
    fn unknown_format_record(&self, _election: &str) {}
    /// This daemon handed `election` to a member of a higher priority.
    fn preempted(&self, _election: &str) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// What the IO driver of a daemon's node runs with: the store, the clock
/// it decides by, and where it reports.
#[derive(Clone)]
pub struct TaskContext {
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// The clock every decision is timed with.
    pub clock: Clock,
    /// Where store requests and their outcomes are reported (the metrics).
    pub observer: Arc<dyn Observer>,
}

mod hint_feed;
mod timing;

pub use crate::core::election::{
    Action, AfterRelease, Core, ElectionConfig, ElectionState, Input, Note, Role, Tenure, Tick,
    WriteOp, defaults,
};
pub use crate::core::hints::{Hint, LeaseEvent};
pub use crate::core::node::KnownSession;
pub use crate::core::session::SessionView;
pub use crate::core::takeover::{TakeoverTimer, takeover_wait};
pub use hint_feed::{Aim, Clients, HINT_CHANNEL, HintSink};
pub use timing::{TimingError, check_drift};
