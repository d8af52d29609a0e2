//! The model of docs/gate.md: a pure function from [`Settings`] to a [`Run`] (every
//! request's outcome and the timeline of events), in whole seconds.
//!
//! What it owns: the rules of the drill, and only them. No clock, no I/O, no
//! formatting: the text, JSON and HTML outputs render the one [`Run`] this module
//! computes, never a second computation.
//!
//! The rules, each tie broken by a written rule so that any two models agree:
//!
//! - Workers W1…Wn boot at 0 s with `slots` invocation slots each and are ready
//!   from `startup` on (a worker is ready at second `t` when `t >= boot + startup`).
//! - Request #i (from 1) arrives at `first_at + (i - 1) * every` and runs
//!   `duration` seconds from its arrival; it commits only at its end.
//! - The router sees readiness and exits instantly. A worker that is down, not
//!   admitting (W1 after SIGTERM) or full (load = `slots`, load being the number of
//!   invocations running) is never a candidate. With `route_ready` only ready
//!   workers are candidates; without it readiness is not looked at, and a request
//!   sent to a worker not yet ready fails (500) at once and takes no slot. Among the
//!   candidates, the least loaded wins, ties to the lowest index; no candidate: a
//!   retryable 503 (rejected).
//! - W1 gets SIGTERM at `signal_at`. If it handles TERM it stops admitting and
//!   lets in-flight work finish; SIGKILL at `signal_at + grace` ends what still
//!   runs (killed; `grace 0` kills at the signal's own second); a draining W1 that
//!   has nothing left running exits (and is not killed). If it does not handle
//!   TERM it exits at the signal, killing its invocations.
//! - `replacement` boots W(n+1) at the signal, ready after `startup`.
//! - At one instant: completions first (and the exit of a W1 drained empty), then
//!   readiness, then the signal (and the replacement's boot), then SIGKILL, then
//!   arrivals in id order. So an invocation ending at the kill's second commits.
//! - The gate passes when nothing failed or was killed and
//!   `rejected * 100 <= allow_503 * requests`.
//!
//! Invariant: every request has exactly one outcome ([`Status`]) and one `end_s`.

use std::collections::BTreeSet;

use serde::Serialize;

/// The drill's knobs (docs/gate.md); [`Settings::default`] is the opening settings.
/// Every time is in whole seconds from the drill's start (0 s, when W1…Wn boot);
/// durations are whole seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// Workers booted at 0 s, W1…Wn (at least 1; W1 is the one signalled).
    pub workers: u32,
    /// Invocation slots per worker (at least 1).
    pub slots: u32,
    /// Requests in the drill (at least 1), numbered #1….
    pub requests: u32,
    /// Seconds between two arrivals (0: all arrive together, in id order).
    pub every_s: u64,
    /// When request #1 arrives.
    pub first_at_s: u64,
    /// How long each invocation runs (at least 1 s); it commits at its end.
    pub duration_s: u64,
    /// From boot to ready (readiness after start).
    pub startup_s: u64,
    /// When W1 gets SIGTERM.
    pub signal_at_s: u64,
    /// From SIGTERM to SIGKILL (`terminationGracePeriodSeconds`).
    pub grace_s: u64,
    /// W1 drains on SIGTERM (stops admitting, finishes in-flight work) rather than
    /// exiting at once.
    pub handles_term: bool,
    /// The router sends only to ready workers (else to any, and a request sent to a
    /// worker not ready fails).
    pub route_ready: bool,
    /// Rejections the clients may retry, in percent of the requests (0–100).
    pub allow_503_pct: u32,
    /// Boot W(n+1) at the signal (`maxSurge`).
    pub replacement: bool,
}

impl Default for Settings {
    /// The opening settings: 2 workers × 2 slots, 20 requests every 2 s from 1 s,
    /// 7 s invocations, startup 4 s, SIGTERM at 30 s, grace 5 s, handles TERM,
    /// route only to ready, allowance 0, no replacement.
    fn default() -> Self {
        Settings {
            workers: 2,
            slots: 2,
            requests: 20,
            every_s: 2,
            first_at_s: 1,
            duration_s: 7,
            startup_s: 4,
            signal_at_s: 30,
            grace_s: 5,
            handles_term: true,
            route_ready: true,
            allow_503_pct: 0,
            replacement: false,
        }
    }
}

/// A request's one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Its invocation finished: the result is committed.
    Committed,
    /// Answered 503 by the router (no candidate worker): a client may retry.
    Rejected,
    /// Answered 500 by a worker not yet ready (only without `route_ready`).
    Failed,
    /// Its invocation was running when its worker was killed (SIGKILL, or the exit
    /// of a worker that does not handle TERM): lost in flight.
    Killed,
}

impl Status {
    /// The word the outputs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Committed => "committed",
            Status::Rejected => "rejected",
            Status::Failed => "failed",
            Status::Killed => "killed",
        }
    }
}

/// One request's row: when it arrived, where it went, when it ended and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Request {
    /// 1-based.
    pub id: u32,
    /// Arrival, seconds from the start.
    pub arrived_s: u64,
    /// The worker's index (1 = W1) it was admitted by or sent to; `None` when the
    /// router rejected it.
    pub worker: Option<u32>,
    /// When its outcome was decided: the commit or the kill; the arrival for a
    /// rejection or a failure.
    pub end_s: u64,
    /// Its one outcome.
    pub status: Status,
}

/// Why a worker exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitCause {
    /// A draining W1 with nothing left running.
    Drained,
    /// SIGTERM, not handled: exited at the signal.
    Sigterm,
    /// SIGKILL at the end of the grace period.
    Sigkill,
}

/// One thing that happened, at a whole second. Serialized with a `kind` tag
/// (`boot`, `ready`, `admit`, `reject`, `fail`, `commit`, `signal`, `kill`,
/// `killed`, `exit`); `worker` is an index (1 = W1), `request` an id (1 = #1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A worker starts; it is ready from `ready_at_s`.
    Boot {
        at_s: u64,
        worker: u32,
        ready_at_s: u64,
    },
    /// A worker becomes ready.
    Ready { at_s: u64, worker: u32 },
    /// The router admits a request on a worker (`load` counts it); it would
    /// commit at `ends_at_s`.
    Admit {
        at_s: u64,
        request: u32,
        worker: u32,
        load: u32,
        ends_at_s: u64,
    },
    /// No candidate worker: 503, retryable.
    Reject { at_s: u64, request: u32 },
    /// Sent to a worker not yet ready: 500.
    Fail {
        at_s: u64,
        request: u32,
        worker: u32,
    },
    /// An invocation finished: committed.
    Commit {
        at_s: u64,
        request: u32,
        worker: u32,
    },
    /// SIGTERM to a worker; `running` lists the requests in flight on it.
    Signal {
        at_s: u64,
        worker: u32,
        handled: bool,
        running: Vec<u32>,
    },
    /// SIGKILL to a worker; `running` lists the requests it kills.
    Kill {
        at_s: u64,
        worker: u32,
        running: Vec<u32>,
    },
    /// A request lost in flight.
    Killed {
        at_s: u64,
        request: u32,
        worker: u32,
    },
    /// A worker is gone.
    Exit {
        at_s: u64,
        worker: u32,
        cause: ExitCause,
    },
}

impl Event {
    /// The second it happened at.
    pub fn at_s(&self) -> u64 {
        match self {
            Event::Boot { at_s, .. }
            | Event::Ready { at_s, .. }
            | Event::Admit { at_s, .. }
            | Event::Reject { at_s, .. }
            | Event::Fail { at_s, .. }
            | Event::Commit { at_s, .. }
            | Event::Signal { at_s, .. }
            | Event::Kill { at_s, .. }
            | Event::Killed { at_s, .. }
            | Event::Exit { at_s, .. } => *at_s,
        }
    }
}

/// The counts of each outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// Requests whose invocation finished.
    pub committed: u32,
    /// Requests answered 503 by the router (retryable).
    pub rejected: u32,
    /// Requests answered 500 by a worker not yet ready.
    pub failed: u32,
    /// Requests lost in flight.
    pub killed: u32,
}

/// The gate's decision and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Nothing failed or was killed, and the rejections are within the allowance.
    pub pass: bool,
    /// Most rejections the allowance accepts: `allow_503 * requests / 100`, rounded
    /// down.
    pub allowance: u32,
    /// One sentence per reason to fail (which requests were killed or failed, the
    /// rejections against the allowance), or one that says why it passes.
    pub reasons: Vec<String>,
}

/// A whole drill: every request's row (in id order), the events in the order they
/// happened, the ledger and the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The settings it ran with.
    pub settings: Settings,
    /// One row per request, `requests[i].id == i + 1`.
    pub requests: Vec<Request>,
    /// In the order they happened (times never decrease).
    pub events: Vec<Event>,
    /// The counts of `requests`' outcomes.
    pub ledger: Ledger,
    /// The gate's decision.
    pub verdict: Verdict,
}

/// A worker's state during the run.
struct Worker {
    ready_at_s: u64,
    up: bool,
    ready: bool,
    admitting: bool,
    /// (request id, end) of the invocations running, in admission order.
    running: Vec<(u32, u64)>,
}

/// Runs the scenario of docs/gate.md with `settings`.
///
/// Pure and total for any settings (zero counts give an empty drill; a duration
/// of 0 s is taken as 1 s, the shortest invocation the whole-second model has).
pub fn run(settings: &Settings) -> Run {
    let s = settings;
    let duration = s.duration_s.max(1);
    let arrival = |id: u32| s.first_at_s + u64::from(id - 1) * s.every_s;
    let kill_at = s.signal_at_s + s.grace_s;

    let mut events = Vec::new();
    let mut outcomes: Vec<Option<Request>> = vec![None; s.requests as usize];
    let mut workers: Vec<Worker> = Vec::new();
    let mut agenda: BTreeSet<u64> = BTreeSet::new();
    agenda.extend([0, s.startup_s, s.signal_at_s, kill_at]);
    agenda.extend((1..=s.requests).map(arrival));
    let mut next_arrival = 1u32;

    for w in 1..=s.workers {
        boot(&mut workers, &mut events, w, 0, s.startup_s);
    }
    while let Some(t) = agenda.pop_first() {
        // 1. Completions, then the exit of a draining W1 left with nothing.
        complete(&mut workers, &mut events, &mut outcomes, t);
        // 2. Readiness (a worker booting at this very second is made ready by its
        // boot, below).
        make_ready(&mut workers, &mut events, t);
        // 3. The signal, and the replacement's boot.
        if t == s.signal_at_s {
            signal(s, &mut workers, &mut events, &mut outcomes, &mut agenda, t);
        }
        // 4. SIGKILL at the end of the grace period, to a W1 still up.
        if t == kill_at
            && s.handles_term
            && let Some(w1) = workers.first_mut().filter(|w| w.up)
        {
            events.push(Event::Kill {
                at_s: t,
                worker: 1,
                running: w1.running.iter().map(|&(id, _)| id).collect(),
            });
            kill(w1, &mut events, &mut outcomes, t, ExitCause::Sigkill);
        }
        // 5. Arrivals, in id order.
        while next_arrival <= s.requests && arrival(next_arrival) == t {
            let id = next_arrival;
            next_arrival += 1;
            let row = arrive(s, &mut workers, &mut events, &mut agenda, id, t, duration);
            outcomes[id as usize - 1] = Some(row);
        }
    }

    let requests: Vec<Request> = outcomes
        .into_iter()
        .map(|r| r.expect("every arrival time is on the agenda, so every request arrived"))
        .collect();
    let ledger = tally(&requests);
    let verdict = judge(s, &requests, ledger);
    Run {
        settings: s.clone(),
        requests,
        events,
        ledger,
        verdict,
    }
}

/// Step 1 at `t`: the invocations ending now commit (in id order), then a
/// draining W1 left with nothing exits.
fn complete(
    workers: &mut [Worker],
    events: &mut Vec<Event>,
    outcomes: &mut [Option<Request>],
    t: u64,
) {
    let mut done: Vec<(u32, u32)> = Vec::new();
    for (i, w) in workers.iter_mut().enumerate() {
        w.running.retain(|&(id, end)| {
            if end == t {
                done.push((id, i as u32 + 1));
            }
            end != t
        });
    }
    done.sort_unstable();
    for &(id, w) in &done {
        events.push(Event::Commit {
            at_s: t,
            request: id,
            worker: w,
        });
        let r = outcomes[id as usize - 1]
            .as_mut()
            .expect("a running request was admitted, so it has a row");
        r.end_s = t;
        r.status = Status::Committed;
    }
    if let Some(w1) = workers.first_mut()
        && w1.up
        && !w1.admitting
        && w1.running.is_empty()
    {
        w1.up = false;
        events.push(Event::Exit {
            at_s: t,
            worker: 1,
            cause: ExitCause::Drained,
        });
    }
}

/// Step 2 at `t`: the workers whose startup ends now become ready.
fn make_ready(workers: &mut [Worker], events: &mut Vec<Event>, t: u64) {
    for (i, w) in workers.iter_mut().enumerate() {
        if w.up && !w.ready && w.ready_at_s == t {
            w.ready = true;
            events.push(Event::Ready {
                at_s: t,
                worker: i as u32 + 1,
            });
        }
    }
}

/// Step 3 at `t` (the signal's second): SIGTERM to W1, and the replacement's boot.
fn signal(
    s: &Settings,
    workers: &mut Vec<Worker>,
    events: &mut Vec<Event>,
    outcomes: &mut [Option<Request>],
    agenda: &mut BTreeSet<u64>,
    t: u64,
) {
    if let Some(w1) = workers.first_mut().filter(|w| w.up) {
        let running: Vec<u32> = w1.running.iter().map(|&(id, _)| id).collect();
        events.push(Event::Signal {
            at_s: t,
            worker: 1,
            handled: s.handles_term,
            running: running.clone(),
        });
        w1.admitting = false;
        if !s.handles_term {
            kill(w1, events, outcomes, t, ExitCause::Sigterm);
        } else if running.is_empty() {
            w1.up = false;
            events.push(Event::Exit {
                at_s: t,
                worker: 1,
                cause: ExitCause::Drained,
            });
        }
    }
    if s.replacement {
        let n = workers.len() as u32 + 1;
        boot(workers, events, n, t, s.startup_s);
        // Ready later: on the agenda (a 0 s startup is ready at its boot,
        // and this second is not processed twice).
        if s.startup_s > 0 {
            agenda.insert(t + s.startup_s);
        }
    }
}

/// Step 5 at `t`: request `id` arrives and is rejected (no worker takes it),
/// failed (routed to a worker not ready) or admitted to the least loaded worker,
/// its row provisional until its commit or a kill rewrites it.
fn arrive(
    s: &Settings,
    workers: &mut [Worker],
    events: &mut Vec<Event>,
    agenda: &mut BTreeSet<u64>,
    id: u32,
    t: u64,
    duration: u64,
) -> Request {
    let chosen = workers
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            w.up && w.admitting && (w.running.len() as u32) < s.slots && (w.ready || !s.route_ready)
        })
        // min_by_key keeps the first of equal keys: ties to the lowest index.
        .min_by_key(|(_, w)| w.running.len());
    match chosen {
        None => {
            events.push(Event::Reject {
                at_s: t,
                request: id,
            });
            Request {
                id,
                arrived_s: t,
                worker: None,
                end_s: t,
                status: Status::Rejected,
            }
        }
        Some((i, w)) if !w.ready => {
            let worker = i as u32 + 1;
            events.push(Event::Fail {
                at_s: t,
                request: id,
                worker,
            });
            Request {
                id,
                arrived_s: t,
                worker: Some(worker),
                end_s: t,
                status: Status::Failed,
            }
        }
        Some((i, _)) => {
            let worker = i as u32 + 1;
            let end = t + duration;
            let w = &mut workers[i];
            w.running.push((id, end));
            agenda.insert(end);
            events.push(Event::Admit {
                at_s: t,
                request: id,
                worker,
                load: w.running.len() as u32,
                ends_at_s: end,
            });
            // Provisional until the commit or the kill rewrites it.
            Request {
                id,
                arrived_s: t,
                worker: Some(worker),
                end_s: end,
                status: Status::Committed,
            }
        }
    }
}

fn boot(workers: &mut Vec<Worker>, events: &mut Vec<Event>, n: u32, t: u64, startup: u64) {
    let ready_at_s = t + startup;
    events.push(Event::Boot {
        at_s: t,
        worker: n,
        ready_at_s,
    });
    if startup == 0 {
        events.push(Event::Ready { at_s: t, worker: n });
    }
    workers.push(Worker {
        ready_at_s,
        up: true,
        ready: startup == 0,
        admitting: true,
        running: Vec::new(),
    });
}

/// W1 goes down at `t`, killing what it runs.
fn kill(
    w1: &mut Worker,
    events: &mut Vec<Event>,
    outcomes: &mut [Option<Request>],
    t: u64,
    cause: ExitCause,
) {
    for (id, _) in w1.running.drain(..) {
        events.push(Event::Killed {
            at_s: t,
            request: id,
            worker: 1,
        });
        let r = outcomes[id as usize - 1]
            .as_mut()
            .expect("a running request was admitted, so it has a row");
        r.end_s = t;
        r.status = Status::Killed;
    }
    w1.up = false;
    events.push(Event::Exit {
        at_s: t,
        worker: 1,
        cause,
    });
}

fn tally(requests: &[Request]) -> Ledger {
    let mut l = Ledger::default();
    for r in requests {
        match r.status {
            Status::Committed => l.committed += 1,
            Status::Rejected => l.rejected += 1,
            Status::Failed => l.failed += 1,
            Status::Killed => l.killed += 1,
        }
    }
    l
}

fn ids(requests: &[Request], status: Status) -> String {
    requests
        .iter()
        .filter(|r| r.status == status)
        .map(|r| format!("#{}", r.id))
        .collect::<Vec<_>>()
        .join(", ")
}

fn judge(s: &Settings, requests: &[Request], l: Ledger) -> Verdict {
    let allowance = (u64::from(s.allow_503_pct) * u64::from(s.requests) / 100) as u32;
    let within = u64::from(l.rejected) * 100 <= u64::from(s.allow_503_pct) * u64::from(s.requests);
    let mut reasons = Vec::new();
    if l.killed > 0 {
        reasons.push(format!(
            "{} killed in flight ({}): no allowance excuses a lost request",
            l.killed,
            ids(requests, Status::Killed)
        ));
    }
    if l.failed > 0 {
        reasons.push(format!(
            "{} failed with 500 ({}): sent to a worker not yet ready",
            l.failed,
            ids(requests, Status::Failed)
        ));
    }
    if !within {
        reasons.push(format!(
            "{} rejected ({}) > allowance {} ({}% of {})",
            l.rejected,
            ids(requests, Status::Rejected),
            allowance,
            s.allow_503_pct,
            s.requests
        ));
    }
    let pass = reasons.is_empty();
    if pass {
        reasons.push(format!(
            "every request accounted for: {} committed, {} rejected <= allowance {} ({}% of {}), nothing failed or killed",
            l.committed, l.rejected, allowance, s.allow_503_pct, s.requests
        ));
    }
    Verdict {
        pass,
        allowance,
        reasons,
    }
}
