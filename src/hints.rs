//! The follower's watch client: holds `GET /v1/elections/{election}/watch`
//! open on the leader's advertised address and hands each event to the
//! election engine as a [`Hint`], with the moment it arrived.
//!
//! The engine says where to watch (through [`HintFeed::target`]); this
//! task connects, reads newline-delimited JSON events, and reports
//! [`Hint::Ended`] when the stream ends, breaks or cannot be opened, then
//! tries again after a pause (the retry interval, doubling up to
//! [`MAX_PAUSE`]; at once when the engine names another address).
//! Meanwhile the engine polls the store as it would without hints.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper::header::{ACCEPT, HOST};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::clock::Clock;
use crate::election::{Hint, HintFeed, LeaseEvent};
use crate::text;

/// How long connecting and waiting for the answer's head may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest pause between attempts to open a stream.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// The longest event line accepted; a longer one ends the stream.
pub const MAX_LINE: usize = 4096;

/// Hints waiting for the engine; beyond that new ones are dropped (the
/// engine is busy leading or writing; it reads the store anyway).
const QUEUE: usize = 16;

/// An HTTP/1 connection to another leaderd at `address` (`HOST:PORT`),
/// made within `limit`. The connection future must be polled (awaited or
/// spawned) for requests to go out.
pub async fn connect<B>(
    address: &str,
    limit: Duration,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<B>,
        hyper::client::conn::http1::Connection<TokioIo<TcpStream>, B>,
    ),
    String,
>
where
    B: hyper::body::Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::time::timeout(limit, TcpStream::connect(address))
        .await
        .map_err(|_| {
            format!(
                "no connection to {address} within {}",
                text::duration(limit)
            )
        })?
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    // Small messages, and latency is the point.
    let _ = tcp.set_nodelay(true);
    hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("HTTP handshake with {address} failed: {e}"))
}

/// The path of `election`'s watch stream.
pub fn watch_path(election: &str) -> String {
    format!("/v1/elections/{}/watch", text::path_segment(election))
}

/// Start a watch client for `election`; the engine gets the feed. The
/// client ends when the engine drops it.
pub fn spawn(election: String, clock: Clock, retry_interval: Duration) -> HintFeed {
    let (target_tx, target) = watch::channel(None);
    let (hints_tx, hints) = mpsc::channel(QUEUE);
    tokio::spawn(run(election, clock, retry_interval, target, hints_tx));
    HintFeed {
        target: target_tx,
        hints,
    }
}

async fn run(
    election: String,
    clock: Clock,
    retry_interval: Duration,
    mut target: watch::Receiver<Option<String>>,
    hints: mpsc::Sender<Hint>,
) {
    let mut pause = retry_interval;
    loop {
        let Some(address) = target.borrow_and_update().clone() else {
            if target.changed().await.is_err() {
                return;
            }
            continue;
        };
        let outcome = tokio::select! {
            outcome = stream(&address, &election, &clock, &hints) => outcome,
            // Another address, or none: this stream is no longer wanted.
            changed = target.changed() => {
                if changed.is_err() {
                    return;
                }
                let _ = hints.try_send(Hint::Ended);
                pause = retry_interval;
                continue;
            }
        };
        let _ = hints.try_send(Hint::Ended);
        match outcome {
            Ok(true) => pause = retry_interval,
            Ok(false) => pause = (pause * 2).min(MAX_PAUSE),
            Err(e) => {
                tracing::debug!(election = %election, address = %address, error = %e, "cannot watch the leader; polling the store");
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            changed = target.changed() => {
                if changed.is_err() {
                    return;
                }
                pause = retry_interval;
            }
        }
    }
}

/// One stream: `Ok(true)` when it ended after telling that the lease is
/// held (a stream worth opening again soon), `Ok(false)` when it ended
/// without (this address does not lead).
async fn stream(
    address: &str,
    election: &str,
    clock: &Clock,
    hints: &mpsc::Sender<Hint>,
) -> Result<bool, String> {
    let (mut sender, conn) = connect(address, CONNECT_TIMEOUT).await?;
    let request = Request::get(watch_path(election))
        .header(HOST, address)
        .header(ACCEPT, "application/x-ndjson")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let events = async {
        let response = tokio::time::timeout(CONNECT_TIMEOUT, sender.send_request(request))
            .await
            .map_err(|_| format!("no answer within {}", text::duration(CONNECT_TIMEOUT)))?
            .map_err(|e| format!("request failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let mut body = response.into_body();
        let mut line = Vec::new();
        let mut held = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("stream broke: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for chunk in data.split_inclusive(|b| *b == b'\n') {
                line.extend_from_slice(chunk);
                if line.len() > MAX_LINE {
                    return Err(format!("an event longer than {MAX_LINE} bytes"));
                }
                if line.last() != Some(&b'\n') {
                    continue;
                }
                let at = clock.now();
                if !line.trim_ascii().is_empty() {
                    let event = serde_json::from_slice::<LeaseEvent>(&line)
                        .map_err(|e| format!("an event that is not valid: {e}"))?;
                    if event.election() != election {
                        return Err("an event of another election".into());
                    }
                    held |= matches!(event, LeaseEvent::Renewed { .. });
                    // Full: the engine is busy; it reads the store anyway.
                    let _ = hints.try_send(Hint::Event { at, event });
                }
                line.clear();
            }
        }
        Ok(held)
    };
    tokio::select! {
        outcome = events => outcome,
        closed = conn => match closed {
            Ok(()) => Ok(false),
            Err(e) => Err(format!("connection failed: {e}")),
        },
    }
}
