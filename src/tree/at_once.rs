//! The forward that the signals' thread sends by itself, as it reads a signal,
//! without waiting for the loop's turn (`signals::SignalThread`).
//!
//! The rule is the loop's own (`driver::forward_at_once`, `Drain::forwarded_at_once`):
//! a signal that is not a drain signal goes to the main child (or its group)
//! after `--rewrite`, unless the same read holds a SIGCHLD or a drain signal (then
//! the whole read goes to the loop, which orders it: the main child's exit read
//! with it, beat 1 before anything else). The thread sends only while the main
//! child is unreaped, holding [`Unreaped`] as it does (the reaper holds it too).

use std::sync::Arc;

use super::{Real, Tree, app::report_failed_send};
use crate::reaper::Unreaped;
use crate::signals::{Received, RewriteMap, Signal};

/// What the signals' thread forwards at once, and to whom. `Send` and `Sync`: it
/// is the thread's, and reads only what was fixed at start and the target.
pub struct AtOnce {
    target: Arc<Unreaped>,
    /// By signal number (1–64): what it is sent on as, after `--rewrite`; `None`:
    /// not forwarded at once (a drain signal, SIGCHLD, the C libraries' 32 and
    /// 33, or rewritten to 0).
    table: [Option<Signal>; 65],
    /// Bit n-1 for signal n: a read holding one of these goes to the loop
    /// whole (SIGCHLD and the drain signals).
    to_loop: u64,
}

impl AtOnce {
    /// The rule of `--drain-signal` and `--rewrite`, for the main child's target
    /// in `target` (shared with the reaper, [`crate::reaper::Reaper::share_main`]).
    pub fn new(target: Arc<Unreaped>, drain_signals: &[Signal], rewrite: &RewriteMap) -> AtOnce {
        let to_loop = drain_signals
            .iter()
            .chain([&Signal::CHLD])
            .filter(|s| (1..=64).contains(&s.0))
            .fold(0u64, |m, s| m | 1 << (s.0 - 1));
        let mut table = [None; 65];
        for (n, out) in table.iter_mut().enumerate().skip(1) {
            let s = Signal(n as i32);
            if to_loop & (1 << (n - 1)) == 0 && !s.is_reserved() {
                *out = rewrite.apply(s);
            }
        }
        AtOnce {
            target,
            table,
            to_loop,
        }
    }

    /// Sends on the signals of one read that need no decision but the rewrite,
    /// and marks them ([`Received::forwarded`]); sends nothing when the read holds
    /// a SIGCHLD or a drain signal, or once the main child is reaped.
    pub fn forward(&self, batch: &mut [Received]) {
        let to_loop = |r: &Received| {
            (1..=64).contains(&r.signal.0) && self.to_loop & (1 << (r.signal.0 - 1)) != 0
        };
        if batch.iter().any(to_loop) {
            return;
        }
        let held = self.target.hold();
        let target = *held;
        if target == 0 {
            return;
        }
        let mut sent = false;
        // A failure is logged after the target is let go: a log line may wait
        // for a stalled stderr, and the reaper must not wait with it.
        let mut failed = None;
        for r in batch.iter_mut() {
            let out = usize::try_from(r.signal.0)
                .ok()
                .and_then(|n| self.table.get(n).copied().flatten());
            if let Some(to) = out {
                if let Err(e) = Real.kill(target, to) {
                    failed.get_or_insert((to, e));
                }
                r.forwarded = Some(to);
                sent = true;
            }
        }
        drop(held);
        if let Some((sig, e)) = failed {
            report_failed_send(target, sig, &e);
        }
        if sent {
            // The app was just woken, often onto this CPU (the scheduler places
            // a wakee near its waker): it runs before this thread hands the read
            // to the loop (sched_yield(2)).
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(signals: &[i32]) -> Vec<Received> {
        signals
            .iter()
            .map(|&n| Received::new(Signal(n), 1))
            .collect()
    }

    fn sent(batch: &[Received]) -> Vec<Option<i32>> {
        batch.iter().map(|r| r.forwarded.map(|s| s.0)).collect()
    }

    #[test]
    fn a_read_with_a_drain_signal_or_sigchld_goes_to_the_loop_whole() {
        let target = Arc::new(Unreaped::new(0));
        let mut rewrite = RewriteMap::default();
        rewrite.insert(Signal(libc::SIGHUP), Signal(libc::SIGUSR2));
        rewrite.insert(Signal(libc::SIGWINCH), Signal(0));
        let at_once = AtOnce::new(target.clone(), &[Signal::TERM], &rewrite);
        assert_eq!(
            at_once.table[libc::SIGHUP as usize],
            Some(Signal(libc::SIGUSR2))
        );
        assert_eq!(at_once.table[libc::SIGWINCH as usize], None);
        assert_eq!(at_once.table[libc::SIGTERM as usize], None);
        assert_eq!(at_once.table[libc::SIGCHLD as usize], None);
        assert_eq!(at_once.table[32], None);
        assert_eq!(at_once.table[34], Some(Signal(34)));

        // The main child not known (or reaped): nothing is sent.
        let mut batch = read(&[libc::SIGUSR1]);
        at_once.forward(&mut batch);
        assert_eq!(sent(&batch), [None]);

        // A process group that cannot exist: a send would be ESRCH, tolerated.
        *target.hold() = -i32::MAX;
        for with in [libc::SIGTERM, libc::SIGCHLD] {
            let mut batch = read(&[libc::SIGUSR1, with, libc::SIGCONT]);
            at_once.forward(&mut batch);
            assert_eq!(sent(&batch), [None, None, None], "read with {with}");
        }
    }

    #[test]
    fn the_others_are_sent_rewritten_and_marked() {
        // Signals to a process group that does not exist: ESRCH, tolerated; the
        // marks say what was sent.
        let target = Arc::new(Unreaped::new(-i32::MAX));
        let mut rewrite = RewriteMap::default();
        rewrite.insert(Signal(libc::SIGHUP), Signal(libc::SIGUSR2));
        rewrite.insert(Signal(libc::SIGWINCH), Signal(0));
        let at_once = AtOnce::new(target, &[Signal::TERM], &rewrite);
        let mut batch = read(&[
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGWINCH,
            32,
            libc::SIGCONT,
        ]);
        at_once.forward(&mut batch);
        assert_eq!(
            sent(&batch),
            [
                Some(libc::SIGUSR2),
                Some(libc::SIGUSR1),
                None,
                None,
                Some(libc::SIGCONT)
            ]
        );
    }
}
