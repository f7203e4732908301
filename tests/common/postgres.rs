//! PostgreSQL servers on loopback, started by the tests themselves: the
//! distribution's PostgreSQL (Debian: /usr/lib/postgresql/VERSION/bin), a
//! cluster made by `initdb` in a temporary directory, run as the
//! unprivileged `postgres` user when the tests run as root, on a free
//! port, no systemd, with TLS on: a CA and a server certificate (for
//! `localhost` and 127.0.0.1) made by the test with the `openssl` command.
//!
//! A missing server or `openssl` is a test failure whose message says what
//! to install, never a silent skip. Like the emulators, every server dies
//! with the test binary: its postmaster by `PR_SET_PDEATHSIG`, the
//! processes it started of the postmaster's death.
//!
//! The cluster trades durability against an operating-system crash for
//! speed (`fsync = off`, `initdb --no-sync`): the tests kill processes,
//! never the machine, and a killed server loses nothing the kernel has.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::emulators::{free_port, kill_group, log_tail, spawn_tied};

/// What to install when the server or a tool is missing.
pub const INSTALL_HINT: &str = "install PostgreSQL's server and openssl: `apt-get install postgresql openssl` \
     (tests/run-all.sh does), or put the directory holding initdb, postgres and pg_isready on PATH";

/// The superuser, and its password.
pub const SUPERUSER: (&str, &str) = ("postgres", "superuser-test-password");
/// leaderd's role (it owns the database the tests use), and its password.
pub const ROLE: (&str, &str) = ("leaderd", "leaderd-test-password");
/// The database the tests use.
pub const DATABASE: &str = "leaderd";

/// How long a server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A running PostgreSQL on 127.0.0.1; killed (with its processes) on drop.
pub struct PgServer {
    /// The TCP port.
    pub port: u16,
    /// The PEM file of the CA that signed the server's certificate.
    pub ca_file: PathBuf,
    bin: PathBuf,
    /// The cluster's data, certificates, socket and log.
    dir: tempfile::TempDir,
    owner: Option<(u32, u32)>,
    child: Option<Child>,
}

impl std::fmt::Debug for PgServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgServer")
            .field("port", &self.port)
            .finish()
    }
}

/// One server shared by every test of this test binary (started on first
/// use; it dies with the binary). Tests must use their own tables.
pub fn shared_postgres() -> &'static PgServer {
    static SHARED: OnceLock<PgServer> = OnceLock::new();
    SHARED.get_or_init(PgServer::start)
}

/// The server's version (`postgres --version`), if it is installed.
pub fn server_version() -> Option<String> {
    let out = Command::new(bin_dir_if_any()?.join("postgres"))
        .arg("--version")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The directory of the server's programs: the newest under
/// /usr/lib/postgresql, else wherever `initdb` is on PATH.
fn bin_dir() -> PathBuf {
    bin_dir_if_any().unwrap_or_else(|| {
        panic!("PostgreSQL is not installed: no /usr/lib/postgresql/*/bin/postgres and no initdb on PATH; {INSTALL_HINT}")
    })
}

fn bin_dir_if_any() -> Option<PathBuf> {
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("postgres").is_file() && bin.join("initdb").is_file())
        .max_by_key(|bin| {
            bin.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
    if debian.is_some() {
        return debian;
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

/// Run `cmd` to its end; panic with its output if it fails.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({cmd:?}): {e}; {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl PgServer {
    /// A fresh cluster on a free port, TLS on, with leaderd's role and
    /// database. Panics with an install hint if it cannot start.
    pub fn start() -> PgServer {
        let bin = bin_dir();
        sweep_left_behind();
        let dir = tempfile::Builder::new()
            .prefix("leaderd-pg-")
            .tempdir()
            .expect("a temporary directory");
        let owner = server_owner();
        make_certificates(dir.path());
        let pw_file = dir.path().join("superuser-password");
        std::fs::write(&pw_file, SUPERUSER.1).expect("write the superuser's password");
        if let Some((uid, gid)) = owner {
            for path in [dir.path(), &dir.path().join("server.key"), &pw_file] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to postgres");
            }
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-U", SUPERUSER.0, "--pwfile"])
            .arg(&pw_file)
            .args([
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "--no-instructions",
                "--encoding=UTF8",
                "--locale=C",
            ]);
        as_owner(&mut initdb, owner);
        run(&mut initdb, "initdb");
        let mut server = PgServer {
            port: 0,
            ca_file: dir.path().join("ca.crt"),
            bin,
            dir,
            owner,
            child: None,
        };
        server.launch_on_a_free_port();
        server.psql_as(
            SUPERUSER,
            "postgres",
            &format!("CREATE ROLE {} LOGIN PASSWORD '{}'", ROLE.0, ROLE.1),
        );
        server.psql_as(
            SUPERUSER,
            "postgres",
            &format!("CREATE DATABASE {DATABASE} OWNER {}", ROLE.0),
        );
        server
    }

    /// A standby of this server: a copy made with `pg_basebackup -R`,
    /// started on a free port, in recovery (it streams this one's WAL).
    pub fn standby(&self) -> PgServer {
        let dir = tempfile::Builder::new()
            .prefix("leaderd-pg-standby-")
            .tempdir()
            .expect("a temporary directory");
        for file in ["ca.crt", "server.crt", "server.key"] {
            std::fs::copy(self.dir.path().join(file), dir.path().join(file))
                .expect("copy the certificates");
        }
        if let Some((uid, gid)) = self.owner {
            for path in [dir.path(), &dir.path().join("server.key")] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to postgres");
            }
        }
        let mut backup = Command::new(self.bin.join("pg_basebackup"));
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER.0,
            ])
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "--no-sync", "-X", "stream", "--checkpoint=fast"])
            .env("PGPASSWORD", SUPERUSER.1)
            .env("PGSSLMODE", "require");
        as_owner(&mut backup, self.owner);
        run(&mut backup, "pg_basebackup");
        let mut standby = PgServer {
            port: 0,
            ca_file: dir.path().join("ca.crt"),
            bin: self.bin.clone(),
            dir,
            owner: self.owner,
            child: None,
        };
        standby.launch_on_a_free_port();
        standby
    }

    fn launch_on_a_free_port(&mut self) {
        let mut last = String::new();
        for _ in 0..3 {
            self.port = free_port();
            match self.launch(STARTUP_TIMEOUT) {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    /// Start the server on `self.port`, and wait until it accepts
    /// connections.
    fn launch(&mut self, timeout: Duration) -> Result<(), String> {
        let dir = self.dir.path();
        let log = dir.join("server.log");
        let out = std::fs::File::create(&log).expect("create the server's log");
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid)).expect("chown to postgres");
        }
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .args(["-c", "ssl=on"])
            .arg("-c")
            .arg(format!(
                "ssl_cert_file={}",
                dir.join("server.crt").display()
            ))
            .arg("-c")
            .arg(format!("ssl_key_file={}", dir.join("server.key").display()))
            .args(["-c", "fsync=off", "-c", "max_connections=300"])
            .args(["-c", "shared_buffers=16MB"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone a file handle"))
            .stderr(out)
            .process_group(0);
        as_owner(&mut cmd, self.owner);
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes one prctl system call, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut child =
            spawn_tied(cmd).map_err(|e| format!("cannot start postgres: {e}; {INSTALL_HINT}"))?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "postgres exited ({status}) before accepting connections on port {}\n--- its log ---\n{}",
                    self.port,
                    log_tail(&log)
                ));
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                kill_group(child);
                return Err(format!(
                    "postgres did not accept connections on port {} within {timeout:?}\n--- its log ---\n{}",
                    self.port,
                    log_tail(&log)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `postgres://leaderd:PASSWORD@127.0.0.1:PORT/leaderd?sslmode=MODE`.
    pub fn url(&self, sslmode: &str) -> String {
        self.url_as(ROLE, sslmode)
    }

    /// The URL of `role` (name, password) on the test database.
    pub fn url_as(&self, role: (&str, &str), sslmode: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{DATABASE}?sslmode={sslmode}",
            role.0, role.1, self.port
        )
    }

    /// The store flags of `leaderd` for `table`, TLS verified against the
    /// test's CA.
    pub fn args(&self, table: &str) -> Vec<String> {
        vec![
            "--store".into(),
            "postgres".into(),
            "--store-url".into(),
            self.url("verify-full"),
            "--store-ca-file".into(),
            self.ca_file.display().to_string(),
            "--table".into(),
            table.to_owned(),
        ]
    }

    /// The store of `table` as leaderd's configuration would give it.
    pub fn spec(&self, table: &str) -> leaderd::lease::postgres::PostgresSpec {
        leaderd::lease::postgres::PostgresSpec {
            url: self.url("verify-full"),
            password_file: None,
            ca_file: Some(self.ca_file.clone()),
            table: table.to_owned(),
            statement_timeout: Duration::from_secs(5),
        }
    }

    /// Run `sql` with psql as leaderd's role; its output, unaligned, `|`
    /// between columns.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_as(ROLE, DATABASE, sql)
    }

    /// Run `sql` with psql as the superuser, on the test database.
    pub fn psql_admin(&self, sql: &str) -> String {
        self.psql_as(SUPERUSER, DATABASE, sql)
    }

    /// The rows `sql` returns (as leaderd's role), each column's value as
    /// text, `None` for null.
    pub fn query(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        const NULL: &str = "\u{2}null\u{2}";
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            ROLE.0,
        ])
        .args(["-d", DATABASE, "-X", "-A", "-t", "-q", "-F", "\u{1f}"])
        .args(["-P", &format!("null={NULL}")])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", ROLE.1)
        .env("PGSSLMODE", "require");
        run(&mut cmd, &format!("psql -c {sql:?}"))
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.split('\u{1f}')
                    .map(|v| (v != NULL).then(|| v.to_owned()))
                    .collect()
            })
            .collect()
    }

    fn psql_as(&self, role: (&str, &str), database: &str, sql: &str) -> String {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            role.0,
        ])
        .args(["-d", database, "-X", "-A", "-t", "-F", "|", "-q"])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", role.1)
        .env("PGSSLMODE", "require");
        run(&mut cmd, &format!("psql -c {sql:?}"))
    }

    /// The server's processes: the postmaster, then every process it
    /// started. Each of those leads a process group of its own (the
    /// postmaster makes them so), so signalling the postmaster's group
    /// reaches none of them.
    pub fn processes(&self) -> Vec<i32> {
        let Some(root) = self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok()) else {
            return Vec::new();
        };
        let mut all = vec![root];
        all.extend(
            super::procfs::descendants(root)
                .into_iter()
                .map(|(pid, _)| pid),
        );
        all
    }

    /// SIGSTOP (`true`) or SIGCONT every process of the server. Stopped,
    /// it accepts no connection and answers nothing; the kernel still
    /// takes what clients send.
    pub fn pause(&self, stop: bool) {
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        // The postmaster first: it forks no new backend while stopped.
        for pid in self.processes() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }

    /// Kill every process of the server with SIGKILL, and start it again
    /// on the same port and data (it recovers from its WAL).
    pub fn kill9_and_restart(&mut self) {
        let all = self.processes();
        for &pid in &all {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
        // Wait until none is left, or the new server finds their shared
        // memory still in use.
        let deadline = Instant::now() + Duration::from_secs(10);
        while all.iter().any(|&pid| super::procfs::alive(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match self.launch(STARTUP_TIMEOUT) {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        log_tail(&self.dir.path().join("server.log"))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        for pid in self.processes() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// Remove the clusters that earlier test processes left behind: the
/// shared server lives in a static that is never dropped, so its
/// directory (about 40 MB) outlives the process (its server does not: it
/// dies with it). A directory counts as left behind when no live server
/// runs from it and it is older than any cluster still starting.
fn sweep_left_behind() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("leaderd-pg-"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(600));
        if named && old && !serves(&path) {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Whether a live server runs from the cluster in `dir`.
fn serves(dir: &Path) -> bool {
    let Ok(pid_file) = std::fs::read_to_string(dir.join("data").join("postmaster.pid")) else {
        return false;
    };
    let Some(pid) = pid_file
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// The user the server runs as: `postgres` when the tests run as root
/// (the server refuses to run as root), else the tests' own user.
fn server_owner() -> Option<(u32, u32)> {
    let id = |args: &[&str]| {
        Command::new("id")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    if id(&["-u"]) != Some(0) {
        return None;
    }
    match (id(&["-u", "postgres"]), id(&["-g", "postgres"])) {
        (Some(uid), Some(gid)) => Some((uid, gid)),
        _ => panic!(
            "the tests run as root, and there is no `postgres` user to run the server as; {INSTALL_HINT}"
        ),
    }
}

/// Run `cmd` as the server's owner.
fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        // std drops root's supplementary groups when it sets the uid.
        cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    }
}

/// A CA (`ca.crt`) and a server certificate it signed (`server.crt`,
/// `server.key`) for `localhost` and 127.0.0.1, in `dir`.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str], what: &str| {
        run(Command::new("openssl").args(args).current_dir(dir), what);
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3",
        "-subj",
        "/CN=leaderd test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&ca, "openssl (the test CA)");
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&csr, "openssl (the server's key)");
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the certificate's extensions");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "3",
            "-extfile",
            "server.ext",
        ],
        "openssl (the server's certificate)",
    );
    // The server refuses a key others may read.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod the server's key");
}
