//! The model checks: the nodes and their cores as built keep every
//! property over the explored space, and each deliberate defect (of an
//! election core, or of the node's multiplexing layer) is found with a
//! trace.
//!
//! Two searches: breadth first (every interleaving, shortest first, as far
//! as the state budget reaches: the start of an election, its first
//! renewals, hints and faults around them) and random walks to the horizon
//! (deep: pauses longer than a lease, takeovers, handovers, crashes).
//! `LEADERD_MODEL_STATES` sets the budget of generated states of the main
//! check's breadth-first searches (default 900,000 each, which comes to
//! over a million distinct states over the four; its walks and the other
//! checks take an eighth of it); docs/model-checking.md gives the figures
//! of a longer run.

use std::collections::BTreeMap;
use std::time::Duration;

use stateright::report::{ReportData, ReportDiscovery, Reporter};
use stateright::{Checker, Chooser, HasDiscoveries, Model};

use super::{
    Bounds, LED_AFTER_CRASH, LED_AFTER_RELEASE, LED_AFTER_REOPEN, LED_BY_PREFERRED, NodeModel,
    Step, World,
};
use crate::core::election::Mutations;
use crate::core::node::NodeMutations;

const ONE_JOB: &str = "one job at a time";
const TOKENS: &str = "fencing tokens rise";
const SUCCESSOR: &str = "a handed-over lease waits a lease for others";
const IN_TIME: &str = "a follower leads in time after a crash";
const APP_CHECK: &str = "no take while the app check fails";
const RELEASED: &str = "a released election is led again in time";

/// Three daemons of one election each, every election its own lease.
fn bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        identities,
        elections: 1,
        horizon: 40_000,
        hints: 2,
        losses: 2,
        resigns: 1,
        crashes: 1,
        pauses: 1,
        delays: 2,
        gate_closes: 0,
        gate_opens: 0,
        preempts: 0,
        deletes: 0,
        timely: false,
        mutations: Mutations::default(),
        node_mutations: NodeMutations::default(),
        sessions: false,
        // The first and the third hear the owners' streams, the second polls.
        streams: [true, false, true],
        strict: false,
        always_session: false,
        settle: 0,
    }
}

/// Three daemons of two elections each, every election held through its
/// daemon's session; an app check may fail.
fn session_bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        elections: 2,
        sessions: true,
        gate_closes: 1,
        ..bounds(identities)
    }
}

/// [`session_bounds`] with app checks that pass: for the defects of
/// takeovers, which a daemon releasing everything would hide.
fn steady_session_bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        gate_closes: 0,
        ..session_bounds(identities)
    }
}

/// [`session_bounds`] with preferred leaders: a leader may preempt an
/// election to whichever daemon it believes above it (true, stale or
/// forged), and a gate may close for a hold-back (any daemon, holding or
/// not) and open again. No resign: a preemption is one.
fn priority_bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        resigns: 0,
        gate_opens: 1,
        preempts: 1,
        ..session_bounds(identities)
    }
}

/// The examples of the `sometimes` properties: not defects.
const EXAMPLES: [&str; 4] = [
    LED_AFTER_CRASH,
    LED_AFTER_RELEASE,
    LED_AFTER_REOPEN,
    LED_BY_PREFERRED,
];

/// The default budget of generated states of a breadth-first search.
const BUDGET: usize = 900_000;

/// The most states a search for a deliberate defect may visit: far more
/// than any of them needs (each is found within half a million).
const DEFECT_BUDGET: usize = 4_000_000;

fn budget() -> usize {
    std::env::var("LEADERD_MODEL_STATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BUDGET)
}

/// The random numbers of one walk (SplitMix64): seeded by the checker for
/// each walk, so that the walks are the same for the same seed, and drawn
/// without a generator from outside the core.
#[derive(Debug, Clone)]
struct Dice(u64);

impl Dice {
    /// A number in `0..n` (`n` > 0); the bias of the modulo is below
    /// 2^-32 for the few thousand steps a walk chooses among.
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % u64::from(n)) as u32
    }
}

/// Random walks that take the ordinary steps (wake, store, answer, time)
/// ten times as often as a fault (a hint, a loss, a freeze, a crash, a
/// resign, a frozen core's request served), so that a walk lives long
/// enough for a deep defect.
#[derive(Clone)]
struct FaultShy {
    /// How long a pause lasts at least, real ms: a lease.
    pause: u64,
}

impl Chooser<NodeModel> for FaultShy {
    type State = Dice;

    fn new_state(&self, seed: u64) -> Dice {
        Dice(seed)
    }

    fn choose_initial_state(&self, _dice: &mut Dice, _initial: &[World]) -> usize {
        0
    }

    fn choose_action(&self, dice: &mut Dice, w: &World, steps: &[Step]) -> usize {
        let weight = |s: &Step| match s {
            // The walks pause a core for a lease at least, its request
            // still on its way (breadth first covers shorter pauses).
            Step::Store(n, ..) | Step::Thaw(n) if w.daemons[*n].frozen => {
                u32::from(w.t >= w.daemons[*n].frozen_at + self.pause)
            }
            // The walks spend their one pause on a leader with a write on
            // its way (breadth first covers the other pauses).
            Step::Freeze(n) => {
                let daemon = &w.daemons[*n];
                let leads = w.leads_any(*n);
                let busy = daemon
                    .requests
                    .values()
                    .any(|r| matches!(r, super::store::Request::Write { .. }));
                u32::from(leads && busy) * 4
            }
            Step::Wake(_)
            | Step::Store(..)
            | Step::Answer(..)
            | Step::Advance(_)
            | Step::ReleaseFailing(..) => 10,
            _ => 1,
        };
        let total: u32 = steps.iter().map(weight).sum();
        if total == 0 {
            let len = u32::try_from(steps.len()).unwrap_or(u32::MAX);
            return dice.below(len) as usize;
        }
        let mut pick = dice.below(total);
        for (i, s) in steps.iter().enumerate() {
            if pick < weight(s) {
                return i;
            }
            pick -= weight(s);
        }
        steps.len() - 1
    }
}

/// How a check walks the space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    /// Every interleaving, shortest first.
    BreadthFirst,
    /// Random walks from the start to the horizon (a fixed seed: the same
    /// walks every run).
    RandomWalks,
}

/// What a search found.
struct Found {
    /// Distinct states (breadth first) or states visited (walks).
    states: usize,
    /// Properties broken.
    broken: Vec<String>,
    /// Examples found of the `sometimes` properties.
    examples: Vec<String>,
}

/// Explore `model` up to `states` states (or the whole space); print what
/// was explored and every property broken, with its trace.
fn explore(label: &str, model: NodeModel, states: usize, search: Search) -> Found {
    let walks = FaultShy {
        pause: model.cfg.lease_duration.as_millis() as u64,
    };
    let builder = model
        .checker()
        .threads(2)
        .target_state_count(states)
        .finish_when(HasDiscoveries::AnyFailures);
    match search {
        Search::BreadthFirst => report(label, builder.spawn_bfs(), states),
        Search::RandomWalks => report(label, builder.spawn_simulation(26, walks), states),
    }
}

/// How long a search took, as the checker timed it (the core reads no
/// clock, not even in its tests).
#[derive(Default)]
struct Took(Duration);

impl Reporter<NodeModel> for Took {
    fn report_checking(&mut self, data: ReportData) {
        // The last report is the final one, or one a moment before it.
        self.0 = self.0.max(data.duration);
    }

    fn report_discoveries(
        &mut self,
        _model: &NodeModel,
        _discoveries: BTreeMap<&'static str, ReportDiscovery<NodeModel>>,
    ) {
        // Printed with their traces by `report`.
    }

    fn delay(&self) -> Duration {
        // How often the checker's progress is looked at: also how long
        // a search may outlast its end before it is reported.
        Duration::from_millis(50)
    }
}

/// Wait for `checker`'s search to end; print what was explored and every
/// property broken, with its trace.
fn report<C>(label: &str, checker: C, states: usize) -> Found
where
    C: Checker<NodeModel> + Send + Sync,
{
    let mut took = Took::default();
    let checker = checker.join_and_report(&mut took);
    let mut found = Found {
        states: checker.unique_state_count(),
        broken: Vec::new(),
        examples: Vec::new(),
    };
    for (name, path) in checker.discoveries() {
        if EXAMPLES.contains(&name) {
            found.examples.push(name.to_owned());
            continue;
        }
        println!("  broken: {name}; counterexample:");
        print!("{}", checker.model().trace(&path.into_vec()));
        found.broken.push(name.to_owned());
    }
    println!(
        "model check {label}: {} distinct states ({} generated), depth {}, {} in {:.1} s",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        if !found.broken.is_empty() {
            "stopped at the first broken property"
        } else if checker.state_count() < states {
            "the whole space within the bounds"
        } else {
            "stopped at the state budget"
        },
        took.0.as_secs_f64()
    );
    found
}

/// Breadth first (`states` each) and random walks (an eighth of that)
/// over `bounds` with each of the identities' sets: nothing broken.
/// Returns the distinct states breadth first.
fn keeps_every_property(
    label: &str,
    bounds: &Bounds,
    sets: &[[&'static str; 3]],
    states: usize,
) -> usize {
    let mut breadth = 0;
    for identities in sets {
        for search in [Search::BreadthFirst, Search::RandomWalks] {
            let found = explore(
                &format!("{search:?}, {label}identities {identities:?}"),
                NodeModel::new(Bounds {
                    identities: *identities,
                    ..bounds.clone()
                }),
                match search {
                    Search::BreadthFirst => states,
                    Search::RandomWalks => states / 8,
                },
                search,
            );
            assert!(found.broken.is_empty(), "broke {:?}", found.broken);
            if search == Search::BreadthFirst {
                breadth += found.states;
            }
        }
    }
    breadth
}

const RESTARTED: [&str; 3] = ["a", "b", "a"];
const THREE: [&str; 3] = ["a", "b", "c"];

#[test]
fn the_nodes_keep_every_property_over_a_million_states() {
    let sets = [THREE, RESTARTED];
    let sessions = keeps_every_property(
        "3 daemons x 2 elections, sessions, ",
        &session_bounds(THREE),
        &sets,
        budget(),
    );
    let single = keeps_every_property("3 daemons x 1 election, ", &bounds(THREE), &sets, budget());
    let breadth = sessions + single;
    println!(
        "model check: {breadth} distinct states breadth first in all \
         ({sessions} of 3 daemons x 2 elections through sessions)"
    );
    // A smaller LEADERD_MODEL_STATES is for a quick local run.
    assert!(
        breadth >= 1_000_000 || budget() < BUDGET,
        "explored only {breadth} distinct states"
    );
}

#[test]
fn preemptions_to_any_believed_priority_and_gates_that_reopen_keep_every_property() {
    let mut examples = Vec::new();
    for identities in [THREE, RESTARTED] {
        for search in [Search::BreadthFirst, Search::RandomWalks] {
            let found = explore(
                &format!("{search:?}, preferred leaders, identities {identities:?}"),
                NodeModel::new(priority_bounds(identities)),
                // The walks reach the preemptions (after `preempt_after`);
                // breadth first covers gates closing and opening early.
                match search {
                    Search::BreadthFirst => budget() / 4,
                    Search::RandomWalks => budget() / 8,
                },
                search,
            );
            assert!(found.broken.is_empty(), "broke {:?}", found.broken);
            examples.extend(found.examples);
        }
    }
    // Not vacuous: some run reached each.
    for example in [LED_AFTER_REOPEN, LED_BY_PREFERRED] {
        assert!(
            examples.iter().any(|e| e == example),
            "no explored run had: {example}"
        );
    }
}

/// The bounded-delay check over `base`: a follower leads in time after a
/// crash whatever the hints say, and some explored run saw each of
/// `expected` happen, so that it is not vacuous.
fn bounded_delay(label: &str, base: Bounds, states: usize, expected: &[&str]) {
    let model = || {
        NodeModel::new(Bounds {
            timely: true,
            hints: 3,
            losses: 0,
            pauses: 0,
            delays: 0,
            horizon: 45_000,
            ..base.clone()
        })
    };
    let crash = model().takeover_bound();
    let release = model().release_bound();
    let mut examples = Vec::new();
    for search in [Search::BreadthFirst, Search::RandomWalks] {
        let found = explore(
            &format!(
                "{search:?}, {label}timely, bounds {crash} ms (crash), {release} ms (release)"
            ),
            model(),
            states,
            search,
        );
        assert!(found.broken.is_empty(), "broken: {:?}", found.broken);
        examples.extend(found.examples);
    }
    for example in expected {
        assert!(
            examples.iter().any(|e| e == example),
            "no explored run had: {example}"
        );
    }
}

#[test]
fn a_follower_leads_within_a_bounded_delay_whatever_the_hints_say() {
    let base = Bounds {
        resigns: 0,
        ..bounds(THREE)
    };
    bounded_delay("", base, budget() / 8, &[LED_AFTER_CRASH]);
}

#[test]
fn through_sessions_a_follower_leads_within_a_bounded_delay_after_a_crash() {
    let base = Bounds {
        resigns: 0,
        gate_closes: 0,
        ..session_bounds(THREE)
    };
    bounded_delay(
        "3 daemons x 2 elections, sessions, ",
        base,
        budget() / 8,
        &[LED_AFTER_CRASH],
    );
}

/// Three daemons of two elections through sessions that stay open (as
/// with balance), timely: one resigns an election to anyone (it sits
/// out), one's app check fails (it releases what it leads and takes
/// nothing); the owners' streams hide every release, so the followers
/// find one by the session's count of ended tenures.
fn release_bounds() -> Bounds {
    Bounds {
        always_session: true,
        timely: true,
        hints: 3,
        losses: 0,
        pauses: 0,
        delays: 0,
        crashes: 0,
        horizon: 50_000,
        ..session_bounds(THREE)
    }
}

/// [`release_bounds`] with a silent network, every daemon hearing the
/// owners' streams (none polls): nothing but the session's count of ended
/// tenures tells the followers of a release. Releases come once the
/// followers timed their leaders' sessions (from 12 s on), and the run
/// lasts the bound after that.
fn silent_release_bounds() -> Bounds {
    Bounds {
        hints: 0,
        streams: [true; 3],
        settle: 12_000,
        horizon: 50_000,
        ..release_bounds()
    }
}

#[test]
fn through_sessions_a_released_election_is_led_again_within_a_bounded_delay_when_the_stream_hides_it()
 {
    let bound = NodeModel::new(release_bounds()).release_bound();
    let mut examples = Vec::new();
    // The hostile network over every start, then a silent one over
    // releases that only the count tells of (walks: they come late).
    let searches = [
        ("", release_bounds(), Search::BreadthFirst),
        ("", release_bounds(), Search::RandomWalks),
        ("silent, ", silent_release_bounds(), Search::RandomWalks),
    ];
    for (label, bounds, search) in searches {
        let found = explore(
            &format!(
                "{search:?}, 3 daemons x 2 elections, sessions, {label}releases hidden, bound {bound} ms"
            ),
            NodeModel::new(bounds),
            budget() / 8,
            search,
        );
        assert!(found.broken.is_empty(), "broken: {:?}", found.broken);
        examples.extend(found.examples);
    }
    assert!(
        examples.iter().any(|e| e == LED_AFTER_RELEASE),
        "no explored run had a released election led again"
    );
}

/// Records deleted by hand under a tenure, with `strict_new_lease`: the
/// holder's read-back notices before the creator leads. The read-back
/// works (no lost or late answer, no pause), and the restarted daemon of
/// the same name polls.
fn deletion_bounds() -> Bounds {
    Bounds {
        strict: true,
        deletes: 1,
        losses: 0,
        pauses: 0,
        delays: 0,
        gate_closes: 0,
        horizon: 45_000,
        streams: [true, true, false],
        ..session_bounds(RESTARTED)
    }
}

#[test]
fn a_record_deleted_under_a_tenure_with_strict_new_lease_never_makes_two_leaders() {
    keeps_every_property(
        "deletes, strict, ",
        &deletion_bounds(),
        &[RESTARTED],
        budget() / 8,
    );
}

/// The defect `mutations` must break a property (`expected`, or another:
/// each broken one is printed with its trace).
fn caught(mutations: Mutations, identities: [&'static str; 3], expected: &str) {
    caught_in(
        bounds(identities),
        mutations,
        NodeMutations::default(),
        expected,
    );
}

/// [`caught`], within `bounds`, with defects of the node too.
fn caught_in(bounds: Bounds, mutations: Mutations, node: NodeMutations, expected: &str) {
    let model = NodeModel::new(Bounds {
        mutations,
        node_mutations: node,
        ..bounds
    });
    let found = explore(
        &format!("with {mutations:?} {node:?}"),
        model,
        DEFECT_BUDGET,
        Search::RandomWalks,
    );
    assert!(
        !found.broken.is_empty(),
        "{mutations:?} {node:?} was not caught (expected: {expected})"
    );
}

#[test]
fn validity_dated_from_the_reply_is_caught() {
    caught(
        Mutations {
            validity_from_reply: true,
            ..Mutations::default()
        },
        THREE,
        ONE_JOB,
    );
}

#[test]
fn a_record_handed_to_someone_else_taken_at_once_is_caught() {
    caught(
        Mutations {
            successor_ignored: true,
            ..Mutations::default()
        },
        THREE,
        SUCCESSOR,
    );
}

#[test]
fn a_forged_released_trusted_is_caught() {
    caught(
        Mutations {
            released_hint_trusted: true,
            ..Mutations::default()
        },
        THREE,
        ONE_JOB,
    );
}

#[test]
fn a_hint_lease_ms_used_for_timing_is_caught() {
    caught(
        Mutations {
            hint_lease_ms_used: true,
            ..Mutations::default()
        },
        THREE,
        ONE_JOB,
    );
}

#[test]
fn a_renew_that_does_not_check_the_rvn_is_caught() {
    caught(
        Mutations {
            renew_ignores_rvn: true,
            ..Mutations::default()
        },
        RESTARTED,
        TOKENS,
    );
}

#[test]
fn a_takeover_that_does_not_end_the_session_first_is_caught() {
    caught_in(
        steady_session_bounds(THREE),
        Mutations {
            session_end_skipped: true,
            ..Mutations::default()
        },
        NodeMutations::default(),
        ONE_JOB,
    );
}

#[test]
fn a_cached_session_answer_served_past_its_date_is_caught() {
    caught_in(
        silent_release_bounds(),
        Mutations::default(),
        NodeMutations {
            cached_answer_past_its_date: true,
            ..NodeMutations::default()
        },
        RELEASED,
    );
}

#[test]
fn a_count_not_moved_when_a_tenure_ends_is_caught() {
    caught_in(
        silent_release_bounds(),
        Mutations::default(),
        NodeMutations {
            count_not_moved: true,
            ..NodeMutations::default()
        },
        RELEASED,
    );
}

#[test]
fn an_end_named_for_the_wrong_election_is_caught() {
    caught_in(
        silent_release_bounds(),
        Mutations::default(),
        NodeMutations {
            ends_misnamed: true,
            ..NodeMutations::default()
        },
        RELEASED,
    );
}

#[test]
fn a_read_back_that_takes_a_rewritten_record_as_still_held_is_caught() {
    caught_in(
        deletion_bounds(),
        Mutations::default(),
        NodeMutations {
            read_back_holder_only: true,
            ..NodeMutations::default()
        },
        ONE_JOB,
    );
}

#[test]
fn a_deferred_take_made_after_the_app_check_closed_is_caught() {
    caught_in(
        session_bounds(THREE),
        Mutations::default(),
        NodeMutations {
            gate_after_input: true,
            ..NodeMutations::default()
        },
        APP_CHECK,
    );
}

#[test]
fn a_takeover_that_ends_the_wrong_session_is_caught() {
    caught_in(
        steady_session_bounds(RESTARTED),
        Mutations::default(),
        NodeMutations {
            sessions_by_owner: true,
            ..NodeMutations::default()
        },
        ONE_JOB,
    );
}

#[test]
fn the_model_states_its_properties() {
    let names: Vec<_> = NodeModel::new(bounds(THREE))
        .properties()
        .iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(
        names,
        [
            ONE_JOB,
            TOKENS,
            SUCCESSOR,
            APP_CHECK,
            IN_TIME,
            RELEASED,
            LED_AFTER_CRASH,
            LED_AFTER_RELEASE,
            LED_AFTER_REOPEN,
            LED_BY_PREFERRED
        ]
    );
}
