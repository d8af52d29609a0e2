//! Drain phases (docs/drain-phases.md): the `[[drain.phase]]` work that runs after the
//! pre-drain delay, while the app still serves, each a helper process or a POST
//! to the app, on one shared budget.
//!
//! Owns: starting a phase (a `command` in its own process group, registered with
//! the reaper in the same step as its spawn, with `DRAINIT_PHASE_BUDGET_MS`; a
//! `post` as a task of hyper's HTTP/1 client with a `Drainit-Phase-Budget-Ms`
//! header), its status, and what each phase left for the report (exit code,
//! status, error). The drain machine decides which phase runs, its time, when it
//! is canceled and when it is abandoned; the tree signals a phase's group
//! (`AppTree::cancel_helper`, `AppTree::kill_helper`) when the driver asks.
//!
//! Must not: signal anything itself, or wait for a process (the reaper does).
//!
//! Invariant: at most one phase runs at a time; a `command` phase's process group
//! is SIGKILLed by the tree once it ended (`AppTree::end_helper`), so what it
//! forked and left behind is never taken for the app's work.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use tokio::sync::oneshot;

use crate::config::{DrainPhase, PhaseAction};
use crate::drain::{ChildExit, PhaseEnd, PhaseRun};
use crate::reaper::Reaper;
use crate::spawn::{HelperOutput, Launcher};
use crate::tree::Helper;

/// The header a `post` phase is told its time in (milliseconds).
pub const BUDGET_HEADER: &str = "Drainit-Phase-Budget-Ms";
/// The variable a `command` phase is told its time in (milliseconds).
pub const BUDGET_ENV: &str = "DRAINIT_PHASE_BUDGET_MS";

/// How a phase ended, as the driver saw it.
#[derive(Debug)]
pub enum PhaseResult {
    /// A `command` phase's status (`None`: it will never come).
    Exit(Option<ChildExit>),
    /// A `post` phase's answer.
    Status(u16),
    /// A `post` that got no answer (refused, reset, a malformed URL).
    Error(String),
}

/// What one phase left for the report besides its end.
#[derive(Clone, Debug, Default)]
struct Detail {
    exit_code: Option<i32>,
    signal: Option<String>,
    status: Option<u16>,
    error: Option<String>,
}

/// The running phase.
struct Running {
    index: usize,
    /// The `command` phase's pid (its group's id) and the guard that kills its
    /// group once it ended.
    helper: Option<(i32, Helper)>,
    rx: Option<oneshot::Receiver<PhaseResult>>,
    /// The `post` task (aborted on cancel: the request is dropped).
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The drain phases of one run.
pub struct Phases {
    specs: Vec<DrainPhase>,
    launcher: Launcher,
    running: Option<Running>,
    details: Vec<Detail>,
}

impl Phases {
    /// The configured phases, none started; `launcher` starts `command` ones.
    pub fn new(specs: Vec<DrainPhase>, launcher: Launcher) -> Phases {
        let details = vec![Detail::default(); specs.len()];
        Phases {
            specs,
            launcher,
            running: None,
            details,
        }
    }

    /// The name of phase `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.specs[i].name
    }

    /// Starts phase `i`, told `budget`. Returns `Some(false)` when it could not
    /// be started (it failed at once), `None` when it runs: its end then
    /// arrives on [`Phases::wait`].
    pub fn start(
        &mut self,
        i: usize,
        budget: Duration,
        reaper: &Rc<RefCell<Reaper>>,
    ) -> Option<bool> {
        self.running = None;
        let ms = budget.as_millis().to_string();
        match &self.specs[i].action {
            PhaseAction::Command(argv) => {
                let spawned = {
                    let mut r = reaper.borrow_mut();
                    self.launcher
                        .spawn_helper_env(argv, HelperOutput::Inherit, &[(BUDGET_ENV, ms)])
                        .map(|pid| (pid, r.register(pid)))
                };
                match spawned {
                    Ok((pid, exit_rx)) => {
                        let (tx, rx) = oneshot::channel();
                        tokio::task::spawn_local(async move {
                            let _ = tx.send(PhaseResult::Exit(exit_rx.await.ok()));
                        });
                        self.running = Some(Running {
                            index: i,
                            helper: Some((pid, Helper::watch(pid, reaper.clone()))),
                            rx: Some(rx),
                            task: None,
                        });
                        None
                    }
                    Err(e) => {
                        let kind = crate::spawn::io_error_kind(&e);
                        self.details[i].error = Some(format!("could not be started: {kind}"));
                        Some(false)
                    }
                }
            }
            PhaseAction::Post(url) => {
                let (tx, rx) = oneshot::channel();
                let url = url.clone();
                let task = tokio::task::spawn_local(async move {
                    let _ = tx.send(post(&url, &ms).await);
                });
                self.running = Some(Running {
                    index: i,
                    helper: None,
                    rx: Some(rx),
                    task: Some(task),
                });
                None
            }
        }
    }

    /// The running phase's end; pending forever when none runs.
    pub async fn wait(&mut self) -> PhaseResult {
        match self.running.as_mut().and_then(|r| r.rx.as_mut()) {
            Some(rx) => rx.await.unwrap_or(PhaseResult::Exit(None)),
            None => std::future::pending().await,
        }
    }

    /// Whether a phase runs (and [`Phases::wait`] may yield).
    pub fn running(&self) -> bool {
        self.running.as_ref().is_some_and(|r| r.rx.is_some())
    }

    /// The running phase ended with `result`: recorded. Returns whether it
    /// succeeded, and the pid of a `command` phase, whose group the tree must
    /// now kill (`AppTree::end_helper`: what it left behind); `None` when none
    /// ran.
    pub fn finish(&mut self, result: PhaseResult) -> Option<(bool, Option<i32>)> {
        let run = self.running.take()?;
        let d = &mut self.details[run.index];
        let ok = match result {
            PhaseResult::Exit(Some(ChildExit::Code(n))) => {
                d.exit_code = Some(n);
                n == 0
            }
            PhaseResult::Exit(Some(ChildExit::Signal(s))) => {
                d.signal = Some(s.to_string());
                false
            }
            PhaseResult::Exit(None) => false,
            PhaseResult::Status(s) => {
                d.status = Some(s);
                s < 400
            }
            PhaseResult::Error(e) => {
                d.error = Some(e);
                false
            }
        };
        // The guard is dropped reaped: it kills nothing; the tree does.
        Some((ok, run.helper.map(|(pid, _)| pid)))
    }

    /// The running `command` phase's pid (its group's id), to signal.
    pub fn pid(&self) -> Option<i32> {
        self.running
            .as_ref()
            .and_then(|r| r.helper.as_ref().map(|h| h.0))
    }

    /// Cancels a running `post`: the request is dropped. Returns whether one was
    /// (it has ended: the driver tells the machine at once).
    pub fn drop_post(&mut self) -> bool {
        let Some(run) = &mut self.running else {
            return false;
        };
        let Some(task) = run.task.take() else {
            return false;
        };
        task.abort();
        run.rx = None;
        self.details[run.index].error = Some("request dropped".into());
        self.running = None;
        true
    }

    /// The running phase was SIGKILLed and is given up: forgotten (its reap, if
    /// it ever comes, is the reaper's; the guard kills its group again).
    pub fn abandon(&mut self) {
        self.running = None;
    }

    /// The report's `phases` list: one entry per phase reached, as the drain
    /// machine recorded it (`runs`, instants from the driver's epoch), times in
    /// ms since `t0`.
    pub fn report(&self, runs: &[PhaseRun], t0: Duration) -> Vec<crate::report::PhaseJson> {
        runs.iter()
            .enumerate()
            .map(|(i, run)| {
                let d = &self.details[i];
                crate::report::PhaseJson {
                    name: self.specs[i].name.clone(),
                    outcome: run.end.as_str(),
                    exit_code: d.exit_code,
                    signal: d.signal.clone(),
                    status: d.status,
                    error: d.error.clone(),
                    start_ms: run.started_at.saturating_sub(t0).as_millis() as u64,
                    duration_ms: run.ended_at.saturating_sub(run.started_at).as_millis() as u64,
                }
            })
            .collect()
    }

    /// The log line of phase `i`'s end; `cut`: a second drain signal canceled
    /// the phases (a skipped one says so, else it had under 100 ms left).
    pub fn end_line(&self, i: usize, run: &PhaseRun, cut: bool) -> String {
        let d = &self.details[i];
        let mut why = String::new();
        if let Some(n) = d.exit_code {
            why = format!(" (exit code {n})");
        } else if let Some(s) = &d.signal {
            why = format!(" (killed by {s})");
        } else if let Some(s) = d.status {
            why = format!(" (status {s})");
        } else if let Some(e) = &d.error {
            why = format!(" ({e})");
        }
        let took = crate::util::fmt_ms(run.ended_at.saturating_sub(run.started_at));
        match run.end {
            PhaseEnd::Skipped if !why.is_empty() => {
                format!("drain phase '{}' skipped{why}", self.specs[i].name)
            }
            PhaseEnd::Skipped if cut => format!(
                "drain phase '{}' skipped: a second drain signal canceled the phases",
                self.specs[i].name
            ),
            PhaseEnd::Skipped => format!(
                "drain phase '{}' skipped: under {} of the phase budget left",
                self.specs[i].name,
                crate::util::fmt_ms(crate::drain::PHASE_MIN)
            ),
            end => format!(
                "drain phase '{}' {} after {took}{why}",
                self.specs[i].name,
                end.as_str()
            ),
        }
    }
}

/// POSTs (empty body) to `url` with the budget header: the status, or why there
/// is none. Plain HTTP/1.1 over hyper's connection API.
async fn post(url: &str, budget_ms: &str) -> PhaseResult {
    match try_post(url, budget_ms).await {
        Ok(status) => PhaseResult::Status(status),
        Err(e) => PhaseResult::Error(e),
    }
}

async fn try_post(url: &str, budget_ms: &str) -> Result<u16, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    let host = uri
        .host()
        .ok_or("no host")?
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| crate::util::io_word_or_text(&e))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or(host);
    let req = hyper::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, authority)
        .header(BUDGET_HEADER, budget_ms)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    // Read the body to its end: the app's answer is complete, not cut.
    let _ = resp.into_body().collect().await;
    Ok(status)
}
