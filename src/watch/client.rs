//! The follower's watch client: holds `GET /v1/elections/{election}/watch`
//! open on the leader's advertised address and hands each event to the
//! election engine as a [`Hint`], with the moment it arrived.
//!
//! The engine says where to watch (through the channel [`spawn`]
//! returns); this task connects, reads the events ([`super::wire`]), and reports
//! [`Hint::Ended`] when the stream ends, breaks or cannot be opened, then
//! tries again after a pause (the retry interval, doubling up to
//! [`MAX_PAUSE`]; at once when the engine names another address).
//! Meanwhile the engine polls the store as it would without hints.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::FutureExt;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, HOST};
use tokio::sync::watch;

use super::wire::{self, LineSplitter, MAX_LINE};
use crate::clock::{Clock, Instant};
use crate::core::node::ElectionId;
use crate::election::{ElectionConfig, Hint, HintSink, LeaseEvent};
use crate::http_client::{self, CONNECT_TIMEOUT};
use crate::text;

/// The longest pause between attempts to open a stream.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Failures in a row to watch one address before they are logged: a
/// leader that has just exited or crashed refuses for a moment before the
/// record names another, and that is no news.
const UNREPORTED_FAILURES: u32 = 3;

/// The path of `election`'s watch stream.
pub fn watch_path(election: &str) -> String {
    format!("/v1/elections/{}/watch", text::path_segment(election))
}

/// Start a watch client for `election` (the node's election `id`),
/// paced by `pacing`, handing its hints to `sink`; it watches the address
/// sent on the channel returned, and ends when that is dropped.
pub fn spawn(
    election: String,
    id: ElectionId,
    clock: Clock,
    pacing: Pacing,
    sink: HintSink,
) -> watch::Sender<Option<String>> {
    let (target_tx, target) = watch::channel(None);
    let hints = Hints { id, sink };
    tokio::spawn(run(election, clock, pacing, target, hints));
    target_tx
}

/// Where one client's hints go: the node's channel, tagged with its
/// election.
struct Hints {
    id: ElectionId,
    sink: HintSink,
}

impl Hints {
    fn try_send(&self, hint: Hint) {
        self.sink.hint(self.id, hint);
    }
}

/// How a watch client paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// The first pause before opening a stream again (P), doubling up to
    /// [`MAX_PAUSE`] while attempts fail.
    pub retry_interval: Duration,
    /// The longest silence a stream may keep before it is abandoned and
    /// opened again (R + P: a leader sends an event every R).
    pub quiet: Duration,
}

impl Pacing {
    /// The pacing of a client that watches for an election timed by
    /// `timing`: P, and R + P.
    pub fn of(timing: &ElectionConfig) -> Pacing {
        Pacing {
            retry_interval: timing.retry_interval,
            quiet: timing.hint_quiet(),
        }
    }
}

/// One stream to open: on which address, at which path, naming which
/// session of this daemon's (if any).
#[derive(Debug, Clone, Copy)]
pub(super) struct StreamRequest<'a> {
    /// The leader's address.
    pub(super) address: &'a str,
    /// The stream's path.
    pub(super) path: &'a str,
    /// This daemon's session, named to the leader.
    pub(super) session: Option<&'a str>,
}

/// What the operator has been told about watching one election's leader:
/// a failure that persists is logged once (again only when it changes),
/// and so is the first event after it.
#[derive(Debug, Default)]
pub(super) struct Reported {
    /// Failures in a row to watch the current address.
    failures: u32,
    /// The failure last logged (address and error), until a stream speaks.
    logged: Option<String>,
}

impl Reported {
    /// Another address to watch: its failures are counted afresh.
    pub(super) fn retarget(&mut self) {
        self.failures = 0;
    }

    /// Watching `address` failed with `error`; whether that was logged.
    pub(super) fn failed(
        &mut self,
        election: &str,
        address: &str,
        error: &str,
        poll: Duration,
    ) -> bool {
        self.failures += 1;
        tracing::debug!(election = %election, address = %address, error = %error, "cannot watch the leader; polling the store");
        let failure = format!("{address}: {error}");
        if self.failures < UNREPORTED_FAILURES || self.logged.as_ref() == Some(&failure) {
            return false;
        }
        tracing::warn!(election = %election, address = %address, error = %error, "cannot watch the leader; polling the store every {} instead (logged again only when the error changes)", text::duration(poll));
        self.logged = Some(failure);
        true
    }

    /// The leader at `address` told of its lease; whether that was logged
    /// (as the end of a logged failure).
    pub(super) fn spoke(&mut self, election: &str, address: &str) -> bool {
        self.failures = 0;
        let recovered = self.logged.take().is_some();
        if recovered {
            tracing::info!(election = %election, address = %address, "watching the leader again");
        }
        recovered
    }
}

async fn run(
    election: String,
    clock: Clock,
    pacing: Pacing,
    mut target: watch::Receiver<Option<String>>,
    hints: Hints,
) {
    let retry_interval = pacing.retry_interval;
    let mut backoff = pauses(retry_interval);
    let mut reported = Reported::default();
    loop {
        let Some(address) = target.borrow_and_update().clone() else {
            if target.changed().await.is_err() {
                return;
            }
            reported.retarget();
            continue;
        };
        let outcome = tokio::select! {
            outcome = stream(&address, &election, &clock, pacing.quiet, &hints, &mut reported) => outcome,
            // Another address, or none: this stream is no longer wanted.
            changed = target.changed() => {
                if changed.is_err() {
                    return;
                }
                hints.try_send(Hint::Ended);
                backoff = pauses(retry_interval);
                reported.retarget();
                continue;
            }
        };
        hints.try_send(Hint::Ended);
        let pause = match outcome {
            Ok(()) => {
                backoff = pauses(retry_interval);
                retry_interval
            }
            Err(e) => {
                let _ = reported.failed(&election, &address, &e, retry_interval);
                backoff.next().expect("pauses never run out")
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            changed = target.changed() => {
                if changed.is_err() {
                    return;
                }
                backoff = pauses(retry_interval);
                reported.retarget();
            }
        }
    }
}

/// The pauses after failed attempts to watch one address: the retry
/// interval, then doubling up to [`MAX_PAUSE`] (or the retry interval, if
/// that is longer). Never runs out.
pub(super) fn pauses(retry_interval: Duration) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(retry_interval)
        .with_max_delay(MAX_PAUSE.max(retry_interval))
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// One stream: `Ok` when it ended after telling that the lease is held (a
/// stream worth opening again soon). A stream that ended without is an
/// error too: a moment after a change of leader (or for a follower that
/// read the record before its writer had finished taking office) that is
/// expected; if it persists, the advertised address is not the leader's
/// own (a load balancer, a copied value).
async fn stream(
    address: &str,
    election: &str,
    clock: &Clock,
    quiet: Duration,
    hints: &Hints,
    reported: &mut Reported,
) -> Result<(), String> {
    let mut held = false;
    let path = watch_path(election);
    let request = StreamRequest {
        address,
        path: &path,
        session: None,
    };
    follow(request, clock, quiet, |at, event| {
        if event.election() != Some(election) {
            return Err("an event of another election".into());
        }
        if matches!(event, LeaseEvent::Renewed { .. }) {
            held = true;
            let _ = reported.spoke(election, address);
        }
        // Full: the engine is busy; it reads the store anyway.
        hints.try_send(Hint::Event {
            at,
            event: Box::new(event),
        });
        Ok(())
    })
    .await?;
    if held {
        Ok(())
    } else {
        Err("the stream told of no lease: the instance there does not lead this election".into())
    }
}

/// Open the stream `request` names and hand each event to `on_event` with
/// the instant it arrived, until the stream ends (`Ok`), breaks, is silent
/// for `quiet`, says something that is not an event, or `on_event`
/// refuses one (an error naming why).
pub(super) async fn follow(
    request: StreamRequest<'_>,
    clock: &Clock,
    quiet: Duration,
    mut on_event: impl FnMut(Instant, LeaseEvent) -> Result<(), String>,
) -> Result<(), String> {
    let StreamRequest {
        address,
        path,
        session,
    } = request;
    let (mut sender, conn) = http_client::connect(address, CONNECT_TIMEOUT).await?;
    let mut request = Request::get(path)
        .header(HOST, address)
        .header(ACCEPT, wire::CONTENT_TYPE);
    if let Some(key) = session {
        request = request.header(wire::SESSION_HEADER, key);
    }
    let request = request
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
        read(response.into_body(), clock, quiet, &mut on_event).await
    };
    let mut events = std::pin::pin!(events);
    tokio::select! {
        biased;
        outcome = &mut events => outcome,
        closed = conn => {
            // Hand on what arrived before the close (a `released` the
            // leader sent just before it exited) without waiting for more.
            let drained = (&mut events).now_or_never();
            match (drained, closed) {
                (Some(outcome), Ok(())) => outcome,
                (Some(outcome), Err(e)) => outcome.and(Err(format!("connection failed: {e}"))),
                (None, Ok(())) => Err("the connection closed in the middle of the stream".into()),
                (None, Err(e)) => Err(format!("connection failed: {e}")),
            }
        },
    }
}

/// Every event of `body`, as for [`follow`].
async fn read(
    mut body: Incoming,
    clock: &Clock,
    quiet: Duration,
    on_event: &mut impl FnMut(Instant, LeaseEvent) -> Result<(), String>,
) -> Result<(), String> {
    let mut lines = LineSplitter::new(MAX_LINE);
    loop {
        let Some(frame) = tokio::time::timeout(quiet, body.frame())
            .await
            .map_err(|_| format!("no event for {}", text::duration(quiet)))?
        else {
            return Ok(());
        };
        let frame = frame.map_err(|e| format!("stream broke: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for line in lines.push(&data) {
            let line = line.map_err(|e| e.to_string())?;
            let at = clock.now();
            let event = wire::decode(&line).map_err(|e| e.to_string())?;
            on_event(at, event)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Reported, pauses};

    const P: Duration = Duration::from_secs(1);

    #[test]
    fn a_failure_is_logged_once_it_persists_and_again_only_when_it_changes() {
        let mut r = Reported::default();
        let refused = "cannot connect to 10.0.0.1:9777: Connection refused";
        // A leader that just left refuses for a moment: no news.
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        assert!(r.failed("web", "10.0.0.1:9777", refused, P));
        // The same again and again: once.
        for _ in 0..10 {
            assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        }
        // Another error: logged.
        assert!(r.failed("web", "10.0.0.1:9777", "no answer within 1s", P));
        // The stream speaks: the end of the failure is logged, once.
        assert!(r.spoke("web", "10.0.0.1:9777"));
        assert!(!r.spoke("web", "10.0.0.1:9777"));
        // A new failure counts afresh, and is news even if it was seen before.
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        assert!(r.failed("web", "10.0.0.1:9777", refused, P));
    }

    #[test]
    fn a_failed_attempt_is_retried_after_the_retry_interval_then_less_and_less_often() {
        let secs =
            |p: &mut dyn Iterator<Item = Duration>| p.next().map(|d| d.as_secs_f64().round());
        // The first retry after one retry interval (it once waited two: a
        // follower that connected a moment before the leader took office
        // missed its hints for 2 P).
        let mut p = pauses(P);
        let seen: Vec<_> = (0..7).map(|_| secs(&mut p)).collect();
        let want = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0].map(Some);
        assert_eq!(seen, want);
        // A retry interval longer than the cap is never shortened.
        let mut p = pauses(Duration::from_secs(45));
        assert_eq!([secs(&mut p), secs(&mut p)], [Some(45.0), Some(45.0)]);
        // It never runs out.
        assert!(pauses(P).nth(10_000).is_some());
    }

    #[test]
    fn another_address_counts_its_failures_afresh() {
        let mut r = Reported::default();
        let refused = "Connection refused";
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        assert!(!r.failed("web", "10.0.0.1:9777", refused, P));
        // The record names another leader: a moment of refusals there is
        // no news either.
        r.retarget();
        assert!(!r.failed("web", "10.0.0.2:9777", refused, P));
        assert!(!r.failed("web", "10.0.0.2:9777", refused, P));
        assert!(r.failed("web", "10.0.0.2:9777", refused, P));
    }
}
