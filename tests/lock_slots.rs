//! Counting locks (`leaderd lock … --slots N`) with real processes, on
//! SQLite, on DynamoDB Local and on PostgreSQL: 20 racing holders of a
//! lock of 3 slots never more than 3 at once, tokens rising (the history
//! checker, `check_at_most`); a `kill -9`ed holder's slot taken only after
//! its lease, the live holder's kept; `--no-wait` on a full lock; a daemon
//! that waits while any holder renews; a mismatched N, a plain lock met
//! with `--slots` and the reverse, and bad values of `--slots`, each a
//! clear error.

use crate::common;
use crate::lock::{Sink, Store, run_into, stderr, stdout};

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, leaderd_bin, wait_until};
use common::history;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Racing holders, and the slots they race for.
const RACERS: usize = 20;
const SLOTS: usize = 3;
/// How long they race.
const RACE: Duration = Duration::from_secs(60);

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    u64::try_from(t.tv_sec()).expect("after boot") * 1_000_000_000
        + u64::try_from(t.tv_nsec()).expect("below a second")
}

/// The history log, one whole line per write.
struct Log(Mutex<File>);

impl Log {
    fn line(&self, ns: u64, event: &str, identity: &str, token: u64, writer: usize) {
        let text = format!("{ns} {event} {identity} {token} {writer}\n");
        let mut file = self.0.lock().expect("no writer panicked holding it");
        file.write_all(text.as_bytes()).expect("history write");
    }
}

/// The fencing token at the head of a lock token.
fn fencing(token: &str) -> u64 {
    token
        .split('.')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{token:?} is no lock token"))
}

/// One racer: take a slot (waiting), work for 50 ms to 1.5 s writing a
/// beat every 50 ms, release it; again until the race is over. Returns
/// how often it held a slot, how often its wait ran out, and how often its
/// slot was gone when it released it.
fn racer(store: &Store, name: &str, n: usize, log: &Log, until: Instant) -> (usize, usize, usize) {
    let identity = format!("racer-{n}");
    let slots = SLOTS.to_string();
    let (mut held, mut ran_out, mut lost) = (0, 0, 0);
    while Instant::now() < until {
        let asked = mono_ns();
        let mut cmd = store.command(
            &["lock", "acquire"],
            &[
                name,
                "--slots",
                &slots,
                "--lease-duration",
                "30s",
                "--wait",
                "20s",
            ],
        );
        cmd.env("LEADERD_IDENTITY", &identity)
            .env("LEADERD_LEASE__RETRY_INTERVAL", "200ms");
        let (out, ended) = common::daemon::output_within(&mut cmd, Duration::from_secs(60));
        assert!(ended, "{identity}: acquire did not end");
        match out.status.code() {
            Some(0) => {}
            Some(75) => {
                ran_out += 1;
                continue;
            }
            other => panic!("{identity}: acquire exited {other:?}: {}", stderr(&out)),
        }
        let token = stdout(&out);
        let t = fencing(&token);
        log.line(asked, "ask", &identity, t, n);
        log.line(mono_ns(), "start", &identity, t, n);
        let work = Duration::from_millis(50 + rand::random::<u64>() % 1450);
        let from = Instant::now();
        while from.elapsed() < work {
            std::thread::sleep(Duration::from_millis(50));
            log.line(mono_ns(), "beat", &identity, t, n);
        }
        log.line(mono_ns(), "end", &identity, t, n);
        let out = store.lock("release", &[name, &token, "--slots", &slots]);
        match out.status.code() {
            Some(0) => {}
            // Its slot was taken while it held it: the history shows how.
            Some(77) => lost += 1,
            other => panic!(
                "{identity}: release of {token} exited {other:?}: {}",
                stderr(&out)
            ),
        }
        held += 1;
    }
    (held, ran_out, lost)
}

fn racers_never_exceed_the_slots(store: &Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("history.log");
    let log = Arc::new(Log(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("history log"),
    )));
    let name = common::unique_name("slots");
    let until = Instant::now() + RACE;
    let threads: Vec<_> = (0..RACERS)
        .map(|n| {
            let (store, log, name) = (store.clone(), log.clone(), name.clone());
            std::thread::spawn(move || racer(&store, &name, n, &log, until))
        })
        .collect();
    let (mut held, mut ran_out, mut lost) = (0, 0, 0);
    for t in threads {
        let (h, r, l) = t.join().expect("a racer panicked");
        held += h;
        ran_out += r;
        lost += l;
    }
    let text = std::fs::read_to_string(&path).expect("history");
    let summary =
        history::check_at_most(&text, SLOTS).unwrap_or_else(|v| panic!("{v}\nhistory:\n{text}"));
    eprintln!(
        "{RACERS} racers, {SLOTS} slots, {}s: {held} tenures ({ran_out} waits ran out), at most {} at once, {} lines",
        RACE.as_secs(),
        summary.most_at_once,
        summary.lines
    );
    assert_eq!(summary.tenures.len(), held);
    assert_eq!(lost, 0, "slots lost while held");
    // The race filled every slot (else it proved little), and went on.
    assert_eq!(summary.most_at_once, SLOTS, "{summary}");
    assert!(held >= 3 * RACERS, "only {held} tenures in {RACE:?}");
    // Every slot was released: nobody holds it now.
    let shown = status(store, &name, &["--slots", &SLOTS.to_string()]);
    assert_eq!(shown["holders"], serde_json::json!([]), "{shown}");
}

#[test]
fn twenty_racers_never_exceed_three_slots_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    racers_never_exceed_the_slots(&Store::sqlite(dir.path()));
}

#[test]
fn twenty_racers_never_exceed_three_slots_on_dynamodb_local() {
    racers_never_exceed_the_slots(&Store::dynamodb());
}

#[test]
fn twenty_racers_never_exceed_three_slots_on_postgres() {
    racers_never_exceed_the_slots(&Store::postgres());
}

/// `lock status NAME --json` (and any more arguments), which must succeed.
fn status(store: &Store, name: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![name, "--json"];
    args.extend(extra);
    let out = store.lock("status", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("status JSON")
}

/// `lock acquire NAME --slots 2 EXTRA…` as `identity`, expected to succeed:
/// the token.
fn take(store: &Store, name: &str, identity: &str, extra: &[&str]) -> String {
    let mut args = vec![name, "--slots", "2"];
    args.extend(extra);
    let mut cmd = store.command(&["lock", "acquire"], &args);
    cmd.env("LEADERD_IDENTITY", identity);
    let (out, ended) = common::daemon::output_within(&mut cmd, Duration::from_secs(60));
    assert!(ended, "acquire did not end");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
}

/// Two slots: one held by a live holder (a long lease), one by a script
/// that took it for 3 s, renewed it once and was killed (`kill -9`): a
/// waiter takes the dead holder's slot only after 3 s · (1 + 1 %) of its
/// own clock, and the live one keeps its own.
fn a_killed_holders_slot_is_taken_after_its_lease(store: &Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = common::unique_name("slots-kill");
    let live = take(store, &name, "live", &["--lease-duration", "5m"]);
    let tokens = dir.path().join("tokens");
    let script = format!(
        r#"set -e
name=$1; shift
t=$("$0" lock acquire "$name" --slots 2 --lease-duration 3s "$@")
echo "$t" > "{tokens}.1"
sleep 0.5
t=$("$0" lock renew "$name" "$t" --slots 2 --lease-duration 3s "$@")
echo "$t" > "{tokens}.2"
exec sleep 600"#,
        tokens = tokens.display()
    );
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(&script)
        .arg(leaderd_bin())
        .arg(&name)
        .args(store_args(store))
        .env("LEADERD_IDENTITY", "doomed")
        .env("AWS_ACCESS_KEY_ID", "leaderdtest")
        .env("AWS_SECRET_ACCESS_KEY", "leaderdtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::null());
    let mut child = sh.spawn().expect("the holder's script");
    let renewed = tokens.with_extension("2");
    wait_until(Duration::from_secs(30), || renewed.exists())
        .unwrap_or_else(|| panic!("the script never renewed its slot"));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).expect("kill -9");
    let _ = child.wait();
    let dead = std::fs::read_to_string(&renewed).expect("its token");
    let dead = dead.trim();

    // Full: --no-wait says so at once.
    let out = store.lock("acquire", &[&name, "--slots", "2", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let said = stderr(&out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("all 2 slots are held") && said.contains("doomed"),
        "{said}"
    );

    let started = Instant::now();
    let taker = take(store, &name, "taker", &["--wait", "20s"]);
    let waited = started.elapsed();
    eprintln!("the dead holder's 3 s slot was taken after {waited:?}");
    assert!(
        waited >= Duration::from_millis(3030),
        "taken after {waited:?}: too early"
    );
    assert!(
        waited <= Duration::from_secs(6),
        "taken after {waited:?}: too late"
    );
    assert!(fencing(&taker) > fencing(dead), "{taker} after {dead}");
    assert!(fencing(&taker) > fencing(&live), "{taker} after {live}");
    // The dead holder's token is stale; the live one's still renews.
    let out = store.lock("renew", &[&name, dead, "--slots", "2"]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    let out = store.lock("renew", &[&name, &live, "--slots", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = status(store, &name, &[]);
    let holders: Vec<&str> = shown["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["holder"].as_str().expect("a holder"))
        .collect();
    assert_eq!(holders, ["live", "taker"], "{shown}");
    assert!(
        shown["holders"][1]["remaining_ms"].as_u64() > Some(0),
        "{shown}"
    );
}

/// The store arguments of `store`, as a script passes them on.
fn store_args(store: &Store) -> Vec<String> {
    let cmd = store.command(&[], &[]);
    cmd.get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_killed_holders_slot_is_taken_after_its_lease_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_killed_holders_slot_is_taken_after_its_lease(&Store::sqlite(dir.path()));
}

#[test]
fn a_killed_holders_slot_is_taken_after_its_lease_on_dynamodb_local() {
    a_killed_holders_slot_is_taken_after_its_lease(&Store::dynamodb());
}

#[test]
fn a_killed_holders_slot_is_taken_after_its_lease_on_postgres() {
    a_killed_holders_slot_is_taken_after_its_lease(&Store::postgres());
}

/// A slot whose token cannot reach stdout (`/dev/full`) is released again
/// at once (exit 74), after `acquire` and after `renew` alike: nobody could
/// renew or release it, and the other holders keep theirs.
#[test]
fn an_undeliverable_token_leaves_the_slot_free_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::sqlite(dir.path());
    let other = take(&store, "gate", "other", &[]);
    let (code, said) = run_into(
        store.command(&["lock", "acquire", "gate", "--slots", "2"], &[]),
        Sink::Full,
    );
    assert_eq!(code, Some(74), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("cannot write the token") && said.contains("released the slot again"),
        "{said}"
    );
    let taken = take(&store, "gate", "next", &["--no-wait"]);
    let (code, said) = run_into(
        store.command(&["lock", "renew", "gate", &taken, "--slots", "2"], &[]),
        Sink::Full,
    );
    assert_eq!(code, Some(74), "{said}");
    assert!(said.contains("released the slot again"), "{said}");
    let shown = status(&store, "gate", &[]);
    assert_eq!(
        shown["holders"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );
    assert_eq!(shown["holders"][0]["holder"], "other", "{shown}");
    let again = take(&store, "gate", "again", &["--no-wait"]);
    assert!(fencing(&again) > fencing(&taken) && fencing(&taken) > fencing(&other));
}

/// Each wrong use is one line on stderr naming the problem, with its exit
/// code, and changes nothing.
fn wrong_uses(store: &Store) {
    let counting = common::unique_name("counting");
    let plain = common::unique_name("plain");
    let slot = take(store, &counting, "a", &["--lease-duration", "5m"]);
    let out = store.lock("acquire", &[&plain, "--lease-duration", "5m"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plain_token = stdout(&out);
    let (c, p) = (counting.as_str(), plain.as_str());
    let cases: Vec<(&str, Vec<&str>, i32, &str)> = vec![
        // Another N, named with the lock's.
        (
            "acquire",
            vec![c, "--slots", "3", "--no-wait"],
            64,
            "is a counting lock of 2 slots, not 3",
        ),
        (
            "acquire",
            vec![c, "--slots", "1"],
            64,
            "is a counting lock of 2 slots, not 1",
        ),
        (
            "renew",
            vec![c, &slot, "--slots", "3"],
            64,
            "is a counting lock of 2 slots, not 3",
        ),
        (
            "release",
            vec![c, &slot, "--slots", "3"],
            64,
            "is a counting lock of 2 slots, not 3",
        ),
        (
            "status",
            vec![c, "--slots", "3"],
            64,
            "is a counting lock of 2 slots, not 3",
        ),
        // A counting lock without --slots.
        (
            "acquire",
            vec![c, "--no-wait"],
            64,
            "is a counting lock of 2 slots; give --slots 2",
        ),
        (
            "acquire",
            vec![c],
            64,
            "is a counting lock of 2 slots; give --slots 2",
        ),
        (
            "renew",
            vec![c, &slot],
            64,
            "is a counting lock of 2 slots; give --slots 2",
        ),
        (
            "release",
            vec![c, &slot],
            64,
            "is a counting lock of 2 slots; give --slots 2",
        ),
        // A plain lock with --slots.
        (
            "acquire",
            vec![p, "--slots", "2"],
            64,
            "is a plain lock (held by",
        ),
        (
            "renew",
            vec![p, &plain_token, "--slots", "2"],
            64,
            "is a plain lock (held by",
        ),
        (
            "release",
            vec![p, &plain_token, "--slots", "2"],
            64,
            "is a plain lock (held by",
        ),
        ("status", vec![p, "--slots", "2"], 64, "is a plain lock"),
        // A stale or foreign token.
        (
            "release",
            vec![c, &plain_token, "--slots", "2"],
            77,
            "nothing was changed",
        ),
    ];
    for (action, args, code, says) in &cases {
        let out = store.lock(action, args);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(*code), "{action} {args:?}: {said}");
        assert!(said.contains(says), "{action} {args:?}: {said}");
        assert_eq!(said.lines().count(), 1, "{action} {args:?}: {said}");
        assert!(!said.contains("panick"), "{said}");
    }
    // Bad values of --slots: the flag named, and why.
    for (value, says) in [
        ("0", "at least 1 slot"),
        ("501", "more than the limit of 500 slots"),
        ("99999999999999999999999", "not a whole number"),
        ("three", "not a whole number"),
        ("-1", "--slots"),
        ("", "not a whole number"),
    ] {
        for (action, args) in [
            ("acquire", vec![c, "--no-wait"]),
            ("renew", vec![c, &slot]),
            ("release", vec![c, &slot]),
            ("status", vec![c]),
        ] {
            let mut args = args.clone();
            let flag = format!("--slots={value}");
            args.push(&flag);
            let out = store.lock(action, &args);
            let said = stderr(&out);
            assert_eq!(out.status.code(), Some(64), "{action} {flag}: {said}");
            assert!(
                said.contains(says) && said.contains("--slots"),
                "{action} {flag}: {said}"
            );
            assert!(!said.contains("panick"), "{said}");
        }
    }
    // Nothing of that changed either lock.
    let shown = status(store, c, &[]);
    assert_eq!(shown["slots"], 2, "{shown}");
    assert_eq!(
        shown["holders"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );
    let out = store.lock("release", &[c, &slot, "--slots", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = store.lock("release", &[p, &plain_token]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Released, either may become the other, the token rising.
    let again = take(store, p, "b", &["--no-wait"]);
    assert!(fencing(&again) > fencing(&plain_token));
    let shown = status(store, p, &["--slots", "2"]);
    assert_eq!(shown["holders"][0]["holder"], "b", "{shown}");
}

#[test]
fn wrong_uses_are_clear_errors_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    wrong_uses(&Store::sqlite(dir.path()));
}

#[test]
fn wrong_uses_are_clear_errors_on_dynamodb_local() {
    wrong_uses(&Store::dynamodb());
}

/// A daemon for the same name sees a counting lock held while any of its
/// holders renews (each renew changes the record), and leads once every
/// slot is released.
#[test]
fn a_daemon_waits_while_any_slot_is_held_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::sqlite(dir.path());
    let a = take(&store, "report", "a", &["--lease-duration", "2s"]);
    let mut b = take(&store, "report", "b", &["--lease-duration", "2s"]);
    let mut args: Vec<String> = store_args(&store);
    args.extend(
        [
            "--lease-duration",
            "2s",
            "--retry-interval",
            "250ms",
            "--kill-grace",
            "500ms",
            "--election",
            "report",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let mut node = Leaderd::start(Spec {
        identity: "daemon",
        args,
        env: vec![],
        command: vec![],
        dir: dir.path(),
    });
    node.wait_http(Duration::from_secs(20));
    // `a` stops renewing; `b` renews every 500 ms for 5 s: the record
    // changes all along, so the daemon never leads, though `a`'s lease ran
    // out long ago.
    let from = Instant::now();
    while from.elapsed() < Duration::from_secs(5) {
        assert!(!node.is_leader(), "the daemon leads a held counting lock");
        let out = store.lock(
            "renew",
            &["report", &b, "--slots", "2", "--lease-duration", "2s"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        b = stdout(&out);
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = a;
    let out = store.lock("release", &["report", &b, "--slots", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // `a`'s slot is still listed (nobody evicted it): the daemon waits out
    // the longest lease from the last write, then takes the record over.
    wait_until(Duration::from_secs(10), || node.is_leader())
        .unwrap_or_else(|| panic!("the daemon does not lead; log:\n{}", node.log()));
    // The daemon holds it now: --slots meets a plain holder.
    let out = store.lock("acquire", &["report", "--slots", "2", "--no-wait"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("plain lock"), "{}", stderr(&out));
    node.signal(Signal::SIGTERM);
    node.wait_exit(Duration::from_secs(20))
        .expect("the daemon exits");
}
