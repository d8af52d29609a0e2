//! Building and spawning processes: the main child, and drainit's own helpers.
//!
//! Owns: the child's starting state (docs/processes-and-signals.md). The child leads a new
//! process group in drainit's session; with a terminal whose foreground group is
//! drainit's, that new group becomes the foreground group, so Ctrl-C and job control
//! reach the app as in a shell (dumb-init PR #122). It starts with the signal mask
//! drainit inherited and the dispositions drainit inherited (drainit installs no
//! handler; it ignores SIGPIPE for itself and gives the child back the SIGPIPE
//! disposition it inherited), and the fds drainit inherited; drainit's own fds are all close-on-exec.
//!
//! Must not: wait for anything (the reaper does), except for a child whose exec
//! failed, reaped in `start` before the reaper knows of it. Everything drainit
//! starts (the main child, exec checks, teardown steps) is started the way glibc's
//! `posix_spawn` starts a process (`clone(CLONE_VM | CLONE_VFORK)`, then `execvpe`
//! with an argv and environment built before the clone): the main child's
//! environment may need its own pid (`LISTEN_PID`, socket activation), nothing may
//! be allocated between the clone and the exec, and std's `Command` would add its
//! own fork machinery to the binary for nothing.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;

use nix::sys::signal::{SigSet, Signal as NixSignal};
use nix::unistd::{getpgrp, isatty, tcgetpgrp};

use crate::exit;
use crate::signals::InheritedMask;

/// Why the command could not be started.
#[derive(Debug)]
pub enum SpawnError {
    /// ENOENT: exit 127.
    NotFound(String),
    /// EACCES, EISDIR, ENOEXEC and the rest: exit 126.
    CannotExecute(String, io::Error),
    /// The argv or environment holds a NUL byte (a usage error, exit 64).
    Nul(String),
}

impl SpawnError {
    /// The exit code (README, Exit codes).
    pub fn exit_code(&self) -> i32 {
        match self {
            SpawnError::NotFound(_) => exit::NOT_FOUND,
            SpawnError::CannotExecute(..) => exit::CANNOT_EXECUTE,
            SpawnError::Nul(_) => exit::USAGE,
        }
    }

    /// The report's `error`: see [`io_error_kind`].
    pub fn kind(&self) -> String {
        match self {
            SpawnError::NotFound(_) => "not found".into(),
            SpawnError::CannotExecute(_, e) => io_error_kind(e),
            SpawnError::Nul(_) => "contains a NUL byte".into(),
        }
    }
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::NotFound(c) => write!(f, "starting '{c}' failed: not found"),
            SpawnError::CannotExecute(c, _) => write!(f, "starting '{c}' failed: {}", self.kind()),
            SpawnError::Nul(c) => write!(
                f,
                "starting '{c}' failed: an argument or variable contains a NUL byte"
            ),
        }
    }
}

/// What the main child is started with.
pub struct ChildSpec {
    pub argv: Vec<OsString>,
    /// The child's environment (drainit's, with the adjustments of the caller).
    pub env: Vec<(OsString, OsString)>,
    /// Rewrite `LISTEN_PID` to the child's own pid (socket activation: the caller
    /// found `LISTEN_PID` naming drainit).
    pub rewrite_listen_pid: bool,
    /// `--user`: the ids the child switches to right before `execve`; `None`:
    /// drainit's own.
    pub user: Option<crate::user::Identity>,
}

const LISTEN_PID: &[u8] = b"LISTEN_PID=";
/// Room for "LISTEN_PID=" + the digits of any pid + NUL.
const LISTEN_PID_LEN: usize = 11 + 20 + 1;

/// Whether drainit's stdin is a terminal whose foreground group is drainit's own
/// (then the child's group takes the terminal). A background job never steals it.
pub fn owns_terminal() -> bool {
    let stdin = std::io::stdin();
    isatty(&stdin).unwrap_or(false) && tcgetpgrp(&stdin).map(|g| g == getpgrp()).unwrap_or(false)
}

/// What everything drainit starts gets back of drainit's own start: the signal
/// mask and SIGPIPE's disposition drainit inherited, and (helpers only) the
/// directory it was started in. Made by `main`, handed to whatever starts
/// processes (the supervisor's start, the checks, the teardown steps).
///
/// The default (an empty mask, SIGPIPE at its default, helpers in the current
/// directory) is a process started by nothing in particular: the tests'.
#[derive(Clone, Default)]
pub struct Launcher {
    mask: InheritedMask,
    /// SIGPIPE was ignored when drainit started (drainit then ignores it for
    /// itself): what drainit starts gets that disposition back, so SIGPIPE is
    /// inherited through drainit like every other signal's (POSIX: an ignored
    /// signal stays ignored across `execve`).
    sigpipe_ignored: bool,
    /// Where helpers run: the directory drainit was started in, before it moved
    /// to `/`, so relative commands and paths in `--teardown` and `--ready-exec`
    /// mean what they meant on the command line.
    start_dir: Option<std::path::PathBuf>,
}

/// What the child reads between `clone` and `execve`: everything built before the
/// clone, so the child allocates nothing. It lives on the parent's stack and the
/// child shares the parent's memory (`CLONE_VM`), so `exec_errno` written by a
/// child whose exec failed is read by the parent after `clone` returns.
#[repr(C)]
struct ExecArgs {
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The `LISTEN_PID=` slot to fill with the child's pid, or null.
    listen_pid: *mut u8,
    take_terminal: bool,
    /// dup2'd onto stdin, or -1 (inherited).
    stdin: libc::c_int,
    /// dup2'd onto stdout and stderr, or -1 (inherited).
    output: libc::c_int,
    /// The directory to start in, or null (drainit's).
    dir: *const libc::c_char,
    /// SIGPIPE was ignored when drainit started.
    sigpipe_ignored: bool,
    /// Switch to `uid`, `gid` and the `ngroups` supplementary groups at `groups`.
    set_ids: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    ngroups: usize,
    /// The signal mask drainit inherited: the child execs with it.
    mask: libc::sigset_t,
    /// SIGTTOU, SIGTTIN, SIGTSTP: blocked around `tcsetpgrp`.
    tty_block: libc::sigset_t,
    /// 0, or the errno of the step that failed (the child then `_exit`s).
    exec_errno: std::sync::atomic::AtomicI32,
}

/// Room for the child's stack: glibc's `execvpe` keeps a PATH candidate (at most
/// PATH_MAX + NAME_MAX) on the stack and, for a script without `#!`, an argv copy
/// of `argc + 2` pointers; 64 KiB of room besides is what glibc's own
/// `posix_spawn` allows (`__MAX_ALLOCA_CUTOFF`).
fn child_stack_size(argc: usize) -> usize {
    let page = 4096;
    (64 * 1024 + (argc + 2) * std::mem::size_of::<usize>()).div_ceil(page) * page
}

/// The child's side of [`start`], from `clone` to `execve`.
///
/// It shares drainit's memory (`CLONE_VM`) while drainit's calling thread is
/// suspended (`CLONE_VFORK`), exactly like glibc's `posix_spawn`: it calls only
/// async-signal-safe functions (sigaction, setpgid, dup2, chdir, sigprocmask,
/// tcsetpgrp, getpid, execvpe, and raw setgroups/setresgid/setresuid, those in
/// [`switch_ids`]), allocates nothing, takes no lock, and writes only into
/// `ExecArgs` and its `LISTEN_PID` slot ([`fill_listen_pid`]). No handler of drainit's can run here: every caught signal is
/// blocked until the mask is replaced right before `execve`, and the dispositions
/// are the child's own copy (no `CLONE_SIGHAND`).
#[allow(unsafe_code)]
extern "C" fn exec_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ExecArgs` on the suspended parent's stack, alive until
    // this child execs or exits (CLONE_VFORK); its pointers were built before the
    // clone and stay valid for as long.
    let a = unsafe { &*(arg as *const ExecArgs) };
    let fail = |a: &ExecArgs| -> libc::c_int {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        a.exec_errno
            .store(errno, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: _exit(2) is async-signal-safe and runs no atexit handler.
        unsafe { libc::_exit(127) }
    };
    // drainit ignores SIGPIPE for itself; what it starts gets the disposition
    // drainit inherited, like every other disposition.
    // SAFETY: an all-zero sigaction is a valid value (no handler, empty mask, no
    // flags), as C's `= {0}`.
    let mut pipe: libc::sigaction = unsafe { std::mem::zeroed() };
    pipe.sa_sigaction = if a.sigpipe_ignored {
        libc::SIG_IGN
    } else {
        libc::SIG_DFL
    };
    // SAFETY: sigaction(2) reads the local `pipe`; SIG_IGN/SIG_DFL install no
    // handler; no old action is written.
    if unsafe { libc::sigaction(libc::SIGPIPE, &pipe, std::ptr::null_mut()) } != 0 {
        return fail(a);
    }
    // New group: the child leads it (so forward-to group and job control work).
    // SAFETY: setpgid(2) takes two integers and touches no memory.
    if unsafe { libc::setpgid(0, 0) } != 0 {
        return fail(a);
    }
    // SAFETY: dup2(2) on integers: fds the parent keeps open until this child has
    // exec'd or exited (CLONE_VFORK).
    if a.stdin >= 0 && unsafe { libc::dup2(a.stdin, 0) } < 0 {
        return fail(a);
    }
    // SAFETY: as above.
    if a.output >= 0 && unsafe { libc::dup2(a.output, 1) < 0 || libc::dup2(a.output, 2) < 0 } {
        return fail(a);
    }
    // SAFETY: `dir` is a NUL-terminated string of the parent's, alive until this
    // child has exec'd or exited.
    if !a.dir.is_null() && unsafe { libc::chdir(a.dir) } != 0 {
        return fail(a);
    }
    if a.take_terminal {
        // tcsetpgrp from a group that is not (yet) the foreground group raises
        // SIGTTOU; keep it blocked across the call (CONVENTIONS pitfall 5).
        // SAFETY: sigprocmask(2) reads `tty_block` (in `ExecArgs`, alive as above)
        // and writes no old mask.
        unsafe { libc::sigprocmask(libc::SIG_BLOCK, &a.tty_block, std::ptr::null_mut()) };
        // ENOTTY/EPERM: no terminal after all; the child runs in the background.
        // SAFETY: tcsetpgrp(3) and getpid(2) take and return integers.
        unsafe { libc::tcsetpgrp(0, libc::getpid()) };
    }
    if !a.listen_pid.is_null() {
        fill_listen_pid(a.listen_pid);
    }
    if a.set_ids && !switch_ids(a) {
        return fail(a);
    }
    // 32–34 as drainit found them (it ignores them for itself), while still
    // blocked; then the mask drainit inherited, replacing drainit's own (nearly
    // everything).
    if crate::signals::give_back_libc_own().is_err() {
        return fail(a);
    }
    if crate::signals::sigprocmask_raw(libc::SIG_SETMASK, &a.mask, None).is_err() {
        return fail(a);
    }
    // SAFETY: `file`, `argv` and `envp` are NUL-terminated strings and
    // NULL-terminated arrays of them, built by the parent before the clone and
    // alive until this child has exec'd or exited. Returns only on failure.
    unsafe { libc::execvpe(a.file, a.argv, a.envp) };
    fail(a)
}

/// Writes the calling process's pid after `LISTEN_PID=` in `slot` (the parent's
/// `LISTEN_PID_LEN`-byte buffer), NUL-terminated: digit by digit, without
/// formatting machinery, which could allocate ([`exec_child`]'s rules).
#[allow(unsafe_code)]
fn fill_listen_pid(slot: *mut u8) {
    let mut digits = [0u8; 20];
    // SAFETY: getpid(2) takes nothing and touches no memory.
    let mut n = unsafe { libc::getpid() } as u64;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // The slot has LISTEN_PID_LEN bytes: 11 + at most 20 digits + NUL fit.
    for i in 0..len {
        // SAFETY: within the parent's LISTEN_PID_LEN-byte buffer (see above),
        // alive and written by no one else until this child has exec'd.
        unsafe { *slot.add(LISTEN_PID.len() + i) = digits[len - 1 - i] };
    }
    // SAFETY: as above: the NUL at most at byte 11 + 20 of 32.
    unsafe { *slot.add(LISTEN_PID.len() + len) = 0 };
}

/// `--user` in [`exec_child`]: groups, then gid, then uid (after setresuid(2) the
/// right to change groups is gone); `false` when one failed (errno set), which
/// fails the spawn (exit 126): the app never runs with the wrong ids.
///
/// Raw system calls, as glibc's posix_spawn does for POSIX_SPAWN_RESETIDS: the C
/// libraries' setuid/setgid wrappers apply the change to every thread of the
/// process through a signal broadcast over the thread list, which this child
/// shares with drainit (CLONE_VM); the raw calls change this task alone.
#[allow(unsafe_code)]
fn switch_ids(a: &ExecArgs) -> bool {
    // SAFETY: setgroups(2) reads `ngroups` gids from `groups`, the parent's
    // `Identity::groups`, alive until this child has exec'd or exited; the
    // other two take integers.
    unsafe {
        libc::syscall(libc::SYS_setgroups, a.ngroups, a.groups) == 0
            && libc::syscall(libc::SYS_setresgid, a.gid, a.gid, a.gid) == 0
            && libc::syscall(libc::SYS_setresuid, a.uid, a.uid, a.uid) == 0
    }
}

/// How a process drainit starts begins: built in full before the clone.
struct Launch<'a> {
    argv: &'a [CString],
    env: &'a [CString],
    /// Add `LISTEN_PID=<the child's pid>` (socket activation).
    listen_pid: bool,
    take_terminal: bool,
    stdin: Option<std::os::fd::BorrowedFd<'a>>,
    output: Option<std::os::fd::BorrowedFd<'a>>,
    dir: Option<&'a std::ffi::CStr>,
    mask: SigSet,
    sigpipe_ignored: bool,
    /// `--user` (the main child only).
    user: Option<&'a crate::user::Identity>,
}

/// Starts a process with `clone(CLONE_VM | CLONE_VFORK)` and `execvpe`, the way
/// glibc's `posix_spawn` does (which cannot be used itself: the main child's
/// environment may need the child's own pid, `LISTEN_PID`). Returns its pid once
/// the exec succeeded.
///
/// Compared with `fork`: no page tables are copied and no page is copied on write
/// afterwards, and the exec's failure comes back through shared memory instead of a
/// pipe. drainit's calling thread is suspended until the child has exec'd or exited.
///
/// # Errors
/// The errno of the step that failed (clone, setpgid, dup2, chdir, execvpe). A
/// child whose exec failed was already waited for here, so the reaper never sees it.
#[allow(unsafe_code)]
fn start(l: &Launch<'_>) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut listen_buf = [0u8; LISTEN_PID_LEN];
    listen_buf[..LISTEN_PID.len()].copy_from_slice(LISTEN_PID);
    let argv_ptrs: Vec<*const libc::c_char> = l
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut envp_ptrs: Vec<*const libc::c_char> = l.env.iter().map(|e| e.as_ptr()).collect();
    if l.listen_pid {
        envp_ptrs.push(listen_buf.as_ptr().cast());
    }
    envp_ptrs.push(std::ptr::null());
    let mut tty_block = SigSet::empty();
    tty_block.add(NixSignal::SIGTTOU);
    tty_block.add(NixSignal::SIGTTIN);
    tty_block.add(NixSignal::SIGTSTP);
    let args = ExecArgs {
        file: argv_ptrs[0],
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        listen_pid: if l.listen_pid {
            listen_buf.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        take_terminal: l.take_terminal,
        stdin: l.stdin.map_or(-1, |fd| fd.as_raw_fd()),
        output: l.output.map_or(-1, |fd| fd.as_raw_fd()),
        dir: l.dir.map_or(std::ptr::null(), |d| d.as_ptr()),
        sigpipe_ignored: l.sigpipe_ignored,
        set_ids: l.user.is_some(),
        uid: l.user.map_or(0, |u| u.uid),
        gid: l.user.map_or(0, |u| u.gid),
        groups: l.user.map_or(std::ptr::null(), |u| u.groups.as_ptr()),
        ngroups: l.user.map_or(0, |u| u.groups.len()),
        mask: *l.mask.as_ref(),
        tty_block: *tty_block.as_ref(),
        exec_errno: std::sync::atomic::AtomicI32::new(0),
    };
    // The child's stack: reserved, touched only as deep as the child goes.
    let mut stack: Vec<u128> = Vec::with_capacity(child_stack_size(l.argv.len()) / 16);
    // SAFETY: one past the end of the reservation, 16-byte aligned (u128): the top of
    // a downward-growing stack.
    let top = unsafe { stack.as_mut_ptr().add(stack.capacity()) };
    // SAFETY: `exec_child` only reads `args` and the memory it points to, all alive
    // across this call; CLONE_VFORK returns only after the child exec'd or exited,
    // so nothing here is freed or moved while the child uses it.
    let pid = unsafe {
        libc::clone(
            exec_child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&args as *const ExecArgs).cast_mut().cast(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(stack);
    let errno = args.exec_errno.load(std::sync::atomic::Ordering::Relaxed);
    if errno == 0 {
        return Ok(pid);
    }
    // The child has already exited (_exit(127)): reap it here, before the reaper
    // knows of it.
    crate::reaper::reap_failed_spawn(pid);
    Err(io::Error::from_raw_os_error(errno))
}

/// Starts the main child: a new process group (the terminal's foreground group
/// with `take_terminal`), drainit's inherited signal mask and fds, the spec's
/// argv and environment (see `start`). Returns its pid once the exec succeeded.
///
/// # Errors
/// [`SpawnError`] when the command cannot be started (the failed child was
/// already waited for, so the reaper never sees it).
impl Launcher {
    /// `mask` and SIGPIPE's disposition as drainit found them at its start.
    pub fn new(mask: InheritedMask, sigpipe_ignored: bool) -> Launcher {
        Launcher {
            mask,
            sigpipe_ignored,
            start_dir: None,
        }
    }

    /// Helpers run in `dir` (the directory drainit was started in).
    pub fn with_start_dir(mut self, dir: std::path::PathBuf) -> Launcher {
        self.start_dir = Some(dir);
        self
    }

    /// Starts the main child: see [`spawn_child`].
    ///
    /// # Errors
    /// As [`spawn_child`].
    pub fn spawn_child(&self, spec: &ChildSpec, take_terminal: bool) -> Result<i32, SpawnError> {
        spawn_child(spec, self, take_terminal)
    }

    /// Starts a helper: see [`spawn_helper`].
    ///
    /// # Errors
    /// As [`spawn_helper`].
    pub fn spawn_helper(&self, argv: &[String], output: HelperOutput) -> io::Result<i32> {
        spawn_helper(argv, output, &[], self)
    }

    /// As [`Launcher::spawn_helper`], with `extra` variables added to (or
    /// replacing) drainit's environment: a drain phase's
    /// `DRAINIT_PHASE_BUDGET_MS`.
    ///
    /// # Errors
    /// As [`spawn_helper`].
    pub fn spawn_helper_env(
        &self,
        argv: &[String],
        output: HelperOutput,
        extra: &[(&str, String)],
    ) -> io::Result<i32> {
        spawn_helper(argv, output, extra, self)
    }
}

fn spawn_child(
    spec: &ChildSpec,
    launcher: &Launcher,
    take_terminal: bool,
) -> Result<i32, SpawnError> {
    let shown = spec
        .argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nul = |_| SpawnError::Nul(shown.clone());
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(nul))
        .collect::<Result<_, _>>()?;
    let mut env: Vec<CString> = Vec::with_capacity(spec.env.len());
    for (k, v) in &spec.env {
        if spec.rewrite_listen_pid && k.as_bytes() == b"LISTEN_PID" {
            continue;
        }
        env.push(CString::new(env_entry(k, v)).map_err(nul)?);
    }
    let launch = Launch {
        argv: &argv,
        env: &env,
        listen_pid: spec.rewrite_listen_pid,
        take_terminal,
        stdin: None,
        output: None,
        dir: None,
        mask: launcher.mask.0,
        sigpipe_ignored: launcher.sigpipe_ignored,
        user: spec.user.as_ref(),
    };
    start(&launch).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            SpawnError::NotFound(shown)
        } else {
            SpawnError::CannotExecute(shown, e)
        }
    })
}

/// `KEY=VALUE`, as `envp` holds it, with room for the NUL `CString::new` adds
/// (one allocation per variable, not two).
fn env_entry(k: &std::ffi::OsStr, v: &std::ffi::OsStr) -> Vec<u8> {
    let mut kv = Vec::with_capacity(k.len() + 1 + v.len() + 1);
    kv.extend_from_slice(k.as_bytes());
    kv.push(b'=');
    kv.extend_from_slice(v.as_bytes());
    kv
}

/// The kind of a spawn error, the same words for the main child, exec checks and
/// teardown steps: `not found`, `permission denied`, `exec format error` (a
/// script without `#!` in the musl build), `is a directory`, `process limit
/// reached` (EAGAIN from fork(2)/clone(2): `RLIMIT_NPROC` or a cgroup's
/// `pids.max`, a container's `--pids-limit`), or `cannot execute` (never the
/// error's text).
pub fn io_error_kind(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::EAGAIN) {
        return "process limit reached".into();
    }
    crate::util::io_word(e).unwrap_or("cannot execute").into()
}

/// Whether `program` names something `execvpe` could run: a path (with a `/`,
/// relative to the current directory) that is executable, or a name found
/// executable in one of `$PATH`'s directories. For warnings at start only: the
/// answer may change before the program runs.
pub fn runnable(program: &str) -> bool {
    use nix::unistd::{AccessFlags, access};
    let executable = |p: &std::path::Path| p.is_file() && access(p, AccessFlags::X_OK).is_ok();
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    // With no PATH, each C library's `execvpe` has its own default.
    let default = if cfg!(target_env = "musl") {
        "/usr/local/bin:/bin:/usr/bin"
    } else {
        "/bin:/usr/bin"
    };
    let path = std::env::var_os("PATH").unwrap_or_else(|| default.into());
    std::env::split_paths(&path).any(|dir| executable(&dir.join(program)))
}

/// How a helper's output is treated.
#[derive(Clone, Copy, Debug)]
pub enum HelperOutput {
    /// Discarded (exec checks: their output is never shown, it may hold secrets).
    Null,
    /// drainit's own stdout/stderr (teardown steps: operators read their logs).
    Inherit,
}

/// Spawns one of drainit's own helpers (an exec check, a teardown step) in a process
/// group of its own, in the directory drainit started in, stdin from /dev/null,
/// with the signal mask drainit inherited (not drainit's own, which blocks nearly
/// everything: a helper must die of SIGTERM like any program), drainit's
/// environment without `NOTIFY_SOCKET`. The caller registers the pid with the
/// reaper in the same step.
///
/// # Errors
/// The spawn failed (not found, permission denied …; `InvalidInput` for a NUL
/// byte in an argument).
fn spawn_helper(
    argv: &[String],
    output: HelperOutput,
    extra: &[(&str, String)],
    launcher: &Launcher,
) -> io::Result<i32> {
    let nul = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(nul))
        .collect::<io::Result<_>>()?;
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "NOTIFY_SOCKET" && !extra.iter().any(|(e, _)| k == e))
        .filter_map(|(k, v)| CString::new(env_entry(&k, &v)).ok())
        .collect();
    for (k, v) in extra {
        env.push(CString::new(env_entry(k.as_ref(), v.as_ref())).map_err(nul)?);
    }
    let dir = launcher
        .start_dir
        .as_ref()
        .map(|d| CString::new(d.as_os_str().as_bytes()).map_err(nul))
        .transpose()?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    use std::os::fd::AsFd;
    let launch = Launch {
        argv: &argv,
        env: &env,
        listen_pid: false,
        take_terminal: false,
        stdin: Some(null.as_fd()),
        output: match output {
            HelperOutput::Null => Some(null.as_fd()),
            HelperOutput::Inherit => None,
        },
        dir: dir.as_deref(),
        mask: launcher.mask.0,
        sigpipe_ignored: launcher.sigpipe_ignored,
        // Helpers (checks, teardown) run as drainit.
        user: None,
    };
    start(&launch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_errors_are_named_by_kind() {
        let e = |n| io::Error::from_raw_os_error(n);
        assert_eq!(io_error_kind(&e(libc::EAGAIN)), "process limit reached");
        assert_eq!(io_error_kind(&e(libc::ENOENT)), "not found");
        assert_eq!(io_error_kind(&e(libc::EIO)), "cannot execute");
    }
}
