//! `GET /metrics`: drainit's counters in the Prometheus text exposition format
//! (version 0.0.4, <https://prometheus.io/docs/instrumenting/exposition_formats/>).
//!
//! Owns: the counters that only grow (signals forwarded and received, checks run
//! and their durations, probe requests answered, orphans reaped) and the text they
//! are rendered to. What is a state rather than a count (phase, readiness, live
//! descendants) is read at scrape time by the caller and passed in as a [`View`].
//!
//! The counters live in a [`Metrics`] handle that `main` makes and hands to
//! the tasks that record (the supervisor, the probe server); the checks keep
//! their own run counts ([`crate::checks::RunCounts`]), read at scrape time. All
//! of them run on the one runtime thread: a `RefCell` of small vectors, which
//! allocates nothing until the first fact is recorded (idle costs nothing).
//!
//! Why hand-written rather than the `prometheus-client` crate: the format is a few
//! lines of text, and drainit's idle RSS has almost no room left under its 2×
//! tini-static budget. Measured at the time: `prometheus-client` 0.23.1
//! added 56 KiB to a small static program doing what [`render`] does; this whole
//! module and its callers added 24 KiB to drainit.
//!
//! Must not: record anything of unbounded cardinality. Labels are signal names,
//! configured check names, a fixed set of probe paths and HTTP status codes.
//!
//! Invariant: every metric is named `drainit_*` with its unit in the name, and has
//! `# HELP` and `# TYPE` lines even before its first sample.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;

use crate::checks::{DURATION_BUCKETS, RunCounts};
use crate::drain::Phase;
use crate::signals::Signal;
use crate::util::entry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label sets and their values, in the order first seen.
#[derive(Default)]
struct Registry {
    /// Keyed by the signal itself, named only when rendered: counting a
    /// forward allocates nothing (it runs in the signal's path, `driver`).
    signals_forwarded: Vec<(Signal, u64)>,
    signals_received: Vec<(Signal, u64)>,
    /// `(path label, status)` → requests.
    probe_requests: Vec<((&'static str, u16), u64)>,
    orphans_reaped: u64,
    /// `(phase name, outcome)` → drain phases ended so.
    phases: Vec<((String, &'static str), u64)>,
}

/// drainit's own counters: made by `main`, cloned to the supervisor (signals,
/// orphans) and the probe server (requests), rendered by `/metrics`. A clone
/// shares the counters.
#[derive(Clone, Default)]
pub struct Metrics(Rc<RefCell<Registry>>);

impl Metrics {
    /// drainit sent `signal` on (after `--rewrite`) `n` times: to the main child
    /// or its group, or, as the drain signal, to `n` remaining descendants.
    /// Rendered with the signal's name (`SIGTERM`) as its label.
    pub fn signal_forwarded(&self, signal: Signal, n: u64) {
        if n > 0 {
            *entry(&mut self.0.borrow_mut().signals_forwarded, signal) += n;
        }
    }

    /// drainit received `signal` (any but SIGCHLD), before rewriting.
    pub fn signal_received(&self, signal: Signal) {
        *entry(&mut self.0.borrow_mut().signals_received, signal) += 1;
    }

    /// The probe server answered a request for `path` with `status`. Paths other
    /// than `/healthz`, `/readyz` and `/metrics` are counted as `other`, so a
    /// scanner cannot grow the label set.
    pub fn probe_request(&self, path: &str, status: u16) {
        let path = match path {
            "/healthz" => "/healthz",
            "/readyz" => "/readyz",
            "/metrics" => "/metrics",
            _ => "other",
        };
        *entry(&mut self.0.borrow_mut().probe_requests, (path, status)) += 1;
    }

    /// Drain phase `name` (a configured name) ended with `outcome` (`ok`,
    /// `failed`, `timed_out`, `canceled`, `abandoned`, `skipped`).
    pub fn phase_ended(&self, name: &str, outcome: &'static str) {
        *entry(&mut self.0.borrow_mut().phases, (name.to_string(), outcome)) += 1;
    }

    /// The reaper's running count of orphans reaped (processes that were not the
    /// main child or one of drainit's helpers).
    pub fn set_orphans_reaped(&self, n: u64) {
        self.0.borrow_mut().orphans_reaped = n;
    }
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

impl Metrics {
    /// The exposition text: every metric with its `# HELP` and `# TYPE` lines;
    /// `checks`: the check runs so far.
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
    /// | `drainit_drain_phases_total` | counter | `phase`, `outcome` |
    ///
    /// With `proxy` (`--proxy`), the admission proxy's metrics follow
    /// (`render_proxy`).
    pub fn render(
        &self,
        view: &View,
        checks: &RunCounts,
        proxy: Option<&crate::proxy::ProxyStats>,
    ) -> String {
        let r = self.0.borrow();
        let mut out = String::with_capacity(2048);
        render_states(&mut out, view);
        head(
            &mut out,
            "drainit_orphans_reaped_total",
            "counter",
            "Processes re-parented to drainit and reaped by it.",
        );
        let _ = writeln!(out, "drainit_orphans_reaped_total {}", r.orphans_reaped);
        render_signals(&mut out, &r);
        render_checks(&mut out, checks);
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
        head(
            &mut out,
            "drainit_drain_phases_total",
            "counter",
            "Drain phases ended, by phase and outcome (ok, failed, timed_out, canceled, abandoned, skipped).",
        );
        for ((phase, outcome), n) in &r.phases {
            let _ = writeln!(
                out,
                "drainit_drain_phases_total{{phase=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(phase)
            );
        }
        if let Some(proxy) = proxy {
            render_proxy(&mut out, proxy);
        }
        out
    }
}

/// The states read at scrape time: phase, readiness, descendants.
fn render_states(out: &mut String, view: &View) {
    head(
        out,
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
        out,
        "drainit_ready",
        "gauge",
        "1 when /readyz answers 200 from what is known now (ready phase, last check evaluation passed).",
    );
    let _ = writeln!(out, "drainit_ready {}", u8::from(view.ready));
    head(
        out,
        "drainit_descendants",
        "gauge",
        "Live processes drainit is responsible for (the app and everything it started).",
    );
    if let Some(n) = view.descendants {
        let _ = writeln!(out, "drainit_descendants {n}");
    }
}

/// The signals received and sent on.
fn render_signals(out: &mut String, r: &Registry) {
    head(
        out,
        "drainit_signals_received_total",
        "counter",
        "Signals drainit received (SIGCHLD excepted), before rewriting.",
    );
    for (sig, n) in &r.signals_received {
        let _ = writeln!(
            out,
            "drainit_signals_received_total{{signal=\"{}\"}} {n}",
            escape(&sig.to_string())
        );
    }
    head(
        out,
        "drainit_signals_forwarded_total",
        "counter",
        "Signals drainit sent on, after rewriting: to the main child or its group, and the drain signal to each remaining descendant.",
    );
    for (sig, n) in &r.signals_forwarded {
        let _ = writeln!(
            out,
            "drainit_signals_forwarded_total{{signal=\"{}\"}} {n}",
            escape(&sig.to_string())
        );
    }
}

/// The readiness check runs and their durations.
fn render_checks(out: &mut String, checks: &RunCounts) {
    head(
        out,
        "drainit_checks_total",
        "counter",
        "Readiness check runs by check and result (pass, fail).",
    );
    for ((check, passed), n) in &checks.runs {
        let _ = writeln!(
            out,
            "drainit_checks_total{{check=\"{}\",result=\"{}\"}} {n}",
            escape(check),
            if *passed { "pass" } else { "fail" }
        );
    }
    head(
        out,
        "drainit_check_duration_seconds",
        "histogram",
        "How long each readiness check run took, seconds (a timeout counts its full timeout).",
    );
    for (check, h) in &checks.durations {
        let check = escape(check);
        let mut cumulative = 0;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = DURATION_BUCKETS
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
}

/// With `--proxy`: the request ledger (docs/proxy.md; docs/logs.md).
///
/// | metric | type | labels |
/// |---|---|---|
/// | `drainit_proxy_requests_total` | counter | `outcome`: completed, unknown, abandoned, canceled, rejected |
/// | `drainit_proxy_requests_in_flight` | gauge | |
/// | `drainit_proxy_malformed_total` | counter | |
/// | `drainit_proxy_request_duration_seconds` | histogram | |
/// | `drainit_proxy_streams_total` | counter | `event`: opened, completed, closed_by_drain, abandoned |
/// | `drainit_proxy_upstream_resent_total` | counter | |
fn render_proxy(out: &mut String, proxy: &crate::proxy::ProxyStats) {
    let ledger = proxy.ledger();
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
        "Requests sent to the app once more on a new connection because the pooled one they were given had been closed by the app (docs/proxy.md, Upstream).",
    );
    let _ = writeln!(
        out,
        "drainit_proxy_upstream_resent_total {}",
        proxy.resent()
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
    use std::time::Duration;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_metric_has_help_and_type_and_histograms_are_cumulative() {
        let mut checks = RunCounts::default();
        checks.record("unit-test \"q\"", true, Duration::from_millis(7));
        checks.record("unit-test \"q\"", false, Duration::from_secs(20));
        let view = View {
            phase: Phase::Ready,
            ready: true,
            descendants: None,
        };
        let text = Metrics::default().render(&view, &checks, None);
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
