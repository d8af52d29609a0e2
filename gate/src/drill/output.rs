//! The drill's outputs: the text a person reads and the replay page's data, both
//! rendered from one [`Drill`].

use std::fmt::Write as _;

use super::{Drill, Router};
use crate::page;

/// The text a person reads: the requests, the replicas' two sides, the ledger,
/// the verdict. Times are scenario seconds (measured, scaled back).
pub fn text(d: &Drill) -> String {
    let mut out = String::new();
    header(&mut out, d);
    replicas(&mut out, d);
    requests(&mut out, d);
    let l = &d.ledger;
    let _ = writeln!(
        out,
        "\nLedger: {} committed, {} rejected, {} failed, {} killed, {} not attempted",
        l.committed, l.rejected, l.failed, l.killed, l.not_attempted
    );
    out.push_str(if d.pass {
        "GATE PASSES: "
    } else {
        "GATE FAILS: "
    });
    out.push_str(&d.reasons.join("; "));
    out.push('\n');
    for w in &d.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

/// The text's first line: the scenario's settings.
fn header(out: &mut String, d: &Drill) {
    let s = &d.settings;
    let _ = writeln!(
        out,
        "drill: {} replicas x {} slots, {} requests every {}s from {}s, SIGTERM to W1 at {}s{}, router {}, time scale {}",
        s.replicas,
        s.slots,
        s.requests,
        s.every_s,
        s.first_at_s,
        s.signal_at_s,
        if s.replacement {
            ", replacement W".to_string() + &(s.replicas + 1).to_string()
        } else {
            String::new()
        },
        match s.router {
            Router::Builtin => "builtin",
            Router::Haproxy => "haproxy",
        },
        s.time_scale
    );
}

/// The text's replicas: ready, signal and exit times, the client's side and the
/// exit report's.
fn replicas(out: &mut String, d: &Drill) {
    out.push_str(
        "\nReplicas (ready, signal, exit in scenario seconds; client side vs exit report):\n",
    );
    for r in &d.replicas {
        let t = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}s"));
        let _ = write!(
            out,
            "  {}  ready {}  signal {}  exit {}  client: {} sent, {} whole, {} rejected, {} lost",
            r.name,
            t(r.ready_s),
            t(r.signal_s),
            t(r.exit_s),
            r.client.sent,
            r.client.whole,
            r.client.rejected,
            r.client.lost
        );
        match &r.report.requests {
            Some(l) => {
                let _ = writeln!(
                    out,
                    " | report ({}, exit {}): {} received, {} completed, {} rejected, {} unknown, {} abandoned",
                    r.report.state,
                    r.report.exit_code.map_or("-".into(), |c| c.to_string()),
                    l.received,
                    l.completed,
                    l.rejected,
                    l.unknown,
                    l.abandoned
                );
            }
            None => {
                let _ = writeln!(out, " | report {}", r.report.state);
            }
        }
    }
}

/// The text's requests: each one's attempts and status.
fn requests(out: &mut String, d: &Drill) {
    out.push_str(
        "\nRequests:\n     #  planned  attempts                                   status\n",
    );
    for r in &d.requests {
        let tries: Vec<String> = r
            .attempts
            .iter()
            .map(|a| {
                format!(
                    "{:.1}s {}→{}",
                    a.at_s,
                    a.replica.as_deref().unwrap_or("router"),
                    a.outcome
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  {:>4}  {:>6.1}s  {:<42} {}{}",
            format!("#{}", r.id),
            r.planned_s,
            if tries.is_empty() {
                "-".into()
            } else {
                tries.join(", ")
            },
            r.status,
            r.ledger
                .as_ref()
                .map_or(String::new(), |l| format!(" (ledger: {l})"))
        );
    }
}

/// The replay page's events of a drill, unsorted: each replica's ready, signal
/// and exit, each request's attempts and their ends.
fn steps(d: &Drill) -> Vec<page::Step> {
    let mut events = Vec::new();
    let step = |at: f64, kind: &str, request: Option<u32>, worker: Option<String>, text: String| {
        page::Step {
            at_s: at,
            kind: kind.into(),
            request,
            worker,
            text,
        }
    };
    for r in &d.replicas {
        if let Some(t) = r.ready_s {
            events.push(step(
                t,
                "ready",
                None,
                Some(r.name.clone()),
                format!("{} answers /readyz 200", r.name),
            ));
        }
        if let Some(t) = r.signal_s {
            events.push(step(
                t,
                "signal",
                None,
                Some(r.name.clone()),
                format!("SIGTERM to {}", r.name),
            ));
        }
        if let Some(t) = r.exit_s {
            events.push(step(
                t,
                "exit",
                None,
                Some(r.name.clone()),
                format!("{} exits", r.name),
            ));
        }
    }
    for r in &d.requests {
        if r.attempts.is_empty() {
            events.push(step(
                r.planned_s,
                "not_attempted",
                Some(r.id),
                None,
                format!("#{} not attempted: the drill had stopped", r.id),
            ));
        }
        for (n, a) in r.attempts.iter().enumerate() {
            let last = n + 1 == r.attempts.len();
            match &a.replica {
                None => events.push(step(
                    a.at_s,
                    "reject",
                    Some(r.id),
                    None,
                    format!("#{} rejected by the router (503)", r.id),
                )),
                Some(w) => {
                    events.push(step(
                        a.at_s,
                        "admit",
                        Some(r.id),
                        Some(w.clone()),
                        format!("#{} sent to {w}", r.id),
                    ));
                    let kind = if last {
                        match r.status.as_str() {
                            "committed" => "commit",
                            "killed" => "killed",
                            "rejected" => "reject",
                            _ => "fail",
                        }
                    } else {
                        "reject"
                    };
                    events.push(step(
                        a.end_s,
                        kind,
                        Some(r.id),
                        Some(w.clone()),
                        format!("#{} {} on {w} ({})", r.id, kind, a.outcome),
                    ));
                }
            }
        }
    }
    events
}

/// The replay page's data for a drill: measured times, one lane per replica.
pub fn replay(d: &Drill) -> page::Replay {
    let mut events = steps(d);
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let last = events.last().map_or(0.0, |e| e.at_s);
    page::Replay {
        title: "drainit-gate drill".into(),
        subtitle: format!(
            "{} replicas x {} slots, {} requests every {}s, SIGTERM to W1 at {}s (measured, time scale {})",
            d.settings.replicas,
            d.settings.slots,
            d.settings.requests,
            d.settings.every_s,
            d.settings.signal_at_s,
            d.settings.time_scale
        ),
        horizon_s: (last + 2.0).max(10.0),
        slots: d.settings.slots,
        workers: d
            .replicas
            .iter()
            .map(|r| page::Lane {
                name: r.name.clone(),
                boot_s: r.boot_s.max(0.0),
                ready_s: r.ready_s,
                signal_s: r.signal_s,
                kill_s: None,
                exit_s: r.exit_s,
            })
            .collect(),
        requests: d
            .requests
            .iter()
            .map(|r| page::Row {
                id: r.id,
                arrived_s: r.planned_s,
                worker: r.worker.clone(),
                end_s: r.end_s,
                status: r.status.clone(),
            })
            .collect(),
        events,
        ledger: page::Counts {
            committed: d.ledger.committed,
            rejected: d.ledger.rejected,
            failed: d.ledger.failed + d.ledger.not_attempted,
            killed: d.ledger.killed,
            allowance: d.allowance,
        },
        verdict: page::Verdict {
            pass: d.pass,
            reasons: d.reasons.clone(),
        },
    }
}
