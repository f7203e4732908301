//! What the core and its driver say to each other: the [`Tick`] and the
//! [`Input`] it is told, the [`Action`]s it asks for, and the [`Note`]s
//! for logs and metrics.

use std::sync::Arc;
use std::time::Duration;

use super::AfterRelease;
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::record::{Condition, Lease, Record, Stamp, WriteOutcome};
use crate::core::session::{SessionAnswer, SessionView};
use crate::core::store_error::StoreError;
use crate::core::time::Instant;

/// What the driver tells the core along with every input: the instant now
/// on the boot-time clock, and what a write made now is stamped with.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Now, on the boot-time clock.
    pub now: Instant,
    /// The stamp of a write made now (a fresh `rvn`, unix ms): the core
    /// uses it for at most one write, and its unix ms for the tokens of
    /// new items and the published state's wall-clock fields.
    pub stamp: Stamp,
    /// A number in [0, 1) that spreads retries of instances that failed together.
    pub jitter: f64,
}

#[cfg(test)]
impl Tick {
    /// The tick `ms` after the clock's origin, stamped `v{ms}` (tests).
    pub(crate) fn at_ms(ms: u64) -> Tick {
        Tick {
            now: Instant::from_since_origin(Duration::from_millis(ms)),
            stamp: Stamp::new(format!("v{ms}"), 1_700_000_000_000 + ms),
            jitter: 0.0,
        }
    }
}

/// What happened, as the core is told.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// The instant asked for by [`Core::next_wake`] came (or any later one;
    /// an earlier one is harmless).
    Timeout,
    /// The answer to the read asked for.
    Read(Result<Record, StoreError>),
    /// The answer to the write asked for (a timeout is an error).
    Written(Result<WriteOutcome, StoreError>),
    /// Something came from the leader's watch stream.
    Hint(Hint),
    /// The watch client is gone for good.
    HintsClosed,
    /// Give the lease up (the caller stopped the job first), then act as
    /// said; answered with [`Action::Answer`].
    Release {
        /// What to do afterwards.
        then: AfterRelease,
        /// Hand the lease to this identity.
        successor: Option<String>,
    },
    /// Nobody can command this election any more: release and end.
    Orphaned,
    /// The app check's verdict: whether it lets this instance campaign.
    Gate(bool),
    /// The store noticed its data was replaced under it.
    StoreReplaced,
    /// The daemon's own session as it stands now (elections held through
    /// sessions only): `None` while none is open and valid.
    Session(Option<Arc<SessionView>>),
    /// The answer to the [`Action::ReadSession`] asked for.
    SessionRecord(SessionAnswer),
    /// The daemon's check of the records it holds through its session
    /// found the record of the tenure with this fencing token reading
    /// `record` (a consistent read sent after the tenure began): unless it
    /// is still this tenure's, the record was deleted or rewritten under
    /// it, and the tenure is lost (a holder through a session never
    /// rewrites its record, so nothing else would tell it).
    Checked {
        /// The tenure checked.
        fencing_token: u64,
        /// Its record as read.
        record: Record,
    },
}

/// Which write the core asks for; also the label of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteOp {
    /// Create the missing item.
    Create,
    /// Take over a released, expired or malformed record (never one of an
    /// unknown format).
    TakeOver,
    /// Renew our lease.
    Renew,
    /// Release our lease.
    Release,
    /// Open the daemon's session.
    OpenSession,
    /// Renew the daemon's session.
    RenewSession,
    /// End a session timed out by the takeover rule.
    EndSession,
}

impl WriteOp {
    /// The `op` label of metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            WriteOp::Create => "create",
            WriteOp::TakeOver => "take_over",
            WriteOp::Renew => "renew",
            WriteOp::Release => "release",
            WriteOp::OpenSession => "open_session",
            WriteOp::RenewSession => "renew_session",
            WriteOp::EndSession => "end_session",
        }
    }
}

/// What the core asks its driver to do, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // A few queued per input, taken at once: boxing the record would buy nothing.
pub enum Action {
    /// Read the record, within `budget`. A `confirming` read only looks
    /// whether a write whose condition failed applied before after all: it
    /// is not a campaign round (not timed for metrics, its error not
    /// logged).
    Read {
        /// Longest the request may take.
        budget: Duration,
        /// See above.
        confirming: bool,
    },
    /// Write `lease` if `condition` holds, within `budget`, and give up at
    /// `deadline` (its answer no longer matters then).
    Write {
        /// Which write.
        op: WriteOp,
        /// The record to write.
        lease: Lease,
        /// Its condition.
        condition: Condition,
        /// Longest the request may take.
        budget: Duration,
        /// When to stop waiting for the answer, if ever.
        deadline: Option<Instant>,
    },
    /// Read the session record under `key`, within `budget` (a follower
    /// times the session an election is held through).
    ReadSession {
        /// The session's key.
        key: String,
        /// Longest the request may take.
        budget: Duration,
        /// The answer of a read sent at or after this instant will do (the
        /// daemon's other elections may have asked for it already); when
        /// the owner's stream flows, the read may wait a moment past it
        /// for the next renewal to be told, so that it finds an `rvn`
        /// timed from its event. `None`: a read sent now.
        not_before: Option<Instant>,
    },
    /// Tell the followers this (the last event replaces the one before).
    Tell(LeaseEvent),
    /// A tenure of this election is over (released, handed over, or
    /// stopped), its last write answered: the daemon's count of ended
    /// tenures, which its session's next write carries, moves by one.
    TenureOver,
    /// Watch the leader's stream at this address, or none.
    Watch(Option<String>),
    /// Answer the pending release command: whether a lease was released.
    Answer(bool),
    /// Changes of the store's data noticed so far are old news (a new
    /// tenure's first write went to the store as it is now).
    ForgetStoreChanges,
    /// For logs and metrics.
    Note(Note),
}

/// What happened that logs and metrics show.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Note {
    /// A store request of the campaign failed (logged once per change).
    StoreError {
        /// Its `op` label.
        op: &'static str,
        /// The error.
        error: StoreError,
    },
    /// An acquisition attempt (create, take over) ended: `Ok(true)` won,
    /// `Ok(false)` lost the race.
    Acquire {
        /// Create or take over.
        op: WriteOp,
        /// How it ended.
        outcome: Result<bool, StoreError>,
    },
    /// A renew ended: `Ok(true)` applied, `Ok(false)` someone else wrote.
    Renew(Result<bool, StoreError>),
    /// Became leader under this fencing token.
    Gained(u64),
    /// Stopped leading (lost, expired, released or resigned).
    Lost,
    /// Renewed under this fencing token.
    Renewed(u64),
    /// A renew went out this long after it was due.
    RenewSent(Duration),
    /// A renew whose answer was lost had applied; carrying on from it.
    AdoptedEarlierWrite,
    /// The store's data was replaced: renewing at once.
    RenewingAfterReplacement(u64),
    /// The lease is lost: the job must stop.
    LeaseLost {
        /// The tenure's fencing token.
        fencing_token: u64,
        /// Who wrote the record instead, when someone did; `None`: no
        /// renew succeeded in time.
        written_by: Option<String>,
    },
    /// The session the tenure was held through is gone (ended, deleted,
    /// or replaced by a new one): the job must stop.
    SessionLost(u64),
    /// The validity of a stopped tenure ended.
    TenureEnded(u64),
    /// The lease was released (to `successor`, or anyone).
    Released {
        /// The tenure's fencing token.
        fencing_token: u64,
        /// Whom it was handed to.
        successor: Option<String>,
    },
    /// Nothing to release: someone else wrote since our last write.
    NothingToRelease(u64),
    /// The release failed: the lease will expire on its own.
    ReleaseFailed(StoreError),
    /// Sitting out this long before campaigning again.
    SittingOut(Duration),
    /// A malformed record, first seen in this form.
    Malformed(String),
    /// Overwriting a malformed record that stayed unchanged for a lease.
    OverwritingMalformed,
    /// A record of a format this build does not know, first seen in this
    /// form: left alone for as long as it stays.
    UnknownFormat {
        /// Its format, as stored.
        format: String,
        /// Its holder, if it could be read.
        holder: Option<String>,
    },
    /// The leader's stream contradicts the store: polling for this tenure.
    StreamDistrusted {
        /// The record's holder.
        holder: Option<String>,
        /// The address it advertised.
        address: Option<String>,
    },
}
