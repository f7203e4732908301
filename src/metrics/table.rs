//! The counters of every election, in one compact table rendered straight
//! into the text format.
//!
//! A thousand elections make ten thousand series. As prometheus-crate
//! series each would keep its own copy of its labels and its family's
//! description, and a scrape would first build every one's protobuf form:
//! several MiB kept, tens of MiB for a moment. Here an election's counters
//! are one small struct, keyed by its name, and a scrape writes their lines
//! directly, a few elections at a time.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use super::text::Lines;

/// Buckets for store latencies: DynamoDB answers in a few ms, SQLite in less,
/// and a request is cut off at the renew interval (seconds).
const LATENCY_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Results of acquire attempts and renews, in label order; their series
/// exist at zero so that rates and alerts work before the first event.
pub(super) const RESULTS: [&str; 5] = ["error", "lost", "ok", "throttled", "timeout"];

/// Directions of `transitions_total`, in label order.
pub(super) const DIRECTIONS: [&str; 2] = ["gained", "lost"];

/// The families kept in the table; each series has an `election` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// `leaderd_acquire_attempts_total`.
    AcquireAttempts,
    /// `leaderd_leases_lost_total`.
    LeasesLost,
    /// `leaderd_malformed_records_total`.
    Malformed,
    /// `leaderd_preemptions_total`.
    Preemptions,
    /// `leaderd_renew_total`.
    Renew,
    /// `leaderd_store_errors_total`.
    StoreErrors,
    /// `leaderd_store_request_duration_seconds`.
    StoreRequests,
    /// `leaderd_transitions_total`.
    Transitions,
    /// `leaderd_unknown_format_records_total`.
    UnknownFormat,
    /// `leaderd_watch_streams`.
    WatchStreams,
}

/// The counters of one label: one of the daemon's elections, the
/// elections counted together (`#others`), or a name the engines report
/// under (`#session`, `#member`).
#[derive(Debug, Default)]
pub(super) struct Series {
    /// One of this daemon's elections: its fixed series exist at zero.
    election: bool,
    /// Renewed on its own: every result of `renew_total` exists at zero.
    renewed: bool,
    /// A watch stream was served: `watch_streams` exists from then on.
    streamed: bool,
    transitions: [u64; DIRECTIONS.len()],
    acquire: [u64; RESULTS.len()],
    renew: [u64; RESULTS.len()],
    leases_lost: u64,
    preemptions: u64,
    malformed: u64,
    unknown_format: u64,
    watch_streams: i64,
    /// Failed requests by class, sorted by class; a class appears with its
    /// first failure.
    errors: Vec<(&'static str, u64)>,
    /// Request latencies by operation, sorted by operation; an operation
    /// appears with its first request.
    requests: Vec<(&'static str, Box<Latency>)>,
}

/// One histogram series: counts per bucket (not cumulative), sum, count.
#[derive(Debug, Default)]
struct Latency {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// A label's series, shared with a watch stream's guard.
pub(super) type Shared = Arc<Mutex<Series>>;

/// Every label's series, sorted by label.
#[derive(Debug, Default)]
pub(super) struct Table {
    series: RwLock<BTreeMap<Box<str>, Shared>>,
}

/// Lock a label's series; a panic midway through an update leaves at worst
/// one count unmade, never a broken value, so a poisoned lock is used as is.
pub(super) fn lock(series: &Mutex<Series>) -> MutexGuard<'_, Series> {
    series.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The index of `label` in `labels`, or `otherwise` for a label not
/// listed (none is: the labels come from the same lists).
fn index(labels: &[&str], label: &str, otherwise: usize) -> usize {
    labels.iter().position(|l| *l == label).unwrap_or(otherwise)
}

impl Series {
    /// Mark as one of the daemon's elections; `renewed` when it is renewed
    /// on its own (without sessions).
    pub(super) fn election(&mut self, renewed: bool) {
        self.election = true;
        self.renewed |= renewed;
    }

    /// Mark as renewed on its own (the session).
    pub(super) fn renewed(&mut self) {
        self.renewed = true;
    }

    pub(super) fn transition(&mut self, direction: &str) {
        self.transitions[index(&DIRECTIONS, direction, 1)] += 1;
    }

    pub(super) fn acquire(&mut self, result: &str) {
        self.acquire[index(&RESULTS, result, 0)] += 1;
    }

    pub(super) fn renew(&mut self, result: &str) {
        self.renew[index(&RESULTS, result, 0)] += 1;
    }

    pub(super) fn lease_lost(&mut self) {
        self.leases_lost += 1;
    }

    pub(super) fn preempted(&mut self) {
        self.preemptions += 1;
    }

    pub(super) fn malformed(&mut self) {
        self.malformed += 1;
    }

    pub(super) fn unknown_format(&mut self) {
        self.unknown_format += 1;
    }

    /// A watch stream opened (`1`) or closed (`-1`).
    pub(super) fn stream(&mut self, delta: i64) {
        self.streamed = true;
        self.watch_streams += delta;
    }

    pub(super) fn error(&mut self, class: &'static str) {
        match self.errors.binary_search_by(|(c, _)| c.cmp(&class)) {
            Ok(i) => self.errors[i].1 += 1,
            Err(i) => self.errors.insert(i, (class, 1)),
        }
    }

    pub(super) fn request(&mut self, op: &'static str, seconds: f64) {
        let i = match self.requests.binary_search_by(|(o, _)| o.cmp(&op)) {
            Ok(i) => i,
            Err(i) => {
                self.requests.insert(i, (op, Box::default()));
                i
            }
        };
        let latency = &mut self.requests[i].1;
        // Past the last bound: counted in +Inf only (count).
        if let Some(b) = LATENCY_BUCKETS.iter().position(|le| seconds <= *le) {
            latency.buckets[b] += 1;
        }
        latency.count += 1;
        latency.sum += seconds;
    }

    /// Write this label's series of `family`.
    fn render(&self, family: Family, label: &str, out: &mut Lines<'_>) {
        let counts = |out: &mut Lines<'_>, key: &str, keys: &[&str], values: &[u64], all| {
            for (k, v) in keys.iter().zip(values) {
                if all || *v > 0 {
                    out.sample("", &[("election", label), (key, k)], *v as f64);
                }
            }
        };
        let one = |out: &mut Lines<'_>, value: u64, shown: bool| {
            if shown || value > 0 {
                out.sample("", &[("election", label)], value as f64);
            }
        };
        match family {
            Family::AcquireAttempts => {
                counts(out, "result", &RESULTS, &self.acquire, self.election)
            }
            Family::Renew => counts(out, "result", &RESULTS, &self.renew, self.renewed),
            Family::LeasesLost => one(out, self.leases_lost, self.election),
            Family::Malformed => one(out, self.malformed, self.election),
            Family::Preemptions => one(out, self.preemptions, self.election),
            Family::UnknownFormat => one(out, self.unknown_format, self.election),
            Family::WatchStreams => {
                if self.election || self.streamed {
                    out.sample("", &[("election", label)], self.watch_streams as f64);
                }
            }
            Family::Transitions => {
                for (d, v) in DIRECTIONS.iter().zip(self.transitions) {
                    if self.election || v > 0 {
                        out.sample("", &[("direction", d), ("election", label)], v as f64);
                    }
                }
            }
            Family::StoreErrors => {
                for (class, v) in &self.errors {
                    out.sample("", &[("class", class), ("election", label)], *v as f64);
                }
            }
            Family::StoreRequests => {
                for (op, latency) in &self.requests {
                    latency.render(&[("election", label), ("op", op)], out);
                }
            }
        }
    }
}

impl Latency {
    fn render(&self, labels: &[(&str, &str); 2], out: &mut Lines<'_>) {
        let mut cumulative = 0;
        for (le, n) in LATENCY_BUCKETS.iter().zip(self.buckets) {
            cumulative += n;
            let le = le.to_string();
            out.sample(
                "_bucket",
                &[labels[0], labels[1], ("le", &le)],
                cumulative as f64,
            );
        }
        out.sample(
            "_bucket",
            &[labels[0], labels[1], ("le", "+Inf")],
            self.count as f64,
        );
        out.sample("_sum", labels, self.sum);
        out.sample("_count", labels, self.count as f64);
    }
}

impl Table {
    /// Apply `f` to the series of `label`, created if new.
    pub(super) fn with<T>(&self, label: &str, f: impl FnOnce(&mut Series) -> T) -> T {
        let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = map.get(label) {
            return f(&mut lock(series));
        }
        drop(map);
        f(&mut lock(&self.get(label)))
    }

    /// The series of `label`, created if new.
    pub(super) fn get(&self, label: &str) -> Shared {
        let mut map = self.series.write().unwrap_or_else(PoisonError::into_inner);
        map.entry(label.into()).or_default().clone()
    }

    /// Write the series of `family` for the labels after `after` (from the
    /// first when `None`), until `out` holds at least `budget` bytes.
    /// Returns the last label written if the family may go on, `None` once
    /// every label was written.
    pub(super) fn render(
        &self,
        family: Family,
        after: Option<&str>,
        out: &mut Lines<'_>,
        budget: usize,
    ) -> Option<Box<str>> {
        let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        for (label, series) in map.range::<str, _>((start, Bound::Unbounded)) {
            lock(series).render(family, label, out);
            if out.len() >= budget {
                return Some(label.clone());
            }
        }
        None
    }
}
