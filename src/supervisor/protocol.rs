//! What leaderd and its guard say to each other: the guard's command line,
//! the requests and reports on the control socket, and how a child ends.
//!
//! Command line (built by [`command_line`], parsed by [`Args::parse`]):
//! `leaderd __guard --control-fd N --stop-signal SIGNUM [--deadline STOP_NS KILL_NS] -- COMMAND [ARGS…]`,
//! where the deadline is in nanoseconds of `CLOCK_BOOTTIME`. The child gets the
//! guard's environment unchanged (leaderd sets the `LEADERD_*` variables on
//! the guard).
//!
//! Protocol on the control socket, one ASCII line per message.
//! leaderd to guard ([`Request`]): `arm STOP_NS KILL_NS`, `disarm`,
//! `signal SIGNUM`, `stop GRACE_NS`, `kill`. Guard to leaderd ([`Report`]):
//! `started PID`, `failed CODE MESSAGE`, `late`, `deadline-stop`,
//! `deadline-kill`, `exited CODE`, `signaled SIGNUM`, `killed`. A line the
//! guard cannot parse means the two sides disagree; the guard then kills the
//! group, as it does when the socket closes.

use std::ffi::{OsStr, OsString};
use std::os::fd::RawFd;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::clock::Instant;
use crate::exit;

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildExit {
    /// It exited with this code.
    Exited(i32),
    /// A signal (this number) ended it, not a SIGKILL sent by leaderd.
    Signaled(i32),
    /// leaderd SIGKILLed it: the kill deadline, the end of a stop's grace,
    /// [`Child::kill`](super::Child::kill), or the loss of leaderd or of the guard.
    Killed,
}

impl ChildExit {
    /// The exit code leaderd passes on: the child's own, or 128+N for
    /// signal N (137 for a kill).
    pub fn exit_code(&self) -> i32 {
        match self {
            ChildExit::Exited(code) => *code,
            ChildExit::Signaled(n) => exit::killed_by(*n),
            ChildExit::Killed => exit::killed_by(Signal::SIGKILL as i32),
        }
    }

    /// Label for `leaderd_child_exits_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            ChildExit::Exited(_) => "exited",
            ChildExit::Signaled(_) => "signaled",
            ChildExit::Killed => "killed",
        }
    }
}

impl std::fmt::Display for ChildExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildExit::Exited(code) => write!(f, "exited with code {code}"),
            ChildExit::Signaled(n) => match Signal::try_from(*n) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {n}"),
            },
            ChildExit::Killed => write!(f, "killed by leaderd (SIGKILL)"),
        }
    }
}

/// The hidden subcommand that runs the guard: `leaderd __guard …`.
pub const SUBCOMMAND: &str = "__guard";

/// A request from leaderd to the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Stop signal at `stop_at`, SIGKILL at `kill_at`; replaces the previous
    /// deadline (it is extended after every successful renew).
    Arm {
        /// When to send the stop signal to the group.
        stop_at: Instant,
        /// When to SIGKILL the group.
        kill_at: Instant,
    },
    /// No lease deadline any more (mode "always", shutdown). A stop already
    /// under way keeps its kill time.
    Disarm,
    /// Forward this signal number to the group.
    Signal(i32),
    /// Stop signal now, SIGKILL after `grace` (never later than an armed
    /// `kill_at`).
    Stop {
        /// Time between the stop signal and the SIGKILL.
        grace: Duration,
    },
    /// SIGKILL the group and every reparented orphan now.
    Kill,
}

impl Request {
    pub(crate) fn encode(&self) -> String {
        match self {
            Request::Arm { stop_at, kill_at } => {
                format!("arm {} {}\n", nanos(*stop_at), nanos(*kill_at))
            }
            Request::Disarm => "disarm\n".to_owned(),
            Request::Signal(n) => format!("signal {n}\n"),
            Request::Stop { grace } => format!("stop {}\n", grace.as_nanos()),
            Request::Kill => "kill\n".to_owned(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Request> {
        let mut words = line.split_ascii_whitespace();
        let request = match words.next()? {
            "arm" => Request::Arm {
                stop_at: instant(words.next()?)?,
                kill_at: instant(words.next()?)?,
            },
            "disarm" => Request::Disarm,
            "signal" => Request::Signal(words.next()?.parse().ok()?),
            "stop" => Request::Stop {
                grace: Duration::from_nanos(words.next()?.parse().ok()?),
            },
            "kill" => Request::Kill,
            _ => return None,
        };
        words.next().is_none().then_some(request)
    }
}

/// A report from the guard to leaderd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// The child runs with this pid, which is also its process group id.
    Started(i32),
    /// The child was not started: why, and the exit code a shell would give
    /// (127 not found, 126 not executable; 0 for any other failure).
    Failed {
        /// The shell's exit code for this failure, 0 if it has none.
        code: i32,
        /// The program and the system's reason.
        message: String,
    },
    /// The child was not started: the deadline's `stop_at` had passed.
    Late,
    /// The armed `stop_at` passed: the stop signal went to the group.
    DeadlineStop,
    /// A kill deadline passed: SIGKILL went to the group.
    DeadlineKill,
    /// The child (the group leader) ended; the guard now clears the rest.
    Exit(ChildExit),
}

impl Report {
    pub(crate) fn encode(&self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}\n"),
            // One line: the message must not break the framing.
            Report::Failed { code, message } => {
                format!("failed {code} {}\n", message.replace(['\n', '\r'], " "))
            }
            Report::Late => "late\n".to_owned(),
            Report::DeadlineStop => "deadline-stop\n".to_owned(),
            Report::DeadlineKill => "deadline-kill\n".to_owned(),
            Report::Exit(ChildExit::Exited(code)) => format!("exited {code}\n"),
            Report::Exit(ChildExit::Signaled(n)) => format!("signaled {n}\n"),
            Report::Exit(ChildExit::Killed) => "killed\n".to_owned(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Report> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        Some(match word {
            "started" => Report::Started(rest.parse().ok()?),
            "failed" => {
                let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
                Report::Failed {
                    code: code.parse().ok()?,
                    message: message.to_owned(),
                }
            }
            "late" => Report::Late,
            "deadline-stop" => Report::DeadlineStop,
            "deadline-kill" => Report::DeadlineKill,
            "exited" => Report::Exit(ChildExit::Exited(rest.parse().ok()?)),
            "signaled" => Report::Exit(ChildExit::Signaled(rest.parse().ok()?)),
            "killed" => Report::Exit(ChildExit::Killed),
            _ => return None,
        })
    }
}

fn nanos(at: Instant) -> u128 {
    at.since_origin().as_nanos()
}

fn instant(word: &str) -> Option<Instant> {
    Some(Instant::from_since_origin(Duration::from_nanos(
        word.parse().ok()?,
    )))
}

/// The guard's command line after the subcommand (see the module docs).
pub(crate) fn command_line(
    control_fd: RawFd,
    stop_signal: Signal,
    deadline: Option<(Instant, Instant)>,
    command: &[String],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        SUBCOMMAND.into(),
        "--control-fd".into(),
        control_fd.to_string().into(),
        "--stop-signal".into(),
        (stop_signal as i32).to_string().into(),
    ];
    if let Some((stop_at, kill_at)) = deadline {
        args.push("--deadline".into());
        args.push(nanos(stop_at).to_string().into());
        args.push(nanos(kill_at).to_string().into());
    }
    args.push("--".into());
    args.extend(command.iter().map(OsString::from));
    args
}

/// The guard's parsed command line.
#[derive(Debug)]
pub(crate) struct Args {
    /// The guard's end of the control socket.
    pub(crate) control_fd: RawFd,
    /// The signal that asks the job to stop.
    pub(crate) stop_signal: Signal,
    /// The deadline to enforce from the start: stop, then kill.
    pub(crate) deadline: Option<(Instant, Instant)>,
    /// The job's program and arguments.
    pub(crate) command: Vec<OsString>,
}

impl Args {
    pub(crate) fn parse(args: &[OsString]) -> Result<Args, String> {
        let mut control_fd = None;
        let mut stop_signal = None;
        let mut deadline = None;
        let mut it = args.iter();
        let text = |v: Option<&OsString>, what: &str| -> Result<String, String> {
            v.and_then(|v| v.to_str())
                .map(str::to_owned)
                .ok_or_else(|| format!("{what} needs a value"))
        };
        loop {
            match it.next().map(OsString::as_os_str) {
                None => return Err("missing `-- COMMAND`".into()),
                Some(a) if a == "--" => break,
                Some(a) if a == "--control-fd" => {
                    let v = text(it.next(), "--control-fd")?;
                    control_fd = Some(v.parse().map_err(|_| format!("bad --control-fd {v:?}"))?);
                }
                Some(a) if a == "--stop-signal" => {
                    let v = text(it.next(), "--stop-signal")?;
                    let n: i32 = v.parse().map_err(|_| format!("bad --stop-signal {v:?}"))?;
                    stop_signal =
                        Some(Signal::try_from(n).map_err(|_| format!("bad --stop-signal {n}"))?);
                }
                Some(a) if a == "--deadline" => {
                    let stop = text(it.next(), "--deadline")?;
                    let kill = text(it.next(), "--deadline")?;
                    deadline = Some(
                        instant(&stop)
                            .zip(instant(&kill))
                            .ok_or_else(|| format!("bad --deadline {stop:?} {kill:?}"))?,
                    );
                }
                Some(a) => return Err(format!("unknown argument {a:?}")),
            }
        }
        let command: Vec<OsString> = it.cloned().collect();
        if command.is_empty() {
            return Err("missing COMMAND after `--`".into());
        }
        Ok(Args {
            control_fd: control_fd.ok_or("missing --control-fd")?,
            stop_signal: stop_signal.ok_or("missing --stop-signal")?,
            deadline,
            command,
        })
    }
}

/// True when `arg` is the guard's hidden subcommand.
pub fn is_subcommand(arg: &OsStr) -> bool {
    arg == SUBCOMMAND
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let at = |ms| Instant::from_since_origin(Duration::from_millis(ms));
        for r in [
            Request::Arm {
                stop_at: at(1_000),
                kill_at: at(3_000),
            },
            Request::Disarm,
            Request::Signal(10),
            Request::Stop {
                grace: Duration::from_millis(2_500),
            },
            Request::Kill,
        ] {
            let line = r.encode();
            assert!(line.ends_with('\n'));
            assert_eq!(Request::parse(line.trim_end()), Some(r));
        }
        assert_eq!(Request::parse("arm 1"), None);
        assert_eq!(Request::parse("kill now"), None);
        assert_eq!(Request::parse("signal x"), None);
        assert_eq!(Request::parse(""), None);
    }

    #[test]
    fn reports_round_trip() {
        for r in [
            Report::Started(42),
            Report::Failed {
                code: 127,
                message: "no such file".into(),
            },
            Report::Failed {
                code: 0,
                message: String::new(),
            },
            Report::Late,
            Report::DeadlineStop,
            Report::DeadlineKill,
            Report::Exit(ChildExit::Exited(3)),
            Report::Exit(ChildExit::Signaled(11)),
            Report::Exit(ChildExit::Killed),
        ] {
            assert_eq!(Report::parse(r.encode().trim_end()), Some(r));
        }
        assert_eq!(
            Report::Failed {
                code: 126,
                message: "a\nb".into()
            }
            .encode(),
            "failed 126 a b\n".to_owned()
        );
        assert_eq!(Report::parse("failed x y"), None);
        assert_eq!(Report::parse("started x"), None);
        assert_eq!(Report::parse("hello"), None);
    }

    #[test]
    fn command_line_parses_back() {
        let stop_at = Instant::from_since_origin(Duration::from_millis(1_500));
        let kill_at = Instant::from_since_origin(Duration::from_millis(3_500));
        let line = command_line(
            7,
            Signal::SIGTERM,
            Some((stop_at, kill_at)),
            &["sh".into(), "-c".into(), "echo --".into()],
        );
        assert_eq!(line[0], SUBCOMMAND);
        let args = Args::parse(&line[1..]).expect("well-formed");
        assert_eq!(args.control_fd, 7);
        assert_eq!(args.stop_signal, Signal::SIGTERM);
        assert_eq!(args.deadline, Some((stop_at, kill_at)));
        assert_eq!(args.command, vec!["sh", "-c", "echo --"]);
    }

    #[test]
    fn bad_command_lines_are_errors() {
        let parse = |a: &[&str]| Args::parse(&a.iter().map(OsString::from).collect::<Vec<_>>());
        assert!(parse(&["--control-fd", "3", "--stop-signal", "15", "--"]).is_err());
        assert!(parse(&["--control-fd", "3", "--stop-signal", "99", "--", "x"]).is_err());
        assert!(parse(&["--stop-signal", "15", "--", "x"]).is_err());
        assert!(parse(&["--control-fd", "x", "--stop-signal", "15", "--", "x"]).is_err());
        assert!(parse(&["--what", "--", "x"]).is_err());
        assert!(parse(&["--control-fd", "3", "--stop-signal", "15", "x"]).is_err());
    }
}
