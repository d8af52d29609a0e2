//! The floor of any proxy here: bytes copied both ways, one app connection per
//! client connection, no parsing at all. Not an HTTP proxy (no accounting, no
//! drain); it says what the kernel and tokio cost per request on this machine.
use tokio::net::TcpStream;

fn main() {
    let (listen, upstream) = drainit_bench_floor::addresses();
    drainit_bench_floor::run(drainit_bench_floor::accept(
        listen,
        move |mut c, _| async move {
            let Ok(mut u) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = u.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
        },
    ));
}
