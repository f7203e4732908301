//! The resign command: what the HTTP API hands the daemon when a caller
//! asks it to step down in one election (`POST /leader/{election}/resign`),
//! and the daemon's answer. A room of its own, because both sides use it
//! and neither may import the other: the daemon serves HTTP.

use tokio::sync::oneshot;

/// Ask the daemon to step down in one election: stop the child, release the
/// lease, sit out one lease. The daemon answers on `done`.
#[derive(Debug)]
pub struct ResignRequest {
    /// The election to resign from (known to exist).
    pub election: String,
    /// The candidate to hand the lease to; `None`: whoever is fastest.
    pub to: Option<String>,
    /// How it stepped down once it has; why not otherwise.
    pub done: oneshot::Sender<Result<Resigned, ResignError>>,
}

/// How a resign stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resigned {
    /// The lease was released; this instance sits out one lease, then
    /// campaigns again.
    SittingOut,
    /// The daemon was told to shut down while it stepped down: the lease
    /// was released (to the resign's `to`) as it exited.
    Exiting,
}

impl Resigned {
    /// What it did, for the answer to the caller.
    pub fn message(self) -> &'static str {
        match self {
            Resigned::SittingOut => "stepped down; sitting out one lease before campaigning again",
            Resigned::Exiting => {
                "stepped down; the lease was released as the daemon is shutting down"
            }
        }
    }
}

/// Why a resign did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResignError {
    /// This instance does not lead the election: nothing was changed.
    #[error("this instance does not lead election `{0}`; nothing was changed")]
    NotLeader(String),
    /// An earlier resign of the election is still stepping down: this one
    /// changed nothing, and the earlier one's successor stands.
    #[error(
        "an earlier resign of election `{election}` is still stepping down (handing the lease to {}); this one changed nothing",
        successor_text(.to)
    )]
    InProgress {
        /// The election.
        election: String,
        /// The earlier resign's successor.
        to: Option<String>,
    },
    /// The daemon is shutting down (it releases every lease as it exits):
    /// this resign changed nothing.
    #[error(
        "the daemon is shutting down and releases its leases as it exits; this resign changed nothing"
    )]
    ShuttingDown,
    /// Something else went wrong (one line).
    #[error("{0}")]
    Failed(String),
}

/// A resign's successor in a message.
fn successor_text(to: &Option<String>) -> String {
    to.as_deref()
        .map_or_else(|| "whoever is fastest".to_owned(), |to| format!("`{to}`"))
}
