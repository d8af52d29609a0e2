//! The client's socket as hyper sees it: its first bytes read to tell HTTP/2's
//! preface from an HTTP/1 request line ([`sniff`]), then read again
//! ([`Rewind`]), each byte written and each successful flush reported to the
//! connection's [`Unflushed`] requests (a response is `completed` once the
//! client's TCP acknowledged its last byte), and closed with a lingering
//! close ([`linger`], RFC 9112 §9.6) that keeps the connection's place under
//! the connection cap ([`Slot`]) until the socket is closed.
//!
//! Must not: parse HTTP (hyper does), or count anything but through
//! [`Unflushed`].

use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use super::outcome::{Unflushed, unacked};

/// The client connection preface of HTTP/2 (RFC 9113 §3.4): a connection that
/// opens with it speaks HTTP/2 with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a new connection's first bytes until they tell HTTP/2's preface from
/// an HTTP/1 request line (one byte for most methods). `Ok(None)`: the client
/// closed first. The bytes read are returned to be replayed ([`Rewind`]).
pub(super) async fn sniff(
    tcp: &mut tokio::net::TcpStream,
) -> std::io::Result<Option<(bool, Vec<u8>)>> {
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
/// go straight to the socket (vectored writes too). For the app-side
/// [`super::upstream`] wrapper ([`Rewind`] counts its writes: its own impl). With a
/// function after the type, it is called with the wrapper after each flush
/// that succeeded.
macro_rules! write_through_tcp {
    ($wrapper:ty) => {
        $crate::socket::write_through_tcp!($wrapper, |_w: &mut $wrapper| {});
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
pub(super) use write_through_tcp;

/// A client connection's place among the [`super::connection_cap`] served at once:
/// held by the connection, and by the tunnel of an upgrade (a WebSocket keeps
/// the client's and the app's descriptors open after hyper let the connection go).
pub(super) type Slot = Arc<tokio::sync::OwnedSemaphorePermit>;

/// A connection whose first bytes were read by [`sniff`]: they are read again
/// first, then the socket. Dropped (hyper let the connection go, or its
/// upgrade's tunnel ended), it closes with a lingering close ([`linger`]).
pub(super) struct Rewind {
    pre: Bytes,
    tcp: tokio::net::TcpStream,
    /// HTTP/1: the requests whose response is written whole once hyper's
    /// next flush succeeds and the client acknowledged it.
    unflushed: Option<Arc<Unflushed>>,
    /// The connection's place under the connection cap: held by the linger
    /// too, so that lingering sockets count against the descriptors the cap
    /// leaves the proxy.
    slot: Option<Slot>,
}

impl Rewind {
    /// `tcp` after [`sniff`] read `pre` from it; `unflushed` for HTTP/1;
    /// `slot` its place under the connection cap.
    pub(super) fn new(
        pre: Bytes,
        tcp: tokio::net::TcpStream,
        unflushed: Option<Arc<Unflushed>>,
        slot: Option<Slot>,
    ) -> Rewind {
        if let Some(u) = &unflushed {
            u.set_socket(Some(tcp.as_raw_fd()));
        }
        Rewind {
            pre,
            tcp,
            unflushed,
            slot,
        }
    }

    /// hyper flushed: its write buffer was empty, every byte of the
    /// responses it took whole is in the kernel's hands.
    fn flushed(&mut self) {
        if let Some(u) = &self.unflushed {
            u.flushed();
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
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Some(u) = &self.unflushed {
            match &r {
                Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                    u.closed_by_peer();
                }
                Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    u.reset_by_peer();
                }
                _ => {}
            }
        }
        r
    }
}

/// Tells `unflushed` that a write failed with `ECONNRESET`: the client reset
/// the connection.
fn note_reset<T>(r: &Poll<std::io::Result<T>>, unflushed: Option<&Unflushed>) {
    if let (Poll::Ready(Err(e)), Some(u)) = (r, unflushed)
        && e.kind() == std::io::ErrorKind::ConnectionReset
    {
        u.reset_by_peer();
    }
}

impl tokio::io::AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(u)) = (&r, &self.unflushed) {
            u.wrote(*n);
        }
        note_reset(&r, self.unflushed.as_deref());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(u)) = (&r, &self.unflushed) {
            u.wrote(*n);
        }
        note_reset(&r, self.unflushed.as_deref());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.tcp).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            self.flushed();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Drop for Rewind {
    /// The lingering close of RFC 9112 §9.6: the socket is closed only after
    /// [`linger`], on a second descriptor of it (this one is closed now, the
    /// socket stays open with the second).
    fn drop(&mut self) {
        if let Some(u) = &self.unflushed {
            u.set_socket(None);
        }
        let second = self
            .tcp
            .as_fd()
            .try_clone_to_owned()
            .map(std::net::TcpStream::from);
        match (second, tokio::runtime::Handle::try_current()) {
            (Ok(second), Ok(runtime)) => {
                let unflushed = self.unflushed.take();
                let slot = self.slot.take();
                // Only the task knows when the socket can close: at drainit's
                // exit the runtime drops it, and its responses still waiting
                // are `abandoned`.
                drop(runtime.spawn(async move {
                    linger(second, unflushed).await;
                    drop(slot);
                }));
            }
            _ => {
                if let Some(u) = &self.unflushed {
                    u.give_up();
                }
            }
        }
    }
}

/// How long a closed client connection lingers at most ([`linger`]): time for
/// a client to read the end of a large response at a slow pace.
pub const LINGER: Duration = Duration::from_secs(5);

/// The lingering close (RFC 9112 §9.6): the writing side is shut (the client
/// reads to the end, then EOF), and what the client still sends (a pipelined
/// request hyper will not read, a body) is read and discarded until the
/// client has acknowledged every byte drainit sent and nothing more waits to
/// be read, or the client closes, or [`LINGER`] passes. Closed at once with
/// unread input, the kernel would answer with a reset and discard what it had
/// not sent yet; closed once the client acknowledged everything, a reset
/// (the client sends more later) costs the client nothing it was sent. An
/// idle connection (nothing unacknowledged, nothing unread) closes at once.
/// Meanwhile the responses waiting for the client's acknowledgement are
/// checked; the ones still waiting at the end are `canceled`.
async fn linger(tcp: std::net::TcpStream, unflushed: Option<Arc<Unflushed>>) {
    let _ = tcp.shutdown(std::net::Shutdown::Write);
    let Ok(tcp) = tokio::net::TcpStream::from_std(tcp) else {
        if let Some(u) = &unflushed {
            u.give_up();
        }
        return;
    };
    if let Some(u) = &unflushed {
        u.set_socket(Some(tcp.as_raw_fd()));
    }
    let until = tokio::time::Instant::now() + LINGER;
    let mut discard = [0u8; 4096];
    let mut wait = Duration::from_millis(1);
    loop {
        // Read what waits, to the end: `None` once the client closed (or
        // the socket failed).
        let drained = loop {
            match tcp.try_read(&mut discard) {
                Ok(0) => {
                    if let Some(u) = &unflushed {
                        u.closed_by_peer();
                    }
                    break None;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Some(()),
                Err(e) => {
                    if let (Some(u), std::io::ErrorKind::ConnectionReset) = (&unflushed, e.kind()) {
                        u.reset_by_peer();
                    }
                    break None;
                }
            }
        };
        let delivered = unflushed.as_ref().is_none_or(|u| u.deliver());
        if drained.is_none() || (delivered && unacked(tcp.as_raw_fd()) == Some(0)) {
            break;
        }
        tokio::select! {
            _ = tcp.readable() => {}
            () = tokio::time::sleep(wait) => wait = (wait * 2).min(Duration::from_millis(50)),
            () = tokio::time::sleep_until(until) => break,
        }
    }
    if let Some(u) = &unflushed {
        u.deliver();
        u.give_up();
    }
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
                let mut io = Rewind::new(Bytes::from(pre), tcp, None, None);
                let mut again = Vec::new();
                io.read_to_end(&mut again).await.unwrap();
                assert_eq!(again, all);
            }
        }
    }
}
