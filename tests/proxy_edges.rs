//! The admission proxy against edge cases (docs/proxy.md), black box: the real binary
//! in front of tests/fixtures/rawapp.py, an app written at the socket level that
//! answers what a well-behaved HTTP server never would, and clients that write raw
//! bytes. What a client got, what the app received, what the exit report says
//! (every report checked against the ledger's equations, `ledger`).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// drainit with `--proxy` in front of rawapp.py, ready.
struct Edge {
    r: Running,
    port: u16,
    probe: u16,
}

impl Edge {
    fn start() -> Edge {
        Edge::start_in(Mode::Subreaper, "0s")
    }

    /// As [`Edge::start`], in `mode`, with `--pre-drain-delay pre_drain`.
    fn start_in(mode: Mode, pre_drain: &str) -> Edge {
        for _ in 0..3 {
            let [port, app, probe] = free_ports();
            let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app}");
            let probe_addr = format!("127.0.0.1:{probe}");
            let ready = format!("127.0.0.1:{app}");
            let app_port = app.to_string();
            let rawapp = fixture("rawapp.py");
            let args = [
                "--probe-addr",
                &probe_addr,
                "--proxy",
                &proxy,
                "--ready-tcp",
                &ready,
                "--pre-drain-delay",
                pre_drain,
                "--drain-timeout",
                "5s",
                "--",
                python(),
                &rawapp,
                "--port",
                &app_port,
                "--log",
                "$TMP/app.log",
            ];
            let r = Running::start(mode, &args);
            if wait_until(secs(10), || http(probe, "/readyz", "GET").0 == 200) {
                return Edge { r, port, probe };
            }
            // A port taken by someone else between free_ports and the bind.
            eprintln!("not ready, retrying:\n{}", r.stderr_text());
        }
        panic!("drainit in front of rawapp.py never became ready");
    }

    /// During a drain (`--pre-drain-delay 3s`, `/readyz` already 503), a client
    /// with an 8 KiB receive buffer that asked for a 100,000-byte response.
    fn draining_with_a_large_response_asked(mode: Mode) -> (Edge, TcpStream) {
        let mut e = Edge::start_in(mode, "3s");
        e.r.signal(15);
        assert!(
            wait_until(secs(5), || http(e.probe, "/readyz", "GET").0 == 503),
            "the drain never began\n{}",
            e.r.stderr_text()
        );
        let mut s = connect_small(e.port, 8192);
        s.write_all(b"GET /bytes?n=100000 HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        (e, s)
    }

    /// Writes `req` on a new connection and reads until the peer closes (or 5 s).
    fn exchange(&self, req: &[u8]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.write_all(req).unwrap();
        read_to_close(&mut s)
    }

    /// The request lines the app received.
    fn app_log(&self) -> String {
        std::fs::read_to_string(self.r.path("app.log")).unwrap_or_default()
    }

    /// SIGTERM, the exit code, and the report's checked ledger.
    fn drain(mut self) -> (i32, Value) {
        self.r.signal(15);
        let (code, _) = self.r.wait(secs(10));
        let rep = self.r.report();
        ledger(&rep);
        (code, rep["requests"].clone())
    }
}

/// Closes `s` with a reset (`SO_LINGER` 0: close(2) sends RST, not FIN).
fn reset(s: TcpStream) {
    nix::sys::socket::setsockopt(
        &s,
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .unwrap();
}

/// Reads until EOF, a reset or 5 s; what came, lossily as text.
fn read_to_close(s: &mut TcpStream) -> String {
    read_for(s, None)
}

/// Reads until `text` has come (or EOF, a reset, 5 s).
fn read_until(s: &mut TcpStream, text: &str) -> String {
    read_for(s, Some(text))
}

fn read_for(s: &mut TcpStream, text: Option<&str>) -> String {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let end = Instant::now() + secs(5);
    let mut got = Vec::new();
    let mut b = [0u8; 8192];
    while Instant::now() < end && !text.is_some_and(|t| String::from_utf8_lossy(&got).contains(t)) {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn a_response_with_both_transfer_encoding_and_content_length_reaches_the_client_whole() {
    // RFC 9112 §6.3: the chunked framing wins, and a proxy drops the length
    // before forwarding. Forwarding it promised the client 3 bytes of an
    // 8-byte body: the client got a cut or overlong response, and the
    // connection was lost, while the ledger said `completed`.
    let e = Edge::start();
    let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    s.write_all(b"GET /both-lengths HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let first = read_until(&mut s, "0\r\n\r\n");
    let head = first.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{first:?}");
    assert!(!head.contains("content-length:"), "{first:?}");
    assert!(head.contains("transfer-encoding: chunked"), "{first:?}");
    assert!(
        first.ends_with("\r\n\r\n8\r\nall here\r\n0\r\n\r\n"),
        "{first:?}"
    );
    // The connection is still good for the next request.
    s.write_all(b"GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let second = read_to_close(&mut s);
    assert!(second.ends_with("echo GET /next"), "{second:?}");
    let (code, q) = e.drain();
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "completed"), 2, "{q}");
}

#[test]
fn a_connect_is_refused_with_501_and_never_reaches_the_app() {
    // drainit is a reverse proxy: a CONNECT asks for a tunnel to another host.
    // Sent on, an app that answered 2xx left the client a 200 and a closed
    // connection (nobody relayed the tunnel), counted `completed`.
    let e = Edge::start();
    let got = e.exchange(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
    let head = got.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 501"), "{got:?}");
    assert!(head.contains("connection: close"), "{got:?}");
    assert!(!got.contains("TUNNEL"), "{got:?}");
    // The next request is served as usual.
    let ok = e.exchange(b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert!(ok.ends_with("echo GET /after"), "{ok:?}");
    let log = e.app_log();
    assert!(!log.contains("CONNECT"), "the app got the CONNECT:\n{log}");
    let (code, q) = e.drain();
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "malformed"), 1, "{q}");
    assert_eq!(num(&q, "received"), 1, "{q}");
    assert_eq!(num(&q, "completed"), 1, "{q}");
}

#[test]
fn a_101_to_a_request_that_asked_for_no_upgrade_is_a_502_and_unknown() {
    // RFC 9110 §15.2.2: an app may switch only to a protocol the client asked
    // for. Passed on, the client got a 101 and then nothing, counted `completed`.
    let e = Edge::start();
    let got = e.exchange(b"GET /upgrade-unasked HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert!(got.starts_with("HTTP/1.1 502"), "{got:?}");
    assert!(!got.contains("RAW"), "{got:?}");
    let (code, q) = e.drain();
    // Lost before T0: in the ledger, the drain itself is clean.
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "unknown"), 1, "{q}");
    assert_eq!(num(&q, "completed"), 0, "{q}");
    assert_eq!(text(&q["lost"][0], "path"), "/upgrade-unasked", "{q}");
}

#[test]
fn authority_and_asterisk_form_targets_of_other_methods_get_400() {
    // RFC 9112 §3.2.3, §3.2.4: `example.com:80` is CONNECT's target form, `*`
    // OPTIONS's. Sent on, `GET evil.example:80` reached the app as `GET /` with
    // `Host: evil.example:80` in place of the client's; `GET *` as `GET *`.
    let e = Edge::start();
    for req in [
        &b"GET evil.example:80 HTTP/1.1\r\nHost: good.example\r\n\r\n"[..],
        b"POST other HTTP/1.1\r\nHost: good.example\r\nContent-Length: 0\r\n\r\n",
        b"GET * HTTP/1.1\r\nHost: good.example\r\n\r\n",
    ] {
        let got = e.exchange(req);
        let what = String::from_utf8_lossy(req);
        assert!(got.starts_with("HTTP/1.1 400"), "{what:?}: {got:?}");
        assert!(
            got.to_ascii_lowercase().contains("connection: close"),
            "{what:?}: {got:?}"
        );
    }
    // OPTIONS * still reaches the app.
    let ok = e.exchange(b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert!(ok.ends_with("echo OPTIONS *"), "{ok:?}");
    let log = e.app_log();
    assert_eq!(log.lines().count(), 1, "the app got a bad target:\n{log}");
    let (code, q) = e.drain();
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "malformed"), 3, "{q}");
    assert_eq!(num(&q, "completed"), 1, "{q}");
}

/// The bad-input table: an invalid `Host` (a list, or one with a
/// path, query and userinfo: RFC 9112 §3.2, RFC 9110 §7.2), an absolute-form
/// target with userinfo (RFC 9110 §4.2.4) or another scheme gets 400 and never
/// reaches the app; a chunked body found malformed after its head went to the
/// app gets 400 and counts `malformed` (not `canceled`); `Content-Length:
/// 0005` reaches the app as `5`.
#[test]
fn invalid_hosts_userinfo_other_schemes_and_bad_chunks_get_400_and_count_malformed() {
    let e = Edge::start();
    let table: [(&[u8], &str); 5] = [
        (b"GET /h1 HTTP/1.1\r\nHost: a, b\r\n\r\n", "400"),
        (b"GET /h2 HTTP/1.1\r\nHost: a/b?c@d\r\n\r\n", "400"),
        (
            b"GET http://user:pw@evil/u HTTP/1.1\r\nHost: a\r\n\r\n",
            "400",
        ),
        (b"GET ftp://evil/f HTTP/1.1\r\nHost: a\r\n\r\n", "400"),
        (
            b"POST /chunks HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nZZ\r\n\r\n",
            "400",
        ),
    ];
    for (req, want) in table {
        let got = e.exchange(req);
        let what = String::from_utf8_lossy(req);
        assert!(
            got.starts_with(&format!("HTTP/1.1 {want}")),
            "{what:?}: {got:?}"
        );
    }
    let got = e.exchange(
        b"POST /length HTTP/1.1\r\nHost: a\r\nContent-Length: 0005\r\nConnection: close\r\n\r\nhello",
    );
    assert!(got.ends_with("length 5"), "{got:?}");
    let log = e.app_log();
    assert!(
        !log.contains("/h1") && !log.contains("/h2") && !log.contains("/u") && !log.contains("/f"),
        "the app got a bad request:\n{log}"
    );
    let (code, q) = e.drain();
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "malformed"), 5, "{q}");
    assert_eq!(num(&q, "canceled"), 0, "{q}");
    assert_eq!(num(&q, "completed"), 1, "{q}");
}

#[test]
fn clients_that_reconnect_when_the_forward_closes_their_idle_connection_get_the_503() {
    // The forward closes idle keep-alive connections; a client with a request
    // to send reconnects at once and writes it (a pool, a load balancer that
    // does not look at readiness). An app that dies at the forward (rawapp.py
    // has no SIGTERM handler) made drainit exit within a millisecond or two,
    // before it had accepted those connections: they were reset with their
    // request unanswered, not counted anywhere.
    let e = Edge::start();
    let n = 8;
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
            s.write_all(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            let got = read_until(&mut s, "echo GET /first");
            assert!(got.ends_with("echo GET /first"), "{got:?}");
            let port = e.port;
            std::thread::spawn(move || {
                // Idle until the forward closes it, then at once a new one.
                let closed = read_to_close(&mut s);
                assert!(closed.is_empty(), "{closed:?}");
                let Ok(mut again) = TcpStream::connect(("127.0.0.1", port)) else {
                    return "refused".to_string();
                };
                if again
                    .write_all(b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n")
                    .is_err()
                {
                    return "reset".to_string();
                }
                let got = read_to_close(&mut again);
                if got.is_empty() {
                    "reset".to_string()
                } else {
                    got.lines().next().unwrap_or_default().to_string()
                }
            })
        })
        .collect();
    let (code, q) = e.drain();
    let got: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    for g in &got {
        assert!(
            g == "refused" || g.starts_with("HTTP/1.1 503"),
            "a reconnecting client got {g:?}: {got:?}\n{q}"
        );
    }
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "completed"), n, "{q}");
    let answered = got.iter().filter(|g| g.starts_with("HTTP/1.1 503")).count() as i64;
    assert_eq!(num(&q, "rejected"), answered, "{got:?} {q}");
}

#[test]
fn a_chunked_response_with_trailers_is_completed_and_its_trailers_reach_the_client() {
    // hyper ends a response at its trailers without asking the body for more:
    // the response went out whole, yet the request was counted `canceled`.
    let e = Edge::start();
    let got = e.exchange(
        b"GET /trailers HTTP/1.1\r\nHost: a\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    );
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(got.contains("\r\n\r\n2\r\nok\r\n0\r\n"), "{got:?}");
    // A client that accepts trailers (`TE: trailers`) gets them: `Trailer` is
    // end to end (RFC 9110 §6.6.2), and hyper sends only the trailers a
    // response's `Trailer` names. It used to be dropped as hop-by-hop.
    assert!(
        got.to_ascii_lowercase().ends_with("0\r\nx-sum: 1\r\n\r\n"),
        "{got:?}"
    );
    let got = e.exchange(b"GET /trailers HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert!(got.contains("\r\n\r\n2\r\nok\r\n0\r\n"), "{got:?}");
    let (code, q) = e.drain();
    assert_eq!(code, 0, "{q}");
    assert_eq!(num(&q, "completed"), 2, "{q}");
    assert_eq!(num(&q, "canceled"), 0, "{q}");
}

#[test]
fn a_half_closed_tunnel_whose_app_never_ends_is_closed_by_the_drain() {
    // The client ends its half of an upgraded connection; the app never ends
    // its own. The tunnel stays open for the app's answer, but not past the
    // drain: at beat 3 drainit closes it like any stream, the drain signal
    // goes to the app, and the client sees the connection end.
    let mut e = Edge::start();
    let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    s.write_all(
        b"GET /upgrade-hold HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n",
    )
    .unwrap();
    let got = read_until(&mut s, "RAW");
    assert!(got.starts_with("HTTP/1.1 101"), "{got:?}");
    assert!(got.ends_with("RAW"), "{got:?}");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let client = std::thread::spawn(move || {
        let t = Instant::now();
        let rest = read_to_close(&mut s);
        (rest, t.elapsed())
    });
    e.r.signal(15);
    let (code, _) = e.r.wait(secs(10));
    let (rest, waited) = client.join().unwrap();
    let rep = e.r.report();
    let q = ledger(&rep);
    assert!(rest.is_empty(), "{rest:?}");
    // The drain timeout is 5 s, and read_to_close gives up at 5 s.
    assert!(
        waited < secs(5),
        "the tunnel outlived the drain: {waited:?}"
    );
    assert!(
        e.r.stderr_text().contains("forwarded SIGTERM to"),
        "{}",
        e.r.stderr_text()
    );
    assert_eq!(code, 0, "{rep}");
    assert_eq!(num(q, "completed"), 1, "{q}");
    assert_eq!(num(&rep, "streams.closed_by_drain"), 1, "{rep}");
}

/// An HTTP/1 request counts `completed` at the connection's next flush after its
/// response's last frame: pipelined requests whose responses end each in their
/// own way (trailers, a HEAD's body hyper never polls, a `Content-Length` body,
/// a `100 Continue` before the answer) all settle on their keep-alive
/// connection, which then sits idle: nothing stays in flight, and the drain
/// goes at once rather than at its deadline.
#[test]
fn pipelined_responses_of_every_ending_settle_and_the_drain_does_not_wait() {
    let e = Edge::start();
    let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
    s.write_all(
        b"GET /trailers HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n\
          HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n\
          GET /y HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /z HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
    )
    .unwrap();
    let got = read_until(&mut s, "100 Continue");
    assert!(
        got.contains("x-sum: 1") && got.contains("echo GET /y"),
        "{got}"
    );
    s.write_all(b"abc").unwrap();
    let got = read_until(&mut s, "echo POST /z");
    assert!(got.contains("echo POST /z"), "{got}");
    // The connection stays open and idle through the drain.
    let t = Instant::now();
    let (code, req) = e.drain();
    assert_eq!(code, 0, "{req}");
    assert_eq!(req["completed"], 4, "{req}");
    assert!(
        t.elapsed() < secs(3),
        "the drain took {:?} (deadline 5 s): a request stayed in flight",
        t.elapsed()
    );
    drop(s);
}

/// RFC 9112 §9.6: during a drain (responses carry `Connection:
/// close`) a client with an 8 KiB receive buffer pipelines a second request
/// 30 ms after the first, while the first's 100,000-byte response is still
/// streaming, with and without a body. drainit closes after the first
/// response with the second unread: closed at once, the kernel would answer
/// the unread bytes with a reset and discard what it had not sent yet. The
/// client gets all 100,000 bytes, and the report counts the response
/// `completed` (as PID 1 too).
#[test]
fn a_client_that_pipelines_during_a_drain_gets_the_whole_response_before_the_close() {
    const SECOND: [&[u8]; 2] = [
        b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    ];
    for mode in BOTH {
        for second in SECOND {
            let (e, mut s) = Edge::draining_with_a_large_response_asked(mode);
            std::thread::sleep(Duration::from_millis(30));
            s.write_all(second).unwrap();
            s.set_read_timeout(Some(secs(10))).unwrap();
            let mut got = Vec::new();
            let mut b = [0u8; 4096];
            let end = loop {
                match s.read(&mut b) {
                    Ok(0) => break "EOF".to_string(),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) => break e.to_string(),
                }
            };
            let text = String::from_utf8_lossy(&got);
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            assert!(
                head.to_ascii_lowercase().contains("connection: close"),
                "{mode:?}: {head}"
            );
            assert_eq!(
                body.len(),
                100_000,
                "{mode:?}, {}: the client got {} body bytes, then {end}",
                String::from_utf8_lossy(second).lines().next().unwrap(),
                body.len()
            );
            assert_eq!(end, "EOF", "{mode:?}");
            let (code, req) = e.drain();
            assert_eq!(code, 0, "{mode:?}: {req}");
            assert_eq!(req["completed"], 1, "{mode:?}: {req}");
        }
    }
}

/// The ledger's side of a lingering close: a client with an 8 KiB receive buffer asks
/// for 100,000 bytes during a drain, reads none, and resets its connection.
/// Its kernel never acknowledged most of the response, which drainit's kernel
/// then discarded: the report must not count it `completed` (as PID 1 too).
#[test]
fn a_response_the_client_reset_before_acknowledging_is_never_completed() {
    for mode in BOTH {
        let (e, s) = Edge::draining_with_a_large_response_asked(mode);
        // Long enough for the app's response to be in drainit's kernel.
        std::thread::sleep(Duration::from_millis(500));
        reset(s);
        let (code, req) = e.drain();
        assert_eq!(req["completed"], 0, "{mode:?}: {req}");
        assert_eq!(
            req["canceled"].as_i64().unwrap_or(0) + req["abandoned"].as_i64().unwrap_or(0),
            1,
            "{mode:?}: {req}"
        );
        let _ = code;
    }
}

/// A client that resets the connection as soon as it has read a response whole,
/// as HAProxy closes each server connection it closes first (`SO_LINGER` 0),
/// never sends the acknowledgement its kernel was delaying: the response
/// reached it, and the report counts it `completed`, every time (as PID 1
/// too). Two keep-alive exchanges come first on each connection, so that the
/// client's kernel delays its ACKs as it does on a busy keep-alive connection.
/// (`drainit-gate drill --router haproxy` counted one such response in four
/// runs `canceled`.)
#[test]
fn a_client_that_resets_right_after_reading_a_whole_response_has_it_completed() {
    const CONNECTIONS: usize = 20;
    const EACH: usize = 3;
    for mode in BOTH {
        let e = Edge::start_in(mode, "0s");
        for _ in 0..CONNECTIONS {
            let mut s = TcpStream::connect(("127.0.0.1", e.port)).unwrap();
            s.set_nodelay(true).unwrap();
            for _ in 0..EACH {
                s.write_all(b"GET /bytes?n=100 HTTP/1.1\r\nHost: a\r\n\r\n")
                    .unwrap();
                let got = read_until(&mut s, &"b".repeat(100));
                assert!(got.starts_with("HTTP/1.1 200"), "{mode:?}: {got}");
            }
            reset(s);
        }
        let (code, req) = e.drain();
        assert_eq!(req["completed"], CONNECTIONS * EACH, "{mode:?}: {req}");
        assert_eq!(req["canceled"], 0, "{mode:?}: {req}");
        assert_eq!(code, 0, "{mode:?}: {req}");
    }
}
