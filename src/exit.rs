//! drainit's exit codes: the README's table (Exit codes), in one place.
//!
//! Owns: the numbers. Must not: decide which one applies (the drain machine does
//! after the spawn, the configuration and `main` before it). Every code drainit
//! returns is one of these constants, the child's own code, or
//! [`signal_death`]`(S)` for a child killed by signal S.

/// A drain signal was received, every descendant exited before the deadline and
/// teardown was clean.
pub const CLEAN: i32 = 0;

/// A drain signal was received and work was abandoned (SIGKILLed at the deadline
/// or by a second signal, or unkillable), or a teardown step failed or timed out.
/// Also: no drain signal, the child exited 0, but work was abandoned or teardown
/// failed (a crash outranks abandoned work).
pub const ABANDONED: i32 = 2;

/// drainit itself failed (an internal error: the runtime, the signalfd, a panic).
pub const INTERNAL: i32 = 1;

/// Usage error on the command line (BSD `EX_USAGE`). clap's own 2 must never leak:
/// it would read as [`ABANDONED`].
pub const USAGE: i32 = 64;

/// Configuration error (BSD `EX_CONFIG`): a bad environment variable (named in the
/// message), a bad config file or value, a fact of the system that makes a setting
/// unusable (a taken explicit probe port, a missing report directory, an unknown
/// `--user`). The child is never started.
pub const CONFIG: i32 = 78;

/// The command exists but cannot be executed (EACCES, ENOEXEC, EISDIR, …; the shell's
/// convention, POSIX `sh` "Exit Status").
pub const CANNOT_EXECUTE: i32 = 126;

/// The command was not found (ENOENT; the shell's convention).
pub const NOT_FOUND: i32 = 127;

/// The code for a child killed by signal `signo` (no drain signal): 128 + S, the
/// shell's convention (POSIX `sh`, "Exit Status").
pub const fn signal_death(signo: i32) -> i32 {
    128 + signo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_design_3() {
        assert_eq!(
            [
                CLEAN,
                ABANDONED,
                INTERNAL,
                USAGE,
                CONFIG,
                CANNOT_EXECUTE,
                NOT_FOUND
            ],
            [0, 2, 1, 64, 78, 126, 127]
        );
        assert_eq!(signal_death(15), 143);
        assert_eq!(signal_death(9), 137);
    }
}
