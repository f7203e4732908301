//! The safety checker: reads the history that the child jobs (`job.py`)
//! append to one shared log and decides whether two tenures ever ran at once.
//!
//! A line is `<monotonic ns> <start|beat|end> <identity> <fencing token>
//! <pid>`. All jobs on one machine share CLOCK_MONOTONIC, so their timestamps
//! compare directly. A tenure is every line with one (identity, fencing
//! token); its activity spans from its first line to its last, whichever
//! process (child or grandchild) wrote them.
//!
//! A counting lock (`leaderd lock acquire --slots N`) has up to N holders
//! at once, so [`check_at_most`] allows N active tenures, and its holders
//! may start their work in another order than they took their slots. A
//! holder then also writes an `ask` line, timed when it *asked* for the
//! slot (written once it has its token): a tenure that had started before
//! another asked must have the lower token.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

/// The (identity, fencing token) that names a tenure.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenureId {
    /// `LEADERD_IDENTITY` of the instance that ran the job.
    pub identity: String,
    /// `LEADERD_FENCING_TOKEN` the job was started with.
    pub fencing_token: u64,
}

impl fmt::Display for TenureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (token {})", self.identity, self.fencing_token)
    }
}

/// One tenure as seen in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    /// Who held it, with which token.
    pub id: TenureId,
    /// Monotonic time of its first line, in ns.
    pub first_ns: u64,
    /// Monotonic time of its last line, in ns.
    pub last_ns: u64,
    /// Monotonic time its holder asked for it (its `ask` line), if it
    /// wrote one; not part of its activity.
    pub asked_ns: Option<u64>,
    /// `start` lines (one per process: child, grandchild).
    pub starts: usize,
    /// `beat` lines.
    pub beats: usize,
    /// `end` lines (a child that was killed writes none).
    pub ends: usize,
    /// Every pid that wrote a line for it.
    pub pids: BTreeSet<u32>,
}

impl Tenure {
    /// From its first line to its last.
    pub fn activity(&self) -> Duration {
        Duration::from_nanos(self.last_ns - self.first_ns)
    }

    /// All its lines.
    pub fn lines(&self) -> usize {
        self.starts + self.beats + self.ends
    }
}

/// Two tenures active at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The tenure whose first line came first.
    pub earlier: TenureId,
    /// The other one.
    pub later: TenureId,
    /// How long their activity spans intersect: from the later tenure's first
    /// line to the first of the two last lines.
    pub overlap: Duration,
    /// Lines of the earlier tenure written at or after the later tenure's
    /// first line.
    pub earlier_lines_inside: usize,
    /// From the first to the last of those lines: how long the earlier
    /// tenure was seen running inside the later one. For a frozen machine
    /// (no lines while frozen) this is the time the old job ran after thawing,
    /// less at most one heartbeat.
    pub earlier_seen_running: Duration,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenures {} and {} overlap by {}: {} wrote {} line(s) after {} started, over {}",
            self.earlier,
            self.later,
            ms(self.overlap),
            self.earlier,
            self.earlier_lines_inside,
            self.later,
            ms(self.earlier_seen_running),
        )
    }
}

/// The time between one tenure's last line and the next tenure's first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The tenure that ended.
    pub from: TenureId,
    /// The tenure that followed.
    pub to: TenureId,
    /// Failover time as the jobs saw it (zero if they overlapped).
    pub gap: Duration,
}

/// Minimum, median and maximum of the gaps between consecutive tenures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    /// Fastest failover.
    pub min: Duration,
    /// Median failover (mean of the two middle ones for an even count).
    pub median: Duration,
    /// Slowest failover.
    pub max: Duration,
}

/// What a history that passed the check contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Tenures in order of their first line.
    pub tenures: Vec<Tenure>,
    /// Gaps between consecutive tenures.
    pub gaps: Vec<Gap>,
    /// Figures over `gaps`; `None` with fewer than two tenures.
    pub failover: Option<Failover>,
    /// Lines in the log.
    pub lines: usize,
    /// `start` lines in the log.
    pub starts: usize,
    /// `beat` lines in the log.
    pub beats: usize,
    /// `end` lines in the log.
    pub ends: usize,
    /// Overlaps measured by [`check_measuring_overlap`]; always empty after
    /// [`check`].
    pub overlaps: Vec<Overlap>,
    /// The most tenures active at one instant.
    pub most_at_once: usize,
}

impl Summary {
    /// The longest activity-span overlap (zero if none).
    pub fn max_overlap(&self) -> Duration {
        self.overlaps
            .iter()
            .map(|o| o.overlap)
            .max()
            .unwrap_or_default()
    }

    /// The longest time an earlier tenure was seen running inside a later one
    /// (zero if none).
    pub fn max_seen_running(&self) -> Duration {
        self.overlaps
            .iter()
            .map(|o| o.earlier_seen_running)
            .max()
            .unwrap_or_default()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} tenure(s), {} line(s): {} start, {} beat, {} end",
            self.tenures.len(),
            self.lines,
            self.starts,
            self.beats,
            self.ends
        )?;
        writeln!(f, "at most {} active at once", self.most_at_once)?;
        for tenure in &self.tenures {
            writeln!(
                f,
                "  {}: active {}, {} line(s), {} end(s), pids {:?}",
                tenure.id,
                ms(tenure.activity()),
                tenure.lines(),
                tenure.ends,
                tenure.pids
            )?;
        }
        match &self.failover {
            Some(failover) => writeln!(
                f,
                "failover over {} gap(s): min {}, median {}, max {}",
                self.gaps.len(),
                ms(failover.min),
                ms(failover.median),
                ms(failover.max)
            )?,
            None => writeln!(f, "no failover (fewer than two tenures)")?,
        }
        if !self.overlaps.is_empty() {
            writeln!(
                f,
                "{} overlap(s), max {} (old job seen running for at most {})",
                self.overlaps.len(),
                ms(self.max_overlap()),
                ms(self.max_seen_running())
            )?;
            for overlap in &self.overlaps {
                writeln!(f, "  {overlap}")?;
            }
        }
        Ok(())
    }
}

/// Why a history fails the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A line that is not `<ns> <start|beat|end> <identity> <token> <pid>`.
    #[error("line {line}: {reason}: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// One process's lines go back in time: the log was not written by
    /// `job.py` on one machine.
    #[error("line {line}: pid {pid} of {tenure} goes back in time by {}", ms(*.by))]
    TimeGoesBack {
        /// 1-based line number.
        line: usize,
        /// The writer.
        pid: u32,
        /// Its tenure.
        tenure: TenureId,
        /// How far back.
        by: Duration,
    },
    /// Two tenures were active at once.
    #[error("two leaders: {0}")]
    Overlap(Overlap),
    /// More than `limit` tenures were active at once ([`check_at_most`]).
    #[error(
        "{} holders at once, more than {limit}: {}",
        at_once.len(),
        at_once.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
    )]
    MoreThan {
        /// The most allowed.
        limit: usize,
        /// The tenures active at the instant the last of them started.
        at_once: Vec<TenureId>,
    },
    /// A tenure's token is not larger than that of every tenure before it.
    #[error(
        "fencing token did not increase: {tenure} started after {earlier}, which has token {}",
        earlier.fencing_token
    )]
    TokenNotIncreasing {
        /// The offending tenure.
        tenure: TenureId,
        /// The earlier tenure with the largest token.
        earlier: TenureId,
    },
}

/// Checks a history: every line well formed, no two tenures active at once,
/// every tenure's token larger than every earlier tenure's.
pub fn check(log: &str) -> Result<Summary, Violation> {
    evaluate(log, false, 1)
}

/// The whole lines of a history read while its jobs still run: a job may
/// be writing its last line (a buffered writer flushes in pieces), which
/// is not a torn write yet. A history read once the jobs are gone is
/// checked whole, a partial last line included.
pub fn complete_lines(log: &str) -> &str {
    log.rfind('\n').map_or("", |end| &log[..=end])
}

/// Like [`check`] for a counting lock of `limit` slots: every line well
/// formed, never more than `limit` tenures active at once, and the token
/// of every tenure above that of every tenure that had started before it
/// was asked for (its `ask` line, else its first line).
pub fn check_at_most(log: &str, limit: usize) -> Result<Summary, Violation> {
    evaluate(log, false, limit.max(1))
}

/// Like [`check`], but overlapping tenures are measured and reported in
/// [`Summary::overlaps`] instead of failing (the frozen-machine scenario,
/// where the old job may run briefly after it thaws). Malformed lines and
/// tokens that do not increase still fail.
pub fn check_measuring_overlap(log: &str) -> Result<Summary, Violation> {
    evaluate(log, true, 1)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Event {
    Ask,
    Start,
    Beat,
    End,
}

struct Line {
    ns: u64,
    event: Event,
    id: TenureId,
    pid: u32,
}

fn parse_line(text: &str) -> Result<Line, String> {
    if let Some(comment) = text.strip_prefix('#') {
        return Err(format!("the job reported an error:{comment}"));
    }
    let fields: Vec<&str> = text.split(' ').collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected 5 space-separated fields (ns event identity token pid), found {}",
            fields.len()
        ));
    }
    let ns = fields[0]
        .parse::<u64>()
        .map_err(|_| format!("timestamp {:?} is not a whole number of ns", fields[0]))?;
    let event = match fields[1] {
        "ask" => Event::Ask,
        "start" => Event::Start,
        "beat" => Event::Beat,
        "end" => Event::End,
        other => return Err(format!("unknown event {other:?} (ask, start, beat or end)")),
    };
    let identity = fields[2];
    if identity.is_empty() {
        return Err("empty identity".to_owned());
    }
    let fencing_token = fields[3]
        .parse::<u64>()
        .map_err(|_| format!("fencing token {:?} is not a whole number", fields[3]))?;
    let pid = fields[4]
        .parse::<u32>()
        .map_err(|_| format!("pid {:?} is not a whole number", fields[4]))?;
    Ok(Line {
        ns,
        event,
        id: TenureId {
            identity: identity.to_owned(),
            fencing_token,
        },
        pid,
    })
}

fn evaluate(log: &str, measure_overlap: bool, at_most: usize) -> Result<Summary, Violation> {
    let mut tenures: HashMap<TenureId, Tenure> = HashMap::new();
    let mut last_of_writer: HashMap<(u32, TenureId), u64> = HashMap::new();
    // Per tenure, the times of its lines (for overlap measurement).
    let mut times: HashMap<TenureId, Vec<u64>> = HashMap::new();
    let mut counts = [0usize; 3];
    let mut lines = 0;

    let mut rest = log;
    while !rest.is_empty() {
        lines += 1;
        let (text, terminated) = match rest.find('\n') {
            Some(end) => (&rest[..end], true),
            None => (rest, false),
        };
        rest = if terminated {
            &rest[text.len() + 1..]
        } else {
            ""
        };
        let malformed = |reason: String| Violation::Malformed {
            line: lines,
            text: text.to_owned(),
            reason,
        };
        if !terminated {
            // job.py writes each line whole, newline included, in one write.
            return Err(malformed(
                "last line has no newline (a torn or foreign write)".to_owned(),
            ));
        }
        let line = parse_line(text).map_err(malformed)?;

        let writer = (line.pid, line.id.clone());
        if let Some(&previous) = last_of_writer.get(&writer) {
            if line.ns < previous {
                return Err(Violation::TimeGoesBack {
                    line: lines,
                    pid: line.pid,
                    tenure: line.id,
                    by: Duration::from_nanos(previous - line.ns),
                });
            }
        }
        last_of_writer.insert(writer, line.ns);

        let tenure = tenures.entry(line.id.clone()).or_insert_with(|| Tenure {
            id: line.id.clone(),
            first_ns: u64::MAX,
            last_ns: 0,
            asked_ns: None,
            starts: 0,
            beats: 0,
            ends: 0,
            pids: BTreeSet::new(),
        });
        tenure.pids.insert(line.pid);
        if line.event == Event::Ask {
            tenure.asked_ns = Some(tenure.asked_ns.map_or(line.ns, |a| a.min(line.ns)));
            continue;
        }
        tenure.first_ns = tenure.first_ns.min(line.ns);
        tenure.last_ns = tenure.last_ns.max(line.ns);
        let (slot, index) = match line.event {
            Event::Ask => unreachable!("taken apart above"),
            Event::Start => (&mut tenure.starts, 0),
            Event::Beat => (&mut tenure.beats, 1),
            Event::End => (&mut tenure.ends, 2),
        };
        *slot += 1;
        counts[index] += 1;
        times.entry(line.id).or_default().push(line.ns);
    }

    let mut tenures: Vec<Tenure> = tenures.into_values().collect();
    if let Some(lone) = tenures.iter().find(|t| t.first_ns == u64::MAX) {
        return Err(Violation::Malformed {
            line: lines,
            text: lone.id.to_string(),
            reason: "an `ask` line with no other line of its tenure".to_owned(),
        });
    }
    // Ties on the first line (same ns) are broken by token, then identity,
    // so the outcome never depends on hash order.
    tenures.sort_by(|a, b| {
        (a.first_ns, &a.id.fencing_token, &a.id).cmp(&(b.first_ns, &b.id.fencing_token, &b.id))
    });

    let mut overlaps = Vec::new();
    let mut most_at_once = usize::from(!tenures.is_empty());
    for (j, later) in tenures.iter().enumerate() {
        // Sorted by first line, so only the earlier ones' ends matter.
        let active: Vec<&Tenure> = tenures[..j]
            .iter()
            .filter(|earlier| later.first_ns <= earlier.last_ns)
            .collect();
        most_at_once = most_at_once.max(active.len() + 1);
        if at_most > 1 && active.len() >= at_most && !measure_overlap {
            return Err(Violation::MoreThan {
                limit: at_most,
                at_once: active
                    .iter()
                    .map(|t| t.id.clone())
                    .chain([later.id.clone()])
                    .collect(),
            });
        }
        for earlier in active.iter().filter(|_| at_most == 1) {
            let inside: Vec<u64> = times[&earlier.id]
                .iter()
                .copied()
                .filter(|&t| t >= later.first_ns)
                .collect();
            let seen_running = match (inside.iter().min(), inside.iter().max()) {
                (Some(first), Some(last)) => Duration::from_nanos(last - first),
                _ => Duration::ZERO,
            };
            let overlap = Overlap {
                earlier: earlier.id.clone(),
                later: later.id.clone(),
                overlap: Duration::from_nanos(earlier.last_ns.min(later.last_ns) - later.first_ns),
                earlier_lines_inside: inside.len(),
                earlier_seen_running: seen_running,
            };
            if !measure_overlap {
                return Err(Violation::Overlap(overlap));
            }
            overlaps.push(overlap);
        }
        // Every tenure that had started before this one was asked for
        // was granted before it: its token is lower.
        let asked = later.asked_ns.unwrap_or(later.first_ns).min(later.first_ns);
        let top = tenures[..j]
            .iter()
            .filter(|earlier| earlier.first_ns < asked || later.asked_ns.is_none())
            .max_by_key(|earlier| earlier.id.fencing_token);
        if let Some(top) = top
            && later.id.fencing_token <= top.id.fencing_token
        {
            return Err(Violation::TokenNotIncreasing {
                tenure: later.id.clone(),
                earlier: top.id.clone(),
            });
        }
    }

    let gaps: Vec<Gap> = tenures
        .windows(2)
        .map(|pair| Gap {
            from: pair[0].id.clone(),
            to: pair[1].id.clone(),
            gap: Duration::from_nanos(pair[1].first_ns.saturating_sub(pair[0].last_ns)),
        })
        .collect();
    let failover = failover(&gaps);
    Ok(Summary {
        tenures,
        gaps,
        failover,
        lines,
        starts: counts[0],
        beats: counts[1],
        ends: counts[2],
        overlaps,
        most_at_once,
    })
}

fn failover(gaps: &[Gap]) -> Option<Failover> {
    let mut sorted: Vec<Duration> = gaps.iter().map(|g| g.gap).collect();
    sorted.sort();
    let (min, max) = (*sorted.first()?, *sorted.last()?);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2
    };
    Some(Failover { min, median, max })
}

/// Milliseconds with µs precision, for humans.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// Tenures grouped by identity, each group in order: how often, and when,
/// each instance led.
pub fn tenures_by_identity(summary: &Summary) -> BTreeMap<String, Vec<&Tenure>> {
    let mut by_identity: BTreeMap<String, Vec<&Tenure>> = BTreeMap::new();
    for tenure in &summary.tenures {
        by_identity
            .entry(tenure.id.identity.clone())
            .or_default()
            .push(tenure);
    }
    by_identity
}
