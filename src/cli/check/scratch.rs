//! The store's permissions, tried for real on a scratch record under a key
//! no election, member or session can have (`#check/IDENTITY/NONCE`): the
//! calls `leaderd run` makes with the configured features, each one item.
//!
//! The delete is tried first, on the record before it exists (a delete on
//! the condition of an `rvn` it cannot have): allowed, it proves the
//! permission without writing anything, and the record is then created,
//! read, rewritten, read in a batch, and deleted again at the end; denied,
//! nothing is created (the record could not be removed), and the put is
//! tried on a condition that cannot hold, which the store authorises
//! before it finds the condition false. Either way nothing is left behind,
//! and no other record is written or deleted.

use std::time::Duration;

use crate::lease::{
    Condition, Lease, LeaseStore, Record, StoreError, WriteOutcome, check_key, new_rvn,
};

use super::config::Features;
use super::report::{Report, fail, ok, store_failure};

/// The time each request may take.
const BUDGET: Duration = Duration::from_secs(10);

/// How long the scratch record says it lasts: a table's TTL deletes it
/// after that, should a check be killed before it deleted it itself.
const SCRATCH_LEASE_MS: u64 = 60_000;

/// One kind of store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Put,
    Get,
    BatchGet,
    Scan,
    Delete,
}

/// How an item names a call: DynamoDB's IAM action, or on another store
/// what it does.
fn name(kind: &str, op: Op) -> &'static str {
    match (kind == "dynamodb", op) {
        (true, Op::Put) => "dynamodb:PutItem",
        (true, Op::Get) => "dynamodb:GetItem",
        (true, Op::BatchGet) => "dynamodb:BatchGetItem",
        (true, Op::Scan) => "dynamodb:Scan",
        (true, Op::Delete) => "dynamodb:DeleteItem",
        (false, Op::Put) => "write",
        (false, Op::Get) => "read",
        (false, Op::BatchGet) => "batch read",
        (false, Op::Scan) => "scan",
        (false, Op::Delete) => "delete",
    }
}

/// Try every call `run` makes with `features` on a fresh scratch record of
/// `identity`, and delete it again. Returns its key.
pub async fn try_calls(
    store: &dyn LeaseStore,
    identity: &str,
    features: Features,
    report: &mut Report,
) -> String {
    let key = check_key(identity, &new_rvn()[..12]);
    let mut trial = Trial {
        store,
        key: &key,
        report,
        current: None,
        maybe_written: Vec::new(),
    };
    // The delete first, before anything exists: see the module's doc.
    let can_delete = trial.delete_before().await;
    let first = Lease::stamped(
        &key,
        identity,
        1,
        SCRATCH_LEASE_MS,
        crate::clock::unix_ms(),
        None,
    );
    if can_delete {
        trial.create(&first).await;
    } else {
        trial.put_refused(&first).await;
    }
    trial.read_back().await;
    trial.rewrite(&first).await;
    if features.sessions {
        trial.batch_read().await;
    }
    if features.balance && !features.sessions {
        trial.members().await;
    }
    if can_delete {
        let Trial {
            current,
            maybe_written,
            report,
            ..
        } = trial;
        remove(store, &key, current, maybe_written, report).await;
    }
    key
}

/// The calls tried on one scratch record, and what they left it with.
struct Trial<'a> {
    store: &'a dyn LeaseStore,
    key: &'a str,
    report: &'a mut Report,
    /// The `rvn` the record has, once written.
    current: Option<String>,
    /// Every rvn a write may have left the record with (an answer lost
    /// after the write, a timeout).
    maybe_written: Vec<String>,
}

impl Trial<'_> {
    /// How the report names `op` on this store.
    fn name(&self, op: Op) -> &'static str {
        name(self.store.kind(), op)
    }

    /// The delete, on a condition the absent record cannot meet: whether
    /// it is allowed.
    async fn delete_before(&mut self) -> bool {
        match self
            .store
            .delete_check_record(self.key, &new_rvn(), BUDGET)
            .await
        {
            Ok(_) => true,
            Err(e) => {
                let failed = store_failure(self.name(Op::Delete), &e);
                let detail = format!(
                    "{}; so nothing was written, and the other writes were tried on conditions that cannot hold",
                    failed.detail
                );
                self.report
                    .add(fail(failed.item, detail).fix(failed.fix.unwrap_or_default()));
                false
            }
        }
    }

    /// Create the record (it can be deleted again).
    async fn create(&mut self, first: &Lease) {
        let (key, put) = (self.key, self.name(Op::Put));
        match self.store.put(first, &Condition::NotExists, BUDGET).await {
            Ok(WriteOutcome::Applied) => {
                self.current = Some(first.rvn.clone());
                self.report.add(ok(
                    put,
                    format!(
                        "created the scratch record {key}, on the condition that it did not exist"
                    ),
                ));
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => self.report.add(
                fail(
                    put,
                    format!("the scratch record {key} was there before it was created"),
                )
                .fix("run the check again (its key is fresh each time)"),
            ),
            Err(e) => {
                if e.maybe_applied() {
                    self.maybe_written.push(first.rvn.clone());
                }
                self.report.add(store_failure(put, &e));
            }
        }
    }

    /// A put on a condition that cannot hold (the record could not be
    /// deleted again): the store must refuse it by its condition, not by
    /// a permission.
    async fn put_refused(&mut self, first: &Lease) {
        let (key, put) = (self.key, self.name(Op::Put));
        match self
            .store
            .put(first, &Condition::RvnIs(new_rvn()), BUDGET)
            .await
        {
            Ok(WriteOutcome::ConditionFailed { .. }) => self.report.add(ok(
                put,
                "allowed: a put on a condition that cannot hold was refused by its condition, not by a permission",
            )),
            Ok(WriteOutcome::Applied) => {
                // Cannot happen (no record has a fresh rvn); say so.
                self.maybe_written.push(first.rvn.clone());
                let detail = format!("a put on a condition that cannot hold was applied to {key}");
                self.report.add(
                    fail(put, detail)
                        .fix("use a store that honours conditional writes: leaderd's safety rests on them"),
                );
            }
            Err(e) => self.report.add(store_failure(put, &e)),
        }
    }

    /// Read the record back: as written, or absent when nothing was.
    async fn read_back(&mut self) {
        let get = self.name(Op::Get);
        match self.store.read(self.key, BUDGET).await {
            Ok(Record::Valid(l)) if self.current.as_ref() == Some(&l.rvn) => self.report.add(ok(
                get,
                "read the scratch record back, consistently, as written",
            )),
            Ok(Record::Absent) if self.current.is_none() => self.report.add(ok(
                get,
                "allowed: read the scratch record, absent as it should be (nothing was written)",
            )),
            Ok(other) => self.report.add(
                fail(
                    get,
                    format!("read back something else than was written: {}", found(&other)),
                )
                .fix("make sure every read is strongly consistent (DynamoDB: nothing in front of it that caches)"),
            ),
            Err(e) => self.report.add(store_failure(get, &e)),
        }
    }

    /// Rewrite the record on the condition of its `rvn`, if it was
    /// written.
    async fn rewrite(&mut self, first: &Lease) {
        let Some(rvn) = self.current.clone() else {
            return;
        };
        let put = self.name(Op::Put);
        let second = first.renewed();
        match self
            .store
            .put(&second, &Condition::RvnIs(rvn), BUDGET)
            .await
        {
            Ok(WriteOutcome::Applied) => {
                self.current = Some(second.rvn.clone());
                self.report.add(ok(
                    put,
                    "rewrote it on the condition of the rvn it had, as renewals and takeovers write",
                ));
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => self.report.add(
                fail(
                    put,
                    "a rewrite on the condition of the rvn just read was refused",
                )
                .fix("make sure every read is strongly consistent"),
            ),
            Err(e) => {
                if e.maybe_applied() {
                    self.maybe_written.push(second.rvn.clone());
                }
                self.report.add(store_failure(put, &e));
            }
        }
    }

    /// Read the record in a batch, as a daemon with sessions checks the
    /// records it holds.
    async fn batch_read(&mut self) {
        let batch_get = self.name(Op::BatchGet);
        let key = self.key.to_owned();
        match self
            .store
            .read_many(std::slice::from_ref(&key), BUDGET)
            .await
        {
            Ok(records) => {
                let rvn = match records.first() {
                    Some(Record::Valid(l)) => Some(&l.rvn),
                    _ => None,
                };
                if rvn == self.current.as_ref() {
                    self.report.add(ok(
                        batch_get,
                        "read it in a batch, as a daemon with sessions checks the records it holds",
                    ));
                } else {
                    self.report.add(
                        fail(
                            batch_get,
                            format!(
                                "a batch read found something else than was written: {}",
                                records.first().map_or("nothing".to_owned(), found)
                            ),
                        )
                        .fix("make sure batch reads are strongly consistent"),
                    );
                }
            }
            Err(e) => self.report.add(store_failure(batch_get, &e)),
        }
    }

    /// Read the member records, as balance without sessions does.
    async fn members(&mut self) {
        let scan = self.name(Op::Scan);
        match self.store.members(BUDGET).await {
            Ok(members) => self.report.add(
                ok(
                    scan,
                    format!(
                        "read the member records ({} found), as balance without sessions does every renew interval",
                        members.len()
                    ),
                )
                .with("members", members.len()),
            ),
            Err(e) => self.report.add(store_failure(scan, &e)),
        }
    }
}

/// Delete the scratch record, whichever `rvn` it was left with, and read
/// that it is gone.
async fn remove(
    store: &dyn LeaseStore,
    key: &str,
    current: Option<String>,
    maybe_written: Vec<String>,
    report: &mut Report,
) {
    let name = name(store.kind(), Op::Delete);
    let mut error: Option<StoreError> = None;
    let mut deleted = false;
    for rvn in current.iter().chain(maybe_written.iter().rev()) {
        match store.delete_check_record(key, rvn, BUDGET).await {
            Ok(WriteOutcome::Applied) => {
                deleted = true;
                break;
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {}
            Err(e) => error = Some(e),
        }
    }
    let left = match store.read(key, BUDGET).await {
        Ok(Record::Absent) => false,
        Ok(_) => true,
        // Cannot tell; the delete's own answer decides.
        Err(_) => !deleted && error.is_some(),
    };
    match (left, error) {
        (false, _) if deleted => report.add(ok(
            name,
            "deleted it on the condition of its rvn; nothing is left behind",
        )),
        (false, _) => report.add(ok(
            name,
            "allowed (a delete on a condition it cannot meet); nothing was left to delete",
        )),
        (true, Some(e)) => {
            let item = store_failure(name, &e);
            report.add(
                fail(
                    item.item,
                    format!("{}; the scratch record {key} is left behind", item.detail),
                )
                .fix(format!(
                    "{}; then delete {key} by hand (nothing takes it for an election)",
                    item.fix.unwrap_or_default()
                )),
            );
        }
        (true, None) => report.add(
            fail(
                name,
                format!("the scratch record {key} is still there after its delete"),
            )
            .fix(format!(
                "delete {key} by hand (nothing takes it for an election)"
            )),
        ),
    }
}

/// A record as one short phrase.
fn found(record: &Record) -> String {
    match record {
        Record::Absent => "no record".to_owned(),
        Record::Valid(l) => format!("a record with rvn {}", l.rvn),
        Record::Malformed(m) => format!("a malformed record ({})", m.problem),
        Record::UnknownFormat(u) => format!("a record of format {}", u.format),
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::*;
    use crate::lease::memory::{Fault, MemoryStore};
    use crate::lease::{CHECK_PREFIX, is_check_key};

    fn features(sessions: bool, balance: bool) -> Features {
        Features { sessions, balance }
    }

    #[tokio::test]
    async fn every_call_is_tried_and_nothing_is_left() {
        let store = MemoryStore::new();
        let election = Lease::stamped("web", "other", 7, 10_000, 1, None);
        store.set("web", Record::Valid(election.clone()));
        let mut report = Report::default();
        let key = try_calls(&store, "me", features(true, false), &mut report).await;
        assert!(key.starts_with(&format!("{CHECK_PREFIX}me/")) && is_check_key(&key));
        let names: Vec<(&str, Status)> = report
            .items()
            .iter()
            .map(|i| (i.item.as_str(), i.status))
            .collect();
        assert_eq!(
            names,
            [
                ("write", Status::Ok),
                ("read", Status::Ok),
                ("write", Status::Ok),
                ("batch read", Status::Ok),
                ("delete", Status::Ok),
            ],
            "{report:?}"
        );
        assert_eq!(store.get(&key), Record::Absent);
        // The election's record is as it was.
        assert_eq!(store.get("web"), Record::Valid(election));
    }

    #[tokio::test]
    async fn balance_without_sessions_scans_and_skips_the_batch() {
        let store = MemoryStore::new();
        let mut report = Report::default();
        try_calls(&store, "me", features(false, true), &mut report).await;
        let names: Vec<&str> = report.items().iter().map(|i| i.item.as_str()).collect();
        assert_eq!(names, ["write", "read", "write", "scan", "delete"]);
        assert!(report.passed(), "{report:?}");
    }

    #[tokio::test]
    async fn refused_writes_fail_each_write_and_leave_nothing() {
        let store = MemoryStore::new();
        store.set_fault(Fault::RefuseWrites);
        let mut report = Report::default();
        let key = try_calls(&store, "me", features(true, false), &mut report).await;
        let failed: Vec<&str> = report
            .items()
            .iter()
            .filter(|i| i.status == Status::Fail)
            .map(|i| i.item.as_str())
            .collect();
        assert_eq!(failed, ["delete", "write"], "{report:?}");
        assert!(!report.passed());
        assert_eq!(store.get(&key), Record::Absent);
    }

    #[tokio::test]
    async fn an_unreachable_store_fails_every_call() {
        let store = MemoryStore::new();
        store.set_fault(Fault::Unreachable);
        let mut report = Report::default();
        try_calls(&store, "me", features(true, true), &mut report).await;
        assert!(
            report.items().iter().all(|i| i.status == Status::Fail),
            "{report:?}"
        );
        assert_eq!(report.items().len(), 4, "{report:?}");
    }
}
