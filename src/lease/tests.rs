//! Unit tests of what every store does alike: the read-back of a later
//! format's record, and `leaderd check`'s scratch records.

use super::*;

fn valid(rvn: &str, holder: Option<&str>) -> Record {
    Record::Valid(Lease {
        election: "e".into(),
        holder: holder.map(Into::into),
        rvn: rvn.into(),
        fencing_token: 7,
        lease_ms: 10_000,
        acquired_at_ms: 0,
        renewed_at_ms: 0,
        expires_at_s: 0,
        holder_meta: None,
        successor: None,
        session: None,
    })
}

fn unknown_format() -> Record {
    Record::UnknownFormat(UnknownFormat {
        election: "e".into(),
        format: "3".into(),
        holder: Some("me".into()),
        fencing_token: Some(7),
        fingerprint: "f".into(),
    })
}

#[tokio::test]
async fn a_read_back_that_finds_an_unknown_format_is_a_failed_condition() {
    let store = memory::MemoryStore::new();
    store.set("e", unknown_format());
    // The write's answer is lost: only the read-back can tell.
    store.set_fault(memory::Fault::TimeOutWrites);
    let Record::Valid(mine) = valid("r1", Some("me")) else {
        unreachable!()
    };
    let renew = Condition::HeldBy {
        rvn: "r1".into(),
        holder: "me".into(),
    };
    assert_eq!(
        store
            .write(&mine.renewed(), &renew, Duration::from_secs(1))
            .await,
        Ok(WriteOutcome::ConditionFailed {
            current: Some(unknown_format())
        })
    );
    assert_eq!(store.get("e"), unknown_format());
}

/// `leaderd check`'s scratch records: listed by no one (`status`),
/// members of nothing, and the only records any store deletes, on the
/// condition of their `rvn`.
#[tokio::test]
async fn scratch_records_are_listed_by_no_one_and_only_they_are_deleted() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = sqlite::SqliteStore::open(&dir.path().join("leases.db")).expect("open");
    let memory = memory::MemoryStore::new();
    let budget = Duration::from_secs(5);
    for store in [&sqlite as &dyn LeaseStore, &memory] {
        let kind = store.kind();
        let election = Lease::stamped("web", "other", 7, 10_000, 1, None);
        let key = check_key("me", "n1");
        let scratch = Lease::stamped(&key, "me", 1, 60_000, 1, None);
        for lease in [&election, &scratch] {
            let written = store.put(lease, &Condition::NotExists, budget).await;
            assert_eq!(written, Ok(WriteOutcome::Applied), "{kind}");
        }
        let listed: Vec<String> = store
            .list(budget)
            .await
            .expect("list")
            .iter()
            .filter_map(|r| r.key().map(str::to_owned))
            .collect();
        assert_eq!(listed, ["web"], "{kind}");
        assert_eq!(store.members(budget).await, Ok(vec![]), "{kind}");

        // Another rvn: kept.
        let other = store.delete_check_record(&key, "not-its-rvn", budget).await;
        assert!(
            matches!(other, Ok(WriteOutcome::ConditionFailed { .. })),
            "{kind}: {other:?}"
        );
        assert!(
            matches!(store.read(&key, budget).await, Ok(Record::Valid(_))),
            "{kind}"
        );
        // An election's key: refused, whatever the rvn.
        let refused = store
            .delete_check_record("web", &election.rvn, budget)
            .await;
        assert!(
            matches!(&refused, Err(StoreError::Other(m)) if m.contains("refused")),
            "{kind}: {refused:?}"
        );
        assert_eq!(
            store.read("web", budget).await,
            Ok(Record::Valid(election.clone())),
            "{kind}"
        );
        // Its own rvn: deleted.
        let deleted = store.delete_check_record(&key, &scratch.rvn, budget).await;
        assert_eq!(deleted, Ok(WriteOutcome::Applied), "{kind}");
        assert_eq!(store.read(&key, budget).await, Ok(Record::Absent), "{kind}");
    }
}
