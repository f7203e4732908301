//! The node and the owner's stream of a session it follows through:
//! elections left to the stream, parked for its next write, its end, and
//! the session's count of ended tenures read as it moves.

use std::time::Duration;

use super::tests::{
    THEIRS, answer_their_session, e, following, handle, read, requests, t, their_session, theirs,
    timing,
};
use super::*;
use crate::core::record::HolderMeta;

/// [`following`] with the owner's stream flowing since 0, every election
/// read again after the count was seen, left to the session alone: due
/// at `due` (the session's rvn `s1`, told at 15).
fn left_to_the_stream(n: u32) -> (Node, Instant) {
    let mut node = following(n);
    let told = |ms: u64, rvn: &str| NodeInput::SessionTold {
        key: THEIRS.into(),
        rvn: rvn.into(),
        labels: Default::default(),
        at: t(ms),
        since: t(0),
    };
    handle(&mut node, 15, told(15, "s1"));
    answer_their_session(&mut node, 20, "s1", 0);
    // Read again at P, all in one request (one alone): the count is now
    // known.
    let out = handle(&mut node, 1_020, NodeInput::Timeout);
    let keys: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
    let budget = timing().renew_interval;
    let answer = if n == 1 {
        let request = RequestId::Election(e(0));
        let asked = NodeAction::Read {
            request: request.clone(),
            key: keys[0].clone(),
            budget,
            confirming: false,
        };
        assert_eq!(requests(&out), [asked]);
        read(request, Record::Valid(theirs(&keys[0], 7)))
    } else {
        let request = RequestId::Reads(0);
        let asked = NodeAction::ReadMany {
            request: request.clone(),
            keys: keys.clone(),
            budget,
        };
        assert_eq!(requests(&out), [asked]);
        let records = keys.iter().map(|k| Record::Valid(theirs(k, 7))).collect();
        NodeInput::ReadMany {
            request,
            records: Ok(records),
        }
    };
    let out = handle(&mut node, 1_030, answer);
    // A round that read the election reads the session anew, one read
    // for all.
    assert_eq!(requests(&out).len(), 1);
    answer_their_session(&mut node, 1_040, "s1", 0);
    let due = t(15) + Duration::from_millis(10_100);
    for i in 0..n {
        assert_eq!(node.core(e(i)).next_wake(), Some(due), "election {i}");
    }
    (node, due)
}

/// The one read of [`THEIRS`] a node sends for all its elections.
fn reads_their_session() -> NodeAction {
    NodeAction::Read {
        request: RequestId::SessionRecord(THEIRS.into()),
        key: THEIRS.into(),
        budget: Duration::from_secs(5),
        confirming: false,
    }
}

/// The owner's stream tells, at `ms`, of its session's write `rvn`.
fn tell(node: &mut Node, ms: u64, rvn: &str) -> Vec<NodeAction> {
    let told = NodeInput::SessionTold {
        key: THEIRS.into(),
        rvn: rvn.into(),
        labels: Default::default(),
        at: t(ms),
        since: t(0),
    };
    handle(node, ms, told)
}

/// [`left_to_the_stream`], the owner renewing every R (told each time)
/// until its writes' news spared two reads: at 20,115 ms the elections
/// are due, the last read two waits old, and they wait for the next
/// write to be told.
fn parked(n: u32) -> Node {
    let (mut node, due) = left_to_the_stream(n);
    tell(&mut node, 5_015, "s2");
    tell(&mut node, 10_015, "s3");
    // Due; the read is one wait old, and the stream told of a later write
    // since: that will do, and they wait for s3 to be due.
    let out = handle(&mut node, 10_115, NodeInput::Timeout);
    assert_eq!(due, t(10_115));
    assert!(requests(&out).is_empty(), "{out:?}");
    assert_eq!(node.next_wake(), Some(t(20_115)));
    tell(&mut node, 15_015, "s4");
    tell(&mut node, 20_015, "s5");
    // Two waits old now: they wait for the next write to be told, a
    // slack at most.
    let out = handle(&mut node, 20_115, NodeInput::Timeout);
    assert!(requests(&out).is_empty(), "{out:?}");
    assert_eq!(node.next_wake(), Some(t(22_115)));
    node
}

#[test]
fn elections_left_to_the_stream_read_their_session_together_once_the_next_write_is_told() {
    let mut node = parked(3);
    let out = tell(&mut node, 21_000, "s6");
    assert_eq!(
        requests(&out),
        vec![reads_their_session()],
        "one read for the three"
    );
    answer_their_session(&mut node, 21_010, "s6", 0);
    // Timed from its event.
    let next = t(21_000) + Duration::from_millis(10_100);
    for i in 0..3 {
        assert_eq!(node.core(e(i)).next_wake(), Some(next), "election {i}");
    }
}

/// A daemon killed after a write of its session and before its stream
/// told it: the stream's end has the session read at once, one read for
/// every election, so the write unheard of is timed from that read, not
/// from the elections' next read of the session (at their due, a wait
/// later).
#[test]
fn a_stream_that_ends_has_its_session_read_at_once_to_time_a_write_it_did_not_tell() {
    let (mut node, due) = left_to_the_stream(3);
    // s2 written at 5,000 and never told: the stream breaks at 5,005.
    let out = handle(
        &mut node,
        5_005,
        NodeInput::SessionStreamEnded { key: THEIRS.into() },
    );
    assert_eq!(
        requests(&out),
        vec![reads_their_session()],
        "one read of the session"
    );
    // Ended again before the read answered: no second read.
    let again = handle(
        &mut node,
        5_006,
        NodeInput::SessionStreamEnded { key: THEIRS.into() },
    );
    assert!(requests(&again).is_empty(), "{again:?}");
    answer_their_session(&mut node, 5_015, "s2", 0);
    let known = node.known_session(THEIRS).expect("known");
    // Learned when the answer came.
    assert_eq!(known.latest, Some(("s2".into(), t(5_015))));
    // At s1's due the answer will do: s2 is not due before 15,115.
    let out = handle(
        &mut node,
        due.since_origin().as_millis() as u64,
        NodeInput::Timeout,
    );
    assert!(
        !requests(&out).iter().any(|a| matches!(
            a,
            NodeAction::Read {
                request: RequestId::SessionRecord(_),
                ..
            }
        )),
        "{out:?}"
    );
}

#[test]
fn a_parked_election_reads_after_the_slack_when_the_stream_tells_nothing() {
    let mut node = parked(2);
    let out = handle(&mut node, 22_115, NodeInput::Timeout);
    assert_eq!(requests(&out).len(), 1, "{out:?}");
}

#[test]
fn a_count_the_node_cannot_account_for_has_the_election_read_again() {
    let mut node = parked(1);
    handle(&mut node, 22_115, NodeInput::Timeout);
    // b released e0 and hid it from its stream; its session's count moved.
    answer_their_session(&mut node, 22_120, "s6", 1);
    assert_eq!(node.core(e(0)).next_wake(), Some(t(23_120)));
}

#[test]
fn a_count_whose_ends_are_named_has_only_the_elections_named_read_again() {
    let mut node = parked(3);
    handle(&mut node, 22_115, NodeInput::Timeout);
    // b released e1 (told or not); its session names that end.
    let mut session = their_session("s6", 1);
    if let Record::Valid(s) = &mut session {
        s.holder_meta = Some(HolderMeta {
            labels: [(
                crate::core::session::ENDED_LABEL.to_owned(),
                "1:e1".to_owned(),
            )]
            .into(),
            ..Default::default()
        });
    }
    handle(
        &mut node,
        22_120,
        read(RequestId::SessionRecord(THEIRS.into()), session),
    );
    assert_eq!(node.core(e(1)).next_wake(), Some(t(23_120)), "e1 read at P");
    // e0 and e2 wait for the session, as before the count moved.
    let later = t(22_120) + Duration::from_millis(5_000);
    for i in [0, 2] {
        let wake = node.core(e(i)).next_wake().expect("a wake");
        assert!(wake > later, "election {i} wakes at {wake:?}");
    }
}
