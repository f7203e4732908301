//! The HTTP API: `/leader`, `/leader/{election}`, `/status`, `/healthz`,
//! `/metrics`, `POST /leader/{election}/resign` and the watch stream
//! `GET /v1/elections/{election}/watch`.
//!
//! The server is split by what each part guards:
//! - this module serves: the listener, the connection settings and limits
//!   (header-read and write timeouts, buffer size, how many connections),
//!   the limits every request passes (body size, time) and the bounded
//!   graceful shutdown;
//! - [`router`](fn@router) maps paths to handlers over the shared
//!   [`AppState`];
//! - `read`: the answers that only report state (`/leader`, `/status`,
//!   `/healthz`, `/metrics`) and the HTTP side of the watch stream, whose
//!   lines are `crate::watch`'s;
//! - `resign`: the one endpoint that changes anything, behind the admin
//!   token;
//! - [`ApiError`]: every error answer, JSON `{"error": "<stable code>",
//!   "message": "..."}`.
//!
//! Every request body is cut off at [`MAX_BODY_BYTES`], whatever its
//! encoding (`Content-Length` or chunked): 413 `payload_too_large`.

mod error;
mod read;
mod resign;
mod router;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::Limited;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;

pub use error::ApiError;
pub use resign::{RESIGN_READERS, ResignError, ResignRequest, Resigned};
pub use router::{AppState, DEFAULT_REQUEST_TIMEOUT, ElectionEntry, router, wedge_threshold};

/// The content type of the watch stream: newline-delimited JSON.
pub use crate::watch::wire::CONTENT_TYPE as WATCH_CONTENT_TYPE;

use crate::text;
use error::payload_too_large;
use router::Shared;

/// How long [`serve`] waits for open requests after the shutdown signal.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Largest request body accepted, by `Content-Length` or as it is read (a
/// chunked body is cut off there). Only resign reads a body, a few bytes of
/// JSON, so anything big is a mistake or an attack.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

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
