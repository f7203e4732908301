//! The child: start, signal, stop, kill, reap, exit codes. The job is one;
//! each command of an app check (`crate::app_check`) is another, with no
//! deadline and its output discarded ([`Streams::Null`]).
//!
//! leaderd never forks the child itself. [`spawn`] starts a guard process
//! (`leaderd __guard`, see [`guard`]) over a Unix socket pair; the guard
//! starts the child in its own process group and owns its kill deadline, so the
//! deadline holds while leaderd's runtime stalls or leaderd is stopped, and the
//! child's whole group dies when leaderd dies (the socket closes).
//!
//! [`Child`] talks to the guard: [`Child::arm`] after every successful renew,
//! [`Child::signal`] to forward a signal, [`Child::stop`] / [`Child::kill`],
//! and [`Child::wait`] (cancel-safe, for `tokio::select!`), which resolves
//! once the child exited and every other member of its group and every orphan
//! it left behind is gone. Dropping a [`Child`] closes the socket, which makes
//! the guard SIGKILL everything at once.
//!
//! - [`protocol`]: the guard's command line, requests, reports, [`ChildExit`].
//! - [`guard`]: the guard process itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::clock::{Instant, boot_now};
pub mod guard;
pub(crate) mod protocol;

pub use protocol::{ChildExit, SUBCOMMAND, is_subcommand};
use protocol::{Report, Request};

/// The variables leaderd puts into its child's environment: the one list,
/// which the daemon sets and the configuration layer knows not to read as
/// settings.
pub mod child_env {
    /// The election the child runs for.
    pub const ELECTION: &str = "LEADERD_ELECTION";
    /// leaderd's identity.
    pub const IDENTITY: &str = "LEADERD_IDENTITY";
    /// The fencing token of the tenure the child runs under (mode
    /// `while-leader`).
    pub const FENCING_TOKEN: &str = "LEADERD_FENCING_TOKEN";
    /// The lease duration in milliseconds.
    pub const LEASE_MS: &str = "LEADERD_LEASE_MS";
    /// `true` or `false`: whether leaderd led when the child started.
    pub const IS_LEADER: &str = "LEADERD_IS_LEADER";
    /// Every name above.
    pub const ALL: [&str; 5] = [ELECTION, IDENTITY, FENCING_TOKEN, LEASE_MS, IS_LEADER];

    /// The child's variables: `fencing_token` only for a child that runs
    /// under a tenure.
    pub fn vars(
        election: &str,
        identity: &str,
        is_leader: bool,
        fencing_token: Option<u64>,
        lease_ms: u64,
    ) -> Vec<(String, String)> {
        let mut env = vec![
            (ELECTION.to_owned(), election.to_owned()),
            (IDENTITY.to_owned(), identity.to_owned()),
            (IS_LEADER.to_owned(), is_leader.to_string()),
            (LEASE_MS.to_owned(), lease_ms.to_string()),
        ];
        if let Some(token) = fencing_token {
            env.push((FENCING_TOKEN.to_owned(), token.to_string()));
        }
        env
    }
}

/// What to run and how to stop it.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Program and arguments, run without a shell. Must not be empty.
    pub command: Vec<String>,
    /// Added to leaderd's own environment (the `LEADERD_*` variables).
    pub env: Vec<(String, String)>,
    /// Sent to the group at the stop deadline and by [`Child::stop`].
    pub stop_signal: Signal,
    /// The leaderd binary that runs the guard. In production
    /// `/proc/self/exe`, which still names the running binary after a package
    /// upgrade replaced the file; tests use `env!("CARGO_BIN_EXE_leaderd")`.
    pub guard_exe: PathBuf,
}

/// Why the child could not be started or reached.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The child command is empty.
    #[error("the child command is empty")]
    EmptyCommand,
    /// The stop deadline passed before the child could start; it never ran.
    #[error("the lease deadline passed before the child could start")]
    DeadlinePassed,
    /// The guard process could not be started.
    #[error("cannot start the guard process {path}: {source}")]
    GuardStart {
        /// The guard executable.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The child command could not be started (not found, not executable…).
    #[error("cannot start the child: {}", .0.message)]
    Spawn(SpawnFailure),
    /// The guard exited or broke the protocol before reporting the child.
    #[error("the guard process ended before starting the child")]
    GuardLost,
    /// The child has exited and its guard is gone; there is nothing to signal.
    #[error("the child has already exited")]
    Gone,
    /// The control socket failed.
    #[error("guard control socket: {0}")]
    Io(#[from] io::Error),
}

/// Why the command itself could not be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnFailure {
    /// The program and the system's reason, e.g. `./exprot.sh: No such file
    /// or directory (os error 2)`.
    pub message: String,
    /// As a shell would exit: 127 when the program does not exist, 126
    /// when it cannot be executed; `None` for other failures, which may
    /// pass (out of memory, too many open files).
    pub exit_code: Option<i32>,
}

/// Where the guard's and the child's standard streams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// leaderd's own (the job: its output is part of leaderd's).
    Inherit,
    /// `/dev/null` (an app check command: only its exit status counts).
    Null,
}

impl Streams {
    fn stdio(self) -> Stdio {
        match self {
            Streams::Inherit => Stdio::inherit(),
            Streams::Null => Stdio::null(),
        }
    }
}

/// Starts the child under a guard. With `deadline = Some((stop_at, kill_at))`
/// the guard enforces it from the first instant, and the child is not started
/// at all once `stop_at` has passed ([`SupervisorError::DeadlinePassed`]);
/// `None` means no deadline (mode "always").
///
/// Resolves once the child runs (the guard reported its pid) or failed to
/// start. Cancelling it leaves nothing running.
pub async fn spawn(
    spec: &ChildSpec,
    deadline: Option<(Instant, Instant)>,
) -> Result<Child, SupervisorError> {
    spawn_with(spec, deadline, Streams::Inherit).await
}

/// [`spawn`], with the guard's and the child's standard streams as
/// `streams` says.
pub async fn spawn_with(
    spec: &ChildSpec,
    deadline: Option<(Instant, Instant)>,
    streams: Streams,
) -> Result<Child, SupervisorError> {
    if spec.command.is_empty() {
        return Err(SupervisorError::EmptyCommand);
    }
    if let Some((stop_at, _)) = deadline
        && boot_now() >= stop_at
    {
        return Err(SupervisorError::DeadlinePassed);
    }
    // Both ends are close-on-exec; only the guard's copy of its end is made
    // inheritable, in the forked guard process just before exec.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let guard_fd = theirs.as_raw_fd();
    let mut cmd = tokio::process::Command::new(&spec.guard_exe);
    cmd.args(protocol::command_line(
        guard_fd,
        spec.stop_signal,
        deadline,
        &spec.command,
    ))
    .envs(spec.env.iter().map(|(k, v)| (k, v)))
    .stdin(streams.stdio())
    .stdout(streams.stdio())
    .stderr(streams.stdio())
    // Its own group: a signal to leaderd's group (terminal, `kill -STOP
    // -PGID`) must not stop or end the deadline's owner.
    .process_group(0);
    // SAFETY: runs in the forked guard process before exec; fcntl is
    // async-signal-safe, and guard_fd is open (`theirs` lives until after
    // spawn returns).
    unsafe {
        cmd.pre_exec(move || {
            let fd = BorrowedFd::borrow_raw(guard_fd);
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
            Ok(())
        });
    }
    let guard_process = cmd.spawn().map_err(|source| SupervisorError::GuardStart {
        path: spec.guard_exe.clone(),
        source,
    })?;
    // Our copy of the guard's end must go, or the guard's death would never
    // show as end-of-file here.
    drop(theirs);
    ours.set_nonblocking(true)?;
    let control = tokio::net::UnixStream::from_std(ours)?;

    let child = Child {
        pid: 0,
        guard: guard_process,
        control,
        inbuf: Vec::new(),
        outbuf: Vec::new(),
        exit: None,
        closed: false,
        finished: None,
    };
    child.started(&spec.command).await
}

impl Child {
    /// The guard's first report: the child runs (its pid), or it did not
    /// start, or the deadline passed first.
    async fn started(mut self, command: &[String]) -> Result<Child, SupervisorError> {
        match self.next_report().await {
            Some(Report::Started(pid)) if pid > 0 => {
                self.pid = pid;
                tracing::debug!(pid, command = ?command, "guard started the child");
                Ok(self)
            }
            Some(Report::Failed { code, message }) => {
                let _ = self.guard.wait().await;
                Err(SupervisorError::Spawn(SpawnFailure {
                    message,
                    exit_code: (code != 0).then_some(code),
                }))
            }
            Some(Report::Late) => {
                let _ = self.guard.wait().await;
                Err(SupervisorError::DeadlinePassed)
            }
            // Dropping the child closes the socket: a guard that is somehow
            // still running kills whatever it started.
            _ => Err(SupervisorError::GuardLost),
        }
    }
}

/// A running child and its guard. Dropping it kills the child's whole group.
#[derive(Debug)]
pub struct Child {
    pid: i32,
    guard: tokio::process::Child,
    control: tokio::net::UnixStream,
    /// Bytes read from the guard, not yet a full line.
    inbuf: Vec<u8>,
    /// Request bytes not yet written (kept across cancellation).
    outbuf: Vec<u8>,
    /// The child's end, once reported.
    exit: Option<ChildExit>,
    /// The guard closed the socket: it has cleared the group and exited.
    closed: bool,
    /// What [`Child::wait`] returns, once everything is gone.
    finished: Option<ChildExit>,
}

impl Child {
    /// The child's pid, which is also its process group id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Stop signal to the group at `stop_at`, SIGKILL at `kill_at` (both on
    /// `CLOCK_BOOTTIME`), replacing the previous deadline. Call it after every
    /// successful renew. Once a stop has begun (its `stop_at` passed, or
    /// [`Child::stop`]), re-arming does not move the kill later.
    pub async fn arm(&mut self, stop_at: Instant, kill_at: Instant) -> Result<(), SupervisorError> {
        self.request(Request::Arm { stop_at, kill_at }).await
    }

    /// No lease deadline (mode "always", or after the lease was released).
    pub async fn disarm(&mut self) -> Result<(), SupervisorError> {
        self.request(Request::Disarm).await
    }

    /// Sends `sig` to the child's process group.
    pub async fn signal(&mut self, sig: Signal) -> Result<(), SupervisorError> {
        self.request(Request::Signal(sig as i32)).await
    }

    /// Stop signal to the group now; SIGKILL after `grace`, or at the armed
    /// `kill_at` if that comes first.
    pub async fn stop(&mut self, grace: Duration) -> Result<(), SupervisorError> {
        self.request(Request::Stop { grace }).await
    }

    /// SIGKILL the group (and every orphan it left) now.
    pub async fn kill(&mut self) -> Result<(), SupervisorError> {
        self.request(Request::Kill).await
    }

    /// Waits until the child has exited and every other member of its group
    /// and every orphan it left is gone. Cancel-safe; after it returned once
    /// it returns the same value at once.
    pub async fn wait(&mut self) -> ChildExit {
        loop {
            if let Some(exit) = self.finished {
                return exit;
            }
            if !self.closed {
                match self.next_report().await {
                    Some(Report::Exit(exit)) => {
                        tracing::debug!(pid = self.pid, %exit, "guard reported the child's exit");
                        self.exit = Some(exit);
                    }
                    Some(Report::DeadlineStop) => tracing::warn!(
                        pid = self.pid,
                        "lease deadline: stop signal sent to the child's process group"
                    ),
                    Some(Report::DeadlineKill) => tracing::warn!(
                        pid = self.pid,
                        "kill deadline: SIGKILL sent to the child's process group"
                    ),
                    Some(other) => {
                        tracing::warn!(pid = self.pid, report = ?other, "unexpected report from the guard")
                    }
                    None => {
                        self.closed = true;
                        if self.exit.is_none() {
                            // The guard died without reporting the child's end.
                            // The child got its parent-death SIGKILL; its group may
                            // not have. The group id cannot have been recycled
                            // while a member lives.
                            tracing::error!(
                                pid = self.pid,
                                "the guard process died; killing the child's process group"
                            );
                            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
                            self.exit = Some(ChildExit::Killed);
                        }
                    }
                }
                continue;
            }
            // Cancel-safe: waiting on a tokio child can be repeated.
            match self.guard.wait().await {
                Ok(status) if !status.success() => {
                    tracing::error!(pid = self.pid, %status, "the guard process failed")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(pid = self.pid, error = %e, "cannot reap the guard"),
            }
            self.finished = self.exit;
        }
    }

    /// Queues `request` and writes every queued byte. Cancel-safe in the
    /// sense that no request is ever torn: what was not written stays queued
    /// and goes first on the next request.
    async fn request(&mut self, request: Request) -> Result<(), SupervisorError> {
        if self.closed {
            return Err(SupervisorError::Gone);
        }
        self.outbuf.extend_from_slice(request.encode().as_bytes());
        while !self.outbuf.is_empty() {
            match self.control.write(&self.outbuf).await {
                Ok(0) => return Err(SupervisorError::Gone),
                Ok(n) => {
                    self.outbuf.drain(..n);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Err(SupervisorError::Gone);
                }
                Err(e) => return Err(SupervisorError::Io(e)),
            }
        }
        Ok(())
    }

    /// The next report from the guard; `None` once the socket is closed.
    /// Cancel-safe: partial lines stay in `inbuf`.
    async fn next_report(&mut self) -> Option<Report> {
        loop {
            while let Some(end) = self.inbuf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.inbuf.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                match Report::parse(&text) {
                    Some(report) => return Some(report),
                    None => tracing::warn!(line = %text, "unintelligible report from the guard"),
                }
            }
            match self.control.read_buf(&mut self.inbuf).await {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(ChildExit::Exited(3).exit_code(), 3);
        assert_eq!(ChildExit::Signaled(11).exit_code(), 139);
        assert_eq!(ChildExit::Signaled(15).exit_code(), 143);
        assert_eq!(ChildExit::Killed.exit_code(), 137);
        assert_eq!(ChildExit::Exited(0).reason(), "exited");
        assert_eq!(ChildExit::Signaled(2).reason(), "signaled");
        assert_eq!(ChildExit::Killed.reason(), "killed");
        assert_eq!(ChildExit::Signaled(11).to_string(), "killed by SIGSEGV");
    }
}
