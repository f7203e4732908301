//! Order statistics of a handful of samples.

/// min / median / p95 / max of some samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// How many samples.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Middle (mean of the two middle ones for an even count).
    pub median: f64,
    /// Nearest-rank 95th percentile: the smallest sample with at least 95 %
    /// of the samples at or below it (the 19th of 20).
    pub p95: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let rank = ((0.95 * n as f64).ceil() as usize).clamp(1, n);
        Some(Summary {
            n,
            min: sorted[0],
            median,
            p95: sorted[rank - 1],
            max: sorted[n - 1],
        })
    }

    /// A Markdown table row: `| label | n | min | median | p95 | max |`, in
    /// seconds with three decimals (input in milliseconds).
    pub fn row_s(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            self.n,
            self.min / 1e3,
            self.median / 1e3,
            self.p95 / 1e3,
            self.max / 1e3
        )
    }
}

/// The header matching [`Summary::row_s`].
pub const HEADER_S: &str =
    "| | n | min (s) | median (s) | p95 (s) | max (s) |\n|---|---:|---:|---:|---:|---:|";
