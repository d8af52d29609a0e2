//! The fleet gate (docs/gate.md, `drainit-gate check REPORT…`): merges the exit
//! reports of any number of replicas into one verdict.
//!
//! What it owns: finding drainit's report among other log lines (a JSON object
//! with a `"drainit"` key, as `kubectl logs --previous` or `docker logs` print it
//! as the last line of stderr), reading each replica's request ledger
//! (`requests`: completed / rejected / unknown / abandoned / canceled), and the
//! rules of the verdict. No I/O beyond what [`Source`] was given.
//!
//! The rules: the gate passes when every replica left a final report
//! (`"final":true`), none says exit 2 (a drain that abandoned or lost work), no
//! request is `unknown` or `abandoned`, and the rejections (retryable 503s
//! answered by drainit) are at most `allow_503` percent of the requests received.
//! A replica whose report is missing or partial (`"final":false`: the platform
//! SIGKILLed drainit mid-drain) counts against the gate and is named.

use serde::Serialize;
use serde_json::Value;

/// One replica's report, as read from one file or stream.
#[derive(Debug, Clone, Serialize)]
pub struct Replica {
    /// What it was read from (the file's path, or `-` for stdin).
    pub name: String,
    /// What was found: `final`, `partial`, or `missing` (no report line, or the
    /// file could not be read).
    pub state: String,
    /// Why it is missing (the read error, or "no drainit report line"), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// drainit's exit code (`None` in a partial or missing report).
    pub exit_code: Option<i64>,
    /// drainit's `reason` (`drained`, `abandoned`, `draining`…).
    pub reason: Option<String>,
    /// The request ledger (`None` without `--proxy`, or when missing).
    pub requests: Option<Ledger>,
    /// Processes drainit SIGKILLed at its deadline (the report's `abandoned` list).
    pub processes_abandoned: u64,
}

/// A replica's request ledger (the report's `requests`; counts of requests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    pub received: u64,
    pub rejected: u64,
    pub completed: u64,
    pub unknown: u64,
    pub abandoned: u64,
    pub canceled: u64,
    pub in_flight: u64,
}

impl std::fmt::Display for Ledger {
    /// `N received, N completed, N rejected, N unknown, N abandoned, N canceled`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} received, {} completed, {} rejected, {} unknown, {} abandoned, {} canceled",
            self.received,
            self.completed,
            self.rejected,
            self.unknown,
            self.abandoned,
            self.canceled
        )
    }
}

impl Ledger {
    fn add(&mut self, o: &Ledger) {
        self.received += o.received;
        self.rejected += o.rejected;
        self.completed += o.completed;
        self.unknown += o.unknown;
        self.abandoned += o.abandoned;
        self.canceled += o.canceled;
        self.in_flight += o.in_flight;
    }
}

/// The merged verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    /// Each replica, in the order given.
    pub replicas: Vec<Replica>,
    /// The sum of the replicas' ledgers.
    pub total: Ledger,
    /// The allowance, in percent of the requests received.
    pub allow_503_pct: u32,
    /// Most rejections accepted (`allow_503_pct` of `total.received`, rounded down).
    pub allowance: u64,
    /// The gate passes.
    pub pass: bool,
    /// Why it fails (one sentence each), or why it passes.
    pub reasons: Vec<String>,
}

/// Where a report is read from: a name (for the messages) and its text, or the
/// error reading it gave.
pub struct Source {
    pub name: String,
    pub text: Result<String, String>,
}

/// The last drainit report among the lines of `text`: a line that is (or ends
/// with, after a log prefix such as a timestamp) a JSON object with a `"drainit"`
/// key. The last one wins: a restarted container's log may hold several.
pub fn find_report(text: &str) -> Option<Value> {
    text.lines().rev().find_map(|line| {
        let line = line.trim_end();
        if !line.ends_with('}') || !line.contains("\"drainit\"") {
            return None;
        }
        // Each '{' from the left is a candidate start (a log prefix may hold braces).
        line.match_indices('{').find_map(|(i, _)| {
            serde_json::from_str::<Value>(&line[i..])
                .ok()
                .filter(|v| v.get("drainit").is_some())
        })
    })
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Reads one replica from its source.
pub fn read_replica(src: &Source) -> Replica {
    let missing = |error: String| Replica {
        name: src.name.clone(),
        state: "missing".into(),
        error: Some(error),
        exit_code: None,
        reason: None,
        requests: None,
        processes_abandoned: 0,
    };
    let text = match &src.text {
        Ok(t) => t,
        Err(e) => return missing(e.clone()),
    };
    let Some(report) = find_report(text) else {
        return missing("no drainit report line".into());
    };
    let is_final = report.get("final").and_then(Value::as_bool).unwrap_or(true);
    Replica {
        name: src.name.clone(),
        state: if is_final { "final" } else { "partial" }.into(),
        error: None,
        exit_code: report.get("exit_code").and_then(Value::as_i64),
        reason: report
            .get("reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        requests: report
            .get("requests")
            .filter(|r| r.is_object())
            .map(|r| Ledger {
                received: u(r, "received"),
                rejected: u(r, "rejected"),
                completed: u(r, "completed"),
                unknown: u(r, "unknown"),
                abandoned: u(r, "abandoned"),
                canceled: u(r, "canceled"),
                in_flight: u(r, "in_flight"),
            }),
        processes_abandoned: report
            .get("abandoned")
            .and_then(Value::as_array)
            .map_or(0, |a| a.len() as u64),
    }
}

/// The fleet's verdict over `sources` (see the module's rules).
pub fn check(sources: &[Source], allow_503_pct: u32) -> Fleet {
    let replicas: Vec<Replica> = sources.iter().map(read_replica).collect();
    let mut total = Ledger::default();
    let mut reasons = Vec::new();
    for r in &replicas {
        if let Some(l) = &r.requests {
            total.add(l);
        }
        match r.state.as_str() {
            "missing" => reasons.push(format!(
                "{}: no report ({}): its requests are not accounted for",
                r.name,
                r.error.as_deref().unwrap_or("missing")
            )),
            "partial" => reasons.push(format!(
                "{}: the report is partial (\"final\":false, reason {}): drainit was killed before it finished draining",
                r.name,
                r.reason.as_deref().unwrap_or("?")
            )),
            _ => {
                if r.exit_code == Some(2) {
                    reasons.push(format!(
                        "{}: exit 2 ({}): the drain abandoned or lost work",
                        r.name,
                        r.reason.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
        if let Some(l) = &r.requests {
            if l.unknown + l.abandoned > 0 {
                reasons.push(format!(
                    "{}: {} unknown, {} abandoned request(s)",
                    r.name, l.unknown, l.abandoned
                ));
            }
        } else if r.state != "missing" && r.processes_abandoned > 0 {
            reasons.push(format!(
                "{}: {} process(es) killed at the deadline (no request ledger: run drainit with --proxy)",
                r.name, r.processes_abandoned
            ));
        }
    }
    if replicas.is_empty() {
        reasons.push("no report given".into());
    }
    let allowance = total.received * u64::from(allow_503_pct) / 100;
    if total.rejected * 100 > u64::from(allow_503_pct) * total.received {
        reasons.push(format!(
            "{} rejected > allowance {allowance} ({allow_503_pct}% of {} received)",
            total.rejected, total.received
        ));
    }
    let pass = reasons.is_empty();
    if pass {
        reasons.push(format!(
            "every request committed or was rejected within the allowance: {} completed, {} rejected (allowance {allowance}), across {} replica(s)",
            total.completed,
            total.rejected,
            replicas.len()
        ));
    }
    Fleet {
        replicas,
        total,
        allow_503_pct,
        allowance,
        pass,
        reasons,
    }
}

/// The text a person reads: one line per replica, the merged ledger, the verdict.
pub fn text(f: &Fleet) -> String {
    let mut out = String::new();
    out.push_str(
        "replica  state    exit  received completed rejected unknown abandoned canceled\n",
    );
    for r in &f.replicas {
        let exit = r.exit_code.map_or("-".into(), |c| c.to_string());
        match &r.requests {
            Some(l) => out.push_str(&format!(
                "{}  {:<8} {:>4}  {:>8} {:>9} {:>8} {:>7} {:>9} {:>8}\n",
                r.name,
                r.state,
                exit,
                l.received,
                l.completed,
                l.rejected,
                l.unknown,
                l.abandoned,
                l.canceled
            )),
            None => out.push_str(&format!(
                "{}  {:<8} {:>4}  (no request ledger)\n",
                r.name, r.state, exit
            )),
        }
    }
    let t = &f.total;
    out.push_str(&format!("\nLedger: {t}\n"));
    out.push_str(if f.pass {
        "GATE PASSES: "
    } else {
        "GATE FAILS: "
    });
    out.push_str(&f.reasons.join("; "));
    out.push('\n');
    out
}

/// The page of a fleet check: one lane per replica (no timeline: reports carry
/// counts, not times), one row per replica's ledger in the verdict's reasons.
pub fn replay(f: &Fleet) -> crate::page::Replay {
    use crate::page;
    let mut reasons = f.reasons.clone();
    for r in &f.replicas {
        reasons.push(match &r.requests {
            Some(l) => format!(
                "{} ({}, exit {}): {l}",
                r.name,
                r.state,
                r.exit_code.map_or("-".into(), |c| c.to_string()),
            ),
            None => format!("{} ({}): no request ledger", r.name, r.state),
        });
    }
    page::Replay {
        title: "drainit-gate check".into(),
        subtitle: format!(
            "{} replica report(s), allowance {}% of the requests",
            f.replicas.len(),
            f.allow_503_pct
        ),
        horizon_s: 1.0,
        slots: 1,
        workers: f
            .replicas
            .iter()
            .map(|r| page::Lane {
                name: r.name.clone(),
                boot_s: 0.0,
                ready_s: None,
                signal_s: None,
                kill_s: None,
                exit_s: None,
            })
            .collect(),
        requests: vec![],
        events: vec![],
        ledger: page::Counts {
            committed: f.total.completed as u32,
            rejected: f.total.rejected as u32,
            failed: f.total.unknown as u32,
            killed: f.total.abandoned as u32,
            allowance: f.allowance as u32,
        },
        verdict: page::Verdict {
            pass: f.pass,
            reasons,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_found_after_a_log_prefix_and_the_last_one_wins() {
        let log = "2026-01-01T00:00:00Z starting\n\
                   2026-01-01T00:00:01Z {\"drainit\":\"0.1\",\"final\":false,\"reason\":\"draining\"}\n\
                   2026-01-01T00:00:02Z {\"drainit\":\"0.1\",\"final\":true,\"exit_code\":0,\"reason\":\"drained\"}\n";
        let r = find_report(log).expect("found");
        assert_eq!(r["reason"], "drained");
        assert!(find_report("{\"level\":\"info\"}\nplain\n").is_none());
    }

    #[test]
    fn rejections_within_the_allowance_pass() {
        let line = |rej: u64| {
            format!(
                "{{\"drainit\":\"0.1\",\"final\":true,\"exit_code\":0,\"reason\":\"drained\",\"requests\":{{\"received\":10,\"rejected\":{rej},\"completed\":{},\"unknown\":0,\"abandoned\":0,\"canceled\":0,\"in_flight\":0}}}}",
                10 - rej
            )
        };
        let src = |t: String| Source {
            name: "a".into(),
            text: Ok(t),
        };
        assert!(check(&[src(line(1)), src(line(1))], 10).pass);
        assert!(!check(&[src(line(2)), src(line(1))], 10).pass);
        assert!(!check(&[], 100).pass);
    }
}
