//! The engine: one task per election that campaigns, renews, stops and
//! releases, publishing its state on a watch channel.

use super::*;

/// The leader's private view of its tenure.
#[derive(Debug, Clone)]
pub(super) struct Term {
    pub(super) lease: Lease,
    pub(super) last_send: Instant,
    pub(super) leads_from: Instant,
    pub(super) since: Instant,
    pub(super) seq: u64,
}

/// How an acquisition attempt ended.
pub(super) enum Attempt {
    /// The write applied: lead under this term (boxed: a term is large
    /// next to the other variants).
    Won(Box<Term>),
    /// Someone else wrote first: an answer, look again at once.
    Lost,
    /// A store error: pause before the next round.
    Failed,
}

/// What one follower round came to.
pub(super) enum Round {
    /// Nothing to take: look again at this instant.
    Wait(Instant),
    /// It tried to take the lease.
    Attempted(Attempt),
}

pub(super) enum Step {
    Follow,
    Lead(Term),
    /// Stop the child now; kill at the given instant; then follow.
    Stopping(Term, Instant),
    /// Sit out this long, then follow.
    SitOut(Duration),
    Exit,
}

pub(super) struct Engine {
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) cfg: ElectionConfig,
    pub(super) clock: Clock,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) state_tx: watch::Sender<ElectionState>,
    pub(super) commands: mpsc::Receiver<Command>,
    /// Times the record version the follower read last (the rvn, or
    /// `malformed:<fingerprint>` for a malformed item).
    pub(super) takeover: TakeoverTimer,
    /// rvns we wrote or may have written (an unanswered write): finding one of
    /// these in the record means nobody else wrote since, so we may take it
    /// back at once.
    pub(super) own_rvns: Vec<String>,
    /// Highest fencing token seen in this process, to keep tokens increasing
    /// across deletion of the item.
    pub(super) last_token: Option<u64>,
    pub(super) tenure_seq: u64,
    pub(super) warned_malformed: Option<String>,
    /// Store errors, logged once per change.
    pub(super) errors: ErrorLog,
    /// The follower's pause after a round that failed with a store error.
    pub(super) retry: Retry,
    /// Moves when the store notices its data was replaced under it.
    pub(super) store_changes: Option<watch::Receiver<u64>>,
    /// The app check's verdict: campaign only while it passes. `None`: no
    /// app check, always campaign.
    pub(super) gate: Option<watch::Receiver<Verdict>>,
    /// The follower's view of the leader's watch stream.
    pub(super) hints: Hints,
    /// What the leader tells its followers.
    pub(super) events: watch::Sender<Option<LeaseEvent>>,
    /// When the last read of the record was answered (or failed).
    pub(super) last_read: Instant,
    /// When that read was sent.
    pub(super) last_read_sent: Instant,
}

/// Resolves once a closed gate opens; never for an open gate or none, so
/// that it wakes a waiting follower exactly when it may campaign again.
pub(super) async fn gate_opened(gate: &mut Option<watch::Receiver<Verdict>>) {
    match gate {
        Some(g) if *g.borrow() != Verdict::Pass => {
            if g.wait_for(|v| *v == Verdict::Pass).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

/// Resolves when the store's change counter moves; never without one.
pub(super) async fn store_changed(changes: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = changes
        && rx.changed().await.is_ok()
    {
        return;
    }
    // No counter, or its store is gone: nothing will ever change.
    std::future::pending().await
}

/// The follower's pause after a failed round: the retry interval P at
/// first, doubling up to 4·P, each pause drawn from `[d, 2d)` so that
/// instances that failed together do not retry together.
#[derive(Debug)]
pub(super) struct Retry {
    pub(super) retry_interval: Duration,
    pub(super) pauses: backon::ExponentialBackoff,
}

impl Retry {
    pub(super) fn new(retry_interval: Duration) -> Retry {
        use backon::BackoffBuilder;
        Retry {
            retry_interval,
            pauses: backon::ExponentialBuilder::default()
                .with_min_delay(retry_interval)
                .with_max_delay(retry_interval * 4)
                .with_jitter()
                .without_max_times()
                .build(),
        }
    }

    pub(super) fn next_pause(&mut self) -> Duration {
        self.pauses.next().unwrap_or(self.retry_interval * 4)
    }

    pub(super) fn reset(&mut self) {
        *self = Retry::new(self.retry_interval);
    }
}

impl Engine {
    pub(super) async fn run(mut self, delay: Duration) {
        let mut step = Step::Follow;
        if !delay.is_zero()
            && let Some(decided) = self.wait_follower(self.clock.now() + delay).await
        {
            step = decided;
        }
        loop {
            step = match step {
                Step::Follow => self.follow().await,
                Step::Lead(term) => self.lead(term).await,
                Step::Stopping(term, kill_at) => self.stopping(term, kill_at).await,
                Step::SitOut(d) => self.sit_out(d).await,
                Step::Exit => break,
            };
        }
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
            s.finished = true;
        });
    }

    pub(super) fn name(&self) -> &str {
        &self.cfg.name
    }

    pub(super) fn beat(&self) {
        let now = self.clock.now();
        self.state_tx.send_modify(|s| s.heartbeat = now);
    }

    pub(super) fn remember_own(&mut self, rvn: &str) {
        self.own_rvns.push(rvn.to_owned());
        if self.own_rvns.len() > 4 {
            self.own_rvns.remove(0);
        }
    }

    pub(super) fn note_token(&mut self, token: u64) {
        self.last_token = Some(self.last_token.map_or(token, |t| t.max(token)));
    }

    /// The token for a new tenure: above every token seen, and when there is no
    /// previous item, at least the unix ms so it also exceeds tokens of items
    /// deleted before this process started.
    pub(super) fn next_token(&self, previous: Option<u64>) -> u64 {
        let floor = self.last_token.map_or(0, |t| t + 1);
        match previous {
            Some(p) => (p + 1).max(floor),
            None => clock::unix_ms().max(floor),
        }
    }

    pub(super) fn store_error(&mut self, op: &'static str, e: &StoreError) {
        let kind = RequestKind::of(op);
        let now = self.clock.now();
        match self.errors.failed(kind, e.to_string(), now) {
            Some(0) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, op, error = %e, class = e.metric_label(), "store request failed (logged again only when the error changes)")
            }
            Some(previous) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, op, error = %e, class = e.metric_label(), previous_error_repeats = previous, "store request failed with another error")
            }
            None => {
                tracing::debug!(election = %self.name(), op, error = %e, "store request failed again")
            }
        }
        let label = e.metric_label().to_owned();
        self.state_tx.send_modify(|s| s.last_error = Some(label));
    }

    /// A store request of `op`'s kind was answered (a failed condition is an
    /// answer too).
    pub(super) fn store_answered(&mut self, op: &'static str) {
        let kind = RequestKind::of(op);
        if let Some(streak) = self.errors.succeeded(kind) {
            let failing = self.clock.now() - streak.since;
            tracing::info!(election = %self.name(), identity = %self.cfg.identity, failures = streak.count, failing_ms = failing.as_millis() as u64, "store {} work again", kind.plural());
        }
    }

    pub(super) fn observed_ok(
        &self,
        at: Instant,
        leader: Option<String>,
        token: Option<u64>,
        malformed: Option<String>,
    ) {
        let unix = clock::unix_ms();
        self.state_tx.send_modify(|s| {
            s.observed_at = Some(at);
            s.observed_at_unix_ms = Some(unix);
            s.last_error = None;
            s.first_observation_done = true;
            s.leader = leader;
            s.fencing_token = token;
            s.malformed = malformed;
        });
    }

    pub(super) async fn timed_read(&mut self) -> (Instant, Result<Record, StoreError>) {
        let start = self.clock.now();
        let res = self
            .store
            .read(self.name(), self.cfg.request_budget())
            .await;
        let end = self.clock.now();
        self.last_read_sent = start;
        self.last_read = end;
        let outcome = match &res {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(self.name(), "read", end - start, outcome);
        if res.is_ok() {
            self.store_answered("read");
        }
        (end, res)
    }

    pub(super) async fn timed_write(
        &mut self,
        op: &'static str,
        lease: &Lease,
        cond: &Condition,
        budget: Duration,
    ) -> Result<WriteOutcome, StoreError> {
        let start = self.clock.now();
        let res = self.store.write(lease, cond, budget).await;
        let outcome = match &res {
            Ok(WriteOutcome::Applied) => Outcome::Ok,
            Ok(WriteOutcome::ConditionFailed { .. }) => Outcome::Lost,
            Err(e) => Outcome::Failed(e),
        };
        self.observer
            .store_request(self.name(), op, self.clock.now() - start, outcome);
        if res.is_ok() {
            self.store_answered(op);
        }
        res
    }

    pub(super) fn new_lease(&self, token: u64, acquired_at_ms: u64) -> Lease {
        Lease::stamped(
            &self.cfg.name,
            &self.cfg.identity,
            token,
            self.cfg.lease_duration.as_millis() as u64,
            acquired_at_ms,
            self.cfg.holder_meta.clone(),
        )
    }

    /// Wait until `until` or a command; handles the command. Returns
    /// `Some(step)` if a command decided the next step.
    pub(super) async fn wait_follower(&mut self, until: Instant) -> Option<Step> {
        loop {
            tokio::select! {
                _ = self.clock.sleep_until(until) => return None,
                // May campaign again: look at the record now.
                _ = gate_opened(&mut self.gate) => return None,
                cmd = self.commands.recv() => {
                    if let Some(step) = Self::command_while_following(cmd) {
                        return Some(step);
                    }
                }
            }
        }
    }

    /// A command that reached a follower. Not leading: nothing to release,
    /// and a step-down (resign) changes nothing either; only an exit (or
    /// the handle dropped) ends the task.
    pub(super) fn command_while_following(cmd: Option<Command>) -> Option<Step> {
        match cmd {
            Some(Command::Release { then, done, .. }) => {
                let _ = done.send(false);
                (then == AfterRelease::Exit).then_some(Step::Exit)
            }
            None => Some(Step::Exit),
        }
    }

    /// A follower's wait between reads: until `poll_at`, or, while the
    /// leader's hints flow, until the next read they cannot spare (the
    /// takeover is due, the stream went quiet, or it is time to check the
    /// hints against the store), or until a hint asks for a read.
    pub(super) async fn wait_round(&mut self, poll_at: Instant) -> Option<Step> {
        let quiet = self.cfg.hint_quiet();
        loop {
            let now = self.clock.now();
            let until = self.hints.quiet_at(quiet);
            self.state_tx.send_if_modified(|s| {
                let changed = s.hints_until != until;
                s.hints_until = until;
                changed
            });
            // The end of the takeover wait of the rvn the store showed last:
            // hints never move it (only a read does), so whatever a stream
            // says, a lease left unchanged is read again then, and taken.
            let due = self.takeover.due();
            // Already read since it passed: back to the round's own schedule.
            let due = due.filter(|d| self.last_read < *d);
            let wake = if self.hints.flowing(now, quiet) && !self.hints.doubted() {
                // Past the due, the read waits for the next renewal the
                // stream tells of (so that it finds a fresh rvn, timed from
                // its hint), a slack at most.
                let due_read = due.map(|d| d + self.cfg.due_read_slack());
                let confirm = self.last_read + self.cfg.hint_confirm_interval();
                [due_read, self.hints.quiet_at(quiet), Some(confirm)]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(poll_at)
            } else {
                poll_at
            };
            let wake = self.hints.deferred_read().map_or(wake, |d| d.min(wake));
            tokio::select! {
                _ = self.clock.sleep_until(wake) => {
                    self.hints.waking(self.clock.now());
                    return None;
                }
                _ = gate_opened(&mut self.gate) => return None,
                hint = self.hints.next() => {
                    let now = self.clock.now();
                    match self.hints.take(hint, now, self.cfg.retry_interval) {
                        AfterHint::ReadNow => return None,
                        AfterHint::Renewed if due.is_some_and(|d| now >= d) => return None,
                        AfterHint::Renewed | AfterHint::Wait => {}
                    }
                }
                cmd = self.commands.recv() => {
                    if let Some(step) = Self::command_while_following(cmd) {
                        return Some(step);
                    }
                }
            }
        }
    }

    pub(super) fn after_release(then: AfterRelease) -> Step {
        match then {
            AfterRelease::Exit => Step::Exit,
            AfterRelease::SitOut(d) => Step::SitOut(d),
            AfterRelease::Follow => Step::Follow,
        }
    }

    pub(super) async fn sit_out(&mut self, d: Duration) -> Step {
        self.takeover.forget();
        let until = self.clock.now() + d;
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, sit_out = %text::duration(d), "sitting out before campaigning again");
        loop {
            self.beat();
            let slice = (self.clock.now() + self.cfg.retry_interval).min(until);
            if let Some(step) = self.wait_follower(slice).await {
                return step;
            }
            if self.clock.now() >= until {
                return Step::Follow;
            }
        }
    }

    pub(super) async fn follow(&mut self) -> Step {
        loop {
            self.beat();
            let (at, res) = self.timed_read().await;
            let round = match res {
                Err(e) => {
                    self.store_error("read", &e);
                    Round::Attempted(Attempt::Failed)
                }
                Ok(record) => self.consider(record, at).await,
            };
            let next_poll = match round {
                Round::Attempted(Attempt::Won(term)) => return Step::Lead(*term),
                // Someone else wrote since our read: read again at once.
                Round::Attempted(Attempt::Lost) => {
                    self.retry.reset();
                    self.clock.now()
                }
                // An error, not an answer: never retried in a loop.
                Round::Attempted(Attempt::Failed) => self.clock.now() + self.retry.next_pause(),
                Round::Wait(until) => {
                    self.retry.reset();
                    until
                }
            };
            self.state_tx.send_modify(|s| s.rounds += 1);
            if let Some(step) = self.wait_round(next_poll).await {
                return step;
            }
        }
    }

    /// One follower round after a successful read (answered at `at`): take
    /// the lease if it is free, or say when to look again.
    /// Whether the app check lets this instance campaign now.
    pub(super) fn may_campaign(&self) -> bool {
        self.gate
            .as_ref()
            .is_none_or(|g| *g.borrow() == Verdict::Pass)
    }

    pub(super) async fn consider(&mut self, record: Record, at: Instant) -> Round {
        let poll = at + self.cfg.retry_interval;
        match record {
            Record::Absent => {
                self.observed_ok(at, None, None, None);
                self.takeover.forget();
                self.hints.stop();
                if !self.may_campaign() {
                    return Round::Wait(poll);
                }
                let token = self.next_token(None);
                let lease = self.new_lease(token, clock::unix_ms());
                Round::Attempted(self.acquire("create", lease, Condition::NotExists).await)
            }
            Record::Valid(current) => {
                self.note_token(current.fencing_token);
                self.observed_ok(
                    at,
                    current.holder.clone(),
                    Some(current.fencing_token),
                    None,
                );
                let me = self.cfg.identity.clone();
                // Before the stream is judged: a stream found lying is
                // dropped with what it named, but an rvn cannot be named
                // before it was written, whoever named it.
                let learned = self.hints.learned_at(&current.rvn);
                let sent = self.last_read_sent;
                self.hints
                    .after_read(&current, &me, sent, at, self.cfg.hint_quiet());
                let ours = current.holder.as_deref() == Some(me.as_str())
                    && self.own_rvns.contains(&current.rvn);
                let expired = self.expired(&current.rvn, current.lease_ms, at, learned);
                // Released to anyone or to us; a lease handed to someone
                // else waits like a held one.
                let free = current.free_for(&me) || ours || expired;
                if free && !self.may_campaign() {
                    return Round::Wait(poll);
                }
                if free {
                    let token = self.next_token(Some(current.fencing_token));
                    let lease = self.new_lease(token, clock::unix_ms());
                    let cond = Condition::RvnIs(current.rvn.clone());
                    return Round::Attempted(self.acquire("take_over", lease, cond).await);
                }
                match self.takeover.due() {
                    // Wake exactly when the takeover becomes allowed.
                    Some(due) => Round::Wait(poll.min(due.max(at))),
                    None => Round::Wait(poll),
                }
            }
            Record::Malformed(m) => self.consider_malformed(m, at).await,
        }
    }

    pub(super) async fn consider_malformed(&mut self, m: Malformed, at: Instant) -> Round {
        self.hints.stop();
        if self.warned_malformed.as_deref() != Some(m.fingerprint.as_str()) {
            tracing::warn!(election = %self.name(), problem = %m.problem, "lease record is malformed; it will be overwritten only if it stays unchanged for a full lease");
            self.observer.malformed_record(self.name());
            self.warned_malformed = Some(m.fingerprint.clone());
        }
        if let Some(t) = m.fencing_token {
            self.note_token(t);
        }
        self.observed_ok(at, None, m.fencing_token, Some(m.problem.clone()));
        let key = format!("malformed:{}", m.fingerprint);
        let lease_ms = self.cfg.lease_duration.as_millis() as u64;
        if !self.expired(&key, lease_ms, at, None) || !self.may_campaign() {
            return Round::Wait(at + self.cfg.retry_interval);
        }
        // Treat an unreadable token as absent: unix ms keeps the new token
        // above any sane earlier one.
        let token = self
            .next_token(None)
            .max(m.fencing_token.map_or(0, |t| t + 1));
        let lease = self.new_lease(token, clock::unix_ms());
        tracing::warn!(election = %self.name(), "overwriting a malformed lease record that stayed unchanged for a full lease");
        Round::Attempted(
            self.acquire("take_over", lease, Condition::Unchanged(m.guard))
                .await,
        )
    }

    /// Time `key` (an rvn, as a read answered at `at` showed it, with the
    /// lease `lease_ms` its record promises; `learned`: when a hint named
    /// it, if earlier): true once it may be taken over. Only a store read
    /// calls this: a hint never starts, restarts or stretches the timer.
    pub(super) fn expired(
        &mut self,
        key: &str,
        lease_ms: u64,
        at: Instant,
        learned: Option<Instant>,
    ) -> bool {
        self.takeover.observe(key, lease_ms, at, learned) <= at
    }

    /// Try to start a tenure with `lease` under `cond`.
    pub(super) async fn acquire(
        &mut self,
        op: &'static str,
        lease: Lease,
        cond: Condition,
    ) -> Attempt {
        let send = self.clock.now();
        self.remember_own(&lease.rvn);
        let res = self
            .timed_write(op, &lease, &cond, self.cfg.request_budget())
            .await;
        match res {
            Ok(WriteOutcome::Applied) => {
                self.observer.acquire_attempt(self.name(), Outcome::Ok);
                self.note_token(lease.fencing_token);
                self.takeover.forget();
                self.tenure_seq += 1;
                let leads_from = if op == "create" && self.cfg.strict_new_lease {
                    send + self.cfg.takeover_wait(lease.lease_ms)
                } else {
                    send
                };
                let term = Term {
                    since: send,
                    leads_from,
                    last_send: send,
                    seq: self.tenure_seq,
                    lease,
                };
                Attempt::Won(Box::new(term))
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                self.observer.acquire_attempt(self.name(), Outcome::Lost);
                tracing::debug!(election = %self.name(), op, "acquisition lost the race");
                self.takeover.forget();
                Attempt::Lost
            }
            Err(e) => {
                self.observer
                    .acquire_attempt(self.name(), Outcome::Failed(&e));
                self.store_error(op, &e);
                Attempt::Failed
            }
        }
    }

    /// The published view of `term`, ending at `valid_until` and due to stop
    /// the child at `stop_at`.
    pub(super) fn tenure_of(term: &Term, valid_until: Instant, stop_at: Instant) -> Tenure {
        Tenure {
            fencing_token: term.lease.fencing_token,
            since_unix_ms: term.lease.acquired_at_ms,
            since: term.since,
            valid_until,
            stop_at,
            seq: term.seq,
            lease_ms: term.lease.lease_ms,
        }
    }

    pub(super) fn publish_term(&self, term: &Term, role: Role) {
        let valid_until = term.last_send + self.cfg.validity();
        let tenure = Self::tenure_of(
            term,
            valid_until,
            valid_until.saturating_sub(self.cfg.kill_grace),
        );
        let at = self.clock.now();
        let unix = clock::unix_ms();
        let me = self.cfg.identity.clone();
        // Followers hear of the write only after it succeeded.
        self.events.send_replace(Some(LeaseEvent::Renewed {
            election: self.cfg.name.clone(),
            holder: me.clone(),
            rvn: term.lease.rvn.clone(),
            fencing_token: term.lease.fencing_token,
            lease_ms: term.lease.lease_ms,
        }));
        self.state_tx.send_modify(|s| {
            s.role = role;
            s.tenure = Some(tenure);
            s.leader = Some(me);
            s.fencing_token = Some(term.lease.fencing_token);
            s.observed_at = Some(at);
            s.observed_at_unix_ms = Some(unix);
            s.last_error = None;
            s.malformed = None;
            s.first_observation_done = true;
            s.heartbeat = at;
            // Holding a tenure, it watches nobody: a stream it heard as a
            // follower must not count once it follows again (after a
            // resign's sit-out) until it hears one anew.
            s.hints_until = None;
        });
    }

    pub(super) async fn lead(&mut self, mut term: Term) -> Step {
        self.hints.stop();
        let mut role = if self.clock.now() < term.leads_from {
            Role::Confirming
        } else {
            Role::Leader
        };
        self.publish_term(&term, role);
        if role == Role::Leader {
            self.announce_gain(&term);
        }
        // Replacements noticed before this tenure's first write are old news:
        // that write went to what the store names now.
        if let Some(rx) = &mut self.store_changes {
            rx.borrow_and_update();
        }
        let mut next_renew = self.renew_due(term.last_send);
        loop {
            self.beat();
            let valid_until = term.last_send + self.cfg.validity();
            let stop_at = valid_until.saturating_sub(self.cfg.kill_grace);
            if role == Role::Confirming && self.clock.now() >= term.leads_from {
                role = Role::Leader;
                self.publish_term(&term, role);
                self.announce_gain(&term);
            }
            let wake = if role == Role::Confirming {
                next_renew.min(stop_at).min(term.leads_from)
            } else {
                next_renew.min(stop_at)
            };
            tokio::select! {
                _ = self.clock.sleep_until(wake) => {}
                cmd = self.commands.recv() => {
                    let (then, successor, done) = match cmd {
                        Some(Command::Release { then, successor, done }) => (then, successor, Some(done)),
                        None => (AfterRelease::Exit, None, None),
                    };
                    self.release(&term, role, successor).await;
                    if let Some(done) = done {
                        let _ = done.send(true);
                    }
                    return Self::after_release(then);
                }
                () = store_changed(&mut self.store_changes) => {
                    tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "the lease store's data was replaced under us; renewing at once to learn whether we still lead");
                    next_renew = self.clock.now();
                }
            }
            let now = self.clock.now();
            if now >= stop_at {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, cause = "no successful renew before validity - kill_grace", "lease lost: stopping the child");
                return Step::Stopping(term, valid_until);
            }
            if now < next_renew {
                continue;
            }
            // Renew. The request may not outlive the stop time: past it the
            // answer no longer matters to this tenure.
            let renewed = term.lease.renewed();
            let cond = Condition::HeldBy {
                rvn: term.lease.rvn.clone(),
                holder: self.cfg.identity.clone(),
            };
            self.remember_own(&renewed.rvn);
            let send = self.clock.now();
            let budget = self.cfg.request_budget().min(stop_at - send);
            let clock = self.clock.clone();
            let res = clock
                .timeout_at(stop_at, self.timed_write("renew", &renewed, &cond, budget))
                .await
                .unwrap_or(Err(StoreError::Timeout(budget)));
            match res {
                Ok(WriteOutcome::Applied) => {
                    self.observer.renew(self.name(), Outcome::Ok);
                    term.lease = renewed;
                    term.last_send = send;
                    next_renew = self.renew_due(send);
                    self.publish_term(&term, role);
                    tracing::debug!(election = %self.name(), fencing_token = term.lease.fencing_token, "renewed");
                }
                Ok(WriteOutcome::ConditionFailed { current }) => {
                    // An earlier renew whose answer was lost may have applied:
                    // the record then carries an rvn we wrote. Adopt it and
                    // renew again at once; validity still counts from the
                    // last write we know succeeded (the conservative choice).
                    let budget = self.cfg.request_budget().min(stop_at - self.clock.now());
                    let (current, ours) = self.record_after_conflict(current, &term, budget).await;
                    if let Some(rvn) = ours {
                        tracing::debug!(election = %self.name(), "an earlier renew had applied; continuing from it");
                        term.lease.rvn = rvn;
                        next_renew = self.clock.now();
                        continue;
                    }
                    self.observer.renew(self.name(), Outcome::Lost);
                    let by = match &current {
                        Some(Record::Valid(l)) => {
                            l.holder.clone().unwrap_or_else(|| "(released)".into())
                        }
                        Some(Record::Absent) => "(item deleted)".into(),
                        Some(Record::Malformed(m)) => format!("(malformed: {})", m.problem),
                        None => "(unknown)".into(),
                    };
                    tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, cause = "someone else wrote the lease record", written_by = %by, "lease lost: stopping the child");
                    self.takeover.forget();
                    let kill_at = (self.clock.now() + self.cfg.kill_grace).min(valid_until);
                    return Step::Stopping(term, kill_at);
                }
                Err(e) => {
                    self.observer.renew(self.name(), Outcome::Failed(&e));
                    self.store_error("renew", &e);
                    next_renew = self.clock.now() + self.cfg.retry_interval;
                }
            }
        }
    }

    /// When to renew after a write sent at `send`: R later, rounded down to
    /// a grid of R/20 shared by every election of this process. Only the
    /// first renewal of a tenure moves (earlier, by less than R/20, which
    /// is always safe); the later ones are R apart on the grid. Elections
    /// whose renewals fall in the same tick are renewed in one wake-up, and
    /// their requests and answers are handled in batches. At 1,000
    /// elections (started over one R, see daemon.rs) R/20 puts about 50
    /// renewals on a tick; the earlier R/100 grid with starts within one
    /// second cost about 25 % more CPU and twice the connections, and R/10
    /// saved nothing more (docs/benchmarks.md).
    pub(super) fn renew_due(&self, send: Instant) -> Instant {
        (send + self.cfg.renew_interval).floor_to(self.cfg.renew_interval / 20)
    }

    pub(super) fn announce_gain(&self, term: &Term) {
        self.observer.transition(self.name(), Transition::Gained);
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "became leader");
    }

    /// The record after a write of ours failed its condition: the one the
    /// store answered with, else read back within `budget` (`None` when that
    /// fails too). With it, the rvn to continue from when the record is
    /// still this tenure's: a renew whose answer was lost applied after all
    /// (our identity, this tenure's token, an rvn we wrote).
    pub(super) async fn record_after_conflict(
        &self,
        current: Option<Record>,
        term: &Term,
        budget: Duration,
    ) -> (Option<Record>, Option<String>) {
        let current = match current {
            Some(c) => Some(c),
            None => self.store.read(self.name(), budget).await.ok(),
        };
        let ours = match &current {
            Some(Record::Valid(l))
                if l.holder.as_deref() == Some(self.cfg.identity.as_str())
                    && l.fencing_token == term.lease.fencing_token
                    && self.own_rvns.contains(&l.rvn) =>
            {
                Some(l.rvn.clone())
            }
            _ => None,
        };
        (current, ours)
    }

    pub(super) async fn release(&mut self, term: &Term, role: Role, successor: Option<String>) {
        let released = term.lease.handed_to(successor.clone());
        let cond = Condition::HeldBy {
            rvn: term.lease.rvn.clone(),
            holder: self.cfg.identity.clone(),
        };
        // Not leading from here on, whatever the store answers.
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
            s.leader = None;
        });
        if role == Role::Leader {
            self.observer.transition(self.name(), Transition::Lost);
        }
        let budget = self.cfg.request_budget();
        let mut outcome = self.timed_write("release", &released, &cond, budget).await;
        let mut released_rvn = released.rvn.clone();
        // A renew whose answer was lost may have applied after all: the
        // record then carries an rvn we wrote. Release that one instead.
        if let Ok(WriteOutcome::ConditionFailed { current }) = &outcome
            && let (_, Some(rvn)) = self
                .record_after_conflict(current.clone(), term, budget)
                .await
        {
            let cond = Condition::HeldBy {
                rvn,
                holder: self.cfg.identity.clone(),
            };
            let again = term.lease.handed_to(successor.clone());
            outcome = self.timed_write("release", &again, &cond, budget).await;
            if outcome == Ok(WriteOutcome::Applied) {
                released_rvn = again.rvn.clone();
            }
        }
        match outcome {
            Ok(WriteOutcome::Applied) => {
                tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, successor = successor.as_deref().unwrap_or("(anyone)"), "released the lease");
                // Only now: a follower that acts on it finds it released.
                self.events.send_replace(Some(LeaseEvent::Released {
                    election: self.cfg.name.clone(),
                    rvn: released_rvn,
                    fencing_token: term.lease.fencing_token,
                    successor,
                }));
            }
            Ok(WriteOutcome::ConditionFailed { .. }) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "nothing to release: someone else wrote the lease record since our last write");
            }
            Err(e) => {
                tracing::warn!(election = %self.name(), identity = %self.cfg.identity, error = %e, "release failed; the lease will expire on its own");
            }
        }
        let told_release = matches!(*self.events.borrow(), Some(LeaseEvent::Released { .. }));
        if !told_release {
            self.tell_not_leader();
        }
        self.own_rvns.clear();
        self.takeover.forget();
    }

    /// Tell followers to look at the store: this instance no longer leads.
    pub(super) fn tell_not_leader(&self) {
        self.events.send_replace(Some(LeaseEvent::NotLeader {
            election: self.cfg.name.clone(),
        }));
    }

    pub(super) async fn stopping(&mut self, term: Term, kill_at: Instant) -> Step {
        // Stop now; the child must be dead by `kill_at`, never after validity.
        let valid_until = kill_at.min(term.last_send + self.cfg.validity());
        let tenure_state = Self::tenure_of(&term, valid_until, self.clock.now().min(valid_until));
        let was_leader = self.state_tx.borrow().role == Role::Leader;
        self.state_tx.send_modify(|s| {
            s.role = Role::Stopping;
            s.tenure = Some(tenure_state.clone());
        });
        if was_leader {
            self.observer.transition(self.name(), Transition::Lost);
        }
        self.tell_not_leader();
        loop {
            self.beat();
            let until = (self.clock.now() + self.cfg.retry_interval).min(tenure_state.valid_until);
            tokio::select! {
                _ = self.clock.sleep_until(until) => {}
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Release { then, successor, done }) => {
                        // The caller stopped the child; the record may still be
                        // ours, so release it if we can.
                        self.release(&term, Role::Stopping, successor).await;
                        let _ = done.send(true);
                        return Self::after_release(then);
                    }
                    None => return Step::Exit,
                },
            }
            if self.clock.now() >= tenure_state.valid_until {
                break;
            }
        }
        self.state_tx.send_modify(|s| {
            s.role = Role::Follower;
            s.tenure = None;
        });
        tracing::info!(election = %self.name(), identity = %self.cfg.identity, fencing_token = term.lease.fencing_token, "tenure ended; campaigning again");
        Step::Follow
    }
}
