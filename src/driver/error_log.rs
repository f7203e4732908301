//! Store errors as the engine logs them: once per change (reads and writes
//! apart), with a count, and once more when requests work again.

use crate::clock::Instant;

/// Which kind of store request failed: reads and writes are told apart so
/// that a read that works between two writes that fail does not count as
/// the end of the writes' trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestKind {
    Read,
    Write,
}

impl RequestKind {
    pub(super) fn of(op: &str) -> RequestKind {
        if op.starts_with("read") {
            RequestKind::Read
        } else {
            RequestKind::Write
        }
    }

    pub(super) fn plural(self) -> &'static str {
        match self {
            RequestKind::Read => "reads",
            RequestKind::Write => "writes",
        }
    }
}

/// An error that keeps coming back: logged when it starts, when it turns
/// into another error, and when it ends, with how often it came in between;
/// never once per attempt.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    pub(super) reads: Option<Streak>,
    pub(super) writes: Option<Streak>,
}

#[derive(Debug)]
pub(super) struct Streak {
    /// The error's text: the same text is the same error.
    pub(super) error: String,
    /// Failures in a row with this text.
    pub(super) count: u64,
    /// When the streak (of any error) began.
    pub(super) since: Instant,
}

impl ErrorLog {
    pub(super) fn streak(&mut self, kind: RequestKind) -> &mut Option<Streak> {
        match kind {
            RequestKind::Read => &mut self.reads,
            RequestKind::Write => &mut self.writes,
        }
    }

    /// Counts a failure; `Some(previous)` when it is worth a log line: a new
    /// error (`previous` is how often the one before it came, 0 if none).
    pub(super) fn failed(&mut self, kind: RequestKind, error: String, now: Instant) -> Option<u64> {
        let streak = self.streak(kind);
        match streak {
            Some(s) if s.error == error => {
                s.count += 1;
                None
            }
            Some(s) => {
                let previous = s.count;
                s.error = error;
                s.count = 1;
                Some(previous)
            }
            None => {
                *streak = Some(Streak {
                    error,
                    count: 1,
                    since: now,
                });
                Some(0)
            }
        }
    }

    /// A request of this kind succeeded: the streak that ended, if any.
    pub(super) fn succeeded(&mut self, kind: RequestKind) -> Option<Streak> {
        self.streak(kind).take()
    }
}
