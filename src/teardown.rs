//! Teardown: the `[[teardown]]` steps that run in order once the drain is over
//! (docs/processes-and-signals.md), each a helper process bounded by its timeout.
//!
//! Owns: starting a step (registered with the reaper in the same step as its
//! spawn), its status channel, and what each step left for the report (duration,
//! status, why it could not start). The drain machine decides which step runs,
//! when one is out of time and when the rest is skipped; the tree kills a step
//! out of time (`AppTree::kill_helper`) when the driver asks.
//!
//! Invariant: at most one step runs at a time, and every step started is accounted
//! for in the report, reaped or not.

use std::cell::RefCell;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::TeardownStep;
use crate::drain::{ChildExit, StepEnd};
use crate::reaper::Reaper;
use crate::report::{self, TeardownJson};
use crate::spawn::{HelperOutput, Launcher};

/// A running step.
struct Running {
    pid: Option<i32>,
    started: Instant,
    rx: Option<oneshot::Receiver<ChildExit>>,
}

/// What a finished step left for the report.
struct Done {
    duration: Duration,
    exit: Option<ChildExit>,
    /// Why the step could not be started (`not found`, `permission denied`).
    spawn_error: Option<String>,
}

/// The teardown steps of one run.
pub struct Teardown {
    steps: Vec<TeardownStep>,
    /// Starts the steps.
    launcher: Launcher,
    running: Option<Running>,
    done: Vec<Done>,
}

impl Teardown {
    /// The configured steps, none started; `launcher` starts them.
    pub fn new(steps: Vec<TeardownStep>, launcher: Launcher) -> Teardown {
        Teardown {
            steps,
            launcher,
            running: None,
            done: Vec::new(),
        }
    }

    /// Starts step `i`. Returns `Some(false)` when it could not be started (it
    /// ended at once, failed), `None` when it runs: its status then arrives on
    /// [`Teardown::status`].
    pub fn start(&mut self, i: usize, reaper: &RefCell<Reaper>) -> Option<bool> {
        // The previous step was killed but never reaped (the machine gave up
        // after its settle time): account for it before the next one starts.
        if let Some(old) = self.running.take() {
            self.done.push(Done {
                duration: old.started.elapsed(),
                exit: None,
                spawn_error: None,
            });
        }
        let step = &self.steps[i];
        log::info!("teardown step '{}' starting", step.name);
        let started = Instant::now();
        let spawned = {
            let mut reaper = reaper.borrow_mut();
            self.launcher
                .spawn_helper(&step.argv, HelperOutput::Inherit)
                .map(|pid| (pid, reaper.register(pid)))
        };
        match spawned {
            Ok((pid, rx)) => {
                self.running = Some(Running {
                    pid: Some(pid),
                    started,
                    rx: Some(rx),
                });
                None
            }
            Err(e) => {
                let kind = crate::spawn::io_error_kind(&e);
                log::error!("teardown step '{}' could not be started: {kind}", step.name);
                self.done.push(Done {
                    duration: started.elapsed(),
                    exit: None,
                    spawn_error: Some(kind),
                });
                Some(false)
            }
        }
    }

    /// The running step ended (`exit`), or its status will never come (`None`).
    /// Returns whether it exited 0; `None` when no step was running.
    pub fn finish(&mut self, exit: Option<ChildExit>) -> Option<bool> {
        let step = self.running.take()?;
        self.done.push(Done {
            duration: step.started.elapsed(),
            exit,
            spawn_error: None,
        });
        Some(exit == Some(ChildExit::Code(0)))
    }

    /// The running step's status channel, if a step runs.
    pub fn status(&mut self) -> Option<&mut oneshot::Receiver<ChildExit>> {
        self.running.as_mut().and_then(|s| s.rx.as_mut())
    }

    /// The running step's pid (its process group leader), if it was started.
    pub fn running_pid(&self) -> Option<i32> {
        self.running.as_ref().and_then(|s| s.pid)
    }

    /// The name of step `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.steps[i].name
    }

    /// The report's `teardown` list: one entry per step reached, as the drain
    /// machine recorded its end (`ends`).
    pub fn report(&self, ends: &[StepEnd]) -> Vec<TeardownJson> {
        ends.iter()
            .enumerate()
            .map(|(i, end)| {
                let done = self.done.get(i);
                TeardownJson {
                    name: self.steps[i].name.clone(),
                    ok: *end == StepEnd::Ok,
                    duration_ms: done.map_or(0, |d| d.duration.as_millis() as u64),
                    error: match done.and_then(|d| d.spawn_error.as_ref()) {
                        Some(kind) => Some(format!("could not be started: {kind}")),
                        None => report::step_error(
                            *end,
                            done.and_then(|d| d.exit),
                            self.steps[i].timeout,
                        ),
                    },
                }
            })
            .collect()
    }
}
