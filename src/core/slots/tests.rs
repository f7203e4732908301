use super::*;
use crate::core::record::{FORMAT, Malformed, RvnGuard, UnknownFormat};

const D: f64 = 0.01;

fn t(ms: u64) -> Instant {
    Instant::from_since_origin(Duration::from_secs(100) + Duration::from_millis(ms))
}

fn stamp(rvn: &str, unix_ms: u64) -> Stamp {
    Stamp::new(rvn, unix_ms)
}

/// A taker's write, and the record it leaves once applied.
fn taken(v: Verdict) -> (Lease, Condition, Vec<SlotHolder>) {
    match v {
        Verdict::Take {
            lease,
            condition,
            evicted,
        } => (lease, condition, evicted),
        other => panic!("expected a take, got {other:?}"),
    }
}

fn table(lease: &Lease) -> Slots {
    Slots::of(lease)
        .expect("a counting lock")
        .expect("readable")
}

/// A counting lock of `limit` slots that `who` took in turn, 1 s apart.
fn lock_of(limit: u32, who: &[&str]) -> Lease {
    let mut record = Record::Absent;
    for (i, me) in who.iter().enumerate() {
        let mut watch = SlotWatch::new(D);
        let s = stamp(&format!("r{i}"), 1_000_000 + i as u64 * 1000);
        let v = watch.acquire("ci", &record, me, limit, 10_000, t(0), &s);
        record = Record::Valid(taken(v).0);
    }
    match record {
        Record::Valid(l) => l,
        _ => unreachable!(),
    }
}

#[test]
fn a_table_round_trips_any_identity_and_rejects_what_it_never_wrote() {
    let slots = Slots {
        limit: 3,
        holders: vec![
            SlotHolder {
                holder: "ci runner 7.a".into(),
                fencing_token: 4,
                marker: "ab12".into(),
                lease_ms: 900_000,
                acquired_at_ms: 1,
                renewed_at_ms: 2,
            },
            SlotHolder {
                holder: "zürich/9".into(),
                fencing_token: 9,
                marker: "cd34".into(),
                lease_ms: 10,
                acquired_at_ms: 3,
                renewed_at_ms: 4,
            },
        ],
    };
    assert_eq!(Slots::parse(&slots.encode()), Ok(slots.clone()));
    assert_eq!(
        Slots::parse("2"),
        Ok(Slots {
            limit: 2,
            holders: Vec::new()
        })
    );
    for bad in [
        "",
        "0",
        "501",
        "x",
        "-1",
        "1 4.ab.1.1.1.61 5.cd.1.1.1.62",
        "3 5.ab.1.1.1.61 4.cd.1.1.1.62",
        "3 5.ab.1.1.1.61 5.cd.1.1.1.62",
        "3 5.ab.1.1.1",
        "3 5.a-b.1.1.1.61",
        "3 5..1.1.1.61",
        "3 5.ab.1.1.1.6",
        "3 5.ab.1.1.1.zz",
        "3 5.ab.1.1.1.",
        "3 5.ab.1.1.1.ff",
        "3 5.ab.x.1.1.61",
        "3 5.ab.1.1.1.61.0",
        "3  5.ab.1.1.1.61",
    ] {
        assert!(Slots::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_largest_table_fits_every_store() {
    let identity = "x".repeat(255);
    let slots = Slots {
        limit: MAX_SLOTS,
        holders: (0..u64::from(MAX_SLOTS))
            .map(|i| SlotHolder {
                holder: identity.clone(),
                fencing_token: u64::MAX - 1000 + i,
                marker: "f".repeat(32),
                lease_ms: 86_400_000,
                acquired_at_ms: 99_999_999_999_999,
                renewed_at_ms: 99_999_999_999_999,
            })
            .collect(),
    };
    let encoded = slots.encode();
    // DynamoDB's item limit is 400 KB, the record's other attributes a
    // few hundred bytes more.
    assert!(encoded.len() < 390_000, "{} bytes", encoded.len());
    assert_eq!(Slots::parse(&encoded), Ok(slots));
}

#[test]
fn a_new_lock_takes_a_first_slot_with_a_token_no_deleted_record_gave() {
    let mut watch = SlotWatch::new(D);
    let s = stamp("r1", 1_700_000_000_000);
    let (lease, condition, evicted) =
        taken(watch.acquire("ci", &Record::Absent, "a", 3, 10_000, t(0), &s));
    assert_eq!(condition, Condition::NotExists);
    assert!(evicted.is_empty());
    assert_eq!(lease.election, "ci");
    assert_eq!(lease.holder.as_deref(), Some("a"));
    assert_eq!(lease.fencing_token, 1_700_000_000_000);
    assert_eq!(lease.format(), FORMAT_SLOTS);
    let slots = table(&lease);
    assert_eq!(slots.limit, 3);
    assert_eq!(
        slots.find(1_700_000_000_000, "r1", "a"),
        slots.holders.first()
    );
}

#[test]
fn tokens_rise_across_slots_and_the_record_reads_as_one_held_lease() {
    let lease = lock_of(3, &["a", "b", "c"]);
    let slots = table(&lease);
    let tokens: Vec<u64> = slots.holders.iter().map(|h| h.fencing_token).collect();
    let first = tokens[0];
    assert_eq!(tokens, [first, first + 1, first + 2]);
    assert_eq!(lease.fencing_token, first + 2);
    // The newest holder, the longest lease, the last expiry.
    assert_eq!(lease.holder.as_deref(), Some("c"));
    assert_eq!(lease.lease_ms, 10_000);
    assert_eq!(lease.expires_at_s, (1_002_000 + 10_000_u64).div_ceil(1000));
}

#[test]
fn a_full_lock_is_waited_on_until_a_silent_holder_is_due_and_then_evicted() {
    let lease = lock_of(2, &["a", "b"]);
    let record = Record::Valid(lease.clone());
    let mut watch = SlotWatch::new(D);
    let s = stamp("w1", 2_000_000);
    let full = watch.acquire("ci", &record, "w", 2, 5_000, t(0), &s);
    assert_eq!(
        full,
        Verdict::Wait {
            until: t(10_100),
            blocked: Blocked::Full(table(&lease)),
        }
    );
    // Just before: still full.
    assert!(matches!(
        watch.acquire("ci", &record, "w", 2, 5_000, t(10_099), &s),
        Verdict::Wait { .. }
    ));
    // `b` renewed meanwhile (another marker): only `a` is due.
    let b = table(&lease).holders[1].clone();
    let (renewed, cond) = renew(
        &record,
        2,
        b.fencing_token,
        &b.marker,
        "b",
        10_000,
        &stamp("rb", 1_005_000),
    )
    .expect("b's slot");
    assert_eq!(cond, Condition::RvnIs(lease.rvn.clone()));
    let record = Record::Valid(renewed);
    let (next, cond, evicted) = taken(watch.acquire("ci", &record, "w", 2, 5_000, t(10_100), &s));
    assert_eq!(cond, Condition::RvnIs(record_rvn(&record)));
    assert_eq!(evicted.len(), 1);
    assert_eq!(evicted[0].holder, "a");
    let slots = table(&next);
    let who: Vec<&str> = slots.holders.iter().map(|h| h.holder.as_str()).collect();
    assert_eq!(who, ["b", "w"]);
    assert_eq!(slots.holders[1].fencing_token, lease.fencing_token + 1);
    assert_eq!(next.fencing_token, lease.fencing_token + 1);
}

fn record_rvn(record: &Record) -> String {
    match record {
        Record::Valid(l) => l.rvn.clone(),
        _ => unreachable!(),
    }
}

#[test]
fn a_holder_is_timed_from_when_this_waiter_first_saw_its_marker() {
    let lease = lock_of(1, &["a"]);
    let mut watch = SlotWatch::new(D);
    let s = stamp("w1", 2_000_000);
    let record = Record::Valid(lease.clone());
    // First seen late: the wait counts from then, not from its write.
    let until = |v: Verdict| match v {
        Verdict::Wait { until, .. } => until,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        until(watch.acquire("ci", &record, "w", 1, 10_000, t(50_000), &s)),
        t(60_100)
    );
    // Others' writes change the record's rvn, not this holder's timer.
    let mut other = lease.clone();
    other.rvn = "someone-else-wrote".into();
    assert_eq!(
        until(watch.acquire("ci", &Record::Valid(other), "w", 1, 10_000, t(55_000), &s)),
        t(60_100)
    );
}

#[test]
fn another_limit_or_a_plain_lock_is_a_conflict_and_a_free_plain_record_is_taken() {
    let lease = lock_of(3, &["a"]);
    let mut watch = SlotWatch::new(D);
    let s = stamp("w1", 2_000_000);
    assert_eq!(
        watch.acquire("ci", &Record::Valid(lease), "w", 4, 10_000, t(0), &s),
        Verdict::Conflict(Conflict::Limit { theirs: 3 })
    );
    let plain = Lease::stamped_with("ci", "p", 41, 10_000, 1, None, &stamp("p1", 1));
    assert_eq!(
        watch.acquire(
            "ci",
            &Record::Valid(plain.clone()),
            "w",
            3,
            10_000,
            t(0),
            &s
        ),
        Verdict::Conflict(Conflict::Plain { holder: "p".into() })
    );
    let handed = plain.handed_to_with(Some("q".into()), &stamp("p2", 2));
    assert_eq!(
        watch.acquire(
            "ci",
            &Record::Valid(handed.clone()),
            "w",
            3,
            10_000,
            t(0),
            &s
        ),
        Verdict::Conflict(Conflict::Handed {
            successor: "q".into()
        })
    );
    // Handed to us, or released: ours at once, the token above the plain
    // lock's.
    let (lease, cond, _) =
        taken(watch.acquire("ci", &Record::Valid(handed), "q", 3, 10_000, t(0), &s));
    assert_eq!(
        (lease.fencing_token, cond),
        (42, Condition::RvnIs("p2".into()))
    );
    let released = plain.handed_to_with(None, &stamp("p3", 3));
    let (lease, cond, _) =
        taken(watch.acquire("ci", &Record::Valid(released), "w", 3, 10_000, t(0), &s));
    assert_eq!(
        (lease.fencing_token, cond),
        (42, Condition::RvnIs("p3".into()))
    );
    assert_eq!(table(&lease).limit, 3);
}

#[test]
fn renew_and_release_touch_only_the_tokens_slot() {
    let lease = lock_of(3, &["a", "b"]);
    let record = Record::Valid(lease.clone());
    let a = table(&lease).holders[0].clone();
    let not_ours = |r: Result<(Lease, Condition), Refusal>| match r {
        Err(Refusal::NotOurs(why)) => why,
        other => panic!("{other:?}"),
    };
    // A stale marker, another holder's name, a token never given.
    let s = stamp("n1", 3_000_000);
    assert!(
        not_ours(renew(&record, 3, a.fencing_token, "old", "a", 1, &s)).contains("renewed since")
    );
    assert!(
        not_ours(renew(&record, 3, a.fencing_token, &a.marker, "b", 1, &s))
            .contains("renewed since")
    );
    assert!(not_ours(release(&record, 3, 7, &a.marker, "a", &s)).contains("not held any more"));
    assert_eq!(
        renew(&record, 2, a.fencing_token, &a.marker, "a", 1, &s),
        Err(Refusal::Conflict(Conflict::Limit { theirs: 3 }))
    );
    let (renewed, _) =
        renew(&record, 3, a.fencing_token, &a.marker, "a", 20_000, &s).expect("ours");
    let slots = table(&renewed);
    assert_eq!(slots.holders[0].marker, "n1");
    assert_eq!(slots.holders[0].lease_ms, 20_000);
    assert_eq!(slots.holders[1], table(&lease).holders[1]);
    assert_eq!(renewed.fencing_token, lease.fencing_token);
    assert_eq!(renewed.lease_ms, 20_000);
    // Releasing one leaves the other; releasing the last releases the
    // record (format 1, for anyone), its token counter kept.
    let record = Record::Valid(renewed);
    let (one_left, _) =
        release(&record, 3, a.fencing_token, "n1", "a", &stamp("n2", 4)).expect("ours");
    assert_eq!(table(&one_left).holders.len(), 1);
    assert_eq!(one_left.holder.as_deref(), Some("b"));
    let b = table(&one_left).holders[0].clone();
    let (none_left, cond) = release(
        &Record::Valid(one_left.clone()),
        3,
        b.fencing_token,
        &b.marker,
        "b",
        &stamp("n3", 5),
    )
    .expect("ours");
    assert_eq!(cond, Condition::RvnIs("n2".into()));
    assert_eq!(none_left.holder, None);
    assert_eq!(none_left.holder_meta, None);
    assert_eq!(none_left.format(), FORMAT);
    assert_eq!(none_left.fencing_token, lease.fencing_token);
    assert!(none_left.free_for("anyone"));
    assert!(
        not_ours(renew(
            &Record::Valid(none_left),
            3,
            b.fencing_token,
            &b.marker,
            "b",
            1,
            &s
        ))
        .contains("released")
    );
    let plain = Lease::stamped_with("ci", "p", 41, 10_000, 1, None, &stamp("p1", 1));
    assert_eq!(
        release(&Record::Valid(plain), 3, 41, "p1", "p", &s),
        Err(Refusal::Conflict(Conflict::Plain { holder: "p".into() }))
    );
}

#[test]
fn a_malformed_record_or_table_is_overwritten_only_after_it_stayed_unchanged_a_lease() {
    let mut watch = SlotWatch::new(D);
    let s = stamp("w1", 2_000_000);
    let malformed = Record::Malformed(Malformed {
        election: "ci".into(),
        problem: "attribute `rvn` is missing".into(),
        fingerprint: "f1".into(),
        fencing_token: Some(9),
        guard: RvnGuard::Missing,
    });
    assert!(matches!(
        watch.acquire("ci", &malformed, "w", 2, 10_000, t(0), &s),
        Verdict::Wait { until, blocked: Blocked::Malformed(_) } if until == t(10_100)
    ));
    let (lease, cond, _) = taken(watch.acquire("ci", &malformed, "w", 2, 10_000, t(10_100), &s));
    assert_eq!(
        (lease.fencing_token, cond),
        (10, Condition::Unchanged(RvnGuard::Missing))
    );
    // A table this build cannot read: timed by the record's rvn and lease.
    let mut garbled = lock_of(2, &["a"]);
    garbled.holder_meta = Some(HolderMeta {
        slots: Some("2 garbage".into()),
        ..HolderMeta::default()
    });
    let record = Record::Valid(garbled.clone());
    assert!(matches!(
        watch.acquire("ci", &record, "w", 2, 1_000, t(20_000), &s),
        Verdict::Wait { until, blocked: Blocked::Malformed(_) } if until == t(30_100)
    ));
    let (lease, cond, _) = taken(watch.acquire("ci", &record, "w", 2, 1_000, t(30_100), &s));
    assert_eq!(cond, Condition::RvnIs(garbled.rvn.clone()));
    assert_eq!(lease.fencing_token, garbled.fencing_token + 1);
    // A later format: waited on for ever.
    let later = Record::UnknownFormat(UnknownFormat {
        election: "ci".into(),
        format: "4".into(),
        holder: None,
        fencing_token: None,
        fingerprint: "f2".into(),
    });
    for at in [t(0), t(1_000_000)] {
        assert!(matches!(
            watch.acquire("ci", &later, "w", 2, 1_000, at, &s),
            Verdict::Wait {
                blocked: Blocked::UnknownFormat(_),
                ..
            }
        ));
    }
}
