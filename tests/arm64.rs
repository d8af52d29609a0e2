//! The arm64 (aarch64) static build, smoke-tested: what a user of the arm64 binary
//! relies on first — it is static and stripped, exit codes are passed on, a signal
//! is forwarded, orphans are reaped, a drain forwards SIGTERM and reports, and
//! `--probe readyz` asks the probe server — not a second copy of the x86_64 suite.
//!
//! Runs when `DRAINIT_ARM64_BIN` names the binary (scripts/test.sh builds it with
//! release.sh's flags and sets it); otherwise each test says it skipped. On an
//! x86_64 machine drainit runs under qemu-user (`qemu-aarch64-static`, Debian
//! `qemu-user-static`, or `qemu-aarch64`, Debian `qemu-user`;
//! `DRAINIT_ARM64_RUNNER` names another), on an arm64 machine natively. The apps
//! it starts are the host's own programs: only drainit is emulated, its system
//! calls are the host kernel's.
//!
//! What emulation cannot run:
//! - reaping as a child subreaper: qemu-user refuses `PR_SET_CHILD_SUBREAPER`
//!   (EINVAL), drainit warns and goes on. Reaping is checked as the PID 1 of a PID
//!   namespace (where orphans come to drainit without it), as a subreaper only
//!   natively; `orphans_are_reaped` says so on stderr (scripts/test.sh shows it);
//! - the start-up window under ptrace (tests/startup.rs): qemu-user has no ptrace
//!   of the emulated process;
//! - timing: figures under emulation are qemu's (bench/README.md measures them and
//!   says so), so the deadlines here are loose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// How to run the arm64 drainit: `[runner, binary]` under emulation, `[binary]` on an
/// arm64 machine; `None` (the test skips) when `DRAINIT_ARM64_BIN` is unset.
fn arm64(test: &str) -> Option<Vec<String>> {
    let Some(bin) = std::env::var("DRAINIT_ARM64_BIN")
        .ok()
        .filter(|b| !b.is_empty())
    else {
        eprintln!("{test}: DRAINIT_ARM64_BIN is unset (scripts/test.sh sets it): skipped");
        return None;
    };
    if std::env::consts::ARCH == "aarch64" {
        return Some(vec![bin]);
    }
    // qemu-user's static build (Debian qemu-user-static), else its other name
    // (Debian qemu-user: the same emulator).
    let runner = std::env::var("DRAINIT_ARM64_RUNNER").unwrap_or_else(|_| {
        let path = std::env::var("PATH").unwrap_or_default();
        ["qemu-aarch64-static", "qemu-aarch64"]
            .into_iter()
            .find(|name| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
            .expect("DRAINIT_ARM64_BIN is set, but no qemu-aarch64-static or qemu-aarch64 on PATH")
            .to_string()
    });
    Some(vec![runner, bin])
}

fn emulated(program: &[String]) -> bool {
    program.len() > 1
}

/// Starts the arm64 drainit with `args` in `mode` (tests/common's launcher: default
/// dispositions, an empty mask, stdio and the report in a temporary folder).
fn start(program: &[String], mode: Mode, args: &[&str]) -> Running {
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    Running::start_program(
        Start {
            mode,
            launch: &[],
            args,
            env: &[],
        },
        &program,
    )
}

/// Runs the arm64 drainit once as a client (`--probe …`): its exit code.
fn run(program: &[String], args: &[&str]) -> i32 {
    let mut child = Command::new(&program[0])
        .args(&program[1..])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_for(secs(20), || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{program:?} {args:?} still running after 20 s")
    });
    status.code().unwrap_or(-1)
}

#[test]
fn the_arm64_build_is_a_static_stripped_aarch64_executable_with_its_hot_code_first() {
    let Some(program) = arm64("static and stripped") else {
        return;
    };
    // hot-text.ld (build.rs, for every musl target): its patterns are symbol names,
    // the same on both architectures, so the arm64 build gets its hot section too.
    let header = assert_shipped_build(program.last().unwrap());
    assert!(header.contains("AArch64"), "{header}");
}

#[test]
fn exit_codes_are_passed_on() {
    let Some(program) = arm64("exit codes") else {
        return;
    };
    for (app, want) in [
        ("exit 3", 3),
        ("kill -KILL $$", 128 + libc::SIGKILL),
        ("exec /nonexistent/app", 127),
    ] {
        for mode in BOTH {
            let mut r = start(&program, mode, &[OFF, "--", "sh", "-c", app]);
            let (rc, _) = r.wait(secs(20));
            assert_eq!(rc, want, "{mode:?} `{app}`:\n{}", r.stderr_text());
            assert_eq!(num(&r.report(), "exit_code"), i64::from(want));
        }
    }
}

#[test]
fn a_signal_sent_to_drainit_reaches_the_child() {
    let Some(program) = arm64("forwarded signal") else {
        return;
    };
    for mode in BOTH {
        let app = sigapp("app", &["CLEANUP=0.1"]);
        let mut r = start(&program, mode, &cmd(&[OFF], &app));
        r.wait_started(&["app"]);
        for (sig, name) in [(libc::SIGHUP, "SIGHUP"), (libc::SIGUSR1, "SIGUSR1")] {
            r.signal(sig);
            assert!(
                r.wait_mark(&format!("app: got {name}"), secs(10)),
                "{mode:?}: the child never got {name}\n{}",
                r.stderr_text()
            );
        }
        r.signal(libc::SIGTERM);
        let (rc, _) = r.wait(secs(20));
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
    }
}

/// The app leaves an orphan (a grandchild whose parent exited) and exits only once
/// the orphan's /proc entry is gone, that is, once it was reaped: a drainit that
/// does not reap never lets it exit.
#[test]
fn orphans_are_reaped() {
    let Some(program) = arm64("reaping") else {
        return;
    };
    let app = "(sleep 0.3 & echo $! >\"$TMP/orphan\"); \
               while [ -e /proc/$(cat \"$TMP/orphan\") ]; do sleep 0.05; done";
    for mode in BOTH {
        if mode == Mode::Subreaper && emulated(&program) {
            // The orphan would go to this machine's init, not to drainit: only the
            // warning is checked.
            let mut r = start(&program, mode, &[OFF, "--", "true"]);
            let (rc, _) = r.wait(secs(20));
            let stderr = r.stderr_text();
            assert_eq!(rc, 0, "{stderr}");
            assert!(
                stderr.contains("becoming a child subreaper failed: EINVAL"),
                "{stderr}"
            );
            eprintln!(
                "orphans_are_reaped: NOT RUN under emulation: reaping as a child \
                 subreaper (qemu-user refuses PR_SET_CHILD_SUBREAPER with EINVAL; \
                 drainit warned and went on). Checked as PID 1 only."
            );
            continue;
        }
        let mut r = start(&program, mode, &[OFF, "--", "sh", "-c", app]);
        let (rc, _) = r.wait(secs(20));
        let stderr = r.stderr_text();
        assert_eq!(rc, 0, "{mode:?}: {stderr}");
        assert!(!stderr.contains("subreaper failed"), "{mode:?}: {stderr}");
        assert_eq!(num(&r.report(), "orphans_reaped"), 1, "{mode:?}: {stderr}");
    }
}

#[test]
fn a_drain_forwards_sigterm_once_and_reports_drained_or_abandoned() {
    let Some(program) = arm64("drain") else {
        return;
    };
    // An app that finishes its cleanup: drained, exit 0.
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let flags = [OFF, "--pre-drain-delay", "300ms", "--drain-timeout", "5s"];
    let mut r = start(&program, Mode::Pid1, &cmd(&flags, &app));
    let (rc, _) = r.stop_after_start(&["app"], secs(20));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert_eq!(r.count("app: got SIGTERM"), 1);
    let dt = r.mark_t("app: got SIGTERM").unwrap() as i64 - r.t0 as i64;
    assert!(dt >= 300, "the child got SIGTERM {dt} ms after drainit did");
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "drained");
    assert_eq!(
        (
            num(&rep, "drain.in_flight_at_start"),
            num(&rep, "drain.completed")
        ),
        (1, 1)
    );

    // An app that ignores it: killed at the drain timeout, abandoned, exit 2.
    let app = sigapp("app", &["STUBBORN=1"]);
    let flags = [OFF, "--pre-drain-delay", "0s", "--drain-timeout", "1s"];
    let mut r = start(&program, Mode::Pid1, &cmd(&flags, &app));
    let (rc, elapsed) = r.stop_after_start(&["app"], secs(20));
    assert_eq!(rc, 2, "{}", r.stderr_text());
    assert!(elapsed >= 1000, "killed {elapsed} ms after SIGTERM");
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "abandoned");
    assert_eq!(num(&rep, "drain.abandoned"), 1);
}

#[test]
fn probe_readyz_asks_the_arm64_probe_server() {
    let Some(program) = arm64("--probe readyz") else {
        return;
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let flags = [
        "--probe-addr",
        &addr,
        "--pre-drain-delay",
        "3s",
        "--drain-timeout",
        "5s",
    ];
    let mut r = start(&program, Mode::Pid1, &cmd(&flags, &app));
    let probe = ["--probe", "readyz", "--probe-addr", &addr];
    assert!(
        wait_until(secs(20), || run(&program, &probe) == 0),
        "--probe readyz never exited 0\n{}",
        r.stderr_text()
    );
    r.signal(libc::SIGTERM);
    let sent = Instant::now();
    // Beat 1: /readyz fails at once; the client says so with exit 1.
    assert!(
        wait_until(secs(3), || run(&program, &probe) == 1),
        "--probe readyz still 0 after SIGTERM\n{}",
        r.stderr_text()
    );
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "readiness failed only after the pre-drain delay"
    );
    let (rc, _) = r.wait(secs(20));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert_eq!(text(&r.report(), "reason"), "drained");
    // Nothing listening: 1.
    let closed = format!("127.0.0.1:{}", free_port());
    assert_eq!(
        run(&program, &["--probe", "readyz", "--probe-addr", &closed]),
        1
    );
}
