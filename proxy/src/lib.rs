//! The admission proxy (`--proxy LISTEN=UPSTREAM`, docs/proxy.md): drainit sees the
//! app's requests, closes admission in one step at beat 3, and keeps a ledger in
//! which every request is completed, rejected (safe to retry), unknown,
//! abandoned or canceled.
//!
//! Owns: the listen socket's connections, the upstream connection pool, the
//! [`Gate`] each request passes, and the [`ledger`] (a [`RequestLedger`]).
//! Runs on its own threads (`--proxy-threads`, each with a current-thread
//! tokio runtime and its own connections to the app), so that no amount of
//! traffic delays signal handling, reaping, the drain's timers or the probes
//! (the supervisor's loop stays single-threaded on its own thread and never
//! waits on the proxy). A panic in one connection ends that connection's task
//! only (tokio catches it).
//!
//! The supervisor drives it through [`Proxy`]: [`Proxy::set_gate`] at each beat,
//! [`Proxy::idle`] to learn that no request is in flight, [`Proxy::stop`] at the
//! exit; `/metrics` reads it through [`ProxyStats`] ([`Proxy::stats`]), handed
//! down from `main`. Nothing here sends a signal or decides when the drain
//! moves on, and nothing here is a global: every connection and request holds
//! an `Arc` of what the proxy shares (`shared.rs`).
//!
//! HTTP/1.1 with keep-alive, chunked bodies streamed both ways (nothing is
//! buffered whole) and `Upgrade` (WebSocket) passed through; hop-by-hop headers
//! are dropped as RFC 9110 §7.6.1 says, and `X-Forwarded-For` and `Forwarded`
//! (RFC 7239) are appended.
//! A connection that opens with HTTP/2's preface (prior knowledge, as gRPC
//! speaks it) is served as HTTP/2 and its requests go to the app over HTTP/2
//! too, trailers included; at beat 3 it gets hyper's two-step GOAWAY instead
//! of HTTP/1's local 503s.
//!
//! Where each part lives (a request's path, in order):
//! - `serve.rs`: accepts and serves connections (HTTP/1.1, or HTTP/2 by its
//!   preface), and `handle`, each request's path through the files below;
//! - `socket.rs`: the client's socket as hyper sees it (first bytes read
//!   again, flushes reported);
//! - `gate.rs`: admission: [`Gate`], malformed requests, `rejected` or
//!   admitted;
//! - `forward.rs`: an admitted request to the app and its answer back
//!   (tunnels, event streams, the failures' outcomes);
//! - `headers.rs`: hop-by-hop and forwarding fields, the target and `Host`;
//! - [`upstream`]: the connections to the app (HTTP/1 pool, HTTP/2);
//! - `body.rs`: the bodies passed through ([`ProxyBody`]);
//! - `respond.rs`: drainit's own answers (503, 502, 408, 400, 501, the
//!   health path);
//! - `outcome.rs`: the one guard that records an admitted request's outcome;
//! - [`ledger`]: the counts; [`streams`]: WebSockets and event streams at
//!   beat 3;
//! - `shared.rs`: what all of them share; `runtime.rs`: the proxy's threads;
//!   [`alloc`]: the process's allocator, with a cache on the proxy's threads.

// A global allocator is unsafe code by its trait's contract.
#[allow(unsafe_code)]
pub mod alloc;
mod body;
mod forward;
mod gate;
mod head_timeout;
mod headers;
pub mod ledger;
mod outcome;
pub mod readiness;
mod respond;
mod runtime;
mod serve;
mod shared;
mod socket;
pub mod streams;
pub mod upstream;
pub mod util;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

pub use body::ProxyBody;
use ledger::{RequestLedger, Totals};
pub use respond::HEALTH_WAIT;
pub use shared::Gate;
use shared::Shared;
use upstream::Clients;

/// `--proxy LISTEN=UPSTREAM`: where the admission proxy listens and where the app
/// listens (docs/proxy.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxySpec {
    /// Bound before the child starts (taken: 78).
    pub listen: SocketAddr,
    /// The app, in drainit's network namespace (an IP address, or `localhost`).
    pub upstream: SocketAddr,
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
/// drainit answered, are premature resets (`serve.rs`, `Resets`).
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
/// HTTP/2 streams one client connection may have open at once (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`): a client's share of the app. As the
/// common default of HTTP/2 servers, so that one client's streams fit in one
/// connection to such an app, and the requests of others go on another
/// ([`upstream::Multiplexed`]).
pub const CLIENT_STREAMS_MAX: u32 = 100;
/// Connections kept open at most; past it, new ones wait in the kernel's backlog.
/// Fewer under a low `RLIMIT_NOFILE`: see [`connection_cap`].
pub const MAX_CONNECTIONS: usize = 4096;

/// [`MAX_CONNECTIONS`], or fewer under a low `RLIMIT_NOFILE`, for the proxy
/// served by `threads` threads: the descriptors left after the probe server's
/// share (drainit's `probe::connection_cap`: half of what a reserve of 32
/// leaves, and 4 more for each proxy thread after the first: its listener
/// descriptor, its epoll and wake-up descriptors) are the proxy's, two per
/// client connection (the client's and its upstream connection's), so a flood
/// of client connections never takes the fds that probes, `/proc` reads and
/// teardown steps need.
pub fn connection_cap(threads: usize) -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let reserve = 32 + 4 * threads.saturating_sub(1) as u64;
    let budget = (soft.saturating_sub(reserve) / 4) as usize;
    budget.clamp(1, MAX_CONNECTIONS)
}

/// Binds the listen address (before the child starts: a taken port is a
/// configuration error, 78).
///
/// # Errors
/// The bind's error.
pub fn bind(addr: SocketAddr) -> std::io::Result<StdListener> {
    util::bind_listener(addr)
}

/// The supervisor's handle on the proxy's threads.
pub struct Proxy {
    shared: Arc<Shared>,
    /// The ways to the app, one set per thread.
    clients: Arc<AllClients>,
    threads: runtime::Threads,
    /// The first proxy thread's runtime: beat 3's stream closer runs there.
    runtime: tokio::runtime::Handle,
}

/// The ways to the app of every proxy thread ([`Clients`], one set each: a
/// thread's requests go over its own connections, none is handed between
/// threads).
struct AllClients(Vec<Arc<Clients>>);

impl AllClients {
    /// Requests waiting for a connection to the app now.
    fn connecting(&self) -> u64 {
        self.0.iter().map(|c| c.connecting()).sum()
    }

    /// Ends every connect to the app under way (and any begun later).
    fn halt(&self) {
        self.0.iter().for_each(|c| c.halt());
    }

    /// Closes the idle connections to the app, and every one from now on
    /// once its response is done.
    fn close_idle(&self) {
        for c in &self.0 {
            c.h1.close_idle();
            c.h2.close_idle();
        }
    }

    /// Requests sent to the app a second time ([`upstream::Pool::send`]).
    fn resent(&self) -> u64 {
        self.0.iter().map(|c| c.h1.resent()).sum()
    }
}

/// What `/metrics` reads of the running proxy: its request ledger and the
/// requests it sent to the app a second time. From [`Proxy::stats`]; cheap to
/// clone (an `Arc` of the proxy's shared state), valid for as long as it is
/// held, even after [`Proxy::stop`].
#[derive(Clone)]
pub struct ProxyStats(Arc<Shared>, Arc<AllClients>);

impl ProxyStats {
    /// The request ledger.
    pub fn ledger(&self) -> &RequestLedger {
        &self.0.ledger
    }

    /// Requests sent to the app a second time because the reused connection
    /// they were given was found closed ([`upstream::Pool::send`]).
    pub fn resent(&self) -> u64 {
        self.1.resent()
    }
}

impl Proxy {
    /// Starts the proxy's threads on `listener` (from [`bind`]): `threads`
    /// (`--proxy-threads`, at least 1) threads named `drainit-proxy`, each
    /// with a current-thread runtime of its own accepting on the listener and
    /// its own connections to the app; the connection cap is theirs together.
    ///
    /// # Errors
    /// Creating the threads or the runtime failed (the OS refused a thread: a
    /// pids limit), named with the number of threads; never a hang.
    /// `spread`: over how long the open streams are closed at beat 3
    /// (`--stream-spread`). The health path (`health`) is answered as `/readyz`:
    /// `ready_ask` reaches drainit's `probe::answer_readiness` on the supervisor's
    /// thread. `thread_start` runs first on each of the proxy's threads: drainit's
    /// `signals::reblock`, which blocks again what the C library's
    /// `pthread_create` unblocked in the new thread (33 on musl; a
    /// process-directed 33 or 34 taken there would end drainit by its default
    /// action).
    pub fn start(
        listener: StdListener,
        spec: ProxySpec,
        health: Option<String>,
        ready_ask: readiness::ReadinessAsks,
        spread: Duration,
        threads: usize,
        thread_start: fn(),
    ) -> std::io::Result<Proxy> {
        let shared = Arc::new(Shared::new(spec.upstream, health, ready_ask, spread)?);
        shared.ledger.set_epoch(Instant::now());
        let clients = AllClients(
            (0..threads.max(1))
                .map(|_| Arc::new(Clients::new(spec.upstream, UPSTREAM_IDLE)))
                .collect(),
        );
        let room = Arc::new(serve::Room::new(clients.0.len()));
        // Each thread accepts on a descriptor of its own for the listener;
        // this one closes once they have theirs.
        let (threads, runtime) =
            runtime::spawn(&listener, &shared, &clients.0, &room, thread_start)?;
        Ok(Proxy {
            shared,
            clients: Arc::new(clients),
            threads,
            runtime,
        })
    }

    /// Moves the gate forward (never back). At [`Gate::Closing`] the ledger
    /// marks T0; at [`Gate::Closed`] with nothing in flight, [`Proxy::idle`]
    /// yields at once.
    pub fn set_gate(&self, gate: Gate) {
        let s = &self.shared;
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
            self.clients.close_idle();
            let n = s.streams.open();
            if n > 0 {
                log::info!(
                    "closing {n} stream(s) over {} (--stream-spread)",
                    util::fmt_ms(s.spread)
                );
            }
            let (streams, spread) = (s.streams.clone(), s.spread);
            self.runtime
                .spawn(async move { streams.close_all(spread).await });
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

    /// The request ledger (report, log lines).
    pub fn ledger(&self) -> &RequestLedger {
        &self.shared.ledger
    }

    /// What `/metrics` reads of this proxy, for as long as it reads it.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats(self.shared.clone(), self.clients.clone())
    }

    /// The ledger's totals now, with the requests sent to the app a second
    /// time (the report's `requests`).
    pub fn totals(&self) -> Totals {
        Totals {
            resent: self.clients.resent(),
            ..self.shared.ledger.totals()
        }
    }

    /// Cuts what is in flight (`abandoned`) and stops the proxy thread: the
    /// listener and every connection are closed. Returns when the thread has
    /// settled every request (a few ms; at most [`STOP_SETTLE`] more while a
    /// request is in flight or being answered drainit's 503
    /// (`respond::Rejecting`) or, after a forward, a connection's first request
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
        self.clients.halt();
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
        self.threads.stop();
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
        let connecting = self.clients.connecting();
        let in_flight = self.shared.ledger.in_flight();
        self.clients.halt();
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
