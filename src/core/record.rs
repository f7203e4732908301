//! The lease record as leaderd reads and writes it, and the conditions a
//! write is made under: plain data, and the one statement of the rules
//! every store implements ([`Condition::holds`]). Stamps are handed in
//! (`Stamp`): nothing here reads a clock or draws a random `rvn`. Tested
//! in `tests` (`record/tests.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::keys::is_session_key;

/// What every write of a record is stamped with: a fresh `rvn` and the
/// wall-clock time (for humans and TTL only; never for a decision). The
/// election core gets its stamps from its driver, so that it reads no clock
/// and draws no random number of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The record version of the write, without its suffix; shared, as
    /// every state machine stepped by one input is stamped from it.
    base: Arc<str>,
    /// The `n` of the `.n` it ends with, if not 0 (see [`Stamp::nth`]).
    suffix: u32,
    /// Unix ms of the write.
    pub unix_ms: u64,
}

impl Stamp {
    /// A stamp of `rvn` at unix ms `unix_ms`.
    pub fn new(rvn: impl Into<Arc<str>>, unix_ms: u64) -> Stamp {
        Stamp {
            base: rvn.into(),
            suffix: 0,
            unix_ms,
        }
    }

    /// The `k`-th stamp drawn from this one (`k` > 0): the same moment,
    /// its `rvn` with `.k` after it (in place of a suffix of its own).
    /// Made without writing the `rvn` out: a daemon of thousands of
    /// elections draws one for each election an input reaches, and few of
    /// them write.
    pub fn nth(&self, k: u32) -> Stamp {
        Stamp {
            base: Arc::clone(&self.base),
            suffix: k,
            unix_ms: self.unix_ms,
        }
    }

    /// The record version of the write.
    pub fn rvn(&self) -> String {
        if self.suffix == 0 {
            self.base.to_string()
        } else {
            format!("{}.{}", self.base, self.suffix)
        }
    }
}

/// One election's lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The election's name (the key).
    pub election: String,
    /// Identity of the current leader; `None` once released.
    pub holder: Option<String>,
    /// Record version: fresh random value on every write.
    pub rvn: String,
    /// +1 (at least) on every new tenure, never on renew, never decreasing.
    pub fencing_token: u64,
    /// The lease duration the holder promises to honour, in ms.
    pub lease_ms: u64,
    /// Unix ms of the start of the tenure (for humans).
    pub acquired_at_ms: u64,
    /// Unix ms of the last write (for humans).
    pub renewed_at_ms: u64,
    /// Unix seconds after which the record is stale (for humans and TTL only).
    pub expires_at_s: u64,
    /// The holder's advertised address and labels, if any.
    pub holder_meta: Option<HolderMeta>,
    /// On a released record only: the identity the previous holder handed
    /// the lease to. For one lease only that candidate may take it at once;
    /// the others wait as if it were still held.
    pub successor: Option<String>,
    /// The key of the holder's session, when the election is held through
    /// one (see `crate::core::session`): the record's `rvn` then
    /// changes only on a new tenure, a release or a handover, and the
    /// tenure lasts as long as the session. `None`: the record is its own
    /// lease, renewed by rewriting it.
    pub session: Option<String>,
}

impl Lease {
    /// [`Lease::stamped`], stamped with `stamp`.
    pub fn stamped_with(
        election: &str,
        holder: &str,
        fencing_token: u64,
        lease_ms: u64,
        acquired_at_ms: u64,
        holder_meta: Option<HolderMeta>,
        stamp: &Stamp,
    ) -> Lease {
        Lease {
            election: election.to_owned(),
            holder: Some(holder.to_owned()),
            rvn: stamp.rvn(),
            fencing_token,
            lease_ms,
            acquired_at_ms,
            renewed_at_ms: stamp.unix_ms,
            expires_at_s: stamp.unix_ms.saturating_add(lease_ms).div_ceil(1000),
            holder_meta,
            successor: None,
            session: None,
        }
    }

    /// [`Lease::renewed`], stamped with `stamp`.
    pub fn renewed_with(&self, stamp: &Stamp) -> Lease {
        self.clone()
            .restamped(stamp, stamp.unix_ms.saturating_add(self.lease_ms))
    }

    /// [`Lease::handed_to`], stamped with `stamp`.
    pub fn handed_to_with(&self, successor: Option<String>, stamp: &Stamp) -> Lease {
        let expires_ms = if successor.is_some() {
            stamp.unix_ms.saturating_add(self.lease_ms)
        } else {
            stamp.unix_ms
        };
        Lease {
            holder: None,
            holder_meta: None,
            successor,
            session: None,
            ..self.clone()
        }
        .restamped(stamp, expires_ms)
    }

    /// This record written anew under `stamp`, stale (for humans and TTL)
    /// at unix ms `expires_ms`.
    fn restamped(self, stamp: &Stamp, expires_ms: u64) -> Lease {
        Lease {
            rvn: stamp.rvn(),
            renewed_at_ms: stamp.unix_ms,
            expires_at_s: expires_ms.div_ceil(1000),
            ..self
        }
    }

    /// This record held through the session `key`: it names the session,
    /// and never goes stale by its own `expires_at` (9999-12-31), since it
    /// is not rewritten on renew; its session's does. A store's TTL must
    /// never delete a live tenure's record.
    pub fn held_through(self, key: &str) -> Lease {
        Lease {
            session: Some(key.to_owned()),
            expires_at_s: HELD_THROUGH_SESSION_EXPIRES_AT_S,
            ..self
        }
    }

    /// The `lease_ms` this record is stored with: its own, but
    /// [`HELD_THROUGH_SESSION_LEASE_MS`] for an election held through a
    /// session. Its `rvn` does not change while the tenure lasts, so a
    /// reader that does not know sessions (a build from before the
    /// `format` attribute, or another tool reading it as a plain lease)
    /// would take a live tenure over once the record stayed unchanged for
    /// its `lease_ms`: stored as a hundred years, such a reader waits
    /// instead. Readers that know sessions time the session, never this.
    pub fn stored_lease_ms(&self) -> u64 {
        if self.session.is_some() {
            HELD_THROUGH_SESSION_LEASE_MS
        } else {
            self.lease_ms
        }
    }

    /// The format this record is written in: [`FORMAT_SESSIONS`] for a
    /// session record or a record held through one, [`FORMAT_SLOTS`] for a
    /// held counting lock, else [`FORMAT`].
    pub fn format(&self) -> u64 {
        if self.session.is_some() || is_session_key(&self.election) {
            FORMAT_SESSIONS
        } else if self.slots().is_some() {
            FORMAT_SLOTS
        } else {
            FORMAT
        }
    }

    /// The holder table of a counting lock's record, as stored (see
    /// [`HolderMeta::slots`]); `None` on any other record.
    pub fn slots(&self) -> Option<&str> {
        self.holder_meta.as_ref().and_then(|m| m.slots.as_deref())
    }

    /// Whether `candidate` may take this record at once: it is released,
    /// and handed to no one or to `candidate`. A record handed to someone
    /// else is taken like a held one, after the takeover wait.
    pub fn free_for(&self, candidate: &str) -> bool {
        self.holder.is_none() && self.successor.as_deref().is_none_or(|s| s == candidate)
    }
}

/// What a holder advertises about itself in the lease record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HolderMeta {
    /// Where the holder can be reached (e.g. its HTTP address).
    pub address: Option<String>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// On a counting lock's record only (`leaderd lock acquire --slots`):
    /// its limit and every holder, as `crate::core::slots::Slots` encodes
    /// them. Kept here, where every store already keeps a holder's
    /// description, so that no store's schema changes, and so that any
    /// writer of any build, whose every write replaces `holder_meta`,
    /// replaces the holder table with it (none can survive a write that
    /// does not know it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<String>,
}

/// The format of a record that is its own lease (renewed by rewriting
/// it): an election's or a lock's without a session, a member record. The
/// format names the layout of a record and the rules its writers follow. A
/// later release that changes them writes another number, so that a build
/// that does not know that number leaves such a record alone instead of
/// misreading it (during a rolling upgrade, a misread live lease could be
/// taken over: two leaders). Records without the `format` attribute, as
/// written before it existed, are format 1.
pub const FORMAT: u64 = 1;

/// The `expires_at` of a record held through a session: 9999-12-31
/// 23:59:59 UTC, never (see [`Lease::held_through`]).
pub const HELD_THROUGH_SESSION_EXPIRES_AT_S: u64 = 253_402_300_799;

/// The `lease_ms` an election's record held through a session is stored
/// with: a hundred years of 365.25 days (see [`Lease::stored_lease_ms`]). Small enough
/// for any reader's arithmetic (SQLite's signed integers, a duration added
/// to a monotonic instant), long enough that no live tenure outlasts it.
pub const HELD_THROUGH_SESSION_LEASE_MS: u64 = 3_155_760_000_000;

/// The format of an election's record held through a session (its `rvn`
/// does not change on renew: the session's does) and of a session record.
/// A build that knows only format 1 would time such a record by its own
/// `rvn`, and take a live one over: it must leave it alone.
pub const FORMAT_SESSIONS: u64 = 2;

/// The format of a held counting lock's record (`leaderd lock acquire
/// --slots N`): up to N holders, each renewing its own entry of the table
/// in [`HolderMeta::slots`]. Its `holder`, `lease_ms` and `rvn` still read
/// as one held lease (the newest holder; the longest lease of any holder;
/// changed by every holder's write), so that a daemon of this build sees
/// it held while any holder renews; a build that knows only formats 1 and
/// 2 leaves it alone, as any record of a later format. Released, it is
/// format 1 again.
pub const FORMAT_SLOTS: u64 = 3;

/// Every format this build knows, lowest first.
pub const KNOWN_FORMATS: [u64; 3] = [FORMAT, FORMAT_SESSIONS, FORMAT_SLOTS];

/// The formats this build knows, for humans: "1, 2 and 3".
pub fn known_formats() -> String {
    format!("{FORMAT}, {FORMAT_SESSIONS} and {FORMAT_SLOTS}")
}

/// Whether this build reads and writes records of `format`.
pub fn known_format(format: u64) -> bool {
    KNOWN_FORMATS.contains(&format)
}

/// A record of a format this build does not know (see [`FORMAT`]): never
/// taken over, overwritten or deleted by this build, however long it stays.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnknownFormat {
    /// The election's name.
    pub election: String,
    /// The `format` attribute as stored, for humans: `2`, or `"x"` for a
    /// string.
    pub format: String,
    /// The holder, when that attribute could be read as this build reads it.
    pub holder: Option<String>,
    /// The fencing token, likewise.
    pub fencing_token: Option<u64>,
    /// A digest of the whole stored item: changes whenever anything changes.
    pub fingerprint: String,
}

/// A record whose attributes are missing or of the wrong type.
///
/// leaderd reports it and never overwrites it unless it stayed unchanged (same
/// `fingerprint`) for a full lease; the write is then conditional on `guard`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Malformed {
    /// The election's name.
    pub election: String,
    /// What is wrong, naming the attribute, e.g. "attribute `rvn` is missing".
    pub problem: String,
    /// A digest of the whole stored item: changes whenever anything changes.
    pub fingerprint: String,
    /// The fencing token, when that one attribute could still be read.
    pub fencing_token: Option<u64>,
    /// Store-specific encoding of the item's `rvn` attribute, to make an
    /// overwrite conditional on it.
    pub guard: RvnGuard,
}

/// The raw `rvn` of a malformed record, in the store's own encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RvnGuard {
    /// The item has no `rvn` attribute.
    Missing,
    /// The item's `rvn`, encoded by the store that read it.
    Raw(String),
}

/// What a consistent read found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Record {
    /// No item for this election.
    Absent,
    /// A well-formed lease (held or released).
    Valid(Lease),
    /// An item leaderd cannot interpret.
    Malformed(Malformed),
    /// An item of a later format: see [`UnknownFormat`].
    UnknownFormat(UnknownFormat),
}

impl Record {
    /// The item's key, `None` for an absent one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Record::Absent => None,
            Record::Valid(l) => Some(&l.election),
            Record::Malformed(m) => Some(&m.election),
            Record::UnknownFormat(u) => Some(&u.election),
        }
    }
}

/// The condition a write is made under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Create: no item exists.
    NotExists,
    /// Take over a released or expired lease: the item still has this `rvn`.
    RvnIs(String),
    /// Renew or release: the item has this `rvn` and this holder.
    HeldBy {
        /// The rvn of the holder's last write.
        rvn: String,
        /// The holder's identity.
        holder: String,
    },
    /// Overwrite a malformed item that still has this raw `rvn`.
    Unchanged(RvnGuard),
    /// The item names this holder, whatever its `rvn`: a defect the
    /// election core's model checker must catch (tests only; no store
    /// writes under it).
    #[cfg(test)]
    HolderIs(String),
}

impl Condition {
    /// Whether a write under this condition would apply to `current`: the
    /// one statement of the rules, which every store implements and the
    /// stores' tests check against. `raw_rvn` is the item's `rvn` in the
    /// store's own encoding (`None` when unknown: then `Unchanged` matches
    /// only a malformed item, by its guard).
    ///
    /// `Unchanged` matches any item whose raw `rvn` is the guard, valid or
    /// not: DynamoDB can only test the raw attribute, so every store does
    /// the same. That is safe: every write of a candidate brings a fresh
    /// `rvn`, so an item that still has the observed one was written by no
    /// candidate since.
    ///
    /// No condition holds on an item of an unknown format, whatever its
    /// raw `rvn`: what this build would write over it could end a live
    /// lease it cannot read.
    pub fn holds(&self, current: &Record, raw_rvn: Option<&RvnGuard>) -> bool {
        match (self, current) {
            (_, Record::UnknownFormat(_)) => false,
            (Condition::NotExists, Record::Absent) => true,
            (Condition::RvnIs(rvn), Record::Valid(l)) => &l.rvn == rvn,
            (Condition::HeldBy { rvn, holder }, Record::Valid(l)) => {
                &l.rvn == rvn && l.holder.as_deref() == Some(holder.as_str())
            }
            (Condition::Unchanged(guard), Record::Malformed(m)) => &m.guard == guard,
            (Condition::Unchanged(guard), Record::Valid(_)) => raw_rvn == Some(guard),
            #[cfg(test)]
            (Condition::HolderIs(holder), Record::Valid(l)) => {
                l.holder.as_deref() == Some(holder.as_str())
            }
            _ => false,
        }
    }
}

/// The answer to a conditional write. A failed condition is an answer, not an
/// error: someone else wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // One per write answered, never kept in bulk: boxing would buy nothing.
pub enum WriteOutcome {
    /// The write happened.
    Applied,
    /// The condition did not hold. `current` is the record the store returned
    /// with its refusal, when it returns one (not every server does).
    ConditionFailed {
        /// The record as the store saw it, if it said.
        current: Option<Record>,
    },
}

/// A session record a sweep deletes, if it still has the `rvn` it was
/// judged by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StaleSession {
    /// The session record's key.
    pub key: String,
    /// The `rvn` it was judged by.
    pub rvn: String,
}

#[cfg(test)]
mod tests;
