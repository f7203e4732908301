//! Paused-clock tests of the election engine against the in-memory store.
//! No real sleeps: `tokio::time::pause` makes every timer advance instantly
//! once all tasks are idle.

use std::sync::Mutex;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::ElectionHandle;
use super::lone::{Links, Lone, spawn, spawn_after, spawn_gated};
use crate::app_check::Verdict;
use crate::clock::Clock;
use crate::core::election::{ElectionConfig, ElectionState, Role};
use crate::election::{AfterRelease, NoObserver, Observer, Outcome};
use crate::lease::memory::{Fault, MemoryStore};
use crate::lease::{Condition, Lease, Malformed, Record, RvnGuard, WriteOutcome, new_rvn};
use crate::lease::{LeaseStore, StoreError};

const S: Duration = Duration::from_secs(1);

fn cfg(identity: &str) -> ElectionConfig {
    ElectionConfig::with_defaults("report", identity)
}

/// Records every renew with the (tokio) time it happened, how late each
/// went out, and the leases lost.
#[derive(Default)]
struct Recorder {
    renews: Mutex<Vec<(tokio::time::Instant, &'static str)>>,
    late: Mutex<Vec<Duration>>,
    lost: Mutex<usize>,
}

impl Observer for Recorder {
    fn renew(&self, _e: &str, o: Outcome<'_>) {
        self.renews
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), o.label()));
    }

    fn renew_sent(&self, _e: &str, late: Duration) {
        self.late.lock().unwrap().push(late);
    }

    fn lease_lost(&self, _e: &str) {
        *self.lost.lock().unwrap() += 1;
    }
}

fn start(store: &MemoryStore, c: ElectionConfig) -> Lone {
    spawn(
        Arc::new(store.clone()),
        c,
        Clock::tokio(),
        Arc::new(NoObserver),
    )
}

/// Wait (in paused time) until the predicate holds; returns the elapsed time.
async fn until(
    h: &mut ElectionHandle,
    limit: Duration,
    pred: impl Fn(&ElectionState) -> bool,
) -> Duration {
    let t0 = tokio::time::Instant::now();
    let reached = tokio::time::timeout(limit, h.state.wait_for(|s| pred(s)))
        .await
        .map(|r| r.is_ok());
    assert_eq!(
        reached,
        Ok(true),
        "condition not reached within {limit:?}: {:?}",
        *h.state.borrow()
    );
    t0.elapsed()
}

fn held_by(store: &MemoryStore, who: &str, token: u64) -> Lease {
    let lease = Lease {
        election: "report".into(),
        holder: Some(who.into()),
        rvn: new_rvn(),
        fencing_token: token,
        lease_ms: 10_000,
        acquired_at_ms: 1,
        renewed_at_ms: 1,
        expires_at_s: 1,
        holder_meta: None,
        successor: None,
        session: None,
    };
    store.set("report", Record::Valid(lease.clone()));
    lease
}

fn stored(store: &MemoryStore) -> Lease {
    match store.get("report") {
        Record::Valid(l) => l,
        other => panic!("expected a valid lease, got {other:?}"),
    }
}

/// Start election "a" on `store` with a recorder, and wait until it leads.
async fn lead(store: &MemoryStore) -> (Arc<Recorder>, Lone) {
    let rec = Arc::new(Recorder::default());
    let mut h = spawn(
        Arc::new(store.clone()),
        cfg("a"),
        Clock::tokio(),
        rec.clone(),
    );
    until(&mut h, S, |s| s.role == Role::Leader).await;
    (rec, h)
}

#[tokio::test(start_paused = true)]
async fn first_acquisition_on_empty_store() {
    let store = MemoryStore::new();
    let mut h = start(&store, cfg("a"));
    let took = until(&mut h, S, |s| s.role == Role::Leader).await;
    assert!(took < Duration::from_millis(10), "took {took:?}");
    let lease = stored(&store);
    assert_eq!(lease.holder.as_deref(), Some("a"));
    let state = h.state.borrow().clone();
    assert_eq!(state.fencing_token, Some(lease.fencing_token));
    // No previous item: the token starts at the unix ms.
    assert!(lease.fencing_token >= crate::clock::unix_ms() - 60_000);
    assert!(state.is_leader_at(Clock::tokio().now()) || state.role == Role::Leader);
}

#[tokio::test(start_paused = true)]
async fn delayed_start_touches_the_store_only_after_its_delay() {
    let store = MemoryStore::new();
    let mut h = spawn_after(
        Arc::new(store.clone()),
        cfg("a"),
        Clock::tokio(),
        Arc::new(NoObserver),
        Duration::from_millis(700),
    );
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert_eq!(
        store.get("report"),
        Record::Absent,
        "wrote before its delay"
    );
    assert_eq!(h.state.borrow().role, Role::Follower);
    let took = until(&mut h, S, |s| s.role == Role::Leader).await;
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_millis(60),
        "led {took:?} after the check, want just after the 700 ms delay"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_fall_on_a_shared_grid_of_r_over_20() {
    let store = MemoryStore::new();
    let rec = Arc::new(Recorder::default());
    let clock = Clock::tokio();
    let t0 = tokio::time::Instant::now();
    // Acquired at 1,234 ms on the process clock: the first renewal is due
    // at 6,234 ms, rounded down to the 250 ms grid; then every R on the grid.
    let mut h = spawn_after(
        Arc::new(store.clone()),
        cfg("a"),
        clock,
        rec.clone(),
        Duration::from_millis(1_234),
    );
    until(&mut h, 2 * S, |s| s.role == Role::Leader).await;
    tokio::time::sleep_until(t0 + Duration::from_millis(16_300)).await;
    let offsets: Vec<u64> = rec
        .renews
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| (*t - t0).as_millis() as u64)
        .collect();
    let want = [6_000u64, 11_000, 16_000];
    assert_eq!(offsets.len(), want.len(), "renews at {offsets:?}");
    for (got, want) in offsets.iter().zip(want) {
        // Tokio's timers round up to the next millisecond.
        assert!(got.abs_diff(want) <= 2, "renews at {offsets:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn delayed_start_obeys_release_at_once() {
    let store = MemoryStore::new();
    let h = spawn_after(
        Arc::new(store.clone()),
        cfg("a"),
        Clock::tokio(),
        Arc::new(NoObserver),
        Duration::from_secs(30),
    );
    let t0 = tokio::time::Instant::now();
    // Not leading: nothing to release, and the task ends.
    assert!(!h.release(AfterRelease::Exit).await);
    h.join().await;
    assert!(t0.elapsed() < Duration::from_millis(10));
    assert_eq!(store.get("report"), Record::Absent);
}

#[tokio::test(start_paused = true)]
async fn leader_renews_every_renew_interval() {
    let store = MemoryStore::new();
    let (rec, h) = lead(&store).await;
    let t0 = tokio::time::Instant::now();
    let first_rvn = stored(&store).rvn;
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    let renews = rec.renews.lock().unwrap().clone();
    let offsets: Vec<u64> = renews
        .iter()
        .map(|(t, _)| (*t - t0).as_millis() as u64)
        .collect();
    assert_eq!(offsets.len(), 4, "renews at {offsets:?}");
    for (i, ms) in offsets.iter().enumerate() {
        let want = 5_000 * (i as u64 + 1);
        assert!(ms.abs_diff(want) <= 5, "renew {i} at {ms} ms, want {want}");
    }
    assert!(renews.iter().all(|(_, l)| *l == "ok"));
    let now = stored(&store);
    assert_ne!(now.rvn, first_rvn, "renew writes a fresh rvn");
    assert_eq!(
        now.fencing_token,
        h.state.borrow().fencing_token.unwrap(),
        "renew keeps the token"
    );
}

#[tokio::test(start_paused = true)]
async fn each_renewal_reports_how_late_it_went_out() {
    let store = MemoryStore::new();
    let (rec, _h) = lead(&store).await;
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let first = rec.renews.lock().unwrap()[0].0;
    // Frozen from before the next renewal is due (R after the first) until
    // 1.2 s past it, inside the validity: it goes out that late.
    tokio::time::sleep_until(first + Duration::from_millis(4_500)).await;
    tokio::time::advance(Duration::from_millis(1_700)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late = rec.late.lock().unwrap().clone();
    assert_eq!(late.len(), 2, "{late:?}");
    assert!(late[0] <= Duration::from_millis(1), "{late:?}");
    assert!(
        late[1].abs_diff(Duration::from_millis(1_200)) <= Duration::from_millis(1),
        "{late:?}"
    );
    assert_eq!(rec.renews.lock().unwrap().len(), 2);
    assert_eq!(*rec.lost.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn takeover_only_after_unchanged_rvn_for_lease_plus_drift() {
    let store = MemoryStore::new();
    let other = held_by(&store, "b", 7);
    let mut h = start(&store, cfg("a"));
    // L·(1+D) = 10.1 s from the first observation (at ~0).
    let took = until(&mut h, Duration::from_secs(30), |s| s.role == Role::Leader).await;
    assert!(
        took >= Duration::from_millis(10_100) && took <= Duration::from_millis(10_200),
        "took over after {took:?}"
    );
    let lease = stored(&store);
    assert_eq!(lease.holder.as_deref(), Some("a"));
    assert_eq!(lease.fencing_token, other.fencing_token + 1);
}

#[tokio::test(start_paused = true)]
async fn never_takes_over_while_the_rvn_moves() {
    let store = MemoryStore::new();
    held_by(&store, "b", 7);
    let h = start(&store, cfg("a"));
    // "b" renews every 5 s (a fresh rvn each time) for a minute.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut l = stored(&store);
        l.rvn = new_rvn();
        store.set("report", Record::Valid(l));
        assert_ne!(h.state.borrow().role, Role::Leader);
    }
    assert_eq!(stored(&store).holder.as_deref(), Some("b"));
    assert_eq!(h.state.borrow().leader.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn released_lease_is_taken_at_once() {
    let store = MemoryStore::new();
    let mut released = held_by(&store, "b", 41);
    released.holder = None;
    store.set("report", Record::Valid(released));
    let mut h = start(&store, cfg("a"));
    let took = until(&mut h, S, |s| s.role == Role::Leader).await;
    assert!(took < Duration::from_millis(10), "took {took:?}");
    assert_eq!(stored(&store).fencing_token, 42);
}

#[tokio::test(start_paused = true)]
async fn restarted_process_with_same_identity_waits_like_a_follower() {
    let store = MemoryStore::new();
    held_by(&store, "a", 3);
    let mut h = start(&store, cfg("a"));
    let took = until(&mut h, Duration::from_secs(30), |s| s.role == Role::Leader).await;
    assert!(took >= Duration::from_millis(10_100), "took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn stop_at_validity_minus_grace_and_not_leader_at_validity_when_store_is_silent() {
    for fault in [Fault::Unreachable, Fault::Blackhole] {
        let store = MemoryStore::new();
        let mut h = start(&store, cfg("a"));
        until(&mut h, S, |s| s.role == Role::Leader).await;
        let tenure = h.state.borrow().tenure.clone().unwrap();
        let t0 = tokio::time::Instant::now();
        store.set_fault(fault);
        // validity = L·(1−D) − M = 9.9 − 0.2 = 9.7 s; stop at 9.7 − 2 = 7.7 s.
        let stop = until(&mut h, Duration::from_secs(20), |s| {
            s.role == Role::Stopping
        })
        .await;
        assert!(
            stop.abs_diff(Duration::from_millis(7_700)) <= Duration::from_millis(5),
            "{fault:?}: stopping after {stop:?}"
        );
        assert!(!h.state.borrow().is_leader_at(Clock::tokio().now()));
        until(&mut h, Duration::from_secs(20), |s| {
            s.role == Role::Follower
        })
        .await;
        let end = t0.elapsed();
        assert!(
            end.abs_diff(Duration::from_millis(9_700)) <= Duration::from_millis(5),
            "{fault:?}: follower after {end:?}"
        );
        assert_eq!(tenure.valid_until - tenure.stop_at, Duration::from_secs(2));
    }
}

#[tokio::test(start_paused = true)]
async fn leader_keeps_its_tenure_through_a_short_outage() {
    let store = MemoryStore::new();
    let (rec, h) = lead(&store).await;
    let before = h.state.borrow().tenure.clone().unwrap();
    store.set_fault(Fault::Unreachable);
    // The renew due at 5 s fails, the retry at 6 s fails too, the one at 7 s
    // (before the stop time at 7.7 s) succeeds.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    store.set_fault(Fault::None);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let after = h.state.borrow().clone();
    assert_eq!(after.role, Role::Leader);
    let t = after.tenure.unwrap();
    assert_eq!(t.seq, before.seq, "same tenure");
    assert_eq!(t.fencing_token, before.fencing_token);
    assert!(t.valid_until > before.valid_until);
    let labels: Vec<_> = rec.renews.lock().unwrap().iter().map(|r| r.1).collect();
    assert_eq!(labels, ["error", "error", "ok"]);
}

#[tokio::test(start_paused = true)]
async fn lost_lease_stops_at_once_when_someone_else_wrote() {
    let store = MemoryStore::new();
    let mut h = start(&store, cfg("a"));
    until(&mut h, S, |s| s.role == Role::Leader).await;
    let mut stolen = stored(&store);
    stolen.holder = Some("b".into());
    stolen.rvn = new_rvn();
    store.set("report", Record::Valid(stolen));
    let took = until(&mut h, Duration::from_secs(10), |s| {
        s.role == Role::Stopping
    })
    .await;
    // Discovered by the renew at R = 5 s.
    assert!(took <= Duration::from_millis(5_010), "took {took:?}");
    let t = h.state.borrow().tenure.clone().unwrap();
    assert!(t.valid_until - t.stop_at <= Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_counted_and_a_release_is_not() {
    let store = MemoryStore::new();
    let (rec, mut h) = lead(&store).await;
    let mut stolen = stored(&store);
    stolen.holder = Some("b".into());
    stolen.rvn = new_rvn();
    store.set("report", Record::Valid(stolen));
    until(&mut h, Duration::from_secs(10), |s| {
        s.role == Role::Stopping
    })
    .await;
    assert_eq!(*rec.lost.lock().unwrap(), 1);

    let store = MemoryStore::new();
    let (rec, h) = lead(&store).await;
    assert!(h.release(AfterRelease::Exit).await);
    h.join().await;
    assert_eq!(*rec.lost.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn ambiguous_renew_is_kept_by_read_back() {
    let store = MemoryStore::new();
    let (rec, h) = lead(&store).await;
    let seq = h.state.borrow().tenure.as_ref().unwrap().seq;
    store.set_fault(Fault::LoseWriteAnswers);
    tokio::time::sleep(Duration::from_secs(21)).await;
    let s = h.state.borrow().clone();
    assert_eq!(s.role, Role::Leader);
    assert_eq!(s.tenure.unwrap().seq, seq);
    assert!(rec.renews.lock().unwrap().iter().all(|r| r.1 == "ok"));
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_increase_over_tenures_and_across_deletion() {
    let store = MemoryStore::new();
    let mut a = start(&store, cfg("a"));
    until(&mut a, S, |s| s.role == Role::Leader).await;
    let t1 = stored(&store).fencing_token;
    let mut b = start(&store, cfg("b"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // a resigns: b takes the released lease.
    assert!(
        a.release(AfterRelease::SitOut(Duration::from_secs(30)))
            .await
    );
    until(&mut b, S, |s| s.role == Role::Leader).await;
    let t2 = stored(&store).fencing_token;
    assert_eq!(t2, t1 + 1);
    // The item is deleted under b: b notices at its next renew, stops, and
    // whoever recreates the item must still use a larger token.
    store.set("report", Record::Absent);
    until(&mut b, Duration::from_secs(10), |s| {
        s.role == Role::Stopping
    })
    .await;
    until(&mut b, Duration::from_secs(60), |s| s.role == Role::Leader).await;
    let t3 = stored(&store).fencing_token;
    assert!(t3 > t2, "{t3} > {t2}");
    // And once more across a release and take-over.
    assert!(b.release(AfterRelease::Exit).await);
    until(&mut a, Duration::from_secs(60), |s| s.role == Role::Leader).await;
    let t4 = stored(&store).fencing_token;
    assert!(t4 > t3, "{t4} > {t3}");
}

#[tokio::test(start_paused = true)]
async fn strict_new_lease_confirms_before_leading() {
    let store = MemoryStore::new();
    let mut c = cfg("a");
    c.strict_new_lease = true;
    let mut h = start(&store, c);
    until(&mut h, S, |s| s.role == Role::Confirming).await;
    assert!(!h.state.borrow().is_leader_at(Clock::tokio().now()));
    let took = until(&mut h, Duration::from_secs(30), |s| s.role == Role::Leader).await;
    assert!(
        took.abs_diff(Duration::from_millis(10_100)) <= Duration::from_millis(10),
        "led after {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn malformed_record_is_reported_and_overwritten_only_after_a_full_unchanged_lease() {
    let store = MemoryStore::new();
    store.set(
        "report",
        Record::Malformed(Malformed {
            election: "report".into(),
            problem: "attribute `rvn` is missing".into(),
            fingerprint: "f1".into(),
            fencing_token: Some(99),
            guard: RvnGuard::Missing,
        }),
    );
    let mut h = start(&store, cfg("a"));
    until(&mut h, S, |s| s.malformed.is_some()).await;
    assert!(
        h.state
            .borrow()
            .malformed
            .as_deref()
            .unwrap()
            .contains("rvn")
    );
    let took = until(&mut h, Duration::from_secs(30), |s| s.role == Role::Leader).await;
    assert!(
        took >= Duration::from_millis(10_000),
        "overwrote after {took:?}"
    );
    assert!(stored(&store).fencing_token > 99);
}

#[tokio::test(start_paused = true)]
async fn release_on_shutdown_lets_another_lead_at_once() {
    let store = MemoryStore::new();
    let mut a = start(&store, cfg("a"));
    until(&mut a, S, |s| s.role == Role::Leader).await;
    let mut b = start(&store, cfg("b"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.release(AfterRelease::Exit).await);
    assert_eq!(stored(&store).holder, None);
    let took = until(&mut b, Duration::from_secs(5), |s| s.role == Role::Leader).await;
    assert!(took <= Duration::from_millis(1_010), "took {took:?}");
    a.join().await;
}

#[test]
fn timing_invariant_is_enforced_with_the_values_named() {
    assert!(cfg("a").validate().is_ok());
    let mut c = cfg("a");
    c.renew_interval = Duration::from_secs(8);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("renew_interval 8s"), "{err}");
    assert!(err.contains("kill_grace 2s"), "{err}");
    assert!(err.contains("lease_duration 10s"), "{err}");
    assert!(!err.contains('\n'));
    c.renew_interval = Duration::from_secs(10);
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("must be shorter")
    );
    assert_eq!(cfg("a").retries_that_fit(), 2);
}

/// A store that can apply a write yet lose its answer while reads fail too,
/// so the read-back cannot resolve it: the leader does not know its renew
/// applied.
struct LostAnswers {
    inner: MemoryStore,
    lose_next_put: std::sync::atomic::AtomicBool,
    reads_fail: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl LeaseStore for LostAnswers {
    fn kind(&self) -> &'static str {
        "lost-answers"
    }
    async fn read(&self, election: &str, budget: Duration) -> Result<Record, StoreError> {
        if self.reads_fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Transport("reads fail (injected)".into()));
        }
        self.inner.read(election, budget).await
    }
    async fn put(
        &self,
        lease: &Lease,
        condition: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let out = self.inner.put(lease, condition, budget).await;
        if self
            .lose_next_put
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.reads_fail
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(StoreError::Timeout(budget));
        }
        out
    }
    async fn scan(&self, budget: Duration) -> Result<Vec<Record>, StoreError> {
        self.inner.scan(budget).await
    }
    async fn check(&self, budget: Duration) -> Result<(), StoreError> {
        self.inner.check(budget).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_renew_that_applied_unknown_to_us_does_not_lose_the_lease() {
    use std::sync::atomic::Ordering;
    let memory = MemoryStore::new();
    let store = Arc::new(LostAnswers {
        inner: memory.clone(),
        lose_next_put: false.into(),
        reads_fail: false.into(),
    });
    // R = 2 s: the renew's budget (R) ends long before the stop time (7.7 s).
    let mut c = cfg("a");
    c.renew_interval = Duration::from_secs(2);
    let mut h = spawn(store.clone(), c, Clock::tokio(), Arc::new(NoObserver));
    until(&mut h, S, |s| s.role == Role::Leader).await;
    let seq = h.state.borrow().tenure.as_ref().unwrap().seq;
    // The renew at 2 s applies; its answer and every read-back until 4 s are
    // lost, so the engine does not know.
    store.lose_next_put.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    store.reads_fail.store(false, Ordering::SeqCst);
    // The retry finds our own newer rvn in the record: same tenure.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = h.state.borrow().clone();
    assert_eq!(s.role, Role::Leader, "{s:?}");
    assert_eq!(s.tenure.unwrap().seq, seq);
}

#[tokio::test(start_paused = true)]
async fn release_after_a_renew_that_applied_unknown_to_us_still_releases() {
    use std::sync::atomic::Ordering;
    let memory = MemoryStore::new();
    let store = Arc::new(LostAnswers {
        inner: memory.clone(),
        lose_next_put: false.into(),
        reads_fail: false.into(),
    });
    let mut h = spawn(
        store.clone(),
        cfg("a"),
        Clock::tokio(),
        Arc::new(NoObserver),
    );
    until(&mut h, S, |s| s.role == Role::Leader).await;
    // The renew at 5 s applies unknown to us; reads fail until the stop time.
    store.lose_next_put.store(true, Ordering::SeqCst);
    until(&mut h, Duration::from_secs(10), |s| {
        s.role == Role::Stopping
    })
    .await;
    store.reads_fail.store(false, Ordering::SeqCst);
    // The child is stopped; the release must find and release our own rvn.
    assert!(h.release(AfterRelease::Exit).await);
    assert_eq!(stored(&memory).holder, None, "released");
}

/// A write refused with an error (not a lost race) is retried after P,
/// then after growing pauses: never at once, never in a loop.
#[tokio::test(start_paused = true)]
async fn refused_writes_are_retried_with_growing_pauses() {
    let store = MemoryStore::new();
    store.set_fault(Fault::RefuseWrites);
    let h = start(&store, cfg("a"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(store.counts().1, 1, "one attempt at once");
    // P = 1 s: pauses from [1, 2) s, then [2, 4), then [4, 8) s for ever.
    tokio::time::sleep(10 * S).await;
    let (reads, writes) = store.counts();
    assert!((3..=5).contains(&writes), "{writes} writes in 10 s");
    assert_eq!(reads, writes, "one read per round");
    tokio::time::sleep(60 * S).await;
    let more = store.counts().1 - writes;
    assert!((7..=16).contains(&more), "{more} writes in the next 60 s");
    assert_eq!(h.state.borrow().role, Role::Follower);
    // Writes allowed again: the next round leads.
    store.set_fault(Fault::None);
    tokio::time::sleep(8 * S).await;
    assert_eq!(h.state.borrow().role, Role::Leader);
}

/// A step-down asked of a follower changes nothing: no sit-out, it takes a
/// released lease as soon as it sees it.
#[tokio::test(start_paused = true)]
async fn resign_of_a_follower_changes_nothing() {
    let store = MemoryStore::new();
    let mut a = start(&store, cfg("a"));
    until(&mut a, S, |s| s.role == Role::Leader).await;
    let mut b = start(&store, cfg("b"));
    until(&mut b, 2 * S, |s| s.first_observation_done).await;
    assert!(
        !b.release(AfterRelease::SitOut(Duration::from_secs(30)))
            .await
    );
    assert!(a.release(AfterRelease::Exit).await);
    let took = until(&mut b, 5 * S, |s| s.role == Role::Leader).await;
    assert!(took <= S, "b sat out after all: led after {took:?}");
}

/// A closed gate (the app check failing) keeps a follower from taking a
/// free lease, an absent one or an expired one; opening it makes the
/// follower look at once rather than at its next poll.
#[tokio::test(start_paused = true)]
async fn a_closed_gate_never_campaigns_and_opening_it_acquires_at_once() {
    let store = MemoryStore::new();
    let (gate_tx, gate) = watch::channel(Verdict::Fail);
    let mut c = cfg("b");
    c.retry_interval = 10 * S;
    let mut h = spawn_gated(
        Arc::new(store.clone()),
        c,
        Clock::tokio(),
        Arc::new(NoObserver),
        Duration::ZERO,
        Links {
            gate: Some(gate),
            ..Links::default()
        },
    );
    // No record at all, then one whose holder stopped renewing: neither is
    // taken while the gate is closed, however long it stays so.
    tokio::time::sleep(25 * S).await;
    assert!(
        matches!(store.get("report"), Record::Absent),
        "created with the gate closed"
    );
    held_by(&store, "a", 7);
    tokio::time::sleep(60 * S).await;
    assert_eq!(stored(&store).holder.as_deref(), Some("a"));
    assert!(!h.state.borrow().is_leader_at(Clock::tokio().now()));

    // Opening the gate: taken well before the next 10 s poll.
    gate_tx.send_replace(Verdict::Pass);
    let took = until(&mut h, 5 * S, |s| s.tenure.is_some()).await;
    assert!(took < S, "took {took:?}");
    assert_eq!(stored(&store).holder.as_deref(), Some("b"));
    assert_eq!(stored(&store).fencing_token, 8);
}

/// Counts the records of an unknown format the engine reported.
#[derive(Default)]
struct UnknownFormats(std::sync::atomic::AtomicU32);

impl Observer for UnknownFormats {
    fn unknown_format_record(&self, _election: &str) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl UnknownFormats {
    fn seen(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_never_writes_a_record_of_an_unknown_format_however_long_it_stays() {
    let store = MemoryStore::new();
    let planted = store.plant_unknown_format("report", "3", Some("old"), Some(99));
    let seen = Arc::new(UnknownFormats::default());
    let mut h = spawn(
        Arc::new(store.clone()),
        cfg("a"),
        Clock::tokio(),
        seen.clone(),
    );
    until(&mut h, S, |s| s.unknown_format.is_some()).await;
    let state = h.state.borrow().clone();
    assert_eq!(state.unknown_format.as_deref(), Some("3"));
    assert_eq!(
        (state.leader.as_deref(), state.fencing_token),
        (Some("old"), Some(99))
    );
    // Ten leases: never a write, a read every R (5 s), not every P (1 s).
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(store.get("report"), planted);
    let (reads, writes) = store.counts();
    assert_eq!(writes, 0, "wrote over an unknown format");
    assert!((20..=22).contains(&reads), "{reads} reads in 100 s");
    assert_eq!(h.state.borrow().role, Role::Follower);
    assert_eq!(seen.seen(), 1, "warned once while it stays the same");
    // Another write of the later format: warned again, still left alone.
    store.plant_unknown_format("report", "3", Some("old"), Some(100));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(seen.seen(), 2);
    assert_eq!(store.counts().1, 0);
    // Back to this format, released: taken at once, above every token seen.
    let mut released = held_by(&store, "old", 50);
    released.holder = None;
    store.set("report", Record::Valid(released));
    until(&mut h, Duration::from_secs(6), |s| s.role == Role::Leader).await;
    assert_eq!(stored(&store).fencing_token, 101);
    assert_eq!(h.state.borrow().unknown_format, None);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_record_turned_to_an_unknown_format_has_lost_it() {
    let store = MemoryStore::new();
    let (rec, mut h) = lead(&store).await;
    let token = stored(&store).fencing_token;
    // A later release took the record, even under our identity.
    let planted = store.plant_unknown_format("report", "3", Some("a"), Some(token));
    until(&mut h, Duration::from_secs(6), |s| s.role == Role::Stopping).await;
    let renews = rec.renews.lock().unwrap().clone();
    assert_eq!(renews.last().map(|(_, r)| *r), Some("lost"), "{renews:?}");
    let took = until(&mut h, Duration::from_secs(30), |s| {
        s.role == Role::Follower && s.unknown_format.is_some()
    })
    .await;
    assert!(took <= Duration::from_secs(15), "{took:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(store.get("report"), planted, "the record was written over");
    assert_eq!(h.state.borrow().role, Role::Follower);
}
