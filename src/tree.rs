//! The process tree: the app's processes (the main child and its descendants),
//! what drainit knows of them, and every signal drainit sends.
//!
//! Owns: the one `kill(2)` call of drainit (private to this module), and with it
//! every decision of *who* gets a signal: [`AppTree`] forwards to the main child
//! or its group, gives the drain signal to the remaining descendants once each,
//! SIGKILLs at the deadline and chases what forks while the kill settles, and
//! keeps the state those decisions need (who was signalled, whether processes
//! from outside the namespace are left, the [`ProcessLedger`]). A helper of
//! drainit's (an exec check, a teardown step) is killed through [`Helper`] or
//! [`AppTree::kill_helper`]. *When* to signal is the drain machine's (`drain.rs`);
//! the driver asks, and turns the counts this module returns into events.
//!
//! The kernel is reached through the [`Tree`] trait: [`Real`] is the kernel
//! (`procs.rs` reads `/proc`, `reaper.rs` keeps the one `waitpid`); the tests put
//! a fake tree in its place, under paused time.
//!
//! Invariant: a pid is signalled only while it is known alive and unreaped: each
//! read and kill happen in one synchronous step, with no reap in between
//! (CONVENTIONS "Never signal a pid after it was reaped"), and every process gets
//! the drain signal from drainit at most once. The one send outside the loop's
//! step, [`AtOnce`]'s forward from the signals' thread, holds the main child's
//! target, which the reaper holds too ([`crate::reaper::Unreaped`]).

mod app;
mod at_once;
#[cfg(test)]
pub(crate) mod fake;
mod ledger;

pub use app::{AppTree, DrainForward, Kills};
pub use at_once::AtOnce;
pub use ledger::{Abandoned, ProcessLedger};

use std::cell::RefCell;
use std::collections::HashSet;
use std::io;
use std::rc::Rc;

use crate::drain::ChildExit;
use crate::procs::{self, Proc};
use crate::reaper::{Kernel, Reaper, Waited, Waiter};
use crate::signals::Signal;

/// The kernel's side of the process tree below drainit: read, signalled, and
/// waited for (the [`Waiter`] part, which the reaper uses). [`AppTree`] decides
/// through it; only this module and the tests' fake implement it.
pub trait Tree: Waiter {
    /// Whether `/proc` shows this PID namespace (else no `/proc` pid is trusted).
    fn is_own_namespace(&self) -> bool;
    /// One process, `None` when it is gone (or `/proc` is unreadable).
    fn stat_of(&self, pid: i32) -> Option<Proc>;
    /// The `comm` of one process.
    fn comm(&self, pid: i32) -> Option<String>;
    /// The live descendants of `root` but `exclude` (and their descendants).
    ///
    /// # Errors
    /// `/proc` could not be read.
    fn descendants(&self, root: i32, exclude: &HashSet<i32>) -> io::Result<Vec<Proc>>;
    /// Calls `f` for each descendant of `root` but `exclude`, zombies included, as
    /// the walk finds it (so a caller can signal it at once).
    ///
    /// # Errors
    /// `/proc` could not be read.
    fn visit(&self, root: i32, exclude: &HashSet<i32>, f: &mut dyn FnMut(&Proc)) -> io::Result<()>;
    /// The children of `pid` (zombies included); `Ok(None)` when the kernel has no
    /// such list.
    ///
    /// # Errors
    /// `/proc` could not be read.
    fn children(&self, pid: i32) -> io::Result<Option<Vec<i32>>>;
    /// `kill(2)`: `sig` to `target`, a pid, `-pgid` or `-1`.
    ///
    /// # Errors
    /// The errno: `ESRCH` (gone), `EPERM` (not permitted).
    fn kill(&self, target: i32, sig: Signal) -> io::Result<()>;
    /// Whether process group `pgid` has a member, zombies included (`kill(-pgid,
    /// 0)` is not `ESRCH`; POSIX `kill(2)`: signal 0 checks without sending).
    fn group_alive(&self, pgid: i32) -> bool;
}

/// drainit's own helpers (exec checks, teardown steps) as the walks of the tree
/// leave them out: the pids of those not yet reaped, and the process groups of
/// reaped exec checks whose leftovers are not all gone. A process is drainit's when
/// its pid, or its process group, is in the set (`procs::visit`). Groups found
/// empty are forgotten first.
pub fn helpers(reaper: &RefCell<Reaper>, tree: &dyn Tree) -> HashSet<i32> {
    forget_empty_groups(reaper, tree);
    reaper.borrow().helpers().collect()
}

/// Forgets the groups of reaped exec checks that have no member left, so that a
/// group's number, once the kernel may hand it out again, never leaves an
/// unrelated process out. Called at the end of each check and before each walk.
pub fn forget_empty_groups(reaper: &RefCell<Reaper>, tree: &dyn Tree) {
    reaper.borrow_mut().forget_groups(|g| tree.group_alive(g));
}

/// The kernel's tree.
#[derive(Clone, Copy, Debug, Default)]
pub struct Real;

impl Tree for Real {
    fn is_own_namespace(&self) -> bool {
        procs::is_own_namespace()
    }
    fn stat_of(&self, pid: i32) -> Option<Proc> {
        procs::stat_of(pid)
    }
    fn comm(&self, pid: i32) -> Option<String> {
        procs::comm(pid)
    }
    fn descendants(&self, root: i32, exclude: &HashSet<i32>) -> io::Result<Vec<Proc>> {
        procs::descendants(root, exclude)
    }
    fn visit(&self, root: i32, exclude: &HashSet<i32>, f: &mut dyn FnMut(&Proc)) -> io::Result<()> {
        procs::visit(root, exclude, f)
    }
    fn children(&self, pid: i32) -> io::Result<Option<Vec<i32>>> {
        procs::children(pid)
    }
    fn kill(&self, target: i32, sig: Signal) -> io::Result<()> {
        kill(target, sig)
    }
    fn group_alive(&self, pgid: i32) -> bool {
        !matches!(kill(-pgid, Signal(0)), Err(e) if e.raw_os_error() == Some(libc::ESRCH))
    }
}

impl Waiter for Real {
    fn has_children(&self) -> bool {
        Kernel.has_children()
    }
    fn wait_pid(&self, pid: i32) -> Option<ChildExit> {
        Kernel.wait_pid(pid)
    }
    fn wait_any(&self) -> Waited {
        Kernel.wait_any()
    }
}

/// How many live descendants drainit has now, its helpers (`helpers`, with
/// their own descendants) left out, as the supervisor counts them; `None` when
/// `/proc` is not this PID namespace's or cannot be read. For `/metrics`, read
/// from the kernel itself (the probe server has no [`AppTree`]).
pub fn count_descendants(helpers: &HashSet<i32>) -> Option<usize> {
    if !Real.is_own_namespace() {
        return None;
    }
    let me = std::process::id() as i32;
    // Not PID 1 and no child at all: nothing is below drainit (a subreaper).
    if me != 1 && !Real.has_children() {
        return Some(0);
    }
    Real.descendants(me, helpers).ok().map(|v| v.len())
}

/// `kill(2)`: sends `sig` to `target`, a process, `-pgid` (a process group) or
/// `-1` (as PID 1 only: every process of the namespace); signal 0 sends nothing
/// and only says whether the target exists. The only `kill` of drainit,
/// private to this module.
///
/// nix's `kill` takes only the standard signals; real-time ones are forwarded too
/// (docs/processes-and-signals.md), so the raw call is used.
///
/// # Errors
/// The errno: `ESRCH` when the target is gone (callers tolerate it), `EPERM`.
#[allow(unsafe_code)]
fn kill(target: i32, sig: Signal) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let r = unsafe { libc::kill(target, sig.0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A helper drainit started in its own process group (an exec check): while it
/// is unreaped, dropping the guard (the check timed out and its future was
/// dropped) SIGKILLs its group.
pub struct Helper {
    pid: i32,
    reaper: Rc<RefCell<Reaper>>,
}

impl Helper {
    /// Watches `pid`, registered with `reaper` (its leader, and its group's id).
    pub fn watch(pid: i32, reaper: Rc<RefCell<Reaper>>) -> Helper {
        Helper { pid, reaper }
    }

    /// The helper was reaped: what it left running in its process group (`sh -c
    /// 'x & exit 0'`) goes too. Left, it would be re-parented to drainit and
    /// taken for the app's work: signalled at the drain, SIGKILLed at the
    /// deadline and reported abandoned (exit 2 after the app drained cleanly).
    /// The group is still the helper's while a member lives (the kernel does not
    /// hand out its number again until the last one is gone), and `ESRCH`
    /// (nothing left) is the common case.
    pub fn finished(self) {
        let pid = self.pid;
        drop(self);
        let _ = kill(-pid, Signal::KILL);
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Unreaped: the group id is still its own. try_borrow: never panic in a
        // drop that may run during unwinding.
        if self
            .reaper
            .try_borrow()
            .is_ok_and(|r| r.is_waiting(self.pid))
        {
            let _ = kill(-self.pid, Signal::KILL);
        }
    }
}
