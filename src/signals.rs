//! Signal names, the forwarding table, the rewrite map, and the signal stream.
//!
//! Owns: how a signal is named (`TERM`, `SIGTERM`, `15`, `RTMIN+3`), which signals
//! drainit catches and forwards (docs/processes-and-signals.md), and the one source of
//! signals, a `signalfd(2)`: read on the tokio runtime ([`SignalStream`]) until the
//! driver hands it to a thread of its own ([`SignalThread`]), which sends the
//! forward of a read that needs no decision as soon as the read returns.
//!
//! Must not: install a signal handler. drainit blocks every signal it catches for
//! its whole life and reads them from a signalfd (catatonit's design). No handler
//! means nothing can run in the child between `fork` and `exec`, no `EINTR`, and no
//! disposition to undo before `exec`: the child inherits drainit's *inherited*
//! dispositions untouched, and `spawn` only restores the inherited mask.
//!
//! Invariant: the synchronous fault signals (SEGV, BUS, FPE, ILL, TRAP, SYS) and
//! SIGPIPE are never blocked or caught: "if we broke, let us die" (catatonit), and a
//! write to a closed pipe must never be "forwarded" to the app.

use std::collections::HashMap;
use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::signal::{SigSet, Signal as NixSignal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tokio::io::unix::AsyncFd;

/// A signal number, 1–64 on Linux (1–31 standard, SIGRTMIN..=SIGRTMAX real-time).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signal(pub i32);

/// The signals that are never blocked nor forwarded: faults (they must kill
/// drainit itself if drainit faults) and SIGPIPE (docs/processes-and-signals.md).
const NEVER_CAUGHT: [i32; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGPIPE,
];

const NAMES: [(&str, i32); 31] = [
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

impl Signal {
    pub const HUP: Signal = Signal(libc::SIGHUP);
    pub const INT: Signal = Signal(libc::SIGINT);
    pub const QUIT: Signal = Signal(libc::SIGQUIT);
    pub const KILL: Signal = Signal(libc::SIGKILL);
    pub const TERM: Signal = Signal(libc::SIGTERM);
    pub const CHLD: Signal = Signal(libc::SIGCHLD);
    pub const CONT: Signal = Signal(libc::SIGCONT);

    /// SIGRTMIN as glibc numbers it: 34 (glibc keeps 32 and 33 for its threads),
    /// in every build. musl also keeps 34 for itself and calls 35 SIGRTMIN, but
    /// the apps drainit runs, and the people who write `RTMIN+3` (systemd,
    /// `kill -l`), use glibc's numbering; a static musl drainit must agree with
    /// them and forward 34 (drainit uses none of musl's own uses of 34, `setuid`
    /// across threads).
    pub fn rtmin() -> i32 {
        34
    }

    /// SIGRTMAX: 64, the kernel's last signal (`_NSIG - 1`), in glibc and musl.
    pub fn rtmax() -> i32 {
        64
    }

    /// Parses `TERM`, `SIGTERM`, `sigterm`, `15`, `RTMIN+3`, `SIGRTMAX-1`.
    ///
    /// `0` is accepted only when `allow_zero` (the `TO` side of `--rewrite`, meaning
    /// "drop the signal").
    ///
    /// # Errors
    /// A message naming the value when it is no Linux signal.
    pub fn parse(s: &str, allow_zero: bool) -> Result<Signal, String> {
        let t = s.trim();
        let bad = || format!("'{s}' is not a signal name or number (e.g. TERM, SIGTERM, 15)");
        if let Ok(n) = t.parse::<i32>() {
            if n == 0 && allow_zero {
                return Ok(Signal(0));
            }
            if (1..=Self::rtmax()).contains(&n) {
                return Ok(Signal(n));
            }
            return Err(bad());
        }
        let upper = t.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        if let Some((_, n)) = NAMES.iter().find(|(k, _)| *k == name) {
            return Ok(Signal(*n));
        }
        let rt = |base: i32, rest: &str| -> Option<i32> {
            if rest.is_empty() {
                return Some(base);
            }
            let (sign, num) = rest.split_at(1);
            let k: i32 = num.parse().ok()?;
            let n = if sign == "+" {
                base + k
            } else if sign == "-" {
                base - k
            } else {
                return None;
            };
            (Self::rtmin()..=Self::rtmax()).contains(&n).then_some(n)
        };
        let n = if let Some(rest) = name.strip_prefix("RTMIN") {
            rt(Self::rtmin(), rest)
        } else if let Some(rest) = name.strip_prefix("RTMAX") {
            rt(Self::rtmax(), rest)
        } else {
            None
        };
        n.map(Signal).ok_or_else(bad)
    }

    /// 32 and 33: kept by the C libraries for their threads (glibc's SIGCANCEL and
    /// SIGSETXID, musl's SIGTIMER and SIGCANCEL). Sent from outside, they mean
    /// nothing to an app either; drainit reads them and drops them.
    pub fn is_reserved(self) -> bool {
        self.0 == 32 || self.0 == 33
    }

    /// Whether drainit catches this signal at all (everything but KILL, STOP, the
    /// fault signals and SIGPIPE; glibc's private 32 and 33 are excluded too).
    pub fn is_caught(self) -> bool {
        let n = self.0;
        n >= 1
            && n <= Self::rtmax()
            && n != libc::SIGKILL
            && n != libc::SIGSTOP
            && !NEVER_CAUGHT.contains(&n)
            && (n < 32 || n >= Self::rtmin())
    }
}

impl fmt::Display for Signal {
    /// `SIGTERM`, `SIGRTMIN+3`, or the bare number when unnamed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((name, _)) = NAMES.iter().find(|(_, n)| *n == self.0) {
            return write!(f, "SIG{name}");
        }
        let (min, max) = (Self::rtmin(), Self::rtmax());
        if self.0 == min {
            write!(f, "SIGRTMIN")
        } else if self.0 > min && self.0 <= max {
            if max - self.0 < self.0 - min {
                if self.0 == max {
                    write!(f, "SIGRTMAX")
                } else {
                    write!(f, "SIGRTMAX-{}", max - self.0)
                }
            } else {
                write!(f, "SIGRTMIN+{}", self.0 - min)
            }
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `--rewrite FROM:TO`: what a received signal becomes when forwarded. `TO` = 0
/// drops it. Applies to everything forwarded, the drain signal at beat 3 included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewriteMap(HashMap<Signal, Signal>);

impl RewriteMap {
    /// Parses one `FROM:TO` pair (`TERM:QUIT`, `SIGHUP:SIGUSR1`, `WINCH:0`).
    ///
    /// # Errors
    /// A message naming the pair when either side is no signal or the colon is missing.
    pub fn parse_pair(s: &str) -> Result<(Signal, Signal), String> {
        let (from, to) = s
            .split_once(':')
            .ok_or_else(|| format!("'{s}' is not FROM:TO (e.g. TERM:QUIT)"))?;
        let from = Signal::parse(from, false)?;
        let to = Signal::parse(to, true)?;
        Ok((from, to))
    }

    pub fn insert(&mut self, from: Signal, to: Signal) {
        self.0.insert(from, to);
    }

    /// The signal to send for a received `sig`; `None` when it is dropped.
    pub fn apply(&self, sig: Signal) -> Option<Signal> {
        let out = self.0.get(&sig).copied().unwrap_or(sig);
        (out.0 != 0).then_some(out)
    }

    /// The pairs, sorted, for printing.
    pub fn pairs(&self) -> Vec<(Signal, Signal)> {
        let mut v: Vec<_> = self.0.iter().map(|(a, b)| (*a, *b)).collect();
        v.sort();
        v
    }
}

/// The set drainit blocks and reads through its signalfd: every caught signal.
fn caught_set() -> SigSet {
    let mut set = SigSet::all();
    for n in NEVER_CAUGHT {
        if let Ok(s) = NixSignal::try_from(n) {
            set.remove(s);
        }
    }
    // `sigfillset` leaves out what the C library keeps for itself: 32 and 33 in
    // glibc, 32 to 34 in musl, whose `sigaddset` refuses them too. They are set by
    // bit: 34 is glibc's SIGRTMIN, an app's signal (see `Signal::rtmin`); 32 and 33
    // would otherwise kill drainit when sent from outside (their default action;
    // drainit uses no thread cancellation and no `setuid`, the C libraries' uses of
    // them), and are read and dropped instead (`is_reserved`).
    (32..=34).fold(set, with_bit)
}

/// `set` with signal `n` (1–64) added, bypassing the C library's reserved list.
#[allow(unsafe_code)]
fn with_bit(set: SigSet, n: i32) -> SigSet {
    let mut raw: libc::sigset_t = *set.as_ref();
    // SAFETY: on Linux (glibc and musl alike) a sigset_t begins with the kernel's
    // 64-bit signal mask, bit n-1 for signal n; it is at least 8 bytes long and
    // 8-byte aligned (an array of unsigned long).
    unsafe {
        let mask = (&mut raw as *mut libc::sigset_t).cast::<u64>();
        *mask |= 1u64 << (n - 1);
        SigSet::from_sigset_t_unchecked(raw)
    }
}

/// The signal mask drainit was started with, to be restored in the child.
/// The default is the empty mask.
#[derive(Clone, Copy)]
pub struct InheritedMask(pub(crate) SigSet);

impl Default for InheritedMask {
    fn default() -> Self {
        InheritedMask(SigSet::empty())
    }
}

/// `rt_sigprocmask(2)` itself, not the C library's wrapper: glibc's leaves 32 and
/// 33 out of the set it is given, musl's clears 32–34 in the old mask it returns,
/// and drainit must block exactly what it catches and give the child back exactly
/// what it inherited (34 included, glibc's SIGRTMIN). Async-signal-safe (the
/// spawned child calls it between `clone` and `exec`).
///
/// # Errors
/// The system call failed (it cannot, with a valid `how`).
#[allow(unsafe_code)]
pub(crate) fn sigprocmask_raw(
    how: libc::c_int,
    set: &libc::sigset_t,
    old: Option<&mut libc::sigset_t>,
) -> std::io::Result<()> {
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut libc::sigset_t);
    // SAFETY: the kernel reads one 8-byte sigset (`_NSIG / 8`) from `set` and writes
    // one to `old` when it is not null; both point to whole sigset_t, longer than
    // that.
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8usize) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Blocks every caught signal in the calling thread (call it first, before any
/// thread exists, so every later thread inherits the block).
///
/// Returns the mask drainit inherited. Once it succeeded, later calls block
/// nothing and return the same mask (the first call is made before `main`, the
/// next by `main` itself).
///
/// # Errors
/// `rt_sigprocmask(2)` failed (it cannot, with a valid set).
#[allow(unsafe_code)]
pub fn block_caught() -> std::io::Result<InheritedMask> {
    if let Some(m) = INHERITED.get() {
        return Ok(*m);
    }
    let mut old = *SigSet::empty().as_ref();
    sigprocmask_raw(libc::SIG_BLOCK, caught_set().as_ref(), Some(&mut old))?;
    // SAFETY: a sigset_t the kernel filled in; its bits are signal numbers 1–64.
    let old = unsafe { SigSet::from_sigset_t_unchecked(old) };
    // At their default action, ignored for drainit itself (a handler of the C
    // library's own, glibc's, is left as it is).
    let ignored = LIBC_OWN.fold(0u8, |bits, n| match sigaction_raw(n, None) {
        Ok(libc::SIG_DFL) => {
            let _ = sigaction_raw(n, Some(libc::SIG_IGN));
            bits
        }
        Ok(libc::SIG_IGN) => bits | (1 << (n - LIBC_OWN.start())),
        _ => bits,
    });
    let _ = INHERITED.set(InheritedMask(old));
    let _ = LIBC_OWN_IGNORED.set(ignored);
    Ok(InheritedMask(old))
}

/// The C libraries' own signals: 32 and 33 (glibc), 32 to 34 (musl).
const LIBC_OWN: std::ops::RangeInclusive<i32> = 32..=34;

/// `rt_sigaction(2)` itself (the C libraries' `sigaction` refuses 32–34): sets
/// signal `n`'s disposition to `set` (SIG_IGN or SIG_DFL) when given, and
/// returns the one it had. Async-signal-safe (the spawned child calls it).
///
/// drainit ignores 32–34 for itself when it finds them at their default action,
/// blocked as they are: a blocked signal is never ignored but queued
/// (signal(7)), so the signalfd still reads it. What the ignore covers is a
/// thread the C library creates: musl's `pthread_create` starts each new thread
/// with 33 unblocked, and unblocks 32–34 in the calling thread the first time,
/// until drainit blocks them again (`reblock`); a process-directed 33 or 34
/// (glibc's SIGRTMIN, an app's signal) taken by such a thread in that window
/// would otherwise kill drainit by its default action.
///
/// # Errors
/// The system call failed (it cannot, for 1–64 and these two dispositions).
#[allow(unsafe_code)]
fn sigaction_raw(n: i32, set: Option<libc::sighandler_t>) -> std::io::Result<libc::sighandler_t> {
    /// The kernel's `struct sigaction` (x86_64 and arm64 alike: both have
    /// `sa_restorer`), for SIG_IGN and SIG_DFL: no handler, flags or mask.
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let of = |handler| KernelSigaction {
        handler,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let act = set.map(of);
    let mut old = of(libc::SIG_DFL);
    let act_ptr = act
        .as_ref()
        .map_or(std::ptr::null(), |a| a as *const KernelSigaction);
    // SAFETY: rt_sigaction(2) reads one `struct sigaction` from `act_ptr` when
    // it is not null and writes one to `old`, locals of the kernel's layout,
    // with an 8-byte mask.
    let rc = unsafe { libc::syscall(libc::SYS_rt_sigaction, n, act_ptr, &raw mut old, 8usize) };
    if rc == 0 {
        Ok(old.handler)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Gives 32–34 back the dispositions drainit inherited (SIG_IGN or SIG_DFL: a
/// handler does not survive `exec`), in a child between `clone` and `exec`.
/// Async-signal-safe: an atomic read and raw system calls.
///
/// # Errors
/// A system call failed (it cannot).
pub(crate) fn give_back_libc_own() -> std::io::Result<()> {
    let ignored = LIBC_OWN_IGNORED.get().copied().unwrap_or(0);
    for n in LIBC_OWN {
        let was = if ignored & (1 << (n - LIBC_OWN.start())) != 0 {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        sigaction_raw(n, Some(was))?;
    }
    Ok(())
}

/// Which of 32–34 drainit found ignored at its start (bit 0: 32), set with
/// [`INHERITED`].
static LIBC_OWN_IGNORED: std::sync::OnceLock<u8> = std::sync::OnceLock::new();

/// Makes drainit a threaded process now, right after the app's spawn: musl's
/// first `pthread_create` unblocks 32–34 in the calling thread, and its new
/// thread inherits them unblocked, until each blocks them again ([`reblock`]);
/// every later one starts its thread with 33 alone unblocked. A 34 (glibc's
/// SIGRTMIN, the app's) pending or sent in that window is taken by a thread and
/// dropped (ignored, [`block_caught`]). Here the window is the app's first
/// moments, before it can have set up a handler for 34 (whose default action
/// would end it); a first thread started later (the signals' thread after the
/// first forward, the log writer when stderr blocks) would drop the app's 34
/// while it is being signalled. Called after the spawn so that the thread's
/// creation runs while the app execs: start+exit wall time is unchanged
/// (`farm-bench -n 100`, paired, 1.00×). The thread returns at once and is
/// waited for. Without musl's rule (glibc) it changes nothing.
#[allow(unsafe_code)]
pub fn become_threaded() {
    /// The thread's whole work: to exist, and end.
    extern "C" fn nothing(_: *mut libc::c_void) -> *mut libc::c_void {
        std::ptr::null_mut()
    }
    // The C library's own calls, not std's thread (its names, packets and
    // thread-locals are start-up code and resident memory for nothing here).
    // SAFETY: `attr` is initialised before use and destroyed after; `thread` is
    // written by a successful `pthread_create` and joined once; `nothing` takes
    // and returns no data.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return;
        }
        libc::pthread_attr_setstacksize(&mut attr, 16 * 1024);
        let mut thread: libc::pthread_t = std::mem::zeroed();
        let created = libc::pthread_create(&mut thread, &attr, nothing, std::ptr::null_mut()) == 0;
        libc::pthread_attr_destroy(&mut attr);
        reblock();
        // Waited for: the thread's window ends with it.
        if created {
            libc::pthread_join(thread, std::ptr::null_mut());
        }
    }
}

/// Blocks the caught signals again in the calling thread: after `pthread_create`,
/// which unblocks the signals the C library keeps for itself in both threads.
/// Errors cannot happen with a valid set and are ignored.
pub fn reblock() {
    let _ = sigprocmask_raw(libc::SIG_BLOCK, caught_set().as_ref(), None);
}

/// The mask [`block_caught`] found, kept between its first call, made by a
/// constructor before `main` (a SIGTERM sent right after exec must find the
/// signals blocked), and its second, made by `main`, which hands the mask on
/// ([`crate::spawn::Launcher`]). Process-wide state that must exist before
/// `main`, private to this module: nothing else reads it.
static INHERITED: std::sync::OnceLock<InheritedMask> = std::sync::OnceLock::new();

#[allow(unsafe_code)]
fn register(sfd: SignalFd) -> std::io::Result<AsyncFd<SignalFd>> {
    // SAFETY: `SignalFd` owns its fd (an `OwnedFd`) until it is dropped, which only
    // happens with the `AsyncFd`, and `as_raw_fd` always returns that same fd.
    unsafe { AsyncFd::register_with_interest(sfd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// `struct signalfd_siginfo` is 128 bytes (signalfd(2)).
const SIGINFO_SIZE: usize = std::mem::size_of::<libc::signalfd_siginfo>();
/// Signals taken per read.
const BATCH: usize = 16;

/// `ssi_signo` (u32 at offset 0) and `ssi_pid` (u32 at offset 12) of one record.
fn parse_siginfo(rec: &[u8]) -> Received {
    let u32_at = |o: usize| u32::from_ne_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
    Received {
        signal: Signal(u32_at(0) as i32),
        sender: u32_at(12) as i32,
        forwarded: None,
    }
}

/// The stream of received signals, read from a signalfd registered with tokio.
pub struct SignalStream {
    fd: AsyncFd<SignalFd>,
}

/// One received signal and the pid that sent it (0 for the kernel or a tty).
#[derive(Clone, Copy, Debug)]
pub struct Received {
    pub signal: Signal,
    pub sender: i32,
    /// The signal it was sent on as, when it was forwarded as it was read (the
    /// `at_once` of [`SignalStream::recv`]); `None`: not sent yet.
    pub forwarded: Option<Signal>,
}

impl Received {
    /// `signal` from `sender`, not sent on yet.
    pub fn new(signal: Signal, sender: i32) -> Received {
        Received {
            signal,
            sender,
            forwarded: None,
        }
    }
}

impl SignalStream {
    /// Opens the signalfd (close-on-exec, non-blocking) for every caught signal.
    /// Call after [`block_caught`] and inside the tokio runtime.
    ///
    /// # Errors
    /// `signalfd(2)` or the epoll registration failed.
    pub fn open() -> std::io::Result<SignalStream> {
        let sfd = SignalFd::with_flags(
            &caught_set(),
            SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        Ok(SignalStream { fd: register(sfd)? })
    }

    /// Waits until at least one signal is pending and returns every pending one, in
    /// the kernel's order (standard signals by number, then real-time ones).
    /// `at_once` sees each read's signals as soon as they are read, before
    /// anything else runs: the forward of a signal that needs no decision but the
    /// rewrite goes out there (it marks [`Received::forwarded`]).
    pub async fn recv(&mut self, mut at_once: impl FnMut(&mut [Received])) -> Vec<Received> {
        loop {
            let mut guard = match self.fd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    log::error!("waiting on the signalfd failed: {e}");
                    continue;
                }
            };
            // One read takes up to BATCH pending signals; a short read means the
            // signalfd is empty, so the readiness can be cleared without a second
            // read that would only return EAGAIN (one syscall less per signal).
            let mut out = Vec::new();
            let mut buf = [0u8; SIGINFO_SIZE * BATCH];
            let drained = loop {
                match nix::unistd::read(guard.get_inner(), &mut buf) {
                    Ok(n) => {
                        // Parsed on the stack, handed to `at_once`, then kept: no
                        // allocation before the forward.
                        let mut read = [Received::new(Signal(0), 0); BATCH];
                        let k = n / SIGINFO_SIZE;
                        for (r, rec) in read.iter_mut().zip(buf[..n].chunks_exact(SIGINFO_SIZE)) {
                            *r = parse_siginfo(rec);
                        }
                        at_once(&mut read[..k]);
                        out.extend_from_slice(&read[..k]);
                        if n < buf.len() {
                            break true;
                        }
                    }
                    Err(nix::errno::Errno::EAGAIN) => break true,
                    // EINTR cannot happen (no handlers); anything else is logged and
                    // the read is retried on the next readiness.
                    Err(e) => {
                        log::error!("reading the signalfd failed: {e}");
                        break false;
                    }
                }
            };
            if !drained {
                continue;
            }
            guard.clear_ready();
            if !out.is_empty() {
                return out;
            }
        }
    }

    /// The raw fd, to check it is not leaked into the child (tests).
    pub fn raw_fd(&self) -> i32 {
        self.fd.get_ref().as_raw_fd()
    }

    /// Hands the signalfd to a thread of its own ([`SignalThread`]), which
    /// calls `at_once` on each read before the read goes to the loop. Gives the
    /// stream back when the thread cannot be started (a pids limit, docs/processes-and-signals.md):
    /// signals are then read on the runtime, as the loop's own step.
    ///
    /// # Errors
    /// The stream itself and why the thread could not be started.
    pub fn into_thread(
        self,
        at_once: impl Fn(&mut [Received]) + Send + 'static,
    ) -> Result<SignalThread, (SignalStream, std::io::Error)> {
        let (fd_tx, fd_rx) = tokio::sync::oneshot::channel::<SignalFd>();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let waiting = Arc::new(AtomicU32::new(0));
        let handed = waiting.clone();
        let spawned = std::thread::Builder::new()
            .name("drainit-signals".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                reblock();
                if let Ok(sfd) = fd_rx.blocking_recv() {
                    read_on_thread(&sfd, &tx, &handed, &at_once);
                }
            });
        // The C library's `pthread_create` unblocks the signals it keeps for
        // itself in the calling thread and the new one: blocked again here and
        // at the top of the new thread (as `logging::Queue::start` does).
        reblock();
        if let Err(e) = spawned {
            return Err((self, e));
        }
        // Off the runtime's epoll (no wake-up of the loop per signal) and
        // blocking: the thread waits in its read.
        let sfd = self.fd.into_inner();
        set_blocking(&sfd);
        // The thread waits for it: the send cannot fail.
        let _ = fd_tx.send(sfd);
        Ok(SignalThread {
            rx,
            waiting,
            counted: false,
        })
    }
}

/// The signals' thread's stack: its frames are the read's buffer and the log
/// line of a failed send (a 2 MiB default would be reserved for nothing).
const THREAD_STACK: usize = 64 * 1024;

/// Clears `O_NONBLOCK` (`fcntl(2)`). Should it fail (it cannot, on a
/// signalfd), the thread's reads return `EAGAIN` and it retries after a yield.
fn set_blocking(sfd: &SignalFd) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(flags) = fcntl(sfd, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
        let _ = fcntl(sfd, FcntlArg::F_SETFL(flags));
    }
}

/// The loop of the signals' thread: each read (up to [`BATCH`] signals, the
/// kernel's order) goes to `at_once` first while no earlier read waits for the
/// loop's step, then to the loop. A read the loop must decide on (a signal
/// `at_once` did not send: a drain signal, SIGCHLD, anything once the main child
/// is gone) is counted in `waiting` until the loop asks for the next one: until
/// then, later reads go to the loop unsent, so a SIGCONT that follows a SIGTERM
/// still comes after beat 1 (systemd and `timeout(1)` send them in that order).
fn read_on_thread(
    sfd: &SignalFd,
    tx: &tokio::sync::mpsc::UnboundedSender<(Vec<Received>, bool)>,
    waiting: &AtomicU32,
    at_once: &impl Fn(&mut [Received]),
) {
    let mut buf = [0u8; SIGINFO_SIZE * BATCH];
    let mut failing = false;
    loop {
        let n = match nix::unistd::read(sfd, &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => {
                std::thread::yield_now();
                continue;
            }
            // Cannot happen on a signalfd; retried (SIGCHLD must still be read,
            // or nothing is reaped), logged once, without spinning.
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    log::error!("reading the signalfd failed: {e}; retrying every 10 ms");
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        failing = false;
        // Parsed on the stack and sent on before anything is allocated.
        let mut read = [Received::new(Signal(0), 0); BATCH];
        let k = n / SIGINFO_SIZE;
        for (r, rec) in read.iter_mut().zip(buf[..n].chunks_exact(SIGINFO_SIZE)) {
            *r = parse_siginfo(rec);
        }
        let read = &mut read[..k];
        if waiting.load(Ordering::Acquire) == 0 {
            at_once(read);
        }
        let counted = read
            .iter()
            .any(|r| r.forwarded.is_none() && !r.signal.is_reserved());
        if counted {
            waiting.fetch_add(1, Ordering::AcqRel);
        }
        if tx.send((read.to_vec(), counted)).is_err() {
            // The loop is gone: drainit is exiting.
            return;
        }
    }
}

/// The signals read by the signals' thread, in the kernel's order, for the loop.
pub struct SignalThread {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Vec<Received>, bool)>,
    /// Reads handed to the loop for a decision and not yet processed.
    waiting: Arc<AtomicU32>,
    /// The last read returned is one of them.
    counted: bool,
}

impl SignalThread {
    /// The next read: each signal either sent on already ([`Received::forwarded`])
    /// or for the loop to decide. The loop asks again only after its step took
    /// the last read, which is then counted as processed.
    pub async fn recv(&mut self) -> Vec<Received> {
        // Asked again: the loop's step took the last read.
        self.processed();
        match self.rx.recv().await {
            Some((read, counted)) => {
                self.counted = counted;
                read
            }
            // The thread stopped (logged): nothing more comes.
            None => std::future::pending().await,
        }
    }

    /// The loop's step took the last read: the thread may send at once again.
    fn processed(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

// `kill(2)` is in the tree module, private there: it is the only code that sends
// signals.

#[cfg(test)]
mod tests {
    /// The kernel's 64-bit mask at the start of a sigset_t (see `with_bit`).
    #[allow(unsafe_code)]
    fn mask_bits(set: &SigSet) -> u64 {
        // SAFETY: as in `with_bit`: a sigset_t starts with an aligned u64 mask.
        unsafe { *(set.as_ref() as *const libc::sigset_t).cast::<u64>() }
    }

    use super::*;

    #[test]
    fn parses_names_numbers_and_realtime() {
        assert_eq!(Signal::parse("TERM", false), Ok(Signal::TERM));
        assert_eq!(Signal::parse("SIGTERM", false), Ok(Signal::TERM));
        assert_eq!(Signal::parse("sigterm", false), Ok(Signal::TERM));
        assert_eq!(Signal::parse("15", false), Ok(Signal::TERM));
        // glibc's numbering in every build (musl's SIGRTMIN would be 35).
        assert_eq!(Signal::parse("RTMIN+3", false), Ok(Signal(37)));
        assert_eq!(Signal(34).to_string(), "SIGRTMIN");
        assert_eq!(
            Signal::parse("SIGRTMAX", false),
            Ok(Signal(Signal::rtmax()))
        );
        assert!(Signal::parse("0", false).is_err());
        assert_eq!(Signal::parse("0", true), Ok(Signal(0)));
        assert!(Signal::parse("TERMINATE", false).is_err());
        assert!(Signal::parse("99", false).is_err());
        assert!(Signal::parse("RTMIN+99", false).is_err());
    }

    #[test]
    fn names_round_trip() {
        for n in 1..=Signal::rtmax() {
            if n == 32 || n == 33 {
                continue;
            }
            let s = Signal(n);
            assert_eq!(Signal::parse(&s.to_string(), false), Ok(s), "{s}");
        }
    }

    #[test]
    fn siginfo_layout() {
        assert_eq!(SIGINFO_SIZE, 128);
        assert_eq!(std::mem::offset_of!(libc::signalfd_siginfo, ssi_signo), 0);
        assert_eq!(std::mem::offset_of!(libc::signalfd_siginfo, ssi_pid), 12);
        let mut rec = [0u8; 128];
        rec[..4].copy_from_slice(&15u32.to_ne_bytes());
        rec[12..16].copy_from_slice(&4242u32.to_ne_bytes());
        let r = parse_siginfo(&rec);
        assert_eq!((r.signal, r.sender), (Signal::TERM, 4242));
    }

    #[test]
    fn caught_table_matches_design() {
        for n in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
        ] {
            assert!(!Signal(n).is_caught());
        }
        for n in [libc::SIGSYS, libc::SIGPIPE, libc::SIGKILL, libc::SIGSTOP] {
            assert!(!Signal(n).is_caught());
        }
        for n in [
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGABRT,
            libc::SIGWINCH,
            libc::SIGCONT,
        ] {
            assert!(Signal(n).is_caught());
        }
        assert!(Signal(Signal::rtmin()).is_caught());
        // Blocked and read through the signalfd in every build (musl's
        // sigfillset leaves 34 out).
        let caught = caught_set();
        assert!(caught.contains(NixSignal::try_from(libc::SIGTERM).unwrap()));
        let raw = mask_bits(&caught);
        assert_ne!(raw & (1 << 33), 0, "34 is caught");
        assert_eq!(
            raw & (0b11 << 31),
            0b11 << 31,
            "32 and 33 are read (and dropped)"
        );
        assert!(Signal(Signal::rtmax()).is_caught());
    }

    #[test]
    fn rewrite_applies_and_drops() {
        let mut m = RewriteMap::default();
        let (a, b) = RewriteMap::parse_pair("TERM:QUIT").unwrap();
        m.insert(a, b);
        let (a, b) = RewriteMap::parse_pair("WINCH:0").unwrap();
        m.insert(a, b);
        assert_eq!(m.apply(Signal::TERM), Some(Signal::QUIT));
        assert_eq!(m.apply(Signal(libc::SIGWINCH)), None);
        assert_eq!(m.apply(Signal::HUP), Some(Signal::HUP));
        assert!(RewriteMap::parse_pair("TERM").is_err());
    }
}
