//! Watching the store's directory, so that a leader learns at once, not at
//! its next renew, that its file was deleted or replaced.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::sync::{Arc, Weak};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::Inner;

/// Start a thread that watches the directory of `inner`'s file for the
/// file being deleted, renamed or replaced, and bumps `inner.changes`
/// when the path no longer names the open file. The thread ends within
/// a second of the store being dropped.
pub(super) fn start(inner: &Arc<Inner>) -> std::io::Result<()> {
    let path = &inner.path;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    let name: OsString = path.file_name().map(OsString::from).unwrap_or_default();
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
    inotify.add_watch(
        &dir,
        AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF,
    )?;
    let weak: Weak<Inner> = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("leaderd-sqlite-watch".into())
        .spawn(move || run(&inotify, &weak, &name))?;
    Ok(())
}

fn run(inotify: &Inotify, store: &Weak<Inner>, name: &OsString) {
    loop {
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        // Wakes at least once a second to notice a dropped store.
        let _ = poll(&mut fds, PollTimeout::from(1_000u16));
        let Some(inner) = store.upgrade() else { return };
        let Ok(events) = inotify.read_events() else {
            continue;
        };
        let ours = events.iter().any(|e| {
            e.name.as_ref() == Some(name)
                || e.mask
                    .intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF)
        });
        if ours && !inner.file_is_current() {
            tracing::warn!(path = %inner.path.display(), "the SQLite lease store file was deleted or replaced");
            inner.changes.send_modify(|n| *n += 1);
        }
    }
}
