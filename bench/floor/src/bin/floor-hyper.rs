//! The least a reverse proxy built on hyper and tokio does per request, the
//! crates drainit keeps for HTTP (DESIGN §11, "Cost"): hyper's HTTP/1 server for
//! the client, hyper's HTTP/1 client over pooled kept-alive app connections
//! (last in, first out), hop-by-hop fields dropped both ways, `X-Forwarded-For`
//! added, bodies passed through as hyper's own `Incoming`, two counters standing
//! for a ledger. Not drainit and not for use (no admission, drain, timeouts,
//! resend or error pages worth the name): it bounds what drainit's proxy can
//! reach while hyper and tokio stay (bench/README.md, "proxy.sh").
use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

static RECEIVED: AtomicU64 = AtomicU64::new(0);
static COMPLETED: AtomicU64 = AtomicU64::new(0);

type Pool = Rc<RefCell<Vec<SendRequest<Incoming>>>>;
type Body = Either<Incoming, Empty<Bytes>>;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// RFC 9110 §7.6.1: fields for one connection only, not forwarded.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    for n in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::TE,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
}

/// An idle app connection ready for a request, the last one put back first, or
/// a new one.
async fn sender(pool: &Pool, upstream: SocketAddr) -> Option<SendRequest<Incoming>> {
    {
        let mut idle = pool.borrow_mut();
        idle.retain(|s| !s.is_closed());
        if let Some(i) = idle.iter().rposition(SendRequest::is_ready) {
            return Some(idle.swap_remove(i));
        }
    }
    let tcp = TcpStream::connect(upstream).await.ok()?;
    let _ = tcp.set_nodelay(true);
    let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    Some(s)
}

async fn forward(
    mut req: Request<Incoming>,
    xff: HeaderValue,
    pool: Pool,
    upstream: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    RECEIVED.fetch_add(1, Relaxed);
    strip_hop_by_hop(req.headers_mut());
    req.headers_mut().append(X_FORWARDED_FOR, xff);
    let bad_gateway = || {
        let mut r = Response::new(Either::Right(Empty::new()));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        Ok(r)
    };
    let Some(mut s) = sender(&pool, upstream).await else {
        return bad_gateway();
    };
    let Ok(resp) = s.send_request(req).await else {
        return bad_gateway();
    };
    // Back in the pool at once: it takes the next request once this body ended.
    pool.borrow_mut().push(s);
    COMPLETED.fetch_add(1, Relaxed);
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Either::Left(body)))
}

fn main() {
    let (listen, upstream) = drainit_bench_floor::addresses();
    let pool: Pool = Rc::default();
    drainit_bench_floor::run(drainit_bench_floor::accept(listen, move |c, peer| {
        let pool = pool.clone();
        let xff = HeaderValue::from_str(&peer.ip().to_string()).expect("an address");
        async move {
            let service = hyper::service::service_fn(move |req| {
                forward(req, xff.clone(), pool.clone(), upstream)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(c), service)
                .await;
        }
    }));
}
