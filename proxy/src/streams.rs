//! Streams through the proxy (docs/proxy.md, "Streams"): upgraded connections (WebSocket)
//! and streaming responses (server-sent events) never "finish", so at beat 3
//! drainit closes them itself, spread evenly over `--stream-spread`, so that
//! their clients reconnect elsewhere a few at a time instead of all at once.
//!
//! Owns: the set of open streams and the order they are closed in; the
//! WebSocket tunnel, which closes a connection with a close frame (1001, going
//! away, RFC 6455 §7.4.1) placed at a frame boundary in each direction; and the
//! event boundary of an SSE body (an event ends at a blank line, WHATWG HTML
//! §9.2.6), where such a stream is ended.
//!
//! Must not: decide when the drain moves on. The proxy counts a stream as
//! open until it ends; the supervisor's wait for "no request in flight" includes
//! them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

/// The open streams, each with the sender that asks it to close.
#[derive(Default)]
pub struct StreamSet {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Every stream until it ends, with the sender that asks it to close until
    /// that is sent (a stream asked to close is still open while it closes).
    open: HashMap<u64, Option<oneshot::Sender<()>>>,
    /// Set at beat 3: streams opened after it are closed at once.
    closing: bool,
}

/// A registered stream: dropping it unregisters it.
pub struct Registered {
    set: Arc<StreamSet>,
    id: u64,
    /// Yields when drainit asks the stream to close.
    pub close: oneshot::Receiver<()>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.set.lock().open.remove(&self.id);
    }
}

impl StreamSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new stream. After [`StreamSet::close_all`] began, its close
    /// request is already sent.
    pub fn register(self: &Arc<Self>) -> Registered {
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        let id = g.next;
        g.next += 1;
        if g.closing {
            let _ = tx.send(());
            g.open.insert(id, None);
        } else {
            g.open.insert(id, Some(tx));
        }
        drop(g);
        Registered {
            set: self.clone(),
            id,
            close: rx,
        }
    }

    /// How many streams are open: registered and not yet dropped, including
    /// those asked to close and still closing.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// Beat 3: asks every open stream to close, one at a time, evenly over
    /// `spread` (all at once when zero); streams opened meanwhile close at once.
    pub async fn close_all(&self, spread: Duration) {
        let mut ids: Vec<u64> = {
            let mut g = self.lock();
            g.closing = true;
            g.open.keys().copied().collect()
        };
        ids.sort_unstable(); // oldest first
        let n = ids.len();
        if n == 0 {
            return;
        }
        let start = tokio::time::Instant::now();
        for (i, id) in ids.into_iter().enumerate() {
            let at = start + spread.mul_f64(i as f64 / n as f64);
            tokio::time::sleep_until(at).await;
            if let Some(tx) = self.lock().open.get_mut(&id).and_then(Option::take) {
                let _ = tx.send(());
            }
        }
    }
}

/// How a WebSocket byte stream stands with respect to frame boundaries
/// (RFC 6455 §5.2): fed every byte that passes, it knows whether the last one
/// ended a frame.
#[derive(Default, Clone, Debug)]
pub struct FrameCursor {
    /// Header bytes seen of the current frame (up to 14).
    header: [u8; 14],
    have: usize,
    /// Payload bytes still to pass once the header is complete.
    payload_left: u64,
    in_payload: bool,
}

impl FrameCursor {
    /// The header's full length, once its first two bytes are known.
    fn header_len(&self) -> Option<usize> {
        if self.have < 2 {
            return None;
        }
        let masked = self.header[1] & 0x80 != 0;
        let ext = match self.header[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        Some(2 + ext + if masked { 4 } else { 0 })
    }

    fn payload_len(&self) -> u64 {
        match self.header[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
            127 => u64::from_be_bytes(self.header[2..10].try_into().expect("8 bytes")),
            n => u64::from(n),
        }
    }

    /// Passes `buf` through the cursor.
    pub fn feed(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() {
            if self.in_payload {
                let take = self.payload_left.min(buf.len() as u64);
                self.payload_left -= take;
                buf = &buf[take as usize..];
                if self.payload_left == 0 {
                    self.in_payload = false;
                    self.have = 0;
                }
                continue;
            }
            self.header[self.have] = buf[0];
            self.have += 1;
            buf = &buf[1..];
            if let Some(len) = self.header_len()
                && self.have == len
            {
                self.payload_left = self.payload_len();
                self.in_payload = self.payload_left > 0;
                if !self.in_payload {
                    self.have = 0;
                }
            }
        }
    }

    /// Whether the bytes so far end exactly at a frame boundary.
    pub fn at_boundary(&self) -> bool {
        !self.in_payload && self.have == 0
    }
}

/// A close frame with status 1001 (going away), unmasked (server to client).
const CLOSE_TO_CLIENT: [u8; 4] = [0x88, 0x02, 0x03, 0xe9];
/// The same, masked as a client must send it (RFC 6455 §5.3), to the app; the
/// mask key is fixed (it protects against cache poisoning by scripts, which a
/// frame drainit writes itself cannot be).
const CLOSE_TO_APP: [u8; 8] = [0x88, 0x82, 0x12, 0x34, 0x56, 0x78, 0x03 ^ 0x12, 0xe9 ^ 0x34];
/// After its close frames, a closed WebSocket gets this long for the peers'
/// close frames before both connections are shut.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// A frame that does not end within this long of the close request is cut
/// mid-frame.
pub const BOUNDARY_WAIT: Duration = Duration::from_secs(2);

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The peers ended it: both sides ended their half, or one failed.
    ByPeer,
    /// drainit closed it at beat 3.
    ByDrain,
}

/// Copies both halves of an upgraded connection until both sides have ended
/// (one side's end, a half-close, is passed on to the other, whose answer
/// still flows back until it ends too) or either fails (a read or write
/// error), or until `close` yields; then, for a WebSocket (`websocket`), a
/// close frame (1001) goes each way at a frame boundary (not to a side
/// already passed the other's end) before both are shut; any other upgrade is
/// shut as is.
///
/// Once asked to close, it ends within [`CLOSE_LIMIT`] whatever the peers do: a
/// peer that stops reading blocks a write, and must not hold the drain (and the
/// app's drain signal) until the deadline.
pub async fn tunnel<C, A>(
    client: C,
    app: A,
    websocket: bool,
    close: &mut oneshot::Receiver<()>,
) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    A: AsyncRead + AsyncWrite + Unpin,
{
    let (relay, mut inner) = oneshot::channel();
    let limit = async {
        // A dropped sender is no close request: wait for the tunnel instead.
        if (&mut *close).await.is_err() {
            std::future::pending::<()>().await;
        }
        let _ = relay.send(());
        tokio::time::sleep(CLOSE_LIMIT).await;
    };
    tokio::select! {
        ended = copy(client, app, websocket, &mut inner) => ended,
        () = limit => Ended::ByDrain,
    }
}

/// How long a tunnel asked to close may take at most: the wait for a frame
/// boundary, the grace for the peers' close frames, and a margin.
pub const CLOSE_LIMIT: Duration = BOUNDARY_WAIT
    .saturating_add(CLOSE_GRACE)
    .saturating_add(Duration::from_millis(500));

/// Which halves of a tunnel are done: a side `*_closed` gets nothing more
/// (its close frame sent, or the other side ended), a side `*_ended` sent its
/// end (EOF).
#[derive(Default)]
struct Sides {
    client_closed: bool,
    app_closed: bool,
    client_ended: bool,
    app_ended: bool,
}

async fn copy<C, A>(client: C, app: A, websocket: bool, close: &mut oneshot::Receiver<()>) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    A: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ar, mut aw) = tokio::io::split(app);
    let mut to_app = FrameCursor::default();
    let mut to_client = FrameCursor::default();
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut abuf = vec![0u8; 16 * 1024];
    let mut closing: Option<tokio::time::Instant> = None;
    // A side that ended its half (EOF): the other side's writer was shut
    // after it, and what that side still sends flows on until it ends too.
    let mut s = Sides::default();
    loop {
        if let Some(since) = closing {
            let due = since.elapsed() >= BOUNDARY_WAIT;
            if !websocket || due {
                break;
            }
            let ends = (&mut cr, &mut cw, &mut ar, &mut aw);
            if send_close_frames(ends, &to_client, &to_app, &mut s).await {
                break;
            }
        }
        let boundary_due = closing.map(|s| s + BOUNDARY_WAIT);
        tokio::select! {
            _ = &mut *close, if closing.is_none() => {
                closing = Some(tokio::time::Instant::now());
            }
            r = cr.read(&mut cbuf), if !s.app_closed => match r {
                Ok(0) => {
                    let _ = aw.shutdown().await;
                    s.client_ended = true;
                    // Nothing more goes to the app: no close frame either.
                    s.app_closed = true;
                    if s.app_ended {
                        return ended_by(closing);
                    }
                }
                Err(_) => {
                    let _ = aw.shutdown().await;
                    return ended_by(closing);
                }
                Ok(n) => {
                    to_app.feed(&cbuf[..n]);
                    if aw.write_all(&cbuf[..n]).await.is_err() {
                        return ended_by(closing);
                    }
                }
            },
            r = ar.read(&mut abuf), if !s.client_closed => match r {
                Ok(0) => {
                    let _ = cw.shutdown().await;
                    s.app_ended = true;
                    // Nothing more goes to the client: no close frame either.
                    s.client_closed = true;
                    if s.client_ended {
                        return ended_by(closing);
                    }
                }
                Err(_) => {
                    let _ = cw.shutdown().await;
                    return ended_by(closing);
                }
                Ok(n) => {
                    to_client.feed(&abuf[..n]);
                    if cw.write_all(&abuf[..n]).await.is_err() {
                        return ended_by(closing);
                    }
                }
            },
            () = async {
                match boundary_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
    let _ = cw.shutdown().await;
    let _ = aw.shutdown().await;
    Ended::ByDrain
}

/// A WebSocket tunnel asked to close: sends each side still open its close
/// frame once the bytes to it stand at a frame boundary; once both are sent,
/// waits up to [`CLOSE_GRACE`] for the peers' close frames (or their end).
/// Returns whether the tunnel is done (both close frames sent).
async fn send_close_frames<CR, CW, AR, AW>(
    (cr, cw, ar, aw): (&mut CR, &mut CW, &mut AR, &mut AW),
    to_client: &FrameCursor,
    to_app: &FrameCursor,
    s: &mut Sides,
) -> bool
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    AR: AsyncRead + Unpin,
    AW: AsyncWrite + Unpin,
{
    if !s.client_closed && to_client.at_boundary() {
        let _ = cw.write_all(&CLOSE_TO_CLIENT).await;
        let _ = cw.flush().await;
        s.client_closed = true;
    }
    if !s.app_closed && to_app.at_boundary() {
        let _ = aw.write_all(&CLOSE_TO_APP).await;
        let _ = aw.flush().await;
        s.app_closed = true;
    }
    if !(s.client_closed && s.app_closed) {
        return false;
    }
    // The peers' close frames (or their end) within the grace.
    let (client_ended, app_ended) = (s.client_ended, s.app_ended);
    let wait = async {
        let (mut b1, mut b2) = ([0u8; 512], [0u8; 512]);
        loop {
            tokio::select! {
                r = cr.read(&mut b1), if !client_ended => if matches!(r, Ok(0) | Err(_)) { break },
                r = ar.read(&mut b2), if !app_ended => if matches!(r, Ok(0) | Err(_)) { break },
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, wait).await;
    true
}

/// How a tunnel that ends now ended: by the drain once it asked the tunnel to
/// close (`closing`), else by its peers.
fn ended_by(closing: Option<tokio::time::Instant>) -> Ended {
    if closing.is_some() {
        Ended::ByDrain
    } else {
        Ended::ByPeer
    }
}

/// Where an SSE body may be ended: the end of the last complete event in
/// `data` (after a blank line), if any.
pub fn last_event_end(data: &[u8]) -> Option<usize> {
    let mut end = None;
    let mut i = 0;
    while i + 1 < data.len() {
        if data[i] == b'\n' && data[i + 1] == b'\n' {
            end = Some(i + 2);
            i += 2;
            continue;
        }
        if i + 3 < data.len() && &data[i..i + 4] == b"\r\n\r\n" {
            end = Some(i + 4);
            i += 4;
            continue;
        }
        i += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: usize, masked: bool) -> Vec<u8> {
        let mut f = vec![0x81];
        let m = if masked { 0x80 } else { 0 };
        match payload {
            0..=125 => f.push(m | payload as u8),
            126..=65535 => {
                f.push(m | 126);
                f.extend_from_slice(&(payload as u16).to_be_bytes());
            }
            _ => {
                f.push(m | 127);
                f.extend_from_slice(&(payload as u64).to_be_bytes());
            }
        }
        if masked {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
        f.extend(std::iter::repeat_n(b'x', payload));
        f
    }

    #[test]
    fn the_cursor_knows_frame_boundaries_whatever_the_split() {
        let mut stream = Vec::new();
        let mut ends = Vec::new();
        for (len, masked) in [
            (5, false),
            (0, true),
            (300, true),
            (70000, false),
            (125, false),
        ] {
            stream.extend(frame(len, masked));
            ends.push(stream.len());
        }
        for chunk in [1, 3, 7, 1000, stream.len()] {
            let mut c = FrameCursor::default();
            let mut pos = 0;
            for piece in stream.chunks(chunk) {
                c.feed(piece);
                pos += piece.len();
                assert_eq!(
                    c.at_boundary(),
                    ends.contains(&pos),
                    "chunk {chunk}, at {pos}"
                );
            }
        }
    }

    #[test]
    fn an_sse_body_ends_after_a_blank_line() {
        assert_eq!(last_event_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(last_event_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(last_event_end(b"data: a\n"), None);
        assert_eq!(last_event_end(b"data: a\n\ndata: b\n\n"), Some(18));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_to_a_client_that_does_not_read_ends_soon_after_the_close_request() {
        // The client never reads: the app's frames fill the pipe and the copy
        // blocks in a write; the close request must still end the tunnel.
        let (client, _client_peer) = tokio::io::duplex(1024);
        let (app, mut app_peer) = tokio::io::duplex(1024);
        let (tx, mut rx) = oneshot::channel();
        let flood = tokio::spawn(async move {
            let f = frame(100, false);
            while app_peer.write_all(&f).await.is_ok() {}
        });
        let start = tokio::time::Instant::now();
        let closer = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(());
        };
        let (ended, ()) = tokio::join!(tunnel(client, app, true, &mut rx), closer);
        assert_eq!(ended, Ended::ByDrain);
        assert!(
            start.elapsed() <= Duration::from_millis(100) + CLOSE_LIMIT,
            "{:?}",
            start.elapsed()
        );
        flood.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_asked_to_close_is_open_until_it_ends() {
        // The drain waits for no stream open: one still sending its close frame
        // (or blocked on a client that does not read) must count.
        let set = Arc::new(StreamSet::default());
        let mut a = set.register();
        let b = set.register();
        set.close_all(Duration::ZERO).await;
        assert!(a.close.try_recv().is_ok());
        assert_eq!(set.open(), 2);
        let late = set.register();
        assert_eq!(set.open(), 3, "opened after beat 3 and closing at once");
        drop((a, b, late));
        assert_eq!(set.open(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn streams_are_closed_evenly_over_the_spread() {
        let set = Arc::new(StreamSet::default());
        let regs: Vec<_> = (0..4).map(|_| set.register()).collect();
        let start = tokio::time::Instant::now();
        let closer = set.close_all(Duration::from_secs(8));
        let waits = async {
            let mut at = Vec::new();
            for mut r in regs {
                let _ = (&mut r.close).await;
                at.push(start.elapsed().as_secs());
            }
            at
        };
        let ((), at) = tokio::join!(closer, waits);
        assert_eq!(at, [0, 2, 4, 6]);
        assert_eq!(set.open(), 0, "each ended when its registration went");
        // Opened after beat 3: closed at once.
        let mut late = set.register();
        assert!(late.close.try_recv().is_ok());
    }
}
