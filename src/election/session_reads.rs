//! What a daemon knows of other daemons' sessions, shared by its
//! elections: reads of session records, and what the owners' streams
//! told of them.
//!
//! Every election held through one session times that session, and their
//! rounds come together (they time the same `rvn` from the same instant,
//! so they wake at the same instants): one store read answers every
//! election that asked for the same session while it was on its way, or
//! that will take an answer from a read sent at or after an instant it
//! names, instead of one read per election.
//!
//! The owner's stream (`crate::watch::mux`) tells of each write of its
//! session: that dates the `rvn` it names (an `rvn` is random, so it
//! cannot be named before it was written), and it tells whether the stream
//! flows. A read asked for once a session is due waits for the next write
//! to be told (a moment at most), so that it finds an `rvn` timed from its
//! event: about one read a lease per session, whatever the number of
//! elections.
//!
//! Sharing an answer is safe: the rule times a session's `rvn` from the
//! earliest instant this daemon knew it (a read's answer, or an event
//! naming it), never earlier, and the end of a session is a write
//! conditional on the `rvn` it timed; an answer that is a moment old can
//! only make a follower wait longer, or end nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OnceCell, watch};

use super::{Observer, Outcome, SESSION_LABEL, TaskContext};
use crate::clock::{Clock, Instant};
use crate::core::election::ElectionConfig;
use crate::core::session::{Flow, SessionAnswer};
use crate::core::takeover::takeover_wait;
use crate::lease::{LeaseStore, READ_MANY_LIMIT, Record, StoreError, is_session_key};

/// One read on its way, and its answer once it came.
type Shared = Arc<OnceCell<Result<Record, StoreError>>>;

/// How many `rvn`s of one session are remembered with when they were
/// first learned.
const REMEMBERED: usize = 8;

/// A session nobody asked about or told of for this long is forgotten
/// (its owner restarted under a new key, or it was ended).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What is known of one session.
struct Known {
    /// The read on its way, if any.
    on_the_way: Option<Shared>,
    /// The last store answer: when its read was sent, and the record.
    last: Option<(Instant, Record)>,
    /// `rvn`s with the instant this daemon first learned each.
    learned: VecDeque<(String, Instant)>,
    /// The owner's stream: the first event on its connection, and the
    /// arrival of the last one (moves on every event).
    flow: Option<Flow>,
    /// The latest write its owner's stream told: its `rvn` and arrival.
    told: watch::Sender<Option<(String, Instant)>>,
    /// The labels its owner's stream told last, if it did.
    labels: Option<BTreeMap<String, String>>,
    /// When anyone last asked about it or told of it.
    touched: Instant,
}

impl Known {
    fn new(now: Instant) -> Known {
        Known {
            on_the_way: None,
            last: None,
            learned: VecDeque::new(),
            flow: None,
            told: watch::channel(None).0,
            labels: None,
            touched: now,
        }
    }

    fn learn(&mut self, rvn: &str, at: Instant) {
        if self.learned.iter().any(|(r, _)| r == rvn) {
            return;
        }
        if self.learned.len() == REMEMBERED {
            self.learned.pop_front();
        }
        self.learned.push_back((rvn.to_owned(), at));
    }

    /// This session as [`SessionReads::sessions`] lists it.
    fn listed(&self, key: &str) -> KnownSession {
        KnownSession {
            key: key.to_owned(),
            record: self.last.as_ref().map(|(_, r)| r.clone()),
            latest: self.learned.back().cloned(),
            told_labels: self.labels.clone(),
        }
    }

    /// What an election is told of `record`, read by a request sent at
    /// `sent`.
    fn answer(
        &self,
        record: Result<Record, StoreError>,
        sent: Instant,
        now: Instant,
    ) -> SessionAnswer {
        let learned = match &record {
            Ok(Record::Valid(s)) => self
                .learned
                .iter()
                .find(|(r, _)| *r == s.rvn)
                .map(|(_, at)| *at),
            _ => None,
        };
        let told = match &record {
            Ok(Record::Valid(s)) => self
                .told
                .borrow()
                .clone()
                .filter(|(rvn, at)| *rvn != s.rvn && *at > sent),
            _ => None,
        };
        SessionAnswer {
            record,
            learned,
            flow: self.flow.filter(|f| now < f.until),
            told,
            // Judged by the election that asked.
            moved: true,
        }
    }
}

/// A session as [`SessionReads::sessions`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownSession {
    /// Its key.
    pub key: String,
    /// Its record as last read, if it was.
    pub record: Option<Record>,
    /// The latest `rvn` learned, and when.
    pub latest: Option<(String, Instant)>,
    /// The labels its owner's stream told last, if it did.
    pub told_labels: Option<BTreeMap<String, String>>,
}

/// See the module docs.
pub struct SessionReads {
    store: Arc<dyn LeaseStore>,
    clock: Clock,
    /// Each read made is counted under the election label `#session`.
    observer: Arc<dyn Observer>,
    /// R + P: a stream that tells nothing this long is quiet.
    quiet: Duration,
    /// D, for the takeover rule's wait of a cached answer.
    max_clock_drift: f64,
    /// How long a read past a session's due waits for its next write to
    /// be told: min(R, 2·P).
    slack: Duration,
    known: Mutex<HashMap<String, Known>>,
}

impl std::fmt::Debug for SessionReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionReads")
            .field("sessions", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl SessionReads {
    /// Shared reads of `store`'s session records, timed on `clock` and
    /// counted by `observer`, with `timing`'s R, P and D: a stream quiet
    /// for R + P has stopped ([`ElectionConfig::hint_quiet`]); a read past
    /// a session's due waits up to min(R, 2·P) for its next write to be
    /// told ([`ElectionConfig::due_read_slack`]).
    pub fn new(context: TaskContext, timing: &ElectionConfig) -> SessionReads {
        let TaskContext {
            store,
            clock,
            observer,
        } = context;
        SessionReads {
            store,
            clock,
            observer,
            quiet: timing.hint_quiet(),
            slack: timing.due_read_slack(),
            max_clock_drift: timing.max_clock_drift,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        // A panic elsewhere mid-update leaves a map that is still whole.
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The entry of `key`, made if need be (forgetting stale ones then).
    fn entry<'a>(map: &'a mut HashMap<String, Known>, key: &str, now: Instant) -> &'a mut Known {
        if !map.contains_key(key) {
            map.retain(|_, k| now - k.touched < FORGET_AFTER || k.on_the_way.is_some());
        }
        let known = map.entry(key.to_owned()).or_insert_with(|| Known::new(now));
        known.touched = now;
        known
    }

    /// The owner's stream told, at `at`, that its session `key` was written
    /// with `rvn`; `since`: the first event of that session on the same
    /// connection. Only of a session some election read: a stream cannot
    /// fill the map with made-up keys (and the first read of a session
    /// dates its `rvn` itself).
    pub fn told(
        &self,
        key: &str,
        rvn: &str,
        labels: &BTreeMap<String, String>,
        at: Instant,
        since: Instant,
    ) {
        let mut map = self.lock();
        let Some(known) = map.get_mut(key) else {
            return;
        };
        known.touched = at;
        known.learn(rvn, at);
        known.labels = Some(labels.clone());
        known.flow = Some(Flow {
            since,
            until: at + self.quiet,
        });
        known.told.send_replace(Some((rvn.to_owned(), at)));
    }

    /// Look up, in one request, sessions named by the daemons that watch
    /// this one (at most [`READ_MANY_LIMIT`]): those the store shows held
    /// are known from now on (balance counts them as members), the others
    /// are not remembered at all, so a made-up name occupies nothing. With
    /// how many were held.
    pub async fn look_up(&self, keys: &[String], budget: Duration) -> Result<usize, StoreError> {
        let keys: Vec<String> = keys
            .iter()
            .filter(|k| is_session_key(k))
            .take(READ_MANY_LIMIT)
            .cloned()
            .collect();
        if keys.is_empty() {
            return Ok(0);
        }
        let sent = self.clock.now();
        let res = self.store.read_many(&keys, budget).await;
        let now = self.clock.now();
        let outcome = match &res {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(SESSION_LABEL, "look_up_sessions", now - sent, outcome);
        let mut held = 0;
        let mut map = self.lock();
        for (key, record) in keys.iter().zip(res?) {
            let Record::Valid(session) = &record else {
                continue;
            };
            if session.holder.is_none() || session.election != *key {
                continue;
            }
            held += 1;
            let known = Self::entry(&mut map, key, now);
            known.learn(&session.rvn, now);
            if known.last.as_ref().is_none_or(|(s, _)| *s <= sent) {
                known.last = Some((sent, record.clone()));
            }
        }
        Ok(held)
    }

    /// Every session known: its key, its record as last read (if it was),
    /// and the latest `rvn` learned of it with the instant it was (from a
    /// read or its owner's stream, whichever came last).
    pub fn sessions(&self) -> Vec<KnownSession> {
        self.lock().iter().map(|(key, k)| k.listed(key)).collect()
    }

    /// The session `key` as [`Self::sessions`] lists it, if known.
    pub fn session(&self, key: &str) -> Option<KnownSession> {
        self.lock().get(key).map(|k| k.listed(key))
    }

    /// The owner's stream of `key` ended (or broke, or went quiet).
    pub fn stream_ended(&self, key: &str) {
        if let Some(known) = self.lock().get_mut(key) {
            known.flow = None;
        }
    }

    /// The last answer, if it will do for an election due at `due`: its
    /// read was sent since, or it shows an `rvn` not due yet (the
    /// election then waits for that one: the elections of a session come
    /// to time the same `rvn`, and to read together).
    ///
    /// It will also do, once, when the stream told of a later write since
    /// its read was sent, and that write is not due yet, and the read is
    /// less than one and a half waits old: the election then waits for
    /// that write (see [`SessionAnswer::told`]), and reads when it is due,
    /// the last read being about two waits old by then. So a session whose
    /// stream flows is read about once every two leases.
    fn will_do(&self, known: &Known, due: Instant, now: Instant) -> Option<(Instant, Record)> {
        let (sent, record) = known.last.as_ref()?;
        if *sent >= due {
            return Some((*sent, record.clone()));
        }
        let Record::Valid(s) = record else {
            return None;
        };
        let wait = takeover_wait(s.lease_ms, self.max_clock_drift);
        let learned = known.learned.iter().find(|(r, _)| *r == s.rvn);
        if learned.is_some_and(|(_, at)| now < *at + wait) {
            return Some((*sent, record.clone()));
        }
        let told_later = known.told.borrow().as_ref().is_some_and(|(rvn, at)| {
            // The read is about one wait old at the first due after it,
            // about two at the next: served at the first only.
            *rvn != s.rvn && *at > *sent && now < *at + wait && now < *sent + wait * 3 / 2
        });
        told_later.then(|| (*sent, record.clone()))
    }

    /// The session record under `key`, as an election is told it: the
    /// answer of the last read if it was sent at or after `not_before`,
    /// else of the read on its way, else of a new read within `budget`
    /// (past `not_before`, while the owner's stream flows, once its next
    /// write is told or `slack` passed). With how long the store took, if
    /// this call made the request (for metrics).
    pub async fn read(
        &self,
        key: &str,
        budget: Duration,
        not_before: Option<Instant>,
    ) -> (SessionAnswer, Option<Duration>) {
        if let Some(due) = not_before {
            let told = {
                let now = self.clock.now();
                let mut map = self.lock();
                let known = Self::entry(&mut map, key, now);
                if let Some((sent, record)) = self.will_do(known, due, now) {
                    return (known.answer(Ok(record), sent, now), None);
                }
                known
                    .flow
                    .is_some_and(|f| now < f.until)
                    .then(|| known.told.subscribe())
            };
            if let Some(mut told) = told {
                let wait = told.wait_for(|t| t.as_ref().is_some_and(|(_, t)| *t >= due));
                let _ = self.clock.timeout_at(due + self.slack, wait).await;
            }
        }
        let shared = {
            let now = self.clock.now();
            let mut map = self.lock();
            let known = Self::entry(&mut map, key, now);
            if let Some((sent, record)) = not_before.and_then(|due| self.will_do(known, due, now)) {
                return (known.answer(Ok(record), sent, now), None);
            }
            known
                .on_the_way
                .get_or_insert_with(Default::default)
                .clone()
        };
        let mut made = false;
        let sent = self.clock.now();
        let res = shared
            .get_or_init(|| {
                made = true;
                self.store.read(key, budget)
            })
            .await
            .clone();
        let now = self.clock.now();
        if made {
            let outcome = match &res {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
            };
            self.observer
                .store_request(SESSION_LABEL, "read_session", now - sent, outcome);
        }
        let mut map = self.lock();
        let known = Self::entry(&mut map, key, now);
        if made {
            // Later askers make a read of their own.
            if known
                .on_the_way
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &shared))
            {
                known.on_the_way = None;
            }
            if let Ok(record) = &res {
                if let Record::Valid(s) = record {
                    known.learn(&s.rvn, now);
                }
                // Two reads answered out of order: the one sent later
                // stays (it shows the newer record).
                if known.last.as_ref().is_none_or(|(s, _)| *s <= sent) {
                    known.last = Some((sent, record.clone()));
                }
            }
        }
        (known.answer(res, sent, now), made.then(|| now - sent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::memory::{Fault, MemoryStore};
    use crate::lease::{Condition, Lease};

    const MS: Duration = Duration::from_millis(1);

    fn reads(store: &MemoryStore, clock: &Clock) -> Arc<SessionReads> {
        Arc::new(SessionReads::new(
            TaskContext {
                store: Arc::new(store.clone()),
                clock: clock.clone(),
                observer: Arc::new(super::super::NoObserver),
            },
            &ElectionConfig::with_defaults("-", "me"),
        ))
    }

    #[tokio::test]
    async fn reads_asked_together_are_answered_by_one_and_later_ones_read_again() {
        let store = MemoryStore::new();
        store.set_fault(Fault::Slow(Duration::from_millis(50)));
        let reads = reads(&store, &Clock::tokio());
        let budget = Duration::from_secs(1);
        let asks: Vec<_> = (0..50)
            .map(|_| {
                let reads = reads.clone();
                tokio::spawn(async move { reads.read("#session/a/n", budget, None).await })
            })
            .collect();
        let answers = join_all(asks).await;
        assert!(answers.iter().all(|(a, _)| a.record == Ok(Record::Absent)));
        let made = answers.iter().filter(|(_, m)| m.is_some()).count();
        assert!(
            (1..10).contains(&made),
            "one read answers those asked together ({made} made)"
        );
        assert_eq!(store.counts().0, made as u64, "reads the store saw");
        // Once answered, the next ask reads anew.
        let (_, made_again) = reads.read("#session/a/n", budget, None).await;
        assert!(made_again.is_some());
        assert_eq!(store.counts().0, made as u64 + 1);
    }

    async fn write_session(store: &MemoryStore, key: &str) -> Lease {
        let lease = Lease::stamped(key, "b", 0, 10_000, 1, None);
        store
            .write(&lease, &Condition::NotExists, Duration::from_secs(1))
            .await
            .expect("the memory store answers");
        lease
    }

    async fn store_renew(store: &MemoryStore, lease: &Lease) -> Lease {
        let renewed = lease.renewed();
        let condition = Condition::RvnIs(lease.rvn.clone());
        store
            .write(&renewed, &condition, Duration::from_secs(1))
            .await
            .expect("the memory store answers");
        renewed
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_past_the_due_waits_for_the_next_write_told_and_dates_its_rvn_from_the_event() {
        let store = MemoryStore::new();
        let clock = Clock::tokio();
        let reads = reads(&store, &clock);
        let key = "#session/b/n";
        let lease = write_session(&store, key).await;
        let t0 = clock.now();
        // Of a session nobody read, nothing is kept.
        reads.told(key, &lease.rvn, &BTreeMap::new(), t0, t0);
        let (answer, made) = reads.read(key, Duration::from_secs(1), None).await;
        assert!(made.is_some());
        assert_eq!((answer.learned, answer.flow), (Some(t0), None));
        // The stream tells of a write 300 ms before anyone reads it.
        let renewed = store_renew(&store, &lease).await;
        let t0 = clock.now();
        reads.told(key, &renewed.rvn, &BTreeMap::new(), t0, t0);
        tokio::time::advance(300 * MS).await;
        let (answer, made) = reads.read(key, Duration::from_secs(1), None).await;
        assert!(made.is_some());
        assert_eq!(answer.learned, Some(t0), "dated from the event");
        let flow = answer.flow.expect("the stream flows");
        assert_eq!((flow.since, flow.until), (t0, t0 + Duration::from_secs(6)));
        // Asked for by an election due later, while that rvn is not due
        // yet itself: the answer will do (that election now times it).
        let (_, made) = reads
            .read(key, Duration::from_secs(1), Some(clock.now() + 100 * MS))
            .await;
        assert!(made.is_none());
        // Once it is due and the read two waits old (the stream telling of
        // other writes meanwhile), a read waits for the next write to be
        // told.
        for k in 1..=4 {
            tokio::time::advance(Duration::from_secs(5)).await;
            reads.told(key, &format!("n{k}"), &BTreeMap::new(), clock.now(), t0);
        }
        let due = clock.now() + 100 * MS;
        let ask = {
            let reads = reads.clone();
            tokio::spawn(async move { reads.read(key, Duration::from_secs(1), Some(due)).await })
        };
        tokio::time::advance(500 * MS).await;
        assert!(!ask.is_finished(), "waits for the next write to be told");
        assert_eq!(store.counts().0, 2);
        let told_at = clock.now();
        assert!(told_at < due + Duration::from_secs(2), "within the slack");
        reads.told(key, "next", &BTreeMap::new(), told_at, t0);
        let (answer, made) = ask.await.expect("the task ran");
        assert!(made.is_some());
        assert_eq!(store.counts().0, 3);
        // The store still shows the rvn told first (the "next" write never
        // happened): it keeps its first date.
        assert_eq!(answer.learned, Some(t0));
        // Another election due at the same instant takes that answer.
        let (_, made) = reads.read(key, Duration::from_secs(1), Some(due)).await;
        assert!(made.is_none(), "a read sent after the due answers it");
        assert_eq!(store.counts().0, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_write_told_since_the_last_read_spares_one_read_and_no_more() {
        let store = MemoryStore::new();
        let clock = Clock::tokio();
        let reads = reads(&store, &clock);
        let key = "#session/b/n";
        let lease = write_session(&store, key).await;
        let (_, made) = reads.read(key, Duration::from_secs(1), None).await;
        assert!(made.is_some());
        let t0 = clock.now();
        let none = BTreeMap::new();
        reads.told(key, &lease.rvn, &none, t0, t0);
        // Renewed every R, told each time.
        for rvn in ["b", "c"] {
            tokio::time::advance(Duration::from_secs(5)).await;
            reads.told(key, rvn, &none, clock.now(), t0);
        }
        // The rvn read is due; the stream told of later writes since the
        // read: the answer will do, telling of the last.
        tokio::time::advance(Duration::from_millis(100)).await;
        let due = clock.now();
        let (answer, made) = reads.read(key, Duration::from_secs(1), Some(due)).await;
        assert!(made.is_none());
        let told = Some(("c".to_owned(), t0 + Duration::from_secs(10)));
        assert_eq!(answer.told, told);
        // Once that one is due, the last read is two leases old: read
        // again (after the next write is told, or the slack).
        for rvn in ["d", "e"] {
            tokio::time::advance(Duration::from_secs(5)).await;
            reads.told(key, rvn, &none, clock.now(), t0);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        let due = clock.now();
        let (answer, made) = reads.read(key, Duration::from_secs(1), Some(due)).await;
        assert!(made.is_some());
        assert_eq!(answer.told, None, "nothing told since this read");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_flowing_stream_a_due_read_waits_for_nothing_and_the_slack_bounds_the_wait() {
        let store = MemoryStore::new();
        let clock = Clock::tokio();
        let reads = reads(&store, &clock);
        let key = "#session/b/n";
        write_session(&store, key).await;
        let t0 = clock.now();
        let (answer, _) = reads.read(key, Duration::from_secs(1), Some(t0)).await;
        assert_eq!(answer.flow, None);
        assert_eq!(clock.now(), t0, "no stream: read at once");
        // Once what it read is due and the read two waits old, a stream
        // that falls silent: the read waits the slack, no more.
        tokio::time::advance(Duration::from_secs(20)).await;
        reads.told(key, "x", &BTreeMap::new(), clock.now(), clock.now());
        let due = clock.now() + MS;
        let (_, made) = reads.read(key, Duration::from_secs(1), Some(due)).await;
        assert!(made.is_some());
        assert_eq!(clock.now(), due + Duration::from_secs(2));
        // Ended: no flow.
        reads.stream_ended(key);
        let (answer, _) = reads.read(key, Duration::from_secs(1), None).await;
        assert_eq!(answer.flow, None);
    }

    async fn join_all(
        handles: Vec<tokio::task::JoinHandle<(SessionAnswer, Option<Duration>)>>,
    ) -> Vec<(SessionAnswer, Option<Duration>)> {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("the task ran"));
        }
        out
    }
}
