//! Connections to the app: HTTP/1.1 ones kept alive between requests, the pool
//! the proxy's HTTP/1 requests go through ([`Pool`]), and the HTTP/2
//! connections its HTTP/2 requests share, one more whenever those open are
//! at the app's stream limit ([`Multiplexed`]).
//!
//! Built on hyper's own connection API (`hyper::client::conn::http1` and
//! `http2`) rather than hyper-util's general-purpose client. For HTTP/2 that
//! client keys its connections by the request's authority, so it had to be
//! given the app's address as `:authority`; here every request goes to the
//! app and keeps the client's. For HTTP/1, with one app address, a locked
//! stack of idle connections does what the general pool does
//! (keyed lookup, waiters, executor hand-offs, per-response extensions) at
//! about a quarter of its cost. Measured with callgrind over 4,000 proxied
//! requests: sending a request and getting its response head took 27.7 k
//! instructions through hyper-util's client and 7.3 k through this pool, and a
//! whole proxied request 127 k before and about 100 k after (bench/README.md,
//! "proxy.sh").
//!
//! The rules (docs/proxy.md, "Upstream"):
//! - an idle connection is kept at most [`super::UPSTREAM_IDLE`], shorter than
//!   the keep-alive timeouts apps commonly use, so drainit gives it up before
//!   the app closes it;
//! - a reused connection found closed (the app closed it as drainit picked
//!   it) is given up, and the request goes once more on a new connection when
//!   that is safe ([`Pool::send`] says when); a request the app may have acted
//!   on is sent twice only if it is idempotent (RFC 9110 §9.2.2), and any
//!   request the app reset unread is sent once more;
//! - a connection is reused only after its response was read whole (hyper
//!   says when it can take the next request); one whose response was cut is
//!   closed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{Notify, watch};

use super::body::{BodyCopy, Inner, ProxyBody};

/// How long a connection attempt to the app may take before the request is
/// answered 503 (`rejected`, safe to retry): 5 s, Envoy's default
/// `connect_timeout`. An app slow to accept (its accept queue full) has the
/// kernel drop the SYN and send it again 1 s and 3 s after the first
/// (RFC 6298's 1 s initial RTO, doubled); 5 s lets both through, as a client
/// connecting directly would wait; a bound of 2 s made the second a 503.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request did not get the app's response. `reached_app` false: it never
/// got to the app (refused, connect timeout, halted), so it is safe to retry.
#[derive(Debug)]
pub struct SendError {
    /// The request may have reached the app.
    pub reached_app: bool,
    /// What failed, for the log.
    pub message: String,
    /// How the connection to the app failed, when that is what failed
    /// (`Refused` otherwise).
    pub connect: ConnectFailed,
}

/// How a connection to the app was not established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectFailed {
    /// Refused, reset, or the handshake failed (or not a connect failure).
    Refused,
    /// Not established within [`CONNECT_TIMEOUT`] of the request asking for
    /// it (the app's accept queue full, or nothing answering).
    TimedOut,
    /// Still connecting when drainit stopped connecting ([`Connects::halt`]:
    /// the app is being SIGKILLed, or drainit exits).
    Halted,
}

impl SendError {
    fn unreached(message: String) -> SendError {
        SendError {
            reached_app: false,
            message,
            connect: ConnectFailed::Refused,
        }
    }

    /// It failed after the request went out: it may have reached the app.
    pub fn reached(message: String) -> SendError {
        SendError {
            reached_app: true,
            message,
            connect: ConnectFailed::Refused,
        }
    }

    /// No connection to `addr` within [`CONNECT_TIMEOUT`].
    fn timed_out(addr: SocketAddr) -> SendError {
        SendError {
            connect: ConnectFailed::TimedOut,
            ..SendError::unreached(format!(
                "connect to {addr}: no answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        }
    }
}

/// Idle keep-alive connections to one app address, most recently used on top.
pub struct Pool {
    addr: SocketAddr,
    idle_for: Duration,
    idle: Mutex<Vec<Conn>>,
    /// Wakes [`Pool::sweep`] when the pool stops being empty.
    filled: Notify,
    /// Requests sent once more, on a new connection, because the reused one
    /// they were given was found closed ([`Pool::send`]).
    resent: AtomicU64,
    /// Set by [`Pool::close_idle`]: connections are no longer kept.
    closed: AtomicBool,
    /// Its connects to the app under way, and the switch that ends them.
    pub connects: Connects,
}

/// The connects to the app under way for one client ([`Pool`] or
/// [`Multiplexed`]), and the switch that ends them.
pub struct Connects {
    /// Set by [`Connects::halt`]: connects under way end, none is begun.
    halted: watch::Sender<bool>,
    /// Requests waiting for a connection ([`Connects::waiting`]).
    waiting: AtomicU64,
}

impl Connects {
    fn new() -> Connects {
        Connects {
            halted: watch::Sender::new(false),
            waiting: AtomicU64::new(0),
        }
    }

    /// Requests waiting now for a connection to the app: their own, or for
    /// HTTP/2 the shared one another request is opening (for the log line at
    /// the deadline: [`Connects::halt`] answers them 503, `rejected`; one sent
    /// once more after a first attempt that may have reached the app is
    /// `abandoned` instead).
    pub fn waiting(&self) -> u64 {
        self.waiting.load(SeqCst)
    }

    /// Ends the connects under way, and any begun from now on, with
    /// [`ConnectFailed::Halted`] (never reached the app): drainit is about to
    /// SIGKILL the app (the deadline, a second signal) or exits, and a request
    /// still waiting for the app to accept its connection is answered now,
    /// not cut without an answer at the exit. HTTP/2 requests queued behind
    /// the connect under way end with it.
    pub fn halt(&self) {
        self.halted.send_replace(true);
    }

    /// Counts a request as waiting until the guard is dropped.
    fn enter(&self) -> Connecting<'_> {
        self.waiting.fetch_add(1, SeqCst);
        Connecting(&self.waiting)
    }

    /// A TCP connection to the app at `addr` (`TCP_NODELAY`), established by
    /// `by` (the request's [`CONNECT_TIMEOUT`]), unless halted first
    /// ([`Connects::halt`]).
    ///
    /// # Errors
    /// Refused, no answer in time, or halted: [`SendError`] with `reached_app`
    /// false and [`SendError::connect`] saying which.
    async fn tcp(
        &self,
        addr: SocketAddr,
        by: tokio::time::Instant,
    ) -> Result<tokio::net::TcpStream, SendError> {
        let mut halt = self.halted.subscribe();
        let tcp = tokio::select! {
            biased;
            Ok(_) = halt.wait_for(|h| *h) => {
                return Err(SendError {
                    connect: ConnectFailed::Halted,
                    ..SendError::unreached(format!(
                        "connect to {addr}: not established when drainit stopped the app"
                    ))
                });
            }
            r = tokio::time::timeout_at(by, tokio::net::TcpStream::connect(addr)) => r
                .map_err(|_| SendError::timed_out(addr))?
                .map_err(|e| SendError::unreached(format!("connect to {addr}: {e}")))?,
        };
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }
}

/// Counts one wait for a connection to the app in the counter it holds, until
/// dropped ([`Connects::enter`]).
struct Connecting<'a>(&'a AtomicU64);

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// One connection to the app: hyper's handle on it, and the bytes read from
/// it so far ([`Counted`]).
pub struct Conn {
    /// Sends requests on it.
    pub send: SendRequest<ProxyBody>,
    read: Arc<AtomicU64>,
    /// When its last response head came: the app's keep-alive timer started
    /// at the earliest then (it starts when the app has written the whole
    /// response, which a slow client may take seconds more to read from
    /// drainit), so the connection's idle age counts from here.
    answered_at: Instant,
}

/// A connection lent to one request (HTTP/1), or a stream counted open on an
/// HTTP/2 connection ([`Multiplexed`]). Dropped with the response body
/// (after its last byte, or early when the client went away): an HTTP/1
/// connection goes back to the pool once hyper says it can take another
/// request, or closes; an HTTP/2 stream stops counting.
pub struct Lease {
    conn: Option<(Conn, Arc<Pool>)>,
    /// An HTTP/2 stream: counted open until dropped.
    _stream: Option<Stream>,
}

impl Lease {
    /// The connection was taken over by an upgrade (`101`): it never goes back.
    pub fn upgraded(mut self) {
        self.conn = None;
    }

    /// The lease of an HTTP/2 stream.
    pub fn stream(stream: Stream) -> Lease {
        Lease {
            conn: None,
            _stream: Some(stream),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some((mut conn, pool)) = self.conn.take() else {
            return;
        };
        if conn.send.is_ready() {
            pool.put(conn);
        } else if !conn.send.is_closed()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // The connection task has not finished with the response yet
            // (its last bytes, or a body the client left unread, which makes
            // hyper close the connection): back once it is ready, if ever.
            rt.spawn(async move {
                if conn.send.ready().await.is_ok() {
                    pool.put(conn);
                }
            });
        }
    }
}

/// The two ways to the app: HTTP/1.1 for HTTP/1 requests ([`Pool`]),
/// HTTP/2 (prior knowledge) for HTTP/2 ones ([`Multiplexed`]), so that
/// gRPC's trailers and streams go through.
pub struct Clients {
    /// HTTP/1 requests' pooled connections.
    pub h1: Arc<Pool>,
    /// HTTP/2 requests' shared connections.
    pub h2: Multiplexed,
}

impl Clients {
    /// The ways to the app at `app`, idle connections kept at most `idle_for`.
    pub fn new(app: SocketAddr, idle_for: Duration) -> Clients {
        Clients {
            h1: Arc::new(Pool::new(app, idle_for)),
            h2: Multiplexed::new(app, idle_for),
        }
    }

    /// Requests waiting for a connection to the app now.
    pub(super) fn connecting(&self) -> u64 {
        self.h1.connects.waiting() + self.h2.connects.waiting()
    }

    /// Ends every connect to the app under way (and any begun later): its
    /// request never reached the app and gets drainit's 503 (`rejected`).
    pub(super) fn halt(&self) {
        self.h1.connects.halt();
        self.h2.connects.halt();
    }
}

impl Pool {
    /// An empty pool for the app at `addr`; idle connections are kept at most
    /// `idle_for`.
    pub fn new(addr: SocketAddr, idle_for: Duration) -> Pool {
        Pool {
            addr,
            idle_for,
            idle: Mutex::new(Vec::new()),
            filled: Notify::new(),
            resent: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            connects: Connects::new(),
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) on an idle connection, or on a
    /// new one. A reused connection that turns out closed is given up and the
    /// request is sent once more, on a new connection, when that is safe:
    /// - nothing of it went out (hyper hands it back), or
    /// - the app closed or reset the connection without sending a single byte
    ///   back, and the request is idempotent (RFC 9110 §9.2.2: GET, HEAD,
    ///   OPTIONS, TRACE, PUT, DELETE) with no body: the race of an app closing
    ///   an idle keep-alive connection just as drainit writes on it, where the
    ///   request's bytes go out after the app's FIN and the app never reads
    ///   them (nginx's `proxy_next_upstream error` resends idempotent requests
    ///   too). The app may also have died reading it: if the second attempt
    ///   cannot connect, the request counts as having reached the app;
    /// - the app reset the connection without sending a byte back, whatever
    ///   the method, with a body of at most [`super::body::RESEND_BODY_MAX`] that went out
    ///   whole ([`BodyCopy`]): a reset says the app's kernel held bytes of the
    ///   request that the app never read ([`reset_unread`]), as when gunicorn's
    ///   gthread worker exits at `--max-requests` with requests queued on its
    ///   kept-alive connections. This and the first case hold on a new
    ///   connection too (that worker also accepts connections it never reads).
    ///
    /// A request goes at most twice.
    ///
    /// # Errors
    /// [`SendError`]: `reached_app` false when the app could not be reached
    /// (connection refused, [`CONNECT_TIMEOUT`]) and no earlier attempt may
    /// have reached it.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<ProxyBody>,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        if let Some(mut conn) = self.checkout() {
            match attempt(&mut conn, req, true).await {
                Ok(resp) => return Ok((resp, self.lease(conn))),
                Err(Failed::Lost(e)) => return Err(e),
                Err(Failed::Again(again, delivered)) => {
                    log::debug!("proxy: pooled upstream connection closed, sending again");
                    return self.send_again(*again, delivered).await;
                }
            }
        }
        let mut conn = self.connect().await?;
        match attempt(&mut conn, req, false).await {
            Ok(resp) => Ok((resp, self.lease(conn))),
            Err(Failed::Lost(e)) => Err(e),
            Err(Failed::Again(again, delivered)) => {
                log::debug!(
                    "proxy: new upstream connection reset the request unread, sending again"
                );
                self.send_again(*again, delivered).await
            }
        }
    }

    /// Sends `req` once more, on a new connection (counted in
    /// [`Pool::resent`] once connected). `maybe_delivered`: the first attempt
    /// may have reached the app, so a refused connect is not "never reached".
    async fn send_again(
        self: &Arc<Self>,
        req: Request<ProxyBody>,
        maybe_delivered: bool,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        let mut conn = self.connect().await.map_err(|e| SendError {
            reached_app: e.reached_app || maybe_delivered,
            ..e
        })?;
        self.resent.fetch_add(1, Relaxed);
        match conn.send.send_request(req).await {
            Ok(resp) => Ok((resp, self.lease(conn))),
            Err(e) => Err(SendError::reached(e.to_string())),
        }
    }

    /// A new connection to the app, its task spawned on the current runtime
    /// (with upgrades: a `101` hands the connection to the tunnel).
    ///
    /// # Errors
    /// The connect failed or took longer than [`CONNECT_TIMEOUT`].
    pub async fn connect(&self) -> Result<Conn, SendError> {
        let addr = self.addr;
        let by = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let tcp = {
            let _waiting = self.connects.enter();
            self.connects.tcp(addr, by).await?
        };
        let read = Arc::new(AtomicU64::new(0));
        let io = Counted {
            tcp,
            read: read.clone(),
        };
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| SendError::unreached(format!("connect to {addr}: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                log::debug!("proxy: upstream connection ended: {e}");
            }
        });
        Ok(Conn {
            send,
            read,
            answered_at: Instant::now(),
        })
    }

    /// Closes idle connections older than the idle timeout, every half of it
    /// while any is idle (asleep while the pool is empty). Runs for the life
    /// of the proxy's runtime.
    pub fn sweep(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let pool = self.clone();
        async move {
            loop {
                if pool.lock().is_empty() {
                    pool.filled.notified().await;
                }
                tokio::time::sleep(pool.idle_for / 2).await;
                let idle_for = pool.idle_for;
                pool.lock()
                    .retain(|c| c.answered_at.elapsed() < idle_for && !c.send.is_closed());
            }
        }
    }

    /// Requests sent once more on a new connection (see [`Pool::send`]).
    pub fn resent(&self) -> u64 {
        self.resent.load(Relaxed)
    }

    /// Idle connections now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.lock().len()
    }

    /// The most recently used idle connection that can take a request now;
    /// the stale and closed ones met on the way are closed.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.lock();
        while let Some(c) = idle.pop() {
            if c.answered_at.elapsed() < self.idle_for && c.send.is_ready() {
                return Some(c);
            }
        }
        None
    }

    /// Closes the idle connections, and every connection from now on once
    /// its response is done (admission closed at beat 3: no request will need
    /// one, and an app that waits for its connections to close before it exits,
    /// such as Node.js's `server.close()`, is not held up by drainit's).
    pub fn close_idle(&self) {
        self.closed.store(true, SeqCst);
        let idle = std::mem::take(&mut *self.lock());
        drop(idle);
    }

    /// Keeps `conn` for the next request, unless the pool is closed or the
    /// connection is already older than the idle timeout.
    fn put(&self, conn: Conn) {
        if conn.answered_at.elapsed() >= self.idle_for {
            return;
        }
        let mut idle = self.lock();
        // Under the lock: `close_idle` sets `closed` before it takes the lock
        // to empty the pool, so a connection is either refused here or
        // emptied there, never kept after beat 3 (with several proxy threads
        // the two can run at once).
        if self.closed.load(SeqCst) {
            return;
        }
        idle.push(conn);
        if idle.len() == 1 {
            self.filled.notify_one();
        }
    }

    fn lease(self: &Arc<Self>, mut conn: Conn) -> Lease {
        conn.answered_at = Instant::now();
        Lease {
            conn: Some((conn, self.clone())),
            _stream: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The app's side of a connection, counting the bytes read from it: a
/// request whose connection failed is sent again only if the app sent nothing
/// back ([`Pool::send`]).
struct Counted {
    tcp: tokio::net::TcpStream,
    read: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.read
                .fetch_add((buf.filled().len() - before) as u64, Relaxed);
        }
        polled
    }
}

super::socket::write_through_tcp!(Counted);

/// RFC 9110 §9.2.2: a request with one of these methods may be sent again
/// after a failure.
fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Why a request got no response on a connection.
enum Failed {
    /// It may go once more on a new connection: the request (its head and
    /// whole body) and whether the first attempt may have reached the app.
    Again(Box<Request<ProxyBody>>, bool),
    /// It may have reached the app: never sent twice.
    Lost(SendError),
}

/// Sends `req` on `conn` (`reused`: it carried a request before), keeping a
/// copy of its head and of its body as it goes out (up to [`super::body::RESEND_BODY_MAX`]),
/// so that it can go once more when [`Pool::send`]'s rules allow.
///
/// # Errors
/// [`Failed`]: whether it may be sent again, and how.
async fn attempt(
    conn: &mut Conn,
    mut req: Request<ProxyBody>,
    reused: bool,
) -> Result<Response<Incoming>, Failed> {
    let idempotent = is_idempotent(req.method());
    let bodiless = req.body().is_end_stream();
    let head = head_copy(&req);
    let body = (!bodiless).then(|| {
        let copy = Arc::new(BodyCopy::default());
        req.body_mut().copy = Some(copy.clone());
        copy
    });
    let read_before = conn.read.load(Relaxed);
    let sent = conn.send.try_send_request(req).await;
    let whole = match &body {
        None => Some(Bytes::new()),
        Some(copy) => {
            let whole = sent.as_ref().err().and_then(|_| copy.whole());
            // Nothing more is kept: the response head came, or the request
            // goes again with its copy (or not at all).
            copy.spoil();
            whole
        }
    };
    let mut e = match sent {
        Ok(resp) => return Ok(resp),
        Err(e) => e,
    };
    let nothing_back = conn.read.load(Relaxed) == read_before;
    match (e.take_message(), whole) {
        // Not a byte of it went out.
        (Some(back), _) => Err(Failed::Again(Box::new(back), false)),
        (None, Some(whole))
            if nothing_back
                && ((reused && idempotent && bodiless && closed_before_response(e.error()))
                    || reset_unread(e.error())) =>
        {
            Err(Failed::Again(Box::new(with_body(head, whole)), true))
        }
        (None, _) => Err(Failed::Lost(SendError::reached(e.into_error().to_string()))),
    }
}

/// `req`'s head with an empty body.
fn head_copy(req: &Request<ProxyBody>) -> Request<ProxyBody> {
    let mut copy = Request::new(ProxyBody::local(""));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// `head` (from [`head_copy`]) with `body` in place of its empty one.
fn with_body(head: Request<ProxyBody>, body: Bytes) -> Request<ProxyBody> {
    if body.is_empty() {
        return head;
    }
    let (parts, _) = head.into_parts();
    Request::from_parts(
        parts,
        ProxyBody::plain(Inner::Local(http_body_util::Full::new(body))),
    )
}

/// The connection ended (EOF, reset, broken pipe) before a whole response
/// head came.
fn closed_before_response(e: &hyper::Error) -> bool {
    use std::error::Error as _;
    e.is_incomplete_message()
        || e.source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionAborted
                )
            })
}

/// The app reset the connection: the kernel does that when a socket is closed
/// with received bytes its process never read (RFC 9293 §3.6.1), or when bytes
/// come after it was closed. On a reused connection that carried nothing but
/// this request since its last response was read whole, with nothing read
/// back, those bytes are this request's: the app did not read it, whatever its
/// method (a process that read a request and then died closes with a FIN).
fn reset_unread(e: &hyper::Error) -> bool {
    use std::error::Error as _;
    e.source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
}

/// The sending half of an HTTP/2 connection to the app.
type H2Sender = hyper::client::conn::http2::SendRequest<ProxyBody>;

/// The HTTP/2 connections (prior knowledge, h2c) that the proxy's HTTP/2
/// requests share: a request goes on the first one with room for another
/// stream (fewer open than the app's `SETTINGS_MAX_CONCURRENT_STREAMS`, read
/// from the app's first SETTINGS frame: [`Settings`]), else on a new one. So
/// a client whose slow streams fill one connection to the limit never makes
/// another client's request wait behind them in h2's queue (Envoy's and
/// Linkerd's rule); a client's own share is capped by drainit's server side
/// ([`super::CLIENT_STREAMS_MAX`]). A connection is given up once the app
/// closed it (GOAWAY, or the connection ended) or it went unused for the idle
/// timeout (as [`Pool`]'s connections: given up before the app's own idle
/// timeout can close it under a request). Each goes to the app's address
/// whatever a request names, so each request keeps the client's
/// `:authority` (RFC 9113 §8.3.1) as an HTTP/1 request keeps its `Host`.
pub struct Multiplexed {
    addr: SocketAddr,
    idle_for: Duration,
    /// The open connections, oldest first; empty before the first request
    /// and from [`Multiplexed::close_idle`]. A connect holds the lock: the
    /// requests that come meanwhile wait for it rather than open connections
    /// of their own.
    conns: tokio::sync::Mutex<Vec<H2Conn>>,
    /// Set by [`Multiplexed::close_idle`] (beat 3): no connection is kept
    /// for later requests any more, as [`Pool`] keeps none.
    closed: AtomicBool,
    /// Its connects to the app under way, and the switch that ends them.
    pub connects: Connects,
}

/// One HTTP/2 connection to the app: its sender, when a request last went on
/// it, its streams open, and the app's limit on them.
struct H2Conn {
    send: H2Sender,
    last: Instant,
    streams: Arc<AtomicU64>,
    /// The app's `SETTINGS_MAX_CONCURRENT_STREAMS` ([`Settings`]); `u64::MAX`
    /// until read, or when the app sets none.
    limit: Arc<AtomicU64>,
}

/// One stream on an HTTP/2 connection to the app, counted open until dropped
/// (with the response body, in its [`Lease`]).
#[derive(Debug)]
pub struct Stream(Arc<AtomicU64>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Multiplexed {
    /// No connection yet: the first request opens it. `idle_for`: how long
    /// a connection may go without a new request and still be used.
    pub fn new(addr: SocketAddr, idle_for: Duration) -> Multiplexed {
        Multiplexed {
            addr,
            idle_for,
            conns: tokio::sync::Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            connects: Connects::new(),
        }
    }

    /// A connection with room for one more stream, or a new one, and the
    /// stream counted on it. A connection given up here closes once its
    /// streams have ended (hyper's, when no sender is left). From beat 3 none
    /// is kept: a request admitted before it and sent after gets a kept one
    /// (taken out) or one of its own.
    ///
    /// A request waits at most [`CONNECT_TIMEOUT`] in all, the time it waits
    /// for another request's connect (which holds the lock) included: the
    /// requests queued behind a connect to an app that does not accept end
    /// with it, not each [`CONNECT_TIMEOUT`] after the one before.
    async fn sender(&self) -> Result<(H2Sender, Stream), SendError> {
        let _waiting = self.connects.enter();
        let by = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let addr = self.addr;
        let mut conns = tokio::time::timeout_at(by, self.conns.lock())
            .await
            .map_err(|_| SendError::timed_out(addr))?;
        let closed = self.closed.load(SeqCst);
        let idle_for = self.idle_for;
        conns.retain(|c| !c.send.is_closed() && c.last.elapsed() < idle_for);
        if let Some(i) = conns
            .iter()
            .position(|c| c.streams.load(SeqCst) < c.limit.load(SeqCst))
        {
            let c = &mut conns[i];
            c.last = Instant::now();
            c.streams.fetch_add(1, SeqCst);
            let taken = (c.send.clone(), Stream(c.streams.clone()));
            if closed {
                conns.clear();
            }
            return Ok(taken);
        }
        let limit = Arc::new(AtomicU64::new(u64::MAX));
        let read = Arc::new(Notify::new());
        let tcp = Settings {
            tcp: self.connects.tcp(addr, by).await?,
            seen: Vec::new(),
            limit: Some(limit.clone()),
            read: read.clone(),
        };
        let (send, connection) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                // h2 counts, over the connection's whole life, the streams it
                // resets itself (a frame from the app on a stream drainit
                // canceled and no longer remembers) and closes the connection
                // at 1024 (a guard against a hostile peer, CVE-2025-8671). The
                // peer here is the app, and every client's cancels add to the
                // shared connection: the limit would cut every client's
                // requests on it (502, `unknown`) each 1024 cancels.
                .max_local_error_reset_streams(None)
                .handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| SendError::unreached(format!("HTTP/2 to {addr}: {e}")))?;
        let ended = read.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("proxy: HTTP/2 upstream connection ended: {e}");
            }
            ended.notify_one();
        });
        // The app's limit first (its SETTINGS come within a round trip): h2
        // knows no limit before them, and the streams sent meanwhile past the
        // app's would be refused, or queued on this connection when another
        // had room. The lock is held: the requests waiting for it wait for
        // the limit too.
        let _ = tokio::time::timeout_at(by, read.notified()).await;
        let streams = Arc::new(AtomicU64::new(1));
        let stream = Stream(streams.clone());
        // Read again: beat 3 may have come during the connect (up to
        // CONNECT_TIMEOUT), when `close_idle` could not take the lock.
        if !self.closed.load(SeqCst) {
            conns.push(H2Conn {
                send: send.clone(),
                last: Instant::now(),
                streams,
                limit,
            });
        }
        Ok((send, stream))
    }

    /// Sends `req` (its URI absolute: `http://`, the client's authority, the
    /// path) and yields the app's response head, and its stream (counted
    /// open until dropped: keep it with the response body). A request hyper
    /// hands back unsent (the connection was closing) goes once more on a
    /// new connection.
    ///
    /// # Errors
    /// [`SendError`]: `reached_app` false when it never went out (refused,
    /// connect timeout, or handed back twice).
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<(Response<Incoming>, Stream), SendError> {
        let mut req = req;
        let mut resent = false;
        loop {
            let (mut send, stream) = self.sender().await?;
            match send.try_send_request(req).await {
                Ok(resp) => return Ok((resp, stream)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if !resent => {
                        log::debug!(
                            "proxy: HTTP/2 upstream was closing, sending again: {}",
                            e.error()
                        );
                        resent = true;
                        req = unsent;
                    }
                    unsent => {
                        return Err(SendError {
                            reached_app: unsent.is_none(),
                            message: e.into_error().to_string(),
                            connect: ConnectFailed::Refused,
                        });
                    }
                },
            }
        }
    }

    /// At beat 3: the connections are let go (each closes once its streams
    /// have ended: no new request will need them), and none is kept after.
    /// When a connect holds the lock now, [`Multiplexed::sender`] reads
    /// `closed` again once connected and does not keep the connection it
    /// opened.
    pub fn close_idle(&self) {
        self.closed.store(true, SeqCst);
        if let Ok(mut conns) = self.conns.try_lock() {
            conns.clear();
        }
    }
}

/// The app's side of an HTTP/2 connection, reading the app's first frame as
/// it passes to hyper: the server's preface is a SETTINGS frame (RFC 9113
/// §3.4), whose `SETTINGS_MAX_CONCURRENT_STREAMS` (0x3, §6.5.2) goes to
/// `limit`. Later SETTINGS frames are not read (an app that lowers its limit
/// later has h2 queue the streams past it, as before).
struct Settings {
    tcp: tokio::net::TcpStream,
    /// The first frame's bytes so far.
    seen: Vec<u8>,
    /// `None` once the first frame was read.
    limit: Option<Arc<AtomicU64>>,
    /// Told once the first frame was read (whatever it was).
    read: Arc<Notify>,
}

/// A first frame longer than this is not read (a SETTINGS frame holds 6
/// bytes per setting, and there are 7 settings).
const SETTINGS_MAX: usize = 1024;

impl Settings {
    /// Takes in `bytes`, read from the app: once the first frame is whole,
    /// reads its limit, if it is a SETTINGS frame that sets one.
    fn observe(&mut self, bytes: &[u8]) {
        let Some(limit) = &self.limit else {
            return;
        };
        self.seen.extend_from_slice(bytes);
        if self.seen.len() < 9 {
            return;
        }
        let len = usize::from(self.seen[0]) << 16
            | usize::from(self.seen[1]) << 8
            | usize::from(self.seen[2]);
        let is_settings = self.seen[3] == 0x4;
        if !is_settings || len > SETTINGS_MAX {
            self.limit = None;
            self.seen = Vec::new();
            self.read.notify_one();
            return;
        }
        if self.seen.len() < 9 + len {
            return;
        }
        for setting in self.seen[9..9 + len].chunks_exact(6) {
            if setting[..2] == [0, 3] {
                let v = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                // Zero forbids new streams for now: one is still tried.
                limit.store(u64::from(v).max(1), SeqCst);
            }
        }
        self.limit = None;
        self.seen = Vec::new();
        self.read.notify_one();
    }
}

impl AsyncRead for Settings {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && self.limit.is_some()
        {
            let new = buf.filled()[before..].to_vec();
            self.observe(&new);
        }
        polled
    }
}

super::socket::write_through_tcp!(Settings);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn get(path: &'static str) -> Request<ProxyBody> {
        Request::get(path)
            .header("host", "app")
            .body(ProxyBody::local(""))
            .unwrap()
    }

    /// The app's answer in these tests.
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// Reads one request head (no body in these tests); false at EOF or error.
    async fn read_head(tcp: &mut tokio::net::TcpStream) -> bool {
        let (mut buf, mut got) = ([0u8; 4096], Vec::new());
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    }

    /// How many connections a test app accepted.
    type Accepted = std::sync::Arc<std::sync::atomic::AtomicUsize>;

    /// A test app on a free port: each connection it accepts is counted and
    /// served by `serve` on a task of its own.
    async fn counting_app<F, Fut>(serve: F) -> (SocketAddr, Accepted)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Accepted::default();
        let counted = conns.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = l.accept().await.unwrap();
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(serve(tcp));
            }
        });
        (addr, conns)
    }

    /// An app that answers every request on a connection, and closes the
    /// connection `linger` after its `per_conn`th answer without saying so (as
    /// an app does when its keep-alive timeout fires between two requests).
    async fn app(per_conn: usize, linger: Duration) -> (SocketAddr, Accepted) {
        counting_app(move |mut tcp| async move {
            for _ in 0..per_conn {
                if !read_head(&mut tcp).await {
                    return;
                }
                let _ = tcp.write_all(OK).await;
            }
            tokio::time::sleep(linger).await;
        })
        .await
    }

    async fn body(resp: Response<Incoming>) -> Vec<u8> {
        use http_body_util::BodyExt;
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    /// Sequential requests share one connection; it is reused only after its
    /// response was read whole.
    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let (addr, conns) = app(usize::MAX, Duration::ZERO).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        for _ in 0..5 {
            let (resp, lease) = pool.send(get("/")).await.unwrap();
            assert_eq!(body(resp).await, b"ok");
            drop(lease);
            tokio::task::yield_now().await;
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    /// A pooled connection the app closed is not used: the request goes on a
    /// new one and gets its answer.
    #[tokio::test]
    async fn a_connection_the_app_closed_is_replaced_and_the_request_answered() {
        let (addr, conns) = app(1, Duration::ZERO).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        for _ in 0..3 {
            let (resp, lease) = pool.send(get("/")).await.unwrap();
            assert_eq!(body(resp).await, b"ok");
            drop(lease);
            // The app's close reaches the connection task.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// How long the race tests' app keeps a connection open after its answer
    /// ([`app`]'s linger): [`closed_as_picked`] must find the connection idle
    /// and open before it runs out, so it is long beside the few ms that takes
    /// (a machine stalled for a second would still fail these tests).
    const RACE_LINGER: Duration = Duration::from_secs(1);

    /// A pool whose one idle connection the app (from [`app`] with
    /// [`RACE_LINGER`]) is about to close, and whose connection task will not
    /// see it before the next request is written: one request answered, the
    /// connection back in the pool, then the runtime blocked past the linger
    /// (no task runs, the app's included). The next request picks that
    /// connection; the app closes it without reading the request.
    async fn closed_as_picked(addr: SocketAddr) -> Arc<Pool> {
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        let (resp, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(lease);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(pool.idle_count(), 1, "the connection is idle, open");
        std::thread::sleep(RACE_LINGER + Duration::from_millis(300));
        pool
    }

    /// The race the resend is for: the app closed the pooled connection, and
    /// drainit picks it before its connection task saw the close. The GET is
    /// written after the app's FIN and the app sends nothing back, so it is
    /// sent once more, on a new connection, and answered.
    #[tokio::test]
    async fn a_request_given_a_connection_the_app_just_closed_is_sent_once_more() {
        let (addr, conns) = app(1, RACE_LINGER).await;
        let pool = closed_as_picked(addr).await;
        let (resp, _lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        assert_eq!(
            pool.resent(),
            1,
            "the closed connection was not the one picked"
        );
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// The same race with a POST and its body: written after the app closed
    /// the connection, it is answered by the app's kernel with a reset, which
    /// says the app never read it: it goes once more, on a new connection, and
    /// is answered (gunicorn's gthread worker recycled by `--max-requests`
    /// leaves requests unread so, gunicorn#3038).
    #[tokio::test]
    async fn a_post_the_app_reset_unread_is_sent_once_more_with_its_body() {
        let (addr, conns) = app(1, RACE_LINGER).await;
        let pool = closed_as_picked(addr).await;
        post_is_answered_after_one_resend(pool, &conns).await;
    }

    /// A POST with a 4-byte body sent through `pool` is answered `ok` after one
    /// resend, on the app's second connection (`conns`).
    async fn post_is_answered_after_one_resend(
        pool: Arc<Pool>,
        conns: &std::sync::atomic::AtomicUsize,
    ) {
        let post = Request::post("/")
            .header("host", "app")
            .body(ProxyBody::local("data"))
            .unwrap();
        let (resp, _lease) = pool.send(post).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        assert_eq!(pool.resent(), 1);
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A new connection the app accepts and then closes with the request
    /// unread (a reset), as gunicorn's exiting gthread worker does with the
    /// connections it accepted last (gunicorn#3038): the POST goes once more,
    /// on another new connection, and is answered.
    #[tokio::test]
    async fn a_post_reset_unread_on_a_new_connection_is_sent_once_more() {
        let first = std::sync::Arc::new(AtomicBool::new(true));
        let (addr, conns) = counting_app(move |mut tcp| {
            let first = first.swap(false, SeqCst);
            async move {
                if first {
                    // Wait for the request's bytes, then close with them
                    // unread: the kernel resets the connection.
                    let _ = tcp.readable().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    return;
                }
                assert!(read_head(&mut tcp).await);
                let _ = tcp.write_all(OK).await;
            }
        })
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        post_is_answered_after_one_resend(pool, &conns).await;
    }

    /// A POST the app read whole on a reused connection, then closed it
    /// without answering (a FIN, no reset: it may have acted on it): not sent
    /// again, a 502 for the proxy and `unknown` in the ledger.
    #[tokio::test]
    async fn a_post_the_app_read_and_closed_without_answering_is_not_sent_again() {
        let (addr, conns) = counting_app(|mut tcp| async move {
            assert!(read_head(&mut tcp).await);
            tcp.write_all(OK).await.unwrap();
            // The POST's head and its 4-byte body, all of it read.
            let (mut buf, mut got) = ([0u8; 4096], Vec::new());
            while !got.ends_with(b"\r\n\r\ndata") {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            // Dropped: a FIN, nothing unread.
        })
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        let (resp, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(lease);
        tokio::task::yield_now().await;
        let post = Request::post("/")
            .header("host", "app")
            .header("content-length", "4")
            .body(ProxyBody::local("data"))
            .unwrap();
        let Err(e) = pool.send(post).await else {
            panic!("the POST the app read was answered");
        };
        assert!(e.reached_app, "{e:?}");
        assert_eq!(pool.resent(), 0);
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The same race when the app is gone for good (it closed the connection
    /// as it died): the second attempt is refused, and since the first may have
    /// reached the app, the request is not "never reached the app" (it would
    /// be counted `rejected`, safe to retry, when the app may have acted on it).
    #[tokio::test]
    async fn a_resent_request_whose_second_attempt_is_refused_may_have_reached_the_app() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = l.accept().await.unwrap();
            drop(l); // nothing listens any more
            assert!(read_head(&mut tcp).await);
            tcp.write_all(OK).await.unwrap();
            tokio::time::sleep(RACE_LINGER).await;
        });
        let pool = closed_as_picked(addr).await;
        let Err(e) = pool.send(get("/")).await else {
            panic!("answered with nothing listening");
        };
        // A second attempt was made (refused), and nothing was sent twice.
        assert!(e.message.contains("refused"), "{e:?}");
        assert_eq!(pool.resent(), 0, "{e:?}");
        assert!(e.reached_app, "{e:?}");
    }

    /// A GET whose reused connection broke after the app had sent part of a
    /// response: the app read it, so it is not sent again.
    #[tokio::test]
    async fn a_get_the_app_began_to_answer_is_not_sent_again() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = l.accept().await.unwrap();
            for answer in [OK, b"HTTP/1.1 2"] {
                assert!(read_head(&mut tcp).await);
                tcp.write_all(answer).await.unwrap();
            }
            // Dropped: closed after half a status line.
        });
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        let (resp, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(lease);
        tokio::task::yield_now().await;
        let Err(e) = pool.send(get("/cut")).await else {
            panic!("a cut response was answered");
        };
        assert!(e.reached_app, "{e:?}");
        assert_eq!(pool.resent(), 0);
    }

    /// At beat 3 the idle connections are closed, and one whose response
    /// ends after that is closed too, not kept.
    #[tokio::test]
    async fn closed_at_beat_3_the_pool_keeps_no_connection() {
        let (addr, conns) = app(usize::MAX, Duration::ZERO).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        let (resp, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(lease);
        tokio::task::yield_now().await;
        let (in_flight, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(pool.idle_count(), 0, "the idle one was taken");
        let (resp, idle) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(idle);
        tokio::task::yield_now().await;
        assert_eq!(pool.idle_count(), 1);
        pool.close_idle();
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(body(in_flight).await, b"ok");
        drop(lease);
        tokio::task::yield_now().await;
        assert_eq!(
            pool.idle_count(),
            0,
            "a connection done after beat 3 is not kept"
        );
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// Idle connections older than the idle timeout are closed, not reused.
    #[tokio::test]
    async fn a_stale_idle_connection_is_not_reused_and_is_swept() {
        let (addr, conns) = app(usize::MAX, Duration::ZERO).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_millis(100)));
        tokio::spawn(pool.sweep());
        let (resp, lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        drop(lease);
        tokio::task::yield_now().await;
        assert_eq!(pool.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(pool.idle_count(), 0, "the sweep closes it");
        let (resp, _lease) = pool.send(get("/")).await.unwrap();
        assert_eq!(body(resp).await, b"ok");
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// An address nothing listens on (bound, then closed).
    fn nobody_listening() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    /// Nothing listening: an error that says the request never reached the app.
    #[tokio::test]
    async fn a_refused_connection_never_reached_the_app() {
        let addr = nobody_listening();
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5)));
        let Err(e) = pool.send(get("/")).await else {
            panic!("a request with nothing listening was answered");
        };
        assert!(!e.reached_app, "{e:?}");
        assert!(e.message.contains(&addr.to_string()), "{e:?}");
    }

    /// An HTTP/2 app (hyper's server, prior knowledge) that answers each
    /// request with the `:authority` it got, and counts its connections.
    async fn h2_app() -> (SocketAddr, Accepted) {
        counting_app(|tcp| async move {
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let authority = req.uri().authority().map(|a| a.to_string());
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(authority.unwrap_or_default()),
                )))
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        })
        .await
    }

    fn h2_get(authority: &str) -> Request<ProxyBody> {
        Request::get(format!("http://{authority}/"))
            .version(hyper::Version::HTTP_2)
            .body(ProxyBody::local(""))
            .unwrap()
    }

    /// HTTP/2 requests share one connection to the app whatever authority
    /// each names (the app sees each one's own); once unused for the idle
    /// timeout it is given up for a new one.
    #[tokio::test]
    async fn http2_requests_share_one_connection_and_keep_their_authority() {
        let (addr, conns) = h2_app().await;
        // 1 s: the three requests below share the connection unless the
        // machine stalls a whole second between two of them.
        let up = Multiplexed::new(addr, Duration::from_secs(1));
        for authority in ["a.example", "b.example:8443", "a.example"] {
            let (resp, _stream) = up.send(h2_get(authority)).await.unwrap();
            assert_eq!(body(resp).await, authority.as_bytes());
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let (resp, _stream) = up.send(h2_get("a.example")).await.unwrap();
        assert_eq!(body(resp).await, b"a.example");
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// From beat 3 no HTTP/2 connection is kept: the one open is let go, and a
    /// request sent after gets a connection of its own that is not kept either.
    #[tokio::test]
    async fn closed_at_beat_3_no_http2_connection_is_kept() {
        let (addr, conns) = h2_app().await;
        let up = Multiplexed::new(addr, Duration::from_secs(5));
        let (resp, _stream) = up.send(h2_get("a.example")).await.unwrap();
        assert_eq!(body(resp).await, b"a.example");
        up.close_idle();
        for n in 2..=3 {
            let (resp, _stream) = up.send(h2_get("a.example")).await.unwrap();
            assert_eq!(body(resp).await, b"a.example");
            assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), n);
        }
        assert!(up.conns.lock().await.is_empty());
    }

    /// Beat 3 while the HTTP/2 connection is being opened (the app slow to
    /// accept: its accept queue full, the SYN sent again after 1 s): the
    /// connection serves the request that opened it and is not kept. Kept, it
    /// stayed open to the app until drainit's exit, and an app that waits for
    /// its connections to close before exiting waited for the deadline.
    #[tokio::test]
    async fn beat_3_during_the_http2_connect_keeps_no_connection() {
        use nix::sys::socket::{Backlog, listen};
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // listen(2) again on the listening socket: a backlog of 0.
        listen(&std_l, Backlog::new(0).unwrap()).unwrap();
        let addr = std_l.local_addr().unwrap();
        let filler = std::net::TcpStream::connect(addr).unwrap();
        std_l.set_nonblocking(true).unwrap();
        let l = tokio::net::TcpListener::from_std(std_l).unwrap();
        let up: &'static Multiplexed =
            Box::leak(Box::new(Multiplexed::new(addr, Duration::from_secs(30))));
        let sent = tokio::spawn(async move { up.send(h2_get("a.example")).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        up.close_idle();
        // The app accepts: the filler, then drainit's connection.
        drop(filler);
        drop(l.accept().await.unwrap());
        let (tcp, _) = l.accept().await.unwrap();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_req: Request<Incoming>| async move {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"ok"),
                )))
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
        let (resp, _stream) = sent.await.unwrap().unwrap();
        assert_eq!(body(resp).await, b"ok");
        assert!(
            up.conns.lock().await.is_empty(),
            "a connection is kept after beat 3"
        );
    }

    /// No app listening: the request never reached it (a `rejected` 503).
    #[tokio::test]
    async fn an_http2_request_to_an_app_that_refuses_never_reached_it() {
        let up = Multiplexed::new(nobody_listening(), Duration::from_secs(5));
        let e = up.send(h2_get("a.example")).await.unwrap_err();
        assert!(!e.reached_app, "{e:?}");
    }

    /// The app's first SETTINGS frame gives the stream limit, in as many
    /// reads as it comes; another first frame, or none set, leaves it open.
    #[tokio::test]
    async fn the_apps_first_settings_frame_gives_its_stream_limit() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        // SETTINGS: ENABLE_PUSH 0, MAX_CONCURRENT_STREAMS 20.
        let frame: &[u8] = &[
            0, 0, 12, 4, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 20,
        ];
        let limit = Arc::new(AtomicU64::new(u64::MAX));
        let mut s = Settings {
            tcp,
            seen: Vec::new(),
            limit: Some(limit.clone()),
            read: Arc::new(Notify::new()),
        };
        for piece in frame.chunks(5) {
            s.observe(piece);
        }
        assert_eq!(limit.load(SeqCst), 20);
        assert!(s.limit.is_none(), "read once");
        let none = Arc::new(AtomicU64::new(u64::MAX));
        s.limit = Some(none.clone());
        s.observe(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(none.load(SeqCst), u64::MAX);
        let other = Arc::new(AtomicU64::new(u64::MAX));
        s.limit = Some(other.clone());
        s.observe(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(other.load(SeqCst), u64::MAX);
        assert!(s.limit.is_none());
    }
}
