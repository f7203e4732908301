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

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on the boot-time clock, as the time elapsed since the clock's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(Duration);

impl Instant {
    /// The instant `d` after the clock's origin.
    pub const fn from_since_origin(d: Duration) -> Self {
        Instant(d)
    }

    /// Time since the clock's origin (for `CLOCK_BOOTTIME`: since boot).
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// `self - d`, never before the origin.
    pub fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d))
    }

    /// This instant rounded down to a multiple of `tick` since the origin
    /// (unchanged for a zero tick). Timers that round their deadlines down
    /// to a shared grid fire together: a daemon with many elections wakes
    /// once per tick instead of once per election.
    pub fn floor_to(self, tick: Duration) -> Instant {
        let tick_ns = tick.as_nanos();
        if tick_ns == 0 {
            return self;
        }
        let ns = self.0.as_nanos();
        let floored = ns - ns % tick_ns;
        Instant(Duration::from_nanos(
            u64::try_from(floored).unwrap_or(u64::MAX),
        ))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0 + rhs)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: an instant minus a later one is zero.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

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

/// Longest single sleep on the monotonic timer before the boot-time clock is
/// read again. tokio's timers run on `CLOCK_MONOTONIC`, which stops during
/// suspend; waking at least this often notices a suspend within this bound.
const MAX_SLEEP_SLICE: Duration = Duration::from_millis(250);

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
            Source::Tokio(origin) => Instant(tokio::time::Instant::now() - *origin),
        }
    }

    /// Sleep until `deadline` on this clock.
    pub async fn sleep_until(&self, deadline: Instant) {
        match &self.source {
            Source::Boot => loop {
                let left = deadline.saturating_since(boot_now());
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(MAX_SLEEP_SLICE)).await;
            },
            Source::Tokio(origin) => tokio::time::sleep_until(*origin + deadline.0).await,
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
    Instant(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32))
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

    #[test]
    fn floor_to_rounds_down_to_the_grid() {
        let at = |ms| Instant::from_since_origin(Duration::from_millis(ms));
        let tick = Duration::from_millis(50);
        assert_eq!(at(5_049).floor_to(tick), at(5_000));
        assert_eq!(at(5_050).floor_to(tick), at(5_050));
        assert_eq!(at(7).floor_to(tick), at(0));
        assert_eq!(at(7).floor_to(Duration::ZERO), at(7));
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
}
