//! Building and spawning processes: the main child, and drainit's own helpers.
//!
//! Owns: the child's starting state (DESIGN §5 "Spawn"). The child leads a new
//! process group in drainit's session; with a terminal whose foreground group is
//! drainit's, that new group becomes the foreground group, so Ctrl-C and job control
//! reach the app as in a shell (dumb-init PR #122). It starts with the signal mask
//! drainit inherited and the dispositions drainit inherited (drainit installs no
//! handler, so there is nothing to reset but std's SIGPIPE), and the fds drainit
//! inherited; drainit's own fds are all close-on-exec.
//!
//! Must not: wait for anything (the reaper does). `Command::spawn` is used only as a
//! fork with an exec-error pipe: the exec itself happens inside `pre_exec`, with an
//! argv and environment built before the fork, because the child's environment may
//! need the child's own pid (`LISTEN_PID`, socket activation) and nothing may be
//! allocated after `fork` in a process that has threads.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::sys::signal::{SigSet, SigmaskHow, Signal as NixSignal, pthread_sigmask};
use nix::unistd::{Pid, getpgrp, getpid, isatty, setpgid, tcgetpgrp, tcsetpgrp};

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
    /// The exit code of DESIGN §3.
    pub fn exit_code(&self) -> i32 {
        match self {
            SpawnError::NotFound(_) => 127,
            SpawnError::CannotExecute(..) => 126,
            SpawnError::Nul(_) => crate::config::EXIT_USAGE,
        }
    }

    /// The report's `error`: `not found`, `permission denied`, or the errno's text.
    pub fn kind(&self) -> String {
        match self {
            SpawnError::NotFound(_) => "not found".into(),
            SpawnError::CannotExecute(_, e) if e.kind() == io::ErrorKind::PermissionDenied => {
                "permission denied".into()
            }
            SpawnError::CannotExecute(_, e) => match e.raw_os_error() {
                Some(libc::ENOEXEC) => "exec format error".into(),
                Some(libc::EISDIR) => "is a directory".into(),
                _ => "cannot execute".into(),
            },
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
}

/// A NULL-terminated `char *[]` for execvpe, built before the fork.
struct CPtrs(Vec<*const libc::c_char>);
// SAFETY: the pointers are only read, in the forked child, where there is one
// thread; the strings they point to outlive the spawn (see `spawn_child`).
#[allow(unsafe_code)]
unsafe impl Send for CPtrs {}

impl CPtrs {
    fn as_ptr(&self) -> *const *const libc::c_char {
        self.0.as_ptr()
    }
    fn first(&self) -> *const libc::c_char {
        self.0[0]
    }
}
#[allow(unsafe_code)]
unsafe impl Sync for CPtrs {}

const LISTEN_PID: &[u8] = b"LISTEN_PID=";
/// Room for "LISTEN_PID=" + the digits of any pid + NUL.
const LISTEN_PID_LEN: usize = 11 + 20 + 1;

/// Whether drainit's stdin is a terminal whose foreground group is drainit's own
/// (then the child's group takes the terminal). A background job never steals it.
pub fn owns_terminal() -> bool {
    let stdin = std::io::stdin();
    isatty(&stdin).unwrap_or(false) && tcgetpgrp(&stdin).map(|g| g == getpgrp()).unwrap_or(false)
}

/// Forks and execs the main child. Returns its pid once the exec succeeded.
///
/// # Errors
/// [`SpawnError`] when the exec failed (the failed child was already waited for by
/// std, in this same call, so the reaper never sees it).
pub fn spawn_child(
    spec: &ChildSpec,
    mask: InheritedMask,
    take_terminal: bool,
) -> Result<i32, SpawnError> {
    let shown = spec
        .argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cstr = |s: &[u8]| CString::new(s).map_err(|_| SpawnError::Nul(shown.clone()));
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstr(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut envs: Vec<CString> = Vec::with_capacity(spec.env.len());
    for (k, v) in &spec.env {
        if spec.rewrite_listen_pid && k.as_bytes() == b"LISTEN_PID" {
            continue;
        }
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        envs.push(cstr(&kv)?);
    }
    // The LISTEN_PID slot is filled in the child, without allocating.
    let mut listen_buf = vec![0u8; LISTEN_PID_LEN];
    listen_buf[..LISTEN_PID.len()].copy_from_slice(LISTEN_PID);
    let argv_ptrs = CPtrs(
        argv.iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect(),
    );
    let mut envp_ptrs: Vec<*const libc::c_char> = envs.iter().map(|e| e.as_ptr()).collect();
    if spec.rewrite_listen_pid {
        envp_ptrs.push(listen_buf.as_ptr().cast());
    }
    envp_ptrs.push(std::ptr::null());
    let envp_ptrs = CPtrs(envp_ptrs);
    let rewrite_listen_pid = spec.rewrite_listen_pid;
    let original_mask = mask.0;
    let mut tty_block = SigSet::empty();
    tty_block.add(NixSignal::SIGTTOU);
    tty_block.add(NixSignal::SIGTTIN);
    tty_block.add(NixSignal::SIGTSTP);

    let mut cmd = Command::new(&spec.argv[0]);
    let exec = move || -> io::Result<()> {
        // New group: the child leads it (so forward-to group and job control work).
        setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(io::Error::from)?;
        if take_terminal {
            // tcsetpgrp from a group that is not (yet) the foreground group raises
            // SIGTTOU; keep it blocked across the call (CONVENTIONS pitfall 5).
            let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&tty_block), None);
            // ENOTTY/EPERM: no terminal after all; the child runs in the background.
            let _ = tcsetpgrp(std::io::stdin(), getpid());
        }
        if rewrite_listen_pid {
            let buf = listen_buf.as_mut_ptr();
            let mut digits = [0u8; 20];
            let mut n = getpid().as_raw() as u64;
            let mut len = 0;
            loop {
                digits[len] = b'0' + (n % 10) as u8;
                len += 1;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            for i in 0..len {
                // SAFETY: buf has LISTEN_PID_LEN bytes; 11 + 20 digits + NUL fit.
                #[allow(unsafe_code)]
                unsafe {
                    *buf.add(LISTEN_PID.len() + i) = digits[len - 1 - i];
                    *buf.add(LISTEN_PID.len() + len) = 0;
                }
            }
        }
        // The mask drainit inherited, replacing std's empty one.
        pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&original_mask), None)
            .map_err(io::Error::from)?;
        // SAFETY: both arrays are NUL-terminated arrays of pointers to NUL-terminated
        // strings, built before the fork and alive (owned by this closure's captures).
        #[allow(unsafe_code)]
        unsafe {
            libc::execvpe(argv_ptrs.first(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
        }
        Err(io::Error::last_os_error())
    };
    // SAFETY: the closure runs between fork and exec in the child. It calls only
    // async-signal-safe functions: setpgid, pthread_sigmask (sigprocmask), tcsetpgrp,
    // getpid, execvpe (glibc's PATH search uses a stack buffer), and it writes into
    // memory allocated before the fork. It allocates nothing and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(exec);
    }
    // `argv`/`envs` must outlive the spawn: the pointers above refer to them.
    let result = cmd.spawn();
    drop((argv, envs));
    match result {
        Ok(child) => {
            let pid = child.id() as i32;
            // Dropping a std Child neither waits nor kills: the reaper owns it now.
            drop(child);
            Ok(pid)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SpawnError::NotFound(shown)),
        Err(e) => Err(SpawnError::CannotExecute(shown, e)),
    }
}

/// The kind of a spawn error, for reports: `not found`, `permission denied`, or
/// `cannot execute` (never the error's text).
pub fn io_error_kind(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "not found".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => "cannot execute".into(),
    }
}

/// How a helper's output is treated.
#[derive(Clone, Copy, Debug)]
pub enum HelperOutput {
    /// Discarded (exec checks: their output is never shown, it may hold secrets).
    Null,
    /// drainit's own stdout/stderr (teardown steps: operators read their logs).
    Inherit,
}

static START_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Records the directory drainit was started in, before it moves to `/`: helpers
/// run there, so relative commands and paths in `--teardown` and `--ready-exec`
/// mean what they meant on the command line.
pub fn remember_start_dir(dir: std::path::PathBuf) {
    let _ = START_DIR.set(dir);
}

/// Spawns one of drainit's own helpers (an exec check, a teardown step) in a process
/// group of its own, in the directory drainit started in, stdin from /dev/null,
/// with the signal mask drainit inherited (not drainit's own, which blocks nearly
/// everything: a helper must die of SIGTERM like any program). The caller registers
/// the pid with the reaper in the same step.
///
/// # Errors
/// The spawn failed (not found, permission denied …).
pub fn spawn_helper(argv: &[String], output: HelperOutput) -> io::Result<i32> {
    let (out, err) = match output {
        HelperOutput::Null => (Stdio::null(), Stdio::null()),
        HelperOutput::Inherit => (Stdio::inherit(), Stdio::inherit()),
    };
    let mask = crate::signals::inherited_mask().0;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .env_remove("NOTIFY_SOCKET");
    if let Some(dir) = START_DIR.get() {
        cmd.current_dir(dir);
    }
    // SAFETY: runs between fork and exec; pthread_sigmask is async-signal-safe and
    // reads only the copied `mask`.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&mask), None).map_err(io::Error::from)
        });
    }
    let child = cmd.spawn()?;
    Ok(child.id() as i32)
}
