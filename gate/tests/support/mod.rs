//! Shared by the drill's and the fleet gate's tests: where drainit and the fixtures
//! are, and the check that nothing a test started is still running.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The drainit the replicas run under: `DRAINIT_BIN` (scripts/test.sh sets it to
/// the static release build), else this workspace's debug build (built here when
/// missing, since a test of one package cannot name another's binary).
pub fn drainit() -> PathBuf {
    if let Some(b) = std::env::var_os("DRAINIT_BIN").filter(|b| !b.is_empty()) {
        return b.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("drainit");
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "drainit", "--bin", "drainit"])
            .current_dir(&root)
            .status()
            .expect("cargo runs");
        assert!(st.success(), "building drainit failed");
    });
    bin
}

pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A marker unique to one test, put in the environment of everything it starts.
pub fn marker(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// The pids (and command lines) of the processes whose environment holds
/// `DRILL_TEST_MARKER=marker`.
pub fn survivors(marker: &str) -> Vec<String> {
    let needle = format!("DRILL_TEST_MARKER={marker}");
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            // A zombie's cmdline is empty: it is not running.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
            {
                continue;
            }
            out.push(format!("{pid}: {cmd}"));
        }
    }
    out
}

/// Asserts nothing with `marker` in its environment is still running (waits a
/// little: a process SIGKILLed a moment ago may not be gone from /proc yet).
pub fn assert_nothing_left(marker: &str) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let left = survivors(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "still running after the drill: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub fn gate(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drainit-gate"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("drainit-gate runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One `GET path` (with `X-Request-Id: r-PATH`) on a new connection: the status
/// code (0: no answer) and the body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nX-Request-Id: r-{path}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

/// One replica: drainit with `--proxy` in front of tests/fixtures/drillapp.py,
/// on ports of its own.
pub struct Replica {
    pub child: Child,
    pub proxy: u16,
    pub probe: u16,
}

impl Replica {
    /// Starts one with `flags` added to drainit's, `env` added to
    /// `DRILL_TEST_MARKER=marker` and `DRAINIT_PRE_DRAIN_DELAY=0`, and returns
    /// once its `/readyz` answers 200 (20 s at most).
    pub fn start(marker: &str, flags: &[&str], env: &[(&str, &str)]) -> Replica {
        let (app, proxy, probe) = (free_port(), free_port(), free_port());
        let child = Command::new(drainit())
            .args([
                "--probe-addr",
                &format!("127.0.0.1:{probe}"),
                "--proxy",
                &format!("127.0.0.1:{proxy}=127.0.0.1:{app}"),
                "--ready-tcp",
                &format!("127.0.0.1:{app}"),
            ])
            .args(flags)
            .args(["--", "python3", &fixture("drillapp.py"), &app.to_string()])
            .env("DRILL_TEST_MARKER", marker)
            .env("DRAINIT_PRE_DRAIN_DELAY", "0")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("drainit starts");
        let until = Instant::now() + Duration::from_secs(20);
        while http_get(probe, "/readyz").0 != 200 {
            assert!(Instant::now() < until, "the replica never got ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        Replica {
            child,
            proxy,
            probe,
        }
    }

    /// SIGTERM, and its exit waited for.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
