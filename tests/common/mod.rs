//! Black-box test harness: runs the built drainit binary against real processes,
//! as a subreaper (a direct child of the test) or as the real PID 1 of a new PID
//! namespace (`unshare --pid --fork --mount-proc --kill-child`).
//!
//! Every process a test starts carries `DRAINIT_TEST_TMP=<its folder>` in its
//! environment; [`Running`]'s `Drop` SIGKILLs each of them by its own pid, so
//! nothing outlives a test and nothing else is ever signalled. Every wait has a
//! deadline; sleeps are only polling intervals inside one.
#![allow(dead_code, clippy::disallowed_methods)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use serde_json::Value;

/// How drainit is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A direct child of the test: not PID 1, a child subreaper.
    Subreaper,
    /// The real PID 1 of a fresh PID namespace.
    Pid1,
}

pub const BOTH: [Mode; 2] = [Mode::Subreaper, Mode::Pid1];

/// The drainit under test: this build's, or the binary `DRAINIT_BIN` names (to run
/// the whole suite against a packaged build, e.g. the static musl one).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("DRAINIT_BIN")
            .ok()
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_drainit").to_string())
    })
}

pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

pub fn python() -> &'static str {
    "python3"
}

/// A fresh temporary folder, removed on drop.
pub struct TmpDir(pub PathBuf);

impl TmpDir {
    pub fn new(tag: &str) -> TmpDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "drainit-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&p).unwrap();
        TmpDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Polls `f` every 10 ms until it returns `Some`, or `None` after `within`.
pub fn wait_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `cond` every 10 ms until it holds (true) or `within` has passed (false).
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for(within, || cond().then_some(())).is_some()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The process is alive and not a zombie.
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(") ")
                .map(|(_, r)| r.chars().next().unwrap_or('X'))
                .unwrap_or('X');
            state != 'Z' && state != 'X'
        }
        Err(_) => false,
    }
}

/// The children of `pid` (host view).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    out
}

pub fn kill(pid: i32, sig: i32) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` free ports, all different: each is held bound until the last is chosen.
/// (Calls to [`free_port`] one after another may return the same port twice: it is
/// freed before the next bind, and the kernel can hand it out again.)
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: [std::net::TcpListener; N] =
        std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|l| l.local_addr().unwrap().port())
}

/// `/proc/PID/status` field (e.g. `SigBlk`).
pub fn status_field(pid: i32, key: &str) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(&format!("{key}:"))
            .map(|v| v.trim().to_string())
    })
}

/// Makes `cmd` start with signals 32 and 33 at their default disposition.
///
/// glibc's `posix_spawn` (which std uses, and so cargo when it starts this test
/// binary) sets its internal signals 32 and 33 to SIG_IGN in the new process, and an
/// ignored signal stays ignored across exec: the whole test tree would inherit
/// them ignored, and neither Python nor glibc's `sigaction` may reset them. A
/// container runtime starts PID 1 with every disposition at its default; the raw
/// `rt_sigaction` syscall restores that here, so the tests see what users see.
pub fn reset_glibc_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; rt_sigaction(2) is
    // async-signal-safe and only reads the local `act`.
    unsafe {
        cmd.pre_exec(|| {
            let act = [0u64; 4]; // struct kernel_sigaction { handler = SIG_DFL, flags = 0, restorer = 0, mask = 0 }
            for sig in [32, 33] {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    act.as_ptr(),
                    std::ptr::null::<u64>(),
                    8usize,
                );
            }
            Ok(())
        });
    }
}

/// A started drainit. See the module docs.
pub struct Running {
    pub mode: Mode,
    pub tmp: TmpDir,
    /// The process the test waits on (drainit, or unshare).
    proc: Child,
    /// drainit's pid in the host's view.
    pub pid: i32,
    pub mark: PathBuf,
    pub stderr: PathBuf,
    pub stdout: PathBuf,
    /// When the last [`Running::signal`] was sent (epoch ms).
    pub t0: u64,
    exit: Option<i32>,
}

/// What to start.
pub struct Start<'a> {
    pub mode: Mode,
    /// Options for launch.py (`--ignore HUP`, `--block USR2`, `--listen-fd 3:FILE`).
    pub launch: &'a [&'a str],
    /// drainit's flags and command.
    pub args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
}

impl Running {
    /// Starts drainit with `args` (flags, `--`, command) in `mode`.
    pub fn start(mode: Mode, args: &[&str]) -> Running {
        Running::start_with(Start {
            mode,
            launch: &[],
            args,
            env: &[],
        })
    }

    pub fn start_with(s: Start<'_>) -> Running {
        Running::start_program(s, &[bin()])
    }

    /// As [`Running::start_with`], with drainit run as `program` (its first word the
    /// executable, e.g. an emulator followed by the binary it runs: tests/arm64.rs).
    pub fn start_program(s: Start<'_>, program: &[&str]) -> Running {
        let tmp = TmpDir::new("run");
        let mut cmd = match s.mode {
            Mode::Subreaper => Command::new(python()),
            Mode::Pid1 => {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--mount-proc", "--kill-child", python()]);
                c
            }
        };
        let launch_opts: Vec<String> = s.launch.iter().map(|a| in_tmp(a, &tmp)).collect();
        cmd.arg(fixture("launch.py"))
            .args(&launch_opts)
            .arg("--")
            .args(program);
        let mut r = Running::spawn(s.mode, tmp, cmd, s.args, s.env, &[]);
        // Wait until launch.py has exec'd drainit (or drainit is already gone: as
        // PID 1 its exit ends the namespace and its /proc entry at once).
        let pid = r.pid;
        wait_for(Duration::from_secs(10), || {
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return Some(());
            };
            (!String::from_utf8_lossy(&cmdline).contains("launch.py")).then_some(())
        });
        r.t0 = now_ms();
        r
    }

    /// Starts drainit itself, without the launcher, as a direct child of the test
    /// (a subreaper), with `env` set and the variables `env_remove` names removed
    /// (before `env` is applied).
    pub fn start_direct(args: &[&str], env: &[(&str, &str)], env_remove: &[&str]) -> Running {
        let tmp = TmpDir::new("run");
        Running::spawn(
            Mode::Subreaper,
            tmp,
            Command::new(bin()),
            args,
            env,
            env_remove,
        )
    }

    /// Spawns `cmd` (whose last argument so far is drainit) with drainit's `args`,
    /// the harness's variables and stdio in `tmp`.
    fn spawn(
        mode: Mode,
        tmp: TmpDir,
        mut cmd: Command,
        args: &[&str],
        env: &[(&str, &str)],
        env_remove: &[&str],
    ) -> Running {
        let mark = tmp.join("mark");
        fs::write(&mark, "").unwrap();
        let stderr = tmp.join("stderr");
        let stdout = tmp.join("stdout");
        let owned: Vec<String> = args.iter().map(|a| in_tmp(a, &tmp)).collect();
        cmd.args(&owned);
        for k in env_remove {
            cmd.env_remove(k);
        }
        cmd.env("DRAINIT_TEST_TMP", tmp.path())
            .env("MARK", &mark)
            .env("TMP", tmp.path())
            .env(
                "FIXTURES",
                format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR")),
            )
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout).unwrap())
            .stderr(fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        reset_glibc_signals(&mut cmd);
        let proc = cmd.spawn().expect("spawning the launcher");
        let outer = proc.id() as i32;
        let pid = match mode {
            Mode::Subreaper => outer,
            Mode::Pid1 => wait_for(Duration::from_secs(5), || {
                children_of(outer).first().copied()
            })
            .expect("unshare did not start a child within 5 s"),
        };
        Running {
            mode,
            tmp,
            proc,
            pid,
            mark,
            stderr,
            stdout,
            t0: now_ms(),
            exit: None,
        }
    }

    /// Sends `sig` (a number) to drainit and notes the time as T0.
    pub fn signal(&mut self, sig: i32) {
        self.t0 = now_ms();
        assert!(kill(self.pid, sig), "could not signal drainit");
    }

    /// Waits for drainit to exit; returns its exit code and the ms since T0.
    /// Panics (after SIGKILL) if it is still running after `within`.
    pub fn wait(&mut self, within: Duration) -> (i32, u64) {
        let end = Instant::now() + within;
        loop {
            if let Some(st) = self.proc.try_wait().unwrap() {
                let elapsed = now_ms().saturating_sub(self.t0);
                use std::os::unix::process::ExitStatusExt;
                let code = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
                self.exit = Some(code);
                return (code, elapsed);
            }
            if Instant::now() >= end {
                let _ = kill(self.pid, 9);
                let _ = self.proc.kill();
                let _ = self.proc.wait();
                panic!(
                    "drainit still running {within:?} after the last event\nstderr:\n{}\nmarks:\n{}",
                    self.stderr_text(),
                    self.marks()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The exit report: the last non-empty stderr line, as JSON.
    pub fn report(&self) -> Value {
        let text = self.stderr_text();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("last stderr line is no report ({e}):\n{text}"))
    }

    pub fn marks(&self) -> String {
        fs::read_to_string(&self.mark).unwrap_or_default()
    }

    /// Mark lines starting with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        self.marks()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.lines(prefix).len()
    }

    pub fn has(&self, prefix: &str) -> bool {
        self.count(prefix) > 0
    }

    /// The t= of the first line starting with `prefix`.
    pub fn mark_t(&self, prefix: &str) -> Option<u64> {
        self.lines(prefix)
            .first()?
            .rsplit_once(" t=")?
            .1
            .parse()
            .ok()
    }

    /// Index (line number) of the first line starting with `prefix`.
    pub fn line_no(&self, prefix: &str) -> Option<usize> {
        self.marks().lines().position(|l| l.starts_with(prefix))
    }

    /// A `key=value` of NAME's "started" line.
    pub fn field(&self, name: &str, key: &str) -> Option<String> {
        let line = self
            .lines(&format!("{name}: started "))
            .into_iter()
            .next()?;
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")).map(String::from))
    }

    /// Waits until every name logged "started".
    pub fn wait_started(&self, names: &[&str]) {
        for n in names {
            let p = format!("{n}: started");
            wait_for(Duration::from_secs(10), || self.has(&p).then_some(()))
                .unwrap_or_else(|| panic!("{n} never started\nstderr:\n{}", self.stderr_text()));
        }
    }

    pub fn wait_mark(&self, prefix: &str, within: Duration) -> bool {
        wait_for(within, || self.has(prefix).then_some(())).is_some()
    }

    /// drainit's first child (host pid), once it exists and runs `comm`.
    pub fn child_running(&self, comm: &str) -> i32 {
        wait_for(Duration::from_secs(5), || {
            let c = *children_of(self.pid).first()?;
            let got = fs::read_to_string(format!("/proc/{c}/comm")).ok()?;
            (got.trim() == comm).then_some(c)
        })
        .unwrap_or_else(|| {
            panic!(
                "drainit's child {comm} did not appear\nstderr:\n{}",
                self.stderr_text()
            )
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.join(name)
    }
}

/// `arg` with `$TMP` replaced by `tmp`'s path.
fn in_tmp(arg: &str, tmp: &TmpDir) -> String {
    arg.replace("$TMP", tmp.path().to_str().unwrap())
}

/// Waits for `child` (a drainit started directly by the test, its processes
/// carrying `DRAINIT_TEST_TMP=<dir>`) to exit, polling every `poll`; after
/// `within`, SIGKILLs it and everything marked with `dir`, and panics with `what`.
pub fn wait_child(
    child: &mut Child,
    within: Duration,
    poll: Duration,
    dir: &Path,
    what: &str,
) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            kill_marked(dir);
            panic!("{what}: still running after {within:?}");
        }
        std::thread::sleep(poll);
    }
}

/// SIGKILLs every process carrying `DRAINIT_TEST_TMP=<dir>`.
pub fn kill_marked(dir: &Path) {
    let needle = format!("DRAINIT_TEST_TMP={}", dir.display());
    for _ in 0..3 {
        let mut any = false;
        if let Ok(rd) = fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                if pid == std::process::id() as i32 {
                    continue;
                }
                let Ok(env) = fs::read(e.path().join("environ")) else {
                    continue;
                };
                if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) && kill(pid, 9) {
                    any = true;
                }
            }
        }
        if !any {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = kill(self.pid, 9);
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
        kill_marked(self.tmp.path());
    }
}

/// How many file descriptors process `pid` holds (`/proc/PID/fd`); a panic
/// when it is gone (a count of a dead process would pass any "no leak" check).
pub fn open_fds(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count()
}

/// Shorthand for report fields.
pub fn num(v: &Value, path: &str) -> i64 {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_i64()
        .unwrap_or_else(|| panic!("report field {path} is not a number: {v}"))
}

/// With `--proxy`: the report's `requests` counts, in the order of the ledger
/// (docs/proxy.md): received, rejected, admitted, completed, unknown, abandoned,
/// canceled, in_flight, malformed.
pub fn counts(rep: &Value) -> [i64; 9] {
    let q = &rep["requests"];
    [
        "received",
        "rejected",
        "admitted",
        "completed",
        "unknown",
        "abandoned",
        "canceled",
        "in_flight",
        "malformed",
    ]
    .map(|k| num(q, k))
}

/// Checks the ledger (docs/proxy.md, "Ledger") in an exit report and returns its `requests`:
/// received = rejected + admitted; admitted = completed + unknown + abandoned +
/// canceled + in_flight; nothing left in flight at exit; every lost request named
/// (or counted truncated), with an outcome, a method and a path without query.
pub fn ledger(rep: &Value) -> &Value {
    let q = &rep["requests"];
    assert!(q.is_object(), "the report has no `requests` ledger: {rep}");
    let n = |k: &str| num(q, k);
    assert_eq!(
        n("received"),
        n("rejected") + n("admitted"),
        "received != rejected + admitted: {q}"
    );
    assert_eq!(
        n("admitted"),
        n("completed") + n("unknown") + n("abandoned") + n("canceled") + n("in_flight"),
        "admitted != completed + unknown + abandoned + canceled + in_flight: {q}"
    );
    assert_eq!(n("in_flight"), 0, "requests still in flight at exit: {q}");
    let lost = q["lost"].as_array().expect("requests.lost is a list");
    assert!(lost.len() <= 100, "lost is capped at 100: {q}");
    assert_eq!(
        lost.len() as i64 + n("lost_truncated"),
        n("unknown") + n("abandoned"),
        "every unknown/abandoned request is listed or counted truncated: {q}"
    );
    for l in lost {
        let outcome = text(l, "outcome");
        assert!(outcome == "unknown" || outcome == "abandoned", "{l}");
        assert!(!text(l, "method").is_empty(), "{l}");
        let path = text(l, "path");
        assert!(path.starts_with('/') && !path.contains('?'), "{l}");
        assert!(l["start_ms"].is_i64(), "{l}");
    }
    let s = &rep["streams"];
    assert!(s.is_object(), "the report has no `streams`: {rep}");
    for k in ["opened", "completed", "closed_by_drain", "abandoned"] {
        assert!(num(s, k) >= 0);
    }
    q
}

pub fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("report field {path} is not a string: {v}"))
}

/// The sigapp fixture as a command line: `env NAME=.. [K=V..] python3 sigapp.py`.
pub fn sigapp(name: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec!["env".to_string(), format!("NAME={name}")];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push(python().into());
    v.push(fixture("sigapp.py"));
    v
}

/// `--probe-addr=off`, for the tests that do not probe.
pub const OFF: &str = "--probe-addr=off";

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// drainit's argv: `flags`, `--`, then the app's argv.
pub fn cmd<'a>(flags: &[&'a str], app: &'a [String]) -> Vec<&'a str> {
    let mut v = flags.to_vec();
    v.push("--");
    v.extend(app.iter().map(String::as_str));
    v
}

/// One HTTP request on a fresh connection to 127.0.0.1:`port`: (status, lowercased
/// head, body); (0, "", "") when nothing answers.
pub fn http(port: u16, path: &str, method: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

impl Running {
    /// Waits until every name logged "started", sends SIGTERM and waits at most
    /// `within` for drainit to exit: (exit code, ms since the SIGTERM).
    pub fn stop_after_start(&mut self, names: &[&str], within: Duration) -> (i32, u64) {
        self.wait_started(names);
        self.signal(libc::SIGTERM);
        self.wait(within)
    }
}

/// Runs CMD as the session leader of a new pseudo-terminal (tests/fixtures/pty_run.py),
/// types Ctrl-C once `ready` appeared on it; returns ("exit N" or "timeout", what the
/// terminal showed).
pub fn run_on_pty(tmp: &TmpDir, ready: &str, cmd: &[&str]) -> (String, String) {
    let out = tmp.join("tty.out");
    let res = Command::new(python())
        .args([
            fixture("pty_run.py").as_str(),
            "--ctrl-c-after",
            ready,
            "--timeout",
            "10",
        ])
        .arg(&out)
        .arg("--")
        .args(cmd)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&res.stdout).trim().to_string();
    (status, fs::read_to_string(&out).unwrap_or_default())
}

/// Ports for drainit's admission proxy in front of a test app: the proxy's
/// listen port, the app's, and drainit's probe port.
pub struct ProxyPorts {
    pub port: u16,
    pub app: u16,
    pub probe: u16,
}

impl ProxyPorts {
    /// Three free ports, all different.
    pub fn new() -> ProxyPorts {
        let [port, app, probe] = free_ports();
        ProxyPorts { port, app, probe }
    }

    /// drainit's command line up to `--`: `--probe-addr 127.0.0.1:PROBE --proxy
    /// 127.0.0.1:PORT=127.0.0.1:APP --ready-tcp 127.0.0.1:APP`, then `flags`,
    /// then `--`, then `app` with `{app}` replaced by the app's port.
    pub fn argv(&self, flags: &[&str], app: &[&str]) -> Vec<String> {
        let mut v = vec![
            "--probe-addr".to_string(),
            format!("127.0.0.1:{}", self.probe),
            "--proxy".to_string(),
            format!("127.0.0.1:{}=127.0.0.1:{}", self.port, self.app),
            "--ready-tcp".to_string(),
            format!("127.0.0.1:{}", self.app),
        ];
        v.extend(flags.iter().map(|f| f.to_string()));
        v.push("--".to_string());
        v.extend(
            app.iter()
                .map(|a| a.replace("{app}", &self.app.to_string())),
        );
        v
    }

    /// drainit as a subreaper with [`ProxyPorts::argv`] under `RLIMIT_NOFILE`
    /// `nofile` (the launcher's `--nofile`), returned once `/readyz` says 200
    /// (10 s at most, else a panic with drainit's stderr).
    pub fn start_under_nofile(&self, nofile: &str, flags: &[&str], app: &[&str]) -> Running {
        let argv = self.argv(flags, app);
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let r = Running::start_with(Start {
            mode: Mode::Subreaper,
            launch: &["--nofile", nofile],
            args: &args,
            env: &[],
        });
        assert!(
            wait_until(secs(10), || http(self.probe, "/readyz", "GET").0 == 200),
            "never ready\n{}",
            r.stderr_text()
        );
        r
    }
}

/// An app's listening socket whose accept queue is full and stays full until
/// the test accepts: a backlog of 0 (one connection waiting fills it) and one
/// connection made to it, returned to keep. Linux drops the SYNs of further
/// connects, which are sent again 1 s, 3 s, 7 s... after the first, as to an
/// app too busy to accept.
pub fn full_listener() -> (std::net::TcpListener, std::net::TcpStream, u16) {
    use std::os::fd::AsRawFd;
    let app = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen(2) again on our own listening socket changes its backlog.
    assert_eq!(unsafe { libc::listen(app.as_raw_fd(), 0) }, 0);
    let port = app.local_addr().unwrap().port();
    let filler = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    (app, filler, port)
}

/// drainit with `--proxy` in front of the test's own listener on `app_port`
/// (e.g. [`full_listener`]), `flags` added, `sleep 60` as its child, ready
/// (no readiness check): (drainit, the proxy's port, the probe's port).
pub fn proxy_to(app_port: u16, flags: &[&str]) -> (Running, u16, u16) {
    let [port, probe] = free_ports();
    let proxy = format!("127.0.0.1:{port}=127.0.0.1:{app_port}");
    let probe_addr = format!("127.0.0.1:{probe}");
    let mut args = vec!["--probe-addr", &probe_addr, "--proxy", &proxy];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sleep", "60"]);
    let r = Running::start(Mode::Subreaper, &args);
    assert!(
        wait_until(secs(10), || http(probe, "/readyz", "GET").0 == 200),
        "{}",
        r.stderr_text()
    );
    (r, port, probe)
}

/// Checks what every shipped build is (release.sh, build.rs, `hot-text.ld`): a plain
/// static executable (ELF type EXEC, no program interpreter), with no symbol table,
/// and its hot functions first: a `.text.drainit.hot` section of 256 KiB to 1 MiB
/// placed before `.text`. Returns the ELF header as `readelf -hW` prints it (the
/// caller checks the machine). Needs readelf (binutils), which reads any
/// architecture's binary.
pub fn assert_shipped_build(bin: &str) -> String {
    let readelf = |flag: &str| {
        let out = Command::new("readelf")
            .args([flag, bin])
            .output()
            .expect("readelf (binutils)");
        assert!(out.status.success(), "readelf {flag} {bin}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let header = readelf("-hW");
    assert!(
        header.contains("EXEC (Executable file)"),
        "{bin} is not a plain static executable:\n{header}"
    );
    let segments = readelf("-lW");
    assert!(
        !segments.contains("INTERP"),
        "{bin} asks for a program interpreter (dynamic):\n{segments}"
    );
    let sections = readelf("-SW");
    assert!(!sections.contains(".symtab"), "{bin} has a symbol table");
    // `[Nr] Name Type Address Off Size ...`: (address, size) of the section `name`.
    let section = |name: &str| {
        let line = sections
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == name))
            .unwrap_or_else(|| panic!("{bin} has no {name} section:\n{sections}"));
        let fields: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
        (hex(fields[2]), hex(fields[4]))
    };
    let (hot_at, hot_size) = section(".text.drainit.hot");
    let (text_at, _) = section(".text");
    assert!(
        (256 * 1024..1024 * 1024).contains(&hot_size),
        "the hot code is {hot_size} bytes"
    );
    assert!(hot_at < text_at, "the hot code is not first:\n{sections}");
    header
}

/// A client connected with its receive buffer set to `rcvbuf` bytes before the
/// connect (so that the window it offers is that small from the start).
pub fn connect_small(port: u16, rcvbuf: usize) -> std::net::TcpStream {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socket, sockopt};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    setsockopt(&fd, sockopt::RcvBuf, &rcvbuf).unwrap();
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connect(2) on our own socket with a sockaddr_in of its size.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    std::net::TcpStream::from(fd)
}
