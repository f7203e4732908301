//! A fault-injection proxy for the DynamoDB HTTP endpoint, and (raw mode,
//! [`FaultProxy::start_raw`]) for any TCP protocol: PostgreSQL's.
//!
//! One `FaultProxy` sits between one leaderd and the emulator, so a test can
//! break the store traffic of a single instance (the leader, say) while the
//! others keep a healthy path. It understands just enough HTTP/1.1 to cut the
//! byte stream into requests and responses: faults apply per request, and the
//! operation (the `X-Amz-Target` suffix) can select which requests a fault
//! hits. Anything it does not break it forwards byte for byte, keep-alive
//! included: one upstream connection per client connection.
//!
//! The proxy runs on its own thread with its own tokio runtime, so it neither
//! depends on nor stalls the test's runtime (paused or not), and dropping it
//! closes every connection it holds.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What the proxy does to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Forward faithfully.
    None,
    /// Wait this long before forwarding the request (so a write lands late,
    /// which is the harder case for the sender's validity arithmetic).
    Latency(Duration),
    /// Read the request and never answer; the connection stays open (and
    /// silent) until the client gives up on it.
    Blackhole,
    /// Close the client connection abruptly (TCP RST); the request is not
    /// forwarded.
    Reset,
    /// This fraction (0.0..=1.0) of requests is swallowed like `Blackhole`;
    /// the rest are forwarded.
    DropFraction(f64),
    /// Answer `400 ProvisionedThroughputExceededException` as DynamoDB does;
    /// the request is not forwarded.
    Throttle,
    /// Answer `400 AccessDeniedException`, as DynamoDB does for a role whose
    /// policy lacks the operation; the request is not forwarded.
    AccessDenied,
    /// Answer `500 InternalServerError`; the request is not forwarded.
    Http500,
    /// Answer `503 ServiceUnavailable`; the request is not forwarded.
    Http503,
    /// Forward the request and wait for the emulator's answer (so the write
    /// is applied), then drop that answer and reset the client connection.
    ApplyThenLoseAnswer,
    /// Like `ApplyThenLoseAnswer`, but the client connection then hangs
    /// silently instead of being reset: the client sees a timeout.
    ApplyThenHang,
}

impl Fault {
    fn validate(&self) {
        if let Fault::DropFraction(f) = self {
            assert!(
                (0.0..=1.0).contains(f),
                "Fault::DropFraction takes a fraction in 0.0..=1.0, got {f}"
            );
        }
    }
}

/// Which fault applies to which operation.
struct Rules {
    all: Fault,
    per_operation: BTreeMap<String, Fault>,
}

impl Rules {
    fn fault_for(&self, operation: &str) -> Fault {
        self.per_operation
            .get(operation)
            .unwrap_or(&self.all)
            .clone()
    }
}

/// State shared between the test's handle and the proxy's tasks.
struct Shared {
    upstream: SocketAddr,
    /// Bytes, not HTTP requests: see [`FaultProxy::start_raw`].
    raw: bool,
    /// Raw, and the bytes are PostgreSQL's protocol in the clear: see
    /// [`FaultProxy::start_postgres`].
    postgres: bool,
    rules: Mutex<Rules>,
    counts: Mutex<BTreeMap<String, u64>>,
    rng: Mutex<StdRng>,
}

/// Locks a mutex even if a proxy task panicked while holding it: the data
/// (rules, counters, an RNG) stays meaningful after any partial update.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A TCP proxy on a free loopback port that injects store faults on demand.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (an emulator's HTTP address),
    /// forwarding faithfully until told otherwise.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        Self::start_with(upstream, false, false)
    }

    /// Starts a proxy that forwards the bytes of any TCP protocol (a
    /// PostgreSQL connection, TLS inside) in both directions, each chunk
    /// read from either side subject to the fault in force (per-operation
    /// rules do not apply; counts are of `connections` and of `chunks`
    /// from the client): `Latency` delays it; `Blackhole` swallows it and
    /// everything after on that connection, which stays open and silent
    /// (as does every new one while it lasts); `DropFraction` does so to
    /// that fraction of chunks and of new connections; `Reset` resets the
    /// connection (and every new one). The faults that answer for the
    /// server (throttling, errors, a lost answer) are HTTP's only.
    pub fn start_raw(upstream: SocketAddr) -> FaultProxy {
        Self::start_with(upstream, true, false)
    }

    /// [`FaultProxy::start_raw`] for PostgreSQL connections without TLS
    /// (`sslmode=disable`): it also reads the statements the clients send
    /// and counts each under the name of the DynamoDB call it stands for
    /// in leaderd's store (a one-record `SELECT` is `GetItem`, a
    /// conditional write `PutItem`, many writes in one statement
    /// `TransactWriteItems`, `= ANY` `BatchGetItem`, a `SELECT` of
    /// many `Scan`, a `DELETE` `DeleteItem`; anything else `-`), so that
    /// what counts DynamoDB requests counts these alike. It counts nothing
    /// else (no `connections`, no `chunks`).
    pub fn start_postgres(upstream: SocketAddr) -> FaultProxy {
        Self::start_with(upstream, true, true)
    }

    fn start_with(upstream: SocketAddr, raw: bool, postgres: bool) -> FaultProxy {
        // Bound here, synchronously, so `addr()` is valid as soon as we return.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("binding port 0 on loopback only fails on a broken host");
        let addr = listener
            .local_addr()
            .expect("a bound listener has a local address");
        listener
            .set_nonblocking(true)
            .expect("a fresh listener accepts non-blocking mode");
        let shared = Arc::new(Shared {
            upstream,
            raw,
            postgres,
            rules: Mutex::new(Rules {
                all: Fault::None,
                per_operation: BTreeMap::new(),
            }),
            counts: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(rand::make_rng::<StdRng>()),
        });
        let shutdown = CancellationToken::new();
        let thread = {
            let shared = shared.clone();
            let shutdown = shutdown.clone();
            std::thread::Builder::new()
                .name(format!("fault-proxy-{}", addr.port()))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect(
                            "a current-thread runtime builds unless the OS is out of resources",
                        );
                    runtime.block_on(accept_loop(listener, shared, shutdown));
                    // Dropping the runtime here cancels every connection task,
                    // which closes their sockets.
                })
                .expect("spawning a thread only fails when the OS is out of resources")
        };
        FaultProxy {
            addr,
            shared,
            shutdown,
            thread: Some(thread),
        }
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint URL to give a DynamoDB client: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address requests are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Applies `fault` to every request from now on, replacing any
    /// per-operation rule. Requests already past the fault decision are not
    /// affected; connections already hanging keep hanging.
    pub fn set(&self, fault: Fault) {
        fault.validate();
        assert!(
            !self.shared.raw
                || matches!(
                    fault,
                    Fault::None
                        | Fault::Latency(_)
                        | Fault::Blackhole
                        | Fault::Reset
                        | Fault::DropFraction(_)
                ),
            "{fault:?} answers HTTP requests; a raw proxy forwards bytes only"
        );
        let mut rules = lock(&self.shared.rules);
        rules.all = fault;
        rules.per_operation.clear();
    }

    /// Applies `fault` to the named operations only (e.g. `["PutItem"]`);
    /// other operations keep the fault set with [`FaultProxy::set`].
    pub fn set_for(&self, operations: &[&str], fault: Fault) {
        fault.validate();
        let mut rules = lock(&self.shared.rules);
        for operation in operations {
            rules
                .per_operation
                .insert((*operation).to_owned(), fault.clone());
        }
    }

    /// Makes `DropFraction` choices reproducible from now on.
    pub fn seed(&self, seed: u64) {
        *lock(&self.shared.rng) = StdRng::seed_from_u64(seed);
    }

    /// Requests received so far, by operation (`GetItem`, `PutItem`, ...),
    /// whatever their fate. Requests without `X-Amz-Target` count as `-`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.counts).clone()
    }

    /// Sets every request count back to zero.
    pub fn clear_counts(&self) {
        lock(&self.shared.counts).clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            // The proxy thread only returns from the accept loop and drops its
            // runtime; a panic there has already been printed.
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("fault proxy: cannot register the listener: {error}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) if shared.raw => {
                    tokio::spawn(serve_raw(client, shared.clone()));
                }
                Ok((client, _)) => {
                    tokio::spawn(serve_connection(client, shared.clone()));
                }
                // Out of file descriptors or the like: back off, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// Serves one client connection until either side closes it or a fault ends
/// it. Returning drops (closes) both sockets.
async fn serve_connection(client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let mut client = Conn::new(client);
    let mut upstream: Option<Conn> = None;
    loop {
        let request = match client.read_request().await {
            Ok(Some(request)) => request,
            // Clean close between requests, or garbage we cannot frame:
            // either way the conversation is over.
            Ok(None) | Err(_) => return,
        };
        let operation = request.operation();
        *lock(&shared.counts).entry(operation.clone()).or_insert(0) += 1;
        let fault = lock(&shared.rules).fault_for(&operation);
        let after_answer = match fault {
            Fault::None => AfterAnswer::Deliver,
            Fault::Latency(delay) => {
                tokio::time::sleep(delay).await;
                AfterAnswer::Deliver
            }
            Fault::Blackhole => return hang(client).await,
            Fault::Reset => return reset(client),
            Fault::DropFraction(fraction) => {
                let roll: f64 = lock(&shared.rng).random();
                if roll < fraction {
                    return hang(client).await;
                }
                AfterAnswer::Deliver
            }
            Fault::Throttle | Fault::AccessDenied | Fault::Http500 | Fault::Http503 => {
                let answer = error_response(&fault, request.close);
                if client.stream.write_all(&answer).await.is_err() || request.close {
                    return;
                }
                continue;
            }
            Fault::ApplyThenLoseAnswer => AfterAnswer::Reset,
            Fault::ApplyThenHang => AfterAnswer::Hang,
        };

        let response = match forward(&mut upstream, shared.upstream, &request).await {
            Ok(response) => response,
            // The emulator closed or broke the connection before answering:
            // the client sees its connection break too.
            Err(_) => return reset(client),
        };
        match after_answer {
            AfterAnswer::Deliver => {}
            AfterAnswer::Reset => return reset(client),
            AfterAnswer::Hang => {
                drop(upstream);
                return hang(client).await;
            }
        }
        if client.stream.write_all(&response.raw).await.is_err() {
            return;
        }
        if request.close || response.close {
            let _ = client.stream.shutdown().await;
            return;
        }
    }
}

/// What a raw connection does with the next chunk, under the fault in
/// force (and, for `DropFraction`, a roll of the dice).
fn raw_verdict(shared: &Shared) -> Fault {
    let fault = lock(&shared.rules).all.clone();
    match fault {
        Fault::DropFraction(fraction) => {
            let roll: f64 = lock(&shared.rng).random();
            if roll < fraction {
                Fault::Blackhole
            } else {
                Fault::None
            }
        }
        other => other,
    }
}

/// Forwards one raw connection both ways, chunk by chunk, until either
/// side closes it or a fault ends it.
async fn serve_raw(client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    // A PostgreSQL proxy counts statements only: the benchmark's cost at
    // rest takes every name counted as a request.
    if !shared.postgres {
        *lock(&shared.counts)
            .entry("connections".to_owned())
            .or_insert(0) += 1;
    }
    match raw_verdict(&shared) {
        Fault::Blackhole => return hang(Conn::new(client)).await,
        Fault::Reset => return reset(Conn::new(client)),
        _ => {}
    }
    let Ok(upstream) = TcpStream::connect(shared.upstream).await else {
        return reset(Conn::new(client));
    };
    let _ = upstream.set_nodelay(true);
    let mut client = client;
    let mut upstream = upstream;
    let (mut client_read, mut client_write) = client.split();
    let (mut up_read, mut up_write) = upstream.split();
    let mut from_client = [0u8; 16 * 1024];
    let mut from_server = [0u8; 16 * 1024];
    let mut swallowing = false;
    let mut statements = shared.postgres.then(PgStatements::default);
    loop {
        let (n, to_server) = tokio::select! {
            read = client_read.read(&mut from_client) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => (n, true),
            },
            read = up_read.read(&mut from_server) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => (n, false),
            },
        };
        if to_server {
            let mut counts = lock(&shared.counts);
            match statements.as_mut() {
                Some(parser) => {
                    for op in parser.feed(&from_client[..n]) {
                        *counts.entry(op.to_owned()).or_insert(0) += 1;
                    }
                }
                None => *counts.entry("chunks".to_owned()).or_insert(0) += 1,
            }
        }
        if swallowing {
            continue;
        }
        match raw_verdict(&shared) {
            Fault::Blackhole => {
                swallowing = true;
                continue;
            }
            Fault::Reset => break,
            Fault::Latency(delay) => tokio::time::sleep(delay).await,
            _ => {}
        }
        let sent = if to_server {
            up_write.write_all(&from_client[..n]).await
        } else {
            client_write.write_all(&from_server[..n]).await
        };
        if sent.is_err() {
            break;
        }
    }
    // The server closed, or a fault: the client sees its connection break.
    let _ = client.set_zero_linger();
}

/// The statements in a PostgreSQL client's byte stream (in the clear):
/// an untyped start-up message (after an SSL request, if the client sent
/// one and was refused), then typed messages, a type byte and a 32-bit
/// length that counts itself. A `Parse` (`P`) or a simple `Query` (`Q`)
/// carries the statement's text.
#[derive(Default)]
struct PgStatements {
    buf: Vec<u8>,
    started: bool,
}

impl PgStatements {
    /// The DynamoDB names of the statements that `bytes` completes.
    fn feed(&mut self, bytes: &[u8]) -> Vec<&'static str> {
        self.buf.extend_from_slice(bytes);
        let mut ops = Vec::new();
        loop {
            let typed = usize::from(self.started);
            let Some(len) = self
                .buf
                .get(typed..typed + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            else {
                return ops;
            };
            if self.buf.len() < typed + len {
                return ops;
            }
            let message: Vec<u8> = self.buf.drain(..typed + len).collect();
            if !self.started {
                // 80877103: an SSL request; the start-up message follows.
                let code = message
                    .get(4..8)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                self.started = code != Some(80_877_103);
                continue;
            }
            let body = &message[5..];
            let text = match message[0] {
                // Parse: a statement name, then the text, each NUL-ended.
                b'P' => body.splitn(3, |b| *b == 0).nth(1),
                b'Q' => body.split(|b| *b == 0).next(),
                _ => None,
            };
            if let Some(text) = text {
                ops.push(dynamodb_name(&String::from_utf8_lossy(text)));
            }
        }
    }
}

/// The DynamoDB call a statement of leaderd's PostgreSQL store stands for.
fn dynamodb_name(sql: &str) -> &'static str {
    let sql = sql.trim_start();
    if sql.starts_with("WITH cur AS") {
        "PutItem"
    } else if sql.starts_with("WITH i AS") {
        "TransactWriteItems"
    } else if sql.starts_with("DELETE") {
        "DeleteItem"
    } else if !sql.starts_with("SELECT t.election") {
        "-"
    } else if sql.contains("= ANY(") {
        "BatchGetItem"
    } else if sql.contains("WHERE t.election = $1") {
        "GetItem"
    } else {
        "Scan"
    }
}

enum AfterAnswer {
    Deliver,
    Reset,
    Hang,
}

/// Sends `request` upstream (reusing the connection when it is still open)
/// and reads the whole answer, passing 1xx interim answers through.
async fn forward(
    upstream: &mut Option<Conn>,
    addr: SocketAddr,
    request: &Message,
) -> io::Result<Message> {
    if upstream.as_ref().is_some_and(|conn| !conn.idle_and_open()) {
        *upstream = None;
    }
    let conn = match upstream {
        Some(conn) => conn,
        None => {
            let stream = TcpStream::connect(addr).await?;
            let _ = stream.set_nodelay(true);
            upstream.insert(Conn::new(stream))
        }
    };
    conn.stream.write_all(&request.raw).await?;
    let mut raw = Vec::new();
    loop {
        let response = conn.read_response(request.is_head).await?;
        raw.extend_from_slice(&response.raw);
        if !response.interim {
            let close = response.close;
            if close {
                *upstream = None;
            }
            return Ok(Message {
                raw,
                close,
                ..response
            });
        }
    }
}

/// Keeps the connection open and silent, discarding whatever the client
/// sends, until the client closes it (or the proxy is dropped).
async fn hang(mut client: Conn) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = client.stream.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// Closes the connection with a TCP RST rather than an orderly FIN.
fn reset(client: Conn) {
    let _ = client.stream.set_zero_linger();
    drop(client);
}

/// An answer in DynamoDB's own error format (status, `x-amzn-ErrorType`,
/// `__type` body), so the SDK classifies it exactly as the real thing.
fn error_response(fault: &Fault, close: bool) -> Vec<u8> {
    let (status, reason, code, message) = match fault {
        Fault::Throttle => (
            400,
            "Bad Request",
            "ProvisionedThroughputExceededException",
            "The level of configured provisioned throughput for the table was exceeded. \
             Consider increasing your provisioning level with the UpdateTable API.",
        ),
        Fault::AccessDenied => (
            400,
            "Bad Request",
            "AccessDeniedException",
            "User: arn:aws:sts::123456789012:assumed-role/leaderd/i-0abc is not authorized \
             to perform: dynamodb:PutItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/leaderd \
             because no identity-based policy allows the dynamodb:PutItem action",
        ),
        Fault::Http500 => (
            500,
            "Internal Server Error",
            "InternalServerError",
            "Internal server error",
        ),
        _ => (
            503,
            "Service Unavailable",
            "ServiceUnavailable",
            "Service unavailable",
        ),
    };
    let body = serde_json::json!({
        "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
        "message": message,
    })
    .to_string();
    let request_id: u64 = rand::rng().random();
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\n\
         x-amzn-RequestId: FAULTPROXY{request_id:016X}\r\n\
         x-amzn-ErrorType: {code}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut answer = head.into_bytes();
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// One HTTP/1.1 message exactly as received, with what the proxy needs to
/// know about it.
#[derive(Debug)]
struct Message {
    /// Head and body bytes as they came off the wire.
    raw: Vec<u8>,
    /// `X-Amz-Target` of a request.
    target: Option<String>,
    /// A request with method HEAD (its answer has no body).
    is_head: bool,
    /// A 1xx answer, to be followed by the real one.
    interim: bool,
    /// The sender will close the connection after this message.
    close: bool,
}

impl Message {
    /// The DynamoDB operation: `DynamoDB_20120810.GetItem` -> `GetItem`.
    fn operation(&self) -> String {
        match &self.target {
            Some(target) => target.rsplit('.').next().unwrap_or(target).to_owned(),
            None => "-".to_owned(),
        }
    }
}

/// How the length of a message body is known.
enum Framing {
    Length(usize),
    Chunked,
    /// Until the sender closes the connection (answers only).
    UntilClose,
}

const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

/// A socket with a read buffer: bytes read past one message belong to the
/// next (pipelining).
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn bad_data(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more bytes into the buffer; `Ok(false)` on end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    async fn fill_or_eof_error(&mut self) -> io::Result<()> {
        if self.fill().await? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a message",
            ))
        }
    }

    /// True if an idle upstream connection was not closed by the other side
    /// in the meantime (an idle server closing its end races with our next
    /// request otherwise).
    fn idle_and_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads one request; `Ok(None)` if the client closed the connection
    /// before sending another.
    async fn read_request(&mut self) -> io::Result<Option<Message>> {
        let (head_len, target, is_head, framing, close) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut request = httparse::Request::new(&mut headers);
            match request.parse(&self.buf) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let target = header(request.headers, "x-amz-target")
                        .map(|v| String::from_utf8_lossy(v).trim().to_owned());
                    let is_head = request.method == Some("HEAD");
                    let framing = body_framing(request.headers, false)?;
                    let close = wants_close(request.version, request.headers);
                    break (head_len, target, is_head, framing, close);
                }
                Ok(httparse::Status::Partial) => {
                    if self.buf.len() > MAX_HEAD {
                        return Err(bad_data("request head too large"));
                    }
                    if !self.fill().await? {
                        if self.buf.is_empty() {
                            return Ok(None);
                        }
                        return Err(bad_data("connection closed inside a request head"));
                    }
                }
                Err(error) => return Err(bad_data(format!("bad request head: {error}"))),
            }
        };
        let end = self.body_end(head_len, framing).await?;
        Ok(Some(Message {
            raw: self.buf.drain(..end).collect(),
            target,
            is_head,
            interim: false,
            close,
        }))
    }

    /// Reads one answer to a request (`for_head`: the request was HEAD).
    async fn read_response(&mut self, for_head: bool) -> io::Result<Message> {
        let (head_len, status, framing, close) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.buf) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let status = response.code.unwrap_or(0);
                    let close = wants_close(response.version, response.headers);
                    let framing = if for_head || status < 200 || status == 204 || status == 304 {
                        Framing::Length(0)
                    } else {
                        body_framing(response.headers, true)?
                    };
                    break (head_len, status, framing, close);
                }
                Ok(httparse::Status::Partial) => {
                    if self.buf.len() > MAX_HEAD {
                        return Err(bad_data("response head too large"));
                    }
                    self.fill_or_eof_error().await?;
                }
                Err(error) => return Err(bad_data(format!("bad response head: {error}"))),
            }
        };
        let until_close = matches!(framing, Framing::UntilClose);
        let end = self.body_end(head_len, framing).await?;
        Ok(Message {
            raw: self.buf.drain(..end).collect(),
            target: None,
            is_head: false,
            interim: (100..200).contains(&status),
            close: close || until_close,
        })
    }

    /// Reads until the buffer holds the whole body that starts at `start`;
    /// returns the offset just past it.
    async fn body_end(&mut self, start: usize, framing: Framing) -> io::Result<usize> {
        match framing {
            Framing::Length(len) => {
                let end = start + len;
                while self.buf.len() < end {
                    self.fill_or_eof_error().await?;
                }
                Ok(end)
            }
            Framing::UntilClose => {
                while self.fill().await? {}
                Ok(self.buf.len())
            }
            Framing::Chunked => {
                let mut pos = start;
                loop {
                    match httparse::parse_chunk_size(&self.buf[pos..]) {
                        Ok(httparse::Status::Complete((line_len, 0))) => {
                            pos += line_len;
                            return self.trailers_end(pos).await;
                        }
                        Ok(httparse::Status::Complete((line_len, size))) => {
                            let size = usize::try_from(size)
                                .map_err(|_| bad_data("chunk size too large"))?;
                            // Chunk data, then its CRLF.
                            let end = pos + line_len + size + 2;
                            while self.buf.len() < end {
                                self.fill_or_eof_error().await?;
                            }
                            if &self.buf[end - 2..end] != b"\r\n" {
                                return Err(bad_data("chunk not followed by CRLF"));
                            }
                            pos = end;
                        }
                        Ok(httparse::Status::Partial) => self.fill_or_eof_error().await?,
                        Err(_) => return Err(bad_data("bad chunk size line")),
                    }
                }
            }
        }
    }

    /// After the last chunk: trailer lines up to an empty line.
    async fn trailers_end(&mut self, mut pos: usize) -> io::Result<usize> {
        loop {
            match self.buf[pos..].windows(2).position(|w| w == b"\r\n") {
                Some(0) => return Ok(pos + 2),
                Some(line_len) => pos += line_len + 2,
                None => {
                    if self.buf.len() - pos > MAX_HEAD {
                        return Err(bad_data("trailers too large"));
                    }
                    self.fill_or_eof_error().await?;
                }
            }
        }
    }
}

fn header<'h>(headers: &'h [httparse::Header<'_>], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// Whether a comma-separated header (`Connection`, `Transfer-Encoding`)
/// carries `token`, case-insensitively.
fn has_token(headers: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .any(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        })
}

fn body_framing(headers: &[httparse::Header<'_>], is_response: bool) -> io::Result<Framing> {
    if has_token(headers, "transfer-encoding", "chunked") {
        return Ok(Framing::Chunked);
    }
    match header(headers, "content-length") {
        Some(value) => std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map(Framing::Length)
            .ok_or_else(|| bad_data("bad Content-Length")),
        None if is_response => Ok(Framing::UntilClose),
        None => Ok(Framing::Length(0)),
    }
}

/// HTTP/1.1 keeps the connection unless told `close`; HTTP/1.0 closes it
/// unless told `keep-alive`.
fn wants_close(version: Option<u8>, headers: &[httparse::Header<'_>]) -> bool {
    if version == Some(0) {
        !has_token(headers, "connection", "keep-alive")
    } else {
        has_token(headers, "connection", "close")
    }
}
