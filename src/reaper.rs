//! A tiny init for when leaderd runs as PID 1 (containers).
//!
//! PID 1 inherits every orphan in its PID namespace and must reap it, or
//! zombies pile up. Reaping with `waitpid(-1)` inside leaderd would steal the
//! exit statuses that tokio waits for (the guard's), so [`init_if_pid1`]
//! forks instead: the PID-1 parent becomes a minimal init that forwards every
//! signal to the real leaderd, reaps every zombie, and exits with the real
//! leaderd's exit code; the forked child returns and runs leaderd as usual.

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};

use crate::exit;

/// When this process is PID 1, split into an init (which never returns) and
/// the real leaderd (which returns from this call). Otherwise does nothing.
///
/// Call it first thing in `main`, before any thread exists: `fork` copies
/// only the calling thread.
pub fn init_if_pid1() {
    if getpid() != Pid::from_raw(1) {
        return;
    }
    // Block everything before the fork, so no signal sent to PID 1 meanwhile
    // takes its default action (for PID 1: ignored, i.e. lost). The init keeps
    // them blocked and collects them with sigwait; the child restores the mask.
    let mut previous = SigSet::empty();
    if nix::sys::signal::sigprocmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut previous),
    )
    .is_err()
    {
        eprintln!("leaderd: running as PID 1 without a reaper: cannot block signals");
        return;
    }
    // SAFETY: called before any other thread exists (see the doc comment),
    // so the child is a complete copy of the process.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
        }
        Ok(ForkResult::Parent { child }) => run_init(child),
        Err(e) => {
            eprintln!("leaderd: running as PID 1 without a reaper: fork failed: {e}");
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
        }
    }
}

/// The init loop: forward, reap, and exit with `leaderd`'s status.
fn run_init(leaderd: Pid) -> ! {
    let all = SigSet::all();
    loop {
        // Reap first: leaderd may already have exited before the loop began.
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == leaderd => std::process::exit(code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == leaderd => {
                    std::process::exit(exit::killed_by(sig as i32))
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                // ECHILD: leaderd is gone and was reaped (cannot happen
                // without passing the arms above).
                Err(_) => std::process::exit(exit::SOFTWARE),
            }
        }
        match all.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                let _ = kill(leaderd, sig);
            }
        }
    }
}
