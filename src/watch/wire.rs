//! The watch stream's wire format: newline-delimited JSON, one
//! [`LeaseEvent`] per line.
//!
//! Both ends of the stream meet here, and nothing here does I/O: the
//! server encodes each event as one line, the client cuts the bytes it
//! receives (in pieces of any size) into lines no longer than
//! [`MAX_LINE`] and decodes each. Lines that are blank (whitespace only)
//! carry nothing and are skipped; a line may end in `\r\n` as well as
//! `\n`. Bytes after the last newline are no line yet: if the stream ends
//! there, they are not an event.

use crate::election::LeaseEvent;

/// The content type of the watch stream: newline-delimited JSON.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// The request header in which a daemon opening another's stream
/// (`GET /v1/watch`) names its own session: with balance, that is how the
/// other learns of it as a member (advice: it reads that session before
/// it counts it).
pub const SESSION_HEADER: &str = "x-leaderd-session";

/// The longest event line accepted, its newline included; a longer one
/// ends the stream.
pub const MAX_LINE: usize = 4096;

/// Why bytes from a watch stream are not an event.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A line grew past the limit (the number of bytes) before its newline.
    #[error("an event longer than {0} bytes")]
    TooLong(usize),
    /// A line is not the JSON of a [`LeaseEvent`] (not JSON, or an unknown
    /// `event`, or a field missing).
    #[error("an event that is not valid: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// `event` as one line of the stream: its JSON and a newline.
pub fn encode(event: &LeaseEvent) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(event)?;
    line.push(b'\n');
    Ok(line)
}

/// The event of one line (its newline, or `\r\n`, may be left on).
pub fn decode(line: &[u8]) -> Result<LeaseEvent, WireError> {
    Ok(serde_json::from_slice(line)?)
}

/// Cuts a byte stream that arrives in pieces into lines.
#[derive(Debug)]
pub struct LineSplitter {
    /// The line read so far, not yet ended by a newline.
    pending: Vec<u8>,
    /// The longest line, its newline included.
    max_line: usize,
}

impl LineSplitter {
    /// A splitter that refuses lines longer than `max_line` bytes, their
    /// newline included.
    pub fn new(max_line: usize) -> Self {
        LineSplitter {
            pending: Vec::new(),
            max_line,
        }
    }

    /// The lines `chunk` completes, in order, each with its newline; blank
    /// lines are left out. What follows the chunk's last newline waits for
    /// the next chunk. After an error the stream is to be abandoned.
    pub fn push<'a>(&'a mut self, chunk: &'a [u8]) -> Lines<'a> {
        Lines {
            splitter: self,
            pieces: chunk.split_inclusive(is_newline as fn(&u8) -> bool),
            failed: false,
        }
    }
}

fn is_newline(b: &u8) -> bool {
    *b == b'\n'
}

/// The lines one chunk completes; see [`LineSplitter::push`].
#[derive(Debug)]
pub struct Lines<'a> {
    splitter: &'a mut LineSplitter,
    pieces: std::slice::SplitInclusive<'a, u8, fn(&u8) -> bool>,
    failed: bool,
}

impl Iterator for Lines<'_> {
    type Item = Result<Vec<u8>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        for piece in self.pieces.by_ref() {
            let line = &mut self.splitter.pending;
            line.extend_from_slice(piece);
            if line.len() > self.splitter.max_line {
                self.failed = true;
                return Some(Err(WireError::TooLong(self.splitter.max_line)));
            }
            if line.last() != Some(&b'\n') {
                continue;
            }
            let line = std::mem::take(line);
            if !line.trim_ascii().is_empty() {
                return Some(Ok(line));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{LineSplitter, MAX_LINE, WireError, decode, encode};
    use crate::election::LeaseEvent;

    fn renewed(rvn: &str) -> LeaseEvent {
        LeaseEvent::Renewed {
            election: "web".into(),
            holder: "web-1".into(),
            rvn: rvn.into(),
            fencing_token: 7,
            lease_ms: 10_000,
        }
    }

    /// The lines `chunks` complete, one after the other, as text; the
    /// first error ends them.
    fn lines(splitter: &mut LineSplitter, chunks: &[&[u8]]) -> Result<Vec<String>, WireError> {
        let mut out = Vec::new();
        for chunk in chunks {
            for line in splitter.push(chunk) {
                out.push(String::from_utf8(line?).expect("UTF-8"));
            }
        }
        Ok(out)
    }

    #[test]
    fn an_event_is_one_line_of_json_and_reads_back_the_same() {
        let events = [
            renewed("r1"),
            LeaseEvent::Released {
                election: "web".into(),
                rvn: "r2".into(),
                fencing_token: 7,
                successor: Some("web-2".into()),
            },
            LeaseEvent::NotLeader {
                election: "web".into(),
            },
        ];
        for event in events {
            let line = encode(&event).expect("encodes");
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
            assert_eq!(decode(&line).expect("decodes"), event);
        }
        let line = encode(&renewed("r1")).expect("encodes");
        assert_eq!(
            String::from_utf8(line).expect("UTF-8"),
            "{\"event\":\"renewed\",\"election\":\"web\",\"holder\":\"web-1\",\"rvn\":\"r1\",\"fencing_token\":7,\"lease_ms\":10000}\n"
        );
    }

    #[test]
    fn a_chunk_of_several_lines_gives_each_in_order() {
        let mut s = LineSplitter::new(MAX_LINE);
        let got = lines(&mut s, &[b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n"]).expect("lines");
        assert_eq!(got, ["{\"a\":1}\n", "{\"b\":2}\n", "{\"c\":3}\n"]);
    }

    #[test]
    fn a_partial_chunk_waits_for_its_newline() {
        let mut s = LineSplitter::new(MAX_LINE);
        assert_eq!(
            lines(&mut s, &[b"{\"a\":"]).expect("lines"),
            Vec::<String>::new()
        );
        assert_eq!(
            lines(&mut s, &[b"1}"]).expect("lines"),
            Vec::<String>::new()
        );
        assert_eq!(
            lines(&mut s, &[b"\n{\"b\""]).expect("lines"),
            ["{\"a\":1}\n"]
        );
        assert_eq!(lines(&mut s, &[b":2}\n"]).expect("lines"), ["{\"b\":2}\n"]);
    }

    #[test]
    fn a_line_split_across_many_chunks_decodes_as_one_event() {
        let line = encode(&renewed("r1")).expect("encodes");
        let mut s = LineSplitter::new(MAX_LINE);
        let mut got = Vec::new();
        for byte in line.chunks(1) {
            for l in s.push(byte) {
                got.push(decode(&l.expect("short enough")).expect("decodes"));
            }
        }
        assert_eq!(got, [renewed("r1")]);
    }

    #[test]
    fn blank_lines_are_skipped() {
        let mut s = LineSplitter::new(MAX_LINE);
        let got = lines(&mut s, &[b"\n  \n{\"a\":1}\n\r\n\t\n"]).expect("lines");
        assert_eq!(got, ["{\"a\":1}\n"]);
    }

    #[test]
    fn a_crlf_line_decodes_and_a_crlf_alone_is_blank() {
        let mut s = LineSplitter::new(MAX_LINE);
        let mut line = serde_json::to_vec(&renewed("r1")).expect("encodes");
        line.extend_from_slice(b"\r\n\r\n");
        let got: Vec<_> = s.push(&line).collect::<Result<_, _>>().expect("lines");
        assert_eq!(got.len(), 1);
        assert!(got[0].ends_with(b"\r\n"));
        assert_eq!(decode(&got[0]).expect("decodes"), renewed("r1"));
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_its_newline_counted() {
        // Exactly the limit, newline included: accepted.
        let mut s = LineSplitter::new(8);
        assert_eq!(
            lines(&mut s, &[b"1234567\n"]).expect("lines"),
            ["1234567\n"]
        );
        // One byte more: refused, even though the line's text fits.
        let mut s = LineSplitter::new(8);
        let e = lines(&mut s, &[b"12345678\n"]).expect_err("too long");
        assert!(matches!(e, WireError::TooLong(8)), "{e:?}");
        assert_eq!(e.to_string(), "an event longer than 8 bytes");
    }

    #[test]
    fn a_line_that_grows_past_the_limit_is_refused_before_its_newline() {
        let mut s = LineSplitter::new(8);
        assert_eq!(
            lines(&mut s, &[b"12345"]).expect("lines"),
            Vec::<String>::new()
        );
        let e = lines(&mut s, &[b"6789"]).expect_err("too long");
        assert!(matches!(e, WireError::TooLong(8)), "{e:?}");
    }

    #[test]
    fn lines_before_one_that_is_too_long_are_still_given_then_nothing() {
        let mut s = LineSplitter::new(8);
        let mut it = s.push(b"abc\n123456789\nxyz\n");
        assert_eq!(it.next().map(|l| l.ok()), Some(Some(b"abc\n".to_vec())));
        assert!(matches!(it.next(), Some(Err(WireError::TooLong(8)))));
        assert!(it.next().is_none());
    }

    #[test]
    fn a_long_blank_line_is_still_too_long() {
        let mut s = LineSplitter::new(4);
        let e = lines(&mut s, &[b"     \n"]).expect_err("too long");
        assert!(matches!(e, WireError::TooLong(4)), "{e:?}");
    }

    #[test]
    fn a_line_that_is_not_json_is_invalid() {
        let e = decode(b"not json\n").expect_err("invalid");
        assert!(matches!(e, WireError::Invalid(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("an event that is not valid: "),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_event_kind_is_invalid() {
        let e = decode(b"{\"event\":\"promoted\",\"election\":\"web\"}\n").expect_err("invalid");
        assert!(matches!(e, WireError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("unknown variant `promoted`"), "{e}");
    }

    #[test]
    fn an_event_missing_a_field_is_invalid() {
        let e = decode(b"{\"event\":\"renewed\",\"election\":\"web\"}\n").expect_err("invalid");
        assert!(e.to_string().contains("missing field"), "{e}");
    }

    #[test]
    fn two_events_on_one_line_are_invalid() {
        let mut two = serde_json::to_vec(&renewed("r1")).expect("encodes");
        two.extend(encode(&renewed("r2")).expect("encodes"));
        assert!(matches!(decode(&two), Err(WireError::Invalid(_))));
    }
}
