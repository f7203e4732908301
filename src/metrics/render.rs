//! A scrape: the gauges read, then every family written in the Prometheus
//! text format, in pieces of about [`PIECE`] bytes, so that a scrape of a
//! thousand elections never holds its whole text (megabytes) at once.

use std::cmp::Ordering as CmpOrdering;
use std::ops::Deref;

use prometheus::TextEncoder;

use super::Metrics;
use super::families::Section;
use super::gauges::Readings;
use super::text::Lines;
use crate::balance::Share;
use crate::clock::Clock;
use crate::driver::board::StateView;

/// Bytes of text a scrape writes before it hands a piece on.
const PIECE: usize = 32 * 1024;

/// One scrape in progress: an iterator over pieces of its text. Families
/// come sorted by name, series by label values; a family without a series
/// is left out.
pub struct Scrape<M> {
    metrics: M,
    readings: Readings,
    /// The family being written, by index into the sections.
    section: usize,
    /// Where in that family the next piece starts.
    at: At,
    /// That family's `# HELP` and `# TYPE` lines are written.
    started: bool,
}

/// Where in a family the next piece starts.
enum At {
    Start,
    /// After this label (table families).
    After(Box<str>),
    /// At this row (the readings).
    Row(usize),
}

impl Metrics {
    /// Start a scrape of `metrics` (borrowed or shared), with the leadership
    /// gauges read now from `elections`' state at `clock.now()`.
    pub fn scrape<'a, M: Deref<Target = Metrics>>(
        metrics: M,
        elections: impl IntoIterator<Item = &'a StateView>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Scrape<M> {
        let readings = metrics.read_gauges(elections, share, clock);
        Scrape {
            metrics,
            readings,
            section: 0,
            at: At::Start,
            started: false,
        }
    }

    /// Every metric in the Prometheus text format, in one string (tests and
    /// small callers; the HTTP endpoint streams a [`Scrape`]).
    pub fn render<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a StateView>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Result<String, prometheus::Error> {
        Metrics::scrape(self, elections, share, clock).collect()
    }
}

impl<M: Deref<Target = Metrics>> Iterator for Scrape<M> {
    type Item = Result<String, prometheus::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut out = String::with_capacity(PIECE + PIECE / 4);
        while out.len() < PIECE && self.section < self.metrics.sections.len() {
            match self.write_on(&mut out) {
                Ok(true) => {
                    self.section += 1;
                    self.at = At::Start;
                    self.started = false;
                }
                Ok(false) => {}
                Err(e) => {
                    self.section = self.metrics.sections.len();
                    return Some(Err(e));
                }
            }
        }
        (!out.is_empty()).then_some(Ok(out))
    }
}

impl<M: Deref<Target = Metrics>> Scrape<M> {
    /// Write on in the current family; `true` once it is all written.
    fn write_on(&mut self, out: &mut String) -> Result<bool, prometheus::Error> {
        let metrics = &*self.metrics;
        match &metrics.sections[self.section] {
            Section::Registered(collector) => {
                for mut family in collector.collect() {
                    if family.get_metric().is_empty() {
                        continue;
                    }
                    family.mut_metric().sort_by(by_label_values);
                    TextEncoder::new().encode_utf8(std::slice::from_ref(&family), out)?;
                }
                Ok(true)
            }
            Section::Table(head, family) => {
                let mut lines = Lines::new(out, *head, self.started);
                let after = match &self.at {
                    At::After(label) => Some(&**label),
                    _ => None,
                };
                let next = metrics.table.render(*family, after, &mut lines, PIECE);
                self.started = lines.started();
                Ok(next.map(|label| self.at = At::After(label)).is_none())
            }
            Section::Reading(head, reading) => {
                let mut lines = Lines::new(out, *head, self.started);
                let from = match self.at {
                    At::Row(row) => row,
                    _ => 0,
                };
                let next = self.readings.render(*reading, from, &mut lines, PIECE);
                self.started = lines.started();
                Ok(next.map(|row| self.at = At::Row(row)).is_none())
            }
        }
    }
}

/// The order `Registry::gather` gives the series of one family.
fn by_label_values(a: &prometheus::proto::Metric, b: &prometheus::proto::Metric) -> CmpOrdering {
    a.get_label()
        .iter()
        .map(|l| l.value())
        .cmp(b.get_label().iter().map(|l| l.value()))
}
