//! What the proxy's threads and the supervisor's handle share: the gate
//! ([`Gate`]), the request ledger, the open streams, and the counts
//! [`super::Proxy::stop`] waits on ([`Rejecting`] among them). The ways to the
//! app are not here: they are `upstream::Clients`, handed to the accept loop
//! beside this.
//!
//! The proxy's files form a one-way graph, and this one is near its bottom:
//! it imports only the ledger and the streams, so that every file of the
//! request path may hold it.
//!
//! One [`Shared`] per proxy, in an `Arc`: the supervisor's [`super::Proxy`],
//! `/metrics`' [`super::ProxyStats`], the accept loop, each connection and each
//! request in flight hold it; it goes when the last of them does.
//!
//! Must not: decide anything. It holds state and answers questions about it
//! (is admission closed, is the proxy quiet); the request path decides.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::STOP_QUIET;
use super::ledger::RequestLedger;
use super::streams::StreamSet;

/// What the proxy thread and the supervisor share.
pub(super) struct Shared {
    pub(super) gate: AtomicU8,
    pub(super) gate_tx: watch::Sender<Gate>,
    pub(super) ledger: RequestLedger,
    /// Notified when no admitted request is in flight once admission is closed.
    pub(super) idle: Notify,
    /// The health path (`--proxy-health`), answered as `/readyz`.
    pub(super) health: Option<String>,
    /// Asks the supervisor's thread what `/readyz` would answer.
    pub(super) ready_ask: crate::readiness::ReadinessAsks,
    pub(super) upstream: SocketAddr,
    /// `upstream` as a URI authority, built once.
    pub(super) authority: hyper::http::uri::Authority,
    /// Open WebSockets and SSE responses, closed over `spread` at beat 3.
    pub(super) streams: Arc<StreamSet>,
    pub(super) spread: Duration,
    /// Client connections whose first request has not been answered yet
    /// ([`super::serve`]'s `Unanswered`).
    pub(super) unanswered: AtomicUsize,
    /// Requests being answered drainit's own 503
    /// ([`Rejecting`]): their body is read first, and
    /// [`super::Proxy::stop`] waits a moment for them.
    pub(super) rejecting: AtomicUsize,
    /// When the last connection was accepted or the drain signal forwarded,
    /// in ms since `born` ([`STOP_QUIET`]).
    stirred_ms: AtomicU64,
    born: Instant,
    /// drainit is SIGKILLing the app ([`super::Proxy::abandon`]: the deadline,
    /// or a second signal in beat 3): an upstream failure from now on is
    /// drainit's doing, not the app's, and its 502 says so.
    pub(super) killing: AtomicBool,
}

impl Shared {
    /// A proxy for the app at `upstream`, its gate at [`Gate::NotReady`].
    ///
    /// # Errors
    /// `upstream` does not make a URI authority.
    pub(super) fn new(
        upstream: SocketAddr,
        health: Option<String>,
        ready_ask: crate::readiness::ReadinessAsks,
        spread: Duration,
    ) -> std::io::Result<Shared> {
        let (gate_tx, _) = watch::channel(Gate::NotReady);
        Ok(Shared {
            gate: AtomicU8::new(Gate::NotReady as u8),
            gate_tx,
            ledger: RequestLedger::default(),
            idle: Notify::new(),
            health,
            ready_ask,
            upstream,
            authority: upstream
                .to_string()
                .parse()
                .map_err(|e| std::io::Error::other(format!("upstream {upstream}: {e}")))?,
            streams: Arc::default(),
            spread,
            unanswered: AtomicUsize::new(0),
            rejecting: AtomicUsize::new(0),
            stirred_ms: AtomicU64::new(0),
            killing: AtomicBool::new(false),
            born: Instant::now(),
        })
    }

    pub(super) fn gate(&self) -> Gate {
        // SeqCst with the ledger's in-flight count: see `gate::admit`.
        Gate::from_u8(self.gate.load(SeqCst))
    }

    /// A connection was accepted, or the drain signal forwarded, now.
    pub(super) fn stir(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.stirred_ms.fetch_max(ms, SeqCst);
    }

    /// [`STOP_QUIET`] has passed since [`Shared::stir`] was last called.
    pub(super) fn still(&self) -> bool {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        ms.saturating_sub(self.stirred_ms.load(SeqCst)) >= STOP_QUIET.as_millis() as u64
    }

    /// No admitted request in flight and no stream open.
    pub(super) fn quiet(&self) -> bool {
        self.ledger.in_flight() == 0 && self.streams.open() == 0
    }

    /// After a request settles or a stream ends: the supervisor may be waiting
    /// for none in flight.
    pub(super) fn settled(&self) {
        if self.gate() >= Gate::Closed && self.quiet() {
            self.idle.notify_one();
        }
    }
}

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
    pub(super) fn from_u8(v: u8) -> Gate {
        match v {
            0 => Gate::NotReady,
            1 => Gate::Ready,
            2 => Gate::Closing,
            3 => Gate::Closed,
            _ => Gate::Forwarded,
        }
    }
}

/// A request counted `rejected` whose 503 is not written yet (drainit reads
/// its body first, up to [`super::REJECT_BODY_MAX`] or 1 s, so that the answer is not
/// lost to a reset): counted in [`Shared::rejecting`] until the 503's body,
/// which holds it, is dropped by hyper, in the same poll as the write and
/// flush of the whole answer. [`super::Proxy::stop`] waits for these (at most
/// [`super::STOP_SETTLE`]): a client counted `rejected` gets its 503, not a
/// connection cut by drainit's exit. Not an outcome: the outcome was recorded
/// when it was decided.
pub(super) struct Rejecting(Arc<Shared>);

impl Rejecting {
    pub(super) fn new(shared: &Arc<Shared>) -> Rejecting {
        shared.rejecting.fetch_add(1, SeqCst);
        Rejecting(shared.clone())
    }
}

impl Drop for Rejecting {
    fn drop(&mut self) {
        self.0.rejecting.fetch_sub(1, SeqCst);
    }
}
