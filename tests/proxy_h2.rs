//! The admission proxy speaking HTTP/2 cleartext with prior knowledge (as gRPC
//! does; docs/proxy.md, "HTTP/2"), black box: the real binary in front of
//! tests/fixtures/h2app.py (an h2c app on Python's `h2`), reached by real HTTP/2
//! clients: Debian's `nghttp`, and tests/fixtures/h2raw.py, which writes its frames
//! by hand so that it can open a stream after the server's GOAWAY.
//!
//! Durations are short (pre-drain 300 ms, drain 5 s); upper bounds loose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// drainit with `--proxy 127.0.0.1:port=127.0.0.1:app` in front of h2app.py.
struct Px {
    r: Running,
    /// The proxy's listening port.
    port: u16,
    /// drainit's probe port (`/readyz`).
    probe: u16,
}

fn start_px() -> Px {
    start_px_with(&[])
}

/// As [`start_px`], with `app_args` added to h2app.py's.
fn start_px_with(app_args: &[&str]) -> Px {
    let ports = ProxyPorts::new();
    let (port, probe) = (ports.port, ports.probe);
    let h2app = fixture("h2app.py");
    let mut app = vec![python(), &h2app, "--port", "{app}", "--log", "$TMP/app.log"];
    app.extend_from_slice(app_args);
    let argv = ports.argv(
        &["--pre-drain-delay", "300ms", "--drain-timeout", "5s"],
        &app,
    );
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let r = Running::start(Mode::Subreaper, &args);
    let px = Px { r, port, probe };
    assert!(
        wait_until(secs(10), || http(px.probe, "/readyz", "GET").0 == 200),
        "drainit never became ready{}",
        px.ctx()
    );
    px
}

impl Px {
    /// The app's log (see h2app.py).
    fn log(&self) -> String {
        std::fs::read_to_string(self.r.path("app.log")).unwrap_or_default()
    }

    /// The t= of the app's first log line starting with `prefix`.
    fn logged_t(&self, prefix: &str) -> Option<u64> {
        let log = self.log();
        let line = log.lines().find(|l| l.starts_with(prefix))?;
        line.rsplit_once(" t=")?.1.parse().ok()
    }

    /// Waits (`within`) for drainit's exit: (exit code, report), the report's
    /// ledger checked to balance with nothing in flight.
    fn finish(&mut self, within: Duration) -> (i32, Value) {
        let (code, _) = self.r.wait(within);
        let rep = self.r.report();
        let q = &rep["requests"];
        let n = |k: &str| num(q, k);
        assert_eq!(n("received"), n("rejected") + n("admitted"), "{q}");
        assert_eq!(
            n("admitted"),
            n("completed") + n("unknown") + n("abandoned") + n("canceled") + n("in_flight"),
            "{q}"
        );
        assert_eq!(n("in_flight"), 0, "{q}");
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

/// `nghttp -v` (prior knowledge: an `http://` URI) against the proxy, within 10 s.
fn nghttp(port: u16, paths: &[&str]) -> Output {
    let mut c = Command::new("timeout");
    c.args(["10", "nghttp", "-v"]);
    for p in paths {
        c.arg(format!("http://127.0.0.1:{port}{p}"));
    }
    c.stdin(Stdio::null()).output().expect("running nghttp")
}

fn out_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// The `:status` values among nghttp's received fields, in order.
fn statuses(fields: &[(String, String)]) -> Vec<&str> {
    fields
        .iter()
        .filter(|(k, _)| k == ":status")
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The `(stream_id=N) name: value` fields nghttp printed as received.
fn recv_fields(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.split_once("] recv (stream_id=")?.1.split_once(") "))
        .filter_map(|(_, f)| f.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn get_with_prior_knowledge_passes_with_trailers_and_is_counted_completed() {
    let mut px = start_px();
    let o = nghttp(px.port, &["/ok", "/trailers"]);
    let out = out_of(&o);
    assert!(o.status.success(), "nghttp failed:\n{out}{}", px.ctx());
    let fields = recv_fields(&out);
    let statuses = statuses(&fields);
    assert_eq!(statuses, ["200", "200"], "{out}");
    assert!(out.contains("\nok\n") || out.contains("ok\n["), "{out}");
    // The app's trailers reach the client: gRPC's status travels there.
    assert!(
        fields.contains(&("grpc-status".into(), "0".into()))
            && fields.contains(&("x-trailer".into(), "yes".into())),
        "trailers lost:\n{out}"
    );
    assert!(
        !fields.iter().any(|(k, _)| k == "connection"),
        "a Connection field on HTTP/2:\n{out}"
    );
    let log = px.log();
    assert!(
        log.contains("recv GET /ok stream=") && log.contains("recv GET /trailers stream="),
        "{log}"
    );
    // A request body streams to the app over HTTP/2 (flow control both hops).
    let body = px.r.path("body");
    std::fs::write(&body, vec![b'x'; 300 * 1024]).unwrap();
    let o = Command::new("timeout")
        .args(["10", "nghttp", "-d"])
        .arg(&body)
        .arg(format!("http://127.0.0.1:{}/len", px.port))
        .stdin(Stdio::null())
        .output()
        .expect("running nghttp");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "307200",
        "{}{}",
        out_of(&o),
        px.ctx()
    );
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    assert_eq!(counts(&rep)[..7], [3, 0, 3, 3, 0, 0, 0], "{rep}");
}

/// The app sees the `:authority` the client sent (RFC 9113 §8.3.1), as an
/// HTTP/1 app sees the client's `Host`, not the address drainit reaches it at;
/// a `Host` that disagrees with it is drainit's 400 (`malformed`).
#[test]
fn the_app_sees_the_clients_authority() {
    let mut px = start_px();
    // nghttp sends the URI's host:port as `:authority` unless told otherwise.
    let seen: Vec<String> = [Some("svc.example:8443"), Some("other.example"), None]
        .iter()
        .map(|authority| {
            let mut c = Command::new("timeout");
            c.args(["10", "nghttp"]);
            if let Some(a) = authority {
                c.arg("-H").arg(format!(":authority: {a}"));
            }
            let o = c
                .arg(format!("http://127.0.0.1:{}/authority", px.port))
                .stdin(Stdio::null())
                .output()
                .expect("running nghttp");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
        .collect();
    assert_eq!(
        seen,
        [
            "authority=svc.example:8443 host=-".to_string(),
            "authority=other.example host=-".to_string(),
            format!("authority=127.0.0.1:{} host=-", px.port),
        ],
        "{}",
        px.ctx()
    );
    // A `Host` that names another authority is malformed (RFC 9113 §8.3.1):
    // drainit's 400, never the app's; the same one as `:authority` passes.
    let with_host = |host: &str| {
        let o = Command::new("timeout")
            .args(["10", "nghttp", "-H"])
            .arg(format!("host: {host}"))
            .arg(format!("http://127.0.0.1:{}/authority", px.port))
            .stdin(Stdio::null())
            .output()
            .expect("running nghttp");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(
        with_host("other.example"),
        "400 bad request: Host differs from :authority"
    );
    let same = format!("127.0.0.1:{}", px.port);
    assert_eq!(with_host(&same), format!("authority={same} host={same}"));
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(8));
    assert_eq!(code, 0, "{}", px.ctx());
    // received, rejected, admitted, completed, unknown, abandoned, canceled,
    // in_flight, malformed
    assert_eq!(counts(&rep), [4, 0, 4, 4, 0, 0, 0, 0, 1], "{rep}");
}

/// The heart of it: a stream admitted before beat 3 finishes after SIGTERM;
/// at beat 3 the connection gets the two-step GOAWAY (2^31-1, then the last
/// stream id), a stream opened on it after that never reaches the app (its id
/// is above the GOAWAY's last one: the client knows it is safe to retry), and
/// the app is signalled only once the open streams are done. Two clients: h2raw
/// (hand-written frames: the new stream after GOAWAY) and nghttp (a real
/// client library: it sees both GOAWAY frames and its stream completes).
#[test]
fn at_beat_3_open_streams_finish_after_goaway_and_a_new_stream_is_refused() {
    let mut px = start_px();
    let raw = Command::new(python())
        .arg(fixture("h2raw.py"))
        .args(["--port", &px.port.to_string()])
        .args(["--first", "/slow?ms=2000", "--after-goaway", "/ok"])
        .args(["--wait", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running h2raw.py");
    let port = px.port;
    let ng = std::thread::spawn(move || nghttp(port, &["/slow?ms=1500"]));
    assert!(
        wait_until(secs(5), || px.log().matches("recv GET /slow").count() == 2),
        "both slow streams never reached the app{}",
        px.ctx()
    );
    px.r.signal(libc::SIGTERM);

    let raw = raw.wait_with_output().expect("h2raw.py output");
    let raw_out = out_of(&raw);
    let ng = ng.join().unwrap();
    let ng_out = out_of(&ng);
    let (code, rep) = px.finish(secs(10));
    let ctx = format!("\nh2raw:\n{raw_out}\nnghttp:\n{ng_out}{}", px.ctx());
    assert_eq!(code, 0, "{ctx}");

    // h2raw: GOAWAY in two steps, its stream 1 answered whole after them.
    let lines: Vec<&str> = raw_out.lines().collect();
    let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix));
    let first = at("goaway last=2147483647 error=0").expect(&ctx);
    let second = at("goaway last=1 error=0").expect(&ctx);
    let sent = at("sent stream=3").expect(&ctx);
    let end = at("data stream=1 len=0 end=1")
        .or_else(|| at("data stream=1 len=5 end=1"))
        .expect(&ctx);
    assert!(first < second && second < sent && sent < end, "{ctx}");
    assert!(at("headers stream=1 status=200").is_some(), "{ctx}");
    // Stream 3 came after the last id: ignored, never answered, never sent on.
    assert!(!raw_out.contains("stream=3 status"), "{ctx}");
    assert!(!px.log().contains("recv GET /ok"), "{ctx}");

    // nghttp: the same two GOAWAY frames; its stream completes; exit 0.
    assert!(ng.status.success(), "{ctx}");
    let goaways: Vec<&str> = ng_out
        .lines()
        .filter(|l| l.contains("last_stream_id=") && !l.contains("last_stream_id=0,"))
        .collect();
    assert_eq!(goaways.len(), 2, "{ctx}");
    assert!(goaways[0].contains("last_stream_id=2147483647"), "{ctx}");
    assert!(
        ng_out.contains("\nslow\n") || ng_out.contains("slow\n["),
        "{ctx}"
    );

    // The drain signal waited for both streams: nghttp's (1.5 s) ended in the
    // app before it, and h2raw's (2 s, the last) got its whole body, which the
    // app (it dies of SIGTERM) sends only at the end. (The app's own "done" line
    // for that last stream may never be written: the signal can come between its
    // last write and that line.)
    let sig = px.logged_t("signal TERM").expect(&ctx);
    let first_done = px.logged_t("done GET /slow?ms=1500").expect(&ctx);
    assert!(
        sig >= first_done && at("data stream=1 len=5").is_some(),
        "SIGTERM reached the app before its streams completed{ctx}"
    );
    assert_eq!(counts(&rep)[..7], [2, 0, 2, 2, 0, 0, 0], "{rep}");
    assert_eq!(num(&rep, "requests.in_flight_at_start"), 2, "{rep}");
}

/// After beat 3 a new HTTP/2 connection's request gets drainit's 503 (with
/// `Retry-After`, `Proxy-Status`, no `Connection` field), never reaches the app,
/// and is counted `rejected`; the connection gets GOAWAY at once.
#[test]
fn a_request_on_a_new_connection_after_beat_3_is_rejected_with_503() {
    let mut px = start_px();
    // A slow stream holds the drain open past beat 3.
    let raw = Command::new(python())
        .arg(fixture("h2raw.py"))
        .args(["--port", &px.port.to_string()])
        .args(["--first", "/slow?ms=2500", "--wait", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running h2raw.py");
    assert!(
        wait_until(secs(5), || px.log().contains("recv GET /slow")),
        "{}",
        px.ctx()
    );
    px.r.signal(libc::SIGTERM);
    assert!(
        wait_until(secs(5), || px.r.stderr_text().contains("admission closed")),
        "{}",
        px.ctx()
    );
    let o = nghttp(px.port, &["/ok"]);
    let out = out_of(&o);
    let fields = recv_fields(&out);
    let field = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(field(":status"), Some("503"), "{out}");
    assert_eq!(field("retry-after"), Some("1"), "{out}");
    assert!(
        field("proxy-status").is_some_and(|v| v.starts_with("drainit")),
        "{out}"
    );
    assert_eq!(field("connection"), None, "{out}");
    assert!(out.contains("recv GOAWAY"), "{out}");
    let raw = raw.wait_with_output().expect("h2raw.py output");
    let raw_out = out_of(&raw);
    assert!(raw_out.contains("data stream=1 len=5"), "{raw_out}");
    let (code, rep) = px.finish(secs(10));
    assert_eq!(code, 0, "{}", px.ctx());
    assert!(!px.log().contains("recv GET /ok"), "{}", px.ctx());
    assert_eq!(counts(&rep)[..7], [2, 1, 1, 1, 0, 0, 0], "{rep}");
}

/// Rapid reset (CVE-2023-44487, paced so that each stream is taken up first):
/// clients open and cancel 6000 requests (15 connections of 400, each under
/// the premature-reset limit) while another client's request is in flight on
/// the same upstream HTTP/2 connection. Every canceled request is `canceled`,
/// and the other client's request completes: before, the app answering a
/// stream drainit had already canceled made h2 reset it, and at 1024 such
/// resets (counted over the connection's life) h2 closed the shared
/// connection, cutting every client's request on it (502 or a reset, `unknown`).
#[test]
fn a_client_canceling_thousands_of_streams_never_cuts_another_clients_request() {
    let mut px = start_px();
    let port = px.port;
    let victim = std::thread::spawn(move || {
        Command::new("timeout")
            .args(["30", "nghttp", "-v"])
            .arg(format!("http://127.0.0.1:{port}/slow?ms=12000"))
            .stdin(Stdio::null())
            .output()
            .expect("running nghttp")
    });
    assert!(
        wait_until(secs(5), || px.log().contains("recv GET /slow?ms=12000")),
        "the other client's request never reached the app{}",
        px.ctx()
    );
    let mut raw_out = String::new();
    for _ in 0..15 {
        let raw = Command::new("timeout")
            .args(["25", python()])
            .arg(fixture("h2raw.py"))
            .args(["--port", &port.to_string()])
            .args(["--first", "/slow?ms=2000", "--cancel", "400"])
            .output()
            .expect("running h2raw.py");
        raw_out += &out_of(&raw);
    }
    let victim = victim.join().unwrap();
    let v_out = out_of(&victim);
    let ctx = format!("\nh2raw:\n{raw_out}\nnghttp:\n{v_out}");
    assert_eq!(
        raw_out.matches("canceled n=400").count(),
        15,
        "{ctx}{}",
        px.ctx()
    );
    assert!(victim.status.success(), "{ctx}{}", px.ctx());
    assert!(
        v_out.contains(":status: 200") && v_out.contains("\nslow\n") || v_out.contains("slow\n["),
        "the other client's request was cut{ctx}"
    );
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(10));
    let q = ledger(&rep);
    assert_eq!(num(q, "received"), 6001, "{q}");
    assert_eq!(num(q, "completed"), 1, "{q}");
    assert_eq!(num(q, "canceled"), 6000, "{q}");
    assert_eq!(num(q, "unknown"), 0, "{q}");
    assert_eq!(code, 0, "{q}");
}

/// A client that cancels its streams as soon as it opens them, thousands of
/// times (rapid reset paced past h2's own guard): once it has canceled 500
/// within 1 s of opening them, more than half of its streams, drainit closes
/// its connection and says so. The app saw no more requests than the ledger
/// admitted, the next client is served, and the drain is clean. The app holds
/// each answer back (`/hold`): a stream whose response head came before the
/// cancel is not a premature reset (as Envoy counts them), and with `/slow`'s
/// head at once that was a race the cancels lost often enough to fail.
#[test]
fn a_client_that_cancels_its_streams_as_it_opens_them_is_disconnected() {
    let mut px = start_px();
    let raw = Command::new("timeout")
        .args(["60", python()])
        .arg(fixture("h2raw.py"))
        .args(["--port", &px.port.to_string()])
        .args(["--first", "/hold?ms=2000", "--cancel", "5000"])
        .output()
        .expect("running h2raw.py");
    let raw_out = out_of(&raw);
    let ctx = format!("\nh2raw:\n{raw_out}");
    assert!(
        raw_out.contains("closed") && !raw_out.contains("canceled n=5000"),
        "the connection was not closed{ctx}{}",
        px.ctx()
    );
    assert!(
        px.r.stderr_text()
            .contains("(rapid reset): its connection is closed"),
        "{}",
        px.ctx()
    );
    let next = nghttp(px.port, &["/ok"]);
    assert!(out_of(&next).contains(":status: 200"), "{}", out_of(&next));
    let app_got = px.log().matches("recv GET /hold").count();
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(10));
    let q = ledger(&rep);
    let received = num(q, "received");
    assert!((500..5000).contains(&received), "{q}");
    assert_eq!(num(q, "canceled"), received - 1, "{q}");
    assert_eq!(num(q, "completed"), 1, "{q}");
    assert!(app_got as i64 <= received, "app got {app_got}: {q}");
    assert_eq!(code, 0, "{q}");
}

/// HTTP/2 requests share one connection to the app, and wait for it while one
/// of them opens it. When the app does not accept (its accept queue full),
/// each request still waits at most the connect bound (5 s) from when it asked,
/// then gets the retryable 503 `connection_timeout`: three at once end
/// together, at 5 s. Before, each waited for the one before it to time out and
/// then connected on its own: 5, 10 and 15 s.
#[test]
fn concurrent_requests_to_an_app_that_does_not_accept_wait_the_connect_bound_once() {
    let (_app, _filler, app_port) = full_listener();
    let (mut r, port, _probe) = proxy_to(app_port, &[]);
    let sent = std::time::Instant::now();
    let o = nghttp(port, &["/a", "/b", "/c"]);
    let took = sent.elapsed();
    let out = out_of(&o);
    let fields = recv_fields(&out);
    let statuses = statuses(&fields);
    assert_eq!(statuses, ["503"; 3], "{out}");
    let timeouts = fields
        .iter()
        .filter(|(k, v)| k == "proxy-status" && v.contains("error=connection_timeout"))
        .count();
    assert_eq!(timeouts, 3, "{out}");
    assert!(
        took < secs(9),
        "{took:?}: the three waited one after another\n{out}"
    );
    r.signal(libc::SIGTERM);
    r.wait(secs(10));
    let rep = r.report();
    ledger(&rep);
    assert_eq!(counts(&rep)[..3], [3, 3, 0], "{rep}");
}

/// An app that allows 20 concurrent streams per connection; one
/// client opens 30 slow streams (8 s each) on its connection, and another
/// client's request on its own connection is answered while they are all
/// still open (ordering: the app logs its answer before any slow stream
/// ended). All HTTP/2 requests sharing one connection to the app, it waited
/// behind the slow streams in h2's queue.
#[test]
fn one_clients_slow_streams_at_the_apps_limit_never_stall_another_client() {
    let mut px = start_px_with(&["--max-streams", "20"]);
    let slow = format!("http://127.0.0.1:{}/hold?ms=8000", px.port);
    let mut a = Command::new("timeout")
        .args(["30", "nghttp", "-m", "30", &slow])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("running nghttp");
    assert!(
        wait_until(secs(10), || px.log().matches("recv GET /hold").count()
            >= 20),
        "the slow streams never reached the app{}",
        px.ctx()
    );
    let o = nghttp(px.port, &["/ok"]);
    let out = out_of(&o);
    assert!(o.status.success(), "nghttp failed:\n{out}{}", px.ctx());
    assert_eq!(statuses(&recv_fields(&out)), ["200"], "{out}");
    let log = px.log();
    assert!(
        !log.contains("done GET /hold"),
        "the other client was answered only after a slow stream ended:\n{log}"
    );
    let _ = a.wait();
    let log = px.log();
    assert_eq!(log.matches("done GET /hold").count(), 30, "{log}");
    px.r.signal(libc::SIGTERM);
    let (code, rep) = px.finish(secs(20));
    assert_eq!(code, 0, "{rep}");
}
