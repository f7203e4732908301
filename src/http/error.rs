//! Error answers: a status plus `{"error": "<stable code>", "message":
//! "..."}`. The codes are the `&'static str`s given to [`ApiError`]'s
//! constructors and never change; every handler answers its errors through
//! here, so they all look alike.

use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde::Serialize;

use super::{MAX_BODY_BYTES, MAX_HEAD_BYTES};
use crate::text;

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
    /// An answer of `status` with the stable `code` and a `message`.
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 404 `unknown_election`: no election `name` here.
    pub(super) fn unknown_election(name: &str) -> Self {
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

/// 413 `payload_too_large`: a body past [`MAX_BODY_BYTES`].
pub(super) fn payload_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
    )
}

/// 431 `headers_too_large`: a request head past [`MAX_HEAD_BYTES`].
pub(super) fn head_too_large() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
        format!("request heads (request line and headers) are limited to {MAX_HEAD_BYTES} bytes"),
    )
}

/// 400 `bad_request`: a path segment that cannot be read.
pub(super) fn bad_path(rejection: PathRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "bad_request",
        rejection.body_text(),
    )
}
