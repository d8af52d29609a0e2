//! The proxy's threads: each with a current-thread tokio runtime of its own,
//! accepting on the one listener and serving the client connections it
//! accepted with its own connections to the app ([`Clients`]), so that no
//! request is handed from one thread to another. Started before the app is
//! spawned, so a refused thread (a pids limit) is an error at startup, never a
//! hang.
//!
//! One runtime per thread rather than a multi-thread runtime for them all:
//! with two threads on two cores, the multi-thread runtime took 8 % more CPU
//! per request than one thread and 12 % less closed-loop throughput (its tasks
//! and the pooled app connections moved between threads); two runtimes, each
//! with its own pool, took the CPU one thread leaves idle in the closed loop
//! (16 % more throughput than one thread), for 10 % more CPU per request at a
//! fixed rate (bench/README.md, "Threads").

use std::net::TcpListener as StdListener;
use std::sync::Arc;

use tokio::sync::watch;

use super::serve::Room;
use super::shared::Shared;
use super::upstream::Clients;

/// The proxy's running threads, and what stops them.
pub(super) struct Threads {
    handles: Vec<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl Threads {
    /// Stops every thread (its listener and its connections closed, its
    /// runtime dropped: what was still in flight there settles as its guards
    /// say) and waits for them.
    pub(super) fn stop(&mut self) {
        self.stop.send_replace(true);
        for t in self.handles.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts one thread per entry of `shards` (`--proxy-threads`), each named
/// `drainit-proxy`, serving `listener` (a descriptor of it each) with that
/// entry's ways to the app until [`Threads::stop`]; `room` is the connection
/// cap they share. Returns the threads and the first one's runtime (for the
/// tasks the supervisor starts, such as beat 3's stream closer).
///
/// # Errors
/// A thread or its runtime could not be made (the OS refused a thread: a pids
/// limit), named with the number of threads; the ones already started are
/// stopped first. Never a hang.
pub(super) fn spawn(
    listener: &StdListener,
    shared: &Arc<Shared>,
    shards: &[Arc<Clients>],
    room: &Arc<Room>,
    thread_start: fn(),
) -> std::io::Result<(Threads, tokio::runtime::Handle)> {
    let n = shards.len();
    let mut threads = Threads {
        handles: Vec::with_capacity(n),
        stop: watch::Sender::new(false),
    };
    let mut first = None;
    for clients in shards {
        match start(listener, shared, clients, room, &threads.stop, thread_start) {
            Ok((thread, runtime)) => {
                threads.handles.push(thread);
                first.get_or_insert(runtime);
            }
            Err(e) => {
                threads.stop();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("its {n} thread(s) could not be started: {e}"),
                ));
            }
        }
    }
    let runtime = first.ok_or_else(|| std::io::Error::other("no thread asked for"))?;
    Ok((threads, runtime))
}

/// One proxy thread and its runtime (see [`spawn`]): returns once the runtime
/// is built and about to serve.
fn start(
    listener: &StdListener,
    shared: &Arc<Shared>,
    clients: &Arc<Clients>,
    room: &Arc<Room>,
    stop: &watch::Sender<bool>,
    thread_start: fn(),
) -> std::io::Result<(std::thread::JoinHandle<()>, tokio::runtime::Handle)> {
    let listener = listener.try_clone()?;
    let (shared, clients, room) = (shared.clone(), clients.clone(), room.clone());
    let mut stopped = stop.subscribe();
    let (built_tx, built_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("drainit-proxy".into())
        .spawn(move || {
            thread_start();
            super::alloc::cache_this_thread();
            // The listener registered here, before the thread says it is
            // ready: a failure is the start's error, not a thread that
            // serves nothing.
            let built = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                // Any blocking-pool thread as the proxy's own (none today).
                .on_thread_start(move || {
                    thread_start();
                    super::alloc::cache_this_thread();
                })
                .on_thread_stop(super::alloc::flush_this_thread)
                .build()
                .and_then(|runtime| {
                    let listening = {
                        let _in = runtime.enter();
                        tokio::net::TcpListener::from_std(listener)?
                    };
                    Ok((runtime, listening))
                });
            let (runtime, listening) = match built {
                Ok(r) => r,
                Err(e) => {
                    let _ = built_tx.send(Err(e));
                    super::alloc::flush_this_thread();
                    return;
                }
            };
            if built_tx.send(Ok(runtime.handle().clone())).is_ok() {
                runtime.block_on(async move {
                    let serving =
                        tokio::spawn(super::serve::serve(listening, shared, clients, room));
                    tokio::select! {
                        _ = serving => {}
                        _ = stopped.wait_for(|s| *s) => {}
                    }
                });
            }
            drop(runtime);
            super::alloc::flush_this_thread();
        })?;
    let runtime = built_rx
        .recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread ended at its start")))?;
    Ok((thread, runtime))
}
