//! The fields of a request on its way to the app and of a response on its
//! way back: the hop-by-hop fields dropped (RFC 9110 §7.6.1), the client's
//! address appended (`X-Forwarded-For`, `Forwarded`, RFC 7239), the target
//! put in the form the app expects (origin form for HTTP/1, the client's
//! `:authority` for HTTP/2) with its `Host`.
//!
//! Must not: decide whether a request is admitted (that is [`super::gate`]) or
//! parse HTTP by hand (hyper parses; this only rewrites fields hyper parsed).

use std::net::SocketAddr;

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::{request, response, uri::Authority};
use hyper::{Method, Uri};

/// Rewrites a request head for the app: hop-by-hop fields dropped (an
/// upgrade, `upgrading`, keeps its own), `TE: trailers` kept for HTTP/2 (gRPC),
/// the client's address appended, and the target addressed to the app: for
/// HTTP/2 the client's `:authority` (or `Host`, else `app`), for HTTP/1 the
/// origin form with the client's `Host` (an absolute-form target's host
/// replacing it; `app` when there is neither). An asterisk-form target
/// (`OPTIONS *`) is left as it is. `fields`: what [`Fields::of`] found in
/// `parts.headers`.
pub(super) fn to_upstream(
    parts: &mut request::Parts,
    fields: Fields,
    peer: Peer,
    upgrading: bool,
    app: &Authority,
) {
    let h2 = parts.version == hyper::Version::HTTP_2;
    // gRPC asks for trailers with `TE: trailers`, the one TE value HTTP/2
    // allows (RFC 9113 §8.2.2); the request goes on over HTTP/2, so it stays.
    let te_trailers = h2
        && fields.has(TE_BIT)
        && parts
            .headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let asterisk = !h2 && parts.uri == "*";
    // The strip adds no field and never takes `Host`: after it, a field
    // `fields` does not name is still absent and `Host` is there as `fields`
    // says (a `Content-Length` it names may have gone: it is looked up).
    strip_found(&mut parts.headers, upgrading, fields);
    if te_trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    append_forwarded_for(&mut parts.headers, peer.xff);
    parts.headers.append(header::FORWARDED, peer.forwarded);
    // RFC 9110 §8.6 allows leading zeros (`Content-Length: 0005`); hyper read
    // the number, and the app gets that number plainly, so that no parser
    // after drainit reads the digits another way (as octal, or as too long).
    if fields.has(CONTENT_LENGTH_BIT)
        && let Some(n) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if h2 {
        // The client's `:authority` goes on (RFC 9113 §8.3.1), or its `Host`
        // when it sent no `:authority`; the app's address only when neither.
        let authority = parts
            .uri
            .authority()
            .cloned()
            .or_else(|| {
                parts
                    .headers
                    .get(header::HOST)
                    .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            })
            .unwrap_or_else(|| app.clone());
        parts.uri = upstream_uri(&authority, &parts.uri);
    } else {
        // HTTP/1: origin form (RFC 9112 §3.2.1), the client's `Host` kept; an
        // absolute-form target's host replaces it (RFC 9112 §3.2.2: the target
        // wins over a `Host` that disagrees); a request without either
        // (HTTP/1.0) names the app.
        let mut has_host = fields.has(HOST_BIT);
        if !asterisk && parts.method != Method::CONNECT {
            if let Some(host) = parts.uri.authority().and_then(host_of) {
                parts.headers.insert(header::HOST, host);
                has_host = true;
            }
            parts.uri = origin_form(std::mem::take(&mut parts.uri));
        }
        if !has_host && let Ok(host) = HeaderValue::from_str(app.as_str()) {
            parts.headers.insert(header::HOST, host);
        }
    }
}

/// Rewrites the app's response head for the client: the client's `version`,
/// not the app's (an HTTP/1.0 app behind drainit does not turn the client's
/// keep-alive connection into a one-shot one), hop-by-hop fields dropped, and
/// `Connection: close` on HTTP/1 when `closing` (from T0). HTTP/2 has no
/// `Connection` field (RFC 9113 §8.2.2): its connections go with GOAWAY at
/// beat 3.
pub(super) fn to_client(parts: &mut response::Parts, version: hyper::Version, closing: bool) {
    parts.version = version;
    strip_hop_by_hop(&mut parts.headers, false);
    if closing && version != hyper::Version::HTTP_2 {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// The request carries `Expect: 100-continue` (RFC 9110 §10.1.1).
pub(super) fn expects_continue(h: &HeaderMap) -> bool {
    h.get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
}

/// The request asks to switch protocols (`Connection: upgrade` and `Upgrade`).
/// `Upgrade: h2c` alone is not passed on as one: the HTTP/1.1 to HTTP/2 upgrade
/// of RFC 7540 §3.2 was removed by RFC 9113 §3.1 (HTTP/2 comes by prior
/// knowledge here), and the requests of an HTTP/2 connection inside a tunnel
/// would escape the ledger and be cut at beat 3. The request is served as
/// HTTP/1.1, its `Upgrade` and `HTTP2-Settings` dropped as hop-by-hop fields.
pub(super) fn wants_upgrade(h: &HeaderMap, fields: Fields) -> bool {
    // Most requests have no `Upgrade`: no lookup at all.
    let only_h2c = || {
        h.get_all(header::UPGRADE)
            .iter()
            .all(|v| v.to_str().is_ok_and(|s| s.split(',').all(is_h2c)))
    };
    fields.has(UPGRADE_BIT)
        && !only_h2c()
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// RFC 9110 §7.6.1: `Connection`, the fields it names, and the hop-by-hop fields
/// (`Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`) are
/// not forwarded; hyper frames the body itself (so a `Content-Length` beside a
/// `Transfer-Encoding` goes too, RFC 9112 §6.3). An upgrade keeps `Upgrade` and
/// `Connection: upgrade`.
pub(super) fn strip_hop_by_hop(h: &mut HeaderMap, upgrading: bool) {
    strip_found(h, upgrading, Fields::of(h));
}

/// [`strip_hop_by_hop`] with the fields present found already (`fields`, of
/// `h` as it is).
fn strip_found(h: &mut HeaderMap, upgrading: bool, fields: Fields) {
    // Most messages carry no hop-by-hop field, or only `Connection`.
    let present = fields.hop_by_hop();
    if present == 0 && !upgrading {
        return;
    }
    let has = |name: &HeaderName| {
        HOP_BY_HOP_NAMES
            .iter()
            .position(|n| n == name)
            .is_some_and(|i| present & (1 << i) != 0)
    };
    if has(&header::CONNECTION) {
        // As bytes: a token is ASCII, and an element with other bytes
        // (obs-text) names no field (`HeaderName::from_bytes` refuses what is
        // not a token); the names beside it in the same value still go.
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            // `close` names no field; the hop-by-hop ones go below. Told
            // apart as text: most lists are `keep-alive` or `close`, and
            // parsing a name costs more than comparing it.
            .filter(|t| {
                !t.eq_ignore_ascii_case(b"close")
                    && !HOP_BY_HOP_NAMES
                        .iter()
                        .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(t))
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            // `Host` is end to end whatever a client says (RFC 9112 §3.2
            // requires it): `Connection: host` must not strip it.
            .filter(|n| n != header::HOST)
            .collect();
        for n in named {
            h.remove(n);
        }
    }
    // RFC 9112 §6.3: a message framed by `Transfer-Encoding` that also has a
    // `Content-Length` (an app that sets both) is chunked, and a proxy drops
    // the length before forwarding it: hyper frames the body again, and a
    // length left behind would promise the client another size than it gets.
    if has(&header::TRANSFER_ENCODING) {
        h.remove(header::CONTENT_LENGTH);
    }
    for (i, n) in HOP_BY_HOP_NAMES.iter().enumerate() {
        if present & (1 << i) != 0 && !(upgrading && *n == header::UPGRADE) {
            h.remove(n);
        }
    }
    if upgrading {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        drop_h2c(h);
    }
}

/// An `Upgrade` list's token (surrounding spaces allowed) names h2c.
fn is_h2c(token: &str) -> bool {
    token.trim().eq_ignore_ascii_case("h2c")
}

/// Takes the `h2c` token out of an upgrade's `Upgrade` list (`websocket, h2c`
/// becomes `websocket`), so the app cannot switch to HTTP/2 inside a tunnel
/// whose requests the ledger would never see (see [`wants_upgrade`]).
fn drop_h2c(h: &mut HeaderMap) {
    let has_h2c = h
        .get_all(header::UPGRADE)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(is_h2c)));
    if !has_h2c {
        return;
    }
    let kept: Vec<String> = h
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter(|t| !is_h2c(t) && !t.trim().is_empty())
        .map(|t| t.trim().to_owned())
        .collect();
    h.remove(header::UPGRADE);
    // `wants_upgrade` saw a token other than h2c, so `kept` is not empty.
    if let Ok(v) = HeaderValue::from_str(&kept.join(", ")) {
        h.insert(header::UPGRADE, v);
    }
}

/// How many names [`HOP_BY_HOP_NAMES`] holds.
const HOP_BY_HOP: usize = 6;

/// The fields [`strip_hop_by_hop`] always drops (or, for an upgrade,
/// rewrites), each at its bit of [`hop_by_hop_bit`]. `Trailer` is end to end
/// (RFC 9110 §6.6.2), and hyper sends a response's trailers only when it names
/// them.
static HOP_BY_HOP_NAMES: [HeaderName; HOP_BY_HOP] = [
    header::TE,
    header::UPGRADE,
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
];

/// The bit of `n` (a lowercase name) in [`Fields`]: its index in
/// [`HOP_BY_HOP_NAMES`], then `Host` and `Content-Length`; 0 for any other.
fn field_bit(n: &str) -> u16 {
    // Called for every field of every message: the length first, so most
    // names are told apart without comparing a byte.
    match (n.len(), n) {
        (2, "te") => TE_BIT,
        (7, "upgrade") => UPGRADE_BIT,
        (10, "connection") => 1 << 2,
        (10, "keep-alive") => 1 << 3,
        (16, "proxy-connection") => 1 << 4,
        (17, "transfer-encoding") => 1 << 5,
        (4, "host") => HOST_BIT,
        (14, "content-length") => CONTENT_LENGTH_BIT,
        _ => 0,
    }
}

const TE_BIT: u16 = 1;
const UPGRADE_BIT: u16 = 1 << 1;
const HOST_BIT: u16 = 1 << HOP_BY_HOP;
const CONTENT_LENGTH_BIT: u16 = 1 << (HOP_BY_HOP + 1);

/// The fields of a head that its rewrites look for, found in one pass over
/// its names ([`Fields::of`]), so that a field absent costs no lookup: the
/// hop-by-hop ones ([`HOP_BY_HOP_NAMES`]), `Host` and `Content-Length`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fields(u16);

impl Fields {
    /// The fields `h` carries.
    pub(super) fn of(h: &HeaderMap) -> Fields {
        Fields(h.keys().fold(0, |bits, n| bits | field_bit(n.as_str())))
    }

    fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    /// The hop-by-hop fields present, as bits of [`HOP_BY_HOP_NAMES`].
    fn hop_by_hop(self) -> u8 {
        (self.0 & ((1 << HOP_BY_HOP) - 1)) as u8
    }
}

/// `X-Forwarded-For`, made once.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client's address as `X-Forwarded-For` gives it (an IPv4-mapped IPv6
/// address as IPv4).
fn forwarded_ip(peer: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.ip().to_canonical().to_string())
        .unwrap_or(HeaderValue::from_static("unknown"))
}

/// A client connection's address, as the two headers that carry it upstream.
#[derive(Clone)]
pub(super) struct Peer {
    /// `X-Forwarded-For`: `192.0.2.7`, `2001:db8::1`.
    xff: HeaderValue,
    /// `Forwarded` (RFC 7239 §4, §6): `for=192.0.2.7`, `for="[2001:db8::1]"`.
    forwarded: HeaderValue,
}

impl Peer {
    pub(super) fn new(peer: SocketAddr) -> Peer {
        let forwarded = match peer.ip().to_canonical() {
            std::net::IpAddr::V4(ip) => format!("for={ip}"),
            std::net::IpAddr::V6(ip) => format!("for=\"[{ip}]\""),
        };
        Peer {
            xff: forwarded_ip(peer),
            forwarded: HeaderValue::from_str(&forwarded)
                .unwrap_or(HeaderValue::from_static("for=unknown")),
        }
    }
}

/// Appends the client's address (`ip`) to `X-Forwarded-For`, as one field line:
/// the lines received are joined in order first (RFC 9110 §5.3), so none is
/// lost. A load balancer in front (HAProxy's `option forwardfor`) adds its own
/// line after the client's: dropping it would hand the app the client's
/// (spoofable) value where it expects the balancer's. `Forwarded` (RFC 7239)
/// gets a field line of its own (`for=…`), after any received.
fn append_forwarded_for(h: &mut HeaderMap, ip: HeaderValue) {
    // One look-up of the name, found or not (most requests carry none).
    let mut lines = match h.entry(X_FORWARDED_FOR) {
        header::Entry::Vacant(v) => {
            v.insert(ip);
            return;
        }
        header::Entry::Occupied(o) => o,
    };
    let prev: Vec<&[u8]> = lines
        .iter()
        .map(HeaderValue::as_bytes)
        .filter(|v| !v.trim_ascii().is_empty())
        .collect();
    let value = if prev.is_empty() {
        ip
    } else {
        let mut joined = prev.join(&b", "[..]);
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(ip.as_bytes());
        HeaderValue::from_bytes(&joined).unwrap_or(ip)
    };
    // Replaces every line received.
    lines.insert(value);
}

/// The `Host` field for an absolute-form target's authority: its host and
/// port, without the userinfo a client may have put before them.
fn host_of(a: &hyper::http::uri::Authority) -> Option<HeaderValue> {
    let host = a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h);
    HeaderValue::from_str(host).ok()
}

/// The origin form of a request target (RFC 9112 §3.2.1): an absolute-form
/// target loses its scheme and authority; one in origin form is kept as it is.
fn origin_form(uri: Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri;
    }
    uri.path_and_query()
        .map_or_else(Uri::default, |pq| Uri::from(pq.clone()))
}

/// The request's path and query, addressed to the app (`authority`): built
/// from parts, without formatting or parsing a string.
fn upstream_uri(authority: &hyper::http::uri::Authority, uri: &Uri) -> Uri {
    let mut parts = hyper::http::uri::Parts::default();
    parts.scheme = Some(hyper::http::uri::Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| hyper::http::uri::PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
        // Nothing hop-by-hop: nothing changes.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2);
        // `Connection` naming `Host` (a client trying to strip it) keeps it,
        // and `close` names nothing.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, Host, x-gone"),
        );
        h.insert("x-gone", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["host"]);
        // A list with bytes beyond ASCII (obs-text) still names its ASCII
        // fields: they go (RFC 9110 §7.6.1), the element it cannot read names
        // none.
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_bytes(b"x-gone, \xff, caf\xc3\xa9").unwrap(),
        );
        h.insert("x-gone", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
        // All HOP_BY_HOP names at once: every one goes.
        let mut h = HeaderMap::new();
        for n in [
            "connection",
            "te",
            "transfer-encoding",
            "upgrade",
            "keep-alive",
            "proxy-connection",
        ] {
            h.insert(n, HeaderValue::from_static("x"));
        }
        assert_eq!(h.len(), HOP_BY_HOP);
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn each_hop_by_hop_name_has_its_own_bit() {
        for (i, n) in HOP_BY_HOP_NAMES.iter().enumerate() {
            assert_eq!(field_bit(n.as_str()), 1 << i, "{n}");
        }
        assert_eq!(field_bit("trailer"), 0);
        assert_eq!(field_bit("host"), HOST_BIT);
        assert_eq!(field_bit("content-length"), CONTENT_LENGTH_BIT);
    }

    #[test]
    fn an_h2c_upgrade_is_no_upgrade_and_its_fields_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.insert(
            "http2-settings",
            HeaderValue::from_static("AAMAAABkAAQAAP__"),
        );
        assert!(!wants_upgrade(&h, Fields::of(&h)));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket, h2c"));
        h.append(header::UPGRADE, HeaderValue::from_static("H2C, foo/2"));
        assert!(wants_upgrade(&h, Fields::of(&h)));
        // The app is offered the other protocols, never h2c.
        strip_hop_by_hop(&mut h, true);
        let offered: Vec<&str> = h
            .get_all(header::UPGRADE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(offered, ["websocket, foo/2"]);
    }

    #[test]
    fn an_upgrade_keeps_upgrade_and_connection_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h, Fields::of(&h)));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
    }

    #[test]
    fn x_forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.7:5000".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.7");
        append_forwarded_for(&mut h, forwarded_ip("[::ffff:10.0.0.8]:1".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.7, 10.0.0.8");
        // Two fields from the client become one list.
        h.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.9:1".parse().unwrap()));
        assert_eq!(
            h["x-forwarded-for"],
            "10.0.0.7, 10.0.0.8, 1.2.3.4, 10.0.0.9"
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn forwarded_names_the_client_as_rfc_7239_says() {
        assert_eq!(
            Peer::new("10.0.0.7:5000".parse().unwrap()).forwarded,
            "for=10.0.0.7"
        );
        assert_eq!(
            Peer::new("[::ffff:10.0.0.8]:1".parse().unwrap()).forwarded,
            "for=10.0.0.8"
        );
        assert_eq!(
            Peer::new("[2001:db8::1]:443".parse().unwrap()).forwarded,
            "for=\"[2001:db8::1]\""
        );
    }

    #[test]
    fn x_forwarded_for_keeps_every_line_received() {
        // The client's line, then the load balancer's own (HAProxy adds a line).
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        append_forwarded_for(&mut h, forwarded_ip("10.0.0.2:5000".parse().unwrap()));
        let all: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["6.6.6.6, 203.0.113.9, 10.0.0.2"]);
    }

    #[test]
    fn an_absolute_form_target_becomes_origin_form_and_its_host() {
        let o = |s: &str| origin_form(s.parse().unwrap()).to_string();
        assert_eq!(o("/a?b=1"), "/a?b=1");
        assert_eq!(o("http://h.example/a?b=1"), "/a?b=1");
        assert_eq!(o("http://h.example"), "/");
        // No path, a query: the path is `/` (RFC 9112 §3.2.1: never empty).
        assert_eq!(o("http://h.example?b=1"), "/?b=1");
        let h = |s: &str| host_of(&s.parse().unwrap()).unwrap();
        assert_eq!(h("h.example:8080"), "h.example:8080");
        assert_eq!(h("user:pw@h.example"), "h.example");
    }

    #[test]
    fn the_upstream_uri_keeps_path_and_query() {
        let u = upstream_uri(
            &"127.0.0.1:8081".parse().unwrap(),
            &"/a/b?x=1".parse().unwrap(),
        );
        assert_eq!(u.to_string(), "http://127.0.0.1:8081/a/b?x=1");
    }

    /// The head of an HTTP/1 request as the app gets it from `raw` (name,
    /// value pairs), with `target`.
    fn upstream_head(target: &str, raw: &[(&str, &str)]) -> request::Parts {
        let mut req = hyper::Request::builder().uri(target);
        for (n, v) in raw {
            req = req.header(*n, *v);
        }
        let (mut parts, ()) = req.body(()).unwrap().into_parts();
        let fields = Fields::of(&parts.headers);
        let peer = Peer::new("10.0.0.7:5000".parse().unwrap());
        let app = Authority::from_static("127.0.0.1:8081");
        to_upstream(&mut parts, fields, peer, false, &app);
        parts
    }

    /// What the one pass over the names found decides no field: `Host` and
    /// `Content-Length` are rewritten as a lookup of each would.
    #[test]
    fn host_and_content_length_reach_the_app_whatever_the_fields_found() {
        let p = upstream_head("/a", &[]);
        assert_eq!(
            p.headers[header::HOST],
            "127.0.0.1:8081",
            "no Host: the app's"
        );
        let p = upstream_head("/a", &[("host", "a.example"), ("content-length", "0005")]);
        assert_eq!(p.headers[header::HOST], "a.example");
        assert_eq!(p.headers[header::CONTENT_LENGTH], "5");
        let p = upstream_head("http://b.example:8080/a", &[("host", "a.example")]);
        assert_eq!(p.headers[header::HOST], "b.example:8080");
        assert_eq!(p.uri, "/a");
        // `Connection` naming the length takes it away before it is rewritten;
        // `Transfer-Encoding` beside it too.
        for raw in [
            [("connection", "content-length"), ("content-length", "5")],
            [("transfer-encoding", "chunked"), ("content-length", "5")],
        ] {
            let p = upstream_head("/a", &raw);
            assert!(!p.headers.contains_key(header::CONTENT_LENGTH), "{raw:?}");
            assert!(!p.headers.contains_key(header::CONNECTION), "{raw:?}");
            assert_eq!(p.headers["x-forwarded-for"], "10.0.0.7");
        }
    }
}
