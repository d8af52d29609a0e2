//! The drain: a pure state machine for the phases and beats of docs/processes-and-signals.md and the README's Exit codes.
//!
//! Owns: the drain's state (one [`State`] value; the published [`Phase`] is
//! derived from it), the drain timeline (T0, the forward at T0 + pre-drain delay,
//! the deadline at T0 + delay + drain timeout), the drain phases of docs/drain-phases.md
//! (after the delay, before the forward: each one's time on the shared budget,
//! its cancellation, its abandonment, its skip), the second-signal rule, the order
//! of a signal batch and the main child's exit read with it, the kill's settle
//! time, the teardown sequence and the exit code.
//!
//! Must not: do I/O, read a clock, or know about tokio or nix. The driver
//! (`driver.rs`) feeds it [`Event`]s stamped with a virtual instant ([`At`]),
//! carries out the [`Action`]s it returns (each carries all the data it needs),
//! and calls [`Drain::handle`] with [`Event::Tick`] once [`Drain::next_deadline`]
//! has passed. Every race of the drain is therefore a deterministic unit test: the
//! tests at the bottom are a table of `(state, event) → (state, actions)`, one row
//! per rule of docs/processes-and-signals.md and the README's Exit codes, and properties over random event sequences.
//!
//! Invariant: once a drain signal has been seen, the deadline never moves (but
//! once, earlier, when the drain phases end: it then counts from their end, never
//! past T0's bound of delay + phase budget + 1 s + drain timeout), and each
//! wait is cut short at most once (the second signal); the exit code is decided here
//! and nowhere else, and [`Action::Exit`] is returned exactly once.
use std::time::Duration;

use crate::exit;
use crate::signals::{RewriteMap, Signal};

/// A virtual instant: time since an epoch the driver picks (its start). Only differences matter.
pub type At = Duration;

/// Drain signals that arrive within this window of the first count as the first
/// (`timeout(1)` signals its child, then its own group: drainit gets two at once).
pub const COALESCE: Duration = Duration::from_millis(100);

/// After SIGKILL, how long to wait for the killed processes to be reaped before
/// carrying on regardless (a process in uninterruptible sleep cannot be waited for).
pub const KILL_SETTLE: Duration = Duration::from_secs(1);

/// A drain phase that overran its time is canceled (SIGTERM to its group); this
/// long after, if it is still there, it is SIGKILLed and counted `abandoned`
/// (docs/drain-phases.md).
pub const PHASE_KILL_AFTER: Duration = Duration::from_secs(1);

/// A drain phase that would get less than this of the phase budget is skipped.
pub const PHASE_MIN: Duration = Duration::from_millis(100);

/// The lifecycle phase, as `/readyz` publishes it (docs/processes-and-signals.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The child was spawned; readiness has never passed.
    Starting,
    /// Readiness passed once; serving.
    Ready,
    /// A drain signal was received; beats 2 and 3 run until every descendant is gone.
    Draining,
    /// The main child is gone (drained, or exited by itself); teardown runs.
    Stopping,
}

impl Phase {
    /// The word `/readyz` shows for this phase.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
        }
    }
}

/// How a process ended: `exit(N)` or killed by a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(Signal),
}

impl ChildExit {
    /// The shell convention: N, or 128 + S for a signal death (POSIX `sh`, "Exit Status").
    pub fn code(self) -> i32 {
        match self {
            ChildExit::Code(n) => n,
            ChildExit::Signal(s) => exit::signal_death(s.0),
        }
    }
}

/// What a second drain signal does (`--second-signal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondSignal {
    /// Cut short the pending wait: forward now in beat 2, SIGKILL now in beat 3.
    Skip,
    /// Change nothing (platforms that repeat the stop signal).
    Ignore,
}

/// The durations and signal rules the machine runs with.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Beat 2, charged from T0. Skipped when readiness never passed, and with
    /// `delay_needs_routing` when no [`Event::Routed`] came before T0.
    pub pre_drain_delay: Duration,
    /// The delay is the default outside Kubernetes (docs/processes-and-signals.md): it applies only
    /// when something routes by drainit's readiness.
    pub delay_needs_routing: bool,
    /// Beat 3: the deadline is T0 + pre-drain delay + drain timeout. With no drain
    /// signal, the leftover descendants get this much time from the child's exit.
    pub drain_timeout: Duration,
    /// One entry per teardown step: that step's timeout.
    pub teardown_timeouts: Vec<Duration>,
    /// Signals that start a drain (default TERM, INT, QUIT). Never empty.
    pub drain_signals: Vec<Signal>,
    pub second_signal: SecondSignal,
    /// Applied to everything forwarded, the drain signal at beat 3 included.
    pub rewrite: RewriteMap,
    /// An admission gate (the proxy, docs/proxy.md) carries the app's requests: beat
    /// 3 closes admission first, and the drain signal goes on once no request is
    /// in flight ([`Event::RequestsDone`]), or not at all when the deadline comes
    /// first.
    pub admission_gate: bool,
    /// One entry per drain phase (docs/drain-phases.md), in order: its `max` (`None`:
    /// everything left of the budget).
    pub phase_maxes: Vec<Option<Duration>>,
    /// The phases' shared budget, counted from the first phase's start.
    pub phase_budget: Duration,
}

/// After SIGKILL, while the killed processes keep dying (fewer alive at each look),
/// the settle is extended by [`KILL_SETTLE`] at a time, up to this long after the
/// kill: thousands of processes killed at once take the kernel more than a second
/// to tear down on a small machine.
pub const SETTLE_MAX: Duration = Duration::from_secs(10);

/// Something that happened, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A signal was received (never SIGCHLD: the driver reaps on it).
    Signal(Signal),
    /// Every readiness check passed (once).
    ReadinessPassed,
    /// Something routes by drainit's readiness: a client has asked `/readyz`.
    Routed,
    /// The main child was reaped.
    ChildExited(ChildExit),
    /// The main child is gone and no descendant is left (proven by the driver).
    /// Meaningful only once [`Event::ChildExited`] came: the main child is a
    /// descendant.
    DescendantsGone,
    /// The result of [`Action::KillAll`]: how many processes were SIGKILLed (also
    /// sent again while the kill settles, for what a kill round missed).
    Killed(usize),
    /// Processes drainit could not signal (`EPERM`): they are neither completed nor
    /// abandoned, and the drain is not clean. Sent before the [`Event::Killed`] of
    /// the same round.
    Unkillable(usize),
    /// The answer to [`Action::CountAlive`]: the live descendants now, `None` when
    /// they cannot be counted (`/proc` unreadable).
    Alive(Option<usize>),
    /// The running teardown step ended; `ok` when it exited 0.
    TeardownExited { ok: bool },
    /// [`Drain::next_deadline`] has passed.
    Tick,
    /// The running drain phase ended; `ok`: exit 0, or a status below 400.
    PhaseExited { ok: bool },
    /// With an admission gate, after [`Action::CloseAdmission`]: no admitted
    /// request is in flight any more.
    RequestsDone,
}

/// What beat 1 (or, with no drain signal, the main child's exit) started: the data
/// the driver logs with the in-flight count and writes in the partial report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    /// The drain signal as received; `None` when the main child exited by itself.
    pub signal: Option<Signal>,
    /// The pre-drain delay that applies (zero when skipped).
    pub pre_drain_delay: Duration,
    /// Why the delay is what it is; `None` with no drain signal.
    pub delay_why: Option<DelayWhy>,
    /// From T0 to the SIGKILL deadline.
    pub to_deadline: Duration,
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this (already rewritten) signal to the main child, or its group with
    /// `--forward-to group`.
    Forward(Signal),
    /// Beat 1: count the live descendants now, before anything else, and log the
    /// start of the drain (or of the stop window) with them.
    SampleInFlight(Start),
    /// Beat 3: send the (rewritten) drain signal to the main child or its group,
    /// and remember who got it.
    ForwardDrain(Signal),
    /// Beat 3 with an admission gate: every new request is answered 503 from now
    /// on; answer [`Event::RequestsDone`] once no admitted request is in flight
    /// (at once when none is).
    CloseAdmission,
    /// drainit is about to SIGKILL the app (the deadline, or a second signal in
    /// beat 3) with requests maybe in flight: they are `abandoned` (cut by
    /// drainit) before the SIGKILL that follows.
    AbandonRequests,
    /// Send the signal to every descendant drainit has not signalled yet (once each).
    SignalRemaining(Signal),
    /// Write the report so far to the report file (`"final":false`), once this
    /// step's signals are sent.
    PartialReport,
    /// SIGKILL every descendant and report back with [`Event::Killed`].
    KillAll,
    /// The kill's settle ran out: count the live descendants and report back with
    /// [`Event::Alive`] (the settle is extended while they keep dying).
    CountAlive,
    /// The settle was extended: this many killed processes are still dying.
    StillDying(usize),
    /// Start drain phase `index`, telling it `budget` (its time, already in the
    /// next deadline), and log its start.
    StartPhase { index: usize, budget: Duration },
    /// Drain phase `i` ran out of time or was cut by a second signal: SIGTERM its
    /// process group (a `post` is dropped, and ends at once: answer
    /// [`Event::PhaseExited`]).
    CancelPhase(usize),
    /// Drain phase `i` ignored its cancellation: SIGKILL its process group.
    KillPhase(usize),
    /// Drain phase `i` ended (or was skipped): its end is the last of
    /// [`Record::phases`]; log and count it.
    PhaseEnded(usize),
    /// Start teardown step `i` (its timeout is already in the next deadline).
    StartTeardown(usize),
    /// Teardown step `i` ran out of time: SIGKILL it (its process group).
    KillTeardown(usize),
    /// All is done: write the report and exit.
    Exit(Outcome),
}

/// Why drainit exits (the report's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Drained,
    Abandoned,
    /// Nothing was abandoned, but a process drainit could not signal (`EPERM`)
    /// was left running.
    Unkillable,
    TeardownFailed,
    ChildExited,
    SpawnFailed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Drained => "drained",
            Reason::Abandoned => "abandoned",
            Reason::Unkillable => "unkillable",
            Reason::TeardownFailed => "teardown_failed",
            Reason::ChildExited => "child_exited",
            Reason::SpawnFailed => "spawn_failed",
        }
    }
}

/// drainit's exit code and reason (README, Exit codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub code: i32,
    pub reason: Reason,
}

/// How one teardown step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEnd {
    Ok,
    Failed,
    TimedOut,
    /// Killed by a second drain signal.
    Cut,
    /// Not run: a second drain signal cut the teardown short before it.
    Skipped,
}

/// How one drain phase ended (docs/drain-phases.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseEnd {
    Ok,
    /// Exit ≠ 0, a status ≥ 400, refused, or it could not be started.
    Failed,
    /// It overran its time, was canceled, and ended within [`PHASE_KILL_AFTER`].
    TimedOut,
    /// It was canceled by a second drain signal and ended within
    /// [`PHASE_KILL_AFTER`].
    Canceled,
    /// It ignored its cancellation and was SIGKILLed (exit 2).
    Abandoned,
    /// Not run: under [`PHASE_MIN`] of the budget left, or a second signal.
    Skipped,
}

impl PhaseEnd {
    /// The word the report, the log and `/metrics` use.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseEnd::Ok => "ok",
            PhaseEnd::Failed => "failed",
            PhaseEnd::TimedOut => "timed_out",
            PhaseEnd::Canceled => "canceled",
            PhaseEnd::Abandoned => "abandoned",
            PhaseEnd::Skipped => "skipped",
        }
    }
}

/// One drain phase, as it ran: its end and its instants (virtual, [`At`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseRun {
    pub end: PhaseEnd,
    pub started_at: At,
    pub ended_at: At,
}

/// Why the pre-drain delay at T0 is what it is, for the T0 log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayWhy {
    /// Readiness never passed: nothing was routed to the app; skipped.
    NeverReady,
    /// The configured (or Kubernetes default) delay applies.
    Applies,
    /// The default applies: a client asked `/readyz`.
    Routed,
    /// The default is 0: outside Kubernetes and no client asked `/readyz`.
    NotRouted,
}

/// The drain's timeline, for the report. All instants are virtual ([`At`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// T0: the first drain signal (or, with none, the main child's exit).
    pub t0: Option<At>,
    /// The pre-drain delay actually applied (zero when skipped).
    pub pre_drain_delay: Duration,
    /// When the drain signal was sent on (beat 3): the machine's instant, replaced
    /// by the instant the signal was actually sent ([`Drain::note_forwarded`]).
    pub forwarded_at: Option<At>,
    /// When the drain's SIGKILL was sent ([`Drain::note_killed`]); `None` when
    /// nothing was killed.
    pub killed_at: Option<At>,
    /// When every descendant was gone (or the kill settled).
    pub finished_at: Option<At>,
    /// The instant of the SIGKILL deadline.
    pub deadline: Option<At>,
}

/// The drain's state: what the machine waits for. The published [`Phase`] is
/// derived from it ([`Drain::phase`]); the facts gathered on the way (drain
/// signal, child exit, counts, timeline, teardown ends) are the run's [`Record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The child was spawned; readiness has never passed. `routed`: a client has
    /// asked `/readyz`.
    Starting { routed: bool },
    /// Readiness passed once; serving.
    Ready { routed: bool },
    /// Beat 2: the forward is due at T0 + pre-drain delay.
    PreDrain,
    /// Beat 2, after the delay: drain phase `i` runs until `until` (its
    /// `min(max, budget left)`; once `canceled`, [`PHASE_KILL_AFTER`] more).
    /// `cut`: a second signal canceled it, and the rest are skipped.
    Phases {
        i: usize,
        started_at: At,
        until: At,
        canceled: bool,
        cut: bool,
        second_used: bool,
    },
    /// Beat 3 with an admission gate: admission is closed; the drain signal waits
    /// for the requests in flight ([`Event::RequestsDone`]) until the deadline.
    Admission { second_used: bool },
    /// Beat 3 (or the stop window): waiting for the descendants until the
    /// deadline. `second_used`: a second drain signal already cut a wait.
    Waiting { second_used: bool },
    /// SIGKILL was sent at `killed_at`; waiting for the reaps until `until`.
    /// `alive`: the live descendants at the last look (at first, those the kill
    /// killed); `counting`: [`Action::CountAlive`] is awaited.
    Killing {
        until: At,
        killed_at: At,
        alive: Option<usize>,
        counting: bool,
        second_used: bool,
    },
    /// Teardown step `step` runs until `until`.
    Teardown {
        step: usize,
        until: At,
        second_used: bool,
    },
    /// Teardown step `step` was killed; waiting for its reap until `until`.
    TeardownKilled {
        step: usize,
        until: At,
        second_used: bool,
    },
    /// Teardown is over; the final sweep (SIGKILL to whatever a step left behind)
    /// was asked for and its [`Event::Killed`] is awaited.
    Sweep,
    /// Done: [`Action::Exit`] was returned with this outcome.
    Exited(Outcome),
}

/// The run's record: the facts the machine gathered, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The first drain signal received (as received, before rewriting).
    pub drain_signal: Option<Signal>,
    /// Why the pre-drain delay is what it is; `None` before T0 (and with no
    /// drain signal).
    pub delay_why: Option<DelayWhy>,
    /// How the main child ended, once reaped.
    pub child_exit: Option<ChildExit>,
    /// Processes SIGKILLed (abandoned), as reported by [`Event::Killed`].
    pub abandoned: usize,
    /// Processes drainit could not signal, as reported by [`Event::Unkillable`].
    pub unkillable: usize,
    /// Requests lost from T0 on (`unknown` or `abandoned` in the proxy's ledger),
    /// as given to [`Drain::settle_requests`] at the exit.
    pub requests_lost: usize,
    pub timeline: Timeline,
    /// How each teardown step ended, in order (steps not reached are absent).
    pub teardown: Vec<StepEnd>,
    /// How each drain phase ended, in order (phases not reached are absent).
    pub phases: Vec<PhaseRun>,
    /// When the phase budget runs out (the first phase's start + budget).
    pub phase_budget_end: Option<At>,
    /// A second drain signal canceled the phases (the rest are skipped).
    pub phases_cut: bool,
}

/// The drain state machine. See the module docs.
#[derive(Debug)]
pub struct Drain {
    policy: Policy,
    state: State,
    record: Record,
}

impl Drain {
    /// A machine in `starting`, for a child that was just spawned.
    pub fn new(policy: Policy) -> Drain {
        Drain {
            policy,
            state: State::Starting { routed: false },
            record: Record::default(),
        }
    }

    /// The state (for tests and the driver's scheduling).
    pub fn state(&self) -> State {
        self.state
    }

    /// The facts gathered so far.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The phase `/readyz` publishes, derived from the state: draining from the
    /// first drain signal until no descendant is left (or the kill settled),
    /// stopping after, or at once when the main child exited by itself.
    pub fn phase(&self) -> Phase {
        match self.state {
            State::Starting { .. } => Phase::Starting,
            State::Ready { .. } => Phase::Ready,
            State::PreDrain
            | State::Phases { .. }
            | State::Admission { .. }
            | State::Waiting { .. }
            | State::Killing { .. }
                if self.record.drain_signal.is_some() =>
            {
                Phase::Draining
            }
            _ => Phase::Stopping,
        }
    }

    /// The first drain signal received (as received, before rewriting).
    pub fn drain_signal(&self) -> Option<Signal> {
        self.record.drain_signal
    }

    pub fn child_exit(&self) -> Option<ChildExit> {
        self.record.child_exit
    }

    pub fn timeline(&self) -> Timeline {
        self.record.timeline
    }

    /// Why the pre-drain delay is what it is; `None` before T0 (and with no drain
    /// signal).
    pub fn delay_why(&self) -> Option<DelayWhy> {
        self.record.delay_why
    }

    /// Records when the drain signal was actually sent (the driver sends it after
    /// the machine decided, and the report gives the time of the signal).
    pub fn note_forwarded(&mut self, at: At) {
        if self.record.timeline.forwarded_at.is_some() {
            self.record.timeline.forwarded_at = Some(at);
        }
    }

    /// Records when the drain's first SIGKILL was sent (later kills keep it). The
    /// sweep of what teardown steps left behind comes after the drain finished and
    /// is not the drain's kill: `killed_at` stays as it was (never after
    /// `finished_at`).
    pub fn note_killed(&mut self, at: At) {
        let t = &mut self.record.timeline;
        if t.t0.is_some() && t.killed_at.is_none() && t.finished_at.is_none() {
            t.killed_at = Some(at);
        }
    }

    /// How each teardown step ended, in order (steps not reached are absent).
    pub fn teardown(&self) -> &[StepEnd] {
        &self.record.teardown
    }

    /// Whether the driver should watch for [`Event::DescendantsGone`].
    pub fn waits_for_descendants(&self) -> bool {
        self.record.child_exit.is_some()
            && matches!(
                self.state,
                State::PreDrain
                    | State::Admission { .. }
                    | State::Waiting { .. }
                    | State::Killing { .. }
            )
    }

    /// Whether the drain's SIGKILL settles: what the driver still finds alive is
    /// killed too, and reaps go before the settle's end.
    pub fn settling(&self) -> bool {
        matches!(self.state, State::Killing { .. }) && self.waits_for_descendants()
    }

    /// Beat 3 (or the stop window after the main child's own exit): the drain
    /// signal was sent on and the remaining descendants are waited for until the
    /// deadline (the driver reports progress meanwhile).
    pub fn awaits_deadline(&self) -> bool {
        matches!(self.state, State::Waiting { .. })
    }

    /// The next instant at which the driver must send [`Event::Tick`]; `None` when
    /// nothing is timed (idle costs nothing).
    pub fn next_deadline(&self) -> Option<At> {
        let t = &self.record.timeline;
        match self.state {
            State::PreDrain => Some(t.t0? + t.pre_drain_delay),
            State::Phases { until, .. } => Some(until),
            State::Admission { .. } | State::Waiting { .. } => t.deadline,
            State::Killing {
                until,
                counting: false,
                ..
            }
            | State::Teardown { until, .. }
            | State::TeardownKilled { until, .. } => Some(until),
            _ => None,
        }
    }

    /// The order in which one batch of signals, read at once, and the main
    /// child's exit reaped with it are fed to the machine. The main child may
    /// have exited before the other signals of the batch were sent: its exit comes
    /// first, unless a drain signal of this very batch killed it: the stop signal
    /// reached both at once (systemd's `KillMode=control-group`,
    /// `kill -TERM -- -PGID`). That is a drain, not a crash.
    pub fn order_batch(&self, signals: &[Signal], child: Option<ChildExit>) -> Vec<Event> {
        let mut events: Vec<Event> = signals.iter().map(|s| Event::Signal(*s)).collect();
        match child {
            Some(ChildExit::Signal(s)) if self.is_drain_signal(s) && signals.contains(&s) => {
                events.push(Event::ChildExited(ChildExit::Signal(s)));
            }
            Some(exit) => events.insert(0, Event::ChildExited(exit)),
            None => {}
        }
        events
    }

    /// What signal `s` is forwarded as, at once, whatever the phase: a signal
    /// that is not a drain signal, rewritten (`None`: a drain signal, one
    /// rewritten to 0, or drainit has exited). The driver sends it as soon as it
    /// is read (`forward_at_once`) and only accounts for it in its step; it
    /// knows whether a child or its group is still there to get it.
    pub fn forwarded_at_once(&self, s: Signal) -> Option<Signal> {
        if matches!(self.state, State::Exited(_)) || self.is_drain_signal(s) {
            return None;
        }
        self.policy.rewrite.apply(s)
    }

    /// Whether `s` starts (or, a second time, hastens) a drain.
    pub fn is_drain_signal(&self, s: Signal) -> bool {
        self.policy.drain_signals.contains(&s)
    }

    /// The signal sent on at beat 3 (and to leftovers): the first drain signal, or
    /// the first configured one when the child exited by itself; rewritten.
    fn outgoing(&self) -> Option<Signal> {
        let s = self
            .record
            .drain_signal
            .unwrap_or(self.policy.drain_signals[0]);
        self.policy.rewrite.apply(s)
    }

    /// In beat 2 without an admission gate, while the main child lives: when
    /// the drain signal is due (T0 + the pre-drain delay) and which signal it
    /// is (after `--rewrite`), for a step that could outlast it (beat 1's walk
    /// of a large tree) to send it on time. `None` otherwise.
    pub fn due_forward(&self) -> Option<(At, Signal)> {
        if !matches!(self.state, State::PreDrain)
            || self.policy.admission_gate
            || self.record.child_exit.is_some()
        {
            return None;
        }
        let t = &self.record.timeline;
        Some((t.t0? + t.pre_drain_delay, self.outgoing()?))
    }

    /// Feeds one event at virtual instant `now`; returns the actions to carry out,
    /// in order.
    pub fn handle(&mut self, now: At, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if matches!(self.state, State::Exited(_)) {
            return out; // exactly one exit; nothing after it
        }
        match event {
            Event::Signal(s) if self.is_drain_signal(s) => self.on_drain_signal(now, s, &mut out),
            Event::Signal(s) => {
                if let Some(s) = self.forwarded_at_once(s) {
                    out.push(Action::Forward(s));
                }
            }
            Event::ReadinessPassed => {
                if let State::Starting { routed } = self.state {
                    self.state = State::Ready { routed };
                }
            }
            Event::Routed => match &mut self.state {
                State::Starting { routed } | State::Ready { routed } => *routed = true,
                _ => {}
            },
            Event::ChildExited(exit) => self.on_child_exit(now, exit, &mut out),
            Event::DescendantsGone => {
                if self.waits_for_descendants() {
                    self.finish_drain(now, &mut out);
                }
            }
            Event::Unkillable(n) => self.record.unkillable += n,
            Event::Killed(n) => {
                self.record.abandoned += n;
                match &mut self.state {
                    State::Sweep => self.exit(&mut out),
                    State::Killing { alive, .. } if alive.is_none() => *alive = Some(n),
                    _ => {}
                }
            }
            Event::Alive(n) => self.on_alive(now, n, &mut out),
            Event::TeardownExited { ok } => match self.state {
                State::Teardown { step, .. } => {
                    let end = if ok { StepEnd::Ok } else { StepEnd::Failed };
                    self.record.teardown.push(end);
                    self.next_teardown(now, step + 1, &mut out);
                }
                State::TeardownKilled { step, .. } => self.teardown_killed(now, step, &mut out),
                _ => {}
            },
            Event::Tick => self.on_tick(now, &mut out),
            Event::PhaseExited { ok } => {
                if let State::Phases {
                    i,
                    started_at,
                    canceled,
                    cut,
                    second_used,
                    ..
                } = self.state
                {
                    let end = match (ok, canceled, cut) {
                        (_, true, true) => PhaseEnd::Canceled,
                        (_, true, false) => PhaseEnd::TimedOut,
                        (true, false, _) => PhaseEnd::Ok,
                        (false, false, _) => PhaseEnd::Failed,
                    };
                    self.end_phase(now, i, started_at, end, cut, second_used, &mut out);
                }
            }
            Event::RequestsDone => {
                if let State::Admission { second_used } = self.state {
                    self.forward_drain(now, second_used, &mut out);
                }
            }
        }
        out
    }

    /// Beat 1, or a second signal.
    fn on_drain_signal(&mut self, now: At, s: Signal, out: &mut Vec<Action>) {
        let (ever_ready, routed) = match self.state {
            State::Starting { routed } => (false, routed),
            State::Ready { routed } => (true, routed),
            _ => return self.on_second_signal(now, out),
        };
        // Beat 1: phase and sample in one step, before anything else.
        let why = if !ever_ready {
            DelayWhy::NeverReady
        } else if !self.policy.delay_needs_routing {
            DelayWhy::Applies
        } else if routed {
            DelayWhy::Routed
        } else {
            DelayWhy::NotRouted
        };
        let delay = match why {
            DelayWhy::Applies | DelayWhy::Routed => self.policy.pre_drain_delay,
            DelayWhy::NeverReady | DelayWhy::NotRouted => Duration::ZERO,
        };
        let bound = self.phase_bound();
        let r = &mut self.record;
        r.drain_signal = Some(s);
        r.delay_why = Some(why);
        r.timeline.t0 = Some(now);
        r.timeline.pre_drain_delay = delay;
        // With phases, the deadline is counted from their end (docs/drain-phases.md): at
        // T0 it is the latest it can be, and it is set when they end.
        r.timeline.deadline = Some(now + delay + bound + self.policy.drain_timeout);
        out.push(Action::SampleInFlight(Start {
            signal: Some(s),
            pre_drain_delay: delay,
            delay_why: Some(why),
            to_deadline: delay + bound + self.policy.drain_timeout,
        }));
        if delay.is_zero() {
            self.start_phases(now, false, out);
        } else {
            self.state = State::PreDrain;
            // Evidence for a platform that SIGKILLs drainit mid-drain.
            out.push(Action::PartialReport);
        }
    }

    /// A drain signal after the first (or while stopping): cuts the pending wait
    /// short, once.
    fn on_second_signal(&mut self, now: At, out: &mut Vec<Action>) {
        if let (Some(t0), Some(_)) = (self.record.timeline.t0, self.record.drain_signal)
            && now.saturating_sub(t0) < COALESCE
        {
            return; // counts as the first
        }
        if self.policy.second_signal == SecondSignal::Ignore {
            return;
        }
        match self.state {
            State::PreDrain => self.start_phases(now, true, out),
            State::Phases {
                i,
                started_at,
                canceled,
                second_used: false,
                ..
            } => {
                self.record.phases_cut = true;
                self.state = State::Phases {
                    i,
                    started_at,
                    until: if canceled {
                        self.next_deadline().unwrap_or(now)
                    } else {
                        now + PHASE_KILL_AFTER
                    },
                    canceled: true,
                    cut: true,
                    second_used: true,
                };
                if !canceled {
                    out.push(Action::CancelPhase(i));
                }
            }
            // The wait for the requests in flight is cut: the signal goes now.
            State::Admission { second_used: false } => self.forward_drain(now, true, out),
            State::Waiting { second_used: false } => self.kill_all(now, true, out),
            State::Teardown {
                step,
                second_used: false,
                ..
            } => {
                self.record.teardown.push(StepEnd::Cut);
                self.state = State::TeardownKilled {
                    step,
                    until: now + KILL_SETTLE,
                    second_used: true,
                };
                out.push(Action::KillTeardown(step));
            }
            // Already used, already killing, or nothing left to cut.
            _ => {}
        }
    }

    fn on_child_exit(&mut self, now: At, exit: ChildExit, out: &mut Vec<Action>) {
        if self.record.child_exit.is_some() {
            return; // reaped once
        }
        self.record.child_exit = Some(exit);
        match self.state {
            State::Starting { .. } | State::Ready { .. } => {
                // No drain signal: straight to stopping; leftovers get the drain
                // signal and the drain timeout, counted from this exit.
                let t = &mut self.record.timeline;
                t.t0 = Some(now);
                t.forwarded_at = Some(now);
                t.deadline = Some(now + self.policy.drain_timeout);
                out.push(Action::SampleInFlight(Start {
                    signal: None,
                    pre_drain_delay: Duration::ZERO,
                    delay_why: None,
                    to_deadline: self.policy.drain_timeout,
                }));
                if let Some(s) = self.outgoing() {
                    out.push(Action::SignalRemaining(s));
                }
                self.state = State::Waiting { second_used: false };
            }
            // The main child went while admitted requests were in flight: what
            // it left gets the drain signal now, as after a forward.
            State::Admission { second_used } => {
                self.record.timeline.forwarded_at = Some(now);
                self.state = State::Waiting { second_used };
                if let Some(s) = self.outgoing() {
                    out.push(Action::SignalRemaining(s));
                }
                out.push(Action::PartialReport);
            }
            // Beat 3: whatever is left gets the drain signal now. (Beat 2: the
            // forward still happens at T0 + delay, to what is left.)
            State::Waiting { .. } => {
                if let Some(s) = self.outgoing() {
                    out.push(Action::SignalRemaining(s));
                }
            }
            _ => {}
        }
    }

    fn on_tick(&mut self, now: At, out: &mut Vec<Action>) {
        match self.next_deadline() {
            Some(due) if now >= due => {}
            _ => return,
        }
        match self.state {
            State::PreDrain => self.start_phases(now, false, out),
            State::Phases {
                i,
                started_at,
                canceled: false,
                cut,
                second_used,
                ..
            } => {
                self.state = State::Phases {
                    i,
                    started_at,
                    until: now + PHASE_KILL_AFTER,
                    canceled: true,
                    cut,
                    second_used,
                };
                out.push(Action::CancelPhase(i));
            }
            State::Phases {
                i,
                started_at,
                canceled: true,
                cut,
                second_used,
                ..
            } => {
                out.push(Action::KillPhase(i));
                self.end_phase(
                    now,
                    i,
                    started_at,
                    PhaseEnd::Abandoned,
                    cut,
                    second_used,
                    out,
                );
            }
            State::Admission { second_used } | State::Waiting { second_used } => {
                self.kill_all(now, second_used, out);
            }
            State::Killing {
                killed_at,
                alive: Some(_),
                ..
            } if self.record.child_exit.is_some() && now < killed_at + SETTLE_MAX => {
                // Are the killed processes still dying? Asked, not assumed.
                if let State::Killing { counting, .. } = &mut self.state {
                    *counting = true;
                }
                out.push(Action::CountAlive);
            }
            // The settle ran out. A main child that cannot be reaped (stuck in
            // uninterruptible sleep, frozen) must not hold drainit: go on without
            // its status.
            State::Killing { .. } => self.finish(now, out),
            State::Teardown {
                step, second_used, ..
            } => {
                self.state = State::TeardownKilled {
                    step,
                    until: now + KILL_SETTLE,
                    second_used,
                };
                out.push(Action::KillTeardown(step));
            }
            // A killed step that cannot be reaped (uninterruptible sleep): go on.
            State::TeardownKilled { step, .. } => self.teardown_killed(now, step, out),
            _ => {}
        }
    }

    /// The answer to [`Action::CountAlive`]: while fewer are alive than at the last
    /// look, the settle is extended; a process that cannot die (uninterruptible
    /// sleep) makes no progress, and the settle ends.
    fn on_alive(&mut self, now: At, n: Option<usize>, out: &mut Vec<Action>) {
        let State::Killing {
            until,
            alive,
            counting: true,
            ..
        } = &mut self.state
        else {
            return;
        };
        let prev = alive.unwrap_or(0);
        match n {
            Some(n) if n > 0 && n < prev => {
                *alive = Some(n);
                *until = now + KILL_SETTLE;
                if let State::Killing { counting, .. } = &mut self.state {
                    *counting = false;
                }
                out.push(Action::StillDying(n));
            }
            _ => self.finish(now, out),
        }
    }

    /// The killed teardown step `i` was reaped, or its settle time ran out.
    fn teardown_killed(&mut self, now: At, i: usize, out: &mut Vec<Action>) {
        let cut = self.record.teardown.len() > i;
        if !cut {
            self.record.teardown.push(StepEnd::TimedOut);
            self.next_teardown(now, i + 1, out);
        } else {
            // A second signal cut it: the rest is skipped.
            let n = self.policy.teardown_timeouts.len();
            self.record.teardown.resize(n, StepEnd::Skipped);
            self.end_teardown(out);
        }
    }

    /// The most the phases can take: the budget, and the cancellation of the
    /// last one (zero without phases).
    fn phase_bound(&self) -> Duration {
        if self.policy.phase_maxes.is_empty() {
            Duration::ZERO
        } else {
            self.policy.phase_budget + PHASE_KILL_AFTER
        }
    }

    /// The pre-drain delay ended (or was cut): the drain phases run, one after
    /// another, on one budget; with none (or the main child gone: nothing serves
    /// any more), beat 3 starts now.
    fn start_phases(&mut self, now: At, second_used: bool, out: &mut Vec<Action>) {
        if self.policy.phase_maxes.is_empty() || self.record.child_exit.is_some() {
            return self.end_phases(now, second_used, out);
        }
        self.record.phase_budget_end = Some(now + self.policy.phase_budget);
        self.next_phase(now, 0, second_used, out);
    }

    /// Starts phase `i`, or skips it (and the next) when under [`PHASE_MIN`] of
    /// the budget is left; after the last, beat 3.
    fn next_phase(&mut self, now: At, mut i: usize, second_used: bool, out: &mut Vec<Action>) {
        let budget_end = self.record.phase_budget_end.unwrap_or(now);
        while let Some(max) = self.policy.phase_maxes.get(i) {
            let left = budget_end.saturating_sub(now);
            if left < PHASE_MIN {
                self.skip_phase(now, i, out);
                i += 1;
                continue;
            }
            let budget = max.map_or(left, |m| m.min(left));
            self.state = State::Phases {
                i,
                started_at: now,
                until: now + budget,
                canceled: false,
                cut: false,
                second_used,
            };
            out.push(Action::StartPhase { index: i, budget });
            return;
        }
        self.end_phases(now, second_used, out);
    }

    fn skip_phase(&mut self, now: At, i: usize, out: &mut Vec<Action>) {
        self.record.phases.push(PhaseRun {
            end: PhaseEnd::Skipped,
            started_at: now,
            ended_at: now,
        });
        out.push(Action::PhaseEnded(i));
    }

    /// Phase `i` ended (`end`); a cut phase skips the rest.
    #[allow(clippy::too_many_arguments)]
    fn end_phase(
        &mut self,
        now: At,
        i: usize,
        started_at: At,
        end: PhaseEnd,
        cut: bool,
        second_used: bool,
        out: &mut Vec<Action>,
    ) {
        self.record.phases.push(PhaseRun {
            end,
            started_at,
            ended_at: now,
        });
        out.push(Action::PhaseEnded(i));
        if cut {
            for j in i + 1..self.policy.phase_maxes.len() {
                self.skip_phase(now, j, out);
            }
            self.end_phases(now, second_used, out);
        } else {
            self.next_phase(now, i + 1, second_used, out);
        }
    }

    /// The phases are over (or there were none): beat 3. With phases, the
    /// deadline is counted from now (it only comes earlier than T0's bound).
    fn end_phases(&mut self, now: At, second_used: bool, out: &mut Vec<Action>) {
        if self.record.phase_budget_end.is_some() {
            let t = &mut self.record.timeline;
            let d = now + self.policy.drain_timeout;
            t.deadline = Some(t.deadline.map_or(d, |old| old.min(d)));
        }
        self.close_admission(now, second_used, out);
    }

    /// Beat 3: with an admission gate, admission closes first and the forward
    /// waits for the requests in flight; without one, the forward is now.
    fn close_admission(&mut self, now: At, second_used: bool, out: &mut Vec<Action>) {
        if self.policy.admission_gate && self.record.child_exit.is_none() {
            self.state = State::Admission { second_used };
            out.push(Action::CloseAdmission);
        } else {
            self.forward_drain(now, second_used, out);
        }
    }

    fn forward_drain(&mut self, now: At, second_used: bool, out: &mut Vec<Action>) {
        self.record.timeline.forwarded_at = Some(now);
        self.state = State::Waiting { second_used };
        if let Some(s) = self.outgoing() {
            if self.record.child_exit.is_none() {
                out.push(Action::ForwardDrain(s));
            } else {
                out.push(Action::SignalRemaining(s));
            }
            out.push(Action::PartialReport);
        }
    }

    fn kill_all(&mut self, now: At, second_used: bool, out: &mut Vec<Action>) {
        // What the proxy still has in flight is cut by drainit's SIGKILL, the
        // deadline's or a second signal's: `abandoned`, not the app's `unknown`.
        if self.policy.admission_gate {
            out.push(Action::AbandonRequests);
        }
        self.state = State::Killing {
            until: now + KILL_SETTLE,
            killed_at: now,
            alive: None,
            counting: false,
            second_used,
        };
        out.push(Action::KillAll);
    }

    /// The drain (or the stop window) is over: every descendant is gone, or the
    /// kill settled. Teardown next.
    fn finish_drain(&mut self, now: At, out: &mut Vec<Action>) {
        if self.record.child_exit.is_none() {
            return; // the main child is a descendant; not gone yet
        }
        self.finish(now, out);
    }

    fn finish(&mut self, now: At, out: &mut Vec<Action>) {
        self.record.timeline.finished_at = Some(now);
        self.next_teardown(now, 0, out);
    }

    /// Whether a second drain signal already cut a wait (it cuts at most one).
    fn second_used(&self) -> bool {
        match self.state {
            State::Phases { second_used, .. }
            | State::Admission { second_used }
            | State::Waiting { second_used }
            | State::Killing { second_used, .. }
            | State::Teardown { second_used, .. }
            | State::TeardownKilled { second_used, .. } => second_used,
            _ => false,
        }
    }

    fn next_teardown(&mut self, now: At, i: usize, out: &mut Vec<Action>) {
        let second_used = self.second_used();
        match self.policy.teardown_timeouts.get(i) {
            Some(t) => {
                self.state = State::Teardown {
                    step: i,
                    until: now + *t,
                    second_used,
                };
                out.push(Action::StartTeardown(i));
            }
            None => self.end_teardown(out),
        }
    }

    /// After the last teardown step: a step may have left a daemon behind, which
    /// would otherwise outlive drainit unaccounted for. Sweep (SIGKILL, counted
    /// abandoned), then exit. Without teardown steps nothing can be left: the drain
    /// ended because every descendant was gone (or was just killed).
    fn end_teardown(&mut self, out: &mut Vec<Action>) {
        if self.policy.teardown_timeouts.is_empty() {
            self.exit(out);
        } else {
            self.state = State::Sweep;
            out.push(Action::KillAll);
        }
    }

    fn exit(&mut self, out: &mut Vec<Action>) {
        let outcome = self.outcome();
        self.state = State::Exited(outcome);
        out.push(Action::Exit(outcome));
    }

    /// At the exit, with an admission gate: the requests lost from T0 on (the
    /// proxy's `unknown` and `abandoned`). A drain that lost a request is not clean
    /// (exit 2, `abandoned`, docs/proxy.md); the outcome already returned by
    /// [`Action::Exit`] is recomputed and returned.
    pub fn settle_requests(&mut self, lost: usize) -> Outcome {
        self.record.requests_lost = lost;
        let outcome = self.outcome();
        if let State::Exited(o) = &mut self.state {
            *o = outcome;
        }
        outcome
    }

    /// The exit code and reason for what happened so far (README, Exit codes).
    pub fn outcome(&self) -> Outcome {
        let r = &self.record;
        let phase_abandoned = r.phases.iter().any(|p| p.end == PhaseEnd::Abandoned);
        let unclean = if r.abandoned > 0 || r.requests_lost > 0 || phase_abandoned {
            Some(Reason::Abandoned)
        } else if r.unkillable > 0 {
            Some(Reason::Unkillable)
        } else if r.teardown.iter().any(|s| *s != StepEnd::Ok) {
            Some(Reason::TeardownFailed)
        } else {
            None
        };
        if r.drain_signal.is_some() {
            return match unclean {
                Some(reason) => Outcome {
                    code: exit::ABANDONED,
                    reason,
                },
                None => Outcome {
                    code: exit::CLEAN,
                    reason: Reason::Drained,
                },
            };
        }
        // A crash outranks abandoned work.
        match (r.child_exit.map_or(1, ChildExit::code), unclean) {
            (exit::CLEAN, Some(reason)) => Outcome {
                code: exit::ABANDONED,
                reason,
            },
            (code, _) => Outcome {
                code,
                reason: Reason::ChildExited,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! The drain's specification, as tables: each row is one rule of docs/processes-and-signals.md and the README's Exit codes,
    //! `given` the events that lead to a state, `when` one event, `then` the state
    //! and the actions. Then properties over random event sequences.
    use super::*;

    const fn ms(n: u64) -> At {
        Duration::from_millis(n)
    }

    fn policy() -> Policy {
        Policy {
            pre_drain_delay: ms(5000),
            delay_needs_routing: false,
            drain_timeout: ms(20000),
            teardown_timeouts: vec![],
            drain_signals: vec![Signal::TERM, Signal::INT, Signal::QUIT],
            second_signal: SecondSignal::Skip,
            rewrite: RewriteMap::default(),
            admission_gate: false,
            phase_maxes: vec![],
            phase_budget: ms(10000),
        }
    }

    /// With the proxy (docs/proxy.md): beat 3 closes admission before the forward.
    fn gate() -> Policy {
        Policy {
            admission_gate: true,
            ..policy()
        }
    }

    fn routing() -> Policy {
        Policy {
            delay_needs_routing: true,
            ..policy()
        }
    }

    fn ignore() -> Policy {
        Policy {
            second_signal: SecondSignal::Ignore,
            ..policy()
        }
    }

    fn rewrite() -> Policy {
        let mut p = policy();
        p.rewrite.insert(Signal::HUP, USR1);
        p.rewrite.insert(WINCH, Signal(0));
        p.rewrite.insert(Signal::TERM, Signal::QUIT);
        p
    }

    fn usr1_only() -> Policy {
        Policy {
            drain_signals: vec![USR1],
            ..policy()
        }
    }

    fn teardown(n: usize) -> Policy {
        Policy {
            teardown_timeouts: vec![ms(1000); n],
            ..policy()
        }
    }

    /// Two drain phases (docs/drain-phases.md): the first capped at 1 s, the second
    /// without `max`, on a 3 s budget.
    fn phases() -> Policy {
        Policy {
            phase_maxes: vec![Some(ms(1000)), None],
            phase_budget: ms(3000),
            ..policy()
        }
    }

    const fn running(i: usize, started: u64, until: u64) -> State {
        State::Phases {
            i,
            started_at: ms(started),
            until: ms(until),
            canceled: false,
            cut: false,
            second_used: false,
        }
    }

    const USR1: Signal = Signal(libc::SIGUSR1);
    const WINCH: Signal = Signal(libc::SIGWINCH);
    const TERM: Event = Event::Signal(Signal::TERM);
    const READY: (u64, Event) = (0, Event::ReadinessPassed);
    const fn exited(code: i32) -> Event {
        Event::ChildExited(ChildExit::Code(code))
    }

    const DRAINED: Outcome = Outcome {
        code: 0,
        reason: Reason::Drained,
    };
    const ABANDONED: Outcome = Outcome {
        code: 2,
        reason: Reason::Abandoned,
    };
    const TEARDOWN_FAILED: Outcome = Outcome {
        code: 2,
        reason: Reason::TeardownFailed,
    };
    const fn child(code: i32) -> Outcome {
        Outcome {
            code,
            reason: Reason::ChildExited,
        }
    }

    /// Beat 1 at T0 = 0 with the default policy.
    const START: Start = Start {
        signal: Some(Signal::TERM),
        pre_drain_delay: ms(5000),
        delay_why: Some(DelayWhy::Applies),
        to_deadline: ms(25000),
    };
    /// The main child exited by itself: the stop window.
    const STOP: Start = Start {
        signal: None,
        pre_drain_delay: Duration::ZERO,
        delay_why: None,
        to_deadline: ms(20000),
    };
    const fn skipped(why: DelayWhy) -> Start {
        Start {
            signal: Some(Signal::TERM),
            pre_drain_delay: Duration::ZERO,
            delay_why: Some(why),
            to_deadline: ms(20000),
        }
    }

    const WAITING: State = State::Waiting { second_used: false };
    const CUT: State = State::Waiting { second_used: true };
    const fn killing(at: u64, alive: Option<usize>, second_used: bool) -> State {
        State::Killing {
            until: ms(at + 1000),
            killed_at: ms(at),
            alive,
            counting: false,
            second_used,
        }
    }
    const fn step(step: usize, until: u64) -> State {
        State::Teardown {
            step,
            until: ms(until),
            second_used: false,
        }
    }

    /// Given prefixes, with the default policy: T0 at 0 in `ready`; beat 3 from 5 s.
    const BEAT2: &[(u64, Event)] = &[READY, (0, TERM)];
    const BEAT3: &[(u64, Event)] = &[READY, (0, TERM), (5000, Event::Tick)];
    const ADMISSION: State = State::Admission { second_used: false };
    /// With [`gate`]: admission closed at 5 s, requests in flight.
    const GATE3: &[(u64, Event)] = BEAT3;
    const CHILD_GONE: &[(u64, Event)] = &[READY, (0, TERM), (5000, Event::Tick), (5100, exited(0))];
    const KILLED: &[(u64, Event)] = &[
        READY,
        (0, TERM),
        (5000, Event::Tick),
        (5100, exited(0)),
        (25000, Event::Tick),
        (25000, Event::Killed(2)),
    ];
    const STOPPING: &[(u64, Event)] = &[READY, (0, exited(0))];
    const TEARDOWN: &[(u64, Event)] = &[
        READY,
        (0, TERM),
        (5000, Event::Tick),
        (5100, exited(0)),
        (5100, Event::DescendantsGone),
    ];

    struct Row {
        rule: &'static str,
        policy: Policy,
        given: Vec<(u64, Event)>,
        when: (u64, Event),
        state: State,
        actions: Vec<Action>,
    }

    fn row(
        rule: &'static str,
        policy: Policy,
        given: &[(u64, Event)],
        when: (u64, Event),
        state: State,
        actions: Vec<Action>,
    ) -> Row {
        Row {
            rule,
            policy,
            given: given.to_vec(),
            when,
            state,
            actions,
        }
    }

    fn then(given: &[(u64, Event)], more: &[(u64, Event)]) -> Vec<(u64, Event)> {
        given.iter().chain(more).copied().collect()
    }

    /// A machine fed `given`.
    fn machine(policy: Policy, given: &[(u64, Event)]) -> Drain {
        let mut d = Drain::new(policy);
        for (at, e) in given {
            d.handle(ms(*at), *e);
        }
        d
    }

    use Action::*;

    /// One row per rule: `(rule, policy, given, when) → (state, actions)`.
    #[rustfmt::skip]
    fn table() -> Vec<Row> {
        let p = policy;
        vec![
            // Lifecycle phases before the drain.
            row("readiness passes: starting → ready", p(), &[], (0, Event::ReadinessPassed), State::Ready { routed: false }, vec![]),
            row("a client asking /readyz is remembered", p(), &[READY], (0, Event::Routed), State::Ready { routed: true }, vec![]),
            // Beat 1.
            row("beat 1: draining and sampled in one step, nothing forwarded", p(), &[READY], (0, TERM), State::PreDrain, vec![SampleInFlight(START), PartialReport]),
            row("readiness never passed: the delay is skipped", p(), &[], (0, TERM), WAITING, vec![SampleInFlight(skipped(DelayWhy::NeverReady)), ForwardDrain(Signal::TERM), PartialReport]),
            row("default delay, not routed: 0", routing(), &[READY], (0, TERM), WAITING, vec![SampleInFlight(skipped(DelayWhy::NotRouted)), ForwardDrain(Signal::TERM), PartialReport]),
            row("default delay, routed: applies", routing(), &[READY, (0, Event::Routed)], (0, TERM), State::PreDrain, vec![SampleInFlight(Start { delay_why: Some(DelayWhy::Routed), ..START }), PartialReport]),
            row("a custom drain signal starts the drain", usr1_only(), &[READY], (0, Event::Signal(USR1)), State::PreDrain, vec![SampleInFlight(Start { signal: Some(USR1), ..START }), PartialReport]),
            // Beat 2.
            row("beat 2: a tick before T0 + delay does nothing", p(), BEAT2, (4999, Event::Tick), State::PreDrain, vec![]),
            row("beat 2: CONT is forwarded, never ends the delay", p(), BEAT2, (10, Event::Signal(Signal::CONT)), State::PreDrain, vec![Forward(Signal::CONT)]),
            row("beat 2: the main child's exit waits for the forward", p(), BEAT2, (1000, exited(0)), State::PreDrain, vec![]),
            row("beat 2: child gone and nothing left: drained at once", p(), &then(BEAT2, &[(1000, exited(3))]), (1000, Event::DescendantsGone), State::Exited(DRAINED), vec![Exit(DRAINED)]),
            // Beat 3.
            row("beat 3: forward at T0 + delay", p(), BEAT2, (5000, Event::Tick), WAITING, vec![ForwardDrain(Signal::TERM), PartialReport]),
            // Beat 3 with the proxy: admission closes, the forward waits for the requests.
            row("beat 3: admission closes at T0 + delay, nothing forwarded", gate(), BEAT2, (5000, Event::Tick), ADMISSION, vec![CloseAdmission]),
            row("delay 0: admission closes at T0", gate(), &[], (0, TERM), ADMISSION, vec![SampleInFlight(skipped(DelayWhy::NeverReady)), CloseAdmission]),
            row("no request in flight: the drain signal goes on", gate(), GATE3, (6000, Event::RequestsDone), WAITING, vec![ForwardDrain(Signal::TERM), PartialReport]),
            row("the forward waits for the requests, not the deadline's clock", gate(), GATE3, (24999, Event::Tick), ADMISSION, vec![]),
            row("requests still in flight at the deadline: abandoned, SIGKILL", gate(), GATE3, (25000, Event::Tick), killing(25000, None, false), vec![AbandonRequests, KillAll]),
            row("a second signal cuts the wait for the requests", gate(), GATE3, (6000, TERM), CUT, vec![ForwardDrain(Signal::TERM), PartialReport]),
            row("a second signal after the forward: what is open is abandoned, SIGKILL", gate(), &then(GATE3, &[(6000, Event::RequestsDone)]), (7000, TERM), killing(7000, None, true), vec![AbandonRequests, KillAll]),
            row("the deadline after a cut wait: abandoned, SIGKILL", gate(), &then(GATE3, &[(6000, TERM)]), (25000, Event::Tick), killing(25000, None, true), vec![AbandonRequests, KillAll]),
            row("the child went with requests in flight: leftovers get the signal", gate(), GATE3, (6000, exited(1)), WAITING, vec![SignalRemaining(Signal::TERM), PartialReport]),
            row("the child went in beat 2: no gate to wait for", gate(), &then(BEAT2, &[(1000, exited(0))]), (5000, Event::Tick), WAITING, vec![SignalRemaining(Signal::TERM), PartialReport]),
            row("RequestsDone outside the wait does nothing", gate(), BEAT2, (1000, Event::RequestsDone), State::PreDrain, vec![]),
            row("beat 3: --rewrite applies to the drain signal", rewrite(), BEAT2, (5000, Event::Tick), WAITING, vec![ForwardDrain(Signal::QUIT), PartialReport]),
            row("beat 3: the child went in beat 2: what is left gets it", p(), &then(BEAT2, &[(1000, exited(0))]), (5000, Event::Tick), WAITING, vec![SignalRemaining(Signal::TERM), PartialReport]),
            row("beat 3: leftovers get the drain signal at the child's exit", p(), BEAT3, (5100, Event::ChildExited(ChildExit::Signal(Signal::TERM))), WAITING, vec![SignalRemaining(Signal::TERM)]),
            row("draining until every descendant is gone, while the child lives", p(), BEAT3, (6000, Event::DescendantsGone), WAITING, vec![]),
            row("every descendant gone before the deadline: 0", p(), CHILD_GONE, (6000, Event::DescendantsGone), State::Exited(DRAINED), vec![Exit(DRAINED)]),
            row("the child's own code does not change 0 (143)", p(), &then(BEAT3, &[(5100, exited(143))]), (5100, Event::DescendantsGone), State::Exited(DRAINED), vec![Exit(DRAINED)]),
            row("deadline: SIGKILL what remains", p(), CHILD_GONE, (25000, Event::Tick), killing(25000, None, false), vec![KillAll]),
            row("the kill reports its count", p(), &then(CHILD_GONE, &[(25000, Event::Tick)]), (25000, Event::Killed(2)), killing(25000, Some(2), false), vec![]),
            row("abandoned: 2", p(), KILLED, (25010, Event::DescendantsGone), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            // The kill's settle.
            row("settle over: count what is still dying", p(), KILLED, (26000, Event::Tick), State::Killing { until: ms(26000), killed_at: ms(25000), alive: Some(2), counting: true, second_used: false }, vec![CountAlive]),
            row("settle: fewer alive than before: extended", p(), &then(KILLED, &[(26000, Event::Tick)]), (26000, Event::Alive(Some(1))), State::Killing { until: ms(27000), killed_at: ms(25000), alive: Some(1), counting: false, second_used: false }, vec![StillDying(1)]),
            row("settle: no progress: go on", p(), &then(KILLED, &[(26000, Event::Tick)]), (26000, Event::Alive(Some(2))), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("settle: /proc unreadable: go on", p(), &then(KILLED, &[(26000, Event::Tick)]), (26000, Event::Alive(None)), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("settle: never longer than SETTLE_MAX after the kill", p(), KILLED, (35000, Event::Tick), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("settle: an unreapable main child does not hold drainit", p(), &then(BEAT3, &[(25000, Event::Tick), (25000, Event::Killed(1))]), (26000, Event::Tick), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("unkillable: not clean, not abandoned", p(), &then(CHILD_GONE, &[(25000, Event::Tick), (25000, Event::Unkillable(1)), (25000, Event::Killed(0)), (26000, Event::Tick)]), (26000, Event::Alive(Some(1))), State::Exited(Outcome { code: 2, reason: Reason::Unkillable }), vec![Exit(Outcome { code: 2, reason: Reason::Unkillable })]),
            row("abandoned outranks unkillable", p(), &then(CHILD_GONE, &[(25000, Event::Tick), (25000, Event::Unkillable(1)), (25000, Event::Killed(2))]), (25100, Event::DescendantsGone), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            // The second signal.
            row("second signal in beat 2: forward now", p(), BEAT2, (2000, TERM), CUT, vec![ForwardDrain(Signal::TERM), PartialReport]),
            row("a third signal changes nothing", p(), &then(BEAT2, &[(2000, TERM)]), (3000, TERM), CUT, vec![]),
            row("second signal in beat 3: SIGKILL now", p(), BEAT3, (5500, TERM), killing(5500, None, true), vec![KillAll]),
            row("killed by a second signal: abandoned, 2", p(), &then(BEAT3, &[(5500, TERM), (5600, Event::Killed(1)), (5601, Event::ChildExited(ChildExit::Signal(Signal::KILL)))]), (5602, Event::DescendantsGone), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("within 100 ms of the first: counts as the first", p(), BEAT2, (50, Event::Signal(Signal::QUIT)), State::PreDrain, vec![]),
            row("within 100 ms, delay skipped: no instant kill", p(), &[(0, TERM)], (99, TERM), WAITING, vec![]),
            row("100 ms after T0 it is a second signal", p(), &[(0, TERM)], (100, TERM), killing(100, None, true), vec![KillAll]),
            row("--second-signal ignore: beat 2 goes on", ignore(), BEAT2, (1000, TERM), State::PreDrain, vec![]),
            row("--second-signal ignore: beat 3 goes on", ignore(), BEAT3, (6000, TERM), WAITING, vec![]),
            // Signals that are not drain signals.
            row("forwarded, rewritten", rewrite(), &[READY], (0, Event::Signal(Signal::HUP)), State::Ready { routed: false }, vec![Forward(USR1)]),
            row("rewritten to 0: dropped", rewrite(), &[READY], (0, Event::Signal(WINCH)), State::Ready { routed: false }, vec![]),
            row("not a drain signal in this set: forwarded", usr1_only(), &[READY], (0, TERM), State::Ready { routed: false }, vec![Forward(Signal::TERM)]),
            // No drain signal: the main child exits by itself.
            row("child exits by itself: stopping, leftovers signalled", p(), &[READY], (100, exited(7)), WAITING, vec![SampleInFlight(STOP), SignalRemaining(Signal::TERM)]),
            row("child exited by itself: its code", p(), &[READY, (0, exited(7))], (50, Event::DescendantsGone), State::Exited(child(7)), vec![Exit(child(7))]),
            row("killed by a signal: 128 + S", p(), &[READY, (0, Event::ChildExited(ChildExit::Signal(Signal::KILL)))], (50, Event::DescendantsGone), State::Exited(child(137)), vec![Exit(child(137))]),
            row("stop window: SIGKILL at exit + drain timeout", p(), STOPPING, (20000, Event::Tick), killing(20000, None, false), vec![KillAll]),
            row("exit 0 with abandoned work: 2", p(), &then(STOPPING, &[(20000, Event::Tick), (20000, Event::Killed(1))]), (20001, Event::DescendantsGone), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("a crash outranks abandoned work", p(), &[READY, (0, exited(3)), (20000, Event::Tick), (20000, Event::Killed(1))], (20001, Event::DescendantsGone), State::Exited(child(3)), vec![Exit(child(3))]),
            row("drain signal while stopping acts as a second signal", p(), STOPPING, (500, TERM), killing(500, None, true), vec![KillAll]),
            // Teardown.
            row("teardown starts when the drain is over", teardown(2), &then(CHILD_GONE, &[]), (5100, Event::DescendantsGone), step(0, 6100), vec![StartTeardown(0)]),
            row("teardown runs in order", teardown(2), TEARDOWN, (5200, Event::TeardownExited { ok: true }), step(1, 6200), vec![StartTeardown(1)]),
            row("after the last step: the sweep", teardown(2), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: true })]), (5300, Event::TeardownExited { ok: true }), State::Sweep, vec![KillAll]),
            row("clean sweep: 0", teardown(1), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: true })]), (5200, Event::Killed(0)), State::Exited(DRAINED), vec![Exit(DRAINED)]),
            row("a daemon left by teardown is abandoned: 2", teardown(1), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: true })]), (5200, Event::Killed(1)), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("a failed step: 2", teardown(1), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: false })]), (5200, Event::Killed(0)), State::Exited(TEARDOWN_FAILED), vec![Exit(TEARDOWN_FAILED)]),
            row("a step out of time is killed", teardown(1), TEARDOWN, (6100, Event::Tick), State::TeardownKilled { step: 0, until: ms(7100), second_used: false }, vec![KillTeardown(0)]),
            row("a killed step reaped: next", teardown(1), &then(TEARDOWN, &[(6100, Event::Tick)]), (6110, Event::TeardownExited { ok: false }), State::Sweep, vec![KillAll]),
            row("a killed step never reaped: next after the settle", teardown(2), &then(TEARDOWN, &[(6100, Event::Tick)]), (7100, Event::Tick), step(1, 8100), vec![StartTeardown(1)]),
            row("second signal in teardown cuts the step", teardown(3), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: true })]), (5300, TERM), State::TeardownKilled { step: 1, until: ms(6300), second_used: true }, vec![KillTeardown(1)]),
            row("a cut step: the rest is skipped", teardown(3), &then(TEARDOWN, &[(5200, Event::TeardownExited { ok: true }), (5300, TERM)]), (5310, Event::TeardownExited { ok: false }), State::Sweep, vec![KillAll]),
            row("teardown failed after a clean exit: 2", teardown(1), &[READY, (0, exited(0)), (1, Event::DescendantsGone), (2, Event::TeardownExited { ok: false })], (2, Event::Killed(0)), State::Exited(TEARDOWN_FAILED), vec![Exit(TEARDOWN_FAILED)]),
            row("teardown failed after a crash: the crash's code", teardown(1), &[READY, (0, exited(5)), (1, Event::DescendantsGone), (2, Event::TeardownExited { ok: false })], (2, Event::Killed(0)), State::Exited(child(5)), vec![Exit(child(5))]),
            // Drain phases.
            row("T0 with phases: the deadline is the latest it can be", phases(), &[READY], (0, TERM), State::PreDrain, vec![SampleInFlight(Start { to_deadline: ms(29000), ..START }), PartialReport]),
            row("phases start when the delay ends, min(max, budget left)", phases(), BEAT2, (5000, Event::Tick), running(0, 5000, 6000), vec![StartPhase { index: 0, budget: ms(1000) }]),
            row("the next one gets what is left of the budget", phases(), &then(BEAT2, &[(5000, Event::Tick)]), (5400, Event::PhaseExited { ok: true }), running(1, 5400, 8000), vec![PhaseEnded(0), StartPhase { index: 1, budget: ms(2600) }]),
            row("a failure does not stop the next", phases(), &then(BEAT2, &[(5000, Event::Tick)]), (5400, Event::PhaseExited { ok: false }), running(1, 5400, 8000), vec![PhaseEnded(0), StartPhase { index: 1, budget: ms(2600) }]),
            row("an overrun is canceled", phases(), &then(BEAT2, &[(5000, Event::Tick)]), (6000, Event::Tick), State::Phases { i: 0, started_at: ms(5000), until: ms(7000), canceled: true, cut: false, second_used: false }, vec![CancelPhase(0)]),
            row("one that ignores its cancellation is abandoned a second later", phases(), &then(BEAT2, &[(5000, Event::Tick), (6000, Event::Tick)]), (7000, Event::Tick), running(1, 7000, 8000), vec![KillPhase(0), PhaseEnded(0), StartPhase { index: 1, budget: ms(1000) }]),
            row("under 100 ms left: skipped; then beat 3", Policy { phase_budget: ms(1000), ..phases() }, &then(BEAT2, &[(5000, Event::Tick), (6000, Event::Tick)]), (6950, Event::PhaseExited { ok: false }), WAITING, vec![PhaseEnded(0), PhaseEnded(1), ForwardDrain(Signal::TERM), PartialReport]),
            row("the last phase's end: admission closes (with the gate)", Policy { admission_gate: true, ..phases() }, &then(BEAT2, &[(5000, Event::Tick), (5400, Event::PhaseExited { ok: true })]), (5500, Event::PhaseExited { ok: true }), ADMISSION, vec![PhaseEnded(1), CloseAdmission]),
            row("a second signal cancels the running phase", phases(), &then(BEAT2, &[(5000, Event::Tick)]), (5200, TERM), State::Phases { i: 0, started_at: ms(5000), until: ms(6200), canceled: true, cut: true, second_used: true }, vec![CancelPhase(0)]),
            row("... and skips the rest once it ended", phases(), &then(BEAT2, &[(5000, Event::Tick), (5200, TERM)]), (5300, Event::PhaseExited { ok: false }), CUT, vec![PhaseEnded(0), PhaseEnded(1), ForwardDrain(Signal::TERM), PartialReport]),
            row("a second signal in the delay: the phases run at once", phases(), BEAT2, (2000, TERM), State::Phases { i: 0, started_at: ms(2000), until: ms(3000), canceled: false, cut: false, second_used: true }, vec![StartPhase { index: 0, budget: ms(1000) }]),
            row("the child gone in the delay: no phase runs", phases(), &then(BEAT2, &[(1000, exited(0))]), (5000, Event::Tick), WAITING, vec![SignalRemaining(Signal::TERM), PartialReport]),
            row("an abandoned phase: 2", phases(), &then(BEAT2, &[(5000, Event::Tick), (6000, Event::Tick), (7000, Event::Tick), (7100, Event::PhaseExited { ok: true }), (7100, exited(0))]), (7100, Event::DescendantsGone), State::Exited(ABANDONED), vec![Exit(ABANDONED)]),
            row("exactly one exit: nothing after it", p(), &then(CHILD_GONE, &[(6000, Event::DescendantsGone)]), (7000, TERM), State::Exited(DRAINED), vec![]),
        ]
    }

    #[test]
    fn the_phases_record_and_the_deadline_from_their_end() {
        let p = Policy {
            phase_budget: ms(1000),
            ..phases()
        };
        let d = machine(
            p,
            &then(
                BEAT2,
                &[
                    (5000, Event::Tick),
                    (6000, Event::Tick),
                    (6950, Event::PhaseExited { ok: false }),
                ],
            ),
        );
        let r = d.record();
        assert_eq!(
            r.phases,
            vec![
                PhaseRun {
                    end: PhaseEnd::TimedOut,
                    started_at: ms(5000),
                    ended_at: ms(6950)
                },
                PhaseRun {
                    end: PhaseEnd::Skipped,
                    started_at: ms(6950),
                    ended_at: ms(6950)
                },
            ]
        );
        assert_eq!(
            r.timeline.deadline,
            Some(ms(26950)),
            "drain timeout from the phases' end"
        );
        assert_eq!(d.phase(), Phase::Draining);
    }

    #[test]
    fn the_drain_table() {
        for r in table() {
            let mut d = machine(r.policy, &r.given);
            let actions = d.handle(ms(r.when.0), r.when.1);
            assert_eq!(
                (d.state(), actions),
                (r.state, r.actions),
                "rule: {}",
                r.rule
            );
        }
    }

    /// Beat 2 says when and which drain signal is due (for a walk that would
    /// outlast it), and nothing once it went, with an admission gate, or with
    /// no pre-drain delay.
    #[test]
    fn the_due_forward_is_beat_2s() {
        let d = machine(policy(), BEAT2);
        assert_eq!(d.due_forward(), Some((ms(5000), Signal::TERM)));
        let d = machine(rewrite(), BEAT2);
        assert_eq!(
            d.due_forward(),
            Some((ms(5000), Signal::QUIT)),
            "after --rewrite"
        );
        assert_eq!(machine(policy(), BEAT3).due_forward(), None, "forwarded");
        assert_eq!(
            machine(gate(), BEAT2).due_forward(),
            None,
            "the gate decides"
        );
        assert_eq!(machine(policy(), &[READY]).due_forward(), None, "no drain");
        let mut no_delay = policy();
        no_delay.pre_drain_delay = Duration::ZERO;
        assert_eq!(
            machine(no_delay, BEAT2).due_forward(),
            None,
            "forwarded at T0"
        );
    }

    /// The phase `/readyz` publishes, per state (docs/processes-and-signals.md).
    #[test]
    fn the_phase_table() {
        let p = policy;
        let rows: &[(&[(u64, Event)], Phase)] = &[
            (&[], Phase::Starting),
            (&[READY], Phase::Ready),
            (BEAT2, Phase::Draining),
            (CHILD_GONE, Phase::Draining),
            (KILLED, Phase::Draining),
            (STOPPING, Phase::Stopping),
            (&[READY, (0, exited(0)), (500, TERM)], Phase::Stopping),
            (
                &then(CHILD_GONE, &[(6000, Event::DescendantsGone)]),
                Phase::Stopping,
            ),
        ];
        for (given, phase) in rows {
            assert_eq!(machine(p(), given).phase(), *phase, "given {given:?}");
        }
    }

    /// The report's record: T0, the forward, the kill, the end and the deadline.
    #[test]
    fn the_timeline_table() {
        let p = policy;
        let t = |given: &[(u64, Event)]| machine(p(), given).timeline();
        let clean = t(&then(CHILD_GONE, &[(6000, Event::DescendantsGone)]));
        assert_eq!(
            (
                clean.t0,
                clean.pre_drain_delay,
                clean.forwarded_at,
                clean.finished_at,
                clean.deadline
            ),
            (
                Some(ms(0)),
                ms(5000),
                Some(ms(5000)),
                Some(ms(6000)),
                Some(ms(25000))
            )
        );
        // The instants the driver actually sent the signals; the first kill kept.
        let mut d = machine(p(), BEAT3);
        d.note_forwarded(ms(5003));
        d.handle(ms(25000), Event::Tick);
        d.note_killed(ms(25002));
        d.note_killed(ms(25400));
        assert_eq!(
            (d.timeline().forwarded_at, d.timeline().killed_at),
            (Some(ms(5003)), Some(ms(25002)))
        );
        // The sweep of a teardown step's leftovers, after the drain finished, is not
        // the drain's kill.
        let mut d = machine(p(), &then(CHILD_GONE, &[(6000, Event::DescendantsGone)]));
        d.note_killed(ms(7000));
        assert_eq!(d.timeline().killed_at, None);
        // The stop window is timed from the child's exit.
        let stop = t(&[READY, (100, exited(0))]);
        assert_eq!((stop.t0, stop.deadline), (Some(ms(100)), Some(ms(20100))));
        // A skipped delay.
        assert_eq!(t(&[(10, TERM)]).deadline, Some(ms(20010)));
    }

    type Given = &'static [(u64, Event)];
    type Steps = &'static [StepEnd];

    #[test]
    #[rustfmt::skip]
    fn the_teardown_record() {
        let rows: &[(usize, Given, Steps)] = &[
            (2, &[(5200, Event::TeardownExited { ok: false }), (5300, Event::TeardownExited { ok: true })], &[StepEnd::Failed, StepEnd::Ok]),
            (1, &[(6100, Event::Tick), (6110, Event::TeardownExited { ok: false })], &[StepEnd::TimedOut]),
            (2, &[(6100, Event::Tick), (7100, Event::Tick)], &[StepEnd::TimedOut]),
            (3, &[(5200, Event::TeardownExited { ok: true }), (5300, TERM), (5310, Event::TeardownExited { ok: false })], &[StepEnd::Ok, StepEnd::Cut, StepEnd::Skipped]),
        ];
        for (n, more, ends) in rows {
            assert_eq!(machine(teardown(*n), &then(TEARDOWN, more)).teardown(), *ends);
        }
    }

    #[test]
    fn idle_has_no_deadline() {
        for given in [&[][..], &[READY][..], &[READY, (0, Event::Routed)][..]] {
            assert_eq!(machine(policy(), given).next_deadline(), None);
        }
    }

    /// The order of one batch of signals and the main child's exit read with it.
    #[test]
    #[rustfmt::skip]
    fn the_batch_order_table() {
        let d = machine(policy(), &[READY]);
        let killed_by = |s| ChildExit::Signal(s);
        let rows = [
            (vec![Signal::TERM], None, vec![TERM]),
            // Exited before the signal was sent: the exit comes first (no drain).
            (vec![Signal::TERM], Some(ChildExit::Code(1)), vec![exited(1), TERM]),
            (vec![Signal::HUP], Some(killed_by(Signal::TERM)), vec![Event::ChildExited(killed_by(Signal::TERM)), Event::Signal(Signal::HUP)]),
            // Killed by the drain signal of this very batch: a drain, not a crash.
            (vec![Signal::TERM], Some(killed_by(Signal::TERM)), vec![TERM, Event::ChildExited(killed_by(Signal::TERM))]),
            (vec![Signal::HUP, Signal::QUIT], Some(killed_by(Signal::QUIT)), vec![Event::Signal(Signal::HUP), Event::Signal(Signal::QUIT), Event::ChildExited(killed_by(Signal::QUIT))]),
        ];
        for (batch, exit, events) in rows {
            assert_eq!(d.order_batch(&batch, exit), events, "batch {batch:?}, exit {exit:?}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_signal() -> impl Strategy<Value = Signal> {
            prop_oneof![
                4 => Just(Signal::TERM),
                1 => Just(Signal::INT),
                1 => Just(Signal::QUIT),
                1 => Just(Signal::HUP),
                1 => Just(Signal::CONT),
            ]
        }

        fn any_event() -> impl Strategy<Value = Event> {
            prop_oneof![
                3 => any_signal().prop_map(Event::Signal),
                1 => Just(Event::ReadinessPassed),
                1 => Just(Event::Routed),
                1 => prop_oneof![
                    1 => (0..3i32).prop_map(ChildExit::Code),
                    1 => Just(ChildExit::Signal(Signal::TERM)),
                    1 => Just(ChildExit::Signal(Signal::KILL)),
                ]
                .prop_map(Event::ChildExited),
                2 => Just(Event::DescendantsGone),
                1 => (0..3usize).prop_map(Event::Killed),
                1 => (0..2usize).prop_map(Event::Unkillable),
                1 => any::<bool>().prop_map(|ok| Event::TeardownExited { ok }),
                4 => Just(Event::Tick),
                1 => Just(Event::RequestsDone),
                1 => any::<bool>().prop_map(|ok| Event::PhaseExited { ok }),
            ]
        }

        fn any_policy() -> impl Strategy<Value = Policy> {
            (
                prop_oneof![Just(0u64), Just(300), Just(5000)],
                any::<bool>(),
                prop_oneof![Just(200u64), Just(2000)],
                0..3usize,
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec(prop_oneof![Just(None), Just(Some(ms(400)))], 0..3),
            )
                .prop_map(|(delay, routing, timeout, steps, ignore, gate, phases)| {
                    Policy {
                        phase_maxes: phases,
                        phase_budget: ms(1000),
                        pre_drain_delay: ms(delay),
                        delay_needs_routing: routing,
                        drain_timeout: ms(timeout),
                        teardown_timeouts: vec![ms(500); steps],
                        second_signal: if ignore {
                            SecondSignal::Ignore
                        } else {
                            SecondSignal::Skip
                        },
                        admission_gate: gate,
                        ..policy()
                    }
                })
        }

        /// A fake driver: feeds the events, answers the machine's questions
        /// (`KillAll` → `Killed`, `CountAlive` → `Alive`) and checks the
        /// invariants after every step.
        struct Run {
            d: Drain,
            now: At,
            exits: usize,
            answers: Vec<usize>,
            /// A second signal cut beat 2 short (the forward may come early).
            cut_beat2: bool,
        }

        impl Run {
            fn feed(&mut self, e: Event) {
                let before = self.d.state();
                let deadline = self.d.timeline().deadline;
                let t0 = self.d.timeline().t0;
                let actions = self.d.handle(self.now, e);
                let r = self.d.record().clone();
                let second = match e {
                    Event::Signal(s) => {
                        self.d.policy.drain_signals.contains(&s)
                            && self.d.policy.second_signal == SecondSignal::Skip
                    }
                    _ => false,
                };
                let t = r.timeline;
                // A second signal in beat 2 cuts it (with the gate, it closes
                // admission early and the forward may follow before T0 + delay).
                self.cut_beat2 |=
                    second && (before == State::PreDrain || matches!(before, State::Phases { .. }));
                // A deadline (and T0) is never moved, but when the drain phases
                // end: it is then counted from there, and only comes earlier.
                if deadline.is_some() {
                    if matches!(before, State::Phases { .. }) {
                        assert!(t.deadline <= deadline, "the deadline moved later on {e:?}");
                    } else {
                        assert_eq!(t.deadline, deadline, "the deadline moved on {e:?}");
                    }
                    assert_eq!(t.t0, t0);
                }
                let mut follow = Vec::new();
                for a in &actions {
                    match a {
                        // Nothing is forwarded before T0 + delay unless a second signal came.
                        Action::ForwardDrain(_) | Action::SignalRemaining(_)
                            if r.drain_signal.is_some() =>
                        {
                            let due = t.t0.expect("a drain has a T0") + t.pre_drain_delay;
                            assert!(
                                self.now >= due || self.cut_beat2,
                                "forwarded at {:?} before {due:?} on {e:?} in {before:?}",
                                self.now
                            );
                        }
                        // Nothing is SIGKILLed before the deadline unless a second signal came in beat 3.
                        Action::KillAll if matches!(self.d.state(), State::Killing { .. }) => {
                            assert!(
                                self.now >= t.deadline.expect("a wait has a deadline")
                                    || (second
                                        && matches!(before, State::Waiting { second_used: false })),
                                "killed at {:?} before the deadline on {e:?} in {before:?}",
                                self.now
                            );
                            let n = self.answers.pop().unwrap_or(0);
                            follow.push(Event::Killed(n));
                        }
                        Action::KillAll => {
                            follow.push(Event::Killed(self.answers.pop().unwrap_or(0)))
                        }
                        Action::CountAlive => {
                            follow.push(Event::Alive(self.answers.pop().map(Some).unwrap_or(None)))
                        }
                        Action::Exit(o) => {
                            self.exits += 1;
                            assert_eq!(self.exits, 1, "exactly one exit");
                            let clean = r.abandoned == 0
                                && r.unkillable == 0
                                && r.phases.iter().all(|p| p.end != PhaseEnd::Abandoned)
                                && r.teardown.iter().all(|s| *s == StepEnd::Ok);
                            if o.code == 0 {
                                assert!(clean, "0 with unclean work: {r:?}");
                                assert!(
                                    r.drain_signal.is_some()
                                        || r.child_exit == Some(ChildExit::Code(0)),
                                    "0 without a drain signal: {r:?}"
                                );
                            }
                            if r.drain_signal.is_some() {
                                assert_eq!(
                                    o.code == 0,
                                    clean,
                                    "a drain's code is 0 exactly when clean: {r:?}"
                                );
                                assert!(o.code == 0 || o.code == 2);
                            }
                        }
                        _ => {}
                    }
                }
                if matches!(before, State::Exited(_)) {
                    assert!(actions.is_empty(), "nothing after the exit");
                }
                for e in follow {
                    self.feed(e);
                }
            }

            /// Time passes to the next deadline (or by `dt` when none is set).
            fn tick(&mut self, dt: u64) {
                self.now = self
                    .d
                    .next_deadline()
                    .map_or(self.now + ms(dt), |at| at.max(self.now));
                self.feed(Event::Tick);
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn invariants_hold_over_random_events(
                policy in any_policy(),
                events in proptest::collection::vec((0..3000u64, any_event()), 0..40),
                answers in proptest::collection::vec(0..4usize, 0..10),
            ) {
                let mut run = Run { d: Drain::new(policy), now: At::ZERO, exits: 0, answers, cut_beat2: false };
                for (dt, e) in events {
                    if e == Event::Tick {
                        run.tick(dt);
                    } else {
                        run.now += ms(dt % 150); // signals close together too
                        run.feed(e);
                    }
                }
                // Then the run is finished by the world: the child exits, the tree
                // empties, steps end, time passes. Exactly one exit comes.
                run.feed(exited(0));
                run.feed(Event::DescendantsGone);
                for _ in 0..20 {
                    if matches!(run.d.state(), State::Teardown { .. }) {
                        run.feed(Event::TeardownExited { ok: true });
                    } else {
                        run.tick(1000);
                    }
                }
                prop_assert!(matches!(run.d.state(), State::Exited(_)), "never exited: {:?}", run.d.state());
                prop_assert_eq!(run.exits, 1);
            }
        }
    }
}
