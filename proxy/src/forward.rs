//! One admitted request to the app and its answer back: the request rewritten
//! for the app ([`super::headers`]), sent over the way that fits it
//! ([`super::upstream`]), and the app's response passed on, turned into a
//! tunnel (`101`) or an event stream; or, when the app did not answer, the
//! outcome that failure settles and drainit's own answer
//! ([`super::respond`]).
//!
//! Every path through [`forward`] ends in exactly one of: the request's guard
//! ([`InFlight`]) recording an outcome here, or the guard handed to the
//! response body, which decides at the body's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed, Ordering::SeqCst};

use hyper::body::Incoming;
use hyper::header;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;

use super::body::{BodyFate, Inner, Open, ProxyBody, Sse};
use super::headers::{self, Peer};
use super::ledger::{Outcome, StreamEnd};
use super::outcome::InFlight;
use super::respond::{self, Unavailable};
use super::shared::{Gate, Shared};
use super::socket::Slot;
use super::streams::{self, Ended};
use super::upstream::{self, Clients};

/// Sends the admitted request `req` (its guard `in_flight`) to the app and
/// answers its client: the app's response, or drainit's own once the outcome
/// of the failure is recorded.
pub(super) async fn forward(
    mut req: Request<Incoming>,
    in_flight: InFlight,
    shared: &Arc<Shared>,
    clients: &Clients,
    peer: Peer,
    slot: Slot,
) -> Response<ProxyBody> {
    let version = req.version();
    let h2 = version == hyper::Version::HTTP_2;
    // A HEAD gets the head of an event stream and no body: not a stream.
    let is_head = req.method() == Method::HEAD;
    let fields = headers::Fields::of(req.headers());
    let upgrading = headers::wants_upgrade(req.headers(), fields);
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let asterisk = !h2 && req.uri() == "*";
    let (mut parts, body) = req.into_parts();
    headers::to_upstream(&mut parts, fields, peer, upgrading, &shared.authority);
    let (up_body, body_fate) = ProxyBody::to_app(body, h2);
    let up_req = Request::from_parts(parts, up_body);
    // Sent the way it fits: `OPTIONS *` (asterisk form, RFC 9112 §3.2.4) on a
    // connection of its own (it says nothing of the app's paths), HTTP/2 on a
    // shared HTTP/2 connection with room for the stream, HTTP/1 on a pooled
    // connection (the lease of either returned with the response). Here, not
    // in a function of its own: each level of futures is copied whole into
    // its caller at its first poll.
    let sent = if asterisk {
        send_asterisk(&clients.h1, up_req).await.map(|r| (r, None))
    } else if h2 {
        clients
            .h2
            .send(up_req)
            .await
            .map(|(r, s)| (r, Some(upstream::Lease::stream(s))))
    } else {
        clients.h1.send(up_req).await.map(|(r, l)| (r, Some(l)))
    };
    let (resp, lease) = match sent {
        Ok(r) => r,
        Err(e) => return failed(&e, body_fate.as_deref(), in_flight, shared, version),
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return upgrade(
            resp,
            lease,
            client_upgrade,
            in_flight,
            shared,
            slot,
            version,
        );
    }
    pass_on(resp, lease, in_flight, shared, version, is_head)
}

/// What a request the app did not answer settles.
enum Failure {
    /// It never reached the app: `rejected`, safe to retry.
    NotReached(Unavailable),
    /// The client's body failed (`canceled`): it went away (400, which it
    /// will not read), or stalled past [`super::BODY_IDLE`] (408).
    ClientBody { stalled: bool },
    /// The client's body turned out malformed (a bad chunk): `malformed`,
    /// 400 (RFC 9112 §7.1).
    MalformedBody,
    /// The app got it and gave no complete response: `unknown`, 502.
    AppFailed,
}

impl Failure {
    /// The failure `e`, given what became of the client's body (`fate`).
    fn of(e: &upstream::SendError, fate: Option<&AtomicU8>) -> Failure {
        if !e.reached_app {
            return Failure::NotReached(match e.connect {
                upstream::ConnectFailed::TimedOut => Unavailable::UpstreamTimeout,
                upstream::ConnectFailed::Halted => Unavailable::Draining,
                upstream::ConnectFailed::Refused => Unavailable::UpstreamRefused,
            });
        }
        match fate.map(|f| f.load(Relaxed)) {
            Some(f) if f == BodyFate::Stalled as u8 => Failure::ClientBody { stalled: true },
            Some(f) if f == BodyFate::Malformed as u8 => Failure::MalformedBody,
            Some(f) if f != BodyFate::Read as u8 => Failure::ClientBody { stalled: false },
            _ => Failure::AppFailed,
        }
    }
}

/// Records the outcome of a request the app did not answer (`e`) and makes
/// drainit's answer.
fn failed(
    e: &upstream::SendError,
    fate: Option<&AtomicU8>,
    in_flight: InFlight,
    shared: &Shared,
    version: hyper::Version,
) -> Response<ProxyBody> {
    match Failure::of(e, fate) {
        Failure::NotReached(why) => {
            log::debug!(
                "proxy: upstream {} not reached: {}",
                shared.upstream,
                e.message
            );
            // Counted in `rejecting` before it leaves `in_flight`: drainit's
            // exit waits for the 503 to go out (a connect halted at the exit).
            let rejecting = in_flight.reject();
            respond::unavailable(why, shared.gate(), version, rejecting)
        }
        Failure::ClientBody { stalled } => {
            // The client went away while its body was being sent on, or
            // stalled it past BODY_IDLE.
            log::debug!("proxy: the client's body failed mid-request: {}", e.message);
            in_flight.record(Outcome::Canceled);
            if stalled {
                let text = "408 request timeout: the request body stalled\n";
                return respond::closing(StatusCode::REQUEST_TIMEOUT, text, shared.gate(), version);
            }
            respond::local(StatusCode::BAD_REQUEST, "", shared.gate(), version)
        }
        Failure::MalformedBody => {
            log::debug!("proxy: the client's body was malformed: {}", e.message);
            in_flight.record(Outcome::Malformed);
            let text = "400 bad request: malformed request body\n";
            respond::closing(StatusCode::BAD_REQUEST, text, shared.gate(), version)
        }
        Failure::AppFailed => {
            log::debug!("proxy: upstream failed: {}", e.message);
            // Once drainit SIGKILLs the app (deadline, second signal), it was
            // not gone by itself: the client is told which. (Any stop cuts the
            // ledger, so a request failing then is `abandoned` either way; only
            // these are drainit's SIGKILL.)
            let why = if shared.killing.load(SeqCst) {
                "502 bad gateway: drainit stopped the app before it answered (the drain deadline, or a second signal); the request may have been processed\n"
            } else {
                "502 bad gateway: the app closed the connection without a complete response\n"
            };
            in_flight.record(Outcome::Unknown);
            respond::local(StatusCode::BAD_GATEWAY, why, shared.gate(), version)
        }
    }
}

/// The app switched protocols (`101`): the request is `completed` and both
/// connections become a tunnel, counted as a stream. A `101` to a request
/// that asked for no upgrade is the app's error (RFC 9110 §15.2.2): passed on,
/// the client got a 101 and then nothing, counted `completed`; the app got
/// the request: `unknown`, a 502, its connection not reused.
fn upgrade(
    mut resp: Response<Incoming>,
    lease: Option<upstream::Lease>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    in_flight: InFlight,
    shared: &Arc<Shared>,
    slot: Slot,
    version: hyper::Version,
) -> Response<ProxyBody> {
    let Some(client_upgrade) = client_upgrade else {
        if let Some(l) = lease {
            l.upgraded();
        }
        drop(resp);
        in_flight.record(Outcome::Unknown);
        return respond::local(
            StatusCode::BAD_GATEWAY,
            "502 bad gateway: the app switched protocols without an upgrade asked\n",
            shared.gate(),
            version,
        );
    };
    // The protocol the app switched to is the one its 101 names (RFC 9110
    // §7.8), not the client's list (`websocket, h2c` is offered as
    // `websocket`): a WebSocket's tunnel ends between frames at beat 3.
    let websocket = resp
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    let app_upgrade = hyper::upgrade::on(&mut resp);
    if let Some(l) = lease {
        l.upgraded();
    }
    // Registered before the request settles: the wait for "nothing in
    // flight" never sees a gap between the two.
    let reg = shared.streams.register();
    shared.ledger.stream_opened();
    let open = Open::new(shared.clone(), StreamEnd::Abandoned, reg);
    tokio::spawn(tunnel(client_upgrade, app_upgrade, websocket, open, slot));
    in_flight.record(Outcome::Completed);
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, true);
    Response::from_parts(parts, ProxyBody::plain(Inner::Upstream(body)))
}

/// The app's response, passed on: its body carries the request's guard and
/// settles it at its end. An event stream's request is `completed` with its
/// head, and the stream that follows is counted as one.
fn pass_on(
    resp: Response<Incoming>,
    lease: Option<upstream::Lease>,
    in_flight: InFlight,
    shared: &Arc<Shared>,
    version: hyper::Version,
    is_head: bool,
) -> Response<ProxyBody> {
    let event_stream = !is_head
        && resp.status() == StatusCode::OK
        && resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| {
            v.as_bytes()
                .trim_ascii_start()
                .starts_with(b"text/event-stream")
        });
    let (sse, in_flight) = if event_stream {
        // The response head reached the client: the request completed, and
        // the stream that follows is counted as one.
        let reg = shared.streams.register();
        shared.ledger.stream_opened();
        in_flight.record(Outcome::Completed);
        let open = Open::new(shared.clone(), StreamEnd::Completed, reg);
        (Some(Box::new(Sse::new(open))), None)
    } else {
        (None, Some(in_flight))
    };
    let (mut parts, body) = resp.into_parts();
    headers::to_client(&mut parts, version, shared.gate() >= Gate::Closing);
    let mut body = ProxyBody::plain(Inner::Upstream(body));
    body.in_flight = in_flight;
    body.sse = sse;
    body.lease = lease.map(|l| Box::new(l) as _);
    Response::from_parts(parts, body)
}

/// Sends an asterisk-form request on a connection of its own to the app,
/// closed after it.
///
/// # Errors
/// As [`upstream::Pool::send`].
async fn send_asterisk(
    pool: &upstream::Pool,
    mut req: Request<ProxyBody>,
) -> Result<Response<Incoming>, upstream::SendError> {
    let mut conn = pool.connect().await?;
    *req.uri_mut() = Uri::from_static("*");
    conn.send
        .send_request(req)
        .await
        .map_err(|e| upstream::SendError::reached(e.to_string()))
}

/// Both halves of an upgraded connection, copied until both sides have ended
/// (a half-close is passed on) or drainit closes it at beat 3
/// ([`streams::tunnel`]). `open` counts the stream (`abandoned` if the task is
/// dropped at the exit); `_slot` keeps the client's place among the
/// connections served.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    app: hyper::upgrade::OnUpgrade,
    websocket: bool,
    mut open: Open,
    _slot: Slot,
) {
    let end = match (client.await, app.await) {
        (Ok(client), Ok(app)) => {
            let close = &mut open.reg.as_mut().expect("set by Open::new").close;
            match streams::tunnel(TokioIo::new(client), TokioIo::new(app), websocket, close).await {
                Ended::ByPeer => StreamEnd::Completed,
                Ended::ByDrain => StreamEnd::ClosedByDrain,
            }
        }
        _ => StreamEnd::Completed,
    };
    open.end = end;
}
