//! Tests of the session sweep's judge (with the SQLite store: in
//! `crate::lease::sqlite`'s `sweep_tests`).

use std::time::Duration;

use super::*;
use crate::core::record::{Lease, Malformed, RvnGuard, UnknownFormat};

const MS: Duration = Duration::from_millis(1);
const D: f64 = 0.01;
/// L·(1+D) of a session record promising 10 s.
const WAIT: Duration = Duration::from_millis(10_100);
/// A wall clock well past every `expires_at` of these records.
const LATE_S: u64 = 1_000_000;

fn t0() -> Instant {
    Instant::from_since_origin(Duration::from_secs(100))
}

/// A live session record under `key` with `rvn`, promising 10 s, stale by
/// `expires_at` at [`LATE_S`].
fn live(key: &str, rvn: &str) -> Record {
    Record::Valid(Lease {
        election: key.to_owned(),
        holder: Some("owner".to_owned()),
        rvn: rvn.to_owned(),
        fencing_token: 0,
        lease_ms: 10_000,
        acquired_at_ms: 1_000,
        renewed_at_ms: 1_000,
        expires_at_s: 11,
        holder_meta: None,
        successor: None,
        session: None,
    })
}

fn ended(key: &str, rvn: &str) -> Record {
    match live(key, rvn) {
        Record::Valid(l) => Record::Valid(Lease { holder: None, ..l }),
        _ => unreachable!("live() is valid"),
    }
}

fn stale(key: &str, rvn: &str) -> StaleSession {
    StaleSession {
        key: key.to_owned(),
        rvn: rvn.to_owned(),
    }
}

#[test]
fn a_live_session_goes_only_once_its_rvn_stayed_for_the_wait_on_the_sweepers_clock() {
    let mut sweep = SessionSweep::new(D);
    let records = [live("#session/a/1", "r1")];
    assert_eq!(sweep.judge(&records, t0(), LATE_S), []);
    assert_eq!(sweep.timing(), 1);
    assert_eq!(sweep.judge(&records, t0() + (WAIT - MS), LATE_S), []);
    assert_eq!(
        sweep.judge(&records, t0() + WAIT, LATE_S),
        [stale("#session/a/1", "r1")]
    );
    assert_eq!(sweep.timing(), 0);
}

#[test]
fn a_renewed_session_is_timed_anew_from_its_new_rvn() {
    let mut sweep = SessionSweep::new(D);
    assert_eq!(sweep.judge(&[live("#session/a/1", "r1")], t0(), LATE_S), []);
    let renewed = [live("#session/a/1", "r2")];
    let later = t0() + WAIT + MS;
    assert_eq!(sweep.judge(&renewed, later, LATE_S), []);
    assert_eq!(sweep.judge(&renewed, later + (WAIT - MS), LATE_S), []);
    assert_eq!(
        sweep.judge(&renewed, later + WAIT, LATE_S),
        [stale("#session/a/1", "r2")]
    );
}

/// Ended, it can never be renewed; it is kept for the wait all the same
/// (followers read it ended, not missing), whatever the wall clock says.
#[test]
fn an_ended_session_goes_once_it_stayed_ended_for_the_wait() {
    let mut sweep = SessionSweep::new(D);
    let records = [ended("#session/a/1", "r1")];
    assert_eq!(sweep.judge(&records, t0(), 0), []);
    assert_eq!(sweep.judge(&records, t0() + (WAIT - MS), 0), []);
    assert_eq!(
        sweep.judge(&records, t0() + WAIT, 0),
        [stale("#session/a/1", "r1")]
    );
    assert_eq!(sweep.timing(), 0);
}

#[test]
fn a_record_of_an_unknown_format_or_malformed_or_not_a_session_never_goes() {
    let mut sweep = SessionSweep::new(D);
    let records = [
        Record::UnknownFormat(UnknownFormat {
            election: "#session/a/1".to_owned(),
            format: "3".to_owned(),
            holder: None,
            fencing_token: None,
            fingerprint: "f".to_owned(),
        }),
        Record::Malformed(Malformed {
            election: "#session/b/1".to_owned(),
            problem: "attribute `rvn` is missing".to_owned(),
            fingerprint: "g".to_owned(),
            fencing_token: None,
            guard: RvnGuard::Missing,
        }),
        live("e", "r1"),
        ended("#member/a", "r2"),
        Record::Absent,
    ];
    for later in [Duration::ZERO, WAIT, 1_000 * WAIT] {
        assert_eq!(sweep.judge(&records, t0() + later, LATE_S), []);
    }
    assert_eq!(sweep.timing(), 0);
}

/// The defect this sweep replaced: a daemon whose wall clock ran two days
/// ahead deleted every live session at first sight.
#[test]
fn a_wall_clock_far_ahead_deletes_nothing_before_the_wait() {
    let mut sweep = SessionSweep::new(D);
    let two_days_ahead = 11 + 2 * 24 * 3600;
    let records = [live("#session/a/1", "r1")];
    assert_eq!(sweep.judge(&records, t0(), two_days_ahead), []);
    assert_eq!(
        sweep.judge(&records, t0() + (WAIT - MS), two_days_ahead),
        []
    );
}

#[test]
fn an_obviously_fresh_record_is_not_even_timed() {
    let mut sweep = SessionSweep::new(D);
    let records = [live("#session/a/1", "r1")];
    // Its `expires_at` (11) is not past: skipped, whatever the wait.
    for later in [Duration::ZERO, 2 * WAIT] {
        assert_eq!(sweep.judge(&records, t0() + later, 10), []);
    }
    assert_eq!(sweep.timing(), 0);
    // Timed from the first sweep that found it past, not before.
    let past = t0() + 2 * WAIT;
    assert_eq!(sweep.judge(&records, past, 11), []);
    assert_eq!(sweep.judge(&records, past + (WAIT - MS), 11), []);
    assert_eq!(
        sweep.judge(&records, past + WAIT, 11),
        [stale("#session/a/1", "r1")]
    );
}

#[test]
fn a_record_missing_from_a_read_is_forgotten() {
    let mut sweep = SessionSweep::new(D);
    let records = [live("#session/a/1", "r1")];
    assert_eq!(sweep.judge(&records, t0(), LATE_S), []);
    assert_eq!(sweep.judge(&[], t0() + MS, LATE_S), []);
    assert_eq!(sweep.timing(), 0);
    // Back (a file restored, say): timed anew.
    assert_eq!(sweep.judge(&records, t0() + WAIT, LATE_S), []);
}

#[test]
fn the_memory_is_bounded_and_keeps_what_it_timed_first() {
    let mut sweep = SessionSweep::new(D);
    let first: Vec<Record> = (0..SWEEP_MEMORY)
        .map(|i| live(&format!("#session/b/{i:05}"), "r"))
        .collect();
    assert_eq!(sweep.judge(&first, t0(), LATE_S), []);
    // Newcomers that sort before the records timed already: the memory is
    // full, so they are not timed yet, and those timed are not forgotten.
    let mut all: Vec<Record> = (0..5)
        .map(|i| live(&format!("#session/a/{i}"), "r"))
        .collect();
    all.extend(first.iter().cloned());
    assert_eq!(sweep.judge(&all, t0() + MS, LATE_S), []);
    assert_eq!(sweep.timing(), SWEEP_MEMORY);
    let gone = sweep.judge(&all, t0() + WAIT, LATE_S);
    assert_eq!(gone.len(), SWEEP_MEMORY);
    assert!(gone.iter().all(|s| s.key.starts_with("#session/b/")));
    // The newcomers are timed from this sweep on.
    assert_eq!(sweep.timing(), 5);
    let rest = &all[..5];
    assert_eq!(sweep.judge(rest, t0() + (2 * WAIT - MS), LATE_S), []);
    assert_eq!(sweep.judge(rest, t0() + 2 * WAIT, LATE_S).len(), 5);
}
