//! How leaderd writes values into messages and logs: durations, user input
//! cut to a sane length, bytes in hex. One owner, so every error and log line
//! reads the same way.

use std::fmt::Write as _;
use std::time::Duration;

/// How many characters of a user's value an error or a log line repeats.
pub const ECHO_CHARS: usize = 64;

/// A duration as the configuration writes it: `0s`, `1h 30m`, `250ms`,
/// `24h`. Hours are the largest unit, so every part reads number-unit
/// with no space, as the configuration accepts it (humantime's own
/// formatting writes `1day`). Cut to whole milliseconds (a computed
/// `9s 699ms 999us 870ns` says nothing more than `9s 699ms`), unless it is
/// shorter than one.
pub fn duration(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let shown = if ms.is_zero() { d } else { ms };
    let secs = shown.as_secs();
    let nanos = u64::from(shown.subsec_nanos());
    let parts = [
        (secs / 3600, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (nanos / 1_000_000, "ms"),
        (nanos / 1_000 % 1_000, "us"),
        (nanos % 1_000, "ns"),
    ];
    let mut out = String::new();
    for (n, unit) in parts.into_iter().filter(|(n, _)| *n > 0) {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{n}{unit}");
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// `s` cut to `max` characters, with `…` when cut.
pub fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// A user's value, quoted, cut to [`ECHO_CHARS`] characters (with its full
/// length when cut): errors and logs never repeat a huge input.
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &s[..at], s.len()),
        None => format!("{s:?}"),
    }
}

/// Like [`echo`], without quotes (for variable names and keys).
pub fn echo_plain(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
        None => s.to_owned(),
    }
}

/// `bytes` as lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The bytes [`hex`] wrote; `None` for anything else.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `s` as one segment of a URL path: bytes other than letters, digits and
/// `-._~` percent-encoded.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_cut_to_milliseconds_unless_shorter() {
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_nanos(9_699_999_870)), "9s 699ms");
        assert_eq!(duration(Duration::from_secs(5400)), "1h 30m");
        assert_eq!(duration(Duration::from_micros(250)), "250us");
        assert_eq!(duration(Duration::from_nanos(1)), "1ns");
        // Hours are the largest unit: no `1day` (nor `1 day`).
        assert_eq!(duration(Duration::from_secs(24 * 3600)), "24h");
        assert_eq!(duration(Duration::from_secs(2 * 86_400 + 61)), "48h 1m 1s");
        assert_eq!(duration(Duration::MAX), duration(Duration::MAX));
        // What it writes, the configuration reads back.
        for d in [
            Duration::from_millis(10),
            Duration::from_secs(86_400),
            Duration::from_millis(5_400_250),
        ] {
            assert_eq!(humantime::parse_duration(&duration(d)), Ok(d));
        }
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("ééé", 2), "éé…");
        let long = "x".repeat(100);
        assert_eq!(
            echo(&long),
            format!("{:?}… (100 bytes)", "x".repeat(ECHO_CHARS))
        );
        assert_eq!(echo("a\"b"), "\"a\\\"b\"");
        assert_eq!(
            echo_plain(&long),
            format!("{}… (100 bytes)", "x".repeat(ECHO_CHARS))
        );
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }

    #[test]
    fn path_segments_escape_what_a_path_cannot_carry() {
        assert_eq!(path_segment("jobs.nightly-1_x~"), "jobs.nightly-1_x~");
        assert_eq!(path_segment("a b/é:"), "a%20b%2F%C3%A9%3A");
    }
}
