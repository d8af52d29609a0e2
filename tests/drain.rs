//! The drain, black box: the three beats, the deadline, the second signal,
//! teardown, exit codes 0/2 and the exit report, against real processes, as PID 1
//! and as a subreaper. Durations are short (pre-drain 200–300 ms, drain ~1–2 s);
//! lower bounds are tight, upper bounds loose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// (status, body) of a GET.
fn get(port: u16, path: &str) -> (u16, String) {
    let (st, _, body) = http(port, path, "GET");
    (st, body)
}

#[test]
fn readyz_fails_at_once_healthz_stays_and_the_app_keeps_serving_through_the_delay() {
    for mode in BOTH {
        let [app_port, probe_port] = free_ports();
        let probe = format!("127.0.0.1:{probe_port}");
        let ready = format!("127.0.0.1:{app_port}");
        let server = vec![
            python().to_string(),
            fixture("server.py"),
            app_port.to_string(),
        ];
        let flags = [
            "--probe-addr",
            &probe,
            "--ready-tcp",
            &ready,
            "--pre-drain-delay",
            "1s",
            "--drain-timeout",
            "3s",
        ];
        let mut r = Running::start(mode, &cmd(&flags, &server));
        wait_for(secs(10), || {
            (get(probe_port, "/readyz").0 == 200).then_some(())
        })
        .unwrap_or_else(|| panic!("{mode:?}: never ready: {}", r.stderr_text()));
        assert_eq!(get(app_port, "/").0, 200);
        r.signal(libc::SIGTERM);
        let sent = Instant::now();
        let flipped = wait_for(secs(2), || {
            (get(probe_port, "/readyz").0 == 503).then(|| sent.elapsed())
        })
        .unwrap();
        // At T0 (beat 1), not at the forward one pre-drain delay (1 s) later.
        assert!(
            flipped < Duration::from_secs(1),
            "{mode:?}: /readyz flipped after {flipped:?}, not before the pre-drain delay ended"
        );
        let (st, body) = get(probe_port, "/readyz");
        assert_eq!((st, body.as_str()), (503, r#"{"status":"draining"}"#));
        // Beat 2: the app still serves, liveness stays green.
        let mut served = 0;
        while sent.elapsed() < Duration::from_millis(800) {
            assert_eq!(
                get(app_port, "/").0,
                200,
                "{mode:?}: the app stopped serving inside the pre-drain delay"
            );
            assert_eq!(
                get(probe_port, "/healthz").0,
                200,
                "{mode:?}: liveness failed during the drain"
            );
            served += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(served > 5);
        let (rc, elapsed) = r.wait(secs(8));
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
        assert!(
            elapsed >= 1000,
            "{mode:?}: exited {elapsed} ms after SIGTERM, inside the delay"
        );
        assert!(
            elapsed < 3500,
            "{mode:?}: exited {elapsed} ms after SIGTERM: the timeout is a limit, not a sleep"
        );
        let rep = r.report();
        assert_eq!(text(&rep, "reason"), "drained");
        assert!(num(&rep, "drain.forwarded_at_ms") >= 1000);
        assert_eq!(num(&rep, "drain.deadline_ms"), 4000);
    }
}

#[test]
fn the_child_gets_the_signal_no_earlier_than_the_delay_and_exactly_once() {
    for mode in BOTH {
        let app = sigapp("app", &["CLEANUP=0.1"]);
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "300ms", "--drain-timeout", "3s"],
                &app,
            ),
        );
        let (rc, _) = r.stop_after_start(&["app"], secs(6));
        assert_eq!(rc, 0);
        let dt = r.mark_t("app: got SIGTERM").unwrap() as i64 - r.t0 as i64;
        assert!(
            dt >= 300,
            "{mode:?}: the child got SIGTERM {dt} ms after drainit did"
        );
        assert_eq!(r.count("app: got SIGTERM"), 1);
        let rep = r.report();
        assert_eq!(
            (
                num(&rep, "drain.in_flight_at_start"),
                num(&rep, "drain.completed")
            ),
            (1, 1)
        );
        assert_eq!(num(&rep, "drain.pre_drain_delay_ms"), 300);
    }
}

#[test]
fn a_signal_before_readiness_skips_the_delay() {
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[
                OFF,
                "--ready-file",
                "/nonexistent/ready",
                "--pre-drain-delay",
                "5s",
                "--drain-timeout",
                "3s",
            ],
            &app,
        ),
    );
    let (rc, elapsed) = r.stop_after_start(&["app"], secs(4));
    assert_eq!(rc, 0);
    assert!(
        elapsed < 2000,
        "never routed to: no pre-drain delay ({elapsed} ms)"
    );
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 0);
}

#[test]
fn an_app_ignoring_term_is_killed_at_the_deadline_and_reported_abandoned() {
    for mode in BOTH {
        let app = sigapp("app", &["STUBBORN=1"]);
        let mut r = Running::start(
            mode,
            &cmd(
                &[
                    OFF,
                    "--pre-drain-delay",
                    "200ms",
                    "--drain-timeout",
                    "1s",
                    "--report-file",
                    "$TMP/report.json",
                ],
                &app,
            ),
        );
        let (rc, elapsed) = r.stop_after_start(&["app"], secs(6));
        assert_eq!(rc, 2, "{mode:?}");
        assert!(
            elapsed >= 1200,
            "{mode:?}: killed {elapsed} ms after SIGTERM, before the deadline"
        );
        assert!(elapsed < 3500, "{mode:?}: {elapsed} ms");
        let rep = r.report();
        assert_eq!(text(&rep, "reason"), "abandoned");
        assert_eq!(num(&rep, "drain.abandoned"), 1);
        assert_eq!(num(&rep, "drain.completed"), 0);
        let ab = &rep["abandoned"][0];
        assert_eq!(ab["pid"].to_string(), r.field("app", "pid").unwrap());
        assert_eq!(
            ab["comm"].as_str().unwrap(),
            r.field("app", "comm").unwrap()
        );
        assert!(
            ab.get("cmdline").is_none() && ab.as_object().unwrap().len() == 2,
            "pid and comm only"
        );
        let file: Value =
            serde_json::from_str(&std::fs::read_to_string(r.path("report.json")).unwrap()).unwrap();
        assert_eq!(file, rep, "--report-file holds the same report");
    }
}

#[test]
fn a_second_signal_in_beat_two_forwards_now_and_in_beat_three_kills_now() {
    // Beat 2.
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[OFF, "--pre-drain-delay", "5s", "--drain-timeout", "5s"],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    r.signal(libc::SIGTERM);
    let (rc, elapsed) = r.wait(secs(4));
    assert_eq!(rc, 0);
    assert!(
        elapsed < 2000,
        "the second signal forwarded at once ({elapsed} ms)"
    );
    assert_eq!(r.count("app: got SIGTERM"), 1);
    // Beat 3.
    let app = sigapp("app", &["STUBBORN=1"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[OFF, "--pre-drain-delay", "100ms", "--drain-timeout", "10s"],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert!(r.wait_mark("app: got SIGTERM", secs(3)));
    r.signal(libc::SIGINT);
    let (rc, elapsed) = r.wait(secs(4));
    assert_eq!(rc, 2);
    assert!(
        elapsed < 1500,
        "the second signal killed at once ({elapsed} ms)"
    );
    assert_eq!(text(&r.report(), "reason"), "abandoned");
}

#[test]
fn second_signal_ignore_keeps_the_timeline() {
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start(
        Mode::Subreaper,
        &cmd(
            &[
                OFF,
                "--second-signal",
                "ignore",
                "--pre-drain-delay",
                "800ms",
                "--drain-timeout",
                "3s",
            ],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    let t0 = r.t0;
    std::thread::sleep(Duration::from_millis(200));
    r.signal(libc::SIGTERM);
    r.t0 = t0;
    let (rc, _) = r.wait(secs(6));
    assert_eq!(rc, 0);
    let dt = r.mark_t("app: got SIGTERM").unwrap() as i64 - t0 as i64;
    assert!(
        dt >= 800,
        "forwarded {dt} ms after the first signal: the second one must change nothing"
    );
}

#[test]
fn a_shell_wrapper_without_exec_drains_its_app() {
    for mode in BOTH {
        let script = format!(
            "NAME=app CLEANUP=0.4 {} {}; echo done",
            python(),
            fixture("sigapp.py")
        );
        let app = vec!["sh".to_string(), "-c".into(), script];
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "200ms", "--drain-timeout", "4s"],
                &app,
            ),
        );
        let (rc, elapsed) = r.stop_after_start(&["app"], secs(8));
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
        assert!(r.has("app: cleanup done"), "{mode:?}: {}", r.marks());
        assert_eq!(r.count("app: got SIGTERM"), 1);
        assert!(elapsed >= 600);
        let rep = r.report();
        assert_eq!(
            (
                num(&rep, "drain.in_flight_at_start"),
                num(&rep, "drain.completed")
            ),
            (2, 2)
        );
    }
}

#[test]
fn a_worker_behind_a_master_is_signalled_only_after_the_master_drained() {
    for mode in BOTH {
        let app = format!("{} {}", python(), fixture("sigapp.py"));
        let script =
            format!("NAME=worker CLEANUP=0.3 {app} & exec env NAME=master CLEANUP=0.5 {app}");
        let sh = vec!["sh".to_string(), "-c".into(), script];
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "200ms", "--drain-timeout", "4s"],
                &sh,
            ),
        );
        let (rc, _) = r.stop_after_start(&["master", "worker"], secs(8));
        assert_eq!(rc, 0);
        let (m, w) = (
            r.line_no("master: cleanup done").unwrap(),
            r.line_no("worker: got SIGTERM").unwrap(),
        );
        assert!(
            w > m,
            "{mode:?}: the worker was signalled before the master drained:\n{}",
            r.marks()
        );
        assert!(r.has("worker: cleanup done"));
    }
}

#[test]
fn the_deadline_is_not_restarted_when_the_main_child_exits() {
    let app = format!("{} {}", python(), fixture("sigapp.py"));
    let script = format!("NAME=worker CLEANUP=5 {app} & exec env NAME=main CLEANUP=0.6 {app}");
    let sh = vec!["sh".to_string(), "-c".into(), script];
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "200ms",
                "--drain-timeout",
                "1200ms",
            ],
            &sh,
        ),
    );
    let (rc, elapsed) = r.stop_after_start(&["main", "worker"], secs(8));
    assert_eq!(rc, 2);
    assert!(
        (1400..2600).contains(&elapsed),
        "killed at T0 + 1.4 s, not later ({elapsed} ms)"
    );
    let rep = r.report();
    assert_eq!(
        rep["abandoned"][0]["comm"],
        r.field("worker", "comm").unwrap().as_str()
    );
    assert_eq!(num(&rep, "drain.completed"), 1);
}

#[test]
fn teardown_runs_after_the_drain_and_its_failure_or_hang_gives_two() {
    let app = sigapp("app", &["CLEANUP=0.05"]);
    // Clean teardown: 0.
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "100ms",
                "--teardown",
                "sh -c 'echo teardown >> \"$MARK\"'",
            ],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert_eq!(r.wait(secs(5)).0, 0);
    assert!(
        r.line_no("teardown").unwrap() > r.line_no("app: cleanup done").unwrap(),
        "teardown after the drain"
    );
    let rep = r.report();
    assert_eq!(rep["teardown"][0]["ok"], true);
    // A failing step: 2, and the next step still runs.
    let mut r = Running::start(
        Mode::Subreaper,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "100ms",
                "--teardown",
                "false",
                "--teardown",
                "true",
            ],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert_eq!(r.wait(secs(5)).0, 2);
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "teardown_failed");
    assert_eq!(rep["teardown"][0]["error"], "exit status 1");
    assert_eq!(rep["teardown"][1]["ok"], true);
    // A hanging step: killed at its timeout, 2.
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "100ms",
                "--teardown",
                "sleep 30",
                "--teardown-timeout",
                "500ms",
            ],
            &app,
        ),
    );
    let (rc, elapsed) = r.stop_after_start(&["app"], secs(5));
    assert_eq!(rc, 2);
    assert!((600..2500).contains(&elapsed), "{elapsed} ms");
    let rep = r.report();
    assert_eq!(rep["teardown"][0]["error"], "timed out after 500ms");
}

#[test]
fn a_clean_stop_with_exit_143_is_zero_and_a_crash_keeps_its_code() {
    let app = sigapp("app", &["CLEANUP=0.1", "EXIT_CODE=143"]);
    let mut r = Running::start(Mode::Pid1, &cmd(&[OFF, "--pre-drain-delay", "100ms"], &app));
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert_eq!(r.wait(secs(5)).0, 0);
    assert_eq!(num(&r.report(), "child.exit.code"), 143);
    // Work abandoned after a clean exit by itself: 2; a crash outranks it.
    for (code, want) in [(0, 2), (3, 3)] {
        let daemon = format!(
            "NAME=stubborn STUBBORN=1 setsid {} {} &",
            python(),
            fixture("sigapp.py")
        );
        let script = format!(
            "{daemon} until grep -q '^stubborn: started' \"$MARK\"; do sleep 0.02; done; exit {code}"
        );
        let sh = vec!["sh".to_string(), "-c".into(), script];
        let mut r = Running::start(Mode::Pid1, &cmd(&[OFF, "--drain-timeout", "500ms"], &sh));
        let (rc, _) = r.wait(secs(8));
        assert_eq!(rc, want, "{}", r.stderr_text());
        let rep = r.report();
        assert_eq!(
            rep["abandoned"][0]["comm"],
            r.field("stubborn", "comm").unwrap().as_str()
        );
        assert!(rep["drain"].is_null() && rep["stop"].is_object());
    }
}

#[test]
fn custom_drain_signal_and_non_drain_signals_never_start_a_drain() {
    let app = sigapp("app", &["DRAIN_SIG=USR2", "CLEANUP=0.05"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[OFF, "--drain-signal", "USR2", "--pre-drain-delay", "200ms"],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    // TERM is no drain signal here: forwarded at once; the app logs and carries on.
    r.signal(libc::SIGCONT);
    r.signal(libc::SIGHUP);
    assert!(r.wait_mark("app: got SIGHUP", secs(3)));
    r.signal(libc::SIGUSR2);
    let (rc, elapsed) = r.wait(secs(5));
    assert_eq!(rc, 0);
    assert!(elapsed >= 200);
    assert_eq!(text(&r.report(), "signal"), "SIGUSR2");
}

#[test]
fn budget_is_logged_and_strict_budget_refuses_what_does_not_fit() {
    let out = std::process::Command::new(bin())
        .args([
            OFF,
            "--pre-drain-delay",
            "10s",
            "--drain-timeout",
            "25s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pre-drain delay 10s + drain timeout 25s") && err.contains("warning"),
        "{err}"
    );
    let out = std::process::Command::new(bin())
        .args([
            OFF,
            "--strict-budget",
            "--pre-drain-delay",
            "10s",
            "--drain-timeout",
            "25s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let out = std::process::Command::new(bin())
        .args([
            "--check-config",
            "--teardown",
            "sync",
            "--teardown-timeout",
            "2s",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text.contains(
            "pre-drain delay 5s + drain timeout 20s + teardown 2s = 27s of grace period 30s"
        ),
        "{text}"
    );
}

#[test]
fn a_process_started_by_a_cleanup_hook_is_part_of_the_drain_not_signalled() {
    // The worker's TERM trap runs a 0.6 s helper (`sleep`) created after the main
    // child exited: drainit must wait for it, not signal it.
    let worker = "trap 'sleep 0.6; echo \"worker: cleanup done\" >> \"$MARK\"; exit 0' TERM; echo \"worker: started\" >> \"$MARK\"; while :; do sleep 0.05; done";
    let script = format!("sh -c '{}' & exec sleep 30", worker.replace('\'', "'\\''"));
    let sh = vec!["sh".to_string(), "-c".into(), script];
    for mode in BOTH {
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "0s", "--drain-timeout", "5s"],
                &sh,
            ),
        );
        r.child_running("sleep");
        // The worker's trap is set.
        r.wait_started(&["worker"]);
        r.signal(libc::SIGTERM);
        let (rc, elapsed) = r.wait(secs(8));
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
        assert!(
            r.has("worker: cleanup done"),
            "{mode:?}: the hook's helper was killed: {}",
            r.stderr_text()
        );
        assert!(elapsed >= 600, "{elapsed}");
        assert_eq!(text(&r.report(), "reason"), "drained");
        // Without a pre-drain delay the forward comes in beat 1's own step; its
        // line still follows the line that announces it.
        let err = r.stderr_text();
        let at = |needle: &str| {
            err.find(needle)
                .unwrap_or_else(|| panic!("{mode:?}: no {needle:?} in {err}"))
        };
        assert!(
            at("drain started by SIGTERM") < at("forwarded SIGTERM to"),
            "{mode:?}: {err}"
        );
    }
}

#[test]
fn teardown_steps_run_in_the_start_directory_with_the_inherited_mask_and_leftovers_are_swept() {
    let tmp = TmpDir::new("tdir");
    std::fs::write(
        tmp.join("step.sh"),
        "#!/bin/sh\necho \"step: ran in $(pwd)\" >> \"$MARK\"\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x", tmp.join("step.sh").to_str().unwrap()])
        .status()
        .unwrap();
    // A step that dies of its own SIGTERM (it must not start with it blocked), and
    // one that leaves a daemon behind.
    let suicide = format!(
        "{} -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)'",
        python()
    );
    let app = sigapp("app", &["CLEANUP=0.05"]);
    let flags = [
        OFF,
        "--pre-drain-delay",
        "0s",
        "--report-file",
        "report.json",
        "--teardown",
        "./step.sh",
        "--teardown",
        &suicide,
        "--teardown",
        "sh -c 'setsid sleep 60 & exit 0'",
    ];
    let mut args = vec![
        python().to_string(),
        fixture("launch.py"),
        "--".into(),
        bin().into(),
    ];
    args.extend(cmd(&flags, &app).iter().map(|s| s.to_string()));
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg("cd \"$1\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(tmp.path())
        .args(&args);
    let mark = tmp.join("mark");
    std::fs::write(&mark, "").unwrap();
    c.env("MARK", &mark).env("DRAINIT_TEST_TMP", tmp.path());
    let mut child = c.spawn().unwrap();
    wait_for(secs(10), || {
        std::fs::read_to_string(&mark)
            .ok()
            .filter(|m| m.contains("app: started"))
    })
    .unwrap();
    kill(child.id() as i32, libc::SIGTERM);
    let status = wait_for(secs(10), || child.try_wait().unwrap()).expect("drainit exits");
    kill_marked(tmp.path());
    assert_eq!(
        status.code(),
        Some(2),
        "a daemon left by teardown is abandoned work"
    );
    let marks = std::fs::read_to_string(&mark).unwrap();
    assert!(
        marks.contains(&format!("step: ran in {}", tmp.path().display())),
        "{marks}"
    );
    let rep: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.join("report.json")).unwrap()).unwrap();
    assert_eq!(rep["teardown"][0]["ok"], true);
    assert_eq!(rep["teardown"][1]["error"], "killed by SIGTERM");
    assert_eq!(rep["abandoned"].as_array().unwrap().len(), 1, "{rep}");
}

#[test]
fn a_probe_flood_at_a_low_fd_limit_never_fakes_a_drain() {
    // With RLIMIT_NOFILE 40, 60 idle probe connections must not leave drainit
    // unable to read /proc (which would look like "nothing left").
    let probe = free_port();
    let tmp = TmpDir::new("nofile");
    let worker = tmp.join("worker.sh");
    std::fs::write(
        &worker,
        // Three processes alive at T0 whenever it comes: the main child, the
        // worker and its `sleep 30` (the loop's short sleeps come and go).
        "trap 'sleep 1; exit 0' TERM\nsleep 30 &\nwhile :; do sleep 0.05; done\n",
    )
    .unwrap();
    let script = format!(
        "ulimit -n 40; exec {} --probe-addr 127.0.0.1:{probe} --pre-drain-delay 0s --drain-timeout 5s -- sh -c 'sh {} & exec sleep 30'",
        bin(),
        worker.display()
    );
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg(&script)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stderr(std::fs::File::create(tmp.join("err")).unwrap());
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    wait_for(secs(5), || TcpStream::connect(("127.0.0.1", probe)).ok()).expect("probe up");
    wait_for(secs(5), || {
        (children_of(pid).len() == 1 && children_of(children_of(pid)[0]).len() >= 2).then_some(())
    });
    let base = open_fds(pid);
    let conns: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", probe)).ok())
        .collect();
    // drainit has taken up what it will of them: its descriptor count grew and
    // stopped growing.
    let mut last = 0;
    wait_for(secs(10), || {
        std::thread::sleep(Duration::from_millis(50));
        let n = open_fds(pid);
        let stable = n == last && n > base;
        last = n;
        stable.then_some(())
    })
    .expect("drainit never took up the probe connections");
    let t0 = Instant::now();
    kill(pid, libc::SIGTERM);
    let status = wait_for(secs(10), || child.try_wait().unwrap()).expect("drainit exits");
    let elapsed = t0.elapsed();
    drop(conns);
    kill_marked(tmp.path());
    let err = std::fs::read_to_string(tmp.join("err")).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        elapsed >= Duration::from_millis(1000),
        "the worker's 1 s cleanup was not waited for ({elapsed:?}): {err}"
    );
    let rep: Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert!(num(&rep, "drain.in_flight_at_start") >= 3, "{err}");
}

/// The count at T0 is read after the forward (no pre-drain delay) while the main
/// child dies of it: the process it started, handed to drainit by that death in
/// the middle of the walk of the tree, is still counted in flight. (It was missed
/// in 8 of 30 drains; 20 here, so that a regression shows.)
#[test]
fn a_process_handed_to_drainit_while_the_count_at_t0_walks_the_tree_is_counted() {
    for run in 0..20 {
        let mut r = Running::start(
            Mode::Subreaper,
            &[
                OFF,
                "--pre-drain-delay",
                "0s",
                "--drain-timeout",
                "5s",
                "--",
                "sh",
                "-c",
                "sleep 30 & exec sleep 30",
            ],
        );
        let main = r.child_running("sleep");
        assert!(
            wait_until(secs(5), || children_of(main).len() == 1),
            "the main child never started its child\n{}",
            r.stderr_text()
        );
        r.signal(libc::SIGTERM);
        let (rc, _) = r.wait(secs(8));
        let rep = r.report();
        assert_eq!(rc, 0, "run {run}: {}", r.stderr_text());
        assert_eq!(
            (
                num(&rep, "drain.in_flight_at_start"),
                num(&rep, "drain.completed")
            ),
            (2, 2),
            "run {run}: {}",
            r.stderr_text()
        );
    }
}

#[test]
fn fds_passed_over_the_notify_socket_never_stay_in_drainit() {
    // 10 datagrams carrying 9 descriptors each: drainit must close every one.
    let app = r#"
import array, os, socket, time
addr = os.environ["NOTIFY_SOCKET"]
if addr.startswith("@"):
    addr = "\0" + addr[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(9)]
for _ in range(10):
    s.sendmsg([b"STATUS=fds"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))], 0, addr)
s.sendmsg([b"READY=1"], [], 0, addr)
open(os.environ["MARK"], "a").write("app: sent\n")
time.sleep(30)
"#;
    let probe = free_port().to_string();
    let p = format!("127.0.0.1:{probe}");
    let r = Running::start(
        Mode::Subreaper,
        &[
            "--probe-addr",
            &p,
            "--ready-notify",
            "--",
            python(),
            "-c",
            app,
        ],
    );
    assert!(r.wait_mark("app: sent", secs(5)), "{}", r.stderr_text());
    let ready = wait_for(secs(5), || {
        let mut s = TcpStream::connect(("127.0.0.1", probe.parse::<u16>().unwrap())).ok()?;
        let _ = write!(s, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut b = String::new();
        let _ = s.read_to_string(&mut b);
        b.starts_with("HTTP/1.1 200").then_some(())
    });
    assert!(
        ready.is_some(),
        "READY=1 after the fd-carrying datagrams was not seen"
    );
    let fds = open_fds(r.pid);
    assert!(
        fds < 20,
        "drainit holds {fds} fds: passed descriptors leaked"
    );
}

#[test]
fn a_child_that_exits_just_before_the_drain_signal_keeps_its_exit_code() {
    // The kernel hands out SIGTERM (15) before SIGCHLD (17): with drainit stopped
    // while the child exits and the signal arrives, both are read together.
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            OFF,
            "--pre-drain-delay",
            "1s",
            "--",
            "sh",
            "-c",
            "sleep 0.3; exit 7",
        ],
    );
    r.child_running("sh");
    assert!(kill(r.pid, libc::SIGSTOP));
    // The child exits while drainit is stopped (it is a zombie then).
    let zombie = wait_for(secs(5), || {
        let c = *children_of(r.pid).first()?;
        let st = std::fs::read_to_string(format!("/proc/{c}/stat")).ok()?;
        st.contains(") Z ").then_some(())
    });
    r.signal(libc::SIGTERM);
    assert!(kill(r.pid, libc::SIGCONT));
    assert!(zombie.is_some(), "setup: the child did not exit");
    let (rc, _) = r.wait(secs(5));
    assert_eq!(rc, 7, "{}", r.stderr_text());
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "child_exited");
    assert!(rep["signal"].is_null());
}

#[test]
fn as_pid1_a_process_entered_from_outside_is_drained_too() {
    // `docker exec` / nsenter: a process of the namespace whose parent is outside.
    let mut r = Running::start(
        Mode::Pid1,
        &[
            OFF,
            "--pre-drain-delay",
            "0s",
            "--drain-timeout",
            "5s",
            "--",
            "sleep",
            "30",
        ],
    );
    r.child_running("sleep");
    let script = "trap 'echo \"entered: got TERM\" >> \"$MARK\"; sleep 0.4; echo \"entered: done\" >> \"$MARK\"; exit 0' TERM; echo \"entered: started\" >> \"$MARK\"; while :; do sleep 0.05; done";
    let mut entered = std::process::Command::new("nsenter")
        .args(["-t", &r.pid.to_string(), "-p", "-m", "sh", "-c", script])
        .env("MARK", &r.mark)
        .env("DRAINIT_TEST_TMP", r.tmp.path())
        .spawn()
        .unwrap();
    assert!(r.wait_mark("entered: started", secs(5)));
    r.signal(libc::SIGTERM);
    let (rc, elapsed) = r.wait(secs(8));
    let _ = entered.wait();
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert!(
        r.has("entered: done"),
        "the entered process was not drained: {}",
        r.marks()
    );
    assert!(elapsed >= 400);
    let rep = r.report();
    assert!(num(&rep, "drain.in_flight_at_start") >= 2, "{rep}");
    assert_eq!(rep["abandoned"].as_array().unwrap().len(), 0);
}

#[test]
fn completed_never_counts_teardown_children_or_killed_processes() {
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            OFF,
            "--pre-drain-delay",
            "0s",
            "--teardown",
            "sh -c 'sleep 0.2 & exit 0'",
            "--teardown",
            "sleep 0.4",
            "--",
            "sleep",
            "30",
        ],
    );
    r.child_running("sleep");
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(6));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    let rep = r.report();
    assert_eq!(
        (
            num(&rep, "drain.in_flight_at_start"),
            num(&rep, "drain.completed")
        ),
        (1, 1),
        "{rep}"
    );
}

#[test]
fn a_stopped_child_is_woken_to_act_on_the_drain_signal() {
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[OFF, "--pre-drain-delay", "0s", "--drain-timeout", "3s"],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    let child = children_of(r.pid)[0];
    assert!(kill(child, libc::SIGSTOP));
    wait_for(secs(3), || {
        let st = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        st.contains(") T ").then_some(())
    })
    .expect("setup: the child stops");
    r.signal(libc::SIGTERM);
    let (rc, elapsed) = r.wait(secs(6));
    assert_eq!(
        rc,
        0,
        "a stopped child must get SIGCONT after the drain signal: {}",
        r.stderr_text()
    );
    assert!(elapsed < 2500, "{elapsed}");
    assert!(r.has("app: cleanup done"));
}

#[test]
fn a_stop_signal_that_reaches_drainit_and_the_child_at_once_is_a_drain() {
    // systemd's KillMode=control-group signals every process of the unit at once:
    // the child dies of the very SIGTERM drainit reads with its SIGCHLD.
    let mut r = Running::start(
        Mode::Subreaper,
        &[OFF, "--pre-drain-delay", "1s", "--", "sleep", "30"],
    );
    let child = r.child_running("sleep");
    assert!(kill(r.pid, libc::SIGSTOP));
    assert!(kill(child, libc::SIGTERM));
    wait_for(secs(5), || {
        let st = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        st.contains(") Z ").then_some(())
    })
    .expect("setup: the child dies");
    r.signal(libc::SIGTERM);
    assert!(kill(r.pid, libc::SIGCONT));
    let (rc, _) = r.wait(secs(5));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "drained");
    assert_eq!(text(&rep, "child.exit.signal"), "SIGTERM");
}

/// What an exec check leaves running in its process group when it exits (`sh -c
/// 'x & exit 0'`) is killed with the check: left, it was re-parented to drainit and
/// taken for the app's work, one more for every `/readyz`, counted in flight,
/// signalled at the drain and, ignoring SIGTERM, SIGKILLed at the deadline and
/// reported abandoned: exit 2 after the app itself drained cleanly.
#[test]
fn what_an_exec_check_leaves_behind_is_not_the_apps_work() {
    for mode in BOTH {
        let probe = free_port();
        let addr = format!("--probe-addr=127.0.0.1:{probe}");
        let check = "sh -c 'trap \"\" TERM; sleep 30 & exit 0'";
        let mut r = Running::start(
            mode,
            &[
                &addr,
                "--pre-drain-delay=0s",
                "--drain-timeout=1s",
                "--ready-exec",
                check,
                "--",
                "sleep",
                "30",
            ],
        );
        assert!(
            wait_until(secs(10), || http(probe, "/readyz", "GET").0 == 200),
            "{mode:?}: never ready\n{}",
            r.stderr_text()
        );
        for _ in 0..5 {
            assert_eq!(http(probe, "/readyz", "GET").0, 200, "{mode:?}");
        }
        r.signal(15);
        let (rc, _) = r.wait(secs(10));
        let rep = r.report();
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
        assert_eq!(rep["abandoned"], serde_json::json!([]), "{mode:?}: {rep}");
        assert_eq!(num(&rep, "drain.in_flight_at_start"), 1, "{mode:?}: {rep}");
    }
}
