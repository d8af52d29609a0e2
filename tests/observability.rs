//! Operations, black box: `GET /metrics` read by a real Prometheus
//! parser (the Python `prometheus_client` package; `.ci/run` installs it), the
//! `--probe` health-check client, drain progress lines, timestamps and journald
//! priorities in the log, and the partial report a SIGKILL of drainit leaves.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses exposition text with `prometheus_client`'s parser, which raises on
/// anything malformed; also checks that every family is `drainit_*` and has its
/// HELP and TYPE lines. Returns the samples.
fn parse_metrics(text: &str) -> Vec<Sample> {
    const PARSE: &str = r#"
import json, sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit("the Python package prometheus_client is missing: python3 -m pip install prometheus_client (.ci/run installs it)")
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "help": f.documentation,
                "samples": [[s.name, s.labels, s.value] for s in f.samples]})
print(json.dumps(out))
"#;
    let mut child = Command::new(python())
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let families: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut samples = Vec::new();
    for f in families.as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        assert!(name.starts_with("drainit_"), "{name}\n{text}");
        assert_ne!(f["type"], "unknown", "{name} has no TYPE line\n{text}");
        assert!(
            !f["help"].as_str().unwrap_or("").is_empty(),
            "{name} has no HELP line\n{text}"
        );
        for s in f["samples"].as_array().unwrap() {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            samples.push((
                s[0].as_str().unwrap().to_string(),
                labels,
                s[2].as_f64().unwrap(),
            ));
        }
    }
    samples
}

/// The value of the sample `name` whose labels include `labels`; `None` if absent.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

fn scrape(port: u16) -> Vec<Sample> {
    let (status, head, body) = http(port, "/metrics", "GET");
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    parse_metrics(&body)
}

/// The file check's runs: at least one pass, and a duration histogram whose
/// `+Inf` bucket holds every run.
fn assert_file_check_counted(m: &[Sample]) {
    let pass = [("check", "file"), ("result", "pass")];
    assert!(
        value(m, "drainit_checks_total", &pass) >= Some(1.0),
        "{m:?}"
    );
    assert!(
        value(
            m,
            "drainit_check_duration_seconds_count",
            &[("check", "file")]
        ) >= Some(1.0)
    );
    let inf = [("check", "file"), ("le", "+Inf")];
    assert_eq!(
        value(m, "drainit_check_duration_seconds_bucket", &inf),
        value(
            m,
            "drainit_check_duration_seconds_count",
            &[("check", "file")]
        )
    );
}

#[test]
fn metrics_count_what_happened_before_and_during_a_drain() {
    for mode in BOTH {
        let port = free_port();
        let probe = format!("127.0.0.1:{port}");
        let tmp = TmpDir::new("metrics");
        let ready_file = tmp.join("ready");
        std::fs::write(&ready_file, "").unwrap();
        // An orphan: the subshell's `sleep` is re-parented to drainit and reaped by it.
        let app = format!(
            "(sleep 0.2 &); exec env NAME=app STUBBORN=1 {} {}",
            python(),
            fixture("sigapp.py")
        );
        let args = [
            "--probe-addr",
            &probe,
            "--ready-file",
            ready_file.to_str().unwrap(),
            "--pre-drain-delay",
            "300ms",
            "--drain-timeout",
            "10s",
            "--",
            "sh",
            "-c",
            &app,
        ];
        let mut r = Running::start(mode, &args);
        r.wait_started(&["app"]);
        wait_for(secs(10), || {
            (http(port, "/readyz", "GET").0 == 200).then_some(())
        })
        .unwrap_or_else(|| panic!("{mode:?}: never ready\n{}", r.stderr_text()));
        r.signal(libc::SIGHUP);
        assert!(r.wait_mark("app: got SIGHUP", secs(5)), "{mode:?}");
        assert_eq!(http(port, "/healthz", "GET").0, 200);
        assert_eq!(http(port, "/no/such/path", "GET").0, 404);

        let m = wait_for(secs(5), || {
            let m = scrape(port);
            (value(&m, "drainit_orphans_reaped_total", &[]) >= Some(1.0)).then_some(m)
        })
        .unwrap_or_else(|| panic!("{mode:?}: the orphan was never counted"));
        assert_eq!(value(&m, "drainit_phase", &[("phase", "ready")]), Some(1.0));
        assert_eq!(
            value(&m, "drainit_phase", &[("phase", "draining")]),
            Some(0.0)
        );
        assert_eq!(value(&m, "drainit_ready", &[]), Some(1.0));
        assert!(value(&m, "drainit_descendants", &[]) >= Some(1.0), "{m:?}");
        let sighup = [("signal", "SIGHUP")];
        assert_eq!(
            value(&m, "drainit_signals_received_total", &sighup),
            Some(1.0)
        );
        assert_eq!(
            value(&m, "drainit_signals_forwarded_total", &sighup),
            Some(1.0)
        );
        assert_file_check_counted(&m);
        let req = |path, status| {
            value(
                &m,
                "drainit_probe_requests_total",
                &[("path", path), ("status", status)],
            )
        };
        assert!(req("/readyz", "200") >= Some(1.0), "{m:?}");
        // /readyz may have answered 503 `starting` while the test waited for 200.
        let starting_503 = req("/readyz", "503").unwrap_or(0.0);
        assert_eq!(req("/healthz", "200"), Some(1.0));
        assert_eq!(req("other", "404"), Some(1.0));

        // During the drain: after the forward, the app (which ignores TERM) is
        // still there.
        r.signal(libc::SIGTERM);
        assert!(r.wait_mark("app: got SIGTERM", secs(5)), "{mode:?}");
        assert_eq!(http(port, "/readyz", "GET").0, 503);
        let m = scrape(port);
        assert_eq!(
            value(&m, "drainit_phase", &[("phase", "draining")]),
            Some(1.0)
        );
        assert_eq!(value(&m, "drainit_phase", &[("phase", "ready")]), Some(0.0));
        assert_eq!(value(&m, "drainit_ready", &[]), Some(0.0));
        assert!(value(&m, "drainit_descendants", &[]) >= Some(1.0), "{m:?}");
        let term = [("signal", "SIGTERM")];
        assert_eq!(
            value(&m, "drainit_signals_received_total", &term),
            Some(1.0)
        );
        assert_eq!(
            value(&m, "drainit_signals_forwarded_total", &term),
            Some(1.0)
        );
        let drain_503 = [("path", "/readyz"), ("status", "503")];
        assert_eq!(
            value(&m, "drainit_probe_requests_total", &drain_503),
            Some(starting_503 + 1.0)
        );
        // A second TERM cuts the drain short (SIGKILL now).
        r.signal(libc::SIGTERM);
        let (rc, _) = r.wait(secs(10));
        assert_eq!(rc, 2, "{mode:?}: {}", r.stderr_text());
    }
}

#[test]
fn metrics_answer_head_and_refuse_other_methods() {
    let port = free_port();
    let probe = format!("127.0.0.1:{port}");
    let mut r = Running::start(
        Mode::Subreaper,
        &["--probe-addr", &probe, "--", "sleep", "30"],
    );
    wait_for(secs(10), || {
        (http(port, "/healthz", "GET").0 == 200).then_some(())
    })
    .unwrap_or_else(|| panic!("no probe server\n{}", r.stderr_text()));
    let (st, head, body) = http(port, "/metrics", "HEAD");
    assert_eq!((st, body.as_str()), (200, ""), "{head}");
    assert!(head.contains("content-length: "), "{head}");
    assert_eq!(http(port, "/metrics", "POST").0, 405);
    r.signal(libc::SIGTERM);
    r.wait(secs(10));
}

/// Runs `drainit ARGS` to its end (at most `within`): (exit code, stdout, stderr,
/// how long it took).
fn run_client(
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> (i32, String, String, Duration) {
    let tmp = TmpDir::new("client");
    let (out, err) = (tmp.join("out"), tmp.join("err"));
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let code = wait_for(within, || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("drainit {args:?} still running after {within:?}")
    });
    (
        code.code().unwrap_or(-1),
        std::fs::read_to_string(out).unwrap(),
        std::fs::read_to_string(err).unwrap(),
        started.elapsed(),
    )
}

#[test]
fn the_probe_client_exits_0_on_200_and_1_otherwise_within_its_bound() {
    let port = free_port();
    let probe = format!("127.0.0.1:{port}");
    let any = format!("0.0.0.0:{port}");
    let tmp = TmpDir::new("client-ready");
    let ready_file = tmp.join("ready");
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            "--probe-addr",
            &probe,
            "--ready-file",
            ready_file.to_str().unwrap(),
            "--",
            "sleep",
            "30",
        ],
    );
    wait_for(secs(10), || {
        (http(port, "/healthz", "GET").0 == 200).then_some(())
    })
    .unwrap_or_else(|| panic!("no probe server\n{}", r.stderr_text()));
    let children_before = children_of(r.pid).len();

    // Starting: /readyz is 503 → 1; /healthz is 200 → 0.
    let (rc, out, err, _) = run_client(
        &["--probe", "readyz", "--probe-addr", &probe],
        &[],
        secs(10),
    );
    assert_eq!(rc, 1, "{out}{err}");
    assert!(out.contains("\"starting\""), "{out}");
    assert!(err.contains("/readyz answered 503"), "{err}");
    let (rc, out, _, _) = run_client(
        &["--probe", "healthz", "--probe-addr", &probe],
        &[],
        secs(10),
    );
    assert_eq!((rc, out.trim()), (0, r#"{"status":"ok"}"#));

    // Ready; the address from the environment, 0.0.0.0 asked on 127.0.0.1.
    std::fs::write(&ready_file, "").unwrap();
    let env = [("DRAINIT_PROBE_ADDR", any.as_str())];
    wait_for(secs(10), || {
        (run_client(&["--probe", "readyz"], &env, secs(10)).0 == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("--probe readyz never exited 0\n{}", r.stderr_text()));
    // The clients started nothing under the running drainit, and it is unaffected.
    assert_eq!(children_of(r.pid).len(), children_before);

    // Nothing listening: 1, at once.
    let closed = format!("127.0.0.1:{}", free_port());
    let (rc, _, err, took) = run_client(
        &["--probe", "healthz", "--probe-addr", &closed],
        &[],
        secs(10),
    );
    assert_eq!(rc, 1);
    assert!(err.contains("connection refused"), "{err}");
    assert!(took < secs(3), "{took:?}");

    // A server that accepts and never answers: 1 after the 3 s bound.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let (rc, _, err, took) = run_client(
        &["--probe", "readyz", "--probe-addr", &silent_addr],
        &[],
        secs(10),
    );
    assert_eq!(rc, 1);
    assert!(err.contains("timed out after 3s"), "{err}");
    assert!(took >= secs(3) && took < secs(6), "{took:?}");
    drop(silent);

    // Off, a bad path, a command, --check-config: refused.
    assert_eq!(
        run_client(&["--probe", "readyz", "--probe-addr", "off"], &[], secs(10)).0,
        1
    );
    let (rc, _, err, _) = run_client(&["--probe", "metrics"], &[], secs(10));
    assert_eq!(rc, 64, "{err}");
    assert!(err.contains("--probe"), "{err}");
    let (rc, _, err, _) = run_client(&["--probe", "readyz", "--", "true"], &[], secs(10));
    assert_eq!(rc, 64, "{err}");
    // Two things to do at once: neither is done (the probe ran before).
    let (rc, _, err, _) = run_client(&["--probe", "readyz", "--check-config"], &[], secs(10));
    assert_eq!(rc, 64, "{err}");
    assert!(err.contains("--check-config"), "{err}");

    r.signal(libc::SIGTERM);
    r.wait(secs(10));
}

#[test]
fn a_long_drain_logs_progress_every_second_naming_what_is_left() {
    for mode in BOTH {
        let app = sigapp("app", &["STUBBORN=1"]);
        let mut r = Running::start(
            mode,
            &cmd(
                &[OFF, "--pre-drain-delay", "0s", "--drain-timeout", "3s"],
                &app,
            ),
        );
        r.wait_started(&["app"]);
        let pid = r.field("app", "pid").unwrap();
        r.signal(libc::SIGTERM);
        let (rc, _) = r.wait(secs(10));
        assert_eq!(rc, 2, "{mode:?}: {}", r.stderr_text());
        let stderr = r.stderr_text();
        let progress: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("drainit: draining: 1 process(es) left ("))
            .collect();
        assert!(progress.len() >= 2, "{mode:?}: {stderr}");
        for l in &progress {
            assert!(l.contains(&format!("({pid} python3)")), "{mode:?}: {l}");
            assert!(l.contains("; SIGKILL in "), "{mode:?}: {l}");
        }
    }
}

#[test]
fn a_quick_drain_logs_no_progress() {
    let app = sigapp("app", &[]);
    let mut r = Running::start(
        Mode::Subreaper,
        &cmd(
            &[OFF, "--pre-drain-delay", "0s", "--drain-timeout", "5s"],
            &app,
        ),
    );
    let (rc, _) = r.stop_after_start(&["app"], secs(10));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert!(
        !r.stderr_text().contains("process(es) left ("),
        "{}",
        r.stderr_text()
    );
}

#[test]
fn json_log_lines_carry_an_rfc3339_utc_timestamp() {
    let before = now_ms();
    let mut r = Running::start(
        Mode::Subreaper,
        &[OFF, "--log-format", "json", "--", "true"],
    );
    let (rc, _) = r.wait(secs(10));
    let after = now_ms();
    assert_eq!(rc, 0);
    let stderr = r.stderr_text();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let logs: Vec<&Value> = lines.iter().filter(|v| v["drainit"] == "log").collect();
    assert!(logs.len() >= 2, "{stderr}");
    for v in logs {
        let ts = v["ts"].as_str().unwrap_or_else(|| panic!("no ts: {v}"));
        // 2026-12-01T15:32:25.123Z
        let b = ts.as_bytes();
        assert_eq!(ts.len(), 24, "{ts}");
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16], b[19], b[23]),
            (b'-', b'-', b'T', b':', b':', b'.', b'Z'),
            "{ts}"
        );
        // The same instant as the system's own reading of it.
        let out = Command::new("date")
            .args(["-u", "-d", &ts[..19].replace('T', " "), "+%s"])
            .output()
            .unwrap();
        let secs: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let ms = secs * 1000 + ts[20..23].parse::<u64>().unwrap();
        assert!(
            ms + 5 >= before && ms <= after + 5,
            "{ts} outside [{before}, {after}]"
        );
    }
    // The exit report is not a log line: its shape is unchanged.
    assert!(lines.last().unwrap().get("ts").is_none());
}

/// drainit on `args` with stderr a file, `JOURNAL_STREAM` naming that file (or
/// another one, `matching` false); returns stderr's text.
fn run_with_journal_stream(args: &[&str], matching: bool) -> String {
    use std::os::unix::fs::MetadataExt;
    let tmp = TmpDir::new("journal");
    let path = tmp.join("stderr");
    let file = std::fs::File::create(&path).unwrap();
    let meta = if matching {
        file.metadata().unwrap()
    } else {
        std::fs::metadata(tmp.path()).unwrap()
    };
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env("JOURNAL_STREAM", &stream)
        .env("DRAINIT_TEST_TMP", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    reset_glibc_signals(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_for(secs(10), || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("drainit did not exit")
    });
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn under_journald_lines_carry_syslog_priorities() {
    // --grace-period 1s makes the budget a warning.
    let args = [OFF, "--grace-period", "1s", "--", "true"];
    let text = run_with_journal_stream(&args, true);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<4>drainit: warning: grace budget")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<6>drainit: started true")),
        "{text}"
    );
    for l in &lines {
        assert!(l.starts_with('<'), "a line without priority: {l}\n{text}");
    }
    // The report: prefixed too (journald strips the prefix), JSON after it.
    let report: Value =
        serde_json::from_str(lines.last().unwrap().strip_prefix("<6>").unwrap()).unwrap();
    assert_eq!(report["exit_code"], 0);

    // JOURNAL_STREAM inherited but stderr elsewhere: no prefixes.
    let text = run_with_journal_stream(&args, false);
    assert!(text.lines().all(|l| !l.starts_with('<')), "{text}");
    assert!(text.contains("drainit: warning: grace budget"), "{text}");
}

#[test]
fn a_sigkilled_drainit_leaves_the_partial_report() {
    // As PID 1: SIGKILL of drainit takes the whole namespace with it, the stubborn
    // app included (as a platform's SIGKILL of a container does).
    let app = sigapp("app", &["STUBBORN=1"]);
    let mut r = Running::start(
        Mode::Pid1,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "0s",
                "--drain-timeout",
                "20s",
                "--report-file",
                "$TMP/report.json",
            ],
            &app,
        ),
    );
    r.wait_started(&["app"]);
    let path = r.path("report.json");
    assert!(!path.exists(), "a report before any drain");
    r.signal(libc::SIGTERM);
    assert!(r.wait_mark("app: got SIGTERM", secs(5)));
    // Written at T0, then again after the forward.
    let report: Value = wait_for(secs(5), || {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
        v["drain"]["forwarded_at_ms"].is_u64().then_some(v)
    })
    .unwrap_or_else(|| panic!("no partial report after the forward\n{}", r.stderr_text()));
    r.signal(libc::SIGKILL);
    r.wait(secs(10));
    let left: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(left, report);
    assert_eq!(left["final"], false, "{left}");
    assert_eq!(left["exit_code"], Value::Null, "{left}");
    assert_eq!(text(&left, "reason"), "draining");
    assert_eq!(text(&left, "signal"), "SIGTERM");
    assert_eq!(num(&left, "drain.in_flight_at_start"), 1);
    assert_eq!(num(&left, "drain.deadline_ms"), 20000);
    assert_eq!(left["drain"]["finished_at_ms"], Value::Null);
    // Only the report itself is in the folder: no temporary file left behind.
    let stray: Vec<_> = std::fs::read_dir(r.tmp.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn the_final_report_replaces_the_partial_one() {
    let app = sigapp("app", &[]);
    let mut r = Running::start(
        Mode::Subreaper,
        &cmd(
            &[
                OFF,
                "--pre-drain-delay",
                "0s",
                "--drain-timeout",
                "5s",
                "--report-file",
                "$TMP/report.json",
            ],
            &app,
        ),
    );
    let (rc, _) = r.stop_after_start(&["app"], secs(10));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(r.path("report.json")).unwrap()).unwrap();
    assert_eq!(file["final"], true, "{file}");
    assert_eq!(num(&file, "exit_code"), 0);
    assert_eq!(text(&file, "reason"), "drained");
    assert_eq!(file, r.report());
}

/// `--probe` answers 0 or 1 only: a setting the client does not need that fails
/// to resolve (the image's `DRAINIT_*` environment, seen by a health check run as
/// another user) is an unhealthy answer, not a 78; a bad `--probe` value is 64.
#[test]
fn the_probe_client_never_exits_78() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(bin());
        c.args(args).stdin(std::process::Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap().status.code()
    };
    let addr = format!("127.0.0.1:{}", free_port());
    assert_eq!(
        run(
            &["--probe", "readyz", "--probe-addr", &addr],
            &[("DRAINIT_REPORT_FILE", "/nonexistent/x")]
        ),
        Some(1)
    );
    assert_eq!(
        run(
            &["--probe=healthz", "--probe-addr", &addr],
            &[("DRAINIT_USER", "ghost")]
        ),
        Some(1)
    );
    assert_eq!(run(&["--probe", "bogus"], &[]), Some(64));
}
