//! Instants on the boot-time clock, as plain values. The core reads no
//! clock: its driver reads one (`crate::clock`) and hands it the instant.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_to_rounds_down_to_the_grid() {
        let at = |ms| Instant::from_since_origin(Duration::from_millis(ms));
        let tick = Duration::from_millis(50);
        assert_eq!(at(5_049).floor_to(tick), at(5_000));
        assert_eq!(at(5_050).floor_to(tick), at(5_050));
        assert_eq!(at(7).floor_to(tick), at(0));
        assert_eq!(at(7).floor_to(Duration::ZERO), at(7));
    }
}
