//! The least an HTTP/1.1 reverse proxy of its own would do per request, without
//! hyper: heads parsed with httparse both ways, hop-by-hop fields dropped,
//! `X-Forwarded-For` added, kept-alive app connections pooled, `Content-Length`
//! bodies only, two counters standing for a ledger. Not drainit and not for use
//! (no chunked bodies, upgrades, timeouts or errors worth the name): it bounds
//! what replacing hyper could save (bench/README.md, "proxy.sh").
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

static RECEIVED: AtomicU64 = AtomicU64::new(0);
static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// A head to send on: its length in the buffer, the body length after it, and
/// the rewritten head.
struct Head {
    len: usize,
    body: usize,
    out: Vec<u8>,
    /// The client sent `Connection: close`.
    close: bool,
}

fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// Copies the end-to-end fields, finds `Content-Length`, adds `xff` if any.
fn fields(headers: &[httparse::Header<'_>], xff: Option<&str>, out: &mut Vec<u8>) -> Option<usize> {
    let mut body = 0;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            body = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
        }
        if !hop_by_hop(h.name) {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(ip) = xff {
        out.extend_from_slice(b"x-forwarded-for: ");
        out.extend_from_slice(ip.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Some(body)
}

/// A whole request head in `buf`, rewritten; `None` while partial or invalid.
fn request(buf: &[u8], xff: &str) -> Option<Head> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Request::new(&mut hs);
    let httparse::Status::Complete(len) = r.parse(buf).ok()? else {
        return None;
    };
    let mut out = Vec::with_capacity(len + 64);
    out.extend_from_slice(r.method?.as_bytes());
    out.push(b' ');
    out.extend_from_slice(r.path?.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let body = fields(r.headers, Some(xff), &mut out)?;
    let close = r.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close")
    });
    Some(Head {
        len,
        body,
        out,
        close,
    })
}

/// A whole response head in `buf`, rewritten; `None` while partial or invalid.
fn response(buf: &[u8]) -> Option<Head> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    let httparse::Status::Complete(len) = r.parse(buf).ok()? else {
        return None;
    };
    let mut out = Vec::with_capacity(len + 16);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", r.code?, r.reason.unwrap_or("")).as_bytes(),
    );
    let body = fields(r.headers, None, &mut out)?;
    Some(Head {
        len,
        body,
        out,
        close: false,
    })
}

/// Reads until `parse` finds a head and its body is in `buf` too.
async fn read_message(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Option<Head>,
) -> Option<Head> {
    loop {
        if let Some(h) = parse(buf) {
            while buf.len() < h.len + h.body {
                read_more(s, buf).await?;
            }
            return Some(h);
        }
        read_more(s, buf).await?;
    }
}

/// One read into `buf`; `None` at the end of the stream or on an error.
async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let at = buf.len();
    buf.resize(at + 8192, 0);
    let n = s.read(&mut buf[at..]).await.ok()?;
    buf.truncate(at + n);
    (n > 0).then_some(())
}

type Pool = Rc<RefCell<Vec<TcpStream>>>;

async fn connection(mut c: TcpStream, upstream: SocketAddr, pool: Pool) -> Option<()> {
    let xff = c.peer_addr().ok()?.ip().to_string();
    let (mut cbuf, mut ubuf) = (Vec::with_capacity(8192), Vec::with_capacity(8192));
    loop {
        let req = read_message(&mut c, &mut cbuf, |b| request(b, &xff)).await?;
        RECEIVED.fetch_add(1, Relaxed);
        let pooled = pool.borrow_mut().pop();
        let mut u = match pooled {
            Some(u) => u,
            None => {
                let u = TcpStream::connect(upstream).await.ok()?;
                u.set_nodelay(true).ok()?;
                u
            }
        };
        let mut out = req.out;
        out.extend_from_slice(&cbuf[req.len..req.len + req.body]);
        cbuf.drain(..req.len + req.body);
        u.write_all(&out).await.ok()?;
        ubuf.clear();
        let resp = read_message(&mut u, &mut ubuf, response).await?;
        let mut out = resp.out;
        out.extend_from_slice(&ubuf[resp.len..resp.len + resp.body]);
        c.write_all(&out).await.ok()?;
        COMPLETED.fetch_add(1, Relaxed);
        pool.borrow_mut().push(u);
        if req.close {
            return Some(());
        }
    }
}

fn main() {
    let (listen, upstream) = drainit_bench_floor::addresses();
    let pool: Pool = Rc::default();
    drainit_bench_floor::run(drainit_bench_floor::accept(listen, move |c, _| {
        connection(c, upstream, pool.clone())
    }));
}
