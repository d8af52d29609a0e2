//! The proxy's threads and their tokio runtime: one thread with a
//! current-thread runtime, or the workers of a multi-thread one and a thread
//! that waits for the stop. Started before the app is spawned, so a refused
//! thread (a pids limit) is an error at startup, never a hang
//! ([`RefusedThreads`]).

use std::net::TcpListener as StdListener;
use std::sync::Arc;

use super::shared::Shared;
use super::upstream::Clients;

/// Starts the proxy's threads serving `listener` until `stop_rx` fires (see
/// [`super::Proxy::start`]): the thread that runs the runtime, and a handle on
/// the runtime.
///
/// # Errors
/// Creating the threads or the runtime failed (the OS refused a thread: a
/// pids limit), named with the number of threads; never a hang.
pub(super) fn spawn(
    listener: StdListener,
    shared: Arc<Shared>,
    clients: Arc<Clients>,
    threads: usize,
    stop_rx: tokio::sync::oneshot::Receiver<()>,
    thread_start: fn(),
) -> std::io::Result<(std::thread::JoinHandle<()>, tokio::runtime::Handle)> {
    let name = if threads <= 1 {
        "drainit-proxy"
    } else {
        "drainit-pxstop"
    };
    // The runtime is built on the thread below, which answers here: a
    // runtime whose workers the OS refuses never answers (see
    // `RefusedThreads`), and drainit must not wait for it.
    let (built_tx, built_rx) = std::sync::mpsc::sync_channel(1);
    let refused = RefusedThreads::catch(built_tx.clone());
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            thread_start();
            super::alloc::cache_this_thread();
            let runtime = match RefusedThreads::build(threads, thread_start) {
                Ok(r) => r,
                Err(e) => {
                    let _ = built_tx.send(Err(e));
                    return;
                }
            };
            if built_tx.send(Ok(runtime.handle().clone())).is_err() {
                return;
            }
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        // On a worker, when there are workers.
                        let serving = tokio::spawn(super::serve::serve(l, shared, clients));
                        tokio::select! {
                            _ = serving => {}
                            _ = stop_rx => {}
                        }
                    }
                    Err(e) => log::error!("proxy: listening failed: {e}"),
                }
            });
            // Dropping the runtime drops every connection task: what is still
            // in flight is settled now (abandoned: `cut_all` came first).
            drop(runtime);
            super::alloc::flush_this_thread();
        });
    // A thread whose runtime was not built is left as it is: it has ended,
    // or hangs (then drainit's exit ends it).
    let started = thread.and_then(|t| {
        let handle = built_rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread ended at its start")))?;
        Ok((t, handle))
    });
    drop(refused);
    started.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("its {threads} thread(s) could not be started: {e}"),
        )
    })
}

/// A tokio multi-thread runtime whose workers the OS refuses (a pids limit:
/// `RLIMIT_NPROC`, a cgroup's `pids.max`) makes its build panic, and that
/// panic's unwinding waits for the workers already started, which never stop:
/// the thread that builds it hangs for good. While one is built, the panic hook
/// answers for that thread instead ([`RefusedThreads::catch`]); dropping this
/// puts drainit's own hook back.
struct RefusedThreads {
    hook: std::sync::Arc<PanicHook>,
}

type PanicHook = dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync;

/// What the thread that builds the proxy's runtime answers.
type Built = std::io::Result<tokio::runtime::Handle>;

std::thread_local! {
    /// This thread is building the proxy's runtime.
    static BUILDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl RefusedThreads {
    /// From now on, a panic while [`RefusedThreads::build`] runs is answered on
    /// `answer` as an error (and not logged as drainit failing: the caller says
    /// what failed); any other panic goes to drainit's hook as before.
    fn catch(answer: std::sync::mpsc::SyncSender<Built>) -> RefusedThreads {
        let hook: std::sync::Arc<PanicHook> = std::panic::take_hook().into();
        let inner = hook.clone();
        std::panic::set_hook(Box::new(move |info| {
            if BUILDING.try_with(std::cell::Cell::get).unwrap_or(false) {
                let what = info
                    .payload()
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| info.payload().downcast_ref::<&str>().copied())
                    .unwrap_or("the runtime panicked");
                let _ = answer.try_send(Err(std::io::Error::other(what.to_string())));
            } else {
                inner(info);
            }
        }));
        RefusedThreads { hook }
    }

    /// The proxy's runtime: a current-thread one for one thread (no
    /// cross-thread wake-ups), else `threads` workers (`drainit-proxy`).
    fn build(threads: usize, thread_start: fn()) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(threads)
                .thread_name("drainit-proxy")
                .on_thread_start(move || {
                    thread_start();
                    super::alloc::cache_this_thread();
                })
                .on_thread_stop(super::alloc::flush_this_thread);
            b
        };
        BUILDING.set(true);
        let built = builder.enable_io().enable_time().build();
        BUILDING.set(false);
        built
    }
}

impl Drop for RefusedThreads {
    fn drop(&mut self) {
        let hook = self.hook.clone();
        std::panic::set_hook(Box::new(move |info| hook(info)));
    }
}
