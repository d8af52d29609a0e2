//! Small helpers shared by several modules: durations in log lines, an optional
//! deadline to sleep until, I/O errors as a word, a listener with a deep accept
//! queue.
//!
//! Must not: hold state or depend on another drainit module (it sits at the bottom
//! of the module graph).

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

/// Sleeps until `deadline`; with `None`, never returns (a `select!` arm that is
/// disabled without a branch of its own).
pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The kind of an I/O error as a word for messages and the report: `not found`,
/// `permission denied`, `address in use`, `address not available`, `exec format
/// error` (a script without `#!` in the musl build), `is a directory`; `None` for
/// any other error, whose caller picks the fallback (its text where that is safe
/// to show, a fixed word where it is not: the report never carries an error's
/// text).
pub fn io_word(e: &std::io::Error) -> Option<&'static str> {
    use std::io::ErrorKind;
    match (e.kind(), e.raw_os_error()) {
        (ErrorKind::NotFound, _) => Some("not found"),
        (ErrorKind::PermissionDenied, _) => Some("permission denied"),
        (ErrorKind::AddrInUse, _) => Some("address in use"),
        (ErrorKind::AddrNotAvailable, _) => Some("address not available"),
        (_, Some(libc::ENOEXEC)) => Some("exec format error"),
        (_, Some(libc::EISDIR)) => Some("is a directory"),
        _ => None,
    }
}

/// [`io_word`], or else the error's own text (for start-up errors printed to the
/// operator, never for the report or a probe).
pub fn io_word_or_text(e: &std::io::Error) -> String {
    io_word(e).map_or_else(|| e.to_string(), String::from)
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

    #[test]
    fn io_word_names_the_kinds_and_nothing_else() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(io_word(&e(libc::ENOENT)), Some("not found"));
        assert_eq!(io_word(&e(libc::EACCES)), Some("permission denied"));
        assert_eq!(io_word(&e(libc::EADDRINUSE)), Some("address in use"));
        assert_eq!(io_word(&e(libc::ENOEXEC)), Some("exec format error"));
        assert_eq!(io_word(&e(libc::EISDIR)), Some("is a directory"));
        assert_eq!(io_word(&e(libc::EAGAIN)), None);
        assert_eq!(io_word(&e(libc::EIO)), None);
        assert!(io_word_or_text(&e(libc::EIO)).contains("Input/output error"));
    }
}
