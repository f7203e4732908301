//! The keys of the records that are not elections': the daemons' member
//! and session records, and `leaderd check`'s scratch record, in the same
//! table. No election can be named with a `#` or a `/`, so none of them is
//! ever taken for an election.

use super::record::{Lease, Record};
use super::store_error::StoreError;

/// Keys of the daemons' member records (see `crate::balance`) start with
/// this. No election can be named so (election names never hold `#` or
/// `/`), so a member record is never taken for an election.
pub const MEMBER_PREFIX: &str = "#member/";

/// The key of `identity`'s member record.
pub fn member_key(identity: &str) -> String {
    format!("{MEMBER_PREFIX}{identity}")
}

/// Whether `key` is a member record's, not an election's.
pub fn is_member_key(key: &str) -> bool {
    key.starts_with(MEMBER_PREFIX)
}

/// The well-formed member records among `records`: what every store's
/// `LeaseStore::members` returns of what it read. A member record of an
/// unknown format is no member to this build: membership is advice.
pub fn member_records(records: impl IntoIterator<Item = Record>) -> Vec<Lease> {
    records
        .into_iter()
        .filter_map(|r| match r {
            Record::Valid(l) if is_member_key(&l.election) => Some(l),
            _ => None,
        })
        .collect()
}

/// Keys of the daemons' session records (see `crate::core::session`)
/// start with this; like member keys, no election can be named so.
pub const SESSION_PREFIX: &str = "#session/";

/// The key of `identity`'s session opened with `nonce` (fresh per opening).
pub fn session_key(identity: &str, nonce: &str) -> String {
    format!("{SESSION_PREFIX}{identity}/{nonce}")
}

/// Whether `key` is a session record's, not an election's.
pub fn is_session_key(key: &str) -> bool {
    key.starts_with(SESSION_PREFIX)
}

/// The identity whose session `key` is, if it is a session's key.
pub fn session_owner(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(SESSION_PREFIX)?;
    rest.rsplit_once('/').map(|(identity, _)| identity)
}

/// Keys of `leaderd check`'s scratch records start with this: a record it
/// writes, reads and deletes to try the store's permissions. No election
/// can be named so, and neither a member's nor a session's key starts so,
/// so no election, member or session is ever read, written or deleted in
/// its place, and nothing takes it for one.
pub const CHECK_PREFIX: &str = "#check/";

/// The key of the scratch record of `identity`'s check made with `nonce`
/// (fresh per run).
pub fn check_key(identity: &str, nonce: &str) -> String {
    format!("{CHECK_PREFIX}{identity}/{nonce}")
}

/// Whether `key` is a scratch record's of `leaderd check`.
pub fn is_check_key(key: &str) -> bool {
    key.starts_with(CHECK_PREFIX)
}

/// `Ok` for a key of `leaderd check`'s scratch records, an error for any
/// other: what every `LeaseStore::delete_check_record` checks
/// first.
pub fn scratch_only(key: &str) -> Result<(), StoreError> {
    if is_check_key(key) {
        Ok(())
    } else {
        Err(StoreError::Other(format!(
            "refused to delete `{key}`: leaderd deletes only the scratch records of `leaderd check` ({CHECK_PREFIX}…)"
        )))
    }
}
