//! The daemon's stream, `GET /v1/watch` (with sessions): its session's
//! writes and every election's events on one stream, through
//! `router(..).oneshot(..)` with paused tokio time.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use leaderd::clock::Clock;
use leaderd::core::node::Node;
use leaderd::driver::{NodeDriver, Running, Sessions, board};
use leaderd::election::{
    ElectionConfig, ElectionState, LeaseEvent, NoObserver, SessionView, TaskContext,
};
use leaderd::http::{AppState, router};
use leaderd::lease::{self, Condition, Lease, LeaseStore, StoreSpec};
use leaderd::metrics::Metrics;
use leaderd::watch::watchers::Watchers;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use tower::ServiceExt;

struct Fixture {
    app: Router,
    clock: Clock,
    peers: Sessions,
    _node: Running,
    watchers: Watchers,
    store: Arc<dyn LeaseStore>,
    _dir: tempfile::TempDir,
    session: watch::Sender<Option<SessionView>>,
    told: broadcast::Sender<LeaseEvent>,
    _state: board::StateBoard,
}

/// A daemon with one election and, when `sessions`, a session and the
/// daemon's stream (keeping `buffer` events for a slow client).
async fn fixture(sessions: bool, buffer: usize) -> Fixture {
    let clock = Clock::tokio();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = lease::open(&StoreSpec::Sqlite(dir.path().join("l.db")))
        .await
        .expect("a SQLite store");
    // What the daemon knows of other sessions: its node's (one of no
    // election, here).
    let context = TaskContext {
        store: store.clone(),
        clock: clock.clone(),
        observer: Arc::new(NoObserver),
    };
    let timing = ElectionConfig::with_defaults("report", "web-1");
    let node = Node::new("web-1", &timing, clock.now(), true);
    let (driver, _, mut node) = NodeDriver::new(node, context.clone());
    driver.spawn(&mut node);
    let peers = node.sessions(context);
    let now = clock.now();
    let (state_tx, state) = board::channel(ElectionState::example("report", "web-1", now));
    let (resign, _) = mpsc::channel(1);
    let (session, session_rx) = watch::channel(Some(view("#session/web-1/a", "s1", &clock)));
    let (told, _) = broadcast::channel(buffer);
    let watchers = Watchers::default();
    let mut app = AppState::new("report", clock.clone(), Arc::new(Metrics::new()), resign)
        .with_election(state, Duration::from_secs(25));
    if sessions {
        app = app
            .with_session(session_rx, Duration::from_millis(9_700))
            .with_daemon_stream(told.clone(), Some(watchers.clone()));
    }
    Fixture {
        app: router(app),
        clock,
        peers,
        _node: node,
        watchers,
        store,
        _dir: dir,
        session,
        told,
        _state: state_tx,
    }
}

fn view(key: &str, rvn: &str, clock: &Clock) -> SessionView {
    SessionView {
        key: key.into(),
        rvn: rvn.into(),
        last_send: clock.now(),
        labels: std::sync::Arc::new([("led".to_owned(), "3".to_owned())].into()),
    }
}

async fn open(app: &Router) -> axum::response::Response {
    open_as(app, None).await
}

/// The stream, opened by a daemon naming `session` as its own.
async fn open_as(app: &Router, session: Option<&str>) -> axum::response::Response {
    let mut req = Request::get("/v1/watch");
    if let Some(key) = session {
        req = req.header("x-leaderd-session", key);
    }
    let req = req.body(Body::empty()).expect("a request");
    app.clone().oneshot(req).await.expect("infallible")
}

/// The next line as JSON; `None` once the stream ended.
async fn next(body: &mut Body) -> Option<Value> {
    let frame = body.frame().await?.expect("the stream does not fail");
    let data = frame.into_data().expect("a data frame");
    let text = std::str::from_utf8(&data).expect("UTF-8");
    assert!(text.ends_with('\n'), "one event per line: {text:?}");
    Some(serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}")))
}

fn released(election: &str) -> LeaseEvent {
    LeaseEvent::Released {
        election: election.into(),
        rvn: "r9".into(),
        fencing_token: 7,
        successor: None,
    }
}

#[tokio::test(start_paused = true)]
async fn without_sessions_there_is_no_daemon_stream() {
    let f = fixture(false, 16).await;
    let res = open(&f.app).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let body = res.into_body().collect().await.expect("a body").to_bytes();
    let body: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(body["error"], "sessions_off", "{body}");
}

#[tokio::test(start_paused = true)]
async fn the_stream_tells_the_sessions_writes_and_every_elections_events_in_order() {
    let f = fixture(true, 16).await;
    let res = open(&f.app).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "application/x-ndjson");
    let mut body = res.into_body();
    // At once: the session's last write.
    let session = json!({"event": "session", "session": "#session/web-1/a", "rvn": "s1",
        "labels": {"led": "3"}});
    assert_eq!(next(&mut body).await, Some(session));
    // A renew, then an election's release, then another's.
    f.session
        .send_replace(Some(view("#session/web-1/a", "s2", &f.clock)));
    assert_eq!(next(&mut body).await.expect("an event")["rvn"], "s2");
    f.told.send(released("a")).expect("a receiver");
    f.told.send(released("b")).expect("a receiver");
    let a = next(&mut body).await.expect("an event");
    assert_eq!(
        (&a["event"], &a["election"]),
        (&json!("released"), &json!("a"))
    );
    assert_eq!(next(&mut body).await.expect("an event")["election"], "b");
    // Lapsed: nothing to tell. A new session: told, under its key.
    f.session.send_replace(None);
    f.session
        .send_replace(Some(view("#session/web-1/b", "t1", &f.clock)));
    let new = next(&mut body).await.expect("an event");
    assert_eq!(
        (&new["session"], &new["rvn"]),
        (&json!("#session/web-1/b"), &json!("t1"))
    );
    // The session task gone (the daemon stopping): the stream ends.
    drop(f.session);
    assert_eq!(next(&mut body).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_falls_behind_is_cut_off_and_never_told_a_gap() {
    let f = fixture(true, 4).await;
    let mut body = open(&f.app).await.into_body();
    assert_eq!(next(&mut body).await.expect("an event")["rvn"], "s1");
    for i in 0..10 {
        f.told.send(released(&format!("e{i}"))).expect("a receiver");
    }
    // It would have missed some: it is told none of them, and reads the
    // store instead once it opens the stream again.
    assert_eq!(next(&mut body).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_named_session_counts_once_the_store_shows_it_and_a_made_up_one_occupies_nothing() {
    let f = fixture(true, 16).await;
    // A real watcher: its session is in the store.
    let real = Lease::stamped("#session/web-2/x", "web-2", 0, 10_000, 1, None);
    f.store
        .write(&real, &Condition::NotExists, Duration::from_secs(1))
        .await
        .expect("the session is written");
    let a = open_as(&f.app, Some("#session/web-2/x")).await;
    // A flood of made-up names, and junk that is not a session key at all.
    let mut flood = Vec::new();
    for n in 0..1_100 {
        flood.push(open_as(&f.app, Some(&format!("#session/ghost-{n}/g"))).await);
    }
    let _b = open_as(&f.app, Some("web-3")).await;
    let _c = open_as(&f.app, Some(&format!("#session/{}", "x".repeat(600)))).await;
    // Names are only names: nothing is known before the store is asked.
    assert!(f.peers.sessions().await.is_empty());
    // Streams beyond the watch slots were refused, and their names dropped.
    assert!(f.watchers.len() <= 512, "{} names kept", f.watchers.len());
    let mut looked_up = 0;
    loop {
        let keys = f.watchers.unchecked(100);
        if keys.is_empty() {
            break;
        }
        f.peers
            .look_up(&keys, Duration::from_secs(1))
            .await
            .expect("the store answers");
        f.watchers.checked(&keys);
        looked_up += keys.len();
    }
    assert_eq!(looked_up, f.watchers.len(), "each name looked up once");
    let known: Vec<String> = f
        .peers
        .sessions()
        .await
        .into_iter()
        .map(|k| k.key)
        .collect();
    assert_eq!(
        known,
        ["#session/web-2/x"],
        "only the session the store shows"
    );
    drop((a, flood));
    assert_eq!(f.watchers.len(), 0, "a name goes with its stream");
}
