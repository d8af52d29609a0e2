//! The drain: a pure state machine for the phases and beats of DESIGN §1–§3.
//!
//! Owns: the phase (starting → ready → draining → stopping), the drain timeline
//! (T0, the forward at T0 + pre-drain delay, the deadline at T0 + delay + drain
//! timeout), the second-signal rule, the teardown sequence and the exit code.
//!
//! Must not: do I/O, read a clock, or know about tokio or nix. The driver
//! (`supervisor.rs`) feeds it [`Event`]s stamped with a virtual instant ([`At`]),
//! carries out the [`Action`]s it returns, and calls [`Drain::handle`] with
//! [`Event::Tick`] once [`Drain::next_deadline`] has passed. Every race of the drain
//! is therefore a deterministic unit test (see the tests at the bottom).
//!
//! Invariant: once a drain signal has been seen, the deadline never moves, and each
//! wait is cut short at most once (the second signal); the exit code is decided here
//! and nowhere else.

use std::time::Duration;

use crate::signals::{RewriteMap, Signal};

/// A virtual instant: time since an epoch the driver picks (the supervisor uses its
/// start). Only differences matter.
pub type At = Duration;

/// Drain signals that arrive within this window of the first count as the first
/// (`timeout(1)` signals its child, then its own group: drainit gets two at once).
pub const COALESCE: Duration = Duration::from_millis(100);

/// After SIGKILL, how long to wait for the killed processes to be reaped before
/// carrying on regardless (a process in uninterruptible sleep cannot be waited for).
pub const KILL_SETTLE: Duration = Duration::from_secs(1);

/// The lifecycle phase, as `/readyz` publishes it (DESIGN §1).
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
            ChildExit::Signal(s) => 128 + s.0,
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
    /// The delay is the default outside Kubernetes (DESIGN §2): it applies only
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
}

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
    /// The main child is gone and no descendant is left.
    DescendantsGone,
    /// The result of [`Action::KillAll`]: how many processes were SIGKILLed (also
    /// sent again while the kill settles, for what a kill round missed).
    Killed(usize),
    /// Processes drainit could not signal (`EPERM`): they are neither completed nor
    /// abandoned, and the drain is not clean. Sent before the [`Event::Killed`] of
    /// the same round.
    Unkillable(usize),
    /// The running teardown step ended; `ok` when it exited 0.
    TeardownExited { ok: bool },
    /// [`Drain::next_deadline`] has passed.
    Tick,
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this (already rewritten) signal to the main child, or its group with
    /// `--forward-to group`.
    Forward(Signal),
    /// Beat 1: count the live descendants now, before anything else.
    SampleInFlight,
    /// Beat 3: send the (rewritten) drain signal to the main child or its group,
    /// and remember who got it.
    ForwardDrain(Signal),
    /// Send the signal to every descendant drainit has not signalled yet (once each).
    SignalRemaining(Signal),
    /// SIGKILL every descendant and report back with [`Event::Killed`].
    KillAll,
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

/// drainit's exit code and reason (DESIGN §3).
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Not waiting on anything timed (starting, ready).
    None,
    /// Beat 2: the forward is due at `Timeline::t0 + pre_drain_delay`.
    PreDrain,
    /// Beat 3 (or the stop window): waiting for the descendants until the deadline.
    Descendants,
    /// SIGKILL was sent; waiting for the reaps until this instant.
    KillSettle(At),
    /// Teardown step `i` runs until this instant.
    Teardown(usize, At),
    /// Teardown step `i` was killed; waiting for its reap.
    TeardownKilled(usize, At),
    /// Teardown is over; the final sweep (SIGKILL to whatever a step left
    /// behind) was asked for and its [`Event::Killed`] is awaited.
    Sweep,
    /// Done.
    Exited,
}

/// The drain state machine. See the module docs.
#[derive(Debug)]
pub struct Drain {
    policy: Policy,
    phase: Phase,
    wait: Wait,
    ever_ready: bool,
    routed: bool,
    delay_why: Option<DelayWhy>,
    drain_signal: Option<Signal>,
    second_used: bool,
    child_exit: Option<ChildExit>,
    gone: bool,
    abandoned: usize,
    unkillable: usize,
    timeline: Timeline,
    teardown: Vec<StepEnd>,
}

impl Drain {
    /// A machine in `starting`, for a child that was just spawned.
    pub fn new(policy: Policy) -> Drain {
        Drain {
            policy,
            phase: Phase::Starting,
            wait: Wait::None,
            ever_ready: false,
            routed: false,
            delay_why: None,
            drain_signal: None,
            second_used: false,
            child_exit: None,
            gone: false,
            abandoned: 0,
            unkillable: 0,
            timeline: Timeline::default(),
            teardown: Vec::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The first drain signal received (as received, before rewriting).
    pub fn drain_signal(&self) -> Option<Signal> {
        self.drain_signal
    }

    pub fn child_exit(&self) -> Option<ChildExit> {
        self.child_exit
    }

    pub fn timeline(&self) -> Timeline {
        self.timeline
    }

    /// Why the pre-drain delay is what it is; `None` before T0 (and with no drain
    /// signal).
    pub fn delay_why(&self) -> Option<DelayWhy> {
        self.delay_why
    }

    /// Records when the drain signal was actually sent (the driver sends it after
    /// the machine decided, and the report gives the time of the signal).
    pub fn note_forwarded(&mut self, at: At) {
        if self.timeline.forwarded_at.is_some() {
            self.timeline.forwarded_at = Some(at);
        }
    }

    /// Records when the drain's first SIGKILL was sent (later kills keep it).
    pub fn note_killed(&mut self, at: At) {
        if self.timeline.t0.is_some() && self.timeline.killed_at.is_none() {
            self.timeline.killed_at = Some(at);
        }
    }

    /// How each teardown step ended, in order (steps not reached are absent).
    pub fn teardown(&self) -> &[StepEnd] {
        &self.teardown
    }

    /// Whether the driver should watch for [`Event::DescendantsGone`].
    pub fn waits_for_descendants(&self) -> bool {
        self.child_exit.is_some()
            && matches!(
                self.wait,
                Wait::PreDrain | Wait::Descendants | Wait::KillSettle(_)
            )
    }

    /// Beat 3 (or the stop window after the main child's own exit): the drain
    /// signal was sent on and the remaining descendants are waited for until the
    /// deadline (the driver reports progress meanwhile).
    pub fn awaits_deadline(&self) -> bool {
        self.wait == Wait::Descendants
    }

    /// The next instant at which the driver must send [`Event::Tick`]; `None` when
    /// nothing is timed (idle costs nothing).
    pub fn next_deadline(&self) -> Option<At> {
        match self.wait {
            Wait::PreDrain => Some(self.timeline.t0? + self.timeline.pre_drain_delay),
            Wait::Descendants => self.timeline.deadline,
            Wait::KillSettle(at) | Wait::Teardown(_, at) => Some(at),
            Wait::TeardownKilled(_, at) => Some(at),
            Wait::None | Wait::Sweep | Wait::Exited => None,
        }
    }

    fn is_drain_signal(&self, s: Signal) -> bool {
        self.policy.drain_signals.contains(&s)
    }

    /// The signal sent on at beat 3 (and to leftovers): the first drain signal, or
    /// the first configured one when the child exited by itself; rewritten.
    fn outgoing(&self) -> Option<Signal> {
        let s = self.drain_signal.unwrap_or(self.policy.drain_signals[0]);
        self.policy.rewrite.apply(s)
    }

    /// Feeds one event at virtual instant `now`; returns the actions to carry out,
    /// in order.
    pub fn handle(&mut self, now: At, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Signal(s) if self.is_drain_signal(s) => self.on_drain_signal(now, s, &mut out),
            Event::Signal(s) => {
                // Forwarded at once, in every phase (the driver knows whether a
                // child or its group is still there to get it).
                if let Some(s) = self.policy.rewrite.apply(s) {
                    out.push(Action::Forward(s));
                }
            }
            Event::ReadinessPassed => {
                self.ever_ready = true;
                if self.phase == Phase::Starting {
                    self.phase = Phase::Ready;
                }
            }
            Event::Routed => self.routed = true,
            Event::ChildExited(exit) => self.on_child_exit(now, exit, &mut out),
            Event::DescendantsGone => {
                self.gone = true;
                if self.waits_for_descendants() {
                    self.finish_drain(now, &mut out);
                }
            }
            Event::Unkillable(n) => self.unkillable += n,
            Event::Killed(n) => {
                self.abandoned += n;
                if self.wait == Wait::Sweep {
                    self.exit(&mut out);
                } else if self.gone && matches!(self.wait, Wait::KillSettle(_)) {
                    self.finish_drain(now, &mut out);
                }
            }
            Event::TeardownExited { ok } => match self.wait {
                Wait::Teardown(i, _) => {
                    self.teardown
                        .push(if ok { StepEnd::Ok } else { StepEnd::Failed });
                    self.next_teardown(now, i + 1, &mut out);
                }
                Wait::TeardownKilled(i, _) => self.teardown_killed(now, i, &mut out),
                _ => {}
            },
            Event::Tick => self.on_tick(now, &mut out),
        }
        out
    }

    /// The killed teardown step `i` was reaped, or its settle time ran out.
    fn teardown_killed(&mut self, now: At, i: usize, out: &mut Vec<Action>) {
        let cut = self.teardown.len() > i;
        if !cut {
            self.teardown.push(StepEnd::TimedOut);
            self.next_teardown(now, i + 1, out);
        } else {
            // A second signal cut it: the rest is skipped.
            let n = self.policy.teardown_timeouts.len();
            self.teardown.resize(n, StepEnd::Skipped);
            self.end_teardown(out);
        }
    }

    fn on_drain_signal(&mut self, now: At, s: Signal, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Starting | Phase::Ready if self.child_exit.is_none() => {
                // Beat 1: phase and sample in one step, before anything else.
                self.drain_signal = Some(s);
                self.phase = Phase::Draining;
                self.timeline.t0 = Some(now);
                let why = if !self.ever_ready {
                    DelayWhy::NeverReady
                } else if !self.policy.delay_needs_routing {
                    DelayWhy::Applies
                } else if self.routed {
                    DelayWhy::Routed
                } else {
                    DelayWhy::NotRouted
                };
                self.delay_why = Some(why);
                self.timeline.pre_drain_delay = match why {
                    DelayWhy::Applies | DelayWhy::Routed => self.policy.pre_drain_delay,
                    DelayWhy::NeverReady | DelayWhy::NotRouted => Duration::ZERO,
                };
                self.timeline.deadline =
                    Some(now + self.timeline.pre_drain_delay + self.policy.drain_timeout);
                out.push(Action::SampleInFlight);
                if self.timeline.pre_drain_delay.is_zero() {
                    self.forward_drain(now, out);
                } else {
                    self.wait = Wait::PreDrain;
                }
            }
            _ => self.on_second_signal(now, out),
        }
    }

    fn on_second_signal(&mut self, now: At, out: &mut Vec<Action>) {
        if let (Some(t0), Some(_)) = (self.timeline.t0, self.drain_signal)
            && now.saturating_sub(t0) < COALESCE
        {
            return; // counts as the first
        }
        if self.policy.second_signal == SecondSignal::Ignore || self.second_used {
            return;
        }
        match self.wait {
            Wait::PreDrain => {
                self.second_used = true;
                self.forward_drain(now, out);
            }
            Wait::Descendants => {
                self.second_used = true;
                self.kill_all(now, out);
            }
            Wait::Teardown(i, _) => {
                self.second_used = true;
                self.teardown.push(StepEnd::Cut);
                self.wait = Wait::TeardownKilled(i, now + KILL_SETTLE);
                out.push(Action::KillTeardown(i));
            }
            // Already killing, or nothing left to cut.
            _ => {}
        }
    }

    fn on_child_exit(&mut self, now: At, exit: ChildExit, out: &mut Vec<Action>) {
        self.child_exit = Some(exit);
        match self.phase {
            Phase::Starting | Phase::Ready => {
                // No drain signal: straight to stopping; leftovers get the drain
                // signal and the drain timeout, counted from this exit.
                self.phase = Phase::Stopping;
                self.timeline.t0 = Some(now);
                self.timeline.forwarded_at = Some(now);
                self.timeline.deadline = Some(now + self.policy.drain_timeout);
                out.push(Action::SampleInFlight);
                if let Some(s) = self.outgoing() {
                    out.push(Action::SignalRemaining(s));
                }
                self.wait = Wait::Descendants;
            }
            Phase::Draining => {
                // Beat 2: the forward still happens at T0 + delay, to what is left.
                // Beat 3: whatever is left gets the drain signal now.
                if self.wait == Wait::Descendants
                    && let Some(s) = self.outgoing()
                {
                    out.push(Action::SignalRemaining(s));
                }
            }
            Phase::Stopping => {}
        }
        if self.gone {
            self.finish_drain(now, out);
        }
    }

    fn on_tick(&mut self, now: At, out: &mut Vec<Action>) {
        let Some(due) = self.next_deadline() else {
            return;
        };
        if now < due {
            return;
        }
        match self.wait {
            Wait::PreDrain => self.forward_drain(now, out),
            Wait::Descendants => self.kill_all(now, out),
            Wait::KillSettle(_) => {
                // The settle ran out. A main child that cannot be reaped (stuck in
                // uninterruptible sleep, frozen) must not hold drainit: go on
                // without its status.
                self.finish_drain_anyway(now, out);
            }
            Wait::Teardown(i, _) => {
                self.wait = Wait::TeardownKilled(i, now + KILL_SETTLE);
                out.push(Action::KillTeardown(i));
            }
            // A killed step that cannot be reaped (uninterruptible sleep): go on.
            Wait::TeardownKilled(i, _) => self.teardown_killed(now, i, out),
            _ => {}
        }
    }

    fn forward_drain(&mut self, now: At, out: &mut Vec<Action>) {
        self.timeline.forwarded_at = Some(now);
        self.wait = Wait::Descendants;
        if let Some(s) = self.outgoing() {
            if self.child_exit.is_none() {
                out.push(Action::ForwardDrain(s));
            } else {
                out.push(Action::SignalRemaining(s));
            }
        }
        if self.child_exit.is_some() && self.gone {
            self.finish_drain(now, out);
        }
    }

    fn kill_all(&mut self, now: At, out: &mut Vec<Action>) {
        self.wait = Wait::KillSettle(now + KILL_SETTLE);
        self.gone = false;
        out.push(Action::KillAll);
    }

    fn finish_drain_anyway(&mut self, now: At, out: &mut Vec<Action>) {
        self.timeline.finished_at = Some(now);
        self.phase = Phase::Stopping;
        self.next_teardown(now, 0, out);
    }

    fn finish_drain(&mut self, now: At, out: &mut Vec<Action>) {
        if self.child_exit.is_none() {
            return; // the main child is a descendant; not gone yet
        }
        self.timeline.finished_at = Some(now);
        self.phase = Phase::Stopping;
        self.next_teardown(now, 0, out);
    }

    fn next_teardown(&mut self, now: At, i: usize, out: &mut Vec<Action>) {
        match self.policy.teardown_timeouts.get(i) {
            Some(t) => {
                self.wait = Wait::Teardown(i, now + *t);
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
            self.wait = Wait::Sweep;
            out.push(Action::KillAll);
        }
    }

    fn exit(&mut self, out: &mut Vec<Action>) {
        self.wait = Wait::Exited;
        out.push(Action::Exit(self.outcome()));
    }

    /// The exit code and reason for what happened so far (DESIGN §3).
    pub fn outcome(&self) -> Outcome {
        let teardown_failed = self.teardown.iter().any(|s| *s != StepEnd::Ok);
        let abandoned = self.abandoned > 0;
        let unkillable = self.unkillable > 0;
        if self.drain_signal.is_some() {
            return if abandoned {
                Outcome {
                    code: 2,
                    reason: Reason::Abandoned,
                }
            } else if unkillable {
                Outcome {
                    code: 2,
                    reason: Reason::Unkillable,
                }
            } else if teardown_failed {
                Outcome {
                    code: 2,
                    reason: Reason::TeardownFailed,
                }
            } else {
                Outcome {
                    code: 0,
                    reason: Reason::Drained,
                }
            };
        }
        let code = self.child_exit.map_or(1, ChildExit::code);
        if code == 0 && abandoned {
            Outcome {
                code: 2,
                reason: Reason::Abandoned,
            }
        } else if code == 0 && unkillable {
            Outcome {
                code: 2,
                reason: Reason::Unkillable,
            }
        } else if code == 0 && teardown_failed {
            Outcome {
                code: 2,
                reason: Reason::TeardownFailed,
            }
        } else {
            Outcome {
                code,
                reason: Reason::ChildExited,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> At {
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
        }
    }

    fn ready(p: Policy) -> Drain {
        let mut d = Drain::new(p);
        assert!(d.handle(ms(0), Event::ReadinessPassed).is_empty());
        assert_eq!(d.phase(), Phase::Ready);
        d
    }

    fn exit_of(actions: &[Action]) -> Option<Outcome> {
        actions.iter().find_map(|a| match a {
            Action::Exit(o) => Some(*o),
            _ => None,
        })
    }

    const TERM: Event = Event::Signal(Signal::TERM);

    #[test]
    fn clean_drain_three_beats() {
        let mut d = ready(policy());
        // Beat 1: draining and sampled in the same step, nothing forwarded yet.
        assert_eq!(d.handle(ms(1000), TERM), vec![Action::SampleInFlight]);
        assert_eq!(d.phase(), Phase::Draining);
        assert_eq!(d.next_deadline(), Some(ms(6000)));
        // Beat 2: a tick before the delay does nothing.
        assert!(d.handle(ms(5999), Event::Tick).is_empty());
        // Beat 3: forward at T0 + delay; deadline T0 + delay + timeout.
        assert_eq!(
            d.handle(ms(6000), Event::Tick),
            vec![Action::ForwardDrain(Signal::TERM)]
        );
        assert_eq!(d.next_deadline(), Some(ms(26000)));
        assert!(
            d.handle(
                ms(6500),
                Event::ChildExited(ChildExit::Signal(Signal::TERM))
            )
            .iter()
            .all(|a| matches!(a, Action::SignalRemaining(_)))
        );
        assert_eq!(
            d.phase(),
            Phase::Draining,
            "draining until every descendant is gone"
        );
        let a = d.handle(ms(6600), Event::DescendantsGone);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 0,
                reason: Reason::Drained
            })
        );
        assert_eq!(d.phase(), Phase::Stopping);
        let t = d.timeline();
        assert_eq!(
            (t.t0, t.forwarded_at, t.finished_at, t.deadline),
            (
                Some(ms(1000)),
                Some(ms(6000)),
                Some(ms(6600)),
                Some(ms(26000))
            )
        );
    }

    #[test]
    fn the_default_delay_outside_kubernetes_applies_only_once_routed() {
        let p = Policy {
            delay_needs_routing: true,
            ..policy()
        };
        let mut d = ready(p.clone());
        assert_eq!(
            d.handle(ms(100), TERM),
            vec![Action::SampleInFlight, Action::ForwardDrain(Signal::TERM)]
        );
        assert_eq!(d.timeline().pre_drain_delay, Duration::ZERO);
        assert_eq!(d.delay_why(), Some(DelayWhy::NotRouted));

        let mut d = ready(p);
        assert!(d.handle(ms(50), Event::Routed).is_empty());
        assert_eq!(d.handle(ms(100), TERM), vec![Action::SampleInFlight]);
        assert_eq!(d.timeline().pre_drain_delay, ms(5000));
        assert_eq!(d.delay_why(), Some(DelayWhy::Routed));
        // Never ready: skipped whatever the rule.
        let mut d = Drain::new(policy());
        d.handle(ms(0), TERM);
        assert_eq!(d.delay_why(), Some(DelayWhy::NeverReady));
    }

    #[test]
    fn unkillable_work_is_not_clean_and_not_abandoned() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.note_forwarded(ms(5003));
        d.handle(ms(5100), Event::ChildExited(ChildExit::Code(0)));
        assert_eq!(d.handle(ms(25000), Event::Tick), vec![Action::KillAll]);
        d.note_killed(ms(25002));
        d.note_killed(ms(25400)); // a later kill keeps the first instant
        assert!(d.handle(ms(25002), Event::Unkillable(1)).is_empty());
        d.handle(ms(25002), Event::Killed(0));
        let a = d.handle(ms(26002), Event::Tick);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::Unkillable
            })
        );
        let t = d.timeline();
        assert_eq!(
            (t.forwarded_at, t.killed_at),
            (Some(ms(5003)), Some(ms(25002)))
        );
        // Abandoned work outranks it.
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.handle(ms(5100), Event::ChildExited(ChildExit::Code(0)));
        d.handle(ms(25000), Event::Tick);
        d.handle(ms(25000), Event::Unkillable(1));
        d.handle(ms(25000), Event::Killed(2));
        let a = d.handle(ms(25100), Event::DescendantsGone);
        assert_eq!(exit_of(&a).map(|o| o.reason), Some(Reason::Abandoned));
    }

    #[test]
    fn signal_before_ready_skips_the_delay() {
        let mut d = Drain::new(policy());
        let a = d.handle(ms(10), TERM);
        assert_eq!(
            a,
            vec![Action::SampleInFlight, Action::ForwardDrain(Signal::TERM)]
        );
        assert_eq!(d.timeline().pre_drain_delay, Duration::ZERO);
        assert_eq!(d.next_deadline(), Some(ms(20010)));
    }

    #[test]
    fn child_exit_during_pre_drain_delay_keeps_the_forward_time() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        // The main child exits at 1 s, a helper is left.
        let a = d.handle(ms(1000), Event::ChildExited(ChildExit::Code(0)));
        assert!(a.is_empty());
        assert_eq!(d.phase(), Phase::Draining);
        assert_eq!(d.next_deadline(), Some(ms(5000)));
        assert_eq!(
            d.handle(ms(5000), Event::Tick),
            vec![Action::SignalRemaining(Signal::TERM)]
        );
        let a = d.handle(ms(5200), Event::DescendantsGone);
        assert_eq!(exit_of(&a).unwrap().code, 0);
    }

    #[test]
    fn child_exit_during_delay_with_nothing_left_finishes_at_once() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(1000), Event::ChildExited(ChildExit::Code(3)));
        let a = d.handle(ms(1000), Event::DescendantsGone);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 0,
                reason: Reason::Drained
            })
        );
    }

    #[test]
    fn second_signal_in_beat_two_forwards_now() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        assert_eq!(
            d.handle(ms(2000), TERM),
            vec![Action::ForwardDrain(Signal::TERM)]
        );
        // The deadline does not move.
        assert_eq!(d.next_deadline(), Some(ms(25000)));
        // A third signal changes nothing.
        assert!(d.handle(ms(3000), TERM).is_empty());
    }

    #[test]
    fn second_signal_in_beat_three_kills_now() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        assert_eq!(d.handle(ms(5500), TERM), vec![Action::KillAll]);
        assert!(d.handle(ms(5600), Event::Killed(1)).is_empty());
        d.handle(
            ms(5601),
            Event::ChildExited(ChildExit::Signal(Signal::KILL)),
        );
        let a = d.handle(ms(5602), Event::DescendantsGone);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::Abandoned
            })
        );
    }

    #[test]
    fn signals_within_100ms_count_as_the_first() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        assert!(d.handle(ms(50), Event::Signal(Signal::QUIT)).is_empty());
        assert_eq!(d.next_deadline(), Some(ms(5000)), "still in beat 2");
        // Also when the delay was skipped (forward at T0): no instant kill.
        let mut d = Drain::new(policy());
        d.handle(ms(0), TERM);
        assert!(d.handle(ms(99), TERM).is_empty());
        assert_eq!(d.handle(ms(100), TERM), vec![Action::KillAll]);
    }

    #[test]
    fn second_signal_ignore() {
        let mut p = policy();
        p.second_signal = SecondSignal::Ignore;
        let mut d = ready(p);
        d.handle(ms(0), TERM);
        assert!(d.handle(ms(1000), TERM).is_empty());
        d.handle(ms(5000), Event::Tick);
        assert!(d.handle(ms(6000), TERM).is_empty());
        assert_eq!(d.next_deadline(), Some(ms(25000)));
    }

    #[test]
    fn deadline_kills_what_remains() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.handle(ms(6000), Event::ChildExited(ChildExit::Code(0)));
        assert_eq!(d.handle(ms(25000), Event::Tick), vec![Action::KillAll]);
        assert!(d.handle(ms(25000), Event::Killed(2)).is_empty());
        let a = d.handle(ms(25010), Event::DescendantsGone);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::Abandoned
            })
        );
    }

    #[test]
    fn kill_settle_bounds_an_unreapable_process() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.handle(ms(6000), Event::ChildExited(ChildExit::Code(0)));
        d.handle(ms(25000), Event::Tick);
        d.handle(ms(25000), Event::Killed(1));
        assert_eq!(d.next_deadline(), Some(ms(26000)));
        let a = d.handle(ms(26000), Event::Tick);
        assert_eq!(exit_of(&a).unwrap().code, 2);
    }

    #[test]
    fn an_unreapable_main_child_does_not_hold_drainit_after_the_settle() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        assert_eq!(d.handle(ms(25000), Event::Tick), vec![Action::KillAll]);
        d.handle(ms(25000), Event::Killed(1));
        // The child is never reaped: after the settle drainit goes on, once.
        let a = d.handle(ms(26000), Event::Tick);
        assert_eq!(exit_of(&a).unwrap().code, 2);
        assert_eq!(d.next_deadline(), None, "no deadline left to spin on");
    }

    #[test]
    fn clean_stop_with_child_code_143_is_zero() {
        let mut d = ready(policy());
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.handle(ms(5200), Event::ChildExited(ChildExit::Code(143)));
        let a = d.handle(ms(5200), Event::DescendantsGone);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 0,
                reason: Reason::Drained
            })
        );
    }

    #[test]
    fn child_exits_by_itself_gives_its_code() {
        for (exit, code) in [
            (ChildExit::Code(0), 0),
            (ChildExit::Code(7), 7),
            (ChildExit::Signal(Signal::KILL), 137),
        ] {
            let mut d = ready(policy());
            let a = d.handle(ms(100), Event::ChildExited(exit));
            assert_eq!(
                a,
                vec![
                    Action::SampleInFlight,
                    Action::SignalRemaining(Signal::TERM)
                ]
            );
            assert_eq!(d.phase(), Phase::Stopping);
            assert_eq!(
                d.next_deadline(),
                Some(ms(20100)),
                "drain timeout from the exit, no delay"
            );
            let a = d.handle(ms(150), Event::DescendantsGone);
            assert_eq!(
                exit_of(&a),
                Some(Outcome {
                    code,
                    reason: Reason::ChildExited
                })
            );
        }
    }

    #[test]
    fn child_exit_zero_with_abandoned_work_is_two_and_a_crash_outranks_it() {
        for (exit, code, reason) in [(0, 2, Reason::Abandoned), (3, 3, Reason::ChildExited)] {
            let mut d = ready(policy());
            d.handle(ms(0), Event::ChildExited(ChildExit::Code(exit)));
            assert_eq!(d.handle(ms(20000), Event::Tick), vec![Action::KillAll]);
            d.handle(ms(20000), Event::Killed(1));
            let a = d.handle(ms(20001), Event::DescendantsGone);
            assert_eq!(exit_of(&a), Some(Outcome { code, reason }));
        }
    }

    #[test]
    fn drain_signal_while_stopping_acts_as_second_signal() {
        let mut d = ready(policy());
        d.handle(ms(0), Event::ChildExited(ChildExit::Code(0)));
        assert_eq!(d.handle(ms(500), TERM), vec![Action::KillAll]);
        assert_eq!(
            d.drain_signal(),
            None,
            "no drain: the exit code stays the child's"
        );
        d.handle(ms(500), Event::Killed(1));
        let a = d.handle(ms(501), Event::DescendantsGone);
        assert_eq!(exit_of(&a).unwrap().code, 2);
    }

    #[test]
    fn non_drain_signals_are_forwarded_rewritten_and_never_start_a_drain() {
        let mut p = policy();
        p.rewrite.insert(Signal::HUP, Signal(libc::SIGUSR1));
        p.rewrite.insert(Signal(libc::SIGWINCH), Signal(0));
        let mut d = ready(p);
        assert_eq!(
            d.handle(ms(0), Event::Signal(Signal::HUP)),
            vec![Action::Forward(Signal(libc::SIGUSR1))]
        );
        assert!(
            d.handle(ms(0), Event::Signal(Signal(libc::SIGWINCH)))
                .is_empty()
        );
        assert_eq!(
            d.handle(ms(0), Event::Signal(Signal::CONT)),
            vec![Action::Forward(Signal::CONT)]
        );
        assert_eq!(d.phase(), Phase::Ready);
        d.handle(ms(0), TERM);
        assert_eq!(
            d.handle(ms(10), Event::Signal(Signal::CONT)),
            vec![Action::Forward(Signal::CONT)]
        );
        assert_eq!(
            d.next_deadline(),
            Some(ms(5000)),
            "CONT neither skips nor ends beat 2"
        );
    }

    #[test]
    fn drain_signal_is_rewritten_at_beat_three() {
        let mut p = policy();
        p.rewrite.insert(Signal::TERM, Signal::QUIT);
        let mut d = ready(p);
        d.handle(ms(0), TERM);
        assert_eq!(
            d.handle(ms(5000), Event::Tick),
            vec![Action::ForwardDrain(Signal::QUIT)]
        );
        assert_eq!(d.drain_signal(), Some(Signal::TERM));
    }

    #[test]
    fn custom_drain_signal_set() {
        let mut p = policy();
        p.drain_signals = vec![Signal(libc::SIGUSR1)];
        let mut d = ready(p);
        assert_eq!(d.handle(ms(0), TERM), vec![Action::Forward(Signal::TERM)]);
        assert_eq!(
            d.handle(ms(0), Event::Signal(Signal(libc::SIGUSR1))),
            vec![Action::SampleInFlight]
        );
    }

    fn with_teardown(n: usize) -> Drain {
        let mut p = policy();
        p.teardown_timeouts = vec![ms(1000); n];
        let mut d = ready(p);
        d.handle(ms(0), TERM);
        d.handle(ms(5000), Event::Tick);
        d.handle(ms(5100), Event::ChildExited(ChildExit::Code(0)));
        d
    }

    /// After the last step: the sweep for leftovers, then the exit.
    fn swept(d: &mut Drain, a: Vec<Action>, killed: usize) -> Vec<Action> {
        assert_eq!(a, vec![Action::KillAll], "teardown ends with a sweep");
        d.handle(ms(9999), Event::Killed(killed))
    }

    #[test]
    fn a_daemon_left_by_teardown_is_swept_and_abandoned() {
        let mut d = with_teardown(1);
        d.handle(ms(5100), Event::DescendantsGone);
        let a = d.handle(ms(5200), Event::TeardownExited { ok: true });
        let a = swept(&mut d, a, 1);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::Abandoned
            })
        );
    }

    #[test]
    fn teardown_runs_in_order_after_the_drain() {
        let mut d = with_teardown(2);
        assert_eq!(
            d.handle(ms(5100), Event::DescendantsGone),
            vec![Action::StartTeardown(0)]
        );
        assert_eq!(d.phase(), Phase::Stopping);
        assert_eq!(
            d.handle(ms(5200), Event::TeardownExited { ok: true }),
            vec![Action::StartTeardown(1)]
        );
        let a = d.handle(ms(5300), Event::TeardownExited { ok: true });
        let a = swept(&mut d, a, 0);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 0,
                reason: Reason::Drained
            })
        );
    }

    #[test]
    fn teardown_failure_gives_two() {
        let mut d = with_teardown(2);
        d.handle(ms(5100), Event::DescendantsGone);
        assert_eq!(
            d.handle(ms(5200), Event::TeardownExited { ok: false }),
            vec![Action::StartTeardown(1)]
        );
        let a = d.handle(ms(5300), Event::TeardownExited { ok: true });
        let a = swept(&mut d, a, 0);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::TeardownFailed
            })
        );
        assert_eq!(d.teardown(), &[StepEnd::Failed, StepEnd::Ok]);
    }

    #[test]
    fn teardown_timeout_kills_the_step() {
        let mut d = with_teardown(1);
        d.handle(ms(5100), Event::DescendantsGone);
        assert_eq!(d.next_deadline(), Some(ms(6100)));
        assert_eq!(
            d.handle(ms(6100), Event::Tick),
            vec![Action::KillTeardown(0)]
        );
        let a = d.handle(ms(6110), Event::TeardownExited { ok: false });
        let a = swept(&mut d, a, 0);
        assert_eq!(
            exit_of(&a),
            Some(Outcome {
                code: 2,
                reason: Reason::TeardownFailed
            })
        );
        assert_eq!(d.teardown(), &[StepEnd::TimedOut]);
    }

    #[test]
    fn a_killed_step_that_is_never_reaped_is_given_up_after_the_settle() {
        let mut d = with_teardown(2);
        d.handle(ms(5100), Event::DescendantsGone);
        assert_eq!(
            d.handle(ms(6100), Event::Tick),
            vec![Action::KillTeardown(0)]
        );
        assert_eq!(d.next_deadline(), Some(ms(6100) + KILL_SETTLE));
        let a = d.handle(ms(6100) + KILL_SETTLE, Event::Tick);
        assert_eq!(a, vec![Action::StartTeardown(1)]);
        assert_eq!(d.teardown(), &[StepEnd::TimedOut]);
    }

    #[test]
    fn second_signal_during_teardown_cuts_it_and_skips_the_rest() {
        let mut d = with_teardown(3);
        d.handle(ms(5100), Event::DescendantsGone);
        d.handle(ms(5200), Event::TeardownExited { ok: true });
        assert_eq!(d.handle(ms(5300), TERM), vec![Action::KillTeardown(1)]);
        let a = d.handle(ms(5310), Event::TeardownExited { ok: false });
        let a = swept(&mut d, a, 0);
        assert_eq!(exit_of(&a).unwrap().code, 2);
        assert_eq!(d.teardown(), &[StepEnd::Ok, StepEnd::Cut, StepEnd::Skipped]);
    }

    #[test]
    fn teardown_failure_after_clean_child_exit_is_two_but_crash_keeps_its_code() {
        for (exit, code) in [(0, 2), (5, 5)] {
            let mut p = policy();
            p.teardown_timeouts = vec![ms(1000)];
            let mut d = ready(p);
            d.handle(ms(0), Event::ChildExited(ChildExit::Code(exit)));
            assert_eq!(
                d.handle(ms(1), Event::DescendantsGone),
                vec![Action::StartTeardown(0)]
            );
            let a = d.handle(ms(2), Event::TeardownExited { ok: false });
            let a = swept(&mut d, a, 0);
            assert_eq!(exit_of(&a).unwrap().code, code);
        }
    }

    #[test]
    fn idle_has_no_deadline() {
        let d = ready(policy());
        assert_eq!(d.next_deadline(), None);
        let d = Drain::new(policy());
        assert_eq!(d.next_deadline(), None);
    }
}
