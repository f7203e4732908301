//! The read handlers: `GET /leader`, `/leader/{election}`, `/status`,
//! `/healthz` and `/metrics`, and the HTTP side of the watch stream.
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
//! - The watch stream (`crate::watch::server` writes it) needs no token: it
//!   tells what `/leader` tells, plus the record's `rvn`, which grants
//!   nothing without access to the store. At most half the connection limit
//!   are watches, so probes always find a connection.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Serialize;

use super::error::{ApiError, bad_path};
use super::render::{Rendered, SharedRender};
use super::router::{AppState, Shared};
use crate::balance::{PriorityView, Share};
use crate::clock::Instant;
use crate::election::{ElectionState, Role, SessionView};
use crate::metrics::{self, Metrics};
use crate::text;
use crate::watch::server as watch_server;

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
    /// The stored record's format when this build does not know it.
    unknown_format: Option<String>,
    /// The session the record names, if it is held through one.
    session: Option<String>,
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
            unknown_format: state.unknown_format.clone(),
            session: state.session.clone(),
            app_check: None,
        }
    }
}

/// The view of `state` at `now`, with the app check's verdict.
fn view(app: &AppState, state: &ElectionState, now: Instant) -> LeaderView {
    let mut view = LeaderView::of(state, now);
    view.app_check = app.app_check.as_ref().map(|rx| rx.borrow().as_str());
    view
}

fn leader_answer(app: &AppState, name: &str) -> Response {
    let Some(entry) = app.elections.get(name) else {
        return ApiError::unknown_election(name).into_response();
    };
    // Clone out at once: a held borrow would block the engine's next publish.
    let state = entry.state.borrow().clone();
    let view = view(app, &state, app.clock.now());
    let status = if view.is_leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(view)).into_response()
}

/// `GET /leader`: the primary election.
pub(super) async fn leader_primary(State(app): State<Shared>) -> Response {
    leader_answer(&app, &app.primary)
}

/// `GET /leader/{election}`.
pub(super) async fn leader_named(
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

/// `GET /healthz`: 200, or 503 with every problem found.
pub(super) async fn healthz(State(app): State<Shared>) -> Response {
    let health = Health::of(health_problems(&app, app.clock.now()));
    let status = if health.problems.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

/// `/status` but its elections, written first.
#[derive(Serialize)]
struct StatusHead<'a> {
    primary: &'a str,
    health: Health,
    /// The app check's verdict; absent without an app check.
    #[serde(skip_serializing_if = "Option::is_none")]
    app_check: Option<&'static str>,
    /// This daemon's share; absent when balance is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    balance: Option<Share>,
    /// Preferred leaders: this daemon's priorities and the members'; absent
    /// when no priority is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<PriorityView>,
    /// This daemon's own session; absent when sessions are off.
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionBody>,
}

/// `/status`'s `session`: the daemon's own session.
#[derive(Debug, Serialize)]
struct SessionBody {
    /// Whether one is open and valid now.
    open: bool,
    /// Its record's key, while open.
    key: Option<String>,
    /// How long the tenures held through it stay valid without another
    /// renew, ms.
    valid_for_ms: u64,
}

impl SessionBody {
    fn of(view: Option<&SessionView>, validity: Duration, now: Instant) -> SessionBody {
        let left = view.map_or(Duration::ZERO, |v| {
            (v.last_send + validity).saturating_since(now)
        });
        SessionBody {
            open: !left.is_zero(),
            key: view.filter(|_| !left.is_zero()).map(|v| v.key.clone()),
            valid_for_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The shared renders of `/status` and `/metrics` (see `super::render`).
#[derive(Debug, Clone)]
pub(super) struct Renders {
    status: Arc<SharedRender>,
    metrics: Arc<SharedRender>,
}

impl Renders {
    /// Renders of `app`'s answers.
    pub(super) fn new(app: &Shared) -> Renders {
        let (for_status, for_metrics) = (app.clone(), app.clone());
        // The last answer's length: the next is made in a buffer of about
        // that size from the start, not one doubled (and copied) as it
        // fills, which holds the old and the new at once at each step.
        // Before the first, a guess on the large side (an election takes
        // about 330 bytes): room never written to is never resident.
        let status_len = std::sync::atomic::AtomicUsize::new(app.elections.len() * 512 + 4096);
        Renders {
            status: SharedRender::new(move || render_status(&for_status, &status_len)),
            metrics: SharedRender::new(move || render_metrics(&for_metrics)),
        }
    }
}

/// An answer of `content_type` from a shared render, or 500 `code`.
fn rendered(
    body: Rendered,
    what: &str,
    code: &'static str,
    content_type: &'static str,
) -> Response {
    match body {
        Ok(bytes) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            bytes,
        )
            .into_response(),
        Err(e) => render_failed(what, code, &e),
    }
}

/// `GET /status`: health, and every election as `/leader` shows it.
pub(super) async fn status(Extension(renders): Extension<Renders>) -> Response {
    let body = renders.status.get().await;
    rendered(body, "/status", "status_failed", "application/json")
}

/// `/status` as it is now; `last_len`: the length of the last one made,
/// then of this one.
fn render_status(app: &AppState, last_len: &std::sync::atomic::AtomicUsize) -> Rendered {
    use std::sync::atomic::Ordering::Relaxed;
    let now = app.clock.now();
    let head = StatusHead {
        primary: &app.primary,
        health: Health::of(health_problems(app, now)),
        app_check: app.app_check.as_ref().map(|rx| rx.borrow().as_str()),
        balance: app.balance.as_ref().map(|rx| rx.borrow().clone()),
        priority: app.priority.as_ref().map(|rx| rx.borrow().clone()),
        session: app
            .session
            .as_ref()
            .map(|(rx, validity)| SessionBody::of(rx.borrow().as_ref(), *validity, now)),
    };
    // Room for the last answer's length and a sixteenth more (the roles
    // and leaders of an election vary in length a little).
    let last = last_len.load(Relaxed);
    let mut out = Vec::with_capacity(last + last / 16);
    // The head's object, left open for the elections.
    serde_json::to_writer(&mut out, &head).map_err(|e| e.to_string())?;
    out.pop();
    out.extend_from_slice(br#","elections":{"#);
    let mut comma = false;
    for (name, entry) in &app.elections {
        if comma {
            out.push(b',');
        }
        comma = true;
        // Read out at once: a held borrow would block the engine.
        let view = view(app, &entry.state.borrow(), app.clock.now());
        serde_json::to_writer(&mut out, name).map_err(|e| e.to_string())?;
        out.push(b':');
        serde_json::to_writer(&mut out, &view).map_err(|e| e.to_string())?;
    }
    out.extend_from_slice(b"}}");
    last_len.store(out.len(), Relaxed);
    Ok(Bytes::from(out))
}

/// 500 `code`: rendering `what` failed.
fn render_failed(what: &str, code: &'static str, e: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %e, "rendering {what} failed");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        code,
        format!("rendering {what} failed: {e}"),
    )
    .into_response()
}

/// `GET /metrics`: the Prometheus text format.
pub(super) async fn metrics_text(Extension(renders): Extension<Renders>) -> Response {
    let body = renders.metrics.get().await;
    rendered(body, "metrics", "metrics_failed", metrics::CONTENT_TYPE)
}

/// The metrics as they are now.
fn render_metrics(app: &AppState) -> Rendered {
    if let Some((rx, validity)) = &app.session {
        let body = SessionBody::of(rx.borrow().as_ref(), *validity, app.clock.now());
        app.metrics
            .set_session_valid(Duration::from_millis(body.valid_for_ms));
    }
    let share = app.balance.as_ref().map(|rx| rx.borrow().clone());
    let scrape = Metrics::scrape(
        app.metrics.clone(),
        app.elections.values().map(|e| &e.state),
        share.as_ref(),
        &app.clock,
    );
    let mut out = Vec::new();
    for piece in scrape {
        out.extend_from_slice(piece.map_err(|e| e.to_string())?.as_bytes());
    }
    Ok(Bytes::from(out))
}

/// `GET /v1/watch`: the daemon's stream, with sessions (its session's
/// writes and every election's events); 404 without sessions.
pub(super) async fn watch_daemon(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let (Some(told), Some((session, _))) = (&app.told, &app.session) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "sessions_off",
            "this instance runs without sessions: watch each election at /v1/elections/{election}/watch",
        )
        .into_response();
    };
    let Ok(slot) = app.watch_slots.clone().try_acquire_owned() else {
        return too_many_watches();
    };
    // The watcher's session, for balance: a name to look up in the store,
    // kept only while this stream is open.
    let named = headers
        .get(crate::watch::wire::SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|k| k.len() <= MAX_SESSION_KEY && crate::lease::is_session_key(k));
    let watcher = named
        .zip(app.watchers.as_ref())
        .map(|(key, w)| w.opened(key));
    let open = app
        .metrics
        .watch_stream_opened(crate::election::SESSION_LABEL);
    watch_server::respond_daemon(session.clone(), told.subscribe(), (slot, open, watcher))
}

/// The longest session key a watcher may name.
const MAX_SESSION_KEY: usize = 512;

fn too_many_watches() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_watches",
        "too many watch streams are open; poll the store instead",
    )
    .into_response()
}

/// `GET /v1/elections/{election}/watch`: the events of this instance's
/// tenure, as they happen. Finds the election and takes a watch slot; the
/// stream itself is [`watch_server::respond`]'s.
pub(super) async fn watch_events(
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
        return too_many_watches();
    };
    let open = app.metrics.watch_stream_opened(&name);
    let leading = entry.state.borrow().is_leader_at(app.clock.now());
    watch_server::respond(&name, events, leading, (slot, open))
}
