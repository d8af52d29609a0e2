//! Streams through the admission proxy (docs/proxy.md, "Streams"): at beat 3 open
//! WebSockets are closed with 1001 (going away), spread over `--stream-spread`
//! rather than in one burst, so their clients reconnect to another replica a
//! few at a time; an SSE stream is ended between events; the drain signal waits
//! for the streams. Real clients on raw sockets, a real app (proxyapp.py).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// drainit + proxyapp.py (graceful) with `--proxy`; returns the run and its
/// proxy port.
fn replica(flags: &[&str]) -> (Running, u16) {
    let [port, app] = free_ports();
    let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app}");
    let ready = format!("127.0.0.1:{app}");
    let app_port = app.to_string();
    let app_py = fixture("proxyapp.py");
    let mut args = vec![
        "--probe-addr",
        "off",
        "--proxy",
        &proxy,
        "--ready-tcp",
        &ready,
        "--proxy-health",
        "/health",
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "--",
        python(),
        &app_py,
        "--port",
        &app_port,
        "--mode",
        "graceful",
        "--log",
        "$TMP/app.log",
    ]);
    let r = Running::start(Mode::Subreaper, &args);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Asked on the health path: not a request of the ledger.
    while http(port, "/health", "GET").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready:\n{}",
            r.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (r, port)
}

/// SIGTERMs the replica and waits for its exit: 0, one request `completed`;
/// the report.
fn drained_with_one_request(r: &mut Running) -> Value {
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    let rep = r.report();
    let q = ledger(&rep);
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(q, "completed"), 1, "{q}");
    rep
}

/// A WebSocket handshake on `port`; the stream after the 101.
fn ws_open(port: u16) -> Option<TcpStream> {
    ws_open_offering(port, "websocket")
}

/// A WebSocket handshake on `port` whose `Upgrade` offers `upgrade`.
fn ws_open_offering(port: u16, upgrade: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    s.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: {upgrade}\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .ok()?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).ok()? == 0 {
            return None;
        }
        head.push(b[0]);
    }
    head.starts_with(b"HTTP/1.1 101").then_some(s)
}

/// Reads frames until a close frame: its status code (0 when the connection
/// ended without one).
fn ws_wait_close(s: &mut TcpStream) -> u16 {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        // Whole frames at the front of `buf` (server frames are unmasked).
        while buf.len() >= 2 {
            let len = (buf[1] & 0x7f) as usize;
            let (hl, len) = match len {
                126 if buf.len() >= 4 => (4, u16::from_be_bytes([buf[2], buf[3]]) as usize),
                126 | 127 => break,
                n => (2, n),
            };
            if buf.len() < hl + len {
                break;
            }
            if buf[0] & 0x0f == 0x8 {
                return if len >= 2 {
                    u16::from_be_bytes([buf[hl], buf[hl + 1]])
                } else {
                    0
                };
            }
            buf.drain(..hl + len);
        }
        match s.read(&mut b) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
}

#[test]
fn open_websockets_are_closed_with_1001_spread_over_the_window_and_reconnect_elsewhere() {
    const N: usize = 100;
    let (mut a, port_a) = replica(&[
        "--pre-drain-delay",
        "0s",
        "--drain-timeout",
        "8s",
        "--stream-spread",
        "3s",
    ]);
    let (mut b, port_b) = replica(&["--pre-drain-delay", "0s"]);
    let sockets: Vec<TcpStream> = (0..N)
        .map(|i| ws_open(port_a).unwrap_or_else(|| panic!("websocket {i} through A")))
        .collect();
    let t0 = Instant::now();
    a.signal(libc::SIGTERM);
    let clients: Vec<_> = sockets
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let code = ws_wait_close(&mut s);
                let at = t0.elapsed();
                // The client reconnects at once, to the other replica.
                let again = ws_open(port_b).is_some();
                (code, at, again)
            })
        })
        .collect();
    let results: Vec<(u16, Duration, bool)> =
        clients.into_iter().map(|c| c.join().unwrap()).collect();
    let (code, _) = a.wait(Duration::from_secs(15));
    let rep = a.report();

    let mut at: Vec<u128> = results.iter().map(|r| r.1.as_millis()).collect();
    at.sort_unstable();
    let burst = at
        .iter()
        .enumerate()
        .map(|(i, t)| at[i..].iter().take_while(|u| **u < t + 300).count())
        .max()
        .unwrap_or(0);
    eprintln!(
        "closes from {} ms to {} ms after SIGTERM; at most {burst} within any 300 ms",
        at[0],
        at[N - 1]
    );
    assert!(
        results.iter().all(|r| r.0 == 1001),
        "every client gets a close frame with 1001 (going away): {:?}",
        results.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    assert!(
        at[N - 1] - at[0] >= 2000,
        "spread over the 3 s window, not in one burst: {at:?}"
    );
    assert!(burst <= 40, "{burst} closes within 300 ms: {at:?}");
    assert!(
        results.iter().all(|r| r.2),
        "every client reconnected to the other replica at once"
    );
    assert_eq!(code, 0, "{rep}");
    assert_eq!(num(&rep, "streams.opened"), N as i64, "{rep}");
    assert_eq!(num(&rep, "streams.closed_by_drain"), N as i64, "{rep}");
    assert_eq!(num(&rep, "requests.completed"), N as i64, "{rep}");
    // The drain signal waited for the streams.
    assert!(num(&rep, "drain.forwarded_at_ms") >= 2000, "{rep}");

    b.signal(libc::SIGTERM);
    let (code_b, _) = b.wait(Duration::from_secs(15));
    let rep_b = b.report();
    assert_eq!(code_b, 0, "{rep_b}");
    assert_eq!(num(&rep_b, "streams.opened"), N as i64, "{rep_b}");
}

/// No pre-drain delay, streams closed all at once at beat 3, a 5 s deadline.
const AT_ONCE: [&str; 6] = [
    "--pre-drain-delay",
    "0s",
    "--drain-timeout",
    "5s",
    "--stream-spread",
    "0s",
];

#[test]
fn an_event_stream_is_ended_between_events_with_a_proper_end() {
    let (mut r, port) = replica(&AT_ONCE);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // The stream is open and event 1 has come through whole (event 2 began;
    // each event is three chunks).
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: event 2") {
        match s.read(&mut b) {
            Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
            other => panic!("the event stream ended before its second event: {other:?}"),
        }
    }
    r.signal(libc::SIGTERM);
    let _ = s.read_to_end(&mut got);
    let (code, _) = r.wait(Duration::from_secs(10));
    let rep = r.report();
    let text = String::from_utf8_lossy(&got);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    // Dechunk: the body ends with the last chunk (a proper end, not a cut).
    assert!(body.ends_with("0\r\n\r\n"), "a cut stream: {body:?}");
    let mut data = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").expect("chunk size");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex size");
        if n == 0 {
            break;
        }
        data.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    assert!(data.contains("data: event 1\n\n"), "{data:?}");
    assert!(
        data.ends_with("\n\n"),
        "ended between events, not inside one: {data:?}"
    );
    assert_eq!(code, 0, "{rep}");
    assert_eq!(num(&rep, "streams.closed_by_drain"), 1, "{rep}");
    assert_eq!(num(&rep, "requests.completed"), 1, "{rep}");
}

/// RLIMIT_NOFILE 256: the proxy's share is 56 client connections of two
/// descriptors each. A WebSocket keeps both (the client's and the app's) for
/// as long as it is open: 120 of them must not take the descriptors the probe
/// server and the drain need; those past the cap wait in the listen backlog.
#[test]
fn websockets_past_the_connection_cap_under_a_low_fd_limit_leave_the_probes_their_fds() {
    let ports = ProxyPorts::new();
    let (port, probe) = (ports.port, ports.probe);
    let app_py = fixture("proxyapp.py");
    let mut r = ports.start_under_nofile(
        "256",
        &AT_ONCE,
        &[python(), &app_py, "--port", "{app}", "--mode", "graceful"],
    );
    // All handshakes sent first; past the cap they wait unanswered.
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let base = open_fds(r.pid);
    let mut socks: Vec<TcpStream> = (0..120)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(100)).ok()?;
            s.write_all(
                b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            )
            .ok()?;
            Some(s)
        })
        .collect();
    // drainit has taken up what it will of them: its descriptor count grew and
    // stopped growing.
    let mut last = 0;
    wait_for(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(100));
        let n = open_fds(r.pid);
        let stable = n == last && n > base;
        last = n;
        stable.then_some(())
    })
    .expect("drainit never took up the WebSockets");
    // What each client got: a 101, or nothing yet (waiting in the backlog).
    let mut open = 0;
    let mut other = Vec::new();
    for s in &mut socks {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 12];
        match s.read_exact(&mut b) {
            Ok(()) if b.starts_with(b"HTTP/1.1 101") => open += 1,
            Ok(()) => other.push(String::from_utf8_lossy(&b).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => other.push(e.to_string()),
        }
    }
    let (status, _, _) = http(probe, "/healthz", "GET");
    let err = r.stderr_text();
    let fds = open_fds(r.pid);
    // (256 - 32) / 4: the proxy's cap on client connections (docs/proxy.md, "HTTP").
    assert!(
        open <= 56 && other.is_empty(),
        "{open} WebSockets open past the cap of 56, drainit holds {fds} of 256 fds; \
         others got {other:?}\n{err}"
    );
    assert!(
        status == 200 && !err.contains("Too many open files"),
        "/healthz {status} beside {open} open WebSockets\n{err}"
    );
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(15));
    drop(socks);
    assert!(code == 0 || code == 2, "{}", r.stderr_text());
}

/// A client that sends its last frame and half-closes (shuts its write side:
/// "no more from me", as Docker's hijacked connections do) still gets what the
/// app sends after: the tunnel passes the end on to the app and keeps the other
/// direction open until the app ends it too. Before, the client's end tore down
/// both directions at once and the app's answer to that last frame was lost.
#[test]
fn a_client_that_half_closes_still_gets_the_apps_answer() {
    let (mut r, port) = replica(&[]);
    let mut s = ws_open(port).expect("the WebSocket handshake through the proxy");
    // A masked text frame "hello" (mask 0: the payload as is), then our end.
    s.write_all(&[0x81, 0x85, 0, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'])
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        got.starts_with(&[0x81, 0x05, b'h', b'e', b'l', b'l', b'o']),
        "the app's echo was lost: {got:?}\n{}",
        r.stderr_text()
    );
    let rep = drained_with_one_request(&mut r);
    assert_eq!(num(&rep, "streams.opened"), 1, "{rep}");
    assert_eq!(num(&rep, "streams.completed"), 1, "{rep}");
}

/// `Upgrade: h2c` on an HTTP/1.1 request (RFC 7540 §3.2, removed by RFC 9113
/// §3.1) is not passed on as an upgrade: the app gets a plain HTTP/1.1 request
/// without `Upgrade`, `HTTP2-Settings` or `Connection: upgrade`, answers it,
/// and it is a completed request, not a stream. Before, the app got `Upgrade:
/// h2c` and `Connection: upgrade` without the `HTTP2-Settings` the upgrade
/// needs, and an app that switched would have carried HTTP/2 requests in a
/// tunnel the ledger never sees.
/// `Upgrade: websocket, h2c` reaches the app without h2c; the app switches to
/// a WebSocket, and drainit's tunnel is one: at beat 3 it ends with a close
/// frame (1001), not a cut connection.
#[test]
fn a_websocket_offered_beside_h2c_is_closed_as_a_websocket() {
    let (mut r, port) = replica(&["--pre-drain-delay", "0s", "--stream-spread", "0s"]);
    let mut s = ws_open_offering(port, "websocket, h2c").expect("the 101");
    r.signal(libc::SIGTERM);
    assert_eq!(ws_wait_close(&mut s), 1001, "{}", r.stderr_text());
    let (code, _) = r.wait(secs(10));
    let rep = r.report();
    assert_eq!(code, 0, "{rep}");
    assert_eq!(num(&rep, "streams.closed_by_drain"), 1, "{rep}");
}

#[test]
fn an_h2c_upgrade_is_served_as_http1_without_its_upgrade_fields() {
    let (mut r, port) = replica(&[]);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /echo-headers HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n\
          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    .unwrap();
    // The head, then the body's Content-Length bytes (the connection stays open).
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let whole = |got: &[u8]| {
        let text = String::from_utf8_lossy(got).to_lowercase();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        head.lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .is_some_and(|n| body.len() >= n)
    };
    while !whole(&got) {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
    }
    let got = String::from_utf8_lossy(&got).to_lowercase();
    assert!(got.starts_with("http/1.1 200"), "{got}");
    let body = got.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    for field in ["\"upgrade\"", "\"http2-settings\"", "\"connection\""] {
        assert!(!body.contains(field), "the app got {field}: {body}");
    }
    let rep = drained_with_one_request(&mut r);
    assert_eq!(num(&rep, "streams.opened"), 0, "{rep}");
}
