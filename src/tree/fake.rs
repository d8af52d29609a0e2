//! A fake process tree for the tests of the tree and the driver: processes that
//! answer signals as told, under tokio's paused time, and every signal sent
//! recorded with its virtual instant.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Tree;
use crate::drain::ChildExit;
use crate::procs::Proc;
use crate::reaper::{Waited, Waiter};
use crate::signals::{self, Signal};

/// How a fake process answers a signal.
#[derive(Clone, Copy)]
pub(crate) enum Reacts {
    /// Exits (killed by the signal) this long after a TERM, INT or QUIT.
    ExitsAfter(Duration),
    /// Catches a TERM, INT or QUIT and exits 0 at once, before drainit's step
    /// ends (its SIGCHLD read in a later one).
    ExitsAtOnce,
    /// Ignores everything but SIGKILL.
    Ignores,
    /// drainit may not signal it: every `kill` of it is `EPERM`.
    Forbids,
}

pub(crate) struct FakeProc {
    pub(crate) pgid: i32,
    pub(crate) reacts: Reacts,
    /// Ended, not yet reaped.
    pub(crate) ended: Option<ChildExit>,
}

/// A tree of fake processes, all children of drainit. A process's end
/// raises SIGCHLD on the driver's signal channel.
pub(crate) struct FakeTree {
    pub(crate) me: i32,
    pub(crate) procs: RefCell<BTreeMap<i32, FakeProc>>,
    /// Every signal sent, with the virtual instant.
    pub(crate) sent: RefCell<Vec<(Instant, i32, Signal)>>,
    chld: mpsc::UnboundedSender<Vec<signals::Received>>,
    me_weak: RefCell<std::rc::Weak<FakeTree>>,
}

impl FakeTree {
    /// An empty tree below this process; a process's end sends SIGCHLD on `chld`.
    pub(crate) fn new(chld: mpsc::UnboundedSender<Vec<signals::Received>>) -> Rc<FakeTree> {
        let tree = Rc::new(FakeTree {
            me: std::process::id() as i32,
            procs: RefCell::new(BTreeMap::new()),
            sent: RefCell::new(Vec::new()),
            chld,
            me_weak: RefCell::new(std::rc::Weak::new()),
        });
        *tree.me_weak.borrow_mut() = Rc::downgrade(&tree);
        tree
    }

    pub(crate) fn add(&self, pid: i32, pgid: i32, reacts: Reacts) {
        let p = FakeProc {
            pgid,
            reacts,
            ended: None,
        };
        self.procs.borrow_mut().insert(pid, p);
    }

    pub(crate) fn end(&self, pid: i32, exit: ChildExit) {
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
        }
    }

    fn deliver(&self, pid: i32, sig: Signal) {
        let reacts = match self.procs.borrow().get(&pid) {
            Some(p) if p.ended.is_none() => p.reacts,
            _ => return,
        };
        match (sig, reacts) {
            (Signal::KILL, _) => self.end(pid, ChildExit::Signal(Signal::KILL)),
            (sig, Reacts::ExitsAtOnce)
                if [Signal::TERM, Signal::INT, Signal::QUIT].contains(&sig) =>
            {
                self.end(pid, ChildExit::Code(0));
            }
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
    fn group_alive(&self, pgid: i32) -> bool {
        self.procs.borrow().values().any(|p| p.pgid == pgid)
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
        let forbidden = |pid: &i32| {
            self.procs
                .borrow()
                .get(pid)
                .is_some_and(|p| matches!(p.reacts, Reacts::Forbids))
        };
        if pids.iter().all(forbidden) {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        let pids: Vec<i32> = pids.into_iter().filter(|p| !forbidden(p)).collect();
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

/// One signal as read from the signalfd, sent by pid 1.
pub(crate) fn received(signal: Signal) -> signals::Received {
    signals::Received::new(signal, 1)
}

/// `n` milliseconds.
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
