//! The process ledger: which processes were in flight at T0, which drainit saw
//! end during the drain, which it killed (abandoned) and which it could not
//! (unkillable). The tree records into it as it signals; the report reads it.
//!
//! Invariant: `completed` never counts an abandoned process and never goes
//! negative; `abandoned` lists pid and `comm` only, never a command line or
//! environment.

use std::collections::HashSet;

use serde::Serialize;

/// Counts the processes of one drain (or, with no drain signal, of the stop that
/// follows the main child's exit).
#[derive(Debug, Default)]
pub struct ProcessLedger {
    /// `(pid, start)` of every descendant alive at T0.
    in_flight: HashSet<(i32, u64)>,
    /// pids (of the T0 set, or reaped by drainit later) that ended without a kill.
    ended: HashSet<i32>,
    /// The processes SIGKILLed: pid and comm, in the order they were killed.
    abandoned: Vec<Abandoned>,
    /// The pids of `abandoned`, so that recording a kill stays O(1) (a kill of
    /// thousands of processes must not cost a scan of the list per process).
    abandoned_pids: HashSet<i32>,
    /// Processes drainit tried to signal and could not (`EPERM`): pid and comm.
    /// Never counted abandoned (they were not killed) nor completed.
    unkillable: Vec<Abandoned>,
    unkillable_pids: HashSet<i32>,
    sampled: bool,
    /// Set at the SIGKILL and when the drain is over: whatever ends after that was
    /// killed, or is no part of the drain (a teardown step's children), and is
    /// never counted completed.
    closed: bool,
}

/// One abandoned (or unkillable) process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Abandoned {
    pub pid: i32,
    /// The kernel's short command name (`/proc/PID/comm`).
    pub comm: String,
}

impl ProcessLedger {
    /// Beat 1: the descendants alive at T0 (`(pid, start)` each).
    pub fn sample(&mut self, alive: impl IntoIterator<Item = (i32, u64)>) {
        self.in_flight = alive.into_iter().collect();
        self.sampled = true;
    }

    /// Whether [`ProcessLedger::sample`] ran (a drain or stop is being counted).
    pub fn is_counting(&self) -> bool {
        self.sampled
    }

    /// Stops counting ends: at the SIGKILL, and when the drain is over.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// A process drainit saw end (reaped by drainit, or gone from the T0 set).
    pub fn ended(&mut self, pid: i32) {
        if self.sampled
            && !self.closed
            && !self.abandoned_pids.contains(&pid)
            && !self.unkillable_pids.contains(&pid)
        {
            self.ended.insert(pid);
        }
    }

    /// Processes of the T0 set that are no longer alive count as ended (a
    /// grandchild reaped by its own parent is never seen by the reaper).
    pub fn settle(&mut self, still_alive: &HashSet<(i32, u64)>) {
        // Members of the T0 set that ended are counted even after `close`: they
        // were not killed (the kill lists what it kills) and did end.
        let closed = std::mem::replace(&mut self.closed, false);
        let gone: Vec<i32> = self
            .in_flight
            .iter()
            .filter(|id| !still_alive.contains(id))
            .map(|id| id.0)
            .collect();
        for pid in gone {
            self.ended(pid);
        }
        self.closed = closed;
    }

    /// Records a process about to be SIGKILLed.
    /// Returns whether it was not recorded before. O(1).
    pub fn abandon(&mut self, pid: i32, comm: String) -> bool {
        if self.unkillable_pids.contains(&pid) || !self.abandoned_pids.insert(pid) {
            return false;
        }
        self.ended.remove(&pid);
        self.abandoned.push(Abandoned { pid, comm });
        true
    }

    /// Whether `pid` was recorded abandoned (SIGKILLed).
    pub fn is_abandoned(&self, pid: i32) -> bool {
        self.abandoned_pids.contains(&pid)
    }

    /// Records a process drainit could not signal (`EPERM`), taking it out of the
    /// abandoned and completed counts. Returns whether it was not recorded before
    /// (so that it is logged once).
    pub fn unkillable(&mut self, pid: i32, comm: String) -> bool {
        if !self.unkillable_pids.insert(pid) {
            return false;
        }
        self.ended.remove(&pid);
        if self.abandoned_pids.remove(&pid) {
            self.abandoned.retain(|a| a.pid != pid);
        }
        self.unkillable.push(Abandoned { pid, comm });
        true
    }

    /// Whether `pid` was recorded unkillable.
    pub fn is_unkillable(&self, pid: i32) -> bool {
        self.unkillable_pids.contains(&pid)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn completed(&self) -> usize {
        self.ended.len()
    }

    pub fn abandoned(&self) -> &[Abandoned] {
        &self.abandoned
    }

    /// The processes drainit could not signal, in the order it found them.
    pub fn unkillables(&self) -> &[Abandoned] {
        &self.unkillable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ledger_counts_completed_and_abandoned_apart() {
        let mut l = ProcessLedger::default();
        l.sample([(10, 1), (11, 1), (12, 1)]);
        l.ended(10);
        l.abandon(11, "stubborn".into());
        l.ended(11); // reaped after the kill: still abandoned, not completed
        l.ended(20); // spawned during the drain and reaped by drainit
        l.settle(&HashSet::new()); // 12 was reaped by its own parent
        assert_eq!(
            (l.in_flight(), l.completed(), l.abandoned().len()),
            (3, 3, 1)
        );
    }

    #[test]
    fn an_unkillable_process_is_neither_abandoned_nor_completed() {
        let mut l = ProcessLedger::default();
        l.sample([(10, 1), (11, 1), (12, 1)]);
        // The kill round records 11 as abandoned before its kill(2) says EPERM.
        assert!(l.abandon(11, "setuid".into()));
        assert!(l.unkillable(11, "setuid".into()));
        assert!(
            !l.unkillable(11, "setuid".into()),
            "recorded (and logged) once"
        );
        assert!(
            !l.abandon(11, "setuid".into()),
            "a later round does not abandon it"
        );
        assert!(l.abandon(12, "stubborn".into()));
        l.ended(11);
        l.ended(10);
        l.settle(&HashSet::from([(11, 1)]));
        assert_eq!(
            (l.completed(), l.abandoned().len(), l.unkillables().len()),
            (1, 1, 1)
        );
        assert_eq!(l.abandoned()[0].pid, 12);
        assert_eq!(l.unkillables()[0].pid, 11);
        assert!(l.is_unkillable(11) && !l.is_abandoned(11) && l.is_abandoned(12));
    }

    #[test]
    fn abandoning_many_processes_is_linear() {
        // 200,000 distinct pids plus a repeat of each: with a scan of the list per
        // call this took minutes; with the index it is milliseconds.
        let mut l = ProcessLedger::default();
        l.sample((0..200_000).map(|p| (p, 1)));
        let started = std::time::Instant::now();
        for round in 0..2 {
            for pid in 0..200_000 {
                assert_eq!(l.abandon(pid, String::new()), round == 0);
                l.ended(pid);
            }
        }
        assert_eq!(l.abandoned().len(), 200_000);
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
