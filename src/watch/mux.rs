//! The follower's end of the daemons' streams, with sessions: one
//! `GET /v1/watch` per leader daemon, whatever the number of elections it
//! leads, instead of one stream per election.
//!
//! The node's elections say where to watch through the mux (it is their
//! [`Aim`]: their holder's advertised address, or nowhere). The mux holds
//! one stream per address some election names, hands each election's
//! events (`renewed` when a tenure starts, `released`, `not_leader`) to
//! the node's one channel ([`HintSink`]) for the elections aimed at that
//! address, and tells the node there of every write of a session the
//! stream tells of, which is how the followers time a session without
//! reading each election. A stream that ends, breaks or goes quiet ends
//! the elections' hints ([`Hint::Ended`]) and the sessions' flow; it is
//! opened again after a pause, as an election's own client does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::{Pacing, Reported, StreamRequest, follow, pauses};
use crate::clock::{Clock, Instant};
use crate::core::node::{ElectionId, NodeInput};
use crate::election::{Aim, Hint, HintSink, LeaseEvent, SESSION_LABEL, SessionView};
use crate::lease::is_session_key;

/// The path of a daemon's stream.
pub const WATCH_PATH: &str = "/v1/watch";

/// Sessions one stream may tell of: a daemon has one at a time (two for a
/// moment when it replaces it). More ends the stream: it is not a
/// daemon's stream.
const MAX_SESSIONS: usize = 8;

/// See the module docs.
#[derive(Clone)]
pub struct Mux {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Clock,
    pacing: Pacing,
    /// The node's one channel: its elections' hints, the sessions told of.
    sink: HintSink,
    /// This daemon's session, named to the daemons it watches.
    own: Option<watch::Receiver<Option<SessionView>>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each feed aimed somewhere, by name: an election's (its name) or a
    /// member's (balance), and where it is aimed.
    feeds: HashMap<String, Feed>,
    /// Each address some feed is aimed at: how many, and its stream.
    streams: HashMap<String, (usize, CancellationToken)>,
}

struct Feed {
    address: String,
    /// The node's election it feeds; `None`: a member's stream kept open
    /// (its sessions' writes are what counts).
    election: Option<ElectionId>,
}

impl Mux {
    /// A mux timed on `clock`: a failed stream is opened again after
    /// `pacing`'s retry interval (doubling while it fails), one silent for
    /// its `quiet` (R + P: a daemon with a session tells of a write every
    /// R) is given up; the elections' hints and the sessions' writes go
    /// to `sink`. Each stream is opened naming this daemon's session,
    /// `own`, and opened again when that session is opened or replaced
    /// (the header is only read on a request).
    pub fn new(
        clock: Clock,
        pacing: Pacing,
        sink: HintSink,
        own: Option<watch::Receiver<Option<SessionView>>>,
    ) -> Mux {
        Mux {
            inner: Arc::new(Inner {
                clock,
                pacing,
                sink,
                own,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Keep the stream of the daemon at `address` open for the member
    /// whose session is `key` (balance); `None`: no longer.
    pub fn aim_member(&self, key: &str, address: Option<String>) {
        self.inner.aim(&format!("#member{key}"), None, address);
    }
}

impl Aim for Mux {
    fn aim(&self, election: ElectionId, name: &str, address: Option<String>) {
        self.inner.aim(name, Some(election), address);
    }
}

/// The key of this daemon's session as `own` shows it now, marked seen.
fn own_key(own: Option<&mut watch::Receiver<Option<SessionView>>>) -> Option<String> {
    own.and_then(|o| o.borrow_and_update().as_ref().map(|v| v.key.clone()))
}

/// Resolves once this daemon's session is no longer `named` (opened,
/// replaced or closed); never without a session, or once it is gone.
async fn own_key_changed(
    own: Option<&mut watch::Receiver<Option<SessionView>>>,
    named: Option<&str>,
) {
    let Some(own) = own else {
        return std::future::pending().await;
    };
    // Renewals change the view, not the key: wait past them.
    if own
        .wait_for(|v| v.as_ref().map(|v| v.key.as_str()) != named)
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere mid-update leaves maps that are still whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Aim the feed `name` (of `election`, if an election's) at
    /// `address`: open that address's stream if it is the first, close the
    /// old one's if it was the last. A feed aimed nowhere is forgotten.
    fn aim(self: &Arc<Self>, name: &str, election: Option<ElectionId>, address: Option<String>) {
        let mut state = self.lock();
        let old = state.feeds.get(name).map(|f| f.address.clone());
        if old == address {
            return;
        }
        match &address {
            Some(address) => {
                state.feeds.insert(
                    name.to_owned(),
                    Feed {
                        address: address.clone(),
                        election,
                    },
                );
            }
            None => {
                state.feeds.remove(name);
            }
        }
        if old.is_some()
            && let Some(id) = election
        {
            // What it watched is no longer its leader's.
            self.sink.hint(id, Hint::Ended);
        }
        if let Some(address) = address {
            let (count, _) = state.streams.entry(address.clone()).or_insert_with(|| {
                let stop = CancellationToken::new();
                tokio::spawn(self.clone().run(address, stop.clone()));
                (0, stop)
            });
            *count += 1;
        }
        if let Some(old) = old
            && let Some((count, stop)) = state.streams.get_mut(&old)
        {
            *count -= 1;
            if *count == 0 {
                stop.cancel();
                state.streams.remove(&old);
            }
        }
    }

    /// Hold the stream of `address` open until `stop`.
    async fn run(self: Arc<Self>, address: String, stop: CancellationToken) {
        let retry = self.pacing.retry_interval;
        let mut backoff = pauses(retry);
        let mut reported = Reported::default();
        loop {
            // The sessions told of on this connection, each with its first
            // event: the flow of each counts from there.
            let mut sessions: HashMap<String, Instant> = HashMap::new();
            let mut own = self.own.clone();
            let named = own_key(own.as_mut());
            let request = StreamRequest {
                address: &address,
                path: WATCH_PATH,
                session: named.as_deref(),
            };
            let outcome = tokio::select! {
                outcome = follow(request, &self.clock, self.pacing.quiet, |at, event| {
                    self.deliver(&address, &mut sessions, &mut reported, at, event)
                }) => Some(outcome),
                () = own_key_changed(own.as_mut(), named.as_deref()) => Some(Ok(())),
                () = stop.cancelled() => None,
            };
            for key in sessions.keys() {
                self.sink
                    .input(NodeInput::SessionStreamEnded { key: key.clone() });
            }
            self.tell_ended(&address);
            let pause = match outcome {
                None => return,
                // Our session was opened or replaced: the daemon there
                // learns of it from the header of a new request.
                Some(Ok(())) if own_key(own.as_mut()) != named => Duration::ZERO,
                Some(Ok(())) if !sessions.is_empty() => {
                    backoff = pauses(retry);
                    retry
                }
                Some(outcome) => {
                    let error = outcome.err().unwrap_or_else(|| {
                        "the stream told of no session: the instance there does not run with sessions".into()
                    });
                    let _ = reported.failed(SESSION_LABEL, &address, &error, retry);
                    backoff.next().expect("pauses never run out")
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// One event of the stream of `address`, arrived at `at`.
    fn deliver(
        &self,
        address: &str,
        sessions: &mut HashMap<String, Instant>,
        reported: &mut Reported,
        at: Instant,
        event: LeaseEvent,
    ) -> Result<(), String> {
        let LeaseEvent::Session {
            session,
            rvn,
            labels,
        } = &event
        else {
            let state = self.lock();
            let feed = event.election().and_then(|e| state.feeds.get(e));
            if let Some(id) = feed
                .filter(|f| f.address == address)
                .and_then(|f| f.election)
            {
                self.sink.hint(
                    id,
                    Hint::Event {
                        at,
                        event: Box::new(event),
                    },
                );
            }
            return Ok(());
        };
        if !is_session_key(session) {
            return Err(format!(
                "a session event naming {session:?}, which is no session's key"
            ));
        }
        if !sessions.contains_key(session) && sessions.len() == MAX_SESSIONS {
            return Err(format!("events of more than {MAX_SESSIONS} sessions"));
        }
        if sessions.is_empty() {
            let _ = reported.spoke(SESSION_LABEL, address);
        }
        let since = *sessions.entry(session.clone()).or_insert(at);
        self.sink.input(NodeInput::SessionTold {
            key: session.clone(),
            rvn: rvn.clone(),
            labels: labels.clone(),
            at,
            since,
        });
        Ok(())
    }

    /// The stream of `address` ended: so did the hints of every feed aimed
    /// at it.
    fn tell_ended(&self, address: &str) {
        let state = self.lock();
        for feed in state.feeds.values() {
            if feed.address == address
                && let Some(id) = feed.election
            {
                self.sink.hint(id, Hint::Ended);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::wire;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// A daemon's stream that never ends: answers every request with one
    /// session event, and reports the session each request named.
    async fn stream_server() -> (String, mpsc::UnboundedReceiver<Option<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (named_tx, named) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let named_tx = named_tx.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_lowercase();
                    let prefix = format!("{}: ", wire::SESSION_HEADER);
                    let session = head
                        .lines()
                        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned));
                    let _ = named_tx.send(session);
                    let line = "{\"event\":\"session\",\"session\":\"#session/there/1\",\"rvn\":\"r1\",\"labels\":{}}\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{line}\r\n",
                        wire::CONTENT_TYPE,
                        line.len()
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                    // Held open until the client goes.
                    let _ = conn.read(&mut byte).await;
                });
            }
        });
        (address, named)
    }

    fn view(key: &str, rvn: &str) -> Option<SessionView> {
        Some(SessionView {
            key: key.to_owned(),
            rvn: rvn.to_owned(),
            last_send: Clock::tokio().now(),
            labels: Default::default(),
        })
    }

    async fn next(
        named: &mut mpsc::UnboundedReceiver<Option<String>>,
        second: Duration,
    ) -> Option<String> {
        tokio::time::timeout(5 * second, named.recv())
            .await
            .expect("no request within 5 s")
            .unwrap()
    }

    #[tokio::test]
    async fn the_stream_is_opened_again_naming_each_new_session_of_ours() {
        let (address, mut named) = stream_server().await;
        let clock = Clock::tokio();
        let (sink, mut brought) = HintSink::channel();
        let (own_tx, own) = watch::channel(None);
        let second = Duration::from_secs(1);
        let pacing = Pacing {
            retry_interval: second,
            quiet: 10 * second,
        };
        let mux = Mux::new(clock, pacing, sink, Some(own));
        mux.aim(ElectionId(0), "e", Some(address));
        // Opened before our session was: no name.
        assert_eq!(next(&mut named, second).await, None);
        own_tx.send_replace(view("#session/me/1", "a"));
        assert_eq!(
            next(&mut named, second).await.as_deref(),
            Some("#session/me/1")
        );
        // A renewal changes nothing there.
        own_tx.send_replace(view("#session/me/1", "b"));
        // A new session is named again.
        own_tx.send_replace(view("#session/me/2", "c"));
        assert_eq!(
            next(&mut named, second).await.as_deref(),
            Some("#session/me/2")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            named.try_recv().is_err(),
            "opened again without a new session"
        );
        // The session the stream told of reached the node (beside the
        // ends of the streams opened again).
        let told = async {
            loop {
                match brought.recv().await {
                    Some(NodeInput::SessionTold { key, .. }) => return key,
                    Some(_) => {}
                    None => panic!("the channel closed"),
                }
            }
        };
        let key = tokio::time::timeout(5 * second, told)
            .await
            .expect("told within 5 s");
        assert_eq!(key, "#session/there/1");
        // A feed aimed nowhere leaves the mux, and its stream with it when
        // it was the last one aimed there.
        mux.aim(ElectionId(0), "e", None);
        let state = mux.inner.lock();
        assert!(state.feeds.is_empty() && state.streams.is_empty());
    }
}
