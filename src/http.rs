//! The HTTP API: `/leader`, `/leader/{election}`, `/status`,
//! `/healthz`, `/metrics`, `POST /leader/{election}/resign` and the watch
//! stream `GET /v1/elections/{election}/watch`.
//!
//! Every answer is computed from the engines' current state (`watch`
//! receivers) and the clock at the moment of the request: `/leader` says 200
//! only while [`ElectionState::is_leader_at`] holds *now*, so an engine that
//! stalled past its stop time reads as not leading, never as a cached guess.
//!
//! Details of the answers:
//! - `leader_since` is the unix ms at which the current tenure was acquired,
//!   present only while this instance leads (null otherwise); `observed_at`
//!   is the unix ms of the last successful store answer.
//! - `fencing_token` is the token of the record as last observed: ours while
//!   leading, the holder's while following; null before the first read.
//! - `role` is the effective role at the time of the request: a published
//!   `leader` whose stop time has passed reads as `stopping`.
//! - Resign is a feature that does not exist unless an admin token is
//!   configured, so it answers 404 `resign_disabled` then (as Kubernetes does
//!   for APIs that are not enabled). With a token: no or malformed
//!   `Authorization: Bearer` → 401 with `WWW-Authenticate: Bearer`, wrong
//!   token → 403, and only then is the election looked up (so names are not
//!   probed without a token). Nothing of the body is read before the token
//!   is checked: a refused resign costs no memory whatever it sends. 200
//!   once the daemon has stepped down, 202 when it is still at it when the
//!   request's time is up; 409 `resign_in_progress` while an earlier resign
//!   is stepping down (the earlier one's `to` wins), 503 `shutting_down`
//!   after SIGTERM.
//! - Resign takes an optional JSON body `{"to": "IDENTITY"}`: the lease is
//!   handed to that candidate (see `Lease::handed_to`). An empty body, or
//!   none, hands it to whoever is fastest; any other JSON (an array, a
//!   string, `null`) is 400.
//! - Every request body is cut off at [`MAX_BODY_BYTES`], whatever its
//!   encoding (`Content-Length` or chunked): 413 `payload_too_large`.
//! - The watch stream (`crate::watch::server` writes it) needs no token: it
//!   tells what `/leader` tells, plus the record's `rvn`, which grants
//!   nothing without access to the store. At most half the connection limit
//!   are watches, so probes always find a connection.
//! - Errors are JSON `{"error": "<stable code>", "message": "..."}`; the codes
//!   are the `&'static str`s of [`ApiError`] constructors and never change.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_io_timeout::TimeoutStream;

use crate::app_check::Verdict;
use crate::balance::Share;
use crate::clock::{Clock, Instant};
use crate::election::{ElectionConfig, ElectionState, LeaseEvent, Role};
use crate::metrics::{self, Metrics};
use crate::text;
use crate::watch::server as watch_server;

/// How long [`serve`] waits for open requests after the shutdown signal.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Default for [`AppState::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest request body accepted, by `Content-Length` or as it is read (a
/// chunked body is cut off there). Only resign reads a body, a few bytes of
/// JSON, so anything big is a mistake or an attack.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Resign bodies read at once; more wait for their turn within the
/// request's time. Resign is rare and its body a few bytes, but each
/// reader may hold up to [`MAX_BODY_BYTES`] plus its connection's buffer:
/// hundreds of authorised resigns sending big bodies at once must not add
/// up to hundreds of times that.
pub const RESIGN_READERS: usize = 4;

/// Ask the daemon to step down in one election: stop the child, release the
/// lease, sit out one lease. The daemon answers on `done`.
#[derive(Debug)]
pub struct ResignRequest {
    /// The election to resign from (known to exist).
    pub election: String,
    /// The candidate to hand the lease to; `None`: whoever is fastest.
    pub to: Option<String>,
    /// How it stepped down once it has; why not otherwise.
    pub done: oneshot::Sender<Result<Resigned, ResignError>>,
}

/// How a resign stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resigned {
    /// The lease was released; this instance sits out one lease, then
    /// campaigns again.
    SittingOut,
    /// The daemon was told to shut down while it stepped down: the lease
    /// was released (to the resign's `to`) as it exited.
    Exiting,
}

impl Resigned {
    fn message(self) -> &'static str {
        match self {
            Resigned::SittingOut => "stepped down; sitting out one lease before campaigning again",
            Resigned::Exiting => {
                "stepped down; the lease was released as the daemon is shutting down"
            }
        }
    }
}

/// Why a resign did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResignError {
    /// This instance does not lead the election: nothing was changed.
    #[error("this instance does not lead election `{0}`; nothing was changed")]
    NotLeader(String),
    /// An earlier resign of the election is still stepping down: this one
    /// changed nothing, and the earlier one's successor stands.
    #[error(
        "an earlier resign of election `{election}` is still stepping down (handing the lease to {}); this one changed nothing",
        successor_text(.to)
    )]
    InProgress {
        /// The election.
        election: String,
        /// The earlier resign's successor.
        to: Option<String>,
    },
    /// The daemon is shutting down (it releases every lease as it exits):
    /// this resign changed nothing.
    #[error(
        "the daemon is shutting down and releases its leases as it exits; this resign changed nothing"
    )]
    ShuttingDown,
    /// Something else went wrong (one line).
    #[error("{0}")]
    Failed(String),
}

/// A resign's successor in a message.
fn successor_text(to: &Option<String>) -> String {
    to.as_deref()
        .map_or_else(|| "whoever is fastest".to_owned(), |to| format!("`{to}`"))
}

/// One election as the HTTP server sees it.
#[derive(Debug, Clone)]
pub struct ElectionEntry {
    /// The engine's published state.
    pub state: watch::Receiver<ElectionState>,
    /// `/healthz` fails when the campaign loop's heartbeat is older than
    /// this; see [`wedge_threshold`].
    pub wedged_after: Duration,
    /// What the watch stream sends; `None`: no stream for this election.
    pub events: Option<watch::Receiver<Option<LeaseEvent>>>,
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
        }
    }

    /// Show this daemon's share of the elections in `/status` and the
    /// metrics.
    pub fn with_balance(mut self, share: watch::Receiver<Share>) -> Self {
        self.balance = Some(share);
        self
    }

    /// Show the app check's verdict in `/leader` and `/status`.
    pub fn with_app_check(mut self, verdict: watch::Receiver<Verdict>) -> Self {
        self.app_check = Some(verdict);
        self
    }

    /// The view of `state` at `now`, with the app check's verdict.
    fn view(&self, state: &ElectionState, now: Instant) -> LeaderView {
        let mut view = LeaderView::of(state, now);
        view.app_check = self.app_check.as_ref().map(|rx| rx.borrow().as_str());
        view
    }

    /// Watch the job's health: `/healthz` fails while it names a problem.
    pub fn with_job_health(mut self, health: watch::Receiver<Option<String>>) -> Self {
        self.job_health = Some(health);
        self
    }

    /// Add an election (named after its state's `election`).
    pub fn with_election(
        mut self,
        state: watch::Receiver<ElectionState>,
        wedged_after: Duration,
    ) -> Self {
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
    pub fn with_watch(mut self, name: &str, events: watch::Receiver<Option<LeaseEvent>>) -> Self {
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

    fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.is_empty())
    }
}

/// An error answer: status plus `{"error": code, "message": ...}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'static str,
    message: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn unknown_election(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_election",
            format!(
                "no election named `{}` here",
                text::shorten(name, text::ECHO_CHARS)
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code,
            message: &self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

/// The body of `/leader` and of each election in `/status`.
#[derive(Debug, Serialize)]
struct LeaderView {
    election: String,
    identity: String,
    is_leader: bool,
    role: Role,
    leader: Option<String>,
    fencing_token: Option<u64>,
    lease_remaining_ms: u64,
    leader_since: Option<u64>,
    observed_at: Option<u64>,
    last_error: Option<String>,
    malformed: Option<String>,
    /// The app check's verdict; absent without an app check.
    #[serde(skip_serializing_if = "Option::is_none")]
    app_check: Option<&'static str>,
}

impl LeaderView {
    fn of(state: &ElectionState, now: Instant) -> Self {
        let is_leader = state.is_leader_at(now);
        let role = match state.role {
            Role::Leader if !is_leader => Role::Stopping,
            r => r,
        };
        LeaderView {
            election: state.election.clone(),
            identity: state.identity.clone(),
            is_leader,
            role,
            leader: state.leader.clone(),
            fencing_token: state.fencing_token,
            lease_remaining_ms: u64::try_from(state.lease_remaining(now).as_millis())
                .unwrap_or(u64::MAX),
            leader_since: state
                .tenure
                .as_ref()
                .filter(|_| is_leader)
                .map(|t| t.since_unix_ms),
            observed_at: state.observed_at_unix_ms,
            last_error: state.last_error.clone(),
            malformed: state.malformed.clone(),
            app_check: None,
        }
    }
}

type Shared = Arc<AppState>;

/// The API's routes, with JSON 404/405 answers, a body size limit, a request
/// timeout and `Cache-Control: no-store` on every answer.
pub fn router(state: AppState) -> Router {
    let state: Shared = Arc::new(state);
    Router::new()
        .route("/leader", get(leader_primary))
        .route("/leader/{election}", get(leader_named))
        .route("/leader/{election}/resign", post(resign))
        .route("/status", get(status))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .route("/v1/elections/{election}/watch", get(watch_events))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Bind the HTTP listener. An error names the address and says why in an
/// operator's words: the address is the operator's choice (taken, not ours
/// to use, not on this host), so it is a usage error, not an internal one.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => "the address is in use".to_owned(),
            std::io::ErrorKind::AddrNotAvailable => {
                "the address is not one of this host's".to_owned()
            }
            std::io::ErrorKind::PermissionDenied => {
                "permission denied (ports below 1024 need privileges)".to_owned()
            }
            _ => e.to_string(),
        };
        format!("cannot listen for HTTP on {addr}: {why}")
    })
}

/// How long a connection has to send a complete request head, counted from
/// when it opens and from the end of each answer: both the header-read
/// timeout (a half-sent request) and the idle timeout (a kept-alive
/// connection with nothing to ask).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long writing an answer may stall (a client that stops reading)
/// before the connection is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most a connection buffers of what it reads (and of an answer not yet
/// sent): a request head must fit (431 otherwise), and a body streams
/// through in pieces this big at most. hyper's default (about 400 KiB)
/// let each of hundreds of connections sending bodies fast hold that much.
pub const CONNECTION_BUFFER_BYTES: usize = 64 * 1024;

/// Most connections served at once; fewer when the process may open few
/// files (see [`connection_limit`]). A connection beyond the limit is
/// closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 512;

/// Descriptors kept for everything but HTTP: store connections, the SQLite
/// files, the job's guard socket and pipes, the runtime's own.
const RESERVED_FDS: u64 = 64;

/// Connections to serve at once: [`MAX_CONNECTIONS`], or half of what the
/// open-files limit leaves after [`RESERVED_FDS`], at least 4. Clients can
/// then never take the descriptors the lease store and the job need.
pub fn connection_limit() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let room = usize::try_from(soft.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX);
    room.clamp(4, MAX_CONNECTIONS)
}

/// Serve `router` on `listener` until `shutdown` completes, then stop
/// accepting and give open requests [`SHUTDOWN_DRAIN`] to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_drain(listener, router, shutdown, SHUTDOWN_DRAIN).await
}

/// [`serve`] with a chosen drain time: after `shutdown` completes, returns
/// once every connection is done or `drain` has passed, whichever is first,
/// so a slow client can never hold the daemon's exit.
///
/// Every connection gets [`HEADER_READ_TIMEOUT`] and [`WRITE_TIMEOUT`], and
/// at most [`connection_limit`] are open at once.
pub async fn serve_with_drain(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(connection_limit()));
    let connections = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(CONNECTION_BUFFER_BYTES);
    let mut accept_trouble = AcceptTrouble::default();
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    accept_trouble.cleared();
                    tcp
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was
                    // accepted: never a reason to stop serving, never a loop.
                    accept_trouble.failed(&e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Full: closed at once rather than queued behind idle clients.
            tracing::debug!("HTTP connection limit reached; closing a new connection");
            continue;
        };
        // Small answers: do not let Nagle hold them back. Failure only
        // costs latency.
        let _ = tcp.set_nodelay(true);
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(WRITE_TIMEOUT));
        let conn = http.serve_connection(
            TokioIo::new(Box::pin(io)),
            TowerToHyperService::new(router.clone()),
        );
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            // Timeouts and resets end connections all the time; nothing to log.
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = connections.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!(drain = %text::duration(drain), "HTTP connections still open after the drain time; closing them");
        }
    }
    Ok(())
}

/// Accept errors, logged once per change rather than once per attempt.
#[derive(Debug, Default)]
struct AcceptTrouble {
    last: Option<std::io::ErrorKind>,
    repeats: u64,
}

impl AcceptTrouble {
    fn failed(&mut self, e: &std::io::Error) {
        if self.last == Some(e.kind()) {
            self.repeats += 1;
            return;
        }
        tracing::warn!(error = %e, "cannot accept HTTP connections (logged again only when the error changes)");
        self.last = Some(e.kind());
        self.repeats = 1;
    }

    fn cleared(&mut self) {
        if self.last.take().is_some() {
            tracing::info!(failures = self.repeats, "accepting HTTP connections again");
        }
    }
}

/// 503 `busy`: other resigns take all the daemon's time for them.
fn busy() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "earlier resign requests are still being handled; try again",
    )
}

fn payload_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
    )
}

/// Runs around every request: rejects oversized bodies, bounds the time, and
/// forbids caching (leadership changes from one moment to the next).
///
/// A body announced bigger than [`MAX_BODY_BYTES`] is refused at once; any
/// other is wrapped so that reading past the limit fails (a chunked body
/// announces no length), whoever reads it.
async fn guard(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let too_big = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    let req = req.map(|body| Body::new(Limited::new(body, MAX_BODY_BYTES)));
    let mut res = if too_big {
        payload_too_large().into_response()
    } else {
        // One second over the request timeout: the resign handler answers
        // 202 at the timeout itself; this is the backstop for everything else.
        let limit = app.request_timeout + Duration::from_secs(1);
        match tokio::time::timeout(limit, next.run(req)).await {
            Ok(res) => res,
            Err(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "timeout",
                "the request took too long",
            )
            .into_response(),
        }
    };
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
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

fn bad_path(rejection: PathRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "bad_request",
        rejection.body_text(),
    )
}

fn leader_answer(app: &AppState, name: &str) -> Response {
    let Some(entry) = app.elections.get(name) else {
        return ApiError::unknown_election(name).into_response();
    };
    // Clone out at once: a held borrow would block the engine's next publish.
    let state = entry.state.borrow().clone();
    let view = app.view(&state, app.clock.now());
    let status = if view.is_leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(view)).into_response()
}

async fn leader_primary(State(app): State<Shared>) -> Response {
    leader_answer(&app, &app.primary)
}

async fn leader_named(
    State(app): State<Shared>,
    election: Result<Path<String>, PathRejection>,
) -> Response {
    match election {
        Ok(Path(name)) => leader_answer(&app, &name),
        Err(rejection) => bad_path(rejection).into_response(),
    }
}

/// Why `/healthz` fails, one line per problem; empty when healthy.
fn health_problems(app: &AppState, now: Instant) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(problem) = app.job_health.as_ref().and_then(|h| h.borrow().clone()) {
        problems.push(problem);
    }
    for (name, entry) in &app.elections {
        let state = entry.state.borrow().clone();
        if state.finished || entry.state.has_changed().is_err() {
            problems.push(format!("election `{name}`: campaign loop has ended"));
            continue;
        }
        let silent = now - state.heartbeat;
        if silent > entry.wedged_after {
            problems.push(format!(
                "election `{name}`: campaign loop wedged: no progress for {} (limit {})",
                text::duration(silent),
                text::duration(entry.wedged_after)
            ));
        }
        if let (Some(limit), Some(error)) = (app.store_timeout, &state.last_error) {
            let since = state.observed_at.unwrap_or(app.started_at);
            let down = now - since;
            if down > limit {
                problems.push(format!(
                    "election `{name}`: store unreachable for {} (limit {}; last error: {error})",
                    text::duration(down),
                    text::duration(limit)
                ));
            }
        }
    }
    problems
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<String>,
}

impl Health {
    fn of(problems: Vec<String>) -> Self {
        if problems.is_empty() {
            Health {
                status: "ok",
                error: None,
                message: None,
                problems,
            }
        } else {
            Health {
                status: "unhealthy",
                error: Some("unhealthy"),
                message: Some(problems.join("; ")),
                problems,
            }
        }
    }
}

async fn healthz(State(app): State<Shared>) -> Response {
    let health = Health::of(health_problems(&app, app.clock.now()));
    let status = if health.problems.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

#[derive(Serialize)]
struct StatusBody {
    primary: String,
    health: Health,
    /// The app check's verdict; absent without an app check.
    #[serde(skip_serializing_if = "Option::is_none")]
    app_check: Option<&'static str>,
    /// This daemon's share; absent when balance is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    balance: Option<Share>,
    elections: BTreeMap<String, LeaderView>,
}

async fn status(State(app): State<Shared>) -> Response {
    let now = app.clock.now();
    let elections = app
        .elections
        .iter()
        .map(|(name, entry)| {
            let state = entry.state.borrow().clone();
            (name.clone(), app.view(&state, now))
        })
        .collect();
    let body = StatusBody {
        primary: app.primary.clone(),
        health: Health::of(health_problems(&app, now)),
        app_check: app.app_check.as_ref().map(|rx| rx.borrow().as_str()),
        balance: app.balance.as_ref().map(|rx| rx.borrow().clone()),
        elections,
    };
    Json(body).into_response()
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    match app.metrics.render(
        app.elections.values().map(|e| &e.state),
        app.balance.as_ref().map(|rx| rx.borrow().clone()).as_ref(),
        &app.clock,
    ) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering metrics failed");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics_failed",
                format!("rendering metrics failed: {e}"),
            )
            .into_response()
        }
    }
}

/// The content type of the watch stream: newline-delimited JSON.
pub use crate::watch::wire::CONTENT_TYPE as WATCH_CONTENT_TYPE;

/// `GET /v1/elections/{election}/watch`: the events of this instance's
/// tenure, as they happen. Finds the election and takes a watch slot; the
/// stream itself is [`watch_server::respond`]'s.
async fn watch_events(
    State(app): State<Shared>,
    election: Result<Path<String>, PathRejection>,
) -> Response {
    let name = match election {
        Ok(Path(name)) => name,
        Err(rejection) => return bad_path(rejection).into_response(),
    };
    let Some(entry) = app.elections.get(&name) else {
        return ApiError::unknown_election(&name).into_response();
    };
    let Some(events) = entry.events.clone() else {
        return ApiError::unknown_election(&name).into_response();
    };
    let Ok(slot) = app.watch_slots.clone().try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_watches",
            "too many watch streams are open; poll the store instead",
        )
        .into_response();
    };
    let open = app.metrics.watch_stream_opened(&name);
    let leading = entry.state.borrow().is_leader_at(app.clock.now());
    watch_server::respond(&name, events, leading, (slot, open))
}

/// The bearer token of `headers`, or `None` when there is not exactly one
/// well-formed `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.to_str().ok()?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthorized() -> Response {
    let mut res = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "resign needs an `Authorization: Bearer <admin token>` header",
    )
    .into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"leaderd\""),
    );
    res
}

#[derive(Serialize)]
struct ResignBody<'a> {
    election: &'a str,
    status: &'static str,
    /// The successor named, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<&'a str>,
    message: &'static str,
}

/// The optional body of a resign.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResignOrder {
    /// The candidate to hand the lease to.
    to: Option<String>,
}

/// What a JSON value is, for a message.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The body of a request, read to its end; 413 past [`MAX_BODY_BYTES`]
/// (however it is sent), 400 when the client breaks off or garbles it.
/// Each piece is copied out as it arrives, so a body sent in many small
/// chunks holds no more than its own bytes.
async fn read_body(mut body: Body) -> Result<Vec<u8>, ApiError> {
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.into_inner().is::<LengthLimitError>() {
                payload_too_large()
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "the request body could not be read",
                )
            }
        })?;
        if let Ok(data) = frame.into_data() {
            if read.len() + data.len() > MAX_BODY_BYTES {
                return Err(payload_too_large());
            }
            read.extend_from_slice(&data);
        }
    }
    Ok(read)
}

/// The successor a resign's body names: `Ok(None)` for no body, an empty
/// one, or no `to`; an error answer for anything else that is not
/// `{"to": "IDENTITY"}` with a valid identity other than `me`.
fn successor_of(body: &[u8], me: &str) -> Result<Option<String>, ApiError> {
    if body.trim_ascii().is_empty() {
        return Ok(None);
    }
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message);
    let not_an_order = |why: String| {
        bad(format!(
            "the body must be empty or {{\"to\": \"IDENTITY\"}}: {why}"
        ))
    };
    // An object, and only an object: serde would also read a struct from a
    // sequence, taking `["B"]` for `{"to": "B"}`.
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| not_an_order(e.to_string()))?;
    if !value.is_object() {
        return Err(not_an_order(format!("found {}", json_kind(&value))));
    }
    let order = ResignOrder::deserialize(value).map_err(|e| not_an_order(e.to_string()))?;
    match order.to {
        None => Ok(None),
        Some(to) if !crate::config::is_valid_identity(&to) => Err(bad(format!(
            "\"to\" = {} is not an identity (printable text of 1 to 255 bytes)",
            text::echo(&to)
        ))),
        Some(to) if to == me => Err(bad(format!(
            "\"to\" = {} is this instance; name another candidate, or leave \"to\" out",
            text::echo(&to)
        ))),
        Some(to) => Ok(Some(to)),
    }
}

/// The refusal of a resign whose `headers` do not carry the admin token
/// (resign disabled, no token, a wrong one); `None` when they do. Decided
/// on the head alone.
fn refusal(app: &AppState, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = app.admin_token() else {
        return Some(
            ApiError::new(
                StatusCode::NOT_FOUND,
                "resign_disabled",
                "resign is disabled: no admin token is configured",
            )
            .into_response(),
        );
    };
    let Some(given) = bearer(headers) else {
        return Some(unauthorized());
    };
    // Constant time in the token's content (a length mismatch is still told
    // apart, which reveals only the length).
    if !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        return Some(
            ApiError::new(StatusCode::FORBIDDEN, "forbidden", "wrong admin token").into_response(),
        );
    }
    None
}

async fn resign(
    State(app): State<Shared>,
    election: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    // Reading the body counts against the request's time too.
    let deadline = tokio::time::Instant::now() + app.request_timeout;
    // The token first, from the head: the body of a request that is refused
    // is never read (a client without the token cannot make us buffer it).
    if let Some(refused) = refusal(&app, request.headers()) {
        return refused;
    }
    let name = match election {
        Ok(Path(name)) => name,
        Err(rejection) => return bad_path(rejection).into_response(),
    };
    let Some(entry) = app.elections.get(&name) else {
        return ApiError::unknown_election(&name).into_response();
    };
    let me = entry.state.borrow().identity.clone();
    let Ok(Ok(reading)) = tokio::time::timeout_at(deadline, app.resign_readers.acquire()).await
    else {
        return busy().into_response();
    };
    let body = read_body(request.into_body()).await;
    drop(reading);
    let body = match body {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let to = match successor_of(&body, &me) {
        Ok(to) => to,
        Err(e) => return e.into_response(),
    };

    let (done, answer) = oneshot::channel();
    let request = ResignRequest {
        election: name.clone(),
        to: to.clone(),
        done,
    };
    match tokio::time::timeout_at(deadline, app.resign.send(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the daemon is shutting down",
            )
            .into_response();
        }
        Err(_) => return busy().into_response(),
    }
    tracing::info!(election = %name, to = to.as_deref().unwrap_or("(anyone)"), "resign requested over HTTP");
    match tokio::time::timeout_at(deadline, answer).await {
        Ok(Ok(Ok(how))) => (
            StatusCode::OK,
            Json(ResignBody {
                election: &name,
                status: "resigned",
                to: to.as_deref(),
                message: how.message(),
            }),
        )
            .into_response(),
        Ok(Ok(Err(e))) => {
            let (status, code) = match e {
                ResignError::NotLeader(_) => (StatusCode::CONFLICT, "not_leader"),
                ResignError::InProgress { .. } => (StatusCode::CONFLICT, "resign_in_progress"),
                ResignError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
                ResignError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "resign_failed"),
            };
            ApiError::new(status, code, e.to_string()).into_response()
        }
        Ok(Err(_)) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the daemon stopped before it answered the resign",
        )
        .into_response(),
        Err(_) => (
            StatusCode::ACCEPTED,
            Json(ResignBody {
                election: &name,
                status: "in_progress",
                to: to.as_deref(),
                message: "stepping down is still in progress; watch /leader",
            }),
        )
            .into_response(),
    }
}
