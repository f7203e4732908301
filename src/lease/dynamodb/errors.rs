//! Requests and their errors: time bounds, the retry of throttled requests,
//! and the classification of SDK errors into the store's error kinds, each
//! in one line; a call the IAM policy denies names its action.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use aws_sdk_dynamodb::config::StalledStreamProtectionConfig;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

use super::{CONNECT_TIMEOUT, MIN_ATTEMPT};
use crate::lease::StoreError;

// ---------------------------------------------------------------------------
// Requests: time bounds, throttling retry, error classification.

/// What every client of this store is set to: no SDK retries (this store
/// retries throttling by itself, within each request's budget), the connect
/// limit as the only SDK timeout, and no stalled-stream protection. Each
/// request is bounded by [`bounded`] rather than by a per-request config
/// override, which rebuilds the client's configuration layers on every call.
pub(super) fn lease_settings(
    builder: aws_sdk_dynamodb::config::Builder,
) -> aws_sdk_dynamodb::config::Builder {
    builder
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build(),
        )
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
}

/// Await an SDK request for at most `left`. The outer result is our own
/// timeout (nothing to inspect); the inner one is the SDK's answer. The
/// bound covers the whole call: credential resolution, connecting, sending
/// and reading the answer. A request cut off here is dropped with its
/// connection, so a late answer cannot be mistaken for another's.
pub(super) async fn bounded<T, E>(
    left: Duration,
    request: impl Future<Output = Result<T, SdkError<E>>>,
) -> Result<Result<T, SdkError<E>>, StoreError> {
    if left.is_zero() {
        // Nothing was sent, but there is no time to send anything either.
        return Err(StoreError::Timeout(left));
    }
    tokio::time::timeout(left, request)
        .await
        .map_err(|_| StoreError::Timeout(left))
}

/// Run `attempt` (given the time left) until it succeeds, fails with anything
/// but `Throttled`, or the next pause would leave less than [`MIN_ATTEMPT`] of
/// `budget`. Pauses grow exponentially with full jitter. Throttled requests
/// were not applied, so repeating them is always safe.
pub(super) async fn retry_throttled<T, F, Fut>(
    budget: Duration,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times();
    (|| attempt(deadline.saturating_duration_since(Instant::now())))
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| matches!(e, StoreError::Throttled(_)))
        .adjust(|_, pause| {
            let pause = pause?;
            let left = deadline.saturating_duration_since(Instant::now());
            (pause + MIN_ATTEMPT <= left).then_some(pause)
        })
        .notify(|e, pause| tracing::debug!(error = %e, ?pause, "throttled; retrying"))
        .await
}

/// The error code of a service error, if the server answered with one.
pub(super) fn service_code<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<&str> {
    match err {
        SdkError::ServiceError(se) => se.err().code(),
        _ => None,
    }
}

/// `Some(old item)` if a PutItem failed its condition; the old item itself is
/// there only if the server returned it.
pub(super) fn condition_failed(
    err: &SdkError<PutItemError>,
) -> Option<Option<&HashMap<String, AttributeValue>>> {
    match err {
        SdkError::ServiceError(se) => match se.err() {
            PutItemError::ConditionalCheckFailedException(e) => Some(e.item()),
            _ => None,
        },
        _ => None,
    }
}

/// A reason if this error says the server lacks the TTL API.
pub(super) fn ttl_unsupported<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<String> {
    match service_code(err) {
        Some(code @ ("UnknownOperationException" | "UnsupportedOperationException")) => Some(
            format!("the server does not implement the DynamoDB TTL API (it answered {code})"),
        ),
        _ => None,
    }
}

/// The DynamoDB operations this store calls: what a denied one names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    GetItem,
    PutItem,
    DeleteItem,
    BatchGetItem,
    Scan,
    DescribeTable,
    CreateTable,
    DescribeTimeToLive,
    UpdateTimeToLive,
}

impl Action {
    /// The action as IAM policies name it.
    pub(super) fn iam_name(self) -> &'static str {
        match self {
            Action::GetItem => "dynamodb:GetItem",
            Action::PutItem => "dynamodb:PutItem",
            Action::DeleteItem => "dynamodb:DeleteItem",
            Action::BatchGetItem => "dynamodb:BatchGetItem",
            Action::Scan => "dynamodb:Scan",
            Action::DescribeTable => "dynamodb:DescribeTable",
            Action::CreateTable => "dynamodb:CreateTable",
            Action::DescribeTimeToLive => "dynamodb:DescribeTimeToLive",
            Action::UpdateTimeToLive => "dynamodb:UpdateTimeToLive",
        }
    }
}

/// Map an SDK error of the request `action` to our classes. `budget` is
/// what the request was given.
pub(super) fn classify<E>(
    err: &SdkError<E>,
    action: Action,
    table: &str,
    budget: Duration,
) -> StoreError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    match err {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            match se.err().code() {
                Some(code) => {
                    classify_service(Some(code), se.err().message(), status, action, table)
                }
                // Not DynamoDB's JSON: maybe the XML error of AWS's query
                // APIs, which some servers and proxies answer with (moto
                // does for a denied call, with HTTP 403).
                None => {
                    let (code, message) = query_error(se.raw().body().bytes().unwrap_or_default());
                    classify_service(
                        code.as_deref(),
                        se.err().message().or(message.as_deref()),
                        status,
                        action,
                        table,
                    )
                }
            }
        }
        SdkError::TimeoutError(_) => StoreError::Timeout(budget),
        SdkError::DispatchFailure(df) => {
            if chain(err).any(is_credentials_error) {
                return StoreError::Credentials(describe(err));
            }
            if chain(err).any(is_connect_error) {
                // Nothing reached the server.
                return StoreError::Transport(describe(err));
            }
            match df.as_connector_error() {
                Some(c) if c.is_user() => StoreError::Other(describe(err)),
                Some(c) if c.is_timeout() => StoreError::Timeout(budget),
                // The connection broke after it was established: the request
                // may have been sent and applied. Only a read-back can tell.
                _ => StoreError::Server(format!(
                    "connection lost after sending the request (it may have been applied): {}",
                    describe(err)
                )),
            }
        }
        SdkError::ResponseError(re) => {
            let status = re.raw().status().as_u16();
            if status == 429 {
                StoreError::Throttled(format!("HTTP 429: {}", describe(err)))
            } else {
                // The server got the request; its answer was unreadable.
                StoreError::Server(format!(
                    "unreadable answer (HTTP {status}): {}",
                    describe(err)
                ))
            }
        }
        SdkError::ConstructionFailure(_) if chain(err).any(is_credentials_error) => {
            StoreError::Credentials(describe(err))
        }
        _ => StoreError::Other(describe(err)),
    }
}

/// Map a DynamoDB error code (and HTTP status) of the request `action` to
/// our classes.
fn classify_service(
    code: Option<&str>,
    message: Option<&str>,
    status: u16,
    action: Action,
    table: &str,
) -> StoreError {
    let text = match (code, message.map(one_line)) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_owned(),
        (None, Some(m)) => format!("HTTP {status}: {m}"),
        (None, None) => format!("HTTP {status}"),
    };
    match code.unwrap_or_default() {
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "Throttling"
        | "RequestLimitExceeded"
        | "TooManyRequestsException" => StoreError::Throttled(text),
        "ResourceNotFoundException" => StoreError::TableMissing(table.to_owned()),
        // Known credentials, but the policy does not allow this call.
        "AccessDeniedException" | "AccessDenied" => StoreError::Denied {
            action: action.iam_name(),
            table: table.to_owned(),
            detail: text,
        },
        "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "ExpiredTokenException"
        | "ExpiredToken"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "IncompleteSignatureException"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException" => StoreError::Credentials(text),
        "InternalServerError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "ServiceUnavailableException" => StoreError::Server(text),
        // The table's key is not `election` (S): no request can ever work.
        "ValidationException"
            if message.is_some_and(|m| m.contains("key element does not match the schema")) =>
        {
            StoreError::WrongSchema {
                table: table.to_owned(),
                detail: text,
            }
        }
        _ if status >= 500 => StoreError::Server(text),
        _ if status == 429 => StoreError::Throttled(text),
        // Forbidden, with no code that says otherwise: DynamoDB itself
        // answers a denied call with 400 and AccessDeniedException, so this
        // comes from a server or proxy in front of it.
        _ if status == 403 => StoreError::Denied {
            action: action.iam_name(),
            table: table.to_owned(),
            detail: text,
        },
        _ => StoreError::Other(text),
    }
}

/// The code and message of an error answer in the XML of AWS's query APIs
/// (`<ErrorResponse><Error><Code>…</Code><Message>…</Message>`), if that is
/// what `body` is.
fn query_error(body: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(text) = std::str::from_utf8(body) else {
        return (None, None);
    };
    if !text.trim_start().starts_with('<') {
        return (None, None);
    }
    let element = |tag: &str| {
        let (_, rest) = text.split_once(&format!("<{tag}>"))?;
        let (inner, _) = rest.split_once(&format!("</{tag}>"))?;
        Some(unescape_xml(inner.trim())).filter(|s| !s.is_empty())
    };
    (element("Code"), element("Message"))
}

/// XML's five predefined entities, replaced (`&amp;` last, so that an
/// escaped entity stays as written).
fn unescape_xml(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// An error and its sources. Steps into an `io::Error`'s payload, which
/// `io::Error::source` skips.
pub(super) fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|p| p as &(dyn StdError + 'static)),
        None => e.source(),
    })
}

/// One line for logs: each cause's message once, outermost first (the SDK's
/// own `DisplayErrorContext` appends a multi-line debug dump).
pub(super) fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in chain(err) {
        let text = one_line(&e.to_string());
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Text from the SDK or a server on one line: a log line is one line, even
/// for the credential chain's list of every provider it tried.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_credentials_error(e: &(dyn StdError + 'static)) -> bool {
    e.is::<aws_credential_types::provider::error::CredentialsError>()
}

/// Whether this error proves the connection was never established.
fn is_connect_error(e: &(dyn StdError + 'static)) -> bool {
    use std::io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable,
    };
    if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        return h.is_connect();
    }
    match e.downcast_ref::<std::io::Error>() {
        Some(io) => matches!(
            io.kind(),
            ConnectionRefused | AddrNotAvailable | NetworkUnreachable | HostUnreachable
        ),
        None => false,
    }
}
