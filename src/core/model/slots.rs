//! The model checker of counting locks (`leaderd lock acquire --slots N`),
//! a world of its own beside the daemons': three lock clients racing for
//! two slots of one record, each deciding by the rules of
//! `crate::core::slots` on its own clock (the first fast by D, the second
//! slow by D, the third exact), writes that reach the store late, renews,
//! releases and a crash.
//!
//! - A client reads the record when it wakes and, if the rules let it
//!   take a slot, sends the write at once; the store applies it (if its
//!   condition still holds) at any later step, and the answer arrives
//!   then. A holder's slot is valid until its own clock reaches the send
//!   of its last applied write plus L·(1−D) (as a leader's tenure, with no
//!   margin); it renews every L/2, and stops holding when validity ends
//!   without a renew, when it sends its release, or when it crashes. One
//!   holder may stall instead: alive, it renews no more (a stuck script),
//!   and holds until its validity ends.
//! - Properties: never more than N clients hold a valid slot at one real
//!   instant; every slot taken has a fencing token above every token
//!   taken before; and some run sees a crashed holder's slot taken by
//!   another (a crash frees its slot).

use stateright::{Checker, Model, Property};

use crate::core::record::{Condition, Lease, Record, Stamp};
use crate::core::slots::{self, SlotWatch, Verdict};
use crate::core::time::Instant;

/// Real time, ms.
type Ms = u64;

/// The slots, and the clients racing for them.
const SLOTS: u32 = 2;
const CLIENTS: usize = 3;
/// L, P and D of the model (a large D, so that drift shows).
const LEASE: Ms = 1_000;
const RETRY: Ms = 250;
const DRIFT: f64 = 0.1;
/// Each client's clock rate, in tenths: fast by D, slow by D, exact.
const RATE: [u64; CLIENTS] = [11, 9, 10];

const AT_MOST_N: &str = "never more than N holders at once";
const TOKENS: &str = "every slot's token is above every earlier one";
const FREED: &str = "a crashed holder's slot is taken";

/// What a client's own clock reads at real `t`.
fn local(c: usize, t: Ms) -> Ms {
    t * RATE[c] / 10
}

/// The first real instant at which client `c`'s clock reads `l`.
fn real(c: usize, l: Ms) -> Ms {
    (l * 10).div_ceil(RATE[c])
}

fn instant(ms: Ms) -> Instant {
    Instant::from_since_origin(std::time::Duration::from_millis(ms))
}

/// A write on its way to the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Write {
    lease: Lease,
    condition: Condition,
}

/// One lock client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Client {
    /// Wants a slot: reads the record at real `wake`.
    Waiting { watch: SlotWatch, wake: Ms },
    /// Sent the write that takes a slot (token, marker) at its own `sent`.
    Taking {
        write: Write,
        token: u64,
        marker: String,
        sent: Ms,
    },
    /// Holds the slot (token, marker) until its own clock reads `until`;
    /// last wrote at its own `sent`; a renew may be on its way.
    Holding {
        token: u64,
        marker: String,
        sent: Ms,
        until: Ms,
        renew: Option<(Write, Ms)>,
    },
    /// Released, expired, lost its slot, or crashed: holds nothing.
    Gone,
}

/// The world: real time, the record, the clients, the writes of the
/// clients that are gone, and what the properties need.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct SlotWorld {
    t: Ms,
    record: Record,
    clients: [Client; CLIENTS],
    strays: Vec<Write>,
    rvns: u32,
    highest: Option<u64>,
    token_fell: bool,
    crashed: Vec<u64>,
    crash_freed: bool,
    crashes: u8,
    releases: u8,
    /// How many more times time may move on while a write is on its way.
    delays: u8,
    /// The holder that stopped renewing (stuck, not dead: it still holds
    /// until its validity ends), if one did; and how many more may.
    stalled: Option<usize>,
    stalls: u8,
}

/// A step of the world.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum SlotStep {
    Read(usize),
    Apply(usize),
    Stray(usize),
    Renew(usize),
    Release(usize),
    Crash(usize),
    Stall(usize),
    Advance,
}

/// The model: its bounds and its one deliberate defect.
pub(super) struct SlotModel {
    horizon: Ms,
    /// D the waiters assume: [`DRIFT`], or a defect's.
    waiter_drift: f64,
}

impl SlotWorld {
    /// The stamp of the next write. Counted (`rvns`) only once a write is
    /// sent, so that a read that writes nothing leaves the world as it was.
    fn stamp(&self) -> Stamp {
        Stamp::new(format!("r{}", self.rvns + 1), 1_000_000 + self.t)
    }

    /// Client `c` reads the record and sends the write the rules allow,
    /// if any.
    fn read(&mut self, c: usize) -> Option<()> {
        let Client::Waiting { mut watch, .. } = self.clients[c].clone() else {
            return None;
        };
        let now = local(c, self.t);
        let stamp = self.stamp();
        let me = format!("c{c}");
        let verdict = watch.acquire("e", &self.record, &me, SLOTS, LEASE, instant(now), &stamp);
        self.clients[c] = match verdict {
            Verdict::Take {
                lease, condition, ..
            } => {
                self.rvns += 1;
                Client::Taking {
                    token: lease.fencing_token,
                    write: Write { lease, condition },
                    marker: stamp.rvn(),
                    sent: now,
                }
            }
            Verdict::Wait { until, .. } => {
                let until = until.since_origin().as_millis() as Ms;
                Client::Waiting {
                    watch,
                    wake: real(c, until.min(now + RETRY)).max(self.t + 1),
                }
            }
            Verdict::Conflict(_) => Client::Gone,
        };
        Some(())
    }

    /// The store applies client `c`'s write on its way, if its condition
    /// holds, and answers. A waiter that lost starts over with a new view
    /// (of drift `drift`).
    fn answer(&mut self, c: usize, drift: f64) -> Option<()> {
        let valid = |sent: Ms| sent + LEASE - (LEASE as f64 * DRIFT) as Ms;
        self.clients[c] = match self.clients[c].clone() {
            Client::Taking {
                write,
                token,
                marker,
                sent,
            } => {
                if !self.apply(&write) {
                    self.clients[c] = Client::Waiting {
                        watch: SlotWatch::new(drift),
                        wake: self.t,
                    };
                    return Some(());
                }
                if self.highest.is_some_and(|h| token <= h) {
                    self.token_fell = true;
                }
                self.highest = Some(self.highest.map_or(token, |h| h.max(token)));
                if let Record::Valid(l) = &self.record
                    && let Some(Ok(table)) = slots::Slots::of(l)
                {
                    let gone = |t: &u64| !table.holders.iter().any(|h| h.fencing_token == *t);
                    self.crash_freed |= self.crashed.iter().any(gone);
                }
                Client::Holding {
                    token,
                    marker,
                    sent,
                    until: valid(sent),
                    renew: None,
                }
            }
            Client::Holding {
                token,
                marker,
                sent,
                until,
                renew: Some((write, renew_sent)),
            } => {
                if self.apply(&write) {
                    Client::Holding {
                        token,
                        marker: write.lease.rvn.clone(),
                        sent: renew_sent,
                        until: valid(renew_sent),
                        renew: None,
                    }
                } else {
                    Client::Holding {
                        token,
                        marker,
                        sent,
                        until,
                        renew: None,
                    }
                }
            }
            _ => return None,
        };
        Some(())
    }

    /// Holder `c` reads the record and sends the renew of its slot; one
    /// whose slot is gone stops at once.
    fn renew(&mut self, c: usize) -> Option<()> {
        let Client::Holding {
            token,
            marker,
            sent,
            until,
            renew: None,
        } = self.clients[c].clone()
        else {
            return None;
        };
        let now = local(c, self.t);
        let stamp = self.stamp();
        let me = format!("c{c}");
        self.clients[c] =
            match slots::renew(&self.record, SLOTS, token, &marker, &me, LEASE, &stamp) {
                Ok((lease, condition)) => {
                    self.rvns += 1;
                    Client::Holding {
                        token,
                        marker,
                        sent,
                        until,
                        renew: Some((Write { lease, condition }, now)),
                    }
                }
                Err(_) => Client::Gone,
            };
        Some(())
    }

    /// Holder `c` stops holding and sends the release of its slot.
    fn release(&mut self, c: usize) -> Option<()> {
        let Client::Holding { token, marker, .. } = self.clients[c].clone() else {
            return None;
        };
        let stamp = self.stamp();
        let me = format!("c{c}");
        if let Ok((lease, condition)) =
            slots::release(&self.record, SLOTS, token, &marker, &me, &stamp)
        {
            self.rvns += 1;
            self.strays.push(Write { lease, condition });
        }
        self.releases -= 1;
        self.clients[c] = Client::Gone;
        Some(())
    }

    /// Whether a write is on its way to the store.
    fn in_flight(&self) -> bool {
        !self.strays.is_empty()
            || self.clients.iter().any(|c| {
                matches!(
                    c,
                    Client::Taking { .. } | Client::Holding { renew: Some(_), .. }
                )
            })
    }

    /// Client `c` holds a valid slot now.
    fn holds(&self, c: usize) -> bool {
        matches!(&self.clients[c], Client::Holding { until, .. } if local(c, self.t) < *until)
    }

    /// Apply `w` to the record if its condition holds: whether it did.
    fn apply(&mut self, w: &Write) -> bool {
        if !w.condition.holds(&self.record, None) {
            return false;
        }
        self.record = Record::Valid(w.lease.clone());
        true
    }

    /// The next real instant someone acts without being told: a waiter
    /// wakes, a holder renews, a slot runs out.
    fn next_event(&self) -> Option<Ms> {
        (0..CLIENTS)
            .filter_map(|c| match &self.clients[c] {
                Client::Waiting { wake, .. } => Some(*wake),
                Client::Holding {
                    sent, until, renew, ..
                } => {
                    let due = real(c, sent + LEASE / 2);
                    let end = real(c, *until);
                    Some(if renew.is_none() { due.min(end) } else { end })
                }
                _ => None,
            })
            .filter(|&at| at > self.t)
            .min()
    }
}

impl SlotModel {
    pub(super) fn new(horizon: Ms, waiter_drift: f64) -> SlotModel {
        SlotModel {
            horizon,
            waiter_drift,
        }
    }

    fn renew_due(w: &SlotWorld, c: usize) -> bool {
        w.stalled != Some(c)
            && matches!(&w.clients[c], Client::Holding { sent, renew: None, .. }
            if local(c, w.t) >= sent + LEASE / 2 && w.holds(c))
    }
}

impl Model for SlotModel {
    type State = SlotWorld;
    type Action = SlotStep;

    fn init_states(&self) -> Vec<SlotWorld> {
        let waiting = |c: usize| Client::Waiting {
            watch: SlotWatch::new(self.waiter_drift),
            // The fast one looks last: it waits on the slow one's slot.
            wake: if c == 0 { 100 } else { 0 },
        };
        vec![SlotWorld {
            t: 0,
            record: Record::Absent,
            clients: [waiting(0), waiting(1), waiting(2)],
            strays: Vec::new(),
            rvns: 0,
            highest: None,
            token_fell: false,
            crashed: Vec::new(),
            crash_freed: false,
            crashes: 1,
            releases: 1,
            delays: 1,
            stalled: None,
            stalls: 1,
        }]
    }

    fn actions(&self, w: &SlotWorld, steps: &mut Vec<SlotStep>) {
        let mut due = false;
        for c in 0..CLIENTS {
            match &w.clients[c] {
                Client::Waiting { wake, .. } if *wake <= w.t => {
                    due = true;
                    steps.push(SlotStep::Read(c));
                }
                Client::Taking { .. } => steps.push(SlotStep::Apply(c)),
                Client::Holding { renew, .. } => {
                    if renew.is_some() {
                        steps.push(SlotStep::Apply(c));
                    }
                    if Self::renew_due(w, c) {
                        due = true;
                        steps.push(SlotStep::Renew(c));
                    }
                    if w.holds(c) {
                        if w.releases > 0 {
                            steps.push(SlotStep::Release(c));
                        }
                        if w.crashes > 0 {
                            steps.push(SlotStep::Crash(c));
                        }
                        if w.stalls > 0 {
                            steps.push(SlotStep::Stall(c));
                        }
                    }
                }
                _ => {}
            }
        }
        steps.extend((0..w.strays.len()).map(SlotStep::Stray));
        if !due && w.t < self.horizon && (!w.in_flight() || w.delays > 0) {
            steps.push(SlotStep::Advance);
        }
    }

    fn next_state(&self, last: &SlotWorld, step: SlotStep) -> Option<SlotWorld> {
        let mut w = last.clone();
        match step {
            SlotStep::Read(c) => w.read(c)?,
            SlotStep::Apply(c) => w.answer(c, self.waiter_drift)?,
            SlotStep::Stray(i) => {
                let write = w.strays.remove(i);
                w.apply(&write);
            }
            SlotStep::Renew(c) => w.renew(c)?,
            SlotStep::Release(c) => w.release(c)?,
            SlotStep::Crash(c) => {
                if let Client::Holding { token, renew, .. } = &w.clients[c] {
                    w.crashed.push(*token);
                    // Its renew, if one was on its way, may still arrive.
                    if let Some((write, _)) = renew {
                        w.strays.push(write.clone());
                    }
                }
                w.crashes -= 1;
                w.clients[c] = Client::Gone;
            }
            SlotStep::Stall(c) => {
                w.stalled = Some(c);
                w.stalls -= 1;
            }
            SlotStep::Advance => {
                if w.in_flight() {
                    w.delays -= 1;
                }
                w.t = w.next_event().unwrap_or(w.t + RETRY).min(self.horizon);
                for c in 0..CLIENTS {
                    if matches!(&w.clients[c], Client::Holding { renew: None, .. }) && !w.holds(c) {
                        w.clients[c] = Client::Gone;
                    }
                }
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_N, |_, w: &SlotWorld| {
                (0..CLIENTS).filter(|&c| w.holds(c)).count() <= SLOTS as usize
            }),
            Property::always(TOKENS, |_, w: &SlotWorld| !w.token_fell),
            Property::sometimes(FREED, |_, w: &SlotWorld| w.crash_freed),
        ]
    }

    fn within_boundary(&self, w: &SlotWorld) -> bool {
        w.t <= self.horizon
    }
}

/// The most states a search generates (breadth first: every interleaving
/// of the first steps, shortest first; about 20 s and 200 MB).
const STATES: usize = 1_000_000;

/// Explore the whole space of `model`; print what was explored. Returns
/// the distinct states and the names of the properties broken (and of the
/// `sometimes` ones seen).
fn explore(label: &str, model: SlotModel, states: usize) -> (usize, Vec<&'static str>) {
    let checker = model
        .checker()
        .threads(1)
        .target_state_count(states)
        .spawn_bfs()
        .join();
    let found: Vec<&'static str> = checker.discoveries().into_keys().collect();
    println!(
        "model check {label}: {} distinct states ({} generated), depth {}, {}; found {found:?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        if checker.state_count() < states {
            "the whole space within the bounds"
        } else {
            "stopped at the state budget"
        },
    );
    (checker.unique_state_count(), found)
}

#[test]
fn counting_locks_never_exceed_their_slots_and_tokens_rise() {
    let (states, found) = explore(
        "counting locks (3 clients, 2 slots)",
        SlotModel::new(3 * LEASE, DRIFT),
        STATES,
    );
    assert_eq!(found, [FREED], "a property broke, or no crash freed a slot");
    assert!(
        states > STATES / 2,
        "explored only {states} distinct states"
    );
}

#[test]
fn waiters_that_underrate_the_drift_are_caught() {
    // Waiting L·(1−D) instead of L·(1+D): a slot is taken while its
    // holder (slow clock) still holds it.
    let (_, found) = explore(
        "counting locks, waiters wait L(1-D)",
        SlotModel::new(3 * LEASE, -DRIFT),
        STATES / 4,
    );
    assert!(found.contains(&AT_MOST_N), "not caught: {found:?}");
}
