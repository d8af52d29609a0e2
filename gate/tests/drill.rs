//! `drainit-gate drill` against real processes: replicas of a small Python app
//! (tests/fixtures/drillapp.py) under the real drainit with `--proxy`, the
//! built-in router or a real HAProxy, a real SIGTERM, a real HTTP client. Time is
//! scaled by 0.25 (the 40 s scenario runs in 10 s; the app's 7 s invocation is
//! `/work?ms=1750`), which leaves 250 ms between any arrival and any completion.
//! On a machine so loaded that the drill sends late, its JSON's `warnings` say so.
//! Every test asserts that nothing it started is still running afterwards.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{assert_nothing_left, drainit, fixture, gate, marker, text};

const SCALE: &str = "0.25";
const WORK: &str = "/work?ms=1750";

struct Drill {
    code: Option<i32>,
    out: String,
    err: String,
    json: Value,
}

/// Runs `drainit-gate drill --json` with the opening scenario (startup 0: the
/// clock starts once every replica is ready), `extra` flags and `env`, the app in
/// `mode`; checks nothing is left running.
fn drill(test: &str, extra: &[&str], env: &[(&str, &str)], mode: &str) -> Drill {
    let m = marker(test);
    let bin = drainit();
    let app = fixture("drillapp.py");
    let mut args = vec![
        "drill",
        "--json",
        "--time-scale",
        SCALE,
        "--path",
        WORK,
        "--drainit",
        bin.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", &app, "{port}", mode]);
    let mut envs = vec![
        ("DRILL_TEST_MARKER", m.as_str()),
        ("DRAINIT_PRE_DRAIN_DELAY", "0"),
    ];
    envs.extend_from_slice(env);
    let o = gate(&args, &envs);
    assert_nothing_left(&m);
    let out = text(&o.stdout);
    Drill {
        code: o.status.code(),
        json: serde_json::from_str(&out).unwrap_or(Value::Null),
        out,
        err: text(&o.stderr),
    }
}

fn ids(d: &Drill, status: &str) -> Vec<u64> {
    d.json["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["status"] == status)
        .map(|r| r["id"].as_u64().expect("id"))
        .collect()
}

fn ledger(d: &Drill) -> [u64; 5] {
    let l = &d.json["ledger"];
    ["committed", "rejected", "failed", "killed", "not_attempted"]
        .map(|k| l[k].as_u64().unwrap_or(u64::MAX))
}

/// The opening scenario with startup 0 and enough grace: the model's ledger, 18
/// committed and 2 rejected (#17, #19: W2 alone while W1 drains), and both sides
/// of every replica agree.
fn opening_passes_with_allowance(d: &Drill) {
    assert_eq!(d.code, Some(0), "{}\n{}", d.out, d.err);
    assert_eq!(ledger(d), [18, 2, 0, 0, 0], "{}", d.out);
    assert_eq!(ids(d, "rejected"), [17, 19], "{}", d.out);
    assert_eq!(d.json["pass"], true);
    for r in d.json["replicas"].as_array().expect("replicas") {
        assert_eq!(r["mismatches"], serde_json::json!([]), "{}", d.out);
        assert_eq!(r["report"]["state"], "final", "{}", d.out);
    }
    // W1 was signalled at 30 s and drained; W2 never was.
    assert_eq!(
        d.json["replicas"][0]["signal_s"].as_f64().map(f64::round),
        Some(30.0)
    );
    assert!(d.json["replicas"][1]["signal_s"].is_null());
}

#[test]
fn graceful_app_builtin_router_gives_the_models_ledger() {
    let d = drill(
        "graceful-builtin",
        &["--allow-503", "10"],
        &[("DRAINIT_DRAIN_TIMEOUT", "5s")],
        "graceful",
    );
    opening_passes_with_allowance(&d);
    // Without the allowance, the same run fails on the rejections alone.
    let d = drill(
        "graceful-builtin-0",
        &[],
        &[("DRAINIT_DRAIN_TIMEOUT", "5s")],
        "graceful",
    );
    assert_eq!(d.code, Some(1), "{}", d.out);
    assert_eq!(ledger(&d), [18, 2, 0, 0, 0], "{}", d.out);
    let reasons = d.json["reasons"].to_string();
    assert!(
        reasons.contains("2 rejected (#17, #19) > allowance 0"),
        "{reasons}"
    );
}

#[test]
fn app_ignoring_sigterm_builtin_router_loses_nothing_behind_the_proxy() {
    // drainit forwards SIGTERM only once its proxy has nothing in flight; the app
    // ignores it and is SIGKILLed at the drain timeout with no request inside.
    let d = drill(
        "ignore-builtin",
        &["--allow-503", "10"],
        &[("DRAINIT_DRAIN_TIMEOUT", "3s")],
        "ignore",
    );
    opening_passes_with_allowance(&d);
    assert_eq!(d.json["replicas"][0]["report"]["exit_code"], 2, "{}", d.out);
}

fn haproxy_present() {
    assert!(
        std::process::Command::new("haproxy")
            .arg("-v")
            .output()
            .is_ok(),
        "these tests need HAProxy (Debian: apt-get install haproxy; .ci/run installs it)"
    );
}

#[test]
fn graceful_app_behind_haproxy() {
    haproxy_present();
    let d = drill(
        "graceful-haproxy",
        &["--router", "haproxy", "--allow-503", "10"],
        &[("DRAINIT_DRAIN_TIMEOUT", "5s")],
        "graceful",
    );
    opening_passes_with_allowance(&d);
    // HAProxy's own 503s (a full queue) were never sent to a replica.
    for r in d.json["requests"].as_array().expect("rows") {
        if r["status"] == "rejected" {
            assert_eq!(r["attempts"][0]["outcome"], "rejected_router", "{r}");
            assert!(r["worker"].is_null(), "{r}");
        }
    }
}

#[test]
fn app_ignoring_sigterm_behind_haproxy() {
    haproxy_present();
    let d = drill(
        "ignore-haproxy",
        &["--router", "haproxy", "--allow-503", "10"],
        &[("DRAINIT_DRAIN_TIMEOUT", "3s")],
        "ignore",
    );
    opening_passes_with_allowance(&d);
}

/// `--replacement` (maxSurge): W3 boots at the signal and, once ready, takes the
/// load W1 no longer can. How soon it is ready depends on how fast python starts
/// on this machine (the model's startup), so the assertions hang on W3's measured
/// ready time: 26 requests (arrivals to 51 s), every one arriving once W3 has
/// been ready for a check interval commits, any rejection comes before, and
/// nothing fails.
fn replacement_takes_the_load(router: &str) {
    let d = drill(
        &format!("replacement-{router}"),
        &["--router", router, "--replacement", "--requests", "26"],
        &[("DRAINIT_DRAIN_TIMEOUT", "5s")],
        "graceful",
    );
    let [committed, rejected, failed, killed, not] = ledger(&d);
    assert_eq!((failed, killed, not), (0, 0, 0), "{}", d.out);
    assert_eq!(committed + rejected, 26, "{}", d.out);
    let w3 = &d.json["replicas"][2];
    assert_eq!(w3["name"], "W3");
    let ready = w3["ready_s"].as_f64().expect("W3 got ready");
    assert!(ready >= 30.0, "{}", d.out);
    assert!(w3["client"]["whole"].as_u64() >= Some(1), "{}", d.out);
    assert_eq!(w3["mismatches"], serde_json::json!([]), "{}", d.out);
    for r in d.json["requests"].as_array().expect("rows") {
        let planned = r["planned_s"].as_f64().expect("planned");
        if planned >= ready + 2.0 {
            assert_eq!(r["status"], "committed", "W3 ready at {ready}: {r}");
        }
    }
    // Ready by 31 s (a quick start), W3 takes #17 and #19 and all commit, as in
    // the model with startup 0.
    if ready < 31.0 {
        assert_eq!(rejected, 0, "{}", d.out);
    }
}

#[test]
fn a_replacement_takes_the_load_builtin_router() {
    replacement_takes_the_load("builtin");
}

#[test]
fn a_replacement_takes_the_load_behind_haproxy() {
    haproxy_present();
    replacement_takes_the_load("haproxy");
}

#[test]
fn a_drain_timeout_too_short_for_the_work_in_flight_fails_naming_the_killed() {
    // At 30 s W1 runs #13 (0.5 s real left) and #15 (1.5 s left): a 1 s drain
    // timeout lets #13 commit and abandons #15.
    let d = drill(
        "short-drain",
        &["--allow-503", "10"],
        &[("DRAINIT_DRAIN_TIMEOUT", "1s")],
        "graceful",
    );
    assert_eq!(d.code, Some(1), "{}\n{}", d.out, d.err);
    assert_eq!(ids(&d, "killed"), [15], "{}", d.out);
    let row = &d.json["requests"][14];
    assert_eq!(row["ledger"], "abandoned", "{row}");
    assert_eq!(row["worker"], "W1", "{row}");
    let reasons = d.json["reasons"].to_string();
    assert!(reasons.contains("1 killed in flight (#15)"), "{reasons}");
    // Both sides still agree: the client lost one answer, the ledger abandoned one.
    assert_eq!(d.json["replicas"][0]["mismatches"], serde_json::json!([]));
    assert_eq!(d.json["replicas"][0]["report"]["requests"]["abandoned"], 1);
}

/// #17 and #19 are retried (once a scenario second) until W2 has a free slot; which
/// retry wins a slot freed at the same instant as an arrival is a race, so the
/// budget (40) outlasts every other request.
#[test]
fn retries_turn_the_rejections_into_commits_and_show_each_attempt() {
    let d = drill(
        "retry",
        &["--retry", "40"],
        &[("DRAINIT_DRAIN_TIMEOUT", "5s")],
        "graceful",
    );
    assert_eq!(d.code, Some(0), "{}\n{}", d.out, d.err);
    assert_eq!(ledger(&d), [20, 0, 0, 0, 0], "{}", d.out);
    let r17 = &d.json["requests"][16];
    let attempts = r17["attempts"].as_array().expect("attempts");
    assert!(attempts.len() > 1, "{r17}");
    assert_eq!(attempts[0]["outcome"], "rejected_router", "{r17}");
    assert_eq!(
        attempts.last().expect("one")["outcome"],
        "committed",
        "{r17}"
    );
    assert_eq!(r17["worker"], "W2", "{r17}");
}

#[test]
fn the_text_and_the_page() {
    let dir = std::env::temp_dir().join(format!("drill-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let page = dir.join("drill.html");
    let m = marker("page");
    let bin = drainit();
    let app = fixture("drillapp.py");
    let o = gate(
        &[
            "drill",
            "--time-scale",
            "0.05",
            "--requests",
            "4",
            "--signal-at",
            "4s",
            "--check-interval",
            "0",
            "--path",
            "/work?ms=100",
            "--html",
            page.to_str().expect("utf-8"),
            "--drainit",
            bin.to_str().expect("utf-8"),
            "--",
            "python3",
            &app,
            "{port}",
        ],
        &[("DRILL_TEST_MARKER", &m), ("DRAINIT_PRE_DRAIN_DELAY", "0")],
    );
    assert_nothing_left(&m);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    assert!(
        out.contains("Ledger: 4 committed, 0 rejected, 0 failed, 0 killed"),
        "{out}"
    );
    assert!(out.contains("GATE PASSES"), "{out}");
    assert!(out.contains("W1→committed"), "{out}");
    let html = std::fs::read_to_string(&page).expect("the page");
    assert!(html.contains("drainit-gate drill"));
    assert!(html.contains("\"committed\":4"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad input: exit 2, the message, nothing left running, within `bound`.
fn refused(test: &str, args: &[&str], cmd: &[&str], bound: Duration, says: &str) {
    let m = marker(test);
    let bin = drainit();
    let mut all = vec!["drill", "--drainit", bin.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(cmd);
    let t = Instant::now();
    let o = gate(&all, &[("DRILL_TEST_MARKER", &m)]);
    let took = t.elapsed();
    assert_nothing_left(&m);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(says), "{err}");
    assert!(took < bound, "took {took:?}");
}

#[test]
fn a_command_without_port_is_refused() {
    let app = fixture("drillapp.py");
    refused(
        "noport",
        &[],
        &["python3", &app, "8080"],
        Duration::from_secs(5),
        "the command has no {port}",
    );
}

#[test]
fn a_replica_that_never_gets_ready_ends_the_drill_with_exit_2() {
    // Listens nowhere: drainit's --ready-tcp never passes.
    refused(
        "neverready",
        &["--ready-timeout", "2s"],
        &["python3", "-c", "import time,sys; time.sleep(60)", "{port}"],
        Duration::from_secs(10),
        "never answered /readyz 200 within --ready-timeout 2s",
    );
}

#[test]
fn a_replica_that_exits_at_start_is_named() {
    refused(
        "exits",
        &[],
        &[
            "python3",
            "-c",
            "import sys; print('no config'); sys.exit(3)",
            "{port}",
        ],
        Duration::from_secs(10),
        "exited before it was ready",
    );
}

#[test]
fn a_taken_port_is_named() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    let base = port.to_string();
    let app = fixture("drillapp.py");
    refused(
        "taken",
        &["--port-base", &base],
        &["python3", &app, "{port}"],
        Duration::from_secs(5),
        &format!("port {port} (of --port-base {port}.."),
    );
}

#[test]
fn haproxy_missing_is_named() {
    let app = fixture("drillapp.py");
    refused(
        "nohaproxy",
        &["--router", "haproxy", "--haproxy", "/nonexistent/haproxy"],
        &["python3", &app, "{port}"],
        Duration::from_secs(5),
        "HAProxy not found (/nonexistent/haproxy)",
    );
}

#[test]
fn ctrl_c_keeps_the_rows_not_sent_as_not_attempted() {
    let m = marker("ctrlc");
    let bin = drainit();
    let app = fixture("drillapp.py");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args([
            "drill",
            "--json",
            "--time-scale",
            SCALE,
            "--path",
            "/work?ms=200",
            "--drainit",
            bin.to_str().expect("utf-8"),
            "--",
            "python3",
            &app,
            "{port}",
        ])
        .env("DRILL_TEST_MARKER", &m)
        .env("DRAINIT_PRE_DRAIN_DELAY", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Once the drill runs (its replicas exist), a few requests in: SIGINT.
    let until = Instant::now() + Duration::from_secs(20);
    while support::survivors(&m).len() < 3 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let _ = nix_kill(child.id());
    let interrupted = Instant::now();
    let o = child.wait_with_output().expect("wait");
    // It stops at once: it does not wait for the last planned request's time (39 s
    // scaled: 7.8 s), only for the replicas to drain (nothing long is in flight).
    let took = interrupted.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "the drill took {took:?} to stop"
    );
    assert_nothing_left(&m);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", text(&o.stderr));
    let d = Drill {
        code: o.status.code(),
        json: serde_json::from_str(&out).expect("json"),
        out,
        err: String::new(),
    };
    let not = ids(&d, "not_attempted");
    assert!(!not.is_empty() && not.contains(&20), "{}", d.out);
    assert_eq!(d.json["requests"].as_array().map(Vec::len), Some(20));
    assert!(
        d.json["stopped"].to_string().contains("interrupted"),
        "{}",
        d.out
    );
    let _ = d.code;
    let _ = d.err;
}

fn nix_kill(pid: u32) -> std::io::Result<()> {
    let st = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    assert!(st.success());
    Ok(())
}
