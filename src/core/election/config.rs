//! An election's settings: its timing and identity, the built-in
//! defaults, and the intervals derived from them. The timing rules they
//! must keep are checked as the configuration is built
//! (`crate::election::timing`); the core takes them as given.

use std::time::Duration;

use crate::core::record::HolderMeta;

/// Timing and identity of one election.
#[derive(Debug, Clone, PartialEq)]
pub struct ElectionConfig {
    /// The election's name (the lease record's key).
    pub name: String,
    /// Our identity, written as `holder`.
    pub identity: String,
    /// L: the lease we promise to honour.
    pub lease_duration: Duration,
    /// R: how often the leader renews.
    pub renew_interval: Duration,
    /// P: follower poll and renew retry interval.
    pub retry_interval: Duration,
    /// G: time between the stop signal and the kill, before validity ends.
    pub kill_grace: Duration,
    /// D: the clock-rate drift we tolerate, as a fraction (0.01 = 1%).
    pub max_clock_drift: f64,
    /// M: margin subtracted from the leader's validity.
    pub safety_margin: Duration,
    /// After creating a missing item, wait the takeover wait of its lease
    /// (renewing) before leading.
    pub strict_new_lease: bool,
    /// Advertised in the lease record.
    pub holder_meta: Option<HolderMeta>,
}

/// The built-in timing: the defaults of the configuration's timing keys.
pub mod defaults {
    use std::time::Duration;

    /// L, `lease.duration`.
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);

    /// R, `lease.renew_interval`, for a lease of `lease_duration`: half of it.
    pub fn renew_interval(lease_duration: Duration) -> Duration {
        lease_duration / 2
    }
    /// P, `lease.retry_interval`.
    pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
    /// D, `lease.max_clock_drift`.
    pub const MAX_CLOCK_DRIFT: f64 = 0.01;
    /// M, `lease.safety_margin`.
    pub const SAFETY_MARGIN: Duration = Duration::from_millis(200);
    /// G, `child.kill_grace`.
    pub const KILL_GRACE: Duration = Duration::from_secs(2);
}

impl ElectionConfig {
    /// A config with the built-in defaults for everything but name and
    /// identity (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_defaults(name: impl Into<String>, identity: impl Into<String>) -> Self {
        ElectionConfig {
            name: name.into(),
            identity: identity.into(),
            lease_duration: defaults::LEASE_DURATION,
            renew_interval: defaults::renew_interval(defaults::LEASE_DURATION),
            retry_interval: defaults::RETRY_INTERVAL,
            kill_grace: defaults::KILL_GRACE,
            max_clock_drift: defaults::MAX_CLOCK_DRIFT,
            safety_margin: defaults::SAFETY_MARGIN,
            strict_new_lease: false,
            holder_meta: None,
        }
    }

    /// How many renew retries fit between a missed renew and the stop signal.
    /// Fewer than two is worth a warning: one slow answer then costs the lease.
    pub fn retries_that_fit(&self) -> u32 {
        let window = self
            .validity()
            .saturating_sub(self.kill_grace + self.renew_interval);
        (window.as_secs_f64() / self.retry_interval.as_secs_f64()).floor() as u32
    }

    /// L·(1−D) − M: how long a successful write keeps the leader valid.
    pub fn validity(&self) -> Duration {
        self.lease_duration
            .mul_f64(1.0 - self.max_clock_drift)
            .saturating_sub(self.safety_margin)
    }

    /// R + P: a watch stream that says nothing this long is taken for
    /// broken, and the follower polls every P again.
    pub fn hint_quiet(&self) -> Duration {
        self.renew_interval + self.retry_interval
    }

    /// While hints flow, the longest a follower goes without reading the
    /// store: 2·L. It reads sooner at the end of the takeover wait of the
    /// rvn it read last (see [`Self::due_read_slack`]), about once a lease.
    pub fn hint_confirm_interval(&self) -> Duration {
        self.lease_duration * 2
    }

    /// While hints flow, a follower past the takeover wait of the rvn it
    /// read last reads when the next renewal is told, or this much later
    /// at most: min(R, 2·P). Reading just after a renewal finds an rvn
    /// timed from its hint, so the next such read is a whole lease away
    /// (60/L reads a minute, 6 at the defaults); and a dead leader's lease
    /// is taken at most 2·P after its takeover wait ends, whatever the
    /// stream says.
    pub fn due_read_slack(&self) -> Duration {
        self.renew_interval.min(self.retry_interval * 2)
    }
}
