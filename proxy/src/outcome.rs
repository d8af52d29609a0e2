//! Where an admitted request's outcome is recorded: one guard per request,
//! [`InFlight`], and nothing else.
//!
//! The request path decides an outcome ([`Outcome`]: completed, unknown,
//! canceled, rejected) and hands it to the guard, once: the guard is taken by
//! value, so a request cannot be recorded twice. Only when the path never got
//! to decide (the client went away and hyper dropped the request's future or
//! its response body; drainit's exit dropped the runtime) does the guard's
//! `Drop` record one: `canceled`, which the ledger counts `abandoned` once
//! drainit cut what is in flight ([`super::ledger::RequestLedger::cut_all`]).
//! No other `Drop` records an outcome, so the order in which things are
//! dropped never decides one.
//!
//! An HTTP/1 response taken whole by hyper is `completed` only once it is out
//! of drainit's buffers: its guard waits in the connection's [`Unflushed`]
//! until hyper's next successful flush and the client's acknowledgement
//! (the kernel's count, `TCP_INFO`), its connection meanwhile [`Busy`].

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::Request;

use super::ledger::{Admitted, Outcome};
use super::shared::{Rejecting, Shared};

/// `X-Request-Id`, made once (a name given as text is parsed at each look-up).
static X_REQUEST_ID: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("x-request-id");

/// One admitted request until its outcome is recorded (see the module's
/// doc): counted `in_flight` from [`InFlight::admit`] until
/// [`InFlight::record`], or until dropped (`canceled`, or `abandoned` after
/// drainit's cut). Either way the supervisor's wait for nothing in flight is
/// woken ([`Shared::settled`]).
pub(super) struct InFlight {
    shared: Arc<Shared>,
    /// `None` once recorded. Boxed: the guard rides in every response body
    /// and request value, which are moved whole many times per request.
    admitted: Option<Box<Admitted>>,
}

impl InFlight {
    /// Admits `req`: `received` and `admitted`, in flight from now on.
    pub(super) fn admit<B>(shared: Arc<Shared>, req: &Request<B>) -> InFlight {
        let admitted =
            shared
                .ledger
                .admit(req.method(), req.uri(), req.headers().get(&X_REQUEST_ID));
        InFlight {
            shared,
            admitted: Some(Box::new(admitted)),
        }
    }

    /// Records the request's outcome, and wakes the supervisor if it waits
    /// for nothing in flight.
    pub(super) fn record(mut self, outcome: Outcome) {
        self.settle(outcome);
    }

    /// The request never reached the app: `rejected`. The 503 that says so is
    /// counted in [`Shared::rejecting`] before the request leaves `in_flight`,
    /// so that [`super::Proxy::stop`], which waits for either, never sees a
    /// moment with neither; the returned [`Rejecting`] goes in the 503's body.
    pub(super) fn reject(self) -> Rejecting {
        let rejecting = Rejecting::new(&self.shared);
        self.record(Outcome::Rejected);
        rejecting
    }

    fn settle(&mut self, outcome: Outcome) {
        if let Some(a) = self.admitted.take() {
            self.shared.ledger.settle(*a, outcome);
            self.shared.settled();
        }
    }
}

impl Drop for InFlight {
    /// Nothing was recorded: the client went away (or drainit's exit dropped
    /// the request). The ledger makes it `abandoned` after drainit's cut.
    fn drop(&mut self) {
        self.settle(Outcome::Canceled);
    }
}

/// The requests of one HTTP/1 client connection whose response's last frame
/// hyper has taken but whose bytes may not have reached the client yet: they
/// stay in flight, and are `completed` only once the client's TCP has
/// acknowledged the response's last byte. Two steps:
///
/// 1. hyper buffers up to a few hundred KiB for a client slower than the app:
///    a response taken whole waits for hyper's next successful flush of the
///    connection, which comes only once its write buffer is empty.
/// 2. Flushed, its bytes are in the kernel's send queue, not yet the client's:
///    a connection closed with unread input is reset, and the kernel discards
///    what it had not sent (RFC 9112 §9.6). So the response waits, at the byte
///    offset where it ends, until the kernel's count of acknowledged bytes
///    (`tcpi_bytes_acked` of `TCP_INFO`, tcp(7)) says the client has
///    everything up to it.
///
/// A client that resets the connection without closing its side first, right
/// after reading a response, never sends the acknowledgement it was delaying
/// (a delayed ACK waits up to 40 ms; the reset carries an acknowledgement the
/// kernel does not read, RFC 9293 §3.10.7.4): HAProxy closes every server
/// connection it closes first this way (`SO_LINGER` 0). So once the client
/// reset it, a response is also `completed` when every byte of it was
/// transmitted (none left in the kernel's queue, `tcpi_notsent_bytes`) and
/// none of the bytes outstanding may have been retransmitted (each of the
/// connection's retransmissions, `tcpi_total_retrans`, is of bytes written
/// before the check that first saw it; once the client acknowledged those,
/// it concerns none outstanding: [`Resent`]): the kernel discarded nothing
/// of it. A
/// client that closed its side first (a read found its end) and then reset
/// did not read what came after; a response the kernel still held when the
/// reset came lost those bytes: both stay `canceled`. The limit: a last
/// segment lost in the network looks transmitted until the kernel's
/// retransmission timer says otherwise (200 ms at least), so a client that
/// resets within that time after such a loss counts `completed`.
///
/// Checked at a flush of a later response (a keep-alive client's next request
/// carries its acknowledgement of the response before), by the connection's
/// [`Unflushed::watch`] while something waits ([`ACK_CHECK_QUICK`] after the
/// connection's last flush, or [`ACK_CHECK_AFTER`] for a client that delays
/// its acknowledgements, then every [`ACK_CHECK_AFTER`]), and by the lingering
/// close ([`super::socket::Rewind`]'s drop). Dropped before that (drainit cut the connection, the client went,
/// the linger ran out, drainit's exit), their guards record them `canceled`
/// (`abandoned` after drainit's cut) as any request cut mid-response: a client
/// that got a cut response is never counted `completed`, and the drain signal
/// waits for the last bytes as for the rest of the response.
#[derive(Default)]
pub(super) struct Unflushed {
    /// Whether `taken` holds any: read on every flush, without the lock.
    any: AtomicBool,
    /// Bytes written to the client's socket so far.
    written: AtomicU64,
    pending: Mutex<Pending>,
    /// What the client did to the connection first: [`PEER_OPEN`],
    /// [`PEER_CLOSED`] or [`PEER_RESET`].
    peer: AtomicU8,
}

/// The client has neither closed nor reset the connection (yet).
const PEER_OPEN: u8 = 0;
/// The client closed its side first (a read found the end of its bytes).
const PEER_CLOSED: u8 = 1;
/// The client reset the connection without closing its side first.
const PEER_RESET: u8 = 2;

/// A request waiting in [`Unflushed`], and its place in its connection's
/// count of requests being answered (the connection is not idle meanwhile).
type Waiting = (InFlight, Option<Busy>);

#[derive(Default)]
struct Pending {
    /// Taken whole by hyper, not flushed yet.
    taken: Vec<Waiting>,
    /// Flushed: each with the offset (bytes written on the connection) at
    /// which its response ends, in order.
    sent: std::collections::VecDeque<(u64, Waiting)>,
    /// The client's socket while it is open: its descriptor stays valid while
    /// this is `Some` (the socket's owner clears it, under the lock, before
    /// closing it).
    socket: Option<RawFd>,
    /// Which of the connection's retransmissions may be of bytes the client
    /// has not acknowledged.
    resent: Resent,
    /// [`Unflushed::watch`]'s timer, made at its first poll (in the runtime):
    /// due [`ACK_CHECK_QUICK`] or [`ACK_CHECK_AFTER`] after the last flush of
    /// a response while responses wait, [`ACK_CHECK_IDLE`] after the last
    /// check when none does. Dropped with the socket ([`Unflushed::set_socket`]).
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The timer is due [`ACK_CHECK_QUICK`] after the last flush.
    quick: bool,
    /// A check [`ACK_CHECK_QUICK`] after a flush found the client had not
    /// acknowledged yet: its TCP delays its acknowledgements (or its round
    /// trip is longer than that), so the next responses are checked
    /// [`ACK_CHECK_AFTER`] after their flush, until a response comes after a
    /// quiet spell of [`ACK_QUICK_AGAIN`].
    delays_acks: bool,
    /// When a response was last flushed.
    last_flush: Option<tokio::time::Instant>,
}

impl Pending {
    /// A flush of responses left some waiting: the watch checks
    /// [`ACK_CHECK_QUICK`] from now, or [`ACK_CHECK_AFTER`] if this client
    /// delays its acknowledgements (unless the connection was quiet for
    /// [`ACK_QUICK_AGAIN`] before this flush).
    fn arm_after_flush(&mut self) {
        let now = tokio::time::Instant::now();
        if self
            .last_flush
            .is_some_and(|t| now.saturating_duration_since(t) >= ACK_QUICK_AGAIN)
        {
            self.delays_acks = false;
        }
        self.last_flush = Some(now);
        self.quick = !self.delays_acks;
        self.check_at(now + self.wait());
    }

    /// How long the watch's timer waits from now: [`ACK_CHECK_IDLE`] while
    /// no response waits, else [`ACK_CHECK_QUICK`] for the quick check and
    /// [`ACK_CHECK_AFTER`] otherwise.
    fn wait(&self) -> Duration {
        if self.sent.is_empty() {
            ACK_CHECK_IDLE
        } else if self.quick {
            ACK_CHECK_QUICK
        } else {
            ACK_CHECK_AFTER
        }
    }

    /// The watch's next check comes at `when`. Between the responses of a
    /// busy connection the deadline only moves later, which tokio's timer
    /// takes as a compare-and-swap: no task is woken and no check made until
    /// the connection has had no response flushed for that long. Moved
    /// earlier (the first flush after a quiet spell) or after it fired, the
    /// timer is registered again under the timer's lock.
    ///
    /// The waker the watch registered stays with the timer across the move:
    /// tokio's own timer (1.54, `runtime/time/entry.rs`: `reset` swaps the
    /// deadline or re-registers the entry, and the entry keeps its waker until
    /// it fires; a timer that fired woke the watch, whose next poll registers
    /// it again). tokio does not document it, and its alternative timer
    /// (`tokio_unstable`'s `enable_alt_timer`, not used here) makes a new
    /// entry at each reset: the unit test
    /// `the_watch_completes_a_response_on_a_connection_gone_quiet` moves the
    /// deadline both ways with nothing else to wake the watch, and fails if a
    /// tokio update stops keeping the waker.
    fn check_at(&mut self, when: tokio::time::Instant) {
        if let Some(timer) = &mut self.timer {
            timer.as_mut().reset(when);
        }
    }
}

/// The connection's retransmitted segments (`tcpi_total_retrans`) sorted by
/// whether they may be of bytes still unacknowledged, from the counts seen at
/// each check: a retransmission first seen when `written` bytes had been
/// written is of some of those bytes, so once the client acknowledged that
/// many it concerns none outstanding.
#[derive(Default)]
struct Resent {
    /// Retransmissions all of whose bytes the client acknowledged since.
    settled: u32,
    /// The count first seen above `settled`, and the bytes written then.
    pending: Option<(u32, u64)>,
}

impl Resent {
    /// A check found `total` retransmissions so far, `written` bytes written
    /// and `acked` acknowledged: true when none may be of the bytes
    /// outstanding.
    fn update(&mut self, total: u32, written: u64, acked: u64) -> bool {
        if total != self.settled {
            if self.pending.is_none_or(|(n, _)| n != total) {
                self.pending = Some((total, written));
            }
            if let Some((n, high)) = self.pending
                && acked >= high
            {
                self.settled = n;
                self.pending = None;
            }
        }
        total == self.settled
    }
}

impl Unflushed {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `request`'s response was taken whole by hyper: `completed` once flushed
    /// and acknowledged.
    pub(super) fn push(&self, request: InFlight, busy: Option<Busy>) {
        self.lock().taken.push((request, busy));
        self.any.store(true, SeqCst);
    }

    /// A read found the end of the client's bytes: it closed its side.
    pub(super) fn closed_by_peer(&self) {
        let _ = self
            .peer
            .compare_exchange(PEER_OPEN, PEER_CLOSED, SeqCst, SeqCst);
    }

    /// A read or a write failed with `ECONNRESET`: the client reset the
    /// connection (counted only if it had not closed its side before).
    pub(super) fn reset_by_peer(&self) {
        let _ = self
            .peer
            .compare_exchange(PEER_OPEN, PEER_RESET, SeqCst, SeqCst);
    }

    /// `n` more bytes were written to the client's socket.
    pub(super) fn wrote(&self, n: usize) {
        self.written.fetch_add(n as u64, SeqCst);
    }

    /// The client's socket (`Some`) or its close (`None`): see
    /// [`Pending::socket`].
    ///
    /// The timer goes with the socket's close: the watch that polled it is
    /// gone with the connection, and the lingering close checks on its own.
    pub(super) fn set_socket(&self, socket: Option<RawFd>) {
        let timer = {
            let mut p = self.lock();
            p.socket = socket;
            if socket.is_none() {
                p.timer.take()
            } else {
                None
            }
        };
        // Dropped outside the lock (it takes the timer's).
        drop(timer);
    }

    /// hyper flushed the connection: the responses it had taken are in the
    /// kernel, and [`Unflushed::watch`] checks for the client's
    /// acknowledgement [`ACK_CHECK_QUICK`] (or [`ACK_CHECK_AFTER`]) from now
    /// unless a later flush comes first. Responses flushed before these may
    /// have been acknowledged meanwhile (a keep-alive client's next request
    /// carries the acknowledgement): they are checked now.
    ///
    /// Not checked at every flush: hyper flushes each time its connection is
    /// polled, and a response just written is not acknowledged yet (a client's
    /// ACK takes a round trip), so each check then was a `TCP_INFO` call that
    /// found nothing, three or four per request.
    pub(super) fn flushed(&self) {
        if !self.any.swap(false, SeqCst) {
            return;
        }
        let end = self.written.load(SeqCst);
        let mut p = self.lock();
        let earlier = !p.sent.is_empty();
        // Drained in place: the list keeps its room for the next response.
        let q = &mut *p;
        q.sent.extend(q.taken.drain(..).map(|w| (end, w)));
        if earlier {
            self.deliver_in(&mut p);
        }
        if !p.sent.is_empty() {
            p.arm_after_flush();
        }
    }

    /// Records `completed` the sent responses whose last byte the client
    /// acknowledged; true when none waits any more.
    pub(super) fn deliver(&self) -> bool {
        self.deliver_in(&mut self.lock())
    }

    fn deliver_in(&self, p: &mut Pending) -> bool {
        if p.sent.is_empty() {
            return true;
        }
        let Some(fd) = p.socket else {
            return false;
        };
        let written = self.written.load(SeqCst);
        // A kernel older than 4.2 has no `tcpi_bytes_acked`: `SIOCOUTQ`.
        let Some(q) = queues(fd).or_else(|| {
            unacked(fd).map(|u| Queues {
                acked: written.saturating_sub(u),
                sent: None,
            })
        }) else {
            return false;
        };
        let mut acked = q.acked.min(written);
        if let Some(t) = q.sent {
            let resent_none = p.resent.update(t.resent, written, acked);
            if resent_none && self.peer.load(SeqCst) == PEER_RESET {
                // Reset right after reading, without the delayed ACK: what
                // the kernel transmitted and never sent again reached it (see
                // the type's doc).
                acked = acked.max(written.saturating_sub(t.unsent));
            }
        }
        while p.sent.front().is_some_and(|(end, _)| *end <= acked) {
            if let Some((_, (request, _))) = p.sent.pop_front() {
                request.record(Outcome::Completed);
            }
        }
        p.sent.is_empty()
    }

    /// The connection is over and its client was not heard from in time:
    /// what it has not acknowledged is `canceled` (`abandoned` after
    /// drainit's cut), and so is what hyper never flushed.
    pub(super) fn give_up(&self) {
        let (taken, sent) = {
            let mut p = self.lock();
            p.socket = None;
            (std::mem::take(&mut p.taken), std::mem::take(&mut p.sent))
        };
        // Recorded outside the lock.
        drop((taken, sent));
    }

    /// Never returns: while the connection is open and responses wait for
    /// the client's acknowledgement, checks for it once the connection has
    /// had no response flushed for [`ACK_CHECK_QUICK`] (a client that
    /// acknowledges at once) or, once a client was found to delay its acknowledgements,
    /// [`ACK_CHECK_AFTER`], and as long again after each check that finds
    /// some still waiting. A busy connection is checked at its flushes
    /// instead ([`Unflushed::flushed`]): its timer only moves. For the
    /// connection's `select!`; dropped and made again, it loses nothing.
    pub(super) async fn watch(&self) {
        std::future::poll_fn(|cx| self.poll_watch(cx)).await;
    }

    fn poll_watch(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let mut p = self.lock();
        loop {
            let after = p.wait();
            let timer = p
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
            if timer.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            let none_waits = self.deliver_in(&mut p);
            // Not acknowledged within the quick check: a delayed ACK (Linux
            // delays them once a connection goes back and forth, until it
            // has been quiet longer than its retransmission timeout), or a
            // round trip longer than the check's wait.
            if p.quick && !none_waits {
                p.delays_acks = true;
            }
            p.quick = false;
            // Polled again at the top: the new deadline holds the waker.
            let after = p.wait();
            p.check_at(tokio::time::Instant::now() + after);
        }
    }
}

/// One request being answered on a client connection, from its head read to
/// its response written (held by the response's body): a connection with
/// none is idle (`serve.rs`'s `Open::evict_oldest_idle`).
pub(super) struct Busy(Arc<std::sync::atomic::AtomicUsize>);

impl Busy {
    pub(super) fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Busy {
        count.fetch_add(1, SeqCst);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// The bytes the kernel holds for a connection that the peer has not
/// acknowledged yet (`SIOCOUTQ`, tcp(7): sent or not); `None` when the
/// kernel does not say. `fd` must be an open TCP socket.
#[allow(unsafe_code)]
pub(super) fn unacked(fd: RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(2) SIOCOUTQ (= TIOCOUTQ) on a socket writes one int
    // through the pointer, which points to `n`; the caller keeps `fd` open.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &raw mut n) };
    (rc == 0).then(|| u64::try_from(n).unwrap_or(0))
}

/// What the kernel says of a connection's bytes ([`queues`]).
struct Queues {
    /// Bytes the client acknowledged (its FIN counts one).
    acked: u64,
    /// What was transmitted; `None` from a kernel older than 4.6.
    sent: Option<Sent>,
}

/// What the kernel transmitted of a connection's bytes ([`queues`]).
struct Sent {
    /// Bytes not transmitted yet (`tcpi_notsent_bytes`).
    unsent: u64,
    /// Segments retransmitted so far (`tcpi_total_retrans`).
    resent: u32,
}

/// The kernel's counts for a connection (`TCP_INFO`, tcp(7): `tcpi_bytes_acked`
/// since Linux 4.2, `tcpi_notsent_bytes` since 4.6); `None` when the kernel
/// does not say (older kernels: [`unacked`]). The counts outlive a reset.
/// `fd` must be an open TCP socket.
#[allow(unsafe_code)]
fn queues(fd: RawFd) -> Option<Queues> {
    // SAFETY: an all-zero tcp_info is a valid value (integers only).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).ok()?;
    // SAFETY: getsockopt(2) TCP_INFO writes at most `len` bytes to `info`,
    // which is that large; the caller keeps `fd` open.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let len = usize::try_from(len).ok()?;
    let has = |end: usize| len >= end;
    if !has(std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8) {
        return None;
    }
    let sent = has(std::mem::offset_of!(libc::tcp_info, tcpi_notsent_bytes) + 4).then(|| Sent {
        unsent: u64::from(info.tcpi_notsent_bytes),
        resent: info.tcpi_total_retrans,
    });
    Some(Queues {
        acked: info.tcpi_bytes_acked,
        sent,
    })
}

/// How long after a connection's last flush of a response [`Unflushed::watch`]
/// first checks for the client's acknowledgement: a nearby client (a round
/// trip well under this) whose TCP acknowledges at once (a new connection's
/// first segments, or after a quiet spell: Linux's quick-ACK mode) has its
/// response counted `completed` 1–2 ms after the flush (tokio's timer rounds
/// up to the next millisecond). A client further away fails this check once
/// and is then checked as one that delays its acknowledgements.
const ACK_CHECK_QUICK: Duration = Duration::from_millis(1);

/// How long after a connection's last flush of a response [`Unflushed::watch`]
/// checks for the acknowledgement of a client that delays them, and then
/// between two checks. A Linux client delays an acknowledgement that no data
/// of its own carries by at most the longer of 40 ms (`TCP_DELACK_MIN`,
/// `include/net/tcp.h`) and its round trip (`tcp_send_delayed_ack`): the
/// first check finds the acknowledgement of a client a few milliseconds away,
/// and a check comes within 50 ms of that of a client further away. A keep-alive client's
/// next request usually carries it sooner, and is checked at the flush of its
/// response instead. With a check 1 ms after every flush, a client at 60
/// requests per second on a connection had that check fail and a timer wake
/// the connection's task once or more per request.
const ACK_CHECK_AFTER: Duration = Duration::from_millis(50);

/// A response flushed after the connection had none flushed for this long is
/// checked [`ACK_CHECK_QUICK`] after its flush again, whatever the client
/// did before: Linux acknowledges at once again data that comes after a gap
/// longer than the connection's retransmission timeout (200 ms at least,
/// `TCP_RTO_MIN`; `tcp_event_data_recv`).
const ACK_QUICK_AGAIN: Duration = Duration::from_millis(200);

/// The watch's timer while nothing waits: the next flush of a response
/// brings it back to [`ACK_CHECK_QUICK`] or [`ACK_CHECK_AFTER`].
const ACK_CHECK_IDLE: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn shared() -> Arc<Shared> {
        let (asks, _) = tokio::sync::mpsc::channel(1);
        let (asked, _) = crate::readiness::ReadyzAsked::channel();
        let ready_ask = crate::readiness::ReadinessAsks::new(asks, asked);
        let app = "127.0.0.1:9".parse().unwrap();
        Arc::new(Shared::new(app, None, ready_ask, Duration::ZERO).unwrap())
    }

    /// A connected pair on the loopback: (client, drainit's side).
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (client, l.accept().unwrap().0)
    }

    /// A request of `s` answered on `server`: its 8-byte response taken
    /// whole, written and flushed.
    fn respond(u: &Unflushed, s: &Arc<Shared>, server: &mut std::net::TcpStream) {
        use std::io::Write;
        let req = Request::get("/a").body(()).unwrap();
        u.push(InFlight::admit(s.clone(), &req), None);
        server.write_all(b"response").unwrap();
        u.wrote(8);
        u.flushed();
    }

    /// The path's outcome is recorded once; a guard dropped with nothing
    /// recorded is `canceled`, `abandoned` after drainit's cut; a rejected
    /// request's 503 is counted before the request leaves `in_flight`.
    #[test]
    fn the_guard_records_the_paths_outcome_or_else_canceled_or_abandoned() {
        let s = shared();
        let req = Request::get("/a").body(()).unwrap();
        InFlight::admit(s.clone(), &req).record(Outcome::Completed);
        drop(InFlight::admit(s.clone(), &req));
        let rejecting = InFlight::admit(s.clone(), &req).reject();
        assert_eq!(s.rejecting.load(SeqCst), 1);
        drop(rejecting);
        assert_eq!(s.rejecting.load(SeqCst), 0);
        let cut = InFlight::admit(s.clone(), &req);
        s.ledger.cut_all();
        drop(cut);
        let t = s.ledger.totals();
        assert!(t.balanced(), "{t:?}");
        assert_eq!(
            (
                t.completed,
                t.canceled,
                t.rejected,
                t.abandoned,
                t.in_flight
            ),
            (1, 1, 1, 1, 0)
        );
    }

    /// A response taken whole is `completed` once flushed and acknowledged by
    /// the client's TCP; one the client has not acknowledged when the
    /// connection is over is `canceled`, and so is one never flushed.
    #[test]
    fn an_unflushed_response_completes_once_the_client_has_it_or_is_canceled() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let s = shared();
        let req = Request::get("/a").body(()).unwrap();
        let (mut client, mut server) = tcp_pair();
        let u = Unflushed::default();
        u.set_socket(Some(server.as_raw_fd()));
        respond(&u, &s, &mut server);
        let mut got = [0u8; 8];
        client.read_exact(&mut got).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !u.deliver() {
            assert!(std::time::Instant::now() < deadline, "never acknowledged");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(s.ledger.totals().completed, 1);
        // Flushed, never acknowledged (no socket to ask), then over.
        u.set_socket(None);
        u.push(InFlight::admit(s.clone(), &req), None);
        u.wrote(8);
        u.flushed();
        assert_eq!(s.ledger.in_flight(), 1, "in flight until acknowledged");
        // Taken, never flushed.
        u.push(InFlight::admit(s.clone(), &req), None);
        u.give_up();
        let t = s.ledger.totals();
        assert_eq!((t.completed, t.canceled, t.in_flight), (1, 2, 0));
    }

    /// A response flushed on a connection that then goes quiet is counted
    /// `completed` by the connection's watch, with no later flush or close:
    /// its timer, due after the flush and moved by the flushes that follow,
    /// checks the client's acknowledgement.
    #[test]
    fn the_watch_completes_a_response_on_a_connection_gone_quiet() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = shared();
        let (mut client, mut server) = tcp_pair();
        let u = Arc::new(Unflushed::default());
        u.set_socket(Some(server.as_raw_fd()));
        rt.block_on(async {
            let watched = u.clone();
            let watch = tokio::spawn(async move { watched.watch().await });
            // The watch's first poll makes its timer, as at a connection's start.
            tokio::task::yield_now().await;
            // Each round: the deadline moved earlier by the first flush (from
            // the idle one, or after the check that fired), then later by a
            // second flush right after it; nothing but the timer wakes the
            // watch after that.
            for round in 1..=3 {
                respond(&u, &s, &mut server);
                respond(&u, &s, &mut server);
                let mut got = [0u8; 16];
                client.read_exact(&mut got).unwrap();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while s.ledger.totals().completed < 2 * round {
                    assert!(tokio::time::Instant::now() < deadline, "never completed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert_eq!(s.ledger.in_flight(), 0);
            }
            watch.abort();
        });
    }

    /// A retransmission counts against the bytes outstanding until the client
    /// acknowledged every byte written before the check that first saw it.
    #[test]
    fn a_retransmission_concerns_the_bytes_outstanding_until_those_written_before_it_are_acknowledged()
     {
        let mut r = Resent::default();
        // (total retransmissions, written, acknowledged) → none outstanding?
        let steps = [
            ((0, 100, 50), true),
            // First seen with 200 written: of some of those 200.
            ((1, 200, 100), false),
            ((1, 300, 150), false),
            // All 200 acknowledged: settled, though 300 are not.
            ((1, 300, 200), true),
            ((1, 400, 300), true),
            // Another, first seen with 400 written; the reset comes first.
            ((2, 400, 300), false),
            ((2, 400, 300), false),
        ];
        for ((total, written, acked), none) in steps {
            assert_eq!(
                r.update(total, written, acked),
                none,
                "{total} {written} {acked}"
            );
        }
    }
}
