//! The HTTP API through `router(..).oneshot(..)`, no socket, with
//! fake engine states on watch channels and paused tokio time; plus one
//! test of `serve` on a real loopback socket for the bounded shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::BodyExt;
use leaderd::clock::{Clock, Instant};
use leaderd::driver::board;
use leaderd::election::{ElectionState, LeaseEvent, Role};
use leaderd::http::{AppState, router};
use leaderd::metrics::Metrics;
use leaderd::resign::{ResignError, ResignRequest, Resigned};
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;

const WEDGE: Duration = Duration::from_secs(25);
const TOKEN: &str = "s3cret-admin-token";

fn follower(name: &str, now: Instant) -> ElectionState {
    ElectionState {
        observed_at_unix_ms: Some(1_700_000_000_500),
        ..ElectionState::example(name, "web-1", now).seeing("web-2", 41)
    }
}

/// Leading since `now`: valid for 9.7 s, stop at 7.7 s.
fn leader(name: &str, now: Instant) -> ElectionState {
    follower(name, now).in_tenure(Role::Leader, 42, now)
}

struct Fixture {
    clock: Clock,
    app: Router,
    /// Keep the senders alive: a dropped sender reads as a dead engine.
    states: Vec<board::StateBoard>,
    resigns: mpsc::Receiver<ResignRequest>,
}

/// Elections "report" (primary) and "my election", from the given states.
fn fixture(
    report: impl FnOnce(&str, Instant) -> ElectionState,
    other: impl FnOnce(&str, Instant) -> ElectionState,
    configure: impl FnOnce(AppState) -> AppState,
) -> Fixture {
    let clock = Clock::tokio();
    let now = clock.now();
    let (report_tx, report_rx) = board::channel(report("report", now));
    let (other_tx, other_rx) = board::channel(other("my election", now));
    let (resign_tx, resigns) = mpsc::channel(4);
    let state = AppState::new("report", clock.clone(), Arc::new(Metrics::new()), resign_tx)
        .with_election(report_rx, WEDGE)
        .with_election(other_rx, WEDGE);
    Fixture {
        clock,
        app: router(configure(state)),
        states: vec![report_tx, other_tx],
        resigns,
    }
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

fn resign_req(uri: &str, auth: Option<&str>) -> Request<Body> {
    let mut b = Request::post(uri);
    if let Some(a) = auth {
        b = b.header(header::AUTHORIZATION, a);
    }
    b.body(Body::empty()).unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text))
    }

    /// Asserts a JSON error answer with `status` and `code`.
    fn assert_error(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.text);
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/json",
            "error answers are JSON"
        );
        let body = self.json();
        assert_eq!(body["error"], code, "body: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error without a message: {body}"
        );
    }
}

async fn call(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.expect("infallible");
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
    }
}

#[tokio::test(start_paused = true)]
async fn leader_answers_200_while_valid_and_503_once_stop_at_passed() {
    let f = fixture(leader, follower, |s| s);
    let a = call(&f.app, get("/leader")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.headers[header::CACHE_CONTROL], "no-store");
    let body = a.json();
    assert_eq!(body["election"], "report");
    assert_eq!(body["identity"], "web-1");
    assert_eq!(body["is_leader"], true);
    assert_eq!(body["role"], "leader");
    assert_eq!(body["leader"], "web-1");
    assert_eq!(body["fencing_token"], 42);
    assert_eq!(body["lease_remaining_ms"], 9_700);
    assert_eq!(body["leader_since"], 1_700_000_000_000u64);
    assert_eq!(body["observed_at"], 1_700_000_000_500u64);
    assert_eq!(body["last_error"], Value::Null);

    tokio::time::advance(Duration::from_millis(7_699)).await;
    let a = call(&f.app, get("/leader")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["lease_remaining_ms"], 2_001);

    // The engine published nothing new (a stalled engine): the answer must
    // still turn at stop_at, from the clock alone.
    tokio::time::advance(Duration::from_millis(1)).await;
    let a = call(&f.app, get("/leader")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.text);
    let body = a.json();
    assert_eq!(body["is_leader"], false);
    assert_eq!(body["role"], "stopping");
    assert_eq!(body["lease_remaining_ms"], 0);
    assert_eq!(body["leader_since"], Value::Null);
    assert_eq!(f.states.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn followers_and_stopping_answer_503_with_the_same_fields() {
    let f = fixture(follower, leader, |s| s);
    let a = call(&f.app, get("/leader")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    let body = a.json();
    assert_eq!(body["is_leader"], false);
    assert_eq!(body["role"], "follower");
    assert_eq!(body["leader"], "web-2");
    assert_eq!(body["fencing_token"], 41);
    assert_eq!(body["lease_remaining_ms"], 0);
    assert_eq!(body["leader_since"], Value::Null);
    assert_eq!(body["observed_at"], 1_700_000_000_500u64);
    assert_eq!(body["unknown_format"], Value::Null);

    // A record of a format this build does not know: its holder, and the
    // format as stored.
    f.states[0].send_modify(0, |s| s.unknown_format = Some("3".into()));
    let body = call(&f.app, get("/leader")).await.json();
    assert_eq!(body["leader"], "web-2");
    assert_eq!(body["unknown_format"], "3");
    let status = call(&f.app, get("/status")).await.json();
    assert_eq!(status["elections"]["report"]["unknown_format"], "3");
    f.states[0].send_modify(0, |s| s.unknown_format = None);

    // The other election leads; percent-encoded names are decoded.
    let a = call(&f.app, get("/leader/my%20election")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["election"], "my election");

    // Stopping keeps its tenure but is not leading.
    f.states[1].send_modify(0, |s| s.role = Role::Stopping);
    let a = call(&f.app, get("/leader/my%20election")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.json()["role"], "stopping");
    assert_eq!(a.json()["is_leader"], false);

    // No record read yet.
    f.states[0].send_modify(0, |s| {
        s.leader = None;
        s.fencing_token = None;
        s.observed_at = None;
        s.observed_at_unix_ms = None;
        s.last_error = Some("timeout".into());
    });
    let body = call(&f.app, get("/leader/report")).await.json();
    assert_eq!(body["leader"], Value::Null);
    assert_eq!(body["fencing_token"], Value::Null);
    assert_eq!(body["observed_at"], Value::Null);
    assert_eq!(body["last_error"], "timeout");
}

#[tokio::test(start_paused = true)]
async fn unknown_paths_methods_and_garbage_get_json_errors() {
    let f = fixture(leader, follower, |s| s);
    call(&f.app, get("/leader/nope"))
        .await
        .assert_error(StatusCode::NOT_FOUND, "unknown_election");
    call(&f.app, get("/nothing/here"))
        .await
        .assert_error(StatusCode::NOT_FOUND, "not_found");
    call(&f.app, get("/leader/report/extra/parts"))
        .await
        .assert_error(StatusCode::NOT_FOUND, "not_found");
    // Not UTF-8 once percent-decoded.
    call(&f.app, get("/leader/%FF%FE"))
        .await
        .assert_error(StatusCode::BAD_REQUEST, "bad_request");
    // A very long name is not echoed in full.
    let long = "x".repeat(50_000);
    let a = call(&f.app, get(&format!("/leader/{long}"))).await;
    a.assert_error(StatusCode::NOT_FOUND, "unknown_election");
    assert!(a.text.len() < 1_000, "echoed {} bytes", a.text.len());
    call(&f.app, get("/leader/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd"))
        .await
        .assert_error(StatusCode::NOT_FOUND, "unknown_election");

    let a = call(
        &f.app,
        Request::post("/leader").body(Body::empty()).unwrap(),
    )
    .await;
    a.assert_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    assert!(a.headers[header::ALLOW].to_str().unwrap().contains("GET"));
    let a = call(
        &f.app,
        Request::delete("/status").body(Body::empty()).unwrap(),
    )
    .await;
    a.assert_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    let a = call(&f.app, get("/leader/report/resign")).await;
    a.assert_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    assert_eq!(a.headers[header::ALLOW], "POST");

    // Oversized bodies are refused before any handler.
    let a = call(
        &f.app,
        Request::post("/leader/report/resign")
            .header(header::CONTENT_LENGTH, "10000000")
            .body(Body::from(vec![b'x'; 10_000_000]))
            .unwrap(),
    )
    .await;
    a.assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");

    // HEAD works where GET does.
    let a = call(
        &f.app,
        Request::head("/leader").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text.is_empty());
}

#[tokio::test(start_paused = true)]
async fn status_lists_every_election_and_health() {
    let f = fixture(leader, follower, |s| s);
    let a = call(&f.app, get("/status")).await;
    assert_eq!(a.status, StatusCode::OK);
    let body = a.json();
    assert_eq!(body["primary"], "report");
    assert_eq!(body["health"]["status"], "ok");
    assert_eq!(body["elections"]["report"]["is_leader"], true);
    assert_eq!(body["elections"]["report"]["fencing_token"], 42);
    assert_eq!(body["elections"]["my election"]["is_leader"], false);
    assert_eq!(body["elections"]["my election"]["leader"], "web-2");
    assert_eq!(body["elections"].as_object().unwrap().len(), 2);

    tokio::time::advance(WEDGE + Duration::from_secs(1)).await;
    let body = call(&f.app, get("/status")).await.json();
    assert_eq!(body["health"]["status"], "unhealthy");
    assert_eq!(body["elections"]["report"]["is_leader"], false);
}

#[tokio::test(start_paused = true)]
async fn a_large_status_parses_whole() {
    let clock = Clock::tokio();
    let now = clock.now();
    let (resign_tx, _resigns) = mpsc::channel(4);
    let mut state = AppState::new("e-0000", clock.clone(), Arc::new(Metrics::new()), resign_tx);
    let mut senders = Vec::new();
    for i in 0..1_000 {
        let name = format!("e-{i:04}");
        let (tx, rx) = board::channel(if i % 3 == 0 {
            leader(&name, now)
        } else {
            follower(&name, now)
        });
        senders.push(tx);
        state = state.with_election(rx, WEDGE);
    }
    let res = router(state).oneshot(get("/status")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "application/json");
    let whole = res.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&whole).expect("one JSON document");
    let elections = json["elections"].as_object().unwrap();
    assert_eq!(elections.len(), 1_000);
    assert_eq!(elections["e-0999"]["election"], "e-0999");
    assert_eq!(elections["e-0999"]["is_leader"], true);
    assert_eq!(elections["e-0998"]["is_leader"], false);
    assert_eq!(json["primary"], "e-0000");
    assert_eq!(json["health"]["status"], "ok");
}

#[tokio::test(start_paused = true)]
async fn healthz_fails_when_a_campaign_loop_is_wedged() {
    let f = fixture(leader, follower, |s| s);
    let a = call(&f.app, get("/healthz")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json(), serde_json::json!({"status": "ok"}));

    // One engine keeps beating, the other goes silent.
    tokio::time::advance(WEDGE).await;
    let now = f.clock.now();
    f.states[0].send_modify(0, |s| s.heartbeat = now);
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
    tokio::time::advance(Duration::from_secs(1)).await;
    let a = call(&f.app, get("/healthz")).await;
    a.assert_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    let body = a.json();
    assert_eq!(body["status"], "unhealthy");
    let problems = body["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{body}");
    assert!(
        problems[0].as_str().unwrap().contains("my election"),
        "{body}"
    );
    assert!(problems[0].as_str().unwrap().contains("wedged"), "{body}");

    // It beats again: healthy.
    let now = f.clock.now();
    f.states[1].send_modify(0, |s| s.heartbeat = now);
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn healthz_fails_when_an_engine_is_gone_or_finished() {
    let mut f = fixture(leader, follower, |s| s);
    f.states[0].send_modify(0, |s| s.finished = true);
    let a = call(&f.app, get("/healthz")).await;
    a.assert_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(a.text.contains("report"), "{}", a.text);

    f.states[0].send_modify(0, |s| s.finished = false);
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
    // An engine task that died drops its sender.
    drop(f.states.remove(1));
    let a = call(&f.app, get("/healthz")).await;
    a.assert_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(a.text.contains("my election"), "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn healthz_fails_when_the_store_is_unreachable_longer_than_store_timeout() {
    let limit = Duration::from_secs(30);
    let f = fixture(follower, follower, |s| s.with_store_timeout(Some(limit)));
    let beat = |f: &Fixture, err: Option<&str>| {
        let now = f.clock.now();
        for tx in &f.states {
            tx.send_modify(0, |s| {
                s.heartbeat = now;
                s.last_error = err.map(str::to_owned);
            });
        }
    };
    // Failing, but not for long enough yet.
    tokio::time::advance(Duration::from_secs(20)).await;
    beat(&f, Some("timeout"));
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
    tokio::time::advance(Duration::from_secs(11)).await;
    beat(&f, Some("timeout"));
    let a = call(&f.app, get("/healthz")).await;
    a.assert_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(a.text.contains("store unreachable"), "{}", a.text);
    assert!(a.text.contains("timeout"), "{}", a.text);

    // Old observation but no current error (e.g. sitting out): healthy.
    beat(&f, None);
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn healthz_store_timeout_counts_from_start_without_any_observation() {
    let limit = Duration::from_secs(30);
    let f = fixture(
        |name, now| ElectionState {
            observed_at: None,
            observed_at_unix_ms: None,
            last_error: Some("transport".into()),
            first_observation_done: false,
            rounds: 0,
            ..follower(name, now)
        },
        follower,
        |s| s.with_store_timeout(Some(limit)),
    );
    tokio::time::advance(limit).await;
    let now = f.clock.now();
    f.states[0].send_modify(0, |s| s.heartbeat = now);
    f.states[1].send_modify(0, |s| s.heartbeat = now);
    assert_eq!(call(&f.app, get("/healthz")).await.status, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(1)).await;
    let a = call(&f.app, get("/healthz")).await;
    a.assert_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(a.text.contains("report"), "{}", a.text);
    assert!(!a.text.contains("my election"), "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn resign_is_disabled_without_an_admin_token() {
    for token in [None, Some(String::new())] {
        let mut f = fixture(leader, follower, |s| s.with_admin_token(token));
        let a = call(
            &f.app,
            resign_req("/leader/report/resign", Some(&format!("Bearer {TOKEN}"))),
        )
        .await;
        a.assert_error(StatusCode::NOT_FOUND, "resign_disabled");
        assert!(f.resigns.try_recv().is_err(), "a disabled resign was sent");
    }
}

#[tokio::test(start_paused = true)]
async fn resign_refuses_missing_malformed_and_wrong_tokens() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let uri = "/leader/report/resign";
    for auth in [
        None,
        Some(""),
        Some("Bearer"),
        Some("Bearer   "),
        Some(TOKEN),
        Some("Basic dXNlcjpwYXNz"),
    ] {
        let a = call(&f.app, resign_req(uri, auth)).await;
        a.assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let challenge = a.headers[header::WWW_AUTHENTICATE].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
    }
    // Not UTF-8.
    let mut req = resign_req(uri, None);
    req.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
    );
    call(&f.app, req)
        .await
        .assert_error(StatusCode::UNAUTHORIZED, "unauthorized");
    // Two Authorization headers, one of them right.
    let mut req = resign_req(uri, Some(&format!("Bearer {TOKEN}")));
    req.headers_mut().append(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer other"),
    );
    call(&f.app, req)
        .await
        .assert_error(StatusCode::UNAUTHORIZED, "unauthorized");

    // A head past 64 KiB is refused before anything looks at it.
    let past_the_limit = format!("Bearer {}", "A".repeat(70_000));
    call(&f.app, resign_req(uri, Some(&past_the_limit)))
        .await
        .assert_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
        );
    let huge = format!("Bearer {}", "A".repeat(60_000));
    for auth in [
        "Bearer wrong",
        &format!("Bearer {TOKEN}x"),
        &format!("Bearer {}", &TOKEN[1..]),
        &huge,
    ] {
        call(&f.app, resign_req(uri, Some(auth)))
            .await
            .assert_error(StatusCode::FORBIDDEN, "forbidden");
    }
    // Authentication comes before the election lookup.
    call(
        &f.app,
        resign_req("/leader/nope/resign", Some("Bearer wrong")),
    )
    .await
    .assert_error(StatusCode::FORBIDDEN, "forbidden");
    assert!(
        f.resigns.try_recv().is_err(),
        "an unauthorized resign reached the daemon"
    );
}

#[tokio::test(start_paused = true)]
async fn resign_with_the_token_reaches_the_daemon() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let auth = format!("bearer  {TOKEN}");
    // The daemon: answers "report" with success, anything else with an error.
    let daemon = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(req) = f.resigns.recv().await {
            let answer = if req.election == "report" {
                Ok(Resigned::SittingOut)
            } else {
                Err(ResignError::Failed("election is shutting down".to_owned()))
            };
            seen.push(req.election);
            let _ = req.done.send(answer);
        }
        seen
    });

    let a = call(&f.app, resign_req("/leader/report/resign", Some(&auth))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let body = a.json();
    assert_eq!(body["election"], "report");
    assert_eq!(body["status"], "resigned");

    call(
        &f.app,
        resign_req("/leader/my%20election/resign", Some(&auth)),
    )
    .await
    .assert_error(StatusCode::INTERNAL_SERVER_ERROR, "resign_failed");
    call(&f.app, resign_req("/leader/nope/resign", Some(&auth)))
        .await
        .assert_error(StatusCode::NOT_FOUND, "unknown_election");

    drop(f.app);
    assert_eq!(
        daemon.await.unwrap(),
        vec!["report".to_owned(), "my election".to_owned()]
    );
}

#[tokio::test(start_paused = true)]
async fn resign_of_an_election_not_led_here_is_409() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let daemon = tokio::spawn(async move {
        let req = f.resigns.recv().await.expect("a resign request");
        let _ = req
            .done
            .send(Err(ResignError::NotLeader(req.election.clone())));
    });
    call(
        &f.app,
        resign_req("/leader/report/resign", Some(&format!("Bearer {TOKEN}"))),
    )
    .await
    .assert_error(StatusCode::CONFLICT, "not_leader");
    daemon.await.expect("the daemon task ran");
}

#[tokio::test(start_paused = true)]
async fn resign_answers_202_when_stepping_down_outlasts_the_request() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let started = tokio::time::Instant::now();
    let a = call(
        &f.app,
        resign_req("/leader/report/resign", Some(&format!("Bearer {TOKEN}"))),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(a.json()["status"], "in_progress");
    assert_eq!(
        started.elapsed(),
        leaderd::http::DEFAULT_REQUEST_TIMEOUT,
        "answered at the request timeout"
    );
    // The request was delivered (the daemon just had not answered).
    let req = f.resigns.try_recv().expect("the resign was sent");
    assert_eq!(req.election, "report");
}

/// A resign request with the body `chunks` streamed in pieces (no
/// `Content-Length`, as a chunked request arrives), and a flag set once
/// anything reads the body.
fn streamed_resign(
    auth: Option<&str>,
    chunks: Vec<Vec<u8>>,
) -> (Request<Body>, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let read = Arc::new(AtomicBool::new(false));
    let flag = read.clone();
    use futures_util::StreamExt;
    let stream = futures_util::stream::iter(chunks).map(move |c| {
        flag.store(true, Ordering::SeqCst);
        Ok::<_, std::convert::Infallible>(c)
    });
    let mut b = Request::post("/leader/report/resign");
    if let Some(a) = auth {
        b = b.header(header::AUTHORIZATION, a);
    }
    (b.body(Body::from_stream(stream)).unwrap(), read)
}

#[tokio::test(start_paused = true)]
async fn a_refused_resign_never_reads_its_body() {
    use std::sync::atomic::Ordering;
    let big = || vec![vec![b' '; 1024 * 1024]; 3];
    let cases = [
        (None, None, StatusCode::NOT_FOUND, "resign_disabled"),
        (Some(TOKEN), None, StatusCode::UNAUTHORIZED, "unauthorized"),
        (
            Some(TOKEN),
            Some("Bearer wrong"),
            StatusCode::FORBIDDEN,
            "forbidden",
        ),
    ];
    for (configured, auth, status, code) in cases {
        let mut f = fixture(leader, follower, |s| {
            s.with_admin_token(configured.map(str::to_owned))
        });
        let (req, read) = streamed_resign(auth, big());
        call(&f.app, req).await.assert_error(status, code);
        assert!(!read.load(Ordering::SeqCst), "{code}: the body was read");
        assert!(f.resigns.try_recv().is_err());
    }
}

#[tokio::test(start_paused = true)]
async fn a_streamed_resign_body_past_the_limit_is_a_json_413() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let auth = format!("Bearer {TOKEN}");
    let limit = leaderd::http::MAX_BODY_BYTES;
    // In one piece, in small pieces, and one byte over in the last piece.
    for chunks in [
        vec![vec![b' '; 3 * 1024 * 1024]],
        vec![vec![b' '; 1000]; 100],
        vec![vec![b' '; limit], vec![b' ']],
    ] {
        let (req, _) = streamed_resign(Some(&auth), chunks);
        call(&f.app, req)
            .await
            .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    }
    assert!(
        f.resigns.try_recv().is_err(),
        "an oversized resign was sent"
    );
    // At the limit (whitespace around the JSON) it is read.
    let mut body = vec![b' '; limit - 10];
    body.extend_from_slice(br#"{"to":"x"}"#);
    let (req, _) = streamed_resign(Some(&auth), vec![body]);
    let daemon = tokio::spawn(async move {
        let req = f.resigns.recv().await.expect("a resign request");
        assert_eq!(req.to.as_deref(), Some("x"));
        let _ = req.done.send(Ok(Resigned::SittingOut));
    });
    let a = call(&f.app, req).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    daemon.await.expect("the daemon task ran");
}

#[tokio::test(start_paused = true)]
async fn resign_bodies_other_than_an_object_are_400() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let auth = format!("Bearer {TOKEN}");
    for body in [
        r#"["web-2"]"#,
        r#""web-2""#,
        "null",
        "42",
        "true",
        r#"{"to": ["web-2"]}"#,
        r#"{"to": "web-2", "x": 1}"#,
        "{",
    ] {
        let mut req = resign_req("/leader/report/resign", Some(&auth));
        *req.body_mut() = Body::from(body);
        call(&f.app, req)
            .await
            .assert_error(StatusCode::BAD_REQUEST, "bad_request");
    }
    assert!(
        f.resigns.try_recv().is_err(),
        "a bad body reached the daemon"
    );
}

#[tokio::test(start_paused = true)]
async fn each_resign_outcome_has_its_answer() {
    let mut f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    let outcomes = vec![
        Ok(Resigned::Exiting),
        Err(ResignError::InProgress {
            election: "report".into(),
            to: Some("web-2".into()),
        }),
        Err(ResignError::ShuttingDown),
    ];
    let daemon = tokio::spawn(async move {
        for outcome in outcomes {
            let req = f.resigns.recv().await.expect("a resign request");
            let _ = req.done.send(outcome);
        }
        // Dropped unanswered: the daemon ended.
        let req = f.resigns.recv().await.expect("a resign request");
        drop(req);
    });
    let auth = format!("Bearer {TOKEN}");
    let a = call(&f.app, resign_req("/leader/report/resign", Some(&auth))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["status"], "resigned");
    assert!(
        a.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("shutting down")),
        "{}",
        a.text
    );
    let a = call(&f.app, resign_req("/leader/report/resign", Some(&auth))).await;
    a.assert_error(StatusCode::CONFLICT, "resign_in_progress");
    assert!(a.json()["message"].as_str().unwrap().contains("`web-2`"));
    call(&f.app, resign_req("/leader/report/resign", Some(&auth)))
        .await
        .assert_error(StatusCode::SERVICE_UNAVAILABLE, "shutting_down");
    call(&f.app, resign_req("/leader/report/resign", Some(&auth)))
        .await
        .assert_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    daemon.await.expect("the daemon task ran");
}

#[tokio::test(start_paused = true)]
async fn resign_when_the_daemon_is_gone_is_503() {
    let f = fixture(leader, follower, |s| s.with_admin_token(Some(TOKEN.into())));
    drop(f.resigns);
    call(
        &f.app,
        resign_req("/leader/report/resign", Some(&format!("Bearer {TOKEN}"))),
    )
    .await
    .assert_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
}

#[tokio::test(start_paused = true)]
async fn metrics_endpoint_serves_promtool_clean_text_computed_now() {
    let f = fixture(leader, follower, |s| s);
    let a = call(&f.app, get("/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers[header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        a.text
            .contains("leaderd_is_leader{election=\"report\"} 1\n"),
        "{}",
        a.text
    );
    assert!(
        a.text
            .contains("leaderd_is_leader{election=\"my election\"} 0\n"),
        "{}",
        a.text
    );
    leaderd::metrics::promtool_check(&a.text);

    tokio::time::advance(Duration::from_millis(7_700)).await;
    let a = call(&f.app, get("/metrics")).await;
    assert!(
        a.text
            .contains("leaderd_is_leader{election=\"report\"} 0\n"),
        "{}",
        a.text
    );
}

fn renewed(rvn: &str) -> LeaseEvent {
    LeaseEvent::Renewed {
        election: "report".into(),
        holder: "web-1".into(),
        rvn: rvn.into(),
        fencing_token: 42,
        lease_ms: 10_000,
    }
}

/// The next line of a watch stream as JSON; `None` once the stream ended.
async fn next_event(body: &mut Body) -> Option<Value> {
    let frame = body.frame().await?.expect("the stream does not fail");
    let data = frame.into_data().expect("a data frame");
    let text = std::str::from_utf8(&data).expect("UTF-8");
    assert!(text.ends_with('\n'), "one event per line: {text:?}");
    Some(serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}")))
}

/// `GET /v1/elections/report/watch`, its body still streaming.
async fn open_watch(app: &Router) -> axum::response::Response {
    app.clone()
        .oneshot(get("/v1/elections/report/watch"))
        .await
        .expect("infallible")
}

/// `leaderd_watch_streams{election="report"}` as `GET /metrics` shows it.
async fn watch_streams(app: &Router) -> Option<f64> {
    let text = call(app, get("/metrics")).await.text;
    text.lines()
        .find_map(|l| l.strip_prefix("leaderd_watch_streams{election=\"report\"} "))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(start_paused = true)]
async fn a_leaders_watch_stream_tells_each_renewal_then_its_release_and_counts_while_open() {
    let (events, rx) = board::channel(Some(renewed("r1")));
    let f = fixture(leader, follower, |s| s.with_watch("report", rx));
    assert_eq!(watch_streams(&f.app).await, Some(0.0));

    let res = open_watch(&f.app).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "application/x-ndjson");
    let mut body = res.into_body();
    // At once: the current state.
    let first = next_event(&mut body).await.expect("a first event");
    assert_eq!(
        first,
        serde_json::json!({"event": "renewed", "election": "report", "holder": "web-1",
            "rvn": "r1", "fencing_token": 42, "lease_ms": 10_000})
    );
    assert_eq!(watch_streams(&f.app).await, Some(1.0));

    events.send_replace(0, Some(renewed("r2")));
    assert_eq!(next_event(&mut body).await.expect("an event")["rvn"], "r2");
    events.send_replace(
        0,
        Some(LeaseEvent::Released {
            election: "report".into(),
            rvn: "r3".into(),
            fencing_token: 42,
            successor: Some("web-3".into()),
        }),
    );
    let released = next_event(&mut body).await.expect("an event");
    assert_eq!(released["event"], "released", "{released}");
    assert_eq!(released["rvn"], "r3");
    assert_eq!(released["successor"], "web-3");
    // Its last word: the stream ends, and no longer counts.
    assert_eq!(next_event(&mut body).await, None);
    assert_eq!(watch_streams(&f.app).await, Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_watch_stream_counts_until_its_client_goes_away() {
    let (_events, rx) = board::channel(Some(renewed("r1")));
    let f = fixture(leader, follower, |s| s.with_watch("report", rx));
    let res = open_watch(&f.app).await;
    let mut body = res.into_body();
    assert!(next_event(&mut body).await.is_some());
    assert_eq!(watch_streams(&f.app).await, Some(1.0));
    drop(body);
    assert_eq!(watch_streams(&f.app).await, Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_followers_watch_stream_says_not_leader_and_ends() {
    // A value left from when it led is not news any more.
    let (_events, rx) = board::channel(Some(renewed("r1")));
    let f = fixture(follower, follower, |s| s.with_watch("report", rx));
    let res = open_watch(&f.app).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    assert_eq!(
        next_event(&mut body).await,
        Some(serde_json::json!({"event": "not_leader", "election": "report"}))
    );
    assert_eq!(next_event(&mut body).await, None);
    assert_eq!(watch_streams(&f.app).await, Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_watch_of_an_unknown_election_is_a_json_404() {
    let (_events, rx) = board::channel(Some(renewed("r1")));
    let f = fixture(leader, follower, |s| s.with_watch("report", rx));
    call(&f.app, get("/v1/elections/nope/watch"))
        .await
        .assert_error(StatusCode::NOT_FOUND, "unknown_election");
}

/// A real socket: requests are served, and shutdown is bounded even while a
/// request hangs (a resign the daemon never answers).
#[tokio::test]
async fn serve_answers_on_a_socket_and_shuts_down_within_the_drain_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let clock = Clock::tokio();
    let now = clock.now();
    let (_tx, rx) = board::channel(leader("report", now));
    let (resign_tx, mut resigns) = mpsc::channel(4);
    let mut state = AppState::new("report", clock, Arc::new(Metrics::new()), resign_tx)
        .with_election(rx, WEDGE)
        .with_admin_token(Some(TOKEN.into()));
    state.request_timeout = Duration::from_secs(600);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = Duration::from_millis(500);
    let server = tokio::spawn(leaderd::http::serve_with_drain(
        listener,
        router(state),
        async move {
            let _ = stop_rx.await;
        },
        drain,
    ));

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"is_leader\":true"), "{answer}");

    // A resign that the daemon never answers keeps its connection busy.
    let mut hanging = tokio::net::TcpStream::connect(addr).await.unwrap();
    hanging
        .write_all(
            format!(
                "POST /leader/report/resign HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let pending = resigns.recv().await.expect("resign reached the daemon");
    assert_eq!(pending.election, "report");

    let asked = std::time::Instant::now();
    stop_tx.send(()).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("serve returned after shutdown despite a hanging request");
    res.unwrap().unwrap();
    let took = asked.elapsed();
    assert!(took >= drain, "returned before the drain time: {took:?}");
    // New connections are refused (or closed) after shutdown.
    drop(pending);
}
