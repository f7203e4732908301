//! How every duration leaderd reads is parsed: the file's and the
//! environment's strings, and the flags of every subcommand.
//!
//! humantime's syntax (`10s`, `1m30s`, `15 minutes`, `200ms`, `1.5h`), but
//! only what can mean one thing. humantime adds up whatever it is given, so
//! `1m1m` would be two minutes, `30s1m` ninety seconds, and `1 0s` (a space
//! inside a number) ten seconds: a typo or a half-edited value that passes
//! as something else. Each unit must appear once, largest first, and a
//! number is written without spaces.

use std::time::Duration;

/// Why a string is not a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not a duration at all: humantime's reason (`expected number at 0`).
    Syntax(String),
    /// A duration humantime would read, but one that could mean something
    /// else than what it adds up to: why, and how to write it.
    Ambiguous(String),
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationError::Syntax(why) => write!(f, "{why} (like 10s, 1m30s, 200ms)"),
            DurationError::Ambiguous(why) => f.write_str(why),
        }
    }
}

/// `s` as a duration, refusing what could be read two ways. A bare `0` is
/// zero, as humantime reads it (`--acquire-timeout 0`).
pub(crate) fn parse(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let d = humantime::parse_duration(s).map_err(|e| DurationError::Syntax(e.to_string()))?;
    if s == "0" {
        return Ok(d);
    }
    check_unambiguous(s).map_err(DurationError::Ambiguous)?;
    Ok(d)
}

/// Each unit at most once and smaller than the one before it; no space
/// inside a number. `s` is one humantime accepts.
fn check_unambiguous(s: &str) -> Result<(), String> {
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    let mut rest = s.trim();
    let mut previous: Option<(&str, Duration)> = None;
    while !rest.is_empty() {
        let number_end = rest.find(|c| !is_number(c)).unwrap_or(rest.len());
        let after = rest[number_end..].trim_start();
        if after.starts_with(is_number) {
            let spaced = rest.len() - after.len();
            let end = after
                .find(|c| !is_number(c))
                .map_or(rest.len(), |e| spaced + e);
            return Err(format!(
                "a space inside the number {:?} (write it without, like 10s)",
                &rest[..end]
            ));
        }
        let unit_end = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let unit = &after[..unit_end];
        // The unit's size, by humantime's own table of unit names; every
        // unit of a string it accepted has one.
        let size = humantime::parse_duration(&format!("1{unit}"))
            .map_err(|e| format!("unit {unit:?}: {e}"))?;
        if let Some((before, before_size)) = previous {
            let why = if unit == before {
                format!("the unit {unit} appears twice")
            } else if size == before_size {
                format!("{before} and {unit} are the same unit")
            } else if size > before_size {
                format!("{unit} comes after the smaller unit {before}")
            } else {
                String::new()
            };
            if !why.is_empty() {
                return Err(format!(
                    "{why} (write each unit once, largest first, like 1m30s)"
                ));
            }
        }
        previous = Some((unit, size));
        rest = after[unit_end..].trim_start();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reading_only() {
        for (s, ms) in [
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("1m 30s", 90_000),
            (" 15 minutes ", 900_000),
            ("900s", 900_000),
            ("200ms", 200),
            ("1.5h", 5_400_000),
            ("1h 2m 3s 4ms", 3_723_004),
            ("1day 1h", 90_000_000),
            ("0s", 0),
            ("0", 0),
            (" 0 ", 0),
        ] {
            assert_eq!(parse(s), Ok(Duration::from_millis(ms)), "{s:?}");
        }
        for (s, why) in [
            ("1m1m", "the unit m appears twice"),
            ("2s 3s", "the unit s appears twice"),
            ("1m 1min", "m and min are the same unit"),
            ("30s1m", "m comes after the smaller unit s"),
            ("10ms 1h", "h comes after the smaller unit ms"),
            ("1 0s", "a space inside the number \"1 0\""),
            ("1 .5s", "a space inside the number \"1 .5\""),
            ("1m 3 0s", "a space inside the number \"3 0\""),
        ] {
            match parse(s) {
                Err(DurationError::Ambiguous(got)) => assert!(got.contains(why), "{s:?}: {got}"),
                other => panic!("{s:?}: {other:?}"),
            }
        }
        for s in ["", "ten", "10", "00", "2 parsecs", "1m30"] {
            assert!(
                matches!(parse(s), Err(DurationError::Syntax(_))),
                "{s:?}: {:?}",
                parse(s)
            );
        }
    }
}
