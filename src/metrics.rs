//! `GET /metrics`: drainit's counters in the Prometheus text exposition format
//! (version 0.0.4, <https://prometheus.io/docs/instrumenting/exposition_formats/>).
//!
//! Owns: the counters that only grow (signals forwarded and received, checks run
//! and their durations, probe requests answered, orphans reaped) and the text they
//! are rendered to. What is a state rather than a count (phase, readiness, live
//! descendants) is read at scrape time by the caller and passed in as a [`View`].
//!
//! Why one process-wide registry, like `log`'s logger, instead of a value passed
//! down: the supervisor, the checks and the probe server all record here, and
//! recording a fact must never need plumbing through every constructor. It is a
//! `Mutex` of small maps, taken for a few hundred nanoseconds at a time by the one
//! runtime thread; it allocates nothing until the first fact is recorded (idle
//! costs nothing).
//!
//! Why hand-written rather than the `prometheus-client` crate: the format is a few
//! lines of text, and drainit's idle RSS has almost no room left under its 2×
//! tini-static budget. Measured (README, Performance): `prometheus-client` 0.23.1
//! added 56 KiB to a small static program doing what [`render`] does; this whole
//! module and its callers added 24 KiB to drainit.
//!
//! Must not: record anything of unbounded cardinality. Labels are signal names,
//! configured check names, a fixed set of probe paths and HTTP status codes.
//!
//! Invariant: every metric is named `drainit_*` with its unit in the name, and has
//! `# HELP` and `# TYPE` lines even before its first sample.

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::drain::Phase;

/// Upper bounds of the check-duration histogram buckets, seconds (the Prometheus
/// client libraries' defaults, which span a 1 s default check timeout well).
pub const CHECK_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Default)]
struct Histogram {
    /// Non-cumulative counts per bucket of [`CHECK_BUCKETS`], then `+Inf`.
    buckets: [u64; CHECK_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

/// Label sets and their values, in the order first seen. Plain vectors, not
/// maps: each holds a handful of entries (signals, checks, paths), and every map
/// type would add its own code to the binary.
struct Registry {
    signals_forwarded: Vec<(String, u64)>,
    signals_received: Vec<(String, u64)>,
    /// `(check name, passed)` → runs.
    checks: Vec<((String, bool), u64)>,
    check_durations: Vec<(String, Histogram)>,
    /// `(path label, status)` → requests.
    probe_requests: Vec<((&'static str, u16), u64)>,
    orphans_reaped: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    signals_forwarded: Vec::new(),
    signals_received: Vec::new(),
    checks: Vec::new(),
    check_durations: Vec::new(),
    probe_requests: Vec::new(),
    orphans_reaped: 0,
});

/// The value for `key`, inserted as `V::default()` when new.
fn entry<K: PartialEq, V: Default>(v: &mut Vec<(K, V)>, key: K) -> &mut V {
    let i = match v.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            v.push((key, V::default()));
            v.len() - 1
        }
    };
    &mut v[i].1
}

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves counters that are still counters.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// drainit sent `signal` on (after `--rewrite`): to the main child or its group,
/// or, as the drain signal, to one remaining descendant. `signal` is its name
/// (`SIGTERM`).
pub fn signal_forwarded(signal: &str) {
    *entry(&mut registry().signals_forwarded, signal.to_string()) += 1;
}

/// drainit received `signal` (any but SIGCHLD), before rewriting.
pub fn signal_received(signal: &str) {
    *entry(&mut registry().signals_received, signal.to_string()) += 1;
}

/// One run of the check named `check` ended after `took`, passed or not (a
/// timeout is a failure that took the timeout).
pub fn check_ran(check: &str, passed: bool, took: Duration) {
    let mut r = registry();
    *entry(&mut r.checks, (check.to_string(), passed)) += 1;
    let h = entry(&mut r.check_durations, check.to_string());
    let secs = took.as_secs_f64();
    let i = CHECK_BUCKETS
        .iter()
        .position(|le| secs <= *le)
        .unwrap_or(CHECK_BUCKETS.len());
    h.buckets[i] += 1;
    h.sum += secs;
    h.count += 1;
}

/// The probe server answered a request for `path` with `status`. Paths other
/// than `/healthz`, `/readyz` and `/metrics` are counted as `other`, so a scanner
/// cannot grow the label set.
pub fn probe_request(path: &str, status: u16) {
    let path = match path {
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        _ => "other",
    };
    *entry(&mut registry().probe_requests, (path, status)) += 1;
}

/// The reaper's running count of orphans reaped (processes that were not the
/// main child or one of drainit's helpers).
pub fn set_orphans_reaped(n: u64) {
    registry().orphans_reaped = n;
}

/// The states read at scrape time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// The lifecycle phase.
    pub phase: Phase,
    /// What `/readyz` would answer now from what is known without running the
    /// checks: 200 (`true`) or 503.
    pub ready: bool,
    /// Live descendants now; `None` when `/proc` cannot tell (the sample is then
    /// left out rather than shown as 0).
    pub descendants: Option<usize>,
}

/// The exposition text: every metric with its `# HELP` and `# TYPE` lines.
///
/// | metric | type | labels |
/// |---|---|---|
/// | `drainit_phase` | gauge | `phase`: 1 for the current phase, 0 for the others |
/// | `drainit_ready` | gauge | |
/// | `drainit_descendants` | gauge | |
/// | `drainit_orphans_reaped_total` | counter | |
/// | `drainit_signals_received_total` | counter | `signal` |
/// | `drainit_signals_forwarded_total` | counter | `signal` |
/// | `drainit_checks_total` | counter | `check`, `result` (`pass`, `fail`) |
/// | `drainit_check_duration_seconds` | histogram | `check` |
/// | `drainit_probe_requests_total` | counter | `path`, `status` |
pub fn render(view: &View) -> String {
    let r = registry();
    let mut out = String::with_capacity(2048);
    head(
        &mut out,
        "drainit_phase",
        "gauge",
        "Lifecycle phase: 1 for the current one (starting, ready, draining, stopping).",
    );
    for p in [
        Phase::Starting,
        Phase::Ready,
        Phase::Draining,
        Phase::Stopping,
    ] {
        let _ = writeln!(
            out,
            "drainit_phase{{phase=\"{}\"}} {}",
            p.as_str(),
            u8::from(p == view.phase)
        );
    }
    head(
        &mut out,
        "drainit_ready",
        "gauge",
        "1 when /readyz answers 200 from what is known now (ready phase, last check evaluation passed).",
    );
    let _ = writeln!(out, "drainit_ready {}", u8::from(view.ready));
    head(
        &mut out,
        "drainit_descendants",
        "gauge",
        "Live processes drainit is responsible for (the app and everything it started).",
    );
    if let Some(n) = view.descendants {
        let _ = writeln!(out, "drainit_descendants {n}");
    }
    head(
        &mut out,
        "drainit_orphans_reaped_total",
        "counter",
        "Processes re-parented to drainit and reaped by it.",
    );
    let _ = writeln!(out, "drainit_orphans_reaped_total {}", r.orphans_reaped);
    head(
        &mut out,
        "drainit_signals_received_total",
        "counter",
        "Signals drainit received (SIGCHLD excepted), before rewriting.",
    );
    for (sig, n) in &r.signals_received {
        let _ = writeln!(
            out,
            "drainit_signals_received_total{{signal=\"{}\"}} {n}",
            escape(sig)
        );
    }
    head(
        &mut out,
        "drainit_signals_forwarded_total",
        "counter",
        "Signals drainit sent on, after rewriting: to the main child or its group, and the drain signal to each remaining descendant.",
    );
    for (sig, n) in &r.signals_forwarded {
        let _ = writeln!(
            out,
            "drainit_signals_forwarded_total{{signal=\"{}\"}} {n}",
            escape(sig)
        );
    }
    head(
        &mut out,
        "drainit_checks_total",
        "counter",
        "Readiness check runs by check and result (pass, fail).",
    );
    for ((check, passed), n) in &r.checks {
        let _ = writeln!(
            out,
            "drainit_checks_total{{check=\"{}\",result=\"{}\"}} {n}",
            escape(check),
            if *passed { "pass" } else { "fail" }
        );
    }
    head(
        &mut out,
        "drainit_check_duration_seconds",
        "histogram",
        "How long each readiness check run took, seconds (a timeout counts its full timeout).",
    );
    for (check, h) in &r.check_durations {
        let check = escape(check);
        let mut cumulative = 0;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = CHECK_BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "drainit_check_duration_seconds_bucket{{check=\"{check}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "drainit_check_duration_seconds_sum{{check=\"{check}\"}} {}",
            h.sum
        );
        let _ = writeln!(
            out,
            "drainit_check_duration_seconds_count{{check=\"{check}\"}} {}",
            h.count
        );
    }
    head(
        &mut out,
        "drainit_probe_requests_total",
        "counter",
        "Requests the probe server answered, by path (/healthz, /readyz, /metrics, other) and status.",
    );
    for ((path, status), n) in &r.probe_requests {
        let _ = writeln!(
            out,
            "drainit_probe_requests_total{{path=\"{path}\",status=\"{status}\"}} {n}"
        );
    }
    if let Some(ledger) = crate::proxy::running_ledger() {
        render_proxy(&mut out, ledger);
    }
    out
}

/// With `--proxy`: the request ledger (DESIGN §11, §12).
///
/// | metric | type | labels |
/// |---|---|---|
/// | `drainit_proxy_requests_total` | counter | `outcome`: completed, unknown, abandoned, canceled, rejected |
/// | `drainit_proxy_requests_in_flight` | gauge | |
/// | `drainit_proxy_malformed_total` | counter | |
/// | `drainit_proxy_request_duration_seconds` | histogram | |
/// | `drainit_proxy_streams_total` | counter | `event`: opened, completed, closed_by_drain, abandoned |
/// | `drainit_proxy_upstream_resent_total` | counter | |
fn render_proxy(out: &mut String, ledger: &crate::proxy::ledger::Ledger) {
    use crate::proxy::ledger::DURATION_BUCKETS;
    head(
        out,
        "drainit_proxy_requests_total",
        "counter",
        "Requests through the admission proxy by outcome (rejected: answered 503 by drainit, never sent to the app).",
    );
    let (outcomes, in_flight) = ledger.by_outcome();
    for (outcome, n) in outcomes {
        let _ = writeln!(
            out,
            "drainit_proxy_requests_total{{outcome=\"{outcome}\"}} {n}"
        );
    }
    head(
        out,
        "drainit_proxy_requests_in_flight",
        "gauge",
        "Admitted requests not yet settled.",
    );
    let _ = writeln!(out, "drainit_proxy_requests_in_flight {in_flight}");
    head(
        out,
        "drainit_proxy_malformed_total",
        "counter",
        "Requests refused as malformed, never admitted (400: unparsable, a missing or repeated Host, or a target form its method may not use; 431: head too large; 501: CONNECT).",
    );
    let _ = writeln!(
        out,
        "drainit_proxy_malformed_total {}",
        ledger.malformed_count()
    );
    head(
        out,
        "drainit_proxy_request_duration_seconds",
        "histogram",
        "From admission to the last byte of the response (or the request's end), seconds.",
    );
    let (buckets, sum_us) = ledger.durations();
    let mut cumulative = 0;
    for (i, n) in buckets.iter().enumerate() {
        cumulative += n;
        let le = DURATION_BUCKETS
            .get(i)
            .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
        let _ = writeln!(
            out,
            "drainit_proxy_request_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "drainit_proxy_request_duration_seconds_sum {}",
        sum_us as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "drainit_proxy_request_duration_seconds_count {cumulative}"
    );
    head(
        out,
        "drainit_proxy_streams_total",
        "counter",
        "Upgraded connections (WebSocket) through the proxy: opened, and how each ended.",
    );
    let st = ledger.streams();
    for (event, n) in [
        ("opened", st.opened),
        ("completed", st.completed),
        ("closed_by_drain", st.closed_by_drain),
        ("abandoned", st.abandoned),
    ] {
        let _ = writeln!(out, "drainit_proxy_streams_total{{event=\"{event}\"}} {n}");
    }
    head(
        out,
        "drainit_proxy_upstream_resent_total",
        "counter",
        "Requests sent to the app once more on a new connection because the pooled one they were given had been closed by the app (README, Admission proxy, Upstream).",
    );
    let _ = writeln!(
        out,
        "drainit_proxy_upstream_resent_total {}",
        crate::proxy::upstream_resent().unwrap_or(0)
    );
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format requires: `\`, `"` and newline escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_metric_has_help_and_type_and_histograms_are_cumulative() {
        check_ran("unit-test \"q\"", true, Duration::from_millis(7));
        check_ran("unit-test \"q\"", false, Duration::from_secs(20));
        let text = render(&View {
            phase: Phase::Ready,
            ready: true,
            descendants: None,
        });
        for name in [
            "drainit_phase",
            "drainit_ready",
            "drainit_descendants",
            "drainit_orphans_reaped_total",
            "drainit_signals_received_total",
            "drainit_signals_forwarded_total",
            "drainit_checks_total",
            "drainit_check_duration_seconds",
            "drainit_probe_requests_total",
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}\n{text}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}\n{text}");
        }
        assert!(
            text.contains("drainit_phase{phase=\"ready\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("\ndrainit_descendants "), "{text}");
        let c = "check=\"unit-test \\\"q\\\"\"";
        assert!(
            text.contains(&format!(
                "drainit_check_duration_seconds_bucket{{{c},le=\"0.01\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "drainit_check_duration_seconds_bucket{{{c},le=\"10\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "drainit_check_duration_seconds_bucket{{{c},le=\"+Inf\"}} 2\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("drainit_checks_total{{{c},result=\"fail\"}} 1\n")),
            "{text}"
        );
    }
}
