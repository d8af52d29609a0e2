//! `drainit-gate model` from outside: exit codes 0/1/64, the flag named in a usage
//! error, the text a person reads and the `--json` shape.

use std::process::{Command, Output};

use serde_json::Value;

fn gate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args(args)
        .output()
        .expect("drainit-gate runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_opening_settings_fail_with_the_seeds_ledger() {
    let o = gate(&["model"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Ledger: 15 committed, 4 rejected, 0 failed, 1 killed"),
        "{out}"
    );
    assert!(
        out.contains("GATE FAILS: 1 killed in flight (#15)"),
        "{out}"
    );
    assert!(
        out.contains("4 rejected (#1, #2, #17, #19) > allowance 0"),
        "{out}"
    );
    // The trace names the signal, the kill and a routing decision; the table a row.
    assert!(
        out.contains("30s  SIGTERM to W1: stops admitting, drains #13, #15"),
        "{out}"
    );
    assert!(out.contains("35s  SIGKILL to W1"), "{out}");
    assert!(out.contains("#3 arrives: routed to W1 (load 1/2)"), "{out}");
    assert!(out.contains("#15      29s      W1    35s  killed"), "{out}");
}

#[test]
fn a_passing_gate_exits_0() {
    let o = gate(&[
        "model",
        "--startup",
        "0",
        "--grace",
        "10s",
        "--allow-503",
        "10%",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("GATE PASSES"));
    let o = gate(&["model", "--startup=0", "--grace=10", "--replacement"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("Ledger: 20 committed, 0 rejected, 0 failed, 0 killed"));
}

#[test]
fn seven_and_7s_are_the_same_duration() {
    let a = gate(&["model", "--json", "--duration", "7", "--grace", "6"]);
    let b = gate(&["model", "--json", "--duration", "7s", "--grace", "6s"]);
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn a_bad_flag_exits_64_and_names_it() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["model", "--grace", "1.5s"], "--grace", "whole seconds"),
        (&["model", "--startup", "1.5"], "--startup", "whole seconds"),
        (&["model", "--every", "500ms"], "--every", "whole seconds"),
        (
            &["model", "--signal-at", "soon"],
            "--signal-at",
            "whole seconds",
        ),
        (&["model", "--duration", "0"], "--duration", "at least 1s"),
        (&["model", "--workers", "0"], "--workers", "0"),
        (&["model", "--slots", "two"], "--slots", "two"),
        (&["model", "--requests", "3.5"], "--requests", "3.5"),
        (
            &["model", "--allow-503", "120"],
            "--allow-503",
            "at most 100",
        ),
        (
            &["model", "--handles-term", "maybe"],
            "--handles-term",
            "maybe",
        ),
        (&["model", "--route-ready"], "--route-ready", ""),
        (&["model", "--first-at"], "--first-at", ""),
        (&["model", "--bogus"], "--bogus", ""),
        (&["model", "--replacement=yes"], "--replacement", ""),
        (&["drill-me"], "drill-me", ""),
    ];
    for (args, flag, why) in cases {
        let o = gate(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?} names {flag}: {err}");
        assert!(err.contains(why), "{args:?} says {why}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // No subcommand: the usage, and 64.
    let o = gate(&[]);
    assert_eq!(o.status.code(), Some(64));
    assert!(stderr(&o).contains("model"));
}

#[test]
fn help_and_version_exit_0() {
    let o = gate(&["model", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    for flag in [
        "--workers",
        "--slots",
        "--requests",
        "--every",
        "--first-at",
        "--duration",
        "--startup",
        "--signal-at",
        "--grace",
        "--handles-term",
        "--route-ready",
        "--allow-503",
        "--replacement",
        "--json",
        "--html",
    ] {
        assert!(help.contains(flag), "--help lists {flag}");
    }
    assert!(help.contains("64"), "--help lists the exit codes");
    assert_eq!(gate(&["--version"]).status.code(), Some(0));
}

#[test]
fn json_has_the_documented_shape() {
    let o = gate(&["model", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["committed"], 15);
    assert_eq!(v["rejected"], 4);
    assert_eq!(v["failed"], 0);
    assert_eq!(v["killed"], 1);
    assert_eq!(v["gate"], "fail");
    let requests = v["requests"].as_array().expect("requests is an array");
    assert_eq!(requests.len(), 20);
    for r in requests {
        let mut keys: Vec<&str> = r
            .as_object()
            .expect("a request is an object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["arrived_s", "end_s", "id", "status", "worker"]);
    }
    assert_eq!(
        requests[0],
        serde_json::json!({"id": 1, "arrived_s": 1, "worker": null, "end_s": 1, "status": "rejected"})
    );
    assert_eq!(
        requests[14],
        serde_json::json!({"id": 15, "arrived_s": 29, "worker": 1, "end_s": 35, "status": "killed"})
    );
    let events = v["events"].as_array().expect("events is an array");
    assert!(
        events
            .iter()
            .all(|e| e["at_s"].is_u64() && e["kind"].is_string())
    );
    assert!(events.contains(&serde_json::json!(
        {"kind": "kill", "at_s": 35, "worker": 1, "running": [15]}
    )));
    let pass = gate(&[
        "model",
        "--json",
        "--startup",
        "0",
        "--replacement",
        "--grace",
        "10",
    ]);
    assert_eq!(pass.status.code(), Some(0));
    let v: Value = serde_json::from_str(&stdout(&pass)).expect("one JSON object");
    assert_eq!(v["gate"], "pass");
}

#[test]
fn html_writes_one_self_contained_page_and_an_unwritable_path_exits_73() {
    let dir = std::env::temp_dir().join(format!("drainit-gate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let page = dir.join("run.html");
    let o = gate(&["model", "--html", page.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(1));
    let html = std::fs::read_to_string(&page).expect("the page was written");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("\"killed\":1"));
    for outside in ["http://", "https://", "src=", "<link", "url(", "@import"] {
        assert!(!html.contains(outside), "the page references {outside}");
    }
    let o = gate(&["model", "--html", "/nonexistent-dir/run.html"]);
    assert_eq!(o.status.code(), Some(73));
    assert!(stderr(&o).contains("/nonexistent-dir/run.html"));
    let _ = std::fs::remove_dir_all(&dir);
}
