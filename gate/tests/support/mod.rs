//! Shared by the drill's and the fleet gate's tests: where drainit and the fixtures
//! are, and the check that nothing a test started is still running.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

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
