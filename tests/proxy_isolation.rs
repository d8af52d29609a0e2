//! Isolation of the admission proxy (docs/proxy.md): under a flood of
//! requests through the proxy, the drain keeps its timing. `/readyz` turns 503
//! right after SIGTERM, and the SIGKILL comes at the deadline, because the proxy
//! runs on its own thread and runtime.
//!
//! Readiness is asserted as an order of events (it fails while the app still
//! serves the flood, before admission closes); the figures themselves are
//! printed (`cargo test --test proxy_isolation -- --nocapture`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// What the flooding clients share with the test.
#[derive(Default)]
struct Flood {
    stop: AtomicBool,
    /// Responses read whole.
    done: AtomicU64,
    /// Set by the test once it has seen `/readyz` answer 503.
    readyz_failed: AtomicBool,
    /// A request written after `readyz_failed` was set got the app's 200.
    served_after_readyz_failed: AtomicBool,
}

/// Keep-alive GET /ok in a loop until `stop`; reconnects whenever the proxy
/// closes (Connection: close from T0, 503s after beat 3). Counts responses.
fn flood(port: u16, f: Arc<Flood>) {
    let (stop, done) = (&f.stop, &f.done);
    let req = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = vec![0u8; 8192];
        'conn: while !stop.load(Ordering::Relaxed) {
            let after = f.readyz_failed.load(Ordering::SeqCst);
            if s.write_all(req).is_err() {
                break;
            }
            // Read one response: the head, then Content-Length bytes.
            let mut have = Vec::new();
            let (head_end, len) = loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(n) => have.extend_from_slice(&buf[..n]),
                }
                if let Some(i) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&have[..i]).to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    break (i + 4, len);
                }
            };
            while have.len() < head_end + len {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(n) => have.extend_from_slice(&buf[..n]),
                }
            }
            done.fetch_add(1, Ordering::Relaxed);
            let head = String::from_utf8_lossy(&have[..head_end]).to_ascii_lowercase();
            if after && head.starts_with("http/1.1 200") {
                f.served_after_readyz_failed.store(true, Ordering::SeqCst);
            }
            if head.contains("connection: close") {
                break;
            }
        }
    }
}

#[test]
fn under_a_flood_readyz_fails_at_once_and_the_sigkill_keeps_the_deadline() {
    let ports = ProxyPorts::new();
    let (port, probe) = (ports.port, ports.probe);
    let app_py = fixture("proxyapp.py");
    let argv = ports.argv(
        &["--pre-drain-delay", "1s", "--drain-timeout", "1s"],
        &[python(), &app_py, "--port", "{app}"],
    );
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut r = Running::start(Mode::Subreaper, &args);
    assert!(
        wait_until(Duration::from_secs(10), || http(probe, "/readyz", "GET").0
            == 200),
        "never ready:\n{}",
        r.stderr_text()
    );
    let f = Arc::new(Flood::default());
    let floods: Vec<_> = (0..6)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || flood(port, f))
        })
        .collect();
    // A request that outlives the deadline: the drain signal waits for it, and
    // the SIGKILL comes at the deadline.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /slow?ms=8000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
    });
    // The flood is under way: its clients are being answered through the proxy.
    assert!(
        wait_until(secs(30), || f.done.load(Ordering::Relaxed) > 50),
        "the flood got {} responses:\n{}",
        f.done.load(Ordering::Relaxed),
        r.stderr_text()
    );
    let before = f.done.load(Ordering::Relaxed);

    let sent = Instant::now();
    r.signal(libc::SIGTERM);
    let mut failed_after = None;
    while sent.elapsed() < Duration::from_secs(10) {
        if http(probe, "/readyz", "GET").0 == 503 {
            failed_after = Some(sent.elapsed());
            f.readyz_failed.store(true, Ordering::SeqCst);
            break;
        }
    }
    let (code, _) = r.wait(Duration::from_secs(20));
    f.stop.store(true, Ordering::Relaxed);
    for t in floods {
        let _ = t.join();
    }
    let _ = slow.join();
    let rep = r.report();
    let failed_after = failed_after.expect("/readyz never turned 503");
    let killed = num(&rep, "drain.killed_at_ms");
    let deadline = num(&rep, "drain.deadline_ms");
    eprintln!(
        "flood: {before} responses through the proxy before SIGTERM; /readyz 503 after {} µs; \
         SIGKILL at {killed} ms for a deadline at {deadline} ms",
        failed_after.as_micros()
    );
    // Readiness failed at once: before admission closed at beat 3, the app still
    // served a flood request sent after /readyz was seen answering 503.
    assert!(
        f.served_after_readyz_failed.load(Ordering::SeqCst),
        "no flood request sent after /readyz turned 503 was served: readiness failed only \
         once admission had closed ({failed_after:?} after SIGTERM):\n{}",
        r.stderr_text()
    );
    assert!(
        killed >= deadline && killed - deadline < 500,
        "SIGKILL at {killed} ms, deadline {deadline} ms: {rep}"
    );
    assert_eq!(code, 2, "a request was abandoned: {rep}");
    assert_eq!(num(&rep, "requests.abandoned"), 1, "{rep}");
    assert_eq!(num(&rep, "requests.unknown"), 0, "{rep}");
}

/// A burst of connections drainit does not accept at once (here: drainit is
/// stopped) waits in the kernel's accept queue, on the probe port and on the
/// proxy's: every connect completes at once. With the standard library's
/// backlog of 128, the 130th SYN was dropped and its client waited for the
/// retransmission, 1 s later: the kubelet's whole probe timeout.
#[test]
fn a_burst_of_connections_waits_in_the_accept_queue_not_in_a_retransmission() {
    const BURST: usize = 300;
    let [port, app, probe] = free_ports();
    let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app}");
    let probe_addr = format!("127.0.0.1:{probe}");
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            "--probe-addr",
            &probe_addr,
            "--proxy",
            &proxy,
            "--pre-drain-delay",
            "0s",
            "--",
            "sleep",
            "60",
        ],
    );
    assert!(
        wait_until(secs(10), || http(probe, "/healthz", "GET").0 == 200),
        "{}",
        r.stderr_text()
    );
    r.signal(libc::SIGSTOP);
    for (what, p) in [("probe", probe), ("proxy", port)] {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p));
        let held: Vec<TcpStream> = (0..BURST)
            .map(|i| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("{what} connection {i} of {BURST}: {e}"))
            })
            .collect();
        drop(held);
    }
    r.signal(libc::SIGCONT);
    assert_eq!(http(probe, "/healthz", "GET").0, 200);
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 0, "{}", r.stderr_text());
}
