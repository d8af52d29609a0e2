//! The probe server: `GET|HEAD /healthz`, `/readyz` and `/metrics` over HTTP/1.1
//! (docs/probes.md; docs/logs.md).
//!
//! Owns: answering probes from the published state. It reads a
//! `tokio::sync::watch` of [`Published`] and evaluates readiness checks through
//! [`Checks`]; it never takes anything the supervisor needs, so a slow or hostile
//! client can delay neither signal handling nor the drain.
//!
//! Hardening: one request per connection (the kubelet opens a fresh connection per
//! probe), a header read timeout (from the accept, whether or not a byte arrived), a
//! header size cap, a cap on concurrent connections, and each connection in its own
//! task, so a panic in one is caught by the runtime and goes no further.
//!
//! The cap sheds only connections that are still sending their request head
//! (slowloris, idle, half-open): past the cap the *oldest such* connection is
//! closed to make room for the new one. A connection whose request head was read
//! in full is being answered (a `/readyz` may wait up to its check timeout) and is
//! never shed: the kubelet would see a reset instead of its answer. A probe sends
//! its request at once and is done in milliseconds, so the oldest head-reading
//! connections are the stalled ones, and a flood of slow or idle clients can never
//! lock a probe out (closing new connections instead would fail every probe until
//! the header read timeout freed a slot). Only when every connection at the cap is
//! being answered is the new one closed; those finish within the largest check
//! timeout.
//!
//! Never a redirect (the kubelet counts 3xx as success); bodies are small JSON
//! (the kubelet reads at most 10 KiB) with `Cache-Control: no-store`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::checks::{Checks, Evaluation};
use crate::drain::Phase;
use crate::metrics::{self, Metrics};

/// How long a client may take to send its request headers, from the accept.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one connection may live at most, whatever it does.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// Concurrent connections served; past it the oldest connection still sending its
/// request head is closed to make room.
pub const MAX_CONNECTIONS: usize = 512;
/// Request buffer (headers included), bytes; a longer head gets 431.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;

// The shared state lives in its own module (written by the supervisor and notify,
// read here); re-exported for the callers that named it here.
pub use crate::published::Published;
use crate::published::{ReadinessAsk, ReadyzAsked};

/// Binds the probe socket (before the child is spawned, so a taken port is a
/// configuration error and never a half-started app). Close-on-exec, like every fd
/// of drainit's own.
///
/// # Errors
/// `bind(2)`/`listen(2)` failed (address in use, permission denied …).
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    crate::util::bind_listener(addr)
}

/// What the probe server answers from and records to.
struct Probes {
    state: watch::Receiver<Published>,
    checks: Rc<Checks>,
    /// Counts each answer; rendered by `/metrics`.
    metrics: Metrics,
    /// Told when `/readyz` is asked (the driver receives it as an event).
    asked: ReadyzAsked,
    /// The admission proxy's counts for `/metrics` (`None` without `--proxy`).
    proxy: Option<crate::proxy::ProxyStats>,
    /// The last count of the descendants and when it was taken.
    descendants: Cell<Option<(std::time::Instant, Option<usize>)>>,
}

/// Serves probes until the runtime stops. Spawn it with `spawn_local` on a
/// `LocalSet` (checks and connections are `!Send` tasks of the same thread).
/// Each answer is counted in `metrics`; each `/readyz` is noted on `asked`.
/// `proxy`: the admission proxy's counts for `/metrics` (`None` without
/// `--proxy`).
pub async fn serve(
    listener: std::net::TcpListener,
    state: watch::Receiver<Published>,
    checks: Rc<Checks>,
    metrics: Metrics,
    asked: ReadyzAsked,
    proxy: Option<crate::proxy::ProxyStats>,
) {
    let probes = Rc::new(Probes {
        state,
        checks,
        metrics,
        asked,
        proxy,
        descendants: Cell::new(None),
    });
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            log::error!("probe server failed: {e}");
            return;
        }
    };
    // Live connections by accept order: the first entry is the oldest.
    let open: Rc<RefCell<BTreeMap<u64, Open>>> = Rc::default();
    let cap = connection_cap();
    let mut next_id = 0u64;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                log::debug!("probe accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.borrow().len() >= cap && !shed_one(&open) {
            // Every connection at the cap is being answered: they end within the
            // largest check timeout; this one is closed unanswered.
            log::debug!(
                "probe connections at the cap of {cap}, all being answered: closing the new one"
            );
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let guard = OpenGuard(open.clone(), id);
        let answering = Rc::new(Cell::new(false));
        let probes = probes.clone();
        let flag = answering.clone();
        let task = tokio::task::spawn_local(async move {
            let _guard = guard;
            let svc = hyper::service::service_fn(move |req| {
                // The request head was read in full: from now on this connection
                // is answered, never shed by the cap.
                flag.set(true);
                let probes = probes.clone();
                async move {
                    let res = answer(&req, &probes).await;
                    probes
                        .metrics
                        .probe_request(req.uri().path(), res.status().as_u16());
                    Ok::<_, Infallible>(res)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
        });
        // The task has not run yet (same thread), so its guard cannot have removed
        // this entry before it is inserted.
        open.borrow_mut().insert(
            id,
            Open {
                task: task.abort_handle(),
                answering,
            },
        );
    }
}

/// A live probe connection: its task, and whether its request head was read.
struct Open {
    task: tokio::task::AbortHandle,
    answering: Rc<Cell<bool>>,
}

/// Closes the oldest connection that is still sending its request head. Returns
/// `false` when every live connection is being answered (nothing was shed).
fn shed_one(open: &RefCell<BTreeMap<u64, Open>>) -> bool {
    let mut open = open.borrow_mut();
    let Some(id) = open
        .iter()
        .find(|(_, c)| !c.answering.get())
        .map(|(id, _)| *id)
    else {
        return false;
    };
    if let Some(c) = open.remove(&id) {
        log::debug!(
            "probe connections at the cap: closing the oldest one still sending its request"
        );
        c.task.abort();
    }
    true
}

/// [`MAX_CONNECTIONS`], or fewer under a low `RLIMIT_NOFILE`: probe connections
/// may take at most half of the descriptors left after a reserve of 32, so that
/// reading `/proc`, the notify socket and teardown steps never run out of fds
/// because of probe traffic (a drain must not see an unreadable process table).
pub fn connection_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let budget = (soft.saturating_sub(32) / 2) as usize;
    budget.clamp(1, MAX_CONNECTIONS)
}

/// Removes its connection from the live set when the connection's task ends,
/// finished, aborted or panicked.
struct OpenGuard(Rc<RefCell<BTreeMap<u64, Open>>>, u64);
impl Drop for OpenGuard {
    fn drop(&mut self) {
        // try_borrow_mut: never panic inside a drop that may run during unwinding.
        if let Ok(mut open) = self.0.try_borrow_mut() {
            open.remove(&self.1);
        }
    }
}

fn respond(status: StatusCode, body: Value, head: bool) -> Response<Full<Bytes>> {
    let bytes = if head {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store");
    if status == StatusCode::METHOD_NOT_ALLOWED {
        b = b.header(header::ALLOW, "GET, HEAD");
    }
    if head {
        b = b.header(header::CONTENT_LENGTH, body.to_string().len());
    }
    b.body(Full::new(bytes)).expect("static headers are valid")
}

fn checks_json(ev: &Evaluation) -> Value {
    let mut m = Map::new();
    for r in &ev.results {
        let mut c = Map::new();
        c.insert("ok".into(), Value::Bool(r.ok));
        if let Some(d) = &r.detail {
            c.insert("detail".into(), Value::String(d.clone()));
        }
        m.insert(r.name.clone(), Value::Object(c));
    }
    Value::Object(m)
}

/// The answer to one request (docs/probes.md): `/healthz` 200 `{"status":"ok"}`, or 503
/// `{"status":"unhealthy","detail":"watchdog expired"}` when the app's sd_notify
/// watchdog stopped beating; `/readyz` 200 `ready` or 503 `starting`, `degraded`,
/// `draining`, `stopping`, with `checks` (name → `ok`, `detail`) when checks are
/// configured and `app_status` when the app sent `STATUS=`; `/metrics` 200 with the
/// Prometheus text of [`Metrics::render`]. Other paths 404, other
/// methods 405 with `Allow: GET, HEAD`; `HEAD` gets the headers of `GET` and no
/// body. Once ready, `/readyz` evaluates the checks (single flight), so it answers
/// within the largest check timeout plus scheduling.
/// A `/readyz` asked is noted on the server's [`ReadyzAsked`].
async fn answer<B>(req: &Request<B>, probes: &Probes) -> Response<Full<Bytes>> {
    let (state, checks) = (&probes.state, &probes.checks);
    let head = req.method() == Method::HEAD;
    let path = req.uri().path();
    if path == "/metrics" && (req.method() == Method::GET || head) {
        return metrics_response(&state.borrow().clone(), probes, head);
    }
    if path != "/healthz" && path != "/readyz" && path != "/metrics" {
        return respond(StatusCode::NOT_FOUND, json!({"status": "not found"}), head);
    }
    if req.method() != Method::GET && !head {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"status": "method not allowed"}),
            false,
        );
    }
    if path == "/readyz" {
        probes.asked.note();
    }
    let published = state.borrow().clone();
    if path == "/healthz" {
        return if published.watchdog_ok {
            respond(StatusCode::OK, json!({"status": "ok"}), head)
        } else {
            respond(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "unhealthy", "detail": "watchdog expired"}),
                head,
            )
        };
    }
    let (status, body) = readiness(&published, state, checks).await;
    respond(status, Value::Object(body), head)
}

/// What `/readyz` answers now: its status and JSON body. Once ready, the checks
/// are evaluated (single flight).
async fn readiness(
    published: &Published,
    state: &watch::Receiver<Published>,
    checks: &Rc<Checks>,
) -> (StatusCode, Map<String, Value>) {
    let mut body = Map::new();
    let status = match published.phase {
        Phase::Starting => {
            body.insert("status".into(), "starting".into());
            if let Some(ev) = checks.last() {
                body.insert("checks".into(), checks_json(&ev));
            }
            StatusCode::SERVICE_UNAVAILABLE
        }
        Phase::Ready if published.app_stopping => {
            body.insert("status".into(), "degraded".into());
            body.insert("detail".into(), "app stopping".into());
            StatusCode::SERVICE_UNAVAILABLE
        }
        Phase::Ready if checks.is_empty() => {
            body.insert("status".into(), "ready".into());
            StatusCode::OK
        }
        Phase::Ready => {
            let ev = checks.evaluate().await;
            // The phase may have changed while the checks ran: a drain wins.
            let phase = state.borrow().phase;
            if phase != Phase::Ready {
                body.insert("status".into(), phase.as_str().into());
                StatusCode::SERVICE_UNAVAILABLE
            } else if ev.all_ok() {
                body.insert("status".into(), "ready".into());
                body.insert("checks".into(), checks_json(&ev));
                StatusCode::OK
            } else {
                body.insert("status".into(), "degraded".into());
                body.insert("checks".into(), checks_json(&ev));
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
        Phase::Draining | Phase::Stopping => {
            body.insert("status".into(), published.phase.as_str().into());
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    if let Some(text) = &published.status_text {
        body.insert("app_status".into(), text.clone().into());
    }
    (status, body)
}

/// How long an answer to a [`ReadinessAsk`] is reused: the proxy's health path
/// is on the app's public port, and a flood of it must not run the checks back
/// to back on the supervisor's thread (nor flood the app's backlog with
/// `--ready-tcp` connects).
pub const READINESS_FRESH: Duration = Duration::from_millis(250);

/// Answers [`ReadinessAsk`]s as `/readyz` would (the checks evaluated once
/// ready, single flight; an answer reused for [`READINESS_FRESH`] while the
/// phase is unchanged and no newer evaluation ran, e.g. for `/readyz`), on the
/// supervisor's thread, until every sender is gone.
/// Spawn it with `spawn_local`.
pub async fn answer_readiness(
    mut asks: tokio::sync::mpsc::Receiver<ReadinessAsk>,
    state: watch::Receiver<Published>,
    checks: Rc<Checks>,
) {
    type Last = Option<(tokio::time::Instant, Phase, u64, bool, String)>;
    let last: Rc<RefCell<Last>> = Rc::default();
    while let Some(ask) = asks.recv().await {
        let published = state.borrow().clone();
        if let Some((at, phase, runs, ok, word)) = &*last.borrow()
            && at.elapsed() < READINESS_FRESH
            && *phase == published.phase
            && *runs == checks.runs()
        {
            let _ = ask.send((*ok, word.clone()));
            continue;
        }
        let (state, checks, last) = (state.clone(), checks.clone(), last.clone());
        tokio::task::spawn_local(async move {
            let (status, body) = readiness(&published, &state, &checks).await;
            let word = body
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string();
            let ok = status == StatusCode::OK;
            *last.borrow_mut() = Some((
                tokio::time::Instant::now(),
                published.phase,
                checks.runs(),
                ok,
                word.clone(),
            ));
            let _ = ask.send((ok, word));
        });
    }
}

/// `/metrics`: the counters, with the states read now. Readiness is what `/readyz`
/// would answer from what is known without running the checks (their last
/// evaluation), so a scrape never triggers a check.
fn metrics_response(published: &Published, probes: &Probes, head: bool) -> Response<Full<Bytes>> {
    let checks = &probes.checks;
    let ready = published.phase == Phase::Ready
        && !published.app_stopping
        && (checks.is_empty() || checks.last().is_some_and(|ev| ev.all_ok()));
    let view = metrics::View {
        phase: published.phase,
        ready,
        descendants: descendants_now(probes),
    };
    let text = probes
        .metrics
        .render(&view, &checks.runs_by_result(), probes.proxy.as_ref());
    let len = text.len();
    let mut b = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, metrics::CONTENT_TYPE)
        .header(header::CACHE_CONTROL, "no-store");
    if head {
        b = b.header(header::CONTENT_LENGTH, len);
    }
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(text)
    };
    b.body(Full::new(body)).expect("static headers are valid")
}

/// How long a count of the descendants serves scrapes: a walk of `/proc` runs on
/// the loop thread and costs ~0.1 ms per process (120 ms for 1,500), so a flood of
/// scrapes must not turn into a flood of walks that delay signals and probes.
pub const DESCENDANTS_MAX_AGE: Duration = Duration::from_secs(5);

/// The live descendants, as the supervisor counts them (drainit's helpers left
/// out), at most [`DESCENDANTS_MAX_AGE`] old; `None` when `/proc` is not this PID
/// namespace's or cannot be read.
fn descendants_now(probes: &Probes) -> Option<usize> {
    let now = std::time::Instant::now();
    if let Some((at, n)) = probes.descendants.get()
        && now.duration_since(at) < DESCENDANTS_MAX_AGE
    {
        return n;
    }
    let n = count_descendants(&probes.checks);
    probes.descendants.set(Some((now, n)));
    n
}

fn count_descendants(checks: &Checks) -> Option<usize> {
    crate::tree::count_descendants(&checks.helper_pids())
}
