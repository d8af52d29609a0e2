//! The driver, the event loop: wake-ups (signals, reaped statuses, timers, a
//! teardown step's end, readiness, a client asking `/readyz`) → events for the
//! drain state machine → its actions → effects: on the process tree (through
//! [`AppTree`], which decides who gets each signal and sends it), the published
//! phase, the proxy's gate and the report.
//!
//! Owns: the one task that reaps, the order of each step (beat 1's line before
//! the forward's), and the timers (progress lines, the outsiders' poll). It runs
//! on a single-threaded tokio runtime; the probe server and the readiness poller
//! are other tasks on the same thread that only read what this loop publishes.
//!
//! Must not: decide policy (that is `drain.rs`: the order of a signal batch, when
//! to forward, to kill, to extend the kill's settle, to write a partial report,
//! the exit code), decide or send a signal (that is `tree.rs`), or await between
//! reading a drain signal and publishing `draining` (beat 1 is one synchronous
//! step). After the spawn nothing leaves this loop but the planned exit: errors
//! are logged and the loop carries on (catatonit's second error regime).
//!
//! Invariant: each action list is carried out in order within one synchronous
//! step, and what the step counts (beat 1's in-flight count, its line) comes at
//! its end, after the signals the step sent: signal first, account after.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{oneshot, watch};

use crate::checks::{self, Checks};
use crate::config::{Config, DelayRule, ForwardTo};
use crate::drain::{
    Action, ChildExit, DelayWhy, Drain, Event, Outcome, Phase, PhaseEnd, Policy, Start, State,
};
use crate::metrics::Metrics;
use crate::phases::{PhaseResult, Phases};
use crate::proxy::{Gate, Proxy};
use crate::published::Published;
use crate::reaper::{Reaper, Unreaped};
use crate::report::{Facts, Report};
use crate::signals::{self, Signal, SignalStream, SignalThread};
use crate::spawn::Launcher;
use crate::teardown::Teardown;
use crate::tree::{AppTree, AtOnce, Kills, Real, Tree};
use crate::util::{fmt_ms, sleep_until};

/// Where the driver reads signals from.
pub enum Signals {
    /// The signals' thread (drainit itself): what it sent on at once is marked.
    Thread(SignalThread),
    /// The signalfd on the runtime (drainit itself, when the thread could not
    /// be started).
    Fd(SignalStream),
    /// Nothing: only while the signalfd moves to its thread.
    Idle,
    /// Batches sent on a channel (the driver's tests, with a fake tree). A closed
    /// channel never yields.
    Channel(tokio::sync::mpsc::UnboundedReceiver<Vec<signals::Received>>),
}

impl Signals {
    /// The next batch of signals read at once; `at_once` sees it first (see
    /// [`SignalStream::recv`]).
    async fn recv(
        &mut self,
        mut at_once: impl FnMut(&mut [signals::Received]),
    ) -> Vec<signals::Received> {
        match self {
            Signals::Thread(t) => {
                let mut batch = t.recv().await;
                at_once(&mut batch);
                batch
            }
            Signals::Fd(fd) => fd.recv(at_once).await,
            Signals::Idle => std::future::pending().await,
            Signals::Channel(rx) => match rx.recv().await {
                Some(mut batch) => {
                    at_once(&mut batch);
                    batch
                }
                None => std::future::pending().await,
            },
        }
    }
}

/// Signal first: the signals of one read that the machine forwards whatever the
/// phase ([`Drain::forwarded_at_once`]) go to the main child as soon as they are
/// read, ahead of the loop's turn; the step that takes the batch accounts for
/// them ([`Driver::on_signal`]). A read with SIGCHLD or a drain signal goes the
/// whole way, in the kernel's order: the main child's exit read with it is
/// ordered against its signals first, and a drain signal's beat 1 comes before
/// anything else (systemd and `timeout(1)` send SIGCONT right after SIGTERM).
/// The signals' thread applies the same rule as it reads ([`crate::tree::AtOnce`]),
/// while no read it handed the loop is still waiting for the loop's step; what
/// it left unsent because one was is sent here, after that step.
fn forward_at_once(batch: &mut [signals::Received], drain: &Drain, app: &AppTree) {
    if batch
        .iter()
        .any(|r| r.signal == Signal::CHLD || drain.is_drain_signal(r.signal))
    {
        return;
    }
    let mut sent = false;
    for r in batch {
        // Sent already by the signals' thread.
        if r.signal.is_reserved() || r.forwarded.is_some() {
            continue;
        }
        if let Some(to) = drain.forwarded_at_once(r.signal)
            && app.forward_at_once(to)
        {
            r.forwarded = Some(to);
            sent = true;
        }
    }
    if sent {
        // The app was just woken, often onto this CPU (the scheduler places a
        // wakee near its waker): it runs before the rest of this turn, as at
        // beat 3's forward (sched_yield(2)).
        std::thread::yield_now();
    }
}

/// What the signals' thread will forward by itself ([`AtOnce`]): to the main
/// child `pid`'s target, which the reaper holds while it waits.
fn at_once_of(cfg: &Config, reaper: &RefCell<Reaper>, pid: i32) -> AtOnce {
    let to_group = cfg.forward_to == ForwardTo::Group;
    let unreaped = Arc::new(Unreaped::new(AppTree::target_of(pid, to_group)));
    reaper.borrow_mut().share_main(unreaped.clone());
    AtOnce::new(unreaped, &cfg.drain_signals, &cfg.rewrite)
}

/// What readiness first passing waits for (docs/probes.md).
pub struct Readiness {
    /// The configured checks (none: only `app_ready`, or ready at once).
    pub checks: Rc<Checks>,
    /// With `--ready-notify`: yields at the app's first `READY=1` (`notify.rs`).
    pub app_ready: Option<oneshot::Receiver<()>>,
}

/// What wakes the loop besides its timers.
struct Inputs {
    signals: Signals,
    /// The signals' thread, started after the first read the loop forwarded
    /// at once: an app never sent such a signal never costs drainit a thread
    /// (start-up, memory). `None` once started or refused, and in tests.
    signal_thread: Option<AtOnce>,
    /// What readiness waits for, until [`Driver::run`] starts its task.
    readiness: Option<Readiness>,
    /// Yields once readiness passed (the task [`Driver::run`] starts).
    ready_rx: Option<oneshot::Receiver<()>>,
    /// The last reap round was full: another runs once the other wake-ups (a
    /// signal, a deadline) had their turn.
    reap_more: bool,
    /// Turns `true` when a client first asks `/readyz` (or the proxy's health
    /// path): `Event::Routed`. `None` once received, or when nothing can ask.
    readyz_asked: Option<watch::Receiver<bool>>,
}

/// What one step (one action list) leaves for its end, and the progress timer.
#[derive(Default)]
struct Due {
    /// `SampleInFlight` was asked for in this step: the T0 count is taken at the
    /// end of the step, after the signal the step sends.
    sample: Option<Start>,
    /// The line of a forward made in the same step as `sample`: logged after
    /// beat 1's line, which announces it.
    forward_line: Option<String>,
    /// Admission closed in this step: logged at its end.
    admission_log: bool,
    /// The drain phases ended in this step, maybe after the main child: what
    /// is left may be gone too (no SIGCHLD will tell), looked at the step's end.
    recheck: bool,
    /// A partial report is due in the report file once the current action list
    /// is carried out (at T0 and at the forward: after the forward, never before
    /// it, so the disk never delays a signal).
    partial: bool,
    /// When the next drain progress line is due (from `epoch`); `None` outside
    /// beat 3 (no timer runs while idle).
    progress_at: Option<Duration>,
}

/// The supervisor's state. Build it with [`Driver::new`] right after the
/// spawn, then [`Driver::run`].
pub struct Driver {
    cfg: Config,
    drain: Drain,
    /// The app's processes: every `/proc` read and every signal goes through it.
    app: AppTree,
    reaper: Rc<RefCell<Reaper>>,
    inputs: Inputs,
    state_tx: watch::Sender<Published>,
    epoch: Instant,
    queue: VecDeque<Event>,
    teardown: Teardown,
    /// The drain phases (docs/drain-phases.md).
    phases: Phases,
    outcome: Option<Outcome>,
    /// The admission proxy (`--proxy`), driven at each beat.
    proxy: Option<Proxy>,
    due: Due,
    /// Counts the signals received and sent on, and the orphans reaped.
    metrics: Metrics,
}

impl Driver {
    /// `child_pid` was just spawned and registered with `reaper`. `app_ready` is
    /// `Some` with `--ready-notify`: it yields at the app's first `READY=1`
    /// (`notify.rs`); readiness passes once it and every check have passed.
    /// `launcher` starts the teardown steps.
    pub fn new(
        cfg: Config,
        reaper: Rc<RefCell<Reaper>>,
        signals: SignalStream,
        state_tx: watch::Sender<Published>,
        readiness: Readiness,
        launcher: Launcher,
        child_pid: i32,
    ) -> Driver {
        let at_once = at_once_of(&cfg, &reaper, child_pid);
        let mut driver = Driver::with_tree(
            cfg,
            reaper,
            Rc::new(Real),
            Signals::Fd(signals),
            state_tx,
            readiness,
            child_pid,
        );
        driver.inputs.signal_thread = Some(at_once);
        driver.teardown = Teardown::new(driver.cfg.teardown.clone(), launcher.clone());
        driver.phases = Phases::new(driver.cfg.phases.clone(), launcher);
        driver
    }

    /// As [`Driver::new`], over `tree` (a fake one in tests), with teardown
    /// steps started by the default [`Launcher`]. Starts nothing: the readiness
    /// task starts in [`Driver::run`].
    pub fn with_tree(
        cfg: Config,
        reaper: Rc<RefCell<Reaper>>,
        tree: Rc<dyn Tree>,
        signals: Signals,
        state_tx: watch::Sender<Published>,
        readiness: Readiness,
        child_pid: i32,
    ) -> Driver {
        let policy = Policy {
            pre_drain_delay: cfg.pre_drain_delay,
            delay_needs_routing: cfg.pre_drain_delay_rule == DelayRule::WhenRouted,
            drain_timeout: cfg.drain_timeout,
            teardown_timeouts: cfg.teardown.iter().map(|t| t.timeout).collect(),
            drain_signals: cfg.drain_signals.clone(),
            second_signal: cfg.second_signal,
            rewrite: cfg.rewrite.clone(),
            admission_gate: cfg.proxy.is_some(),
            phase_maxes: cfg.phases.iter().map(|p| p.max).collect(),
            phase_budget: cfg.phase_budget,
        };
        let teardown = Teardown::new(cfg.teardown.clone(), Launcher::default());
        let phases = Phases::new(cfg.phases.clone(), Launcher::default());
        let to_group = cfg.forward_to == ForwardTo::Group;
        Driver {
            drain: Drain::new(policy),
            app: AppTree::new(tree, reaper.clone(), child_pid, to_group),
            reaper,
            inputs: Inputs {
                signals,
                signal_thread: None,
                readiness: Some(readiness),
                ready_rx: None,
                reap_more: false,
                readyz_asked: None,
            },
            state_tx,
            epoch: Instant::now(),
            queue: VecDeque::new(),
            teardown,
            phases,
            outcome: None,
            proxy: None,
            due: Due::default(),
            metrics: Metrics::default(),
            cfg,
        }
    }

    /// Records signals and orphans in `metrics` (else in counters nobody reads).
    pub fn with_metrics(mut self, metrics: Metrics) -> Driver {
        self.metrics = metrics;
        self
    }

    /// Receives "a client asked `/readyz`" from the probe server and the proxy's
    /// health path ([`crate::published::ReadyzAsked`]): from then on a drain
    /// applies the default pre-drain delay (docs/processes-and-signals.md).
    pub fn with_readyz_asked(mut self, asked: watch::Receiver<bool>) -> Driver {
        self.inputs.readyz_asked = Some(asked);
        self
    }

    /// Drives `proxy` through the beats (docs/proxy.md): its gate follows the
    /// phase, admission closes at beat 3, and the drain signal waits for the
    /// requests in flight.
    pub fn with_proxy(mut self, proxy: Proxy) -> Driver {
        self.proxy = Some(proxy);
        self
    }

    /// Starts the readiness task: it yields once every check and, with
    /// `--ready-notify`, the app's `READY=1` have passed. With nothing configured,
    /// readiness passes at once (docs/probes.md).
    fn start_readiness(&mut self) {
        let Some(Readiness { checks, app_ready }) = self.inputs.readiness.take() else {
            return;
        };
        if checks.is_empty() && app_ready.is_none() {
            self.queue.push_back(Event::ReadinessPassed);
            return;
        }
        let (tx, rx) = oneshot::channel();
        let interval = self.cfg.ready_interval;
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
        self.inputs.ready_rx = Some(rx);
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// From now to the SIGKILL deadline (zero when none is set or it passed).
    fn to_deadline(&self) -> Duration {
        self.drain
            .timeline()
            .deadline
            .map_or(Duration::ZERO, |d| d.saturating_sub(self.now()))
    }

    /// Marks readiness as passed from elsewhere (sd_notify `READY=1`).
    pub fn readiness_passed(&mut self) {
        self.queue.push_back(Event::ReadinessPassed);
        self.process();
    }

    /// Runs until the drain machine says exit; returns the report to write.
    pub async fn run(mut self) -> Report {
        self.start_readiness();
        self.process();
        while self.outcome.is_none() {
            let woke = self.wait().await;
            self.on_woke(woke);
            self.process();
        }
        self.report()
    }

    /// Waits for the next wake-up: a `/readyz` asked first (so that a drain
    /// signal read in the same turn sees it, as it would have seen it had it
    /// come a moment later), then signals, readiness, a teardown
    /// step's end, the deadline, the progress line, the outsiders' poll, the
    /// next reap round, the proxy's last request.
    async fn wait(&mut self) -> Woke {
        let mut deadline = self.drain.next_deadline().map(|at| self.epoch + at);
        // While killed processes are still dying and being reaped, the kill's
        // settle time does not run out: thousands killed at once take the
        // kernel more than a second to tear down on a small machine, and their
        // statuses (the main child's among them) are on their way. A process
        // that cannot die (uninterruptible sleep) stops the reaps, and the
        // settle time runs out as before.
        if self.drain.settling() && self.inputs.reap_more {
            deadline = None;
        }
        let polling = self.app.outsiders() && self.drain.waits_for_descendants();
        if !self.drain.awaits_deadline() {
            self.due.progress_at = None;
        }
        let progress = self.due.progress_at.map(|at| self.epoch + at);
        let reaping = self.inputs.reap_more;
        let admission = matches!(self.drain.state(), State::Admission { .. });
        let proxy = &self.proxy;
        let (drain, app) = (&self.drain, &self.app);
        let Inputs {
            signals,
            ready_rx,
            readyz_asked,
            ..
        } = &mut self.inputs;
        let step_rx = self.teardown.status();
        let phases = &mut self.phases;
        let phase_running = phases.running();
        tokio::select! {
            biased;
            changed = async { readyz_asked.as_mut().expect("guarded by the if").changed().await }, if readyz_asked.is_some() => Woke::Asked(changed.is_ok()),
            received = signals.recv(|batch| forward_at_once(batch, drain, app)) => Woke::Signals(received),
            _ = async { ready_rx.as_mut().expect("guarded by the if").await }, if ready_rx.is_some() => Woke::Ready,
            exit = wait_step(step_rx) => Woke::StepExited(exit),
            result = phases.wait(), if phase_running => Woke::PhaseEnded(result),
            _ = sleep_until(deadline), if deadline.is_some() => Woke::Tick,
            _ = sleep_until(progress), if progress.is_some() => Woke::Progress,
            () = async { tokio::time::sleep(OUTSIDER_POLL).await }, if polling => Woke::Poll,
            () = tokio::task::yield_now(), if reaping => Woke::Reap,
            () = async { proxy.as_ref().expect("guarded by the if").idle().await }, if admission && proxy.is_some() => Woke::RequestsDone,
        }
    }

    /// A wake-up becomes events (or, for a signal, a step of its own).
    fn on_woke(&mut self, woke: Woke) {
        match woke {
            Woke::Asked(open) => {
                // Received once: the machine remembers it. A closed channel
                // (nothing can ask any more) is no ask.
                let rx = self.inputs.readyz_asked.take();
                if open && rx.is_some_and(|rx| *rx.borrow()) {
                    self.queue.push_back(Event::Routed);
                }
            }
            Woke::Signals(received) => {
                let forwarded = received.iter().any(|r| r.forwarded.is_some());
                self.on_signals(received);
                if forwarded {
                    self.start_signal_thread();
                }
            }
            Woke::Ready => {
                self.inputs.ready_rx = None;
                log::info!("ready: every readiness check passed");
                self.queue.push_back(Event::ReadinessPassed);
            }
            Woke::StepExited(exit) => {
                if let Some(ok) = self.teardown.finish(exit) {
                    self.queue.push_back(Event::TeardownExited { ok });
                }
            }
            Woke::PhaseEnded(result) => {
                if let Some((ok, pid)) = self.phases.finish(result) {
                    if let Some(pid) = pid {
                        self.app.end_helper(pid);
                    }
                    self.queue.push_back(Event::PhaseExited { ok });
                }
            }
            Woke::Tick => self.queue.push_back(Event::Tick),
            Woke::Progress => self.log_progress(),
            Woke::Poll => self.check_descendants(false),
            Woke::Reap => self.on_sigchld(),
            Woke::RequestsDone => {
                log::info!("no request in flight: the app may drain");
                self.queue.push_back(Event::RequestsDone);
            }
        }
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
            if let Some(start) = self.due.sample.take() {
                self.finish_sample(start);
                if self.app.sent_early() {
                    // The walk outlasted the pre-drain delay and sent the drain
                    // signal when it came due: beat 3 is now, before anything
                    // else is read.
                    self.queue.push_front(Event::Tick);
                }
            }
            if let Some(line) = self.due.forward_line.take() {
                log::info!("{line}");
            }
            if std::mem::take(&mut self.due.admission_log) {
                self.log_admission_closed();
            }
            if std::mem::take(&mut self.due.recheck) {
                self.check_descendants(false);
            }
            self.app.end_step();
        }
        self.publish();
        if std::mem::take(&mut self.due.partial)
            && self.outcome.is_none()
            && let Some(path) = &self.cfg.report_file
        {
            self.partial_report().write_partial(path);
        }
    }

    /// Drain phase `i` ended: its log line and its count in `/metrics`.
    fn phase_ended(&mut self, i: usize) {
        let Some(run) = self.drain.record().phases.get(i) else {
            return;
        };
        let cut = self.drain.record().phases_cut;
        let line = self.phases.end_line(i, run, cut);
        match run.end {
            PhaseEnd::Ok | PhaseEnd::Skipped => log::info!("{line}"),
            _ => log::warn!("{line}"),
        }
        self.metrics
            .phase_ended(self.phases.name(i), run.end.as_str());
        self.due.recheck = true;
    }

    /// About once a second in beat 3 (or the stop window), while anything is
    /// left: how many processes, the first few `pid comm`, and the time to the
    /// SIGKILL deadline (docs/logs.md). A 12 s wait must not be silent.
    fn log_progress(&mut self) {
        self.due.progress_at = None;
        if !self.drain.awaits_deadline() {
            return;
        }
        let now = self.now();
        self.due.progress_at = Some(now + PROGRESS_EVERY);
        // An unreadable /proc was logged by `descendants`; the next line retries.
        let Some(left) = self.app.descendants() else {
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
            fmt_ms(to_deadline)
        );
    }

    /// The report's `phases` list, times since T0.
    fn phases_report(&self) -> Vec<crate::report::PhaseJson> {
        let t0 = self.drain.timeline().t0.unwrap_or_default();
        self.phases.report(&self.drain.record().phases, t0)
    }

    /// The report so far, for the report file (`"final":false`).
    fn partial_report(&self) -> Report {
        Report::from_facts(Facts {
            outcome: None,
            phase: self.drain.phase(),
            record: self.drain.record(),
            child_pid: self.app.child_pid(),
            ledger: self.app.ledger(),
            teardown: Vec::new(),
            phases: self.phases_report(),
            orphans: self.reaper.borrow().orphans(),
            requests: self
                .proxy
                .as_ref()
                .map(|p| (p.totals(), p.ledger().streams())),
        })
    }

    fn publish(&self) {
        let phase = self.drain.phase();
        if let Some(p) = &self.proxy {
            p.set_gate(match phase {
                Phase::Starting => Gate::NotReady,
                Phase::Ready => Gate::Ready,
                Phase::Draining | Phase::Stopping => Gate::Closing,
            });
        }
        self.state_tx.send_if_modified(|p| {
            let changed = p.phase != phase;
            p.phase = phase;
            changed
        });
    }

    /// Why the pre-drain delay at T0 is what it is, for the T0 log line.
    fn delay_why(&self, why: Option<DelayWhy>) -> &'static str {
        match (why, self.cfg.pre_drain_delay_rule) {
            (Some(DelayWhy::NeverReady), _) => "readiness never passed: nothing was routed here",
            (Some(DelayWhy::Routed), _) => "default pre-drain delay: a client asked /readyz",
            (Some(DelayWhy::NotRouted), _) => {
                "default pre-drain delay 0: not in Kubernetes and no client asked /readyz"
            }
            (_, DelayRule::Kubernetes) => "default pre-drain delay: in Kubernetes",
            (_, DelayRule::Unroutable) => "default pre-drain delay 0: nothing can ask /readyz",
            _ => "pre-drain delay as configured",
        }
    }

    /// Beat 1's count and line, at the end of the step that asked for it (after
    /// the signal the step sent).
    fn finish_sample(&mut self, start: Start) {
        let alive = self.app.sample_in_flight();
        match start.signal {
            Some(sig) => log::info!(
                "drain started by {sig}: readiness fails now; {} in flight; {} in {} ({}), deadline in {}{}",
                alive,
                if self.cfg.phases.is_empty() {
                    "forwarding"
                } else {
                    "drain phases, then forwarding,"
                },
                fmt_ms(start.pre_drain_delay),
                self.delay_why(start.delay_why),
                fmt_ms(start.to_deadline),
                self.proxy.as_ref().map_or(String::new(), |p| format!(
                    "; proxy: {} request(s) in flight, responses now carry Connection: close",
                    p.ledger().in_flight()
                ))
            ),
            None if alive == 0 => {}
            None => log::info!(
                "no drain signal: the {} process(es) left get the drain signal and {} to finish",
                alive,
                fmt_ms(start.to_deadline)
            ),
        }
    }

    /// Beat 3: the tree forwards the drain signal; the machine notes when.
    fn forward_drain(&mut self, sig: Signal) {
        let sent = self.app.forward_drain(sig);
        self.drain
            .note_forwarded(sent.sent_at.saturating_duration_since(self.epoch));
        self.metrics.signal_forwarded(sig, 1);
        self.due
            .progress_at
            .get_or_insert(self.now() + PROGRESS_EVERY);
        if self.due.sample.is_some() {
            // No pre-drain delay: beat 1's line ("drain started by …"), which
            // announces this forward, is logged at the end of this step; the
            // forward's line follows it rather than coming first.
            self.due.forward_line = Some(sent.line);
        } else {
            log::info!("{}", sent.line);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Forward(sig) => {
                if self.app.forward(sig) {
                    self.metrics.signal_forwarded(sig, 1);
                }
            }
            Action::SampleInFlight(start) => {
                // Counted at the end of this step (`finish_sample`), after the
                // forward it may send: neither a walk of a large tree nor a read
                // of the main child's `/proc` entry (tens of µs) delays the signal.
                self.due.sample = Some(start);
                // With a pre-drain delay, the count's walk sends the drain
                // signal itself should it run past its due time.
                let due = self.drain.due_forward().filter(|_| self.proxy.is_none());
                self.app
                    .send_when_due(due.map(|(at, sig)| (self.epoch + at, sig)));
            }
            Action::ForwardDrain(sig) => {
                // The gate first: a second signal in beat 2 forwards while
                // admission is still open, and a request let in between the
                // signal and the gate would reach an app already told to stop
                // (a naive one loses it). Closed first, it gets the 503.
                if let Some(p) = &self.proxy {
                    p.set_gate(Gate::Forwarded);
                }
                self.forward_drain(sig);
            }
            Action::CloseAdmission => self.close_admission(),
            Action::AbandonRequests => self.abandon_requests(),
            Action::SignalRemaining(sig) => {
                if let Some(p) = &self.proxy {
                    p.set_gate(Gate::Forwarded);
                }
                let sent = self.app.signal_remaining(sig);
                self.metrics.signal_forwarded(sig, sent as u64);
                self.due
                    .progress_at
                    .get_or_insert(self.now() + PROGRESS_EVERY);
            }
            Action::PartialReport => self.due.partial = true,
            Action::CountAlive => {
                let alive = self.app.descendants().map(|v| v.len());
                self.queue.push_back(Event::Alive(alive));
            }
            Action::StillDying(n) => {
                log::info!("{n} killed process(es) still dying; waiting for them");
            }
            Action::KillAll => {
                let killed_at = self.now();
                let k = self.app.kill_all();
                if k.killed > 0 {
                    self.drain.note_killed(killed_at);
                }
                self.on_kills(k, true);
            }
            Action::StartPhase { index, budget } => {
                log::info!(
                    "drain phase '{}' starting with {} of the phase budget",
                    self.phases.name(index),
                    fmt_ms(budget)
                );
                if let Some(ok) = self.phases.start(index, budget, &self.reaper) {
                    self.queue.push_back(Event::PhaseExited { ok });
                }
            }
            Action::CancelPhase(i) => {
                // Signal first, account after.
                if self.phases.drop_post() {
                    self.queue.push_back(Event::PhaseExited { ok: false });
                } else if let Some(pid) = self.phases.pid() {
                    self.app.cancel_helper(pid);
                }
                log::warn!("drain phase '{}' is being canceled", self.phases.name(i));
            }
            Action::KillPhase(i) => {
                if let Some(pid) = self.phases.pid() {
                    self.app.kill_phase(pid);
                }
                log::warn!(
                    "drain phase '{}' ignored its cancellation: SIGKILLed",
                    self.phases.name(i)
                );
                self.phases.abandon();
            }
            Action::PhaseEnded(i) => self.phase_ended(i),
            Action::StartTeardown(i) => {
                // The drain is over: a teardown step's processes are not part of it.
                self.app.close_ledger();
                if let Some(ok) = self.teardown.start(i, &self.reaper) {
                    self.queue.push_back(Event::TeardownExited { ok });
                }
            }
            Action::KillTeardown(i) => {
                if let Some(pid) = self.teardown.running_pid()
                    && self.app.kill_helper(pid)
                {
                    log::warn!("teardown step '{}' is being killed", self.teardown.name(i));
                }
            }
            Action::Exit(outcome) => self.outcome = Some(outcome),
        }
    }

    /// The counts of a kill become events: `Unkillable` first, then `Killed`
    /// (always after the deadline's kill, `always`; after a chase only when it
    /// killed something).
    fn on_kills(&mut self, k: Kills, always: bool) {
        if k.unkillable > 0 {
            self.queue.push_back(Event::Unkillable(k.unkillable));
        }
        if always || k.killed > 0 {
            self.queue.push_back(Event::Killed(k.killed));
        }
    }

    /// Beat 3 with the proxy: admission closes; with nothing in flight the
    /// requests are done at once.
    fn close_admission(&mut self) {
        let p = self
            .proxy
            .as_ref()
            .expect("the machine has a gate only with --proxy");
        p.set_gate(Gate::Closed);
        // Logged after this step's "drain started" line (delay 0).
        self.due.admission_log = true;
        if p.is_quiet() {
            self.queue.push_back(Event::RequestsDone);
        }
    }

    /// The deadline with the proxy: what is still in flight is abandoned.
    fn abandon_requests(&mut self) {
        if let Some(p) = &self.proxy {
            let (n, connecting, streams) = p.abandon();
            let n = n - connecting;
            if n > 0 || streams > 0 {
                log::warn!(
                    "SIGKILL: {n} request(s) still in flight and {streams} stream(s) open are abandoned"
                );
            }
            if connecting > 0 {
                log::warn!(
                    "SIGKILL: {connecting} request(s) still waiting for the app to accept their connection get drainit's 503 (rejected: they never reached it)"
                );
            }
        }
    }

    fn on_sigchld(&mut self) {
        let round = self.reaper.borrow_mut().reap();
        for (pid, _) in &round.orphans {
            self.app.orphan_reaped(*pid);
        }
        if !round.orphans.is_empty() {
            self.metrics
                .set_orphans_reaped(self.reaper.borrow().orphans());
        }
        if let Some(exit) = round.main {
            self.main_exited(exit);
        }
        self.inputs.reap_more = round.more;
        // A full round left zombies of drainit's own to reap: nothing can be
        // gone yet, and the next round comes at once.
        if !round.more {
            self.check_descendants(round.none_left);
        }
    }

    /// While the drain waits for descendants: notice when none is left (proven,
    /// see `AppTree::nothing_left`); while a kill settles, the tree kills what
    /// is still there. `none_left`: the reaper saw `ECHILD`.
    ///
    /// Checking on SIGCHLD is enough: the last descendant to end is always a child
    /// of drainit (its parent is gone, so it was re-parented to drainit), and its
    /// end raises SIGCHLD here. No timer is needed. The check reads drainit's own
    /// list of children, not the tree: a drain of thousands of processes does not
    /// walk them on every SIGCHLD.
    fn check_descendants(&mut self, none_left: bool) {
        if !self.drain.waits_for_descendants() {
            return;
        }
        if self.app.nothing_left(none_left) {
            self.queue.push_back(Event::DescendantsGone);
        } else if self.drain.settling() {
            let k = self.app.chase();
            self.on_kills(k, false);
        }
    }

    /// The signalfd goes to the signals' thread, once: from the next read on, what
    /// needs no decision is sent as it is read, without waiting for this loop's
    /// turn. Where the thread cannot be started (a pids limit), signals stay
    /// read here, and drainit says so once.
    fn start_signal_thread(&mut self) {
        if !matches!(self.inputs.signals, Signals::Fd(_)) {
            return;
        }
        let Some(at_once) = self.inputs.signal_thread.take() else {
            return;
        };
        let Signals::Fd(stream) = std::mem::replace(&mut self.inputs.signals, Signals::Idle) else {
            unreachable!("matched above");
        };
        self.inputs.signals = match stream.into_thread(move |read| at_once.forward(read)) {
            Ok(thread) => Signals::Thread(thread),
            Err((stream, e)) => {
                log::info!(
                    "no thread of its own for signals ({e}): they are read and forwarded in the main loop's turn"
                );
                Signals::Fd(stream)
            }
        };
    }

    /// A batch of signals read at once: the main child's exit read with it (if
    /// SIGCHLD is in the batch) goes where the machine orders it, each other
    /// signal is fed at once, then the reap round.
    fn on_signals(&mut self, mut received: Vec<signals::Received>) {
        let chld = received.iter().any(|r| r.signal == Signal::CHLD);
        if !chld {
            // No exit read with this batch, so nothing to order: each signal is
            // fed as read (`order_batch` without an exit), with no list built
            // on the way to its forward.
            for r in received {
                self.on_signal(r);
            }
            return;
        }
        received.retain(|r| r.signal != Signal::CHLD);
        // The main child's exit read with this batch goes where the
        // machine says (before the signals, or after the drain signal
        // that killed it).
        let exit = self.reaper.borrow_mut().reap_main();
        let batch: Vec<Signal> = received.iter().map(|r| r.signal).collect();
        let mut received = received.into_iter();
        for event in self.drain.order_batch(&batch, exit) {
            match event {
                Event::ChildExited(exit) => self.main_exited(exit),
                _ => {
                    let r = received.next().expect("one event per signal");
                    self.on_signal(r);
                }
            }
        }
        self.on_sigchld();
    }

    /// One signal of a batch (never SIGCHLD), fed to the machine at once: beat 1
    /// is taken before anything else, in this step.
    fn on_signal(&mut self, r: signals::Received) {
        if r.signal.is_reserved() {
            self.metrics.signal_received(r.signal);
            log::warn!(
                "ignored signal {} from pid {}: the C library keeps it for itself",
                r.signal,
                r.sender
            );
            return;
        }
        log::debug!("received {} from pid {}", r.signal, r.sender);
        if let Some(sent) = r.forwarded {
            // Sent as it was read (`forward_at_once`): only the accounting is left.
            log::debug!("forwarded {sent} to {}", self.app.forward_target());
            self.metrics.signal_forwarded(sent, 1);
            self.metrics.signal_received(r.signal);
            return;
        }
        self.queue.push_back(Event::Signal(r.signal));
        self.process();
        // Counted after the step that forwarded it: signal first, account after.
        self.metrics.signal_received(r.signal);
    }

    fn main_exited(&mut self, exit: ChildExit) {
        self.app.main_exited();
        log::info!(
            "main child {} exited ({})",
            self.app.child_pid(),
            describe_exit(exit)
        );
        self.queue.push_back(Event::ChildExited(exit));
        self.process();
    }

    fn report(&mut self) -> Report {
        let mut outcome = self.outcome.expect("run() returns only after Exit");
        // The proxy stops first: what is still in flight is abandoned, and the
        // requests lost from T0 on decide whether the drain was clean.
        let requests = self.proxy.as_mut().map(|p| {
            p.stop();
            let l = p.ledger();
            (p.totals(), l.streams(), l.lost_since_t0())
        });
        if let Some((totals, _, lost)) = &requests {
            outcome = self.drain.settle_requests(*lost as usize);
            self.outcome = Some(outcome);
            log::info!(
                "requests: {} received, {} completed, {} rejected (503, safe to retry), {} unknown, {} abandoned, {} canceled",
                totals.received,
                totals.completed,
                totals.rejected,
                totals.unknown,
                totals.abandoned,
                totals.canceled
            );
        }
        // What is left to reap is reaped and counted before the report.
        while self.inputs.reap_more {
            let round = self.reaper.borrow_mut().reap();
            for (pid, _) in &round.orphans {
                self.app.orphan_reaped(*pid);
            }
            self.inputs.reap_more = round.more;
        }
        self.app.settle();
        let teardown = self.teardown.report(self.drain.teardown());
        let t = self.drain.timeline();
        match outcome.reason {
            crate::drain::Reason::Drained => log::info!(
                "drained: {} process(es) finished in {}",
                self.app.ledger().completed(),
                fmt_ms(
                    t.finished_at
                        .unwrap_or_default()
                        .saturating_sub(t.t0.unwrap_or_default())
                )
            ),
            crate::drain::Reason::Abandoned => {
                let phases = (self.drain.record().phases.iter())
                    .filter(|p| p.end == PhaseEnd::Abandoned)
                    .count();
                if phases > 0 {
                    log::warn!(
                        "abandoned: {} process(es) and {phases} drain phase(s) had to be killed",
                        self.app.ledger().abandoned().len()
                    )
                } else {
                    log::warn!(
                        "abandoned: {} process(es) had to be killed",
                        self.app.ledger().abandoned().len()
                    )
                }
            }
            _ => {}
        }
        log::info!("exit {} ({})", outcome.code, outcome.reason.as_str());
        Report::from_facts(Facts {
            outcome: Some(outcome),
            phase: self.drain.phase(),
            record: self.drain.record(),
            child_pid: self.app.child_pid(),
            ledger: self.app.ledger(),
            teardown,
            phases: self.phases_report(),
            orphans: self.reaper.borrow().orphans(),
            requests: requests.map(|(totals, streams, _)| (totals, streams)),
        })
    }

    /// Beat 3 with the proxy: what the forward waits for.
    fn log_admission_closed(&self) {
        if let Some(p) = &self.proxy {
            log::info!(
                "admission closed: new requests get 503; {} request(s) in flight and {} stream(s) open; the drain signal waits for them (deadline in {})",
                p.ledger().in_flight(),
                p.open_streams(),
                fmt_ms(self.to_deadline())
            );
        }
    }

    /// The current phase (for tests and the notify relay).
    pub fn phase(&self) -> Phase {
        self.drain.phase()
    }
}

/// What woke the loop.
enum Woke {
    /// A client asked `/readyz` (`false`: the channel closed).
    Asked(bool),
    Signals(Vec<signals::Received>),
    Ready,
    StepExited(Option<ChildExit>),
    /// The running drain phase ended.
    PhaseEnded(PhaseResult),
    Tick,
    Progress,
    Poll,
    /// The next reap round (the last one was full).
    Reap,
    /// Admission is closed and no request is in flight.
    RequestsDone,
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

fn describe_exit(e: ChildExit) -> String {
    match e {
        ChildExit::Code(n) => format!("exit code {n}"),
        ChildExit::Signal(s) => format!("killed by {s}"),
    }
}

#[cfg(test)]
mod tests {
    //! The driver against a fake process tree, under paused time: what is
    //! signalled, when (virtual time from the first drain signal), and what the
    //! report says.
    use super::*;
    use tokio::sync::mpsc;

    use crate::tree::fake::{FakeTree, Reacts, ms, received};

    const CHILD: i32 = 4_000_000;

    struct World {
        tree: Rc<FakeTree>,
        signals_tx: mpsc::UnboundedSender<Vec<signals::Received>>,
        driver: Driver,
    }

    /// A driver over a fake tree with one main child (`CHILD`, reacting as
    /// `child`), configured by `flags`.
    fn world(flags: &[&str], child: Reacts) -> World {
        world_with(flags, child, |_| {})
    }

    /// As [`world`], with the configuration changed by `tweak` after loading.
    fn world_with(flags: &[&str], child: Reacts, tweak: impl FnOnce(&mut Config)) -> World {
        let (signals_tx, signals_rx) = mpsc::unbounded_channel();
        let tree = FakeTree::new(signals_tx.clone());
        tree.add(CHILD, CHILD, child);
        let mut args: Vec<std::ffi::OsString> =
            vec!["drainit".into(), "--probe-addr".into(), "off".into()];
        args.extend(flags.iter().map(Into::into));
        args.extend(["--".into(), "app".into()]);
        struct NoEnv;
        impl crate::config::Env for NoEnv {
            fn get(&self, _: &str) -> Option<String> {
                None
            }
        }
        let mut cfg = crate::config::load_from(args, &NoEnv).expect("valid flags");
        tweak(&mut cfg);
        let reaper = Rc::new(RefCell::new(Reaper::with_waiter(tree.clone())));
        reaper.borrow_mut().set_main(CHILD);
        let (state_tx, _) = watch::channel(Published::new());
        let readiness = Readiness {
            checks: Checks::new(Vec::new(), reaper.clone(), Launcher::default()),
            app_ready: None,
        };
        let driver = Driver::with_tree(
            cfg,
            reaper,
            tree.clone(),
            Signals::Channel(signals_rx),
            state_tx,
            readiness,
            CHILD,
        );
        World {
            tree,
            signals_tx,
            driver,
        }
    }

    impl World {
        /// Runs the driver to its exit: `TERM` at `t0`, then `more` signals at
        /// their instants (all from the start). Returns the report's JSON and
        /// what was sent, in ms since the first drain signal.
        async fn run(
            self,
            t0: Duration,
            more: &[(u64, Signal)],
        ) -> (serde_json::Value, Vec<(u64, i32, Signal)>) {
            let start = Instant::now();
            let tx = self.signals_tx.clone();
            let mut at = vec![(t0, Signal::TERM)];
            at.extend(more.iter().map(|(ms_, s)| (ms(*ms_), *s)));
            tokio::task::spawn_local(async move {
                for (when, sig) in at {
                    tokio::time::sleep_until(start + when).await;
                    let _ = tx.send(vec![received(sig)]);
                }
            });
            let report = tokio::time::timeout(Duration::from_secs(120), self.driver.run())
                .await
                .expect("the driver exits");
            let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
            let sent = self
                .tree
                .sent
                .borrow()
                .iter()
                .map(|(when, target, sig)| {
                    (
                        (*when - start).saturating_sub(t0).as_millis() as u64,
                        *target,
                        *sig,
                    )
                })
                .collect();
            (json, sent)
        }
    }

    async fn local<F: std::future::Future>(f: F) -> F::Output {
        tokio::task::LocalSet::new().run_until(f).await
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_clean_drain_forwards_at_t0_plus_delay_and_exits_0() {
        local(async {
            let w = world(
                &["--pre-drain-delay", "5s", "--drain-timeout", "20s"],
                Reacts::ExitsAfter(ms(300)),
            );
            let (report, sent) = w.run(ms(1000), &[]).await;
            assert_eq!(
                sent,
                vec![(5000, CHILD, Signal::TERM)],
                "one forward, at T0 + delay"
            );
            assert_eq!(report["exit_code"], 0);
            assert_eq!(report["reason"], "drained");
            assert_eq!(report["drain"]["forwarded_at_ms"], 5000);
            assert_eq!(report["drain"]["finished_at_ms"], 5300);
            assert_eq!(report["drain"]["deadline_ms"], 25000);
            assert_eq!(report["drain"]["in_flight_at_start"], 1);
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn what_ignores_the_drain_signal_is_killed_at_the_deadline() {
        local(async {
            let w = world(
                &["--pre-drain-delay", "2s", "--drain-timeout", "3s"],
                Reacts::Ignores,
            );
            w.tree.add(CHILD + 1, CHILD, Reacts::Ignores);
            let (report, sent) = w.run(ms(0), &[]).await;
            assert_eq!(sent.first(), Some(&(2000, CHILD, Signal::TERM)));
            let kills: Vec<_> = sent.iter().filter(|s| s.2 == Signal::KILL).collect();
            assert!(
                !kills.is_empty() && kills.iter().all(|k| k.0 == 5000),
                "SIGKILL at the deadline only: {sent:?}"
            );
            assert_eq!(report["exit_code"], 2);
            assert_eq!(report["reason"], "abandoned");
            assert_eq!(report["drain"]["abandoned"], 2);
            assert_eq!(report["drain"]["killed_at_ms"], 5000);
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_second_signal_cuts_each_wait_short_once() {
        local(async {
            // In beat 2: forward now; a third signal changes nothing.
            let w = world(
                &["--pre-drain-delay", "5s", "--drain-timeout", "20s"],
                Reacts::Ignores,
            );
            let (report, sent) = w
                .run(ms(0), &[(1000, Signal::TERM), (2000, Signal::INT)])
                .await;
            assert_eq!(
                sent.first(),
                Some(&(1000, CHILD, Signal::TERM)),
                "beat 2 cut short"
            );
            assert!(
                sent.iter().all(|s| s.2 != Signal::KILL || s.0 == 25000),
                "{sent:?}"
            );
            assert_eq!(
                report["drain"]["deadline_ms"], 25000,
                "the deadline never moves"
            );
            // In beat 3: SIGKILL now.
            let w = world(
                &["--pre-drain-delay", "1s", "--drain-timeout", "20s"],
                Reacts::Ignores,
            );
            let (report, sent) = w.run(ms(0), &[(2000, Signal::INT)]).await;
            assert_eq!(sent.first(), Some(&(1000, CHILD, Signal::TERM)));
            assert!(
                sent.contains(&(2000, CHILD, Signal::KILL)),
                "beat 3 cut short: {sent:?}"
            );
            assert_eq!(report["exit_code"], 2);
            assert_eq!(report["drain"]["killed_at_ms"], 2000);
            assert_eq!(
                report["drain"]["deadline_ms"], 21000,
                "the deadline never moves"
            );
        })
        .await;
    }

    /// An app that catches the drain signal and exits at once, before the T0
    /// count reads it (its SIGCHLD not read yet): it was alive when the signal
    /// was read, so it was in flight at T0, and drained.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_app_that_exits_as_soon_as_it_is_told_was_in_flight_at_t0() {
        local(async {
            let w = world(&["--pre-drain-delay", "0s"], Reacts::ExitsAtOnce);
            let (report, _) = w.run(ms(100), &[]).await;
            assert_eq!(report["drain"]["in_flight_at_start"], 1, "{report}");
            assert_eq!(report["drain"]["completed"], 1, "{report}");
            assert_eq!(report["reason"], "drained");
        })
        .await;
    }

    /// A drain signal read together with plain ones (systemd's SIGTERM then
    /// SIGCONT): everything goes out in the kernel's order, the drain signal
    /// first, as when each came alone; the plain ones are not sent ahead of it.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_drain_signal_read_with_plain_ones_goes_out_first() {
        local(async {
            let w = world(&["--pre-drain-delay", "0s"], Reacts::ExitsAfter(ms(10)));
            let winch = Signal(libc::SIGWINCH);
            let batch = [Signal::TERM, Signal::CONT, winch].map(received).to_vec();
            w.signals_tx.send(batch).expect("the driver reads");
            let report = tokio::time::timeout(Duration::from_secs(120), w.driver.run())
                .await
                .expect("the driver exits");
            let sent: Vec<Signal> = w.tree.sent.borrow().iter().map(|s| s.2).collect();
            assert_eq!(sent, vec![Signal::TERM, Signal::CONT, winch]);
            assert!(report.to_json().contains("\"reason\":\"drained\""));
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn other_signals_are_forwarded_at_once_and_never_start_a_drain() {
        local(async {
            let w = world(
                &["--pre-drain-delay", "1s", "--rewrite", "HUP:USR1"],
                Reacts::ExitsAfter(ms(10)),
            );
            let (report, sent) = w.run(ms(500), &[(100, Signal::HUP)]).await;
            assert_eq!(
                sent,
                vec![
                    (0, CHILD, Signal(libc::SIGUSR1)),
                    (1000, CHILD, Signal::TERM)
                ],
                "HUP rewritten at once (before T0, shown as 0), TERM at T0 + 1 s"
            );
            assert_eq!(report["reason"], "drained");
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_child_that_exits_by_itself_gives_its_code_and_leftovers_are_drained() {
        local(async {
            let w = world(&["--drain-timeout", "4s"], Reacts::Ignores);
            w.tree
                .add(CHILD + 1, CHILD + 1, Reacts::ExitsAfter(ms(700)));
            let tree = w.tree.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep(ms(300)).await;
                tree.end(CHILD, ChildExit::Code(3));
            });
            // The TERM comes long after: by then drainit has exited.
            let (report, sent) = w.run(ms(60_000), &[]).await;
            assert_eq!(
                sent.len(),
                1,
                "the leftover got the drain signal once: {sent:?}"
            );
            assert_eq!((sent[0].1, sent[0].2), (CHILD + 1, Signal::TERM));
            assert_eq!(report["exit_code"], 3);
            assert_eq!(report["reason"], "child_exited");
            assert_eq!(report["stop"]["finished_at_ms"], 700);
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_child_killed_by_the_drain_signal_of_its_batch_was_drained() {
        local(async {
            // The stop signal reached the child and drainit at once (a group
            // kill): TERM and the child's SIGCHLD are read in one batch.
            let w = world(&["--pre-drain-delay", "0s"], Reacts::Ignores);
            if let Some(p) = w.tree.procs.borrow_mut().get_mut(&CHILD) {
                p.ended = Some(ChildExit::Signal(Signal::TERM));
            }
            w.signals_tx
                .send(vec![received(Signal::TERM), received(Signal::CHLD)])
                .expect("the driver listens");
            let (report, _) = w.run(ms(60_000), &[]).await;
            assert_eq!(report["reason"], "drained", "{report}");
            assert_eq!(report["exit_code"], 0);
            assert_eq!(report["signal"], "SIGTERM");
        })
        .await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_readyz_asked_before_t0_arrives_as_an_event_and_the_default_delay_applies() {
        local(async {
            // The default delay, as when the probe server is on outside Kubernetes.
            let routed = |cfg: &mut Config| {
                cfg.pre_drain_delay_rule = DelayRule::WhenRouted;
                cfg.pre_drain_delay = Duration::from_secs(5);
            };
            for ask in [false, true] {
                let (asked, asked_rx) = crate::published::ReadyzAsked::channel();
                let mut w = world_with(&[], Reacts::ExitsAfter(ms(10)), routed);
                w.driver = w.driver.with_readyz_asked(asked_rx);
                if ask {
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(ms(100)).await;
                        asked.note();
                        asked.note();
                    });
                }
                let (report, sent) = w.run(ms(1000), &[]).await;
                let delay = if ask { 5000 } else { 0 };
                assert_eq!(sent, vec![(delay, CHILD, Signal::TERM)], "asked: {ask}");
                assert_eq!(report["drain"]["pre_drain_delay_ms"], delay);
            }
        })
        .await;
    }
}
