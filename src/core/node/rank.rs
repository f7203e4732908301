//! Who takes first: when several daemons find one election free at once
//! (the session it was held through timed out), each ranks the daemons
//! by a hash of the election's name and theirs, and one that a live
//! daemon of the same set ranks before waits a moment for that daemon's
//! take (`crate::core::session::SessionAnswer::yields`). Advice only:
//! every take stays conditional on the record read.

/// The label of a daemon's session naming the set of elections it
/// campaigns for (a digest; balance writes it).
pub const SET_LABEL: &str = "elections";

/// Whether the daemon `other` ranks before the daemon `me` to take the
/// election `election` when both find it free: a hash of the identity and
/// the election's name, so the elections of a session that timed out are
/// split among the daemons that follow it, each taking its part at once.
pub fn outranks(other: &str, me: &str, election: &str) -> bool {
    (rank(other, election), other) > (rank(me, election), me)
}

/// FNV-1a of `identity`, a zero byte and `election`, its bits then mixed
/// (MurmurHash3's finalizer: FNV alone orders mostly by the identity): the
/// same on every build and platform, unlike std's hasher.
fn rank(identity: &str, election: &str) -> u64 {
    let bytes = identity.bytes().chain([0]).chain(election.bytes());
    let mut h = bytes.fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::election::{ElectionConfig, WriteOp};
    use crate::core::node::tests::{
        THEIRS, applied, handle, read, t, their_session, theirs, timing,
    };
    use crate::core::node::{Node, NodeAction, NodeInput, RequestId};
    use crate::core::record::{HolderMeta, Lease, Record};

    #[test]
    fn of_two_daemons_one_outranks_the_other_for_each_election_and_each_for_about_half() {
        let names: Vec<String> = (0..1_000).map(|i| format!("e-{i:05}")).collect();
        let first = names.iter().filter(|e| outranks("a", "b", e)).count();
        for e in &names {
            assert_ne!(outranks("a", "b", e), outranks("b", "a", e), "{e}");
            assert!(!outranks("a", "a", e));
        }
        assert!(
            (400..=600).contains(&first),
            "a ranks first for {first} of 1000"
        );
    }

    /// The session of `other` (its record labelled with the set `set`): a
    /// daemon "me" of the set `x`, with `e0` held through `b`'s session
    /// ([`THEIRS`], never renewed: `b` is dead) and `e1` through `other`'s,
    /// whose stream tells of a write every R. Returns when "me" first ends
    /// `b`'s session or takes `e0`, in ms.
    fn takeover_of_e0_beside(other: &str, set: &str) -> u64 {
        let key = format!("#session/{other}/n1");
        let labels =
            |set: &str| std::collections::BTreeMap::from([(SET_LABEL.to_owned(), set.to_owned())]);
        let mut node = Node::new("me", &timing(), t(0), true).with_session(timing(), true);
        for i in 0..2 {
            let cfg = ElectionConfig::with_defaults(format!("e{i}"), "me");
            node.add_election(cfg, Duration::ZERO, true, |c| c);
        }
        handle(&mut node, 0, NodeInput::Labels(labels("x")));
        let theirs_too = |rvn: String| {
            let meta = HolderMeta {
                labels: labels(set),
                ..HolderMeta::default()
            };
            let mut s = Lease::stamped(&key, other, 0, 10_000, 1, Some(meta));
            s.rvn = rvn;
            Record::Valid(s)
        };
        // Each read finds the same records (the same `rvn`).
        let (e0, e1) = (
            theirs("e0", 7),
            Lease::stamped("e1", other, 7, 10_000, 1, None).held_through(&key),
        );
        let record = |name: &str| Record::Valid(if name == "e0" { e0.clone() } else { e1.clone() });
        let (mut ms, mut next_tell) = (0, 100);
        let mut out = handle(&mut node, 0, NodeInput::Timeout);
        loop {
            while let Some(action) = out.pop() {
                let input = match action {
                    NodeAction::Write { op, ref lease, .. }
                        if (op == WriteOp::EndSession && lease.election == THEIRS)
                            || (op == WriteOp::TakeOver && lease.election == "e0") =>
                    {
                        return ms;
                    }
                    NodeAction::Write { request, .. } => applied(request),
                    NodeAction::Read {
                        request: RequestId::SessionRecord(k),
                        ..
                    } => {
                        let answer = match k == THEIRS {
                            true => their_session("s1", 0),
                            false => theirs_too(format!("c{}", ms / 5_000)),
                        };
                        read(RequestId::SessionRecord(k), answer)
                    }
                    NodeAction::Read { request, key, .. } => read(request, record(&key)),
                    NodeAction::ReadMany { request, keys, .. } => NodeInput::ReadMany {
                        request,
                        records: Ok(keys.iter().map(|k| record(k)).collect()),
                    },
                    _ => continue,
                };
                out.extend(handle(&mut node, ms, input));
            }
            let wake = node
                .next_wake()
                .map_or(u64::MAX, |w| w.since_origin().as_millis() as u64);
            ms = wake.min(next_tell);
            assert!(ms < 40_000, "e0 never taken");
            out = if ms == next_tell {
                next_tell += 5_000;
                let told = NodeInput::SessionTold {
                    key: key.clone(),
                    rvn: format!("c{}", ms / 5_000),
                    labels: labels(set),
                    at: t(ms),
                    since: t(0),
                };
                handle(&mut node, ms, told)
            } else {
                handle(&mut node, ms, NodeInput::Timeout)
            };
        }
    }

    #[test]
    fn a_takeover_waits_two_retry_intervals_for_a_live_daemon_of_the_same_set_ranked_before() {
        let ranks = |first: bool| {
            (0..100)
                .map(|i| format!("c{i}"))
                .find(|c| outranks(c, "me", "e0") == first)
                .expect("found")
        };
        let alone = takeover_of_e0_beside(&ranks(false), "x");
        assert!(
            alone >= 10_100,
            "not before b's session timed out: {alone} ms"
        );
        let other_set = takeover_of_e0_beside(&ranks(true), "y");
        let waited = takeover_of_e0_beside(&ranks(true), "x");
        assert_eq!(other_set, alone, "another set's daemon is not waited for");
        assert!(
            waited >= alone + 2_000,
            "ranked before: waited from {alone} to {waited} ms"
        );
    }
}
