//! Stand-ins for a leader's watch stream: a server of the test's own at
//! the address a leader advertises, and the real stream it may relay.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A watch server of the test's own at `listener`, standing in for the
/// leader's advertised address. `behave` gets each follower's connection
/// (after its request head was read).
pub fn fake_watch_server(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    behave: impl Fn(TcpStream) + Send + Sync + Clone + 'static,
) {
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    let behave = behave.clone();
                    std::thread::spawn(move || {
                        conn.set_nonblocking(false).expect("blocking");
                        let mut head = [0u8; 4096];
                        let _ = conn.read(&mut head);
                        behave(conn);
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
}

pub fn send_chunk(conn: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let line = format!("{line}\n");
    write!(conn, "{:x}\r\n{line}\r\n", line.len())
}

/// The head of the stream a fake watch server answers with.
pub fn stream_head(conn: &mut TcpStream) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
}

/// The events of the stream at `path` of the daemon at `upstream_port`,
/// line by line (each with its JSON), until it ends; nothing if it cannot
/// be reached.
pub fn upstream_events(
    upstream_port: u16,
    path: &str,
) -> impl Iterator<Item = (String, serde_json::Value)> + use<> {
    let up = TcpStream::connect(("127.0.0.1", upstream_port)).ok();
    let lines = up.and_then(|mut up| {
        write!(
            up,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        Some(BufReader::new(up).lines().map_while(Result::ok))
    });
    lines.into_iter().flatten().filter_map(|line| {
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(event @ serde_json::Value::Object(_)) => Some((line, event)),
            _ => None, // headers and chunk sizes
        }
    })
}
