//! Counterexamples as text: one line per step.

use std::fmt::Write as _;

use super::{NodeModel, Step, World};
use crate::core::node::ElectionId;

impl NodeModel {
    /// One line per step of a counterexample: the step, real time, each
    /// daemon's role in each election, and the store's records.
    pub fn trace(&self, path: &[(World, Option<Step>)]) -> String {
        let mut out = String::new();
        let mut idle = 0;
        for (i, (w, step)) in path.iter().enumerate() {
            // Time passing with nothing else happening: one line.
            let next_advances = matches!(step, Some(Step::Advance(_)));
            let prev_advanced = i > 0 && matches!(path[i - 1].1, Some(Step::Advance(_)));
            if next_advances && prev_advanced {
                idle += 1;
                continue;
            }
            if idle > 0 {
                let _ = writeln!(out, "      ... time passes ({idle} more steps)");
                idle = 0;
            }
            let _ = writeln!(
                out,
                "  t={:>6} ms  [{}]  store: {}",
                w.t,
                self.roles(w),
                Self::records(w)
            );
            if let Some(step) = step {
                let _ = writeln!(out, "      -> {step:?}");
            }
        }
        out
    }

    /// Each daemon's roles: `a0: e0=Leader (job) e1=Follower`.
    fn roles(&self, w: &World) -> String {
        let daemons: Vec<String> = (0..3)
            .map(|n| {
                let daemon = &w.daemons[n];
                let name = format!("{}{}", self.bounds.identities[n], n);
                if !daemon.alive {
                    return format!("{name}: dead");
                }
                let roles: Vec<String> = (0..self.bounds.elections)
                    .map(|e| {
                        let s = daemon.node.state(ElectionId(e as u32));
                        let job = if self.runs_job(w, n, e) { " (job)" } else { "" };
                        format!("e{e}={:?}{job}", s.role)
                    })
                    .collect();
                let frozen = if daemon.frozen { " frozen" } else { "" };
                let gate = if daemon.gate { "" } else { " app failing" };
                format!("{name}{frozen}{gate}: {}", roles.join(" "))
            })
            .collect();
        daemons.join("; ")
    }

    /// The store's records: `e0 a rvn r3 token 9 via a/r1; session a/r1 rvn r5 ended 1`.
    fn records(w: &World) -> String {
        let prefix = crate::core::keys::SESSION_PREFIX;
        let records: Vec<String> = w
            .records
            .iter()
            .map(|(key, l)| match key.strip_prefix(prefix) {
                Some(session) => match l.holder {
                    Some(_) => format!("session {session} rvn {} count {}", l.rvn, l.fencing_token),
                    None => format!("session {session} ended"),
                },
                None => format!(
                    "{key} {} rvn {} token {}{}{}",
                    l.holder.as_deref().unwrap_or("released"),
                    l.rvn,
                    l.fencing_token,
                    l.session
                        .as_deref()
                        .map(|s| format!(" via {}", s.trim_start_matches(prefix)))
                        .unwrap_or_default(),
                    l.successor
                        .as_deref()
                        .map(|s| format!(" to {s}"))
                        .unwrap_or_default()
                ),
            })
            .collect();
        if records.is_empty() {
            "empty".into()
        } else {
            records.join("; ")
        }
    }
}
