//! The session core's rules, one input at a time.

use std::time::Duration;

use super::*;

fn at(ms: u64) -> Tick {
    Tick::at_ms(ms)
}

fn session() -> SessionCore {
    SessionCore::new(ElectionConfig::with_defaults("-", "me"), at(0).now, true)
}

/// The next request the core asks for, past its notes.
fn poll(core: &mut SessionCore) -> Option<Action> {
    std::iter::from_fn(|| core.poll_action()).find(|a| !matches!(a, Action::Note(_)))
}

/// The write the core asks for next.
fn write(core: &mut SessionCore) -> (Lease, Condition) {
    match poll(core) {
        Some(Action::Write {
            lease, condition, ..
        }) => (lease, condition),
        other => panic!("expected a write, got {other:?}"),
    }
}

fn applied(core: &mut SessionCore, ms: u64) {
    core.handle(&at(ms), SessionInput::Written(Ok(WriteOutcome::Applied)));
}

#[test]
fn a_session_opens_under_a_fresh_key_and_is_renewed_every_r_from_its_send() {
    let mut s = session();
    assert_eq!(s.view(), None);
    s.handle(&at(0), SessionInput::Timeout);
    let (opened, condition) = write(&mut s);
    assert_eq!(opened.election, "#session/me/v0");
    assert_eq!(condition, Condition::NotExists);
    assert_eq!(s.next_wake(), None, "no wake while a request is in flight");
    applied(&mut s, 40);
    let view = s.view().expect("open");
    assert_eq!(view.key, "#session/me/v0");
    assert_eq!(view.last_send, at(0).now, "validity counts from the send");
    assert_eq!(s.next_wake(), Some(at(5_000).now));
    s.handle(&at(5_000), SessionInput::Timeout);
    let (renewed, condition) = write(&mut s);
    assert_eq!(renewed.election, opened.election);
    assert_eq!(renewed.rvn, "v5000");
    assert_eq!(
        condition,
        Condition::HeldBy {
            rvn: "v0".into(),
            holder: "me".into()
        }
    );
    applied(&mut s, 5_100);
    assert_eq!(s.view().unwrap().last_send, at(5_000).now);
}

#[test]
fn the_next_write_after_a_tenure_ended_carries_the_count_of_ended_tenures() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    let (opened, _) = write(&mut s);
    assert_eq!(opened.fencing_token, 0);
    applied(&mut s, 10);
    // Two tenures ended; a count told late never lowers it.
    s.handle(&at(1_000), SessionInput::TenuresEnded(1, "e3".into()));
    s.handle(&at(1_000), SessionInput::TenuresEnded(2, "e7".into()));
    s.handle(&at(1_001), SessionInput::TenuresEnded(1, "e9".into()));
    assert_eq!(poll(&mut s), None, "no write of its own");
    s.handle(&at(5_000), SessionInput::Timeout);
    let (renewed, _) = write(&mut s);
    assert_eq!(renewed.fencing_token, 2);
    let ended = |l: &Lease| {
        l.holder_meta
            .as_ref()
            .and_then(|m| m.labels.get(ENDED_LABEL).cloned())
    };
    assert_eq!(
        ended(&renewed).as_deref(),
        Some("1:e3 2:e7"),
        "and names them"
    );
    applied(&mut s, 5_010);
    s.handle(&at(10_000), SessionInput::Timeout);
    assert_eq!(write(&mut s).0.fencing_token, 2, "every write carries it");
}

#[test]
fn the_latest_ends_named_are_consecutive_and_bounded() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    write(&mut s);
    applied(&mut s, 10);
    for n in 1..=40 {
        s.handle(&at(100), SessionInput::TenuresEnded(n, format!("e{n}")));
    }
    s.handle(&at(5_000), SessionInput::Timeout);
    let (renewed, _) = write(&mut s);
    applied(&mut s, 5_010);
    let label = renewed.holder_meta.unwrap().labels[ENDED_LABEL].clone();
    let numbers: Vec<u64> = label
        .split(' ')
        .map(|e| e.split_once(':').unwrap().0.parse().unwrap())
        .collect();
    assert_eq!(numbers, (25..=40).collect::<Vec<_>>(), "{label}");
    // A number that skips some starts the list over.
    s.handle(&at(5_100), SessionInput::TenuresEnded(45, "e45".into()));
    s.handle(&at(10_000), SessionInput::Timeout);
    let (renewed, _) = write(&mut s);
    assert_eq!(renewed.holder_meta.unwrap().labels[ENDED_LABEL], "45:e45");
}

#[test]
fn a_session_found_ended_is_lost_and_a_new_key_is_opened_at_once() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    let (opened, _) = write(&mut s);
    applied(&mut s, 10);
    s.handle(&at(5_000), SessionInput::Timeout);
    write(&mut s);
    let ended = opened.handed_to_with(None, &at(4_000).stamp);
    s.handle(
        &at(5_010),
        SessionInput::Written(Ok(WriteOutcome::ConditionFailed {
            current: Some(Record::Valid(ended)),
        })),
    );
    assert_eq!(s.view(), None, "every tenure held through it is over");
    assert_eq!(s.next_wake(), Some(at(5_010).now));
    s.handle(&at(5_010), SessionInput::Timeout);
    let (reopened, condition) = write(&mut s);
    assert_eq!(reopened.election, "#session/me/v5010");
    assert_eq!(condition, Condition::NotExists);
}

#[test]
fn each_renew_notes_how_late_it_went_out() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    write(&mut s);
    applied(&mut s, 10);
    // Due at 5 s, woken 120 ms late.
    s.handle(&at(5_120), SessionInput::Timeout);
    let actions: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert!(
        matches!(
            actions.as_slice(),
            [
                Action::Write {
                    op: WriteOp::RenewSession,
                    ..
                },
                Action::Note(Note::RenewSent(late)),
            ] if *late == Duration::from_millis(120)
        ),
        "{actions:?}"
    );
    applied(&mut s, 5_130);
    // Due R after that send, and on time.
    s.handle(&at(10_120), SessionInput::Timeout);
    let late: Vec<Action> = std::iter::from_fn(|| s.poll_action())
        .filter(|a| matches!(a, Action::Note(_)))
        .collect();
    assert_eq!(late, [Action::Note(Note::RenewSent(Duration::ZERO))]);
}

#[test]
fn a_renew_whose_answer_was_lost_is_adopted_without_stretching_validity() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    let (opened, _) = write(&mut s);
    applied(&mut s, 10);
    s.handle(&at(5_000), SessionInput::Timeout);
    let (lost, _) = write(&mut s);
    s.handle(
        &at(10_000),
        SessionInput::Written(Err(StoreError::Timeout(Duration::from_secs(5)))),
    );
    // Retried after P, from the last rvn known: refused, without the
    // record (not every store returns it): read back.
    assert_eq!(s.next_wake(), Some(at(11_000).now));
    s.handle(&at(11_000), SessionInput::Timeout);
    let (_, condition) = write(&mut s);
    assert_eq!(
        condition,
        Condition::HeldBy {
            rvn: opened.rvn.clone(),
            holder: "me".into()
        }
    );
    s.handle(
        &at(11_010),
        SessionInput::Written(Ok(WriteOutcome::ConditionFailed { current: None })),
    );
    assert!(matches!(
        poll(&mut s),
        Some(Action::Read {
            confirming: true,
            ..
        })
    ));
    s.handle(
        &at(11_020),
        SessionInput::Read(Ok(Record::Valid(lost.clone()))),
    );
    // Ours: carry on from it at once; validity still from the open
    // (the lost write's send is not known to have applied in time).
    assert_eq!(s.next_wake(), Some(at(11_020).now));
    s.handle(&at(11_020), SessionInput::Timeout);
    let (_, condition) = write(&mut s);
    assert_eq!(
        condition,
        Condition::HeldBy {
            rvn: lost.rvn,
            holder: "me".into()
        }
    );
}

#[test]
fn a_failed_open_never_reuses_its_key_and_backs_off() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    let (first, _) = write(&mut s);
    s.handle(
        &at(100),
        SessionInput::Written(Err(StoreError::Timeout(Duration::from_secs(5)))),
    );
    assert_eq!(s.view(), None);
    assert_eq!(
        s.next_wake(),
        Some(at(1_100).now),
        "P after the first failure"
    );
    s.handle(&at(1_100), SessionInput::Timeout);
    let (second, _) = write(&mut s);
    assert_ne!(first.election, second.election);
    s.handle(
        &at(1_200),
        SessionInput::Written(Err(StoreError::Throttled("slow down".into()))),
    );
    assert_eq!(s.next_wake(), Some(at(3_200).now), "then 2·P");
}

#[test]
fn the_view_drops_when_validity_ends_without_a_renew() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    write(&mut s);
    applied(&mut s, 10);
    s.handle(&at(5_000), SessionInput::Timeout);
    write(&mut s);
    s.handle(
        &at(5_100),
        SessionInput::Written(Err(StoreError::Transport("refused".into()))),
    );
    assert_eq!(s.next_wake(), Some(at(6_100).now), "retried after P");
    s.handle(&at(6_100), SessionInput::Timeout);
    write(&mut s);
    s.handle(
        &at(9_699),
        SessionInput::Written(Err(StoreError::Transport("refused".into()))),
    );
    assert!(s.view().is_some());
    // L·(1−D) − M = 9,700 ms after the send of the last success: the
    // core wakes then, so that the view drops on time.
    assert_eq!(s.next_wake(), Some(at(9_700).now));
    s.handle(&at(9_700), SessionInput::Timeout);
    assert_eq!(s.view(), None);
}

#[test]
fn a_replaced_store_is_renewed_against_at_once_and_a_missing_session_is_lost() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    write(&mut s);
    applied(&mut s, 10);
    s.handle(&at(1_000), SessionInput::StoreReplaced);
    let (_, condition) = write(&mut s);
    assert!(matches!(condition, Condition::HeldBy { .. }));
    s.handle(
        &at(1_010),
        SessionInput::Written(Ok(WriteOutcome::ConditionFailed {
            current: Some(Record::Absent),
        })),
    );
    assert_eq!(s.view(), None);
}

fn lazy() -> SessionCore {
    SessionCore::new(ElectionConfig::with_defaults("-", "me"), at(0).now, false)
}

#[test]
fn a_session_nobody_wants_is_not_opened_until_an_election_wants_it() {
    let mut s = lazy();
    assert_eq!(s.next_wake(), None, "nothing to do while nobody wants it");
    s.handle(&at(0), SessionInput::Timeout);
    assert_eq!(poll(&mut s), None, "no write");
    assert_eq!(s.view(), None);
    s.handle(&at(3_000), SessionInput::Wanted(true));
    let (opened, condition) = write(&mut s);
    assert_eq!(opened.election, "#session/me/v3000", "opened at once");
    assert_eq!(condition, Condition::NotExists);
    applied(&mut s, 3_010);
    assert_eq!(s.view().expect("open").last_send, at(3_000).now);
}

#[test]
fn a_session_unwanted_for_a_lease_is_ended_and_a_new_one_opened_when_wanted_again() {
    let mut s = lazy();
    s.handle(&at(0), SessionInput::Wanted(true));
    let (opened, _) = write(&mut s);
    applied(&mut s, 10);
    // Unwanted at 2 s, wanted again at 3 s: nothing ends; renewed as ever.
    s.handle(&at(2_000), SessionInput::Wanted(false));
    s.handle(&at(3_000), SessionInput::Wanted(true));
    assert_eq!(poll(&mut s), None);
    assert_eq!(s.next_wake(), Some(at(5_000).now));
    s.handle(&at(5_000), SessionInput::Timeout);
    let (renewed, _) = write(&mut s);
    assert_eq!(renewed.election, opened.election);
    applied(&mut s, 5_010);
    // Unwanted from 7 s on: renewed at 10 s, ended at 17 s (a lease on).
    s.handle(&at(7_000), SessionInput::Wanted(false));
    assert_eq!(s.next_wake(), Some(at(10_000).now));
    s.handle(&at(10_000), SessionInput::Timeout);
    let (last, _) = write(&mut s);
    applied(&mut s, 10_010);
    assert_eq!(s.next_wake(), Some(at(15_000).now));
    s.handle(&at(15_000), SessionInput::Timeout);
    let (last, _) = {
        let w = write(&mut s);
        applied(&mut s, 15_010);
        assert_eq!(w.0.election, last.election);
        w
    };
    assert_eq!(s.next_wake(), Some(at(17_000).now));
    s.handle(&at(17_000), SessionInput::Timeout);
    let (ended, condition) = write(&mut s);
    assert_eq!(ended.election, opened.election);
    assert_eq!(ended.holder, None, "ended: nobody has to time it out");
    assert_eq!(
        condition,
        Condition::HeldBy {
            rvn: last.rvn.clone(),
            holder: "me".into()
        }
    );
    assert_eq!(s.view(), None, "no election may hold through it any more");
    assert!(s.is_retired(), "ended for want of use, not lost");
    applied(&mut s, 17_010);
    assert_eq!(s.next_wake(), None, "idle: no write until wanted again");
    assert!(!s.is_finished());
    s.handle(&at(30_000), SessionInput::Wanted(true));
    let (reopened, condition) = write(&mut s);
    assert_eq!(reopened.election, "#session/me/v30000", "a new key");
    assert!(!s.is_retired());
    assert_eq!(condition, Condition::NotExists);
}

#[test]
fn closing_an_idle_session_writes_nothing_and_finishes() {
    let mut s = lazy();
    s.handle(&at(1_000), SessionInput::Close);
    assert_eq!(poll(&mut s), None);
    assert!(s.is_finished());
}

fn labels(names: &[(&str, &str)]) -> SessionInput {
    SessionInput::Labels(
        names
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

fn carried(l: &Lease) -> Vec<String> {
    l.holder_meta
        .as_ref()
        .map(|m| m.labels.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn new_label_names_go_out_at_once_and_at_most_once_an_r_while_new_values_wait_for_the_renewal() {
    let mut s = session();
    s.handle(&at(0), SessionInput::Timeout);
    let (opened, _) = write(&mut s);
    assert!(carried(&opened).is_empty());
    // Labels told while the opening write is on its way: written as soon
    // as it is answered, not an R later.
    s.handle(&at(5), labels(&[("led", "0"), ("priority", "2")]));
    applied(&mut s, 10);
    assert_eq!(s.next_wake(), Some(at(10).now));
    s.handle(&at(10), SessionInput::Timeout);
    let (early, _) = write(&mut s);
    assert_eq!(carried(&early), ["led", "priority"]);
    applied(&mut s, 20);
    assert_eq!(
        s.next_wake(),
        Some(at(5_010).now),
        "then every R from that send"
    );
    // A new value of a label already carried waits for the renewal.
    s.handle(&at(1_000), labels(&[("led", "3"), ("priority", "2")]));
    assert_eq!(s.next_wake(), Some(at(5_010).now));
    // Names that change again within the R (an app check that flaps):
    // not before an R after the last early write.
    s.handle(&at(1_500), labels(&[("led", "3")]));
    assert_eq!(s.next_wake(), Some(at(5_010).now));
    s.handle(&at(5_010), SessionInput::Timeout);
    let (renewed, _) = write(&mut s);
    assert_eq!(carried(&renewed), ["led"]);
    applied(&mut s, 5_020);
    assert_eq!(s.next_wake(), Some(at(10_010).now));
    s.handle(&at(6_000), labels(&[("led", "3"), ("priority", "2")]));
    assert_eq!(
        s.next_wake(),
        Some(at(6_000).now),
        "an R after the last early one: at once"
    );
}
