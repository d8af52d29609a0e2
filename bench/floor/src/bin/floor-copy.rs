//! The floor of any proxy here: bytes copied both ways, one app connection per
//! client connection, no parsing at all. Not an HTTP proxy (no accounting, no
//! drain); it says what the kernel and tokio cost per request on this machine.
use tokio::net::{TcpListener, TcpStream};

fn main() {
    let (listen, upstream) = drainit_bench_floor::addresses();
    drainit_bench_floor::run(async move {
        let l = TcpListener::bind(listen).await.expect("bind");
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                continue;
            };
            tokio::task::spawn_local(async move {
                let _ = c.set_nodelay(true);
                let Ok(mut u) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = u.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            });
        }
    });
}
