//! The bodies drainit passes on: a request's body on its way to the app
//! (watched for a client that stalls or goes, and copied while it may have to
//! go again) and a response's body on its way to the client (its request's
//! outcome decided by how it ends; an event stream, counted as a stream
//! ([`Open`]), ended between events at beat 3).
//!
//! Must not: record an outcome itself. A response body decides `completed`
//! (its last frame went out) or `unknown` (the app's body failed) and hands
//! it to its request's guard ([`InFlight`]); a body dropped before its end
//! leaves the guard to record what that means.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::BODY_IDLE;
use super::ledger::{Outcome, StreamEnd};
use super::outcome::{Busy, InFlight, Unflushed};
use super::shared::{Rejecting, Shared};
use super::streams::{self, Registered};

/// The response body drainit sends (its own, or the app's streamed through
/// with the request's guard, settled when the last byte went out), and the
/// request body it sends the app.
pub struct ProxyBody {
    inner: Inner,
    /// The request whose response this is, until its outcome is decided.
    pub(super) in_flight: Option<InFlight>,
    /// A server-sent event stream (`text/event-stream`).
    pub(super) sse: Option<Box<Sse>>,
    /// As a request body with something in it: what became of the client's
    /// body when reading it failed ([`BodyFate`]): `canceled`, not `unknown`.
    body_fate: Option<Arc<AtomicU8>>,
    /// As a request body: fires when the client has sent nothing for
    /// [`BODY_IDLE`] while drainit waited for it (armed when a read finds
    /// nothing; time the app spends not reading does not count).
    stall: Option<Stall>,
    /// The upstream connection the response comes on (`upstream::Lease`):
    /// back to the pool when the body goes (after `inner`, so an unread body
    /// closes it first).
    pub(super) lease: Option<Held>,
    /// An HTTP/1 response's connection: its request is `completed` once
    /// the connection is flushed after the last frame, not when hyper takes it.
    pub(super) unflushed: Option<Arc<Unflushed>>,
    /// drainit's 503 to a `rejected` request: counted until written.
    pub(super) rejecting: Option<Rejecting>,
    /// As a request body sent on a reused connection: what of it went out, so
    /// the request can go once more if the app resets it unread
    /// (`upstream::Pool::send`).
    pub(super) copy: Option<Arc<BodyCopy>>,
    /// The client connection's count of requests being answered, one of them
    /// this response's until it is written (`serve.rs`, `Busy`): a connection
    /// with none is idle, and may make room at the connection cap.
    pub(super) busy: Option<Busy>,
}

/// What a body keeps until it goes, for its drop alone: the lease of the
/// upstream connection its response comes on (`upstream::Lease`), which the
/// body needs no more of than that.
pub(super) type Held = Box<dyn std::any::Any + Send + Sync>;

/// An SSE response body counted as a stream: ended between events at beat 3.
pub(super) struct Sse {
    /// Counts and unregisters the stream when the body goes.
    open: Open,
    /// drainit asked it to close: it ends at the next event boundary.
    closing: bool,
    /// The last bytes sent (up to 3), to find an event's end across frames.
    tail: Vec<u8>,
    /// Ended by drainit; the next poll ends the body.
    ended: bool,
}

impl Sse {
    /// An event stream counted by `open`, nothing sent yet.
    pub(super) fn new(open: Open) -> Sse {
        Sse {
            open,
            closing: false,
            tail: b"\n\n".to_vec(),
            ended: false,
        }
    }

    /// Ended by drainit at an event boundary.
    fn end(&mut self) {
        self.ended = true;
        self.open.end = StreamEnd::ClosedByDrain;
    }
}

/// An open stream (a tunnel, an event stream): counted in the ledger's
/// streams as `end` says and unregistered however its task or body ends
/// (dropped at the exit too: then `abandoned`). The stream's own ledger, not
/// a request's outcome.
pub(super) struct Open {
    shared: Arc<Shared>,
    /// How the stream ends if it ends now.
    pub(super) end: StreamEnd,
    pub(super) reg: Option<Registered>,
}

impl Open {
    pub(super) fn new(shared: Arc<Shared>, end: StreamEnd, reg: Registered) -> Open {
        Open {
            shared,
            end,
            reg: Some(reg),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.shared.ledger.stream_ended(self.end);
        drop(self.reg.take());
        self.shared.settled();
    }
}

/// What a body carries: drainit's own bytes, or the peer's as hyper reads them.
pub(super) enum Inner {
    Local(Full<Bytes>),
    Upstream(Incoming),
}

/// The body-stall timer of a request body ([`BODY_IDLE`]).
struct Stall {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// A read found nothing and the client has not sent since: `sleep` runs.
    waiting: bool,
}

/// What became of a request body that failed on its way to the app.
#[repr(u8)]
pub(super) enum BodyFate {
    /// Read whole, or still being read.
    Read = 0,
    /// The client went away mid-body.
    Gone = 1,
    /// The client sent nothing for [`BODY_IDLE`].
    Stalled = 2,
    /// The body turned out malformed (a bad chunk: hyper's parse error).
    Malformed = 3,
}

/// What one poll of a body gives hyper.
type Polled = Poll<Option<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>>>;

impl ProxyBody {
    /// A body with nothing to account for: drainit's own text, or the app's
    /// body passed through as it is.
    pub(super) fn plain(inner: Inner) -> ProxyBody {
        ProxyBody {
            inner,
            in_flight: None,
            sse: None,
            body_fate: None,
            stall: None,
            lease: None,
            unflushed: None,
            rejecting: None,
            copy: None,
            busy: None,
        }
    }

    pub(super) fn local(text: &'static str) -> ProxyBody {
        ProxyBody::plain(Inner::Local(Full::new(Bytes::from_static(text.as_bytes()))))
    }

    pub(super) fn text(text: String) -> ProxyBody {
        ProxyBody::plain(Inner::Local(Full::new(Bytes::from(text))))
    }

    /// The client's request body on its way to the app, and what will say
    /// how it failed if it does (`None` for an empty body: most requests have
    /// none, and get no allocation and no timer). An HTTP/1 body is cut after
    /// [`BODY_IDLE`] of silence; not an HTTP/2 one (`h2`), which may be a gRPC
    /// stream whose client is silent for minutes by design.
    pub(super) fn to_app(body: Incoming, h2: bool) -> (ProxyBody, Option<Arc<AtomicU8>>) {
        let mut up = ProxyBody::plain(Inner::Upstream(body));
        let fate = (!up.is_end_stream()).then(|| Arc::new(AtomicU8::new(BodyFate::Read as u8)));
        up.body_fate = fate.clone();
        if !h2 && fate.is_some() {
            up.stall = Some(Stall {
                sleep: Box::pin(tokio::time::sleep(BODY_IDLE)),
                waiting: false,
            });
        }
        (up, fate)
    }

    /// The response went out whole (`Completed`) or the app's body failed
    /// (`Unknown`): handed to the request's guard. An HTTP/1 response taken
    /// whole by hyper may not be written yet: completed when the connection
    /// is flushed ([`Unflushed`]; an SSE's request settled at its head).
    fn settle(&mut self, outcome: Outcome) {
        if let Some(request) = self.in_flight.take() {
            match &self.unflushed {
                Some(u) if outcome == Outcome::Completed => u.push(request, self.busy.take()),
                _ => request.record(outcome),
            }
        }
    }

    /// An SSE asked to close: ends the body where the bytes sent so far end an
    /// event (`Some`), or notes the close request for the next event's end.
    fn poll_sse_close(&mut self, cx: &mut Context<'_>) -> Option<Polled> {
        let sse = self.sse.as_mut()?;
        if sse.ended {
            return Some(Poll::Ready(None));
        }
        if !sse.closing
            && let Some(reg) = &mut sse.open.reg
            && Pin::new(&mut reg.close).poll(cx).is_ready()
        {
            sse.closing = true;
        }
        if sse.closing && streams::last_event_end(&sse.tail) == Some(sse.tail.len()) {
            sse.end();
            return Some(Poll::Ready(None));
        }
        None
    }

    /// A request body's stall timer: armed when a read finds nothing, and,
    /// once [`BODY_IDLE`] passed without a byte, the body fails (`Some`).
    fn poll_stall(&mut self, polled: &Polled, cx: &mut Context<'_>) -> Option<Polled> {
        let stall = self.stall.as_mut()?;
        match polled {
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
        if !(stall.waiting && stall.sleep.as_mut().poll(cx).is_ready()) {
            return None;
        }
        if let Some(fate) = &self.body_fate {
            fate.store(BodyFate::Stalled as u8, Relaxed);
        }
        self.stall = None;
        Some(Poll::Ready(Some(Err(format!(
            "the client sent nothing of its body for {} s",
            BODY_IDLE.as_secs()
        )
        .into()))))
    }

    /// A request body that may go again: keeps what went out.
    fn keep_copy(&self, polled: &Polled) {
        let Some(copy) = &self.copy else {
            return;
        };
        match polled {
            Poll::Ready(Some(Ok(f))) => match f.data_ref() {
                Some(data) => {
                    copy.push(data);
                    if self.is_end_stream() {
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

    /// An SSE asked to close whose frame ends an event: the frame cut there,
    /// the body's last (`Some`); otherwise the frame's tail is kept to find
    /// an event's end across frames.
    fn cut_sse_at_event(&mut self, polled: &Polled) -> Option<Polled> {
        let (Some(sse), Poll::Ready(Some(Ok(frame)))) = (&mut self.sse, polled) else {
            return None;
        };
        let data = frame.data_ref()?;
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
            sse.end();
            return Some(Poll::Ready(Some(Ok(Frame::data(data.slice(..end))))));
        }
        sse.tail = if data.len() >= 3 {
            data[data.len() - 3..].to_vec()
        } else {
            seam[seam.len().saturating_sub(3)..].to_vec()
        };
        None
    }

    /// What this poll decides of the request: its last frame went out
    /// (`completed`), or the body failed (`unknown`; a request body's
    /// failure is the client's, noted in its [`BodyFate`]).
    fn settle_on(&mut self, polled: &Polled) {
        if let (Some(fate), Poll::Ready(Some(Err(e)))) = (&self.body_fate, polled) {
            let why = if is_malformed(&**e) {
                BodyFate::Malformed
            } else {
                BodyFate::Gone
            };
            fate.store(why as u8, Relaxed);
        }
        match polled {
            Poll::Ready(None) => self.settle(Outcome::Completed),
            Poll::Ready(Some(Err(_))) => self.settle(Outcome::Unknown),
            // Trailers are a body's last frame, and hyper's HTTP/1 server asks
            // for nothing after them (the body's own end is never seen).
            Poll::Ready(Some(Ok(f))) if f.is_trailers() || self.is_end_stream() => {
                self.settle(Outcome::Completed);
            }
            _ => {}
        }
    }
}

/// Whether a client's body failed because it is malformed: hyper's HTTP/1
/// body decoder says so with an `InvalidData` or `InvalidInput` I/O error (a
/// bad chunk size, a missing CRLF), where a client gone gives
/// `UnexpectedEof` or a reset.
fn is_malformed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            );
        }
        cause = c.source();
    }
    false
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        if let Some(ended) = this.poll_sse_close(cx) {
            return ended;
        }
        let polled = match &mut this.inner {
            Inner::Local(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {}),
            Inner::Upstream(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        };
        if let Some(stalled) = this.poll_stall(&polled, cx) {
            return stalled;
        }
        this.keep_copy(&polled);
        if let Some(last) = this.cut_sse_at_event(&polled) {
            return last;
        }
        this.settle_on(&polled);
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
    /// A body hyper never had to poll (HEAD, 204, 304, empty) reached the
    /// client whole: `completed` is decided here. Anything else dropped early
    /// was the client going away (or drainit cutting it): the request's guard,
    /// dropped with this body, records that.
    fn drop(&mut self) {
        if self.is_end_stream() {
            self.settle(Outcome::Completed);
        }
    }
}

/// The largest request body kept while its response head is awaited on a
/// reused connection ([`BodyCopy`]); a longer one is never sent twice. The
/// same bound as the body drainit reads before its own 503.
pub const RESEND_BODY_MAX: usize = 64 * 1024;

/// What of a request body went out on a reused connection (its frames, shared,
/// not copied), up to [`RESEND_BODY_MAX`], so that the request can go once
/// more if the app resets the connection with it unread (`upstream::Pool::send`).
/// Given up once the response head came.
#[derive(Default)]
pub struct BodyCopy(Mutex<CopyState>);

#[derive(Default)]
struct CopyState {
    frames: Vec<Bytes>,
    len: usize,
    /// The body's end was seen: `frames` hold all of it.
    whole: bool,
    /// Too long, trailers, a read error, or no longer needed: never resent.
    spoiled: bool,
}

impl BodyCopy {
    /// Keeps `data`, the body's next bytes, unless the body is now longer than
    /// [`RESEND_BODY_MAX`].
    pub fn push(&self, data: &Bytes) {
        let mut s = self.lock();
        if s.spoiled {
            return;
        }
        s.len += data.len();
        if s.len > RESEND_BODY_MAX {
            s.spoiled = true;
            s.frames = Vec::new();
        } else {
            s.frames.push(data.clone());
        }
    }

    /// The body ended: what was kept is all of it.
    pub fn end(&self) {
        self.lock().whole = true;
    }

    /// Keeps nothing more, and the request is not sent twice.
    pub fn spoil(&self) {
        let mut s = self.lock();
        s.spoiled = true;
        s.frames = Vec::new();
    }

    /// The whole body, if its end was seen and it was kept.
    pub(super) fn whole(&self) -> Option<Bytes> {
        let s = self.lock();
        if !s.whole || s.spoiled {
            return None;
        }
        let mut all = bytes::BytesMut::with_capacity(s.len);
        for f in &s.frames {
            all.extend_from_slice(f);
        }
        Some(all.freeze())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CopyState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
