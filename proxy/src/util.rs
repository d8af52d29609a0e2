//! Small helpers that the proxy and the rest of drainit both use (drainit's
//! `util.rs` re-exports them): durations in log lines, a listener with a deep
//! accept queue.
//!
//! Must not: hold state or depend on another module (it sits at the bottom of
//! the graph).

use std::time::Duration;

/// A duration for log lines and check details: `500ms`, `1s`, `1.5s`
/// (milliseconds precision; whole seconds without a fraction).
pub fn fmt_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms as f64 / 1000.0)
    }
}

/// Binds a non-blocking TCP listener whose accept queue is as deep as the
/// kernel allows (`listen(2)` again with a backlog of -1, which Linux clamps to
/// `net.core.somaxconn`: 4096 by default since Linux 5.4). Rust's standard
/// library listens with 128: a burst of more connections than drainit accepts
/// at once (hundreds of slow probe clients, clients reconnecting at a drain's
/// forward) fills that queue, and a SYN the kernel drops is sent again only
/// after the client's initial retransmission timeout, 1 s (RFC 6298 §2), which
/// is the kubelet's whole probe timeout. nginx listens with 511, HAProxy with
/// its `maxconn`.
///
/// # Errors
/// `bind(2)`/`listen(2)` failed (address in use, permission denied …).
pub fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    nix::sys::socket::listen(&l, nix::sys::socket::Backlog::MAXALLOWABLE)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmt_ms_writes_ms_below_a_second_and_s_above() {
        assert_eq!(fmt_ms(Duration::from_millis(500)), "500ms");
        assert_eq!(fmt_ms(Duration::from_secs(1)), "1s");
        assert_eq!(fmt_ms(Duration::from_millis(1500)), "1.5s");
    }
}
