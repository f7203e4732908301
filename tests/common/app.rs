//! The stand-in app of the app-check tests (tests/common/app.py): an HTTP
//! health endpoint that answers as a state file says.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::daemon::wait_until;

/// The stand-in app (tests/common/app.py), answering as its state file says.
pub struct App {
    process: Child,
    port: u16,
    state: PathBuf,
}

impl App {
    pub fn start(dir: &Path, name: &str, state: &str) -> App {
        let port_file = dir.join(format!("{name}.port"));
        let app = App {
            process: Command::new("python3")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/app.py"))
                .arg(&port_file)
                .arg(dir.join(format!("{name}.state")))
                .stdin(Stdio::null())
                .spawn()
                .expect("start python3 tests/common/app.py"),
            port: 0,
            state: dir.join(format!("{name}.state")),
        };
        app.set(state);
        let mut app = app;
        wait_until(Duration::from_secs(10), || port_file.exists()).expect("the app listens");
        app.port = std::fs::read_to_string(&port_file)
            .expect("port file")
            .trim()
            .parse()
            .expect("a port");
        app
    }

    /// `ok`, `fail` or `hang`.
    pub fn set(&self, state: &str) {
        let tmp = self.state.with_extension("tmp");
        std::fs::write(&tmp, state).expect("write the app's state");
        std::fs::rename(&tmp, &self.state).expect("replace the app's state");
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
