//! The admission proxy (`--proxy LISTEN=UPSTREAM`, DESIGN §11): drainit sees the
//! app's requests, closes admission in one step at beat 3, and keeps a ledger in
//! which every request is completed, rejected (safe to retry), unknown,
//! abandoned or canceled.
//!
//! Owns: the listen socket's connections, the upstream connection pool, the
//! [`Gate`] each request passes, and the [`ledger`]. Runs on its own threads
//! (`--proxy-threads`: one with a current-thread tokio runtime, or the workers
//! of a multi-thread one), so that no amount of
//! traffic delays signal handling, reaping, the drain's timers or the probes
//! (the supervisor's loop stays single-threaded on its own thread and never
//! waits on the proxy). A panic in one connection ends that connection's task
//! only (tokio catches it).
//!
//! The supervisor drives it through [`Proxy`]: [`Proxy::set_gate`] at each beat,
//! [`Proxy::idle`] to learn that no request is in flight, [`Proxy::stop`] at the
//! exit. Nothing here sends a signal or decides when the drain moves on.
//!
//! HTTP/1.1 with keep-alive, chunked bodies streamed both ways (nothing is
//! buffered whole) and `Upgrade` (WebSocket) passed through; hop-by-hop headers
//! are dropped as RFC 9110 §7.6.1 says, and `X-Forwarded-For` and `Forwarded`
//! (RFC 7239) are appended.
//! A connection that opens with HTTP/2's preface (prior knowledge, as gRPC
//! speaks it) is served as HTTP/2 and its requests go to the app over HTTP/2
//! too, trailers included; at beat 3 it gets hyper's two-step GOAWAY instead
//! of HTTP/1's local 503s.

pub mod ledger;
pub mod streams;
pub mod upstream;

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{Notify, watch};

use crate::config::ProxySpec;
use ledger::{Admitted, Ledger, Outcome, StreamEnd, Totals};
use streams::{Ended, Registered, StreamSet};

/// Where admission stands; only ever moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Gate {
    /// Readiness has not passed yet: every request is `rejected` (503).
    NotReady = 0,
    /// Pass-through.
    Ready = 1,
    /// From T0 (beat 1): requests still pass, every response carries
    /// `Connection: close`, the health path answers 503.
    Closing = 2,
    /// Beat 3: admission is closed; every new request is `rejected` (503).
    Closed = 3,
    /// The drain signal went to the app: idle connections are closed too.
    Forwarded = 4,
}

impl Gate {
    fn from_u8(v: u8) -> Gate {
        match v {
            0 => Gate::NotReady,
            1 => Gate::Ready,
            2 => Gate::Closing,
            3 => Gate::Closed,
            _ => Gate::Forwarded,
        }
    }
}

/// How long an idle pooled upstream connection is kept: shorter than the
/// keep-alive timeouts apps commonly use (Node.js 5 s, gunicorn 2 s, nginx 75 s),
/// so drainit closes it before the app does and never reuses one the app is
/// closing.
pub const UPSTREAM_IDLE: Duration = Duration::from_millis(1500);
/// A client has this long to send a request head (slowloris).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// An HTTP/1 client has this long between two pieces of a request body (a
/// slowloris on the body): past it the request is cut, the app's connection
/// closed, the client answered 408 (RFC 9110 §15.5.9) and the request counted
/// `canceled`. Apache's `mod_reqtimeout` uses the same 20 s for bodies by
/// default. Not for HTTP/2, whose request bodies may be gRPC streams.
pub const BODY_IDLE: Duration = Duration::from_secs(20);
/// A rejected request's body is read up to this much (so the 503 is not lost to a
/// TCP reset), then the connection is closed.
pub const REJECT_BODY_MAX: usize = 64 * 1024;
/// ... and for at most this long.
pub const REJECT_BODY_TIME: Duration = Duration::from_secs(1);
/// `Retry-After` of drainit's own 503s, seconds (RFC 9110 §10.2.3).
pub const RETRY_AFTER_S: u32 = 1;
/// At the exit, how long requests still in flight get to settle by themselves
/// (their app is gone) before drainit cuts them; after a forward, also how long
/// a connection whose first request is not answered yet gets for its 503.
pub const STOP_SETTLE: Duration = Duration::from_millis(200);
/// At an exit after the forward, within [`STOP_SETTLE`]: drainit keeps
/// accepting until this long has passed since the forward and since the last
/// connection came. The forward closes idle keep-alive connections, and a
/// client with a request to send reconnects at once: an app that dies at the
/// forward would otherwise make drainit exit before accepting those
/// connections, and the kernel reset them with their requests unanswered.
pub const STOP_QUIET: Duration = Duration::from_millis(50);
/// HTTP/2 streams a client cancels within this long of opening them, before
/// drainit answered, are premature resets ([`Resets`]).
pub const PREMATURE_RESET: Duration = Duration::from_secs(1);
/// An HTTP/2 client connection is closed once it has canceled this many
/// streams prematurely, and they are more than half of its streams (Envoy's
/// defaults for `premature_reset_total_stream_count` and its 50 % rule).
pub const PREMATURE_RESETS_MAX: u32 = 500;
/// After the forward, a connection that has sent nothing yet gets this long to
/// send its first request before it is closed as idle: a client that connected
/// a moment before the forward (it was told `Connection: close` and reopened)
/// is writing its request now, and closing its connection unread would lose it.
pub const OPENING_GRACE: Duration = Duration::from_secs(1);
/// Connections kept open at most; past it, new ones wait in the kernel's backlog.
/// Fewer under a low `RLIMIT_NOFILE`: see [`connection_cap`].
pub const MAX_CONNECTIONS: usize = 4096;

/// [`MAX_CONNECTIONS`], or fewer under a low `RLIMIT_NOFILE`: the descriptors
/// left after the probe server's share ([`crate::probe::connection_cap`]: half of
/// what a reserve of 32 leaves) are the proxy's, two per client connection (the
/// client's and its upstream connection's), so a flood of client connections
/// never takes the fds that probes, `/proc` reads and teardown steps need.
pub fn connection_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let budget = (soft.saturating_sub(32) / 4) as usize;
    budget.clamp(1, MAX_CONNECTIONS)
}

/// What the proxy thread and the supervisor share. One per process, never freed.
struct Shared {
    gate: AtomicU8,
    gate_tx: watch::Sender<Gate>,
    ledger: Ledger,
    /// Notified when no admitted request is in flight once admission is closed.
    idle: Notify,
    health: Option<String>,
    /// Asks the supervisor's thread what `/readyz` would answer.
    ready_ask: tokio::sync::mpsc::Sender<crate::probe::ReadinessAsk>,
    upstream: SocketAddr,
    /// `upstream` as a URI authority, built once.
    authority: hyper::http::uri::Authority,
    /// Open WebSockets and SSE responses, closed over `spread` at beat 3.
    streams: StreamSet,
    spread: Duration,
    /// Client connections whose first request has not been answered yet
    /// ([`Unanswered`]).
    unanswered: AtomicUsize,
    /// Requests being answered drainit's own 503 ([`Rejecting`]): their body
    /// is read first, and [`Proxy::stop`] waits a moment for them.
    rejecting: AtomicUsize,
    /// The ways to the app (its HTTP/1 pool, its HTTP/2 client).
    clients: Clients,
    /// When the last connection was accepted or the drain signal forwarded,
    /// in ms since `born` ([`STOP_QUIET`]).
    stirred_ms: std::sync::atomic::AtomicU64,
    born: Instant,
    /// drainit is SIGKILLing the app ([`Proxy::abandon`]: the deadline, or a
    /// second signal in beat 3): an upstream failure from now on is drainit's
    /// doing, not the app's, and its 502 says so.
    killing: AtomicBool,
}

impl Shared {
    fn gate(&self) -> Gate {
        // SeqCst with the ledger's in-flight count: see `handle`.
        Gate::from_u8(self.gate.load(SeqCst))
    }

    /// A connection was accepted, or the drain signal forwarded, now.
    fn stir(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.stirred_ms.fetch_max(ms, SeqCst);
    }

    /// [`STOP_QUIET`] has passed since [`Shared::stir`] was last called.
    fn still(&self) -> bool {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        ms.saturating_sub(self.stirred_ms.load(SeqCst)) >= STOP_QUIET.as_millis() as u64
    }

    /// No admitted request in flight and no stream open.
    fn quiet(&self) -> bool {
        self.ledger.in_flight() == 0 && self.streams.open() == 0
    }

    /// After a request settles or a stream ends: the supervisor may be waiting
    /// for none in flight.
    fn settled(&self) {
        if self.gate() >= Gate::Closed && self.quiet() {
            self.idle.notify_one();
        }
    }
}

/// The supervisor's handle on the proxy thread.
pub struct Proxy {
    shared: &'static Shared,
    thread: Option<std::thread::JoinHandle<()>>,
    stop_tx: Option<tokio::sync::oneshot::Sender<()>>,
    /// The proxy thread's runtime: beat 3's stream closer runs there.
    runtime: tokio::runtime::Handle,
}

/// Binds the listen address (before the child starts: a taken port is a
/// configuration error, 78).
///
/// # Errors
/// The bind's error.
pub fn bind(addr: SocketAddr) -> std::io::Result<StdListener> {
    crate::util::bind_listener(addr)
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
    fn build(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(threads).thread_name("drainit-proxy");
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

impl Proxy {
    /// Starts the proxy's threads on `listener` (from [`bind`]): one thread
    /// with a current-thread runtime when `threads` (`--proxy-threads`) is 1,
    /// else `threads` workers of a multi-thread runtime and one thread that
    /// only waits for [`Proxy::stop`]. The workers are named `drainit-proxy`
    /// (the one thread too).
    ///
    /// # Errors
    /// Creating the threads or the runtime failed (the OS refused a thread: a
    /// pids limit), named with the number of threads; never a hang.
    /// `spread`: over how long the open streams are closed at beat 3
    /// (`--stream-spread`). The health path (`health`) is answered as `/readyz`:
    /// `ready_ask` reaches [`crate::probe::answer_readiness`] on the supervisor's
    /// thread.
    pub fn start(
        listener: StdListener,
        spec: ProxySpec,
        health: Option<String>,
        ready_ask: tokio::sync::mpsc::Sender<crate::probe::ReadinessAsk>,
        spread: Duration,
        threads: usize,
    ) -> std::io::Result<Proxy> {
        let (gate_tx, _) = watch::channel(Gate::NotReady);
        let shared: &'static Shared =
            Box::leak(Box::new(Shared {
                gate: AtomicU8::new(Gate::NotReady as u8),
                gate_tx,
                ledger: Ledger::default(),
                idle: Notify::new(),
                health,
                ready_ask,
                upstream: spec.upstream,
                authority: spec.upstream.to_string().parse().map_err(|e| {
                    std::io::Error::other(format!("upstream {}: {e}", spec.upstream))
                })?,
                streams: StreamSet::default(),
                spread,
                unanswered: AtomicUsize::new(0),
                rejecting: AtomicUsize::new(0),
                clients: Clients::new(spec.upstream),
                stirred_ms: std::sync::atomic::AtomicU64::new(0),
                killing: AtomicBool::new(false),
                born: Instant::now(),
            }));
        shared.ledger.set_epoch(Instant::now());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
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
                let runtime = match RefusedThreads::build(threads) {
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
                            let serving = tokio::spawn(serve(l, shared));
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
        let (thread, handle) = started.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("its {threads} thread(s) could not be started: {e}"),
            )
        })?;
        Ok(Proxy {
            shared,
            thread: Some(thread),
            stop_tx: Some(stop_tx),
            runtime: handle,
        })
    }

    /// Moves the gate forward (never back). At [`Gate::Closing`] the ledger
    /// marks T0; at [`Gate::Closed`] with nothing in flight, [`Proxy::idle`]
    /// yields at once.
    pub fn set_gate(&self, gate: Gate) {
        let s = self.shared;
        let prev = Gate::from_u8(s.gate.fetch_max(gate as u8, SeqCst));
        if gate <= prev {
            return;
        }
        if gate >= Gate::Closing {
            s.ledger.mark_t0();
        }
        if gate >= Gate::Forwarded {
            s.stir();
        }
        if gate >= Gate::Closed && prev < Gate::Closed {
            // No request will need a pooled connection to the app any more.
            s.clients.h1.close_idle();
            s.clients.h2.close_idle();
            let n = s.streams.open();
            if n > 0 {
                log::info!(
                    "closing {n} stream(s) over {} (--stream-spread)",
                    crate::util::fmt_ms(s.spread)
                );
            }
            self.runtime
                .spawn(async move { s.streams.close_all(s.spread).await });
        }
        s.gate_tx.send_replace(gate);
        s.settled();
    }

    /// Yields once no admitted request is in flight and no stream is open after
    /// admission closed.
    pub async fn idle(&self) {
        loop {
            if self.shared.gate() >= Gate::Closed && self.shared.quiet() {
                return;
            }
            self.shared.idle.notified().await;
        }
    }

    /// No admitted request in flight and no stream open.
    pub fn is_quiet(&self) -> bool {
        self.shared.quiet()
    }

    /// Open streams (WebSockets, event streams).
    pub fn open_streams(&self) -> usize {
        self.shared.streams.open()
    }

    /// The ledger (report, metrics, log lines).
    pub fn ledger(&self) -> &'static Ledger {
        &self.shared.ledger
    }

    /// The ledger's totals now, with the requests sent to the app a second
    /// time (the report's `requests`).
    pub fn totals(&self) -> Totals {
        Totals {
            resent: self.shared.clients.h1.resent(),
            ..self.shared.ledger.totals()
        }
    }

    /// Cuts what is in flight (`abandoned`) and stops the proxy thread: the
    /// listener and every connection are closed. Returns when the thread has
    /// settled every request (a few ms; at most [`STOP_SETTLE`] more while a
    /// request is in flight or being answered drainit's 503
    /// ([`Rejecting`]) or, after a forward, a connection's first request
    /// is unanswered or [`STOP_QUIET`] has not passed since the forward or the
    /// last connection).
    pub fn stop(&mut self) {
        // An app that died by itself took its requests with it: their upstream
        // connections are reset, and the proxy thread settles them (`unknown`,
        // a 502 to the client) within moments. Give it those moments before
        // cutting what is left.
        // After a forward, so do the connections that have not had their first
        // request answered: one opened just before the forward may be sending its
        // request now (OPENING_GRACE), and it needs only drainit's 503, not the app.
        // And the clients whose idle connection the forward closed, reconnecting
        // now (STOP_QUIET): accepted, they get the 503; left in the kernel's
        // queue at the exit, a reset. And the 503s still reading their
        // request's body (Rejecting): counted `rejected`, they must go out.
        // After drainit's SIGKILL (the deadline, a second signal) likewise:
        // the abandoned requests' 502s (with `Connection: close`) are still
        // being written, and their clients reconnect at once to retry.
        // A request still waiting for the app to accept its connection never
        // reached it: it gets its 503 now (`rejected`, counted in `rejecting`
        // until it went out), not a connection cut without an answer.
        self.shared.clients.halt();
        let ledger = &self.shared.ledger;
        let lingering = self.shared.gate() >= Gate::Forwarded || self.shared.killing.load(SeqCst);
        let until = Instant::now() + STOP_SETTLE;
        while ((!ledger.cutting() && ledger.in_flight() > 0)
            || self.shared.rejecting.load(SeqCst) > 0
            || (lingering && (self.shared.unanswered.load(SeqCst) > 0 || !self.shared.still())))
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.shared.ledger.cut_all();
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Cuts what is in flight now (`abandoned`): drainit is about to SIGKILL
    /// the app (the deadline, or a second signal in beat 3). The
    /// connections are closed by [`Proxy::stop`] at the exit. Returns the
    /// requests in flight, how many of them were still waiting for a
    /// connection to the app (answered 503, `rejected`, not abandoned), and
    /// the streams open.
    pub fn abandon(&self) -> (u64, u64, usize) {
        self.shared.killing.store(true, SeqCst);
        // A connect under way will not be accepted by an app about to be
        // killed: its request, which never reached the app, is answered 503.
        // Both read before the halt: a halted request leaves `in_flight` at
        // once (`rejected`), on the proxy thread.
        let connecting = self.shared.clients.connecting();
        let in_flight = self.shared.ledger.in_flight();
        self.shared.clients.halt();
        // The 502s go out now and their clients reconnect: [`Proxy::stop`]
        // keeps accepting (503) until [`STOP_QUIET`] has passed since.
        self.shared.stir();
        self.shared.ledger.cut_all();
        (
            in_flight,
            connecting.min(in_flight),
            self.shared.streams.open(),
        )
    }
}

/// The ledger of the running proxy, for `/metrics` (`None` without `--proxy`).
pub fn running_ledger() -> Option<&'static Ledger> {
    RUNNING.get().map(|s| &s.ledger)
}

/// The running proxy's shared state, for `/metrics` (set once it serves).
static RUNNING: OnceLock<&'static Shared> = OnceLock::new();

/// Requests the running proxy sent to the app a second time because the
/// reused connection they were given was found closed ([`upstream::Pool::send`]);
/// `None` without `--proxy`. For `/metrics`.
pub fn upstream_resent() -> Option<u64> {
    RUNNING.get().map(|s| s.clients.h1.resent())
}

async fn serve(listener: tokio::net::TcpListener, shared: &'static Shared) {
    let _ = RUNNING.set(shared);
    let clients = &shared.clients;
    tokio::spawn(clients.h1.sweep());
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(connection_cap()));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                log::warn!("proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        shared.stir();
        // Given back when the connection and every tunnel it became are closed.
        tokio::spawn(connection(
            tcp,
            peer,
            shared,
            clients,
            std::sync::Arc::new(permit),
        ));
    }
}

/// The two ways to the app: HTTP/1.1 for HTTP/1 requests ([`upstream::Pool`]),
/// HTTP/2 (prior knowledge) for HTTP/2 ones ([`upstream::Multiplexed`]), so that
/// gRPC's trailers and streams go through.
struct Clients {
    h1: upstream::Pool,
    h2: upstream::Multiplexed,
}

impl Clients {
    fn new(app: SocketAddr) -> Clients {
        Clients {
            h1: upstream::Pool::new(app, UPSTREAM_IDLE),
            h2: upstream::Multiplexed::new(app, UPSTREAM_IDLE),
        }
    }

    /// Requests waiting for a connection to the app now.
    fn connecting(&self) -> u64 {
        self.h1.connects.waiting() + self.h2.connects.waiting()
    }

    /// Ends every connect to the app under way (and any begun later): its
    /// request never reached the app and gets drainit's 503 (`rejected`).
    fn halt(&self) {
        self.h1.connects.halt();
        self.h2.connects.halt();
    }
}

/// The client connection preface of HTTP/2 (RFC 9113 §3.4): a connection that
/// opens with it speaks HTTP/2 with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a new connection's first bytes until they tell HTTP/2's preface from
/// an HTTP/1 request line (one byte for most methods). `Ok(None)`: the client
/// closed first. The bytes read are returned to be replayed ([`Rewind`]).
async fn sniff(tcp: &mut tokio::net::TcpStream) -> std::io::Result<Option<(bool, Vec<u8>)>> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::with_capacity(1024);
    loop {
        if tcp.read_buf(&mut seen).await? == 0 {
            return Ok(None);
        }
        let k = seen.len().min(H2_PREFACE.len());
        if seen[..k] != H2_PREFACE[..k] {
            return Ok(Some((false, seen)));
        }
        if k == H2_PREFACE.len() {
            return Ok(Some((true, seen)));
        }
    }
}

/// `impl AsyncWrite` for a wrapper of a `TcpStream` in its field `tcp`: writes
/// go straight to the socket (vectored writes too). For [`Rewind`] and the
/// app-side [`upstream`] wrapper, which differ only in how they read. With a
/// method name after the type, that method of the wrapper is called after
/// each flush that succeeded ([`Rewind::flushed`]).
macro_rules! write_through_tcp {
    ($wrapper:ty) => {
        $crate::proxy::write_through_tcp!($wrapper, |_w: &mut $wrapper| {});
    };
    ($wrapper:ty, $after_flush:expr) => {
        impl tokio::io::AsyncWrite for $wrapper {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.tcp).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.tcp.is_write_vectored()
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let flushed = std::pin::Pin::new(&mut self.tcp).poll_flush(cx);
                if let std::task::Poll::Ready(Ok(())) = flushed {
                    let after: fn(&mut $wrapper) = $after_flush;
                    after(&mut *self);
                }
                flushed
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
            }
        }
    };
}
use write_through_tcp;

/// A connection whose first bytes were read by [`sniff`]: they are read again
/// first, then the socket.
struct Rewind {
    pre: Bytes,
    tcp: tokio::net::TcpStream,
    /// HTTP/1: the requests whose response is written whole once hyper's
    /// next flush succeeds.
    unflushed: Option<std::sync::Arc<Unflushed>>,
}

impl Rewind {
    /// hyper flushed: its write buffer was empty, every byte of the
    /// responses it took whole is in the kernel's hands.
    fn flushed(&mut self) {
        if let Some(u) = &self.unflushed {
            u.flushed();
        }
    }
}

/// The admitted requests of one HTTP/1 client connection whose response's
/// last frame hyper has taken but may not have written yet (it buffers up to
/// a few hundred KiB for a client slower than the app): they stay in flight
/// until hyper's next successful flush of the connection, which comes only
/// once its write buffer is empty, and are `completed` then. Dropped with the
/// connection before that (drainit cut it, or the client went), they are
/// `abandoned` or `canceled` as any request cut mid-response: a client that
/// got a cut response is never counted `completed`, and the drain signal
/// waits for the last bytes as for the rest of the response.
struct Unflushed {
    shared: &'static Shared,
    /// Whether `pending` holds any: read on every flush, without the lock.
    any: AtomicBool,
    pending: std::sync::Mutex<Vec<Admitted<'static>>>,
}

impl Unflushed {
    fn new(shared: &'static Shared) -> Unflushed {
        Unflushed {
            shared,
            any: AtomicBool::new(false),
            pending: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Admitted<'static>>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `admitted`'s response was taken whole by hyper: `completed` at the
    /// next flush.
    fn push(&self, admitted: Admitted<'static>) {
        self.lock().push(admitted);
        self.any.store(true, SeqCst);
    }

    /// Settles the pending requests `completed`.
    fn flushed(&self) {
        if self.any.swap(false, SeqCst) {
            // Drained in place: the list keeps its room for the next response.
            for mut a in self.lock().drain(..) {
                a.settle(Outcome::Completed);
            }
            self.shared.settled();
        }
    }
}

impl Drop for Unflushed {
    fn drop(&mut self) {
        // Not flushed: the connection was cut (or the client went) with their
        // last bytes unwritten: each settles `canceled`, or `abandoned` after
        // drainit's cut.
        let left = std::mem::take(&mut *self.lock());
        if !left.is_empty() {
            drop(left);
            self.shared.settled();
        }
    }
}

impl tokio::io::AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            let head = self.pre.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

write_through_tcp!(Rewind, Rewind::flushed);

/// Yields when the gate reaches `at` after this receiver last looked (a gate
/// already there when the connection came does not count: a new connection is
/// served, and answered as the gate says).
async fn gate_reaches(gate: &mut watch::Receiver<Gate>, at: Gate) {
    while gate.changed().await.is_ok() {
        if *gate.borrow_and_update() >= at {
            return;
        }
    }
}

/// One client connection: HTTP/2 when it opens with the preface (prior
/// knowledge), HTTP/1.1 otherwise.
async fn connection(
    mut tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &'static Shared,
    clients: &'static Clients,
    slot: Slot,
) {
    let mut gate = shared.gate_tx.subscribe();
    let unanswered = std::sync::Arc::new(Unanswered::new(shared));
    // The head timeout counts from the connection's start, as hyper's does for
    // HTTP/1. At the forward, a connection that has sent nothing gets
    // OPENING_GRACE to send its request (it may be on its way), then goes as idle.
    let first = {
        let sniffing = tokio::time::timeout(HEAD_TIMEOUT, sniff(&mut tcp));
        tokio::pin!(sniffing);
        tokio::select! {
            r = &mut sniffing => r,
            () = gate_reaches(&mut gate, Gate::Forwarded) => {
                match tokio::time::timeout(OPENING_GRACE, &mut sniffing).await {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
        }
    };
    let (h2, pre) = match first {
        Ok(Ok(Some(first))) => first,
        // Nothing sent within the head timeout: an idle pre-opened connection
        // (load balancers and browsers open them ahead), not a malformed request.
        Ok(Ok(None) | Err(_)) | Err(_) => return,
    };
    let unflushed = (!h2).then(|| std::sync::Arc::new(Unflushed::new(shared)));
    let io = TokioIo::new(Rewind {
        pre: Bytes::from(pre),
        tcp,
        unflushed: unflushed.clone(),
    });
    // The client's address as X-Forwarded-For and Forwarded want it, once per
    // connection.
    let peer_ip = Peer::new(peer);
    let first = unanswered.clone();
    let resets = h2.then(|| std::sync::Arc::new(Resets::default()));
    let counted = resets.clone();
    let service = hyper::service::service_fn(move |req| {
        let (peer_ip, slot, unflushed) = (peer_ip.clone(), slot.clone(), unflushed.clone());
        // Only the first response needs to say so (no clone after it).
        let unanswered = (!unanswered.is_answered()).then(|| unanswered.clone());
        let opened = counted.as_ref().map(|r| Opened::new(r.clone()));
        async move {
            let mut resp = handle(req, peer_ip, shared, clients, slot).await;
            resp.body_mut().unflushed = unflushed;
            if let Some(u) = unanswered {
                u.answered();
            }
            if let Some(o) = opened {
                o.answered();
            }
            Ok::<_, Infallible>(resp)
        }
    });
    if let Some(resets) = resets {
        serve_h2(io, service, gate, shared, &resets, peer).await;
    } else {
        serve_h1(io, service, gate, shared, &first).await;
    }
}

/// A client connection's place among the [`connection_cap`] served at once:
/// held by the connection, and by the tunnel of an upgrade (a WebSocket keeps
/// the client's and the app's descriptors open after hyper let the connection go).
type Slot = std::sync::Arc<tokio::sync::OwnedSemaphorePermit>;

/// A client connection counted in [`Shared::unanswered`] until its first
/// response is ready or it ends: [`Proxy::stop`] waits a moment for those
/// after a forward.
struct Unanswered {
    shared: &'static Shared,
    done: AtomicBool,
}

impl Unanswered {
    fn new(shared: &'static Shared) -> Unanswered {
        shared.unanswered.fetch_add(1, SeqCst);
        Unanswered {
            shared,
            done: AtomicBool::new(false),
        }
    }

    /// Whether its first response is ready.
    fn is_answered(&self) -> bool {
        self.done.load(Relaxed)
    }

    /// Its first response is ready (idempotent).
    fn answered(&self) {
        if !self.done.swap(true, Relaxed) {
            self.shared.unanswered.fetch_sub(1, SeqCst);
        }
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.answered();
    }
}

/// HTTP/1.1 until the connection closes, or until the gate says idle
/// connections go (the forward). A connection whose first request has not
/// been answered yet is not idle: its bytes came (that is how it got here), so
/// it is served (drainit's 503, `Connection: close`) and closes after.
async fn serve_h1<S>(
    io: TokioIo<Rewind>,
    service: S,
    mut gate: watch::Receiver<Gate>,
    shared: &'static Shared,
    first: &Unanswered,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r
                    && (e.is_parse() || e.is_parse_too_large())
                {
                    shared.ledger.malformed();
                }
                return;
            }
            () = gate_reaches(&mut gate, Gate::Forwarded), if !closing => {
                closing = true;
                // Finishes the request in progress, if any; closes an idle one.
                if first.is_answered() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// HTTP/2 (prior knowledge) until the connection closes. At beat 3 hyper's
/// graceful shutdown: GOAWAY with the last stream id 2^31-1 and a PING, then,
/// once the PING comes back, GOAWAY with the last stream id received
/// (RFC 9113 §6.8): the streams already open finish; a stream the client
/// opens after that is ignored, and the client knows from the last id that it
/// was never processed (safe to retry). A connection that opens after beat 3
/// gets the GOAWAY at once; the requests it sent meanwhile get drainit's 503.
///
/// A client that cancels most of its streams as soon as it opens them (the
/// rapid reset of CVE-2023-44487, paced so that h2's own guard, which counts
/// only streams reset before they are taken up, never trips) has its
/// connection closed once it has canceled [`PREMATURE_RESETS_MAX`] streams within
/// [`PREMATURE_RESET`] of opening them and they are more than half of its
/// streams: each went on to the app, on the HTTP/2 connection every client
/// shares, and the app's own guard could close that connection for them all.
async fn serve_h2<S>(
    io: TokioIo<Rewind>,
    service: S,
    mut gate: watch::Receiver<Gate>,
    shared: &'static Shared,
    resets: &Resets,
    peer: SocketAddr,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = shared.gate() >= Gate::Closed;
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    log::debug!("proxy: HTTP/2 connection ended: {e}");
                }
                return;
            }
            () = gate_reaches(&mut gate, Gate::Closed), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = resets.tripped.notified() => {
                log::warn!(
                    "proxy: HTTP/2 client {peer} canceled {} of its {} streams within {} of opening them (rapid reset): its connection is closed",
                    resets.premature.load(Relaxed),
                    resets.streams.load(Relaxed),
                    crate::util::fmt_ms(PREMATURE_RESET),
                );
                // Closed at once, not with a graceful GOAWAY: that waits for a
                // PING's answer, which such a client need not send.
                return;
            }
        }
    }
}

/// One HTTP/2 client connection's streams, and those of them it canceled
/// prematurely (within [`PREMATURE_RESET`] of opening them, before drainit
/// answered).
#[derive(Default)]
struct Resets {
    streams: std::sync::atomic::AtomicU32,
    premature: std::sync::atomic::AtomicU32,
    /// Notified once the connection is over the limit ([`serve_h2`]).
    tripped: tokio::sync::Notify,
}

/// One stream of an HTTP/2 client connection until drainit answers it:
/// dropped unanswered (the client reset it) within [`PREMATURE_RESET`], a
/// premature reset.
struct Opened {
    resets: std::sync::Arc<Resets>,
    at: Instant,
    answered: bool,
}

impl Opened {
    fn new(resets: std::sync::Arc<Resets>) -> Opened {
        resets.streams.fetch_add(1, Relaxed);
        Opened {
            resets,
            at: Instant::now(),
            answered: false,
        }
    }

    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if self.answered || self.at.elapsed() >= PREMATURE_RESET {
            return;
        }
        let premature = self.resets.premature.fetch_add(1, Relaxed) + 1;
        if premature >= PREMATURE_RESETS_MAX
            && premature.saturating_mul(2) > self.resets.streams.load(Relaxed)
        {
            self.resets.tripped.notify_one();
        }
    }
}

/// The response body drainit sends: its own, or the app's streamed through with
/// the request's ledger entry, settled when the last byte went out.
pub struct ProxyBody {
    inner: Inner,
    admitted: Option<Admitted<'static>>,
    shared: Option<&'static Shared>,
    /// A server-sent event stream (`text/event-stream`).
    sse: Option<Sse>,
    /// As a request body with something in it: what became of the client's
    /// body when reading it failed ([`BodyFate`]): `canceled`, not `unknown`.
    body_fate: Option<std::sync::Arc<AtomicU8>>,
    /// As a request body: fires when the client has sent nothing for
    /// [`BODY_IDLE`] while drainit waited for it (armed when a read finds
    /// nothing; time the app spends not reading does not count).
    stall: Option<Stall>,
    /// The upstream connection the response comes on: back to the pool when
    /// the body goes (after `inner`, so an unread body closes it first).
    lease: Option<upstream::Lease>,
    /// An HTTP/1 response's connection: its request is `completed` once
    /// the connection is flushed after the last frame, not when hyper takes it.
    unflushed: Option<std::sync::Arc<Unflushed>>,
    /// drainit's 503 to a `rejected` request: counted until written.
    rejecting: Option<Rejecting>,
    /// As a request body sent on a reused connection: what of it went out, so
    /// the request can go once more if the app resets it unread
    /// ([`upstream::Pool::send`]).
    copy: Option<std::sync::Arc<upstream::BodyCopy>>,
}

/// An SSE response body counted as a stream: ended between events at beat 3.
struct Sse {
    /// Counts and unregisters the stream when the body goes.
    open: Open,
    /// drainit asked it to close: it ends at the next event boundary.
    closing: bool,
    /// The last bytes sent (up to 3), to find an event's end across frames.
    tail: Vec<u8>,
    /// Ended by drainit; the next poll ends the body.
    ended: bool,
}

enum Inner {
    Local(Full<Bytes>),
    Upstream(Incoming),
}

impl ProxyBody {
    /// A body with nothing to account for: drainit's own text, or the app's
    /// body passed through as it is.
    fn plain(inner: Inner) -> ProxyBody {
        ProxyBody {
            inner,
            admitted: None,
            shared: None,
            sse: None,
            body_fate: None,
            stall: None,
            lease: None,
            unflushed: None,
            rejecting: None,
            copy: None,
        }
    }

    fn local(text: &'static str) -> ProxyBody {
        ProxyBody::plain(Inner::Local(Full::new(Bytes::from_static(text.as_bytes()))))
    }

    fn text(text: String) -> ProxyBody {
        ProxyBody::plain(Inner::Local(Full::new(Bytes::from(text))))
    }

    fn settle(&mut self, outcome: Outcome) {
        if let Some(mut a) = self.admitted.take() {
            // Taken whole by hyper, maybe not written yet: completed when the
            // connection is flushed (an SSE's request settled at its head).
            if outcome == Outcome::Completed
                && let Some(u) = &self.unflushed
            {
                u.push(a);
                return;
            }
            a.settle(outcome);
            drop(a);
            if let Some(s) = self.shared {
                s.settled();
            }
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(sse) = &mut this.sse {
            if sse.ended {
                return Poll::Ready(None);
            }
            if !sse.closing
                && let Some(reg) = &mut sse.open.reg
                && Pin::new(&mut reg.close).poll(cx).is_ready()
            {
                sse.closing = true;
            }
            if sse.closing && streams::last_event_end(&sse.tail) == Some(sse.tail.len()) {
                sse.ended = true;
                sse.open.end = StreamEnd::ClosedByDrain;
                return Poll::Ready(None);
            }
        }
        let polled = match &mut this.inner {
            Inner::Local(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {}),
            Inner::Upstream(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        };
        if let Some(stall) = &mut this.stall {
            match &polled {
                Poll::Pending if !stall.waiting => {
                    stall
                        .sleep
                        .as_mut()
                        .reset(tokio::time::Instant::now() + BODY_IDLE);
                    stall.waiting = true;
                }
                Poll::Pending => {}
                _ => stall.waiting = false,
            }
            if stall.waiting && stall.sleep.as_mut().poll(cx).is_ready() {
                if let Some(fate) = &this.body_fate {
                    fate.store(BodyFate::Stalled as u8, Relaxed);
                }
                this.stall = None;
                return Poll::Ready(Some(Err(format!(
                    "the client sent nothing of its body for {} s",
                    BODY_IDLE.as_secs()
                )
                .into())));
            }
        }
        if let Some(copy) = &this.copy {
            match &polled {
                Poll::Ready(Some(Ok(f))) => match f.data_ref() {
                    Some(data) => {
                        copy.push(data);
                        if this.is_end_stream() {
                            copy.end();
                        }
                    }
                    // Trailers are not kept: such a request is not sent twice.
                    None => copy.spoil(),
                },
                Poll::Ready(None) => copy.end(),
                Poll::Ready(Some(Err(_))) => copy.spoil(),
                Poll::Pending => {}
            }
        }
        if let (Some(sse), Poll::Ready(Some(Ok(frame)))) = (&mut this.sse, &polled)
            && let Some(data) = frame.data_ref()
        {
            // An event's blank line may span two frames: the frame's first
            // bytes are searched with the tail of what went before (at most 3
            // bytes each), the frame itself in place.
            let mut seam = std::mem::take(&mut sse.tail);
            let before = seam.len();
            seam.extend_from_slice(&data[..data.len().min(3)]);
            if sse.closing
                && let Some(end) = streams::last_event_end(data).or_else(|| {
                    streams::last_event_end(&seam)
                        .filter(|e| *e > before)
                        .map(|e| e - before)
                })
            {
                sse.ended = true;
                sse.open.end = StreamEnd::ClosedByDrain;
                return Poll::Ready(Some(Ok(Frame::data(data.slice(..end)))));
            }
            sse.tail = if data.len() >= 3 {
                data[data.len() - 3..].to_vec()
            } else {
                seam[seam.len().saturating_sub(3)..].to_vec()
            };
        }
        if let (Some(fate), Poll::Ready(Some(Err(_)))) = (&this.body_fate, &polled) {
            fate.store(BodyFate::Gone as u8, Relaxed);
        }
        match &polled {
            Poll::Ready(None) => this.settle(Outcome::Completed),
            Poll::Ready(Some(Err(_))) => this.settle(Outcome::Unknown),
            // Trailers are a body's last frame, and hyper's HTTP/1 server asks
            // for nothing after them (the body's own end is never seen).
            Poll::Ready(Some(Ok(f))) if f.is_trailers() || this.is_end_stream() => {
                this.settle(Outcome::Completed);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        if self.sse.as_ref().is_some_and(|s| s.ended) {
            return true;
        }
        match &self.inner {
            Inner::Local(b) => b.is_end_stream(),
            Inner::Upstream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Local(b) => b.size_hint(),
            Inner::Upstream(b) => b.size_hint(),
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // A body hyper never had to poll (HEAD, 204, 304, empty) reached the
        // client whole; anything else dropped early was the client going away
        // (or drainit cutting it: the ledger knows).
        if self.is_end_stream() {
            self.settle(Outcome::Completed);
        } else if let Some(a) = self.admitted.take() {
            drop(a);
            if let Some(s) = self.shared {
                s.settled();
            }
        }
    }
}

async fn handle(
    mut req: Request<Incoming>,
    peer_ip: Peer,
    shared: &'static Shared,
    clients: &'static Clients,
    slot: Slot,
) -> Response<ProxyBody> {
    let gate = shared.gate();
    let version = req.version();
    // A HEAD gets the head of an event stream and no body: not a stream.
    let is_head = req.method() == Method::HEAD;
    let h2 = version == hyper::Version::HTTP_2;
    if let Some(h) = &shared.health
        && req.uri().path() == h
        && matches!(*req.method(), Method::GET | Method::HEAD)
    {
        // Something routes by drainit's readiness: the default pre-drain delay
        // applies (DESIGN §2), as for `/readyz`.
        crate::published::note_readyz_asked();
        return health(shared, version).await;
    }
    // RFC 9112 §3.2: an HTTP/1.1 request without `Host`, and any request with
    // more than one, is answered 400 and never sent on (counted `malformed`,
    // as hyper's own 400s are). RFC 9113 §8.3.1: an HTTP/2 request whose `Host`
    // names another authority than its `:authority` is malformed too.
    let hosts = req.headers().get_all(header::HOST);
    let host_count = hosts.iter().count();
    let bad = |text| Some((StatusCode::BAD_REQUEST, text));
    let refused = if host_count > 1 {
        bad("400 bad request: more than one Host field\n")
    } else if !h2 && host_count == 0 && version == hyper::Version::HTTP_11 {
        bad("400 bad request: HTTP/1.1 requires a Host field\n")
    } else if h2
        && let (Some(authority), Some(host)) = (req.uri().authority(), hosts.iter().next())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        bad("400 bad request: Host differs from :authority\n")
    } else if !h2
        && req.uri().scheme().is_none()
        && req.uri().authority().is_some()
        && req.method() != Method::CONNECT
    {
        // RFC 9112 §3.2.3: the authority form (`GET example.com:80`) is
        // CONNECT's only; sent on, the app got `GET /` with that authority as
        // its `Host`, in place of the client's.
        bad("400 bad request: an authority-form target is for CONNECT only\n")
    } else if !h2 && req.uri() == "*" && req.method() != Method::OPTIONS {
        // RFC 9112 §3.2.4: the asterisk form is OPTIONS's only.
        bad("400 bad request: an asterisk-form target is for OPTIONS only\n")
    } else if req.method() == Method::CONNECT {
        // drainit is a reverse proxy, not a forward one: a `CONNECT` (RFC 9110
        // §9.3.6) asks for a tunnel to another host, which it does not relay
        // (sent on, an app's 2xx left the client a 200 and a closed
        // connection). 501, never sent to the app, counted `malformed`.
        Some((
            StatusCode::NOT_IMPLEMENTED,
            "501 not implemented: CONNECT (drainit is no forward proxy)\n",
        ))
    } else {
        None
    };
    if let Some((status, text)) = refused {
        shared.ledger.malformed();
        let mut r = local(status, text, gate, version);
        if !h2 {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return r;
    }
    // Counted `received` with its outcome, in one write: `rejected` here, or
    // admitted below.
    if gate != Gate::Ready && gate != Gate::Closing {
        shared.ledger.rejected();
        let rejecting = Rejecting::new(shared);
        let why = if gate == Gate::NotReady {
            "not ready"
        } else {
            "draining"
        };
        // A client that waits for `100 Continue` gets the 503 instead: reading
        // the body would send the 100 and invite an upload drainit then cuts
        // (RFC 9110 §10.1.1). hyper closes the connection after the answer.
        if !expects_continue(req.headers()) {
            drain_body(req.into_body()).await;
        }
        return unavailable(why, gate, version, rejecting);
    }
    // Declared before `admitted`, so dropped after it: when hyper drops this
    // future (the client went away while the app works on its request), the
    // request settles `canceled` and the supervisor, which may be waiting for
    // nothing in flight, hears of it.
    let _wake = Wake(shared);
    let mut admitted =
        shared
            .ledger
            .admit(req.method(), req.uri(), req.headers().get("x-request-id"));
    // Admission may have closed since the gate was read above, and the
    // supervisor may have seen nothing in flight and forwarded the drain signal:
    // read again now that this request counts (both sides SeqCst: one of them
    // sees the other). Closed now: it never reaches the app.
    if shared.gate() >= Gate::Closed {
        let rejecting = Rejecting::new(shared);
        admitted.refused();
        drop(admitted);
        shared.settled();
        if !expects_continue(req.headers()) {
            drain_body(req.into_body()).await;
        }
        return unavailable("draining", shared.gate(), version, rejecting);
    }
    let upgrading = wants_upgrade(req.headers());
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));

    let (mut parts, body) = req.into_parts();
    // gRPC asks for trailers with `TE: trailers`, the one TE value HTTP/2
    // allows (RFC 9113 §8.2.2); the request goes on over HTTP/2, so it stays.
    let te_trailers = h2
        && parts
            .headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let asterisk = !h2 && parts.uri == "*";
    strip_hop_by_hop(&mut parts.headers, upgrading);
    if te_trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    append_forwarded_for(&mut parts.headers, peer_ip.xff);
    parts.headers.append(header::FORWARDED, peer_ip.forwarded);
    if h2 {
        // The client's `:authority` goes on (RFC 9113 §8.3.1), or its `Host`
        // when it sent no `:authority`; the app's address only when neither.
        let authority = parts
            .uri
            .authority()
            .cloned()
            .or_else(|| {
                parts
                    .headers
                    .get(header::HOST)
                    .and_then(|h| hyper::http::uri::Authority::try_from(h.as_bytes()).ok())
            })
            .unwrap_or_else(|| shared.authority.clone());
        parts.uri = upstream_uri(&authority, &parts.uri);
    } else {
        // HTTP/1: origin form (RFC 9112 §3.2.1), the client's `Host` kept; an
        // absolute-form target's host replaces it (RFC 9112 §3.2.2: the target
        // wins over a `Host` that disagrees); a request without either
        // (HTTP/1.0) names the app.
        if !asterisk && parts.method != Method::CONNECT {
            if let Some(host) = parts.uri.authority().and_then(host_of) {
                parts.headers.insert(header::HOST, host);
            }
            parts.uri = origin_form(std::mem::take(&mut parts.uri));
        }
        if !parts.headers.contains_key(header::HOST)
            && let Ok(host) = HeaderValue::from_str(shared.authority.as_str())
        {
            parts.headers.insert(header::HOST, host);
        }
    }
    let mut up_body = ProxyBody::plain(Inner::Upstream(body));
    // Only a body with something in it can fail or stall (most requests have
    // none: no allocation, no timer for them).
    let body_fate = (!up_body.is_end_stream())
        .then(|| std::sync::Arc::new(AtomicU8::new(BodyFate::Read as u8)));
    up_body.body_fate = body_fate.clone();
    // HTTP/1 only: an HTTP/2 request body may be a gRPC stream whose client
    // is silent for minutes by design.
    if !h2 && body_fate.is_some() {
        up_body.stall = Some(Stall {
            sleep: Box::pin(tokio::time::sleep(BODY_IDLE)),
            waiting: false,
        });
    }
    let up_req = Request::from_parts(parts, up_body);
    let sent = if asterisk {
        // `OPTIONS *` (asterisk form, RFC 9112 §3.2.4) goes on a connection of
        // its own: it says nothing of the app's paths.
        send_asterisk(&clients.h1, up_req).await.map(|r| (r, None))
    } else if h2 {
        clients.h2.send(up_req).await.map(|r| (r, None))
    } else {
        clients.h1.send(up_req).await.map(|(r, l)| (r, Some(l)))
    };
    let (mut resp, lease) = match sent {
        Ok(r) => r,
        Err(e) if !e.reached_app => {
            // It never reached the app: safe to retry. Counted in
            // `rejecting` before it leaves `in_flight`: drainit's exit waits
            // for the 503 to go out (a connect halted at the exit).
            let rejecting = Rejecting::new(shared);
            admitted.refused();
            drop(admitted);
            shared.settled();
            log::debug!(
                "proxy: upstream {} not reached: {}",
                shared.upstream,
                e.message
            );
            let why = match e.connect {
                upstream::ConnectFailed::TimedOut => "upstream timeout",
                upstream::ConnectFailed::Halted => "draining",
                upstream::ConnectFailed::Refused => "upstream refused",
            };
            return unavailable(why, shared.gate(), version, rejecting);
        }
        Err(e)
            if body_fate
                .as_ref()
                .is_some_and(|f| f.load(Relaxed) != BodyFate::Read as u8) =>
        {
            // The client went away while its body was being sent on, or
            // stalled it past BODY_IDLE.
            log::debug!("proxy: the client's body failed mid-request: {}", e.message);
            settle_now(admitted, Outcome::Canceled, shared);
            if body_fate.is_some_and(|f| f.load(Relaxed) == BodyFate::Stalled as u8) {
                let mut r = local(
                    StatusCode::REQUEST_TIMEOUT,
                    "408 request timeout: the request body stalled\n",
                    shared.gate(),
                    version,
                );
                if !h2 {
                    r.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                return r;
            }
            return local(StatusCode::BAD_REQUEST, "", shared.gate(), version);
        }
        Err(e) => {
            log::debug!("proxy: upstream failed: {}", e.message);
            // Once drainit SIGKILLs the app (deadline, second signal), it was
            // not gone by itself: the client is told which. (Any stop cuts the
            // ledger, so a request failing then is `abandoned` either way; only
            // these are drainit's SIGKILL.)
            let why = if shared.killing.load(SeqCst) {
                "502 bad gateway: drainit stopped the app before it answered (the drain deadline, or a second signal); the request may have been processed\n"
            } else {
                "502 bad gateway: the app closed the connection without a complete response\n"
            };
            settle_now(admitted, Outcome::Unknown, shared);
            return local(StatusCode::BAD_GATEWAY, why, shared.gate(), version);
        }
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            // A 101 to a request that asked for no upgrade (RFC 9110 §15.2.2:
            // the app's error). Passed on, the client got a 101 and then
            // nothing, counted `completed`. The app got the request: `unknown`,
            // a 502; its connection is not reused.
            if let Some(l) = lease {
                l.upgraded();
            }
            drop(resp);
            settle_now(admitted, Outcome::Unknown, shared);
            return local(
                StatusCode::BAD_GATEWAY,
                "502 bad gateway: the app switched protocols without an upgrade asked\n",
                shared.gate(),
                version,
            );
        };
        // The protocol the app switched to is the one its 101 names (RFC 9110
        // §7.8), not the client's list (`websocket, h2c` is offered as
        // `websocket`): a WebSocket's tunnel ends between frames at beat 3.
        let websocket = resp
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
        let app_upgrade = hyper::upgrade::on(&mut resp);
        if let Some(l) = lease {
            l.upgraded();
        }
        // Registered before the request settles: the wait for "nothing in
        // flight" never sees a gap between the two.
        let reg = shared.streams.register();
        shared.ledger.stream_opened();
        tokio::spawn(tunnel(
            client_upgrade,
            app_upgrade,
            websocket,
            reg,
            shared,
            slot,
        ));
        settle_now(admitted, Outcome::Completed, shared);
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, true);
        return Response::from_parts(parts, ProxyBody::plain(Inner::Upstream(body)));
    }
    let event_stream = !is_head
        && resp.status() == StatusCode::OK
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let sse = if event_stream {
        // The response head reached the client: the request completed, and
        // the stream that follows is counted as one.
        let reg = shared.streams.register();
        shared.ledger.stream_opened();
        admitted.settle(Outcome::Completed);
        Some(Sse {
            open: Open {
                shared,
                end: StreamEnd::Completed,
                reg: Some(reg),
            },
            closing: false,
            tail: b"\n\n".to_vec(),
            ended: false,
        })
    } else {
        None
    };
    let (mut parts, body) = resp.into_parts();
    // The client's version, not the app's: an HTTP/1.0 app behind drainit does
    // not turn the client's keep-alive connection into a one-shot one.
    parts.version = version;
    strip_hop_by_hop(&mut parts.headers, false);
    // HTTP/2 has no `Connection` field (RFC 9113 §8.2.2): its connections go
    // with GOAWAY at beat 3.
    if shared.gate() >= Gate::Closing && !h2 {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let mut body = ProxyBody::plain(Inner::Upstream(body));
    body.admitted = Some(admitted);
    body.shared = Some(shared);
    body.sse = sse;
    body.lease = lease;
    Response::from_parts(parts, body)
}

/// The body-stall timer of a request body ([`BODY_IDLE`]).
struct Stall {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// A read found nothing and the client has not sent since: `sleep` runs.
    waiting: bool,
}

/// What became of a request body that failed on its way to the app.
#[repr(u8)]
enum BodyFate {
    /// Read whole, or still being read.
    Read = 0,
    /// The client went away mid-body.
    Gone = 1,
    /// The client sent nothing for [`BODY_IDLE`].
    Stalled = 2,
}

/// A request counted `rejected` whose 503 is not written yet (drainit reads
/// its body first, up to [`REJECT_BODY_MAX`] or 1 s, so that the answer is not
/// lost to a reset): counted in [`Shared::rejecting`] until the 503's body,
/// which holds it, is dropped by hyper, in the same poll as the write and
/// flush of the whole answer. [`Proxy::stop`] waits for these (at most
/// [`STOP_SETTLE`]): a client counted `rejected` gets its 503, not a
/// connection cut by drainit's exit.
struct Rejecting(&'static Shared);

impl Rejecting {
    fn new(shared: &'static Shared) -> Rejecting {
        shared.rejecting.fetch_add(1, SeqCst);
        Rejecting(shared)
    }
}

impl Drop for Rejecting {
    fn drop(&mut self) {
        self.0.rejecting.fetch_sub(1, SeqCst);
    }
}

/// Tells the supervisor a request may have settled ([`Shared::settled`]) when
/// dropped.
struct Wake(&'static Shared);

impl Drop for Wake {
    fn drop(&mut self) {
        self.0.settled();
    }
}

/// Settles an admitted request now, before its response is made (drainit's
/// own answer, or a tunnel's start), and wakes whoever waits for the proxy to
/// be quiet.
fn settle_now(mut admitted: Admitted<'static>, outcome: Outcome, shared: &Shared) {
    admitted.settle(outcome);
    drop(admitted);
    shared.settled();
}

/// Both halves of an upgraded connection, copied until both sides have ended
/// (a half-close is passed on) or drainit closes it at beat 3
/// ([`streams::tunnel`]).
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    app: hyper::upgrade::OnUpgrade,
    websocket: bool,
    reg: Registered<'static>,
    shared: &'static Shared,
    _slot: Slot,
) {
    let mut open = Open {
        shared,
        end: StreamEnd::Abandoned,
        reg: Some(reg),
    };
    let end = match (client.await, app.await) {
        (Ok(client), Ok(app)) => {
            let close = &mut open.reg.as_mut().expect("set above").close;
            match streams::tunnel(TokioIo::new(client), TokioIo::new(app), websocket, close).await {
                Ended::ByPeer => StreamEnd::Completed,
                Ended::ByDrain => StreamEnd::ClosedByDrain,
            }
        }
        _ => StreamEnd::Completed,
    };
    open.end = end;
}

/// An open stream: counted and unregistered however its task ends (dropped at
/// the exit too: then `abandoned`).
struct Open {
    shared: &'static Shared,
    end: StreamEnd,
    reg: Option<Registered<'static>>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.shared.ledger.stream_ended(self.end);
        drop(self.reg.take());
        self.shared.settled();
    }
}

/// The health path: drainit's own readiness, as `/readyz` (200 only while
/// ready; 503 before and from T0).
async fn health(shared: &'static Shared, version: hyper::Version) -> Response<ProxyBody> {
    let gate = shared.gate();
    if gate != Gate::Ready {
        let word = if gate == Gate::NotReady {
            "starting\n"
        } else {
            "draining\n"
        };
        return local(StatusCode::SERVICE_UNAVAILABLE, word, gate, version);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let answer = async {
        shared.ready_ask.send(tx).await.ok()?;
        rx.await.ok()
    };
    let answer = tokio::time::timeout(HEALTH_WAIT, answer)
        .await
        .ok()
        .flatten();
    // A drain that began meanwhile wins.
    let gate = shared.gate();
    match answer {
        Some((true, _)) if gate == Gate::Ready => local(StatusCode::OK, "ready\n", gate, version),
        Some((_, word)) if gate == Gate::Ready => {
            let mut r = local(StatusCode::SERVICE_UNAVAILABLE, "", gate, version);
            *r.body_mut() = ProxyBody::text(format!("{word}\n"));
            r
        }
        _ if gate == Gate::Ready => {
            local(StatusCode::SERVICE_UNAVAILABLE, "unknown\n", gate, version)
        }
        _ => local(StatusCode::SERVICE_UNAVAILABLE, "draining\n", gate, version),
    }
}

/// How long the health path waits for the readiness evaluation (the checks'
/// own timeouts end it sooner).
pub const HEALTH_WAIT: Duration = Duration::from_secs(10);

/// drainit's own 503: never reached the app, safe to retry (RFC 9110 §15.6.4,
/// `Retry-After` §10.2.3). Its `Proxy-Status` (RFC 9209 §2) names the error
/// type: `destination_unavailable` before ready and while draining,
/// `connection_refused` and `connection_timeout` (§2.3.7, §2.3.9) when the
/// connection to the app failed. Its body holds `rejecting` until it is
/// written ([`Rejecting`]).
fn unavailable(
    why: &'static str,
    gate: Gate,
    version: hyper::Version,
    rejecting: Rejecting,
) -> Response<ProxyBody> {
    let (body, error, details) = match why {
        "not ready" => (
            "503 not ready\n",
            "destination_unavailable",
            "\"not ready\"",
        ),
        "draining" => ("503 draining\n", "destination_unavailable", "\"draining\""),
        "upstream timeout" => (
            "503 upstream did not accept the connection in time\n",
            "connection_timeout",
            "\"upstream connect timeout\"",
        ),
        _ => (
            "503 upstream refused\n",
            "connection_refused",
            "\"upstream refused\"",
        ),
    };
    let mut r = local(StatusCode::SERVICE_UNAVAILABLE, body, gate, version);
    r.body_mut().rejecting = Some(rejecting);
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    if version < hyper::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let status = format!("drainit; error={error}; details={details}");
    if let Ok(v) = HeaderValue::from_str(&status) {
        h.insert(HeaderName::from_static("proxy-status"), v);
    }
    r
}

/// A response of drainit's own; `Connection: close` from T0 on HTTP/1 only
/// (HTTP/2 has no `Connection` field).
fn local(
    status: StatusCode,
    text: &'static str,
    gate: Gate,
    version: hyper::Version,
) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::local(text));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if gate >= Gate::Closing && version < hyper::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Reads a rejected request's body, bounded in size and time, so the client is
/// not answered with a TCP reset while it still sends.
async fn drain_body(mut body: Incoming) {
    let read = async {
        let mut n = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(d) = frame.data_ref() {
                n += d.len();
                if n > REJECT_BODY_MAX {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(REJECT_BODY_TIME, read).await;
}

/// The request carries `Expect: 100-continue` (RFC 9110 §10.1.1).
fn expects_continue(h: &HeaderMap) -> bool {
    h.get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
}

/// The request asks to switch protocols (`Connection: upgrade` and `Upgrade`).
/// `Upgrade: h2c` alone is not passed on as one: the HTTP/1.1 to HTTP/2 upgrade
/// of RFC 7540 §3.2 was removed by RFC 9113 §3.1 (HTTP/2 comes by prior
/// knowledge here), and the requests of an HTTP/2 connection inside a tunnel
/// would escape the ledger and be cut at beat 3. The request is served as
/// HTTP/1.1, its `Upgrade` and `HTTP2-Settings` dropped as hop-by-hop fields.
fn wants_upgrade(h: &HeaderMap) -> bool {
    // Most requests have no `Upgrade`: one lookup, nothing more.
    let only_h2c = || {
        h.get_all(header::UPGRADE)
            .iter()
            .all(|v| v.to_str().is_ok_and(|s| s.split(',').all(is_h2c)))
    };
    h.contains_key(header::UPGRADE)
        && !only_h2c()
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// RFC 9110 §7.6.1: `Connection`, the fields it names, and the hop-by-hop fields
/// (`Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`) are
/// not forwarded; hyper frames the body itself (so a `Content-Length` beside a
/// `Transfer-Encoding` goes too, RFC 9112 §6.3). An upgrade keeps `Upgrade` and
/// `Connection: upgrade`.
fn strip_hop_by_hop(h: &mut HeaderMap, upgrading: bool) {
    // One pass over the names finds the hop-by-hop fields present (most
    // messages carry none, or only `Connection`); only those are looked up.
    // Names are unique among the keys, so at most HOP_BY_HOP of them: no
    // allocation on this per-message path.
    let mut present: [Option<HeaderName>; HOP_BY_HOP] = Default::default();
    for (slot, name) in present
        .iter_mut()
        .zip(h.keys().filter(|n| is_hop_by_hop(n)))
    {
        *slot = Some(name.clone());
    }
    if present[0].is_none() && !upgrading {
        return;
    }
    if present.contains(&Some(header::CONNECTION)) {
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .map(str::trim)
            // `close` names no field; the hop-by-hop ones are in `present`.
            .filter(|t| !t.eq_ignore_ascii_case("close"))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            // `Host` is end to end whatever a client says (RFC 9112 §3.2
            // requires it): `Connection: host` must not strip it.
            .filter(|n| !is_hop_by_hop(n) && n != header::HOST)
            .collect();
        for n in named {
            h.remove(n);
        }
    }
    // RFC 9112 §6.3: a message framed by `Transfer-Encoding` that also has a
    // `Content-Length` (an app that sets both) is chunked, and a proxy drops
    // the length before forwarding it: hyper frames the body again, and a
    // length left behind would promise the client another size than it gets.
    if present.contains(&Some(header::TRANSFER_ENCODING)) {
        h.remove(header::CONTENT_LENGTH);
    }
    for n in present.into_iter().flatten() {
        if !(upgrading && n == header::UPGRADE) {
            h.remove(n);
        }
    }
    if upgrading {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        drop_h2c(h);
    }
}

/// An `Upgrade` list's token (surrounding spaces allowed) names h2c.
fn is_h2c(token: &str) -> bool {
    token.trim().eq_ignore_ascii_case("h2c")
}

/// Takes the `h2c` token out of an upgrade's `Upgrade` list (`websocket, h2c`
/// becomes `websocket`), so the app cannot switch to HTTP/2 inside a tunnel
/// whose requests the ledger would never see (see [`wants_upgrade`]).
fn drop_h2c(h: &mut HeaderMap) {
    let has_h2c = h
        .get_all(header::UPGRADE)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(is_h2c)));
    if !has_h2c {
        return;
    }
    let kept: Vec<String> = h
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter(|t| !is_h2c(t) && !t.trim().is_empty())
        .map(|t| t.trim().to_owned())
        .collect();
    h.remove(header::UPGRADE);
    // `wants_upgrade` saw a token other than h2c, so `kept` is not empty.
    if let Ok(v) = HeaderValue::from_str(&kept.join(", ")) {
        h.insert(header::UPGRADE, v);
    }
}

/// How many names [`is_hop_by_hop`] knows.
const HOP_BY_HOP: usize = 6;

/// A field [`strip_hop_by_hop`] always drops (or, for an upgrade, rewrites):
/// one of [`HOP_BY_HOP`] names.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Called for every field of every message: the length first, so most
    // names are told apart without comparing a byte.
    let n = name.as_str();
    match n.len() {
        2 => n == "te",
        // `Trailer` is end to end (RFC 9110 §6.6.2), and hyper sends a
        // response's trailers only when it names them.
        7 => n == "upgrade",
        10 => n == "connection" || n == "keep-alive",
        16 => n == "proxy-connection",
        17 => n == "transfer-encoding",
        _ => false,
    }
}

/// The client's address as `X-Forwarded-For` gives it (an IPv4-mapped IPv6
/// address as IPv4).
fn forwarded_ip(peer: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.ip().to_canonical().to_string())
        .unwrap_or(HeaderValue::from_static("unknown"))
}

/// A client connection's address, as the two headers that carry it upstream.
#[derive(Clone)]
struct Peer {
    /// `X-Forwarded-For`: `192.0.2.7`, `2001:db8::1`.
    xff: HeaderValue,
    /// `Forwarded` (RFC 7239 §4, §6): `for=192.0.2.7`, `for="[2001:db8::1]"`.
    forwarded: HeaderValue,
}

impl Peer {
    fn new(peer: SocketAddr) -> Peer {
        let forwarded = match peer.ip().to_canonical() {
            std::net::IpAddr::V4(ip) => format!("for={ip}"),
            std::net::IpAddr::V6(ip) => format!("for=\"[{ip}]\""),
        };
        Peer {
            xff: forwarded_ip(peer),
            forwarded: HeaderValue::from_str(&forwarded)
                .unwrap_or(HeaderValue::from_static("for=unknown")),
        }
    }
}

/// Appends the client's address (`ip`) to `X-Forwarded-For`, as one field line:
/// the lines received are joined in order first (RFC 9110 §5.3), so none is
/// lost. A load balancer in front (HAProxy's `option forwardfor`) adds its own
/// line after the client's: dropping it would hand the app the client's
/// (spoofable) value where it expects the balancer's. `Forwarded` (RFC 7239)
/// gets a field line of its own (`for=…`), after any received.
fn append_forwarded_for(h: &mut HeaderMap, ip: HeaderValue) {
    let name = HeaderName::from_static("x-forwarded-for");
    let prev: Vec<&[u8]> = h
        .get_all(&name)
        .iter()
        .map(HeaderValue::as_bytes)
        .filter(|v| !v.trim_ascii().is_empty())
        .collect();
    if prev.is_empty() {
        h.insert(name, ip);
        return;
    }
    let mut joined = prev.join(&b", "[..]);
    joined.extend_from_slice(b", ");
    joined.extend_from_slice(ip.as_bytes());
    match HeaderValue::from_bytes(&joined) {
        Ok(v) => {
            h.insert(name, v);
        }
        Err(_) => {
            h.insert(name, ip);
        }
    }
}

/// Sends an asterisk-form request on a connection of its own to the app,
/// closed after it.
///
/// # Errors
/// As [`upstream::Pool::send`].
async fn send_asterisk(
    pool: &upstream::Pool,
    mut req: Request<ProxyBody>,
) -> Result<Response<Incoming>, upstream::SendError> {
    let mut conn = pool.connect().await?;
    *req.uri_mut() = Uri::from_static("*");
    conn.send
        .send_request(req)
        .await
        .map_err(|e| upstream::SendError::reached(e.to_string()))
}

/// The `Host` field for an absolute-form target's authority: its host and
/// port, without the userinfo a client may have put before them.
fn host_of(a: &hyper::http::uri::Authority) -> Option<HeaderValue> {
    let host = a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h);
    HeaderValue::from_str(host).ok()
}

/// The origin form of a request target (RFC 9112 §3.2.1): an absolute-form
/// target loses its scheme and authority; one in origin form is kept as it is.
fn origin_form(uri: Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri;
    }
    uri.path_and_query()
        .map_or_else(Uri::default, |pq| Uri::from(pq.clone()))
}

/// The request's path and query, addressed to the app (`authority`): built
/// from parts, without formatting or parsing a string.
fn upstream_uri(authority: &hyper::http::uri::Authority, uri: &Uri) -> Uri {
    let mut parts = hyper::http::uri::Parts::default();
    parts.scheme = Some(hyper::http::uri::Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| hyper::http::uri::PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes decide, in as many reads as they come, and are read
    /// again whole through [`Rewind`].
    #[tokio::test]
    async fn the_preface_tells_http2_from_http1_and_its_bytes_are_read_again() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let cases: [(&[&[u8]], Option<bool>); 4] = [
            (&[b"GET / HTTP/1.1\r\n\r\n"], Some(false)),
            (&[b"P", b"OST / HTTP/1.1\r\n\r\n"], Some(false)),
            (
                &[b"PRI * HT", b"TP/2.0\r\n\r\nSM\r\n\r\n\0\0\0"],
                Some(true),
            ),
            (&[b"PRI"], None),
        ];
        for (pieces, want) in cases {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut tcp, _) = l.accept().await.unwrap();
            let all: Vec<u8> = pieces.concat();
            for p in pieces {
                c.write_all(p).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            c.shutdown().await.unwrap();
            let got = sniff(&mut tcp).await.unwrap();
            assert_eq!(got.as_ref().map(|g| g.0), want, "{all:?}");
            if let Some((_, pre)) = got {
                let mut io = Rewind {
                    pre: Bytes::from(pre),
                    tcp,
                    unflushed: None,
                };
                let mut again = Vec::new();
                io.read_to_end(&mut again).await.unwrap();
                assert_eq!(again, all);
            }
        }
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
        // Nothing hop-by-hop: nothing changes.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2);
        // `Connection` naming `Host` (a client trying to strip it) keeps it,
        // and `close` names nothing.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, Host, x-gone"),
        );
        h.insert("x-gone", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["host"]);
        // All HOP_BY_HOP names at once: every one goes.
        let mut h = HeaderMap::new();
        for n in [
            "connection",
            "te",
            "transfer-encoding",
            "upgrade",
            "keep-alive",
            "proxy-connection",
        ] {
            h.insert(n, HeaderValue::from_static("x"));
        }
        assert_eq!(h.len(), HOP_BY_HOP);
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn an_h2c_upgrade_is_no_upgrade_and_its_fields_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.insert(
            "http2-settings",
            HeaderValue::from_static("AAMAAABkAAQAAP__"),
        );
        assert!(!wants_upgrade(&h));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket, h2c"));
        h.append(header::UPGRADE, HeaderValue::from_static("H2C, foo/2"));
        assert!(wants_upgrade(&h));
        // The app is offered the other protocols, never h2c.
        strip_hop_by_hop(&mut h, true);
        let offered: Vec<&str> = h
            .get_all(header::UPGRADE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(offered, ["websocket, foo/2"]);
    }

    #[test]
    fn an_upgrade_keeps_upgrade_and_connection_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
    }

    #[test]
    fn x_forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.7:5000".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.7");
        append_forwarded_for(&mut h, forwarded_ip("[::ffff:10.0.0.8]:1".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.7, 10.0.0.8");
        // Two fields from the client become one list.
        h.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.9:1".parse().unwrap()));
        assert_eq!(
            h["x-forwarded-for"],
            "10.0.0.7, 10.0.0.8, 1.2.3.4, 10.0.0.9"
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn forwarded_names_the_client_as_rfc_7239_says() {
        assert_eq!(
            Peer::new("10.0.0.7:5000".parse().unwrap()).forwarded,
            "for=10.0.0.7"
        );
        assert_eq!(
            Peer::new("[::ffff:10.0.0.8]:1".parse().unwrap()).forwarded,
            "for=10.0.0.8"
        );
        assert_eq!(
            Peer::new("[2001:db8::1]:443".parse().unwrap()).forwarded,
            "for=\"[2001:db8::1]\""
        );
    }

    #[test]
    fn x_forwarded_for_keeps_every_line_received() {
        // The client's line, then the load balancer's own (HAProxy adds a line).
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.2:5000".parse().unwrap()));
        let all: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["6.6.6.6, 203.0.113.9, 10.0.0.2"]);
    }

    #[test]
    fn an_absolute_form_target_becomes_origin_form_and_its_host() {
        let o = |s: &str| origin_form(s.parse().unwrap()).to_string();
        assert_eq!(o("/a?b=1"), "/a?b=1");
        assert_eq!(o("http://h.example/a?b=1"), "/a?b=1");
        assert_eq!(o("http://h.example"), "/");
        // No path, a query: the path is `/` (RFC 9112 §3.2.1: never empty).
        assert_eq!(o("http://h.example?b=1"), "/?b=1");
        let h = |s: &str| host_of(&s.parse().unwrap()).unwrap();
        assert_eq!(h("h.example:8080"), "h.example:8080");
        assert_eq!(h("user:pw@h.example"), "h.example");
    }

    #[test]
    fn the_upstream_uri_keeps_path_and_query() {
        let u = upstream_uri(
            &"127.0.0.1:8081".parse().unwrap(),
            &"/a/b?x=1".parse().unwrap(),
        );
        assert_eq!(u.to_string(), "http://127.0.0.1:8081/a/b?x=1");
    }
}
