//! The router and the state every handler reads.
//!
//! [`AppState`] is built once by the daemon (or a test) from the engines'
//! `watch` receivers; [`router`] puts it behind an `Arc` and maps each
//! path to its handler: the read handlers ([`super::read`]), resign
//! ([`super::resign`]) and the watch stream. Every route runs inside the
//! request guard of [`super`] (body limit, request timeout,
//! `Cache-Control: no-store`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::routing::{get, post};
use axum::{Extension, Router};
use tokio::sync::{Semaphore, broadcast, mpsc, watch};

use super::error::ApiError;
use super::read::{
    Renders, healthz, leader_named, leader_primary, metrics_text, status, watch_daemon,
    watch_events,
};
use super::resign::{RESIGN_READERS, resign};
use super::{connection_limit, guard};
use crate::app_check::Verdict;
use crate::balance::{PriorityView, Share};
use crate::clock::{Clock, Instant};
use crate::driver::board::{EventView, StateView};
use crate::election::{ElectionConfig, LeaseEvent, SessionView};
use crate::metrics::Metrics;
use crate::resign::ResignRequest;
use crate::watch::watchers::Watchers;

/// Default for [`AppState::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One election as the HTTP server sees it.
#[derive(Debug, Clone)]
pub struct ElectionEntry {
    /// The engine's published state.
    pub state: StateView,
    /// `/healthz` fails when the campaign loop's heartbeat is older than
    /// this; see [`wedge_threshold`].
    pub wedged_after: Duration,
    /// What the watch stream sends; `None`: no stream for this election.
    pub events: Option<EventView>,
}

/// A heartbeat age past which an election's campaign loop counts as wedged:
/// 2 × lease duration + the request budget (the renew interval). The loop
/// beats at least once per renew interval plus one store request, so this
/// only trips on a loop that is really stuck.
pub fn wedge_threshold(cfg: &ElectionConfig) -> Duration {
    cfg.lease_duration * 2 + cfg.renew_interval
}

/// Everything the handlers read. Built once by the daemon; [`router`] shares
/// it behind an `Arc`.
#[derive(Debug)]
pub struct AppState {
    /// Every election by name.
    pub elections: BTreeMap<String, ElectionEntry>,
    /// The election behind `GET /leader`.
    pub primary: String,
    /// The clock leadership is judged on.
    pub clock: Clock,
    /// Rendered by `GET /metrics`.
    pub metrics: Arc<Metrics>,
    /// Enables `POST /leader/{election}/resign`; `None` or empty = disabled.
    pub admin_token: Option<String>,
    /// Where resign requests go; the daemon services them.
    pub resign: mpsc::Sender<ResignRequest>,
    /// `/healthz` fails when an election's store requests have been failing
    /// for longer than this since its last successful answer (or since
    /// `started_at` if there was none). `None` = not checked.
    pub store_timeout: Option<Duration>,
    /// When the daemon started, for `store_timeout` before the first answer.
    pub started_at: Instant,
    /// Longest a request may take; resign answers 202 when stepping down
    /// takes longer.
    pub request_timeout: Duration,
    /// The job's trouble, if any (it cannot start, it keeps crashing):
    /// `/healthz` fails while there is one. `None`: no job to watch.
    pub job_health: Option<watch::Receiver<Option<String>>>,
    /// The app check's verdict, shown by `/leader` and `/status`. `None`: no
    /// app check.
    pub app_check: Option<watch::Receiver<Verdict>>,
    /// Watch streams open at once: half the connection limit.
    pub watch_slots: Arc<Semaphore>,
    /// Resign bodies read at once: [`RESIGN_READERS`].
    pub resign_readers: Arc<Semaphore>,
    /// This daemon's share when `balance` is on, shown by `/status` and the
    /// metrics. `None`: balance is off.
    pub balance: Option<watch::Receiver<Share>>,
    /// What this daemon knows of priorities, shown by `/status`. `None`:
    /// no priority is configured.
    pub priority: Option<watch::Receiver<PriorityView>>,
    /// The daemon's session and L·(1−D) − M, shown by `/status`. `None`:
    /// sessions are off.
    pub session: Option<(watch::Receiver<Option<SessionView>>, Duration)>,
    /// What the elections tell their followers, all together, for the
    /// daemon's stream `GET /v1/watch` (with the session's writes). `None`:
    /// sessions are off, and there is no such stream.
    pub told: Option<broadcast::Sender<LeaseEvent>>,
    /// The sessions named by the daemons that hold `GET /v1/watch` open,
    /// for balance to look up. `None`: nobody looks them up.
    pub watchers: Option<Watchers>,
}

impl AppState {
    /// A state with no elections, no admin token, no store timeout and
    /// `started_at = clock.now()`.
    pub fn new(
        primary: impl Into<String>,
        clock: Clock,
        metrics: Arc<Metrics>,
        resign: mpsc::Sender<ResignRequest>,
    ) -> Self {
        AppState {
            elections: BTreeMap::new(),
            primary: primary.into(),
            started_at: clock.now(),
            clock,
            metrics,
            admin_token: None,
            resign,
            store_timeout: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            job_health: None,
            app_check: None,
            watch_slots: Arc::new(Semaphore::new((connection_limit() / 2).max(1))),
            resign_readers: Arc::new(Semaphore::new(RESIGN_READERS)),
            balance: None,
            priority: None,
            session: None,
            told: None,
            watchers: None,
        }
    }

    /// Show the daemon's session (valid `validity` after its last renew's
    /// send) in `/status`.
    pub fn with_session(
        mut self,
        session: watch::Receiver<Option<SessionView>>,
        validity: Duration,
    ) -> Self {
        self.session = Some((session, validity));
        self
    }

    /// Serve the daemon's stream `GET /v1/watch`: the session's writes
    /// (see [`Self::with_session`]) and every event on `told`; the
    /// sessions its watchers name go to `watchers` (balance's), if any.
    pub fn with_daemon_stream(
        mut self,
        told: broadcast::Sender<LeaseEvent>,
        watchers: Option<Watchers>,
    ) -> Self {
        self.told = Some(told);
        self.watchers = watchers;
        self
    }

    /// Show this daemon's share of the elections in `/status` and the
    /// metrics.
    pub fn with_balance(mut self, share: watch::Receiver<Share>) -> Self {
        self.balance = Some(share);
        self
    }

    /// Show what this daemon knows of priorities in `/status`.
    pub fn with_priority(mut self, view: watch::Receiver<PriorityView>) -> Self {
        self.priority = Some(view);
        self
    }

    /// Show the app check's verdict in `/leader` and `/status`.
    pub fn with_app_check(mut self, verdict: watch::Receiver<Verdict>) -> Self {
        self.app_check = Some(verdict);
        self
    }

    /// Watch the job's health: `/healthz` fails while it names a problem.
    pub fn with_job_health(mut self, health: watch::Receiver<Option<String>>) -> Self {
        self.job_health = Some(health);
        self
    }

    /// Add an election (named after its state's `election`).
    pub fn with_election(mut self, state: StateView, wedged_after: Duration) -> Self {
        let name = state.borrow().election.clone();
        self.elections.insert(
            name,
            ElectionEntry {
                state,
                wedged_after,
                events: None,
            },
        );
        self
    }

    /// Serve the watch stream of election `name` (added before) from
    /// `events`.
    pub fn with_watch(mut self, name: &str, events: EventView) -> Self {
        if let Some(entry) = self.elections.get_mut(name) {
            entry.events = Some(events);
        }
        self
    }

    /// Set the admin token (empty = disabled).
    pub fn with_admin_token(mut self, token: Option<String>) -> Self {
        self.admin_token = token;
        self
    }

    /// Set the store timeout checked by `/healthz`.
    pub fn with_store_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// The admin token, if resign is enabled.
    pub(super) fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.is_empty())
    }
}

/// The state as the handlers receive it.
pub(super) type Shared = Arc<AppState>;

/// The API's routes, with JSON 404/405 answers, a body size limit, a request
/// timeout and `Cache-Control: no-store` on every answer.
pub fn router(state: AppState) -> Router {
    let state: Shared = Arc::new(state);
    let renders = Renders::new(&state);
    Router::new()
        .route("/leader", get(leader_primary))
        .route("/leader/{election}", get(leader_named))
        .route("/leader/{election}/resign", post(resign))
        .route("/status", get(status))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .route("/v1/elections/{election}/watch", get(watch_events))
        .route("/v1/watch", get(watch_daemon))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(renders))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; try /leader, /leader/{election}, /status, /healthz or /metrics",
    )
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("method {method} is not allowed here; see the Allow header"),
    )
}
