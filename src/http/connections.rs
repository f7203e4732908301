//! The open HTTP connections, and which one gives way when they are too
//! many.
//!
//! At most [`super::connection_limit`] connections are served at once, so
//! that clients can never take the descriptors the lease store and the job
//! need. Half of them at most are watch streams (their slots are taken by
//! the handler); the rest is shared by everything else. A full table must
//! not turn a readiness probe away because others opened connections and
//! sent nothing (or keep them alive between requests): when a connection
//! arrives and the table is full, the connection that has been idle the
//! longest, with no request in progress, is closed to make room. Only when
//! every connection is in the middle of a request is the new one closed.
//!
//! A connection is idle from the moment it is accepted, and again from the
//! moment its last answer was sent (or abandoned), until a whole request
//! head has arrived.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

/// The open connections; shared by the accept loop and the connections.
#[derive(Debug)]
pub(super) struct Connections {
    limit: usize,
    table: Mutex<Table>,
    /// Stamps the moments connections become idle, in order.
    ticks: AtomicU64,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Arc<Conn>>,
}

/// One connection's state, as the table sees it.
#[derive(Debug)]
pub(super) struct Conn {
    id: u64,
    /// Requests whose answer is not sent yet.
    in_flight: AtomicUsize,
    /// The tick at which it last became idle.
    idle_since: AtomicU64,
    /// Cancelled to close it.
    close: CancellationToken,
}

impl Conn {
    /// Resolves when the table closes this connection to make room.
    pub(super) fn closed(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }
}

/// Why a new connection cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Full;

impl Connections {
    /// A table of at most `limit` connections.
    pub(super) fn new(limit: usize) -> Arc<Connections> {
        Arc::new(Connections {
            limit: limit.max(1),
            table: Mutex::new(Table::default()),
            ticks: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Each update is one map operation: a panic cannot leave it torn.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tick(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::Relaxed)
    }

    /// Admit a new connection, closing the longest idle one if the table
    /// is full; [`Full`] when every open connection is busy.
    pub(super) fn admit(&self) -> Result<Arc<Conn>, Full> {
        let mut table = self.lock();
        if table.open.len() >= self.limit {
            let idlest = table
                .open
                .values()
                .filter(|c| c.in_flight.load(Ordering::Acquire) == 0)
                .min_by_key(|c| c.idle_since.load(Ordering::Relaxed))
                .map(|c| c.id)
                .ok_or(Full)?;
            if let Some(evicted) = table.open.remove(&idlest) {
                evicted.close.cancel();
            }
        }
        let id = table.next;
        table.next += 1;
        let conn = Arc::new(Conn {
            id,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.tick()),
            close: CancellationToken::new(),
        });
        table.open.insert(id, conn.clone());
        Ok(conn)
    }

    /// `conn` has ended (or was closed to make room).
    pub(super) fn ended(&self, conn: &Conn) {
        self.lock().open.remove(&conn.id);
    }

    /// How many connections are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().open.len()
    }
}

/// The router as one connection serves it: counts its requests in flight
/// until each answer's body is done with, so the table knows when the
/// connection is idle.
#[derive(Clone)]
pub(super) struct Tracked {
    pub(super) router: axum::Router,
    pub(super) conn: Arc<Conn>,
    pub(super) table: Arc<Connections>,
}

/// Marks its connection idle again when the answer is done with.
struct InFlight {
    conn: Arc<Conn>,
    table: Arc<Connections>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since
            .store(self.table.tick(), Ordering::Relaxed);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl tower_service::Service<Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        self.conn.in_flight.fetch_add(1, Ordering::AcqRel);
        let held = InFlight {
            conn: self.conn.clone(),
            table: self.table.clone(),
        };
        let mut router = self.router.clone();
        Box::pin(async move {
            let res = tower_service::Service::call(&mut router, req.map(Body::new)).await?;
            // The body keeps the request counted until it is sent or dropped
            // (a watch stream for as long as it lasts).
            Ok(res.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &held;
                    frame
                }))
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(conn: &Conn) {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    #[test]
    fn a_full_table_closes_the_longest_idle_connection_and_never_a_busy_one() {
        let table = Connections::new(3);
        let a = table.admit().expect("room");
        let b = table.admit().expect("room");
        let c = table.admit().expect("room");
        busy(&a);
        // Full: b has been idle the longest of the idle ones.
        let d = table.admit().expect("b makes room");
        assert!(b.close.is_cancelled() && !a.close.is_cancelled() && !c.close.is_cancelled());
        assert_eq!(table.len(), 3);
        // c became busy and then idle again: d is now the idlest.
        busy(&c);
        drop(InFlight {
            conn: c.clone(),
            table: table.clone(),
        });
        let _e = table.admit().expect("d makes room");
        assert!(d.close.is_cancelled() && !c.close.is_cancelled());
        // All busy: the newcomer is turned away.
        busy(&c);
        busy(&_e);
        assert_eq!(table.admit().map(|_| ()), Err(Full));
        table.ended(&a);
        assert_eq!(table.len(), 2);
        assert!(table.admit().is_ok());
    }
}
