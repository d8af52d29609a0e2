//! Admission: the gate a request passes before it may reach the app, and the
//! checks of its head that come first.
//!
//! Owns: what a request meets at the [`Gate`] (where admission stands, moved
//! forward by the supervisor at each beat, held in [`Shared`]), the refusal of
//! malformed requests drainit must not send on (RFC 9112 §3.2 on `Host` and
//! target forms, `CONNECT`), and the moment a request becomes `admitted`
//! ([`admit`]). Must not: talk to the app.
//!
//! Invariant: a request is counted `received` exactly when it is rejected
//! here or admitted; a malformed one is never `received`.

use std::sync::Arc;

use hyper::header;
use hyper::{Method, Request, StatusCode};

use super::outcome::InFlight;
use super::respond::Unavailable;
use super::shared::{Gate, Rejecting, Shared};

/// What admission decided for a request.
pub(super) enum Admission {
    /// Refused as malformed, never sent on (counted `malformed`): the status
    /// and text of drainit's answer.
    Malformed(StatusCode, &'static str),
    /// Counted `rejected` (never reaches the app): why, and the count its 503
    /// holds until written.
    Rejected(Unavailable, Rejecting),
    /// Counted `admitted`, in flight: on to the app.
    Admitted(InFlight),
}

/// `req` asks for the health path (`--proxy-health`): answered as `/readyz`,
/// never counted, never sent on.
pub(super) fn is_health<B>(req: &Request<B>, shared: &Shared) -> bool {
    shared.health.as_deref() == Some(req.uri().path())
        && matches!(*req.method(), Method::GET | Method::HEAD)
}

/// Decides `req`'s admission and counts it: malformed, rejected (the gate is
/// not open), or admitted.
pub(super) fn admit<B>(req: &Request<B>, shared: &Arc<Shared>) -> Admission {
    let gate = shared.gate();
    if let Some((status, text)) = malformed(req) {
        shared.ledger.malformed();
        return Admission::Malformed(status, text);
    }
    // Counted `received` with its outcome, in one write: `rejected` here, or
    // admitted below.
    if gate != Gate::Ready && gate != Gate::Closing {
        shared.ledger.rejected();
        let why = if gate == Gate::NotReady {
            Unavailable::NotReady
        } else {
            Unavailable::Draining
        };
        return Admission::Rejected(why, Rejecting::new(shared));
    }
    let in_flight = InFlight::admit(shared.clone(), req);
    // Admission may have closed since the gate was read above, and the
    // supervisor may have seen nothing in flight and forwarded the drain signal:
    // read again now that this request counts (both sides SeqCst: one of them
    // sees the other). Closed now: it never reaches the app.
    if shared.gate() >= Gate::Closed {
        return Admission::Rejected(Unavailable::Draining, in_flight.reject());
    }
    Admission::Admitted(in_flight)
}

/// Why `req` must not be sent on, if it must not: the status and text of
/// drainit's answer.
///
/// RFC 9112 §3.2: an HTTP/1.1 request without `Host`, any request with
/// more than one or an invalid one (not `host[:port]`), a target with
/// userinfo or (absolute form) of a scheme other than http(s), is answered 400 and never sent on (counted `malformed`, as
/// hyper's own 400s are). RFC 9113 §8.3.1: an HTTP/2 request whose `Host`
/// names another authority than its `:authority` is malformed too.
pub(super) fn malformed<B>(req: &Request<B>) -> Option<(StatusCode, &'static str)> {
    let version = req.version();
    let h2 = version == hyper::Version::HTTP_2;
    let hosts = req.headers().get_all(header::HOST);
    let host_count = hosts.iter().count();
    let bad = |text| Some((StatusCode::BAD_REQUEST, text));
    if host_count > 1 {
        bad("400 bad request: more than one Host field\n")
    } else if !h2 && host_count == 0 && version == hyper::Version::HTTP_11 {
        bad("400 bad request: HTTP/1.1 requires a Host field\n")
    } else if hosts.iter().any(|h| !is_host(h.as_bytes())) {
        // RFC 9112 §3.2, RFC 9110 §7.2: `Host` is `uri-host [ ":" port ]`; a
        // list (`a, b`) or one with a path, query or userinfo (`a/b?c@d`) is
        // invalid, and an app or cache downstream could read it either way.
        bad("400 bad request: invalid Host field\n")
    } else if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        // RFC 9110 §4.2.4: userinfo (`http://user:pw@evil/`) is forbidden in
        // http(s) URIs, and RFC 9113 §8.3.1 in `:authority`.
        bad("400 bad request: userinfo in the target\n")
    } else if !h2
        && req
            .uri()
            .scheme_str()
            .is_some_and(|s| !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https"))
    {
        // An absolute-form target names another scheme (`ftp://`): no
        // request for this origin server (RFC 9112 §3.2.2).
        bad("400 bad request: a target of a scheme other than http(s)\n")
    } else if h2
        && let (Some(authority), Some(host)) = (req.uri().authority(), hosts.iter().next())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        bad("400 bad request: Host differs from :authority\n")
    } else if !h2
        && req.uri().scheme().is_none()
        && req.uri().authority().is_some()
        && req.method() != Method::CONNECT
    {
        // RFC 9112 §3.2.3: the authority form (`GET example.com:80`) is
        // CONNECT's only; sent on, the app got `GET /` with that authority as
        // its `Host`, in place of the client's.
        bad("400 bad request: an authority-form target is for CONNECT only\n")
    } else if !h2 && req.uri() == "*" && req.method() != Method::OPTIONS {
        // RFC 9112 §3.2.4: the asterisk form is OPTIONS's only.
        bad("400 bad request: an asterisk-form target is for OPTIONS only\n")
    } else if req.method() == Method::CONNECT {
        // drainit is a reverse proxy, not a forward one: a `CONNECT` (RFC 9110
        // §9.3.6) asks for a tunnel to another host, which it does not relay
        // (sent on, an app's 2xx left the client a 200 and a closed
        // connection). 501, never sent to the app, counted `malformed`.
        Some((
            StatusCode::NOT_IMPLEMENTED,
            "501 not implemented: CONNECT (drainit is no forward proxy)\n",
        ))
    } else {
        None
    }
}

/// A `Host` field's value is `uri-host [ ":" port ]` (RFC 9110 §7.2), as the
/// `http` crate reads an authority, without userinfo; empty is allowed (RFC
/// 9112 §3.2: a target without an authority).
fn is_host(value: &[u8]) -> bool {
    value.is_empty() || is_plain_host(value) || is_host_by_http(value)
}

/// The `Host` of nearly every request (`example.com`, `10.0.0.7:8080`):
/// letters, digits, `.` and `-`, with at most one `:`. The `http` crate reads
/// every such value as an authority ([`is_host_by_http`] agrees, see the
/// test), and this needs no copy of it: `Authority::try_from` allocates one
/// for each valid value, a request's largest cost in admission.
fn is_plain_host(value: &[u8]) -> bool {
    let mut colons = 0;
    value.iter().all(|&b| {
        colons += usize::from(b == b':');
        b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || (b == b':' && colons == 1)
    })
}

/// [`is_host`] as the `http` crate reads an authority, without userinfo.
fn is_host_by_http(value: &[u8]) -> bool {
    !value.contains(&b'@') && hyper::http::uri::Authority::try_from(value).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9110 §7.2's `Host`: a host and an optional port, nothing else.
    #[test]
    fn a_host_is_a_host_and_a_port_only() {
        for ok in ["a", "a:80", "example.com", "[::1]:8080", "127.0.0.1", ""] {
            assert!(is_host(ok.as_bytes()), "{ok}");
        }
        for bad in ["a, b", "a/b?c@d", "user@a", "a b", "a/b", "a?b", "a#b"] {
            assert!(!is_host(bad.as_bytes()), "{bad}");
        }
    }

    /// The fast path accepts only what the `http` crate accepts: every value
    /// of up to four bytes over letters, digits and the characters that
    /// matter to an authority.
    #[test]
    fn a_plain_host_is_one_the_http_crate_reads_as_an_authority() {
        let alphabet = b"aZ09.-:@[]/?#% _,";
        let mut value = Vec::new();
        let mut checked = 0;
        let mut walk = vec![0usize; 0];
        for len in 1..=4 {
            walk.clear();
            walk.resize(len, 0);
            loop {
                value.clear();
                value.extend(walk.iter().map(|&i| alphabet[i]));
                if is_plain_host(&value) {
                    assert!(
                        is_host_by_http(&value),
                        "{:?}",
                        String::from_utf8_lossy(&value)
                    );
                }
                checked += 1;
                // The next value: an odometer over the alphabet.
                let Some(pos) = walk.iter().rposition(|&i| i + 1 < alphabet.len()) else {
                    break;
                };
                walk[pos] += 1;
                walk[pos + 1..].iter_mut().for_each(|i| *i = 0);
            }
        }
        assert!(checked > 80_000, "{checked}");
        for plain in ["example.com", "10.0.0.7:8080", "a:", "localhost:1"] {
            assert!(is_plain_host(plain.as_bytes()), "{plain}");
        }
        for not in ["a:1:2", "[::1]", "a_b", "a b", "user@a"] {
            assert!(!is_plain_host(not.as_bytes()), "{not}");
        }
    }
}
