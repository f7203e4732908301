//! The model checks: the core as built keeps every property over the
//! explored space, and each deliberate defect is found with a trace.
//!
//! Two searches: breadth first (every interleaving, shortest first, as far
//! as the state budget reaches: the start of an election, its first
//! renewals, hints and faults around them) and random walks to the horizon
//! (deep: pauses longer than a lease, takeovers, handovers, crashes).
//! `LEADERD_MODEL_STATES` sets the breadth-first searches' budget of
//! generated states (default 1,500,000, which comes to over a million
//! distinct states over the two; the walks take half of it);
//! docs/model-checking.md gives the figures of a longer run.

use std::collections::BTreeMap;
use std::time::Duration;

use stateright::report::{ReportData, ReportDiscovery, Reporter};
use stateright::{Checker, Chooser, HasDiscoveries, Model};

use super::{Bounds, ElectionModel, LED_AFTER_CRASH, Step, World};
use crate::core::election::Mutations;

const ONE_JOB: &str = "one job at a time";
const TOKENS: &str = "fencing tokens rise";
const SUCCESSOR: &str = "a handed-over lease waits a lease for others";
const IN_TIME: &str = "a follower leads in time after a crash";

fn bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        identities,
        horizon: 40_000,
        hints: 2,
        losses: 2,
        resigns: 1,
        crashes: 1,
        pauses: 1,
        delays: 2,
        timely: false,
        mutations: Mutations::default(),
        sessions: false,
    }
}

/// [`bounds`] with every election held through its daemon's session.
fn session_bounds(identities: [&'static str; 3]) -> Bounds {
    Bounds {
        sessions: true,
        ..bounds(identities)
    }
}

/// The default budget of generated states of a breadth-first search.
const BUDGET: usize = 1_500_000;

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

impl Chooser<ElectionModel> for FaultShy {
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
            Step::Store(n, ..) | Step::Thaw(n) if w.nodes[*n].frozen => {
                u32::from(w.t >= w.nodes[*n].frozen_at + self.pause)
            }
            // The walks spend their one pause on a leader with a write on
            // its way (breadth first covers the other pauses).
            Step::Freeze(n) => {
                let node = &w.nodes[*n];
                let leads = node.core.state().tenure.is_some();
                let busy = node.request.is_some() || node.session_request.is_some();
                u32::from(leads && busy) * 4
            }
            Step::Wake(_)
            | Step::WakeSession(_)
            | Step::Store(..)
            | Step::Answer(..)
            | Step::Advance(_) => 10,
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
fn explore(label: &str, model: ElectionModel, states: usize, search: Search) -> Found {
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

impl Reporter<ElectionModel> for Took {
    fn report_checking(&mut self, data: ReportData) {
        // The last report is the final one, or one a moment before it.
        self.0 = self.0.max(data.duration);
    }

    fn report_discoveries(
        &mut self,
        _model: &ElectionModel,
        _discoveries: BTreeMap<&'static str, ReportDiscovery<ElectionModel>>,
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
    C: Checker<ElectionModel> + Send + Sync,
{
    let mut took = Took::default();
    let checker = checker.join_and_report(&mut took);
    let mut found = Found {
        states: checker.unique_state_count(),
        broken: Vec::new(),
        examples: Vec::new(),
    };
    for (name, path) in checker.discoveries() {
        if name == LED_AFTER_CRASH {
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

#[test]
fn the_core_keeps_every_property_over_a_million_states() {
    let mut breadth = 0;
    for identities in [["a", "b", "c"], ["a", "b", "a"]] {
        for (search, states) in [
            (Search::BreadthFirst, budget()),
            (Search::RandomWalks, budget() / 2),
        ] {
            let found = explore(
                &format!("{search:?}, identities {identities:?}"),
                ElectionModel::new(bounds(identities)),
                states,
                search,
            );
            assert!(found.broken.is_empty(), "the core broke {:?}", found.broken);
            if search == Search::BreadthFirst {
                breadth += found.states;
            }
        }
    }
    println!("model check: {breadth} distinct states breadth first in all");
    // A smaller LEADERD_MODEL_STATES is for a quick local run.
    assert!(
        breadth >= 1_000_000 || budget() < BUDGET,
        "explored only {breadth} distinct states"
    );
}

/// The bounded-delay check over `base` (with or without sessions): a
/// follower leads in time after a crash whatever the hints say, and some
/// explored run saw a takeover after a crash, so that it is not vacuous.
fn bounded_delay(label: &str, base: Bounds, states: usize) {
    let model = || {
        ElectionModel::new(Bounds {
            timely: true,
            hints: 3,
            losses: 0,
            resigns: 0,
            pauses: 0,
            delays: 0,
            horizon: 45_000,
            ..base.clone()
        })
    };
    let bound = model().takeover_bound();
    let mut examples = Vec::new();
    for search in [Search::BreadthFirst, Search::RandomWalks] {
        let found = explore(
            &format!("{search:?}, {label}timely, bound {bound} ms"),
            model(),
            states,
            search,
        );
        assert!(found.broken.is_empty(), "broken: {:?}", found.broken);
        examples.extend(found.examples);
    }
    assert!(
        examples.iter().any(|e| e == LED_AFTER_CRASH),
        "no explored run had a takeover after a crash"
    );
}

#[test]
fn a_follower_leads_within_a_bounded_delay_whatever_the_hints_say() {
    bounded_delay("", bounds(["a", "b", "c"]), budget() / 2);
}

#[test]
fn elections_held_through_sessions_keep_every_property() {
    for identities in [["a", "b", "c"], ["a", "b", "a"]] {
        // A quarter of the budget each: the sessions' deep runs are the
        // walks', and the budget of one core's checks covers the rest.
        for (search, states) in [
            (Search::BreadthFirst, budget() / 4),
            (Search::RandomWalks, budget() / 4),
        ] {
            let found = explore(
                &format!("{search:?}, sessions, identities {identities:?}"),
                ElectionModel::new(session_bounds(identities)),
                states,
                search,
            );
            assert!(found.broken.is_empty(), "sessions broke {:?}", found.broken);
        }
    }
}

#[test]
fn a_follower_leads_within_a_bounded_delay_through_sessions() {
    bounded_delay("sessions, ", session_bounds(["a", "b", "c"]), budget() / 4);
}

#[test]
fn a_takeover_that_does_not_end_the_session_first_is_caught() {
    caught_in(
        session_bounds(["a", "b", "c"]),
        Mutations {
            session_end_skipped: true,
            ..Mutations::default()
        },
        ONE_JOB,
    );
}

/// The defect `mutations` must break a property (`expected`, or another:
/// each broken one is printed with its trace).
fn caught(mutations: Mutations, identities: [&'static str; 3], expected: &str) {
    caught_in(bounds(identities), mutations, expected);
}

/// [`caught`], within `bounds`.
fn caught_in(bounds: Bounds, mutations: Mutations, expected: &str) {
    let model = ElectionModel::new(Bounds {
        mutations,
        ..bounds
    });
    let found = explore(
        &format!("with {mutations:?}"),
        model,
        DEFECT_BUDGET,
        Search::RandomWalks,
    );
    assert!(
        !found.broken.is_empty(),
        "{mutations:?} was not caught (expected: {expected})"
    );
}

#[test]
fn validity_dated_from_the_reply_is_caught() {
    caught(
        Mutations {
            validity_from_reply: true,
            ..Mutations::default()
        },
        ["a", "b", "c"],
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
        ["a", "b", "c"],
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
        ["a", "b", "c"],
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
        ["a", "b", "c"],
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
        ["a", "b", "a"],
        TOKENS,
    );
}

#[test]
fn the_model_states_its_properties() {
    let names: Vec<_> = ElectionModel::new(bounds(["a", "b", "c"]))
        .properties()
        .iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(
        names,
        [ONE_JOB, TOKENS, SUCCESSOR, IN_TIME, LED_AFTER_CRASH]
    );
}
