//! [`AppTree`]: the app's processes as drainit tracks them, and every signal
//! sent to them.
//!
//! Signal first, account after: the forward and the SIGKILL are sent before any
//! walk of `/proc` that only counts (a tree of thousands of processes or zombies
//! takes tens of milliseconds to read), descendants found by a walk are signalled
//! as it finds them, and the instants returned are those of the signals. "No
//! descendant left" is proven, never inferred from a walk that may miss a process
//! forked while its parent exited ([`AppTree::nothing_left`]).

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use tokio::time::Instant;

use super::{ProcessLedger, Tree};
use crate::procs::{self, Proc};
use crate::reaper::Reaper;
use crate::signals::Signal;

/// What a kill (the deadline's, or a chase while it settles) did: the counts the
/// driver turns into `Killed` and `Unkillable` events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kills {
    /// Processes newly SIGKILLed and recorded abandoned.
    pub killed: usize,
    /// Processes newly found that drainit may not signal (`EPERM`).
    pub unkillable: usize,
}

/// Beat 3's forward, as sent.
#[derive(Clone, Debug)]
pub struct DrainForward {
    /// When the drain signal was sent (before any accounting read).
    pub sent_at: Instant,
    /// The log line: `forwarded SIGTERM to child 42`.
    pub line: String,
}

/// What one step of the driver read of the tree, for later actions of the same
/// step (nothing was reaped in between, so the reads still hold). Cleared by
/// [`AppTree::end_step`].
#[derive(Default)]
struct StepReads {
    /// The descendants the step read (after its signal, if it sent one): one
    /// `/proc` walk per step, not two.
    alive: Option<Vec<Proc>>,
    /// The main child's `/proc` entry as the forward read it.
    child: Option<Option<Proc>>,
}

/// The main child.
struct MainChild {
    pid: i32,
    /// Not reaped yet: its pid, and its group's id, are still its own.
    alive: bool,
    /// `--forward-to group`: signals go to its process group.
    to_group: bool,
}

/// The app's process tree: the main child, its descendants, what drainit sent
/// them and what became of them (the [`ProcessLedger`]).
pub struct AppTree {
    /// The kernel (a fake one in tests): every read and every signal.
    kernel: Rc<dyn Tree>,
    /// Knows drainit's helpers (exec checks, teardown steps): not the app's.
    reaper: Rc<RefCell<Reaper>>,
    child: MainChild,
    me: i32,
    is_pid1: bool,
    /// `/proc` shows this PID namespace (checked once at start): without it, no
    /// `/proc` pid may be trusted, and the drain falls back on the reaper alone.
    proc_ok: bool,
    /// The last scan found processes from outside the namespace (as PID 1): their
    /// end raises no SIGCHLD here, so `/proc` is polled while the drain waits.
    outsiders: bool,
    /// Processes that got the drain signal from drainit: `(pid, start)`.
    signalled: HashSet<(i32, u64)>,
    ledger: ProcessLedger,
    step: StepReads,
    /// What ended drain phases left in their process groups (killed with the
    /// group): drainit's, never the app's work, whatever their reap says.
    leftovers: HashSet<i32>,
    /// Beat 2's drain signal and when it is due ([`AppTree::send_when_due`]):
    /// a walk that runs past that instant sends it from within.
    due: Option<(Instant, Signal)>,
    /// The drain signal a walk sent when it came due, and when: the forward
    /// that follows takes it as its own instead of sending it again.
    sent_early: Option<(Signal, Instant)>,
}

impl AppTree {
    /// The tree below drainit, whose main child `child_pid` was just spawned;
    /// `to_group`: signals are forwarded to its process group.
    pub fn new(
        kernel: Rc<dyn Tree>,
        reaper: Rc<RefCell<Reaper>>,
        child_pid: i32,
        to_group: bool,
    ) -> AppTree {
        let me = std::process::id() as i32;
        let proc_ok = kernel.is_own_namespace();
        if !proc_ok {
            log::warn!(
                "/proc is not this PID namespace's (mount a fresh /proc, e.g. unshare --mount-proc): \
                 descendants cannot be found; only the main child and reaped processes are tracked"
            );
        }
        AppTree {
            kernel,
            reaper,
            child: MainChild {
                pid: child_pid,
                alive: true,
                to_group,
            },
            me,
            is_pid1: me == 1,
            proc_ok,
            outsiders: false,
            signalled: HashSet::new(),
            ledger: ProcessLedger::default(),
            step: StepReads::default(),
            leftovers: HashSet::new(),
            due: None,
            sent_early: None,
        }
    }

    /// Beat 2 (no admission gate): the drain signal `sig` is due at `at`. A walk
    /// of `/proc` that is still running then (beat 1's count of a tree of
    /// thousands, which takes longer than a short pre-drain delay) sends it to
    /// the main child (or its group) from within, on time: signal first,
    /// account after. `None` clears it.
    pub fn send_when_due(&mut self, due: Option<(Instant, Signal)>) {
        self.due = due;
    }

    /// Whether a walk sent the drain signal when it came due (see
    /// [`AppTree::send_when_due`]); the driver then lets the machine forward at
    /// once, and [`AppTree::forward_drain`] records that signal.
    pub fn sent_early(&self) -> bool {
        self.sent_early.is_some()
    }

    /// Beat 1's walk: the live descendants, sending the due drain signal on the
    /// way when its time comes (checked every 64 processes read).
    fn descendants_sending_due(&mut self) -> Option<Vec<Proc>> {
        let Some((due, sig)) = self.due.take() else {
            return self.descendants();
        };
        if !self.proc_ok {
            return None;
        }
        if !self.is_pid1 && !self.kernel.has_children() {
            return Some(Vec::new());
        }
        let helpers = self.helpers();
        let target = self.forward_target();
        let kernel = Rc::clone(&self.kernel);
        let mut out = Vec::new();
        let mut sent = None;
        let mut n = 0u32;
        let walked = kernel.visit(self.me, &helpers, &mut |p| {
            n += 1;
            if sent.is_none() && n.is_multiple_of(64) && Instant::now() >= due {
                send_to(&*kernel, target, sig);
                sent = Some((sig, Instant::now()));
            }
            if !p.zombie {
                out.push(p.clone());
            }
        });
        if let Some(s) = sent {
            self.sent_early = Some(s);
        }
        match walked {
            Ok(()) => Some(out),
            Err(e) => {
                log::error!("reading /proc to find descendants failed: {e}");
                None
            }
        }
    }

    /// The main child's pid.
    pub fn child_pid(&self) -> i32 {
        self.child.pid
    }

    /// The ledger of the app's processes, for the report.
    pub fn ledger(&self) -> &ProcessLedger {
        &self.ledger
    }

    /// The drain is over (or killed): whatever ends from now on is not counted
    /// completed.
    pub fn close_ledger(&mut self) {
        self.ledger.close();
    }

    /// The main child was reaped.
    pub fn main_exited(&mut self) {
        self.child.alive = false;
        self.ledger.ended(self.child.pid);
    }

    /// An orphan was reaped.
    pub fn orphan_reaped(&mut self, pid: i32) {
        if !self.leftovers.remove(&pid) {
            self.ledger.ended(pid);
        }
    }

    /// A drain phase led by `pid` (its group's id) was reaped: what it left in
    /// its process group (`sh -c 'x & exit 0'`) is found, remembered as not the
    /// app's, and SIGKILLed with the group. Left, it would be re-parented to
    /// drainit and taken for the app's work (counted completed, or signalled at
    /// the drain and killed at the deadline). The group is still the helper's
    /// while a member lives; `ESRCH` (nothing left) is the common case.
    pub fn end_helper(&mut self, pid: i32) {
        self.note_leftovers(pid);
        self.send(-pid, Signal::KILL);
    }

    /// Whether the last proof found processes from outside the namespace (their
    /// end raises no SIGCHLD here: `/proc` must be polled).
    pub fn outsiders(&self) -> bool {
        self.outsiders
    }

    /// The end of one step of the driver: its reads no longer hold.
    pub fn end_step(&mut self) {
        self.step = StepReads::default();
    }

    fn helpers(&self) -> HashSet<i32> {
        super::helpers(&self.reaper, &*self.kernel)
    }

    /// Where a forwarded signal goes: the main child's pid, or its process
    /// group's (negative) with `--forward-to group`.
    pub fn forward_target(&self) -> i32 {
        AppTree::target_of(self.child.pid, self.child.to_group)
    }

    /// Where a forward to main child `pid` goes: `pid`, or its process group
    /// (`-pid`, the child leads it) with `to_group` (`--forward-to group`).
    pub fn target_of(pid: i32, to_group: bool) -> i32 {
        if to_group { -pid } else { pid }
    }

    fn send(&self, target: i32, sig: Signal) {
        send_to(&*self.kernel, target, sig);
    }

    /// The live descendants, or `None` when `/proc` could not be read (logged):
    /// then nothing may be concluded, least of all that none is left.
    pub fn descendants(&self) -> Option<Vec<Proc>> {
        if !self.proc_ok {
            return None;
        }
        // Not PID 1 and no child at all: nothing below drainit is left (it is a
        // subreaper, see `reaper::has_children`). One syscall instead of a walk.
        if !self.is_pid1 && !self.kernel.has_children() {
            return Some(Vec::new());
        }
        match self.kernel.descendants(self.me, &self.helpers()) {
            Ok(v) => Some(v),
            Err(e) => {
                log::error!("reading /proc to find descendants failed: {e}");
                None
            }
        }
    }

    /// The non-helper children of drainit, zombies included (see
    /// [`procs::children`]); `None` when the kernel has no such list or `/proc`
    /// cannot be read.
    fn own_children(&self) -> Option<Vec<i32>> {
        if !self.proc_ok {
            return None;
        }
        match self.kernel.children(self.me) {
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
            None => !self.kernel.has_children(),
        }
    }

    /// Whether no descendant is left, proven: `none_left` is the
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
    pub fn nothing_left(&mut self, none_left: bool) -> bool {
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

    /// Beat 1's count, at the end of the step that asked for it: records in the
    /// ledger, and returns, the live descendants (read after the step's signal,
    /// if it sent one), plus the main child read before that signal.
    pub fn sample_in_flight(&mut self) -> usize {
        let mut alive = match self.step.alive.take() {
            Some(v) => v,
            None => self.descendants_sending_due().unwrap_or_default(),
        };
        // The main child, read after this step's signal (once), unreaped: alive
        // at T0 even if it has ended since (killed by this step's forward, or
        // exited on catching it). One that ended before the drain signal was
        // read is reaped before it: its SIGCHLD was read with that signal (the
        // kernel queues it before the process reads as a zombie), and the batch
        // reaps the main child first (`Driver::on_signals`).
        let child = match self.step.child.take() {
            Some(read) => read,
            None if self.child.alive && self.proc_ok => self.kernel.stat_of(self.child.pid),
            None => None,
        };
        if let Some(p) = child
            && !alive.iter().any(|a| a.id() == p.id())
        {
            alive.push(p);
        }
        self.ledger.sample(alive.iter().map(Proc::id));
        let n = alive.len();
        self.step.alive = Some(alive);
        n
    }

    /// `sig` to the main child (or its group) while the main child lives;
    /// returns whether it was sent. The fast part of [`AppTree::forward`], for a
    /// signal forwarded as soon as it is read: nothing is read or logged first.
    pub fn forward_at_once(&self, sig: Signal) -> bool {
        if self.child.alive {
            self.send(self.forward_target(), sig);
        }
        self.child.alive
    }

    /// A signal that is not a drain signal: to the main child (or its group), at
    /// once; to the group still when its leader is gone but a member lives.
    /// Returns whether it was sent.
    pub fn forward(&mut self, sig: Signal) -> bool {
        if self.forward_at_once(sig) {
            log::debug!("forwarded {sig} to {}", self.forward_target());
            true
        } else if self.child.to_group
            && self
                .descendants()
                .is_some_and(|v| v.iter().any(|p| p.pgid == self.child.pid))
        {
            // The leader is gone but its group lives on (a group id is
            // not reused while a member exists, and a member was just seen).
            log::debug!("forwarding {sig} to process group {}", self.child.pid);
            self.send(-self.child.pid, sig);
            true
        } else {
            log::debug!("{sig} not forwarded: the main child is gone");
            false
        }
    }

    /// Beat 3: the drain signal to the main child (or its group), then the
    /// accounting: who got it, and SIGCONT for a stopped one.
    pub fn forward_drain(&mut self, sig: Signal) -> DrainForward {
        let target = self.forward_target();
        // The signal goes first, the accounting after: the main child's
        // identity and whether it is stopped are read after the signal
        // (unreaped, it is still that process, and a drain signal does
        // not continue a stopped one).
        self.due = None;
        let sent_at = match self.sent_early.take() {
            // Sent already, on time, by beat 1's walk.
            Some((early, at)) if early == sig => at,
            _ => {
                self.send(target, sig);
                let sent_at = Instant::now();
                // The child was just woken, often onto this CPU (the scheduler
                // places a wakee near its waker): let it run before the
                // accounting below, which reads /proc (sched_yield(2)).
                std::thread::yield_now();
                sent_at
            }
        };
        let child = if self.child.alive && self.proc_ok {
            self.kernel.stat_of(self.child.pid)
        } else {
            None
        };
        self.step.child = Some(child.clone());
        let mut stopped = child.as_ref().is_some_and(|c| c.stopped);
        if let Some(c) = &child {
            self.signalled.insert(c.id());
        }
        if target < 0 {
            // The group's members got it too (those forked after the
            // signal were started by a member already draining).
            let left = self.descendants().unwrap_or_default();
            for p in &left {
                if p.pgid == self.child.pid {
                    self.signalled.insert(p.id());
                    stopped |= p.stopped;
                }
            }
            self.step.alive = Some(left);
        }
        if stopped {
            // A stopped process cannot act on the drain signal: wake it, as
            // systemd does after SIGTERM (systemd.kill(5), SendSIGCONT=).
            self.send(target, Signal::CONT);
        }
        let line = format!(
            "forwarded {sig} to {} {}",
            if target < 0 { "process group" } else { "child" },
            target.abs()
        );
        DrainForward { sent_at, line }
    }

    /// Every descendant alive now and not yet signalled by drainit gets the
    /// leftover signal; returns how many did. Called once, when the main child
    /// is gone (or at the forward, if it went during the pre-drain delay):
    /// processes created later were started by a process already draining (a
    /// cleanup hook's `curl`, a trap's `sleep`) and are part of its drain, so
    /// they are waited for, not signalled, and SIGKILLed only at the deadline.
    ///
    /// Each process is signalled as the walk finds it, not after the walk: in a
    /// tree of thousands the first signal goes out after one `/proc` read.
    pub fn signal_remaining(&mut self, sig: Signal) -> usize {
        let (me, helpers, kernel) = (self.me, self.helpers(), self.kernel.clone());
        let signalled = &mut self.signalled;
        let mut sent = 0;
        let mut hit = |p: &Proc| {
            if !p.zombie && signalled.insert(p.id()) {
                send_to(&*kernel, p.pid, sig);
                sent += 1;
                if p.stopped {
                    send_to(&*kernel, p.pid, Signal::CONT);
                }
                log::info!("sent {sig} to remaining process {} ({})", p.pid, p.comm);
            }
        };
        if let Some(left) = self.step.alive.as_ref() {
            left.iter().for_each(hit);
            return sent;
        }
        // Unreadable /proc (logged): the deadline still SIGKILLs what is left.
        let mut seen = Vec::new();
        if self.proc_ok && (self.is_pid1 || self.kernel.has_children()) {
            let r = kernel.visit(me, &helpers, &mut |p| {
                hit(p);
                if !p.zombie {
                    seen.push(p.clone());
                }
            });
            if let Err(e) = r {
                log::error!("reading /proc to find descendants failed: {e}");
            }
        }
        self.step.alive = Some(seen);
        sent
    }

    /// The deadline's SIGKILL (and the sweep after teardown). Signal first: as
    /// PID 1 `kill(-1)`, otherwise the main child's process group, before any
    /// walk; then each descendant is killed as the walk finds it, and recorded
    /// abandoned (a zombie whose status says SIGKILL was killed by this too; one
    /// that ended by itself was not). A process drainit may not signal (`EPERM`)
    /// is recorded unkillable instead, and logged once.
    pub fn kill_all(&mut self) -> Kills {
        self.ledger.close();
        // The main child first (it is not reaped, so its pid and group are still
        // its own): woken first, it tends to die first, and its status is what
        // the report shows.
        // Failures are not logged here: the walk below finds each process still
        // alive, kills it by pid and records (and logs, once) what it cannot kill.
        if self.child.alive {
            let _ = self.kernel.kill(self.child.pid, Signal::KILL);
        }
        if self.is_pid1 {
            // As PID 1, -1 means every process of this PID namespace but drainit
            // (kill(2)); never used outside PID 1, where it would reach processes
            // drainit did not start.
            let _ = self.kernel.kill(-1, Signal::KILL);
        } else if self.child.alive {
            let _ = self.kernel.kill(-self.child.pid, Signal::KILL);
        }
        let mut all = Kills::default();
        // A few rounds: a process may fork between the read and its SIGKILL.
        for _ in 0..3 {
            let before = all;
            match self.kill_round() {
                Some(k) => all.add(k),
                None => {
                    all.add(self.kill_main_child());
                    break;
                }
            }
            if all == before {
                break;
            }
        }
        if self.is_pid1 {
            let _ = self.kernel.kill(-1, Signal::KILL);
        }
        if all.killed > 0 {
            self.log_killed(all.killed);
        }
        all
    }

    /// With `/proc` unreadable, what can still be reached is the main child and its
    /// group (and, as PID 1, everything: `kill_all` sent `kill(-1)`). Both were
    /// sent SIGKILL already; sent again, to learn the outcome for the main child.
    fn kill_main_child(&mut self) -> Kills {
        let mut counts = Kills::default();
        if !self.child.alive {
            return counts;
        }
        let pid = self.child.pid;
        let comm = self.kernel.comm(pid).unwrap_or_default();
        match self.kernel.kill(pid, Signal::KILL) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if self.ledger.unkillable(pid, comm) {
                    counts.unkillable = 1;
                    log::warn!(
                        "cannot kill the main child {pid}: not permitted; it is left running (unkillable)"
                    );
                }
            }
            _ => {
                if self.ledger.abandon(pid, comm) {
                    counts.killed = 1;
                }
            }
        }
        self.send(-pid, Signal::KILL);
        counts
    }

    /// One walk of the tree that SIGKILLs every live descendant as it is found and
    /// records it; `None` when `/proc` cannot be read.
    fn kill_round(&mut self) -> Option<Kills> {
        if !self.proc_ok {
            return None;
        }
        if !self.is_pid1 && !self.kernel.has_children() {
            return Some(Kills::default());
        }
        let (me, helpers) = (self.me, self.helpers());
        let ledger = &mut self.ledger;
        let signalled = &mut self.signalled;
        let mut k = Kills::default();
        let mut leaders = HashSet::new();
        let mut groups = HashSet::new();
        let kernel = self.kernel.clone();
        let r = kernel.visit(me, &helpers, &mut |p| {
            // Ended by itself (before the kill): not abandoned.
            if p.zombie && !p.killed {
                return;
            }
            if !p.zombie {
                if ledger.is_unkillable(p.pid) {
                    return;
                }
                if let Err(e) = kernel.kill(p.pid, Signal::KILL)
                    && e.raw_os_error() == Some(libc::EPERM)
                {
                    if ledger.unkillable(p.pid, p.comm.clone()) {
                        k.unkillable += 1;
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
                k.killed += 1;
            }
        });
        if let Err(e) = r {
            log::error!("reading /proc to find descendants failed: {e}");
            return None;
        }
        // Process groups led by a descendant (or the main child's, while it is
        // unreaped) also catch what forked between the read and the kill.
        for g in groups {
            if leaders.contains(&g) || (g == self.child.pid && self.child.alive) {
                let _ = self.kernel.kill(-g, Signal::KILL);
            }
        }
        Some(k)
    }

    /// While the kill settles: SIGKILL drainit's live children (what the kill's
    /// walk could not see: a process forked as its parent was killed is
    /// re-parented to drainit). They are drainit's own and unreaped, so their
    /// pids cannot have been reused.
    pub fn chase(&mut self) -> Kills {
        let mut k = Kills::default();
        let Some(children) = self.own_children() else {
            return k;
        };
        for pid in children {
            // Killed already (and unreaped, so still that process): no read.
            if self.ledger.is_abandoned(pid) {
                continue;
            }
            let Some(p) = self.kernel.stat_of(pid) else {
                continue;
            };
            if p.zombie || self.ledger.is_unkillable(pid) {
                continue;
            }
            match self.kernel.kill(pid, Signal::KILL) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    if self.ledger.unkillable(pid, p.comm.clone()) {
                        k.unkillable += 1;
                        log::warn!(
                            "cannot kill {pid} ({}): not permitted; it is left running (unkillable)",
                            p.comm
                        );
                    }
                }
                _ => {
                    self.signalled.insert(p.id());
                    if self.ledger.abandon(pid, p.comm.clone()) {
                        k.killed += 1;
                    }
                }
            }
        }
        if k.killed > 0 {
            log::warn!(
                "abandoned: SIGKILLed {} more process(es) started as the kill ran",
                k.killed
            );
        }
        k
    }

    /// A drain phase out of time (or cut by a second signal): SIGTERM its
    /// process group, if it is still unreaped (its group id is then still its
    /// own). Returns whether it was.
    pub fn cancel_helper(&mut self, pid: i32) -> bool {
        if !self.reaper.borrow().is_waiting(pid) {
            return false;
        }
        // Its members may die of it before the leader is reaped: they are
        // known as drainit's first.
        self.note_leftovers(pid);
        self.send(-pid, Signal::TERM);
        true
    }

    /// A drain phase that ignored its cancellation: SIGKILL its process group
    /// (if its leader is unreaped), its members known as drainit's.
    pub fn kill_phase(&mut self, pid: i32) {
        if self.reaper.borrow().is_waiting(pid) {
            self.end_helper(pid);
        }
    }

    /// Remembers the members of process group `pgid` (but its leader) as
    /// drainit's, not the app's.
    fn note_leftovers(&mut self, pgid: i32) {
        if self.proc_ok
            && let Ok(procs) = self.kernel.descendants(self.me, &HashSet::new())
        {
            self.leftovers.extend(
                procs
                    .iter()
                    .filter(|p| p.pgid == pgid && p.pid != pgid)
                    .map(|p| p.pid),
            );
        }
    }

    /// A teardown step (or drain phase) out of time: SIGKILL its process group, if it is still
    /// unreaped (its group id is then still its own). Returns whether it was.
    pub fn kill_helper(&self, pid: i32) -> bool {
        if !self.reaper.borrow().is_waiting(pid) {
            return false;
        }
        self.send(-pid, Signal::KILL);
        true
    }

    /// The processes still alive count as they are: those of the T0 set that are
    /// gone ended (a grandchild reaped by its own parent is never seen by the
    /// reaper). At exit, before the report.
    pub fn settle(&mut self) {
        if let Some(alive) = self.descendants() {
            let alive: HashSet<(i32, u64)> = alive.iter().map(Proc::id).collect();
            self.ledger.settle(&alive);
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
}

impl Kills {
    fn add(&mut self, other: Kills) {
        self.killed += other.killed;
        self.unkillable += other.unkillable;
    }
}

/// Sends `sig` to `target` (a pid, or a negated process group); failures are
/// logged but for `ESRCH`.
pub(super) fn send_to(kernel: &dyn Tree, target: i32, sig: Signal) {
    if let Err(e) = kernel.kill(target, sig) {
        report_failed_send(target, sig, &e);
    }
}

/// Logs a failed send of `sig` to `target`, but for `ESRCH`: the target is
/// already gone (it races with its own exit).
pub(super) fn report_failed_send(target: i32, sig: Signal, e: &std::io::Error) {
    if e.raw_os_error() != Some(libc::ESRCH) {
        log::warn!("sending {sig} to {target} failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    //! The tree's decisions against a fake kernel: who gets which signal, once,
    //! and what the counts say.
    use super::*;
    use crate::tree::fake::{FakeTree, Reacts};

    const CHILD: i32 = 4_000_000;

    /// A tree with the main child `CHILD` (its own group) and `more` processes.
    fn tree(to_group: bool, more: &[(i32, i32, Reacts)]) -> (Rc<FakeTree>, AppTree) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let fake = FakeTree::new(tx);
        fake.add(CHILD, CHILD, Reacts::Ignores);
        for (pid, pgid, reacts) in more {
            fake.add(*pid, *pgid, *reacts);
        }
        let reaper = Rc::new(RefCell::new(Reaper::with_waiter(fake.clone())));
        reaper.borrow_mut().set_main(CHILD);
        let app = AppTree::new(fake.clone(), reaper, CHILD, to_group);
        (fake, app)
    }

    fn sent(fake: &FakeTree) -> Vec<(i32, Signal)> {
        fake.sent.borrow().iter().map(|s| (s.1, s.2)).collect()
    }

    #[test]
    fn a_signal_goes_to_the_child_or_its_group_and_to_the_group_after_the_leader() {
        let (fake, mut app) = tree(false, &[]);
        assert!(app.forward(Signal::HUP));
        assert_eq!(sent(&fake), vec![(CHILD, Signal::HUP)]);

        let (fake, mut app) = tree(true, &[(CHILD + 1, CHILD, Reacts::Ignores)]);
        app.main_exited();
        fake.procs.borrow_mut().remove(&CHILD);
        assert!(app.forward(Signal::HUP), "a member of the group lives");
        assert_eq!(sent(&fake), vec![(-CHILD, Signal::HUP)]);
        fake.procs.borrow_mut().remove(&(CHILD + 1));
        assert!(!app.forward(Signal::HUP), "nobody left to forward to");
        assert_eq!(sent(&fake).len(), 1);
    }

    #[test]
    fn every_remaining_process_gets_the_drain_signal_once() {
        let more = [
            (CHILD + 1, CHILD + 1, Reacts::Ignores),
            (CHILD + 2, CHILD + 2, Reacts::Ignores),
        ];
        let (fake, mut app) = tree(false, &more);
        let forward = app.forward_drain(Signal::TERM);
        assert_eq!(forward.line, format!("forwarded SIGTERM to child {CHILD}"));
        app.end_step();
        assert_eq!(app.signal_remaining(Signal::TERM), 2, "the child had it");
        app.end_step();
        assert_eq!(app.signal_remaining(Signal::TERM), 0, "once each");
        assert_eq!(
            sent(&fake),
            vec![
                (CHILD, Signal::TERM),
                (CHILD + 1, Signal::TERM),
                (CHILD + 2, Signal::TERM)
            ]
        );
    }

    #[test]
    fn the_kill_abandons_what_it_kills_and_records_what_it_may_not() {
        let more = [
            (CHILD + 1, CHILD, Reacts::Ignores),
            (CHILD + 2, CHILD + 2, Reacts::Forbids),
        ];
        let (fake, mut app) = tree(false, &more);
        app.sample_in_flight();
        let k = app.kill_all();
        assert_eq!(
            k,
            Kills {
                killed: 2,
                unkillable: 1
            }
        );
        assert!(
            sent(&fake).contains(&(-CHILD, Signal::KILL)),
            "the main child's group first: {:?}",
            sent(&fake)
        );
        let ledger = app.ledger();
        assert_eq!(ledger.abandoned().len(), 2);
        assert_eq!(ledger.unkillables()[0].pid, CHILD + 2);
        assert_eq!(app.chase(), Kills::default(), "nothing new to kill");
    }

    #[test]
    fn a_helper_is_killed_only_while_it_is_unreaped() {
        let (fake, app) = tree(false, &[(CHILD + 5, CHILD + 5, Reacts::Ignores)]);
        assert!(!app.kill_helper(CHILD + 5), "not registered: not a helper");
        let _rx = app.reaper.borrow_mut().register(CHILD + 5);
        assert!(app.kill_helper(CHILD + 5));
        assert_eq!(sent(&fake), vec![(-(CHILD + 5), Signal::KILL)]);
    }

    #[test]
    fn nothing_is_left_only_when_drainit_has_no_child() {
        let (fake, mut app) = tree(false, &[]);
        assert!(!app.nothing_left(false));
        fake.procs.borrow_mut().clear();
        assert!(app.nothing_left(false));
    }
}
