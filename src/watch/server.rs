//! The leader's end of the watch streams: the body of
//! `GET /v1/elections/{election}/watch` (one election), and with sessions
//! of `GET /v1/watch` (the daemon: its session's writes and every
//! election's events, see [`respond_daemon`]).
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
use tokio::sync::{broadcast, watch};

use super::wire;
use crate::driver::board::EventView;
use crate::election::{LeaseEvent, SessionView};

/// The streaming answer for `election`: the events published on `events`,
/// starting with the last one if this instance is `leading`. `held` (a
/// connection slot, an open-stream count) is kept until the stream ends or
/// its client goes away.
pub fn respond<H: Send + 'static>(
    election: &str,
    mut events: EventView,
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
    ndjson(futures_util::stream::unfold(rest, next_line))
}

/// A streaming answer of event lines.
fn ndjson<S>(lines: S) -> Response
where
    S: futures_util::Stream<Item = Result<Vec<u8>, Infallible>> + Send + 'static,
{
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
    events: Option<EventView>,
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

/// The daemon's stream (`GET /v1/watch`, with sessions): its session's
/// writes as they happen (starting with the last one, if a session is
/// open) and every event its elections tell. A follower daemon holds one
/// such stream per leader daemon, whatever the number of elections.
///
/// A client too slow to keep up (`events` lagged past its buffer) is cut
/// off: it opens the stream again, and its elections read the store
/// meanwhile, so nothing it missed is lost for longer than a read.
pub fn respond_daemon<H: Send + 'static>(
    session: watch::Receiver<Option<SessionView>>,
    events: broadcast::Receiver<LeaseEvent>,
    held: H,
) -> Response {
    let rest = DaemonRest {
        session,
        events,
        started: false,
        _held: held,
    };
    ndjson(futures_util::stream::unfold(rest, next_daemon_line))
}

/// What is left of a daemon's stream.
struct DaemonRest<H> {
    session: watch::Receiver<Option<SessionView>>,
    events: broadcast::Receiver<LeaseEvent>,
    /// Whether the session as it was at the start was sent.
    started: bool,
    _held: H,
}

fn session_event(view: &SessionView) -> LeaseEvent {
    LeaseEvent::Session {
        session: view.key.clone(),
        rvn: view.rvn.clone(),
        labels: (*view.labels).clone(),
    }
}

/// The next line of a daemon's stream; `None` once it is over (the
/// session task or the elections gone, or the client fell behind).
async fn next_daemon_line<H>(
    mut rest: DaemonRest<H>,
) -> Option<(Result<Vec<u8>, Infallible>, DaemonRest<H>)> {
    let event = loop {
        if !rest.started {
            rest.started = true;
            if let Some(view) = rest.session.borrow_and_update().as_ref() {
                break session_event(view);
            }
        }
        tokio::select! {
            changed = rest.session.changed() => {
                changed.ok()?;
                // No session (validity ran out, closing): nothing to say;
                // the followers time the last write they were told of.
                if let Some(view) = rest.session.borrow_and_update().as_ref() {
                    break session_event(view);
                }
            }
            event = rest.events.recv() => break event.ok()?,
        }
    };
    let line = wire::encode(&event).ok()?;
    Some((Ok(line), rest))
}
