//! drainit's stderr, black box: a stderr pipe that nobody reads (a stalled log
//! shipper) must never freeze drainit. Its log lines are dropped instead, the drain
//! still runs on time, and the exit waits at most a bounded time for the report.
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Bytes waiting in the pipe behind `fd` (FIONREAD).
fn pipe_bytes(fd: i32) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer, which points to `n`.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD failed");
    n
}

/// drainit with `args`, stderr as given, stdin and stdout on /dev/null, the
/// signal state a container runtime gives (`reset_glibc_signals`). The Command is
/// dropped at once: it would hold the parent's copy of a socket or pipe end.
fn start(
    tmp: &TmpDir,
    args: &[&str],
    env: &[(&str, &std::path::Path)],
    stderr: Stdio,
) -> std::process::Child {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .envs(env.iter().copied())
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    reset_glibc_signals(&mut cmd);
    cmd.spawn().unwrap()
}

#[test]
fn a_stderr_nobody_reads_never_freezes_the_drain() {
    let tmp = TmpDir::new("stuck-stderr");
    let probe = free_port();
    let probe_addr = format!("127.0.0.1:{probe}");
    let mut drainit = start(
        &tmp,
        &[
            "--probe-addr",
            &probe_addr,
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            // More than a pipe holds (64 KiB), from a grandchild that then blocks
            // in its write; the main child is `sleep`, which TERM ends.
            "head -c 70000 /dev/zero >&2 & exec sleep 99",
        ],
        &[],
        Stdio::piped(),
    );
    // Held open and never read, until the end of the test.
    let stderr = drainit.stderr.take().unwrap();
    let pid = drainit.id() as i32;
    let _guard = Guard(tmp.path().to_path_buf());

    // Wait until the pipe is full: its fill level stops growing.
    let mut last = -1;
    let full = wait_for(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(100));
        let n = pipe_bytes(stderr.as_raw_fd());
        let stable = n == last && n >= 4096;
        last = n;
        stable.then_some(n)
    });
    assert!(
        full.is_some(),
        "the stderr pipe never filled up ({last} bytes)"
    );

    let t0 = Instant::now();
    assert!(kill(pid, libc::SIGTERM), "could not signal drainit");
    let status = wait_for(Duration::from_secs(10), || drainit.try_wait().unwrap());
    let Some(status) = status else {
        let _ = drainit.kill();
        let _ = drainit.wait();
        panic!("drainit did not exit within 10 s of SIGTERM with a stuck stderr");
    };
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}");
    // The drain itself is immediate; the report may wait up to 2 s for stderr.
    assert!(took < Duration::from_secs(6), "exit took {took:?}");
    drop(stderr);
}

/// SIGKILLs whatever the test started (the blocked `head`), on every exit path.
struct Guard(std::path::PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        kill_marked(&self.0);
    }
}

/// The `flags:` of `/proc/PID/fdinfo/FD`, octal.
fn fd_flags(pid: i32, fd: i32) -> u32 {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .unwrap()
        .trim();
    u32::from_str_radix(flags, 8).unwrap()
}

/// With stderr a pipe that is read (the container default), drainit writes its
/// lines itself through a non-blocking description of its own: no writer thread,
/// and the fd 2 it shares with the child stays blocking (O_NONBLOCK there would
/// hand the app EAGAIN). Every line arrives, in order, the report last.
#[test]
fn a_stderr_pipe_that_keeps_up_needs_no_writer_thread() {
    let tmp = TmpDir::new("pipe-stderr");
    let args = [
        "--probe-addr",
        "off",
        "--pre-drain-delay",
        "0s",
        "--",
        "sleep",
        "30",
    ];
    let mut drainit = start(&tmp, &args, &[], Stdio::piped());
    let _guard = Guard(tmp.path().to_path_buf());
    let pid = drainit.id() as i32;
    let stderr = drainit.stderr.take().unwrap();
    // Reads every line as it comes; says when the "started" line has.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
            let line = line.unwrap();
            if line.contains("started sleep") {
                let _ = started_tx.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let child = wait_for(Duration::from_secs(5), || {
        let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        kids.split_whitespace().next()?.parse::<i32>().ok()
    })
    .expect("drainit started no child");
    // The "started" line has been written (it comes right after the spawn).
    started_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("no \"started\" line");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    assert_eq!(
        threads, 1,
        "drainit started a thread for a stderr that keeps up"
    );
    assert_eq!(
        fd_flags(pid, 2) & libc::O_NONBLOCK as u32,
        0,
        "drainit's fd 2"
    );
    assert_eq!(
        fd_flags(child, 2) & libc::O_NONBLOCK as u32,
        0,
        "the child's fd 2"
    );

    assert!(kill(pid, libc::SIGTERM), "could not signal drainit");
    let status = wait_for(Duration::from_secs(10), || drainit.try_wait().unwrap())
        .expect("drainit did not exit");
    assert_eq!(status.code(), Some(0));
    let text = reader.join().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("grace budget"), "{text}");
    assert!(lines[1].contains("started sleep"), "{text}");
    assert!(
        lines.last().unwrap().starts_with("{\"drainit\":\"exit\""),
        "{text}"
    );
}

/// With stderr a socket (journald's stream, `systemd-cat`) every line goes through
/// the writer thread, and creating a thread makes the C library unblock the signals
/// it keeps for itself (glibc 32 and 33; musl 33 and 34). drainit blocks them again:
/// 32 and 33 are still dropped, not fatal, and 34 (glibc's SIGRTMIN) still reaches
/// the app.
#[test]
fn with_a_writer_thread_the_c_librarys_signals_stay_blocked() {
    let tmp = TmpDir::new("socket-stderr");
    let mark = tmp.join("marks");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let sigapp = fixture("sigapp.py");
    let args = [
        "--probe-addr",
        "off",
        "--pre-drain-delay",
        "0s",
        "--",
        python(),
        &sigapp,
    ];
    let mut drainit = start(
        &tmp,
        &args,
        &[("MARK", mark.as_path())],
        Stdio::from(std::os::fd::OwnedFd::from(theirs)),
    );
    let _guard = Guard(tmp.path().to_path_buf());
    let pid = drainit.id() as i32;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut &ours, &mut text);
        text
    });
    let marks = || std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(5), || marks()
            .contains("app: started")
            .then_some(()))
        .is_some(),
        "the app never started"
    );
    // The writer thread exists (a socket cannot be written to directly).
    let threads = wait_for(Duration::from_secs(5), || {
        let n = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.count();
        (n > 1).then_some(n)
    });
    assert!(threads.is_some(), "no writer thread for a socket stderr");
    for sig in [32, 33, 34] {
        assert!(kill(pid, sig), "drainit is gone before signal {sig}");
    }
    assert!(
        wait_for(Duration::from_secs(5), || marks()
            .contains("app: got SIGRTMIN+0")
            .then_some(()))
        .is_some(),
        "34 never reached the app: {}",
        marks()
    );
    assert!(kill(pid, libc::SIGTERM), "drainit died of signal 32 or 33");
    let status = wait_for(Duration::from_secs(10), || drainit.try_wait().unwrap())
        .expect("drainit did not exit");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let log = reader.join().unwrap();
    assert!(
        log.contains("ignored signal 32") && log.contains("ignored signal 33"),
        "{log}"
    );
}

/// A process's `comm` is any 15 bytes the process chose (`prctl(PR_SET_NAME)`), and
/// drainit names processes in its log lines (the progress line, the abandoned
/// warning): an app that names itself `\n<0>drainit…` made drainit write a
/// line of its own that read as drainit's, with a journald priority of the app's
/// choice, and an escape sequence reached the operator's terminal. Each text line
/// stays one line, its control characters escaped; the report keeps the name as is
/// (JSON escapes it).
#[test]
fn a_process_name_with_a_newline_cannot_forge_a_log_line() {
    let app = "import ctypes, signal, time\n\
               signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
               ctypes.CDLL(None).prctl(15, b'\\n<0>drainit\\x1b[2J', 0, 0, 0)\n\
               open('$TMP/named', 'w').close()\n\
               time.sleep(30)\n";
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            OFF,
            "--pre-drain-delay=0s",
            "--drain-timeout=1200ms",
            "--",
            python(),
            "-c",
            app,
        ],
    );
    assert!(
        wait_until(secs(10), || r.path("named").exists()),
        "{}",
        r.stderr_text()
    );
    r.signal(15);
    assert_eq!(r.wait(secs(10)).0, 2, "{}", r.stderr_text());
    let text = r.stderr_text();
    for line in text.lines() {
        assert!(
            line.starts_with("drainit: ") || line.starts_with('{'),
            "a line drainit did not write:\n{text}"
        );
        assert!(
            !line.contains('\u{1b}'),
            "an escape reached stderr:\n{text}"
        );
    }
    assert!(
        text.contains(r"(\n<0>drainit\u{1b}[2J)"),
        "the name is not shown escaped:\n{text}"
    );
    let rep = r.report();
    assert_eq!(
        rep["abandoned"][0]["comm"], "\n<0>drainit\u{1b}[2J",
        "{rep}"
    );
}
