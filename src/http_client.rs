//! A plain HTTP/1 client connection to another leaderd.
//!
//! Two callers talk to a leaderd over HTTP: `leaderd resign` (one request
//! to the local daemon) and a follower's watch client (one long stream from
//! the leader). Neither needs more than a TCP connection and an HTTP/1
//! handshake within a time limit, so that is all this module does; what is
//! asked and how the answer is read stays with each caller.

use std::time::Duration;

use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::text;

/// How long connecting and waiting for the answer's head may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// An HTTP/1 connection to another leaderd at `address` (`HOST:PORT`),
/// made within `limit`. The connection future must be polled (awaited or
/// spawned) for requests to go out.
pub async fn connect<B>(
    address: &str,
    limit: Duration,
) -> Result<(SendRequest<B>, Connection<TokioIo<TcpStream>, B>), String>
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
