//! Hardening (issue 13): trees that fork as they exit, large trees, processes
//! drainit may not signal, and an sd_notify flood from outside the child's tree.
//! Each test starts the real binary against real processes and asserts what a
//! user sees: the exit code, the report, what the app received and when.
#![allow(clippy::disallowed_methods)]

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::*;

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

/// Item 4 of issue 13: a tree that keeps forking and exiting is never reported
/// drained while it runs. Before the fix, a `/proc` walk that lost the successor
/// forked between its listing and its read was taken for "none left": the drain
/// ended `drained`, exit 0, a few ms after the forward, and (as a subreaper) the
/// chain forked on after drainit exited.
#[test]
fn a_tree_that_keeps_forking_and_exiting_is_killed_at_the_deadline_not_drained_subreaper() {
    forking_chain(Mode::Subreaper);
}

#[test]
fn a_tree_that_keeps_forking_and_exiting_is_killed_at_the_deadline_not_drained_pid1() {
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
        // Nothing of the chain outlives drainit.
        std::thread::sleep(Duration::from_millis(300));
        let left = marked_alive(r.tmp.path());
        assert!(left.is_empty(), "{mode:?}: still running: {left:?}");
    }
}
