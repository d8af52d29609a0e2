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

#[test]
fn a_stderr_nobody_reads_never_freezes_the_drain() {
    let tmp = TmpDir::new("stuck-stderr");
    let probe = free_port();
    let probe_addr = format!("127.0.0.1:{probe}");
    let mut cmd = Command::new(bin());
    cmd.args([
        "--probe-addr",
        &probe_addr,
        "--pre-drain-delay",
        "0s",
        "--drain-timeout",
        "1s",
        "--",
        "sh",
        "-c",
        // More than a pipe holds (64 KiB), from a grandchild that then blocks in
        // its write; the main child is `sleep`, which TERM ends.
        "head -c 70000 /dev/zero >&2 & exec sleep 99",
    ])
    .env("DRAINIT_TEST_TMP", tmp.path())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    reset_glibc_signals(&mut cmd);
    let mut drainit = cmd.spawn().unwrap();
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
