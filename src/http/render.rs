//! The big read answers (`/status`, `/metrics`), rendered once for every
//! request that is waiting for one.
//!
//! At ten thousand elections `/status` is megabytes; rendered once per
//! request, clients looping on it could keep the CPU busy with copies of
//! the same answer. Here at most one render of each answer runs at a time,
//! on a blocking thread of the HTTP runtime at a lower CPU priority, and at
//! most one more is wanted: every request is answered by a render that
//! started after it arrived (never a stale answer), and all the requests
//! that arrived during one render share the next. However many clients
//! ask, the cost is one render after another, and the memory one answer
//! (shared, not copied, by every response that sends it), dropped once
//! every waiter has it.

use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use tokio::sync::watch;

/// A render's outcome: the answer's bytes, or why it failed.
pub(super) type Rendered = Result<Bytes, String>;

/// One answer, and which render made it (they are numbered from 1 as they
/// start).
#[derive(Debug, Clone)]
struct Answer {
    render: u64,
    body: Rendered,
}

/// Renders one answer for everyone waiting; see the module docs.
pub(super) struct SharedRender {
    render: Box<dyn Fn() -> Rendered + Send + Sync>,
    state: Mutex<RenderState>,
    latest: watch::Sender<Option<Answer>>,
}

impl std::fmt::Debug for SharedRender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRender").finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct RenderState {
    /// Renders started so far; the last one is running if `running`.
    started: u64,
    running: bool,
    /// Someone arrived after the running render started: render again
    /// when it is done.
    again: bool,
}

impl SharedRender {
    /// Renders made by `render`.
    pub(super) fn new(render: impl Fn() -> Rendered + Send + Sync + 'static) -> Arc<SharedRender> {
        Arc::new(SharedRender {
            render: Box::new(render),
            state: Mutex::new(RenderState::default()),
            latest: watch::channel(None).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RenderState> {
        // Fields set together under the lock: never torn by a panic.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An answer from a render that started after this call.
    pub(super) async fn get(self: &Arc<Self>) -> Rendered {
        let mut latest = self.latest.subscribe();
        let wanted = {
            let mut state = self.lock();
            if state.running {
                state.again = true;
            } else {
                state.running = true;
                state.started += 1;
                let this = self.clone();
                tokio::task::spawn_blocking(move || this.render_while_wanted());
            }
            // The render that starts next, or the one that just did.
            state.started + u64::from(state.again)
        };
        let (render, body) = match latest
            .wait_for(|a| a.as_ref().is_some_and(|a| a.render >= wanted))
            .await
        {
            Ok(answer) => answer.as_ref().map_or_else(
                || (0, Err("no answer".to_owned())),
                |a| (a.render, a.body.clone()),
            ),
            // The sender lives in `self`, which this call holds.
            Err(_) => return Err("the renderer is gone".to_owned()),
        };
        drop(latest);
        self.let_go(render);
        body
    }

    /// Drop the answer of `render` once nobody waits for it any more: at
    /// ten thousand elections a `/status` is megabytes, and kept until the
    /// next request it would sit in memory for nothing. Nobody can want it
    /// again: a request that comes later wants a render that starts after
    /// it. A newer answer is left alone.
    fn let_go(&self, render: u64) {
        self.latest.send_if_modified(|a| {
            if self.latest.receiver_count() == 0 && a.as_ref().is_some_and(|a| a.render == render) {
                *a = None;
            }
            // Nobody to wake: whoever waits wants a newer render.
            false
        });
    }

    /// Render, and again as long as someone arrived during the last render.
    fn render_while_wanted(&self) {
        lower_priority();
        loop {
            let render = self.lock().started;
            // A panic is a bug; in a release build it ends the process. In
            // a test build it must not leave every later request waiting.
            let body = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.render)()))
                .unwrap_or_else(|_| Err("the render panicked".to_owned()));
            self.latest.send_replace(Some(Answer { render, body }));
            let mut state = self.lock();
            if !std::mem::take(&mut state.again) {
                state.running = false;
                return;
            }
            state.started += 1;
        }
    }
}

/// How much lower than the rest of leaderd the renders run: they give way
/// to the threads that renew the leases whenever both want the CPU.
const RENDER_NICENESS: i32 = 10;

/// Lower the CPU priority of this (render) thread, once. Linux gives each
/// thread a niceness of its own. Raising it needs no privilege; if it
/// fails, the render runs at the usual priority.
fn lower_priority() {
    thread_local!(static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if LOWERED.replace(true) {
        return;
    }
    let Ok(tid) = nix::libc::id_t::try_from(nix::unistd::gettid().as_raw()) else {
        return;
    };
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let _ = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid, RENDER_NICENESS) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_answer_is_rendered_after_its_request_and_waiters_share_renders() {
        let renders = Arc::new(AtomicUsize::new(0));
        let counted = renders.clone();
        let shared = SharedRender::new(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(Duration::from_millis(50));
            Ok(Bytes::from(n.to_string()))
        });
        // One request alone: one render.
        assert_eq!(shared.get().await.unwrap(), "1");
        // A second request after it: a new render, never the old answer.
        assert_eq!(shared.get().await.unwrap(), "2");
        // Many at once: they share at most two renders (one running when
        // some arrive, one after).
        let before = renders.load(Ordering::SeqCst);
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let shared = shared.clone();
                tokio::spawn(async move { shared.get().await })
            })
            .collect();
        for w in waiters {
            w.await.unwrap().unwrap();
        }
        let made = renders.load(Ordering::SeqCst) - before;
        assert!((1..=2).contains(&made), "{made} renders for 50 requests");
    }

    #[tokio::test]
    async fn an_answer_everyone_got_is_not_kept() {
        let shared = SharedRender::new(|| Ok(Bytes::from(vec![b'x'; 1 << 20])));
        assert_eq!(shared.get().await.unwrap().len(), 1 << 20);
        assert!(shared.latest.borrow().is_none(), "the answer is kept");
        // And the next request still gets an answer of its own.
        assert_eq!(shared.get().await.unwrap().len(), 1 << 20);
        assert!(shared.latest.borrow().is_none());
    }

    #[tokio::test]
    async fn a_failed_render_is_an_error_for_its_waiters_and_the_next_request_renders_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let shared = SharedRender::new(move || match counted.fetch_add(1, Ordering::SeqCst) {
            0 => Err("broken".to_owned()),
            _ => Ok(Bytes::from_static(b"ok")),
        });
        assert_eq!(shared.get().await, Err("broken".to_owned()));
        assert_eq!(shared.get().await.unwrap(), "ok");
    }
}
