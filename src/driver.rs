//! The driver, the event loop: wake-ups (signals, reaped statuses, timers, a
//! teardown step's end) → events for the drain state machine → its actions →
//! effects on the process tree (through [`crate::tree::Tree`], which makes the
//! system calls), the published phase, the ledger and the report.
//!
//! Owns: the one task that reaps, and every request to signal. It runs on a
//! single-threaded tokio runtime; the probe server and the readiness poller are
//! other tasks on the same thread that only read what this loop publishes.
//!
//! Must not: decide policy (that is `drain.rs`: the order of a signal batch, when
//! to forward, to kill, to extend the kill's settle, to write a partial report,
//! the exit code), or await between reading a drain
//! signal and publishing `draining` (beat 1 is one synchronous step). After the
//! spawn nothing leaves this loop but the planned exit: errors are logged and the
//! loop carries on (catatonit's second error regime).
//!
//! Invariant: a pid is signalled only while it is known alive and unreaped: the
//! `/proc` read and the `kill` happen in one synchronous step, with no reap in
//! between, and every process gets the drain signal from drainit at most once.
//!
//! Signal first, account after: the forward and the SIGKILL are sent before any
//! walk of `/proc` that only counts (a tree of thousands of processes or zombies
//! takes tens of milliseconds to read), and the report's times are the instants
//! the signals were sent. "No descendant left" is proven, never inferred from a
//! walk that may miss a process forked while its parent exited
//! (`Driver::nothing_left`).

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{oneshot, watch};

use crate::checks::{self, Checks};
use crate::config::{Config, DelayRule, ForwardTo};
use crate::drain::{
    Action, ChildExit, DelayWhy, Drain, Event, Outcome, Phase, Policy, Start, State,
};
use crate::metrics;
use crate::procs;
use crate::proxy::{Gate, Proxy};
use crate::published::Published;
use crate::reaper::Reaper;
use crate::report::{Facts, Ledger, Report};
use crate::signals::{self, Signal, SignalStream};
use crate::teardown::Teardown;
use crate::tree::{Real, Tree};
use crate::util::fmt_ms;

/// Where the driver reads signals from.
pub enum Signals {
    /// The signalfd (drainit itself).
    Fd(SignalStream),
    /// Batches sent on a channel (the driver's tests, with a fake tree). A closed
    /// channel never yields.
    Channel(tokio::sync::mpsc::UnboundedReceiver<Vec<signals::Received>>),
}

impl Signals {
    /// The next batch of signals read at once.
    async fn recv(&mut self) -> Vec<signals::Received> {
        match self {
            Signals::Fd(fd) => fd.recv().await,
            Signals::Channel(rx) => match rx.recv().await {
                Some(batch) => batch,
                None => std::future::pending().await,
            },
        }
    }
}

/// What readiness first passing waits for (DESIGN §7).
pub struct Readiness {
    /// The configured checks (none: only `app_ready`, or ready at once).
    pub checks: Rc<Checks>,
    /// With `--ready-notify`: yields at the app's first `READY=1` (`notify.rs`).
    pub app_ready: Option<oneshot::Receiver<()>>,
}

/// The supervisor's state. Build it with [`Driver::new`] right after the
/// spawn, then [`Driver::run`].
pub struct Driver {
    cfg: Config,
    drain: Drain,
    reaper: Rc<RefCell<Reaper>>,
    /// The process tree: every `/proc` read and every signal sent goes through it.
    tree: Rc<dyn Tree>,
    signals: Signals,
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
    /// `SampleInFlight` was asked for in this step: the T0 count is taken at the
    /// end of the step, after the signal the step sends. Holds the main child
    /// when it was alive at the sample (read before that signal).
    sample_due: Option<Start>,
    /// The line of a forward made in the same step as `sample_due`: logged
    /// after beat 1's line, which announces it.
    forward_line_due: Option<String>,
    /// The drain signal this step forwarded to the main child (or its group):
    /// a main child it killed at once was alive at T0.
    forwarded_now: Option<Signal>,
    /// The main child's `/proc` entry as `SampleInFlight` read it, for a
    /// `ForwardDrain` of the same step. Cleared after every action list.
    child_read: Option<Option<procs::Proc>>,
    /// The last reap round was full: another runs once the other wake-ups (a
    /// signal, a deadline) had their turn.
    reap_more: bool,
    queue: VecDeque<Event>,
    /// What readiness waits for, until [`Driver::run`] starts its task.
    readiness: Option<Readiness>,
    ready_rx: Option<oneshot::Receiver<()>>,
    teardown: Teardown,
    outcome: Option<Outcome>,
    /// When the next drain progress line is due (from `epoch`); `None` outside
    /// beat 3 (no timer runs while idle).
    progress_at: Option<Duration>,
    /// A partial report is due in the report file once the current action list
    /// is carried out (at T0 and at the forward: after the forward, never before
    /// it, so the disk never delays a signal).
    partial_due: bool,
    /// The admission proxy (`--proxy`), driven at each beat.
    proxy: Option<Proxy>,
    /// Admission closed in this step: logged at its end.
    admission_log_due: bool,
}

impl Driver {
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
    ) -> Driver {
        let readiness = Readiness { checks, app_ready };
        Driver::with_tree(
            cfg,
            reaper,
            Rc::new(Real),
            Signals::Fd(signals),
            state_tx,
            readiness,
            child_pid,
        )
    }

    /// As [`Driver::new`], over `tree` (a fake one in tests). Starts nothing:
    /// the readiness task starts in [`Driver::run`].
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
        };
        let me = std::process::id() as i32;
        let teardown = Teardown::new(cfg.teardown.clone());
        let proc_ok = tree.is_own_namespace();
        if !proc_ok {
            log::warn!(
                "/proc is not this PID namespace's (mount a fresh /proc, e.g. unshare --mount-proc): \
                 descendants cannot be found; only the main child and reaped processes are tracked"
            );
        }
        Driver {
            cfg,
            drain: Drain::new(policy),
            reaper,
            tree,
            signals,
            state_tx,
            child_pid,
            child_alive: true,
            me,
            is_pid1: me == 1,
            epoch: Instant::now(),
            ledger: Ledger::default(),
            proc_ok,
            outsiders: false,
            signalled: HashSet::new(),
            sampled: None,
            sample_due: None,
            forward_line_due: None,
            forwarded_now: None,
            child_read: None,
            reap_more: false,
            queue: VecDeque::new(),
            readiness: Some(readiness),
            ready_rx: None,
            teardown,
            outcome: None,
            progress_at: None,
            partial_due: false,
            proxy: None,
            admission_log_due: false,
        }
    }

    /// Drives `proxy` through the beats (DESIGN §11): its gate follows the
    /// phase, admission closes at beat 3, and the drain signal waits for the
    /// requests in flight.
    pub fn with_proxy(mut self, proxy: Proxy) -> Driver {
        self.proxy = Some(proxy);
        self
    }

    /// Starts the readiness task: it yields once every check and, with
    /// `--ready-notify`, the app's `READY=1` have passed. With nothing configured,
    /// readiness passes at once (DESIGN §7).
    fn start_readiness(&mut self) {
        let Some(Readiness { checks, app_ready }) = self.readiness.take() else {
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
        self.ready_rx = Some(rx);
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
            let mut deadline = self.drain.next_deadline().map(|at| self.epoch + at);
            // While killed processes are still dying and being reaped, the kill's
            // settle time does not run out: thousands killed at once take the
            // kernel more than a second to tear down on a small machine, and their
            // statuses (the main child's among them) are on their way. A process
            // that cannot die (uninterruptible sleep) stops the reaps, and the
            // settle time runs out as before.
            if self.drain.settling() && self.reap_more {
                deadline = None;
            }
            let polling = self.outsiders && self.drain.waits_for_descendants();
            if !self.drain.awaits_deadline() {
                self.progress_at = None;
            }
            let progress = self.progress_at.map(|at| self.epoch + at);
            let reaping = self.reap_more;
            let admission = matches!(self.drain.state(), State::Admission { .. });
            let woke = {
                let proxy = &self.proxy;
                let signals = &mut self.signals;
                let ready_rx = &mut self.ready_rx;
                let step_rx = self.teardown.status();
                tokio::select! {
                    biased;
                    received = signals.recv() => Woke::Signals(received),
                    _ = async { ready_rx.as_mut().expect("guarded by the if").await }, if ready_rx.is_some() => Woke::Ready,
                    exit = wait_step(step_rx) => Woke::StepExited(exit),
                    _ = sleep_until(deadline), if deadline.is_some() => Woke::Tick,
                    _ = sleep_until(progress), if progress.is_some() => Woke::Progress,
                    _ = tokio::time::sleep(OUTSIDER_POLL), if polling => Woke::Poll,
                    () = tokio::task::yield_now(), if reaping => Woke::Reap,
                    () = async { proxy.as_ref().expect("guarded by the if").idle().await }, if admission && proxy.is_some() => Woke::RequestsDone,
                }
            };
            match woke {
                Woke::Signals(received) => self.on_signals(received),
                Woke::Ready => {
                    self.ready_rx = None;
                    log::info!("ready: every readiness check passed");
                    self.queue.push_back(Event::ReadinessPassed);
                }
                Woke::StepExited(exit) => {
                    if let Some(ok) = self.teardown.finish(exit) {
                        self.queue.push_back(Event::TeardownExited { ok });
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
            if let Some(start) = self.sample_due.take() {
                self.finish_sample(start);
            }
            if let Some(line) = self.forward_line_due.take() {
                log::info!("{line}");
            }
            if std::mem::take(&mut self.admission_log_due) {
                self.log_admission_closed();
            }
            self.sampled = None;
            self.child_read = None;
            self.forwarded_now = None;
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
            fmt_ms(to_deadline)
        );
    }

    /// The report so far, for the report file (`"final":false`).
    fn partial_report(&self) -> Report {
        Report::from_facts(Facts {
            outcome: None,
            phase: self.drain.phase(),
            record: self.drain.record(),
            child_pid: self.child_pid,
            ledger: &self.ledger,
            teardown: Vec::new(),
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
        if !self.is_pid1 && !self.tree.has_children() {
            return Some(Vec::new());
        }
        match self.tree.descendants(self.me, &self.helpers()) {
            Ok(v) => Some(v),
            Err(e) => {
                log::error!("reading /proc to find descendants failed: {e}");
                None
            }
        }
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

    fn forward_target(&self) -> i32 {
        match self.cfg.forward_to {
            ForwardTo::Child => self.child_pid,
            ForwardTo::Group => -self.child_pid,
        }
    }

    fn send(&self, target: i32, sig: Signal) {
        send_to(&*self.tree, target, sig);
    }

    /// The non-helper children of drainit, zombies included (see
    /// [`procs::children`]); `None` when the kernel has no such list or `/proc`
    /// cannot be read.
    fn own_children(&self) -> Option<Vec<i32>> {
        if !self.proc_ok {
            return None;
        }
        match self.tree.children(self.me) {
            Ok(Some(v)) => {
                let helpers = self.helpers();
                Some(v.into_iter().filter(|p| !helpers.contains(p)).collect())
            }
            Ok(None) => None,
            Err(e) => {
                log::debug!("reading drainit's children in /proc failed: {e}");
                None
            }
        }
    }

    /// Whether drainit has no child left but its helpers: from its list of
    /// children, or, without one, from `waitid` (then a running helper counts).
    fn no_child_left(&self) -> bool {
        match self.own_children() {
            Some(v) => v.is_empty(),
            None => !self.tree.has_children(),
        }
    }

    /// Whether no descendant is left, proven (issue 13): `none_left` is the
    /// reaper's `ECHILD`.
    ///
    /// Not PID 1, drainit is a subreaper: every live descendant has a parent
    /// chain that reaches drainit through one of its children (an exiting
    /// parent's children are re-parented to drainit before its zombie can be
    /// reaped), so "no child but helpers" is "no descendant". A walk of the tree
    /// is not proof: a process that forks its successor and exits between the
    /// walk's listing and its read of that process leaves a successor the walk
    /// never sees. As PID 1, processes that entered the namespace from outside
    /// (`nsenter`, `docker exec`) are nobody's child here: the namespace is read
    /// too, and drainit's children read again after it, so that a process forked
    /// while the read ran, whose parent then exited, is found as drainit's child.
    fn nothing_left(&mut self, none_left: bool) -> bool {
        // ECHILD is conclusive unless, as PID 1, processes from outside the
        // namespace (never drainit's children) may be left: then /proc decides.
        if none_left && (!self.is_pid1 || !self.proc_ok) {
            return true;
        }
        if !self.proc_ok || !self.no_child_left() {
            return false;
        }
        if !self.is_pid1 {
            return true;
        }
        let Some(left) = self.descendants() else {
            return false;
        };
        self.outsiders = procs::any_from_outside(&left);
        left.is_empty() && self.no_child_left()
    }

    /// Beat 1's count, at the end of the step that asked for it: the live
    /// descendants (read after the step's signal, if it sent one), plus the main
    /// child read before that signal.
    fn finish_sample(&mut self, start: Start) {
        let mut alive = match self.sampled.take() {
            Some(v) => v,
            None => self.descendants().unwrap_or_default(),
        };
        // The main child, read after this step's signal (once): alive at T0
        // unless it had ended by itself (a zombie whose SIGCHLD is not read yet);
        // one that this step's forward killed at once was alive.
        let child = match self.child_read.take() {
            Some(read) => read,
            None if self.child_alive && self.proc_ok => self.tree.stat_of(self.child_pid),
            None => None,
        };
        let forwarded = self.forwarded_now;
        if let Some(p) = child.filter(|p| !p.zombie || forwarded.is_some_and(|s| p.ended_by == s.0))
            && !alive.iter().any(|a| a.id() == p.id())
        {
            alive.push(p);
        }
        self.ledger.sample(alive.iter().map(procs::Proc::id));
        match start.signal {
            Some(sig) => log::info!(
                "drain started by {sig}: readiness fails now; {} in flight; forwarding in {} ({}), deadline in {}{}",
                alive.len(),
                fmt_ms(start.pre_drain_delay),
                self.delay_why(start.delay_why),
                fmt_ms(start.to_deadline),
                self.proxy.as_ref().map_or(String::new(), |p| format!(
                    "; proxy: {} request(s) in flight, responses now carry Connection: close",
                    p.ledger().in_flight()
                ))
            ),
            None if alive.is_empty() => {}
            None => log::info!(
                "no drain signal: the {} process(es) left get the drain signal and {} to finish",
                alive.len(),
                fmt_ms(start.to_deadline)
            ),
        }
        self.sampled = Some(alive);
    }

    /// A signal that is not a drain signal: to the main child (or its group), at
    /// once; to the group still when its leader is gone but a member lives.
    fn forward(&mut self, sig: Signal) {
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

    /// Beat 3: the drain signal to the main child (or its group), then the
    /// accounting: who got it, and SIGCONT for a stopped one.
    fn forward_drain(&mut self, sig: Signal) {
        let target = self.forward_target();
        // The signal goes first, the accounting after: the main child's
        // identity and whether it is stopped are read after the signal
        // (unreaped, it is still that process, and a drain signal does
        // not continue a stopped one).
        self.send(target, sig);
        self.drain.note_forwarded(self.now());
        // The child was just woken, often onto this CPU (the scheduler
        // places a wakee near its waker): let it run before the
        // accounting below, which reads /proc (sched_yield(2)).
        std::thread::yield_now();
        self.forwarded_now = Some(sig);
        let child = if self.child_alive && self.proc_ok {
            self.tree.stat_of(self.child_pid)
        } else {
            None
        };
        self.child_read = Some(child.clone());
        metrics::signal_forwarded(&sig.to_string());
        self.progress_at.get_or_insert(self.now() + PROGRESS_EVERY);
        let mut stopped = child.as_ref().is_some_and(|c| c.stopped);
        if let Some(c) = &child {
            self.signalled.insert(c.id());
        }
        if target < 0 {
            // The group's members got it too (those forked after the
            // signal were started by a member already draining).
            let left = self.descendants().unwrap_or_default();
            for p in &left {
                if p.pgid == self.child_pid {
                    self.signalled.insert(p.id());
                    stopped |= p.stopped;
                }
            }
            self.sampled = Some(left);
        }
        let line = format!(
            "forwarded {sig} to {} {}",
            if target < 0 { "process group" } else { "child" },
            target.abs()
        );
        if self.sample_due.is_some() {
            // No pre-drain delay: beat 1's line ("drain started by …"), which
            // announces this forward, is logged at the end of this step; the
            // forward's line follows it rather than coming first.
            self.forward_line_due = Some(line);
        } else {
            log::info!("{line}");
        }
        if stopped {
            // A stopped process cannot act on the drain signal: wake it, as
            // systemd does after SIGTERM (systemd.kill(5), SendSIGCONT=).
            self.send(target, Signal::CONT);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Forward(sig) => self.forward(sig),
            Action::SampleInFlight(start) => {
                // Counted at the end of this step (`finish_sample`), after the
                // forward it may send: neither a walk of a large tree nor a read
                // of the main child's `/proc` entry (tens of µs) delays the signal.
                self.sample_due = Some(start);
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
            Action::CloseAdmission => {
                let p = self
                    .proxy
                    .as_ref()
                    .expect("the machine has a gate only with --proxy");
                p.set_gate(Gate::Closed);
                // Logged after this step's "drain started" line (delay 0).
                self.admission_log_due = true;
                if p.is_quiet() {
                    self.queue.push_back(Event::RequestsDone);
                }
            }
            Action::AbandonRequests => {
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
            Action::SignalRemaining(sig) => {
                if let Some(p) = &self.proxy {
                    p.set_gate(Gate::Forwarded);
                }
                self.signal_remaining(sig);
                self.progress_at.get_or_insert(self.now() + PROGRESS_EVERY);
            }
            Action::PartialReport => self.partial_due = true,
            Action::CountAlive => {
                let alive = self.descendants().map(|v| v.len());
                self.queue.push_back(Event::Alive(alive));
            }
            Action::StillDying(n) => {
                log::info!("{n} killed process(es) still dying; waiting for them");
            }
            Action::KillAll => self.kill_all(),
            Action::StartTeardown(i) => {
                // The drain is over: a teardown step's processes are not part of it.
                self.ledger.close();
                if let Some(ok) = self.teardown.start(i, &self.reaper) {
                    self.queue.push_back(Event::TeardownExited { ok });
                }
            }
            Action::KillTeardown(i) => {
                if let Some(pid) = self.teardown.running_pid()
                    && self.reaper.borrow().is_waiting(pid)
                {
                    log::warn!("teardown step '{}' is being killed", self.teardown.name(i));
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
    ///
    /// Each process is signalled as the walk finds it, not after the walk: in a
    /// tree of thousands the first signal goes out after one `/proc` read.
    fn signal_remaining(&mut self, sig: Signal) {
        let (me, helpers, tree) = (self.me, self.helpers(), self.tree.clone());
        let signalled = &mut self.signalled;
        let mut hit = |p: &procs::Proc| {
            if !p.zombie && signalled.insert(p.id()) {
                send_to(&*tree, p.pid, sig);
                metrics::signal_forwarded(&sig.to_string());
                if p.stopped {
                    send_to(&*tree, p.pid, Signal::CONT);
                }
                log::info!("sent {sig} to remaining process {} ({})", p.pid, p.comm);
            }
        };
        if let Some(left) = self.sampled.as_ref() {
            left.iter().for_each(hit);
            return;
        }
        // Unreadable /proc (logged): the deadline still SIGKILLs what is left.
        let mut seen = Vec::new();
        if self.proc_ok && (self.is_pid1 || self.tree.has_children()) {
            let r = tree.visit(me, &helpers, &mut |p| {
                hit(p);
                if !p.zombie {
                    seen.push(p.clone());
                }
            });
            if let Err(e) = r {
                log::error!("reading /proc to find descendants failed: {e}");
            }
        }
        self.sampled = Some(seen);
    }

    /// The deadline's SIGKILL (and the sweep after teardown). Signal first: as
    /// PID 1 `kill(-1)`, otherwise the main child's process group, before any
    /// walk; then each descendant is killed as the walk finds it, and recorded
    /// abandoned (a zombie whose status says SIGKILL was killed by this too; one
    /// that ended by itself was not). A process drainit may not signal (`EPERM`)
    /// is recorded unkillable instead, and logged once.
    fn kill_all(&mut self) {
        self.ledger.close();
        let killed_at = self.now();
        // The main child first (it is not reaped, so its pid and group are still
        // its own): woken first, it tends to die first, and its status is what
        // the report shows.
        // Failures are not logged here: the walk below finds each process still
        // alive, kills it by pid and records (and logs, once) what it cannot kill.
        if self.child_alive {
            let _ = self.tree.kill(self.child_pid, Signal::KILL);
        }
        if self.is_pid1 {
            // As PID 1, -1 means every process of this PID namespace but drainit
            // (kill(2)); never used outside PID 1, where it would reach processes
            // drainit did not start.
            let _ = self.tree.kill(-1, Signal::KILL);
        } else if self.child_alive {
            let _ = self.tree.kill(-self.child_pid, Signal::KILL);
        }
        let mut killed = 0;
        let mut unkillable = 0;
        // A few rounds: a process may fork between the read and its SIGKILL.
        for _ in 0..3 {
            let before = (killed, unkillable);
            match self.kill_round() {
                Some((k, u)) => {
                    killed += k;
                    unkillable += u;
                }
                None => {
                    let (k, u) = self.kill_main_child();
                    killed += k;
                    unkillable += u;
                    break;
                }
            }
            if (killed, unkillable) == before {
                break;
            }
        }
        if self.is_pid1 {
            let _ = self.tree.kill(-1, Signal::KILL);
        }
        if killed > 0 {
            self.drain.note_killed(killed_at);
            self.log_killed(killed);
        }
        if unkillable > 0 {
            self.queue.push_back(Event::Unkillable(unkillable));
        }
        self.queue.push_back(Event::Killed(killed));
    }

    /// With `/proc` unreadable, what can still be reached is the main child and its
    /// group (and, as PID 1, everything: `kill_all` sent `kill(-1)`). Both were
    /// sent SIGKILL already; sent again, to learn the outcome for the main child.
    /// `(newly abandoned, newly unkillable)`.
    fn kill_main_child(&mut self) -> (usize, usize) {
        if !self.child_alive {
            return (0, 0);
        }
        let mut counts = (0, 0);
        let comm = self.tree.comm(self.child_pid).unwrap_or_default();
        match self.tree.kill(self.child_pid, Signal::KILL) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if self.ledger.unkillable(self.child_pid, comm) {
                    counts.1 = 1;
                    log::warn!(
                        "cannot kill the main child {}: not permitted; it is left running (unkillable)",
                        self.child_pid
                    );
                }
            }
            _ => {
                if self.ledger.abandon(self.child_pid, comm) {
                    counts.0 = 1;
                }
            }
        }
        self.send(-self.child_pid, Signal::KILL);
        counts
    }

    /// One walk of the tree that SIGKILLs every live descendant as it is found and
    /// records it; `(newly abandoned, newly unkillable)`, `None` when `/proc`
    /// cannot be read.
    fn kill_round(&mut self) -> Option<(usize, usize)> {
        if !self.proc_ok {
            return None;
        }
        if !self.is_pid1 && !self.tree.has_children() {
            return Some((0, 0));
        }
        let (me, helpers) = (self.me, self.helpers());
        let ledger = &mut self.ledger;
        let signalled = &mut self.signalled;
        let (mut killed, mut unkillable) = (0, 0);
        let mut leaders = HashSet::new();
        let mut groups = HashSet::new();
        let tree = self.tree.clone();
        let r = tree.visit(me, &helpers, &mut |p| {
            // Ended by itself (before the kill): not abandoned.
            if p.zombie && !p.killed {
                return;
            }
            if !p.zombie {
                if ledger.is_unkillable(p.pid) {
                    return;
                }
                if let Err(e) = tree.kill(p.pid, Signal::KILL)
                    && e.raw_os_error() == Some(libc::EPERM)
                {
                    if ledger.unkillable(p.pid, p.comm.clone()) {
                        unkillable += 1;
                        log::warn!(
                            "cannot kill {} ({}): not permitted; it is left running (unkillable)",
                            p.pid,
                            p.comm
                        );
                    }
                    return;
                }
                // Unreaped when read, so its group id is still its own.
                leaders.insert(p.pid);
                groups.insert(p.pgid);
            }
            // Killed: it gets no drain signal after this.
            signalled.insert(p.id());
            if ledger.abandon(p.pid, p.comm.clone()) {
                killed += 1;
            }
        });
        if let Err(e) = r {
            log::error!("reading /proc to find descendants failed: {e}");
            return None;
        }
        // Process groups led by a descendant (or the main child's, while it is
        // unreaped) also catch what forked between the read and the kill.
        for g in groups {
            if leaders.contains(&g) || (g == self.child_pid && self.child_alive) {
                let _ = self.tree.kill(-g, Signal::KILL);
            }
        }
        Some((killed, unkillable))
    }

    /// While the kill settles: SIGKILL drainit's live children (what the kill's
    /// walk could not see: a process forked as its parent was killed is
    /// re-parented to drainit). They are drainit's own and unreaped, so their
    /// pids cannot have been reused.
    fn chase(&mut self) {
        let Some(children) = self.own_children() else {
            return;
        };
        let (mut killed, mut unkillable) = (0, 0);
        for pid in children {
            // Killed already (and unreaped, so still that process): no read.
            if self.ledger.is_abandoned(pid) {
                continue;
            }
            let Some(p) = self.tree.stat_of(pid) else {
                continue;
            };
            if p.zombie || self.ledger.is_unkillable(pid) {
                continue;
            }
            match self.tree.kill(pid, Signal::KILL) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    if self.ledger.unkillable(pid, p.comm.clone()) {
                        unkillable += 1;
                        log::warn!(
                            "cannot kill {pid} ({}): not permitted; it is left running (unkillable)",
                            p.comm
                        );
                    }
                }
                _ => {
                    self.signalled.insert(p.id());
                    if self.ledger.abandon(pid, p.comm.clone()) {
                        killed += 1;
                    }
                }
            }
        }
        if unkillable > 0 {
            self.queue.push_back(Event::Unkillable(unkillable));
        }
        if killed > 0 {
            log::warn!("abandoned: SIGKILLed {killed} more process(es) started as the kill ran");
            self.queue.push_back(Event::Killed(killed));
        }
    }

    fn log_killed(&self, killed: usize) {
        const SHOWN: usize = 20;
        let all = self.ledger.abandoned();
        let mut names: Vec<String> = all
            .iter()
            .take(SHOWN)
            .map(|a| format!("{} ({})", a.pid, a.comm))
            .collect();
        if all.len() > SHOWN {
            names.push(format!("and {} more", all.len() - SHOWN));
        }
        log::warn!(
            "abandoned: SIGKILLed {killed} process(es): {}",
            names.join(", ")
        );
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
        self.reap_more = round.more;
        // A full round left zombies of drainit's own to reap: nothing can be
        // gone yet, and the next round comes at once.
        if !round.more {
            self.check_descendants(round.none_left);
        }
    }

    /// While the drain waits for descendants: notice when none is left (proven,
    /// see `Driver::nothing_left`); while a kill settles, kill what is
    /// still there. `none_left`: the reaper saw `ECHILD`.
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
        if self.nothing_left(none_left) {
            self.queue.push_back(Event::DescendantsGone);
        } else if self.drain.settling() {
            self.chase();
        }
    }

    /// A batch of signals read at once: the main child's exit read with it (if
    /// SIGCHLD is in the batch) goes where the machine orders it, each other
    /// signal is fed at once, then the reap round.
    fn on_signals(&mut self, received: Vec<signals::Received>) {
        let chld = received.iter().any(|r| r.signal == Signal::CHLD);
        let received: Vec<_> = received
            .into_iter()
            .filter(|r| r.signal != Signal::CHLD)
            .collect();
        // The main child's exit read with this batch goes where the
        // machine says (before the signals, or after the drain signal
        // that killed it).
        let exit = if chld {
            self.reaper.borrow_mut().reap_main()
        } else {
            None
        };
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
        if chld {
            self.on_sigchld();
        }
    }

    /// One signal of a batch (never SIGCHLD), fed to the machine at once: beat 1
    /// is taken before anything else, in this step.
    fn on_signal(&mut self, r: signals::Received) {
        if r.signal.is_reserved() {
            metrics::signal_received(&r.signal.to_string());
            log::warn!(
                "ignored signal {} from pid {}: the C library keeps it for itself",
                r.signal,
                r.sender
            );
            return;
        }
        log::debug!("received {} from pid {}", r.signal, r.sender);
        if crate::published::readyz_asked() {
            // Before the signal: a T0 now decides the delay by it.
            self.queue.push_back(Event::Routed);
        }
        self.queue.push_back(Event::Signal(r.signal));
        self.process();
        // Counted after the step that forwarded it: signal first, account after.
        metrics::signal_received(&r.signal.to_string());
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
        while self.reap_more {
            let round = self.reaper.borrow_mut().reap();
            for (pid, _) in &round.orphans {
                self.ledger.ended(*pid);
            }
            self.reap_more = round.more;
        }
        if let Some(alive) = self.descendants() {
            let alive: HashSet<(i32, u64)> = alive.iter().map(procs::Proc::id).collect();
            self.ledger.settle(&alive);
        }
        let teardown = self.teardown.report(self.drain.teardown());
        let t = self.drain.timeline();
        match outcome.reason {
            crate::drain::Reason::Drained => log::info!(
                "drained: {} process(es) finished in {}",
                self.ledger.completed(),
                fmt_ms(
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
            record: self.drain.record(),
            child_pid: self.child_pid,
            ledger: &self.ledger,
            teardown,
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
    Signals(Vec<signals::Received>),
    Ready,
    StepExited(Option<ChildExit>),
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

/// Sends `sig` to `target` (a pid, or a negated process group); failures are
/// logged but for `ESRCH`.
fn send_to(tree: &dyn Tree, target: i32, sig: Signal) {
    match tree.kill(target, sig) {
        Ok(()) => {}
        // ESRCH: the target is already gone (it races with its own exit).
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(e) => log::warn!("sending {sig} to {target} failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    //! The driver against a fake process tree, under paused time: what is
    //! signalled, when (virtual time from the first drain signal), and what the
    //! report says.
    use super::*;
    use std::collections::BTreeMap;
    use tokio::sync::mpsc;

    use crate::procs::Proc;
    use crate::reaper::{Waited, Waiter};

    const CHILD: i32 = 4_000_000;

    /// How a fake process answers a signal.
    #[derive(Clone, Copy)]
    enum Reacts {
        /// Exits (killed by the signal) this long after a TERM, INT or QUIT.
        ExitsAfter(Duration),
        /// Ignores everything but SIGKILL.
        Ignores,
    }

    struct FakeProc {
        pgid: i32,
        reacts: Reacts,
        /// Ended, not yet reaped.
        ended: Option<ChildExit>,
    }

    /// A tree of fake processes, all children of drainit. A process's end
    /// raises SIGCHLD on the driver's signal channel.
    struct FakeTree {
        me: i32,
        procs: RefCell<BTreeMap<i32, FakeProc>>,
        /// Every signal sent, with the virtual instant.
        sent: RefCell<Vec<(Instant, i32, Signal)>>,
        chld: mpsc::UnboundedSender<Vec<signals::Received>>,
        me_weak: RefCell<std::rc::Weak<FakeTree>>,
    }

    impl FakeTree {
        fn add(&self, pid: i32, pgid: i32, reacts: Reacts) {
            let p = FakeProc {
                pgid,
                reacts,
                ended: None,
            };
            self.procs.borrow_mut().insert(pid, p);
        }

        fn end(&self, pid: i32, exit: ChildExit) {
            if let Some(p) = self.procs.borrow_mut().get_mut(&pid)
                && p.ended.is_none()
            {
                p.ended = Some(exit);
            }
            let _ = self.chld.send(vec![received(Signal::CHLD)]);
        }

        fn proc(&self, pid: i32, p: &FakeProc) -> Proc {
            Proc {
                pid,
                ppid: self.me,
                pgid: p.pgid,
                comm: "fake".into(),
                start: 1,
                zombie: p.ended.is_some(),
                killed: p.ended == Some(ChildExit::Signal(Signal::KILL)),
                stopped: false,
                ended_by: match p.ended {
                    Some(ChildExit::Signal(s)) => s.0,
                    _ => 0,
                },
            }
        }

        fn deliver(&self, pid: i32, sig: Signal) {
            let reacts = match self.procs.borrow().get(&pid) {
                Some(p) if p.ended.is_none() => p.reacts,
                _ => return,
            };
            match (sig, reacts) {
                (Signal::KILL, _) => self.end(pid, ChildExit::Signal(Signal::KILL)),
                (sig, Reacts::ExitsAfter(d))
                    if [Signal::TERM, Signal::INT, Signal::QUIT].contains(&sig) =>
                {
                    let me = self.me_weak.borrow().upgrade().expect("the tree lives");
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(d).await;
                        me.end(pid, ChildExit::Signal(sig));
                    });
                }
                _ => {}
            }
        }
    }

    impl Tree for FakeTree {
        fn is_own_namespace(&self) -> bool {
            true
        }
        fn stat_of(&self, pid: i32) -> Option<Proc> {
            self.procs.borrow().get(&pid).map(|p| self.proc(pid, p))
        }
        fn comm(&self, _pid: i32) -> Option<String> {
            Some("fake".into())
        }
        fn descendants(&self, _root: i32, _exclude: &HashSet<i32>) -> std::io::Result<Vec<Proc>> {
            let procs = self.procs.borrow();
            Ok(procs
                .iter()
                .filter(|(_, p)| p.ended.is_none())
                .map(|(pid, p)| self.proc(*pid, p))
                .collect())
        }
        fn visit(
            &self,
            _root: i32,
            _exclude: &HashSet<i32>,
            f: &mut dyn FnMut(&Proc),
        ) -> std::io::Result<()> {
            let all: Vec<Proc> = {
                let procs = self.procs.borrow();
                procs.iter().map(|(pid, p)| self.proc(*pid, p)).collect()
            };
            all.iter().for_each(f);
            Ok(())
        }
        fn children(&self, _pid: i32) -> std::io::Result<Option<Vec<i32>>> {
            Ok(Some(self.procs.borrow().keys().copied().collect()))
        }
        fn kill(&self, target: i32, sig: Signal) -> std::io::Result<()> {
            self.sent.borrow_mut().push((Instant::now(), target, sig));
            let pids: Vec<i32> = {
                let procs = self.procs.borrow();
                procs
                    .iter()
                    .filter(|(pid, p)| match target {
                        -1 => true,
                        t if t < 0 => p.pgid == -t,
                        t => **pid == t,
                    })
                    .map(|(pid, _)| *pid)
                    .collect()
            };
            if pids.is_empty() {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            pids.into_iter().for_each(|pid| self.deliver(pid, sig));
            Ok(())
        }
    }

    impl Waiter for FakeTree {
        fn has_children(&self) -> bool {
            !self.procs.borrow().is_empty()
        }
        fn wait_pid(&self, pid: i32) -> Option<ChildExit> {
            let mut procs = self.procs.borrow_mut();
            let exit = procs.get(&pid)?.ended?;
            procs.remove(&pid);
            Some(exit)
        }
        fn wait_any(&self) -> Waited {
            let mut procs = self.procs.borrow_mut();
            let ended = procs.iter().find_map(|(pid, p)| p.ended.map(|e| (*pid, e)));
            match ended {
                Some((pid, exit)) => {
                    procs.remove(&pid);
                    Waited::Exited(pid, exit)
                }
                None if procs.is_empty() => Waited::NoChildren,
                None => Waited::NoneExited,
            }
        }
    }

    fn received(signal: Signal) -> signals::Received {
        signals::Received { signal, sender: 1 }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    struct World {
        tree: Rc<FakeTree>,
        signals_tx: mpsc::UnboundedSender<Vec<signals::Received>>,
        driver: Driver,
    }

    /// A driver over a fake tree with one main child (`CHILD`, reacting as
    /// `child`), configured by `flags`.
    fn world(flags: &[&str], child: Reacts) -> World {
        let (signals_tx, signals_rx) = mpsc::unbounded_channel();
        let tree = Rc::new(FakeTree {
            me: std::process::id() as i32,
            procs: RefCell::new(BTreeMap::new()),
            sent: RefCell::new(Vec::new()),
            chld: signals_tx.clone(),
            me_weak: RefCell::new(std::rc::Weak::new()),
        });
        *tree.me_weak.borrow_mut() = Rc::downgrade(&tree);
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
        let cfg = crate::config::load_from(args, &NoEnv).expect("valid flags");
        let reaper = Rc::new(RefCell::new(Reaper::with_waiter(tree.clone())));
        reaper.borrow_mut().set_main(CHILD);
        let (state_tx, _) = watch::channel(Published::new());
        let readiness = Readiness {
            checks: Checks::new(Vec::new(), reaper.clone()),
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
}
