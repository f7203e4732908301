//! systemd's notify protocol (`Type=notify`): [`Notifier`] speaks it, and
//! [`report_states`] tells systemd what the elections do.
//!
//! The socket path is taken from `NOTIFY_SOCKET` once at start, and the
//! variable is removed from leaderd's environment before any thread starts, so
//! the child never inherits it (only leaderd speaks for the service).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::driver::board::StateView;

/// Where to send notifications, if systemd asked for them.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    socket: Option<PathBuf>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Take `NOTIFY_SOCKET` and `WATCHDOG_USEC` out of the environment.
    ///
    /// # Safety
    /// Mutates the process environment: call it before any other thread
    /// exists (first thing in `main`, before the tokio runtime starts).
    pub unsafe fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET").map(PathBuf::from);
        let pid_ok = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0 && pid_ok)
            .map(Duration::from_micros);
        // SAFETY: the caller guarantees no other thread runs yet.
        unsafe {
            std::env::remove_var("NOTIFY_SOCKET");
            std::env::remove_var("WATCHDOG_USEC");
            std::env::remove_var("WATCHDOG_PID");
        }
        Notifier { socket, watchdog }
    }

    /// Whether systemd listens.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// The watchdog interval systemd asked for, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Send one notification (e.g. "READY=1", "STATUS=leading report").
    /// Failures are logged, never fatal: the daemon works without systemd.
    /// Never blocks: it runs on the async runtime, and a listener that stops
    /// reading must not stall the daemon (a message that does not fit in
    /// the socket's queue is dropped).
    pub fn send(&self, state: &str) {
        let Some(path) = &self.socket else { return };
        match send_to(path, state) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tracing::debug!(socket = %path.display(), "notify socket full; dropped {state}");
            }
            Err(e) => {
                tracing::warn!(error = %e, socket = %path.display(), "cannot notify systemd")
            }
        }
    }
}

fn send_to(path: &std::path::Path, msg: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    let bytes = path.as_os_str().as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // Abstract socket namespace (Linux).
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(msg.as_bytes(), &addr)?;
    } else {
        sock.send_to(msg.as_bytes(), path)?;
    }
    Ok(())
}

/// READY=1 once every election made its first observation, STATUS= on every
/// leadership change, WATCHDOG=1 while every campaign loop makes progress.
pub(crate) async fn report_states(
    notifier: Notifier,
    mut states: Vec<StateView>,
    primary: String,
    clock: Clock,
) {
    if !notifier.enabled() {
        return;
    }
    for s in states.iter_mut() {
        let _ = s.wait_for(|st| st.first_observation_done).await;
    }
    notifier.send("READY=1");
    let mut last_status = String::new();
    let watchdog = notifier.watchdog();
    let tick = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 3).max(Duration::from_millis(100))
    });
    loop {
        let now = clock.now();
        let status = states
            .iter()
            .map(|s| {
                let st = s.borrow();
                if st.is_leader_at(now) {
                    format!(
                        "leader of {} (fencing token {})",
                        st.election,
                        st.fencing_token.unwrap_or(0)
                    )
                } else {
                    format!(
                        "follower of {} (leader: {})",
                        st.election,
                        st.leader.as_deref().unwrap_or("none")
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        if status != last_status {
            notifier.send(&format!("STATUS={status}"));
            last_status = status;
        }
        if watchdog.is_some() {
            // A wedged campaign loop stops the watchdog pings, and systemd
            // restarts the unit.
            let fresh = states.iter().all(|s| {
                let st = s.borrow();
                now - st.heartbeat
                    < Duration::from_millis(st.tenure.as_ref().map_or(30_000, |t| t.lease_ms * 2))
            });
            if fresh {
                notifier.send("WATCHDOG=1");
            }
        }
        let primary_rx = states.iter_mut().find(|s| s.borrow().election == primary);
        match primary_rx {
            Some(rx) => {
                let _ = tokio::time::timeout(tick, rx.changed()).await;
            }
            None => tokio::time::sleep(tick).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_that_stops_reading_never_blocks_a_send() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let _listener = UnixDatagram::bind(&path).expect("bind");
        let notifier = Notifier {
            socket: Some(path),
            watchdog: None,
        };
        // Far more than a datagram socket queues: a blocking send would hang.
        let t0 = std::time::Instant::now();
        for _ in 0..5_000 {
            notifier.send("WATCHDOG=1");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
    }
}
