//! The unit tests of what needs no server: reading `store.url`, rows as
//! records, the statements.

use std::path::PathBuf;

use super::codec::{Statements, Stored};
use super::spec::{SslMode, parse_url, quoted_table, redacted};
use crate::lease::{Condition, Record, RvnGuard};

#[test]
fn a_url_is_read_apart() {
    let t = parse_url(
        "postgres://leaderd:s3cret@db.example.com:6432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
    )
    .expect("a valid URL");
    assert_eq!(t.ssl, SslMode::VerifyFull);
    assert_eq!(t.root_cert, Some(PathBuf::from("/etc/ca.pem")));
    assert!(t.url_password);
    assert_eq!(t.shown, "db.example.com:6432/app");
    assert_eq!(t.pg.get_application_name(), Some("x"));
    let t = parse_url("postgresql://leaderd@db/app").expect("a valid URL");
    assert_eq!(t.ssl, SslMode::Prefer, "libpq's default");
    assert!(!t.url_password);
    assert_eq!(t.shown, "db:5432/app");
}

#[test]
fn a_bad_url_is_one_line_without_its_password() {
    for (url, says) in [
        ("mysql://u:pw@db/app", "is not a postgres:// URL"),
        (
            "postgres://u:pw@db/app?sslmode=allow",
            "sslmode=allow is not one of",
        ),
        (
            "postgres://u:pw@db/app?sslcert=/c.pem",
            "`sslcert` is not supported",
        ),
        (
            "postgres://u:pw@db/app?colour=blue",
            "is not a valid PostgreSQL URL",
        ),
        (
            "postgres://u:pw@db:port/app",
            "is not a valid PostgreSQL URL",
        ),
        ("postgres://u:pw@/app", "names no host"),
        (
            "postgres://u:pw@db/app?sslrootcert=%zz",
            "not validly %-encoded",
        ),
    ] {
        let e = parse_url(url).expect_err(url);
        assert!(e.contains(says), "{url}: {e}");
        assert!(!e.contains("pw@"), "{url}: the password is shown: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn the_password_is_never_shown() {
    assert_eq!(
        redacted("postgres://u:secret@db/app?x=1"),
        "postgres://u:***@db/app?x=1"
    );
    assert_eq!(redacted("postgres://u@db/app"), "postgres://u@db/app");
    assert_eq!(redacted("postgres://db/app"), "postgres://db/app");
}

#[test]
fn the_password_comes_from_the_url_or_the_file() {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("pw");
    std::fs::write(&file, "from-file\n").expect("write");
    let with = parse_url("postgres://u:in-url@db/app").expect("a URL");
    assert_eq!(
        with.password(Some(&file)).expect("a password"),
        Some(b"in-url".to_vec())
    );
    let without = parse_url("postgres://u@db/app").expect("a URL");
    assert_eq!(
        without.password(Some(&file)).expect("a password"),
        Some(b"from-file".to_vec()),
        "the newline a Secret or echo adds is not part of it"
    );
    let e = without
        .password(Some(&dir.path().join("missing")))
        .expect_err("a missing file");
    assert!(e.contains("cannot read store.password_file"), "{e}");
}

#[test]
fn table_names_are_quoted_as_written() {
    assert_eq!(quoted_table("leaderd"), "\"leaderd\"");
    assert_eq!(
        quoted_table("ops.Leader-Leases"),
        "\"ops\".\"Leader-Leases\""
    );
}

fn row(f: impl FnOnce(&mut Stored)) -> Stored {
    let mut stored = Stored::for_tests();
    f(&mut stored);
    stored
}

#[test]
fn a_row_reads_as_a_lease_or_names_what_is_wrong() {
    let good = row(|_| {});
    let Record::Valid(lease) = good.to_record() else {
        panic!("{:?}", good.to_record());
    };
    assert_eq!(lease.fencing_token, 41);
    assert_eq!(
        lease.holder_meta.and_then(|m| m.address).as_deref(),
        Some("10.0.0.7:9777")
    );
    for (spoil, says, token) in [
        (
            Box::new(|s: &mut Stored| s.set_rvn(None)) as Box<dyn Fn(&mut Stored)>,
            "attribute `rvn` is missing",
            Some(41),
        ),
        (
            Box::new(|s: &mut Stored| s.set_number(0, Some(-3))),
            "attribute `fencing_token` is negative (-3)",
            None,
        ),
        (
            Box::new(|s: &mut Stored| s.set_number(1, None)),
            "attribute `lease_ms` is missing",
            Some(41),
        ),
        (
            Box::new(|s: &mut Stored| s.set_meta(Some(r#"{"labels": {"a": 1}}"#))),
            "label `a` is not a string",
            Some(41),
        ),
        (
            Box::new(|s: &mut Stored| s.set_meta(Some(r#"{"address": "x"}"#))),
            "`labels` is missing",
            Some(41),
        ),
        (
            Box::new(|s: &mut Stored| s.set_meta(Some("[1]"))),
            "not an object",
            Some(41),
        ),
    ] {
        let stored = row(|s| spoil(s));
        let Record::Malformed(m) = stored.to_record() else {
            panic!("{says}: {:?}", stored.to_record());
        };
        assert!(m.problem.contains(says), "{says}: {}", m.problem);
        assert_eq!(m.fencing_token, token, "{says}");
        assert_ne!(m.fingerprint, "");
    }
    let missing = row(|s| s.set_rvn(None));
    let Record::Malformed(m) = missing.to_record() else {
        panic!()
    };
    assert_eq!(m.guard, RvnGuard::Missing);
}

#[test]
fn a_row_of_another_format_is_never_judged_by_this_ones_layout() {
    for format in [4, -1] {
        let stored = row(|s| {
            s.set_format(Some(format));
            s.set_rvn(None);
        });
        let Record::UnknownFormat(u) = stored.to_record() else {
            panic!("{:?}", stored.to_record());
        };
        assert_eq!(u.format, format.to_string());
        assert_eq!(u.fencing_token, Some(41));
    }
    for format in [None, Some(1), Some(2)] {
        let stored = row(|s| s.set_format(format));
        assert!(matches!(stored.to_record(), Record::Valid(_)), "{format:?}");
    }
}

#[test]
fn each_condition_has_its_statement() {
    let sql = Statements::new("\"t\"");
    let (s, p) = sql.write(&Condition::NotExists).expect("a statement");
    assert!(s.contains("INSERT INTO \"t\""), "{s}");
    assert!(s.contains("FOR UPDATE"), "{s}");
    assert!(p.is_empty());
    let (s, p) = sql
        .write(&Condition::HeldBy {
            rvn: "r".into(),
            holder: "h".into(),
        })
        .expect("a statement");
    assert!(
        s.contains("cur.holder = $14") && s.contains("cur.rvn = $13"),
        "{s}"
    );
    assert_eq!(p, vec![Some("r".to_owned()), Some("h".to_owned())]);
    let (s, p) = sql
        .write(&Condition::Unchanged(RvnGuard::Missing))
        .expect("a statement");
    assert!(s.contains("IS NOT DISTINCT FROM $13"), "{s}");
    assert_eq!(p, vec![None]);
    // No condition but `Unchanged` holds on a malformed row, and none on
    // a row of another format.
    let (s, _) = sql
        .write(&Condition::RvnIs("r".into()))
        .expect("a statement");
    assert!(
        s.contains("cur.fencing_token >= 0") && s.contains("cur.format IN (1, 2, 3)"),
        "{s}"
    );
    assert!(sql.update_unchanged.contains("cur.format IN (1, 2, 3)"));
    assert!(!sql.update_unchanged.contains("fencing_token >= 0"));
}
