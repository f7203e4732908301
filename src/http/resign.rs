//! `POST /leader/{election}/resign`: ask this daemon to step down in one
//! election, and the admin-token check that guards it.
//!
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
//!
//! The handler only checks and forwards: the daemon steps down, and answers
//! on the [`ResignRequest`]'s channel (the command's types are
//! `crate::resign`'s, shared with the daemon).

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use http_body_util::{BodyExt, LengthLimitError};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio::time::Instant as Deadline;

use super::MAX_BODY_BYTES;
use super::error::{ApiError, bad_path, payload_too_large};
use super::router::{AppState, Shared};
use crate::resign::{ResignError, ResignRequest, Resigned};
use crate::text;

/// Resign bodies read at once; more wait for their turn within the
/// request's time. Resign is rare and its body a few bytes, but each
/// reader may hold up to [`MAX_BODY_BYTES`] plus its connection's buffer:
/// hundreds of authorised resigns sending big bodies at once must not add
/// up to hundreds of times that.
pub const RESIGN_READERS: usize = 4;

/// 503 `busy`: other resigns take all the daemon's time for them.
fn busy() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "earlier resign requests are still being handled; try again",
    )
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

/// `POST /leader/{election}/resign` (see the module's notes).
pub(super) async fn resign(
    State(app): State<Shared>,
    election: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    // Reading the body counts against the request's time too.
    let deadline = Deadline::now() + app.request_timeout;
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
    match order(&app, request.into_body(), &me, deadline).await {
        Ok(to) => step_down(&app, name, to, deadline).await,
        Err(e) => e.into_response(),
    }
}

/// The successor `body` names (see [`successor_of`]), read when one of the
/// [`RESIGN_READERS`] is free before `deadline` (503 `busy` otherwise).
async fn order(
    app: &AppState,
    body: Body,
    me: &str,
    deadline: Deadline,
) -> Result<Option<String>, ApiError> {
    let Ok(Ok(reading)) = tokio::time::timeout_at(deadline, app.resign_readers.acquire()).await
    else {
        return Err(busy());
    };
    let body = read_body(body).await;
    drop(reading);
    successor_of(&body?, me)
}

/// Hand the resign to the daemon and answer with how it went by
/// `deadline`.
async fn step_down(
    app: &AppState,
    name: String,
    to: Option<String>,
    deadline: Deadline,
) -> Response {
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
        Ok(Ok(outcome)) => answer_of(&name, to.as_deref(), outcome),
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

/// The answer to a resign of `election` the daemon has answered.
fn answer_of(election: &str, to: Option<&str>, outcome: Result<Resigned, ResignError>) -> Response {
    match outcome {
        Ok(how) => (
            StatusCode::OK,
            Json(ResignBody {
                election,
                status: "resigned",
                to,
                message: how.message(),
            }),
        )
            .into_response(),
        Err(e) => {
            let (status, code) = match e {
                ResignError::NotLeader(_) => (StatusCode::CONFLICT, "not_leader"),
                ResignError::InProgress { .. } => (StatusCode::CONFLICT, "resign_in_progress"),
                ResignError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
                ResignError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "resign_failed"),
            };
            ApiError::new(status, code, e.to_string()).into_response()
        }
    }
}
