//! The process tree, as the kernel shows it: reading it (`/proc`), signalling it
//! (`kill(2)`) and collecting its ends (`waitpid(2)`, through the reaper).
//!
//! Owns: the one `kill(2)` call of drainit ([`kill`]). Every signal drainit sends,
//! the forward, the leftovers' drain signal, the SIGKILLs of the deadline, of a
//! teardown step and of an exec check that timed out, goes through it.
//!
//! The driver and the reaper use the tree through the [`Tree`] trait: [`Real`] is
//! the kernel (`procs.rs` reads `/proc`, `reaper.rs` keeps the one `waitpid`), and
//! the driver's tests put a fake tree in its place, under paused time.
//!
//! Must not: decide anything (who is signalled, when, is the driver's and the
//! drain machine's). Invariant: a pid is signalled only while it is known alive and
//! unreaped: the caller reads and kills in one synchronous step, with no reap in
//! between (CONVENTIONS "Never signal a pid after it was reaped").

use std::collections::HashSet;
use std::io;

use crate::drain::ChildExit;
use crate::procs::{self, Proc};
use crate::reaper::{Kernel, Waited, Waiter};
use crate::signals::Signal;

/// The process tree below drainit, as the driver sees it: read, signalled, and
/// waited for (the [`Waiter`] part, which the reaper uses).
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

/// `kill(2)`: sends `sig` to `target`, a process, `-pgid` (a process group) or
/// `-1` (as PID 1 only: every process of the namespace). The only `kill` of
/// drainit.
///
/// nix's `kill` takes only the standard signals; real-time ones are forwarded too
/// (DESIGN §5), so the raw call is used.
///
/// # Errors
/// The errno: `ESRCH` when the target is gone (callers tolerate it), `EPERM`.
#[allow(unsafe_code)]
pub fn kill(target: i32, sig: Signal) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let r = unsafe { libc::kill(target, sig.0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
