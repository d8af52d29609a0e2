//! Bad input, black box: what the environment, the config file and its values can
//! hold that drainit must refuse at start (78, naming the variable, path or key),
//! before anything is started.
//!
//! - a `DRAINIT_*` variable (or `*_MS`) whose value is not UTF-8;
//! - `--config` naming what is not a regular file of at most 1 MiB: a FIFO (which
//!   would block the open), `/dev/zero` (which would grow drainit without bound),
//!   a directory, a 2 MiB file;
//! - a NUL byte in `report_file`, a teardown command or an exec check (it could
//!   not reach the kernel, and used to fail only at exit);
//! - a probe address explicitly given and taken: the message names where it was
//!   given (`--probe-addr`, `DRAINIT_PROBE_ADDR`, the file's line);
//!   one with port 0 (a port nobody is told);
//! - a zero timeout for checks or teardown steps (flag, variable, file key).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Out {
    code: i32,
    stderr: String,
}

/// Runs drainit with `args` and `env` (raw bytes), its command `touch $TMP/started`
/// appended; waits at most 10 s (SIGKILL, then panic). Asserts the command never
/// started.
fn run(tmp: &TmpDir, args: &[&str], env: &[(&str, &[u8])]) -> Out {
    let started = tmp.join("started");
    let stderr = tmp.join("stderr");
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .args(["--", "touch"])
        .arg(&started)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap());
    for (k, v) in env {
        cmd.env(k, OsStr::from_bytes(v));
    }
    let mut child = cmd.spawn().unwrap();
    let status = wait_child(
        &mut child,
        Duration::from_secs(10),
        Duration::from_millis(10),
        tmp.path(),
        &format!("drainit {args:?}"),
    );
    // drainit exited: it leaves nothing running, so no `kill_marked` here.
    let stderr = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(
        !started.exists(),
        "the command was started on bad input {args:?}:\n{stderr}"
    );
    Out {
        code: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        stderr,
    }
}

#[test]
fn non_utf8_environment_values_are_78_and_name_the_variable() {
    let tmp = TmpDir::new("nonutf8");
    // Lists (split by drainit), values clap reads, switches, plain milliseconds.
    for var in [
        "DRAINIT_DRAIN_SIGNAL",
        "DRAINIT_READY_TCP",
        "DRAINIT_TEARDOWN",
        "DRAINIT_REWRITE",
        "DRAINIT_PROBE_ADDR",
        "DRAINIT_PRE_DRAIN_DELAY",
        "DRAINIT_LOG_LEVEL",
        "DRAINIT_REPORT_FILE",
        "DRAINIT_STRICT_BUDGET",
        "PRE_DRAIN_DELAY_MS",
        "DRAIN_TIMEOUT_MS",
    ] {
        let o = run(&tmp, &[OFF], &[(var, b"5\xffs")]);
        assert_eq!(o.code, 78, "{var}: {}", o.stderr);
        assert!(
            o.stderr.contains(var) && o.stderr.contains("UTF-8"),
            "{var}: {}",
            o.stderr
        );
    }
    // Even when a flag overrides it: the environment is broken either way.
    let o = run(
        &tmp,
        &[OFF, "--drain-timeout", "1s"],
        &[("DRAINIT_DRAIN_TIMEOUT", b"\xfe")],
    );
    assert_eq!(o.code, 78, "{}", o.stderr);
    assert!(o.stderr.contains("DRAINIT_DRAIN_TIMEOUT"), "{}", o.stderr);
}

#[test]
fn config_must_be_a_regular_file_of_at_most_1_mib() {
    let tmp = TmpDir::new("cfgkind");
    let fifo = tmp.join("fifo.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = tmp.join("big.toml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 * 1024 * 1024))).unwrap();
    let dir = tmp.path().to_str().unwrap().to_string();
    for (path, why) in [
        (fifo.to_str().unwrap(), "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (dir.as_str(), "not a regular file"),
        (big.to_str().unwrap(), "larger than 1024 KiB"),
    ] {
        let started = Instant::now();
        let o = run(&tmp, &[OFF, "--config", path], &[]);
        assert_eq!(o.code, 78, "{path}: {}", o.stderr);
        assert!(
            o.stderr.contains(path) && o.stderr.contains(why),
            "{path}: {}",
            o.stderr
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{path}");
        // The same through DRAINIT_CONFIG.
        let o = run(&tmp, &[OFF], &[("DRAINIT_CONFIG", path.as_bytes())]);
        assert_eq!(o.code, 78, "DRAINIT_CONFIG={path}: {}", o.stderr);
    }
    // Just under the bound is read (a comment, then a real key).
    let ok = tmp.join("ok.toml");
    std::fs::write(
        &ok,
        format!("# {}\ndrain_timeout = \"3s\"\n", "x".repeat(1000 * 1024)),
    )
    .unwrap();
    let out = Command::new(bin())
        .args([OFF, "--check-config", "--config", ok.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("drain_timeout = \"3s\""));
}

#[test]
fn nul_bytes_in_the_file_are_refused_at_start() {
    let tmp = TmpDir::new("nul");
    let report_dir = tmp.path().to_str().unwrap().to_string();
    for (text, want) in [
        (
            format!("report_file = \"{report_dir}/r\\u0000.json\"\n"),
            ":1:15: invalid value for key `report_file`",
        ),
        (
            "[[teardown]]\ncommand = [\"echo\", \"a\\u0000b\"]\n".to_string(),
            ":1:1: [[teardown]] #1: command:",
        ),
        (
            "[[check]]\nexec = [\"tr\\u0000ue\"]\n".to_string(),
            ":1:1: [[check]] #1: exec:",
        ),
        (
            "[[check]]\nfile = \"/tmp/a\\u0000\"\n".to_string(),
            "invalid value for key `file`",
        ),
    ] {
        let p = tmp.join("nul.toml");
        std::fs::write(&p, &text).unwrap();
        let o = run(&tmp, &[OFF, "--config", p.to_str().unwrap()], &[]);
        assert_eq!(o.code, 78, "{text}: {}", o.stderr);
        assert!(
            o.stderr.contains(want) && o.stderr.contains("NUL byte"),
            "{text}: {}",
            o.stderr
        );
        assert!(
            !o.stderr.contains('\0'),
            "the message carries the NUL itself"
        );
    }
}

/// A taken probe or proxy address names where it was given: the flag, the
/// variable, or the file's line and column, not a flag the user never typed.
#[test]
fn a_taken_probe_or_proxy_address_names_the_flag_the_variable_or_the_file() {
    let tmp = TmpDir::new("taken-addr");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let proxy = format!("{addr}=127.0.0.1:1");
    let file = tmp.join("drainit.toml");
    let cfg = file.to_str().unwrap();
    // (flag, variable, file key, value, other flags)
    let rows: [(&str, &str, &str, &str, &[&str]); 2] = [
        (
            "--probe-addr",
            "DRAINIT_PROBE_ADDR",
            "probe_addr",
            &addr,
            &[],
        ),
        ("--proxy", "DRAINIT_PROXY", "proxy", &proxy, &[OFF]),
    ];
    for (flag, var, key, value, other) in rows {
        let named = |o: &Out, by: &str| {
            assert_eq!(o.code, 78, "{flag}: {}", o.stderr);
            assert!(
                o.stderr.contains(&format!("{addr} ({by}) failed")),
                "{flag}: {}",
                o.stderr
            );
        };
        fn with<'a>(other: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
            [other, more].concat()
        }
        named(&run(&tmp, &with(other, &[flag, value]), &[]), flag);
        named(
            &run(&tmp, &with(other, &[]), &[(var, value.as_bytes())]),
            var,
        );
        std::fs::write(&file, format!("\n{key} = \"{value}\"\n")).unwrap();
        let col = key.len() + 4;
        named(
            &run(&tmp, &with(other, &["--config", cfg]), &[]),
            &format!("{cfg}:2:{col}"),
        );
    }
}

#[test]
fn a_taken_probe_address_names_the_flag() {
    let tmp = TmpDir::new("probeaddr");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = run(&tmp, &["--probe-addr", &addr], &[]);
    assert_eq!(o.code, 78, "{}", o.stderr);
    assert!(
        o.stderr.contains("--probe-addr") && o.stderr.contains(&addr),
        "{}",
        o.stderr
    );
}

/// A probe address with port 0 is refused before the start (64 on the command line,
/// 78 from the environment or file), as `--proxy` and `--ready-tcp` refuse it: it
/// was bound to a port the kernel picked and nobody was told, so no platform probe
/// and no `drainit --probe` could ever reach it.
#[test]
fn a_probe_address_with_port_0_is_refused() {
    let tmp = TmpDir::new("probeaddr0");
    for addr in ["127.0.0.1:0", "0.0.0.0:0", "[::]:0"] {
        let o = run(&tmp, &["--probe-addr", addr], &[]);
        assert_eq!(o.code, 64, "{addr}: {}", o.stderr);
        assert!(
            o.stderr.contains("--probe-addr") && o.stderr.contains("no valid port"),
            "{}",
            o.stderr
        );
    }
    let o = run(&tmp, &[], &[("DRAINIT_PROBE_ADDR", b"0.0.0.0:0")]);
    assert_eq!(o.code, 78, "{}", o.stderr);
    assert!(o.stderr.contains("DRAINIT_PROBE_ADDR"), "{}", o.stderr);
}

/// A zero timeout for a check or a teardown step is refused at start, naming where
/// it was given: a teardown step with `0s` was "timed out after 0s" at exit (exit 2
/// on every clean drain), and a check with one passed or failed by a race with the
/// timer.
#[test]
fn a_zero_check_or_teardown_timeout_is_refused_at_start() {
    let tmp = TmpDir::new("zero-timeout");
    for flag in ["--teardown-timeout", "--check-timeout"] {
        for zero in ["0", "0s", "0ms"] {
            let out = run(&tmp, &["--probe-addr=off", flag, zero], &[]);
            assert_eq!(out.code, 64, "{flag} {zero}: {}", out.stderr);
            assert!(
                out.stderr.contains(flag) && out.stderr.contains("greater than 0"),
                "{}",
                out.stderr
            );
        }
    }
    for var in ["DRAINIT_TEARDOWN_TIMEOUT", "DRAINIT_CHECK_TIMEOUT"] {
        let out = run(&tmp, &["--probe-addr=off"], &[(var, b"0s")]);
        assert_eq!(out.code, 78, "{var}: {}", out.stderr);
        assert!(out.stderr.contains(var), "{}", out.stderr);
    }
    for (file, at) in [
        (
            "[[teardown]]\ncommand = [\"true\"]\ntimeout = \"0s\"\n",
            ":3:11",
        ),
        ("[[check]]\nfile = \"/\"\ntimeout = \"0ms\"\n", ":3:11"),
        ("teardown_timeout = \"0s\"\n", ":1:20"),
    ] {
        let path = tmp.join("zero.toml");
        std::fs::write(&path, file).unwrap();
        let out = run(
            &tmp,
            &["--probe-addr=off", "--config", path.to_str().unwrap()],
            &[],
        );
        assert_eq!(out.code, 78, "{file}: {}", out.stderr);
        assert!(
            out.stderr.contains(at) && out.stderr.contains("greater than 0"),
            "{file}: {}",
            out.stderr
        );
    }
}
