//! Read-only HTTP traffic never costs a tenure, and probes get through
//! whatever the other clients hold open.
//!
//! - Clients looping on the big read answers (`/status`, `/metrics`) of a
//!   leader of many elections: it keeps every lease (the HTTP server runs
//!   apart from the elections, and renders each answer once for everyone
//!   waiting).
//! - Watch streams holding their half of the connection limit, and idle
//!   connections holding the rest and opened again as soon as they are
//!   closed: a readiness probe on `/leader` is still answered within 1 s.
//!
//! `LEADERD_TEST_HTTP_LOAD_ELECTIONS` (default 1,000) and
//! `LEADERD_TEST_HTTP_LOAD_SECS` (default 20) size the first test.

use crate::common;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::daemon::{Leaderd, Spec, wait_until};

fn env_usize(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={text:?} is not a whole number")),
        Err(_) => default,
    }
}

/// A config of `count` elections `e00001`… on a SQLite file in `dir`.
fn elections_config(dir: &std::path::Path, count: usize) -> std::path::PathBuf {
    let mut toml = String::new();
    let db = dir.join("leases.db");
    let _ = writeln!(
        toml,
        "[store]\nkind = \"sqlite\"\npath = {:?}\n",
        db.display().to_string()
    );
    for i in 1..=count {
        let _ = writeln!(toml, "[[elections]]\nname = \"e{i:05}\"");
    }
    let config = dir.join("elections.toml");
    std::fs::write(&config, toml).expect("write the config file");
    config
}

/// How many elections `node`'s `/status` shows it leading.
fn led(node: &Leaderd) -> Option<usize> {
    let (status, body) = common::daemon::http(node.port, "GET", "/status", &[])?;
    if status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(
        json["elections"]
            .as_object()?
            .values()
            .filter(|v| v["is_leader"] == true)
            .count(),
    )
}

/// One HTTP/1.0 GET on a new connection (the answer ends with the
/// connection, however it is framed): the body's size, if it came whole.
fn get(port: u16, path: &str) -> Option<usize> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).ok()?;
    let at = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    // hyper answers an HTTP/1.0 request as HTTP/1.0.
    let ok = answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200");
    ok.then_some(answer.len() - at - 4)
}

#[test]
fn clients_looping_on_status_and_metrics_never_cost_a_tenure() {
    let count = env_usize("LEADERD_TEST_HTTP_LOAD_ELECTIONS", 1_000);
    let secs = env_usize("LEADERD_TEST_HTTP_LOAD_SECS", 20);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = elections_config(dir.path(), count);
    // L = 4 s: a renewal late by more than about a second loses the lease.
    let node = Leaderd::start(Spec {
        identity: "a",
        args: [
            "--config",
            &config.display().to_string(),
            "--lease-duration",
            "4s",
            "--kill-grace",
            "1s",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![],
        command: vec![],
        dir: dir.path(),
    });
    node.wait_http(Duration::from_secs(30));
    wait_until(Duration::from_secs(60), || led(&node) == Some(count))
        .unwrap_or_else(|| panic!("never led all {count} elections:\n{}", node.log()));

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (stop, answers, bytes) = (stop.clone(), answers.clone(), bytes.clone());
            let port = node.port;
            std::thread::spawn(move || {
                let path = if i % 2 == 0 { "/status" } else { "/metrics" };
                while !stop.load(Ordering::Relaxed) {
                    if let Some(n) = get(port, path) {
                        answers.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(n, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs as u64));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client thread");
    }
    let log = node.log();
    eprintln!(
        "http load: {count} elections, {} answers ({} MB) in {secs} s",
        answers.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed) / 1_000_000
    );
    assert!(
        !log.contains("lease lost"),
        "read-only requests cost a tenure:\n{}",
        log.lines()
            .filter(|l| l.contains("lease lost"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        answers.load(Ordering::Relaxed) >= 16,
        "the clients were hardly answered: the test measured nothing\n{log}"
    );
    assert_eq!(led(&node), Some(count), "{log}");
}

/// Keep `n` connections open that never send a request; open another one as
/// soon as the server closes one.
fn idle_flood(port: u16, n: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let connect = || TcpStream::connect(("127.0.0.1", port)).ok();
        let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| connect()).collect();
        let mut reopened = 0;
        while !stop.load(Ordering::Relaxed) {
            for slot in &mut conns {
                let closed = match slot {
                    None => true,
                    Some(c) => {
                        let _ = c.set_nonblocking(true);
                        let mut byte = [0u8; 1];
                        !matches!(c.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    }
                };
                if closed {
                    *slot = connect();
                    reopened += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        reopened
    })
}

#[test]
fn probes_are_answered_while_watch_streams_and_idle_connections_fill_the_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 200 descriptors: (200 − 64) / 2 = 68 connections, 34 of them watches.
    // Default timing: what is measured is the HTTP side, and the flood's
    // 40 threads share this machine's CPUs with the daemon, which a 2 s
    // lease on a loaded CI machine does not always survive (a remote
    // flood costs the daemon only its accepts).
    let db = dir.path().join("l.db");
    let node = Leaderd::start_with(
        Spec {
            identity: "a",
            args: ["--store", "sqlite", "--election", "job", "--store-path"]
                .iter()
                .map(|s| s.to_string())
                .chain([db.to_str().expect("utf-8 temp path").to_owned()])
                .collect(),
            env: vec![],
            command: vec![],
            dir: dir.path(),
        },
        common::daemon::open_files_limit(200),
    );
    node.wait_http(Duration::from_secs(20));
    wait_until(Duration::from_secs(10), || node.is_leader()).expect("it leads");

    // Every watch slot taken by a stream that stays open.
    let mut streams = Vec::new();
    loop {
        let mut conn = TcpStream::connect(("127.0.0.1", node.port)).expect("connect");
        conn.write_all(b"GET /v1/watch HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("send");
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut first = [0u8; 12];
        conn.read_exact(&mut first).expect("an answer");
        if &first != b"HTTP/1.1 200" {
            break;
        }
        streams.push(conn);
        assert!(
            streams.len() <= 64,
            "more watch streams than the limit allows"
        );
    }
    assert_eq!(streams.len(), 34, "half of 68 connections are watches");

    // The other half, and more, held by connections that send nothing.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = idle_flood(node.port, 40, stop.clone());
    std::thread::sleep(Duration::from_secs(1));

    let mut answered = 0;
    let mut failures = Vec::new();
    for _ in 0..50 {
        let start = Instant::now();
        let probe = TcpStream::connect(("127.0.0.1", node.port)).and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(1)))?;
            c.write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            let mut answer = Vec::new();
            c.read_to_end(&mut answer)?;
            Ok(answer)
        });
        match probe {
            Ok(a) if a.starts_with(b"HTTP/1.1 200") && start.elapsed() < Duration::from_secs(1) => {
                answered += 1;
            }
            Ok(a) => failures.push(format!(
                "{:?} after {:?}",
                String::from_utf8_lossy(&a[..a.len().min(40)]),
                start.elapsed()
            )),
            Err(e) => failures.push(format!("{e} after {:?}", start.elapsed())),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let reopened = flood.join().expect("the flood thread");
    eprintln!("probes answered: {answered}/50; idle connections re-opened: {reopened}");
    assert!(
        answered >= 49,
        "{answered} of 50 probes answered within 1 s: {failures:?}\n{}",
        node.log()
    );
    // The streams were never the ones to give way.
    for s in streams {
        s.set_nonblocking(true).expect("nonblocking");
        let mut byte = [0u8; 1];
        assert!(
            matches!(s.peek(&mut byte), Ok(n) if n > 0)
                || matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a watch stream was closed"
        );
    }
}
