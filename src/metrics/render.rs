//! A scrape: the gauges computed, then every family written in the
//! Prometheus text format, one family at a time.

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::Ordering;

use prometheus::TextEncoder;
use tokio::sync::watch;

use super::Metrics;
use crate::balance::Share;
use crate::clock::Clock;
use crate::election::ElectionState;

impl Metrics {
    /// Every metric in the Prometheus text format, with the leadership gauges
    /// computed from `elections`' current state at `clock.now()`.
    pub fn render<'a>(
        &self,
        elections: impl IntoIterator<Item = &'a watch::Receiver<ElectionState>>,
        share: Option<&Share>,
        clock: &Clock,
    ) -> Result<String, prometheus::Error> {
        // A poisoned lock only means another render panicked midway; the
        // gauges are fully rewritten below, so its state does not matter.
        let _guard = self
            .render_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.refresh_gauges(elections, share, clock);
        self.encode()
    }

    /// Every family with a series, in the text format.
    ///
    /// One family at a time rather than `Registry::gather`, which builds
    /// every family's protobuf form first: at 1,000 elections that is
    /// tens of MiB for a moment on every scrape, the largest peak in the
    /// daemon's memory. Same output: families by name, series by label
    /// values, empty families left out.
    fn encode(&self) -> Result<String, prometheus::Error> {
        let encoder = TextEncoder::new();
        let mut out = String::with_capacity(self.last_render_len.load(Ordering::Relaxed) * 9 / 8);
        for family in &self.families {
            for mut mf in family.collect() {
                if mf.get_metric().is_empty() {
                    continue;
                }
                mf.mut_metric().sort_by(by_label_values);
                encoder.encode_utf8(std::slice::from_ref(&mf), &mut out)?;
            }
        }
        self.last_render_len.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

/// The order `Registry::gather` gives the series of one family.
fn by_label_values(a: &prometheus::proto::Metric, b: &prometheus::proto::Metric) -> CmpOrdering {
    a.get_label()
        .iter()
        .map(|l| l.value())
        .cmp(b.get_label().iter().map(|l| l.value()))
}
