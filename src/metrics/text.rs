//! Lines of the Prometheus text format (version 0.0.4), for the families
//! leaderd writes itself: a family's `# HELP` and `# TYPE` lines come with
//! its first sample, so a family without samples is left out.

use std::fmt::Write;

/// A family's name, help text and type.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub(super) kind: &'static str,
}

/// Samples of one family, appended to a scrape's text.
pub(super) struct Lines<'a> {
    out: &'a mut String,
    head: Head,
    /// The `# HELP` and `# TYPE` lines are written.
    started: bool,
}

impl<'a> Lines<'a> {
    /// Samples of `head`'s family; `started` once its head was written
    /// (by an earlier piece of the same scrape).
    pub(super) fn new(out: &'a mut String, head: Head, started: bool) -> Self {
        Lines { out, head, started }
    }

    /// Whether the family's head is written.
    pub(super) fn started(&self) -> bool {
        self.started
    }

    /// Bytes of the scrape's text so far.
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    /// One sample: the family's name with `suffix` (`_bucket`, `_sum`,
    /// `_count` or nothing), `labels` in the order given, and `value`.
    pub(super) fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: f64) {
        if !self.started {
            self.started = true;
            let Head { name, help, kind } = self.head;
            self.out.push_str("# HELP ");
            self.out.push_str(name);
            self.out.push(' ');
            escape(self.out, help, false);
            let _ = writeln!(self.out, "\n# TYPE {name} {kind}");
        }
        self.out.push_str(self.head.name);
        self.out.push_str(suffix);
        for (i, (key, value)) in labels.iter().enumerate() {
            self.out.push(if i == 0 { '{' } else { ',' });
            self.out.push_str(key);
            self.out.push_str("=\"");
            escape(self.out, value, true);
            self.out.push('"');
        }
        if !labels.is_empty() {
            self.out.push('}');
        }
        self.out.push(' ');
        number(self.out, value);
        self.out.push('\n');
    }
}

/// `text` escaped as the format asks: backslash and newline everywhere,
/// double quotes in label values.
fn escape(out: &mut String, text: &str, label_value: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label_value => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// A sample value: integers without a fraction, the infinities and NaN as
/// the format spells them.
fn number(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_labels_and_spell_special_values() {
        let head = Head {
            name: "x_total",
            help: "Line one\\two\nthree.",
            kind: "counter",
        };
        let mut out = String::new();
        let mut lines = Lines::new(&mut out, head, false);
        lines.sample("", &[("election", "a\"b\\c\nd"), ("result", "ok")], 3.0);
        lines.sample("", &[], f64::INFINITY);
        lines.sample("_sum", &[("e", "x")], 0.25);
        lines.sample("", &[], f64::NAN);
        assert_eq!(
            out,
            "# HELP x_total Line one\\\\two\\nthree.\n# TYPE x_total counter\n\
             x_total{election=\"a\\\"b\\\\c\\nd\",result=\"ok\"} 3\n\
             x_total +Inf\nx_total_sum{e=\"x\"} 0.25\nx_total NaN\n"
        );
    }

    #[test]
    fn a_family_without_samples_writes_nothing() {
        let head = Head {
            name: "x",
            help: "h",
            kind: "gauge",
        };
        let mut out = String::new();
        let lines = Lines::new(&mut out, head, false);
        assert!(!lines.started());
        assert!(out.is_empty());
    }
}
