//! The core of an init, black box: spawn, exit codes, forwarding, transparency,
//! fds, reaping, the terminal, leftovers. Each test runs the built binary against
//! real processes, as a subreaper and as the real PID 1 of a PID namespace.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn exit_codes_are_the_childs() {
    for mode in BOTH {
        for code in [0, 1, 7, 126, 127, 128, 129, 255] {
            let script = format!("exit {code}");
            let mut r = Running::start(
                mode,
                &[OFF, "--pre-drain-delay", "2s", "--", "sh", "-c", &script],
            );
            let (rc, elapsed) = r.wait(secs(5));
            assert_eq!(rc, code, "{mode:?}: child exited {code}");
            assert!(
                elapsed < 1500,
                "{mode:?}: no pre-drain delay without a drain signal ({elapsed} ms)"
            );
            let rep = r.report();
            assert_eq!(text(&rep, "reason"), "child_exited");
            assert_eq!(num(&rep, "child.exit.code"), code as i64);
            assert!(rep["signal"].is_null() && rep["drain"].is_null());
        }
    }
}

#[test]
fn a_signal_death_gives_128_plus_n() {
    for mode in BOTH {
        for (sig, n) in [
            ("KILL", 9),
            ("SEGV", 11),
            ("TERM", 15),
            ("INT", 2),
            ("USR1", 10),
        ] {
            let script = format!("ulimit -c 0; kill -{sig} $$; exit 0");
            let mut r = Running::start(mode, &[OFF, "--", "sh", "-c", &script]);
            let (rc, _) = r.wait(secs(5));
            assert_eq!(rc, 128 + n, "{mode:?}: child died of SIG{sig}");
            let rep = r.report();
            assert_eq!(text(&rep, "reason"), "child_exited");
            assert_eq!(text(&rep, "child.exit.signal"), format!("SIG{sig}"));
        }
    }
}

#[test]
fn a_command_that_cannot_start_gives_127_or_126() {
    let tmp = TmpDir::new("spawn");
    let noexec = tmp.join("noexec");
    std::fs::write(&noexec, "data\n").unwrap();
    let dir = tmp.join("adir");
    std::fs::create_dir(&dir).unwrap();
    let cases = [
        ("/nonexistent/app".to_string(), 127, "not found"),
        ("drainit-test-no-such-command".to_string(), 127, "not found"),
        (noexec.display().to_string(), 126, "permission denied"),
        (dir.display().to_string(), 126, "permission denied"),
    ];
    for mode in BOTH {
        for (cmd, code, kind) in &cases {
            let mut r = Running::start(mode, &[OFF, "--", cmd]);
            let (rc, _) = r.wait(secs(5));
            assert_eq!(rc, *code, "{mode:?}: {cmd}");
            let rep = r.report();
            assert_eq!(text(&rep, "reason"), "spawn_failed");
            assert_eq!(text(&rep, "error"), *kind);
            assert!(rep["child"].is_null());
            assert!(
                r.stderr_text().contains(cmd.as_str()),
                "stderr names the command: {}",
                r.stderr_text()
            );
        }
    }
}

/// A fork the pids limit refuses (RLIMIT_NPROC 1 for a uid no account has, so
/// that no other process of the machine counts against it: drainit itself is
/// its one process) is named as such, not "cannot execute".
#[test]
fn a_fork_the_process_limit_refuses_is_named() {
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--user", "64101", "--nproc", "1"],
        args: &[OFF, "--", "sh", "-c", "echo child-ran >&2"],
        env: &[],
    });
    let (rc, _) = r.wait(secs(5));
    let err = r.stderr_text();
    assert_eq!(rc, 126, "{err}");
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "spawn_failed");
    assert_eq!(text(&rep, "error"), "process limit reached", "{err}");
    assert!(!err.contains("child-ran"), "{err}");
}

/// The signals' thread refused by the pids limit (RLIMIT_NPROC 2 for a uid no
/// account has: drainit and its child, a single process, are its two tasks) is
/// no failure: drainit says so and reads its signals in the loop's turn, as
/// before the thread existed. Forwarded signals reach the app, and a SIGTERM
/// drains it.
#[test]
fn signals_are_still_forwarded_when_the_pids_limit_refuses_their_thread() {
    // sigapp.py as uid 64103, once the test made the marks file writable (it
    // waits for that without a process of its own: exec only).
    let app = sigapp("app", &[]);
    let (python, script) = (app[2].as_str(), app[3].as_str());
    let wait = "import os, sys, time\n\
                while not os.access(os.environ['MARK'], os.W_OK): time.sleep(0.02)\n\
                os.execv(sys.executable, [sys.executable, sys.argv[1]])";
    let args = [
        OFF,
        "--pre-drain-delay",
        "0s",
        "--",
        "env",
        "NAME=app",
        python,
        "-c",
        wait,
        script,
    ];
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--user", "64103", "--nproc", "2"],
        args: &args,
        env: &[],
    });
    std::fs::set_permissions(&r.mark, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    r.wait_started(&["app"]);
    r.signal(libc::SIGUSR1);
    assert!(r.wait_mark("app: got SIGUSR1", secs(5)), "{}", r.marks());
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(10));
    let err = r.stderr_text();
    assert_eq!(rc, 0, "{err}");
    assert!(r.has("app: got SIGTERM"), "{}", r.marks());
    assert!(err.contains("no thread of its own for signals"), "{err}");
    assert_eq!(r.count("app: got "), 2, "{}", r.marks());
}

#[test]
fn bad_input_is_64_or_78_and_starts_nothing() {
    let tmp = TmpDir::new("usage");
    let witness = tmp.join("started");
    let touch = format!("touch {}", witness.display());
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(bin())
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (rc, err) = run(&["--no-such-flag", "sh", "-c", &touch], &[]);
    assert_eq!(rc, 64, "{err}");
    let (rc, err) = run(&[OFF], &[]);
    assert_eq!(rc, 64, "no command: {err}");
    let (rc, err) = run(&[OFF, "--drain-timeout", "soon", "sh", "-c", &touch], &[]);
    assert_eq!(rc, 64);
    assert!(
        err.contains("--drain-timeout") && err.contains("soon"),
        "{err}"
    );
    let (rc, err) = run(
        &[OFF, "sh", "-c", &touch],
        &[("DRAINIT_DRAIN_TIMEOUT", "soon")],
    );
    assert_eq!(rc, 78);
    assert!(err.contains("DRAINIT_DRAIN_TIMEOUT"), "{err}");
    let (rc, err) = run(&[OFF, "--forward-to", "everyone", "sh", "-c", &touch], &[]);
    assert_eq!(rc, 64, "{err}");
    assert!(!witness.exists(), "bad input must never start the child");
    let (rc, out) = run(&["--help"], &[]);
    assert_eq!(rc, 0, "{out}");
}

/// One test per forwarded signal: drainit receives it, the child's handler runs.
macro_rules! forwarded {
    ($($name:ident: $sig:expr, $shown:expr;)*) => {$(
        #[test]
        fn $name() {
            for mode in BOTH {
                let app = sigapp("app", &[]);
                let mut args = vec![OFF, "--"];
                args.extend(app.iter().map(String::as_str));
                let mut r = Running::start(mode, &args);
                r.wait_started(&["app"]);
                let sig: i32 = $sig;
                r.signal(sig);
                let want = format!("app: got {}", $shown);
                assert!(r.wait_mark(&want, secs(5)), "{mode:?}: the child never got {} (marks: {})", $shown, r.marks());
                assert_eq!(r.count("app: got "), 1, "{mode:?}: exactly one signal: {}", r.marks());
            }
        }
    )*};
}

fn rtmin() -> i32 {
    libc::SIGRTMIN()
}

forwarded! {
    forwards_sighup: libc::SIGHUP, "SIGHUP";
    forwards_sigusr1: libc::SIGUSR1, "SIGUSR1";
    forwards_sigusr2: libc::SIGUSR2, "SIGUSR2";
    forwards_sigalrm: libc::SIGALRM, "SIGALRM";
    forwards_sigwinch: libc::SIGWINCH, "SIGWINCH";
    forwards_sigcont: libc::SIGCONT, "SIGCONT";
    forwards_sigurg: libc::SIGURG, "SIGURG";
    forwards_sigio: libc::SIGIO, "SIGIO";
    forwards_sigpwr: libc::SIGPWR, "SIGPWR";
    forwards_sigvtalrm: libc::SIGVTALRM, "SIGVTALRM";
    forwards_sigprof: libc::SIGPROF, "SIGPROF";
    forwards_sigtstp: libc::SIGTSTP, "SIGTSTP";
    forwards_sigttin: libc::SIGTTIN, "SIGTTIN";
    forwards_sigttou: libc::SIGTTOU, "SIGTTOU";
    forwards_sigxcpu: libc::SIGXCPU, "SIGXCPU";
    forwards_sigxfsz: libc::SIGXFSZ, "SIGXFSZ";
    forwards_sigabrt: libc::SIGABRT, "SIGABRT";
    forwards_sigstkflt: libc::SIGSTKFLT, "SIGSTKFLT";
    forwards_sigrtmin: rtmin(), "SIGRTMIN+0";
    forwards_sigrtmin_3: rtmin() + 3, "SIGRTMIN+3";
    forwards_sigrtmax: libc::SIGRTMAX(), format!("SIGRTMIN+{}", libc::SIGRTMAX() - rtmin());
}

#[test]
fn sigchld_and_sigpipe_sent_to_drainit_are_not_forwarded() {
    let app = sigapp("app", &[]);
    let mut args = vec![OFF, "--"];
    args.extend(app.iter().map(String::as_str));
    let mut r = Running::start(Mode::Pid1, &args);
    r.wait_started(&["app"]);
    r.signal(libc::SIGCHLD);
    r.signal(libc::SIGUSR1);
    assert!(r.wait_mark("app: got SIGUSR1", secs(5)));
    assert!(!r.has("app: got SIGCHLD"), "{}", r.marks());
}

/// 32 and 33 belong to the C libraries (thread cancellation, setuid across
/// threads). Sent to drainit from outside, their default action would kill it and
/// orphan the app; they are read and dropped, and drainit goes on forwarding.
#[test]
fn the_c_librarys_own_signals_neither_kill_drainit_nor_reach_the_app() {
    let [listen, upstream] = free_ports::<2>();
    let proxy = format!("--proxy=127.0.0.1:{listen}=127.0.0.1:{upstream}");
    // Each of drainit's threads counts: the C library unblocks these signals in
    // every thread it creates. Without --proxy, the signals' thread (started by
    // the first forward, SIGUSR1 here); with it, the proxy's too.
    let runs: [(Mode, &[&str]); 3] = [
        (Mode::Subreaper, &[]),
        (Mode::Pid1, &[]),
        (Mode::Subreaper, &[&proxy, "--proxy-threads", "2"]),
    ];
    for (mode, extra) in runs {
        let app = sigapp("app", &[]);
        let mut args = vec![OFF, "--pre-drain-delay", "0s"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend(app.iter().map(String::as_str));
        let mut r = Running::start(mode, &args);
        r.wait_started(&["app"]);
        // `sigs`, then `last`, which must reach the app.
        let send = |r: &mut Running, sigs: &[i32], last: i32, shown: &str| {
            for &sig in sigs {
                r.signal(sig);
            }
            r.signal(last);
            assert!(
                r.wait_mark(&format!("app: got {shown}"), secs(5)),
                "{mode:?} {extra:?}: drainit stopped forwarding: {}",
                r.marks()
            );
        };
        send(&mut r, &[32, 33], libc::SIGUSR1, "SIGUSR1");
        // Again, with the signals' thread running; 34 is glibc's SIGRTMIN, the
        // app's, forwarded.
        send(&mut r, &[32, 33, 34], libc::SIGUSR2, "SIGUSR2");
        assert!(
            r.wait_mark("app: got SIGRTMIN+0", secs(5)),
            "{mode:?} {extra:?}: {}",
            r.marks()
        );
        assert_eq!(r.count("app: got "), 3, "{mode:?} {extra:?}: {}", r.marks());
        r.signal(libc::SIGTERM);
        let (code, _) = r.wait(secs(10));
        assert_eq!(code, 0, "{mode:?} {extra:?}: {}", r.stderr_text());
        // Each read and dropped with a warning; the second 33 may instead be
        // dropped unread, by the signals' thread in its first moments (the C
        // library starts every thread with 33 unblocked; drainit ignores it).
        let log = r.stderr_text();
        let (n32, n33) = (
            log.matches("ignored signal 32").count(),
            log.matches("ignored signal 33").count(),
        );
        assert!(
            n32 == 2 && (1..=2).contains(&n33),
            "{mode:?} {extra:?}: {log}"
        );
    }
}

fn two_in_a_group(extra: &[&str]) -> Running {
    let app = format!("{} {}", python(), fixture("sigapp.py"));
    let script = format!("NAME=worker {app} & exec env NAME=main {app}");
    let mut args = vec![OFF];
    args.extend_from_slice(extra);
    args.extend(["--", "sh", "-c", script.as_str()]);
    let r = Running::start(Mode::Pid1, &args);
    r.wait_started(&["main", "worker"]);
    r
}

#[test]
fn forward_to_child_reaches_only_the_main_child() {
    let mut r = two_in_a_group(&[]);
    r.signal(libc::SIGUSR1);
    assert!(r.wait_mark("main: got SIGUSR1", secs(5)));
    // Give a wrong delivery to the worker time to show.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!r.has("worker: got SIGUSR1"), "{}", r.marks());
}

#[test]
fn forward_to_group_reaches_the_whole_group() {
    let mut r = two_in_a_group(&["--forward-to", "group"]);
    r.signal(libc::SIGUSR1);
    assert!(r.wait_mark("main: got SIGUSR1", secs(5)));
    assert!(r.wait_mark("worker: got SIGUSR1", secs(5)), "{}", r.marks());
    assert_eq!(r.field("main", "pgid"), r.field("worker", "pgid"));
    assert_eq!(
        r.field("main", "pgid"),
        r.field("main", "pid"),
        "the child leads its own group"
    );
}

#[test]
fn rewrite_maps_and_drops_forwarded_signals() {
    for mode in BOTH {
        let app = sigapp("app", &[]);
        let mut args = vec![
            OFF,
            "--rewrite",
            "USR1:USR2",
            "--rewrite",
            "SIGWINCH:0",
            "--",
        ];
        args.extend(app.iter().map(String::as_str));
        let mut r = Running::start(mode, &args);
        r.wait_started(&["app"]);
        r.signal(libc::SIGWINCH);
        r.signal(libc::SIGUSR1);
        assert!(r.wait_mark("app: got SIGUSR2", secs(5)), "{}", r.marks());
        r.signal(libc::SIGHUP);
        assert!(r.wait_mark("app: got SIGHUP", secs(5)));
        assert!(
            !r.has("app: got SIGUSR1") && !r.has("app: got SIGWINCH"),
            "{}",
            r.marks()
        );
    }
}

/// SigBlk, SigIgn, SigCgt of a process, without signals 32 and 33: glibc keeps
/// those for itself (SIGCANCEL, SIGSETXID), refuses to let a program change them,
/// and installs its own handlers in any process that starts threads, so their
/// state says nothing about what a program chose.
fn sig_state(pid: i32) -> (String, String, String) {
    let field = |k: &str| {
        let v = u64::from_str_radix(&status_field(pid, k).unwrap(), 16).unwrap();
        format!("{:016x}", v & !(0b11u64 << 31))
    };
    (field("SigBlk"), field("SigIgn"), field("SigCgt"))
}

#[test]
fn the_child_starts_with_the_signal_state_drainit_inherited() {
    // RTMIN (34): a C library may keep it for itself (musl does) and leave it out
    // of the masks it reports; the child must get it back all the same.
    let launch = ["--ignore", "HUP", "--block", "USR2", "--block", "RTMIN"];
    // Without an init in between.
    let tmp = TmpDir::new("bare");
    let mut bare = std::process::Command::new(python())
        .args([
            fixture("launch.py").as_str(),
            "--ignore",
            "HUP",
            "--block",
            "USR2",
            "--block",
            "RTMIN",
            "--",
            "sleep",
            "30",
        ])
        .env("DRAINIT_TEST_TMP", tmp.path())
        .spawn()
        .unwrap();
    let bare_pid = bare.id() as i32;
    let bare_state = wait_for(secs(5), || {
        let comm = std::fs::read_to_string(format!("/proc/{bare_pid}/comm")).ok()?;
        (comm.trim() == "sleep").then(|| sig_state(bare_pid))
    })
    .unwrap();
    let _ = bare.kill();
    let _ = bare.wait();
    assert_eq!(
        bare_state,
        (
            "0000000200000800".into(),
            "0000000000000001".into(),
            "0000000000000000".into()
        )
    );
    for mode in BOTH {
        let r = Running::start_with(Start {
            mode,
            launch: &launch,
            args: &[OFF, "--", "sleep", "30"],
            env: &[],
        });
        let child = r.child_running("sleep");
        assert_eq!(
            sig_state(child),
            bare_state,
            "{mode:?}: SigBlk/SigIgn/SigCgt of the child"
        );
    }
}

/// drainit ignores SIGPIPE for itself, yet the child gets the SIGPIPE disposition
/// drainit inherited: ignored stays ignored (the default case is the test above).
#[test]
fn an_inherited_ignored_sigpipe_stays_ignored_in_the_child() {
    for mode in BOTH {
        let r = Running::start_with(Start {
            mode,
            launch: &["--ignore", "PIPE"],
            args: &[OFF, "--", "sleep", "30"],
            env: &[],
        });
        let child = r.child_running("sleep");
        let (_, ignored, _) = sig_state(child);
        assert_eq!(ignored, "0000000000001000", "{mode:?}: SigIgn of the child");
    }
}

fn fds_of(pid: i32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

#[test]
fn no_drainit_fd_leaks_into_the_child_and_inherited_fds_pass_through() {
    for mode in BOTH {
        let port = free_port().to_string();
        let probe = format!("127.0.0.1:{port}");
        let r = Running::start(mode, &["--probe-addr", &probe, "--", "sleep", "30"]);
        let child = r.child_running("sleep");
        // `sleep` may briefly hold a locale file of its own while it starts: a leak
        // is an fd that stays.
        let settled = wait_for(secs(2), || (fds_of(child) == [0, 1, 2]).then_some(()));
        assert!(
            settled.is_some(),
            "{mode:?}: drainit's own fds are close-on-exec, the child has {:?}",
            fds_of(child)
        );
        // Socket activation: fd 3 reaches the child, and drainit lets go of it.
        let r = Running::start_with(Start {
            mode,
            launch: &["--listen-fd", "3:$TMP/port"],
            args: &[OFF, "--", "sleep", "30"],
            env: &[],
        });
        let child = r.child_running("sleep");
        let settled = wait_for(secs(2), || (fds_of(child) == [0, 1, 2, 3]).then_some(()));
        assert!(
            settled.is_some(),
            "{mode:?}: the inherited fd 3 reaches the child, which has {:?}",
            fds_of(child)
        );
        let held = wait_for(secs(2), || (!fds_of(r.pid).contains(&3)).then_some(()));
        assert!(
            held.is_some(),
            "{mode:?}: drainit still holds inherited fd 3: {:?}",
            fds_of(r.pid)
        );
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", r.pid)).unwrap();
        assert_eq!(
            cwd,
            std::path::PathBuf::from("/"),
            "drainit leaves its directory so it pins no mount"
        );
    }
}

#[test]
fn listen_pid_names_the_child_when_it_named_drainit() {
    let r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--setenv-pid", "LISTEN_PID"],
        args: &[
            OFF,
            "--",
            "sh",
            "-c",
            "echo \"$$ $LISTEN_PID\" > \"$TMP/pids\"; exec sleep 30",
        ],
        env: &[("LISTEN_FDS", "0")],
    });
    let got = wait_for(secs(5), || {
        std::fs::read_to_string(r.path("pids"))
            .ok()
            .filter(|s| s.ends_with('\n'))
    })
    .unwrap();
    let v: Vec<&str> = got.split_whitespace().collect();
    assert_eq!(v[0], v[1], "LISTEN_PID is the child's pid: {got}");
}

#[test]
fn thousand_orphans_leave_no_zombie() {
    let app = r#"
import os, sys, time
me = os.getpid()
for _ in range(1000):
    if os.fork() == 0:
        if os.fork() == 0:
            os._exit(0)     # the grandchild: orphaned when its parent exits first
        os._exit(0)
for _ in range(1000):
    os.wait()
def zombies():
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                s = open("/proc/%s/stat" % p).read()
            except OSError:
                continue
            f = s[s.rfind(")") + 2:].split()
            # Every orphan drainit has not reaped yet: a zombie, or a grandchild
            # still on its way out (under load one may exit after a look that saw
            # no zombie: it must be reaped too).
            if int(f[1]) == os.getppid() and int(p) != me:
                n += 1
    return n
end = time.time() + 10
left = zombies()
while left and time.time() < end:
    time.sleep(0.05)
    left = zombies()
open(os.environ["TMP"] + "/zombies", "w").write("%d\n" % left)
"#;
    for mode in BOTH {
        let mut r = Running::start(mode, &[OFF, "--", python(), "-c", app]);
        let (rc, _) = r.wait(secs(30));
        assert_eq!(rc, 0, "{}", r.stderr_text());
        let z = std::fs::read_to_string(r.path("zombies")).unwrap();
        assert_eq!(z.trim(), "0", "{mode:?}: zombies left");
        assert!(
            num(&r.report(), "orphans_reaped") >= 1000,
            "{mode:?}: {}",
            r.report()
        );
    }
}

#[test]
fn leftover_processes_get_term_and_finish_cleanup_before_exit() {
    for mode in BOTH {
        let app = format!("{} {}", python(), fixture("sigapp.py"));
        let script = format!(
            "NAME=pgrp CLEANUP=0.4 {app} & NAME=setsid CLEANUP=0.4 setsid {app} & \
             until grep -q '^setsid: started' \"$MARK\" && grep -q '^pgrp: started' \"$MARK\"; do sleep 0.02; done; exit 0"
        );
        let mut r = Running::start(
            mode,
            &[
                OFF,
                "--pre-drain-delay",
                "3s",
                "--drain-timeout",
                "5s",
                "--",
                "sh",
                "-c",
                &script,
            ],
        );
        let (rc, _) = r.wait(secs(15));
        assert_eq!(rc, 0, "{mode:?}: {}", r.stderr_text());
        for d in ["pgrp", "setsid"] {
            assert_eq!(
                r.count(&format!("{d}: got SIGTERM")),
                1,
                "{mode:?}: {}",
                r.marks()
            );
            assert!(
                r.has(&format!("{d}: cleanup done")),
                "{mode:?}: {d} was killed mid-cleanup: {}",
                r.marks()
            );
        }
        let rep = r.report();
        assert_eq!(text(&rep, "reason"), "child_exited");
        assert_eq!(num(&rep, "stop.in_flight_at_start"), 2);
        assert_eq!(num(&rep, "stop.completed"), 2);
        assert_eq!(rep["abandoned"].as_array().unwrap().len(), 0);
    }
}

#[test]
fn not_pid1_never_signals_what_it_did_not_start() {
    // A bystander in drainit's own process group and session.
    let tmp = TmpDir::new("bystander");
    let mark = tmp.join("mark");
    std::fs::write(&mark, "").unwrap();
    let mut bystander = std::process::Command::new(python())
        .arg(fixture("sigapp.py"))
        .env("NAME", "bystander")
        .env("MARK", &mark)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .spawn()
        .unwrap();
    wait_for(secs(5), || {
        std::fs::read_to_string(&mark)
            .ok()
            .filter(|s| s.contains("started"))
    })
    .unwrap();
    let app = sigapp("stubborn", &["STUBBORN=1"]);
    let mut args = vec![
        OFF,
        "--pre-drain-delay",
        "0s",
        "--drain-timeout",
        "300ms",
        "--",
    ];
    args.extend(app.iter().map(String::as_str));
    let mut r = Running::start(Mode::Subreaper, &args);
    r.wait_started(&["stubborn"]);
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(5));
    assert_eq!(rc, 2);
    assert!(alive(bystander.id() as i32), "the bystander was killed");
    assert!(
        !std::fs::read_to_string(&mark).unwrap().contains("got"),
        "the bystander got a signal"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_closed_stderr_does_not_crash_drainit() {
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            &format!(
                "exec 2>&-; exec {} --probe-addr off -- sh -c 'exit 3'",
                bin()
            ),
        ])
        .status()
        .unwrap();
    assert_eq!(out.code(), Some(3));
}

/// Closed fds 0–2 are reopened on /dev/null before drainit opens anything of its
/// own: its probe socket never becomes its stdin or stderr, and the child starts
/// with all three open.
#[test]
fn closed_standard_fds_become_dev_null() {
    let tmp = TmpDir::new("closed-fds");
    let out = tmp.join("out");
    let script = format!(
        "exec 0<&- 2>&-; exec {} --probe-addr 127.0.0.1:{} --log-level off -- sh -c \
         'for fd in 0 2; do readlink /proc/$PPID/fd/$fd /proc/self/fd/$fd; done' > {}",
        bin(),
        free_port(),
        out.display()
    );
    let st = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text.lines().filter(|l| *l == "/dev/null").count(),
        4,
        "{text}"
    );
}

#[test]
fn terminal_foreground_group_under_script() {
    // `script` gives drainit a pty as stdin: the child's group must become the
    // terminal's foreground group.
    let tmp = TmpDir::new("script");
    let out = tmp.join("out");
    let app = "import os; print('fg=%s' % (os.tcgetpgrp(0) == os.getpgrp()), 'leader=%s' % (os.getpid() == os.getpgrp()), flush=True)";
    let inner = format!("{} --probe-addr off -- {} -c \"{}\"", bin(), python(), app);
    let st = std::process::Command::new("script")
        .args(["-qec", &inner, out.to_str().unwrap()])
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(st.status.success(), "{text}");
    assert!(
        text.contains("fg=True") && text.contains("leader=True"),
        "{text}"
    );
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_app_not_a_drain() {
    let tmp = TmpDir::new("pty");
    let app = "import time; print('APP' + ' READY', flush=True); time.sleep(30)";
    let launch = fixture("launch.py");
    let (res, text) = run_on_pty(
        &tmp,
        "APP READY",
        &[
            python(),
            &launch,
            "--",
            bin(),
            OFF,
            "--pre-drain-delay",
            "3s",
            "--",
            python(),
            "-c",
            app,
        ],
    );
    assert_eq!(res, "exit 130", "{text}");
    let last = text.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let rep: Value = serde_json::from_str(last).unwrap();
    assert_eq!(text_of(&rep, "reason"), "child_exited");
    assert_eq!(text_of(&rep["child"]["exit"], "signal"), "SIGINT");
}

fn text_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}
