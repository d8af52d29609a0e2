//! `drainit --probe readyz|healthz`: a health-check client for images that have
//! nothing else to run one with (`FROM scratch`: no curl, no wget), in Docker's
//! `HEALTHCHECK CMD ["/drainit", "--probe", "readyz"]`.
//!
//! Owns: one `GET` on the probe address, bounded by [`TIMEOUT`] from start to end
//! (connect, write, read), and the exit code: 0 for a 200, 1 for anything else
//! (Docker reads 1 as unhealthy and reserves 2). It starts no child, binds nothing
//! and runs no runtime: plain blocking sockets with deadlines.
//!
//! The address is the configured probe address (`--probe-addr`,
//! `DRAINIT_PROBE_ADDR`, the config file, or the default `0.0.0.0:8079`), with an
//! unspecified host (`0.0.0.0`, `::`) asked on loopback (`127.0.0.1`, `::1`): the
//! client runs in the container whose drainit it asks.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::config::{ProbeAddr, ProbePath};

/// The whole request, from connect to the last byte read, at most this long
/// (Docker's default `HEALTHCHECK --timeout` is 30 s; a probe answers in
/// milliseconds, or within its largest check timeout).
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// The most of an answer read; a probe's body is a small JSON object.
const MAX_ANSWER: usize = 16 * 1024;

/// Runs the client: prints the answer's body on stdout (Docker keeps it in
/// `docker inspect`), an error line on stderr, and returns the exit code.
pub fn run(path: ProbePath, addr: &ProbeAddr) -> i32 {
    let addr = match addr {
        ProbeAddr::Off => {
            err(format_args!(
                "--probe: the probe server is off (--probe-addr off); give the address drainit serves probes on"
            ));
            return 1;
        }
        ProbeAddr::Listen { addr, .. } => loopback_for(*addr),
    };
    let path = path.as_path();
    match get(addr, path, TIMEOUT) {
        Ok((200, body)) => {
            let _ = writeln!(std::io::stdout(), "{body}");
            0
        }
        Ok((status, body)) => {
            let _ = writeln!(std::io::stdout(), "{body}");
            err(format_args!("--probe: {path} answered {status}"));
            1
        }
        Err(e) => {
            err(format_args!("--probe: GET http://{addr}{path} failed: {e}"));
            1
        }
    }
}

fn err(msg: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "drainit: error: {msg}");
}

/// An unspecified host (the server listens on every address) is asked on loopback.
pub fn loopback_for(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

/// `GET path` on a fresh connection: the status and the body (lossy UTF-8,
/// trimmed).
///
/// # Errors
/// A message naming the kind of failure: `connection refused`, `timed out after
/// 3s`, `no HTTP response`.
fn get(addr: SocketAddr, path: &str, within: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + within;
    let timed_out = || format!("timed out after {}", humantime::format_duration(within));
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let describe = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => timed_out(),
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset".into(),
        _ => e.to_string(),
    };
    let mut s = TcpStream::connect_timeout(&addr, within).map_err(describe)?;
    s.set_write_timeout(Some(left().ok_or_else(timed_out)?))
        .map_err(describe)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: drainit-probe\r\nConnection: close\r\n\r\n"
    )
    .map_err(describe)?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // Done as soon as the final answer is whole (a server that keeps the
        // connection open after a `Content-Length` body is not waited for).
        if let Some(done) = final_answer(&answer, false) {
            return done;
        }
        // Each read gets what is left of the whole bound, so a server that
        // trickles bytes cannot hold the client past it.
        s.set_read_timeout(Some(left().ok_or_else(timed_out)?))
            .map_err(describe)?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.len() >= MAX_ANSWER {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(describe(e)),
        }
    }
    final_answer(&answer, true).unwrap_or_else(|| Err("no HTTP response".into()))
}

/// The final response in `answer` (interim 1xx responses skipped, RFC 9110 §15.2):
/// `None` while more bytes are needed; at `eof`, whatever body arrived.
fn final_answer(answer: &[u8], eof: bool) -> Option<Result<(u16, String), String>> {
    let mut at = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut res = httparse::Response::new(&mut headers);
        match res.parse(&answer[at..]) {
            Ok(httparse::Status::Complete(head)) => {
                let Some(status) = res.code else {
                    return Some(Err("no HTTP response".into()));
                };
                if (100..200).contains(&status) && status != 101 {
                    at += head;
                    continue;
                }
                let body = &answer[at + head..];
                let length = res
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| {
                        std::str::from_utf8(h.value)
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    });
                let body = match length {
                    Some(n) if body.len() >= n => &body[..n],
                    _ if eof => body,
                    _ => return None,
                };
                let body = String::from_utf8_lossy(body).trim().to_string();
                return Some(Ok((status, body)));
            }
            Ok(httparse::Status::Partial) if !eof => return None,
            _ => return Some(Err("no HTTP response".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_hosts_are_asked_on_loopback() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(loopback_for(a("0.0.0.0:8079")), a("127.0.0.1:8079"));
        assert_eq!(loopback_for(a("[::]:8079")), a("[::1]:8079"));
        assert_eq!(loopback_for(a("10.0.0.2:9000")), a("10.0.0.2:9000"));
    }

    #[test]
    fn a_silent_server_is_given_up_on_within_the_bound() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let started = Instant::now();
        let e = get(addr, "/readyz", Duration::from_millis(300)).unwrap_err();
        let took = started.elapsed();
        assert!(e.starts_with("timed out after 300ms"), "{e}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        drop(l);
    }

    /// Review findings: an interim `100 Continue` before the answer is skipped; a
    /// complete `Content-Length` body is the answer without waiting for the close.
    #[test]
    fn interim_responses_are_skipped_and_a_whole_body_is_enough() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 No\r\nContent-Length: 4\r\n\r\nbusy";
        assert_eq!(final_answer(raw, false), Some(Ok((503, "busy".into()))));
        let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
        assert_eq!(final_answer(partial, false), None);
        assert_eq!(final_answer(partial, true), Some(Ok((200, "abc".into()))));
        assert_eq!(final_answer(b"HTTP/1.1 200 OK\r\n", false), None);
        assert!(matches!(
            final_answer(b"garbage\r\n\r\n", true),
            Some(Err(_))
        ));
    }
}
