//! The event loop: turns signals, reaped statuses and timers into events for the
//! drain state machine, and carries out its actions.
//!
//! Owns: the one task that reaps and the only place that kills. It runs on a
//! single-threaded tokio runtime; the probe server and the readiness poller are
//! other tasks on the same thread that only read what this loop publishes.
//!
//! Must not: decide policy (that is `drain.rs`) or await between reading a drain
//! signal and publishing `draining` (beat 1 is one synchronous step). After the
//! spawn nothing leaves this loop but the planned exit: errors are logged and the
//! loop carries on (catatonit's second error regime).
//!
//! Invariant: a pid is signalled only while it is known alive and unreaped: the
//! `/proc` snapshot and the `kill` happen in one synchronous step, with no reap in
//! between, and every process gets the drain signal from drainit at most once.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::checks::{self, Checks};
use crate::config::{Config, DelayRule, ForwardTo};
use crate::drain::{Action, ChildExit, DelayWhy, Drain, Event, Outcome, Phase, Policy};
use crate::metrics;
use crate::probe::Published;
use crate::procs;
use crate::reaper::Reaper;
use crate::report::{self, Facts, Ledger, Report, TeardownJson};
use crate::signals::{self, Signal, SignalStream};
use crate::spawn::{HelperOutput, spawn_helper};

/// A running teardown step.
struct Step {
    pid: Option<i32>,
    started: Instant,
    rx: Option<oneshot::Receiver<ChildExit>>,
}

/// What a finished teardown step left for the report.
struct StepDone {
    duration: Duration,
    exit: Option<ChildExit>,
    /// Why the step could not be started (`not found`, `permission denied`).
    spawn_error: Option<String>,
}

/// The supervisor's state. Build it with [`Supervisor::new`] right after the
/// spawn, then [`Supervisor::run`].
pub struct Supervisor {
    cfg: Config,
    drain: Drain,
    reaper: Rc<RefCell<Reaper>>,
    signals: SignalStream,
    state_tx: watch::Sender<Published>,
    child_pid: i32,
    child_alive: bool,
    me: i32,
    is_pid1: bool,
    epoch: Instant,
    ledger: Ledger,
    /// `/proc` shows this PID namespace (checked once at start): without it, no
    /// `/proc` pid may be trusted, and the drain falls back on the reaper alone.
    proc_ok: bool,
    /// The last scan found processes from outside the namespace (as PID 1): their
    /// end raises no SIGCHLD here, so `/proc` is polled while the drain waits.
    outsiders: bool,
    /// Processes that got the drain signal from drainit: `(pid, start)`.
    signalled: HashSet<(i32, u64)>,
    /// The descendants `SampleInFlight` just read, for a `SignalRemaining` of the
    /// same step (nothing was signalled in between): one /proc walk, not two.
    /// Cleared after every action list.
    sampled: Option<Vec<procs::Proc>>,
    queue: VecDeque<Event>,
    ready_rx: Option<oneshot::Receiver<()>>,
    step: Option<Step>,
    steps_done: Vec<StepDone>,
    outcome: Option<Outcome>,
    /// When the next drain progress line is due (from `epoch`); `None` outside
    /// beat 3 (no timer runs while idle).
    progress_at: Option<Duration>,
    /// A partial report is due in the report file once the current action list
    /// is carried out (at T0 and at the forward: after the forward, never before
    /// it, so the disk never delays a signal).
    partial_due: bool,
}

impl Supervisor {
    /// `child_pid` was just spawned and registered with `reaper`. `app_ready` is
    /// `Some` with `--ready-notify`: it yields at the app's first `READY=1`
    /// (`notify.rs`); readiness passes once it and every check have passed.
    pub fn new(
        cfg: Config,
        reaper: Rc<RefCell<Reaper>>,
        signals: SignalStream,
        state_tx: watch::Sender<Published>,
        checks: Rc<Checks>,
        app_ready: Option<oneshot::Receiver<()>>,
        child_pid: i32,
    ) -> Supervisor {
        let policy = Policy {
            pre_drain_delay: cfg.pre_drain_delay,
            delay_needs_routing: cfg.pre_drain_delay_rule == DelayRule::WhenRouted,
            drain_timeout: cfg.drain_timeout,
            teardown_timeouts: cfg.teardown.iter().map(|t| t.timeout).collect(),
            drain_signals: cfg.drain_signals.clone(),
            second_signal: cfg.second_signal,
            rewrite: cfg.rewrite.clone(),
        };
        let mut queue = VecDeque::new();
        let ready_rx = if checks.is_empty() && app_ready.is_none() {
            // Nothing configured: ready as soon as the child is spawned (DESIGN §7).
            queue.push_back(Event::ReadinessPassed);
            None
        } else {
            let (tx, rx) = oneshot::channel();
            let interval = cfg.ready_interval;
            tokio::task::spawn_local(async move {
                if !checks.is_empty() {
                    checks::wait_ready(checks, interval).await;
                }
                // A notify task that is gone never sent READY=1: never ready, and
                // `tx` is kept, since a dropped sender would wake the loop as Ready.
                if let Some(app_ready) = app_ready
                    && app_ready.await.is_err()
                {
                    std::future::pending::<()>().await;
                }
                let _ = tx.send(());
            });
            Some(rx)
        };
        let me = std::process::id() as i32;
        Supervisor {
            cfg,
            drain: Drain::new(policy),
            reaper,
            signals,
            state_tx,
            child_pid,
            child_alive: true,
            me,
            is_pid1: me == 1,
            epoch: Instant::now(),
            ledger: Ledger::default(),
            proc_ok: {
                let ok = procs::is_own_namespace();
                if !ok {
                    log::warn!(
                        "/proc is not this PID namespace's (mount a fresh /proc, e.g. unshare --mount-proc): \
                         descendants cannot be found; only the main child and reaped processes are tracked"
                    );
                }
                ok
            },
            outsiders: false,
            signalled: HashSet::new(),
            sampled: None,
            queue,
            ready_rx,
            step: None,
            steps_done: Vec::new(),
            outcome: None,
            progress_at: None,
            partial_due: false,
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Marks readiness as passed from elsewhere (sd_notify `READY=1`).
    pub fn readiness_passed(&mut self) {
        self.queue.push_back(Event::ReadinessPassed);
        self.process();
    }

    /// Runs until the drain machine says exit; returns the report to write.
    pub async fn run(mut self) -> Report {
        self.process();
        while self.outcome.is_none() {
            let deadline = self
                .drain
                .next_deadline()
                .map(|at| tokio::time::Instant::from_std(self.epoch + at));
            let polling = self.outsiders && self.drain.waits_for_descendants();
            if !self.drain.awaits_deadline() {
                self.progress_at = None;
            }
            let progress = self
                .progress_at
                .map(|at| tokio::time::Instant::from_std(self.epoch + at));
            let woke = {
                let signals = &mut self.signals;
                let ready_rx = &mut self.ready_rx;
                let step_rx = self.step.as_mut().and_then(|s| s.rx.as_mut());
                tokio::select! {
                    biased;
                    received = signals.recv() => Woke::Signals(received),
                    _ = async { ready_rx.as_mut().expect("guarded by the if").await }, if ready_rx.is_some() => Woke::Ready,
                    exit = wait_step(step_rx) => Woke::StepExited(exit),
                    _ = sleep_until(deadline), if deadline.is_some() => Woke::Tick,
                    _ = sleep_until(progress), if progress.is_some() => Woke::Progress,
                    _ = tokio::time::sleep(OUTSIDER_POLL), if polling => Woke::Poll,
                }
            };
            match woke {
                Woke::Signals(received) => {
                    let mut chld = false;
                    let mut stopped_with_us = None;
                    if received.iter().any(|r| r.signal == Signal::CHLD) {
                        // The main child may have exited before the other signals
                        // of this batch were sent: its exit comes first...
                        let exit = self.reaper.borrow_mut().reap_main();
                        match exit {
                            // ...unless a drain signal of this very batch killed it:
                            // the stop signal reached both at once (systemd's
                            // KillMode=control-group, `kill -TERM -- -PGID`). That is
                            // a drain, not a crash.
                            Some(ChildExit::Signal(s))
                                if self.cfg.drain_signals.contains(&s)
                                    && received.iter().any(|r| r.signal == s) =>
                            {
                                stopped_with_us = exit;
                            }
                            Some(exit) => self.main_exited(exit),
                            None => {}
                        }
                    }
                    for r in received {
                        if r.signal == Signal::CHLD {
                            chld = true;
                            continue;
                        }
                        metrics::signal_received(&r.signal.to_string());
                        if r.signal.is_reserved() {
                            log::warn!(
                                "ignored signal {} from pid {}: the C library keeps it for itself",
                                r.signal,
                                r.sender
                            );
                        } else {
                            log::debug!("received {} from pid {}", r.signal, r.sender);
                            if crate::probe::readyz_asked() {
                                // Before the signal: a T0 now decides the delay by it.
                                self.queue.push_back(Event::Routed);
                            }
                            self.queue.push_back(Event::Signal(r.signal));
                            // Beat 1 is taken before anything else, in this step.
                            self.process();
                        }
                    }
                    if let Some(exit) = stopped_with_us {
                        self.main_exited(exit);
                    }
                    if chld {
                        self.on_sigchld();
                    }
                }
                Woke::Ready => {
                    self.ready_rx = None;
                    log::info!("ready: every readiness check passed");
                    self.queue.push_back(Event::ReadinessPassed);
                }
                Woke::StepExited(exit) => self.finish_step(exit),
                Woke::Tick => self.queue.push_back(Event::Tick),
                Woke::Progress => self.log_progress(),
                Woke::Poll => self.check_descendants(false),
            }
            self.process();
        }
        self.report()
    }

    /// Feeds queued events to the machine and carries out its actions, until the
    /// queue is empty; then publishes the phase.
    fn process(&mut self) {
        while let Some(ev) = self.queue.pop_front() {
            let before = self.drain.phase();
            let actions = self.drain.handle(self.now(), ev);
            if self.drain.phase() != before {
                self.publish();
            }
            for a in actions {
                self.act(a);
            }
            self.sampled = None;
        }
        self.publish();
        if std::mem::take(&mut self.partial_due)
            && self.outcome.is_none()
            && let Some(path) = &self.cfg.report_file
        {
            self.partial_report().write_partial(path);
        }
    }

    /// About once a second in beat 3 (or the stop window), while anything is
    /// left: how many processes, the first few `pid comm`, and the time to the
    /// SIGKILL deadline (DESIGN §12). A 12 s wait must not be silent.
    fn log_progress(&mut self) {
        self.progress_at = None;
        if !self.drain.awaits_deadline() {
            return;
        }
        let now = self.now();
        self.progress_at = Some(now + PROGRESS_EVERY);
        // An unreadable /proc was logged by `descendants`; the next line retries.
        let Some(left) = self.descendants() else {
            return;
        };
        if left.is_empty() {
            return;
        }
        let mut named: Vec<String> = left
            .iter()
            .take(PROGRESS_NAMED)
            .map(|p| format!("{} {}", p.pid, p.comm))
            .collect();
        if left.len() > PROGRESS_NAMED {
            named.push(format!("and {} more", left.len() - PROGRESS_NAMED));
        }
        let to_deadline = self
            .drain
            .timeline()
            .deadline
            .unwrap_or_default()
            .saturating_sub(now);
        // Whole tenths of a second: "1.9s", not "1.873s".
        let to_deadline = Duration::from_millis(to_deadline.as_millis() as u64 / 100 * 100);
        log::info!(
            "{}: {} process(es) left ({}); SIGKILL in {}",
            self.drain.phase().as_str(),
            left.len(),
            named.join(", "),
            checks::fmt_ms(to_deadline)
        );
    }

    /// The report so far, for the report file (`"final":false`).
    fn partial_report(&self) -> Report {
        Report::from_facts(Facts {
            outcome: None,
            phase: self.drain.phase(),
            signal: self.drain.drain_signal(),
            child_pid: self.child_pid,
            child_exit: self.drain.child_exit(),
            timeline: self.drain.timeline(),
            ledger: &self.ledger,
            teardown: Vec::new(),
            orphans: self.reaper.borrow().orphans(),
        })
    }

    fn publish(&self) {
        let phase = self.drain.phase();
        self.state_tx.send_if_modified(|p| {
            let changed = p.phase != phase;
            p.phase = phase;
            changed
        });
    }

    fn helpers(&self) -> HashSet<i32> {
        self.reaper.borrow().helpers().collect()
    }

    /// The live descendants, or `None` when `/proc` could not be read (logged):
    /// then nothing may be concluded, least of all that none is left.
    fn descendants(&self) -> Option<Vec<procs::Proc>> {
        if !self.proc_ok {
            return None;
        }
        // Not PID 1 and no child at all: nothing below drainit is left (it is a
        // subreaper, see `reaper::has_children`). One syscall instead of a walk.
        if !self.is_pid1 && !crate::reaper::has_children() {
            return Some(Vec::new());
        }
        match procs::descendants(self.me, &self.helpers()) {
            Ok(v) => Some(v),
            Err(e) => {
                log::error!("reading /proc to find descendants failed: {e}");
                None
            }
        }
    }

    /// Why the pre-drain delay at T0 is what it is, for the T0 log line.
    fn delay_why(&self) -> &'static str {
        match (self.drain.delay_why(), self.cfg.pre_drain_delay_rule) {
            (Some(DelayWhy::NeverReady), _) => "readiness never passed: nothing was routed here",
            (Some(DelayWhy::Routed), _) => "default pre-drain delay: a client asked /readyz",
            (Some(DelayWhy::NotRouted), _) => {
                "default pre-drain delay 0: not in Kubernetes and no client asked /readyz"
            }
            (_, DelayRule::Kubernetes) => "default pre-drain delay: in Kubernetes",
            _ => "pre-drain delay as configured",
        }
    }

    fn forward_target(&self) -> i32 {
        match self.cfg.forward_to {
            ForwardTo::Child => self.child_pid,
            ForwardTo::Group => -self.child_pid,
        }
    }

    fn send(&self, target: i32, sig: Signal) {
        match signals::send(target, sig) {
            Ok(()) => {}
            // ESRCH: the target is already gone (it races with its own exit).
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => log::warn!("sending {sig} to {target} failed: {e}"),
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Forward(sig) => {
                if self.child_alive {
                    log::debug!("forwarding {sig} to {}", self.forward_target());
                    self.send(self.forward_target(), sig);
                    metrics::signal_forwarded(&sig.to_string());
                } else if self.cfg.forward_to == ForwardTo::Group
                    && self
                        .descendants()
                        .is_some_and(|v| v.iter().any(|p| p.pgid == self.child_pid))
                {
                    // The leader is gone but its group lives on (a group id is
                    // not reused while a member exists, and a member was just seen).
                    log::debug!("forwarding {sig} to process group {}", self.child_pid);
                    self.send(-self.child_pid, sig);
                    metrics::signal_forwarded(&sig.to_string());
                } else {
                    log::debug!("{sig} not forwarded: the main child is gone");
                }
            }
            Action::SampleInFlight => {
                let alive = self.descendants().unwrap_or_default();
                self.sampled = Some(alive.clone());
                self.ledger.sample(alive.iter().map(procs::Proc::id));
                let t = self.drain.timeline();
                // Evidence for a platform that SIGKILLs drainit mid-drain.
                self.partial_due = self.drain.drain_signal().is_some();
                match self.drain.drain_signal() {
                    Some(sig) => log::info!(
                        "drain started by {sig}: readiness fails now; {} in flight; forwarding in {} ({}), deadline in {}",
                        alive.len(),
                        checks::fmt_ms(t.pre_drain_delay),
                        self.delay_why(),
                        checks::fmt_ms(
                            t.deadline
                                .unwrap_or_default()
                                .saturating_sub(t.t0.unwrap_or_default())
                        )
                    ),
                    None if alive.is_empty() => {}
                    None => log::info!(
                        "no drain signal: the {} process(es) left get the drain signal and {} to finish",
                        alive.len(),
                        checks::fmt_ms(self.cfg.drain_timeout)
                    ),
                }
            }
            Action::ForwardDrain(sig) => {
                let target = self.forward_target();
                let mut stopped = false;
                for p in self.descendants().unwrap_or_default() {
                    if p.pid == self.child_pid || (target < 0 && p.pgid == self.child_pid) {
                        self.signalled.insert(p.id());
                        stopped |= p.stopped;
                    }
                }
                log::info!(
                    "forwarding {sig} to {} {}",
                    if target < 0 { "process group" } else { "child" },
                    target.abs()
                );
                self.send(target, sig);
                metrics::signal_forwarded(&sig.to_string());
                self.progress_at.get_or_insert(self.now() + PROGRESS_EVERY);
                self.partial_due = true;
                if stopped {
                    // A stopped process cannot act on the drain signal: wake it, as
                    // systemd does after SIGTERM (systemd.kill(5), SendSIGCONT=).
                    self.send(target, Signal::CONT);
                }
            }
            Action::SignalRemaining(sig) => {
                self.signal_remaining(sig);
                self.progress_at.get_or_insert(self.now() + PROGRESS_EVERY);
                // At the forward when the main child went during the delay.
                self.partial_due |= self.drain.drain_signal().is_some();
            }
            Action::KillAll => self.kill_all(),
            Action::StartTeardown(i) => {
                // The drain is over: a teardown step's processes are not part of it.
                self.ledger.close();
                self.start_step(i);
            }
            Action::KillTeardown(i) => {
                if let Some(pid) = self.step.as_ref().and_then(|s| s.pid)
                    && self.reaper.borrow().is_waiting(pid)
                {
                    log::warn!(
                        "teardown step '{}' is being killed",
                        self.cfg.teardown[i].name
                    );
                    self.send(-pid, Signal::KILL);
                }
            }
            Action::Exit(outcome) => self.outcome = Some(outcome),
        }
    }

    /// Every descendant alive now and not yet signalled by drainit gets the
    /// leftover signal. Called once, when the main child is gone (or at the
    /// forward, if it went during the pre-drain delay): processes created later
    /// were started by a process already draining (a cleanup hook's `curl`, a
    /// trap's `sleep`) and are part of its drain, so they are waited for, not
    /// signalled, and SIGKILLed only at the deadline.
    fn signal_remaining(&mut self, sig: Signal) {
        // Unreadable /proc (logged): the deadline still SIGKILLs what is left.
        let left = match self.sampled.take() {
            Some(v) => v,
            None => self.descendants().unwrap_or_default(),
        };
        for p in left {
            if self.signalled.insert(p.id()) {
                log::info!("sending {sig} to remaining process {} ({})", p.pid, p.comm);
                self.send(p.pid, sig);
                metrics::signal_forwarded(&sig.to_string());
                if p.stopped {
                    self.send(p.pid, Signal::CONT);
                }
            }
        }
    }

    fn kill_all(&mut self) {
        self.ledger.close();
        let mut killed = 0;
        // A few rounds: a process may fork between the snapshot and its SIGKILL.
        for _ in 0..3 {
            let Some(left) = self.descendants() else {
                // Unreadable /proc: what can still be reached is the main child
                // and its group (and, as PID 1, everything, below).
                if self.child_alive {
                    self.ledger.abandon(
                        self.child_pid,
                        procs::comm(self.child_pid).unwrap_or_default(),
                    );
                    killed += 1;
                    self.send(self.child_pid, Signal::KILL);
                }
                self.send(-self.child_pid, Signal::KILL);
                break;
            };
            if left.is_empty() {
                break;
            }
            // Process groups led by a descendant (or the main child's, whose
            // leader may be gone) also catch what forks between snapshot and kill.
            let pids: HashSet<i32> = left.iter().map(|p| p.pid).collect();
            let groups: HashSet<i32> = left
                .iter()
                .map(|p| p.pgid)
                .filter(|g| pids.contains(g) || *g == self.child_pid)
                .collect();
            for p in left {
                if !self.ledger.abandoned().iter().any(|a| a.pid == p.pid) {
                    killed += 1;
                }
                self.ledger.abandon(p.pid, p.comm.clone());
                // Killed: it gets no drain signal after this.
                self.signalled.insert(p.id());
                self.send(p.pid, Signal::KILL);
            }
            for g in groups {
                self.send(-g, Signal::KILL);
            }
        }
        if self.is_pid1 {
            // As PID 1, -1 means every process of this PID namespace but drainit
            // (kill(2)); never used outside PID 1, where it would reach processes
            // drainit did not start.
            let _ = signals::send(-1, Signal::KILL);
        }
        if killed > 0 {
            let names: Vec<String> = self
                .ledger
                .abandoned()
                .iter()
                .map(|a| format!("{} ({})", a.pid, a.comm))
                .collect();
            log::warn!(
                "abandoned: SIGKILLed {killed} process(es): {}",
                names.join(", ")
            );
        }
        self.queue.push_back(Event::Killed(killed));
    }

    fn start_step(&mut self, i: usize) {
        // The previous step was killed but never reaped (the machine gave up
        // after its settle time): account for it before the next one starts.
        if let Some(old) = self.step.take() {
            self.steps_done.push(StepDone {
                duration: old.started.elapsed(),
                exit: None,
                spawn_error: None,
            });
        }
        let step = &self.cfg.teardown[i];
        log::info!("teardown step '{}' starting", step.name);
        let started = Instant::now();
        let spawned = {
            let mut reaper = self.reaper.borrow_mut();
            spawn_helper(&step.argv, HelperOutput::Inherit).map(|pid| (pid, reaper.register(pid)))
        };
        match spawned {
            Ok((pid, rx)) => {
                self.step = Some(Step {
                    pid: Some(pid),
                    started,
                    rx: Some(rx),
                })
            }
            Err(e) => {
                log::error!(
                    "teardown step '{}' could not be started: {}",
                    step.name,
                    crate::spawn::io_error_kind(&e)
                );
                self.step = Some(Step {
                    pid: None,
                    started,
                    rx: None,
                });
                self.finish_step(None);
                if let Some(done) = self.steps_done.last_mut() {
                    done.spawn_error = Some(crate::spawn::io_error_kind(&e));
                }
            }
        }
    }

    fn finish_step(&mut self, exit: Option<ChildExit>) {
        let Some(step) = self.step.take() else { return };
        let ok = exit == Some(ChildExit::Code(0));
        self.steps_done.push(StepDone {
            duration: step.started.elapsed(),
            exit,
            spawn_error: None,
        });
        self.queue.push_back(Event::TeardownExited { ok });
    }

    fn on_sigchld(&mut self) {
        let round = self.reaper.borrow_mut().reap();
        for (pid, _) in &round.orphans {
            self.ledger.ended(*pid);
        }
        if !round.orphans.is_empty() {
            metrics::set_orphans_reaped(self.reaper.borrow().orphans());
        }
        if let Some(exit) = round.main {
            self.main_exited(exit);
        }
        self.check_descendants(round.none_left);
    }

    /// While the drain waits for descendants: notice when none is left.
    /// `none_left`: the reaper saw `ECHILD`.
    ///
    /// Checking on SIGCHLD is enough: the last descendant to end is always a child
    /// of drainit (its parent is gone, so it was re-parented to drainit), and its
    /// end raises SIGCHLD here. No timer is needed.
    fn check_descendants(&mut self, none_left: bool) {
        if !self.drain.waits_for_descendants() {
            return;
        }
        // ECHILD is conclusive unless, as PID 1, processes from outside the
        // namespace (never drainit's children) may be left: then /proc decides.
        if none_left && (!self.is_pid1 || !self.proc_ok) {
            self.queue.push_back(Event::DescendantsGone);
            return;
        }
        let left = self.descendants();
        self.outsiders = left.as_deref().is_some_and(procs::any_from_outside);
        if left.is_some_and(|v| v.is_empty()) {
            self.queue.push_back(Event::DescendantsGone);
        }
    }

    fn main_exited(&mut self, exit: ChildExit) {
        self.child_alive = false;
        self.ledger.ended(self.child_pid);
        log::info!(
            "main child {} exited ({})",
            self.child_pid,
            describe_exit(exit)
        );
        self.queue.push_back(Event::ChildExited(exit));
        self.process();
    }

    fn report(&mut self) -> Report {
        let outcome = self.outcome.expect("run() returns only after Exit");
        if let Some(alive) = self.descendants() {
            let alive: HashSet<(i32, u64)> = alive.iter().map(procs::Proc::id).collect();
            self.ledger.settle(&alive);
        }
        let timeouts: Vec<Duration> = self.cfg.teardown.iter().map(|t| t.timeout).collect();
        let teardown: Vec<TeardownJson> = self
            .drain
            .teardown()
            .iter()
            .enumerate()
            .map(|(i, end)| {
                let done = self.steps_done.get(i);
                TeardownJson {
                    name: self.cfg.teardown[i].name.clone(),
                    ok: *end == crate::drain::StepEnd::Ok,
                    duration_ms: done.map_or(0, |d| d.duration.as_millis() as u64),
                    error: match done.and_then(|d| d.spawn_error.as_ref()) {
                        Some(kind) => Some(format!("could not be started: {kind}")),
                        None => report::step_error(*end, done.and_then(|d| d.exit), timeouts[i]),
                    },
                }
            })
            .collect();
        let t = self.drain.timeline();
        match outcome.reason {
            crate::drain::Reason::Drained => log::info!(
                "drained: {} process(es) finished in {}",
                self.ledger.completed(),
                checks::fmt_ms(
                    t.finished_at
                        .unwrap_or_default()
                        .saturating_sub(t.t0.unwrap_or_default())
                )
            ),
            crate::drain::Reason::Abandoned => {
                log::warn!(
                    "abandoned: {} process(es) had to be killed",
                    self.ledger.abandoned().len()
                )
            }
            _ => {}
        }
        log::info!("exit {} ({})", outcome.code, outcome.reason.as_str());
        Report::from_facts(Facts {
            outcome: Some(outcome),
            phase: self.drain.phase(),
            signal: self.drain.drain_signal(),
            child_pid: self.child_pid,
            child_exit: self.drain.child_exit(),
            timeline: t,
            ledger: &self.ledger,
            teardown,
            orphans: self.reaper.borrow().orphans(),
        })
    }

    /// The current phase (for tests and the notify relay).
    pub fn phase(&self) -> Phase {
        self.drain.phase()
    }
}

/// What woke the loop.
enum Woke {
    Signals(Vec<signals::Received>),
    Ready,
    StepExited(Option<ChildExit>),
    Tick,
    Progress,
    Poll,
}

/// How often a drain progress line is logged while processes remain.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How many `pid comm` a progress line names.
const PROGRESS_NAMED: usize = 5;

/// How often `/proc` is read while processes from outside the namespace remain in
/// a drain (their end raises no SIGCHLD in drainit). Never while idle.
const OUTSIDER_POLL: Duration = Duration::from_millis(100);

/// The running teardown step's status; pending forever when there is none.
async fn wait_step(rx: Option<&mut oneshot::Receiver<ChildExit>>) -> Option<ChildExit> {
    match rx {
        Some(rx) => rx.await.ok(),
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn describe_exit(e: ChildExit) -> String {
    match e {
        ChildExit::Code(n) => format!("exit code {n}"),
        ChildExit::Signal(s) => format!("killed by {s}"),
    }
}
