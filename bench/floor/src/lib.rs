//! Shared by the reference proxies: the `--proxy LISTEN=UPSTREAM` argument
//! (the rest of a drainit command line is ignored), a one-thread runtime, as
//! drainit's proxy thread has, and the accept loop.

use std::future::Future;
use std::net::SocketAddr;

/// `--proxy LISTEN=UPSTREAM` from the command line.
///
/// # Panics
/// When the argument is missing or not two `IP:PORT` addresses.
pub fn addresses() -> (SocketAddr, SocketAddr) {
    let args: Vec<String> = std::env::args().collect();
    let at = args
        .iter()
        .position(|a| a == "--proxy")
        .expect("--proxy LISTEN=UPSTREAM");
    let (listen, upstream) = args[at + 1].split_once('=').expect("LISTEN=UPSTREAM");
    (
        listen.parse().expect("LISTEN"),
        upstream.parse().expect("UPSTREAM"),
    )
}

/// Runs `f` on a current-thread runtime with I/O (one thread, as drainit's
/// proxy by default).
pub fn run<F: Future<Output = ()>>(f: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, f);
}

/// Accepts client connections on `listen` for ever (the runtime of [`run`]),
/// each with `TCP_NODELAY` set and served by `serve(connection, peer)` on a
/// task of its own (what it returns is dropped).
///
/// # Panics
/// When `listen` cannot be bound.
pub async fn accept<F, S>(listen: SocketAddr, mut serve: F)
where
    F: FnMut(tokio::net::TcpStream, SocketAddr) -> S,
    S: Future<Output: 'static> + 'static,
{
    let l = tokio::net::TcpListener::bind(listen).await.expect("bind");
    loop {
        let Ok((c, peer)) = l.accept().await else {
            continue;
        };
        let _ = c.set_nodelay(true);
        tokio::task::spawn_local(serve(c, peer));
    }
}
