//! The HTTP API: `/leader`, `/leader/{election}`, `/status`, `/healthz`,
//! `/metrics`, `POST /leader/{election}/resign` and the watch stream
//! `GET /v1/elections/{election}/watch`.
//!
//! The server is split by what each part guards:
//! - this module serves, on a runtime of its own: the listener, the
//!   connection settings and limits (header-read and write timeouts,
//!   buffer size, how many connections), the limits every request passes
//!   (body size, time) and the bounded graceful shutdown;
//! - [`router`](fn@router) maps paths to handlers over the shared
//!   [`AppState`];
//! - `read`: the answers that only report state (`/leader`, `/status`,
//!   `/healthz`, `/metrics`) and the HTTP side of the watch stream, whose
//!   lines are `crate::watch`'s;
//! - `resign`: the one endpoint that changes anything, behind the admin
//!   token;
//! - `connections`: the open connections; when the table is full, the
//!   longest-idle one makes room;
//! - `render`: the big read answers, rendered once for all the requests
//!   waiting for them, on the HTTP runtime at lower CPU priority;
//! - `error` ([`ApiError`]): every error answer, JSON `{"error": "<stable
//!   code>", "message": "..."}`.
//!
//! Every request body is cut off at [`MAX_BODY_BYTES`], whatever its
//! encoding (`Content-Length` or chunked): 413 `payload_too_large`.

mod connections;
mod error;
mod read;
mod render;
mod resign;
mod router;

use std::future::Future;
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
use tokio_io_timeout::TimeoutStream;

pub use error::ApiError;
pub use resign::RESIGN_READERS;
pub use router::{AppState, DEFAULT_REQUEST_TIMEOUT, ElectionEntry, router, wedge_threshold};

/// The content type of the watch stream: newline-delimited JSON.
pub use crate::watch::wire::CONTENT_TYPE as WATCH_CONTENT_TYPE;

use crate::text;
use connections::Connections;
use error::{head_too_large, payload_too_large};
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

/// Largest request head (request line and headers) answered: a bigger one
/// gets 431 `headers_too_large`. hyper itself reads a head only as far as
/// its buffer goes ([`CONNECTION_BUFFER_BYTES`], which it may overrun by a
/// read) and answers a bare 431 beyond; between the two, this limit holds
/// exactly.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The size of `req`'s head as it was sent: the request line and every
/// header line with their line ends (as counted after parsing, so spacing
/// around a header's colon does not count).
fn head_bytes(req: &Request) -> usize {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let request_line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let headers: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    request_line + headers + 2
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

/// The HTTP server on a runtime of its own: a thread that serves, and
/// blocking threads for the big renders (see `render`). Nothing a client
/// asks, however much, takes CPU time from the runtime that renews the
/// leases, nor delays one of its timers: the two share no thread.
#[derive(Debug)]
pub struct Server {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Blocking threads of the HTTP runtime: one render of `/status` and one of
/// `/metrics` at most run at once (see `render`).
const RENDER_THREADS: usize = 2;

impl Server {
    /// Serve `router` on `listener` (bound on any runtime) from a runtime
    /// of its own, until [`Server::stop`].
    pub fn start(listener: TcpListener, router: Router) -> std::io::Result<Server> {
        let listener = listener.into_std()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(RENDER_THREADS)
            .thread_name("leaderd-http")
            .enable_all()
            .build()?;
        let stop = tokio_util::sync::CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = runtime.spawn(async move {
            // Registered with this runtime's reactor, not the caller's.
            let listener = TcpListener::from_std(listener)?;
            serve(listener, router, shutdown).await
        });
        Ok(Server {
            stop,
            task,
            runtime: Some(runtime),
        })
    }

    /// Stop accepting, give the connections still open [`SHUTDOWN_DRAIN`],
    /// and end the runtime.
    pub async fn stop(mut self) {
        self.stop.cancel();
        let drained = SHUTDOWN_DRAIN + Duration::from_secs(1);
        if let Ok(Ok(Err(e))) = tokio::time::timeout(drained, &mut self.task).await {
            tracing::warn!(error = %e, "the HTTP server failed");
        }
        self.end_runtime();
    }

    fn end_runtime(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Never waits: a render still running is left to finish alone.
            runtime.shutdown_background();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        self.end_runtime();
    }
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
/// at most [`connection_limit`] are open at once: when that many are, the
/// one idle the longest makes room for a new one (see `connections`).
pub async fn serve_with_drain(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let table = Connections::new(connection_limit());
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
        let Ok(conn) = table.admit() else {
            // Every connection is busy with a request: closed at once
            // rather than queued.
            tracing::debug!("HTTP connection limit reached; closing a new connection");
            continue;
        };
        // Small answers: do not let Nagle hold them back. Failure only
        // costs latency.
        let _ = tcp.set_nodelay(true);
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(WRITE_TIMEOUT));
        let service = connections::Tracked {
            router: router.clone(),
            conn: conn.clone(),
            table: table.clone(),
        };
        let served = connections.watch(http.serve_connection(
            TokioIo::new(Box::pin(io)),
            TowerToHyperService::new(service),
        ));
        let table = table.clone();
        tokio::spawn(async move {
            // Timeouts and resets end connections all the time; nothing to log.
            tokio::select! {
                _ = served => {}
                () = conn.closed() => {}
            }
            table.ended(&conn);
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
    if head_bytes(&req) > MAX_HEAD_BYTES {
        return head_too_large().into_response();
    }
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
