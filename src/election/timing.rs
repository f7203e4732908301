//! The timing rules an election's settings must keep, the one place
//! they are written: checked as the configuration is built, with an error
//! that names the values. The core takes them as given.

use std::time::Duration;

use crate::core::election::ElectionConfig;
use crate::text;

impl ElectionConfig {
    /// Check the timing rules, the one place they are written: every
    /// interval above zero, D in [0, 0.5), R < L, and the invariant
    /// R + G + M + L·D < L, without which a leader could still be running its
    /// job when a follower's wait ends.
    pub fn validate(&self) -> Result<(), TimingError> {
        let l = self.lease_duration;
        if l.is_zero() || self.renew_interval.is_zero() || self.retry_interval.is_zero() {
            return Err(TimingError::Zero);
        }
        check_drift(self.max_clock_drift)?;
        if self.renew_interval >= l {
            return Err(TimingError::RenewNotShorter {
                renew: self.renew_interval,
                lease: l,
            });
        }
        let drift = l.mul_f64(self.max_clock_drift);
        let sum = self.renew_interval + self.kill_grace + self.safety_margin + drift;
        if sum >= l {
            return Err(TimingError::Invariant {
                renew: self.renew_interval,
                kill_grace: self.kill_grace,
                safety_margin: self.safety_margin,
                drift,
                lease: l,
            });
        }
        Ok(())
    }
}

/// D must be at least 0 and below 0.5.
pub fn check_drift(max_clock_drift: f64) -> Result<(), TimingError> {
    if (0.0..0.5).contains(&max_clock_drift) {
        Ok(())
    } else {
        Err(TimingError::Drift(max_clock_drift))
    }
}

/// A timing rule an election's settings break (see
/// [`ElectionConfig::validate`]); the message names the values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    /// The lease, renew or retry interval is zero.
    #[error("lease duration, renew_interval and retry_interval must be above zero")]
    Zero,
    /// D is outside [0, 0.5).
    #[error("max_clock_drift = {0} must be at least 0 and below 0.5")]
    Drift(f64),
    /// R ≥ L.
    #[error("renew_interval ({}) must be shorter than lease duration ({})", text::duration(*renew), text::duration(*lease))]
    RenewNotShorter {
        /// R.
        renew: Duration,
        /// L.
        lease: Duration,
    },
    /// R + G + M + L·D ≥ L.
    #[error(
        "timing invariant R + G + M + L·D < L violated: renew_interval {} + kill_grace {} + safety_margin {} + lease_duration·max_clock_drift {} = {} is not below lease_duration {}",
        text::duration(*renew),
        text::duration(*kill_grace),
        text::duration(*safety_margin),
        text::duration(*drift),
        text::duration(*renew + *kill_grace + *safety_margin + *drift),
        text::duration(*lease)
    )]
    Invariant {
        /// R.
        renew: Duration,
        /// G.
        kill_grace: Duration,
        /// M.
        safety_margin: Duration,
        /// L·D.
        drift: Duration,
        /// L.
        lease: Duration,
    },
}
