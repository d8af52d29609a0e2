//! Isolation of the admission proxy (issue 10, DESIGN §11): under a flood of
//! requests through the proxy, the drain keeps its timing. `/readyz` turns 503
//! right after SIGTERM, and the SIGKILL comes at the deadline, because the proxy
//! runs on its own thread and runtime.
//!
//! Upper bounds are loose (the behaviour, not the machine): the figures
//! themselves are printed (`cargo test --test proxy_isolation -- --nocapture`)
//! and reported in the README.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// Keep-alive GET /ok in a loop until `stop`; reconnects whenever the proxy
/// closes (Connection: close from T0, 503s after beat 3). Counts responses.
fn flood(port: u16, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let req = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = vec![0u8; 8192];
        'conn: while !stop.load(Ordering::Relaxed) {
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
        &["--pre-drain-delay", "500ms", "--drain-timeout", "1s"],
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
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let floods: Vec<_> = (0..6)
        .map(|_| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || flood(port, stop, done))
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
    std::thread::sleep(Duration::from_millis(1000));
    let before = done.load(Ordering::Relaxed);
    assert!(
        before > 50,
        "the flood got {before} responses in 1 s:\n{}",
        r.stderr_text()
    );

    let sent = Instant::now();
    r.signal(libc::SIGTERM);
    let mut failed_after = None;
    while sent.elapsed() < Duration::from_secs(2) {
        if http(probe, "/readyz", "GET").0 == 503 {
            failed_after = Some(sent.elapsed());
            break;
        }
    }
    let (code, _) = r.wait(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        let _ = f.join();
    }
    let _ = slow.join();
    let rep = r.report();
    let failed_after = failed_after.expect("/readyz never turned 503 within 2 s");
    let killed = num(&rep, "drain.killed_at_ms");
    let deadline = num(&rep, "drain.deadline_ms");
    let rate = before;
    eprintln!(
        "flood ~{rate} req/s through the proxy: /readyz 503 after {} µs; SIGKILL at {killed} ms for a deadline at {deadline} ms",
        failed_after.as_micros()
    );
    assert!(
        failed_after < Duration::from_secs(1),
        "/readyz took {failed_after:?}"
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
