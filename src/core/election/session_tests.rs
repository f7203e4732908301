//! The core following an election held through another daemon's session,
//! step by step: with the owner's stream flowing it reads the session
//! alone, once a lease, and the election only when the stream tells of it.

use std::time::Duration;

use super::{Action, Core, ElectionConfig, Input, Role, Tick, WriteOp};
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::record::{Condition, HolderMeta, Lease, Record, WriteOutcome};
use crate::core::session::{Flow, SessionAnswer, SessionView};
use crate::core::time::Instant;

const MS: Duration = Duration::from_millis(1);
const KEY: &str = "#session/b/n1";

/// Instants of the tests count from here; [`follower`] runs a first
/// round before.
const BASE: u64 = 2_000;

fn t(ms: u64) -> Instant {
    Instant::from_since_origin(MS * (ms + BASE) as u32)
}

fn at(ms: u64) -> Tick {
    raw(ms + BASE)
}

/// The tick at `ms` from the clock's origin.
fn raw(ms: u64) -> Tick {
    Tick::at_ms(ms)
}

/// A follower holding tenures through its own session. A first round
/// read the election, which aimed its watch at the holder's address: an
/// event told between that read and the aim could not reach it, so it
/// polls once more, though the stream flows; the second round's read was
/// sent at 0.
fn follower() -> Core {
    let mut core = sessions_core();
    core.handle(&raw(0), Input::Session(Some(own_session(0))));
    core.handle(&raw(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core.handle(&raw(1), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    let first = SessionAnswer {
        flow: Some(Flow {
            since: raw(0).now,
            until: raw(6_000).now,
        }),
        ..SessionAnswer::bare(Ok(session("s0")))
    };
    core.handle(&raw(2), Input::SessionRecord(first));
    assert_eq!(core.next_wake(), Some(raw(1_002).now), "polls once more");
    core.handle(&at(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core
}

/// A core of "me" for "e", holding tenures through sessions, that may
/// campaign at once.
fn sessions_core() -> Core {
    Core::new(
        ElectionConfig::with_defaults("e", "me"),
        raw(0).now,
        Duration::ZERO,
        true,
        true,
    )
    .through_sessions()
}

/// This daemon's session, last renewed at `ms` from the clock's origin.
fn own_session_raw(ms: u64) -> std::sync::Arc<SessionView> {
    std::sync::Arc::new(SessionView {
        key: "#session/me/n0".into(),
        rvn: format!("m{ms}"),
        last_send: raw(ms).now,
        labels: Default::default(),
    })
}

/// This daemon's session, last renewed at `ms`.
fn own_session(ms: u64) -> std::sync::Arc<SessionView> {
    std::sync::Arc::new(SessionView {
        key: "#session/me/n0".into(),
        rvn: format!("m{ms}"),
        last_send: t(ms),
        labels: Default::default(),
    })
}

/// The election, held by `b` through [`KEY`], advertising an address.
fn election() -> Lease {
    let meta = HolderMeta {
        address: Some("10.0.0.2:9777".into()),
        ..Default::default()
    };
    Lease::stamped("e", "b", 7, 10_000, 1, Some(meta)).held_through(KEY)
}

fn session(rvn: &str) -> Record {
    session_after(rvn, 0)
}

/// The session record after `ended` of its owner's tenures ended.
fn session_after(rvn: &str, ended: u64) -> Record {
    let mut s = Lease::stamped(KEY, "b", ended, 10_000, 1, None);
    s.rvn = rvn.into();
    Record::Valid(s)
}

#[derive(Debug, PartialEq)]
enum Kind {
    Election,
    Session(Option<Instant>),
}

/// The read the core asks for next (other actions skipped).
fn read_kind(core: &mut Core) -> Kind {
    while let Some(action) = core.poll_action() {
        match action {
            Action::Read { .. } => return Kind::Election,
            Action::ReadSession {
                key, not_before, ..
            } => {
                assert_eq!(key, KEY);
                return Kind::Session(not_before);
            }
            Action::Write { .. } => panic!("a write: {action:?}"),
            _ => {}
        }
    }
    panic!("no read asked for")
}

fn flowing(since: u64, until: u64) -> Option<Flow> {
    Some(Flow {
        since: t(since),
        until: t(until),
    })
}

fn answer(core: &mut Core, ms: u64, rvn: &str, learned: u64, flow: Option<Flow>) {
    answer_with(core, ms, session(rvn), learned, flow, false);
}

/// The answer at `ms` to the session read: `record`, its `rvn` learned
/// at `learned`; `moved`: the daemon cannot account for a move of the
/// session's count of ended tenures since the election was read.
fn answer_with(
    core: &mut Core,
    ms: u64,
    record: Record,
    learned: u64,
    flow: Option<Flow>,
    moved: bool,
) {
    let answer = SessionAnswer {
        record: Ok(record.into()),
        learned: Some(t(learned)),
        flow,
        told: None,
        moved,
        yields: false,
    };
    core.handle(&at(ms), Input::SessionRecord(answer));
}

/// The next action is the takeover of the election read with `rvn`.
fn assert_takes_over(core: &mut Core, rvn: String) {
    let Some(Action::Write { op, condition, .. }) = core.poll_action() else {
        panic!("the election is taken");
    };
    assert_eq!((op, condition), (WriteOp::TakeOver, Condition::RvnIs(rvn)));
}

#[test]
fn with_the_stream_flowing_only_the_session_is_read_once_due_and_its_rvn_dated_from_its_event() {
    let mut core = follower();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    // The stream flowed since before the election was read; the session's
    // rvn was told at 5 ms: due a lease and the drift after that.
    answer(&mut core, 20, "s1", 5, flowing(0, 6_000));
    let due = t(5) + Duration::from_millis(10_100);
    assert_eq!(core.next_wake(), Some(due));
    assert_eq!(core.state().hints_until, Some(t(6_000)));
    core.handle(&at(10_105), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Session(Some(due)));
    // Renewed, told at 10 s: the next read a lease after that.
    answer(&mut core, 10_110, "s2", 10_000, flowing(0, 16_000));
    assert_eq!(core.next_wake(), Some(t(20_100)));
    // The stream tells of the election's release: the election is read.
    let released = LeaseEvent::Released {
        election: "e".into(),
        rvn: "r".into(),
        fencing_token: 7,
        successor: None,
    };
    let hint = Hint::Event {
        at: t(12_000),
        event: Box::new(released),
    };
    core.handle(&at(12_000), Input::Hint(hint));
    assert_eq!(read_kind(&mut core), Kind::Election);
}

#[test]
fn a_release_the_stream_left_out_is_found_once_the_sessions_count_of_ended_tenures_moves() {
    let mut core = follower();
    let held = election();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(held.clone()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer(&mut core, 20, "s1", 5, flowing(0, 40_000));
    let due = t(5) + Duration::from_millis(10_100);
    assert_eq!(core.next_wake(), Some(due), "the session alone, once due");
    // The owner released the election; its stream (forged) says nothing
    // of it and keeps flowing. The session's next write counts one more
    // ended tenure.
    core.handle(&at(10_105), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Session(Some(due)));
    answer_with(
        &mut core,
        10_110,
        session_after("s2", 1),
        10_000,
        flowing(0, 40_000),
        true,
    );
    // The election is read again within P, and taken once found free.
    assert_eq!(core.next_wake(), Some(t(11_110)));
    core.handle(&at(11_000), Input::Session(Some(own_session(11_000))));
    core.handle(&at(11_110), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    let mut released = held.released();
    released.session = None;
    core.handle(
        &at(11_120),
        Input::Read(Ok(Record::Valid(released.clone()))),
    );
    assert_takes_over(&mut core, released.rvn);
}

#[test]
fn a_moved_count_has_the_election_read_again_and_an_unmoved_one_leaves_it_to_the_stream() {
    let mut core = follower();
    // The daemon cannot account for the count the answer shows: the
    // election is read once more.
    core.handle(&at(10), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer_with(
        &mut core,
        20,
        session_after("s1", 3),
        5,
        flowing(0, 40_000),
        true,
    );
    assert_eq!(core.next_wake(), Some(t(1_020)));
    core.handle(&at(1_020), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    // Read again, and the count accounted for: left to the stream.
    core.handle(&at(1_030), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer_with(
        &mut core,
        1_040,
        session_after("s1", 3),
        5,
        flowing(0, 40_000),
        false,
    );
    assert_eq!(core.next_wake(), Some(t(5) + Duration::from_millis(10_100)));
}

#[test]
fn a_stream_that_began_after_the_election_was_read_does_not_spare_its_reads() {
    let mut core = follower();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    // It may not have told of a release before it began: poll every P.
    answer(&mut core, 20, "s1", 5, flowing(15, 6_000));
    assert_eq!(core.next_wake(), Some(t(1_020)));
    core.handle(&at(1_020), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    // Without a stream, the same.
    core.handle(&at(1_030), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer(&mut core, 1_040, "s1", 5, None);
    assert_eq!(core.next_wake(), Some(t(2_040)));
}

/// Without the owner's stream the election is polled every P; the poll
/// that would come at the session's due (within P of it, the count
/// unmoved) reads the session alone, and a session found unchanged is
/// ended and the election taken on the record the last poll read.
#[test]
fn without_a_stream_the_poll_at_the_sessions_due_reads_the_session_alone() {
    let due = t(5) + Duration::from_millis(10_100);
    for moved in [false, true] {
        let mut core = follower();
        let held = election();
        core.handle(&at(10), Input::Read(Ok(Record::Valid(held.clone()))));
        assert_eq!(read_kind(&mut core), Kind::Session(None));
        answer(&mut core, 20, "s1", 5, None);
        assert_eq!(core.next_wake(), Some(t(1_020)), "polled every P");
        // The poll at 9,100 ms, the session due at 10,105 ms.
        core.handle(&at(9_100), Input::Timeout);
        assert_eq!(read_kind(&mut core), Kind::Election);
        core.handle(&at(9_110), Input::Read(Ok(Record::Valid(held.clone()))));
        assert_eq!(read_kind(&mut core), Kind::Session(None));
        answer_with(&mut core, 9_120, session("s1"), 5, None, moved);
        assert_eq!(core.next_wake(), Some(due));
        // Nothing told it of the owner: it does not count as watching.
        assert_eq!(core.state().hints_until, None);
        core.handle(&at(10_000), Input::Session(Some(own_session(10_000))));
        core.handle(&at(10_105), Input::Timeout);
        if moved {
            // A count the daemon cannot account for: the election itself.
            assert_eq!(read_kind(&mut core), Kind::Election);
            continue;
        }
        assert_eq!(read_kind(&mut core), Kind::Session(Some(due)));
        answer(&mut core, 10_110, "s1", 5, None);
        let Some(Action::Write { op, .. }) = core.poll_action() else {
            panic!("the session is ended");
        };
        assert_eq!(op, WriteOp::EndSession);
        core.handle(&at(10_120), Input::Written(Ok(WriteOutcome::Applied)));
        assert_takes_over(&mut core, held.rvn);
    }
}

/// A follower of [`election`], its session's `rvn` s1 learned at 5 ms;
/// the owner then died (its stream fell quiet, the store still shows s1),
/// and at 10,105 ms the follower reads the session once it is due.
fn owner_died() -> (Core, Lease) {
    let mut core = follower();
    let held = election();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(held.clone()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer(&mut core, 20, "s1", 5, flowing(0, 6_000));
    // Our own session renewed meanwhile: it may hold what it takes.
    core.handle(&at(10_000), Input::Session(Some(own_session(10_000))));
    core.handle(&at(10_105), Input::Timeout);
    assert_eq!(
        read_kind(&mut core),
        Kind::Session(Some(t(5) + Duration::from_millis(10_100)))
    );
    (core, held)
}

#[test]
fn a_session_left_unchanged_for_the_wait_is_ended_then_the_election_taken() {
    let (mut core, held) = owner_died();
    answer(&mut core, 12_200, "s1", 5, None);
    let Some(Action::Write {
        op,
        condition,
        lease,
        ..
    }) = core.poll_action()
    else {
        panic!("the session is ended");
    };
    assert_eq!(
        (op, condition),
        (WriteOp::EndSession, Condition::RvnIs("s1".into()))
    );
    assert_eq!((lease.election.as_str(), lease.holder), (KEY, None));
    core.handle(&at(12_210), Input::Written(Ok(WriteOutcome::Applied)));
    assert_takes_over(&mut core, held.rvn);
}

/// The session timed out, found by a follower with no session of its own
/// (it held nothing): it asks for one, and as it opens ends the owner's
/// session and takes the election, with the conditions the round read,
/// without reading either again.
#[test]
fn a_timed_out_session_found_without_a_session_of_its_own_is_ended_and_taken_as_one_opens() {
    let (mut core, held) = owner_died();
    core.handle(&at(12_100), Input::Session(None));
    answer(&mut core, 12_200, "s1", 5, None);
    assert!(core.wants_session(), "a session to hold it through");
    while let Some(action) = core.poll_action() {
        assert!(!matches!(action, Action::Write { .. }), "{action:?}");
    }
    core.handle(&at(12_300), Input::Session(Some(own_session(12_250))));
    let Some(Action::Write { op, condition, .. }) = core.poll_action() else {
        panic!("the session is ended as this daemon's opens, nothing read first");
    };
    assert_eq!(
        (op, condition),
        (WriteOp::EndSession, Condition::RvnIs("s1".into()))
    );
    core.handle(&at(12_310), Input::Written(Ok(WriteOutcome::Applied)));
    assert_takes_over(&mut core, held.rvn);
}

/// The session timed out, and another daemon ranks before this one for
/// the election: the end and the take wait two retry intervals, then the
/// election is read again; still held through the session, it is taken
/// (the wait is spent once for that record).
#[test]
fn a_daemon_that_ranks_before_takes_first_and_this_one_takes_what_it_left() {
    let (mut core, held) = owner_died();
    let yielding = |ms: u64| {
        let answer = SessionAnswer {
            yields: true,
            learned: Some(t(5)),
            ..SessionAnswer::bare(Ok(session("s1")))
        };
        (at(ms), Input::SessionRecord(answer))
    };
    let (tick, input) = yielding(12_200);
    core.handle(&tick, input);
    assert!(
        !std::iter::from_fn(|| core.poll_action()).any(|a| matches!(a, Action::Write { .. })),
        "no write while the other daemon may take it"
    );
    assert_eq!(core.next_wake(), Some(t(14_200)));
    core.handle(&at(14_200), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core.handle(&at(14_210), Input::Read(Ok(Record::Valid(held.clone()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    let (tick, input) = yielding(14_220);
    core.handle(&tick, input);
    let Some(Action::Write { op, .. }) = core.poll_action() else {
        panic!("the session is ended");
    };
    assert_eq!(op, WriteOp::EndSession);
    core.handle(&at(14_230), Input::Written(Ok(WriteOutcome::Applied)));
    assert_takes_over(&mut core, held.rvn);
}

#[test]
fn a_record_older_than_a_write_the_stream_told_since_is_not_ended_on_while_that_write_is_not_due() {
    let mut core = follower();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer(&mut core, 20, "s1", 5, flowing(0, 6_000));
    core.handle(&at(10_000), Input::Session(Some(own_session(10_000))));
    core.handle(&at(10_105), Input::Timeout);
    assert!(matches!(read_kind(&mut core), Kind::Session(Some(_))));
    // The answer (shared, read at 20 ms) still shows s1, due; the stream
    // told of s3 at 9.9 s since: read again once s3 is due.
    let cached = SessionAnswer {
        record: Ok(session("s1").into()),
        learned: Some(t(5)),
        flow: flowing(0, 15_900),
        told: Some(("s3".into(), t(9_900))),
        moved: false,
        yields: false,
    };
    core.handle(&at(10_110), Input::SessionRecord(cached));
    assert!(
        !matches!(core.poll_action(), Some(Action::Write { .. })),
        "not ended"
    );
    let due = t(9_900) + Duration::from_millis(10_100);
    assert_eq!(core.next_wake(), Some(due));
    core.handle(&at(19_000), Input::Session(Some(own_session(19_000))));
    core.handle(&at(20_000), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Session(Some(due)));
    // A fresh read still finds s1: the stream told nothing since, and s1
    // is long due: ended.
    answer(&mut core, 20_010, "s1", 5, None);
    let Some(Action::Write { op, condition, .. }) = core.poll_action() else {
        panic!("the session is ended");
    };
    assert_eq!(
        (op, condition),
        (WriteOp::EndSession, Condition::RvnIs("s1".into()))
    );
}

/// A core leading "e" through its own session since 25 ms, with the
/// record it created.
fn leader() -> (Core, Lease) {
    let mut core = sessions_core();
    core.handle(&raw(0), Input::Session(Some(own_session(0))));
    core.handle(&raw(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core.handle(&raw(20), Input::Read(Ok(Record::Absent)));
    let created = loop {
        match core.poll_action() {
            Some(Action::Write { lease, .. }) => break lease,
            Some(_) => {}
            None => panic!("no write"),
        }
    };
    core.handle(&raw(25), Input::Written(Ok(WriteOutcome::Applied)));
    assert_eq!(core.state().role, Role::Leader);
    (core, created)
}

/// A take sent before a renewal of the session and answered after it:
/// the tenure is valid as long as the session, from that renewal (a slow
/// store answered the takes of a daemon of ten thousand elections after
/// the session's next write, and each tenure, dated from its take, ran
/// out before the write after).
#[test]
fn a_take_answered_after_a_renewal_of_the_session_is_valid_from_that_renewal() {
    let mut core = sessions_core();
    core.handle(&raw(0), Input::Session(Some(own_session(0))));
    core.handle(&raw(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core.handle(&raw(20), Input::Read(Ok(Record::Absent)));
    while core.poll_action().is_some() {}
    // The create was sent at 20; the session is renewed, sent at 5,000.
    core.handle(&raw(5_100), Input::Session(Some(own_session_raw(5_000))));
    core.handle(&raw(6_000), Input::Written(Ok(WriteOutcome::Applied)));
    assert_eq!(core.state().role, Role::Leader);
    let validity = ElectionConfig::with_defaults("e", "me").validity();
    let tenure = core.state().tenure.clone().expect("leading");
    assert_eq!(tenure.valid_until, raw(5_000).now + validity, "{tenure:?}");
}

#[test]
fn a_check_that_finds_the_record_deleted_or_rewritten_ends_the_tenure() {
    let (mut core, created) = leader();
    let token = created.fencing_token;
    // Still ours, or about another tenure: nothing happens.
    core.handle(
        &raw(3_000),
        Input::Checked {
            fencing_token: token,
            record: Record::Valid(created.clone()),
        },
    );
    core.handle(
        &raw(3_000),
        Input::Checked {
            fencing_token: token + 1,
            record: Record::Absent,
        },
    );
    assert_eq!(core.state().role, Role::Leader);
    assert!(core.state().tenure.is_some());
    // Deleted under it: the tenure is lost, the job stops now (kill grace
    // from now, not at the end of the session's validity).
    core.handle(
        &raw(4_000),
        Input::Checked {
            fencing_token: token,
            record: Record::Absent,
        },
    );
    let tenure = core.state().tenure.clone().expect("stopping");
    assert_eq!(tenure.stop_at, raw(4_000).now, "{tenure:?}");
    assert_ne!(core.state().role, Role::Leader);
    // Rewritten by another holder: the same.
    let (mut core, created) = leader();
    let other = Lease::stamped("e", "b", created.fencing_token + 1, 10_000, 1, None);
    core.handle(
        &raw(4_000),
        Input::Checked {
            fencing_token: created.fencing_token,
            record: Record::Valid(other),
        },
    );
    assert_ne!(core.state().role, Role::Leader);
}

#[test]
fn a_round_that_finds_the_election_free_without_a_session_asks_for_one_and_takes_it_once_open() {
    let mut core = sessions_core();
    core.handle(&raw(0), Input::Session(None));
    core.handle(&raw(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    assert!(!core.wants_session(), "nothing found yet");
    core.handle(&raw(5), Input::Read(Ok(Record::Absent)));
    assert!(
        core.wants_session(),
        "free, and no session to hold it through"
    );
    while let Some(action) = core.poll_action() {
        assert!(!matches!(action, Action::Write { .. }), "{action:?}");
    }
    // The session opens: the election is taken at once, held through it
    // (not at the next poll), under the condition the round read.
    core.handle(&raw(20), Input::Session(Some(own_session(15))));
    let written = loop {
        match core.poll_action() {
            Some(Action::Write { lease, op, .. }) => break (lease, op),
            Some(_) => {}
            None => panic!("no write"),
        }
    };
    assert_eq!(written.1, WriteOp::Create);
    assert_eq!(written.0.session.as_deref(), Some("#session/me/n0"));
    assert!(core.wants_session(), "taking it");
    core.handle(&raw(30), Input::Written(Ok(WriteOutcome::Applied)));
    assert!(core.wants_session(), "holding it");
}

#[test]
fn a_take_waiting_for_the_session_is_dropped_when_the_app_check_closes() {
    let mut core = sessions_core();
    core.handle(&raw(0), Input::Session(None));
    core.handle(&raw(0), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
    core.handle(&raw(5), Input::Read(Ok(Record::Absent)));
    assert!(core.wants_session());
    core.handle(&raw(10), Input::Gate(false));
    assert!(!core.wants_session(), "it may not campaign");
    core.handle(&raw(20), Input::Session(Some(own_session(15))));
    while let Some(action) = core.poll_action() {
        assert!(!matches!(action, Action::Write { .. }), "{action:?}");
    }
    assert_ne!(core.state().role, Role::Leader);
}

#[test]
fn a_follower_of_a_live_holder_does_not_want_a_session() {
    let mut core = follower();
    core.handle(&at(10), Input::Read(Ok(Record::Valid(election()))));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    answer(&mut core, 20, "s1", 5, flowing(0, 6_000));
    assert!(!core.wants_session());
}

/// What a build from before sessions makes of an election held through a
/// session: it knows neither `session` nor `format`, and times the record
/// by its own `rvn` and its stored `lease_ms` (the rule of this core
/// without sessions). Stored as a hundred years, a live tenure whose
/// record does not change on renew is never taken from under its holder.
#[test]
fn a_reader_that_does_not_know_sessions_never_takes_a_held_election() {
    let held = election();
    let as_stored = Lease {
        lease_ms: held.stored_lease_ms(),
        session: None,
        ..held
    };
    let mut old = Core::new(
        ElectionConfig::with_defaults("e", "old"),
        raw(0).now,
        Duration::ZERO,
        false,
        true,
    );
    old.handle(&raw(0), Input::Timeout);
    let day = 24 * 3_600 * 1_000;
    for ms in [1, 60_000, day, 30 * day] {
        while old.poll_action().is_some() {}
        old.handle(&raw(ms), Input::Timeout);
        old.handle(&raw(ms), Input::Read(Ok(Record::Valid(as_stored.clone()))));
        while let Some(action) = old.poll_action() {
            assert!(
                !matches!(action, Action::Write { .. }),
                "taken after {ms} ms: {action:?}"
            );
        }
    }
}

#[test]
fn a_take_that_loses_takes_the_record_it_lost_to_as_its_next_read() {
    // The election released, read, and taken: b's take came first.
    let released = election().handed_to_with(None, &raw(0).stamp);
    let lose = |current: Option<Record>| {
        let mut core = sessions_core();
        core.handle(&raw(0), Input::Session(Some(own_session_raw(0))));
        core.handle(&raw(0), Input::Timeout);
        assert_eq!(read_kind(&mut core), Kind::Election);
        core.handle(&raw(5), Input::Read(Ok(Record::Valid(released.clone()))));
        assert_takes_over(&mut core, released.rvn.clone());
        let lost = WriteOutcome::ConditionFailed { current };
        core.handle(&raw(9), Input::Written(Ok(lost)));
        core
    };
    // The store showed b's record: b's session is what is read next, and
    // the election is not read again.
    let mut core = lose(Some(Record::Valid(election())));
    assert_eq!(read_kind(&mut core), Kind::Session(None));
    assert_eq!(
        core.last_read_sent(),
        raw(5).now,
        "as if read with the take"
    );
    assert_eq!(core.state().leader.as_deref(), Some("b"));
    // A store that shows nothing (some emulators): a round reads it, at
    // once.
    let mut core = lose(None);
    assert_eq!(core.next_wake(), Some(raw(9).now));
    core.handle(&raw(9), Input::Timeout);
    assert_eq!(read_kind(&mut core), Kind::Election);
}

#[test]
fn a_handover_that_follows_takes_the_record_it_wrote_as_its_first_read() {
    let hand_over = |answer: Result<WriteOutcome, crate::core::store_error::StoreError>| {
        let (mut core, _) = leader();
        let then = super::AfterRelease::Follow;
        let successor = Some("b".to_owned());
        core.handle(&raw(100), Input::Release { then, successor });
        let written = loop {
            match core.poll_action() {
                Some(Action::Write { op, lease, .. }) => {
                    assert_eq!(op, WriteOp::Release);
                    break lease;
                }
                Some(_) => {}
                None => panic!("no release written"),
            }
        };
        core.handle(&raw(130), Input::Written(answer));
        (core, written)
    };
    // Applied: the store holds what was written; nothing is read, and
    // the record, handed to b, is waited on as if read with the release.
    let (mut core, written) = hand_over(Ok(WriteOutcome::Applied));
    while let Some(action) = core.poll_action() {
        assert!(
            !matches!(action, Action::Read { .. } | Action::Write { .. }),
            "{action:?}"
        );
    }
    assert_eq!(written.successor.as_deref(), Some("b"));
    assert_eq!(core.state().role, Role::Follower);
    assert_eq!(
        core.last_read_sent(),
        raw(100).now,
        "as if read with the release"
    );
    let poll = raw(130).now + ElectionConfig::with_defaults("e", "me").retry_interval;
    assert_eq!(core.next_wake(), Some(poll));
    // Not known to have applied: the record is read at once.
    let timeout = crate::core::store_error::StoreError::Timeout(Duration::from_secs(5));
    let (mut core, _) = hand_over(Err(timeout));
    assert_eq!(read_kind(&mut core), Kind::Election);
}
