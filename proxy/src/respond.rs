//! drainit's own responses, never the app's: the 503 of a request that never
//! reached the app (safe to retry), the 400/408/501 of a malformed or stalled
//! request, the 502 of one the app did not answer, and the health path.
//!
//! As linkerd2-proxy's `errors/respond.rs`: every error becomes a well-formed
//! response with a reason (its body, and `Proxy-Status`, RFC 9209), never a
//! dropped connection. Must not: count anything in the ledger; the request
//! path records the outcome ([`super::outcome`]) and picks the answer here.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

use super::body::ProxyBody;
use super::shared::{Gate, Rejecting, Shared};
use super::{REJECT_BODY_MAX, REJECT_BODY_TIME, RETRY_AFTER_S};

/// How long the health path waits for the readiness evaluation (the checks'
/// own timeouts end it sooner).
pub const HEALTH_WAIT: Duration = Duration::from_secs(10);

/// Why drainit answers 503 (the request never reached the app).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unavailable {
    /// Readiness has not passed yet.
    NotReady,
    /// Admission is closed (beat 3), or drainit halted the connect to the app.
    Draining,
    /// The app did not accept the connection in time.
    UpstreamTimeout,
    /// The app refused the connection.
    UpstreamRefused,
}

/// drainit's own 503: never reached the app, safe to retry (RFC 9110 §15.6.4,
/// `Retry-After` §10.2.3). Its `Proxy-Status` (RFC 9209 §2) names the error
/// type: `destination_unavailable` before ready and while draining,
/// `connection_refused` and `connection_timeout` (§2.3.7, §2.3.9) when the
/// connection to the app failed. Its body holds `rejecting` until it is
/// written ([`Rejecting`]).
pub(super) fn unavailable(
    why: Unavailable,
    gate: Gate,
    version: hyper::Version,
    rejecting: Rejecting,
) -> Response<ProxyBody> {
    let (body, error, details) = match why {
        Unavailable::NotReady => (
            "503 not ready\n",
            "destination_unavailable",
            "\"not ready\"",
        ),
        Unavailable::Draining => ("503 draining\n", "destination_unavailable", "\"draining\""),
        Unavailable::UpstreamTimeout => (
            "503 upstream did not accept the connection in time\n",
            "connection_timeout",
            "\"upstream connect timeout\"",
        ),
        Unavailable::UpstreamRefused => (
            "503 upstream refused\n",
            "connection_refused",
            "\"upstream refused\"",
        ),
    };
    let mut r = local(StatusCode::SERVICE_UNAVAILABLE, body, gate, version);
    r.body_mut().rejecting = Some(rejecting);
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    if version < hyper::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let status = format!("drainit; error={error}; details={details}");
    if let Ok(v) = HeaderValue::from_str(&status) {
        h.insert(HeaderName::from_static("proxy-status"), v);
    }
    r
}

/// A response of drainit's own; `Connection: close` from T0 on HTTP/1 only
/// (HTTP/2 has no `Connection` field).
pub(super) fn local(
    status: StatusCode,
    text: &'static str,
    gate: Gate,
    version: hyper::Version,
) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::local(text));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if gate >= Gate::Closing && version < hyper::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// [`local`], and an HTTP/1 connection closed after it whatever the gate: a
/// malformed request (400, 501) or a stalled body (408) leaves the
/// connection's framing in doubt.
pub(super) fn closing(
    status: StatusCode,
    text: &'static str,
    gate: Gate,
    version: hyper::Version,
) -> Response<ProxyBody> {
    let mut r = local(status, text, gate, version);
    if version != hyper::Version::HTTP_2 {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// The health path: drainit's own readiness, as `/readyz` (200 only while
/// ready; 503 before and from T0).
pub(super) async fn health(shared: &Shared, version: hyper::Version) -> Response<ProxyBody> {
    let gate = shared.gate();
    if gate != Gate::Ready {
        let word = if gate == Gate::NotReady {
            "starting\n"
        } else {
            "draining\n"
        };
        return local(StatusCode::SERVICE_UNAVAILABLE, word, gate, version);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let answer = async {
        shared.ready_ask.send(tx).await.ok()?;
        rx.await.ok()
    };
    let answer = tokio::time::timeout(HEALTH_WAIT, answer)
        .await
        .ok()
        .flatten();
    // A drain that began meanwhile wins.
    let gate = shared.gate();
    match answer {
        Some((true, _)) if gate == Gate::Ready => local(StatusCode::OK, "ready\n", gate, version),
        Some((_, word)) if gate == Gate::Ready => {
            let mut r = local(StatusCode::SERVICE_UNAVAILABLE, "", gate, version);
            *r.body_mut() = ProxyBody::text(format!("{word}\n"));
            r
        }
        _ if gate == Gate::Ready => {
            local(StatusCode::SERVICE_UNAVAILABLE, "unknown\n", gate, version)
        }
        _ => local(StatusCode::SERVICE_UNAVAILABLE, "draining\n", gate, version),
    }
}

/// Reads a rejected request's body, bounded in size and time, so the client is
/// not answered with a TCP reset while it still sends.
pub(super) async fn drain_body(mut body: Incoming) {
    let read = async {
        let mut n = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(d) = frame.data_ref() {
                n += d.len();
                if n > REJECT_BODY_MAX {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(REJECT_BODY_TIME, read).await;
}
