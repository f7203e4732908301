//! Counting locks (`leaderd lock acquire NAME --slots N`): at most N
//! holders at once, in one record, every write of it conditional on the
//! record's `rvn`, so that every change of the holder table is one atomic
//! step and the fencing tokens rise from the one record's counter.
//!
//! The record keeps its limit and its holders in [`HolderMeta::slots`]
//! ([`Slots::encode`]); each holder has its own fencing token and its own
//! renew marker (the `rvn` of the write that took or last renewed its
//! slot). A holder that stops renewing is evicted by the takeover rule
//! ([`TakeoverTimer`], one per holder, timing its marker); nothing else is
//! timed, and no wall clock is compared. Everything else of the record
//! reads as one held lease (see [`FORMAT_SLOTS`]): a daemon times it by its
//! `rvn`, which every holder's write changes, and its `lease_ms`, the
//! longest of the holders' leases.
//!
//! This file decides; `leaderd lock` reads, writes and tells the user.
//! Tested in `tests` (`slots/tests.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::core::record::{Condition, FORMAT_SLOTS, HolderMeta, Lease, Record, Stamp};
use crate::core::takeover::TakeoverTimer;
use crate::core::time::Instant;

/// The most slots a counting lock may have. Every write carries the whole
/// holder table: at most about 600 bytes per holder (a 255-byte identity,
/// hex-encoded), so 500 of them stay well inside DynamoDB's 400 KB item,
/// the smallest limit of the three stores.
pub const MAX_SLOTS: u32 = 500;

/// One holder of a counting lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotHolder {
    /// Its identity.
    pub holder: String,
    /// Its fencing token: above every token given before it.
    pub fencing_token: u64,
    /// The `rvn` of the write that took or last renewed this slot: what a
    /// waiter times, and what the holder's lock token names.
    pub marker: String,
    /// The lease it promises, ms, from its last renew.
    pub lease_ms: u64,
    /// Unix ms it took the slot (for humans).
    pub acquired_at_ms: u64,
    /// Unix ms it last renewed (for humans).
    pub renewed_at_ms: u64,
}

/// A counting lock's limit and holders, lowest token first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slots {
    /// N: at most this many holders.
    pub limit: u32,
    /// The holders, lowest token first; never more than `limit`.
    pub holders: Vec<SlotHolder>,
}

impl Slots {
    /// The text kept in [`HolderMeta::slots`]: the limit, then one
    /// `token.marker.lease_ms.acquired_at.renewed_at.holder-in-hex` per
    /// holder, separated by spaces.
    pub fn encode(&self) -> String {
        let mut out = self.limit.to_string();
        for h in &self.holders {
            let _ = write!(
                out,
                " {}.{}.{}.{}.{}.",
                h.fencing_token, h.marker, h.lease_ms, h.acquired_at_ms, h.renewed_at_ms
            );
            for b in h.holder.bytes() {
                let _ = write!(out, "{b:02x}");
            }
        }
        out
    }

    /// What [`Slots::encode`] wrote, checked: a limit of 1 to
    /// [`MAX_SLOTS`], at most that many holders, tokens rising, every
    /// field readable. An error says what is wrong.
    pub fn parse(text: &str) -> Result<Slots, String> {
        let mut fields = text.split(' ');
        let limit = fields.next().unwrap_or_default();
        let limit = limit
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_SLOTS).contains(n))
            .ok_or_else(|| format!("limit {limit:?} is not a number from 1 to {MAX_SLOTS}"))?;
        let mut holders: Vec<SlotHolder> = Vec::new();
        for (i, entry) in fields.enumerate() {
            let holder =
                parse_holder(entry).ok_or_else(|| format!("holder {} is unreadable", i + 1))?;
            if holders
                .last()
                .is_some_and(|h| h.fencing_token >= holder.fencing_token)
            {
                return Err(format!("holder {}'s fencing token does not rise", i + 1));
            }
            holders.push(holder);
        }
        if holders.len() > limit as usize {
            return Err(format!("{} holders for {limit} slots", holders.len()));
        }
        Ok(Slots { limit, holders })
    }

    /// The table of `lease`, if it is a counting lock's: `None` for any
    /// other record, an error if its table is unreadable.
    pub fn of(lease: &Lease) -> Option<Result<Slots, String>> {
        lease.slots().map(Slots::parse)
    }

    /// The holder whose lock token names `fencing_token`, `marker` and
    /// `holder`, if it still holds a slot.
    pub fn find(&self, fencing_token: u64, marker: &str, holder: &str) -> Option<&SlotHolder> {
        self.holders
            .iter()
            .find(|h| h.fencing_token == fencing_token && h.marker == marker && h.holder == holder)
    }

    /// The record that keeps this table: held by the newest holder, its
    /// `lease_ms` the longest of the holders' leases (a reader that times
    /// the record by its `rvn` waits out every holder), its `expires_at`
    /// the last of theirs (so a store's TTL never deletes a live slot).
    /// `counter` is the highest fencing token given so far. With no
    /// holders, the record is released (format 1; `lease_ms` kept as
    /// `released_lease_ms`), for anyone to take at once.
    pub fn record(
        &self,
        election: &str,
        counter: u64,
        released_lease_ms: u64,
        stamp: &Stamp,
    ) -> Lease {
        let Some(newest) = self.holders.last() else {
            return Lease {
                election: election.to_owned(),
                holder: None,
                rvn: stamp.rvn(),
                fencing_token: counter,
                lease_ms: released_lease_ms,
                acquired_at_ms: stamp.unix_ms,
                renewed_at_ms: stamp.unix_ms,
                expires_at_s: stamp.unix_ms.div_ceil(1000),
                holder_meta: None,
                successor: None,
                session: None,
            };
        };
        let lease_ms = self.holders.iter().map(|h| h.lease_ms).max().unwrap_or(0);
        let expires_ms = self
            .holders
            .iter()
            .map(|h| h.renewed_at_ms.saturating_add(h.lease_ms))
            .max()
            .unwrap_or(stamp.unix_ms);
        let lease = Lease {
            election: election.to_owned(),
            holder: Some(newest.holder.clone()),
            rvn: stamp.rvn(),
            fencing_token: counter.max(newest.fencing_token),
            lease_ms,
            acquired_at_ms: newest.acquired_at_ms,
            renewed_at_ms: stamp.unix_ms,
            expires_at_s: expires_ms.div_ceil(1000),
            holder_meta: Some(HolderMeta {
                slots: Some(self.encode()),
                ..HolderMeta::default()
            }),
            successor: None,
            session: None,
        };
        debug_assert_eq!(lease.format(), FORMAT_SLOTS);
        lease
    }
}

fn parse_holder(entry: &str) -> Option<SlotHolder> {
    let mut parts = entry.split('.');
    let (Some(token), Some(marker), Some(lease), Some(acquired), Some(renewed), Some(hex), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if marker.is_empty() || !marker.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(SlotHolder {
        holder: String::from_utf8(bytes).ok()?,
        fencing_token: token.parse().ok()?,
        marker: marker.to_owned(),
        lease_ms: lease.parse().ok()?,
        acquired_at_ms: acquired.parse().ok()?,
        renewed_at_ms: renewed.parse().ok()?,
    })
}

/// The next fencing token after `lease`: above its counter and above every
/// holder's token (a table another tool wrote could name a higher one).
fn next_token(lease: &Lease, slots: Option<&Slots>) -> u64 {
    let highest = slots
        .and_then(|s| s.holders.last())
        .map_or(0, |h| h.fencing_token);
    lease.fencing_token.max(highest).saturating_add(1)
}

/// What a record is that a counting lock of N slots cannot be taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// A counting lock of another limit.
    Limit {
        /// The record's limit.
        theirs: u32,
    },
    /// A plain lock (or a daemon's election) held by `holder`.
    Plain {
        /// Who holds it.
        holder: String,
    },
    /// A plain lock a daemon handed to `successor` (resign `--to`).
    Handed {
        /// Whom it was handed to.
        successor: String,
    },
}

/// What keeps a counting lock from being taken now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// Every slot is held by a live holder; these are the holders.
    Full(Slots),
    /// The record is malformed, or its holder table unreadable (this).
    Malformed(String),
    /// A record of a format this build does not know: this one.
    UnknownFormat(String),
}

/// What to do next about a counting lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per round, never kept in bulk
pub enum Verdict {
    /// Write `lease` under `condition`: the slot of `me` (`lease`'s
    /// newest holder) is taken if it applies.
    Take {
        /// The record with our slot.
        lease: Lease,
        /// The condition to write it under.
        condition: Condition,
        /// Holders evicted by it (their lease ran out), for the log.
        evicted: Vec<SlotHolder>,
    },
    /// Look again at `until` (the earliest a slot may be free).
    Wait {
        /// When.
        until: Instant,
        /// Why.
        blocked: Blocked,
    },
    /// The record is not a counting lock of this limit: nothing to wait
    /// for.
    Conflict(Conflict),
}

/// A waiter's view of one counting lock over its rounds: one takeover
/// timer per holder, timing its marker, and one for the whole record when
/// it is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotWatch {
    max_clock_drift_bits: u64,
    /// By fencing token.
    holders: BTreeMap<u64, TakeoverTimer>,
    record: TakeoverTimer,
}

impl SlotWatch {
    /// A watch for drift D = `max_clock_drift`, timing nothing yet.
    pub fn new(max_clock_drift: f64) -> SlotWatch {
        SlotWatch {
            max_clock_drift_bits: max_clock_drift.to_bits(),
            holders: BTreeMap::new(),
            record: TakeoverTimer::new(max_clock_drift),
        }
    }

    /// Time every holder of `slots` as read at `at`: the instant each may
    /// be evicted from, by fencing token. Holders gone are forgotten.
    pub fn observe(&mut self, slots: &Slots, at: Instant) -> Vec<(u64, Instant)> {
        let drift = f64::from_bits(self.max_clock_drift_bits);
        self.holders
            .retain(|token, _| slots.holders.iter().any(|h| h.fencing_token == *token));
        slots
            .holders
            .iter()
            .map(|h| {
                let timer = self
                    .holders
                    .entry(h.fencing_token)
                    .or_insert_with(|| TakeoverTimer::new(drift));
                (
                    h.fencing_token,
                    timer.observe(&h.marker, h.lease_ms, at, None),
                )
            })
            .collect()
    }

    /// What `me`, wanting one of `limit` slots of the lock `election` for
    /// `lease_ms`, does about its `record`, read at `at`; our write would
    /// be stamped `stamp`.
    #[allow(clippy::too_many_arguments)] // one verdict's facts, each named
    pub fn acquire(
        &mut self,
        election: &str,
        record: &Record,
        me: &str,
        limit: u32,
        lease_ms: u64,
        at: Instant,
        stamp: &Stamp,
    ) -> Verdict {
        let want = Want {
            me,
            limit,
            lease_ms,
            at,
            stamp,
        };
        let lease = match record {
            // A new lock: a first token no deleted record can have given
            // (the wall clock's ms, as for a plain lock).
            Record::Absent => {
                let token = stamp.unix_ms;
                return want.take(election, token, Condition::NotExists);
            }
            Record::Malformed(m) => {
                let key = format!("malformed:{}", m.fingerprint);
                let due = self.record.observe(&key, lease_ms, at, None);
                if at < due {
                    return Verdict::Wait {
                        until: due,
                        blocked: Blocked::Malformed(m.problem.clone()),
                    };
                }
                let token = m
                    .fencing_token
                    .map_or(stamp.unix_ms, |t| t.saturating_add(1));
                return want.take(&m.election, token, Condition::Unchanged(m.guard.clone()));
            }
            Record::UnknownFormat(u) => {
                self.record.forget();
                return Verdict::Wait {
                    until: at + Duration::from_millis(lease_ms),
                    blocked: Blocked::UnknownFormat(u.format.clone()),
                };
            }
            Record::Valid(l) => l,
        };
        match Slots::of(lease) {
            Some(Ok(slots)) => {
                self.record.forget();
                self.acquire_slot(lease, slots, &want)
            }
            Some(Err(problem)) => self.acquire_unreadable(lease, &problem, &want),
            None => acquire_plain(lease, &want),
        }
    }

    /// A counting lock whose table reads `slots`: a slot if fewer than
    /// `limit` holders are live (the others evicted by the same write).
    fn acquire_slot(&mut self, lease: &Lease, slots: Slots, want: &Want<'_>) -> Verdict {
        if slots.limit != want.limit {
            return Verdict::Conflict(Conflict::Limit {
                theirs: slots.limit,
            });
        }
        let at = want.at;
        let dues = self.observe(&slots, at);
        let (expired, live): (Vec<_>, Vec<_>) = slots
            .holders
            .iter()
            .zip(&dues)
            .partition(|(_, (_, due))| *due <= at);
        if live.len() >= want.limit as usize {
            let until = live.iter().map(|(_, (_, due))| *due).min().unwrap_or(at);
            return Verdict::Wait {
                until,
                blocked: Blocked::Full(slots),
            };
        }
        let token = next_token(lease, Some(&slots));
        let mut holders: Vec<SlotHolder> = live.into_iter().map(|(h, _)| h.clone()).collect();
        holders.push(want.slot(token));
        let table = Slots {
            limit: want.limit,
            holders,
        };
        Verdict::Take {
            lease: table.record(&lease.election, token, want.lease_ms, want.stamp),
            condition: Condition::RvnIs(lease.rvn.clone()),
            evicted: expired.into_iter().map(|(h, _)| h.clone()).collect(),
        }
    }

    /// A counting lock whose table this build cannot read: timed as the
    /// whole record, as a daemon times it, and overwritten once it stayed
    /// unchanged for its lease.
    fn acquire_unreadable(&mut self, lease: &Lease, problem: &str, want: &Want<'_>) -> Verdict {
        let due = self
            .record
            .observe(&lease.rvn, lease.lease_ms, want.at, None);
        if want.at < due {
            return Verdict::Wait {
                until: due,
                blocked: Blocked::Malformed(format!("its holder table: {problem}")),
            };
        }
        let token = next_token(lease, None);
        want.take(&lease.election, token, Condition::RvnIs(lease.rvn.clone()))
    }
}

/// A plain record: ours at once if nobody holds it (and it was handed to
/// no one else), as a counting lock from now on; else not one to wait on.
fn acquire_plain(lease: &Lease, want: &Want<'_>) -> Verdict {
    if lease.free_for(want.me) {
        let token = next_token(lease, None);
        return want.take(&lease.election, token, Condition::RvnIs(lease.rvn.clone()));
    }
    Verdict::Conflict(match (&lease.holder, &lease.successor) {
        (Some(holder), _) => Conflict::Plain {
            holder: holder.clone(),
        },
        (None, successor) => Conflict::Handed {
            successor: successor.clone().unwrap_or_default(),
        },
    })
}

/// Who wants a slot, of how many, for how long, read when, to write with
/// which stamp.
struct Want<'a> {
    me: &'a str,
    limit: u32,
    lease_ms: u64,
    at: Instant,
    stamp: &'a Stamp,
}

impl Want<'_> {
    /// Our slot, with fencing token `token`.
    fn slot(&self, token: u64) -> SlotHolder {
        SlotHolder {
            holder: self.me.to_owned(),
            fencing_token: token,
            marker: self.stamp.rvn(),
            lease_ms: self.lease_ms,
            acquired_at_ms: self.stamp.unix_ms,
            renewed_at_ms: self.stamp.unix_ms,
        }
    }

    /// Take the lock `election` as its only holder, with `token`, under
    /// `condition`.
    fn take(&self, election: &str, token: u64, condition: Condition) -> Verdict {
        let table = Slots {
            limit: self.limit,
            holders: vec![self.slot(token)],
        };
        Verdict::Take {
            lease: table.record(election, token, self.lease_ms, self.stamp),
            condition,
            evicted: Vec::new(),
        }
    }
}

/// Why a renew or release of a slot changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The slot is not the token's any more: why.
    NotOurs(String),
    /// The record is not a counting lock of this limit.
    Conflict(Conflict),
}

/// The token's slot in `record`, a counting lock of `limit` slots, and the
/// record's table; or why not.
fn held<'a>(
    record: &'a Record,
    limit: u32,
    fencing_token: u64,
    marker: &str,
    holder: &str,
) -> Result<(&'a Lease, Slots, usize), Refusal> {
    let lease = match record {
        Record::Valid(l) => l,
        Record::Absent => return Err(Refusal::NotOurs("there is no such lock".into())),
        Record::Malformed(m) => {
            return Err(Refusal::NotOurs(format!(
                "the record is malformed ({})",
                m.problem
            )));
        }
        Record::UnknownFormat(u) => {
            return Err(Refusal::NotOurs(format!(
                "it is a record of format {}, which this leaderd does not know",
                u.format
            )));
        }
    };
    let slots = match Slots::of(lease) {
        Some(Ok(slots)) => slots,
        Some(Err(problem)) => {
            return Err(Refusal::NotOurs(format!(
                "its holder table is unreadable ({problem})"
            )));
        }
        None if lease.holder.is_none() => {
            return Err(Refusal::NotOurs("every slot was released".into()));
        }
        None => {
            return Err(Refusal::Conflict(Conflict::Plain {
                holder: lease.holder.clone().unwrap_or_default(),
            }));
        }
    };
    if slots.limit != limit {
        return Err(Refusal::Conflict(Conflict::Limit {
            theirs: slots.limit,
        }));
    }
    match slots
        .holders
        .iter()
        .position(|h| h.fencing_token == fencing_token && h.marker == marker && h.holder == holder)
    {
        Some(i) => Ok((lease, slots, i)),
        None if slots
            .holders
            .iter()
            .any(|h| h.fencing_token == fencing_token) =>
        {
            Err(Refusal::NotOurs(
                "its slot was renewed since this token (use the newest)".into(),
            ))
        }
        None => Err(Refusal::NotOurs(
            "its slot is not held any more (released, or its lease ran out and it was taken)"
                .into(),
        )),
    }
}

/// The record with the token's slot renewed for `lease_ms` from now (its
/// new marker: `stamp`'s `rvn`), and the condition to write it under.
pub fn renew(
    record: &Record,
    limit: u32,
    fencing_token: u64,
    marker: &str,
    holder: &str,
    lease_ms: u64,
    stamp: &Stamp,
) -> Result<(Lease, Condition), Refusal> {
    let (lease, mut slots, i) = held(record, limit, fencing_token, marker, holder)?;
    let entry = &mut slots.holders[i];
    entry.marker = stamp.rvn();
    entry.lease_ms = lease_ms;
    entry.renewed_at_ms = stamp.unix_ms;
    let next = slots.record(&lease.election, lease.fencing_token, lease_ms, stamp);
    Ok((next, Condition::RvnIs(lease.rvn.clone())))
}

/// The record without the token's slot (released when it was the last),
/// and the condition to write it under.
pub fn release(
    record: &Record,
    limit: u32,
    fencing_token: u64,
    marker: &str,
    holder: &str,
    stamp: &Stamp,
) -> Result<(Lease, Condition), Refusal> {
    let (lease, mut slots, i) = held(record, limit, fencing_token, marker, holder)?;
    let gone = slots.holders.remove(i);
    let next = slots.record(&lease.election, lease.fencing_token, gone.lease_ms, stamp);
    Ok((next, Condition::RvnIs(lease.rvn.clone())))
}

#[cfg(test)]
mod tests;
