//! The text and JSON outputs of a [`Run`]: renderers of the one timeline the model
//! computed, never a second computation. The page (`crate::page`) takes its event
//! sentences from [`describe`] too, so a person reads the same words everywhere.

use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{Event, ExitCause, Request, Run, Settings};

/// A worker's name: `W1` for index 1.
pub fn worker_name(index: u32) -> String {
    format!("W{index}")
}

fn list(ids: &[u32]) -> String {
    if ids.is_empty() {
        return "nothing".into();
    }
    ids.iter()
        .map(|id| format!("#{id}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One sentence for an event, as the trace prints it (without its time).
pub fn describe(event: &Event, slots: u32) -> String {
    match event {
        Event::Boot {
            worker, ready_at_s, ..
        } => format!("{} starts (ready at {ready_at_s}s)", worker_name(*worker)),
        Event::Ready { worker, .. } => format!("{} is ready", worker_name(*worker)),
        Event::Admit {
            request,
            worker,
            load,
            ends_at_s,
            ..
        } => format!(
            "#{request} arrives: routed to {} (load {load}/{slots}), would commit at {ends_at_s}s",
            worker_name(*worker)
        ),
        Event::Reject { request, .. } => {
            format!(
                "#{request} arrives: rejected 503 (no worker ready, admitting and with a free slot), retryable"
            )
        }
        Event::Fail {
            request, worker, ..
        } => format!(
            "#{request} arrives: sent to {}, not ready yet: failed 500",
            worker_name(*worker)
        ),
        Event::Commit {
            request, worker, ..
        } => format!("#{request} committed on {}", worker_name(*worker)),
        Event::Signal {
            worker,
            handled: true,
            running,
            ..
        } => format!(
            "SIGTERM to {}: stops admitting, drains {}",
            worker_name(*worker),
            list(running)
        ),
        Event::Signal {
            worker,
            handled: false,
            running,
            ..
        } => format!(
            "SIGTERM to {}: not handled, it exits at once with {} in flight",
            worker_name(*worker),
            list(running)
        ),
        Event::Kill {
            worker, running, ..
        } => format!(
            "SIGKILL to {} at the end of the grace period: kills {}",
            worker_name(*worker),
            list(running)
        ),
        Event::Killed {
            request, worker, ..
        } => format!("#{request} killed in flight on {}", worker_name(*worker)),
        Event::Exit { worker, cause, .. } => format!(
            "{} exits ({})",
            worker_name(*worker),
            match cause {
                ExitCause::Drained => "drained: nothing left running",
                ExitCause::Sigterm => "SIGTERM",
                ExitCause::Sigkill => "SIGKILL",
            }
        ),
    }
}

/// The settings in one line, flags' words.
pub fn summary(s: &Settings) -> String {
    format!(
        "{} workers x {} slots; {} requests every {}s from {}s, {}s each; startup {}s; \
         SIGTERM to W1 at {}s ({}), grace {}s; {}; allow 503: {}%; {}",
        s.workers,
        s.slots,
        s.requests,
        s.every_s,
        s.first_at_s,
        s.duration_s,
        s.startup_s,
        s.signal_at_s,
        if s.handles_term {
            "handles TERM"
        } else {
            "does not handle TERM"
        },
        s.grace_s,
        if s.route_ready {
            "route only to ready workers"
        } else {
            "route to any worker"
        },
        s.allow_503_pct,
        if s.replacement {
            format!("replacement W{} at the signal", s.workers + 1)
        } else {
            "no replacement".into()
        }
    )
}

/// The ledger's line: `15 committed, 4 rejected, 0 failed, 1 killed`.
pub fn ledger_line(run: &Run) -> String {
    let l = run.ledger;
    format!(
        "{} committed, {} rejected, {} failed, {} killed",
        l.committed, l.rejected, l.failed, l.killed
    )
}

/// The verdict's line: `GATE PASSES: …` or `GATE FAILS: …; …`.
pub fn verdict_line(run: &Run) -> String {
    format!(
        "{}: {}",
        if run.verdict.pass {
            "GATE PASSES"
        } else {
            "GATE FAILS"
        },
        run.verdict.reasons.join("; ")
    )
}

/// The output for a person: settings, event trace, request table, ledger, verdict.
pub fn text(run: &Run) -> String {
    let mut out = String::new();
    let s = &run.settings;
    let _ = writeln!(out, "drainit-gate model: {}\n", summary(s));
    let _ = writeln!(out, "Events");
    for e in &run.events {
        let _ = writeln!(out, "  {:>4}s  {}", e.at_s(), describe(e, s.slots));
    }
    let _ = writeln!(out, "\nRequests");
    let _ = writeln!(
        out,
        "  {:>5}  {:>7}  {:>6}  {:>5}  status",
        "id", "arrived", "worker", "end"
    );
    for r in &run.requests {
        let _ = writeln!(
            out,
            "  {:>5}  {:>6}s  {:>6}  {:>4}s  {}",
            format!("#{}", r.id),
            r.arrived_s,
            r.worker.map_or_else(|| "-".into(), worker_name),
            r.end_s,
            r.status.as_str()
        );
    }
    let _ = writeln!(out, "\nLedger: {}", ledger_line(run));
    let _ = writeln!(out, "{}", verdict_line(run));
    out
}

/// The JSON object of `--json`: the ledger's four counts, `gate` ("pass" or
/// "fail"), `reasons`, `allowance`, `settings`, `requests` (id, arrived_s, worker
/// as an index or null, end_s, status) and `events` (each with `at_s`, `kind` and
/// its fields, see [`Event`]).
#[derive(Serialize)]
pub struct Json<'a> {
    pub committed: u32,
    pub rejected: u32,
    pub failed: u32,
    pub killed: u32,
    pub gate: &'static str,
    pub allowance: u32,
    pub reasons: &'a [String],
    pub settings: &'a Settings,
    pub requests: &'a [Request],
    pub events: &'a [Event],
}

/// The `--json` object of a run, as one line.
pub fn json(run: &Run) -> String {
    let j = Json {
        committed: run.ledger.committed,
        rejected: run.ledger.rejected,
        failed: run.ledger.failed,
        killed: run.ledger.killed,
        gate: if run.verdict.pass { "pass" } else { "fail" },
        allowance: run.verdict.allowance,
        reasons: &run.verdict.reasons,
        settings: &run.settings,
        requests: &run.requests,
        events: &run.events,
    };
    serde_json::to_string(&j).expect("plain structs of numbers and strings serialize")
}
