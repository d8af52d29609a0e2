//! `--user USER[:GROUP]`: the child runs with the ids the image's /etc/passwd and
//! /etc/group give (read without NSS), drainit keeps its own and still reaps and
//! drains; a user the image does not know is 78 before anything starts.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::*;

/// Prints the child's ids as the kernel sees them, its HOME, then sleeps until
/// drained (with an orphan, so reaping and draining as another user are covered).
const SHOW_IDS: &str = "grep -E '^(Uid|Gid|Groups):' /proc/self/status; echo HOME=$HOME; \
                        sleep 30 & exec sleep 31";

/// `(uid, gid, groups)` from `/proc/<pid>/status` lines in `text`.
fn ids(text: &str) -> (String, String, String) {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    (field("Uid:"), field("Gid:"), field("Groups:"))
}

/// `id OPTS nobody`: NSS's answer, an independent reading of the same files.
fn id_of(opt: &str, user: &str) -> String {
    let out = Command::new("id").args([opt, user]).output().unwrap();
    assert!(out.status.success(), "id {opt} {user}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn run_as(mode: Mode, user: &str) -> (String, Running) {
    let mut r = Running::start(
        mode,
        &[
            OFF,
            "--drain-timeout",
            "5s",
            "--user",
            user,
            "--",
            "sh",
            "-c",
            SHOW_IDS,
        ],
    );
    let out = wait_for(secs(10), || {
        let t = std::fs::read_to_string(&r.stdout).ok()?;
        t.contains("HOME=").then_some(t)
    })
    .unwrap_or_else(|| panic!("the child printed nothing\n{}", r.stderr_text()));
    // drainit itself keeps running as root.
    let me = std::fs::read_to_string(format!("/proc/{}/status", r.pid)).unwrap();
    assert_eq!(ids(&me).0, "0 0 0 0", "drainit changed its own ids");
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(8));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    let rep = r.report();
    assert_eq!(text(&rep, "reason"), "drained");
    assert_eq!(num(&rep, "drain.abandoned"), 0);
    assert!(num(&rep, "drain.completed") >= 2, "{rep}");
    (out, r)
}

#[test]
fn the_child_runs_as_nobody_and_is_still_drained() {
    let uid = id_of("-u", "nobody");
    let gid = id_of("-g", "nobody");
    let groups = id_of("-G", "nobody");
    for mode in BOTH {
        let (out, _r) = run_as(mode, "nobody");
        let (u, g, gs) = ids(&out);
        assert_eq!(u, format!("{uid} {uid} {uid} {uid}"), "{mode:?}");
        assert_eq!(g, format!("{gid} {gid} {gid} {gid}"), "{mode:?}");
        assert_eq!(gs, groups, "{mode:?}");
        let home = std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("nobody:")
                    .map(|r| r.split(':').nth(4).unwrap().to_string())
            })
            .unwrap();
        assert!(out.contains(&format!("HOME={home}\n")), "{out}");
    }
}

#[test]
fn numeric_ids_need_no_entry() {
    let (out, r) = run_as(Mode::Subreaper, "4242:4343");
    assert_eq!(
        ids(&out),
        (
            "4242 4242 4242 4242".into(),
            "4343 4343 4343 4343".into(),
            "4343".into()
        )
    );
    assert!(out.contains("HOME=/\n"), "{out}");
    assert!(
        r.stderr_text()
            .contains("user 4242:4343 (uid 4242, gid 4343)")
    );
}

#[test]
fn supplementary_groups_come_from_the_images_etc_group() {
    // An image's own /etc, bind-mounted over the host's in a mount namespace.
    let tmp = TmpDir::new("etc");
    std::fs::write(
        tmp.join("passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        tmp.join("group"),
        "root:x:0:\napp:x:1001:\nwww-data:x:33:app\naudio:x:29:someone,app\nother:x:50:someone\n",
    )
    .unwrap();
    let script = format!(
        "mount --bind {0}/passwd /etc/passwd && mount --bind {0}/group /etc/group && \
         exec {1} --probe-addr=off --user app -- sh -c \"grep -E '^(Uid|Gid|Groups):' /proc/self/status; echo HOME=\\$HOME\"",
        tmp.path().display(),
        bin()
    );
    let out = Command::new("timeout")
        .args([
            "20",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
        ])
        .arg(&script)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        ids(&stdout),
        (
            "1000 1000 1000 1000".into(),
            "1001 1001 1001 1001".into(),
            "29 33 1001".into()
        )
    );
    assert!(stdout.contains("HOME=/home/app\n"), "{stdout}");
}

#[test]
fn an_unknown_user_is_78_naming_where_it_came_from_and_nothing_starts() {
    let tmp = TmpDir::new("user");
    let started = tmp.join("started");
    let file = tmp.join("drainit.toml");
    std::fs::write(&file, "user = \"ghost\"\n").unwrap();
    /// (flags, an environment variable, what the message must say)
    type Case<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 4] = [
        (
            &["--user", "ghost"],
            None,
            "invalid value for --user: user 'ghost' not found in /etc/passwd",
        ),
        (
            &["--user", "nobody:ghosts"],
            None,
            "--user: group 'ghosts' not found in /etc/group",
        ),
        (
            &[],
            Some(("DRAINIT_USER", "ghost")),
            "environment variable DRAINIT_USER: user 'ghost'",
        ),
        (
            &["--config", file.to_str().unwrap()],
            None,
            ":1:8: invalid value for key `user`: user 'ghost'",
        ),
    ];
    for (flags, env, want) in cases {
        let mut c = Command::new(bin());
        c.args(["--probe-addr=off"])
            .args(flags)
            .args(["--", "touch"])
            .arg(&started)
            .env_remove("DRAINIT_USER")
            .env("DRAINIT_TEST_TMP", tmp.path());
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!started.exists(), "{flags:?}: the child was started");
    }
    // A malformed value on the command line is a usage error.
    let out = Command::new(bin())
        .args(["--probe-addr=off", "--user", "app:", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
