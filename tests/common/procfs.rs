//! What the tests read about processes from `/proc`: state, parent, group,
//! CPU time, memory, descriptors, and the process tree.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

/// The fields of `/proc/PID/stat` the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `T`, `Z`, ...
    pub state: char,
    /// Parent pid.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Session id.
    pub session: i32,
    /// User and system CPU time, in clock ticks.
    pub cpu_ticks: u64,
}

/// `/proc/PID/stat`, or `None` once the process is gone.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// A stat line. The command name (field 2) may hold spaces and parentheses,
/// so fields are counted after its last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    // After the name: 0 state, 1 ppid, 2 pgrp, 3 session, ... 11 utime, 12 stime.
    let num = |i: usize| f.get(i)?.parse::<i64>().ok();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: i32::try_from(num(1)?).ok()?,
        pgrp: i32::try_from(num(2)?).ok()?,
        session: i32::try_from(num(3)?).ok()?,
        cpu_ticks: u64::try_from(num(11)? + num(12)?).ok()?,
    })
}

/// True while the process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Gone, or a zombie waiting to be reaped (it runs no more code).
pub fn gone(pid: i32) -> bool {
    !alive(pid)
}

/// The process's CPU time so far (user + system), in seconds.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    Some(stat(pid)?.cpu_ticks as f64 / clock_ticks())
}

/// Clock ticks per second, the unit of CPU times in `/proc/PID/stat`.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// A number in `/proc/PID/status`: KiB for `VmHWM`, `VmRSS`, `RssAnon`;
/// a count for `Threads`.
pub fn status_field(pid: i32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// A field of `/proc/PID/smaps_rollup` in KiB (`Pss`, `Rss`).
pub fn smaps_kib(pid: i32, field: &str) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// How many descriptors the process has open.
pub fn open_fds(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The `socket:[inode]` targets of the process's descriptors.
pub fn socket_inodes(pid: i32) -> HashSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .filter(|l| l.starts_with("socket:"))
                .collect()
        })
        .unwrap_or_default()
}

/// Every process's pid and stat.
fn all() -> Vec<(i32, Stat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// The processes whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    all()
        .into_iter()
        .filter(|(_, s)| s.ppid == pid)
        .map(|(p, _)| p)
        .collect()
}

/// The command name (`comm`) of a process.
pub fn comm(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(text.trim_end().to_owned())
}

/// Every process below `root` (children, grandchildren, ...), with its
/// state; `root` itself is not included.
pub fn descendants(root: i32) -> Vec<(i32, char)> {
    let mut children: HashMap<i32, Vec<(i32, char)>> = HashMap::new();
    for (pid, s) in all() {
        children.entry(s.ppid).or_default().push((pid, s.state));
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &(c, state) in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push((c, state));
            todo.push(c);
        }
    }
    out
}

/// The live processes (zombies excepted) with `arg` among their arguments:
/// how a test finds what a command it configured left behind, by a marker
/// argument no other process has.
pub fn with_arg(arg: &str) -> Vec<i32> {
    all()
        .into_iter()
        .filter(|(_, s)| s.state != 'Z' && s.state != 'X')
        .map(|(pid, _)| pid)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}
