//! The one clock leaderd decides with.
//!
//! Every local time that decides anything comes from a clock that
//! keeps counting while the machine is suspended (`CLOCK_BOOTTIME`), never the
//! wall clock. [`Instant`] is a point on that clock; it is comparable across
//! processes on the same host (the guard process uses the same numbers).
//!
//! Tests swap in [`Clock::tokio`], which reads tokio's clock so that
//! `tokio::time::pause()` and `advance()` drive the election engine without
//! real sleeps.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::watch;

pub use crate::core::time::Instant;

/// Where [`Instant`]s come from and how to sleep until one.
#[derive(Debug, Clone)]
pub struct Clock {
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Boot,
    Tokio(tokio::time::Instant),
}

/// How often the boot-time clock is compared with the monotonic one.
/// tokio's timers run on `CLOCK_MONOTONIC`, which stops during suspend: a
/// sleep on it alone would end late by the time the machine slept. One
/// thread per process checks this often and wakes every sleeper when the
/// two clocks drift apart (a suspend ended), so each sleeps until its own
/// deadline and a suspend is still noticed within this bound. (Before, each
/// sleeper woke this often: with a thousand elections, four thousand
/// wake-ups a second, most of a daemon's CPU at rest.)
const SUSPEND_CHECK: Duration = Duration::from_millis(250);

/// How far the boot-time clock must get ahead of the monotonic one between
/// two checks to count as a suspend (both run at the same rate otherwise;
/// this is only above the noise of reading them one after the other).
const SUSPEND_MIN: Duration = Duration::from_millis(5);

/// Moves each time the machine is seen to have been suspended; `None` if
/// the watching thread could not be started (then sleepers wake every
/// [`SUSPEND_CHECK`] themselves, as they did before).
fn suspends() -> Option<watch::Receiver<u64>> {
    static SUSPENDS: OnceLock<Option<watch::Sender<u64>>> = OnceLock::new();
    SUSPENDS
        .get_or_init(|| {
            let (tx, _) = watch::channel(0);
            let watcher = tx.clone();
            std::thread::Builder::new()
                .name("leaderd-suspend".into())
                .spawn(move || watch_suspends(&watcher, boot_ahead, SUSPEND_CHECK))
                .ok()
                .map(|_| tx)
        })
        .as_ref()
        .map(watch::Sender::subscribe)
}

/// How far `CLOCK_BOOTTIME` is ahead of `CLOCK_MONOTONIC`: the time the
/// machine spent suspended since boot.
fn boot_ahead() -> Duration {
    let monotonic = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32))
        .unwrap_or_default();
    boot_now().since_origin().saturating_sub(monotonic)
}

/// Every `every`, bump `tx` if `ahead` grew by [`SUSPEND_MIN`] or more.
/// Never returns.
fn watch_suspends(tx: &watch::Sender<u64>, ahead: impl Fn() -> Duration, every: Duration) {
    let mut last = ahead();
    loop {
        std::thread::sleep(every);
        let now = ahead();
        if now >= last + SUSPEND_MIN {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        last = now;
    }
}

impl Clock {
    /// The production clock: `CLOCK_BOOTTIME`.
    pub fn boot() -> Self {
        Clock {
            source: Source::Boot,
        }
    }

    /// A clock driven by tokio's (pausable) time, for tests.
    pub fn tokio() -> Self {
        Clock {
            source: Source::Tokio(tokio::time::Instant::now()),
        }
    }

    /// Now.
    pub fn now(&self) -> Instant {
        match &self.source {
            Source::Boot => boot_now(),
            Source::Tokio(origin) => {
                Instant::from_since_origin(tokio::time::Instant::now() - *origin)
            }
        }
    }

    /// Sleep until `deadline` on this clock.
    pub async fn sleep_until(&self, deadline: Instant) {
        match &self.source {
            Source::Boot => {
                let mut suspends = suspends();
                loop {
                    let left = deadline.saturating_since(boot_now());
                    if left.is_zero() {
                        return;
                    }
                    let Some(rx) = &mut suspends else {
                        tokio::time::sleep(left.min(SUSPEND_CHECK)).await;
                        continue;
                    };
                    tokio::select! {
                        () = tokio::time::sleep(left) => {}
                        changed = rx.changed() => if changed.is_err() {
                            // The watcher is gone: slice the sleep instead.
                            suspends = None;
                        },
                    }
                }
            }
            Source::Tokio(origin) => {
                tokio::time::sleep_until(*origin + deadline.since_origin()).await
            }
        }
    }

    /// Sleep for `d` on this clock.
    pub async fn sleep(&self, d: Duration) {
        let deadline = self.now() + d;
        self.sleep_until(deadline).await
    }

    /// Run `fut` until `deadline`; `None` when the deadline came first.
    pub async fn timeout_at<F: std::future::Future>(
        &self,
        deadline: Instant,
        fut: F,
    ) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = fut => Some(out),
            _ = self.sleep_until(deadline) => None,
        }
    }
}

/// `CLOCK_BOOTTIME` now.
pub fn boot_now() -> Instant {
    // clock_gettime(CLOCK_BOOTTIME) cannot fail on Linux >= 2.6.39 with a
    // valid clock id; fall back to the monotonic clock only to avoid a panic.
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .or_else(|_| nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC))
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    Instant::from_since_origin(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32))
}

/// Unix time in milliseconds, for lease attributes meant for humans and for the
/// floor of a fresh fencing token. Never used to decide who leads.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward() {
        let a = boot_now();
        std::thread::sleep(Duration::from_millis(5));
        let b = boot_now();
        assert!(b - a >= Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = Clock::tokio();
        let start = clock.now();
        clock.sleep(Duration::from_secs(3)).await;
        assert_eq!(clock.now() - start, Duration::from_secs(3));
        assert_eq!(
            clock
                .timeout_at(
                    clock.now() + Duration::from_secs(1),
                    std::future::pending::<()>()
                )
                .await,
            None
        );
    }

    #[test]
    fn the_watcher_tells_of_a_jump_of_the_boot_clock_and_of_nothing_else() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static AHEAD_MS: AtomicU64 = AtomicU64::new(1_000);
        let (tx, mut rx) = watch::channel(0);
        std::thread::spawn(move || {
            watch_suspends(
                &tx,
                || Duration::from_millis(AHEAD_MS.load(Ordering::SeqCst)),
                Duration::from_millis(5),
            )
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!rx.has_changed().unwrap(), "told of a suspend that was not");
        // Noise below the threshold is no suspend.
        AHEAD_MS.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!rx.has_changed().unwrap(), "told of 1 ms of noise");
        AHEAD_MS.fetch_add(30_000, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.has_changed().unwrap(), "a 30 s suspend not told");
        assert_eq!(*rx.borrow_and_update(), 1);
    }

    #[tokio::test]
    async fn a_boot_clock_sleep_is_woken_at_its_deadline_only() {
        use futures_util::task::{ArcWake, waker};
        use std::future::Future;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Wakes(AtomicUsize);
        impl ArcWake for Wakes {
            fn wake_by_ref(w: &Arc<Self>) {
                w.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = waker(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let clock = Clock::boot();
        let start = clock.now();
        let mut sleep = std::pin::pin!(clock.sleep(Duration::from_millis(1_500)));
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "woken before its deadline"
        );
        sleep.await;
        assert!(clock.now() - start >= Duration::from_millis(1_500));
    }
}
