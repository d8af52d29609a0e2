//! Hardening: trees that fork as they exit, large trees, processes
//! drainit may not signal, and an sd_notify flood from outside the child's tree.
//! Each test starts the real binary against real processes and asserts what a
//! user sees: the exit code, the report, what the app received and when.
#![allow(clippy::disallowed_methods)]

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::*;

/// The tests of this file run one at a time: each loads the 2-core machine (a fork
/// loop, thousands of processes, a flood).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live processes (not zombies) that carry this test's marker: whatever of
/// the test's tree is still running.
fn marked_alive(dir: &Path) -> Vec<i32> {
    let needle = format!("DRAINIT_TEST_TMP={}", dir.display());
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A process that forks its successor and exits, over and over, ignoring SIGTERM
/// (each generation is a new process, so a drain signal sent to one generation
/// would not reach the next anyway).
const CHAIN: &str = r#"
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.setsid()
with open(os.environ["MARK"], "a") as f:
    f.write("chain: started t=%d\n" % int(time.time() * 1000))
while True:
    if os.fork() > 0:
        os._exit(0)
"#;

/// A tree that keeps forking and exiting is never reported
/// drained while it runs. Before the fix, a `/proc` walk that lost the successor
/// forked between its listing and its read was taken for "none left": the drain
/// ended `drained`, exit 0, a few ms after the forward, and (as a subreaper) the
/// chain forked on after drainit exited.
#[test]
fn a_tree_that_keeps_forking_and_exiting_is_killed_at_the_deadline_not_drained_subreaper() {
    let _serial = one_at_a_time();
    forking_chain(Mode::Subreaper);
}

#[test]
fn a_tree_that_keeps_forking_and_exiting_is_killed_at_the_deadline_not_drained_pid1() {
    let _serial = one_at_a_time();
    forking_chain(Mode::Pid1);
}

fn forking_chain(mode: Mode) {
    {
        let script = format!(
            "{py} -c '{CHAIN}' & exec env NAME=app CLEANUP=0 {py} {app}",
            py = python(),
            app = fixture("sigapp.py")
        );
        let app = vec!["sh".to_string(), "-c".into(), script];
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "0s", "--drain-timeout", "1500ms"],
                &app,
            ),
        );
        r.wait_started(&["app", "chain"]);
        r.signal(libc::SIGTERM);
        let (rc, elapsed) = r.wait(secs(15));
        let rep = r.report();
        assert_eq!(rc, 2, "{mode:?}: {rep}\n{}", r.stderr_text());
        assert_eq!(text(&rep, "reason"), "abandoned", "{mode:?}: {rep}");
        assert!(num(&rep, "drain.abandoned") >= 1, "{mode:?}: {rep}");
        assert!(
            num(&rep, "drain.finished_at_ms") >= num(&rep, "drain.deadline_ms"),
            "{mode:?}: reported finished before the deadline: {rep}"
        );
        assert!(elapsed >= 1500, "{mode:?}: exited after {elapsed} ms");
        assert!(r.has("app: cleanup done"), "{mode:?}: {}", r.marks());
        // Nothing of the chain outlives drainit: what is left of it ends (as PID 1,
        // the namespace's teardown may take the kernel a moment), where a chain
        // that escaped would fork on forever.
        let gone = wait_for(secs(10), || {
            marked_alive(r.tmp.path()).is_empty().then_some(())
        });
        let left = marked_alive(r.tmp.path());
        assert!(gone.is_some(), "{mode:?}: still running: {left:?}");
    }
}

/// An app with a large tree: `ZOMBIES` children that exited and are never reaped,
/// `LIVE` children that sleep, and an app that logs SIGTERM and carries on.
const BIG_TREE: &str = r#"
import os, signal, time
mark = os.environ["MARK"]
def log(s):
    with open(mark, "a") as f:
        f.write("%s t=%d\n" % (s, int(time.time() * 1000)))
for _ in range(int(os.environ["LIVE"])):
    if os.fork() == 0:
        while True:
            time.sleep(60)
zombies = []
for _ in range(int(os.environ["ZOMBIES"])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    zombies.append(pid)
for pid in zombies:  # every one has exited before "started"
    while open("/proc/%d/stat" % pid).read().rsplit(") ", 1)[1][0] != "Z":
        time.sleep(0.001)
signal.signal(signal.SIGTERM, lambda s, f: log("app: got SIGTERM"))
log("app: started pid=%d" % os.getpid())
while True:
    time.sleep(0.05)
"#;

/// In a large tree the forward and the SIGKILL are not held up by the tree: each
/// goes out before drainit reads `/proc` (signal first, account after), and the
/// report's times are the times the signals were sent. Asserted as an order of
/// drainit's own system calls, traced: between reading the SIGTERM from its
/// signalfd and the `kill(2)` that forwards it, and between the wake-up of the
/// deadline and the first SIGKILL, no `/proc` file is opened and no directory is
/// listed. (A walk before the signal, once per zombie, made both seconds late.)
fn big_tree(mode: Mode) {
    const ZOMBIES: usize = 3000;
    const LIVE: usize = 100;
    let zombies = ZOMBIES.to_string();
    let live = LIVE.to_string();
    let mut r = Running::start_with(Start {
        mode,
        launch: &[],
        args: &[
            OFF,
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "1500ms",
            "--",
            python(),
            "-c",
            BIG_TREE,
        ],
        env: &[("ZOMBIES", &zombies), ("LIVE", &live)],
    });
    assert!(
        r.wait_mark("app: started", secs(60)),
        "{mode:?}: the app did not start\n{}",
        r.stderr_text()
    );
    let app: i32 = r.lines("app: started")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();
    let app_host = match mode {
        Mode::Subreaper => app,
        Mode::Pid1 => r.child_running("python3"),
    };
    let signalfd = fd_of(r.pid, "anon_inode:[signalfd]").expect("drainit's signalfd");
    let pid = r.pid;
    let trace = trace_syscalls(
        pid,
        || r.signal(libc::SIGTERM),
        |call| call.nr == libc::SYS_kill && call.args[1] == libc::SIGKILL as u64,
    );
    // The app's death, seen from outside (a SIGKILLed app logs nothing).
    assert!(
        wait_for(secs(30), || (!alive(app_host)).then_some(())).is_some(),
        "{mode:?}: the app never died"
    );
    let (rc, _) = r.wait(secs(30));
    let rep = r.report();
    assert_eq!(rc, 2, "{mode:?}: {rep}\n{}", r.stderr_text());
    assert_eq!(text(&rep, "reason"), "abandoned", "{mode:?}: {rep}");
    // The app and its live children were killed; its zombies had ended by
    // themselves and are not abandoned.
    assert_eq!(
        num(&rep, "drain.abandoned"),
        LIVE as i64 + 1,
        "{mode:?}: {rep}"
    );
    assert_eq!(
        num(&rep, "drain.in_flight_at_start"),
        LIVE as i64 + 1,
        "{mode:?}: {rep}"
    );
    assert!(
        num(&rep, "orphans_reaped") >= ZOMBIES as i64,
        "{mode:?}: {rep}"
    );
    assert!(
        r.has("app: got SIGTERM"),
        "{mode:?}: the app got no SIGTERM: {}",
        r.stderr_text()
    );
    assert_no_walk_before_signals(mode, &trace, signalfd);
    // The report's times: the forward at T0 (no delay), the SIGKILL not before
    // the deadline, in that order.
    let deadline = num(&rep, "drain.deadline_ms");
    let forwarded = num(&rep, "drain.forwarded_at_ms");
    let killed = num(&rep, "drain.killed_at_ms");
    assert!(
        forwarded < deadline && killed >= deadline,
        "{mode:?}: forwarded at {forwarded} ms, killed at {killed} ms, deadline {deadline} ms: {rep}"
    );
}

/// In `trace`: between reading the SIGTERM from the signalfd and the `kill(2)`
/// that forwards it, and between the deadline's wake-up and the SIGKILL (the
/// trace's last call), no `/proc` read.
fn assert_no_walk_before_signals(mode: Mode, trace: &[Call], signalfd: i32) {
    // The forward: read from the signalfd, then sent, with no walk between.
    let forward = trace
        .iter()
        .position(|c| c.nr == libc::SYS_kill && c.args[1] == libc::SIGTERM as u64)
        .unwrap_or_else(|| panic!("{mode:?}: no kill(2) with SIGTERM traced"));
    let read = trace[..forward]
        .iter()
        .rposition(|c| c.nr == libc::SYS_read && c.args[0] == signalfd as u64)
        .unwrap_or_else(|| panic!("{mode:?}: the SIGTERM was never read from the signalfd"));
    let walk = proc_reads(&trace[read..forward]);
    assert!(
        walk.is_empty(),
        "{mode:?}: between reading the SIGTERM and forwarding it drainit made {} \
         /proc reads: {:?}",
        walk.len(),
        &walk[..walk.len().min(5)]
    );
    // The SIGKILL: the deadline's wake-up, then the signal, with no walk between.
    let kill = trace.len() - 1;
    let woke = trace[..kill]
        .iter()
        .rposition(|c| EPOLL_WAITS.contains(&c.nr))
        .unwrap_or_else(|| panic!("{mode:?}: no wake-up before the SIGKILL"));
    let walk = proc_reads(&trace[woke..kill]);
    assert!(
        walk.is_empty(),
        "{mode:?}: between the deadline's wake-up and the SIGKILL drainit made {} \
         /proc reads: {:?}",
        walk.len(),
        &walk[..walk.len().min(5)]
    );
}

/// One system call of a traced thread, at its entry: its number and arguments.
#[derive(Clone, Copy, Debug)]
struct Call {
    nr: i64,
    args: [u64; 3],
}

/// The calls that wait for the next wake-up of drainit's loop.
const EPOLL_WAITS: [i64; 3] = [
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
];

/// The calls of `calls` that read `/proc` (or any file or directory): opening a
/// file, listing a directory. drainit's loop opens nothing else while it drains.
fn proc_reads(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| [libc::SYS_openat, libc::SYS_open, libc::SYS_getdents64].contains(&c.nr))
        .copied()
        .collect()
}

/// The descriptor of `pid` whose link reads `target` (`/proc/PID/fd`).
fn fd_of(pid: i32, target: &str) -> Option<i32> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|e| fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == target))?
        .file_name()
        .to_str()?
        .parse()
        .ok()
}

/// Traces the system calls of the thread `pid` (drainit's supervisor thread;
/// threads it starts later are not traced): attaches (`PTRACE_SEIZE`), runs
/// `then` once the thread is stopped, and records every call at its entry until
/// `until` holds for one (recorded too), then detaches and lets it run on.
/// Each call only stops the thread a moment; the order of the calls is what a
/// test reads, never their times.
#[allow(unsafe_code)]
fn trace_syscalls(
    pid: i32,
    then: impl FnOnce(),
    mut until: impl FnMut(&Call) -> bool,
) -> Vec<Call> {
    const SYSCALL_STOP: i32 = libc::SIGTRAP | 0x80;
    // SAFETY: ptrace(2) on a process of this test; no memory of ours is passed.
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            0,
            libc::PTRACE_O_TRACESYSGOOD as usize,
        )
    };
    assert_eq!(
        seized,
        0,
        "PTRACE_SEIZE of drainit: {}",
        std::io::Error::last_os_error()
    );
    let stop = || {
        let mut st = 0;
        // SAFETY: waitpid(2) on our tracee, status into a local.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        assert_eq!(r, pid, "waitpid on the traced drainit");
        assert!(libc::WIFSTOPPED(st), "drainit ended while traced: {st:#x}");
        st
    };
    // SAFETY: as above.
    unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) };
    stop();
    then();
    let mut calls = Vec::new();
    let mut inject = 0;
    for _ in 0..10_000_000 {
        // SAFETY: resume our stopped tracee to its next system call stop.
        unsafe { libc::ptrace(libc::PTRACE_SYSCALL, pid, 0, inject) };
        let st = stop();
        inject = 0;
        if libc::WSTOPSIG(st) != SYSCALL_STOP {
            // A signal about to be delivered goes on to the tracee; an event
            // stop (the interrupt's) carries none.
            if st >> 16 == 0 {
                inject = libc::WSTOPSIG(st) as usize;
            }
            continue;
        }
        // SAFETY: GETREGS of a stopped tracee into a zeroed local struct.
        let regs = unsafe {
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs as *mut _);
            regs
        };
        // At a call's entry the kernel has set rax to -ENOSYS; at its exit, the
        // result.
        if regs.rax as i64 != -i64::from(libc::ENOSYS) {
            continue;
        }
        let call = Call {
            nr: regs.orig_rax as i64,
            args: [regs.rdi, regs.rsi, regs.rdx],
        };
        calls.push(call);
        if until(&call) {
            // SAFETY: detach our stopped tracee; it runs on untraced.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
            return calls;
        }
    }
    panic!("drainit made ten million system calls without the one awaited");
}

#[test]
fn a_large_tree_is_forwarded_and_killed_on_time_subreaper() {
    let _serial = one_at_a_time();
    big_tree(Mode::Subreaper);
}

#[test]
fn a_large_tree_is_forwarded_and_killed_on_time_pid1() {
    let _serial = one_at_a_time();
    big_tree(Mode::Pid1);
}

/// An app that marks each SIGHUP it gets.
const HUP_APP: &str = r#"
import os, signal, time
def log(s):
    with open(os.environ["MARK"], "a") as f:
        f.write(s + "\n")
signal.signal(signal.SIGHUP, lambda s, f: log("app: got SIGHUP"))
log("app: started")
while True:
    time.sleep(0.05)
"#;

/// A signal forwarded in every phase (SIGHUP here) goes out as drainit's next
/// system call after the read that took it from the signalfd: nothing is
/// written, read or asked of the kernel between them (signal first, account
/// after); the app gets it and drainit still exits 0 on SIGTERM.
#[test]
fn a_forwarded_signal_is_the_next_system_call_after_its_read_subreaper() {
    let _serial = one_at_a_time();
    forwarded_at_once(Mode::Subreaper);
}

#[test]
fn a_forwarded_signal_is_the_next_system_call_after_its_read_pid1() {
    let _serial = one_at_a_time();
    forwarded_at_once(Mode::Pid1);
}

fn forwarded_at_once(mode: Mode) {
    let mut r = Running::start_with(Start {
        mode,
        launch: &[],
        args: &[OFF, "--", python(), "-c", HUP_APP],
        env: &[],
    });
    assert!(
        r.wait_mark("app: started", secs(60)),
        "{mode:?}: the app did not start\n{}",
        r.stderr_text()
    );
    let signalfd = fd_of(r.pid, "anon_inode:[signalfd]").expect("drainit's signalfd");
    let pid = r.pid;
    let trace = trace_syscalls(
        pid,
        || r.signal(libc::SIGHUP),
        |call| call.nr == libc::SYS_kill && call.args[1] == libc::SIGHUP as u64,
    );
    let kill = trace.len() - 1;
    let read = trace[..kill]
        .iter()
        .rposition(|c| c.nr == libc::SYS_read && c.args[0] == signalfd as u64)
        .unwrap_or_else(|| panic!("{mode:?}: the SIGHUP was never read from the signalfd"));
    assert_eq!(
        read + 1,
        kill,
        "{mode:?}: system calls between the read and the forward: {:?}",
        &trace[read + 1..kill]
    );
    assert!(
        r.wait_mark("app: got SIGHUP", secs(10)),
        "{mode:?}: the app got no SIGHUP\n{}",
        r.stderr_text()
    );
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(30));
    assert_eq!(rc, 0, "{mode:?}: {}\n{}", r.report(), r.stderr_text());
}

/// An app speaking sd_notify: `READY=1`, then one mark line per SIGUSR1, and a
/// clean exit on SIGTERM.
const NOTIFY_APP: &str = r#"
import os, signal, socket, time
mark = os.environ["MARK"]
def log(s):
    with open(mark, "a") as f:
        f.write("%s t=%d\n" % (s, int(time.time() * 1000)))
addr = os.environ["NOTIFY_SOCKET"]
signal.signal(signal.SIGUSR1, lambda s, f: log("app: got SIGUSR1"))
def term(s, f):
    log("app: got SIGTERM")
    os._exit(0)
signal.signal(signal.SIGTERM, term)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.sendto(b"READY=1", "\0" + addr[1:])
log("app: started sock=%s" % addr)
while True:
    time.sleep(0.05)
"#;

/// Floods an abstract datagram socket from outside drainit's tree, ignoring a
/// full queue, until killed: two senders at the bottom of a chain of 40
/// processes (a deep parent chain is what made each datagram expensive to reject).
/// Each sender writes a line to the file named by its second argument once its
/// first datagram went out. The chain's head lives as long as a sender does.
const FLOODER: &str = r#"
import os, socket, sys
for _ in range(40):
    if os.fork() > 0:
        os.wait()
        os._exit(0)
os.fork()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setblocking(False)
addr = "\0" + sys.argv[1][1:]
msg = b"READY=1\nSTATUS=flood\nWATCHDOG=trigger"
said = False
while True:
    try:
        s.sendto(msg, addr)
        if not said:
            with open(sys.argv[2], "a") as f:
                f.write("flooding\n")
            said = True
    except (BlockingIOError, ConnectionRefusedError):
        pass
"#;

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// A process outside the child's tree that floods the notify
/// socket starves nothing. Before the fix the receive loop read until the queue
/// was empty, walking the sender's `/proc` parent chain for every datagram, and
/// a flood kept it from ever being empty: signals were not forwarded, probes not
/// answered, the drain not run.
#[test]
fn an_sd_notify_flood_from_outside_starves_neither_signals_nor_probes_nor_the_drain() {
    let _serial = one_at_a_time();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            "--probe-addr",
            &addr,
            "--ready-notify",
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "5s",
            "--",
            python(),
            "-c",
            NOTIFY_APP,
        ],
    );
    assert!(r.wait_mark("app: started", secs(10)), "{}", r.stderr_text());
    let sock = r.lines("app: started")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("sock="))
        .unwrap()
        .to_string();
    assert!(
        wait_for(secs(5), || (http(port, "/readyz", "GET").0 == 200)
            .then_some(()))
        .is_some(),
        "never ready: {}",
        r.stderr_text()
    );
    // The flooder: a child of the test, not of drainit, in the same namespaces.
    let mut flooder = std::process::Command::new(python())
        .args(["-c", FLOODER, &sock])
        .arg(r.path("flooding"))
        .env("DRAINIT_TEST_TMP", r.tmp.path())
        .spawn()
        .expect("start the flooder");
    // Both senders are flooding before anything is measured.
    assert!(
        wait_for(secs(30), || {
            (fs::read_to_string(r.path("flooding"))
                .unwrap_or_default()
                .lines()
                .count()
                >= 2)
                .then_some(())
        })
        .is_some(),
        "the flooders never sent a datagram"
    );
    // What follows happens while the flood runs: each step checks it still does.
    let mut flooding = |what: &str| {
        assert!(
            flooder.try_wait().unwrap().is_none(),
            "the flood ended before {what}"
        );
    };
    // Forwarding under the flood: SIGUSR1 to drainit, until the app logs it.
    let latencies = forwards_under_flood(&r, &mut flooding);
    // The probes under the flood.
    let probes = probes_under_flood(port, &mut flooding);
    let (_, _, body) = http(port, "/readyz", "GET");
    assert!(
        !body.contains("flood"),
        "an outsider's STATUS= was taken: {body}"
    );
    // The drain under the flood: the forward and a clean exit (`drained`: all
    // of it before the 5 s deadline), all while the flood runs.
    r.signal(libc::SIGTERM);
    let (rc, elapsed) = r.wait(secs(30));
    flooding("drainit exited");
    let _ = flooder.kill();
    let _ = flooder.wait();
    let rep = r.report();
    assert_eq!(rc, 0, "{rep}\n{}", r.stderr_text());
    assert_eq!(text(&rep, "reason"), "drained", "{rep}");
    assert!(r.has("app: got SIGTERM"), "{}", r.marks());
    assert!(
        num(&rep, "drain.forwarded_at_ms") < num(&rep, "drain.deadline_ms"),
        "{rep}"
    );
    // The figures, for the reader (the benchmark's business, not an assertion).
    let (fwd, probe) = (median(latencies.clone()), median(probes.clone()));
    eprintln!(
        "under the flood: forward p50 {fwd} ms {latencies:?}; /healthz p50 {probe} ms {probes:?}; \
         drain {elapsed} ms"
    );
}

/// Twenty SIGUSR1s to drainit under the flood, each waited for until the app
/// logs it (`flooding` checks the flood still runs); their latencies in ms.
fn forwards_under_flood(r: &Running, flooding: &mut dyn FnMut(&str)) -> Vec<u64> {
    let mut latencies = Vec::new();
    for i in 1..=20 {
        let sent = now_ms();
        // SAFETY: kill(2) with a pid this test started.
        assert_eq!(unsafe { libc::kill(r.pid, libc::SIGUSR1) }, 0);
        let seen = wait_for(secs(10), || {
            (r.count("app: got SIGUSR1") >= i).then_some(())
        });
        assert!(
            seen.is_some(),
            "SIGUSR1 #{i} not forwarded under the flood\n{}",
            r.stderr_text()
        );
        flooding(&format!("SIGUSR1 #{i} was forwarded"));
        let t: u64 = r.lines("app: got SIGUSR1")[i - 1]
            .rsplit_once(" t=")
            .unwrap()
            .1
            .parse()
            .unwrap();
        latencies.push(t.saturating_sub(sent));
        std::thread::sleep(Duration::from_millis(20));
    }
    latencies
}

/// Ten `/healthz` requests under the flood, each answered 200 (`flooding`
/// checks the flood still runs); their durations in ms.
fn probes_under_flood(port: u16, flooding: &mut dyn FnMut(&str)) -> Vec<u64> {
    let mut probes = Vec::new();
    for _ in 0..10 {
        let sent = std::time::Instant::now();
        let (code, _, body) = http(port, "/healthz", "GET");
        probes.push(sent.elapsed().as_millis() as u64);
        // The flooder's WATCHDOG=trigger and STATUS= were not taken.
        assert_eq!(code, 200, "{body}");
        flooding("a /healthz was answered");
    }
    probes
}

/// A setuid-root program: it takes every uid (so that its unprivileged parent may
/// no longer signal it), ignores SIGTERM and waits.
const ROOTED_C: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
    if (setresuid(0, 0, 0) != 0) return 1;
    signal(SIGTERM, SIG_IGN);
    FILE *f = fopen(getenv("MARK"), "a");
    if (!f) return 1;
    fprintf(f, "rooted: started pid=%d\n", getpid());
    fclose(f);
    for (;;) pause();
}
"#;

/// The unkillable outcome: drainit (here as an unprivileged user)
/// cannot SIGKILL a process that took root's uids (`EPERM`). It is reported
/// `unkillable`, not `abandoned` (it was not killed: it runs on), logged once,
/// and the drain is not clean (exit 2).
#[test]
fn a_process_drainit_may_not_signal_is_unkillable_not_abandoned() {
    let _serial = one_at_a_time();
    let build = TmpDir::new("rooted");
    let src = build.join("rooted.c");
    let bin = build.join("rooted");
    fs::write(&src, ROOTED_C).unwrap();
    let out = std::process::Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc (gcc) is needed to build the setuid fixture");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(build.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!("{} & exec sleep 30", bin.display());
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--user", "65534"],
        args: &[
            OFF,
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
        env: &[],
    });
    fs::set_permissions(&r.mark, fs::Permissions::from_mode(0o666)).unwrap();
    assert!(
        r.wait_mark("rooted: started", secs(10)),
        "{}",
        r.stderr_text()
    );
    let rooted: i64 = r.lines("rooted: started")[0]
        .rsplit_once("pid=")
        .unwrap()
        .1
        .trim()
        .parse()
        .unwrap();
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(10));
    let rep = r.report();
    let stderr = r.stderr_text();
    assert!(alive(rooted as i32), "the setuid process should still run");
    common::kill(rooted as i32, 9);
    assert_eq!(rc, 2, "{rep}\n{stderr}");
    assert_eq!(text(&rep, "reason"), "unkillable", "{rep}");
    assert_eq!(rep["abandoned"].as_array().unwrap().len(), 0, "{rep}");
    assert_eq!(num(&rep, "drain.abandoned"), 0, "{rep}");
    assert_eq!(num(&rep, "drain.unkillable"), 1, "{rep}");
    assert_eq!(rep["unkillable"][0]["pid"].as_i64(), Some(rooted), "{rep}");
    assert_eq!(rep["unkillable"][0]["comm"], "rooted", "{rep}");
    assert_eq!(
        stderr.matches("cannot kill").count(),
        1,
        "logged once:\n{stderr}"
    );
}
