//! What an election publishes (its role, tenure and what it last saw of
//! the store) and what it does after a release.

use std::time::Duration;

use crate::core::time::Instant;

/// Where this instance stands in one election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Not leading; polling the record.
    Follower,
    /// Created the item under `strict_new_lease`; renewing but not leading yet.
    Confirming,
    /// Leading, inside validity.
    Leader,
    /// Lost the lease or could not renew in time: the child must stop now and be
    /// killed by `Tenure::valid_until`. Not leading.
    Stopping,
}

/// One term of leadership.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenure {
    /// The fencing token of this tenure.
    pub fencing_token: u64,
    /// Unix ms when it began (for humans).
    pub since_unix_ms: u64,
    /// Boot-clock instant it began.
    pub since: Instant,
    /// The end of validity: the child must be dead by then.
    pub valid_until: Instant,
    /// `valid_until − G`: the stop signal is due then unless renewed.
    pub stop_at: Instant,
    /// Counts tenures in this process: a new number is a new tenure.
    pub seq: u64,
    /// Lease duration promised in the record, ms.
    pub lease_ms: u64,
}

/// The engine's published state.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ElectionState {
    /// Election name.
    pub election: String,
    /// Our identity.
    pub identity: String,
    /// Our role.
    pub role: Role,
    /// Present while `Leader`, `Confirming` or `Stopping`.
    pub tenure: Option<Tenure>,
    /// The holder as last observed (ourselves while leading).
    pub leader: Option<String>,
    /// The fencing token as last observed.
    pub fencing_token: Option<u64>,
    /// Boot instant of the last successful store answer.
    pub observed_at: Option<Instant>,
    /// Unix ms of the same, for humans.
    pub observed_at_unix_ms: Option<u64>,
    /// The class of the last store error, cleared by the next success.
    pub last_error: Option<String>,
    /// What is wrong with the stored record, if it is malformed.
    pub malformed: Option<String>,
    /// The stored record's format, as stored, when this build does not
    /// know it (see [`crate::core::record::FORMAT`]): it never writes that record.
    pub unknown_format: Option<String>,
    /// The session the record names as last observed (ours while leading
    /// through it); `None` for a record that is its own lease.
    pub session: Option<String>,
    /// Boot instant at which the campaign loop last made progress.
    pub heartbeat: Instant,
    /// True once the first read of the record has been answered.
    pub first_observation_done: bool,
    /// True once the task has ended (after a final release).
    pub finished: bool,
    /// Campaign rounds completed as a follower (read, and the acquisition
    /// attempt it allowed, if any). `--acquire-timeout 0` gives up after one.
    pub rounds: u64,
    /// While the leader's events reach this follower: the boot instant at
    /// which its watch stream counts as quiet (last event + R + P). `None`
    /// while it polls the store instead.
    pub hints_until: Option<Instant>,
}

impl Clone for ElectionState {
    fn clone(&self) -> ElectionState {
        ElectionState {
            election: self.election.clone(),
            identity: self.identity.clone(),
            role: self.role,
            tenure: self.tenure.clone(),
            leader: self.leader.clone(),
            fencing_token: self.fencing_token,
            observed_at: self.observed_at,
            observed_at_unix_ms: self.observed_at_unix_ms,
            last_error: self.last_error.clone(),
            malformed: self.malformed.clone(),
            unknown_format: self.unknown_format.clone(),
            session: self.session.clone(),
            heartbeat: self.heartbeat,
            first_observation_done: self.first_observation_done,
            finished: self.finished,
            rounds: self.rounds,
            hints_until: self.hints_until,
        }
    }

    /// Field by field, keeping the buffers of the strings: the driver
    /// publishes a changed state over the last one at every renewal of
    /// every election, and the names in it rarely change. (Each field is
    /// named, so a new one cannot be left out; as in `clone`'s literal.)
    fn clone_from(&mut self, source: &ElectionState) {
        let ElectionState {
            election,
            identity,
            role,
            tenure,
            leader,
            fencing_token,
            observed_at,
            observed_at_unix_ms,
            last_error,
            malformed,
            unknown_format,
            session,
            heartbeat,
            first_observation_done,
            finished,
            rounds,
            hints_until,
        } = source;
        self.election.clone_from(election);
        self.identity.clone_from(identity);
        self.role = *role;
        self.tenure.clone_from(tenure);
        self.leader.clone_from(leader);
        self.fencing_token = *fencing_token;
        self.observed_at = *observed_at;
        self.observed_at_unix_ms = *observed_at_unix_ms;
        self.last_error.clone_from(last_error);
        self.malformed.clone_from(malformed);
        self.unknown_format.clone_from(unknown_format);
        self.session.clone_from(session);
        self.heartbeat = *heartbeat;
        self.first_observation_done = *first_observation_done;
        self.finished = *finished;
        self.rounds = *rounds;
        self.hints_until = *hints_until;
    }
}

impl ElectionState {
    /// Whether we lead at `now`: role `Leader` and before the stop time. Callers
    /// pass the current clock reading so a stalled engine cannot make a stale
    /// state look valid.
    pub fn is_leader_at(&self, now: Instant) -> bool {
        self.role == Role::Leader && self.tenure.as_ref().is_some_and(|t| now < t.stop_at)
    }

    /// Whether this instance follows with the leader's events flowing at
    /// `now`, rather than polling the store.
    pub fn watching_leader_at(&self, now: Instant) -> bool {
        self.role != Role::Leader && self.hints_until.is_some_and(|until| now < until)
    }

    /// Validity left at `now` while leading, else zero.
    pub fn lease_remaining(&self, now: Instant) -> Duration {
        match &self.tenure {
            Some(t) if self.is_leader_at(now) => t.valid_until - now,
            _ => Duration::ZERO,
        }
    }
}

/// Made-up states for tests of what watches the engines (HTTP, metrics):
/// one place that builds them, so a new field is added once.
#[cfg(any(test, feature = "testing"))]
impl ElectionState {
    /// A follower of `election` as `identity` that last heard from the store
    /// at `now` (unix ms 1,700,000,000,000) and knows of no leader.
    pub fn example(election: &str, identity: &str, now: Instant) -> ElectionState {
        ElectionState {
            election: election.into(),
            identity: identity.into(),
            role: Role::Follower,
            tenure: None,
            leader: None,
            fencing_token: None,
            observed_at: Some(now),
            observed_at_unix_ms: Some(1_700_000_000_000),
            last_error: None,
            malformed: None,
            unknown_format: None,
            session: None,
            heartbeat: now,
            first_observation_done: true,
            finished: false,
            rounds: 1,
            hints_until: None,
        }
    }

    /// The same, seeing `leader` hold the lease under `token`.
    #[must_use]
    pub fn seeing(self, leader: &str, token: u64) -> ElectionState {
        ElectionState {
            leader: Some(leader.into()),
            fencing_token: Some(token),
            ..self
        }
    }

    /// The same, in `role` of a tenure begun at `since` under `token` with
    /// the default timing: a 10 s lease, valid for 9.7 s, stop at 7.7 s.
    #[must_use]
    pub fn in_tenure(self, role: Role, token: u64, since: Instant) -> ElectionState {
        let identity = self.identity.clone();
        ElectionState {
            role,
            tenure: Some(Tenure {
                fencing_token: token,
                since_unix_ms: 1_700_000_000_000,
                since,
                valid_until: since + Duration::from_millis(9_700),
                stop_at: since + Duration::from_millis(7_700),
                seq: 1,
                lease_ms: 10_000,
            }),
            ..self.seeing(&identity, token)
        }
    }
}

/// What to do after a voluntary release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AfterRelease {
    /// End the election (it campaigns no more).
    Exit,
    /// Sit out this long, then campaign again.
    SitOut(Duration),
    /// Follow at once: the lease went to a named successor, which others
    /// wait for as if it were held.
    Follow,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_published_over_the_last_one_is_equal_and_keeps_its_strings() {
        let t0 = Instant::from_since_origin(Duration::from_secs(1));
        let mut published = ElectionState::example("report", "web-1", t0);
        published.session = Some("#session/web-1/n1".into());
        let mut next = ElectionState::example("report", "web-1", t0 + Duration::from_secs(5))
            .in_tenure(Role::Leader, 7, t0);
        next.session = Some("#session/web-1/n1".into());
        next.last_error = Some("throttled".into());
        let buffers = (published.election.as_ptr(), published.identity.as_ptr());
        published.clone_from(&next);
        assert_eq!(published, next);
        assert_eq!(published, next.clone());
        assert_eq!(
            (published.election.as_ptr(), published.identity.as_ptr()),
            buffers,
            "the names' buffers are kept"
        );
        // And back: fields that went away go away.
        let follower = ElectionState::example("report", "web-1", t0);
        published.clone_from(&follower);
        assert_eq!(published, follower);
    }
}
