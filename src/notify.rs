//! systemd's notify protocol (`Type=notify`): [`Notifier`] speaks it, and
//! [`report_states`] tells systemd what the elections do.
//!
//! The socket path is taken from `NOTIFY_SOCKET` once at start, and the
//! variable is removed from leaderd's environment before any thread starts, so
//! the child never inherits it (only leaderd speaks for the service).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Instant};
use crate::driver::board::StateView;

/// Where to send notifications, if systemd asked for them.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    socket: Option<PathBuf>,
    watchdog: Option<Duration>,
    /// The last send failed (other than a full queue): warned once, until
    /// a send works again.
    failing: Arc<AtomicBool>,
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
        Notifier {
            socket,
            watchdog,
            failing: Arc::default(),
        }
    }

    /// Whether systemd listens.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// The watchdog interval systemd asked for, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Send one notification (e.g. "READY=1", "STATUS=leading report");
    /// `false` only when systemd's queue was full and the message was
    /// dropped (worth sending again). Other failures are logged, never
    /// fatal: the daemon works without systemd. Never blocks: it runs on
    /// the async runtime, and a listener that stops reading must not stall
    /// the daemon.
    pub fn send(&self, state: &str) -> bool {
        let Some(path) = &self.socket else {
            return true;
        };
        match send_to(path, state) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(socket = %path.display(), "notifying systemd works again");
                }
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tracing::debug!(socket = %path.display(), "notify socket full; dropped {state}");
                false
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, socket = %path.display(), "cannot notify systemd");
                }
                true
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

/// After a message systemd's full queue dropped, the first wait before it is
/// sent again; each further drop doubles it, up to the watchdog's tick.
const RESEND_FIRST: Duration = Duration::from_millis(50);

/// READY=1 once every election made its first observation, STATUS= on every
/// leadership change, WATCHDOG=1 while every campaign loop makes progress.
///
/// systemd's notify socket queues few datagrams (`net.unix.max_dgram_qlen`,
/// 10 by default), and a send never blocks: READY=1 or a STATUS= that finds
/// the queue full is sent again shortly, never forgotten (else `systemctl
/// status` would show a role long past until the next change).
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
    let mut ready_told = false;
    let mut status_told = String::new();
    let watchdog = notifier.watchdog();
    let tick = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 3).max(Duration::from_millis(100))
    });
    let mut resend = RESEND_FIRST;
    loop {
        let now = clock.now();
        let status = status_line(&states, now);
        let mut dropped = false;
        if !ready_told {
            ready_told = notifier.send("READY=1");
            dropped |= !ready_told;
        }
        if ready_told && status != status_told {
            if notifier.send(&format!("STATUS={status}")) {
                status_told = status;
            } else {
                dropped = true;
            }
        }
        // A wedged campaign loop stops the watchdog pings, and systemd
        // restarts the unit.
        if watchdog.is_some() && all_fresh(&states, now) {
            notifier.send("WATCHDOG=1");
        }
        let wait = if dropped {
            let wait = resend;
            resend = (resend * 2).min(tick);
            wait
        } else {
            resend = RESEND_FIRST;
            tick
        };
        let primary_rx = states.iter_mut().find(|s| s.borrow().election == primary);
        match primary_rx {
            Some(rx) => {
                let _ = tokio::time::timeout(wait, rx.changed()).await;
            }
            None => tokio::time::sleep(wait).await,
        }
    }
}

/// `leader of E (fencing token T)` or `follower of E (leader: L)` for each
/// election, joined by `; `.
fn status_line(states: &[StateView], now: Instant) -> String {
    states
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
        .join("; ")
}

/// Whether every election's loop beat within two leases (30 s without one).
fn all_fresh(states: &[StateView], now: Instant) -> bool {
    states.iter().all(|s| {
        let st = s.borrow();
        now - st.heartbeat
            < Duration::from_millis(st.tenure.as_ref().map_or(30_000, |t| t.lease_ms * 2))
    })
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
            failing: Arc::default(),
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

    #[tokio::test]
    async fn a_status_that_finds_the_queue_full_is_sent_again_not_forgotten() {
        use crate::core::election::{ElectionState, Role};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let notifier = Notifier {
            socket: Some(path),
            watchdog: None,
            failing: Arc::default(),
        };
        // systemd busy: its queue full, so the next sends are dropped.
        while notifier.send("FILLER=1") {}
        let clock = Clock::tokio();
        let (board, view) =
            crate::driver::board::channel(ElectionState::example("report", "web-1", clock.now()));
        let task = tokio::spawn(report_states(
            notifier,
            vec![view],
            "report".into(),
            clock.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        board.send_replace(
            0,
            ElectionState::example("report", "web-1", clock.now()).in_tenure(
                Role::Leader,
                7,
                clock.now(),
            ),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        // systemd reads again: what was dropped arrives, in order.
        let mut told = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let mut buf = [0u8; 512];
        while std::time::Instant::now() < deadline
            && !told.iter().any(|m: &String| m.starts_with("STATUS="))
        {
            match listener.recv(&mut buf) {
                Ok(n) => {
                    let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if m != "FILLER=1" {
                        told.push(m);
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        task.abort();
        assert_eq!(
            told,
            ["READY=1", "STATUS=leader of report (fencing token 7)"],
            "READY=1 and the status that found the queue full are sent again"
        );
    }
}
