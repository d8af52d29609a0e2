//! Drain phases (docs/drain-phases.md) and the grace budget's platform, against real
//! processes, as a subreaper and as PID 1: phases run after the pre-drain delay
//! and before the forward, in order, on one budget; an overrun is canceled, one
//! that ignores it is abandoned (exit 2); a second signal cancels the running one
//! and skips the rest; a POST phase reaches the app while the proxy still admits;
//! the platform's markers give the default grace period and fit the defaults.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The report's phases as `(name, outcome)`.
fn outcomes(rep: &Value) -> Vec<(String, String)> {
    rep["phases"]
        .as_array()
        .unwrap_or_else(|| panic!("no phases in {rep}"))
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A number of the report, by JSON pointer (`/phases/0/start_ms`).
fn at(rep: &Value, pointer: &str) -> i64 {
    rep.pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("{pointer} is not a number in {rep}"))
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// A config file holding `text`, in a directory of its own.
fn config_file(text: &str) -> (TmpDir, String) {
    let dir = TmpDir::new("phases-cfg");
    let path = dir.join("drainit.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_str().unwrap().to_string())
}

#[test]
fn phases_run_in_order_after_the_delay_and_before_the_forward() {
    for mode in BOTH {
        let app = sigapp("app", &[]);
        let flags = [
            OFF,
            "--pre-drain-delay=300ms",
            "--drain-timeout=3s",
            "--phase-budget=3s",
            // Told its time; leaves a process behind in its group.
            "--drain-phase",
            "hand=sh -c 'echo \"hand: budget=$DRAINIT_PHASE_BUDGET_MS t=$(date +%s%3N)\" >> $MARK; sleep 60 & exit 0'",
            "--drain-phase",
            "fail=sh -c 'exit 3'",
            "--drain-phase",
            "after=sh -c 'echo \"after: ran t=$(date +%s%3N)\" >> $MARK'",
        ];
        let mut r = Running::start(mode, &cmd(&flags, &app));
        let (code, _) = r.stop_after_start(&["app"], secs(10));
        let rep = r.report();
        assert_eq!(
            code, 0,
            "a failed phase does not make the drain unclean: {rep}"
        );
        assert_eq!(
            outcomes(&rep),
            pairs(&[("hand", "ok"), ("fail", "failed"), ("after", "ok")]),
            "{mode:?}"
        );
        assert_eq!(rep["phases"][1]["exit_code"], 3);
        assert!(
            r.has("hand: budget=3000 "),
            "the phase is told its budget: {}",
            r.marks()
        );
        let (hand, after, term) = (
            r.mark_t("hand:").unwrap(),
            r.mark_t("after:").unwrap(),
            r.mark_t("app: got SIGTERM").unwrap(),
        );
        assert!(hand >= r.t0 + 300, "phases start when the delay ends");
        assert!(hand <= after && after <= term, "in order, then the forward");
        assert!(at(&rep, "/phases/0/start_ms") >= 300);
        // The leftover `sleep 60` was killed with its group and is not the app's.
        assert_eq!(at(&rep, "/drain/abandoned"), 0, "{rep}");
        assert_eq!(at(&rep, "/drain/completed"), 1, "only the app: {rep}");
        let text = r.stderr_text();
        for line in [
            "drain phase 'hand' ok after",
            "drain phase 'fail' failed after",
            "(exit code 3)",
            "drain phase 'after' ok after",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
    }
}

#[test]
fn an_overrun_is_canceled_one_that_ignores_it_is_abandoned_and_what_is_left_is_skipped() {
    let (_dir, path) = config_file(
        r#"
phase_budget = "1500ms"

[[drain.phase]]
name = "slow"
command = ["sleep", "30"]
max = "400ms"

[[drain.phase]]
name = "stubborn"
command = ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"]

[[drain.phase]]
name = "late"
command = ["true"]
"#,
    );
    for mode in BOTH {
        let app = sigapp("app", &[]);
        let flags = [
            OFF,
            "--pre-drain-delay=0s",
            "--drain-timeout=3s",
            "--config",
            &path,
        ];
        let mut r = Running::start(mode, &cmd(&flags, &app));
        let (code, took) = r.stop_after_start(&["app"], secs(10));
        let rep = r.report();
        assert_eq!(code, 2, "an abandoned phase makes exit 2: {rep}");
        assert_eq!(rep["reason"], "abandoned");
        assert_eq!(
            outcomes(&rep),
            pairs(&[
                ("slow", "timed_out"),
                ("stubborn", "abandoned"),
                ("late", "skipped")
            ]),
            "{mode:?}"
        );
        assert_eq!(rep["phases"][0]["signal"], "SIGTERM", "{rep}");
        let slow = at(&rep, "/phases/0/duration_ms");
        assert!((400..1400).contains(&slow), "canceled at its max: {slow}");
        // The stubborn one gets what is left (1.1 s), then a second to obey.
        let stubborn_end = at(&rep, "/phases/1/start_ms") + at(&rep, "/phases/1/duration_ms");
        assert!(
            (2500..4000).contains(&stubborn_end),
            "SIGKILLed a second after the budget ran out: {rep}"
        );
        let forwarded = at(&rep, "/drain/forwarded_at_ms");
        assert!(forwarded >= stubborn_end, "the forward after the phases");
        // Counted from the phases' end, never past T0's bound (delay + budget
        // + the last cancellation's second + drain timeout: 5.5 s).
        let deadline = at(&rep, "/drain/deadline_ms");
        assert!(
            deadline <= 5500 && deadline + 50 >= forwarded + 3000,
            "the deadline counts from the phases' end: {rep}"
        );
        assert!(took < 8000, "{took}");
        let text = r.stderr_text();
        assert!(
            text.contains("ignored its cancellation: SIGKILLed"),
            "{text}"
        );
        assert!(
            text.contains("drain phase 'late' skipped: under 100ms of the phase budget left"),
            "{text}"
        );
    }
}

#[test]
fn a_second_signal_cancels_the_running_phase_and_skips_the_rest() {
    for mode in BOTH {
        let app = sigapp("app", &[]);
        let flags = [
            OFF,
            "--pre-drain-delay=0s",
            "--drain-timeout=3s",
            "--phase-budget=20s",
            "--drain-phase",
            "long=sh -c 'echo \"long: started t=$(date +%s%3N)\" >> $MARK; exec sleep 30'",
            "--drain-phase",
            "next=sh -c 'echo next: ran >> $MARK'",
        ];
        let mut r = Running::start(mode, &cmd(&flags, &app));
        r.wait_started(&["app"]);
        r.signal(libc::SIGTERM);
        assert!(r.wait_mark("long: started", secs(5)), "{}", r.stderr_text());
        std::thread::sleep(Duration::from_millis(200));
        r.signal(libc::SIGTERM);
        let (code, took) = r.wait(secs(10));
        let rep = r.report();
        assert_eq!(code, 0, "{rep}");
        assert_eq!(
            outcomes(&rep),
            pairs(&[("long", "canceled"), ("next", "skipped")]),
            "{mode:?}"
        );
        assert!(!r.has("next: ran"));
        assert!(
            r.stderr_text()
                .contains("drain phase 'next' skipped: a second drain signal canceled the phases"),
            "{}",
            r.stderr_text()
        );
        assert!(r.has("app: got SIGTERM"));
        assert!(took < 3000, "the forward follows the cut: {took} ms");
    }
}

/// The app's own `POST /drain/handoff` (examples/demo-app.py, configured as in
/// examples/drain-phases.toml) while the proxy still admits; admission closes
/// when the phase ends.
#[test]
fn a_post_phase_reaches_the_app_while_admission_is_open() {
    let [app_port, proxy_port] = free_ports::<2>();
    let example = std::fs::read_to_string(format!(
        "{}/examples/drain-phases.toml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    // The example's handoff phase alone, on this test's port; the app takes 1 s.
    let handoff = example.split("[[drain.phase]]").nth(1).unwrap().replace(
        "127.0.0.1:8080/drain/handoff",
        &format!("127.0.0.1:{app_port}/drain/handoff?ms=1000"),
    );
    let (_dir, path) = config_file(&format!(
        "pre_drain_delay = \"0s\"\ndrain_timeout = \"3s\"\n[[drain.phase]]{handoff}"
    ));
    for mode in BOTH {
        let app_port_s = app_port.to_string();
        let proxy = format!("127.0.0.1:{proxy_port}=127.0.0.1:{app_port}");
        let ready = format!("127.0.0.1:{app_port}");
        let demo = format!("{}/examples/demo-app.py", env!("CARGO_MANIFEST_DIR"));
        let args = [
            OFF,
            "--config",
            &path,
            "--proxy",
            &proxy,
            "--ready-tcp",
            &ready,
            "--",
            python(),
            &demo,
            &app_port_s,
        ];
        let mut r = Running::start(mode, &args);
        assert!(
            wait_until(secs(10), || http(proxy_port, "/", "GET").0 == 200),
            "{}",
            r.stderr_text()
        );
        r.signal(libc::SIGTERM);
        assert!(
            wait_until(secs(5), || r
                .stderr_text()
                .contains("drain phase 'handoff' starting")),
            "{}",
            r.stderr_text()
        );
        let (status, _, body) = http(proxy_port, "/", "GET");
        assert_eq!(
            (status, body.as_str()),
            (200, "hello\n"),
            "admission is open while the phase runs"
        );
        let (code, _) = r.wait(secs(10));
        let rep = r.report();
        assert_eq!(code, 0, "{rep}");
        assert_eq!(outcomes(&rep), pairs(&[("handoff", "ok")]));
        assert_eq!(rep["phases"][0]["status"], 200);
        assert!(at(&rep, "/phases/0/duration_ms") >= 1000);
        let out = std::fs::read_to_string(&r.stdout).unwrap_or_default();
        assert!(
            out.contains("demo-app: handing off, budget 3000 ms"),
            "the header reached the app: {out}"
        );
        let text = r.stderr_text();
        let phase_end = text.find("drain phase 'handoff' ok").unwrap();
        let closed = text.find("admission closed").expect("admission closes");
        assert!(
            phase_end < closed,
            "admission closes after the phase\n{text}"
        );
    }
}

/// The example's Consul deregistration, against a stand-in for Consul's agent
/// API (no Consul here): the PUT arrives with the service's id.
#[test]
fn the_consul_example_deregisters_through_the_agent_api() {
    let port = free_port();
    let seen = TmpDir::new("consul");
    let log = seen.join("requests");
    let script = format!(
        r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        open({log:?}, "a").write(self.path + "\n")
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
"#,
        log = log.to_str().unwrap()
    );
    let mut consul = Command::new(python())
        .args(["-c", &script])
        .spawn()
        .unwrap();
    wait_until(secs(5), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let example = std::fs::read_to_string(format!(
        "{}/examples/drain-phases.toml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let consul_phase = example.split("[[drain.phase]]").nth(2).unwrap();
    let (_dir, path) = config_file(&format!(
        "pre_drain_delay = \"0s\"\n[[drain.phase]]{consul_phase}"
    ));
    let addr = format!("127.0.0.1:{port}");
    let app = sigapp("app", &[]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&[OFF, "--config", &path], &app),
        env: &[("CONSUL_HTTP_ADDR", &addr), ("SERVICE_ID", "web-1")],
    });
    let (code, _) = r.stop_after_start(&["app"], secs(10));
    let _ = consul.kill();
    let _ = consul.wait();
    let rep = r.report();
    assert_eq!(code, 0, "{rep}");
    assert_eq!(outcomes(&rep), pairs(&[("consul-deregister", "ok")]));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        "/v1/agent/service/deregister/web-1\n"
    );
}

/// `drainit --check-config` with `env`, in a root of its own (a private mount
/// namespace: a tmpfs root with the system's directories bound in, and the
/// platform `markers` created): what the budget says.
fn check_config_in_root(markers: &[&str], env: &[(&str, &str)], flags: &[&str]) -> (i32, String) {
    let root = TmpDir::new("root");
    let r = root.path().to_str().unwrap();
    let bin = std::fs::canonicalize(bin()).unwrap();
    let bin_dir = bin.parent().unwrap().to_str().unwrap().to_string();
    let mut script = format!("set -e\nmount -t tmpfs none {r}\n");
    for d in ["/usr", "/lib", "/lib64", "/bin", "/etc", &bin_dir] {
        if std::path::Path::new(d).exists() {
            script.push_str(&format!("mkdir -p {r}{d}\nmount --bind {d} {r}{d}\n"));
        }
    }
    for m in markers {
        script.push_str(&format!("mkdir -p $(dirname {r}{m})\ntouch {r}{m}\n"));
    }
    script.push_str(&format!("exec chroot {r} {} --check-config", bin.display()));
    for f in flags {
        script.push_str(&format!(" '{f}'"));
    }
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    for k in [
        "DRAINIT_PLATFORM",
        "KUBERNETES_SERVICE_HOST",
        "INVOCATION_ID",
        "NOTIFY_SOCKET",
    ] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    let out = c.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn each_platform_gives_its_grace_period_and_fits_the_defaults() {
    // No marker: 30 s, and the defaults as they are.
    let (code, out) = check_config_in_root(&[], &[], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("platform none (detected: no platform marker"),
        "{out}"
    );
    assert!(
        out.contains("= 25s of grace period 30s (5s spare)"),
        "{out}"
    );
    // Kubernetes: 30 s; the defaults fit as they are.
    let (_, out) = check_config_in_root(
        &["/.dockerenv"],
        &[("KUBERNETES_SERVICE_HOST", "10.96.0.1")],
        &[],
    );
    assert!(
        out.contains(
            "platform kubernetes (detected: KUBERNETES_SERVICE_HOST is set); grace period 30s"
        ),
        "Kubernetes outranks the runtime's marker: {out}"
    );
    assert!(
        out.contains("= 25s of grace period 30s (5s spare)"),
        "{out}"
    );
    // Docker and Podman: 10 s; the defaults shrink to fit, with a second spare.
    for (marker, name) in [("/.dockerenv", "docker"), ("/run/.containerenv", "podman")] {
        let (_, out) = check_config_in_root(&[marker], &[], &[]);
        assert!(
            out.contains(&format!(
                "platform {name} (detected: {marker} exists); grace period 10s"
            )),
            "{out}"
        );
        assert!(
            out.contains("pre-drain delay 1s 800ms + drain timeout 7s 200ms + teardown 0s = 9s of grace period 10s (1s spare)"),
            "{out}"
        );
        assert!(
            out.contains("the defaults not given were shrunk to fit it"),
            "{out}"
        );
    }
    // systemd: 90 s, which drainit extends itself.
    let (_, out) = check_config_in_root(&[], &[("INVOCATION_ID", "abc")], &[]);
    assert!(
        out.contains("platform systemd (detected: INVOCATION_ID is set); grace period 1m 30s"),
        "{out}"
    );
    assert!(out.contains("EXTEND_TIMEOUT_USEC"), "{out}");
    // Explicit settings that overrun Docker's 10 s: a warning, 78 when strict.
    let (code, out) = check_config_in_root(&["/.dockerenv"], &[], &["--drain-timeout=20s"]);
    assert_eq!(code, 0);
    assert!(out.contains("warning: grace budget"), "{out}");
    let (code, out) = check_config_in_root(
        &["/.dockerenv"],
        &[],
        &["--drain-timeout=20s", "--strict-budget"],
    );
    assert_eq!(code, 78, "{out}");
    // Phases count in the budget: their budget, and a second per command phase.
    let (_, out) = check_config_in_root(
        &["/.dockerenv"],
        &[],
        &[
            "--drain-phase",
            "a=true",
            "--phase-budget=2s",
            "--pre-drain-delay=1s",
        ],
    );
    assert!(
        out.contains("pre-drain delay 1s + 1 phase(s) 2s + cancel 1s + drain timeout 5s + teardown 0s = 9s of grace period 10s"),
        "{out}"
    );
}

/// Docker's 10 s, as `docker stop` gives them, with every default: an app that
/// ignores SIGTERM is SIGKILLed by drainit before Docker would, and the report is
/// complete.
#[test]
fn on_docker_the_defaults_end_the_drain_inside_ten_seconds() {
    let app = sigapp("app", &["STUBBORN=1"]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&[OFF], &app),
        env: &[("DRAINIT_PLATFORM", "docker")],
    });
    let (code, took) = r.stop_after_start(&["app"], secs(15));
    let rep = r.report();
    assert_eq!(code, 2, "{rep}");
    assert_eq!(rep["final"], true);
    // Nothing can ask /readyz (probe off): no delay; the drain timeout takes
    // the 9 s Docker's 10 s leave with a second spare.
    assert_eq!(at(&rep, "/drain/deadline_ms"), 9000, "{rep}");
    assert!(
        took < 10_000,
        "done before Docker's SIGKILL at 10 s: {took} ms"
    );
    assert!(
        r.stderr_text()
            .contains("platform docker (as configured); grace period 10s")
    );
}

/// A phase runs while the app serves: it holds none of the descriptors drainit
/// inherited for the app (a socket-activation listener as fd 3), which the app
/// gets as before.
#[test]
fn a_phase_holds_no_descriptor_of_the_app() {
    let app = sigapp("app", &[]);
    let flags = [
        OFF,
        "--pre-drain-delay=0s",
        "--drain-phase",
        "fds=sh -c 'for f in /proc/$$/fd/*; do echo \"fd: $f -> $(readlink $f)\" >> $MARK; done'",
    ];
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &["--listen-fd", "3:$TMP/port"],
        args: &cmd(&flags, &app),
        env: &[],
    });
    r.wait_started(&["app"]);
    let app_pid = r.child_running("python3");
    assert!(
        std::fs::read_link(format!("/proc/{app_pid}/fd/3"))
            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:")),
        "the app has the listener"
    );
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 0, "{}", r.stderr_text());
    let fds = r.lines("fd: ");
    assert!(fds.len() >= 3, "{}", r.marks());
    assert!(
        fds.iter().all(|l| !l.contains("socket:")),
        "the phase holds no socket: {fds:?}"
    );
}

/// `/metrics` counts the phases by outcome as they end.
#[test]
fn metrics_count_the_phases_by_outcome() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let app = sigapp("app", &[]);
    let flags = [
        "--probe-addr",
        &addr,
        "--pre-drain-delay=0s",
        "--drain-phase",
        "one=true",
        "--drain-phase",
        "bad=false",
        "--drain-phase",
        "two=sh -c 'echo two: started >> $MARK; sleep 1'",
    ];
    let mut r = Running::start(Mode::Subreaper, &cmd(&flags, &app));
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert!(r.wait_mark("two: started", secs(5)), "{}", r.stderr_text());
    let (status, _, body) = http(port, "/metrics", "GET");
    assert_eq!(status, 200);
    for line in [
        "# TYPE drainit_drain_phases_total counter",
        "drainit_drain_phases_total{phase=\"one\",outcome=\"ok\"} 1",
        "drainit_drain_phases_total{phase=\"bad\",outcome=\"failed\"} 1",
    ] {
        assert!(body.contains(line), "{line} in\n{body}");
    }
    assert!(!body.contains("phase=\"two\""), "two still runs:\n{body}");
    let (code, _) = r.wait(secs(10));
    assert_eq!(code, 0);
}
