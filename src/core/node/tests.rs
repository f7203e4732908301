//! The node, one input at a time: its elections, its session, what it
//! knows of other sessions, the read-back, the order of inputs.

use std::time::Duration;

use super::*;
use crate::core::election::{AfterRelease, Role, WriteOp};
use crate::core::hints::LeaseEvent;
use crate::core::record::{Condition, HolderMeta, Lease, WriteOutcome};
use crate::core::session::ENDED_LABEL;
use crate::core::store_error::StoreError;

const MS: Duration = Duration::from_millis(1);
/// The session of the other daemon, `b`, the tests follow.
pub(super) const THEIRS: &str = "#session/b/n1";

pub(super) fn t(ms: u64) -> Instant {
    Instant::from_since_origin(MS * ms as u32)
}

pub(super) fn at(ms: u64) -> Moment {
    Moment {
        tick: Tick::at_ms(ms),
        may_campaign: true,
    }
}

pub(super) fn timing() -> ElectionConfig {
    ElectionConfig::with_defaults("-", "me")
}

/// A node of "me" with elections `e0`..`e{n-1}`, all starting at once;
/// with its session (opened when wanted) if `sessions`.
pub(super) fn node(n: u32, sessions: bool) -> Node {
    let mut node = Node::new("me", &timing(), t(0), true);
    if sessions {
        node = node.with_session(timing(), false);
    }
    for i in 0..n {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), "me");
        node.add_election(cfg, Duration::ZERO, true, |c| c);
    }
    node
}

pub(super) fn e(n: u32) -> ElectionId {
    ElectionId(n)
}

/// Hand `input` in at `ms` and take every action out.
pub(super) fn handle(node: &mut Node, ms: u64, input: NodeInput) -> Vec<NodeAction> {
    node.handle(&at(ms), input);
    std::iter::from_fn(|| node.poll_action()).collect()
}

/// The store requests among `actions`.
pub(super) fn requests(actions: &[NodeAction]) -> Vec<NodeAction> {
    actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                NodeAction::Read { .. } | NodeAction::ReadMany { .. } | NodeAction::Write { .. }
            )
        })
        .cloned()
        .collect()
}

/// The write asked for by `request` among `actions`.
fn write_of(actions: &[NodeAction], request: &RequestId) -> (WriteOp, Lease, Condition) {
    actions
        .iter()
        .find_map(|a| match a {
            NodeAction::Write {
                request: r,
                op,
                lease,
                condition,
                ..
            } if r == request => Some((*op, (**lease).clone(), condition.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no write of {request:?} in {actions:?}"))
}

pub(super) fn applied(request: RequestId) -> NodeInput {
    NodeInput::Written {
        request,
        outcome: Ok(WriteOutcome::Applied),
    }
}

pub(super) fn read(request: RequestId, record: Record) -> NodeInput {
    NodeInput::Read {
        request,
        record: Ok(record),
    }
}

/// The election `name`, held by `b` through [`THEIRS`] under `token`.
pub(super) fn theirs(name: &str, token: u64) -> Lease {
    let meta = HolderMeta {
        address: Some("10.0.0.2:9777".into()),
        ..Default::default()
    };
    Lease::stamped(name, "b", token, 10_000, 1, Some(meta)).held_through(THEIRS)
}

/// `b`'s session record, written with `rvn` after `ended` of its tenures
/// ended.
pub(super) fn their_session(rvn: &str, ended: u64) -> Record {
    let mut s = Lease::stamped(THEIRS, "b", ended, 10_000, 1, None);
    s.rvn = rvn.into();
    Record::Valid(s)
}

#[test]
fn without_sessions_each_election_is_its_own_lease_with_a_request_of_its_own() {
    let mut node = node(2, false);
    assert_eq!(node.next_wake(), Some(t(0)));
    let out = handle(&mut node, 0, NodeInput::Timeout);
    assert_eq!(
        requests(&out),
        vec![
            NodeAction::Read {
                request: RequestId::Election(e(0)),
                key: "e0".into(),
                budget: Duration::from_secs(5),
                confirming: false,
            },
            NodeAction::Read {
                request: RequestId::Election(e(1)),
                key: "e1".into(),
                budget: Duration::from_secs(5),
                confirming: false,
            },
        ]
    );
    assert!(out.contains(&NodeAction::Publish(e(0))));
    assert_eq!(node.next_wake(), None, "both wait for their answers");
    // One answer does not wait for the other.
    let out = handle(
        &mut node,
        10,
        read(RequestId::Election(e(1)), Record::Absent),
    );
    let (op, lease, condition) = write_of(&out, &RequestId::Election(e(1)));
    assert_eq!((op, condition), (WriteOp::Create, Condition::NotExists));
    assert_eq!((lease.election.as_str(), lease.session), ("e1", None));
    handle(&mut node, 20, applied(RequestId::Election(e(1))));
    assert_eq!(node.state(e(1)).role, Role::Leader);
    assert_eq!(node.state(e(0)).role, Role::Follower);
    // Renewed by itself every R.
    assert_eq!(node.next_wake(), Some(t(5_000)));
}

#[test]
fn each_write_of_one_input_gets_a_stamp_of_its_own() {
    let mut node = node(2, false);
    handle(&mut node, 0, NodeInput::Timeout);
    let out = [e(0), e(1)]
        .into_iter()
        .map(|id| read(RequestId::Election(id), Record::Absent))
        .flat_map(|input| handle(&mut node, 10, input))
        .collect::<Vec<_>>();
    let a = write_of(&out, &RequestId::Election(e(0))).1.rvn;
    let b = write_of(&out, &RequestId::Election(e(1))).1.rvn;
    assert_eq!((a.as_str(), b.as_str()), ("v10", "v10"), "one input each");
    // Two answers in one input would share nothing: the Orphaned input
    // ends both at once, each release with its own rvn.
    handle(&mut node, 20, applied(RequestId::Election(e(0))));
    handle(&mut node, 20, applied(RequestId::Election(e(1))));
    let out = handle(&mut node, 30, NodeInput::Orphaned);
    let a = write_of(&out, &RequestId::Election(e(0))).1.rvn;
    let b = write_of(&out, &RequestId::Election(e(1))).1.rvn;
    assert_ne!(a, b);
    assert!(a.starts_with("v30") && b.starts_with("v30"));
}

/// A node of two elections with its session, `e0` leading through it
/// (`e1` starts a minute later).
fn leading_through_the_session() -> (Node, String) {
    let mut node = Node::new("me", &timing(), t(0), true).with_session(timing(), false);
    for (i, delay) in [(0, Duration::ZERO), (1, Duration::from_secs(60))] {
        let cfg = ElectionConfig::with_defaults(format!("e{i}"), "me");
        node.add_election(cfg, delay, true, |c| c);
    }
    let out = handle(&mut node, 0, NodeInput::Timeout);
    assert_eq!(requests(&out).len(), 1, "e0 reads, the session waits");
    // e0's round finds it free, but there is no session to hold it
    // through: the session opens for it.
    let out = handle(
        &mut node,
        10,
        read(RequestId::Election(e(0)), Record::Absent),
    );
    let (op, session, _) = write_of(&out, &RequestId::Session);
    assert_eq!(op, WriteOp::OpenSession);
    // Once open, the election is taken at once, through it.
    let out = handle(&mut node, 20, applied(RequestId::Session));
    assert!(out.contains(&NodeAction::PublishSession));
    let (op, lease, _) = write_of(&out, &RequestId::Election(e(0)));
    assert_eq!(op, WriteOp::Create);
    assert_eq!(lease.session.as_deref(), Some(session.election.as_str()));
    handle(&mut node, 30, applied(RequestId::Election(e(0))));
    assert_eq!(node.state(e(0)).role, Role::Leader);
    (node, session.election)
}

#[test]
fn the_session_opens_for_an_election_that_wants_it_and_its_tenure_follows_the_session() {
    let (mut node, key) = leading_through_the_session();
    assert_eq!(node.session_view().map(|v| v.key.clone()), Some(key));
    let valid = node
        .state(e(0))
        .tenure
        .clone()
        .expect("a tenure")
        .valid_until;
    assert_eq!(
        valid,
        t(10) + timing().validity(),
        "from the session's send"
    );
    // The session's renew moves the tenure's validity on.
    let out = handle(&mut node, 5_010, NodeInput::Timeout);
    let (op, _, _) = write_of(&out, &RequestId::Session);
    assert_eq!(op, WriteOp::RenewSession);
    handle(&mut node, 5_020, applied(RequestId::Session));
    let valid = node
        .state(e(0))
        .tenure
        .clone()
        .expect("a tenure")
        .valid_until;
    assert_eq!(valid, t(5_010) + timing().validity());
}

#[test]
fn a_tenures_end_moves_the_count_the_sessions_next_write_carries() {
    let (mut node, _) = leading_through_the_session();
    let out = handle(
        &mut node,
        1_000,
        NodeInput::Release {
            election: e(0),
            then: AfterRelease::SitOut(Duration::from_secs(10)),
            successor: None,
        },
    );
    let (op, _, _) = write_of(&out, &RequestId::Election(e(0)));
    assert_eq!(op, WriteOp::Release);
    assert_eq!(
        node.tenures_ended(),
        0,
        "not before its last write is answered"
    );
    let out = handle(&mut node, 1_010, applied(RequestId::Election(e(0))));
    assert!(out.contains(&NodeAction::Answer {
        election: e(0),
        released: true
    }));
    assert_eq!(node.tenures_ended(), 1);
    let out = handle(&mut node, 5_010, NodeInput::Timeout);
    let (_, renewed, _) = write_of(&out, &RequestId::Session);
    assert_eq!(renewed.fencing_token, 1);
}

#[test]
fn a_release_asked_for_while_a_request_is_in_flight_waits_for_its_answer() {
    let mut node = node(1, false);
    handle(&mut node, 0, NodeInput::Timeout);
    let release = NodeInput::Release {
        election: e(0),
        then: AfterRelease::Exit,
        successor: None,
    };
    let out = handle(&mut node, 5, release);
    assert!(requests(&out).is_empty(), "the read is still on its way");
    let out = handle(
        &mut node,
        10,
        read(RequestId::Election(e(0)), Record::Absent),
    );
    // The round's write goes out; the release waits for its answer too.
    let (op, _, _) = write_of(&out, &RequestId::Election(e(0)));
    assert_eq!(op, WriteOp::Create);
    let out = handle(&mut node, 20, applied(RequestId::Election(e(0))));
    let (op, _, _) = write_of(&out, &RequestId::Election(e(0)));
    assert_eq!(op, WriteOp::Release);
    let out = handle(&mut node, 30, applied(RequestId::Election(e(0))));
    assert!(out.contains(&NodeAction::Answer {
        election: e(0),
        released: true
    }));
    assert!(node.is_finished());
}

/// The read of [`THEIRS`] on its way answered at `ms`: written with
/// `rvn` after `ended` of its tenures ended.
pub(super) fn answer_their_session(node: &mut Node, ms: u64, rvn: &str, ended: u64) {
    handle(
        node,
        ms,
        read(
            RequestId::SessionRecord(THEIRS.into()),
            their_session(rvn, ended),
        ),
    );
}

/// A node of `n` elections following `b`'s through [`THEIRS`], its own
/// session open; every election read once (the read answered at 10).
pub(super) fn following(n: u32) -> Node {
    let mut node = node(n, true);
    let out = handle(&mut node, 0, NodeInput::Timeout);
    // Their first reads go out together (one alone), and the session of
    // `b` is read once for all of them.
    let mut session_reads = 0;
    for asked in requests(&out) {
        let answer = match asked {
            NodeAction::Read { request, key, .. } => {
                assert_eq!(n, 1, "a first read alone of {n} elections");
                read(request, Record::Valid(theirs(&key, 7)))
            }
            NodeAction::ReadMany { request, keys, .. } => NodeInput::ReadMany {
                request,
                records: Ok(keys.iter().map(|k| Record::Valid(theirs(k, 7))).collect()),
            },
            other => panic!("not a read: {other:?}"),
        };
        session_reads += handle(&mut node, 10, answer)
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    NodeAction::Read {
                        request: RequestId::SessionRecord(_),
                        ..
                    }
                )
            })
            .count();
    }
    assert_eq!(session_reads, 1);
    node
}

#[test]
fn one_read_of_another_daemons_session_answers_every_election_that_asked_while_it_was_on_its_way() {
    let mut node = following(3);
    let out = handle(
        &mut node,
        20,
        read(
            RequestId::SessionRecord(THEIRS.into()),
            their_session("s1", 0),
        ),
    );
    assert!(requests(&out).is_empty());
    // Each times the session's rvn from this read; the first answer after
    // their first read may count a release: each reads once more, at P.
    for i in 0..3 {
        assert_eq!(node.core(e(i)).next_wake(), Some(t(1_020)), "election {i}");
    }
    let known = node.known_session(THEIRS).expect("known");
    assert_eq!(known.latest, Some(("s1".into(), t(20))));
}

#[test]
fn the_read_back_tells_an_election_whose_record_was_rewritten_under_it() {
    let (mut node, key) = leading_through_the_session();
    // Renewed every R; the first period (at R) reads nothing of the
    // others (every 2R), the second reads e0.
    let out = handle(&mut node, 5_010, NodeInput::Timeout);
    assert!(!out.iter().any(|a| matches!(a, NodeAction::ReadMany { .. })));
    handle(&mut node, 5_020, applied(RequestId::Session));
    let out = handle(&mut node, 10_010, NodeInput::Timeout);
    assert!(
        out.contains(&NodeAction::ReadMany {
            request: RequestId::ReadBack(0),
            keys: vec!["e0".into()],
            budget: Duration::from_secs(5),
        }),
        "{out:?}"
    );
    // Rewritten by someone of the same name: its rvn is not one e0 wrote.
    let token = node.state(e(0)).fencing_token.expect("a token");
    let rewritten = Lease::stamped("e0", "me", token + 1, 10_000, 1, None).held_through(&key);
    handle(
        &mut node,
        10_010,
        NodeInput::ReadMany {
            request: RequestId::ReadBack(0),
            records: Ok(vec![Record::Valid(rewritten)]),
        },
    );
    assert_eq!(node.state(e(0)).role, Role::Stopping);
}

#[test]
fn a_closed_app_check_reaches_the_elections_before_the_session_it_came_with() {
    let mut node = node(1, true);
    handle(&mut node, 0, NodeInput::Timeout);
    // The round finds e0 free and waits for the session to take it.
    handle(
        &mut node,
        10,
        read(RequestId::Election(e(0)), Record::Absent),
    );
    // The app check closes as the session opens: no take.
    let closed = Moment {
        may_campaign: false,
        ..at(20)
    };
    node.handle(&closed, applied(RequestId::Session));
    let out: Vec<_> = std::iter::from_fn(|| node.poll_action()).collect();
    assert!(
        !out.iter().any(|a| matches!(
            a,
            NodeAction::Write {
                request: RequestId::Election(_),
                ..
            }
        )),
        "{out:?}"
    );
    assert_eq!(node.state(e(0)).role, Role::Follower);
}

#[test]
fn hints_wait_while_the_election_has_a_request_in_flight() {
    let mut node = node(1, false);
    handle(&mut node, 0, NodeInput::Timeout);
    let released = LeaseEvent::Released {
        election: "e0".into(),
        rvn: "r".into(),
        fencing_token: 7,
        successor: None,
    };
    let hint = Hint::Event {
        at: t(5),
        event: Box::new(released),
    };
    let out = handle(
        &mut node,
        5,
        NodeInput::Hint {
            election: e(0),
            hint,
        },
    );
    assert!(requests(&out).is_empty(), "the round's read is on its way");
    // Answered: the election follows a holder; the hint then makes it
    // read at once.
    let meta = HolderMeta {
        address: Some("10.0.0.2:9777".into()),
        ..Default::default()
    };
    let held = Lease::stamped("e0", "b", 7, 10_000, 1, Some(meta));
    let out = handle(
        &mut node,
        10,
        read(RequestId::Election(e(0)), Record::Valid(held)),
    );
    assert_eq!(requests(&out).len(), 1, "{out:?}");
}

#[test]
fn a_store_error_of_a_shared_session_read_reaches_every_election_asking() {
    let mut node = following(2);
    let out = handle(
        &mut node,
        20,
        NodeInput::Read {
            request: RequestId::SessionRecord(THEIRS.into()),
            record: Err(StoreError::Transport("down".into())),
        },
    );
    assert!(
        out.iter()
            .any(|a| matches!(a, NodeAction::Note { election: None, .. }))
    );
    for i in 0..2 {
        assert_eq!(node.state(e(i)).last_error.as_deref(), Some("transport"));
    }
}

#[test]
fn followers_polling_together_read_their_records_in_requests_of_a_hundred() {
    let mut node = following(150);
    // The first answer of the session after their first reads: each
    // polls its record again at P, all at once.
    answer_their_session(&mut node, 20, "s1", 0);
    let out = handle(&mut node, 1_020, NodeInput::Timeout);
    let sizes: Vec<(RequestId, usize)> = requests(&out)
        .into_iter()
        .map(|a| match a {
            NodeAction::ReadMany { request, keys, .. } => (request, keys.len()),
            other => panic!("not one read of many: {other:?}"),
        })
        .collect();
    assert_eq!(
        sizes,
        [(RequestId::Reads(0), 100), (RequestId::Reads(1), 50)]
    );
    // An answer that does not match the question is an error for each
    // election in it; the other request's records reach theirs.
    handle(
        &mut node,
        1_030,
        NodeInput::ReadMany {
            request: RequestId::Reads(1),
            records: Ok(vec![Record::Absent]),
        },
    );
    let records = (0..100)
        .map(|i| Record::Valid(theirs(&format!("e{i}"), 7)))
        .collect();
    let out = handle(
        &mut node,
        1_030,
        NodeInput::ReadMany {
            request: RequestId::Reads(0),
            records: Ok(records),
        },
    );
    // Those that read their record read the session, once for all.
    assert_eq!(requests(&out).len(), 1, "{out:?}");
    for i in 100..150 {
        assert!(
            node.state(e(i)).last_error.is_some(),
            "election {i} saw the error"
        );
    }
}

#[test]
fn a_sessions_labels_are_dated_from_when_they_were_first_learned_as_they_are() {
    let mut node = following(1);
    let map = |labels: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let with = |rvn: &str, labels: &[(&str, &str)]| {
        let mut record = their_session(rvn, 0);
        if let Record::Valid(s) = &mut record {
            s.holder_meta = Some(HolderMeta {
                labels: map(labels),
                ..HolderMeta::default()
            });
        }
        record
    };
    let told = |ms: u64, rvn: &str, labels: &[(&str, &str)]| NodeInput::SessionTold {
        key: THEIRS.into(),
        rvn: rvn.into(),
        labels: map(labels),
        at: t(ms),
        since: t(0),
    };
    let labels_at = |node: &Node| node.known_session(THEIRS).expect("known").labels_at;
    let session = RequestId::SessionRecord(THEIRS.into());
    handle(
        &mut node,
        20,
        read(session, with("s1", &[("priority", "2")])),
    );
    assert_eq!(
        labels_at(&node),
        Some(t(20)),
        "learned by the read's answer"
    );
    // The stream tells the same labels: still dated from the read.
    handle(&mut node, 100, told(100, "s2", &[("priority", "2")]));
    assert_eq!(labels_at(&node), Some(t(20)));
    // The list of ended tenures moves without changing the date.
    let ended = [("priority", "2"), (ENDED_LABEL, "1:e0")];
    handle(&mut node, 5_100, told(5_100, "s3", &ended));
    assert_eq!(labels_at(&node), Some(t(20)));
    // Gone, and back: each change dated when it was told.
    handle(&mut node, 10_100, told(10_100, "s4", &[]));
    assert_eq!(labels_at(&node), Some(t(10_100)));
    handle(&mut node, 15_100, told(15_100, "s5", &[("priority", "2")]));
    assert_eq!(labels_at(&node), Some(t(15_100)));
}
