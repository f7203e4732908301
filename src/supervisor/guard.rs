//! The guard: the process that owns the child's kill deadline.
//!
//! The SIGKILL at the end of a tenure's validity must happen even when
//! leaderd's async runtime stalls or the leaderd process alone is stopped, so
//! it cannot live inside leaderd. The guard is the leaderd binary run as
//! `leaderd __guard`: a single-threaded `poll` loop (no tokio), in its own
//! process group so a signal to leaderd's group (a terminal's Ctrl-C or Ctrl-Z,
//! `kill -STOP -PGID`) does not reach it. It
//!
//! - starts the child COMMAND without a shell, in a new process group, with
//!   default signal dispositions and `PR_SET_PDEATHSIG = SIGKILL`, and is a
//!   child subreaper, so the job's orphans are reparented to it;
//! - enforces the last deadline leaderd armed, on `CLOCK_BOOTTIME` (a timerfd
//!   with an absolute expiry, so suspend and resume are counted): the stop
//!   signal (then SIGCONT) to the group at `stop_at`, SIGKILL at `kill_at`;
//! - SIGKILLs everything the moment the control socket closes (leaderd died,
//!   even by SIGKILL);
//! - reports the child's exit, then kills and reaps every remaining member of
//!   the group and every reparented orphan, and exits (which closes the socket:
//!   leaderd's "all gone" signal).
//!
//! What it is told and what it reports are in [`super::protocol`].

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, getpid, getppid, setpgid};

use super::protocol::{Args, ChildExit, Report, Request, SUBCOMMAND};
use crate::clock::{Instant, boot_now};
use crate::exit;

/// Entry point of `leaderd __guard`; returns the process exit code. Runs on
/// the main thread with no async runtime: the child's parent-death signal is
/// tied to the thread that forked it, so that thread must live as long as the
/// guard.
pub fn main() -> i32 {
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    let args = match Args::parse(&args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("leaderd {SUBCOMMAND}: {e} (internal command, started by `leaderd run`)");
            // Only ever started by leaderd: a bug, or a person typing it.
            return exit::USAGE;
        }
    };
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("leaderd guard: {e}");
            exit::SOFTWARE
        }
    }
}

/// Signals the guard takes through its signalfd instead of their default
/// action. SIGCHLD drives reaping; the others are ignored because leaderd
/// forwards signals explicitly, and a broadcast meant for leaderd (a terminal,
/// a process-group kill) must not end or stop the deadline's owner.
const BLOCKED: [Signal; 10] = [
    Signal::SIGCHLD,
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

fn run(args: Args) -> io::Result<()> {
    let control = take_control_socket(args.control_fd)?;
    control.set_nonblocking(true)?;

    let mut mask = SigSet::empty();
    for s in BLOCKED {
        mask.add(s);
    }
    // Single-threaded process: the thread mask is the process mask.
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    prctl::set_child_subreaper(true)?;
    let timer = TimerFd::new(
        ClockId::CLOCK_BOOTTIME,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;

    let mut guard = Guard {
        control: Some(control),
        inbuf: Vec::new(),
        signals,
        timer,
        stop_signal: args.stop_signal,
        child: Pid::from_raw(0),
        lease: args.deadline,
        lease_stop_sent: false,
        stop_kill_at: None,
        killed: false,
    };

    // leaderd may have stalled between deciding to start the child and this
    // point; a child must never start after its tenure's stop time.
    if let Some((stop_at, _)) = args.deadline
        && boot_now() >= stop_at
    {
        guard.report(&Report::Late);
        return Ok(());
    }
    match spawn_child(&args.command) {
        Ok(pid) => guard.child = pid,
        Err(e) => {
            let program = args.command[0].to_string_lossy();
            guard.report(&Report::Failed {
                code: shell_exit_code(&e),
                message: format!("{program}: {e}"),
            });
            return Ok(());
        }
    }
    guard.report(&Report::Started(guard.child.as_raw()));

    let exit = guard.supervise()?;
    guard.report(&Report::Exit(exit));
    guard.clear_and_reap();
    Ok(())
}

/// The exit code a shell gives a command it cannot run: 127 when the
/// program is not there, 126 when it is but cannot be executed; 0 when the
/// failure is of another kind (out of memory, too many files open), which
/// may pass.
fn shell_exit_code(e: &io::Error) -> i32 {
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::ENAMETOOLONG) => {
            exit::NOT_FOUND
        }
        Some(Errno::EACCES | Errno::EPERM | Errno::ENOEXEC | Errno::EISDIR | Errno::ETXTBSY) => {
            exit::NOT_EXECUTABLE
        }
        _ => 0,
    }
}

/// Adopts the inherited control socket and marks it close-on-exec so the
/// child never inherits it (an inherited copy would keep the socket open
/// after leaderd died and hide its death from the guard).
fn take_control_socket(fd: RawFd) -> io::Result<UnixStream> {
    // SAFETY: F_GETFD only reads the flags of the descriptor number; it fails
    // with EBADF when the number is not an open descriptor.
    if fd < 3 || unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } == -1 {
        return Err(io::Error::other(format!(
            "--control-fd {fd} is not an inherited descriptor"
        )));
    }
    // SAFETY: fd is open (checked above), and leaderd passed it to this
    // process for the guard alone; nothing else in the guard owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    fcntl(owned.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(UnixStream::from(owned))
}

fn spawn_child(command: &[OsString]) -> io::Result<Pid> {
    let guard_pid = getpid();
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (sigaction, sigprocmask, prctl, getppid);
    // it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // The child starts with default dispositions and an empty mask,
            // whatever leaderd inherited: a shell script cannot trap a signal
            // that was ignored when it started.
            let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            for sig in Signal::iterator() {
                if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
                    let _ = signal::sigaction(sig, &default);
                }
            }
            SigSet::all().thread_unblock()?;
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The guard may have died between fork and prctl, in which case
            // the death signal will never come.
            if getppid() != guard_pid {
                return Err(io::Error::other(
                    "the guard exited while starting the child",
                ));
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    // Also from this side, as shells do: the group must exist before the first
    // signal to it, whichever of parent and child runs first. Fails harmlessly
    // once the child has exec'd (it did it itself).
    let _ = setpgid(pid, pid);
    // The std handle neither kills nor reaps on drop; the guard reaps with
    // waitid so the group stays pinned until it has been killed.
    drop(child);
    Ok(pid)
}

struct Guard {
    /// None once leaderd closed its end.
    control: Option<UnixStream>,
    inbuf: Vec<u8>,
    signals: SignalFd,
    timer: TimerFd,
    stop_signal: Signal,
    /// The child's pid, also its process group id. Its zombie is not reaped
    /// until the group has been SIGKILLed, so `-pgid` can never name a
    /// recycled group.
    child: Pid,
    lease: Option<(Instant, Instant)>,
    lease_stop_sent: bool,
    /// Kill time of a stop under way (a `stop` request or a passed `stop_at`).
    stop_kill_at: Option<Instant>,
    killed: bool,
}

impl Guard {
    fn report(&mut self, report: &Report) {
        if let Some(control) = &mut self.control {
            // The socket is non-blocking: a report must never hold up a
            // deadline. The guard sends a handful of short lines in its life,
            // far below the socket buffer; a failure means leaderd is gone,
            // which the read side notices.
            let _ = control.write_all(report.encode().as_bytes());
        }
    }

    /// Runs until the child exits; returns how it ended (its zombie is left
    /// for [`Guard::clear_and_reap`]).
    fn supervise(&mut self) -> io::Result<ChildExit> {
        loop {
            if let Some(exit) = self.reap_orphans_until_child_exit() {
                return Ok(exit);
            }
            self.enforce_deadlines();
            self.set_timer()?;

            let (signals_ready, timer_ready, control_ready) = {
                let mut fds = vec![
                    PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.timer.as_fd(), PollFlags::POLLIN),
                ];
                if let Some(control) = &self.control {
                    fds.push(PollFd::new(control.as_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
                let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
                (
                    ready(&fds[0]),
                    ready(&fds[1]),
                    fds.get(2).is_some_and(ready),
                )
            };
            if signals_ready {
                // Drain: blocked signals are only ever read here; SIGCHLD is
                // handled by the reap at the top of the loop, the others are
                // deliberately ignored (see BLOCKED).
                while let Ok(Some(_)) = self.signals.read_signal() {}
            }
            if timer_ready {
                let mut expirations = [0u8; 8];
                let _ = nix::unistd::read(self.timer.as_fd(), &mut expirations);
            }
            if control_ready {
                self.read_control();
            }
        }
    }

    fn read_control(&mut self) {
        let Some(control) = &mut self.control else {
            return;
        };
        let mut buf = [0u8; 4096];
        let closed = loop {
            match control.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        while let Some(end) = self.inbuf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.inbuf.drain(..=end).collect();
            let request = std::str::from_utf8(&line).ok().and_then(Request::parse);
            match request {
                Some(request) => self.apply(request),
                None => {
                    eprintln!(
                        "leaderd guard: unintelligible request {:?}; killing the child",
                        String::from_utf8_lossy(&line)
                    );
                    self.kill_all();
                }
            }
        }
        if closed {
            // leaderd is gone (or closed the channel on purpose): nobody
            // renews the lease any more, so the child must not outlive it.
            self.control = None;
            self.kill_all();
        }
    }

    fn apply(&mut self, request: Request) {
        match request {
            Request::Arm { stop_at, kill_at } => self.lease = Some((stop_at, kill_at)),
            Request::Disarm => self.lease = None,
            Request::Signal(n) => match Signal::try_from(n) {
                Ok(sig) => self.signal_group(sig),
                Err(_) => eprintln!("leaderd guard: ignoring unknown signal number {n}"),
            },
            Request::Stop { grace } => {
                self.stop_group();
                let kill_at = boot_now() + grace;
                self.stop_kill_at = Some(self.stop_kill_at.map_or(kill_at, |k| k.min(kill_at)));
            }
            Request::Kill => self.kill_all(),
        }
    }

    /// The earliest kill time in force: the armed `kill_at` and a stop's.
    fn kill_deadline(&self) -> Option<Instant> {
        match (self.lease.map(|(_, kill_at)| kill_at), self.stop_kill_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn enforce_deadlines(&mut self) {
        let now = boot_now();
        if let Some((stop_at, kill_at)) = self.lease
            && !self.lease_stop_sent
            && now >= stop_at
        {
            self.lease_stop_sent = true;
            self.stop_group();
            // A stop is not undone by a later re-arm: the kill stays at the
            // validity leaderd promised when the stop began.
            self.stop_kill_at = Some(self.stop_kill_at.map_or(kill_at, |k| k.min(kill_at)));
            self.report(&Report::DeadlineStop);
        }
        if !self.killed
            && let Some(kill_at) = self.kill_deadline()
            && now >= kill_at
        {
            self.kill_all();
            self.report(&Report::DeadlineKill);
        }
    }

    fn set_timer(&self) -> io::Result<()> {
        let stop = self
            .lease
            .filter(|_| !self.lease_stop_sent)
            .map(|(stop_at, _)| stop_at);
        let kill = self.kill_deadline().filter(|_| !self.killed);
        let next = match (stop, kill) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            // Relative expiry on CLOCK_BOOTTIME (still counts suspend; every
            // wake re-checks and re-arms). Not TFD_TIMER_ABSTIME: libfaketime
            // shifts absolute expiries by its wall-clock offset even for
            // CLOCK_BOOTTIME, which made the kill late or the loop spin in the
            // wall-clock-shift tests. A zero expiry would disarm the timer.
            Some(at) => self.timer.set(
                Expiration::OneShot(TimeSpec::from_duration(
                    at.saturating_since(crate::clock::boot_now())
                        .max(Duration::from_nanos(1)),
                )),
                TimerSetTimeFlags::empty(),
            )?,
            None => self.timer.unset()?,
        }
        Ok(())
    }

    /// The stop signal, then SIGCONT: a stopped process runs no handler, so
    /// without it a job someone paused would sit out the whole grace.
    fn stop_group(&self) {
        self.signal_group(self.stop_signal);
        self.signal_group(Signal::SIGCONT);
    }

    fn signal_group(&self, sig: Signal) {
        // ESRCH: the group is already empty; nothing to do.
        let _ = killpg(self.child, sig);
    }

    /// SIGKILL to the child's group and to every other child of the guard
    /// (orphans reparented here, possibly in other groups or sessions).
    fn kill_all(&mut self) {
        self.killed = true;
        let _ = killpg(self.child, Signal::SIGKILL);
        for pid in children_of(getpid()).unwrap_or_default() {
            let _ = signal::kill(pid, Signal::SIGKILL);
        }
    }

    /// Reaps exited orphans; returns the child's end once it has exited,
    /// without reaping it.
    fn reap_orphans_until_child_exit(&mut self) -> Option<ChildExit> {
        loop {
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::All, flags) {
                Ok(WaitStatus::Exited(pid, code)) if pid == self.child => {
                    return Some(ChildExit::Exited(code));
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.child => {
                    return Some(if sig == Signal::SIGKILL && self.killed {
                        ChildExit::Killed
                    } else {
                        ChildExit::Signaled(sig as i32)
                    });
                }
                Ok(WaitStatus::StillAlive) => return None,
                Ok(status) => match status.pid() {
                    Some(pid) => {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                    }
                    None => return None,
                },
                Err(Errno::EINTR) => {}
                // ECHILD cannot happen while the child's zombie is unreaped;
                // anything else: try again at the next SIGCHLD.
                Err(_) => return None,
            }
        }
    }

    /// After the child exited: SIGKILL what is left of its group (the zombie
    /// still pins the group id), reap the child, then kill and reap
    /// reparented orphans until the guard has no children left.
    fn clear_and_reap(&mut self) {
        let _ = killpg(self.child, Signal::SIGKILL);
        let _ = waitpid(self.child, None);
        loop {
            let can_list = match children_of(getpid()) {
                Ok(children) => {
                    for pid in children {
                        let _ = signal::kill(pid, Signal::SIGKILL);
                    }
                    true
                }
                Err(e) => {
                    eprintln!("leaderd guard: cannot list orphans in /proc: {e}");
                    false
                }
            };
            // Without /proc a live orphan outside the group could not be
            // killed, and a blocking wait for it would never return.
            let flags = (!can_list).then_some(WaitPidFlag::WNOHANG);
            match waitpid(None::<Pid>, flags) {
                Ok(WaitStatus::StillAlive) => return,
                // Each reaped process may have left orphans of its own,
                // reparented here: list and kill again.
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return, // ECHILD: nothing left
            }
        }
    }
}

/// The pids whose parent is `parent`, from /proc.
fn children_of(parent: Pid) -> io::Result<Vec<Pid>> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A process may exit between listing and reading: skip it.
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
            && parse_ppid(&stat) == Some(parent.as_raw())
        {
            children.push(Pid::from_raw(pid));
        }
    }
    Ok(children)
}

/// The parent pid from a /proc/PID/stat line. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after the last ')'.
fn parse_ppid(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_is_read_after_the_command_name() {
        assert_eq!(parse_ppid("123 (a) b) c) S 77 123 123 0"), Some(77));
        assert_eq!(parse_ppid("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parse_ppid("garbage"), None);
    }
}
