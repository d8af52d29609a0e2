//! The probe server and readiness (docs/probes.md).
//!
//! Component tests speak raw bytes over TCP to `probe::serve`, bound on
//! `127.0.0.1:0` on a single-threaded runtime (the production setup), with the
//! published state set by the test. Black-box tests run the built binary as a
//! subreaper (a direct child of the test) against real apps: `python3 -m
//! http.server`, and Python children that speak sd_notify. Every port is picked at
//! run time; every wait has a deadline; a `Running` guard kills what it started.
//!
//! The component tests never reap (a `waitpid(-1)` here would steal the statuses
//! of the black-box tests' drainit processes): their exec checks end by timing out,
//! which is what they test. Exec checks through the real reaper are tested black-box.

// The test harness waits for the drainit processes it started; drainit itself never
// calls `Child::wait` (CONVENTIONS, "One waiter").
#![allow(clippy::disallowed_methods)]

mod common;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use drainit::checks::Checks;
use drainit::config::{Check, CheckKind};
use drainit::drain::Phase;
use drainit::probe::{self, Published};
use drainit::reaper::Reaper;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use common::*;

// ---------------------------------------------------------------------------------
// Shared helpers

/// One HTTP answer as read off the wire.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// Header names lower-cased, in order.
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn parse(raw: &[u8]) -> Reply {
        let text = String::from_utf8_lossy(raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Reply {
            status,
            headers,
            body: body.to_string(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body {:?} is not JSON: {e}", self.body))
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n")
}

// ---------------------------------------------------------------------------------
// Component tests: probe::serve on 127.0.0.1:0

/// Runs `f` on a single-threaded runtime inside a `LocalSet`, as drainit does.
fn local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

/// A probe server of this runtime.
struct Server {
    addr: SocketAddr,
    state: watch::Sender<Published>,
    checks: Rc<Checks>,
}

impl Server {
    fn start(specs: Vec<Check>) -> Server {
        let listener =
            probe::bind("127.0.0.1:0".parse().expect("addr")).expect("bind the probe socket");
        let addr = listener.local_addr().expect("local_addr");
        let (state, state_rx) = watch::channel(Published::new());
        let reaper = Rc::new(RefCell::new(Reaper::new()));
        let checks = Checks::new(specs, reaper, drainit::spawn::Launcher::default());
        let (asked, _) = drainit::published::ReadyzAsked::channel();
        let metrics = drainit::metrics::Metrics::default();
        tokio::task::spawn_local(probe::serve(
            listener,
            state_rx,
            checks.clone(),
            metrics,
            asked,
            None,
        ));
        Server {
            addr,
            state,
            checks,
        }
    }

    fn set(&self, f: impl FnOnce(&mut Published)) {
        self.state.send_modify(f);
    }

    fn phase(&self, phase: Phase) {
        self.set(|p| p.phase = phase);
    }

    /// Sends `raw` on a fresh connection and reads until the server closes it.
    async fn raw(&self, raw: &str) -> Reply {
        let mut s = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect to the probe server");
        s.write_all(raw.as_bytes())
            .await
            .expect("write the request");
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .expect("the server closes the connection after one answer")
            .expect("read the answer");
        Reply::parse(&buf)
    }

    async fn get(&self, path: &str) -> Reply {
        self.raw(&get(path)).await
    }
}

fn check(name: &str, kind: CheckKind, timeout_ms: u64) -> Check {
    Check {
        name: name.into(),
        kind,
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn assert_probe_headers(r: &Reply) {
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    assert_eq!(r.header("cache-control"), Some("no-store"), "{r:?}");
    assert!(
        r.header("location").is_none() && !(300..400).contains(&r.status),
        "never a redirect: {r:?}"
    );
}

#[test]
fn every_route_and_status() {
    local(async {
        let s = Server::start(Vec::new());

        let r = s.get("/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (200, r#"{"status":"ok"}"#));
        assert_probe_headers(&r);

        for (phase, code, word) in [
            (Phase::Starting, 503, "starting"),
            (Phase::Ready, 200, "ready"),
            (Phase::Draining, 503, "draining"),
            (Phase::Stopping, 503, "stopping"),
        ] {
            s.phase(phase);
            let r = s.get("/readyz").await;
            assert_eq!(
                (r.status, r.json()),
                (code, json!({ "status": word })),
                "phase {phase:?}"
            );
            assert_probe_headers(&r);
            // /healthz never fails because of a drain.
            assert_eq!(s.get("/healthz").await.status, 200, "phase {phase:?}");
        }

        s.phase(Phase::Ready);
        // A query string does not change the route.
        assert_eq!(s.get("/readyz?verbose=1").await.status, 200);
        // HTTP/1.0 clients are answered too.
        let r = s.raw("GET /readyz HTTP/1.0\r\n\r\n").await;
        assert_eq!((r.status, r.json()), (200, json!({"status": "ready"})));

        for path in ["/", "/nope", "/healthz/", "/readyz/x", "/HEALTHZ"] {
            let r = s.get(path).await;
            assert_eq!(r.status, 404, "{path}");
            assert_probe_headers(&r);
        }
        for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
            let r = s
                .raw(&format!(
                    "{method} /readyz HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n\r\n"
                ))
                .await;
            assert_eq!(r.status, 405, "{method}");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method}");
            assert_probe_headers(&r);
        }

        // HEAD: the headers of GET, no body.
        let r = s.raw("HEAD /healthz HTTP/1.1\r\nHost: p\r\n\r\n").await;
        assert_eq!((r.status, r.body.as_str()), (200, ""));
        assert_eq!(
            r.header("content-length"),
            Some(r#"{"status":"ok"}"#.len().to_string().as_str())
        );
        assert_probe_headers(&r);
        s.phase(Phase::Draining);
        let r = s.raw("HEAD /readyz HTTP/1.1\r\nHost: p\r\n\r\n").await;
        assert_eq!((r.status, r.body.as_str()), (503, ""));

        // One request per connection (the kubelet never reuses one).
        let r = s.get("/healthz").await;
        assert_eq!(r.header("connection"), Some("close"));
    });
}

#[test]
fn app_status_stopping_and_watchdog_show() {
    local(async {
        let s = Server::start(Vec::new());
        s.set(|p| {
            p.phase = Phase::Ready;
            p.status_text = Some("serving 3 workers".into());
        });
        let r = s.get("/readyz").await;
        assert_eq!(
            (r.status, r.json()),
            (
                200,
                json!({"status": "ready", "app_status": "serving 3 workers"})
            )
        );

        s.set(|p| p.app_stopping = true);
        let r = s.get("/readyz").await;
        assert_eq!(r.status, 503);
        assert_eq!(r.json()["status"], "degraded");

        s.set(|p| p.watchdog_ok = false);
        let r = s.get("/healthz").await;
        assert_eq!(
            (r.status, r.json()),
            (
                503,
                json!({"status": "unhealthy", "detail": "watchdog expired"})
            )
        );
        assert_probe_headers(&r);
    });
}

#[test]
fn degraded_shows_each_check() {
    local(async {
        let up = TcpListener::bind("127.0.0.1:0").expect("bind");
        let up_addr = up.local_addr().expect("addr").to_string();
        let missing =
            std::env::temp_dir().join(format!("drainit-probe-missing-{}", std::process::id()));
        let s = Server::start(vec![
            check("db", CheckKind::Tcp(up_addr), 500),
            check(
                "cache",
                CheckKind::Tcp(format!("127.0.0.1:{}", free_port())),
                500,
            ),
            check("flag", CheckKind::File(missing), 500),
        ]);
        // Starting: no evaluation yet, no breakdown.
        let r = s.get("/readyz").await;
        assert_eq!((r.status, r.json()), (503, json!({"status": "starting"})));

        s.phase(Phase::Ready);
        let r = s.get("/readyz").await;
        assert_eq!(r.status, 503);
        assert_eq!(
            r.json(),
            json!({"status": "degraded", "checks": {
                "db": {"ok": true},
                "cache": {"ok": false, "detail": "connection refused"},
                "flag": {"ok": false, "detail": "not found"},
            }})
        );
        // Starting shows the last evaluation once there is one.
        s.phase(Phase::Starting);
        let r = s.get("/readyz").await;
        assert_eq!(r.json()["checks"]["cache"]["detail"], "connection refused");
        assert_eq!(r.json()["status"], "starting");
        // A drain wins over the checks.
        s.phase(Phase::Draining);
        assert_eq!(s.get("/readyz").await.json(), json!({"status": "draining"}));
    });
}

/// A server that answers every connection with `reply`, written in two halves
/// (the check must read a head that arrives in pieces).
async fn raw_app(reply: &'static [u8]) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::task::spawn_local(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf).await;
            let (a, b) = reply.split_at(reply.len() / 2);
            let _ = c.write_all(a).await;
            let _ = c.flush().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = c.write_all(b).await;
        }
    });
    addr
}

/// What an HTTP check makes of real-world response heads.
#[test]
fn http_check_reads_the_status_of_real_response_heads() {
    local(async {
        let many_headers: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\n{}Content-Length: 0\r\n\r\n",
                "X-Filler: yes\r\n".repeat(100)
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        // One header longer than a check reads (16 KiB): the status line decides.
        let huge_head: &'static [u8] = Box::leak(
            format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000))
                .into_bytes()
                .into_boxed_slice(),
        );
        let cases: Vec<(&str, &'static [u8], serde_json::Value)> = vec![
            (
                "interim",
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
                json!({"ok": true}),
            ),
            ("many-headers", many_headers, json!({"ok": true})),
            (
                "switching",
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
                json!({"ok": false, "detail": "http status 101"}),
            ),
            ("huge-head", huge_head, json!({"ok": true})),
            (
                "redirect",
                b"HTTP/1.0 302 Found\r\nLocation: /x\r\n\r\n",
                json!({"ok": true}),
            ),
            (
                "error",
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                json!({"ok": false, "detail": "http status 503"}),
            ),
            (
                "garbage",
                b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
                json!({"ok": false, "detail": "bad response"}),
            ),
            (
                "silent",
                b"",
                json!({"ok": false, "detail": "no response"}),
            ),
        ];
        let mut checks = Vec::new();
        for (name, reply, _) in &cases {
            let addr = raw_app(reply).await;
            checks.push(check(
                name,
                CheckKind::Http(format!("http://{addr}/health")),
                1000,
            ));
        }
        let s = Server::start(checks);
        s.phase(Phase::Ready);
        let r = s.get("/readyz").await;
        for (name, _, want) in &cases {
            assert_eq!(&r.json()["checks"][name], want, "{name}: {}", r.body);
        }
    });
}

/// `localhost` is 127.0.0.1, then ::1, with no resolver: an app listening on
/// either passes, as in a `FROM scratch` image without /etc/hosts.
#[test]
fn localhost_targets_need_no_resolver() {
    local(async {
        let v4 = TcpListener::bind("127.0.0.1:0").expect("bind");
        let v4_port = v4.local_addr().expect("addr").port();
        let web = http_app(204).await;
        let mut checks = vec![
            check("v4", CheckKind::Tcp(format!("localhost:{v4_port}")), 500),
            check(
                "web",
                CheckKind::Http(format!("http://localhost:{}/health", web.port())),
                500,
            ),
        ];
        // Only ::1: the second address is tried (skipped where IPv6 is off).
        let v6 = TcpListener::bind("[::1]:0").ok();
        if let Some(l) = &v6 {
            let port = l.local_addr().expect("addr").port();
            checks.push(check(
                "v6",
                CheckKind::Tcp(format!("localhost:{port}")),
                500,
            ));
        }
        let s = Server::start(checks);
        s.phase(Phase::Ready);
        let r = s.get("/readyz").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["checks"]["web"], json!({"ok": true}));
    });
}

#[test]
fn all_checks_passing_is_ready_with_breakdown() {
    local(async {
        let up = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = Server::start(vec![check(
            "db",
            CheckKind::Tcp(up.local_addr().expect("addr").to_string()),
            500,
        )]);
        s.phase(Phase::Ready);
        let r = s.get("/readyz").await;
        assert_eq!(
            (r.status, r.json()),
            (
                200,
                json!({"status": "ready", "checks": {"db": {"ok": true}}})
            )
        );
    });
}

#[test]
fn a_hanging_exec_check_answers_within_its_timeout() {
    local(async {
        let s = Server::start(vec![check(
            "slow",
            CheckKind::Exec(vec!["sleep".into(), "11".into()]),
            500,
        )]);
        s.phase(Phase::Ready);
        let started = Instant::now();
        let r = s.get("/readyz").await;
        let took = started.elapsed();
        assert_eq!(
            (r.status, r.json()),
            (
                503,
                json!({"status": "degraded", "checks": {"slow": {"ok": false, "detail": "timed out after 500ms"}}})
            )
        );
        assert!(
            took >= Duration::from_millis(495),
            "answered after {took:?}, before the check's timeout"
        );
        // The command sleeps 11 s: answered at the check's timeout, not at its end.
        assert!(
            took < Duration::from_secs(5),
            "answered after {took:?}, not at the check's 500 ms timeout"
        );
        // /healthz is not held up by a running evaluation.
        let before = running(&["sleep", "11"]);
        let evaluation = tokio::task::spawn_local({
            let addr = s.addr;
            async move {
                let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
                c.write_all(get("/readyz").as_bytes()).await.expect("write");
                let mut buf = Vec::new();
                let _ = c.read_to_end(&mut buf).await;
            }
        });
        // The evaluation is under way: its check's command runs.
        check_started(&["sleep", "11"], &before).await;
        let started = Instant::now();
        assert_eq!(s.get("/healthz").await.status, 200);
        // Answered while the evaluation (500 ms) still runs: not held up by it.
        assert!(
            !evaluation.is_finished(),
            "/healthz waited for the running evaluation ({:?})",
            started.elapsed()
        );
        evaluation.await.expect("the /readyz client");
    });
}

#[test]
fn concurrent_probes_share_one_evaluation() {
    local(async {
        // Each evaluation takes the whole 300 ms timeout (nothing reaps here).
        let s = Server::start(vec![check(
            "slow",
            CheckKind::Exec(vec!["sleep".into(), "10".into()]),
            300,
        )]);
        s.phase(Phase::Ready);
        let s = Rc::new(s);
        let clients: Vec<_> = (0..40)
            .map(|_| {
                let s = s.clone();
                tokio::task::spawn_local(async move { s.get("/readyz").await })
            })
            .collect();
        for c in clients {
            let r = c.await.expect("client task");
            assert_eq!(r.status, 503);
            assert_eq!(
                r.json()["checks"]["slow"]["detail"],
                "timed out after 300ms"
            );
        }
        let runs = s.checks.runs();
        assert!(
            (1..=3).contains(&runs),
            "40 concurrent /readyz ran the checks {runs} times"
        );
    });
}

/// A one-shot HTTP server that answers every request with `status`.
async fn http_app(status: u16) -> SocketAddr {
    let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    raw_app(Box::leak(reply.into_bytes().into_boxed_slice())).await
}

#[test]
fn a_url_with_credentials_never_appears_in_a_body() {
    local(async {
        let failing = http_app(500).await;
        let fine = http_app(204).await;
        let secret_url = |addr: String| format!("http://admin:hunter2@{addr}/health?token=s3cret");
        let s = Server::start(vec![
            check(
                "http-1",
                CheckKind::Http(secret_url(format!("127.0.0.1:{}", free_port()))),
                500,
            ),
            check(
                "http-2",
                CheckKind::Http(secret_url(failing.to_string())),
                500,
            ),
            check("http-3", CheckKind::Http(secret_url(fine.to_string())), 500),
        ]);
        s.phase(Phase::Ready);
        let r = s.get("/readyz").await;
        assert_eq!(
            r.json(),
            json!({"status": "degraded", "checks": {
                "http-1": {"ok": false, "detail": "connection refused"},
                "http-2": {"ok": false, "detail": "http status 500"},
                "http-3": {"ok": true},
            }})
        );
        for secret in ["hunter2", "admin", "s3cret", "token", "127.0.0.1", "health"] {
            assert!(
                !r.body.contains(secret),
                "{secret:?} leaked into {}",
                r.body
            );
        }
    });
}

/// Opens `n` connections that each send half a request head and stall.
/// The live children of this test process whose command line is `argv` (the
/// exec checks the in-process servers started).
fn running(argv: &[&str]) -> Vec<i32> {
    let want = argv.join("\0") + "\0";
    children_of(std::process::id() as i32)
        .into_iter()
        .filter(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want.as_bytes())
                && status_field(p, "State").is_some_and(|s| !s.starts_with('Z'))
        })
        .collect()
}

/// Waits (10 s, letting the local tasks run) until a child running `argv` that
/// is not in `before` exists: a check evaluation has started its command.
async fn check_started(argv: &[&str], before: &[i32]) {
    let end = Instant::now() + Duration::from_secs(10);
    while running(argv).iter().all(|p| before.contains(p)) {
        assert!(Instant::now() < end, "the check {argv:?} never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stalled_clients(addr: SocketAddr, n: usize) -> Vec<(tokio::net::TcpStream, Instant)> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect a slow client");
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: sl")
            .await
            .expect("write half a head");
        v.push((c, Instant::now()));
    }
    v
}

/// `/healthz` from a new client, five times: each well within the header read
/// timeout (2 s), so none waited for a stalled client to be timed out and free
/// its place.
async fn healthz_is_prompt(s: &Server, with: &str) {
    for _ in 0..5 {
        let started = Instant::now();
        let r = s.get("/healthz").await;
        let took = started.elapsed();
        assert_eq!(r.status, 200, "with {with}");
        assert!(
            took < probe::HEADER_READ_TIMEOUT / 2,
            "/healthz took {took:?} with {with}"
        );
    }
}

#[test]
fn slow_clients_do_not_delay_healthz() {
    local(async {
        let s = Server::start(Vec::new());
        let mut slow = stalled_clients(s.addr, 300).await;
        // Let the server accept them all.
        tokio::time::sleep(Duration::from_millis(100)).await;
        healthz_is_prompt(&s, "300 stalled clients").await;

        // The header read timeout closes a stalled client, not sooner.
        let (mut first, connected) = slow.remove(0);
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(
            probe::HEADER_READ_TIMEOUT + Duration::from_secs(2),
            first.read(&mut buf),
        )
        .await;
        let after = connected.elapsed();
        assert!(
            read.is_ok(),
            "a stalled client was still open after {after:?}"
        );
        assert!(
            after >= probe::HEADER_READ_TIMEOUT - Duration::from_millis(50),
            "a stalled client was closed after {after:?}, before the header read timeout"
        );
    });
}

#[test]
fn past_the_connection_cap_the_oldest_is_closed() {
    local(async {
        let s = Server::start(Vec::new());
        let n = probe::MAX_CONNECTIONS + 50;
        let mut slow = stalled_clients(s.addr, n).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        healthz_is_prompt(&s, &format!("{n} stalled clients, past the cap")).await;
        // The oldest stalled client made room: it is closed well before the header
        // read timeout.
        let (mut oldest, connected) = slow.remove(0);
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(1), oldest.read(&mut buf)).await;
        assert!(
            read.is_ok() && connected.elapsed() < probe::HEADER_READ_TIMEOUT,
            "the oldest stalled client was kept past the cap"
        );
    });
}

/// Opens `n` connections that send nothing at all (idle, as a connection pool's).
async fn idle_clients(addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(
            tokio::net::TcpStream::connect(addr)
                .await
                .expect("connect an idle client"),
        );
    }
    v
}

/// As in tests/cases.rs (a wedged app under slow clients): past the cap, a
/// connection whose request is being answered (a `/readyz` waiting on its check)
/// is never the one closed, whether the cap is reached by slow clients (half a
/// head) or idle ones (no byte at all).
#[test]
fn past_the_cap_a_probe_being_answered_is_never_closed() {
    for idle in [false, true] {
        local(async {
            let s = Rc::new(Server::start(vec![check(
                "slow",
                CheckKind::Exec(vec!["sleep".into(), "12".into()]),
                500,
            )]));
            s.phase(Phase::Ready);
            let before = running(&["sleep", "12"]);
            let readyz = tokio::task::spawn_local({
                let s = s.clone();
                async move { s.get("/readyz").await }
            });
            // The /readyz request is read in full and waits for its check: the
            // check's command runs.
            check_started(&["sleep", "12"], &before).await;
            let n = probe::MAX_CONNECTIONS + 100;
            let _held = if idle {
                (idle_clients(s.addr, n).await, Vec::new())
            } else {
                (Vec::new(), stalled_clients(s.addr, n).await)
            };
            let r = readyz.await.expect("the /readyz client");
            let what = if idle { "idle" } else { "slow" };
            assert_eq!(
                (r.status, r.json()["status"].clone()),
                (503, json!("degraded")),
                "the /readyz being answered when {n} {what} clients came: {r:?}"
            );
            healthz_is_prompt(&s, &format!("{n} {what} clients past the cap")).await;
        });
    }
}

/// Under 1000 stalled clients (twice the cap) fresh `/healthz` probes keep
/// answering, none of them waiting for a stalled client to be timed out to get a
/// place: just before each probe a new stalled client (a witness) connects, and
/// the probe's answer comes while that witness is still open (its header read
/// timeout has not run out; the cap closes the oldest connection first, never
/// the newest). An order of events, not a speed; the latencies are printed.
#[test]
fn healthz_under_a_thousand_slow_clients() {
    local(async {
        let s = Server::start(Vec::new());
        let mut slow = stalled_clients(s.addr, 1000).await;
        // The server has taken them up to its cap: it closed the oldest.
        let mut b = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(30), slow[0].0.read(&mut b)).await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "the oldest of 1000 stalled clients was never closed: {closed:?}"
        );
        let mut took = Vec::new();
        let mut witnesses = Vec::new();
        for i in 0..100 {
            let (witness, _) = stalled_clients(s.addr, 1).await.pop().unwrap();
            let started = Instant::now();
            let r = s.get("/healthz").await;
            took.push(started.elapsed());
            assert_eq!(r.status, 200, "probe {i}");
            let mut one = [0u8; 1];
            match witness.try_read(&mut one) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!(
                    "probe {i} was answered only after the stalled client that connected \
                     just before it had been closed ({other:?})"
                ),
            }
            witnesses.push(witness);
        }
        took.sort();
        eprintln!(
            "/healthz under 1000 slow clients: p50 {:?} p99 {:?}",
            took[49], took[98]
        );
    });
}

// ---------------------------------------------------------------------------------
// Black-box tests: the drainit binary as a subreaper

/// A drainit of the shared harness, started directly (no launcher) as a subreaper
/// without the test's own `NOTIFY_SOCKET` and `WATCHDOG_*`, with the probe port it
/// was given.
struct Probed {
    run: Running,
    probe: Option<u16>,
}

impl Probed {
    /// Starts drainit with `args` (flags, `--`, command) and `env`.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Probed {
        let probe = args
            .iter()
            .position(|a| *a == "--probe-addr")
            .and_then(|i| args.get(i + 1)?.rsplit_once(':')?.1.parse().ok());
        let run = Running::start_direct(
            args,
            env,
            &["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"],
        );
        Probed { run, probe }
    }

    /// GET on a fresh connection to drainit's probe port; `None` when not answered.
    fn get(&self, path: &str) -> Option<(u16, Value)> {
        let port = self.probe.expect("started with --probe-addr");
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        s.write_all(get(path).as_bytes()).ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).ok()?;
        let r = Reply::parse(&buf);
        Some((r.status, serde_json::from_str(&r.body).ok()?))
    }

    /// Polls `path` until `want` holds for an answer; panics with the last answer.
    fn wait_for(
        &self,
        path: &str,
        within: Duration,
        what: &str,
        want: impl Fn(u16, &Value) -> bool,
    ) -> Value {
        let mut last = None;
        let ok = wait_until(within, || {
            last = self.get(path);
            last.as_ref().is_some_and(|(c, b)| want(*c, b))
        });
        assert!(
            ok,
            "{what}: {path} answered {last:?} within {within:?}\nstderr:\n{}",
            self.stderr_text()
        );
        last.expect("an answer").1
    }
}

impl std::ops::Deref for Probed {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.run
    }
}

impl std::ops::DerefMut for Probed {
    fn deref_mut(&mut self) -> &mut Running {
        &mut self.run
    }
}

/// `--probe-addr 127.0.0.1:<free>` plus short drain durations.
fn base_flags(probe: u16) -> Vec<String> {
    [
        "--probe-addr",
        &format!("127.0.0.1:{probe}"),
        "--pre-drain-delay",
        "100ms",
        "--drain-timeout",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn args<'a>(flags: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    flags
        .iter()
        .map(String::as_str)
        .chain(more.iter().copied())
        .collect()
}

#[test]
fn explicit_probe_port_in_use_exits_78_before_the_child() {
    let scratch = TmpDir::new("port-in-use");
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    let marker = scratch.join("child-ran");
    let script = format!("touch {}", marker.display());
    let mut d = Probed::start(
        &[
            "--probe-addr",
            &format!("127.0.0.1:{port}"),
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    let (code, _) = d.wait(Duration::from_secs(10));
    assert_eq!(code, 78, "stderr:\n{}", d.stderr_text());
    assert!(
        d.stderr_text().contains("address in use"),
        "stderr:\n{}",
        d.stderr_text()
    );
    // Had a child been started, it would have touched the file by now.
    assert!(
        !wait_until(Duration::from_millis(300), || marker.exists()),
        "the child ran"
    );
}

#[test]
fn default_probe_port_taken_warns_and_runs() {
    let scratch = TmpDir::new("default-taken");
    // Hold the default address; when something else holds it already, it is taken
    // all the same.
    let _held = TcpListener::bind("0.0.0.0:8079").ok();
    let marker = scratch.join("child-ran");
    let script = format!("touch {}; exec sleep 30", marker.display());
    let mut d = Probed::start(
        &[
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    assert!(
        wait_until(Duration::from_secs(5), || marker.exists()),
        "the child did not run\n{}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text().contains("running without probes"),
        "no warning:\n{}",
        d.stderr_text()
    );
    d.signal(libc::SIGTERM);
    let (code, _) = d.wait(Duration::from_secs(5));
    assert_eq!(code, 0, "stderr:\n{}", d.stderr_text());
}

fn status_of(b: &Value) -> &str {
    b["status"].as_str().unwrap_or("")
}

#[test]
fn real_app_starting_ready_degraded() {
    let [probe, app, dep] = free_ports();
    let flags = base_flags(probe);
    let app_addr = format!("127.0.0.1:{app}");
    let dep_addr = format!("127.0.0.1:{dep}");
    let app_port = app.to_string();
    let d = Probed::start(
        &args(
            &flags,
            &[
                "--ready-tcp",
                &app_addr,
                "--ready-tcp",
                &dep_addr,
                "--ready-interval",
                "50ms",
                "--check-timeout",
                "500ms",
                "--",
                python(),
                "-m",
                "http.server",
                &app_port,
                "--bind",
                "127.0.0.1",
            ],
        ),
        &[],
    );
    // Starting: the app is up, the dependency is not.
    let b = d.wait_for("/readyz", Duration::from_secs(10), "starting", |c, b| {
        c == 503 && status_of(b) == "starting" && b["checks"]["tcp-1"]["ok"] == true
    });
    assert_eq!(
        b["checks"]["tcp-2"],
        json!({"ok": false, "detail": "connection refused"})
    );
    assert_eq!(d.get("/healthz"), Some((200, json!({"status": "ok"}))));

    // Ready once the dependency listens.
    let dep_listener = TcpListener::bind(&dep_addr).expect("bind the dependency port");
    let b = d.wait_for("/readyz", Duration::from_secs(5), "ready", |c, _| c == 200);
    assert_eq!(
        b,
        json!({"status": "ready", "checks": {"tcp-1": {"ok": true}, "tcp-2": {"ok": true}}})
    );

    // Degraded, on the very next probe, when the dependency closes.
    drop(dep_listener);
    let (code, b) = d.get("/readyz").expect("an answer");
    assert_eq!(
        (code, b),
        (
            503,
            json!({"status": "degraded", "checks": {"tcp-1": {"ok": true}, "tcp-2": {"ok": false, "detail": "connection refused"}}})
        )
    );
    assert_eq!(d.get("/healthz"), Some((200, json!({"status": "ok"}))));

    // And ready again when it is back.
    let _dep_listener = TcpListener::bind(&dep_addr).expect("bind the dependency port again");
    d.wait_for("/readyz", Duration::from_secs(5), "ready again", |c, _| {
        c == 200
    });
}

#[test]
fn exec_check_runs_through_the_reaper() {
    let scratch = TmpDir::new("exec-check");
    let probe = free_port();
    let flags = base_flags(probe);
    let flag_file = scratch.join("ok");
    let exec = format!("test -e {}", flag_file.display());
    let d = Probed::start(
        &args(
            &flags,
            &[
                "--ready-exec",
                &exec,
                "--ready-interval",
                "50ms",
                "--",
                "sleep",
                "30",
            ],
        ),
        &[],
    );
    d.wait_for(
        "/readyz",
        Duration::from_secs(5),
        "the exec check fails with its status",
        |c, b| c == 503 && b["checks"]["exec"] == json!({"ok": false, "detail": "exit status 1"}),
    );
    std::fs::write(&flag_file, "").expect("create the flag file");
    let b = d.wait_for("/readyz", Duration::from_secs(5), "ready", |c, _| c == 200);
    assert_eq!(
        b,
        json!({"status": "ready", "checks": {"exec": {"ok": true}}})
    );
}

/// A Python child speaking sd_notify: `send(msg)` handles the abstract `@` form.
/// It writes its `NOTIFY_SOCKET` and `WATCHDOG_USEC` to `env`, then runs `body`.
fn notify_app(scratch: &TmpDir, body: &str) -> String {
    let prelude = format!(
        r#"
import os, socket, sys, time
addr = os.environ.get("NOTIFY_SOCKET", "")
open({env:?} + ".tmp", "w").write(addr + "\n" + os.environ.get("WATCHDOG_USEC", "-") + "\n")
os.rename({env:?} + ".tmp", {env:?})
target = "\0" + addr[1:] if addr.startswith("@") else addr
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def send(msg):
    sock.sendto(msg.encode(), target)
def wait_file(name):
    while not os.path.exists(os.path.join({dir:?}, name)):
        time.sleep(0.02)
"#,
        env = scratch.join("env").display().to_string(),
        dir = scratch.0.display().to_string(),
    );
    format!("{prelude}\n{body}\ntime.sleep(30)\n")
}

/// Sends a datagram to an `@abstract` or path socket from this (the test) process.
fn send_from_test(addr: &str, msg: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let a = match addr.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name"),
        None => SocketAddr::from_pathname(addr).expect("path"),
    };
    UnixDatagram::unbound()
        .expect("socket")
        .send_to_addr(msg.as_bytes(), &a)
        .expect("send to the notify socket");
}

fn read_env(scratch: &TmpDir) -> Vec<String> {
    let p = scratch.join("env");
    assert!(
        wait_until(Duration::from_secs(10), || p.exists()),
        "the app did not start"
    );
    std::fs::read_to_string(p)
        .expect("read env")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn notify_ready_status_and_stopping() {
    let scratch = TmpDir::new("notify");
    let probe = free_port();
    let flags = base_flags(probe);
    let app = notify_app(
        &scratch,
        r#"
send("STATUS=warming up")
wait_file("go1")
send("STATUS=still starting")
wait_file("go2")
send("READY=1\nSTATUS=serving")
wait_file("go3")
send("STOPPING=1")
"#,
    );
    let d = Probed::start(
        &args(&flags, &["--ready-notify", "--", python(), "-c", &app]),
        &[],
    );
    let env = read_env(&scratch);
    assert!(
        env[0].starts_with("@drainit-notify-"),
        "NOTIFY_SOCKET {:?} is not a private abstract socket",
        env[0]
    );
    assert_eq!(env[1], "-", "WATCHDOG_USEC is set without a watchdog");

    let b = d.wait_for(
        "/readyz",
        Duration::from_secs(5),
        "starting with STATUS",
        |_, b| b["app_status"] == "warming up",
    );
    assert_eq!(b, json!({"status": "starting", "app_status": "warming up"}));

    // A process outside the child's tree (this test, drainit's parent) is ignored.
    send_from_test(&env[0], "READY=1\nSTATUS=stranger");
    std::fs::write(scratch.join("go1"), "").expect("go1");
    let b = d.wait_for(
        "/readyz",
        Duration::from_secs(5),
        "the app's next STATUS",
        |_, b| b["app_status"] != "warming up",
    );
    assert_eq!(
        b,
        json!({"status": "starting", "app_status": "still starting"}),
        "the stranger's datagram counted"
    );

    std::fs::write(scratch.join("go2"), "").expect("go2");
    let b = d.wait_for("/readyz", Duration::from_secs(5), "READY=1", |c, _| {
        c == 200
    });
    assert_eq!(b, json!({"status": "ready", "app_status": "serving"}));

    std::fs::write(scratch.join("go3"), "").expect("go3");
    let b = d.wait_for("/readyz", Duration::from_secs(5), "STOPPING=1", |c, _| {
        c == 503
    });
    assert_eq!(status_of(&b), "degraded");
    assert_eq!(d.get("/healthz"), Some((200, json!({"status": "ok"}))));
}

#[test]
fn notify_and_checks_both_required() {
    let scratch = TmpDir::new("notify-and-check");
    let probe = free_port();
    let flags = base_flags(probe);
    let flag_file = scratch.join("ok");
    let flag = flag_file.display().to_string();
    let app = notify_app(&scratch, "send(\"READY=1\\nSTATUS=up\")\n");
    let d = Probed::start(
        &args(
            &flags,
            &[
                "--ready-notify",
                "--ready-file",
                &flag,
                "--ready-interval",
                "50ms",
                "--",
                python(),
                "-c",
                &app,
            ],
        ),
        &[],
    );
    read_env(&scratch);
    let b = d.wait_for(
        "/readyz",
        Duration::from_secs(5),
        "READY=1 sent, file missing",
        |_, b| b["app_status"] == "up" && b["checks"]["file"]["ok"] == false,
    );
    assert_eq!(status_of(&b), "starting");
    std::fs::write(&flag_file, "").expect("create the flag file");
    d.wait_for(
        "/readyz",
        Duration::from_secs(5),
        "ready once both passed",
        |c, _| c == 200,
    );
}

#[test]
fn notify_watchdog_drives_healthz() {
    let scratch = TmpDir::new("watchdog");
    let probe = free_port();
    let flags = base_flags(probe);
    let stop = scratch.join("stop").display().to_string();
    let app = notify_app(
        &scratch,
        &format!(
            r#"
send("READY=1\nWATCHDOG_USEC=500000")
while not os.path.exists({stop:?}):
    send("WATCHDOG=1")
    time.sleep(0.05)
"#
        ),
    );
    let d = Probed::start(
        &args(&flags, &["--ready-notify", "--", python(), "-c", &app]),
        &[],
    );
    read_env(&scratch);
    d.wait_for("/readyz", Duration::from_secs(5), "ready", |c, _| c == 200);
    // Beating: /healthz stays 200 over three intervals.
    let beating = Instant::now();
    while beating.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            d.get("/healthz").map(|r| r.0),
            Some(200),
            "stderr:\n{}",
            d.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = Instant::now();
    std::fs::write(&stop, "").expect("stop beating");
    let b = d.wait_for(
        "/healthz",
        Duration::from_secs(3),
        "the watchdog expired",
        |c, _| c == 503,
    );
    // The last beat came at most 50 ms before the stop file: the 500 ms interval
    // runs out no sooner than 450 ms after it.
    assert!(
        stopped.elapsed() >= Duration::from_millis(400),
        "/healthz failed {:?} after the beats stopped, inside the interval",
        stopped.elapsed()
    );
    assert_eq!(
        b,
        json!({"status": "unhealthy", "detail": "watchdog expired"})
    );
    // Readiness is a separate matter.
    assert_eq!(d.get("/readyz").map(|r| r.0), Some(200));
}

/// A datagram socket at a path, standing in for systemd's `NOTIFY_SOCKET`.
struct FakeSystemd {
    sock: std::os::unix::net::UnixDatagram,
    path: String,
}

impl FakeSystemd {
    fn bind(scratch: &TmpDir) -> FakeSystemd {
        let path = scratch.join("systemd.sock");
        let sock =
            std::os::unix::net::UnixDatagram::bind(&path).expect("bind the fake systemd socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        FakeSystemd {
            sock,
            path: path.display().to_string(),
        }
    }

    /// The first datagram, among those `seen` so far and those still to come, that
    /// contains `want`; panics after `within`.
    fn expect(&self, want: &str, within: Duration, seen: &mut Vec<String>) -> String {
        if let Some(m) = seen.iter().find(|m| m.contains(want)) {
            return m.clone();
        }
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                seen.push(msg.clone());
                if msg.contains(want) {
                    return msg;
                }
            }
        }
        panic!("no {want:?} from drainit within {within:?}; got {seen:?}");
    }
}

#[test]
fn systemd_gets_ready_stopping_and_relayed_messages() {
    let scratch = TmpDir::new("systemd");
    let systemd = FakeSystemd::bind(&scratch);
    let probe = free_port();
    let flags = base_flags(probe);
    let app = notify_app(
        &scratch,
        "send(\"READY=1\\nSTATUS=hello\")\nsend(\"WATCHDOG=1\")\n",
    );
    let mut d = Probed::start(
        &args(&flags, &["--ready-notify", "--", python(), "-c", &app]),
        &[
            ("NOTIFY_SOCKET", &systemd.path),
            ("WATCHDOG_USEC", "5000000"),
        ],
    );
    let env = read_env(&scratch);
    assert!(
        env[0].starts_with("@drainit-notify-"),
        "the child got NOTIFY_SOCKET {:?}",
        env[0]
    );
    assert_eq!(
        env[1], "5000000",
        "the child did not get systemd's watchdog interval"
    );
    let mut seen = Vec::new();
    systemd.expect("READY=1", Duration::from_secs(5), &mut seen);
    systemd.expect("STATUS=hello", Duration::from_secs(5), &mut seen);
    systemd.expect("WATCHDOG=1", Duration::from_secs(5), &mut seen);
    d.wait_for("/readyz", Duration::from_secs(5), "ready", |c, _| c == 200);

    d.signal(libc::SIGTERM);
    let msg = systemd.expect("STOPPING=1", Duration::from_secs(3), &mut seen);
    let extend: u64 = msg
        .lines()
        .find_map(|l| l.strip_prefix("EXTEND_TIMEOUT_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no EXTEND_TIMEOUT_USEC with STOPPING=1: {msg:?}"));
    // At least pre-drain delay + drain timeout (100 ms + 1 s).
    assert!(
        extend >= 1_100_000,
        "EXTEND_TIMEOUT_USEC={extend} does not cover the drain"
    );
    let (code, _) = d.wait(Duration::from_secs(5));
    assert_eq!(code, 0, "stderr:\n{}", d.stderr_text());
}

#[test]
fn systemd_without_ready_notify_keeps_the_socket_from_the_child() {
    let scratch = TmpDir::new("systemd-plain");
    let systemd = FakeSystemd::bind(&scratch);
    let probe = free_port();
    let flags = base_flags(probe);
    let env_file = scratch.join("env");
    let script = format!(
        "echo \"${{NOTIFY_SOCKET-unset}} ${{WATCHDOG_USEC-unset}}\" > {}; exec sleep 30",
        env_file.display()
    );
    let _d = Probed::start(
        &args(&flags, &["--", "sh", "-c", &script]),
        &[
            ("NOTIFY_SOCKET", &systemd.path),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut seen = Vec::new();
    // Nothing configured: ready at the spawn.
    systemd.expect("READY=1", Duration::from_secs(5), &mut seen);
    // No app to relay beats from: drainit keeps systemd's watchdog itself.
    systemd.expect("WATCHDOG=1", Duration::from_secs(2), &mut seen);
    assert!(wait_until(Duration::from_secs(5), || env_file.exists()));
    let env = std::fs::read_to_string(&env_file).expect("read env");
    assert_eq!(
        env.trim(),
        "unset unset",
        "drainit's own NOTIFY_SOCKET/WATCHDOG_USEC reached the child"
    );
}
