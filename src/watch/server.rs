//! The leader's end of the watch stream: the body of
//! `GET /v1/elections/{election}/watch`.
//!
//! While this instance leads, the stream starts with its last write (a
//! `renewed` event) and then sends one event after every write; it ends
//! after `released` or `not_leader`, which is the only line an instance
//! that does not lead sends. The HTTP server (`crate::http`) finds the
//! election, takes one of its watch slots and hands over here; this module
//! knows nothing of routes, limits or error answers.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use super::wire;
use crate::election::LeaseEvent;

/// The streaming answer for `election`: the events published on `events`,
/// starting with the last one if this instance is `leading`. `held` (a
/// connection slot, an open-stream count) is kept until the stream ends or
/// its client goes away.
pub fn respond<H: Send + 'static>(
    election: &str,
    mut events: watch::Receiver<Option<LeaseEvent>>,
    leading: bool,
    held: H,
) -> Response {
    let first = match events.borrow_and_update().clone() {
        Some(e @ LeaseEvent::Renewed { .. }) if leading => e,
        _ => LeaseEvent::NotLeader {
            election: election.to_owned(),
        },
    };
    let rest = Rest {
        events: Some(events),
        first: Some(first),
        _held: held,
    };
    let lines = futures_util::stream::unfold(rest, next_line);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(wire::CONTENT_TYPE),
        )],
        Body::from_stream(lines),
    )
        .into_response()
}

/// What is left of a stream.
struct Rest<H> {
    /// The events to follow; `None` once the stream has said its last.
    events: Option<watch::Receiver<Option<LeaseEvent>>>,
    /// The first line, until it is sent.
    first: Option<LeaseEvent>,
    /// Released when the stream is dropped.
    _held: H,
}

/// The next line of the stream and what is left after it; `None` once the
/// stream is over (its last event sent, or the engine gone).
async fn next_line<H>(mut rest: Rest<H>) -> Option<(Result<Vec<u8>, Infallible>, Rest<H>)> {
    let event = match rest.first.take() {
        Some(first) => first,
        None => {
            let events = rest.events.as_mut()?;
            events.changed().await.ok()?;
            events.borrow_and_update().clone()?
        }
    };
    if matches!(
        event,
        LeaseEvent::Released { .. } | LeaseEvent::NotLeader { .. }
    ) {
        rest.events = None;
    }
    let line = wire::encode(&event).ok()?;
    Some((Ok(line), rest))
}
