//! The store contract: one suite, written once against
//! `Arc<dyn LeaseStore>`, run unchanged against every backend.
//!
//! A backend supplies only what the store interface cannot: fresh store
//! handles (separate connections or clients, as separate processes would
//! have), raw writes "by another tool", and a store whose table is missing.
//! Nothing here relies on one server's quirks: a refused condition may or may
//! not come with the current record.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use common::emulators::{self, Emulator};
use common::postgres::{PgServer, shared_postgres};
use leaderd::lease::dynamodb::{DynamoConfig, DynamoStore};
use leaderd::lease::postgres::{PostgresStore, quoted_table};
use leaderd::lease::sqlite::SqliteStore;
use leaderd::lease::{
    Condition, FORMAT, FORMAT_SLOTS, HolderMeta, Lease, LeaseStore, Record, RvnGuard, StoreError,
    WriteOutcome, is_member_key, member_key, new_rvn,
};
use tokio::sync::Barrier;

/// Generous: the machine running the tests is shared and often busy.
const BUDGET: Duration = Duration::from_secs(20);

/// Candidates racing in the concurrency test.
const CANDIDATES: usize = 8;

/// Rounds of takeover after the first creation.
const TAKEOVER_ROUNDS: usize = 4;

/// An attribute value as another tool would write it.
#[derive(Debug, Clone)]
pub enum RawValue {
    /// A string (DynamoDB S, SQLite TEXT).
    S(&'static str),
    /// A number (DynamoDB N, SQLite INTEGER).
    N(i64),
    /// Bytes (DynamoDB B, SQLite BLOB): a type no lease attribute has, and
    /// one SQLite's column affinity never converts.
    B(&'static [u8]),
}

/// What each backend provides to the suite.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A new store handle on this backend's table, with its own connection
    /// or client (as another leaderd process would have).
    async fn store(&self) -> Arc<dyn LeaseStore>;
    /// Replace the item of `election` with exactly `attrs`, bypassing the store.
    async fn put_raw(&self, election: &str, attrs: &[(&str, RawValue)]);
    /// A store whose table does not exist.
    async fn store_without_table(&self) -> Arc<dyn LeaseStore>;
    /// Whether the store's columns are typed (PostgreSQL): another tool
    /// can leave an attribute out or give it a value of its type that
    /// leaderd cannot use (a negative number, JSON of another shape), but
    /// never a value of another type ([`RawValue::B`] anywhere, a string
    /// for a number).
    fn typed(&self) -> bool {
        false
    }
}

/// A number attribute another tool spoiled: a string where the store
/// takes one, else a negative number.
fn bad_number(b: &dyn Backend, text: &'static str) -> RawValue {
    if b.typed() {
        RawValue::N(-41)
    } else {
        RawValue::S(text)
    }
}

fn lease(election: &str, holder: &str, fencing_token: u64) -> Lease {
    Lease {
        election: election.to_owned(),
        holder: Some(holder.to_owned()),
        rvn: new_rvn(),
        fencing_token,
        lease_ms: 10_000,
        acquired_at_ms: 1_700_000_000_000,
        renewed_at_ms: 1_700_000_000_000,
        expires_at_s: 1_700_000_010,
        holder_meta: None,
        successor: None,
        session: None,
    }
}

fn with_meta(mut l: Lease) -> Lease {
    l.holder_meta = Some(HolderMeta {
        address: Some("http://10.0.0.7:9777".into()),
        labels: [("zone".to_owned(), "eu-west-1a".to_owned())]
            .into_iter()
            .collect(),
        slots: None,
    });
    l
}

/// A renewal of `l`: same tenure, new rvn, later timestamps.
fn renewed(l: &Lease) -> Lease {
    Lease {
        rvn: new_rvn(),
        renewed_at_ms: l.renewed_at_ms + 5_000,
        expires_at_s: l.expires_at_s + 5,
        ..l.clone()
    }
}

/// The well-formed attributes of a lease, to be spoiled one at a time.
fn good_attrs() -> Vec<(&'static str, RawValue)> {
    vec![
        ("holder", RawValue::S("other-tool")),
        ("rvn", RawValue::S("raw-rvn-1")),
        ("fencing_token", RawValue::N(41)),
        ("lease_ms", RawValue::N(10_000)),
        ("acquired_at", RawValue::N(1_700_000_000_000)),
        ("renewed_at", RawValue::N(1_700_000_000_000)),
        ("expires_at", RawValue::N(1_700_000_010)),
    ]
}

/// `good_attrs` with `name` replaced by `value`, or removed when `None`.
fn spoiled(name: &'static str, value: Option<RawValue>) -> Vec<(&'static str, RawValue)> {
    let mut attrs: Vec<_> = good_attrs()
        .into_iter()
        .filter(|(n, _)| *n != name)
        .collect();
    attrs.extend(value.map(|v| (name, v)));
    attrs
}

async fn read(store: &Arc<dyn LeaseStore>, election: &str) -> Record {
    store
        .read(election, BUDGET)
        .await
        .unwrap_or_else(|e| panic!("read of {election} failed: {e}"))
}

fn expect_valid(record: Record) -> Lease {
    match record {
        Record::Valid(l) => l,
        other => panic!("expected a well-formed lease, got {other:?}"),
    }
}

fn expect_malformed(record: Record) -> leaderd::lease::Malformed {
    match record {
        Record::Malformed(m) => m,
        other => panic!("expected a malformed record, got {other:?}"),
    }
}

fn expect_unknown_format(record: Record) -> leaderd::lease::UnknownFormat {
    match record {
        Record::UnknownFormat(u) => u,
        other => panic!("expected a record of an unknown format, got {other:?}"),
    }
}

fn assert_condition_failed(outcome: Result<WriteOutcome, StoreError>, what: &str) {
    match outcome {
        Ok(WriteOutcome::ConditionFailed { .. }) => {}
        other => panic!("{what}: expected ConditionFailed, got {other:?}"),
    }
}

fn assert_applied(outcome: Result<WriteOutcome, StoreError>, what: &str) {
    match outcome {
        Ok(WriteOutcome::Applied) => {}
        other => panic!("{what}: expected Applied, got {other:?}"),
    }
}

/// The contract, one function per behaviour.
mod contract {
    use super::*;

    /// A created lease reads back exactly; `list` returns every item.
    pub async fn create_then_read_back(b: &dyn Backend) {
        let store = b.store().await;
        let election = common::unique_name("create");
        assert_eq!(read(&store, &election).await, Record::Absent);

        let first = with_meta(lease(&election, "node-a", 1_700_000_000_000));
        assert_applied(store.create(&first, BUDGET).await, "create");
        // Another handle (another process) sees it at once: strong consistency.
        let other = b.store().await;
        assert_eq!(expect_valid(read(&other, &election).await), first);

        // A second create of the same election is refused, not an error.
        let second = lease(&election, "node-b", 1_700_000_000_001);
        assert_condition_failed(other.create(&second, BUDGET).await, "second create");
        assert_eq!(expect_valid(read(&store, &election).await), first);

        // A lease without holder_meta round-trips as None.
        let plain_election = common::unique_name("create-plain");
        let plain = lease(&plain_election, "node-c", 5);
        assert_applied(store.create(&plain, BUDGET).await, "create plain");
        assert_eq!(expect_valid(read(&other, &plain_election).await), plain);

        let listed = store.list(BUDGET).await.expect("list");
        for expected in [&first, &plain] {
            assert!(
                listed.contains(&Record::Valid(expected.clone())),
                "list() lacks {}: {listed:?}",
                expected.election
            );
        }
        store.check(BUDGET).await.expect("check of a usable store");
    }

    /// A counting lock's record (format 3, its holder table in
    /// `holder_meta.slots`) reads back exactly, is written over under its
    /// `rvn` like any lease (and not under a stale one), and once released
    /// (no holder, no `holder_meta`) it reads as format 1 again.
    pub async fn counting_lock_round_trips(b: &dyn Backend) {
        let store = b.store().await;
        let election = common::unique_name("slots");
        let mut held = lease(&election, "node-b", 7);
        held.holder_meta = Some(HolderMeta {
            slots: Some("2 6.abc.10000.1.1.61 7.def.10000.2.2.62".into()),
            ..HolderMeta::default()
        });
        assert_eq!(held.format(), FORMAT_SLOTS);
        assert_applied(store.create(&held, BUDGET).await, "create");
        let other = b.store().await;
        assert_eq!(expect_valid(read(&other, &election).await), held);
        let next = renewed(&held);
        assert_applied(
            other.take_over(&next, &held.rvn, BUDGET).await,
            "a write under its rvn",
        );
        assert_condition_failed(
            store.take_over(&renewed(&held), &held.rvn, BUDGET).await,
            "a write under a stale rvn",
        );
        assert_eq!(expect_valid(read(&store, &election).await), next);
        let released = Lease {
            holder: None,
            holder_meta: None,
            rvn: new_rvn(),
            ..next.clone()
        };
        assert_applied(
            store.take_over(&released, &next.rvn, BUDGET).await,
            "the release",
        );
        let back = expect_valid(read(&other, &election).await);
        assert_eq!((&back, back.format()), (&released, FORMAT));
    }

    /// Member records (balance) live next to the leases: `members()` finds
    /// them, `list()` (what `leaderd status` shows) never does.
    pub async fn member_records_are_not_elections(b: &dyn Backend) {
        let store = b.store().await;
        let identity = common::unique_name("member");
        let member = with_meta(lease(&member_key(&identity), &identity, 0));
        assert_applied(store.create(&member, BUDGET).await, "create member");
        let election = common::unique_name("next-to-member");
        let held = lease(&election, &identity, 3);
        assert_applied(store.create(&held, BUDGET).await, "create election");

        // Read eventually consistently on DynamoDB: give it a moment.
        let mut found = Vec::new();
        for _ in 0..50 {
            found = store.members(BUDGET).await.expect("members");
            if found.iter().any(|m| m.election == member.election) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(found.contains(&member), "members() lacks it: {found:?}");
        assert!(
            found.iter().all(|m| is_member_key(&m.election)),
            "members() returned an election: {found:?}"
        );
        let listed = store.list(BUDGET).await.expect("list");
        assert!(listed.contains(&Record::Valid(held)), "{listed:?}");
        assert!(
            !listed.iter().any(|r| r.key().is_some_and(is_member_key)),
            "list() shows a member record: {listed:?}"
        );
    }

    /// Candidates with separate store handles race; every round has exactly
    /// one winner, and the stored record is the winner's.
    pub async fn one_winner_per_round(b: &dyn Backend) {
        let election = common::unique_name("race");
        let mut stores = Vec::new();
        for _ in 0..CANDIDATES {
            stores.push(b.store().await);
        }
        let observer = b.store().await;

        let mut observed: Option<Lease> = None;
        for round in 0..=TAKEOVER_ROUNDS {
            let barrier = Arc::new(Barrier::new(CANDIDATES));
            let mut tasks = Vec::new();
            for (i, store) in stores.iter().enumerate() {
                let store = store.clone();
                let barrier = barrier.clone();
                let observed = observed.clone();
                let election = election.clone();
                tasks.push(tokio::spawn(async move {
                    // Each candidate reads for itself, as a follower would.
                    let seen = store.read(&election, BUDGET).await;
                    let token = observed.as_ref().map_or(1, |l| l.fencing_token + 1);
                    let mine = lease(&election, &format!("candidate-{i}"), token);
                    barrier.wait().await;
                    let outcome = match &observed {
                        None => store.create(&mine, BUDGET).await,
                        Some(prev) => store.take_over(&mine, &prev.rvn, BUDGET).await,
                    };
                    (seen, mine, outcome)
                }));
            }
            let mut winners = Vec::new();
            let mut refused = Vec::new();
            for task in tasks {
                let (seen, mine, outcome) = task.await.expect("candidate task panicked");
                let seen = seen.unwrap_or_else(|e| panic!("round {round}: read failed: {e}"));
                match &observed {
                    None => assert_eq!(seen, Record::Absent, "round {round}"),
                    Some(prev) => assert_eq!(seen, Record::Valid(prev.clone()), "round {round}"),
                }
                match outcome {
                    Ok(WriteOutcome::Applied) => winners.push(mine),
                    Ok(WriteOutcome::ConditionFailed { current }) => refused.push(current),
                    Err(e) => panic!("round {round}: a racing write failed: {e}"),
                }
            }
            assert_eq!(
                winners.len(),
                1,
                "round {round}: exactly one winner expected, got {:?}",
                winners.iter().map(|l| &l.holder).collect::<Vec<_>>()
            );
            let winner = winners.remove(0);
            assert_eq!(refused.len(), CANDIDATES - 1);
            for current in refused.into_iter().flatten() {
                // A server that says what it saw must have seen the winner's write.
                assert_eq!(current, Record::Valid(winner.clone()), "round {round}");
            }
            assert_eq!(expect_valid(read(&observer, &election).await), winner);
            if let Some(prev) = &observed {
                assert!(winner.fencing_token > prev.fencing_token);
            }
            observed = Some(winner);
        }
    }

    /// Renew and release only work for the holder with its last rvn; anyone
    /// else gets ConditionFailed, never an error.
    pub async fn non_holder_is_refused(b: &dyn Backend) {
        let a = b.store().await;
        let intruder = b.store().await;
        let election = common::unique_name("renew");
        let held = lease(&election, "node-a", 7);
        assert_applied(a.create(&held, BUDGET).await, "create");

        // Someone else claiming to renew with the right rvn.
        let mut theirs = renewed(&held);
        theirs.holder = Some("node-b".into());
        assert_condition_failed(
            intruder.renew(&theirs, &held.rvn, BUDGET).await,
            "renew by another holder",
        );
        // The holder with a stale rvn.
        assert_condition_failed(
            intruder
                .renew(&renewed(&held), "not-the-current-rvn", BUDGET)
                .await,
            "renew with a wrong rvn",
        );
        let released = Lease {
            holder: None,
            rvn: new_rvn(),
            holder_meta: None,
            ..held.clone()
        };
        assert_condition_failed(
            intruder
                .release(&released, &held.rvn, "node-b", BUDGET)
                .await,
            "release by another holder",
        );
        assert_condition_failed(
            intruder
                .release(&released, "not-the-current-rvn", "node-a", BUDGET)
                .await,
            "release with a wrong rvn",
        );
        assert_eq!(expect_valid(read(&a, &election).await), held);

        // The holder renews: same tenure, same fencing token.
        let next = renewed(&held);
        assert_applied(a.renew(&next, &held.rvn, BUDGET).await, "renew");
        let stored = expect_valid(read(&intruder, &election).await);
        assert_eq!(stored, next);
        assert_eq!(stored.fencing_token, held.fencing_token);
        // Its previous rvn no longer works.
        assert_condition_failed(
            a.renew(&renewed(&held), &held.rvn, BUDGET).await,
            "renew with the rvn before the last renewal",
        );
    }

    /// Release keeps the item without a holder, with its fencing token; a
    /// released lease can be taken over at once with its rvn.
    pub async fn release_keeps_the_item(b: &dyn Backend) {
        let a = b.store().await;
        let other = b.store().await;
        let election = common::unique_name("release");
        let held = with_meta(lease(&election, "node-a", 12));
        assert_applied(a.create(&held, BUDGET).await, "create");
        let released = Lease {
            holder: None,
            rvn: new_rvn(),
            holder_meta: None,
            ..held.clone()
        };
        assert_applied(
            a.release(&released, &held.rvn, "node-a", BUDGET).await,
            "release",
        );
        let stored = expect_valid(read(&other, &election).await);
        assert_eq!(stored.holder, None);
        assert_eq!(stored.fencing_token, 12);
        assert_eq!(stored, released);

        // Nobody holds it: renewing or releasing again is refused.
        assert_condition_failed(
            a.renew(&renewed(&held), &released.rvn, BUDGET).await,
            "renew after release",
        );
        assert_condition_failed(
            a.release(&released, &released.rvn, "node-a", BUDGET).await,
            "second release",
        );
        // A create is refused too: the item (and its token) still exists.
        assert_condition_failed(
            other.create(&lease(&election, "node-b", 1), BUDGET).await,
            "create over a released item",
        );
        let next = lease(&election, "node-b", 13);
        assert_applied(
            other.take_over(&next, &released.rvn, BUDGET).await,
            "take over a released lease",
        );
        assert_eq!(expect_valid(read(&a, &election).await), next);
    }

    /// A lease handed to a successor: the released record carries the
    /// successor's identity for everyone to read; the next holder's write
    /// drops it.
    pub async fn handover_records_the_successor(b: &dyn Backend) {
        let a = b.store().await;
        let other = b.store().await;
        let election = common::unique_name("handover");
        let held = with_meta(lease(&election, "node-a", 20));
        assert_applied(a.create(&held, BUDGET).await, "create");
        let handed = held.handed_to(Some("node-b".into()));
        assert_applied(
            a.release(&handed, &held.rvn, "node-a", BUDGET).await,
            "release to node-b",
        );
        let stored = expect_valid(read(&other, &election).await);
        assert_eq!(stored.successor.as_deref(), Some("node-b"));
        assert_eq!(stored.holder, None);
        assert!(stored.free_for("node-b") && !stored.free_for("node-c"));
        assert_eq!(stored, handed);
        let next = lease(&election, "node-b", 21);
        assert_applied(
            other.take_over(&next, &handed.rvn, BUDGET).await,
            "the successor takes over",
        );
        let stored = expect_valid(read(&a, &election).await);
        assert_eq!(stored.successor, None);
        assert_eq!(stored, next);
    }

    /// Items with missing or wrongly typed attributes are reported as
    /// malformed, naming the attribute; nothing panics, `list` included.
    pub async fn malformed_records_are_reported(b: &dyn Backend) {
        let store = b.store().await;
        let cases: Vec<(&'static str, Option<RawValue>)> = if b.typed() {
            vec![
                ("rvn", None),
                ("fencing_token", Some(RawValue::N(-1))),
                ("fencing_token", None),
                (
                    "holder_meta",
                    Some(RawValue::S(r#"{"address": 7, "labels": {}}"#)),
                ),
                ("holder_meta", Some(RawValue::S(r#"["a", "b"]"#))),
                (
                    "holder_meta",
                    Some(RawValue::S(r#"{"labels": {}, "slots": 7}"#)),
                ),
                ("lease_ms", Some(RawValue::N(-10_000))),
                ("acquired_at", None),
            ]
        } else {
            vec![
                ("rvn", None),
                ("rvn", Some(RawValue::B(b"\x01\x02"))),
                ("fencing_token", Some(RawValue::S("not-a-number"))),
                ("fencing_token", None),
                ("holder", Some(RawValue::B(b"\xff"))),
                ("lease_ms", Some(RawValue::S("ten seconds"))),
                ("acquired_at", None),
            ]
        };
        let mut elections = Vec::new();
        for (attr, value) in &cases {
            let election = common::unique_name("malformed");
            b.put_raw(&election, &spoiled(attr, value.clone())).await;
            let m = expect_malformed(read(&store, &election).await);
            assert_eq!(m.election, election);
            assert!(
                m.problem.contains(attr),
                "problem for a bad `{attr}` ({value:?}) does not name it: {}",
                m.problem
            );
            assert!(!m.fingerprint.is_empty());
            match (*attr, value) {
                ("rvn", None) => assert_eq!(m.guard, RvnGuard::Missing),
                _ => assert!(matches!(m.guard, RvnGuard::Raw(_)), "{:?}", m.guard),
            }
            if *attr == "fencing_token" {
                assert_eq!(m.fencing_token, None);
            } else {
                assert_eq!(m.fencing_token, Some(41), "bad `{attr}`");
            }
            // Reading again changes nothing.
            assert_eq!(read(&store, &election).await, Record::Malformed(m));
            elections.push(election);
        }
        // The well-formed control case reads as a lease.
        let control = common::unique_name("wellformed");
        b.put_raw(&control, &good_attrs()).await;
        let l = expect_valid(read(&store, &control).await);
        assert_eq!(
            (l.rvn.as_str(), l.fencing_token, l.holder.as_deref()),
            ("raw-rvn-1", 41, Some("other-tool"))
        );

        let listed = store.list(BUDGET).await.expect("list with malformed items");
        for election in &elections {
            assert!(
                listed
                    .iter()
                    .any(|r| matches!(r, Record::Malformed(m) if &m.election == election)),
                "list() lacks malformed {election}"
            );
        }
    }

    /// A malformed item is overwritten only while its raw rvn is the one
    /// observed; the fingerprint changes whenever the item does.
    pub async fn malformed_overwrite_only_while_unchanged(b: &dyn Backend) {
        let store = b.store().await;
        let election = common::unique_name("overwrite");
        let bad_token = Some(bad_number(b, "not-a-number"));

        b.put_raw(&election, &spoiled("fencing_token", bad_token.clone()))
            .await;
        let seen = expect_malformed(read(&store, &election).await);
        // Another tool rewrites it with a different rvn.
        let mut changed = spoiled("fencing_token", bad_token.clone());
        for (name, value) in changed.iter_mut() {
            if *name == "rvn" {
                *value = RawValue::S("raw-rvn-2");
            }
        }
        b.put_raw(&election, &changed).await;
        let now = expect_malformed(read(&store, &election).await);
        assert_ne!(now.fingerprint, seen.fingerprint);
        assert_ne!(now.guard, seen.guard);
        let mine = lease(&election, "node-a", 1_000);
        assert_condition_failed(
            store
                .put(&mine, &Condition::Unchanged(seen.guard.clone()), BUDGET)
                .await,
            "overwrite of a changed malformed item",
        );
        assert_eq!(
            read(&store, &election).await,
            Record::Malformed(now.clone())
        );
        assert_applied(
            store
                .write(&mine, &Condition::Unchanged(now.guard.clone()), BUDGET)
                .await,
            "overwrite of an unchanged malformed item",
        );
        assert_eq!(expect_valid(read(&store, &election).await), mine);

        // Without an rvn: the guard is "missing", and a change of any other
        // attribute changes the fingerprint.
        let bare = common::unique_name("overwrite-bare");
        b.put_raw(&bare, &spoiled("rvn", None)).await;
        let first = expect_malformed(read(&store, &bare).await);
        assert_eq!(first.guard, RvnGuard::Missing);
        let mut later = spoiled("rvn", None);
        later.retain(|(n, _)| *n != "lease_ms");
        later.push(("lease_ms", RawValue::N(20_000)));
        b.put_raw(&bare, &later).await;
        let second = expect_malformed(read(&store, &bare).await);
        assert_ne!(second.fingerprint, first.fingerprint);
        // Someone gives it an rvn (still malformed): "missing" no longer holds.
        let mut with_rvn = later.clone();
        with_rvn.retain(|(n, _)| *n != "fencing_token");
        with_rvn.push(("rvn", RawValue::S("raw-rvn-3")));
        b.put_raw(&bare, &with_rvn).await;
        let third = expect_malformed(read(&store, &bare).await);
        let mine = lease(&bare, "node-a", 1_000);
        assert_condition_failed(
            store
                .put(&mine, &Condition::Unchanged(RvnGuard::Missing), BUDGET)
                .await,
            "overwrite conditional on a missing rvn that is now present",
        );
        assert_applied(
            store
                .put(&mine, &Condition::Unchanged(third.guard), BUDGET)
                .await,
            "overwrite with the current guard",
        );
        assert_eq!(expect_valid(read(&store, &bare).await), mine);

        // Nothing to overwrite: refused.
        let absent = common::unique_name("overwrite-absent");
        assert_condition_failed(
            store
                .put(
                    &lease(&absent, "node-a", 1),
                    &Condition::Unchanged(RvnGuard::Missing),
                    BUDGET,
                )
                .await,
            "overwrite of an absent item",
        );
        assert_eq!(read(&store, &absent).await, Record::Absent);
    }

    /// A malformed item whose rvn and holder still match is not renewed or
    /// taken over: only `Unchanged` may overwrite it.
    pub async fn renew_refuses_a_malformed_item(b: &dyn Backend) {
        let store = b.store().await;
        let election = common::unique_name("corrupt");
        b.put_raw(
            &election,
            &spoiled("fencing_token", Some(bad_number(b, "forty-one"))),
        )
        .await;
        expect_malformed(read(&store, &election).await);
        let mine = lease(&election, "other-tool", 42);
        let renew = Condition::HeldBy {
            rvn: "raw-rvn-1".into(),
            holder: "other-tool".into(),
        };
        assert_condition_failed(
            store.put(&mine, &renew, BUDGET).await,
            "renew of a malformed item",
        );
        assert_condition_failed(
            store
                .put(&mine, &Condition::RvnIs("raw-rvn-1".into()), BUDGET)
                .await,
            "take-over of a malformed item",
        );
        expect_malformed(read(&store, &election).await);
    }

    /// Many records in as few requests as the store allows, each as a
    /// single read finds it, in the order asked (a name twice, twice; a
    /// missing one absent), past the 100 of one DynamoDB request.
    pub async fn read_many_reads_each_in_order(b: &dyn Backend) {
        let store = b.store().await;
        let names: Vec<String> = (0..130)
            .map(|i| common::unique_name(&format!("many-{i}")))
            .collect();
        for (i, name) in names.iter().enumerate().step_by(2) {
            let mut held = lease(name, "h", i as u64 + 1);
            if i % 4 == 0 {
                held = held.held_through("#session/h/n1");
            }
            assert_applied(store.create(&held, BUDGET).await, "create");
        }
        let mut asked = names.clone();
        asked.push(names[0].clone());
        let many = store.read_many(&asked, BUDGET).await.expect("read_many");
        assert_eq!(many.len(), asked.len());
        for (name, got) in asked.iter().zip(&many) {
            assert_eq!(got, &read(&store, name).await, "{name}");
        }
        assert!(matches!(many[1], Record::Absent), "{:?}", many[1]);
        assert_eq!(many[0], many[130]);
    }

    /// Many writes at once (how a daemon takes a dead one's elections):
    /// each is answered by its own condition, one that fails takes
    /// nothing from the others, a malformed record is not taken by `rvn`
    /// alone; and a batch that mixes a create with takeovers is made too.
    pub async fn many_writes_each_by_its_own_condition(b: &dyn Backend) {
        let store = b.store().await;
        let name = |what: &str| common::unique_name(&format!("many-{what}"));
        let (a, stale, c, broken, absent, fresh) = (
            name("a"),
            name("stale"),
            name("c"),
            name("broken"),
            name("absent"),
            name("fresh"),
        );
        let mut held = Vec::new();
        for election in [&a, &stale, &c] {
            let l = lease(election, "h", 3);
            assert_applied(store.create(&l, BUDGET).await, "create");
            held.push(l);
        }
        b.put_raw(&broken, &spoiled("fencing_token", Some(bad_number(b, "x"))))
            .await;
        let taken = |l: &Lease| with_meta(lease(&l.election, "t", 4));
        let writes = vec![
            (taken(&held[0]), Condition::RvnIs(held[0].rvn.clone())),
            (taken(&held[1]), Condition::RvnIs("stale".into())),
            (taken(&held[2]), Condition::RvnIs(held[2].rvn.clone())),
            (lease(&broken, "t", 1), Condition::RvnIs("raw-rvn-1".into())),
            (lease(&absent, "t", 1), Condition::RvnIs("never".into())),
        ];
        let outcomes = store.write_many(&writes, BUDGET).await;
        assert_eq!(outcomes.len(), writes.len());
        let mut outcomes = outcomes.into_iter();
        let mut next = || outcomes.next().expect("one answer per write");
        assert_applied(next(), "take of a");
        match next() {
            Ok(WriteOutcome::ConditionFailed { current }) => {
                if let Some(current) = current {
                    assert_eq!(current, Record::Valid(held[1].clone()));
                }
            }
            other => panic!("take on a stale rvn: expected ConditionFailed, got {other:?}"),
        }
        assert_applied(next(), "take of c");
        assert_condition_failed(next(), "take of a malformed record by its rvn");
        assert_condition_failed(next(), "take of an absent record");
        assert_eq!(read(&store, &a).await, Record::Valid(writes[0].0.clone()));
        assert_eq!(read(&store, &stale).await, Record::Valid(held[1].clone()));
        assert_eq!(read(&store, &c).await, Record::Valid(writes[2].0.clone()));
        expect_malformed(read(&store, &broken).await);
        assert!(matches!(read(&store, &absent).await, Record::Absent));
        // A create among takeovers.
        let again = taken(&writes[0].0);
        let mixed = vec![
            (lease(&fresh, "t", 1), Condition::NotExists),
            (again.clone(), Condition::RvnIs(writes[0].0.rvn.clone())),
        ];
        let outcomes = store.write_many(&mixed, BUDGET).await;
        assert_eq!(outcomes, vec![Ok(WriteOutcome::Applied); 2]);
        assert_eq!(
            read(&store, &fresh).await,
            Record::Valid(mixed[0].0.clone())
        );
        assert_eq!(read(&store, &a).await, Record::Valid(again));
    }

    /// Two daemons take the same hundred elections at once, each in
    /// batches of its own order: every election is taken by one of them,
    /// each answer says which, and neither meets an error (no batch
    /// waits on another for ever).
    pub async fn many_writes_race_for_one_winner_each(b: &dyn Backend) {
        let setup = b.store().await;
        let names: Vec<String> = (0..100)
            .map(|i| common::unique_name(&format!("race-many-{i}")))
            .collect();
        let mut first = Vec::new();
        for name in &names {
            let l = lease(name, "dead", 1);
            assert_applied(setup.create(&l, BUDGET).await, "create");
            first.push(l);
        }
        let takes = |holder: &str, reversed: bool| {
            let mut writes: Vec<(Lease, Condition)> = first
                .iter()
                .map(|l| {
                    (
                        lease(&l.election, holder, 2),
                        Condition::RvnIs(l.rvn.clone()),
                    )
                })
                .collect();
            if reversed {
                writes.reverse();
            }
            writes
        };
        let (x, y) = (takes("x", false), takes("y", true));
        let (sx, sy) = (b.store().await, b.store().await);
        let (ax, ay) = tokio::join!(
            async {
                let mut answers = Vec::new();
                for chunk in x.chunks(25) {
                    answers.extend(sx.write_many(chunk, BUDGET).await);
                }
                answers
            },
            async {
                let mut answers = Vec::new();
                for chunk in y.chunks(25) {
                    answers.extend(sy.write_many(chunk, BUDGET).await);
                }
                answers
            }
        );
        let won = |writes: &[(Lease, Condition)],
                   answers: Vec<Result<WriteOutcome, StoreError>>| {
            writes
                .iter()
                .zip(answers)
                .map(|((l, _), answer)| match answer {
                    Ok(WriteOutcome::Applied) => (l.election.clone(), true),
                    Ok(WriteOutcome::ConditionFailed { .. }) => (l.election.clone(), false),
                    Err(e) => panic!("take of {}: {e}", l.election),
                })
                .collect::<std::collections::HashMap<_, _>>()
        };
        let (wx, wy) = (won(&x, ax), won(&y, ay));
        for name in &names {
            let holder = expect_valid(read(&setup, name).await).holder;
            match (wx[name], wy[name]) {
                (true, false) => assert_eq!(holder.as_deref(), Some("x"), "{name}"),
                (false, true) => assert_eq!(holder.as_deref(), Some("y"), "{name}"),
                both => panic!("{name}: x and y applied {both:?}"),
            }
        }
    }

    /// An item of a format this build does not know reads as such (holder
    /// and token as far as they read), and no write replaces it, whatever
    /// its condition: not even `Unchanged` with its own raw rvn. Nor is it
    /// a member. Items of formats 1, 2 and 3 are this build's.
    pub async fn unknown_format_is_never_written(b: &dyn Backend) {
        let store = b.store().await;
        let formats = if b.typed() {
            [(RawValue::N(4), "4"), (RawValue::N(-1), "-1")]
        } else {
            [(RawValue::N(4), "4"), (RawValue::S("x"), "\"x\"")]
        };
        for (format, shown) in formats {
            let election = common::unique_name("format");
            // First malformed in this format, to learn its raw rvn.
            b.put_raw(&election, &spoiled("fencing_token", None)).await;
            let guard = expect_malformed(read(&store, &election).await).guard;
            let mut later = good_attrs();
            later.push(("format", format.clone()));
            b.put_raw(&election, &later).await;
            let u = expect_unknown_format(read(&store, &election).await);
            assert_eq!(
                (u.format.as_str(), u.holder.as_deref(), u.fencing_token),
                (shown, Some("other-tool"), Some(41))
            );
            let mine = lease(&election, "other-tool", 42);
            for condition in [
                Condition::NotExists,
                Condition::RvnIs("raw-rvn-1".into()),
                Condition::HeldBy {
                    rvn: "raw-rvn-1".into(),
                    holder: "other-tool".into(),
                },
                Condition::Unchanged(guard.clone()),
            ] {
                let what = format!("{condition:?} over format {shown}");
                assert_condition_failed(store.put(&mine, &condition, BUDGET).await, &what);
            }
            assert_eq!(read(&store, &election).await, Record::UnknownFormat(u));
            let listed = store.list(BUDGET).await.expect("list");
            assert!(listed.iter().any(|r| r.key() == Some(election.as_str())));
        }
        let member = member_key(&common::unique_name("later"));
        let mut later = good_attrs();
        later.push(("format", RawValue::N(4)));
        b.put_raw(&member, &later).await;
        let members = store.members(BUDGET).await.expect("members");
        assert!(!members.iter().any(|m| m.election == member), "{members:?}");
        // Format 1, as this build writes it: renewed like any lease.
        let election = common::unique_name("format-1");
        let mut ours = good_attrs();
        ours.push(("format", RawValue::N(1)));
        b.put_raw(&election, &ours).await;
        expect_valid(read(&store, &election).await);
        let renew = Condition::HeldBy {
            rvn: "raw-rvn-1".into(),
            holder: "other-tool".into(),
        };
        let mine = lease(&election, "other-tool", 41);
        assert_applied(store.put(&mine, &renew, BUDGET).await, "renew of format 1");
        assert_eq!(expect_valid(read(&store, &election).await), mine);
        // Format 2, held through a session: this build's too.
        let election = common::unique_name("format-2");
        let mut held = good_attrs();
        held.push(("format", RawValue::N(2)));
        held.push(("session", RawValue::S("#session/other-tool/n1")));
        b.put_raw(&election, &held).await;
        let read_back = expect_valid(read(&store, &election).await);
        assert_eq!(read_back.session.as_deref(), Some("#session/other-tool/n1"));
        let mine = lease(&election, "other-tool", 42).held_through("#session/me/n2");
        let take = Condition::RvnIs("raw-rvn-1".into());
        assert_applied(
            store.put(&mine, &take, BUDGET).await,
            "take-over of format 2",
        );
        // Stored with a lease no reader that times it as a plain lease
        // ever sees run out; readers that know sessions time the session.
        let stored = Lease {
            lease_ms: leaderd::lease::HELD_THROUGH_SESSION_LEASE_MS,
            ..mine
        };
        assert_eq!(expect_valid(read(&store, &election).await), stored);
    }

    /// A missing table is its own clear error for every operation.
    pub async fn missing_table(b: &dyn Backend) {
        let store = b.store_without_table().await;
        let checked = store.check(BUDGET).await;
        assert!(
            matches!(checked, Err(StoreError::TableMissing(_))),
            "check: {checked:?}"
        );
        let read = store.read("any", BUDGET).await;
        assert!(
            matches!(read, Err(StoreError::TableMissing(_))),
            "read: {read:?}"
        );
        let created = store.create(&lease("any", "node-a", 1), BUDGET).await;
        assert!(
            matches!(created, Err(StoreError::TableMissing(_))),
            "create: {created:?}"
        );
        let listed = store.list(BUDGET).await;
        assert!(
            matches!(listed, Err(StoreError::TableMissing(_))),
            "list: {listed:?}"
        );
    }
}

/// Instantiate every contract test for one backend. `$backend` is an async
/// expression giving something that implements [`Backend`].
macro_rules! contract_tests {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn create_then_read_back() {
                contract::create_then_read_back(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn counting_lock_round_trips() {
                contract::counting_lock_round_trips(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn one_winner_per_round() {
                contract::one_winner_per_round(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn non_holder_is_refused() {
                contract::non_holder_is_refused(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn release_keeps_the_item() {
                contract::release_keeps_the_item(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn handover_records_the_successor() {
                contract::handover_records_the_successor(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn malformed_records_are_reported() {
                contract::malformed_records_are_reported(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn malformed_overwrite_only_while_unchanged() {
                contract::malformed_overwrite_only_while_unchanged(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn renew_refuses_a_malformed_item() {
                contract::renew_refuses_a_malformed_item(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn member_records_are_not_elections() {
                contract::member_records_are_not_elections(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn unknown_format_is_never_written() {
                contract::unknown_format_is_never_written(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn read_many_reads_each_in_order() {
                contract::read_many_reads_each_in_order(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn many_writes_each_by_its_own_condition() {
                contract::many_writes_each_by_its_own_condition(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn many_writes_race_for_one_winner_each() {
                contract::many_writes_race_for_one_winner_each(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn missing_table() {
                contract::missing_table(&$backend).await;
            }
        }
    };
}

// ---------------------------------------------------------------- SQLite

/// A temporary SQLite file; every `store()` is a separate `open` of it.
struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn new() -> Sqlite {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // Create the file and table once, as the first leaderd would.
        SqliteStore::open(&dir.path().join("leases.db")).expect("open a fresh SQLite store");
        Sqlite { dir }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("leases.db")
    }
}

#[async_trait]
impl Backend for Sqlite {
    async fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(SqliteStore::open(&self.path()).expect("open the SQLite store"))
    }

    async fn put_raw(&self, election: &str, attrs: &[(&str, RawValue)]) {
        use rusqlite::types::Value;
        let conn = rusqlite::Connection::open(self.path()).expect("open the file with rusqlite");
        conn.busy_timeout(BUDGET).expect("set a busy timeout");
        let mut names = vec!["election".to_owned()];
        let mut values = vec![Value::Text(election.to_owned())];
        for (name, value) in attrs {
            names.push((*name).to_owned());
            values.push(match value {
                RawValue::S(s) => Value::Text((*s).to_owned()),
                RawValue::N(n) => Value::Integer(*n),
                RawValue::B(b) => Value::Blob(b.to_vec()),
            });
        }
        let placeholders = (1..=values.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT OR REPLACE INTO leases ({}) VALUES ({placeholders})",
            names.join(", ")
        );
        conn.execute(&sql, rusqlite::params_from_iter(values))
            .expect("raw insert");
    }

    async fn store_without_table(&self) -> Arc<dyn LeaseStore> {
        // A store whose table another tool dropped after it was opened.
        let path = self.dir.path().join("dropped.db");
        let store = SqliteStore::open(&path).expect("open a second SQLite file");
        rusqlite::Connection::open(&path)
            .and_then(|c| c.execute("DROP TABLE leases", []))
            .expect("drop the table");
        Arc::new(store)
    }
}

contract_tests!(sqlite, async { Sqlite::new() }.await);

/// Many `open`s of one file racing for the same election from separate OS
/// threads, each with its own runtime: SQLite's file lock, not a shared
/// in-process lock, decides.
#[test]
fn sqlite_separate_runtimes_race_for_one_winner() {
    let backend = Sqlite::new();
    let path = backend.path();
    let election = common::unique_name("threads");
    let barrier = Arc::new(std::sync::Barrier::new(CANDIDATES));
    let handles: Vec<_> = (0..CANDIDATES)
        .map(|i| {
            let (path, election, barrier) = (path.clone(), election.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                rt.block_on(async {
                    let store = SqliteStore::open(&path).expect("open");
                    let mine = lease(&election, &format!("thread-{i}"), 1);
                    barrier.wait();
                    (mine.clone(), store.create(&mine, BUDGET).await)
                })
            })
        })
        .collect();
    let mut winners = Vec::new();
    for h in handles {
        let (mine, outcome) = h.join().expect("candidate thread panicked");
        match outcome {
            Ok(WriteOutcome::Applied) => winners.push(mine),
            Ok(WriteOutcome::ConditionFailed { current }) => {
                assert!(matches!(current, Some(Record::Valid(_))), "{current:?}");
            }
            Err(e) => panic!("a racing create failed: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let stored = rt.block_on(async {
        SqliteStore::open(&path)
            .expect("open")
            .read(&election, BUDGET)
            .await
    });
    assert_eq!(stored, Ok(Record::Valid(winners.remove(0))));
}

// -------------------------------------------------------------- DynamoDB

/// Start (once per test binary) the shared emulator off the async runtime,
/// keeping the harness's panic message if it cannot start.
async fn shared(start: fn() -> &'static Emulator) -> &'static Emulator {
    emulators::fake_aws_env();
    tokio::task::spawn_blocking(start)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

fn dynamo_config(emulator: &Emulator, table: &str) -> DynamoConfig {
    DynamoConfig {
        table: table.to_owned(),
        region: "us-east-1".into(),
        endpoint_url: Some(emulator.endpoint.clone()),
    }
}

/// One freshly created table on an emulator; every `store()` is a new client.
struct Dynamo {
    emulator: &'static Emulator,
    table: String,
}

impl Dynamo {
    async fn new(start: fn() -> &'static Emulator) -> Dynamo {
        let emulator = shared(start).await;
        let table = common::unique_name("contract");
        DynamoStore::new(&dynamo_config(emulator, &table))
            .await
            .create_table(false, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("creating table {table} on {emulator:?}: {e}"));
        Dynamo { emulator, table }
    }

    async fn dynamo_store(&self) -> DynamoStore {
        DynamoStore::new(&dynamo_config(self.emulator, &self.table)).await
    }
}

#[async_trait]
impl Backend for Dynamo {
    async fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.dynamo_store().await)
    }

    async fn put_raw(&self, election: &str, attrs: &[(&str, RawValue)]) {
        let store = self.dynamo_store().await;
        let mut item = std::collections::HashMap::new();
        item.insert(
            "election".to_owned(),
            AttributeValue::S(election.to_owned()),
        );
        for (name, value) in attrs {
            let value = match value {
                RawValue::S(s) => AttributeValue::S((*s).to_owned()),
                RawValue::N(n) => AttributeValue::N(n.to_string()),
                RawValue::B(b) => AttributeValue::B(Blob::new(*b)),
            };
            item.insert((*name).to_owned(), value);
        }
        store
            .client()
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "raw PutItem: {}",
                    aws_sdk_dynamodb::error::DisplayErrorContext(e)
                )
            });
    }

    async fn store_without_table(&self) -> Arc<dyn LeaseStore> {
        let never_created = common::unique_name("missing");
        Arc::new(DynamoStore::new(&dynamo_config(self.emulator, &never_created)).await)
    }
}

contract_tests!(
    dynamodb_local,
    Dynamo::new(emulators::shared_dynamodb_local).await
);
contract_tests!(dynalite, Dynamo::new(emulators::shared_dynalite).await);

/// A table still CREATING is its own clear error, not "missing". Tested on
/// dynalite only: it keeps new tables CREATING for a while
/// (`emulators::DYNALITE_CREATE_TABLE_MS`), while DynamoDB Local makes them
/// ACTIVE at once, so there is no CREATING window to observe there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynalite_table_still_creating() {
    let emulator = shared(emulators::shared_dynalite).await;
    let table = common::unique_name("creating");
    let store = DynamoStore::new(&dynamo_config(emulator, &table)).await;
    store
        .client()
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("election")
                .key_type(KeyType::Hash)
                .build()
                .expect("name and key type are set"),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("election")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("name and type are set"),
        )
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "CreateTable: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        });

    let checked = store.check(BUDGET).await;
    assert!(
        matches!(&checked, Err(StoreError::TableNotActive { status, .. }) if status == "CREATING"),
        "check right after CreateTable: {checked:?}"
    );
    let read = store.read("any", BUDGET).await;
    assert!(
        matches!(&read, Err(StoreError::TableNotActive { .. })),
        "read right after CreateTable: {read:?}"
    );

    // Once ACTIVE, the same store works.
    store
        .create_table(false, Duration::from_secs(60))
        .await
        .expect("wait until ACTIVE");
    store.check(BUDGET).await.expect("check once ACTIVE");
    assert_eq!(store.read("any", BUDGET).await, Ok(Record::Absent));
}

/// After the server restarts with no data, the same store (same endpoint,
/// same client) reports the table missing instead of failing obscurely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulator_restart_loses_the_table() {
    emulators::fake_aws_env();
    let mut emulator = tokio::task::spawn_blocking(emulators::dynalite)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let table = common::unique_name("restart");
    let store = DynamoStore::new(&dynamo_config(&emulator, &table)).await;
    store
        .create_table(false, Duration::from_secs(60))
        .await
        .expect("create the table");
    let held = lease("restart", "node-a", 3);
    assert_eq!(store.create(&held, BUDGET).await, Ok(WriteOutcome::Applied));

    let port = emulator.port;
    let emulator = tokio::task::spawn_blocking(move || {
        emulator.restart();
        emulator
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    assert_eq!(emulator.port, port, "restart keeps the port");

    let checked = store.check(BUDGET).await;
    assert!(
        matches!(checked, Err(StoreError::TableMissing(_))),
        "check after restart: {checked:?}\n{}",
        emulator.log()
    );
    let read = store.read("restart", BUDGET).await;
    assert!(
        matches!(read, Err(StoreError::TableMissing(_))),
        "read after restart: {read:?}"
    );
}

// ------------------------------------------------------------ PostgreSQL

/// One fresh table on the shared PostgreSQL server; every `store()` has its
/// own connections, over TLS verified against the test's CA.
struct Postgres {
    server: &'static PgServer,
    table: String,
}

impl Postgres {
    async fn new() -> Postgres {
        let server = tokio::task::spawn_blocking(shared_postgres)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let table = common::unique_name("contract");
        PostgresStore::new(&server.spec(&table))
            .expect("a store")
            .create_table(BUDGET)
            .await
            .unwrap_or_else(|e| panic!("creating table {table}: {e}\n{}", server.log()));
        Postgres { server, table }
    }
}

/// A plain client of leaderd's role, as another tool would connect.
async fn raw_client(server: &PgServer) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&server.url("disable"), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting as another tool: {e}"));
    tokio::spawn(connection);
    client
}

#[async_trait]
impl Backend for Postgres {
    async fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(PostgresStore::new(&self.server.spec(&self.table)).expect("a store"))
    }

    async fn put_raw(&self, election: &str, attrs: &[(&str, RawValue)]) {
        use tokio_postgres::types::{ToSql, Type};
        let client = raw_client(self.server).await;
        let table = quoted_table(&self.table);
        let mut names = vec!["election".to_owned()];
        let mut placeholders = vec!["$1".to_owned()];
        let mut params: Vec<(Box<dyn ToSql + Sync + Send>, Type)> =
            vec![(Box::new(election.to_owned()), Type::TEXT)];
        for (name, value) in attrs {
            let n = params.len() + 1;
            names.push((*name).to_owned());
            let cast = if *name == "holder_meta" {
                "::jsonb"
            } else {
                ""
            };
            placeholders.push(format!("${n}{cast}"));
            params.push(match value {
                RawValue::S(s) => (Box::new((*s).to_owned()), Type::TEXT),
                RawValue::N(n) => (Box::new(*n), Type::INT8),
                RawValue::B(_) => panic!("a typed column takes no bytes (see Backend::typed)"),
            });
        }
        let key = election.to_owned();
        client
            .execute_typed(
                &format!("DELETE FROM {table} WHERE election = $1"),
                &[(&key, Type::TEXT)],
            )
            .await
            .expect("raw delete");
        let params: Vec<(&(dyn ToSql + Sync), Type)> = params
            .iter()
            .map(|(v, t)| (&**v as &(dyn ToSql + Sync), t.clone()))
            .collect();
        client
            .execute_typed(
                &format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    names.join(", "),
                    placeholders.join(", ")
                ),
                &params,
            )
            .await
            .unwrap_or_else(|e| panic!("raw insert: {e:?}"));
    }

    async fn store_without_table(&self) -> Arc<dyn LeaseStore> {
        let never_created = common::unique_name("missing");
        Arc::new(PostgresStore::new(&self.server.spec(&never_created)).expect("a store"))
    }

    fn typed(&self) -> bool {
        true
    }
}

contract_tests!(postgres, Postgres::new().await);
