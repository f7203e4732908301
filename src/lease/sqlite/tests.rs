//! Unit tests of the SQLite store.
use super::lanes::{READERS, WRITERS};
use super::row::Raw;
use super::*;
use crate::lease::{RvnGuard, UnknownFormat};

fn row(values: [Raw; 12]) -> Row {
    Row(values)
}

/// The index of the `format` column.
const FORMAT_COLUMN: usize = 10;

fn good() -> [Raw; 12] {
    [
        Raw::Text(b"e".to_vec()),
        Raw::Text(b"me".to_vec()),
        Raw::Text(b"r1".to_vec()),
        Raw::Integer(7),
        Raw::Integer(10_000),
        Raw::Integer(1),
        Raw::Integer(2),
        Raw::Integer(3),
        Raw::Null,
        Raw::Null,
        Raw::Integer(1),
        Raw::Null,
    ]
}

#[test]
fn a_well_formed_row_is_a_lease() {
    let Record::Valid(l) = row(good()).to_record() else {
        panic!("expected a valid lease");
    };
    assert_eq!(l.rvn, "r1");
    assert_eq!(l.fencing_token, 7);
    assert_eq!(l.holder.as_deref(), Some("me"));
}

#[test]
fn format_one_or_none_is_a_lease_and_any_other_is_unknown() {
    let mut old = good();
    old[FORMAT_COLUMN] = Raw::Null;
    assert_eq!(row(old).to_record(), row(good()).to_record());
    let unknown = |format: Raw| {
        let mut values = good();
        values[FORMAT_COLUMN] = format;
        // Even a row that is malformed by this format's layout.
        values[2] = Raw::Null;
        match row(values).to_record() {
            Record::UnknownFormat(u) => u,
            other => panic!("expected an unknown format, got {other:?}"),
        }
    };
    let u = unknown(Raw::Integer(4));
    assert_eq!(
        (u.election.as_str(), u.format.as_str()),
        ("e", "4"),
        "{u:?}"
    );
    assert_eq!(
        (u.holder.as_deref(), u.fencing_token),
        (Some("me"), Some(7))
    );
    assert_eq!(unknown(Raw::Text(b"x".to_vec())).format, "\"x\"");
    assert_eq!(unknown(Raw::Text(b"1".to_vec())).format, "\"1\"");
    assert_eq!(unknown(Raw::Real(1.5)).format, "1.5");
    assert_eq!(unknown(Raw::Integer(-1)).format, "-1");
    // The fingerprint follows every column.
    let mut later = good();
    later[FORMAT_COLUMN] = Raw::Integer(4);
    let mut renewed = later.clone();
    renewed[2] = Raw::Text(b"r2".to_vec());
    let fingerprint = |v: [Raw; 12]| match row(v).to_record() {
        Record::UnknownFormat(UnknownFormat { fingerprint, .. }) => fingerprint,
        other => panic!("expected an unknown format, got {other:?}"),
    };
    assert_ne!(fingerprint(later), fingerprint(renewed));
}

#[test]
fn every_bad_column_is_named_and_nothing_panics() {
    let cases: [(usize, Raw, &str); 9] = [
        (9, Raw::Integer(3), "`successor` has type integer"),
        (2, Raw::Null, "`rvn` is missing"),
        (2, Raw::Integer(5), "`rvn` has type integer"),
        (
            3,
            Raw::Text(b"abc".to_vec()),
            "`fencing_token` is not a whole number",
        ),
        (3, Raw::Integer(-1), "`fencing_token` is negative"),
        (4, Raw::Real(1.5), "`lease_ms` is not a whole number"),
        (1, Raw::Blob(vec![0xff]), "`holder` has type blob"),
        (8, Raw::Text(b"{not json".to_vec()), "`holder_meta`"),
        (
            1,
            Raw::Text(vec![0xff, 0xfe]),
            "`holder` is not valid UTF-8",
        ),
    ];
    for (i, bad, expected) in cases {
        let mut values = good();
        values[i] = bad.clone();
        let Record::Malformed(m) = row(values).to_record() else {
            panic!("{bad:?} in column {i} must be malformed");
        };
        assert!(m.problem.contains(expected), "{} vs {expected}", m.problem);
    }
}

#[test]
fn guard_and_fingerprint_follow_the_raw_values() {
    let mut a = good();
    a[3] = Raw::Text(b"x".to_vec());
    let mut b = a.clone();
    b[5] = Raw::Integer(99);
    let (Record::Malformed(ma), Record::Malformed(mb)) =
        (row(a.clone()).to_record(), row(b).to_record())
    else {
        panic!("both rows are malformed");
    };
    assert_ne!(ma.fingerprint, mb.fingerprint);
    assert_eq!(ma.guard, RvnGuard::Raw("text:r1".into()));
    assert_eq!(ma.fencing_token, None);
    let Record::Malformed(again) = row(a.clone()).to_record() else {
        panic!("same row, same answer");
    };
    assert_eq!(again.fingerprint, ma.fingerprint);
    // Text "5" and integer 5 are different raw values.
    let mut t = a.clone();
    t[2] = Raw::Text(b"5".to_vec());
    let mut i = a;
    i[2] = Raw::Integer(5);
    assert_ne!(row(t).guard(), row(i).guard());
}

#[test]
fn conditions_match_the_memory_store() {
    let valid = row(good());
    let mut bad = good();
    bad[2] = Raw::Null;
    let missing_rvn = row(bad);
    let held = Condition::HeldBy {
        rvn: "r1".into(),
        holder: "me".into(),
    };
    assert!(holds(None, &Condition::NotExists));
    assert!(!holds(Some(&valid), &Condition::NotExists));
    assert!(holds(Some(&valid), &Condition::RvnIs("r1".into())));
    assert!(!holds(Some(&valid), &Condition::RvnIs("r2".into())));
    assert!(holds(Some(&valid), &held));
    assert!(!holds(
        Some(&valid),
        &Condition::HeldBy {
            rvn: "r1".into(),
            holder: "you".into()
        }
    ));
    assert!(!holds(None, &held));
    assert!(!holds(Some(&missing_rvn), &Condition::RvnIs(String::new())));
    assert!(holds(
        Some(&missing_rvn),
        &Condition::Unchanged(RvnGuard::Missing)
    ));
    assert!(!holds(None, &Condition::Unchanged(RvnGuard::Missing)));
    assert!(!holds(
        Some(&valid),
        &Condition::Unchanged(RvnGuard::Missing)
    ));
    assert!(holds(
        Some(&valid),
        &Condition::Unchanged(RvnGuard::Raw("text:r1".into()))
    ));
    // A row of another format: no condition, not even its own raw rvn.
    let mut later = good();
    later[FORMAT_COLUMN] = Raw::Integer(4);
    let later = row(later);
    for condition in [
        Condition::NotExists,
        Condition::RvnIs("r1".into()),
        held,
        Condition::Unchanged(later.guard()),
    ] {
        assert!(!holds(Some(&later), &condition), "{condition:?}");
    }
}

fn sample(election: &str) -> Lease {
    Lease {
        election: election.into(),
        holder: Some("me".into()),
        rvn: crate::lease::new_rvn(),
        fencing_token: 1,
        lease_ms: 10_000,
        acquired_at_ms: 1,
        renewed_at_ms: 1,
        expires_at_s: 1,
        holder_meta: None,
        successor: None,
        session: None,
    }
}

/// A store on a new file, and a second connection (as another process
/// would) holding the file's write lock.
fn store_and_locker() -> (tempfile::TempDir, SqliteStore, Connection) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let store = SqliteStore::open(&path).expect("open");
    let other = Connection::open(&path).expect("second connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    (dir, store, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_is_a_timeout_within_the_budget() {
    let (_dir, store, other) = store_and_locker();

    let budget = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let res = store.put(&sample("e"), &Condition::NotExists, budget).await;
    assert_eq!(res, Err(StoreError::Timeout(budget)));
    // Generous: only "bounded", not "punctual", on a busy machine.
    assert!(started.elapsed() < Duration::from_secs(10));
    // WAL: readers are not blocked by the writer.
    assert_eq!(store.read("e", budget).await, Ok(Record::Absent));

    other.execute_batch("ROLLBACK").expect("release the lock");
    let lease = sample("e");
    assert_eq!(
        store
            .put(&lease, &Condition::NotExists, Duration::from_secs(10))
            .await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(
        store.read("e", Duration::from_secs(10)).await,
        Ok(Record::Valid(lease))
    );
    assert_eq!(
        store.read("e", Duration::ZERO).await,
        Err(StoreError::Timeout(Duration::ZERO))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_another_process_lock_then_applies() {
    let (_dir, store, other) = store_and_locker();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .put(&sample("e"), &Condition::NotExists, Duration::from_secs(30))
                .await
        })
    };
    // The busy handler keeps retrying while the lock is held...
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the write gave up while waiting");
    other.execute_batch("ROLLBACK").expect("release the lock");
    // ...and takes it once released.
    let res = writer.await.expect("the write task ran");
    assert_eq!(res, Ok(WriteOutcome::Applied));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_a_fixed_set_of_connections() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let store = SqliteStore::open(&path).expect("open");
    let budget = Duration::from_secs(60);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let store = store.clone();
        tasks.spawn(async move {
            let name = format!("e{}", i % 20);
            if i % 3 == 0 {
                // Only one per election can win; the rest fail the condition.
                store
                    .put(&sample(&name), &Condition::NotExists, budget)
                    .await
                    .map(|_| ())
            } else {
                store.read(&name, budget).await.map(|_| ())
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        assert_eq!(res.expect("the request task ran"), Ok(()));
    }
    assert_eq!(store.list(budget).await.map(|l| l.len()), Ok(20));
    // Every connection is back and none beyond the lanes' sizes was opened.
    assert_eq!(store.inner.lanes.idle(LaneKind::Write), WRITERS);
    let readers = store.inner.lanes.idle(LaneKind::Read);
    assert!(
        (1..=READERS).contains(&readers),
        "{readers} reader connections"
    );
}

#[test]
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("no-such-dir").join("l.db");
    match SqliteStore::open(&path) {
        Err(StoreError::Other(msg)) => {
            assert!(msg.contains(&path.display().to_string()), "{msg}")
        }
        other => panic!("expected an error naming the path, got {other:?}"),
    }
}

#[test]
fn open_waits_for_another_process_that_holds_the_file() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let other = Connection::open(&path).expect("another process's connection");
    other
        .execute_batch("BEGIN EXCLUSIVE")
        .expect("hold the file's lock");
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.execute_batch("COMMIT").expect("let go");
    });
    let store = SqliteStore::open(&path).expect("open waits for the lock");
    holder.join().expect("the holder ran");
    assert_eq!(store.path(), path);
}

#[test]
fn reading_a_missing_file_names_it_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("missing.db");
    match SqliteStore::open_read_only(&path) {
        Err(StoreError::Other(msg)) => {
            assert!(msg.contains(&path.display().to_string()), "{msg}")
        }
        other => panic!("expected an error naming the path, got {other:?}"),
    }
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_file_is_noticed_and_what_the_path_names_now_is_used() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let store = SqliteStore::open(&path).expect("open");
    let mut changes = store.changes().expect("SQLite tells of replacements");
    let budget = Duration::from_secs(10);
    let mine = sample("e");
    assert_eq!(
        store.put(&mine, &Condition::NotExists, budget).await,
        Ok(WriteOutcome::Applied)
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    // The directory watch tells at once, before any request.
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the deletion is noticed within seconds")
        .expect("the store lives");
    // A renew of the lease held in the deleted file fails its condition:
    // the path now names a new, empty file.
    let mut renewed = mine.clone();
    renewed.rvn = crate::lease::new_rvn();
    let held = Condition::HeldBy {
        rvn: mine.rvn.clone(),
        holder: "me".into(),
    };
    assert_eq!(
        store.put(&renewed, &held, budget).await,
        Ok(WriteOutcome::ConditionFailed {
            current: Some(Record::Absent)
        })
    );
    assert!(path.exists(), "opened anew at the same path");
    assert_eq!(store.read("e", budget).await, Ok(Record::Absent));
}

#[tokio::test]
async fn check_reports_a_foreign_table() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    Connection::open(&path)
        .and_then(|c| c.execute_batch("CREATE TABLE leases (election TEXT, owner TEXT)"))
        .expect("a table of another tool");
    let store = SqliteStore::open(&path).expect("open keeps the existing table");
    let res = store.check(Duration::from_secs(10)).await;
    match res {
        Err(StoreError::WrongSchema { detail, .. }) => {
            assert!(detail.contains("rvn"), "{detail}")
        }
        other => panic!("expected WrongSchema, got {other:?}"),
    }
}

/// The `leases` table as the first release made it, without `successor`.
const FIRST_SCHEMA: &str = "CREATE TABLE leases (election TEXT PRIMARY KEY NOT NULL, \
     holder TEXT, rvn TEXT, fencing_token INTEGER, lease_ms INTEGER, acquired_at INTEGER, \
     renewed_at INTEGER, expires_at INTEGER, holder_meta TEXT); \
     INSERT INTO leases VALUES ('e', 'me', 'r1', 7, 10000, 1, 2, 3, NULL)";

#[tokio::test]
async fn an_older_file_is_read_as_it_is_and_gains_the_new_column_when_run_opens_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    Connection::open(&path)
        .and_then(|c| c.execute_batch(FIRST_SCHEMA))
        .expect("a file of the first release");
    let budget = Duration::from_secs(10);
    // `leaderd status` reads it and changes nothing.
    let reader = SqliteStore::open_read_only(&path).expect("open to read");
    let Ok(Record::Valid(l)) = reader.read("e", budget).await else {
        panic!("the old row reads as a lease");
    };
    assert_eq!((l.fencing_token, l.successor.as_deref()), (7, None));
    assert_eq!(reader.list(budget).await.map(|v| v.len()), Ok(1));
    assert_eq!(reader.check(budget).await, Ok(()));
    let columns = |path: &std::path::Path| {
        Connection::open(path)
            .and_then(|c| {
                c.prepare("SELECT name FROM pragma_table_info('leases')")?
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .expect("the schema")
    };
    assert!(!columns(&path).contains(&"successor".to_owned()));
    // `leaderd run` adds the columns, keeping the row.
    let store = SqliteStore::open(&path).expect("open to run");
    assert!(columns(&path).contains(&"successor".to_owned()));
    assert!(columns(&path).contains(&"format".to_owned()));
    let Ok(Record::Valid(kept)) = store.read("e", budget).await else {
        panic!("the row is kept");
    };
    assert_eq!(kept, l);
    let handed = kept.handed_to(Some("you".into()));
    let held = Condition::HeldBy {
        rvn: "r1".into(),
        holder: "me".into(),
    };
    assert_eq!(
        store.put(&handed, &held, budget).await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(store.read("e", budget).await, Ok(Record::Valid(handed)));
    // Opening it again (another instance) finds the column there.
    SqliteStore::open(&path).expect("open again");
}

/// The `format` column of `election`'s row as SQLite stored it.
fn stored_format(path: &std::path::Path, election: &str) -> rusqlite::types::Value {
    Connection::open(path)
        .and_then(|c| {
            c.query_row(
                "SELECT format FROM leases WHERE election = ?1",
                [election],
                |r| r.get(0),
            )
        })
        .expect("the row's format")
}

#[tokio::test]
async fn every_write_stores_format_1_and_a_later_format_is_never_replaced() {
    use rusqlite::types::Value;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let store = SqliteStore::open(&path).expect("open");
    let budget = Duration::from_secs(10);
    let mine = sample("e");
    assert_eq!(
        store.put(&mine, &Condition::NotExists, budget).await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(stored_format(&path, "e"), Value::Integer(1));
    // A later release rewrites it in its own format, keeping our rvn.
    Connection::open(&path)
        .and_then(|c| c.execute("UPDATE leases SET format = 4 WHERE election = 'e'", []))
        .expect("a later release's write");
    let Ok(Record::UnknownFormat(u)) = store.read("e", budget).await else {
        panic!("format 4 reads as an unknown format");
    };
    assert_eq!((u.format.as_str(), u.holder.as_deref()), ("4", Some("me")));
    // The raw rvn is still the one we wrote: only the format says no.
    let raw_rvn = RvnGuard::Raw(format!("text:{}", mine.rvn));
    for condition in [
        Condition::NotExists,
        Condition::RvnIs(mine.rvn.clone()),
        Condition::HeldBy {
            rvn: mine.rvn.clone(),
            holder: "me".into(),
        },
        Condition::Unchanged(raw_rvn),
    ] {
        let res = store.write(&mine.renewed(), &condition, budget).await;
        assert_eq!(
            res,
            Ok(WriteOutcome::ConditionFailed {
                current: Some(Record::UnknownFormat(u.clone()))
            }),
            "{condition:?}"
        );
    }
    assert_eq!(stored_format(&path, "e"), Value::Integer(4));
    assert_eq!(store.read("e", budget).await, Ok(Record::UnknownFormat(u)));
}

/// The `leases` table as the releases before `format` made it.
const SECOND_SCHEMA: &str = "CREATE TABLE leases (election TEXT PRIMARY KEY NOT NULL, \
     holder TEXT, rvn TEXT, fencing_token INTEGER, lease_ms INTEGER, acquired_at INTEGER, \
     renewed_at INTEGER, expires_at INTEGER, holder_meta TEXT, successor TEXT); \
     INSERT INTO leases VALUES ('e', 'me', 'r1', 7, 10000, 1, 2, 3, NULL, NULL)";

#[tokio::test]
async fn a_file_without_format_reads_as_format_1_and_gains_an_integer_column() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    Connection::open(&path)
        .and_then(|c| c.execute_batch(SECOND_SCHEMA))
        .expect("a file of an earlier release");
    let budget = Duration::from_secs(10);
    let reader = SqliteStore::open_read_only(&path).expect("open to read");
    let Ok(Record::Valid(l)) = reader.read("e", budget).await else {
        panic!("the old row reads as a lease of format 1");
    };
    assert_eq!(
        reader.list(budget).await,
        Ok(vec![Record::Valid(l.clone())])
    );
    let format_type = |path: &std::path::Path| {
        Connection::open(path)
            .and_then(|c| {
                c.query_row(
                    "SELECT type FROM pragma_table_info('leases') WHERE name = 'format'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
            })
            .expect("the schema")
    };
    assert_eq!(format_type(&path), None, "reading changes nothing");
    let store = SqliteStore::open(&path).expect("open to run");
    assert_eq!(format_type(&path).as_deref(), Some("INTEGER"));
    assert_eq!(store.read("e", budget).await, Ok(Record::Valid(l.clone())));
    assert_eq!(stored_format(&path, "e"), rusqlite::types::Value::Null);
    let renewed = l.renewed();
    let held = Condition::HeldBy {
        rvn: "r1".into(),
        holder: "me".into(),
    };
    assert_eq!(
        store.put(&renewed, &held, budget).await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(
        stored_format(&path, "e"),
        rusqlite::types::Value::Integer(1)
    );
    assert_eq!(store.read("e", budget).await, Ok(Record::Valid(renewed)));
}

#[tokio::test]
async fn a_record_held_through_a_session_is_stored_as_format_2_with_its_session() {
    use rusqlite::types::Value;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("l.db");
    let store = SqliteStore::open(&path).expect("open");
    let budget = Duration::from_secs(10);
    let held = Lease {
        session: Some("#session/me/abc".into()),
        ..sample("e")
    };
    assert_eq!(
        store.put(&held, &Condition::NotExists, budget).await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(stored_format(&path, "e"), Value::Integer(2));
    // Its own lease is stored as a hundred years (for readers that would
    // time it as a plain lease).
    let stored = Lease {
        lease_ms: crate::lease::HELD_THROUGH_SESSION_LEASE_MS,
        ..held.clone()
    };
    assert_eq!(store.read("e", budget).await, Ok(Record::Valid(stored)));
    // Renewing it as a lease of its own drops the session and the format.
    let own = Lease {
        session: None,
        ..held.renewed()
    };
    let cond = Condition::RvnIs(held.rvn.clone());
    assert_eq!(
        store.put(&own, &cond, budget).await,
        Ok(WriteOutcome::Applied)
    );
    assert_eq!(stored_format(&path, "e"), Value::Integer(1));
    assert_eq!(store.read("e", budget).await, Ok(Record::Valid(own)));
}
