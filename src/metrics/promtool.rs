//! `promtool check metrics` on a rendering, for the tests here and in
//! `tests/` (built with the `testing` feature, never in a release build).

/// Run `promtool check metrics` on `text` (tests); panics with its output on
/// problems, or with how to install promtool when it is missing.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot run promtool ({e}); install it with `apt-get install prometheus` (Debian's package provides promtool)"
        ),
    };
    child
        .stdin
        .take()
        .expect("stdin was piped")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "promtool check metrics found problems ({}):\n{stdout}{stderr}\n--- input ---\n{text}",
        out.status
    );
}
