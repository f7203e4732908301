//! The one place that touches process signals (signal-hook).
//!
//! A dedicated thread receives signals with `signal_hook::iterator::Signals`
//! and hands them to the async side over a channel, so no signal handler ever
//! runs async code and a stalled runtime never loses a signal.

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

/// Signals leaderd acts on: SIGTERM/SIGINT shut down, the rest are forwarded
/// to the child.
pub const HANDLED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// Receives the signals sent to leaderd.
#[derive(Debug)]
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
    handle: signal_hook::iterator::Handle,
}

impl Signals {
    /// Install the handlers and start the receiving thread.
    pub fn install() -> std::io::Result<Signals> {
        let mut signals = signal_hook::iterator::Signals::new(HANDLED.iter().map(|s| *s as i32))?;
        let handle = signals.handle();
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("leaderd-signals".into())
            .spawn(move || {
                for raw in signals.forever() {
                    let Ok(sig) = Signal::try_from(raw) else {
                        continue;
                    };
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Signals { rx, handle })
    }

    /// The next signal; `None` once the signal thread ended.
    pub async fn recv(&mut self) -> Option<Signal> {
        self.rx.recv().await
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.handle.close();
    }
}

/// Whether `sig` asks leaderd to shut down.
pub fn is_shutdown(sig: Signal) -> bool {
    matches!(sig, Signal::SIGTERM | Signal::SIGINT)
}
