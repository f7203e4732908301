//! Paused-clock tests of the hints: what a leader publishes, and how a
//! follower fed by a (fake) watch stream reads less, acts sooner, and is
//! never made to lead by what it is told.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::ElectionHandle;
use super::lone::{Links, Lone, spawn_gated};
use crate::clock::Clock;
use crate::core::election::{ElectionConfig, Role};
use crate::core::hints::{Hint, LeaseEvent};
use crate::core::node::{ElectionId, NodeInput};
use crate::election::{AfterRelease, NoObserver};
use crate::lease::memory::{Fault, MemoryStore};
use crate::lease::{HolderMeta, Lease, Record, new_rvn};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn cfg(identity: &str) -> ElectionConfig {
    ElectionConfig::with_defaults("report", identity)
}

/// The record of "a", leading at address "a:9777" under token 7, with a
/// fresh rvn.
fn held_by_a(store: &MemoryStore) -> Lease {
    let lease = Lease {
        election: "report".into(),
        holder: Some("a".into()),
        rvn: new_rvn(),
        fencing_token: 7,
        lease_ms: 10_000,
        acquired_at_ms: 1,
        renewed_at_ms: 1,
        expires_at_s: 1,
        holder_meta: Some(HolderMeta {
            address: Some("a:9777".into()),
            ..Default::default()
        }),
        successor: None,
        session: None,
    };
    store.set("report", Record::Valid(lease.clone()));
    lease
}

/// The far end of a follower's feed: what it asks to watch, and the way to
/// send it hints.
struct FakeStream {
    target: watch::Receiver<Option<String>>,
    hints: mpsc::Sender<NodeInput>,
    /// The follower's clock: arrival times are on it.
    clock: Clock,
}

impl FakeStream {
    async fn send(&self, event: LeaseEvent) {
        let at = self.clock.now();
        self.hint(Hint::Event {
            at,
            event: Box::new(event),
        })
        .await;
    }

    async fn renewed(&self, rvn: &str) {
        self.send(LeaseEvent::Renewed {
            election: "report".into(),
            holder: "a".into(),
            rvn: rvn.into(),
            fencing_token: 7,
            lease_ms: 10_000,
        })
        .await;
    }

    async fn hint(&self, hint: Hint) {
        let input = NodeInput::Hint {
            election: ElectionId(0),
            hint,
        };
        self.hints
            .send(input)
            .await
            .expect("the engine takes hints");
    }

    /// The stream ends (the leader's connection closed).
    async fn ended(&self) {
        self.hint(Hint::Ended).await;
    }

    async fn released(&self, rvn: &str) {
        self.send(LeaseEvent::Released {
            election: "report".into(),
            rvn: rvn.into(),
            fencing_token: 7,
            successor: None,
        })
        .await;
    }
}

/// Start follower `identity` on `store`, fed by a fake stream.
fn follower(store: &MemoryStore, identity: &str) -> (Lone, FakeStream) {
    let (target_tx, target) = watch::channel(None);
    let (hints_tx, hints) = mpsc::channel(64);
    let feed = (hints, target_tx);
    let clock = Clock::tokio();
    let h = spawn_gated(
        Arc::new(store.clone()),
        cfg(identity),
        clock.clone(),
        Arc::new(NoObserver),
        Duration::ZERO,
        Links {
            hints: Some(feed),
            ..Links::default()
        },
    );
    (
        h,
        FakeStream {
            target,
            hints: hints_tx,
            clock,
        },
    )
}

/// Whether the engine holds a tenure (leading, confirming or stopping):
/// read on the engine's own terms, not against another clock's instant.
fn leads(h: &ElectionHandle) -> bool {
    h.state.borrow().tenure.is_some()
}

/// Let the follower's first read happen and its watch be aimed.
async fn settle() {
    tokio::time::sleep(10 * MS).await;
}

/// How long until `h` leads, from now (at most two minutes).
async fn time_to_lead(h: &mut ElectionHandle) -> Duration {
    let t0 = tokio::time::Instant::now();
    tokio::time::timeout(120 * S, h.state.wait_for(|s| s.role == Role::Leader))
        .await
        .expect("it leads within two minutes")
        .expect("the engine runs");
    t0.elapsed()
}

/// "a" leads; "b" follows it, its first read done and its watch aimed.
async fn b_watching_a() -> (MemoryStore, Lease, Lone, FakeStream) {
    let store = MemoryStore::new();
    let lease = held_by_a(&store);
    let (h, stream) = follower(&store, "b");
    settle().await;
    (store, lease, h, stream)
}

#[tokio::test(start_paused = true)]
async fn with_hints_flowing_a_follower_reads_about_once_a_lease_and_never_takes_over() {
    let store = MemoryStore::new();
    let mut lease = held_by_a(&store);
    let (h, stream) = follower(&store, "b");
    settle().await;
    assert_eq!(stream.target.borrow().as_deref(), Some("a:9777"));
    stream.renewed(&lease.rvn).await;
    let (reads_before, _) = store.counts();
    // "a" renews every 5 s for a minute and says so each time.
    for _ in 0..12 {
        tokio::time::sleep(5 * S).await;
        lease.rvn = new_rvn();
        store.set("report", Record::Valid(lease.clone()));
        stream.renewed(&lease.rvn).await;
        assert!(!leads(&h), "took over a lease renewed every 5 s");
    }
    // One read at the end of each takeover wait, found a fresh rvn: at
    // most 60/L = 6 (hints never spare that read, so that a stream cannot
    // keep a dead leader's lease from being taken).
    let reads = store.counts().0 - reads_before;
    assert!(
        (4..=6).contains(&reads),
        "{reads} reads in a minute with hints flowing (60 without)"
    );
}

/// The renewed hint "a" would send for `rvn`, with `lease_ms` forged.
fn renewed_with_lease(rvn: &str, lease_ms: u64) -> LeaseEvent {
    LeaseEvent::Renewed {
        election: "report".into(),
        holder: "a".into(),
        rvn: rvn.into(),
        fencing_token: 7,
        lease_ms,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hint_lease_ms_never_enters_the_timing() {
    // "a" renews every 5 s and every renewal is told, but with the lease
    // forged to 1 ms: the store's 10 s lease decides, so "b" never takes
    // over a lease renewed in time.
    let store = MemoryStore::new();
    let mut lease = held_by_a(&store);
    let (h, stream) = follower(&store, "b");
    settle().await;
    stream.send(renewed_with_lease(&lease.rvn, 1)).await;
    for _ in 0..24 {
        tokio::time::sleep(5 * S).await;
        lease.rvn = new_rvn();
        store.set("report", Record::Valid(lease.clone()));
        stream.send(renewed_with_lease(&lease.rvn, 1)).await;
        for _ in 0..50 {
            tokio::time::sleep(10 * MS).await;
            assert!(!leads(&h), "b took over a live lease on a hint's lease_ms");
        }
    }
    // And a huge one does not stretch the wait on a dead leader either.
    stream
        .send(renewed_with_lease(&lease.rvn, u64::MAX / 2))
        .await;
    let mut h = h;
    let took = time_to_lead(&mut h).await;
    assert!(
        took <= Duration::from_millis(10_100) + 3 * S,
        "a hinted lease_ms stretched the takeover to {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn alternating_hints_never_keep_a_dead_leaders_lease_from_being_taken() {
    // "a" is dead: its record never changes. Something at its address
    // names a made-up rvn, then the real one again, every 0.5 s.
    let (store, lease, mut h, stream) = b_watching_a().await;
    let rvn = lease.rvn.clone();
    let liar = tokio::spawn(async move {
        loop {
            stream.renewed(&new_rvn()).await;
            tokio::time::sleep(S / 2).await;
            stream.renewed(&rvn).await;
            tokio::time::sleep(S / 2).await;
        }
    });
    let took = time_to_lead(&mut h).await + settle_time();
    liar.abort();
    // b first saw the rvn 10 ms before (its first read): the lease is
    // taken L·(1+D) after that, and a few P at most later.
    assert!(
        took >= Duration::from_millis(10_100),
        "took over after {took:?}"
    );
    assert!(
        took <= Duration::from_millis(10_100) + 3 * S,
        "alternating hints delayed the takeover to {took:?}"
    );
    let Record::Valid(now) = store.get("report") else {
        panic!("a record");
    };
    assert_eq!((now.holder.as_deref(), now.fencing_token), (Some("b"), 8));
}

#[tokio::test(start_paused = true)]
async fn replayed_hints_of_a_dead_leader_never_restart_its_timer() {
    // The real stream's last renewal, replayed every 200 ms after "a" died.
    let (_store, lease, mut h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    let rvn = lease.rvn.clone();
    let replay = tokio::spawn(async move {
        loop {
            tokio::time::sleep(S / 5).await;
            stream.renewed(&rvn).await;
        }
    });
    let took = time_to_lead(&mut h).await + settle_time();
    replay.abort();
    assert!(
        (Duration::from_millis(10_100)..=Duration::from_millis(10_100) + 3 * S).contains(&took),
        "took over after {took:?}"
    );
}

/// How long [`settle`] lets pass.
fn settle_time() -> Duration {
    10 * MS
}

/// How a follower hears that the leader released.
#[derive(Debug, Clone, Copy)]
enum Told {
    /// Its `released` event.
    Released,
    /// Only the end of its stream: the event was lost.
    StreamEnded,
}

/// "a" leads and "b" watches it; after 3 s "a" releases and "b" is `told`:
/// how long "b" took to lead, and the record then.
async fn release_told(told: Told) -> (Duration, Lease) {
    let (store, lease, mut h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    tokio::time::sleep(3 * S).await;
    let released = lease.released();
    store.set("report", Record::Valid(released.clone()));
    match told {
        Told::Released => stream.released(&released.rvn).await,
        Told::StreamEnded => stream.ended().await,
    }
    let took = time_to_lead(&mut h).await;
    let Record::Valid(now) = store.get("report") else {
        panic!("a record");
    };
    (took, now)
}

#[tokio::test(start_paused = true)]
async fn a_released_hint_makes_the_follower_read_and_take_over_at_once() {
    for told in [Told::Released, Told::StreamEnded] {
        let (took, now) = release_told(told).await;
        assert!(took < 10 * MS, "{told:?}: took {took:?}");
        assert_eq!(
            (now.holder.as_deref(), now.fencing_token),
            (Some("b"), 8),
            "{told:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_after_saying_why_costs_one_read_not_two() {
    let (store, lease, h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    let (reads_before, _) = store.counts();
    // A `released` the store denies (the record is still held), then the
    // end that follows it.
    stream.released(&lease.rvn).await;
    stream.ended().await;
    settle().await;
    assert_eq!(store.counts().0 - reads_before, 1);
    assert!(!leads(&h));
}

#[tokio::test(start_paused = true)]
async fn forged_released_hints_cost_reads_never_a_takeover() {
    let (store, lease, h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    let (reads_before, _) = store.counts();
    // A flood of "released" carrying the live rvn, for 3 s; the lease
    // itself is renewed and hinted as usual.
    for _ in 0..300 {
        stream.released(&lease.rvn).await;
        tokio::time::sleep(10 * MS).await;
        assert!(!leads(&h), "a forged release made a leader");
    }
    let reads = store.counts().0 - reads_before;
    assert!(reads <= 5, "{reads} reads for 300 forged hints in 3 s");
    let Record::Valid(now) = store.get("report") else {
        panic!("a record");
    };
    assert_eq!(now, lease, "the record was written");
}

#[tokio::test(start_paused = true)]
async fn a_release_past_the_read_budget_is_acted_on_when_the_budget_allows_it() {
    let (store, lease, mut h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    // Three releases that the store denies spend the reads hints may ask
    // for within 3 P.
    let (reads_before, _) = store.counts();
    for _ in 0..3 {
        stream.released(&lease.rvn).await;
        settle().await;
    }
    assert_eq!(store.counts().0 - reads_before, 3, "one read per hint");
    assert!(!leads(&h), "a denied release made a leader");
    // Then a true one: its read waits for the budget (3 P after the
    // first), not for the stream to go quiet or the lease to run out.
    let released = lease.released();
    store.set("report", Record::Valid(released));
    stream.released(&lease.rvn).await;
    let took = time_to_lead(&mut h).await;
    assert!(
        took <= 3 * S,
        "took {took:?} after a release past the budget"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deferred_read_that_fails_is_retried_with_back_off_not_in_a_loop() {
    let (store, lease, h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    // Three releases spend the budget; the fourth's read is deferred to
    // 3 P after the first, and by then the store refuses every request.
    for _ in 0..4 {
        stream.released(&lease.rvn).await;
        settle().await;
    }
    store.set_fault(Fault::Unreachable);
    let before = h.state.borrow().rounds;
    tokio::time::sleep(10 * S).await;
    let rounds = h.state.borrow().rounds - before;
    assert!(
        rounds <= 10,
        "{rounds} reads in 10 s while the store refuses"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_lies_about_a_dead_leader_delays_the_takeover_but_does_not_prevent_it() {
    let (store, lease, mut h, stream) = b_watching_a().await;
    // "a" is dead (its record never changes) but something at its address
    // keeps announcing renewals with made-up rvns, every second.
    let liar = tokio::spawn(async move {
        loop {
            stream.renewed(&new_rvn()).await;
            tokio::time::sleep(S).await;
        }
    });
    let t0 = tokio::time::Instant::now();
    let led = tokio::time::timeout(120 * S, h.state.wait_for(|s| s.role == Role::Leader)).await;
    let took = t0.elapsed() + settle_time();
    liar.abort();
    assert!(led.is_ok(), "the liar kept b from leading for {took:?}");
    // Never before the rvn stayed unchanged for L·(1+D) since b first saw
    // it, and no more than a few P later.
    assert!(
        took >= Duration::from_millis(10_100),
        "took over after {took:?}"
    );
    assert!(
        took <= Duration::from_millis(10_100) + 3 * S,
        "the liar kept b from leading for {took:?}"
    );
    let Record::Valid(now) = store.get("report") else {
        panic!("a record");
    };
    assert_eq!((now.holder.as_deref(), now.fencing_token), (Some("b"), 8));
    assert_ne!(now.rvn, lease.rvn);
}

#[tokio::test(start_paused = true)]
async fn a_lease_handed_to_a_successor_is_taken_by_it_at_once_and_by_others_after_a_lease() {
    let store = MemoryStore::new();
    let handed = held_by_a(&store).handed_to(Some("c".into()));
    store.set("report", Record::Valid(handed.clone()));
    let (mut b, _sb) = follower(&store, "b");
    settle().await;
    assert!(!leads(&b), "b took a lease handed to c");
    // c is not there: b waits as if the lease were held, then takes it.
    let t0 = tokio::time::Instant::now();
    b.state
        .wait_for(|s| s.role == Role::Leader)
        .await
        .expect("the engine runs");
    assert!(
        t0.elapsed() + 10 * MS >= Duration::from_millis(10_100),
        "b took the handed lease after {:?}",
        t0.elapsed()
    );

    // The same record, c this time: at once.
    let store = MemoryStore::new();
    store.set("report", Record::Valid(handed));
    let (mut c, _sc) = follower(&store, "c");
    let t0 = tokio::time::Instant::now();
    c.state
        .wait_for(|s| s.role == Role::Leader)
        .await
        .expect("the engine runs");
    assert!(t0.elapsed() < 10 * MS, "c took {:?}", t0.elapsed());
}

#[tokio::test(start_paused = true)]
async fn the_leader_tells_each_write_after_it_succeeded_and_its_release_with_the_successor() {
    let store = MemoryStore::new();
    let (mut a, _stream) = follower(&store, "a");
    a.state
        .wait_for(|s| s.role == Role::Leader)
        .await
        .expect("the engine runs");
    let stored_rvn = |store: &MemoryStore| match store.get("report") {
        Record::Valid(l) => l.rvn,
        other => panic!("expected a lease, got {other:?}"),
    };
    let told_rvn = |a: &ElectionHandle| match a.events.borrow().clone() {
        Some(LeaseEvent::Renewed { rvn, holder, .. }) => {
            assert_eq!(holder, "a");
            rvn
        }
        other => panic!("expected a renewed event, got {other:?}"),
    };
    assert_eq!(told_rvn(&a), stored_rvn(&store));
    tokio::time::sleep(6 * S).await;
    assert_eq!(told_rvn(&a), stored_rvn(&store), "the renewal is told");
    assert!(a.hand_over(AfterRelease::SitOut(S), Some("c".into())).await);
    let Record::Valid(released) = store.get("report") else {
        panic!("a record");
    };
    assert_eq!(released.successor.as_deref(), Some("c"));
    assert_eq!(
        a.events.borrow().clone(),
        Some(LeaseEvent::Released {
            election: "report".into(),
            rvn: released.rvn,
            fencing_token: released.fencing_token,
            successor: Some("c".into()),
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_led_counts_as_watching_again_only_once_it_hears_a_stream_anew() {
    let (store, lease, mut h, stream) = b_watching_a().await;
    stream.renewed(&lease.rvn).await;
    settle().await;
    let now = || Clock::tokio().now();
    assert!(h.state.borrow().watching_leader_at(now()), "b hears a");
    // "a" releases; b leads, then resigns and sits out a lease: the
    // stream it heard before it led is not heard any more.
    store.set("report", Record::Valid(lease.released()));
    stream.released(&lease.rvn).await;
    time_to_lead(&mut h).await;
    assert!(h.hand_over(AfterRelease::SitOut(10 * S), None).await);
    settle().await;
    let state = h.state.borrow().clone();
    assert_eq!(state.role, Role::Follower);
    assert!(
        !state.watching_leader_at(now()),
        "b counts as watching a stream it heard before it led: {:?}",
        state.hints_until
    );
}
