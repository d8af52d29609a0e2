//! The admission proxy (`--proxy LISTEN=UPSTREAM`, docs/proxy.md), black box: the real
//! binary in front of a real app (tests/fixtures/proxyapp.py: routes, modes and its
//! log are described in its header), real clients over `std::net` with a small
//! HTTP/1.1 reader below, and what a client got, what the app's log says it received,
//! and what the exit report says.
//!
//! Every report read here is checked against the ledger's equations (`ledger`).
//! Durations are short (pre-drain 200 ms–2 s, drain 1–10 s); upper bounds are
//! generous deadlines. Tests wait for events (a line of the app's log or of
//! drainit's, a `/metrics` counter) rather than sleep; where a test acts inside
//! a window of the behaviour (the pre-drain delay), it checks by the order of
//! events that it did ("admission closed" not yet logged) rather than pass by
//! luck.
//!
//! Covered: pass-through and keep-alive (both sides), hop-by-hop and
//! X-Forwarded-For and Forwarded, streaming both ways in bounded memory, the gate before ready,
//! an upstream that refuses, the health path, the beats (Connection: close, the
//! draining 503 on new and idle connections, the forward after the last request,
//! PID 1 too), the deadline (abandoned, named), lost/canceled outcomes, /metrics,
//! bad clients (400, 431, slowloris), floods across a drain, WebSocket and SSE
//! streams, bad values (64/78).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

// ---------------------------------------------------------------- the setup

/// drainit with `--proxy 127.0.0.1:port=127.0.0.1:app` in front of proxyapp.py.
struct Px {
    r: Running,
    /// The proxy's listening port.
    port: u16,
    /// drainit's probe port (`/readyz`).
    probe: u16,
}

/// Starts drainit in `mode` with `--probe-addr`, `--proxy` and `flags` (in which
/// `{app}` is replaced by the app's port), running proxyapp.py with
/// `--port APP --log $TMP/app.log` and `app_args`.
///
/// The three ports come from [`free_port`], which frees them before they are
/// bound: on a busy machine another process may take one first. Such a start
/// (drainit or the app finds its port in use) is retried with new ports, at most
/// three times; the app's port is checked only when it listens at once.
fn start_px(mode: Mode, flags: &[&str], app_args: &[&str]) -> Px {
    let listens_at_once = !app_args.contains(&"--listen-after");
    for attempt in 1..=3 {
        let px = start_px_once(mode, flags, app_args);
        let started = wait_for(secs(10), || {
            if !px.logged("start").is_empty()
                && (!listens_at_once || !px.logged("listening").is_empty())
            {
                Some(true)
            } else if !alive(px.r.pid) {
                Some(false)
            } else {
                None
            }
        });
        let taken = {
            let err = px.r.stderr_text();
            err.contains("Address already in use") || err.contains("address in use")
        };
        match started {
            Some(true) => return px,
            Some(false) if taken && attempt < 3 => {
                eprintln!("start_px: a port was taken by someone else, retrying");
                continue;
            }
            _ => panic!("the app never started (attempt {attempt}){}", px.ctx()),
        }
    }
    unreachable!()
}

/// The usual setup: a graceful app behind the proxy as a subreaper, readiness
/// from the app's port, no pre-drain delay; returned once ready.
fn start_graceful() -> Px {
    let px = start_px(
        Mode::Subreaper,
        &["--ready-tcp", "127.0.0.1:{app}", "--pre-drain-delay", "0s"],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    px
}

/// [`start_graceful`] with `threads` proxy threads (`--proxy-threads`). Each
/// thread pools its own connections to the app, so a second client
/// connection is sure to get the first one's pooled connection only with one.
fn start_graceful_on_threads(threads: usize) -> Px {
    let threads = threads.to_string();
    let px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--proxy-threads",
            &threads,
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    px
}

fn start_px_once(mode: Mode, flags: &[&str], app_args: &[&str]) -> Px {
    let [port, app, probe] = free_ports();
    let probe_addr = format!("127.0.0.1:{probe}");
    let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app}");
    let mut args: Vec<String> = vec!["--probe-addr".into(), probe_addr, "--proxy".into(), proxy];
    args.extend(flags.iter().map(|f| f.replace("{app}", &app.to_string())));
    args.push("--".into());
    args.extend([
        python().to_string(),
        fixture("proxyapp.py"),
        "--port".into(),
        app.to_string(),
        "--log".into(),
        "$TMP/app.log".into(),
    ]);
    args.extend(app_args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    // drainit binds the listen socket before it starts the app: once the app
    // logged its start, connections to the proxy are accepted.
    Px {
        r: Running::start(mode, &argv),
        port,
        probe,
    }
}

impl Px {
    /// The app's log (see proxyapp.py).
    fn log(&self) -> String {
        std::fs::read_to_string(self.r.path("app.log")).unwrap_or_default()
    }

    /// The app's log lines starting with `prefix`.
    fn logged(&self, prefix: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    /// The t= of the app's first log line starting with `prefix`.
    fn logged_t(&self, prefix: &str) -> Option<u64> {
        self.logged(prefix)
            .first()?
            .rsplit_once(" t=")?
            .1
            .parse()
            .ok()
    }

    /// Waits (10 s) until drainit's `/readyz` answers 200.
    fn wait_ready(&self) {
        assert!(
            wait_until(secs(10), || http(self.probe, "/readyz", "GET").0 == 200),
            "drainit never became ready{}",
            self.ctx()
        );
    }

    /// Waits (5 s) until the app's log has a line starting with `prefix`
    /// (`recv GET /slow`: the request is in the app).
    fn wait_logged(&self, prefix: &str) {
        assert!(
            wait_until(secs(5), || !self.logged(prefix).is_empty()),
            "{}",
            self.ctx()
        );
    }

    /// Waits (10 s) until drainit's stderr has a line containing `text`
    /// (`admission closed`: beat 3 has begun).
    fn wait_drainit_logged(&self, text: &str) {
        assert!(
            wait_until(secs(10), || self.r.stderr_text().contains(text)),
            "drainit never logged {text:?}{}",
            self.ctx()
        );
    }

    /// Waits (10 s) until a line of drainit's `/metrics` is exactly `line`
    /// (`drainit_proxy_requests_total{outcome="canceled"} 1`: the ledger has
    /// settled that request).
    fn wait_metric(&self, line: &str) {
        assert!(
            wait_until(secs(10), || http(self.probe, "/metrics", "GET")
                .2
                .lines()
                .any(|l| l == line)),
            "/metrics never had {line:?}:\n{}{}",
            http(self.probe, "/metrics", "GET").2,
            self.ctx()
        );
    }

    /// A new client connection to the proxy.
    fn conn(&self) -> Conn {
        Conn::open(self.port)
    }

    /// Sends SIGTERM and waits (2 s) until drainit has taken it (T0: `/readyz`
    /// turns 503 in the same step as the gate moves): T0 is when drainit reads
    /// the signal, and a request sent between the kill and that instant is still
    /// one from before T0.
    fn term(&mut self) {
        self.r.signal(libc::SIGTERM);
        assert!(
            wait_until(secs(2), || http(self.probe, "/readyz", "GET").0 == 503),
            "drainit did not take the SIGTERM{}",
            self.ctx()
        );
    }

    /// Sends SIGTERM, waits (`within`) for the exit: (exit code, the report after
    /// the ledger check).
    fn stop(&mut self, within: Duration) -> (i32, Value) {
        self.r.signal(libc::SIGTERM);
        self.finish(within)
    }

    /// Waits (`within`) for drainit to exit: (exit code, the report after the
    /// ledger check).
    fn finish(&mut self, within: Duration) -> (i32, Value) {
        let (code, _) = self.r.wait(within);
        let rep = self.r.report();
        ledger(&rep);
        (code, rep)
    }

    fn ctx(&self) -> String {
        format!(
            "\nstderr:\n{}\napp log:\n{}",
            self.r.stderr_text(),
            self.log()
        )
    }
}

// ---------------------------------------------------------------- a small client

/// One response: status, head (names lowercased), body.
#[derive(Debug)]
struct Resp {
    status: u16,
    head: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The response says `Connection: close`.
    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection, with what was read and not consumed yet.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the proxy");
        s.set_read_timeout(Some(secs(10))).unwrap();
        s.set_write_timeout(Some(secs(30))).unwrap();
        Conn { s, buf: Vec::new() }
    }

    /// A connection whose receive buffer is 4 KiB (`SO_RCVBUF`, set before
    /// the connect so the window is small from the start): what the client has
    /// not read stays on drainit's side, as for a client on a slow link.
    fn open_small_window(port: u16) -> Conn {
        let s = connect_small(port, 4096);
        s.set_read_timeout(Some(secs(10))).unwrap();
        s.set_write_timeout(Some(secs(30))).unwrap();
        Conn { s, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.s.write_all(bytes)
    }

    /// Sends `METHOD PATH HTTP/1.1` with `Host` and `headers`, and `body` with its
    /// Content-Length when given.
    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> io::Result<()> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        if let Some(b) = body {
            bytes.extend_from_slice(b);
        }
        self.send(&bytes)
    }

    /// A GET on this connection (keep-alive) and its response.
    fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> io::Result<Resp> {
        self.request("GET", path, headers, None)?;
        self.response(false)
    }

    /// Reads more bytes; Err(UnexpectedEof) at end of stream.
    fn fill(&mut self) -> io::Result<()> {
        let mut b = [0u8; 65536];
        let n = self.s.read(&mut b)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        self.buf.extend_from_slice(&b[..n]);
        Ok(())
    }

    fn take_line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            self.fill()?;
        }
    }

    fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill()?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Status and head of the next response.
    fn head(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        let status_line = self.take_line()?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("status line {status_line:?}"),
                )
            })?;
        let mut head = Vec::new();
        loop {
            let line = self.take_line()?;
            if line.is_empty() {
                return Ok((status, head));
            }
            if let Some((k, v)) = line.split_once(':') {
                head.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }

    /// The next chunk of a chunked body (empty: the last one, trailers consumed).
    fn chunk(&mut self) -> io::Result<Vec<u8>> {
        let size_line = self.take_line()?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if size == 0 {
            while !self.take_line()?.is_empty() {}
            return Ok(Vec::new());
        }
        let data = self.take(size)?;
        self.take(2)?;
        Ok(data)
    }

    /// The next whole response (`head_only`: the answer to a HEAD, no body).
    fn response(&mut self, head_only: bool) -> io::Result<Resp> {
        let (status, head) = self.head()?;
        let get = |k: &str| head.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut body = Vec::new();
        if head_only || status < 200 || status == 204 || status == 304 {
        } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let c = self.chunk()?;
                if c.is_empty() {
                    break;
                }
                body.extend(c);
            }
        } else if let Some(n) = get("content-length") {
            let n: usize = n.parse().unwrap();
            body = self.take(n)?;
        } else {
            loop {
                match self.fill() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
            }
            body = std::mem::take(&mut self.buf);
        }
        Ok(Resp { status, head, body })
    }

    /// The peer closed the connection (EOF, or a reset) within 5 s, with nothing
    /// more to read.
    fn closed(&mut self) -> bool {
        self.s.set_read_timeout(Some(secs(5))).unwrap();
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_)) && self.buf.is_empty()
    }
}

/// A GET on a fresh connection.
fn get(port: u16, path: &str) -> Resp {
    let mut c = Conn::open(port);
    c.get(path, &[])
        .unwrap_or_else(|e| panic!("GET {path} through the proxy: {e}"))
}

/// drainit's VmRSS in kB.
fn rss_kb(pid: i32) -> u64 {
    status_field(pid, "VmRSS")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Asserts the local 503 of a closed admission (beat 3): Retry-After,
/// Connection: close, Proxy-Status naming drainit.
fn assert_draining_503(resp: &Resp, what: &str) {
    assert_eq!(resp.status, 503, "{what}: {resp:?}");
    assert_eq!(resp.header("retry-after"), Some("1"), "{what}: {resp:?}");
    assert!(resp.closes(), "{what}: no Connection: close: {resp:?}");
    let ps = resp.header("proxy-status").unwrap_or_default();
    assert!(
        ps.starts_with("drainit") && ps.contains("destination_unavailable"),
        "{what}: Proxy-Status {ps:?}"
    );
}

// ---------------------------------------------------------------- pass-through

#[test]
fn passes_requests_through_on_a_reused_keep_alive_connection_and_a_clean_run_counts_them() {
    let mut px = start_graceful();
    let mut c = px.conn();
    for i in 0..3 {
        let resp = c
            .get("/ok", &[])
            .unwrap_or_else(|e| panic!("GET #{i} on one connection: {e}{}", px.ctx()));
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(resp.body.len(), 1024);
        assert!(
            !resp.closes(),
            "Connection: close before any drain: {resp:?}"
        );
    }
    // Bodies both ways, on the same connection.
    c.request("POST", "/upload", &[], Some(&[7u8; 5000]))
        .unwrap();
    let up = c.response(false).unwrap();
    assert_eq!((up.status, up.text().as_str()), (200, "5000\n"));
    // HEAD: the head only, the connection still in step; an error status is a
    // completed request like any other.
    c.request("HEAD", "/ok", &[], None).unwrap();
    let head = c.response(true).unwrap();
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("1024"))
    );
    assert_eq!(c.get("/nothing-here", &[]).unwrap().status, 404);
    // A 30 kB header passes whole.
    let big = "c".repeat(30_000);
    let echoed = c.get("/echo-headers", &[("Cookie", &big)]).unwrap();
    assert_eq!(echoed.status, 200);
    assert!(
        echoed.text().contains(&big),
        "the 30 kB header did not reach the app"
    );
    // The app saw each, on one pooled upstream connection.
    let recv = px.logged("recv GET /ok");
    assert_eq!(recv.len(), 3, "{}", px.ctx());
    let peer = |l: &str| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix("peer="))
            .map(String::from)
    };
    assert!(
        recv.iter().all(|l| peer(l) == peer(&recv[0])),
        "sequential requests did not reuse the upstream connection: {recv:?}"
    );
    drop(c);
    // The last response counts `completed` once the client's TCP has
    // acknowledged it (checked a moment after its flush): settled before the
    // SIGTERM, nothing is in flight at T0.
    px.wait_metric("drainit_proxy_requests_in_flight 0");
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(text(&rep, "reason"), "drained");
    // received, rejected, admitted, completed, unknown, abandoned, canceled,
    // in_flight, malformed
    assert_eq!(counts(&rep), [7, 0, 7, 7, 0, 0, 0, 0, 0], "{rep}");
    assert_eq!(num(&rep, "requests.in_flight_at_start"), 0);
    assert_eq!(rep["requests"]["lost"].as_array().unwrap().len(), 0);
    assert_eq!(num(&rep, "streams.opened"), 0);
}

/// `--proxy-threads N`: N threads named `drainit-proxy` serve the proxy (`ps -T`
/// shows them), one as well as several; `--check-config` shows the number, and
/// `auto`'s number for this machine.
#[test]
fn the_proxy_is_served_by_the_threads_it_is_given() {
    for n in [1usize, 3] {
        let mut px = start_graceful_on_threads(n);
        let workers = std::fs::read_dir(format!("/proc/{}/task", px.r.pid))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == "drainit-proxy")
            .count();
        assert_eq!(workers, n, "--proxy-threads {n}{}", px.ctx());
        // Twelve connections at once, three requests each.
        let clients: Vec<_> = (0..12)
            .map(|_| {
                let port = px.port;
                std::thread::spawn(move || {
                    let mut c = Conn::open(port);
                    (0..3)
                        .map(|_| c.get("/ok", &[]).map(|r| r.status).unwrap_or(0))
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        for c in clients {
            assert_eq!(
                c.join().unwrap(),
                [200; 3],
                "--proxy-threads {n}{}",
                px.ctx()
            );
        }
        let (code, rep) = px.stop(secs(8));
        assert_eq!(code, 0, "{}", px.ctx());
        assert_eq!(counts(&rep), [36, 0, 36, 36, 0, 0, 0, 0, 0], "{rep}");
    }
    let proxy = "127.0.0.1:8080=127.0.0.1:8081";
    let shown = |extra: &[&str]| {
        let mut args = vec!["--check-config", "--proxy", proxy];
        args.extend(extra);
        let mut r = Running::start_direct(&args, &[], &["DRAINIT_PROXY_THREADS"]);
        assert_eq!(r.wait(secs(10)).0, 0, "{}", r.stderr_text());
        let out = std::fs::read_to_string(r.tmp.join("stdout")).unwrap();
        out.lines()
            .find(|l| l.starts_with("proxy_threads"))
            .unwrap_or_else(|| panic!("no proxy_threads line in {out}"))
            .to_string()
    };
    assert_eq!(shown(&["--proxy-threads", "3"]), "proxy_threads = \"3\"");
    let auto = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 4));
    assert_eq!(
        shown(&[]),
        format!("proxy_threads = \"auto\"  # {auto} here")
    );
}

/// The OS refuses the proxy's threads (a pids limit, here `RLIMIT_NPROC` of a
/// uid no account has, so that only drainit's own threads count): drainit says so and exits 1 at once, before the
/// child starts. tokio panics when it cannot spawn a worker, and the panic's
/// unwinding waits for the workers already started, which never stop: before,
/// drainit hung there for good, its SIGTERM blocked and never read.
#[test]
fn proxy_threads_the_os_refuses_are_an_error_not_a_hang() {
    let ports = ProxyPorts::new();
    let argv = ports.argv(
        &["--proxy-threads", "8"],
        &["sh", "-c", "echo child-ran >&2; exec sleep 30"],
    );
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--user", "64102", "--nproc", "4"],
        args: &args,
        env: &[],
    });
    let (code, _) = r.wait(secs(10));
    let err = r.stderr_text();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("starting the proxy failed"), "{err}");
    assert!(err.contains("thread"), "{err}");
    assert!(!err.contains("child-ran"), "the child started: {err}");
}

#[test]
fn adds_x_forwarded_for_and_forwarded_and_drops_hop_by_hop_headers() {
    let mut px = start_graceful();
    let mut c = px.conn();
    let resp = c
        .get(
            "/echo-headers",
            &[
                ("Connection", "keep-alive, X-Hop-Secret"),
                ("X-Hop-Secret", "must not pass"),
                ("Keep-Alive", "timeout=5"),
                ("Proxy-Connection", "keep-alive"),
                ("TE", "trailers"),
                ("X-End-To-End", "kept"),
                ("X-Forwarded-For", "10.1.2.3"),
                ("Forwarded", "for=10.1.2.3;proto=https"),
            ],
        )
        .unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    let got: Vec<(String, String)> = serde_json::from_slice(&resp.body).unwrap();
    let get = |k: &str| -> Vec<&str> {
        got.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(get("x-end-to-end"), ["kept"], "{got:?}");
    for hop in ["x-hop-secret", "keep-alive", "proxy-connection", "te"] {
        assert!(
            get(hop).is_empty(),
            "hop-by-hop {hop} was forwarded: {got:?}"
        );
    }
    assert!(
        get("connection")
            .iter()
            .all(|v| !v.to_ascii_lowercase().contains("x-hop-secret")),
        "the client's Connection header was forwarded: {got:?}"
    );
    // Appended to what the client sent: "10.1.2.3, 127.0.0.1" (one header or two).
    // An HTTP/1.0 client gets an HTTP/1.0 response.
    let mut c10 = px.conn();
    c10.send(b"GET /ok HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let _ = c10.s.read_to_end(&mut raw);
    assert!(
        raw.starts_with(b"HTTP/1.0 200"),
        "{}",
        String::from_utf8_lossy(&raw[..raw.len().min(200)])
    );
    let xff = get("x-forwarded-for").join(", ");
    let hops: Vec<&str> = xff.split(',').map(str::trim).collect();
    assert_eq!(hops, ["10.1.2.3", "127.0.0.1"], "{got:?}");
    // RFC 7239: the element received is kept, drainit's comes after it.
    let fwd = get("forwarded").join(", ");
    let elements: Vec<&str> = fwd.split(',').map(str::trim).collect();
    assert_eq!(
        elements,
        ["for=10.1.2.3;proto=https", "for=127.0.0.1"],
        "{got:?}"
    );
    drop(c);
    let (code, _) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

#[test]
fn streams_a_chunked_response_chunk_by_chunk() {
    let mut px = start_graceful();
    let gate = px.r.path("gate");
    let mut c = px.conn();
    c.request(
        "GET",
        &format!("/chunked?n=4&gate={}", gate.display()),
        &[],
        None,
    )
    .unwrap();
    let (status, head) = c.head().unwrap_or_else(|e| panic!("{e}{}", px.ctx()));
    assert_eq!(status, 200, "{head:?}");
    // The app holds its last chunk until the gate exists: the first three must
    // reach the client before, or the proxy buffered the body.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(
            c.chunk()
                .unwrap_or_else(|e| panic!("a chunk before the gate opened: {e}{}", px.ctx())),
        );
    }
    assert_eq!(String::from_utf8_lossy(&got), "chunk 0\nchunk 1\nchunk 2\n");
    std::fs::write(&gate, "").unwrap();
    let mut rest = Vec::new();
    loop {
        let ch = c.chunk().unwrap();
        if ch.is_empty() {
            break;
        }
        rest.extend(ch);
    }
    assert_eq!(String::from_utf8_lossy(&rest), "chunk 3\n");
    drop(c);
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 1, "{rep}");
}

#[test]
fn streams_a_256_mib_chunked_upload_without_growing() {
    let mut px = start_graceful();
    // Warm the proxy's paths up with a small request, then read the baseline.
    assert_eq!(get(px.port, "/ok").status, 200);
    let pid = px.r.pid;
    let base = rss_kb(pid);
    let peak = Arc::new(AtomicU64::new(base));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                peak.fetch_max(rss_kb(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    const PIECE: usize = 64 * 1024;
    const PIECES: usize = 4096; // 256 MiB
    let mut frame = format!("{PIECE:x}\r\n").into_bytes();
    frame.extend(std::iter::repeat_n(b'x', PIECE));
    frame.extend(b"\r\n");
    let started = Instant::now();
    let mut c = px.conn();
    c.send(b"POST /upload HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    for i in 0..PIECES {
        c.send(&frame)
            .unwrap_or_else(|e| panic!("upload cut at piece {i}: {e}{}", px.ctx()));
    }
    c.send(b"0\r\n\r\n").unwrap();
    let resp = c.response(false).unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(
        (resp.status, resp.text().trim()),
        (200, (PIECE * PIECES).to_string().as_str()),
        "the app did not get the whole body"
    );
    let peak = peak.load(Ordering::Relaxed);
    eprintln!("256 MiB upload: {took:?}, drainit VmRSS {base} kB before, peak {peak} kB");
    assert!(
        peak < 20 * 1024 && peak - base < 8 * 1024,
        "drainit grew with the body: VmRSS {base} kB -> peak {peak} kB"
    );
    drop(c);
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 2, "{rep}");
}

#[test]
fn streams_a_256_mib_chunked_download_to_a_slow_reader_without_growing() {
    let mut px = start_graceful();
    assert_eq!(get(px.port, "/ok").status, 200);
    let pid = px.r.pid;
    let base = rss_kb(pid);
    let mut peak = base;
    let mut c = px.conn();
    c.request("GET", "/big?mb=256", &[], None).unwrap();
    let (status, _) = c.head().unwrap();
    assert_eq!(status, 200);
    let mut got = 0usize;
    let mut paused = false;
    let started = Instant::now();
    loop {
        let ch = c
            .chunk()
            .unwrap_or_else(|e| panic!("download cut after {got} bytes: {e}{}", px.ctx()));
        if ch.is_empty() {
            break;
        }
        got += ch.len();
        if !paused && got >= 1 << 20 {
            // A reader that stops: the app keeps writing; drainit must not absorb it.
            paused = true;
            for _ in 0..50 {
                std::thread::sleep(Duration::from_millis(10));
                peak = peak.max(rss_kb(pid));
            }
        }
        if got % (8 << 20) < ch.len() {
            peak = peak.max(rss_kb(pid));
        }
    }
    let took = started.elapsed();
    assert_eq!(got, 256 << 20, "the client did not get the whole body");
    eprintln!("256 MiB download: {took:?}, drainit VmRSS {base} kB before, peak {peak} kB");
    assert!(
        peak < 20 * 1024 && peak - base < 8 * 1024,
        "drainit grew with the body: VmRSS {base} kB -> peak {peak} kB"
    );
    drop(c);
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 2, "{rep}");
}

// ---------------------------------------------------------------- admission

#[test]
fn rejects_with_503_before_ready_and_never_reaches_the_app() {
    // The app listens after 1 s and reports ready (GET /ready) only once the test
    // creates $TMP/go: both before and after it listens, drainit is not ready.
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-http",
            "http://127.0.0.1:{app}/ready",
            "--ready-interval",
            "50ms",
            "--pre-drain-delay",
            "0s",
        ],
        &["--listen-after", "1000", "--ready-file", "$TMP/go"],
    );
    let mut rejected = 0;
    // Before the app listens.
    let resp = get(px.port, "/ok");
    assert_eq!(resp.status, 503, "{resp:?}{}", px.ctx());
    rejected += 1;
    // Listening, not ready.
    assert!(
        wait_until(secs(10), || !px.logged("listening").is_empty()),
        "{}",
        px.ctx()
    );
    for _ in 0..3 {
        let resp = get(px.port, "/ok");
        assert_eq!(resp.status, 503, "{resp:?}{}", px.ctx());
        rejected += 1;
    }
    assert!(
        px.logged("recv GET /ok").is_empty(),
        "a request reached an app that was not ready{}",
        px.ctx()
    );
    std::fs::write(px.r.path("go"), "").unwrap();
    px.wait_ready();
    assert_eq!(get(px.port, "/ok").status, 200);
    assert_eq!(px.logged("recv GET /ok").len(), 1, "{}", px.ctx());
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.rejected"), rejected, "{rep}");
    assert_eq!(num(&rep, "requests.completed"), 1, "{rep}");
}

#[test]
fn an_upstream_that_refuses_gets_a_retryable_503() {
    // No readiness check (ready at once); the app takes 30 s to listen.
    let mut px = start_px(
        Mode::Subreaper,
        &["--pre-drain-delay", "0s"],
        &["--listen-after", "30000"],
    );
    px.wait_ready();
    let resp = get(px.port, "/ok");
    assert_eq!(resp.status, 503, "{resp:?}{}", px.ctx());
    assert!(resp.header("retry-after").is_some(), "{resp:?}");
    let ps = resp.header("proxy-status").unwrap_or_default();
    assert!(ps.contains("error=connection_refused"), "{ps}");
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..3], [1, 1, 0], "{rep}");
}

/// An app slow to accept: Linux drops a SYN while the listener's accept
/// queue is full, and the connecting side sends it again 1 s, then 3 s after
/// the first. drainit waits for a connection as long as Envoy's default
/// connect timeout (5 s), so the request is served once the app accepts (as a
/// client connecting directly would be), not answered 503. With a bound of
/// 2 s it was a 503 at 2 s. An app that accepts nothing for 5 s gets its
/// client a retryable 503 that says so (`Proxy-Status`, RFC 9209
/// `connection_timeout`), counted `rejected`.
#[test]
fn a_connection_the_app_is_slow_to_accept_is_waited_for_not_a_503() {
    let (app, _filler, app_port) = full_listener();
    let (mut r, port, _probe) = proxy_to(app_port, &["--pre-drain-delay", "0s"]);
    // Nothing accepted: the connect bound ends it.
    let sent = Instant::now();
    let resp = get(port, "/never-accepted");
    let took = sent.elapsed();
    assert_eq!(resp.status, 503, "{resp:?}");
    assert!(took >= Duration::from_millis(4500), "{took:?}");
    assert_eq!(resp.header("retry-after"), Some("1"), "{resp:?}");
    let ps = resp.header("proxy-status").unwrap_or_default();
    assert!(ps.contains("error=connection_timeout"), "{ps}");
    // Accepted late: waited for.
    let sent = Instant::now();
    let client = std::thread::spawn(move || get(port, "/slow-accept"));
    // The app accepts after 1.5 s: the second SYN (1 s) was dropped, the
    // third (3 s) gets through, past the old bound of 2 s and inside the new
    // one. 1.5 s, not 2.5: a test thread that oversleeps by half a second on
    // a loaded machine would have missed the third SYN and made the connect a
    // 503 at 5 s.
    std::thread::sleep(Duration::from_millis(1500));
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut c, _) = app.accept().unwrap();
            std::thread::spawn(move || {
                c.set_read_timeout(Some(secs(5))).unwrap();
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(n) if n > 0 => head.extend_from_slice(&b[..n]),
                        _ => return, // the filler: it sends nothing
                    }
                }
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\naccepted");
                std::thread::sleep(secs(1));
            });
        }
    });
    let resp = client.join().unwrap();
    let took = sent.elapsed();
    assert_eq!(
        (resp.status, resp.text().as_str()),
        (200, "accepted"),
        "after {took:?}: {}",
        r.stderr_text()
    );
    server.join().unwrap();
    r.signal(libc::SIGTERM);
    r.wait(secs(10));
    let rep = r.report();
    ledger(&rep);
    assert_eq!(counts(&rep)[..4], [2, 1, 1, 1], "{rep}");
}

/// A request still connecting to the app when the drain deadline comes (the
/// app's accept queue full: the connect bound, 5 s, is longer than the drain
/// timeout) never reached the app: its client gets drainit's retryable 503 at
/// the deadline, and it counts `rejected`, not `abandoned` and lost; drainit
/// does not wait for the connect to exit. Before, its connection was cut at
/// drainit's exit without a response (curl: "Empty reply from server") and it
/// was counted `abandoned`.
#[test]
fn a_request_still_connecting_at_the_deadline_gets_a_503_and_counts_rejected() {
    let (_app, _filler, app_port) = full_listener();
    let (mut r, port, probe) = proxy_to(
        app_port,
        &["--pre-drain-delay", "0s", "--drain-timeout", "2s"],
    );
    let client = std::thread::spawn(move || Conn::open(port).get("/connecting", &[]));
    // The request is admitted and connecting (its SYN dropped) when the drain
    // starts: the forward waits for it, and the deadline comes first.
    assert!(
        wait_until(secs(10), || http(probe, "/metrics", "GET")
            .2
            .contains("drainit_proxy_requests_in_flight 1")),
        "{}",
        r.stderr_text()
    );
    r.signal(libc::SIGTERM);
    let (code, ms) = r.wait(secs(15));
    let resp = client.join().unwrap();
    let resp = resp.unwrap_or_else(|e| panic!("no response: {e}{}", r.stderr_text()));
    assert_eq!(resp.status, 503, "{resp:?}");
    assert_eq!(resp.header("retry-after"), Some("1"), "{resp:?}");
    let ps = resp.header("proxy-status").unwrap_or_default();
    assert!(ps.contains("error=destination_unavailable"), "{ps}");
    assert_eq!(code, 2, "{}", r.stderr_text());
    // The deadline (2 s), not the connect bound (5 s), ends it.
    assert!(ms < 4500, "drainit exited {ms} ms after SIGTERM");
    let rep = r.report();
    ledger(&rep);
    assert_eq!(counts(&rep)[..8], [1, 1, 0, 0, 0, 0, 0, 0], "{rep}");
    assert_eq!(num(&rep["requests"], "in_flight_at_start"), 1, "{rep}");
    let err = r.stderr_text();
    assert!(
        err.contains("SIGKILL: 1 request(s) still waiting for the app to accept")
            && !err.contains("request(s) still in flight and"),
        "{err}"
    );
}

#[test]
fn the_health_path_follows_readiness_and_never_reaches_the_app() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--proxy-health",
            "/health",
            "--ready-http",
            "http://127.0.0.1:{app}/ready",
            "--ready-interval",
            "50ms",
            "--pre-drain-delay",
            "2s",
            "--drain-timeout",
            "5s",
        ],
        &["--mode", "graceful", "--ready-file", "$TMP/go"],
    );
    assert!(
        wait_until(secs(10), || !px.logged("listening").is_empty()),
        "{}",
        px.ctx()
    );
    assert_eq!(get(px.port, "/health").status, 503, "before ready");
    std::fs::write(px.r.path("go"), "").unwrap();
    px.wait_ready();
    let h = get(px.port, "/health");
    assert_eq!((h.status, h.text().trim()), (200, "ready"), "{h:?}");
    let mut c = px.conn();
    c.request("HEAD", "/health", &[], None).unwrap();
    assert_eq!(c.response(true).unwrap().status, 200);
    // A neighbour path, and another method, are the app's.
    assert_eq!(get(px.port, "/health/x").status, 404);
    c.request("POST", "/health", &[], Some(b"x")).unwrap();
    assert_eq!(c.response(false).unwrap().status, 404);
    assert_eq!(px.logged("recv POST /health").len(), 1, "{}", px.ctx());
    drop(c);
    px.term();
    // From T0, inside the pre-drain delay: 503, while the app still serves.
    let h = get(px.port, "/health");
    assert_eq!(h.status, 503, "{h:?}");
    let ok = get(px.port, "/ok");
    assert_eq!(
        ok.status,
        200,
        "the app no longer served after the health path failed{}",
        px.ctx()
    );
    assert!(
        !px.r.stderr_text().contains("admission closed"),
        "the health path failed only once admission had closed{}",
        px.ctx()
    );
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert!(
        px.log()
            .lines()
            .all(|l| !l.contains("GET /health ") && !l.contains("HEAD /health ")),
        "the health path reached the app{}",
        px.ctx()
    );
    // Only /health/x, POST /health and /ok are counted.
    assert_eq!(counts(&rep)[..4], [3, 0, 3, 3], "{rep}");
}

/// The health path answers as `/readyz` does (docs/proxy.md, "Health path"): once ready,
/// a check that fails again makes `/readyz` 503 `degraded`, and the health path
/// with it, while requests still pass.
#[test]
fn the_health_path_fails_when_readyz_says_degraded() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--proxy-health",
            "/health",
            "--ready-http",
            "http://127.0.0.1:{app}/ready",
            "--ready-interval",
            "50ms",
            "--pre-drain-delay",
            "0s",
        ],
        &["--mode", "graceful", "--ready-file", "$TMP/go"],
    );
    std::fs::write(px.r.path("go"), "").unwrap();
    px.wait_ready();
    assert_eq!(get(px.port, "/health").status, 200);
    std::fs::remove_file(px.r.path("go")).unwrap();
    let (st, _, body) = http(px.probe, "/readyz", "GET");
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("degraded"), "{body}");
    let h = get(px.port, "/health");
    assert_eq!(
        h.status, 503,
        "/readyz says degraded, the health path {h:?}"
    );
    assert_eq!(get(px.port, "/ok").status, 200);
    let (code, _) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

/// A second drain signal cuts the wait for the requests in flight short (docs/proxy.md):
/// the app is signalled at once, and a naive app dies with the request inside.
#[test]
fn a_second_drain_signal_forwards_at_once_with_a_request_in_flight() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "10s",
        ],
        &["--mode", "naive"],
    );
    px.wait_ready();
    let port = px.port;
    let slow = std::thread::spawn(move || {
        let mut s = Conn::open(port);
        s.get("/slow?ms=5000", &[]).map(|r| r.status)
    });
    px.wait_logged("recv GET /slow");
    px.r.signal(libc::SIGTERM);
    // Beat 3 has come (no delay), and the drain signal waits for the request.
    px.wait_drainit_logged("admission closed");
    assert!(
        px.logged("signal TERM").is_empty() && !px.r.stderr_text().contains("forwarded"),
        "forwarded with a request in flight{}",
        px.ctx()
    );
    // Past the 100 ms in which a second signal counts as the first: time passing
    // (the behaviour's window), not a wait for anything.
    std::thread::sleep(Duration::from_millis(200));
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(4));
    assert!(
        !px.logged("signal TERM").is_empty(),
        "the second signal was not forwarded{}",
        px.ctx()
    );
    // The request died in the app after T0: lost, and the drain is not clean.
    assert_eq!(code, 2, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 0, "{rep}");
    assert_eq!(
        num(&rep, "requests.unknown") + num(&rep, "requests.abandoned"),
        1,
        "{rep}"
    );
    let got = slow.join().unwrap();
    assert!(!matches!(got, Ok(200)), "{got:?}");
}

/// Once the app was signalled, the proxy port still answers (drainit's 503) until
/// drainit exits, rather than refusing connections.
#[test]
fn after_the_forward_the_proxy_port_answers_503_until_the_exit() {
    let mut px = start_px(
        Mode::Subreaper,
        &["--ready-tcp", "127.0.0.1:{app}", "--pre-drain-delay", "0s"],
        &["--mode", "graceful", "--exit-delay", "1500"],
    );
    px.wait_ready();
    px.r.signal(libc::SIGTERM);
    px.wait_logged("signal TERM");
    let resp = get(px.port, "/ok");
    assert_draining_503(&resp, "after the forward");
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..3], [1, 1, 0], "{rep}");
}

/// Being asked for the health path makes the default pre-drain delay apply, as
/// `/readyz` does; not being asked leaves it 0 (outside Kubernetes).
#[test]
fn asking_the_health_path_makes_the_default_pre_drain_delay_apply() {
    for ask in [false, true] {
        let mut px = start_px(
            Mode::Subreaper,
            &[
                "--proxy-health",
                "/health",
                "--ready-tcp",
                "127.0.0.1:{app}",
            ],
            &["--mode", "graceful"],
        );
        // Ready, without asking /readyz (which would make the delay apply itself);
        // the proxy port may not be bound yet when drainit has just started.
        assert!(
            wait_until(secs(10), || {
                TcpStream::connect(("127.0.0.1", px.port)).is_ok()
                    && get(px.port, "/ok").status == 200
            }),
            "{}",
            px.ctx()
        );
        if ask {
            assert_eq!(get(px.port, "/health").status, 200);
        }
        px.r.signal(libc::SIGTERM);
        if ask {
            // A second signal cuts the 5 s wait short, not the figure.
            std::thread::sleep(Duration::from_millis(200));
            px.r.signal(libc::SIGTERM);
        }
        let (code, rep) = px.finish(secs(8));
        assert_eq!(code, 0, "{}", px.ctx());
        assert_eq!(
            num(&rep, "drain.pre_drain_delay_ms"),
            if ask { 5000 } else { 0 },
            "asked the health path: {ask}: {rep}"
        );
    }
}

/// The beats with a 2 s pre-drain delay and one slow request keeping the drain
/// open: `Connection: close` from T0; from T0 + delay a local 503 for a new
/// connection (with a body, read first) and for an idle keep-alive connection
/// opened before T0; the slow request completes.
#[test]
fn the_beats_connection_close_then_a_local_503_even_on_an_idle_keep_alive_connection() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "2s",
            "--drain-timeout",
            "10s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    // A: a keep-alive connection, used once, then idle across T0.
    let mut a = px.conn();
    let first = a.get("/ok", &[]).unwrap();
    assert!(first.status == 200 && !first.closes(), "{first:?}");
    // S: a slow request admitted before T0, keeping the drain open past the delay.
    let port = px.port;
    let slow = std::thread::spawn(move || {
        let mut s = Conn::open(port);
        s.get("/slow?ms=7000", &[]).map(|r| (r.status, r.closes()))
    });
    px.wait_logged("recv GET /slow");
    px.term();
    // Beat 1: still served, with Connection: close, and the connection closes.
    let mut b = px.conn();
    let resp = b.get("/ok", &[]).unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(resp.closes(), "no Connection: close after T0: {resp:?}");
    assert!(
        b.closed(),
        "the connection stayed open after Connection: close"
    );
    // Beat 3: admission closed (the slow request, 7 s in the app, still runs).
    px.wait_drainit_logged("admission closed");
    let mut c = px.conn();
    c.request("POST", "/upload", &[], Some(&[b'y'; 16 * 1024]))
        .unwrap();
    let resp = c
        .response(false)
        .unwrap_or_else(|e| panic!("a new request after the delay: {e}{}", px.ctx()));
    assert_draining_503(&resp, "a new connection after the delay");
    let resp = a
        .get("/ok", &[])
        .unwrap_or_else(|e| panic!("the idle keep-alive connection was cut: {e}{}", px.ctx()));
    assert_draining_503(&resp, "an idle keep-alive connection after the delay");
    assert!(
        !slow.is_finished(),
        "the slow request was over before the 503s were checked{}",
        px.ctx()
    );
    let (st, closes) = slow.join().unwrap().expect("the slow request");
    assert_eq!(st, 200);
    assert!(
        closes,
        "the slow request's response lacked Connection: close"
    );
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(px.logged("recv GET /ok").len(), 2, "{}", px.ctx());
    assert!(px.logged("recv POST").is_empty(), "{}", px.ctx());
    // A, S, B admitted and completed; C and A's second rejected.
    assert_eq!(counts(&rep), [5, 2, 3, 3, 0, 0, 0, 0, 0], "{rep}");
    assert_eq!(num(&rep, "requests.in_flight_at_start"), 1, "{rep}");
}

/// An app with no SIGTERM handling (naive: the signal kills it mid-request) gets
/// its signal only once the request admitted before the drain completed.
#[test]
fn the_drain_signal_waits_for_the_request_in_flight_as_subreaper_and_as_pid_1() {
    for mode in BOTH {
        let mut px = start_px(
            mode,
            &[
                "--ready-tcp",
                "127.0.0.1:{app}",
                "--pre-drain-delay",
                "200ms",
                "--drain-timeout",
                "5s",
            ],
            &["--mode", "naive"],
        );
        px.wait_ready();
        let port = px.port;
        let slow = std::thread::spawn(move || {
            let mut s = Conn::open(port);
            s.get("/slow?ms=1500", &[("X-Request-Id", "slow-1")])
                .map(|r| r.status)
        });
        assert!(
            wait_until(secs(5), || !px.logged("recv GET /slow").is_empty()),
            "{mode:?}{}",
            px.ctx()
        );
        px.r.signal(libc::SIGTERM);
        let st = slow.join().unwrap();
        assert!(
            matches!(st, Ok(200)),
            "{mode:?}: the admitted request was not completed: {st:?}{}",
            px.ctx()
        );
        let (code, rep) = px.finish(secs(8));
        assert_eq!(code, 0, "{mode:?}{}", px.ctx());
        let done = px
            .logged_t("respond GET /slow")
            .expect("the app answered /slow");
        let sig = px
            .logged_t("signal TERM")
            .unwrap_or_else(|| panic!("{mode:?}: the app never got SIGTERM{}", px.ctx()));
        assert!(
            sig >= done,
            "{mode:?}: SIGTERM reached the app {} ms before its request completed",
            done - sig
        );
        assert!(num(&rep, "drain.forwarded_at_ms") >= 1000, "{rep}");
        assert_eq!(counts(&rep), [1, 0, 1, 1, 0, 0, 0, 0, 0], "{mode:?}: {rep}");
        assert_eq!(num(&rep, "requests.in_flight_at_start"), 1, "{rep}");
    }
}

/// The deadline comes with a request inside a naive app: abandoned, named (no
/// query), exit 2; as a subreaper and as PID 1.
#[test]
fn a_request_still_in_flight_at_the_deadline_is_abandoned_and_named() {
    for mode in BOTH {
        let mut px = start_px(
            mode,
            &[
                "--ready-tcp",
                "127.0.0.1:{app}",
                "--pre-drain-delay",
                "0s",
                "--drain-timeout",
                "1s",
            ],
            &["--mode", "naive"],
        );
        px.wait_ready();
        let port = px.port;
        let slow = std::thread::spawn(move || {
            let mut s = Conn::open(port);
            s.get("/slow?ms=8000&secret=1", &[("X-Request-Id", "req-42")])
        });
        assert!(
            wait_until(secs(5), || !px.logged("recv GET /slow").is_empty()),
            "{mode:?}{}",
            px.ctx()
        );
        let (code, rep) = px.stop(secs(6));
        assert_eq!(code, 2, "{mode:?}{}", px.ctx());
        assert_eq!(text(&rep, "reason"), "abandoned", "{rep}");
        let lost: Vec<_> = rep["requests"]["lost"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    text(l, "outcome").to_string(),
                    text(l, "method").to_string(),
                    text(l, "path").to_string(),
                    l["request_id"].as_str().map(String::from),
                    // started before T0
                    l["start_ms"].as_i64().is_some_and(|ms| ms <= 0),
                )
            })
            .collect();
        let want = (
            "abandoned".to_string(),
            "GET".to_string(),
            "/slow".to_string(),
            Some("req-42".to_string()),
            true,
        );
        assert_eq!(
            (counts(&rep), lost),
            ([1, 0, 1, 0, 0, 1, 0, 0, 0], vec![want]),
            "{mode:?}: {rep}"
        );
        assert!(
            !px.r.stderr_text().contains("secret"),
            "the query reached drainit's log or report:\n{}",
            px.r.stderr_text()
        );
        // The client is not left hanging: a 502 that says the deadline cut it
        // (or, if drainit's proxy had already stopped, a closed connection).
        if let Ok(r) = slow.join().unwrap() {
            let body = String::from_utf8_lossy(&r.body);
            assert_eq!(r.status, 502, "{mode:?}: {body}");
            assert!(body.contains("drainit stopped the app"), "{mode:?}: {body}");
        }
    }
}

/// A second signal cuts the wait for the requests: the drain signal goes with a
/// request still in the (graceful) app, which works on past the deadline. The
/// deadline's SIGKILL is drainit's cut: the request is `abandoned` and its
/// client's 502 says drainit stopped the app, not that the app closed the
/// connection by itself.
#[test]
fn a_request_cut_by_the_sigkill_after_a_second_signal_is_abandoned() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "2s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let port = px.port;
    let slow = std::thread::spawn(move || Conn::open(port).get("/slow?ms=8000", &[]));
    px.wait_logged("recv GET /slow");
    px.r.signal(libc::SIGTERM);
    assert!(
        wait_until(secs(5), || px.r.stderr_text().contains("drain started")),
        "{}",
        px.ctx()
    );
    // A second signal, past the first's coalescing window: the forward now.
    std::thread::sleep(Duration::from_millis(300));
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 2, "{}", px.ctx());
    assert_eq!(counts(&rep), [1, 0, 1, 0, 0, 1, 0, 0, 0], "{rep}");
    assert_eq!(rep["requests"]["lost"][0]["outcome"], "abandoned", "{rep}");
    if let Ok(r) = slow.join().unwrap() {
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, 502, "{body}");
        assert!(body.contains("drainit stopped the app"), "{body}");
    }
}

/// The deadline's 502s carry `Connection: close`, and a client (oha, any
/// pooling client or load balancer retrying) reconnects at once. Measured
/// behind drainit with a real Node.js app that cannot drain (32 clients, 3 s
/// requests, `--drain-timeout 1s`): 2 of the 32 abandoned requests got no 502
/// but a closed connection, and 7 reconnects got a reset from the kernel's
/// queue, not drainit's 503. Each client here gets its 502, and its retry the
/// 503 (counted `rejected`), as after a forward.
#[test]
fn at_the_deadline_every_client_gets_its_502_and_an_immediate_retry_the_503() {
    const N: usize = 32;
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "1s",
        ],
        &["--mode", "naive"],
    );
    px.wait_ready();
    let port = px.port;
    let clients: Vec<_> = (0..N)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let first = c.get("/slow?ms=8000", &[]).map(|r| (r.status, r.text()));
                // At once, as a pool retires a connection told to close.
                let retry = TcpStream::connect(("127.0.0.1", port)).and_then(|s| {
                    let mut c = Conn { s, buf: Vec::new() };
                    c.get("/ok", &[]).map(|r| r.status)
                });
                (first, retry)
            })
        })
        .collect();
    assert!(
        wait_until(secs(5), || px.logged("recv GET /slow").len() == N),
        "{}",
        px.ctx()
    );
    let (code, rep) = px.stop(secs(6));
    assert_eq!(code, 2, "{}", px.ctx());
    for c in clients {
        let (first, retry) = c.join().unwrap();
        match first {
            Ok((502, body)) => assert!(body.contains("drain deadline"), "{body}"),
            other => panic!("an abandoned request got {other:?}, not its 502: {rep}"),
        }
        assert_eq!(retry.ok(), Some(503), "{rep}");
    }
    assert_eq!(counts(&rep), [64, 32, 32, 0, 0, 32, 0, 0, 0], "{rep}");
}

/// The deadline comes while a response is half streamed: the client's body is
/// cut (no end of the chunked body), the request `abandoned`, exit 2.
#[test]
fn a_response_still_streaming_at_the_deadline_is_abandoned() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "1s",
        ],
        &["--mode", "naive"],
    );
    px.wait_ready();
    // The gate never opens: the app holds its last chunk (10 s).
    let mut c = px.conn();
    c.request(
        "GET",
        "/chunked?n=3&gate=/nonexistent",
        &[("X-Request-Id", "half")],
        None,
    )
    .unwrap();
    let (st, _) = c.head().unwrap();
    assert_eq!(st, 200);
    assert_eq!(c.chunk().unwrap(), b"chunk 0\n");
    let (code, rep) = px.stop(secs(6));
    assert_eq!(code, 2, "{}", px.ctx());
    assert_eq!(counts(&rep), [1, 0, 1, 0, 0, 1, 0, 0, 0], "{rep}");
    assert_eq!(rep["requests"]["lost"][0]["request_id"], "half", "{rep}");
    // The client sees a cut body, not a clean end.
    let mut ended = false;
    while let Ok(ch) = c.chunk() {
        if ch.is_empty() {
            ended = true;
            break;
        }
    }
    assert!(!ended, "a cut response ended like a whole one");
}

/// A response the app finished but drainit had not written out yet (hyper
/// buffers a few hundred KiB for a client slower than the app) is still in
/// flight: the drain signal waits for its last bytes, and it is `completed`
/// only once they are written. Before, it was `completed` when hyper took its
/// last frame, the forward went, the app exited, and drainit's exit cut the
/// client's download short of its end: exit 0, a completed request, a
/// truncated body.
#[test]
fn a_slow_client_gets_the_whole_response_before_it_counts_completed_and_the_drain_ends() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "8s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut c = Conn::open_small_window(px.port);
    c.request("GET", "/big?mb=4", &[], None).unwrap();
    let (st, _) = c.head().unwrap();
    assert_eq!(st, 200);
    // A reader slower than the app (a 4 KiB window, 64 KiB per 15 ms), so that
    // drainit holds unwritten bytes when the app is done; the drain starts
    // mid-download.
    let mut got = 0usize;
    let mut ended = false;
    let started = Instant::now();
    while started.elapsed() < secs(8) {
        match c.chunk() {
            Ok(ch) if ch.is_empty() => {
                ended = true;
                break;
            }
            Ok(ch) => got += ch.len(),
            Err(e) => {
                eprintln!("download cut after {got} bytes: {e}");
                break;
            }
        }
        if got == 64 << 10 {
            px.term();
        }
        std::thread::sleep(Duration::from_millis(15));
    }
    let (code, rep) = px.finish(secs(10));
    assert!(
        ended && got == 4 << 20,
        "the client got {got} of {} bytes, ended: {ended}; report {rep}{}",
        4 << 20,
        px.ctx()
    );
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 1, "{rep}");
}

#[test]
fn a_response_cut_by_the_app_is_unknown_and_a_502_when_nothing_was_sent() {
    let mut px = start_graceful();
    // Cut inside the status line: the client gets a 502.
    let resp = get(px.port, "/cut?at=head");
    assert_eq!(resp.status, 502, "{resp:?}{}", px.ctx());
    // Cut inside the body: the head went out, the body is short, the connection ends.
    let mut c = px.conn();
    c.request("GET", "/cut?at=body", &[("X-Request-Id", "cut-2")], None)
        .unwrap();
    let (st, _) = c.head().unwrap();
    assert_eq!(st, 200);
    let short = c.take(1000);
    assert!(
        short.is_err(),
        "the client got a whole body from a cut response"
    );
    drop(c);
    // The proxy still serves.
    assert_eq!(get(px.port, "/ok").status, 200);
    let (code, rep) = px.stop(secs(8));
    // Lost before T0: the drain itself lost nothing.
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep), [3, 0, 3, 1, 2, 0, 0, 0, 0], "{rep}");
    let lost = rep["requests"]["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 2, "{rep}");
    for l in lost {
        assert_eq!((text(l, "outcome"), text(l, "path")), ("unknown", "/cut"));
        assert!(l["start_ms"].as_i64().unwrap() < 0, "{l}");
    }
    assert!(lost.iter().any(|l| l["request_id"] == "cut-2"), "{rep}");
}

/// The app closes a kept-alive connection as drainit reuses it: it reads the
/// request and closes without a byte back. A GET is idempotent, so drainit
/// sends it once more on a new connection (docs/proxy.md, "Upstream"): the client gets
/// its 200, and the report says the request reached the app twice.
#[test]
fn a_get_the_app_dropped_on_a_reused_connection_is_resent_and_reported() {
    let mut px = start_graceful_on_threads(1);
    let mut c = px.conn();
    let first = c.get("/drop-next", &[]).unwrap();
    assert_eq!(first.status, 200, "{}", px.ctx());
    // The one idle connection to the app is the one it will drop (back in the
    // pool as soon as the response is read; kept 1.5 s).
    std::thread::sleep(Duration::from_millis(300));
    let second = get(px.port, "/ok");
    assert_eq!(second.status, 200, "{}", px.ctx());
    assert_eq!(px.logged("dropped GET /ok").len(), 1, "{}", px.ctx());
    let peers: Vec<String> = px.logged("recv GET /ok");
    assert_eq!(peers.len(), 2, "the app got it twice: {}", px.ctx());
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep), [2, 0, 2, 2, 0, 0, 0, 0, 0], "{rep}");
    assert_eq!(rep["requests"]["resent"], 1, "{rep}");
}

/// gunicorn's gthread worker recycled by `--max-requests` (gunicorn#3038) stops
/// reading its kept-alive connections and exits with the requests sent on them
/// unread: the kernel resets them. Measured behind drainit with real gunicorn
/// 20.1 (`-k gthread --max-requests 50`, 16 closed-loop POST clients): 1305 of
/// 12,354 POSTs were 502 `unknown`, none of them seen by the app. A reset with
/// nothing read back proves the app left the request unread, so a POST with a
/// body goes once more too, and is answered.
#[test]
fn a_post_the_app_reset_unread_on_a_reused_connection_is_resent_and_answered() {
    let mut px = start_graceful_on_threads(1);
    let mut c = px.conn();
    let first = c.get("/reset-next", &[]).unwrap();
    assert_eq!(first.status, 200, "{}", px.ctx());
    // The one idle connection to the app is the one that will reset the next
    // request unread (back in the pool once the response was read).
    std::thread::sleep(Duration::from_millis(300));
    let mut c2 = px.conn();
    c2.request(
        "POST",
        "/upload",
        &[("X-Request-Id", "r-1")],
        Some(b"hello"),
    )
    .unwrap();
    let second = c2.response(false).unwrap();
    assert_eq!(second.status, 200, "{}", px.ctx());
    assert_eq!(second.text().trim(), "5", "{}", px.ctx());
    assert_eq!(px.logged("reset unread").len(), 1, "{}", px.ctx());
    assert_eq!(px.logged("recv POST /upload").len(), 1, "{}", px.ctx());
    // The same with a chunked body of two chunks (two frames): kept as it
    // went out, whole.
    let first = c2.get("/reset-next", &[]).unwrap();
    assert_eq!(first.status, 200, "{}", px.ctx());
    std::thread::sleep(Duration::from_millis(300));
    let mut c3 = px.conn();
    c3.send(b"POST /upload HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        .unwrap();
    let third = c3.response(false).unwrap();
    assert_eq!(
        (third.status, third.text().trim()),
        (200, "7"),
        "{}",
        px.ctx()
    );
    assert_eq!(px.logged("reset unread").len(), 2, "{}", px.ctx());
    assert_eq!(px.logged("recv POST /upload").len(), 2, "{}", px.ctx());
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep), [4, 0, 4, 4, 0, 0, 0, 0, 0], "{rep}");
    assert_eq!(rep["requests"]["resent"], 2, "{rep}");
}

#[test]
fn a_client_that_goes_away_mid_request_is_canceled() {
    let mut px = start_graceful();
    let mut c = px.conn();
    c.request("GET", "/slow?ms=800", &[], None).unwrap();
    px.wait_logged("recv GET /slow");
    drop(c);
    // The app finishes its side (or finds the upstream connection closed); the
    // proxy has nobody to answer.
    assert!(
        wait_until(secs(5), || {
            !px.logged("done GET /slow").is_empty() || !px.logged("broken GET /slow").is_empty()
        }),
        "{}",
        px.ctx()
    );
    // The ledger has settled it.
    px.wait_metric("drainit_proxy_requests_total{outcome=\"canceled\"} 1");
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep), [1, 0, 1, 0, 0, 0, 1, 0, 0], "{rep}");
}

#[test]
fn metrics_count_proxy_requests_by_outcome() {
    let mut px = start_graceful();
    assert_eq!(get(px.port, "/ok").status, 200);
    assert_eq!(get(px.port, "/ok").status, 200);
    assert_eq!(get(px.port, "/cut").status, 502);
    let (st, _, metrics) = http(px.probe, "/metrics", "GET");
    assert_eq!(st, 200);
    let value = |name: &str, label: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .and_then(|l| l.split_whitespace().last())
            .map(String::from)
    };
    let got = [
        value("drainit_proxy_requests_total{", "outcome=\"completed\""),
        value("drainit_proxy_requests_total{", "outcome=\"unknown\""),
        value("drainit_proxy_requests_in_flight", ""),
        value("drainit_proxy_request_duration_seconds_count", ""),
        value("drainit_proxy_upstream_resent_total", ""),
    ];
    let want = ["2", "1", "0", "3", "0"].map(|v| Some(v.to_string()));
    assert_eq!(
        got, want,
        "completed, unknown, in flight, durations, resent:\n{metrics}"
    );
    // The in-flight gauge sees a request inside the app.
    let port = px.port;
    let slow = std::thread::spawn(move || get(port, "/slow?ms=700").status);
    let seen = wait_until(secs(5), || {
        let (_, _, m) = http(px.probe, "/metrics", "GET");
        m.lines().any(|l| l == "drainit_proxy_requests_in_flight 1")
    });
    assert!(
        seen,
        "drainit_proxy_requests_in_flight never showed the slow request"
    );
    assert_eq!(slow.join().unwrap(), 200);
    let (code, _) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

/// An app that dies with a request inside it (no drain): the client gets a 502,
/// the request is `unknown`, and drainit exits with the app's status.
#[test]
fn an_app_that_dies_mid_request_loses_it_as_unknown() {
    let mut px = start_px(
        Mode::Subreaper,
        &["--ready-tcp", "127.0.0.1:{app}"],
        &["--mode", "naive"],
    );
    px.wait_ready();
    let port = px.port;
    let slow = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        c.get("/slow?ms=5000", &[])
            .map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned()))
            .map_err(|e| e.to_string())
    });
    px.wait_logged("recv GET /slow");
    let app: i32 = px.logged("start pid=")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(kill(app, libc::SIGKILL));
    let got = slow.join().unwrap();
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 128 + libc::SIGKILL, "{}", px.ctx());
    assert_eq!(counts(&rep), [1, 0, 1, 0, 1, 0, 0, 0, 0], "{rep}");
    assert_eq!(rep["requests"]["lost"][0]["path"], "/slow", "{rep}");
    // The 502 blames the app, not a drain deadline that never came.
    let (status, body) = got.expect("a response");
    assert_eq!(status, 502, "what the client got: {body}{}", px.ctx());
    assert!(body.contains("the app closed the connection"), "{body}");
}

/// A client that leaves in the middle of its request body went away first: the
/// request is `canceled`, not lost, and a drain it happens in stays clean.
#[test]
fn a_client_that_goes_away_mid_body_is_canceled_and_the_drain_stays_clean() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "2s",
            "--drain-timeout",
            "5s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    px.term();
    let mut c = px.conn();
    c.send(b"POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 100000\r\n\r\nabc")
        .unwrap();
    px.wait_logged("recv POST /upload");
    drop(c);
    // The client left inside the pre-drain delay, before admission closed.
    assert!(
        !px.r.stderr_text().contains("admission closed"),
        "the client left only after admission had closed{}",
        px.ctx()
    );
    let (code, rep) = px.finish(secs(8));
    assert_eq!(
        (code, counts(&rep)),
        (0, [1, 0, 1, 0, 0, 0, 1, 0, 0]),
        "{rep}{}",
        px.ctx()
    );
}

/// `OPTIONS *` (asterisk-form, RFC 9112 §3.2.4) is a request for the app like
/// any other, not an upstream refusal.
#[test]
fn an_asterisk_form_options_request_reaches_the_app() {
    let mut px = start_graceful();
    let mut c = px.conn();
    c.request("OPTIONS", "*", &[], None).unwrap();
    let resp = c.response(false).unwrap();
    // proxyapp has no OPTIONS handler: Python's http.server answers 501.
    assert_eq!(resp.status, 501, "{resp:?}{}", px.ctx());
    assert_eq!(px.logged("recv OPTIONS *").len(), 1, "{}", px.ctx());
    drop(c);
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..4], [1, 0, 1, 1], "{rep}");
}

/// Six keep-alive clients flood the proxy across a drain: `/readyz` still flips at
/// once, every request a client sent is answered (200, or drainit's 503 once
/// admission closed, never a reset), and the ledger counts exactly what the
/// clients got.
#[test]
fn under_a_flood_the_drain_loses_nothing_and_the_ledger_matches_the_clients() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "1s",
            "--drain-timeout",
            "5s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let port = px.port;
    // Each client: (200s, 503s, failures); it stops at its first 503.
    let clients: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut ok, mut rejected, mut failed) = (0u32, 0u32, Vec::new());
                let end = Instant::now() + secs(10);
                let mut c = Conn::open(port);
                while Instant::now() < end {
                    match c.get("/ok", &[]) {
                        Ok(r) if r.status == 200 => {
                            ok += 1;
                            if r.closes() {
                                c = Conn::open(port);
                            }
                        }
                        Ok(r) if r.status == 503 => {
                            rejected += 1;
                            break;
                        }
                        Ok(r) => failed.push(format!("status {}", r.status)),
                        Err(e) => {
                            failed.push(e.to_string());
                            break;
                        }
                    }
                }
                (ok, rejected, failed)
            })
        })
        .collect();
    // The flood is under way: the app has served the clients.
    assert!(
        wait_until(secs(10), || px.logged("recv GET /ok").len() >= 30),
        "{}",
        px.ctx()
    );
    px.r.signal(libc::SIGTERM);
    let sent = Instant::now();
    let flipped = wait_for(secs(10), || {
        (http(px.probe, "/readyz", "GET").0 == 503).then(|| sent.elapsed())
    })
    .expect("/readyz never failed");
    // At once: before admission closed at the end of the 1 s delay.
    let closed_first = px.r.stderr_text().contains("admission closed");
    let (mut ok, mut rejected) = (0, 0);
    for c in clients {
        let (o, r, failed) = c.join().unwrap();
        assert!(failed.is_empty(), "a client saw {failed:?}{}", px.ctx());
        assert_eq!(r, 1, "a client never got the 503 of a closed admission");
        ok += o as i64;
        rejected += r as i64;
    }
    let (code, rep) = px.finish(secs(8));
    eprintln!("flood: {ok} requests served, /readyz failed {flipped:?} after SIGTERM");
    assert_eq!(code, 0, "{}", px.ctx());
    assert!(
        !closed_first,
        "/readyz flipped {flipped:?} after SIGTERM under load, only once admission had closed"
    );
    assert_eq!(
        counts(&rep),
        [ok + rejected, rejected, ok, ok, 0, 0, 0, 0, 0],
        "{rep}"
    );
}

/// Admission closes in one step: with no pre-drain delay and a naive app (the
/// forward kills it at once), six clients flooding the proxy across the SIGTERM
/// never get a request admitted and then killed in the app (no 502, nothing
/// unknown or abandoned), and the ledger counts exactly the 200s and 503s the
/// clients got. (Without a delay, a keep-alive client may find its connection
/// closed at the forward, or the listener gone at the exit: those requests never
/// reached drainit and are not counted.)
#[test]
fn admission_closes_atomically_under_a_flood_with_no_delay_and_a_naive_app() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "5s",
        ],
        &["--mode", "naive"],
    );
    px.wait_ready();
    let port = px.port;
    // Each client: (200s, 503s, other statuses).
    let clients: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut ok, mut rejected, mut bad) = (0i64, 0i64, Vec::new());
                let end = Instant::now() + secs(10);
                'conns: while Instant::now() < end {
                    let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
                        break;
                    };
                    s.set_read_timeout(Some(secs(10))).unwrap();
                    let mut c = Conn { s, buf: Vec::new() };
                    while Instant::now() < end {
                        match c.get("/ok", &[]) {
                            Ok(r) if r.status == 200 => {
                                ok += 1;
                                if r.closes() {
                                    continue 'conns;
                                }
                            }
                            Ok(r) if r.status == 503 => {
                                rejected += 1;
                                break 'conns;
                            }
                            Ok(r) => bad.push(r.status),
                            Err(_) => break 'conns,
                        }
                    }
                }
                (ok, rejected, bad)
            })
        })
        .collect();
    // The flood is under way: the app has served the clients.
    assert!(
        wait_until(secs(10), || px.logged("recv GET /ok").len() >= 30),
        "{}",
        px.ctx()
    );
    px.r.signal(libc::SIGTERM);
    let (mut ok, mut rejected) = (0, 0);
    for c in clients {
        let (o, r, bad) = c.join().unwrap();
        assert!(bad.is_empty(), "a client got {bad:?}{}", px.ctx());
        ok += o;
        rejected += r;
    }
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(
        counts(&rep),
        [ok + rejected, rejected, ok, ok, 0, 0, 0, 0, 0],
        "{rep}"
    );
}

#[test]
fn the_list_of_lost_requests_is_capped_at_100() {
    let mut px = start_graceful();
    for _ in 0..105 {
        assert_eq!(get(px.port, "/cut").status, 502);
    }
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    let q = &rep["requests"];
    assert_eq!(
        (
            num(q, "unknown"),
            q["lost"].as_array().unwrap().len(),
            num(q, "lost_truncated")
        ),
        (105, 100, 5),
        "{rep}"
    );
}

/// A keep-alive connection idle across the whole drain neither holds the drain
/// open nor is left hanging: drainit closes it once the app was signalled.
#[test]
fn an_idle_keep_alive_connection_is_closed_at_the_forward_and_does_not_hold_the_drain() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "200ms",
            "--drain-timeout",
            "10s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut idle = px.conn();
    assert_eq!(idle.get("/ok", &[]).unwrap().status, 200);
    px.r.signal(libc::SIGTERM);
    let (code, elapsed) = px.r.wait(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert!(
        elapsed < 3000,
        "an idle connection held the drain for {elapsed} ms"
    );
    assert!(idle.closed(), "the idle connection was left open");
    ledger(&px.r.report());
}

/// A connection opened just before the forward whose request comes just after
/// it (a client told `Connection: close` reopens and writes) is not an idle
/// connection to close unread: it gets drainit's 503. A keep-alive connection
/// that had served a request and sat idle is closed at the forward.
#[test]
fn a_connection_opened_before_the_forward_whose_request_comes_after_gets_the_503() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "10s",
        ],
        &["--mode", "graceful", "--exit-delay", "3000"],
    );
    px.wait_ready();
    let mut used = px.conn();
    assert_eq!(used.get("/ok", &[]).unwrap().status, 200);
    let mut fresh = px.conn();
    px.term();
    assert!(
        wait_until(secs(5), || !px.logged("signal TERM").is_empty()),
        "the app never got its signal{}",
        px.ctx()
    );
    // The forward has happened; the fresh connection's request arrives now.
    let resp = fresh.get("/ok", &[]).unwrap_or_else(|e| {
        panic!(
            "the connection opened before the forward was cut: {e}{}",
            px.ctx()
        )
    });
    assert_draining_503(&resp, "a request on a connection opened before the forward");
    assert!(
        used.closed(),
        "the idle keep-alive connection was left open"
    );
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..3], [2, 1, 1], "{rep}");
}

/// A request that comes after admission closed is counted `rejected` and gets
/// drainit's 503 once its body is read (so that the answer is not lost to a
/// reset). When the app exits while that body is still coming, drainit's exit
/// waits for the 503 as it waits for a request in flight (at most 200 ms):
/// before, it exited 50 ms after the forward and cut the connection, and the
/// report counted a `rejected` request (safe to retry: it got a 503) whose
/// client got no answer at all.
#[test]
fn a_503_still_reading_its_request_body_when_the_app_exits_goes_out() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "300ms",
            "--drain-timeout",
            "5s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut c = px.conn();
    assert_eq!(c.get("/ok", &[]).unwrap().status, 200);
    // In flight across beat 3: the forward waits for it.
    let mut slow = px.conn();
    slow.request("GET", "/slow?ms=700", &[], None).unwrap();
    px.term();
    assert!(
        wait_until(secs(5), || px.r.stderr_text().contains("admission closed")),
        "admission never closed{}",
        px.ctx()
    );
    // The idle keep-alive connection sends a POST with half its body.
    c.send(b"POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 20000\r\n\r\n")
        .unwrap();
    c.send(&[b'u'; 10000]).unwrap();
    assert_eq!(slow.response(false).unwrap().status, 200);
    let exited = wait_for(secs(5), || px.logged_t("exit 0")).unwrap_or_else(|| {
        panic!("the app never exited{}", px.ctx());
    });
    // The rest of the body comes 100 ms after the app's exit: after drainit's
    // 50 ms of quiet since the forward, within its 200 ms for what is unanswered.
    std::thread::sleep(Duration::from_millis(
        (exited + 100).saturating_sub(now_ms()).min(100),
    ));
    let late = now_ms().saturating_sub(exited);
    let sent = c.send(&[b'u'; 10000]);
    let resp = c.response(false);
    assert!(
        late < 180,
        "the machine is too slow: the body's end went {late} ms after the app's exit"
    );
    let resp = match (sent, resp) {
        (Ok(()), Ok(r)) => r,
        (s, r) => panic!(
            "the rejected request got no answer: send {s:?}, response {r:?}{}",
            px.ctx()
        ),
    };
    assert_draining_503(&resp, "a request whose body was still coming at the exit");
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..3], [3, 1, 2], "{rep}");
    assert_eq!(num(&rep, "requests.completed"), 2, "{rep}");
}

/// The same with an app that exits at once on its drain signal: drainit's exit
/// does not cut the connection whose request is on its way (the report would
/// call the drain clean while that client got no answer at all).
#[test]
fn a_request_that_comes_as_the_app_exits_at_the_forward_still_gets_the_503() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "10s",
        ],
        &["--mode", "naive"],
    );
    px.wait_ready();
    let app = px.r.child_running("python3");
    let mut fresh = px.conn();
    // Not `term()`: drainit may be gone before its `/readyz` is asked.
    px.r.signal(libc::SIGTERM);
    // The app died of its signal (drainit is exiting); the request comes now,
    // not after a fixed sleep that a loaded machine could stretch past drainit's
    // exit.
    assert!(
        wait_until(secs(5), || !alive(app)),
        "the app never died of its signal{}",
        px.ctx()
    );
    let resp = fresh.get("/ok", &[]).unwrap_or_else(|e| {
        panic!(
            "the connection opened before the forward was cut at the exit: {e}{}",
            px.ctx()
        )
    });
    assert_draining_503(&resp, "a request sent as the app exits");
    let (code, _) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

// ---------------------------------------------------------------- bad clients

#[test]
fn malformed_requests_get_400_oversized_heads_431_and_are_counted() {
    let mut px = start_graceful();
    let mut c = px.conn();
    c.send(b"THIS IS NOT HTTP\r\n\r\n").unwrap();
    let resp = c
        .response(false)
        .unwrap_or_else(|e| panic!("{e}{}", px.ctx()));
    assert_eq!(resp.status, 400, "{resp:?}");
    // 400 headers (~6 kB: one read, so the 431 is not lost to a reset).
    let mut head = String::from("GET /ok HTTP/1.1\r\nHost: test\r\n");
    for i in 0..400 {
        head.push_str(&format!("X-Pad-{i}: v\r\n"));
    }
    head.push_str("\r\n");
    let mut c = px.conn();
    c.send(head.as_bytes()).unwrap();
    let resp = c
        .response(false)
        .unwrap_or_else(|e| panic!("{e}{}", px.ctx()));
    assert_eq!(resp.status, 431, "{resp:?}");
    // RFC 9112 §3.2: an HTTP/1.1 request without Host, and a request with two,
    // get 400 and never reach the app; HTTP/1.0 may go without.
    for head in [
        "GET /ok HTTP/1.1\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ] {
        let mut c = px.conn();
        c.send(head.as_bytes()).unwrap();
        let resp = c
            .response(false)
            .unwrap_or_else(|e| panic!("{head:?}: {e}{}", px.ctx()));
        assert_eq!(resp.status, 400, "{head:?}: {resp:?}");
        assert_eq!(resp.header("connection"), Some("close"), "{resp:?}");
    }
    assert!(px.logged("recv").is_empty(), "{}", px.ctx());
    let mut c = px.conn();
    c.send(b"GET /ok HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(c.response(false).unwrap().status, 200);
    assert_eq!(get(px.port, "/ok").status, 200);
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.malformed"), 4, "{rep}");
    assert_eq!(num(&rep, "requests.completed"), 2, "{rep}");
}

/// A client that stops sending its request body halfway (a slowloris on the
/// body) is cut after BODY_IDLE (20 s) of silence: it gets 408 with
/// `Connection: close`, the request is `canceled`, and nobody else waited.
#[test]
fn a_client_that_stalls_its_request_body_gets_408_after_the_body_timeout() {
    let mut px = start_graceful();
    let mut c = px.conn();
    c.s.set_read_timeout(Some(secs(40))).unwrap();
    c.send(b"POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    let t = Instant::now();
    // Meanwhile (the stalled request is in the app, waiting for its body)
    // everyone else is served.
    px.wait_logged("recv POST /upload");
    assert_eq!(get(px.port, "/ok").status, 200);
    let resp = c
        .response(false)
        .unwrap_or_else(|e| panic!("no answer to the stalled upload: {e}{}", px.ctx()));
    let waited = t.elapsed();
    assert_eq!(resp.status, 408, "{resp:?}");
    assert_eq!(resp.header("connection"), Some("close"), "{resp:?}");
    assert!(
        waited >= Duration::from_secs(19) && waited < Duration::from_secs(35),
        "answered after {waited:?}"
    );
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    // received, rejected, admitted, completed, unknown, abandoned, canceled,
    // in_flight, malformed
    assert_eq!(counts(&rep), [2, 0, 2, 1, 0, 0, 1, 0, 0], "{rep}");
}

#[test]
fn slowloris_clients_do_not_delay_a_normal_request() {
    let mut px = start_graceful();
    // 32 clients each sending a head one byte per 100 ms, never finishing it.
    // `held`: they are connected and sending; `cut`: drainit closed one.
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicBool::new(false));
    let port = px.port;
    let loris = {
        let (stop, held, cut) = (stop.clone(), held.clone(), cut.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<TcpStream> = (0..32)
                .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
                .collect();
            let head =
                b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
            let end = Instant::now() + secs(10);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                for s in conns.iter_mut() {
                    if s.write_all(&head[i % head.len()..i % head.len() + 1])
                        .is_err()
                    {
                        cut.store(true, Ordering::SeqCst);
                    }
                }
                i += 1;
                held.store(conns.len() == 32, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    assert!(
        wait_until(secs(10), || held.load(Ordering::SeqCst)),
        "the slow clients never connected"
    );
    // Each normal request is answered while every slow client is still held
    // (none was timed out or closed to make room for it): an order, not a speed.
    for i in 0..5 {
        let t = Instant::now();
        let resp = get(px.port, "/ok");
        assert_eq!(resp.status, 200, "{resp:?}");
        assert!(
            !cut.load(Ordering::SeqCst),
            "request {i} was answered ({:?}) only once a slow client had been cut",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    loris.join().unwrap();
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.completed"), 5, "{rep}");
}

#[test]
fn a_websocket_is_echoed_through_the_proxy_and_counted_as_a_stream() {
    let mut px = start_graceful();
    let mut c = px.conn();
    c.request(
        "GET",
        "/ws",
        &[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
        None,
    )
    .unwrap();
    let (st, head) = c.head().unwrap_or_else(|e| panic!("{e}{}", px.ctx()));
    assert_eq!(st, 101, "{head:?}{}", px.ctx());
    let accept = head.iter().find(|(k, _)| k == "sec-websocket-accept");
    assert_eq!(
        accept.map(|(_, v)| v.as_str()),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "{head:?}"
    );
    // Masked text frames, as a client sends them.
    let frame = |op: u8, payload: &[u8]| {
        let mask = [1u8, 2, 3, 4];
        let mut f = vec![0x80 | op, 0x80 | payload.len() as u8];
        f.extend(mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };
    for msg in ["hello", "through drainit"] {
        c.send(&frame(0x1, msg.as_bytes())).unwrap();
        let h = c.take(2).unwrap();
        assert_eq!(h[0], 0x81, "a text frame back");
        let body = c.take((h[1] & 0x7f) as usize).unwrap();
        assert_eq!(String::from_utf8_lossy(&body), msg);
    }
    c.send(&frame(0x8, &[0x03, 0xe8])).unwrap();
    let h = c.take(4).unwrap();
    assert_eq!(h, [0x88, 2, 0x03, 0xe8], "the close frame echoed");
    assert!(
        c.closed(),
        "the stream did not end after the close handshake"
    );
    // The client closes its side too, as RFC 6455 §7.1.1 has it, and the
    // stream is over.
    drop(c);
    px.wait_metric("drainit_proxy_streams_total{event=\"completed\"} 1");
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "streams.opened"), 1, "{rep}");
    assert_eq!(num(&rep, "streams.abandoned"), 0, "{rep}");
}

/// A WebSocket client's handshake on `c` (asserts the 101).
fn ws_open(px: &Px, c: &mut Conn) {
    c.request(
        "GET",
        "/ws",
        &[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
        None,
    )
    .unwrap();
    let (st, head) = c.head().unwrap_or_else(|e| panic!("{e}{}", px.ctx()));
    assert_eq!(st, 101, "{head:?}{}", px.ctx());
}

/// A masked client frame.
fn ws_frame(op: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![0x80 | op, 0x80 | payload.len() as u8];
    f.extend(mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// WebSockets open at beat 3 are closed by drainit with a close frame 1001
/// (going away), spread over `--stream-spread`, counted `closed_by_drain`, and
/// the drain is clean.
#[test]
fn open_websockets_are_closed_with_1001_over_the_stream_spread() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "200ms",
            "--drain-timeout",
            "5s",
            "--stream-spread",
            "1s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut socks: Vec<Conn> = (0..2).map(|_| px.conn()).collect();
    for c in socks.iter_mut() {
        ws_open(&px, c);
        c.send(&ws_frame(0x1, b"hi")).unwrap();
        assert_eq!(c.take(4).unwrap(), [0x81, 2, b'h', b'i']);
    }
    px.r.signal(libc::SIGTERM);
    let t0 = px.r.t0;
    let readers: Vec<_> = socks
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let h = c.take(4).map_err(|e| format!("no close frame: {e}"))?;
                let at = now_ms() - t0;
                if h != [0x88, 2, 0x03, 0xe9] {
                    return Err(format!("not a close frame 1001: {h:?} ({at} ms)"));
                }
                // The client answers the close, as RFC 6455 has it.
                c.send(&ws_frame(0x8, &[0x03, 0xe9])).unwrap();
                if !c.closed() {
                    return Err("the stream stayed open after the close handshake".into());
                }
                Ok(at)
            })
        })
        .collect();
    // Admission is closed from beat 3 (200 ms after drainit took the signal): a
    // new upgrade gets the 503.
    px.wait_drainit_logged("admission closed");
    let mut late = px.conn();
    late.request(
        "GET",
        "/ws",
        &[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
        None,
    )
    .unwrap();
    let resp = late.response(false).unwrap();
    assert_draining_503(&resp, "a new upgrade after beat 3");
    let mut at: Vec<u64> = readers
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{e}{}", px.ctx()))
        })
        .collect();
    at.sort();
    eprintln!("websockets closed by drainit at {at:?} ms after T0");
    // Beat 3 at 200 ms, then spread over 1 s: not all at once, all within it.
    assert!(
        at[0] >= 150 && at[1] < 1200 + 1000 && at[1] - at[0] >= 250,
        "closed at {at:?} ms after T0, not spread over 1 s from beat 3"
    );
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(
        ["opened", "completed", "closed_by_drain", "abandoned"].map(|k| num(&rep["streams"], k)),
        [2, 0, 2, 0],
        "{rep}"
    );
    // The two 101s completed, the late upgrade rejected.
    assert_eq!(counts(&rep), [3, 1, 2, 2, 0, 0, 0, 0, 0], "{rep}");
}

/// A server-sent event stream open at beat 3 is ended by drainit at an
/// event boundary (the client's body ends cleanly, with whole events only).
#[test]
fn an_event_stream_is_ended_between_events_at_beat_3() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "200ms",
            "--drain-timeout",
            "5s",
            "--stream-spread",
            "500ms",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut c = px.conn();
    c.request("GET", "/sse", &[], None).unwrap();
    let (st, head) = c.head().unwrap();
    assert_eq!(st, 200, "{head:?}");
    let mut body = Vec::new();
    while !String::from_utf8_lossy(&body).contains("event 2\n\n") {
        body.extend(c.chunk().unwrap());
    }
    px.r.signal(libc::SIGTERM);
    loop {
        let ch = c
            .chunk()
            .unwrap_or_else(|e| panic!("the event stream was cut, not ended: {e}{}", px.ctx()));
        if ch.is_empty() {
            break;
        }
        body.extend(ch);
    }
    let at = now_ms() - px.r.t0;
    assert!(at < 3000, "ended {at} ms after T0");
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(text.ends_with("\n\n"), "ended mid-event: {text:?}");
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "streams.closed_by_drain"), 1, "{rep}");
    assert_eq!(num(&rep, "requests.completed"), 1, "{rep}");
}

// ---------------------------------------------------------------- bad configuration

#[test]
fn a_taken_listen_port_exits_78_naming_proxy_and_starts_nothing() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let app = free_port();
    let tmp = TmpDir::new("proxy-taken");
    let log = tmp.join("app.log");
    let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app}");
    let app_s = app.to_string();
    let mut r = Running::start_direct(
        &[
            OFF,
            "--proxy",
            &proxy,
            "--",
            python(),
            &fixture("proxyapp.py"),
            "--port",
            &app_s,
            "--log",
            log.to_str().unwrap(),
        ],
        &[],
        &[],
    );
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 78, "{}", r.stderr_text());
    assert!(r.stderr_text().contains("--proxy"), "{}", r.stderr_text());
    assert!(!log.exists(), "the app was started");
    drop(taken);
}

#[test]
fn a_bad_proxy_value_exits_64_naming_the_flag_or_78_naming_the_variable() {
    let tmp = TmpDir::new("proxy-bad");
    let started = tmp.join("started");
    let touch = ["--", "touch", started.to_str().unwrap()];
    for bad in [
        "nonsense",
        "127.0.0.1:8080",
        "=127.0.0.1:8081",
        "127.0.0.1:8080=",
        "127.0.0.1:x=127.0.0.1:8081",
        "127.0.0.1:8080=127.0.0.1:99999",
        "127.0.0.1:8080=127.0.0.1:8080",
        // A wildcard listener is its own upstream on a loopback address.
        "0.0.0.0:8080=127.0.0.1:8080",
        "[::]:8080=localhost:8080",
        "[::1]:8080=[::]:8080",
    ] {
        let mut args = vec![OFF, "--proxy", bad];
        args.extend(touch);
        let mut r = Running::start_direct(&args, &[], &[]);
        let (code, _) = r.wait(secs(10));
        assert_eq!(code, 64, "--proxy {bad:?}: {}", r.stderr_text());
        assert!(
            r.stderr_text().contains("--proxy"),
            "--proxy {bad:?}: {}",
            r.stderr_text()
        );
        let mut args = vec![OFF];
        args.extend(touch);
        let mut r = Running::start_direct(&args, &[("DRAINIT_PROXY", bad)], &[]);
        let (code, _) = r.wait(secs(10));
        assert_eq!(code, 78, "DRAINIT_PROXY={bad:?}: {}", r.stderr_text());
        assert!(
            r.stderr_text().contains("DRAINIT_PROXY"),
            "DRAINIT_PROXY={bad:?}: {}",
            r.stderr_text()
        );
        let cfg = tmp.join("drainit.toml");
        std::fs::write(&cfg, format!("proxy = {bad:?}\n")).unwrap();
        let mut args = vec![OFF, "--config", cfg.to_str().unwrap()];
        args.extend(touch);
        let mut r = Running::start_direct(&args, &[], &[]);
        let (code, _) = r.wait(secs(10));
        assert_eq!(code, 78, "proxy = {bad:?}: {}", r.stderr_text());
        assert!(
            r.stderr_text().contains("`proxy`"),
            "proxy = {bad:?}: {}",
            r.stderr_text()
        );
        assert!(!started.exists(), "started on {bad:?}");
    }
    // The health path and the thread count: valid, and only with --proxy.
    let proxy = "127.0.0.1:8080=127.0.0.1:8081";
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a str);
    let cases: [Case; 7] = [
        (
            &["--proxy", proxy, "--proxy-threads", "0"],
            &[],
            64,
            "--proxy-threads",
        ),
        (&["--proxy-threads", "2"], &[], 64, "--proxy"),
        (
            &["--proxy", proxy],
            &[("DRAINIT_PROXY_THREADS", "many")],
            78,
            "DRAINIT_PROXY_THREADS",
        ),
        (
            &["--proxy", proxy, "--proxy-health", "health"],
            &[],
            64,
            "--proxy-health",
        ),
        (
            &["--proxy", proxy, "--proxy-health", "/h?x=1"],
            &[],
            64,
            "--proxy-health",
        ),
        (&["--proxy-health", "/health"], &[], 64, "--proxy"),
        (
            &["--proxy", proxy],
            &[("DRAINIT_PROXY_HEALTH", "x")],
            78,
            "DRAINIT_PROXY_HEALTH",
        ),
    ];
    for (flags, env, want, needle) in cases {
        let mut args = vec![OFF];
        args.extend(flags);
        args.extend(touch);
        let mut r = Running::start_direct(&args, env, &[]);
        let (code, _) = r.wait(secs(10));
        assert_eq!(code, want, "{flags:?} {env:?}: {}", r.stderr_text());
        assert!(
            r.stderr_text().contains(needle),
            "{flags:?}: {}",
            r.stderr_text()
        );
        assert!(!started.exists(), "started on {flags:?} {env:?}");
    }
}

/// The other address family's loopback on the same port is another socket: an
/// IPv4 wildcard listener never gets a connection to `[::1]` (nor an `[::1]`
/// listener one to `0.0.0.0`, which goes to 127.0.0.1). Such a setup starts; it
/// was refused (64) as the proxy's own upstream.
#[test]
fn an_upstream_on_the_other_familys_loopback_is_not_the_proxys_own() {
    let tmp = TmpDir::new("proxy-family");
    let started = tmp.join("started");
    let port = free_port();
    let proxy = format!("0.0.0.0:{port}=[::1]:{port}");
    let args = [
        OFF,
        "--proxy",
        &proxy,
        "--",
        "touch",
        started.to_str().unwrap(),
    ];
    let mut r = Running::start_direct(&args, &[], &[]);
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 0, "--proxy {proxy}: {}", r.stderr_text());
    assert!(started.exists(), "never started: {}", r.stderr_text());
}

#[test]
fn a_flood_of_idle_connections_under_a_low_fd_limit_leaves_the_probes_and_the_drain_their_fds() {
    // RLIMIT_NOFILE 256 (launch.py --nofile): the probe server and the proxy share
    // drainit's descriptors; 250 idle client connections must not take them all.
    let ports = ProxyPorts::new();
    let (port, probe) = (ports.port, ports.probe);
    let fixture = fixture("proxyapp.py");
    let mut r = ports.start_under_nofile(
        "256",
        &["--pre-drain-delay", "0s", "--drain-timeout", "5s"],
        &[python(), &fixture, "--port", "{app}", "--mode", "graceful"],
    );
    // Past the cap and the listen backlog a connect waits: 100 ms each at most.
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let before = open_fds(r.pid);
    let flood: Vec<TcpStream> = (0..250)
        .filter_map(|_| TcpStream::connect_timeout(&to, Duration::from_millis(100)).ok())
        .collect();
    // drainit has taken up about as many as its cap allows ((256 - 32) / 4 = 56,
    // less what it already holds).
    assert!(
        wait_until(secs(10), || open_fds(r.pid) >= before + 48),
        "drainit took up {} connections of 250\n{}",
        open_fds(r.pid).saturating_sub(before),
        r.stderr_text()
    );
    let (status, _, _) = http(probe, "/healthz", "GET");
    assert_eq!(
        status,
        200,
        "/healthz beside {} idle proxy connections\n{}",
        flood.len(),
        r.stderr_text()
    );
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    drop(flood);
    let err = r.stderr_text();
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("Too many open files"), "{err}");
    ledger(&r.report());
}

#[test]
fn a_rejected_request_that_expects_100_continue_gets_the_503_without_a_100() {
    // Never ready (the app's /ready waits for $TMP/go): every request is rejected.
    // A client that asks `Expect: 100-continue` for a 16 MiB upload must get the
    // 503 at once, not a `100 Continue` inviting a body drainit will not take
    // (RFC 9110 §10.1.1) and then reset after 64 KiB.
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-http",
            "http://127.0.0.1:{app}/ready",
            "--pre-drain-delay",
            "0s",
        ],
        &["--ready-file", "$TMP/go"],
    );
    assert!(
        wait_until(secs(10), || !px.logged("listening").is_empty()),
        "{}",
        px.ctx()
    );
    let mut c = px.conn();
    c.send(
        b"POST /upload HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: 16777216\r\n\r\n",
    )
    .unwrap();
    let resp = c.response(false).expect("a response to the head alone");
    assert_eq!(resp.status, 503, "{resp:?}{}", px.ctx());
    assert!(resp.closes(), "{resp:?}");
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(num(&rep, "requests.rejected"), 1, "{rep}");
}

#[test]
fn a_client_that_goes_away_while_the_drain_waits_for_its_request_lets_the_drain_go_on() {
    // Beat 3 waits for the one request in flight (the app takes 3 s); its client
    // goes away: nothing is left in flight, so the drain signal goes to the app at
    // once (it finishes that request and exits 0), not at the 8 s deadline with a
    // SIGKILL.
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "8s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let mut c = px.conn();
    c.request("GET", "/slow?ms=3000", &[], None).unwrap();
    px.wait_logged("recv GET /slow");
    px.r.signal(libc::SIGTERM);
    px.wait_drainit_logged("admission closed");
    drop(c);
    let (code, rep) = px.finish(secs(15));
    assert_eq!(code, 0, "{}", px.ctx());
    // The app got its SIGTERM while its 3 s request was still running, and
    // nothing was SIGKILLed at the deadline.
    let term = px.logged_t("signal TERM");
    let end = px
        .logged_t("done GET /slow")
        .or(px.logged_t("broken GET /slow"));
    assert!(
        term.is_some() && end.is_some() && term < end,
        "the drain waited for a request nobody waits for (signal at {term:?}, the request \
         ended at {end:?}): {rep}{}",
        px.ctx()
    );
    assert!(rep["drain"]["killed_at_ms"].is_null(), "{rep}");
    assert_eq!(num(&rep, "requests.canceled"), 1, "{rep}");
}

/// A flood of the health path (it is on the app's public port) does not run the
/// readiness checks back to back on the supervisor's thread: an answer is
/// reused for 250 ms (review finding: `/readyz` waited up to 1 s under such a
/// flood, the `--ready-tcp` connects overflowing the app's backlog).
#[test]
fn a_flood_of_the_health_path_runs_the_checks_a_few_times_a_second_not_per_request() {
    let mut px = start_px(
        Mode::Subreaper,
        &[
            "--proxy-health",
            "/health",
            "--ready-tcp",
            "127.0.0.1:{app}",
            "--pre-drain-delay",
            "0s",
        ],
        &["--mode", "graceful"],
    );
    px.wait_ready();
    let runs = |px: &Px| -> u64 {
        let (_, _, body) = http(px.probe, "/metrics", "GET");
        body.lines()
            .filter(|l| l.starts_with("drainit_checks_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = runs(&px);
    let port = px.port;
    let stop = Instant::now() + Duration::from_millis(1500);
    let answered = Arc::new(AtomicU64::new(0));
    let floods: Vec<_> = (0..4)
        .map(|_| {
            let answered = answered.clone();
            std::thread::spawn(move || {
                while Instant::now() < stop {
                    if http(port, "/health", "GET").0 == 200 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for f in floods {
        f.join().unwrap();
    }
    let ran = runs(&px) - before;
    let answered = answered.load(Ordering::Relaxed);
    assert!(answered >= 50, "only {answered} health answers{}", px.ctx());
    assert!(
        ran <= 20,
        "{ran} check runs for {answered} health requests in 1.5 s{}",
        px.ctx()
    );
    let (code, _) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

/// The request's headers as the app received them (proxyapp's /echo-headers),
/// from a raw request `raw` sent to the proxy.
fn echoed_headers(px: &Px, raw: &str) -> (String, Vec<(String, String)>) {
    let mut c = px.conn();
    c.send(raw.as_bytes()).unwrap();
    let resp = c.response(false).unwrap();
    assert_eq!(resp.status, 200, "{raw:?}: {resp:?}");
    let got: Vec<(String, String)> = serde_json::from_slice(&resp.body).unwrap();
    let recv = px.logged("recv GET");
    (recv.last().cloned().unwrap_or_default(), got)
}

/// An absolute-form request target names the host: a proxy forwarding it sends
/// that host as `Host`, whatever `Host` field came with it (RFC 9112 §3.2.2),
/// and the app gets the path in origin form.
#[test]
fn an_absolute_form_target_gives_the_app_its_host_and_an_origin_form_path() {
    let mut px = start_graceful();
    let hosts = |got: &[(String, String)]| -> Vec<String> {
        got.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.clone())
            .collect()
    };
    // Host and the target disagree: the target wins.
    let (recv, got) = echoed_headers(
        &px,
        "GET http://a.example/echo-headers?q=1 HTTP/1.1\r\nHost: b.example\r\n\r\n",
    );
    assert!(recv.contains(" /echo-headers?q=1 "), "{recv}");
    assert_eq!(hosts(&got), ["a.example"], "{got:?}");
    // HTTP/1.0 without Host: the target's host, not the app's address.
    let (_, got) = echoed_headers(
        &px,
        "GET http://a.example:8080/echo-headers HTTP/1.0\r\n\r\n",
    );
    assert_eq!(hosts(&got), ["a.example:8080"], "{got:?}");
    let (code, _) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
}

/// Clients that go away in the middle of their download, again and again:
/// each upstream connection whose response was cut is closed, none is kept
/// (drainit's descriptors do not grow), and the next request is answered.
#[test]
fn aborted_downloads_leave_no_upstream_connection_behind() {
    let mut px = start_graceful();
    // One request first, so the pool and its sweep exist.
    assert_eq!(get(px.port, "/ok").status, 200);
    let before = open_fds(px.r.pid);
    let gate = px.r.path("gate");
    for i in 0..40 {
        let mut c = px.conn();
        let path = if i % 2 == 0 {
            "/big?mb=64".to_string()
        } else {
            // The app stalls before its last chunk: nothing more comes.
            format!("/chunked?n=3&gate={}", gate.display())
        };
        c.request("GET", &path, &[], None).unwrap();
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200);
        drop(c);
    }
    let settled = wait_until(secs(5), || open_fds(px.r.pid) <= before + 2);
    std::fs::write(&gate, "").unwrap();
    assert!(
        settled,
        "descriptors {before} -> {} after 40 aborted downloads{}",
        open_fds(px.r.pid),
        px.ctx()
    );
    assert_eq!(get(px.port, "/ok").status, 200, "{}", px.ctx());
    let (code, _) = px.stop(secs(20));
    assert!(code == 0 || code == 2, "{}", px.ctx());
}

/// drainit with `--proxy` in front of proxyapp.py under RLIMIT_NOFILE 544: a
/// cap of (544 - 32) / 4 = 128 client connections. The running drainit and the
/// proxy's address.
fn proxy_capped_at_128() -> (Running, std::net::SocketAddr) {
    let ports = ProxyPorts::new();
    let fixture = fixture("proxyapp.py");
    let r = ports.start_under_nofile(
        "544",
        &["--pre-drain-delay", "0s", "--drain-timeout", "5s"],
        &[python(), &fixture, "--port", "{app}", "--mode", "graceful"],
    );
    (r, std::net::SocketAddr::from(([127, 0, 0, 1], ports.port)))
}

/// Idle connections fill the cap (RLIMIT_NOFILE 544: (544 - 32) / 4
/// = 128 client connections), and a new client's request is answered at once:
/// the oldest idle connection makes room for it. Ordering, not speed: the
/// answer comes while drainit still holds about its cap of the idle flood
/// (behind them in the kernel's backlog, the request would be answered only
/// once the head timeout, 10 s, had closed them).
#[test]
fn at_the_connection_cap_the_oldest_idle_connection_makes_room_for_a_new_client() {
    let (mut r, to) = proxy_capped_at_128();
    let before = open_fds(r.pid);
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect_timeout(&to, secs(1)).ok())
        .collect();
    assert!(
        wait_until(secs(5), || open_fds(r.pid) >= before + 120),
        "drainit took up {} connections of {}\n{}",
        open_fds(r.pid).saturating_sub(before),
        flood.len(),
        r.stderr_text()
    );
    let mut c = TcpStream::connect(to).unwrap();
    c.set_read_timeout(Some(secs(30))).unwrap();
    c.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = String::new();
    let _ = c.read_to_string(&mut got);
    assert!(
        got.starts_with("HTTP/1.1 200"),
        "{got}\n{}",
        r.stderr_text()
    );
    // The flood is still held: drainit still serves about its cap of them
    // (the oldest made room, one each), none closed by the head timeout.
    let still_open = flood
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            matches!(
                (&**s).read(&mut b),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            )
        })
        .count();
    assert!(
        still_open >= 118,
        "{still_open} of the flood's connections still open at the answer"
    );
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    drop(flood);
    assert_eq!(code, 0, "{}", r.stderr_text());
    ledger(&r.report());
}

/// The other side of the cap's rule: a connection whose request was already
/// there when drainit accepted it is not idle, however new. 200 clients each
/// send a whole request while drainit is stopped (cap 128: RLIMIT_NOFILE 544);
/// drainit, resumed, accepts them in one burst and every client gets its 200:
/// the ones past the cap wait in the kernel's backlog until a place is free,
/// none is closed unanswered to make room for a later one.
#[test]
fn at_the_connection_cap_a_connection_whose_request_came_is_never_closed_for_room() {
    let (mut r, to) = proxy_capped_at_128();
    // Ready: one request answered.
    assert!(
        wait_until(secs(10), || {
            let Ok(mut c) = TcpStream::connect(to) else {
                return false;
            };
            let _ = c.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
            let mut got = String::new();
            let _ = c.read_to_string(&mut got);
            got.starts_with("HTTP/1.1 200")
        }),
        "never answered\n{}",
        r.stderr_text()
    );
    r.signal(libc::SIGSTOP);
    let mut clients: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut c = TcpStream::connect_timeout(&to, secs(1)).ok()?;
            c.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .ok()?;
            Some(c)
        })
        .collect();
    assert_eq!(clients.len(), 200, "connects while drainit was stopped");
    r.signal(libc::SIGCONT);
    let answers: Vec<String> = clients
        .iter_mut()
        .map(|c| {
            c.set_read_timeout(Some(secs(30))).unwrap();
            let mut got = String::new();
            match c.read_to_string(&mut got) {
                Ok(_) => got.lines().next().unwrap_or("EOF, no answer").to_string(),
                Err(e) => e.to_string(),
            }
        })
        .collect();
    let unanswered: Vec<&String> = answers
        .iter()
        .filter(|a| !a.starts_with("HTTP/1.1 200"))
        .collect();
    assert!(
        unanswered.is_empty(),
        "{} of 200 clients got no 200: {:?}\n{}",
        unanswered.len(),
        &unanswered[..unanswered.len().min(5)],
        r.stderr_text()
    );
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 0, "{}", r.stderr_text());
    ledger(&r.report());
}

#[test]
fn a_head_not_sent_within_the_header_read_timeout_and_an_idle_connection_are_closed() {
    let mut px = start_graceful();
    // One client stops in the middle of its head; another is answered and
    // then sends nothing on its keep-alive connection.
    let mut slow = TcpStream::connect(("127.0.0.1", px.port)).unwrap();
    slow.write_all(b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Slow: a")
        .unwrap();
    let t = Instant::now();
    let mut idle = px.conn();
    idle.request("GET", "/ok", &[], None).unwrap();
    let resp = idle.response(false).unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    let idle_from = Instant::now();
    // drainit's HEAD_TIMEOUT is 10 s.
    slow.set_read_timeout(Some(secs(30))).unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("no end to the slow head: {e}{}", px.ctx()));
    let waited = t.elapsed();
    // Closed without an answer, as nginx's client_header_timeout does.
    assert_eq!(answer, "", "{answer:?}");
    assert!(
        waited >= secs(9) && waited < secs(25),
        "the slow head was cut after {waited:?}"
    );
    let mut rest = Vec::new();
    idle.s.set_read_timeout(Some(secs(30))).unwrap();
    let n = idle.s.read_to_end(&mut rest);
    let waited = idle_from.elapsed();
    assert!(matches!(n, Ok(0)), "{n:?} {rest:?}");
    assert!(
        waited >= secs(9) && waited < secs(25),
        "the idle connection was closed after {waited:?}"
    );
    let (code, rep) = px.stop(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    // received, rejected, admitted, completed, unknown, abandoned, canceled,
    // in_flight, malformed
    assert_eq!(counts(&rep), [1, 0, 1, 1, 0, 0, 0, 0, 0], "{rep}");
}
