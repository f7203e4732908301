//! `leaderd run --sessions` with real processes, on SQLite, on DynamoDB
//! Local and on PostgreSQL (there, all but the followers' reads at rest,
//! which the benchmark measures, and the stream that hides releases, which
//! is the stream's behaviour): three daemons campaign for five elections
//! (one scenario: a hundred), every election held
//! through its leader's one session record. The leader is killed, stopped,
//! has its session deleted, loses answers to its renews, has its store
//! stalled, is stopped gracefully, releases its elections behind a stream
//! that hides it; a CLI lock meets a daemon; daemons restart. Whatever happens, the jobs of the primary election never run
//! at once (the history checker), tokens only rise, every election the
//! leader held is led again within the takeover rule's bound, and sessions
//! that are over are ended in the store, never reused.
//!
//! Timing (see `harness::TIMING`): L = 5 s, R = 1 s, P = 500 ms,
//! G = 500 ms. Bounds on real time add `SLACK` (3 s) for the loaded
//! machine; none is tight.

use crate::common;
#[path = "sessions/harness.rs"]
pub(crate) mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::app::App;
use common::daemon::{Leaderd, wait_until};
use common::history;
use common::proxy::{Fault, FaultProxy};
use common::stream::{fake_watch_server, send_chunk, stream_head, upstream_events};
use harness::{
    Cluster, ELECTIONS, G, Kind, L, P, R, SLACK, Store, all_led_once, elections_of, monotonic_ns,
    sessions_opened, sqlite, takeover_wait, validity, who_leads,
};
use nix::sys::signal::Signal;

/// How long a follower may take to lead an election whose leader died:
/// it times the session's last `rvn` for L·(1+D) from when it first saw
/// it (at most a poll after it was written), then ends the session and
/// takes the election: two writes, a read or two.
fn crash_bound() -> Duration {
    takeover_wait() + Duration::from_secs(2) + SLACK
}

/// Every election's leader in `led` holds it with a higher token than
/// `before`.
fn assert_tokens_rose(before: &BTreeMap<String, u64>, nodes: &[&Leaderd]) {
    let led = who_leads(nodes);
    for (election, old) in before {
        let leaders = &led[election];
        assert_eq!(leaders.len(), 1, "{election}: {leaders:?}");
        assert!(
            leaders[0].1 > *old,
            "{election}: token {} after {old}",
            leaders[0].1
        );
    }
}

/// Let the primary's leader's job run, stop every node, check the
/// history.
fn finish(c: &mut Cluster) -> history::Summary {
    let leader = wait_until(Duration::from_secs(20), || {
        who_leads(&c.all())
            .get(ELECTIONS[0])
            .is_some_and(|l| l.len() == 1)
    })
    .map(|_| who_leads(&c.all())[ELECTIONS[0]][0].0.clone())
    .expect("the primary has one leader");
    wait_until(Duration::from_secs(10), || c.job_running(&leader))
        .unwrap_or_else(|| panic!("the job of {leader} does not run"));
    sleep(Duration::from_millis(500));
    c.stop_all();
    c.check_history()
}

/// The primary's first tenure is `node-a`'s with `token`, and a later one
/// (another job, started once that one was over) has a higher token.
fn assert_primary_moved_on(summary: &history::Summary, token: u64) {
    let first = &summary.tenures[0].id;
    assert_eq!(
        (first.identity.as_str(), first.fencing_token),
        ("node-a", token),
        "{summary}"
    );
    assert!(
        summary.tenures[1..]
            .iter()
            .any(|t| t.id.fencing_token > token),
        "no job ran for the primary after node-a's: {summary}"
    );
}

/// `node`'s log says it let its session `first` go: found it lost, or,
/// holding nothing through it for a lease, ended it itself (an end that
/// may fail while the store is cut off; the others ended it anyway). It
/// opened no other under a key it used before.
fn wait_session_lost(node: &Leaderd, first: &str) {
    wait_until(Duration::from_secs(10) + SLACK, || {
        let log = node.log();
        log.contains("session lost") || let_go_unused(&log)
    })
    .unwrap_or_else(|| panic!("{} did not let its session go", node.identity));
    fresh_keys(node, first);
}

/// Whether `log` shows a session ended for want of use, or its end write
/// tried (a session core ends one only at shutdown or for want of use).
fn let_go_unused(log: &str) -> bool {
    log.contains("held nothing through it") || log.contains("op=\"end_session\"")
}

/// The session keys `node` opened, the first `first`, none twice.
fn fresh_keys(node: &Leaderd, first: &str) -> Vec<String> {
    let opened = sessions_opened(&node.log());
    assert_eq!(opened[0], first);
    let distinct: BTreeSet<&String> = opened.iter().collect();
    assert_eq!(
        distinct.len(),
        opened.len(),
        "a session key reused: {opened:?}"
    );
    opened
}

/// `node`'s log says its session was lost and it opened another one,
/// under a key it never used: all its session keys. (It opens one at once
/// while a tenure it held through the lost one is still stopping.)
fn wait_session_replaced(node: &Leaderd, first: &str) -> Vec<String> {
    wait_until(Duration::from_secs(10) + SLACK, || {
        let log = node.log();
        log.contains("session lost") && sessions_opened(&log).len() >= 2
    })
    .unwrap_or_else(|| {
        panic!(
            "{} did not report a lost session and open a new one",
            node.identity
        )
    });
    fresh_keys(node, first)
}

/// `node` leads nothing, answers 503 on `/leader`, and `others` lead
/// every election, at every sample for 2 s.
fn assert_follows(node: &Leaderd, others: &[&Leaderd]) {
    let from = Instant::now();
    while from.elapsed() < Duration::from_secs(2) {
        let status = node.leader().map(|(s, _)| s);
        assert_eq!(status, Some(503), "{} /leader", node.identity);
        let views = elections_of(node).expect("/status answers");
        assert!(views.values().all(|v| !v.is_leader), "{views:?}");
        assert!(all_led_once(others, &ELECTIONS), "{:?}", who_leads(others));
        sleep(Duration::from_millis(200));
    }
}

/// The session record under `key` is ended: there, with no holder.
fn assert_ended(store: &Store, key: &str) {
    let row = store
        .row(key)
        .unwrap_or_else(|| panic!("no session record {key}"));
    assert_eq!(row.holder, None, "session {key} not ended: {row:?}");
}

/// 1. kill -9 of the daemon leading every election: each is led again by
///    another within the crash bound, with a higher token; the dead
///    daemon's session ends up ended; its job stopped (the guard) before
///    another's started.
fn kill_9_of_the_leader(kind: Kind) {
    let mut c = Cluster::new(kind);
    let before = c.settle(None);
    let session = c.only_session("node-a");
    let mut a = c.take("node-a");
    let killed = Instant::now();
    a.kill9();
    wait_until(crash_bound() + Duration::from_secs(10), || {
        all_led_once(&c.all(), &ELECTIONS)
    })
    .unwrap_or_else(|| panic!("not every election is led again: {:?}", who_leads(&c.all())));
    let took = killed.elapsed();
    eprintln!("every election led again {took:?} after kill -9 of its leader");
    assert!(took <= crash_bound(), "{took:?} > {:?}", crash_bound());
    assert_tokens_rose(&before, &c.all());
    assert_ended(&c.store, &session);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
    drop(a);
}

/// 1b. kill -9 of a daemon leading a hundred elections through its one
///     session: each is led again by another within the crash bound, with
///     a higher token; its session ends up ended; the primary's jobs
///     never overlap.
fn kill_9_of_a_daemon_holding_100_elections(kind: Kind) {
    let names: Vec<String> = (0..100).map(|i| format!("e{i:03}")).collect();
    let elections: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut c = Cluster::new(kind);
    c.start("node-a", &elections, None);
    wait_until(Duration::from_secs(60), || {
        all_led_once(&[c.node("node-a")], &elections) && c.job_running("node-a")
    })
    .unwrap_or_else(|| panic!("node-a does not lead the hundred elections"));
    for id in ["node-b", "node-c"] {
        c.start(id, &elections, None);
    }
    wait_until(Duration::from_secs(60), || {
        c.others("node-a").iter().all(|n| {
            elections_of(n).is_some_and(|v| {
                v.len() == elections.len()
                    && v.values().all(|e| e.leader.as_deref() == Some("node-a"))
            })
        })
    })
    .unwrap_or_else(|| panic!("node-b and node-c do not follow node-a everywhere"));
    let before = c.tokens_of("node-a");
    assert_eq!(before.len(), elections.len());
    let session = c.only_session("node-a");
    let mut a = c.take("node-a");
    let killed = Instant::now();
    a.kill9();
    wait_until(crash_bound() + Duration::from_secs(10), || {
        all_led_once(&c.all(), &elections)
    })
    .unwrap_or_else(|| panic!("not every election is led again: {:?}", who_leads(&c.all())));
    let took = killed.elapsed();
    eprintln!("a hundred elections led again {took:?} after kill -9 of their leader");
    assert!(took <= crash_bound(), "{took:?} > {:?}", crash_bound());
    assert_tokens_rose(&before, &c.all());
    assert_ended(&c.store, &session);
    let primary = who_leads(&c.all())[elections[0]][0].0.clone();
    wait_until(Duration::from_secs(10), || c.job_running(&primary))
        .unwrap_or_else(|| panic!("the job of {primary} does not run"));
    c.stop_all();
    let summary = c.check_history();
    assert!(summary.tenures.len() >= 2, "{summary}");
    drop(a);
}

#[test]
fn kill_9_of_a_daemon_holding_100_elections_on_postgres() {
    kill_9_of_a_daemon_holding_100_elections(Kind::Postgres);
}

#[test]
fn kill_9_of_the_leader_frees_every_election_on_sqlite() {
    kill_9_of_the_leader(Kind::Sqlite);
}

#[test]
fn kill_9_of_the_leader_frees_every_election_on_dynamodb_local() {
    kill_9_of_the_leader(Kind::DynamoDbLocal);
}

#[test]
fn kill_9_of_the_leader_frees_every_election_on_postgres() {
    kill_9_of_the_leader(Kind::Postgres);
}

/// 2. SIGSTOP of the leading daemon for 2·L: the others lead every
///    election while it is stopped (its job killed by the guard first);
///    thawed, it reports its session lost and follows. (Whether it opens a
///    new session at once depends on whether a tenure held through the
///    lost one is still stopping when it finds it lost: a race at the
///    thaw.) Once the others stop, it leads every election again through
///    a session under a key it never used.
fn sigstop_for_two_leases(kind: Kind) {
    let mut c = Cluster::new(kind);
    let before = c.settle(None);
    let first = c.only_session("node-a");
    // Out of the cluster while stopped: it would not answer a probe.
    let a = c.take("node-a");
    let stopped = Instant::now();
    a.signal(Signal::SIGSTOP);
    wait_until(crash_bound() + Duration::from_secs(10), || {
        all_led_once(&c.all(), &ELECTIONS)
    })
    .unwrap_or_else(|| panic!("not every election is led: {:?}", who_leads(&c.all())));
    let took = stopped.elapsed();
    eprintln!("every election led by another {took:?} after SIGSTOP of its leader");
    assert!(took <= crash_bound(), "{took:?} > {:?}", crash_bound());
    assert_tokens_rose(&before, &c.all());
    assert_ended(&c.store, &first);
    sleep((stopped + 2 * L).saturating_duration_since(Instant::now()));
    a.signal(Signal::SIGCONT);
    wait_until(Duration::from_secs(10) + SLACK, || {
        a.log().contains("session lost")
    })
    .expect("node-a, thawed, reports its session lost");
    fresh_keys(&a, &first);
    wait_until(Duration::from_secs(5), || {
        matches!(a.leader(), Some((503, _)))
            && elections_of(&a).is_some_and(|v| {
                v.values()
                    .all(|e| !e.is_leader && e.leader.as_deref() != Some("node-a"))
            })
    })
    .expect("node-a follows once thawed");
    assert_follows(&a, &c.all());
    lead_alone_through_a_new_session(&mut c, a, &first);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
}

/// Stop every node of `c` (each hands its elections over) and put `a`
/// back: it leads every election alone, through a session under a key it
/// never used (not `first`).
fn lead_alone_through_a_new_session(c: &mut Cluster, a: Leaderd, first: &str) {
    c.stop_all();
    c.nodes = vec![a];
    let a = &c.nodes[0];
    wait_until(Duration::from_secs(2) + SLACK, || {
        all_led_once(&[a], &ELECTIONS)
    })
    .unwrap_or_else(|| panic!("node-a does not lead every election: {:?}", who_leads(&[a])));
    let opened = fresh_keys(a, first);
    let last = opened.last().expect("a session");
    assert_ne!(last, first, "node-a leads through its lost session");
    let held = c.store.row(last).expect("its new session's record");
    assert_eq!(held.holder.as_deref(), Some("node-a"), "{held:?}");
    for name in ELECTIONS {
        let row = c.store.row(name).expect("the record");
        assert_eq!(row.session.as_deref(), Some(last.as_str()), "{row:?}");
    }
}

#[test]
fn sigstop_of_the_leader_for_two_leases_on_sqlite() {
    sigstop_for_two_leases(Kind::Sqlite);
}

#[test]
fn sigstop_of_the_leader_for_two_leases_on_dynamodb_local() {
    sigstop_for_two_leases(Kind::DynamoDbLocal);
}

#[test]
fn sigstop_of_the_leader_for_two_leases_on_postgres() {
    sigstop_for_two_leases(Kind::Postgres);
}

/// When each (election, identity other than `node-a`) was first seen
/// leading after `since`, until every election has one leader; and when
/// that was, if before `limit`.
fn watch_leaders(
    c: &Cluster,
    since: Instant,
    limit: Duration,
) -> (Option<Duration>, BTreeMap<(String, String), Duration>) {
    let mut seen = BTreeMap::new();
    while since.elapsed() < limit {
        let at = since.elapsed();
        let led = who_leads(&c.all());
        for (election, leaders) in &led {
            for (id, _) in leaders.iter().filter(|(id, _)| id != "node-a") {
                seen.entry((election.clone(), id.clone())).or_insert(at);
            }
        }
        if ELECTIONS
            .iter()
            .all(|e| led.get(*e).is_some_and(|l| l.len() == 1))
        {
            return (Some(at), seen);
        }
        sleep(Duration::from_millis(50));
    }
    (None, seen)
}

/// 3. The leader's session record deleted by hand: it loses every
///    election (503, its job stopped) and opens a new session; nobody
///    else leads one before timing the missing session for L·(1+D);
///    every election is led again within about 2·L. Then it is killed and
///    its new session deleted at once: the others lead every election only
///    after timing the missing record, within the crash bound.
fn deleted_session(kind: Kind) {
    let mut c = Cluster::new(kind);
    let before = c.settle(None);
    let first = c.only_session("node-a");
    let deleted = Instant::now();
    c.store.delete(&first);
    wait_until(R + G + SLACK, || {
        matches!(c.node("node-a").leader(), Some((503, _)))
    })
    .expect("node-a still answers 200 on /leader");
    let (all_led, seen) = watch_leaders(&c, deleted, 2 * L + SLACK);
    let all_led = all_led.unwrap_or_else(|| {
        panic!(
            "not every election led within 2·L: {:?}",
            who_leads(&c.all())
        )
    });
    eprintln!(
        "every election led again {all_led:?} after the deletion; others first seen {seen:?}"
    );
    assert_taken_after_timing(&seen);
    let opened = wait_session_replaced(c.node("node-a"), &first);

    // Its elections may be held through its new session now: kill it and
    // delete that one too, so that only the others can take them.
    let second = opened.last().expect("a new session").clone();
    let mut a = c.take("node-a");
    a.kill9();
    let deleted = Instant::now();
    c.store.delete(&second);
    let (all_led, seen) = watch_leaders(&c, deleted, crash_bound());
    eprintln!("node-a killed, its session deleted: every election led {all_led:?} later");
    assert!(all_led.is_some(), "{:?}", who_leads(&c.all()));
    assert_taken_after_timing(&seen);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
    drop(a);
}

/// Nobody but `node-a` took an election before timing its missing
/// session for L·(1+D) (`seen`: when each was first seen leading one).
fn assert_taken_after_timing(seen: &BTreeMap<(String, String), Duration>) {
    for ((election, id), at) in seen {
        assert!(
            *at >= takeover_wait(),
            "{id} led {election} {at:?} after the deletion, before L·(1+D)"
        );
    }
}

#[test]
fn a_deleted_session_loses_every_election_on_sqlite() {
    deleted_session(Kind::Sqlite);
}

#[test]
fn a_deleted_session_loses_every_election_on_dynamodb_local() {
    deleted_session(Kind::DynamoDbLocal);
}

#[test]
fn a_deleted_session_loses_every_election_on_postgres() {
    deleted_session(Kind::Postgres);
}

/// `node-a` leads every election with the tokens of `before`, and nobody
/// else leads any, at every sample for `span`.
fn assert_keeps_leading(c: &Cluster, before: &BTreeMap<String, u64>, span: Duration) {
    let from = Instant::now();
    while from.elapsed() < span {
        let led = who_leads(&c.all());
        for (election, token) in before {
            let expected = vec![("node-a".to_string(), *token)];
            assert_eq!(
                led.get(election),
                Some(&expected),
                "{election} after {:?}",
                from.elapsed()
            );
        }
        sleep(Duration::from_millis(100));
    }
}

/// The instant the session `key` was just renewed (its `rvn` moved).
fn just_renewed(store: &Store, key: &str) -> Instant {
    let rvn = store.row(key).and_then(|r| r.rvn);
    wait_until(R + SLACK, || store.row(key).and_then(|r| r.rvn) != rvn)
        .expect("the session is renewed");
    Instant::now()
}

/// `node-a` stopped its job while the store was stalled (from `from_ns`
/// to `to_ns`): the last line of its tenure `token` came before the end
/// of the stall.
fn assert_job_stopped_within(c: &Cluster, token: u64, from_ns: u64, to_ns: u64) {
    let log = c.history_text();
    let last = log
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() == 5 && f[2] == "node-a" && f[3] == token.to_string())
        .filter_map(|f| f[0].parse::<u64>().ok())
        .max()
        .expect("node-a's job wrote lines");
    let ran = Duration::from_nanos(last.saturating_sub(from_ns));
    eprintln!("node-a's job last seen {ran:?} into the stall");
    assert!(last < to_ns, "node-a's job ran past the stall: {ran:?}");
}

/// The tail of scenario 4: after a stall past validity ended, every
/// election is led again, by anyone, and the history is safe.
fn recover_after_long_stall(c: &mut Cluster, token: u64, released: Instant) {
    wait_until(crash_bound(), || all_led_once(&c.all(), &ELECTIONS)).unwrap_or_else(|| {
        panic!(
            "not every election led {:?} after the stall: {:?}",
            released.elapsed(),
            who_leads(&c.all())
        )
    });
    let log = c.node("node-a").log();
    let said: Vec<&str> = log.lines().filter(|l| l.contains("session")).collect();
    eprintln!(
        "every election led again {:?} after the stall; node-a said:\n{}",
        released.elapsed(),
        said.join("\n")
    );
    let summary = finish(c);
    assert_eq!(summary.tenures[0].id.fencing_token, token, "{summary}");
}

/// 4 on SQLite. The test holds the file's write lock: first for 2·R just
/// after a renew (shorter than the validity: the renew is retried and
/// lands, `node-a` keeps every election), then for 2·L (past validity:
/// `node-a` stops its job while nobody can write, and the history shows
/// no overlap once everyone can again).
#[test]
fn a_store_stall_on_sqlite() {
    let mut c = Cluster::new(Kind::Sqlite);
    let before = c.settle(None);
    let key = c.only_session("node-a");
    // The renew due during the short stall is retried every P and lands
    // once it ends, long before the tenures would stop.
    assert!(2 * R + P < validity() - G);
    let lock = sqlite(c.store.sqlite_path().expect("SQLite"));
    just_renewed(&c.store, &key);
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the lock");
    assert_keeps_leading(&c, &before, 2 * R);
    lock.execute_batch("ROLLBACK").expect("release the lock");
    let rvn = c.store.row(&key).and_then(|r| r.rvn);
    assert_keeps_leading(&c, &before, L);
    assert_ne!(c.store.row(&key).and_then(|r| r.rvn), rvn, "not renewed");
    assert_eq!(sessions_opened(&c.node("node-a").log()), [key.as_str()]);

    let from_ns = monotonic_ns();
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the lock");
    sleep(2 * L);
    let to_ns = monotonic_ns();
    lock.execute_batch("ROLLBACK").expect("release the lock");
    let released = Instant::now();
    assert_job_stopped_within(&c, before[ELECTIONS[0]], from_ns, to_ns);
    recover_after_long_stall(&mut c, before[ELECTIONS[0]], released);
}

/// `fault` on the next PutItem through `proxy` only: with `node-a`
/// leading every election, its only writes are session renews.
fn fault_one_renew(proxy: &FaultProxy, fault: Fault) {
    proxy.clear_counts();
    proxy.set_for(&["PutItem"], fault.clone());
    let hit = wait_until(R + SLACK, || {
        proxy.counts().get("PutItem").copied().unwrap_or(0) >= 1
    });
    proxy.set_for(&["PutItem"], Fault::None);
    assert!(hit.is_some(), "no renew went through the proxy");
    let n = proxy.counts().get("PutItem").copied().unwrap_or(0);
    eprintln!("{fault:?} on one renew ({n} PutItem seen meanwhile)");
}

/// 4 on DynamoDB Local, `node-a` behind a fault proxy: one renew applied
/// and its answer lost (connection reset: the store reads it back), one
/// applied and its answer never coming (timeout: the session core's next
/// renew is refused and adopts it), and `node-a` keeps every election
/// through both; then all of its traffic blackholed for 2·L: the others
/// lead only once its job stopped, and it comes back with a new session.
#[test]
fn a_store_stall_on_dynamodb_local() {
    let mut c = Cluster::new(Kind::DynamoDbLocal);
    let proxy = FaultProxy::start(c.store.upstream().expect("DynamoDB"));
    let before = c.settle(Some(&proxy));
    let key = c.only_session("node-a");
    for fault in [Fault::ApplyThenLoseAnswer, Fault::ApplyThenHang] {
        fault_one_renew(&proxy, fault);
        assert_keeps_leading(&c, &before, L);
    }
    let log = c.node("node-a").log();
    assert!(log.contains("session store writes fail"), "{log}");
    assert!(!log.contains("session lost"), "{log}");
    assert_eq!(sessions_opened(&log), [key.as_str()]);

    let from_ns = monotonic_ns();
    let cut = Instant::now();
    proxy.set(Fault::Blackhole);
    let others = c.others("node-a");
    wait_until(crash_bound() + Duration::from_secs(10), || {
        all_led_once(&others, &ELECTIONS)
    })
    .unwrap_or_else(|| {
        panic!(
            "the others do not lead every election: {:?}",
            who_leads(&others)
        )
    });
    let took = cut.elapsed();
    eprintln!("the others lead every election {took:?} into the blackhole");
    assert!(took <= crash_bound(), "{took:?} > {:?}", crash_bound());
    assert_job_stopped_within(&c, before[ELECTIONS[0]], from_ns, monotonic_ns());
    sleep((cut + 2 * L).saturating_duration_since(Instant::now()));
    proxy.set(Fault::None);
    // Back, it finds its session ended. Its elections are led by others
    // by now: it opens no new session until one of them needs it.
    wait_session_lost(c.node("node-a"), &key);
    assert_ended(&c.store, &key);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
}

/// 5. SIGTERM of the leader: it stops its job, releases every election
///    and ends its session; the others take every election at once
///    (within about 2 s: a poll, or the released hint), with higher
///    tokens; it exits 0 (its job's code).
fn sigterm_of_the_leader(kind: Kind) {
    let mut c = Cluster::new(kind);
    let before = c.settle(None);
    let session = c.only_session("node-a");
    let mut a = c.take("node-a");
    let asked = Instant::now();
    a.signal(Signal::SIGTERM);
    let bound = Duration::from_secs(2) + SLACK;
    wait_until(bound + Duration::from_secs(10), || {
        all_led_once(&c.all(), &ELECTIONS)
    })
    .unwrap_or_else(|| panic!("not every election is led: {:?}", who_leads(&c.all())));
    let took = asked.elapsed();
    eprintln!("every election led by another {took:?} after SIGTERM of its leader");
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert_tokens_rose(&before, &c.all());
    let status = a
        .wait_exit(Duration::from_secs(30))
        .expect("node-a exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let log = a.log();
    assert_eq!(
        log.matches("released the lease").count(),
        ELECTIONS.len(),
        "{log}"
    );
    assert!(log.contains("session ended"), "{log}");
    assert_ended(&c.store, &session);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
}

#[test]
fn sigterm_of_the_leader_hands_every_election_over_on_sqlite() {
    sigterm_of_the_leader(Kind::Sqlite);
}

#[test]
fn sigterm_of_the_leader_hands_every_election_over_on_dynamodb_local() {
    sigterm_of_the_leader(Kind::DynamoDbLocal);
}

#[test]
fn sigterm_of_the_leader_hands_every_election_over_on_postgres() {
    sigterm_of_the_leader(Kind::Postgres);
}

/// `leaderd lock acquire …`, expected to succeed: the token.
fn lock_acquire(store: &Store, name: &str, extra: &[&str]) -> String {
    let out = store.leaderd(&["lock", "acquire", name], extra);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// 6a. A CLI lock holds `xray` while a `--sessions` daemon campaigns for
///     `yankee` and `xray`: it leads `yankee`, never `xray` while the
///     lock is held (over two leases); once the lock is released it leads
///     `xray` too, held through its session (format 2).
fn a_cli_lock_keeps_a_sessions_daemon_out(kind: Kind) {
    let mut c = Cluster::new(kind);
    let token = lock_acquire(&c.store, "xray", &["--lease-duration", "1m"]);
    c.start("node-a", &["yankee", "xray"], None);
    wait_until(Duration::from_secs(20), || {
        c.tokens_of("node-a").contains_key("yankee")
    })
    .expect("node-a leads yankee");
    let from = Instant::now();
    while from.elapsed() < 2 * L + Duration::from_secs(1) {
        let views = elections_of(c.node("node-a")).expect("/status answers");
        assert!(!views["xray"].is_leader, "led a locked election: {views:?}");
        assert!(views["yankee"].is_leader, "{views:?}");
        sleep(Duration::from_millis(100));
    }
    let out = c.store.leaderd(&["lock", "release", "xray", &token], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(P + SLACK, || c.tokens_of("node-a").contains_key("xray"))
        .expect("node-a leads xray once the lock is released");
    let session = c.only_session("node-a");
    for name in ["yankee", "xray"] {
        let row = c.store.row(name).expect("the record");
        assert_eq!(row.holder.as_deref(), Some("node-a"), "{row:?}");
        assert_eq!(row.session.as_deref(), Some(session.as_str()), "{row:?}");
        assert_eq!(row.format, Some(2), "{row:?}");
    }
    c.stop_all();
    c.check_history();
}

#[test]
fn a_cli_lock_keeps_a_sessions_daemon_out_on_sqlite() {
    a_cli_lock_keeps_a_sessions_daemon_out(Kind::Sqlite);
}

#[test]
fn a_cli_lock_keeps_a_sessions_daemon_out_on_dynamodb_local() {
    a_cli_lock_keeps_a_sessions_daemon_out(Kind::DynamoDbLocal);
}

#[test]
fn a_cli_lock_keeps_a_sessions_daemon_out_on_postgres() {
    a_cli_lock_keeps_a_sessions_daemon_out(Kind::Postgres);
}

/// 6b. The reverse: a `--sessions` daemon holds `xray` through its
///     session, whose renewals leave the election record's `rvn` alone.
///     `lock acquire --no-wait` is refused (busy, 75); a waiting
///     `lock acquire --wait 3·L` must not get it either while the daemon
///     renews its session, and the daemon keeps leading with its token.
fn a_cli_lock_never_takes_a_session_held_election(kind: Kind) {
    let mut c = Cluster::new(kind);
    c.start("node-a", &["xray"], None);
    wait_until(Duration::from_secs(20), || {
        c.tokens_of("node-a").contains_key("xray")
    })
    .expect("node-a leads xray");
    let token = c.tokens_of("node-a")["xray"];
    let out = c
        .store
        .leaderd(&["lock", "acquire", "xray", "--no-wait"], &[]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{said}");
    assert!(said.contains("node-a"), "names the holder: {said}");

    let wait = format!("{}s", (3 * L).as_secs());
    let mut waiter = c
        .store
        .command(&["lock", "acquire", "xray"], &["--wait", &wait])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the waiting lock");
    let limit = 3 * L + Duration::from_secs(30);
    let from = Instant::now();
    while waiter.try_wait().expect("try_wait").is_none() && from.elapsed() < limit {
        assert_eq!(c.tokens_of("node-a").get("xray"), Some(&token));
        sleep(Duration::from_millis(200));
    }
    let _ = waiter.kill();
    let out = waiter.wait_with_output().expect("the waiter's output");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(75),
        "the CLI took an election the daemon holds through its live session \
         (stdout {:?}): {said}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(c.tokens_of("node-a").get("xray"), Some(&token));
    let row = c.store.row("xray").expect("the record");
    assert_eq!(row.holder.as_deref(), Some("node-a"), "{row:?}");
    c.stop_all();
}

#[test]
fn a_cli_lock_never_takes_a_session_held_election_on_sqlite() {
    a_cli_lock_never_takes_a_session_held_election(Kind::Sqlite);
}

#[test]
fn a_cli_lock_never_takes_a_session_held_election_on_dynamodb_local() {
    a_cli_lock_never_takes_a_session_held_election(Kind::DynamoDbLocal);
}

#[test]
fn a_cli_lock_never_takes_a_session_held_election_on_postgres() {
    a_cli_lock_never_takes_a_session_held_election(Kind::Postgres);
}

/// Start `solo` for two elections and wait until it leads both with its
/// job running (within `limit`); the key of its session.
fn start_solo(c: &mut Cluster, limit: Duration) -> String {
    c.start("solo", &ELECTIONS[..2], None);
    wait_until(limit, || {
        all_led_once(&c.all(), &ELECTIONS[..2]) && c.job_running("solo")
    })
    .unwrap_or_else(|| panic!("solo does not lead: {:?}", who_leads(&c.all())));
    c.only_session("solo")
}

/// The election records released at a graceful stop: no holder, no
/// session, format 1.
fn assert_released(store: &Store) {
    for name in &ELECTIONS[..2] {
        let row = store.row(name).expect("the record");
        assert_eq!(row.holder, None, "{row:?}");
        assert_eq!(row.session, None, "{row:?}");
        assert_eq!(row.format, Some(1), "{row:?}");
    }
}

/// 7. One identity restarted: three graceful stops, a kill -9 and a last
///    start. Each process opens its own session key, never an earlier
///    one; the store keeps every session record (a sweep deletes none at
///    first sight, and each process sweeps once before this ends), the
///    earlier ones ended (the one of the killed process ended by its
///    successor before it took the elections), only the live one held.
fn restarts(kind: Kind) {
    let mut c = Cluster::new(kind);
    let mut keys = Vec::new();
    // Exited processes, kept for their logs (their pids may be reused).
    let mut gone = Vec::new();
    for _ in 0..3 {
        keys.push(start_solo(&mut c, Duration::from_secs(20)));
        c.stop_all();
        gone.push(c.take("solo"));
        assert_released(&c.store);
        assert_ended(&c.store, keys.last().expect("a key"));
    }
    keys.push(start_solo(&mut c, Duration::from_secs(20)));
    let mut killed = c.take("solo");
    killed.kill9();
    gone.push(killed);
    let live = c.store.row(&keys[3]).expect("the killed process's session");
    assert_eq!(live.holder.as_deref(), Some("solo"), "{live:?}");
    keys.push(start_solo(&mut c, crash_bound() + Duration::from_secs(10)));

    let distinct: BTreeSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "a session key reused: {keys:?}");
    let stored: Vec<_> = c.store.sessions();
    eprintln!("session records after 5 starts: {stored:#?}");
    let stored_keys: BTreeSet<&String> = stored.iter().map(|r| &r.key).collect();
    assert_eq!(stored_keys, distinct, "{stored:?}");
    for row in &stored {
        let expected = (row.key == keys[4]).then_some("solo");
        assert_eq!(row.holder.as_deref(), expected, "{row:?}");
        assert_eq!(row.format, Some(2), "{row:?}");
    }
    c.stop_all();
    assert_released(&c.store);
    assert!(c.store.sessions().iter().all(|r| r.holder.is_none()));
    c.check_history();
    drop(gone);
}

#[test]
fn restarts_open_fresh_sessions_and_end_the_old_ones_on_sqlite() {
    restarts(Kind::Sqlite);
}

#[test]
fn restarts_open_fresh_sessions_and_end_the_old_ones_on_dynamodb_local() {
    restarts(Kind::DynamoDbLocal);
}

#[test]
fn restarts_open_fresh_sessions_and_end_the_old_ones_on_postgres() {
    restarts(Kind::Postgres);
}

/// Store reads `node` made so far: of election records (alone, or up to
/// a hundred in one request, `read_elections`), and of session records.
fn reads_of(node: &Leaderd) -> (f64, f64) {
    let (_, text) = node.get("/metrics").expect("metrics");
    let mut reads = (0.0, 0.0);
    for line in text.lines() {
        if !line.starts_with("leaderd_store_request_duration_seconds_count{") {
            continue;
        }
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if line.contains("op=\"read\"") || line.contains("op=\"read_elections\"") {
            reads.0 += count;
        } else if line.contains("op=\"read_session\"") {
            reads.1 += count;
        }
    }
    reads
}

/// 8. At rest the followers read no election's record: the leader's
///    stream (`GET /v1/watch`) tells of its session's writes and of each
///    election's events, and each follower reads the leader's session
///    about once every two leases for all five elections.
fn followers_at_rest(kind: Kind) {
    let mut c = Cluster::new(kind);
    c.settle(None);
    // Each follower reads every election once more after its stream
    // began to flow; then leaves them alone.
    sleep(2 * L);
    let before = reads_of(c.node("node-b"));
    let span = 4 * L;
    sleep(span);
    let after = reads_of(c.node("node-b"));
    let (elections, sessions) = (after.0 - before.0, after.1 - before.1);
    eprintln!(
        "node-b read {elections} election records and {sessions} session records in {span:?}"
    );
    // The counts are real: node-b read the elections when it started (the
    // five together, in one request), and its series are there to be
    // counted.
    assert!(
        before.0 >= 1.0,
        "node-b's election reads are not counted ({} before the rest): the test would measure nothing",
        before.0
    );
    // Polling would read each of the five every P: 200 reads.
    assert_eq!(elections, 0.0, "a follower read election records at rest");
    // The session is still timed by reading it: about two reads.
    assert!(
        sessions >= 1.0,
        "node-b never read node-a's session in {span:?}: the follower stopped timing it"
    );
    // About two (one every 2·L·(1+D)); a stream that stalls on a loaded
    // machine costs a few more, never one per election.
    assert!(sessions <= 8.0, "{sessions} session reads in {span:?}");
    c.stop_all();
}

#[test]
fn followers_read_no_election_at_rest_on_sqlite() {
    followers_at_rest(Kind::Sqlite);
}

#[test]
fn followers_read_no_election_at_rest_on_dynamodb_local() {
    followers_at_rest(Kind::DynamoDbLocal);
}

/// A relay at `node-a`'s advertised address: its daemon stream, every
/// `released` and `not_leader` left out (counted in `dropped`).
fn relay_without_releases(
    port: u16,
    dropped: Arc<AtomicUsize>,
) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        if stream_head(&mut conn).is_err() {
            return;
        }
        for (line, event) in upstream_events(port, "/v1/watch") {
            if event["event"] == "released" || event["event"] == "not_leader" {
                dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if send_chunk(&mut conn, &line).is_err() {
                return;
            }
        }
        let _ = write!(conn, "0\r\n\r\n");
    }
}

/// 9. A stream that leaves releases out: `node-a` advertises a relay of
///    its stream that drops every `released` and `not_leader`, and runs
///    balance, so that its session stays open while it leads nothing.
///    Its app check fails: it releases every election and renews its
///    session on. The others learn of the releases from the count of
///    ended tenures that the session's next write carries, at their next
///    read of the session (about every two leases, each up to R past its
///    due), and lead every election within 2·L·(1+D) + 2·R + P (and the
///    app check's 1 s); never while the stream alone decides.
fn hidden_releases(kind: Kind) {
    let mut c = Cluster::new(kind);
    let app = App::start(c.dir.path(), "app", "ok");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let relay_at = listener.local_addr().expect("address").to_string();
    let app_url = app.url();
    let extra = [
        "--advertise",
        &relay_at,
        "--balance",
        "--app-check",
        &app_url,
    ];
    let env = [
        ("INTERVAL", "500ms"),
        ("TIMEOUT", "300ms"),
        ("FAILURE_THRESHOLD", "2"),
    ]
    .map(|(k, v)| (format!("LEADERD_APP_CHECK__{k}"), v.to_owned()));
    c.start_with("node-a", &ELECTIONS, None, &extra, env.to_vec());
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicUsize::new(0));
    let relay = relay_without_releases(c.node("node-a").port, dropped.clone());
    fake_watch_server(listener, stop.clone(), relay);
    let before = c.settle_started();
    // Each follower reads every election once more after its stream began
    // to flow, then leaves them to the stream and the session.
    sleep(2 * L);
    // At rest: node-b reads no election. Then, at a moment of the session
    // reads' cycle left to chance, node-a's app fails.
    let rest = reads_of(c.node("node-b"));
    sleep(L + (2 * L).mul_f64(rand::random::<f64>()));
    assert_eq!(reads_of(c.node("node-b")).0, rest.0, "node-b polls at rest");
    let failed = Instant::now();
    app.set("fail");
    wait_until(Duration::from_secs(5), || {
        c.tokens_of("node-a").is_empty() && c.node("node-a").log().contains("released the lease")
    })
    .expect("node-a releases its elections once its app fails");
    let bound = 2 * takeover_wait() + 2 * R + P + Duration::from_secs(1) + SLACK;
    wait_until(bound + Duration::from_secs(10), || {
        all_led_once(&c.others("node-a"), &ELECTIONS)
    })
    .unwrap_or_else(|| {
        panic!(
            "the others do not lead every election after node-a released them: {:?}",
            who_leads(&c.all())
        )
    });
    let took = failed.elapsed();
    eprintln!("every election led by another {took:?} after node-a's app failed");
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert!(
        dropped.load(Ordering::Relaxed) >= ELECTIONS.len(),
        "the relay dropped only {} events",
        dropped.load(Ordering::Relaxed)
    );
    let log = c.node("node-a").log();
    assert!(
        !log.contains("session ended"),
        "node-a ended its session: {log}"
    );
    assert_tokens_rose(&before, &c.others("node-a"));
    stop.store(true, Ordering::Relaxed);
    let summary = finish(&mut c);
    assert_primary_moved_on(&summary, before[ELECTIONS[0]]);
}

#[test]
fn a_stream_that_hides_releases_delays_them_by_a_read_of_the_session_on_sqlite() {
    hidden_releases(Kind::Sqlite);
}

#[test]
fn a_stream_that_hides_releases_delays_them_by_a_read_of_the_session_on_dynamodb_local() {
    hidden_releases(Kind::DynamoDbLocal);
}
