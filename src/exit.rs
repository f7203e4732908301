//! The process exit codes, one owner for every part of leaderd that ends the
//! process (the daemon, the command-line tools, the guard, the PID-1 reaper).
//!
//! They follow sysexits(3) where it has a code for the case, and shells for a
//! child that cannot be run or was killed by a signal.

/// `leaderd check`: at least one item failed, so `leaderd run` would not
/// work here as configured (the report says why).
pub const CHECK_FAILED: i32 = 1;
/// Bad usage on the command line.
pub const USAGE: i32 = 64;
/// An invalid configuration. The same code as a usage error (not sysexits'
/// 78): both mean "you asked for something wrong", and scripts and systemd
/// units need to tell only that from "the world is wrong".
pub const CONFIG: i32 = 64;
/// The store is unreachable at start under `store.fail_fast`, or its table or
/// file has a schema leaderd cannot use.
pub const UNAVAILABLE: i32 = 69;
/// An internal error: a bug, or the runtime failing.
pub const SOFTWARE: i32 = 70;
/// The lease was not acquired within `--acquire-timeout`.
pub const TEMPFAIL: i32 = 75;
/// `leaderd lock acquire|renew`: the token could not be written to stdout
/// (a full disk, a closed pipe), so the lock was given up again; also
/// `leaderd status` when its output cannot be written. sysexits' code for an
/// output error: scripts tell it from "not acquired" (75).
pub const IOERR: i32 = 74;
/// `leaderd lock renew|release`: the lock is not the token's any more (it
/// was released, taken over, or never existed); nothing was changed.
pub const NOT_OURS: i32 = 77;
/// The job's command is there but cannot be executed (as shells exit).
pub const NOT_EXECUTABLE: i32 = 126;
/// The job's command does not exist (as shells exit).
pub const NOT_FOUND: i32 = 127;

/// The code a shell gives a process killed by `signal`: 128 + its number.
pub fn killed_by(signal: i32) -> i32 {
    128 + signal
}
