//! Forged hints, with real processes: something at the leader's advertised
//! address relays the leader's real watch stream and forges one field of
//! it (the lease, the holder, the fencing token, the successor, the event
//! kind, the rvn), or alternates, replays or floods events; after the
//! leader is killed it goes on naming the dead leader's last rvn and
//! made-up ones in turn. Nothing it says may make a second leader, and
//! once the leader is dead a follower leads within L·(1+D) + 3·P.
//!
//! The poll interval P is 1 s here (the bound is about P), L = 4 s.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Cluster, Store, crash_scenario, fake_watch_server, send_chunk, stream_head};
use super::{upstream_events, wait_until};

/// L = 4 s, R = 2 s, P = 1 s, G = 1 s.
const TIMING: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--renew-interval",
    "2s",
    "--retry-interval",
    "1s",
    "--kill-grace",
    "1s",
];
const L: Duration = Duration::from_secs(4);
const P: Duration = Duration::from_secs(1);

/// What the forger at the leader's address does to its stream.
#[derive(Debug, Clone, Copy)]
pub(super) enum Forgery {
    /// `renewed` events claim a 1 ms lease.
    LeaseMs,
    /// `renewed` events name a follower as the holder.
    Holder,
    /// `renewed` events carry the largest and the smallest fencing token.
    FencingToken,
    /// After each `renewed`, a `released` of the live rvn to a follower.
    Successor,
    /// After each `renewed`, the same as `released` and as `not_leader`,
    /// and now and then an event of a kind nobody knows.
    Kind,
    /// Every `renewed` names a made-up rvn instead of the real one.
    Rvn,
    /// A made-up rvn, then the real one again, every 0.5 s.
    Alternating,
    /// The first event ever seen and the one before, again and again.
    Replay,
    /// Dozens of forged events every 250 ms.
    Flood,
}

fn made_up_rvn() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn renewed(rvn: &str) -> Value {
    json!({
        "event": "renewed", "election": "report", "holder": "alpha",
        "rvn": rvn, "fencing_token": 1u64 << 50, "lease_ms": 4000,
    })
}

impl Forgery {
    /// What goes out for a real `event` (`first` and `previous`: the first
    /// and the previous real events).
    fn on_event(self, event: &Value, first: &Value, previous: &Value) -> Vec<Value> {
        let is_renewed = event["event"] == "renewed";
        let with = |key: &str, value: Value| {
            let mut e = event.clone();
            e[key] = value;
            e
        };
        match self {
            Forgery::LeaseMs if is_renewed => vec![with("lease_ms", json!(1))],
            Forgery::Holder if is_renewed => vec![with("holder", json!("bravo"))],
            Forgery::FencingToken if is_renewed => vec![
                with("fencing_token", json!(u64::MAX)),
                with("fencing_token", json!(0)),
            ],
            Forgery::Successor if is_renewed => vec![
                event.clone(),
                json!({"event": "released", "election": "report", "rvn": event["rvn"],
                       "fencing_token": event["fencing_token"], "successor": "bravo"}),
            ],
            Forgery::Kind if is_renewed => vec![
                event.clone(),
                with("event", json!("released")),
                json!({"event": "not_leader", "election": "report"}),
            ],
            Forgery::Rvn if is_renewed => vec![with("rvn", json!(made_up_rvn()))],
            Forgery::Alternating => vec![event.clone(), renewed(&made_up_rvn())],
            Forgery::Replay => vec![event.clone(), first.clone(), previous.clone()],
            _ => vec![event.clone()],
        }
    }

    /// What goes out every 250 ms between real events (`tick` counts
    /// them); `last_rvn` is the last real rvn.
    fn idle(self, tick: u64, first: &Value, previous: &Value, last_rvn: &str) -> Vec<Value> {
        match self {
            Forgery::Kind if tick % 8 == 0 => {
                vec![json!({"event": "taken", "election": "report", "rvn": last_rvn})]
            }
            Forgery::Alternating => alternate(tick, last_rvn),
            Forgery::Replay => vec![first.clone(), previous.clone()],
            Forgery::Flood => (0..25)
                .map(|i| match i % 4 {
                    0 => renewed(&made_up_rvn()),
                    1 => json!({"event": "released", "election": "report", "rvn": last_rvn,
                                "fencing_token": 1, "successor": made_up_rvn()}),
                    2 => json!({"event": "not_leader", "election": "report"}),
                    _ => {
                        let mut e = renewed(last_rvn);
                        e["lease_ms"] = json!(1);
                        e
                    }
                })
                .collect(),
            _ => vec![],
        }
    }
}

/// Every other 250 ms tick: a made-up rvn, then the real one again.
fn alternate(tick: u64, last_rvn: &str) -> Vec<Value> {
    match tick % 4 {
        0 => vec![renewed(&made_up_rvn())],
        2 => vec![renewed(last_rvn)],
        _ => vec![],
    }
}

/// The forger: the real leader's stream from `upstream_port`, spoilt as
/// `forgery` says; once the real stream ends (the leader died) it keeps
/// going, alternating the last real rvn with made-up ones. Counts what it
/// sent in `sent`.
fn forger(
    upstream_port: u16,
    forgery: Forgery,
    sent: Arc<AtomicUsize>,
) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        if stream_head(&mut conn).is_err() {
            return;
        }
        let (tx, rx) = mpsc::channel::<Value>();
        std::thread::spawn(move || {
            for (_, event) in upstream_events(upstream_port) {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        let mut first: Option<Value> = None;
        let mut previous = Value::Null;
        let mut last_rvn = made_up_rvn();
        for tick in 0u64.. {
            let out = match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(event) => {
                    let first = first.get_or_insert_with(|| event.clone());
                    if let Some(rvn) = event["rvn"].as_str() {
                        last_rvn = rvn.to_owned();
                    }
                    let out = forgery.on_event(&event, first, &previous);
                    previous = event;
                    out
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let first = first.clone().unwrap_or(Value::Null);
                    forgery.idle(tick, &first, &previous, &last_rvn)
                }
                // The leader is gone: the lies go on.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(250));
                    let first = first.clone().unwrap_or(Value::Null);
                    let mut out = forgery.idle(tick, &first, &previous, &last_rvn);
                    out.extend(alternate(tick, &last_rvn));
                    out
                }
            };
            for event in out.iter().filter(|e| !e.is_null()) {
                if send_chunk(&mut conn, &event.to_string()).is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// alpha leads behind a forger; bravo and charlie follow. While alpha
/// lives nobody else leads; after its kill -9 one of them leads within
/// L·(1+D) + 3·P; the jobs never overlap and tokens rise.
pub(super) fn forged_hints_never_make_two_leaders_nor_none(store: Store, forgery: Forgery) {
    let mut cluster = Cluster::with_timing(store, &TIMING);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let fake = listener.local_addr().expect("address").to_string();
    cluster.start("alpha", &["--advertise", &fake]);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    fake_watch_server(
        listener,
        stop.clone(),
        forger(cluster.node("alpha").port, forgery, sent.clone()),
    );
    assert_eq!(cluster.one_leader(L * 3), "alpha");
    cluster.start("bravo", &[]);
    cluster.start("charlie", &[]);
    // The followers hear the forger before the crash.
    wait_until(L * 2, || sent.load(Ordering::Relaxed) >= 4).unwrap_or_else(|| {
        panic!(
            "{forgery:?}: the followers never heard the forger ({} events)",
            sent.load(Ordering::Relaxed)
        )
    });
    // Watched for 10 s (five renewals) before the kill.
    crash_scenario(&mut cluster, "alpha", L.mul_f64(1.01) + P * 3);
    stop.store(true, Ordering::Relaxed);
}

/// Each forgery, on one store.
macro_rules! forged_hint_tests {
    ($module:ident, $store:expr) => {
        mod $module {
            use super::forged::{Forgery, forged_hints_never_make_two_leaders_nor_none as run};
            use super::*;

            #[test]
            fn a_forged_lease_ms() {
                run($store, Forgery::LeaseMs);
            }

            #[test]
            fn a_forged_holder() {
                run($store, Forgery::Holder);
            }

            #[test]
            fn a_forged_fencing_token() {
                run($store, Forgery::FencingToken);
            }

            #[test]
            fn a_forged_successor() {
                run($store, Forgery::Successor);
            }

            #[test]
            fn a_forged_event_kind() {
                run($store, Forgery::Kind);
            }

            #[test]
            fn a_forged_rvn() {
                run($store, Forgery::Rvn);
            }

            #[test]
            fn alternating_rvns() {
                run($store, Forgery::Alternating);
            }

            #[test]
            fn replayed_events() {
                run($store, Forgery::Replay);
            }

            #[test]
            fn a_flood_of_forged_events() {
                run($store, Forgery::Flood);
            }
        }
    };
}
pub(super) use forged_hint_tests;
