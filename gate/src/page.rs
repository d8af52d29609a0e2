//! The replay page: one self-contained HTML file (inline CSS and plain JavaScript,
//! no network reference, no external script or font) whose data is one embedded
//! JSON object, a [`Replay`].
//!
//! What it owns: the [`Replay`] shape and the template (`page.html`). A [`Replay`]
//! is not tied to the model: the model fills one with [`Replay::from_run`], and the
//! live drill fills the same shape with what it measured, so one page renders both.
//! The page derives everything it shows at an inspection time from the events up
//! to that time (a request is waiting until its `admit`/`reject`/`fail` step,
//! running until its `commit`/`killed` step); the final ledger and verdict come
//! from the data.

use serde::Serialize;

use crate::model::{Event, Run};
use crate::render;

const TEMPLATE: &str = include_str!("page.html");
/// Where the template takes the data: a JavaScript expression.
const SLOT: &str = "/*REPLAY_DATA*/null";

/// Everything the page shows. Times are seconds from the run's start (the model's
/// whole seconds, or a drill's measured ones).
#[derive(Debug, Clone, Serialize)]
pub struct Replay {
    /// The heading.
    pub title: String,
    /// One line under it: the settings.
    pub subtitle: String,
    /// The inspection window: the scrubber goes from 0 to this.
    pub horizon_s: f64,
    /// Invocation slots per worker (the height of a lane).
    pub slots: u32,
    /// One lane per worker, in index order.
    pub workers: Vec<Lane>,
    /// One row per request, in id order; its final outcome.
    pub requests: Vec<Row>,
    /// The events in the order they happened.
    pub events: Vec<Step>,
    /// The final counts.
    pub ledger: Counts,
    /// The final verdict.
    pub verdict: Verdict,
}

/// A worker's lane: when it booted, became ready, was signalled, killed, exited.
/// `None`: never (within the run).
#[derive(Debug, Clone, Serialize)]
pub struct Lane {
    /// `W1`….
    pub name: String,
    /// When it started.
    pub boot_s: f64,
    pub ready_s: Option<f64>,
    pub signal_s: Option<f64>,
    pub kill_s: Option<f64>,
    pub exit_s: Option<f64>,
}

/// A request's final row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// 1-based.
    pub id: u32,
    /// Its arrival.
    pub arrived_s: f64,
    /// The worker's name, or `None` when the router rejected it.
    pub worker: Option<String>,
    /// When its outcome was decided (commit, kill; the arrival for a 503 or 500).
    pub end_s: f64,
    /// `committed`, `rejected`, `failed` or `killed` (a drill may add others).
    pub status: String,
}

/// One event: its time, its kind (the model's `kind` words: `admit`, `reject`,
/// `fail`, `commit`, `killed` change a request's state, and a drill's
/// `not_attempted`; the others mark a lane),
/// the request and worker it concerns, and its sentence.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// When it happened.
    pub at_s: f64,
    /// What happened (see above).
    pub kind: String,
    /// The request it concerns, if any.
    pub request: Option<u32>,
    /// The worker's name it concerns, if any.
    pub worker: Option<String>,
    /// The sentence the trace shows.
    pub text: String,
}

/// The ledger's counts, plus the allowance the rejections are held to.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    /// Committed requests.
    pub committed: u32,
    /// Retryable 503s.
    pub rejected: u32,
    /// 500s.
    pub failed: u32,
    /// Lost in flight.
    pub killed: u32,
    /// Most rejections the gate accepts.
    pub allowance: u32,
}

/// The gate's verdict and its reasons.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The gate passes.
    pub pass: bool,
    /// Why it fails (one sentence each), or why it passes.
    pub reasons: Vec<String>,
}

/// The inspection window the seed's page uses (sixty seconds), or longer when the
/// run is.
const MIN_HORIZON_S: f64 = 60.0;

impl Replay {
    /// The replay of a model run.
    pub fn from_run(run: &Run) -> Replay {
        let s = &run.settings;
        let n = s.workers + u32::from(s.replacement);
        let mut workers: Vec<Lane> = (1..=n)
            .map(|i| Lane {
                name: render::worker_name(i),
                boot_s: 0.0,
                ready_s: None,
                signal_s: None,
                kill_s: None,
                exit_s: None,
            })
            .collect();
        let mut events = Vec::with_capacity(run.events.len());
        for e in &run.events {
            let at = e.at_s() as f64;
            let (kind, request, worker) = match *e {
                Event::Boot { worker, .. } => ("boot", None, worker),
                Event::Ready { worker, .. } => ("ready", None, worker),
                Event::Admit {
                    request, worker, ..
                } => ("admit", Some(request), worker),
                Event::Reject { request, .. } => ("reject", Some(request), 0),
                Event::Fail {
                    request, worker, ..
                } => ("fail", Some(request), worker),
                Event::Commit {
                    request, worker, ..
                } => ("commit", Some(request), worker),
                Event::Signal { worker, .. } => ("signal", None, worker),
                Event::Kill { worker, .. } => ("kill", None, worker),
                Event::Killed {
                    request, worker, ..
                } => ("killed", Some(request), worker),
                Event::Exit { worker, .. } => ("exit", None, worker),
            };
            if let Some(lane) = workers.get_mut((worker as usize).wrapping_sub(1)) {
                match kind {
                    "boot" => lane.boot_s = at,
                    "ready" => lane.ready_s = Some(at),
                    "signal" => lane.signal_s = Some(at),
                    "kill" => lane.kill_s = Some(at),
                    "exit" => lane.exit_s = Some(at),
                    _ => {}
                }
            }
            events.push(Step {
                at_s: at,
                kind: kind.into(),
                request,
                worker: (worker > 0).then(|| render::worker_name(worker)),
                text: render::describe(e, s.slots),
            });
        }
        let last = run.events.last().map_or(0, Event::at_s) as f64;
        Replay {
            title: "drainit-gate model".into(),
            subtitle: render::summary(s),
            horizon_s: MIN_HORIZON_S.max(last + 2.0),
            slots: s.slots,
            workers,
            requests: run
                .requests
                .iter()
                .map(|r| Row {
                    id: r.id,
                    arrived_s: r.arrived_s as f64,
                    worker: r.worker.map(render::worker_name),
                    end_s: r.end_s as f64,
                    status: r.status.as_str().into(),
                })
                .collect(),
            events,
            ledger: Counts {
                committed: run.ledger.committed,
                rejected: run.ledger.rejected,
                failed: run.ledger.failed,
                killed: run.ledger.killed,
                allowance: run.verdict.allowance,
            },
            verdict: Verdict {
                pass: run.verdict.pass,
                reasons: run.verdict.reasons.clone(),
            },
        }
    }

    /// The page: the template with this replay embedded as JSON. `<`, `>` and `&`
    /// are written as `\u003c`… so no string in the data can close the script
    /// element.
    pub fn html(&self) -> String {
        let data = serde_json::to_string(self)
            .expect("plain structs of numbers and strings serialize")
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026");
        TEMPLATE.replacen(SLOT, &data, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Settings, run};

    #[test]
    fn the_page_embeds_the_run_and_references_nothing_outside_itself() {
        let page = Replay::from_run(&run(&Settings::default())).html();
        assert!(!page.contains(SLOT), "the data slot was filled");
        assert!(page.contains("\"committed\":15"));
        for outside in ["http://", "https://", "src=", "@import", "url(", "<link"] {
            assert!(!page.contains(outside), "the page references {outside}");
        }
    }
}
