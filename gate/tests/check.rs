//! `drainit-gate check REPORT…`, the fleet gate, on real exit reports: each written
//! by the real drainit with `--proxy` in front of tests/fixtures/drillapp.py after
//! real requests and a real SIGTERM, read from files and from stdin among other
//! log lines (as `kubectl logs --previous` prints them); plus partial and missing
//! reports, which a platform's SIGKILL or a lost log leave.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Replica, assert_nothing_left, gate, http_get, marker, text};

/// Runs one replica (drainit --proxy in front of the app), sends `ok` quick
/// requests, one `/work?ms=slow_ms` in flight at the SIGTERM if asked, and returns
/// the report file drainit wrote.
fn replica(dir: &Path, name: &str, ok: u32, slow_ms: Option<u32>, drain_timeout: &str) -> PathBuf {
    let m = marker(&format!("check-{name}"));
    let report = dir.join(format!("{name}.json"));
    let r = Replica::start(
        &m,
        &["--report-file", report.to_str().expect("utf-8")],
        &[("DRAINIT_DRAIN_TIMEOUT", drain_timeout)],
    );
    let proxy = r.proxy;
    for _ in 0..ok {
        assert_eq!(http_get(proxy, "/").0, 200);
    }
    let slow = slow_ms.map(|ms| {
        let t = std::thread::spawn(move || http_get(proxy, &format!("/work?ms={ms}")));
        std::thread::sleep(Duration::from_millis(200));
        t
    });
    r.stop();
    if let Some(t) = slow {
        let _ = t.join();
    }
    assert_nothing_left(&m);
    report
}

fn tmp(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gate-check-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

#[test]
fn clean_reports_pass_and_their_ledgers_add_up() {
    let dir = tmp("clean");
    let a = replica(&dir, "a", 3, None, "5s");
    let b = replica(&dir, "b", 2, None, "5s");
    let o = gate(&["check", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("Ledger: 5 received, 5 completed, 0 rejected, 0 unknown, 0 abandoned"),
        "{out}"
    );
    assert!(out.contains("GATE PASSES"), "{out}");

    // The same report on stdin, among a pod's other log lines with a timestamp
    // prefix (kubectl logs --previous --timestamps), and as JSON.
    let report = std::fs::read_to_string(&a).expect("report");
    let log = format!(
        "2026-12-04T10:00:00Z app starting\n2026-12-04T10:00:01Z {{\"level\":\"info\"}}\n2026-12-04T10:00:09Z {}\n",
        report.trim()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args(["check", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(log.as_bytes())
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["pass"], true);
    assert_eq!(v["total"]["completed"], 3);
    assert_eq!(v["replicas"][0]["name"], "-");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lossy_report_fails_and_is_named() {
    let dir = tmp("lossy");
    let good = replica(&dir, "good", 2, None, "5s");
    // A 3 s request in flight at the SIGTERM, a 300 ms drain timeout: abandoned,
    // drainit exits 2.
    let lossy = replica(&dir, "lossy", 1, Some(3000), "300ms");
    let html = dir.join("fleet.html");
    let o = gate(
        &[
            "check",
            "--html",
            html.to_str().unwrap(),
            good.to_str().unwrap(),
            lossy.to_str().unwrap(),
        ],
        &[],
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let name = lossy.to_str().unwrap();
    assert!(out.contains(&format!("{name}: exit 2")), "{out}");
    assert!(
        out.contains(&format!("{name}: 0 unknown, 1 abandoned request(s)")),
        "{out}"
    );
    assert!(
        !out.contains(&format!("{}: exit", good.to_str().unwrap())),
        "{out}"
    );
    let page = std::fs::read_to_string(&html).expect("page");
    assert!(page.contains("drainit-gate check") && page.contains("abandoned"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn partial_and_missing_reports_count_against_the_gate() {
    let dir = tmp("partial");
    let good = replica(&dir, "good", 2, None, "5s");
    // What a platform's SIGKILL of drainit mid-drain leaves in its report file.
    let partial = dir.join("partial.json");
    std::fs::write(
        &partial,
        "{\"drainit\":\"0.1.0\",\"final\":false,\"exit_code\":null,\"reason\":\"draining\",\"signal\":\"SIGTERM\",\"requests\":{\"received\":4,\"rejected\":0,\"admitted\":4,\"completed\":3,\"unknown\":0,\"abandoned\":0,\"canceled\":0,\"in_flight\":1}}\n",
    )
    .expect("write");
    // A pod whose log holds no report (its previous container's log was lost).
    let nolog = dir.join("nolog.txt");
    std::fs::write(&nolog, "starting\nlistening on :8080\n").expect("write");
    let gone = dir.join("gone.json");
    let o = gate(
        &[
            "check",
            "--json",
            good.to_str().unwrap(),
            partial.to_str().unwrap(),
            nolog.to_str().unwrap(),
            gone.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let states: Vec<&str> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["final", "partial", "missing", "missing"]);
    let reasons = v["reasons"].to_string();
    assert!(
        reasons.contains("partial.json: the report is partial"),
        "{reasons}"
    );
    assert!(
        reasons.contains("nolog.txt: no report (no drainit report line)"),
        "{reasons}"
    );
    assert!(
        reasons.contains("gone.json: no report (reading"),
        "{reasons}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rejections_are_held_to_the_allowance() {
    let dir = tmp("allow");
    let line = |name: &str, received: u32, rejected: u32| {
        let p = dir.join(name);
        std::fs::write(&p, format!(
            "{{\"drainit\":\"0.1.0\",\"final\":true,\"exit_code\":0,\"reason\":\"drained\",\"requests\":{{\"received\":{received},\"rejected\":{rejected},\"admitted\":{},\"completed\":{},\"unknown\":0,\"abandoned\":0,\"canceled\":0,\"in_flight\":0}}}}\n",
            received - rejected, received - rejected
        )).expect("write");
        p.to_str().unwrap().to_owned()
    };
    let (a, b) = (line("a.json", 10, 1), line("b.json", 10, 1));
    assert_eq!(gate(&["check", &a, &b], &[]).status.code(), Some(1));
    let o = gate(&["check", "--allow-503", "10%", &a, &b], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert_eq!(gate(&["check"], &[]).status.code(), Some(64));
    let _ = std::fs::remove_dir_all(&dir);
}
