//! Unit tests of the record and the rules of conditions.

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

fn malformed(guard: RvnGuard) -> Record {
    Record::Malformed(Malformed {
        election: "e".into(),
        problem: "attribute `fencing_token` is missing".into(),
        fingerprint: "f".into(),
        fencing_token: None,
        guard,
    })
}

#[test]
fn conditions_hold_as_the_rules_say() {
    let raw = |s: &str| RvnGuard::Raw(s.into());
    let held = Condition::HeldBy {
        rvn: "r1".into(),
        holder: "me".into(),
    };
    assert!(Condition::NotExists.holds(&Record::Absent, None));
    assert!(!Condition::NotExists.holds(&valid("r1", None), None));
    assert!(Condition::RvnIs("r1".into()).holds(&valid("r1", None), None));
    assert!(!Condition::RvnIs("r2".into()).holds(&valid("r1", None), None));
    assert!(held.holds(&valid("r1", Some("me")), None));
    assert!(!held.holds(&valid("r1", Some("you")), None));
    assert!(!held.holds(&valid("r1", None), None));
    // A malformed item: only `Unchanged` with its own guard.
    let bad = malformed(raw("s:r1"));
    assert!(!Condition::RvnIs("r1".into()).holds(&bad, None));
    assert!(Condition::Unchanged(raw("s:r1")).holds(&bad, None));
    assert!(!Condition::Unchanged(raw("s:r2")).holds(&bad, None));
    assert!(!Condition::Unchanged(RvnGuard::Missing).holds(&bad, None));
    assert!(Condition::Unchanged(RvnGuard::Missing).holds(&malformed(RvnGuard::Missing), None));
    assert!(!Condition::Unchanged(RvnGuard::Missing).holds(&Record::Absent, None));
    // `Unchanged` on a valid item: by its raw rvn, when the store knows it.
    let ok = valid("r1", Some("me"));
    assert!(Condition::Unchanged(raw("s:r1")).holds(&ok, Some(&raw("s:r1"))));
    assert!(!Condition::Unchanged(raw("s:r1")).holds(&ok, Some(&raw("s:r2"))));
    assert!(!Condition::Unchanged(raw("s:r1")).holds(&ok, None));
    assert!(!Condition::Unchanged(RvnGuard::Missing).holds(&ok, Some(&raw("s:r1"))));
    // An item of an unknown format: nothing holds, not even `Unchanged`
    // with its very raw rvn.
    let later = unknown_format();
    for condition in [
        Condition::NotExists,
        Condition::RvnIs("r1".into()),
        held,
        Condition::Unchanged(raw("s:r1")),
        Condition::Unchanged(RvnGuard::Missing),
        Condition::HolderIs("me".into()),
    ] {
        for raw_rvn in [None, Some(raw("s:r1")), Some(RvnGuard::Missing)] {
            assert!(
                !condition.holds(&later, raw_rvn.as_ref()),
                "{condition:?} held on an unknown format ({raw_rvn:?})"
            );
        }
    }
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

#[test]
fn a_record_held_through_a_session_is_format_2_and_never_stale_by_itself() {
    let Record::Valid(own) = valid("r1", Some("me")) else {
        unreachable!()
    };
    assert_eq!(own.format(), FORMAT);
    let held = own.clone().held_through("#session/me/n");
    assert_eq!(held.session.as_deref(), Some("#session/me/n"));
    assert_eq!(held.format(), FORMAT_SESSIONS);
    // A store's TTL must never delete it while its session lives.
    assert_eq!(held.expires_at_s, HELD_THROUGH_SESSION_EXPIRES_AT_S);
    // Released, it is its own record again.
    let stamp = Stamp::new("r2", 1_700_000_000_000);
    let released = held.handed_to_with(None, &stamp);
    assert_eq!(
        (released.session.as_deref(), released.format()),
        (None, FORMAT)
    );
    assert!(released.expires_at_s < HELD_THROUGH_SESSION_EXPIRES_AT_S);
    let session = Lease {
        election: crate::core::keys::session_key("me", "n"),
        ..own
    };
    assert_eq!(session.format(), FORMAT_SESSIONS);
}
