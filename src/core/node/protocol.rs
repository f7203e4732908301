//! What the node and its driver say to each other: the [`Moment`] and the
//! [`NodeInput`] it is told, the [`NodeAction`]s it asks for.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::election::{AfterRelease, Note, Tick, WriteOp};
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::record::{Condition, Lease, Record, WriteOutcome};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

/// One of the node's elections, by its place in the order they were
/// added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ElectionId(pub u32);

impl ElectionId {
    /// Its place in the node's list.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which of the node's requests an answer is for. At most one request of
/// each is in flight, so an answer always finds what asked for it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestId {
    /// The request of one election (its campaign, its renew, its release).
    Election(ElectionId),
    /// The request of the daemon's own session.
    Session,
    /// A read of another daemon's session record (its key), shared by
    /// every election that times it.
    SessionRecord(String),
    /// A request of the read-back of the records held through the
    /// session: its number in the period under way.
    ReadBack(u32),
    /// The records of elections that asked for them in the same input,
    /// read in one request (see [`super::Node::handle`]): its number among
    /// those on their way.
    Reads(u32),
}

/// What the driver tells the node along with every input: the instant
/// now with a stamp for new writes (see [`Tick`]; the node gives each
/// write a stamp of its own, derived from this one), and the app check's
/// verdict now.
#[derive(Debug, Clone, PartialEq)]
pub struct Moment {
    /// Now, and what a write made now is stamped with.
    pub tick: Tick,
    /// Whether the app check lets this daemon campaign (true without one).
    /// A change reaches every election before the input it comes with.
    pub may_campaign: bool,
}

/// What happened, as the node is told.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeInput {
    /// The instant asked for by [`super::Node::next_wake`] came (or any
    /// later one; an earlier one is harmless). Also how a change of the
    /// app check's verdict alone is told.
    Timeout,
    /// The answer to a read asked for; the instant is the moment's.
    Read {
        /// The request.
        request: RequestId,
        /// What the store answered.
        record: Result<Record, StoreError>,
    },
    /// The answer to a read of many records asked for, in the order asked.
    ReadMany {
        /// The request.
        request: RequestId,
        /// What the store answered.
        records: Result<Vec<Record>, StoreError>,
    },
    /// The answer to a write asked for (a timeout is an error); the node
    /// noted when it sent it.
    Written {
        /// The request.
        request: RequestId,
        /// What the store answered.
        outcome: Result<WriteOutcome, StoreError>,
    },
    /// Something came from the leader's stream for an election: held
    /// until the election takes hints.
    Hint {
        /// The election.
        election: ElectionId,
        /// What came.
        hint: Hint,
    },
    /// An election's watch client is gone for good.
    HintsClosed {
        /// The election.
        election: ElectionId,
    },
    /// An owner's stream told, at `at`, that its session `key` was written
    /// with `rvn` (and `labels`); `since`: the first event of that session
    /// on the same connection. Only of a session some election read: a
    /// stream cannot fill the node with made-up keys.
    SessionTold {
        /// The session's key.
        key: String,
        /// The `rvn` of the write.
        rvn: String,
        /// The labels the write carried.
        labels: BTreeMap<String, String>,
        /// When it arrived.
        at: Instant,
        /// When the first event of that session arrived on the connection.
        since: Instant,
    },
    /// The owner's stream of the session `key` ended (or broke, or went
    /// quiet).
    SessionStreamEnded {
        /// The session's key.
        key: String,
    },
    /// A read of the session `key`, sent at `sent`, made by someone else
    /// than an election (balance) found `record`: learned like an
    /// election's read.
    SessionRead {
        /// The session's key.
        key: String,
        /// When the read was sent.
        sent: Instant,
        /// What it found.
        record: Record,
    },
    /// Give an election's lease up (the caller stopped the job first),
    /// then act as said; answered with [`NodeAction::Answer`].
    Release {
        /// The election.
        election: ElectionId,
        /// What to do afterwards.
        then: AfterRelease,
        /// Hand the lease to this identity.
        successor: Option<String>,
    },
    /// Nobody can command the elections any more: release and end.
    Orphaned,
    /// The store noticed its data was replaced under it.
    StoreReplaced,
    /// The labels the session's record carries from its next write on.
    Labels(BTreeMap<String, String>),
    /// End the session (its elections were released) and open no other.
    CloseSession,
}

/// What the node asks its driver to do. Store requests are performed
/// concurrently, each answered with the same [`RequestId`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // taken one at a time as they come
pub enum NodeAction {
    /// Read the record under `key` within `budget`. For an election, a
    /// `confirming` read only looks whether a write whose condition failed
    /// applied after all: not a campaign round (not timed for metrics).
    Read {
        /// The request.
        request: RequestId,
        /// The record's key.
        key: String,
        /// Longest the request may take.
        budget: Duration,
        /// See above.
        confirming: bool,
    },
    /// Read the records under `keys` (at most 100) in one request.
    ReadMany {
        /// The request.
        request: RequestId,
        /// The records' keys.
        keys: Vec<String>,
        /// Longest the request may take.
        budget: Duration,
    },
    /// Write `lease` if `condition` holds, within `budget`, giving up at
    /// `deadline` (its answer no longer matters then).
    Write {
        /// The request.
        request: RequestId,
        /// Which write.
        op: WriteOp,
        /// The record to write (boxed: a node queues an action for each
        /// of thousands of elections at once, most of them small).
        lease: Box<Lease>,
        /// Its condition.
        condition: Condition,
        /// Longest the request may take.
        budget: Duration,
        /// When to stop waiting for the answer, if ever.
        deadline: Option<Instant>,
    },
    /// An election's state may have changed: publish
    /// [`super::Node::state`].
    Publish(ElectionId),
    /// The daemon's session may have changed: publish
    /// [`super::Node::session_view`].
    PublishSession,
    /// Tell the followers of an election this (on its stream, and the
    /// daemon's).
    Tell {
        /// The election.
        election: ElectionId,
        /// The event.
        event: LeaseEvent,
    },
    /// Watch this address's stream for an election, or none.
    Watch {
        /// The election.
        election: ElectionId,
        /// The address.
        address: Option<String>,
    },
    /// Answer the pending release command of an election: whether a lease
    /// was released.
    Answer {
        /// The election.
        election: ElectionId,
        /// Whether a lease was released.
        released: bool,
    },
    /// For logs and metrics: of an election, or (`None`) of the daemon's
    /// session and its reads.
    Note {
        /// The election, if any.
        election: Option<ElectionId>,
        /// What happened.
        note: Note,
    },
}
