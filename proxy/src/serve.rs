//! Accepting and serving client connections: the accept loop under the
//! connection cap (where the oldest idle connection makes room for a new
//! one), each connection's protocol (HTTP/2 by its preface, else
//! HTTP/1.1), its life across the gate's moves (idle connections closed at
//! the forward, HTTP/2's GOAWAY at beat 3, a rapid-reset client cut off), and
//! each request's path through the proxy ([`handle`]: the health path,
//! admission, then the app).
//!
//! As linkerd2-proxy's `serve.rs`: this file owns connections, not requests;
//! what happens to one request is [`super::gate`]'s and
//! [`super::forward`]'s.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Relaxed, SeqCst},
};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::watch;

use super::body::ProxyBody;
use super::gate::{self, Admission};
use super::head_timeout::{HeadClock, HeadTimer};
use super::headers::{Peer, expects_continue};
use super::outcome::{Busy, Unflushed};
use super::respond;
use super::shared::{Gate, Shared};
use super::socket::{Rewind, Slot, sniff};
use super::upstream::Clients;
use super::{
    CLIENT_STREAMS_MAX, HEAD_TIMEOUT, OPENING_GRACE, PREMATURE_RESET, PREMATURE_RESETS_MAX,
    connection_cap,
};

/// Accepts client connections until the runtime stops, at most
/// [`connection_cap`] served at once. At the cap, a new connection makes room:
/// the oldest idle connection (no request being answered on it: a keep-alive
/// connection between requests, one that had sent nothing when drainit first
/// read it, one still short of its first request [`OPENING_GRACE`] after it
/// was accepted, an HTTP/2 connection with no stream open) is closed for it.
/// A connection just accepted whose first request was already there is not
/// idle: that request is on its way. With none idle, the new connection waits
/// for a place (and the ones after it in the kernel's backlog), and looks again
/// every [`OPENING_GRACE`].
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    clients: Arc<Clients>,
    room: Arc<Room>,
) {
    tokio::spawn(clients.h1.sweep());
    let Room { slots, open } = &*room;
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                log::warn!("proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let Some(p) = make_room(slots, open).await else {
                    return;
                };
                p
            }
        };
        let _ = tcp.set_nodelay(true);
        shared.stir();
        let (id, busy, evicted, opening) = open.insert();
        let conns = open.clone();
        // Given back when the connection and every tunnel it became are closed.
        let slot = Arc::new(permit);
        // Boxed: moved into the task's future and then into its `select!`,
        // the connection's future would otherwise take its room twice.
        let serving = Box::pin(connection(
            tcp,
            peer,
            shared.clone(),
            clients.clone(),
            slot,
            Idle { busy, opening },
        ));
        tokio::spawn(async move {
            // The eviction's `Notified` polled only when notified (`OnWake`):
            // polled at each of the task's wakes, several per request, it
            // would take the `Notify`'s lock each time.
            let notified = evicted.notified();
            tokio::pin!(notified);
            let on_evict = OnWake::new();
            tokio::select! {
                biased;
                () = serving => {}
                () = on_evict.poll(notified.as_mut()) => {}
            }
            conns.remove(id);
        });
    }
}

/// The connections served at once under [`connection_cap`], by all the
/// proxy's threads together: their places, and the connections open (for the
/// oldest idle one to make room).
pub(super) struct Room {
    slots: Arc<tokio::sync::Semaphore>,
    open: Arc<Open>,
}

impl Room {
    /// Room for [`connection_cap`] connections of the proxy's `threads`
    /// threads, none open.
    pub(super) fn new(threads: usize) -> Room {
        Room {
            slots: Arc::new(tokio::sync::Semaphore::new(connection_cap(threads))),
            open: Arc::new(Open::default()),
        }
    }
}

/// At the cap: closes the oldest idle connection and waits for a place, looking
/// again every [`OPENING_GRACE`] (a connection still opening becomes idle when
/// its grace ends). `None` when the proxy stops.
async fn make_room(
    slots: &Arc<tokio::sync::Semaphore>,
    open: &Open,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    loop {
        if open.evict_oldest_idle() {
            log::debug!("proxy: connections at the cap: closed the oldest idle one");
        }
        tokio::select! {
            p = slots.clone().acquire_owned() => return p.ok(),
            () = tokio::time::sleep(OPENING_GRACE) => {}
        }
    }
}

/// What tells the accept loop whether a connection is idle: its count of
/// requests being answered, and whether it is still opening (accepted, its
/// first request may be on its way).
struct Idle {
    busy: Arc<std::sync::atomic::AtomicUsize>,
    opening: Arc<AtomicBool>,
}

/// The client connections served, by accept order (the first is the oldest),
/// each with its count of requests being answered, whether it is still
/// opening, and what closes it.
#[derive(Default)]
struct Open {
    next: std::sync::atomic::AtomicU64,
    conns: std::sync::Mutex<std::collections::BTreeMap<u64, OpenConn>>,
}

struct OpenConn {
    busy: Arc<std::sync::atomic::AtomicUsize>,
    evict: Arc<tokio::sync::Notify>,
    opening: Arc<AtomicBool>,
    accepted: Instant,
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, OpenConn>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new connection: its id, its count of requests being answered, what
    /// tells it to close, and its opening flag (set: cleared by the connection
    /// when it finds nothing sent yet, or when its first request comes).
    fn insert(
        &self,
    ) -> (
        u64,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<tokio::sync::Notify>,
        Arc<AtomicBool>,
    ) {
        let id = self.next.fetch_add(1, Relaxed);
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let evict = Arc::new(tokio::sync::Notify::new());
        let opening = Arc::new(AtomicBool::new(true));
        self.lock().insert(
            id,
            OpenConn {
                busy: busy.clone(),
                evict: evict.clone(),
                opening: opening.clone(),
                accepted: Instant::now(),
            },
        );
        (id, busy, evict, opening)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the oldest idle connection (no request being answered, and not
    /// opening unless its [`OPENING_GRACE`] is over); false when none is.
    fn evict_oldest_idle(&self) -> bool {
        let mut conns = self.lock();
        let now = Instant::now();
        let Some(id) = conns
            .iter()
            .find(|(_, c)| {
                c.busy.load(SeqCst) == 0
                    && (!c.opening.load(SeqCst) || now.duration_since(c.accepted) >= OPENING_GRACE)
            })
            .map(|(id, _)| *id)
        else {
            return false;
        };
        if let Some(c) = conns.remove(&id) {
            // Stored if the task is not waiting yet: it closes at its first look.
            c.evict.notify_one();
        }
        true
    }
}

/// One request's path: the health path (answered as `/readyz`), else
/// admission ([`gate::admit`]), then the app ([`super::forward::forward`]).
/// A rejected request's body is read first (up to
/// [`super::REJECT_BODY_MAX`]), so that its 503 is not lost to a reset.
/// The connection's service future itself (no async block around it: each
/// level of futures is copied whole into its caller at its first poll), so
/// it also does the connection's bookkeeping of the answer (`answering`).
async fn handle(
    req: Request<Incoming>,
    peer: Peer,
    shared: Arc<Shared>,
    clients: Arc<Clients>,
    slot: Slot,
    answering: Answering,
) -> Result<Response<ProxyBody>, Infallible> {
    let version = req.version();
    let mut resp = if gate::is_health(&req, &shared) {
        // Something routes by drainit's readiness: the default pre-drain delay
        // applies (docs/processes-and-signals.md), as for `/readyz`.
        shared.ready_ask.note_asked();
        respond::health(&shared, version).await
    } else {
        match gate::admit(&req, &shared) {
            Admission::Malformed(status, text) => {
                respond::closing(status, text, shared.gate(), version)
            }
            Admission::Rejected(why, rejecting) => {
                // A client that waits for `100 Continue` gets the 503 instead:
                // reading the body would send the 100 and invite an upload
                // drainit then cuts (RFC 9110 §10.1.1). hyper closes the
                // connection after the answer.
                if !expects_continue(req.headers()) {
                    respond::drain_body(req.into_body()).await;
                }
                respond::unavailable(why, shared.gate(), version, rejecting)
            }
            Admission::Admitted(in_flight) => {
                super::forward::forward(req, in_flight, &shared, &clients, peer, slot).await
            }
        }
    };
    answering.answered(&mut resp);
    Ok(resp)
}

/// What a client connection notes once a request's response is ready.
struct Answering {
    /// The HTTP/1 connection's flush accounting, for the response's body.
    unflushed: Option<Arc<Unflushed>>,
    /// The connection's count of requests being answered.
    busy: Busy,
    /// The connection's first response: it is answered.
    unanswered: Option<Arc<Unanswered>>,
    /// The HTTP/2 stream: answered, so not a premature reset.
    opened: Option<Opened>,
}

impl Answering {
    fn answered(self, resp: &mut Response<ProxyBody>) {
        resp.body_mut().unflushed = self.unflushed;
        resp.body_mut().busy = Some(self.busy);
        if let Some(u) = self.unanswered {
            u.answered();
        }
        if let Some(o) = self.opened {
            o.answered();
        }
    }
}

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
    shared: Arc<Shared>,
    clients: Arc<Clients>,
    slot: Slot,
    idle: Idle,
) {
    let Idle { busy, opening } = idle;
    let mut gate = shared.gate_tx.subscribe();
    let unanswered = Arc::new(Unanswered::new(shared.clone()));
    // The head timeout counts from the connection's start, as hyper's does for
    // HTTP/1. At the forward, a connection that has sent nothing gets
    // OPENING_GRACE to send its request (it may be on its way), then goes as idle.
    let first = {
        let sniffing = tokio::time::timeout(HEAD_TIMEOUT, sniff(&mut tcp));
        tokio::pin!(sniffing);
        // Nothing there at the first read: no request on its way yet, so the
        // connection is idle as far as the cap goes.
        let first_read = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(sniffing.as_mut(), cx))
        })
        .await;
        if let std::task::Poll::Ready(r) = first_read {
            r
        } else {
            opening.store(false, SeqCst);
            tokio::select! {
                r = &mut sniffing => r,
                () = gate_reaches(&mut gate, Gate::Forwarded) => {
                    match tokio::time::timeout(OPENING_GRACE, &mut sniffing).await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
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
    let unflushed = (!h2).then(|| Arc::new(Unflushed::default()));
    let io = TokioIo::new(Rewind::new(
        Bytes::from(pre),
        tcp,
        unflushed.clone(),
        Some(slot.clone()),
    ));
    let watched = unflushed.clone();
    // The client's address as X-Forwarded-For and Forwarded want it, once per
    // connection.
    let peer_ip = Peer::new(peer);
    let first = unanswered.clone();
    let resets = h2.then(|| Arc::new(Resets::default()));
    let counted = resets.clone();
    let serving = shared.clone();
    let service = hyper::service::service_fn(move |req| {
        let (peer_ip, slot, unflushed) = (peer_ip.clone(), slot.clone(), unflushed.clone());
        let (shared, clients) = (serving.clone(), clients.clone());
        // Only the first response needs to say so (no clone after it).
        let unanswered = (!unanswered.is_answered()).then(|| unanswered.clone());
        let opened = counted.as_ref().map(|r| Opened::new(r.clone()));
        let busy = Busy::new(&busy);
        // Its first request came: no longer opening (busy counted first, so
        // the cap never sees it idle in between).
        opening.store(false, SeqCst);
        let answering = Answering {
            unflushed,
            busy,
            unanswered,
            opened,
        };
        handle(req, peer_ip, shared, clients, slot, answering)
    });
    if let Some(resets) = resets {
        serve_h2(io, service, gate, &shared, &resets, peer).await;
    } else if let Some(watched) = watched {
        serve_h1(io, service, gate, &shared, &first, &watched).await;
    }
}

/// A client connection counted in [`Shared::unanswered`] until its first
/// response is ready or it ends: [`super::Proxy::stop`] waits a moment for those
/// after a forward.
struct Unanswered {
    shared: Arc<Shared>,
    done: AtomicBool,
}

impl Unanswered {
    fn new(shared: Arc<Shared>) -> Unanswered {
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
    shared: &Shared,
    first: &Unanswered,
    unflushed: &Unflushed,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // The header read timeout (slowloris), one runtime timer per connection:
    // `head_timeout`.
    let clock = HeadClock::new();
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(HeadTimer(clock.clone()))
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(io, service)
        .with_upgrades();
    let watchdog = tokio::time::sleep(HEAD_TIMEOUT);
    // Made once, polled only when woken (`OnWake`).
    let forwarded = gate_reaches(&mut gate, Gate::Forwarded);
    let acks = unflushed.watch();
    tokio::pin!(conn, watchdog, forwarded, acks);
    // hyper too: a turn for another branch (an acknowledgement checked, the
    // gate) does not poll hyper's connection when nothing woke it.
    let on_conn = OnWake::new();
    let (on_gate, on_acks, on_watchdog) = (OnWake::new(), OnWake::new(), OnWake::new());
    let mut closing = false;
    loop {
        tokio::select! {
            biased;
            r = on_conn.poll(conn.as_mut()) => {
                if let Err(e) = r
                    && (e.is_parse() || e.is_parse_too_large())
                {
                    shared.ledger.malformed();
                }
                return;
            }
            () = on_gate.poll(forwarded.as_mut()), if !closing => {
                closing = true;
                // Finishes the request in progress, if any; closes an idle one.
                if first.is_answered() {
                    conn.as_mut().graceful_shutdown();
                    on_conn.wake();
                }
            }
            // The responses flushed are `completed` once the client has them.
            () = on_acks.poll(acks.as_mut()) => {}
            // A head awaited past its deadline: the next turn polls hyper,
            // which closes the connection.
            () = on_watchdog.poll(watchdog.as_mut()) => {
                if clock.check(watchdog.as_mut(), HEAD_TIMEOUT) {
                    on_conn.wake();
                }
                // Re-armed: polled again so that it holds its waker from a
                // Pending poll, as the Future contract asks (tokio's timer
                // keeps the waker across a reset today; that is its detail).
                on_watchdog.wake();
            }
        }
    }
}

/// A future of a connection's task (hyper's connection, the gate's move, the
/// watch for acknowledgements, the head watchdog) polled only when its own
/// waker fired since its last poll (or [`OnWake::wake`] was called), not at
/// every turn of the task: `tokio::select!` polls every branch each time the
/// task wakes, several times per request for hyper's I/O, and a `Notify`
/// waiter polled again takes the `Notify`'s lock each time. Measured with the
/// rest of its change (bench/README.md, "CPU per request").
struct OnWake {
    flag: Arc<WakeFlag>,
    /// The side future's waker: sets the flag and wakes the task.
    waker: std::task::Waker,
}

struct WakeFlag {
    woken: AtomicBool,
    task: atomic_waker::AtomicWaker,
}

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, SeqCst);
        self.task.wake();
    }
}

impl OnWake {
    /// Its first poll polls the future (which registers the waker).
    fn new() -> OnWake {
        let flag = Arc::new(WakeFlag {
            woken: AtomicBool::new(true),
            task: atomic_waker::AtomicWaker::new(),
        });
        OnWake {
            waker: std::task::Waker::from(flag.clone()),
            flag,
        }
    }

    /// Its future is polled at the next turn: the task changed its state.
    fn wake(&self) {
        self.flag.woken.store(true, SeqCst);
    }

    /// `fut`, polled when its waker fired since its last poll. The same
    /// future every time: a new one is never polled until the old one's
    /// waker fires.
    fn poll<'a, F: Future>(
        &'a self,
        mut fut: std::pin::Pin<&'a mut F>,
    ) -> impl Future<Output = F::Output> + 'a {
        std::future::poll_fn(move |cx| {
            // The task's waker first: a wake between the two is not lost.
            self.flag.task.register(cx.waker());
            if !self.flag.woken.swap(false, SeqCst) {
                return std::task::Poll::Pending;
            }
            fut.as_mut()
                .poll(&mut std::task::Context::from_waker(&self.waker))
        })
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
/// streams: each went on to the app, on an HTTP/2 connection other clients
/// share, and the app's own guard could close that connection for them all.
/// A client has at most [`CLIENT_STREAMS_MAX`] streams open at once.
async fn serve_h2<S>(
    io: TokioIo<Rewind>,
    service: S,
    mut gate: watch::Receiver<Gate>,
    shared: &Shared,
    resets: &Resets,
    peer: SocketAddr,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(CLIENT_STREAMS_MAX)
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
    resets: Arc<Resets>,
    at: Instant,
    answered: bool,
}

impl Opened {
    fn new(resets: Arc<Resets>) -> Opened {
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
