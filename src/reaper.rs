//! The one waiter: `waitpid(-1, WNOHANG)` until nothing is left to reap, on every
//! SIGCHLD, in batches of [`MAX_REAP`] (the supervisor runs the next batch once
//! the other wake-ups had their turn: 20,000 orphans re-parented at once take the
//! kernel seconds to hand over, and must not hold a deadline or a signal).
//!
//! Owns: reaping. Every process that ends in drainit's tree and is re-parented to
//! it (as PID 1, or as a child subreaper) is reaped here and nowhere else. The main
//! child's status is handed to the supervisor; processes drainit started for itself
//! (exec checks, teardown steps) are registered first and their status is sent to
//! whoever registered them; anything else is an orphan and is counted.
//!
//! Must not: be bypassed. `tokio::process`, `Child::wait`, `Command::status` and
//! `Command::output` would reap behind this module's back (their own waitpid races
//! with `waitpid(-1)`); they are never used (clippy's `disallowed-methods`).
//!
//! Invariant: a pid is forgotten the moment it is reaped, so nobody signals a pid
//! that may have been reused (CONVENTIONS "Never signal a pid after it was reaped").
//! Registration happens in the same synchronous step as the spawn, on the one
//! runtime thread, so a helper cannot be reaped before it is registered. The
//! signals' thread forwards to the main child outside that step: it does so
//! holding [`Unreaped`], which each wait that can reap the main child holds too.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::drain::ChildExit;
use crate::signals::Signal;

/// What one `waitpid(-1, WNOHANG)` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// This pid ended with this status (and is reaped: forget it).
    Exited(i32, ChildExit),
    /// Children remain, none has ended.
    NoneExited,
    /// `ECHILD`: drainit has no child at all.
    NoChildren,
}

/// The wait-family calls the reaper makes: the kernel's ([`Kernel`]), or a fake
/// tree's in the driver's tests (`tree::Tree` extends this trait).
pub trait Waiter {
    /// Whether drainit has any child at all, alive or unreaped (reaps nothing).
    fn has_children(&self) -> bool;
    /// `waitpid(pid, WNOHANG)`: its status if it has ended (and is reaped).
    fn wait_pid(&self, pid: i32) -> Option<ChildExit>;
    /// `waitpid(-1, WNOHANG)`.
    fn wait_any(&self) -> Waited;
}

/// The kernel: the only `waitpid`/`waitid` calls of drainit.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel;

impl Waiter for Kernel {
    fn has_children(&self) -> bool {
        has_children()
    }
    fn wait_pid(&self, pid: i32) -> Option<ChildExit> {
        wait_pid(pid)
    }
    fn wait_any(&self) -> Waited {
        wait_any()
    }
}

/// What one reap round found.
#[derive(Debug, Default)]
pub struct Round {
    /// The main child's status, if it was reaped in this round.
    pub main: Option<ChildExit>,
    /// Orphans reaped in this round: pid and status.
    pub orphans: Vec<(i32, ChildExit)>,
    /// `waitpid` said ECHILD: drainit has no child left at all.
    pub none_left: bool,
    /// The batch was full: more may be waiting to be reaped (run another round).
    pub more: bool,
}

/// The most processes reaped in one [`Reaper::reap`] round.
pub const MAX_REAP: usize = 256;

/// The main child's forward target (its pid, or `-pgid` with `--forward-to
/// group`) while it is unreaped, 0 once it is reaped: shared with the signals'
/// thread, which forwards holding it ([`crate::tree::AtOnce`]). The reaper holds
/// it around each wait that can reap the main child and sets 0 when one did, so a
/// forward from that thread either comes before the reap (the pid is still the
/// child's, a zombie at worst) or finds 0: never a reaped, reusable pid.
#[derive(Debug)]
pub struct Unreaped(Mutex<i32>);

impl Unreaped {
    /// `target`: the main child's forward target; 0 until it is known.
    pub fn new(target: i32) -> Unreaped {
        Unreaped(Mutex::new(target))
    }

    /// Holds the target (a panic while it was held leaves the value as it was:
    /// a plain integer has no broken state).
    pub fn hold(&self) -> MutexGuard<'_, i32> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The registry of waited-for pids.
pub struct Reaper {
    waiter: Rc<dyn Waiter>,
    main: Option<i32>,
    /// Shared with the signals' thread while the main child is unreaped.
    unreaped: Option<Arc<Unreaped>>,
    waiters: HashMap<i32, oneshot::Sender<ChildExit>>,
    /// The process groups the exec checks lead (a helper's pgid is its pid),
    /// kept after the check is reaped while the group has members: what a check
    /// leaves behind (`sh -c 'x & exit 0'`, killed with it) is drainit's, not
    /// the app's, until it is gone, even re-parented to drainit.
    groups: HashSet<i32>,
    orphans: u64,
}

impl Default for Reaper {
    fn default() -> Reaper {
        Reaper::with_waiter(Rc::new(Kernel))
    }
}

impl Reaper {
    /// The reaper of the kernel's tree.
    pub fn new() -> Reaper {
        Reaper::default()
    }

    /// A reaper that waits through `waiter` (a fake tree in the driver's tests).
    pub fn with_waiter(waiter: Rc<dyn Waiter>) -> Reaper {
        Reaper {
            waiter,
            main: None,
            unreaped: None,
            waiters: HashMap::new(),
            groups: HashSet::new(),
            orphans: 0,
        }
    }

    /// Records the main child's pid (right after the spawn).
    pub fn set_main(&mut self, pid: i32) {
        self.main = Some(pid);
    }

    /// Shares the main child's forward target with the signals' thread: held
    /// around every wait that can reap the main child, set to 0 when one does.
    pub fn share_main(&mut self, unreaped: Arc<Unreaped>) {
        self.unreaped = Some(unreaped);
    }

    /// Registers a helper pid; its status arrives on the returned channel. Call in
    /// the same synchronous step as the spawn.
    pub fn register(&mut self, pid: i32) -> oneshot::Receiver<ChildExit> {
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(pid, tx);
        rx
    }

    /// As [`Reaper::register`], for a helper whose process group is drainit's
    /// to the end (an exec check, whose leftovers are killed with it): the group
    /// stays drainit's after the helper is reaped, while it has members. A
    /// teardown step's or a drain phase's leftovers are not: left running, they
    /// are work drainit abandons, and the report says so.
    pub fn register_check(&mut self, pid: i32) -> oneshot::Receiver<ChildExit> {
        self.groups.insert(pid);
        self.register(pid)
    }

    /// Whether `pid` is a helper that has not been reaped yet (safe to signal).
    pub fn is_waiting(&self, pid: i32) -> bool {
        self.waiters.contains_key(&pid)
    }

    /// The helper pids not yet reaped, and the process groups of reaped helpers
    /// that still had members when last asked ([`Reaper::forget_groups`]):
    /// every pid here, and every process in a group led by one, is drainit's.
    pub fn helpers(&self) -> impl Iterator<Item = i32> + '_ {
        self.waiters.keys().chain(self.groups.iter()).copied()
    }

    /// Forgets the groups of reaped helpers for which `alive(pgid)` says no
    /// member is left (not even a zombie: the kernel reuses a group's number only
    /// after its last member was reaped).
    pub fn forget_groups(&mut self, alive: impl Fn(i32) -> bool) {
        let waiters = &self.waiters;
        self.groups
            .retain(|&g| waiters.contains_key(&g) || alive(g));
    }

    /// How many orphans were reaped so far.
    pub fn orphans(&self) -> u64 {
        self.orphans
    }

    /// Reaps the main child alone if it has exited (`waitpid(main, WNOHANG)`).
    ///
    /// For the one race the signal order creates: the kernel hands out pending
    /// signals by number, so a drain signal (15) is read before a SIGCHLD (17)
    /// raised by a child that exited first. The supervisor asks this before it
    /// takes a drain signal read together with SIGCHLD: a child that already
    /// exited on its own is not drained (docs/processes-and-signals.md). One syscall,
    /// unlike a full reap round, so beat 1 is not delayed by a storm of orphans.
    pub fn reap_main(&mut self) -> Option<ChildExit> {
        let pid = self.main?;
        let mut held = self.unreaped.as_deref().map(Unreaped::hold);
        let exit = self.waiter.wait_pid(pid)?;
        if let Some(target) = held.as_mut() {
            **target = 0;
        }
        self.main = None;
        Some(exit)
    }

    /// Reaps exited children, without blocking: all of them, or [`MAX_REAP`] and
    /// [`Round::more`].
    pub fn reap(&mut self) -> Round {
        let mut round = Round::default();
        // Held only while the main child is unreaped: after, nothing forwards.
        let mut held = self.main.and(self.unreaped.as_deref()).map(Unreaped::hold);
        for n in 0.. {
            if n == MAX_REAP {
                round.more = true;
                break;
            }
            match self.waiter.wait_any() {
                Waited::Exited(pid, exit) => {
                    if Some(pid) == self.main {
                        self.main = None;
                        if let Some(target) = held.take().as_mut() {
                            **target = 0;
                        }
                        round.main = Some(exit);
                    } else if let Some(tx) = self.waiters.remove(&pid) {
                        // The receiver may be gone (a check that timed out): fine.
                        let _ = tx.send(exit);
                    } else {
                        self.orphans += 1;
                        round.orphans.push((pid, exit));
                    }
                }
                Waited::NoneExited => break,
                Waited::NoChildren => {
                    round.none_left = true;
                    break;
                }
            }
        }
        round
    }
}

/// Whether drainit has any child at all, alive or exited and not yet reaped: a peek
/// (`waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT | __WALL)`) that reaps nothing.
///
/// Not PID 1, drainit is a child subreaper: every descendant whose parent ended is
/// re-parented to it, so "no child" means "no descendant", without walking `/proc`.
/// An error other than `ECHILD` counts as "has children" (the caller then looks).
#[allow(unsafe_code)]
pub fn has_children() -> bool {
    loop {
        // SAFETY: waitid(2) writes one siginfo_t through a valid pointer to a local.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL,
            )
        };
        if r == 0 {
            return true;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return false,
            _ => return true,
        }
    }
}

/// Waits for (blocking) and reaps a child whose `exec` failed: `spawn.rs` calls it
/// right after the `clone`, before the reaper knows the pid, so no status is lost
/// and the reaper never sees it. (With `CLONE_VFORK` the parent resumes at the
/// child's `_exit`, possibly before it is a zombie: hence blocking.)
#[allow(unsafe_code)]
pub(crate) fn reap_failed_spawn(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid(2) on our own exited child, writing one c_int to a local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
}

/// `waitpid(pid, &status, WNOHANG)` for one pid: its status if it has exited.
#[allow(unsafe_code)]
fn wait_pid(pid: i32) -> Option<ChildExit> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid(2) writes one c_int through a valid pointer to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return decode(status);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

fn decode(status: libc::c_int) -> Option<ChildExit> {
    if libc::WIFEXITED(status) {
        Some(ChildExit::Code(libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        Some(ChildExit::Signal(Signal(libc::WTERMSIG(status))))
    } else {
        None
    }
}

/// One `waitpid(-1, &status, WNOHANG)`.
///
/// nix's `waitpid` is not used: it turns a death by a real-time signal into
/// `EINVAL` *after* the child was reaped, which would lose the main child's status.
#[allow(unsafe_code)]
fn wait_any() -> Waited {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid(2) writes one c_int through a valid pointer to a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            match decode(status) {
                Some(exit) => return Waited::Exited(pid, exit),
                // Stopped/continued are not reported without WUNTRACED/WCONTINUED.
                None => continue,
            }
        }
        if pid == 0 {
            return Waited::NoneExited;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Waited::NoChildren,
            _ => return Waited::NoneExited,
        }
    }
}
