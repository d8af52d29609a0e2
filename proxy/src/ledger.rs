//! The request ledger (docs/proxy.md, "Ledger"): every request that reaches the proxy gets
//! exactly one outcome, counted here.
//!
//! Owns: the counters, the capped list of lost requests, the request-duration
//! histogram and the stream counters. Written by the proxy thread (each admitted request's
//! [`Admitted`] entry is settled exactly once: [`RequestLedger::settle`] takes
//! it by value; the proxy's one guard, `proxy::outcome::InFlight`, makes sure
//! of it), read by the supervisor (the report, the beats' log lines) and by
//! `/metrics`.
//!
//! Invariants, checked by [`Totals::balanced`] and the tests:
//! `received = rejected + admitted` and
//! `admitted = completed + unknown + abandoned + canceled + in_flight`. They
//! hold in every snapshot ([`RequestLedger::totals`]), not only once the proxy has
//! stopped: each change that moves several counters (a request received and
//! rejected, admitted, settled, found refused) is one write, and a snapshot is
//! taken between writes (see [`RequestLedger::totals`]).
//!
//! Named `RequestLedger` (the proxy's requests), not to be confused with the
//! report's `ProcessLedger` (the app's processes at a drain).

use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use hyper::{Method, Uri};
use serde::Serialize;

/// How many lost requests the report names (the totals count them all).
pub const LOST_LISTED: usize = 100;

/// Upper bounds of the request-duration histogram buckets, seconds (the
/// Prometheus client libraries' defaults).
pub const DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How a request through the proxy ended: the one outcome type of the request
/// path. `Rejected` is for a request that was admitted and then found never to
/// have reached the app (admission closed meanwhile, the app's connection
/// refused or halted); a request rejected at the gate is counted by
/// [`RequestLedger::rejected`], a malformed one by
/// [`RequestLedger::malformed`] (never `received`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The app's response (any status) reached the client whole.
    Completed,
    /// Sent to the app, no complete response: the app may have acted on it.
    Unknown,
    /// Still in flight when drainit cut it (the deadline, or drainit's exit).
    Abandoned,
    /// The client went away first.
    Canceled,
    /// Never reached the app, answered drainit's 503: safe to retry (counted
    /// `rejected`, no longer `admitted`).
    Rejected,
    /// Its body turned out malformed after its head went to the app (a bad
    /// chunk): counted `malformed` as the requests refused at their head,
    /// no longer `received` nor `admitted`. The app got a body cut short.
    Malformed,
}

/// How a stream ended (the report's `streams`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The peers ended it (a tunnel: both sides, each passing its end on).
    Completed,
    /// drainit closed it at beat 3, spread over `--stream-spread`.
    ClosedByDrain,
    /// Still open when drainit cut everything (the deadline, or its exit).
    Abandoned,
}

/// A request named in the report: never its query, headers or body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lost {
    pub outcome: Outcome,
    pub method: String,
    /// The path without its query.
    pub path: String,
    /// When the request started, ms since T0 (negative before T0; since the
    /// proxy started when there was no T0).
    pub start_ms: i64,
    #[serde(skip)]
    start: Instant,
    /// The `X-Request-Id` header, when present (at most 128 bytes kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// The request ledger. One per proxy; shared between threads.
#[derive(Default)]
pub struct RequestLedger {
    received: AtomicU64,
    rejected: AtomicU64,
    admitted: AtomicU64,
    completed: AtomicU64,
    unknown: AtomicU64,
    abandoned: AtomicU64,
    canceled: AtomicU64,
    in_flight: AtomicU64,
    malformed: AtomicU64,
    in_flight_at_start: AtomicU64,
    /// `unknown` + `abandoned` settled from T0 on.
    lost_since_t0: AtomicU64,
    t0_passed: AtomicBool,
    /// T0, once passed; the proxy's start before.
    t0: std::sync::OnceLock<Instant>,
    epoch: std::sync::OnceLock<Instant>,
    /// drainit is cutting what is in flight: an unsettled request is `abandoned`.
    cutting: AtomicBool,
    lost: Mutex<(Vec<Lost>, u64)>,
    /// Non-cumulative counts per bucket of [`DURATION_BUCKETS`], then `+Inf`.
    durations: [AtomicU64; DURATION_BUCKETS.len() + 1],
    duration_sum_us: AtomicU64,
    streams_opened: AtomicU64,
    streams_completed: AtomicU64,
    streams_closed_by_drain: AtomicU64,
    streams_abandoned: AtomicU64,
    /// Held shared by each write of several counters ([`RequestLedger::write`]),
    /// which run side by side, and alone by a snapshot ([`RequestLedger::totals`]),
    /// which waits for the writes under way and holds new ones back (the
    /// lock prefers the one who waits alone) for the few reads it takes.
    writing: RwLock<()>,
}

/// The ledger's totals at one instant (the report's `requests`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub received: u64,
    pub rejected: u64,
    pub admitted: u64,
    pub completed: u64,
    pub unknown: u64,
    pub abandoned: u64,
    pub canceled: u64,
    pub in_flight: u64,
    /// Admitted requests in flight at T0.
    pub in_flight_at_start: u64,
    /// Requests refused as malformed (hyper's 400 and 431; drainit's 400 for a
    /// missing or repeated `Host`, RFC 9112 §3.2, or a target form its method
    /// may not use, §3.2.3–3.2.4; its 501 for `CONNECT`): not in `received`. A
    /// head that never came (timeout) is not counted: an idle pre-opened
    /// connection looks the same.
    pub malformed: u64,
    /// Admitted requests sent to the app a second time, on a new connection,
    /// because the kept-alive one they were given turned out closed (the
    /// proxy's resend rule, docs/proxy.md, "Upstream"): each is also counted once in
    /// its outcome. Set by [`crate::Proxy::totals`]; 0 from
    /// [`RequestLedger::totals`].
    pub resent: u64,
    /// The first [`LOST_LISTED`] `unknown` and `abandoned` requests.
    pub lost: Vec<Lost>,
    /// How many more were lost than `lost` lists.
    pub lost_truncated: u64,
}

impl Totals {
    /// Both invariants of the ledger hold.
    pub fn balanced(&self) -> bool {
        self.received == self.rejected + self.admitted
            && self.admitted
                == self.completed + self.unknown + self.abandoned + self.canceled + self.in_flight
    }
}

/// The report's `streams`: upgraded connections (WebSocket) passed through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Streams {
    pub opened: u64,
    pub completed: u64,
    pub closed_by_drain: u64,
    pub abandoned: u64,
}

/// The outcomes with their counts, for `/metrics`.
pub type ByOutcome = [(&'static str, u64); 5];

impl RequestLedger {
    /// One change of several counters, which a snapshot sees whole or not
    /// at all ([`RequestLedger::totals`]).
    fn write<R>(&self, f: impl FnOnce() -> R) -> R {
        let _writing = self.writing.read().unwrap_or_else(PoisonError::into_inner);
        f()
    }

    /// A request reached the proxy and was answered 503 by drainit itself,
    /// never sent to the app (`received` and `rejected`).
    pub fn rejected(&self) {
        self.write(|| {
            self.received.fetch_add(1, Relaxed);
            self.rejected.fetch_add(1, Relaxed);
        });
    }

    /// A request hyper refused before drainit saw it.
    pub fn malformed(&self) {
        self.malformed.fetch_add(1, Relaxed);
    }

    /// A request reached the proxy and is admitted (`received`, `admitted`):
    /// it is in flight until [`RequestLedger::settle`] takes its entry. The
    /// request's method, URI and `X-Request-Id` are kept as they are (shared
    /// buffers, no copy) and written out only if the request is lost.
    pub fn admit(&self, method: &Method, uri: &Uri, request_id: Option<&HeaderValue>) -> Admitted {
        self.write(|| {
            self.received.fetch_add(1, Relaxed);
            self.admitted.fetch_add(1, Relaxed);
            // SeqCst with the proxy's gate: the supervisor closes the gate, then
            // reads this; a request counts here, then reads the gate.
            self.in_flight.fetch_add(1, SeqCst);
        });
        Admitted {
            start: Instant::now(),
            method: method.clone(),
            uri: uri.clone(),
            request_id: request_id.cloned(),
        }
    }

    /// T0: the requests in flight now are `in_flight_at_start`; losses from now
    /// on make the drain unclean.
    pub fn mark_t0(&self) {
        let _ = self.t0.set(Instant::now());
        if !self.t0_passed.swap(true, Relaxed) {
            self.in_flight_at_start
                .store(self.in_flight.load(Relaxed), Relaxed);
        }
    }

    /// From now on, a request dropped unsettled was cut by drainit
    /// (`abandoned`), not by its client (`canceled`); likewise open streams.
    pub fn cut_all(&self) {
        self.cutting.store(true, Relaxed);
    }

    /// Whether [`RequestLedger::cut_all`] was called.
    pub fn cutting(&self) -> bool {
        self.cutting.load(Relaxed)
    }

    /// Requests hyper refused before drainit read them.
    pub fn malformed_count(&self) -> u64 {
        self.malformed.load(Relaxed)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }

    /// `unknown` + `abandoned` settled from T0 on.
    pub fn lost_since_t0(&self) -> u64 {
        self.lost_since_t0.load(Relaxed)
    }

    /// The totals now: a snapshot between two writes, so that the ledger's
    /// equations hold in it while requests come and go.
    pub fn totals(&self) -> Totals {
        let _alone = self.writing.write().unwrap_or_else(PoisonError::into_inner);
        let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        let base = self
            .t0
            .get()
            .or(self.epoch.get())
            .copied()
            .unwrap_or_else(Instant::now);
        let since = |start: Instant| {
            if start >= base {
                start.duration_since(base).as_millis() as i64
            } else {
                -(base.duration_since(start).as_millis() as i64)
            }
        };
        let listed = lost
            .0
            .iter()
            .map(|l| Lost {
                start_ms: since(l.start),
                ..l.clone()
            })
            .collect();
        Totals {
            received: self.received.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            admitted: self.admitted.load(Relaxed),
            completed: self.completed.load(Relaxed),
            unknown: self.unknown.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            canceled: self.canceled.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            in_flight_at_start: self.in_flight_at_start.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            resent: 0,
            lost: listed,
            lost_truncated: lost.1,
        }
    }

    /// The outcome counters and the requests in flight, for `/metrics`: one
    /// snapshot, as [`RequestLedger::totals`] takes it, so that a scrape never counts
    /// a request both settled and still in flight, or neither.
    pub fn by_outcome(&self) -> (ByOutcome, u64) {
        let _alone = self.writing.write().unwrap_or_else(PoisonError::into_inner);
        let outcomes = [
            ("completed", self.completed.load(Relaxed)),
            ("unknown", self.unknown.load(Relaxed)),
            ("abandoned", self.abandoned.load(Relaxed)),
            ("canceled", self.canceled.load(Relaxed)),
            ("rejected", self.rejected.load(Relaxed)),
        ];
        (outcomes, self.in_flight.load(Relaxed))
    }

    /// The duration histogram: non-cumulative bucket counts and the sum in µs.
    pub fn durations(&self) -> ([u64; DURATION_BUCKETS.len() + 1], u64) {
        (
            std::array::from_fn(|i| self.durations[i].load(Relaxed)),
            self.duration_sum_us.load(Relaxed),
        )
    }

    /// The stream counters now.
    pub fn streams(&self) -> Streams {
        Streams {
            opened: self.streams_opened.load(Relaxed),
            completed: self.streams_completed.load(Relaxed),
            closed_by_drain: self.streams_closed_by_drain.load(Relaxed),
            abandoned: self.streams_abandoned.load(Relaxed),
        }
    }

    /// An upgraded connection was opened.
    pub fn stream_opened(&self) {
        self.streams_opened.fetch_add(1, Relaxed);
    }

    /// A stream ended: by itself (or its client), closed by drainit at beat 3,
    /// or cut when drainit stopped (`abandoned`, whatever `how` says once
    /// [`RequestLedger::cut_all`] was called).
    pub fn stream_ended(&self, how: StreamEnd) {
        let c = match how {
            _ if self.cutting() => &self.streams_abandoned,
            StreamEnd::Completed => &self.streams_completed,
            StreamEnd::ClosedByDrain => &self.streams_closed_by_drain,
            StreamEnd::Abandoned => &self.streams_abandoned,
        };
        c.fetch_add(1, Relaxed);
    }

    /// The instant `start_ms` counts from while there is no T0 (the proxy's
    /// start).
    pub fn set_epoch(&self, at: Instant) {
        let _ = self.epoch.set(at);
    }

    /// Settles the admitted request `a` with `outcome`: it leaves `in_flight`
    /// and is counted once (taken by value: it cannot be settled twice).
    /// `Unknown` and `Canceled` become `Abandoned` once drainit cuts what is
    /// in flight ([`RequestLedger::cut_all`]); `Rejected` takes it out of
    /// `admitted` (it never reached the app).
    pub fn settle(&self, a: Admitted, outcome: Outcome) {
        // Once drainit cuts what is in flight (the deadline's SIGKILL follows),
        // a request the app could not finish was cut by drainit.
        let outcome = match outcome {
            Outcome::Rejected => return self.unadmit(),
            Outcome::Malformed => return self.unreceive(),
            Outcome::Unknown | Outcome::Canceled if self.cutting() => Outcome::Abandoned,
            o => o,
        };
        let took = a.start.elapsed();
        self.write(|| self.count(&a, outcome));
        self.observe(took);
    }

    /// The counters and the list of lost requests for `a` settled `outcome`.
    fn count(&self, a: &Admitted, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Completed => &self.completed,
            Outcome::Unknown => &self.unknown,
            Outcome::Abandoned => &self.abandoned,
            Outcome::Canceled => &self.canceled,
            Outcome::Rejected | Outcome::Malformed => {
                unreachable!("settle counts a rejected or malformed request apart")
            }
        };
        counter.fetch_add(1, Relaxed);
        // SeqCst as the admission's `fetch_add` and the supervisor's `in_flight`
        // read: the wake-up that follows (`settled`) is never for a stale count.
        self.in_flight.fetch_sub(1, SeqCst);
        if matches!(outcome, Outcome::Unknown | Outcome::Abandoned) {
            if self.t0_passed.load(Relaxed) {
                self.lost_since_t0.fetch_add(1, Relaxed);
            }
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            if lost.0.len() < LOST_LISTED {
                lost.0.push(Lost {
                    outcome,
                    method: truncate(a.method.as_str(), 16),
                    path: truncate(a.uri.path(), 256),
                    start_ms: 0,
                    start: a.start,
                    request_id: a
                        .request_id
                        .as_ref()
                        .and_then(|v| v.to_str().ok())
                        .map(|v| truncate(v, 128)),
                });
            } else {
                lost.1 += 1;
            }
        }
    }

    fn observe(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.durations[i].fetch_add(1, Relaxed);
        self.duration_sum_us
            .fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// An admitted request turned out never to have reached the app (the
    /// upstream refused the connection): it is `rejected`, not admitted.
    /// An admitted request found malformed (its body): `malformed`, no longer
    /// `received`, `admitted` nor in flight, in one write.
    fn unreceive(&self) {
        self.write(|| {
            self.received.fetch_sub(1, Relaxed);
            self.admitted.fetch_sub(1, Relaxed);
            self.in_flight.fetch_sub(1, SeqCst);
            self.malformed.fetch_add(1, Relaxed);
        });
    }

    fn unadmit(&self) {
        self.write(|| {
            self.admitted.fetch_sub(1, Relaxed);
            self.in_flight.fetch_sub(1, SeqCst);
            self.rejected.fetch_add(1, Relaxed);
        });
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// One admitted request's entry, in flight until
/// [`RequestLedger::settle`] takes it: what the ledger keeps of it (its start,
/// and what names it if it is lost). A plain value: the proxy's guard
/// (`proxy::outcome::InFlight`) holds it and settles it however the request
/// ends.
#[must_use = "an admitted request stays in flight until it is settled"]
pub struct Admitted {
    start: Instant,
    method: Method,
    uri: Uri,
    request_id: Option<HeaderValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_gets_exactly_one_outcome_and_the_equations_hold() {
        let l = RequestLedger::default();
        l.rejected();
        for outcome in [Outcome::Completed, Outcome::Unknown, Outcome::Completed] {
            let a = l.admit(
                &Method::GET,
                &Uri::from_static("/a"),
                Some(&HeaderValue::from_static("id-1")),
            );
            // Once only: `settle` takes the entry.
            l.settle(a, outcome);
        }
        // The client went away (the proxy's guard settles it so).
        let gone = l.admit(&Method::GET, &Uri::from_static("/gone"), None);
        l.settle(gone, Outcome::Canceled);
        let refused = l.admit(&Method::POST, &Uri::from_static("/refused"), None);
        l.settle(refused, Outcome::Rejected);
        let in_flight = l.admit(&Method::PUT, &Uri::from_static("/slow"), None);
        l.mark_t0();
        let t = l.totals();
        assert!(t.balanced(), "{t:?}");
        assert_eq!((t.completed, t.unknown, t.canceled), (2, 1, 1));
        assert_eq!((t.rejected, t.in_flight, t.in_flight_at_start), (2, 1, 1));
        assert_eq!(l.lost_since_t0(), 0, "the unknown came before T0");
        l.cut_all();
        // Dropped unsettled after the cut: the guard says `Canceled`.
        l.settle(in_flight, Outcome::Canceled);
        let t = l.totals();
        assert!(t.balanced(), "{t:?}");
        assert_eq!((t.abandoned, t.in_flight, l.lost_since_t0()), (1, 0, 1));
        assert_eq!(t.lost.len(), 2);
        assert_eq!(t.lost[1].path, "/slow");
        assert_eq!(t.lost[0].request_id.as_deref(), Some("id-1"));
        assert!(t.lost[1].start_ms <= 0, "started before T0");
    }

    /// A snapshot (the report file's at T0 and at the forward, the log
    /// lines) is taken while the proxy threads count: it must balance as the
    /// final one does, and list or count every lost request.
    #[test]
    fn a_snapshot_taken_while_requests_come_and_go_balances() {
        let l = RequestLedger::default();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let uri = Uri::from_static("/x");
                    while !stop.load(Relaxed) {
                        l.rejected();
                        l.settle(l.admit(&Method::GET, &uri, None), Outcome::Unknown);
                        l.settle(l.admit(&Method::GET, &uri, None), Outcome::Rejected);
                        l.settle(l.admit(&Method::GET, &uri, None), Outcome::Canceled);
                    }
                });
            }
            let mut bad = None;
            for i in 0..20_000 {
                let t = l.totals();
                if !t.balanced() || t.lost.len() as u64 + t.lost_truncated != t.unknown {
                    bad = Some((i, t));
                    break;
                }
            }
            stop.store(true, Relaxed);
            if let Some((i, t)) = bad {
                panic!(
                    "snapshot {i} does not balance: received {} rejected {} admitted {} \
                     completed {} unknown {} canceled {} in flight {}, {} lost listed + {}",
                    t.received,
                    t.rejected,
                    t.admitted,
                    t.completed,
                    t.unknown,
                    t.canceled,
                    t.in_flight,
                    t.lost.len(),
                    t.lost_truncated
                );
            }
        });
    }

    #[test]
    fn the_list_of_lost_requests_is_capped_and_the_rest_counted() {
        let l = RequestLedger::default();
        for _ in 0..LOST_LISTED + 7 {
            l.settle(
                l.admit(&Method::GET, &Uri::from_static("/x"), None),
                Outcome::Unknown,
            );
        }
        let t = l.totals();
        assert_eq!(t.lost.len(), LOST_LISTED);
        assert_eq!(t.lost_truncated, 7);
        assert_eq!(t.unknown, LOST_LISTED as u64 + 7);
    }
}
