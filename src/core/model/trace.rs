//! Counterexamples as text: one line per step.

use std::fmt::Write as _;

use super::{ElectionModel, Step, World};

impl ElectionModel {
    /// One line per step of a counterexample: the step, real time, each
    /// core's role, and the record.
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
            let roles: Vec<String> = (0..3)
                .map(|n| {
                    let node = &w.nodes[n];
                    let s = node.core.state();
                    let mark = if !node.alive {
                        "dead".to_owned()
                    } else {
                        format!("{:?}", s.role)
                    };
                    let job = if self.runs_job(w, n) {
                        " (job runs)"
                    } else {
                        ""
                    };
                    format!("{}{}={mark}{job}", self.bounds.identities[n], n)
                })
                .collect();
            let record = match &w.record {
                None => "no item".to_owned(),
                Some(l) => format!(
                    "{} rvn {} token {}{}{}",
                    l.holder.as_deref().unwrap_or("released"),
                    l.rvn,
                    l.fencing_token,
                    l.session
                        .as_deref()
                        .map(|s| format!(
                            " via {}",
                            s.trim_start_matches(crate::core::keys::SESSION_PREFIX)
                        ))
                        .unwrap_or_default(),
                    l.successor
                        .as_deref()
                        .map(|s| format!(" to {s}"))
                        .unwrap_or_default()
                ),
            };
            let sessions: String = w
                .sessions
                .iter()
                .map(|(key, s)| {
                    let key = key.trim_start_matches(crate::core::keys::SESSION_PREFIX);
                    match s.holder {
                        Some(_) => format!("; session {key} rvn {}", s.rvn),
                        None => format!("; session {key} ended"),
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "  t={:>6} ms  [{}]  store: {record}{sessions}",
                w.t,
                roles.join(" ")
            );
            if let Some(step) = step {
                let _ = writeln!(out, "      -> {step:?}");
            }
        }
        out
    }
}
