//! The Docker-sized pre-drain delay (docs/processes-and-signals.md): the default applies only when
//! something routes by drainit's readiness (Kubernetes, or a client that asked
//! `/readyz`); an explicit value always wins. Black box: what the child received
//! and when, what the report and the log lines say.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::*;

/// `KUBERNETES_SERVICE_HOST` empty counts as unset: these tests must not depend on
/// where they run.
const NOT_K8S: (&str, &str) = ("KUBERNETES_SERVICE_HOST", "");
const K8S: (&str, &str) = ("KUBERNETES_SERVICE_HOST", "10.96.0.1");

/// ms from drainit's SIGTERM to the app's.
fn term_after(r: &Running) -> i64 {
    r.mark_t("app: got SIGTERM").expect("the app got SIGTERM") as i64 - r.t0 as i64
}

#[test]
fn nobody_asked_readyz_outside_kubernetes_the_child_gets_term_at_once() {
    for mode in BOTH {
        let port = free_port().to_string();
        let addr = format!("--probe-addr=127.0.0.1:{port}");
        let app = sigapp("app", &["CLEANUP=0.1"]);
        let mut r = Running::start_with(Start {
            mode,
            launch: &[],
            args: &cmd(&[&addr, "--drain-timeout", "5s"], &app),
            env: &[NOT_K8S],
        });
        r.wait_started(&["app"]);
        // /healthz does not count: only readiness routes traffic.
        assert_eq!(http(port.parse().unwrap(), "/healthz", "GET").0, 200);
        r.signal(libc::SIGTERM);
        let (rc, elapsed) = r.wait(secs(4));
        assert_eq!(rc, 0, "{}", r.stderr_text());
        assert!(term_after(&r) < 1500, "{mode:?}: {} ms", term_after(&r));
        assert!(elapsed < 3000, "{mode:?}: drainit took {elapsed} ms");
        assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 0);
        let log = r.stderr_text();
        assert!(
            log.contains("0s unless a client asks /readyz before the drain signal"),
            "the budget line says the default is conditional:\n{log}"
        );
        assert!(
            log.contains("forwarding in 0s (default pre-drain delay 0: not in Kubernetes and no client asked /readyz)"),
            "the T0 line says why:\n{log}"
        );
    }
}

#[test]
fn a_client_that_asked_readyz_gets_the_five_second_default() {
    let port = free_port();
    let addr = format!("--probe-addr=127.0.0.1:{port}");
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&[&addr, "--drain-timeout", "5s"], &app),
        env: &[NOT_K8S],
    });
    r.wait_started(&["app"]);
    let got = wait_for(secs(5), || {
        let (status, _, body) = http(port, "/readyz", "GET");
        (status == 200).then_some(body)
    });
    assert!(got.is_some(), "/readyz never 200\n{}", r.stderr_text());
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(12));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    let dt = term_after(&r);
    assert!(dt >= 5000, "the app got SIGTERM {dt} ms after drainit");
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 5000);
    assert!(
        r.stderr_text()
            .contains("forwarding in 5s (default pre-drain delay: a client asked /readyz)"),
        "{}",
        r.stderr_text()
    );
}

#[test]
fn in_kubernetes_the_default_applies_without_any_probe() {
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&[OFF, "--drain-timeout", "5s"], &app),
        env: &[K8S],
    });
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    assert!(
        wait_for(secs(3), || r
            .stderr_text()
            .contains("forwarding in 5s (default pre-drain delay: in Kubernetes)")
            .then_some(()))
        .is_some(),
        "{}",
        r.stderr_text()
    );
    // Still in the delay: the app has not been signalled. A second SIGTERM (past
    // the 100 ms coalescing window) cuts the delay short, so the test stays quick.
    assert!(!r.has("app: got SIGTERM"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!r.has("app: got SIGTERM"));
    assert!(kill(r.pid, libc::SIGTERM));
    let (rc, _) = r.wait(secs(4));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 5000);
}

#[test]
fn an_explicit_delay_always_wins() {
    // Explicit 0 in Kubernetes, with /readyz asked: at once.
    let port = free_port();
    let addr = format!("--probe-addr=127.0.0.1:{port}");
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&[&addr, "--drain-timeout", "5s"], &app),
        env: &[K8S, ("DRAINIT_PRE_DRAIN_DELAY", "0s")],
    });
    r.wait_started(&["app"]);
    assert!(
        wait_for(secs(5), || (http(port, "/readyz", "GET").0 == 200)
            .then_some(()))
        .is_some()
    );
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(4));
    assert_eq!(rc, 0);
    assert!(term_after(&r) < 1500, "{} ms", term_after(&r));
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 0);
    assert!(r.stderr_text().contains("pre-drain delay as configured"));

    // An explicit value outside Kubernetes, nobody asking /readyz: it applies.
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(
            &[OFF, "--pre-drain-delay", "700ms", "--drain-timeout", "5s"],
            &app,
        ),
        env: &[NOT_K8S],
    });
    let (rc, _) = r.stop_after_start(&["app"], secs(5));
    assert_eq!(rc, 0);
    assert!(term_after(&r) >= 700, "{} ms", term_after(&r));
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 700);
}

#[test]
fn check_config_says_which_delay_applies() {
    let run = |env: (&str, &str), flags: &[&str]| {
        let out = Command::new(bin())
            .arg("--check-config")
            .args(flags)
            .env(env.0, env.1)
            .env_remove("DRAINIT_PRE_DRAIN_DELAY")
            .env_remove("PRE_DRAIN_DELAY_MS")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8(out.stdout).unwrap()
    };
    let docker = run(NOT_K8S, &[]);
    assert!(
        docker.contains(
            "# pre_drain_delay = \"5s\": default pre-drain delay: 0s unless a client asks /readyz"
        ),
        "{docker}"
    );
    let k8s = run(K8S, &[]);
    assert!(k8s.contains("applies, in Kubernetes"), "{k8s}");
    let explicit = run(NOT_K8S, &["--pre-drain-delay", "2s"]);
    assert!(
        explicit.contains("\npre_drain_delay = \"2s\"\n"),
        "{explicit}"
    );
}

/// Outside Kubernetes with the probe server off and no `--proxy-health`, nothing
/// can ask `/readyz`: the default delay is 0 outright, and the grace budget counts
/// 0, so `--strict-budget` takes a grace period only the 5 s would have overrun.
/// Before, the budget counted 5 s and refused it (78).
#[test]
fn with_nothing_that_could_ask_readyz_the_default_delay_is_zero() {
    let out = Command::new(bin())
        .args([
            "--check-config",
            "--probe-addr",
            "off",
            "--drain-timeout",
            "8s",
            "--grace-period",
            "10s",
            "--strict-budget",
        ])
        .env(NOT_K8S.0, NOT_K8S.1)
        .env_remove("DRAINIT_PRE_DRAIN_DELAY")
        .env_remove("PRE_DRAIN_DELAY_MS")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "# pre_drain_delay = \"0s\": default pre-drain delay: 0s, nothing can ask /readyz"
        ),
        "{text}"
    );
    assert!(
        text.contains("pre-drain delay 0s + drain timeout 8s"),
        "{text}"
    );
    // Running: the child gets its SIGTERM at T0, and the log says why.
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start_with(Start {
        mode: Mode::Subreaper,
        launch: &[],
        args: &cmd(&["--probe-addr", "off", "--drain-timeout", "5s"], &app),
        env: &[NOT_K8S],
    });
    r.wait_started(&["app"]);
    r.signal(libc::SIGTERM);
    let (rc, _) = r.wait(secs(4));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert!(term_after(&r) < 1500, "{} ms", term_after(&r));
    assert_eq!(num(&r.report(), "drain.pre_drain_delay_ms"), 0);
    let log = r.stderr_text();
    assert!(
        log.contains("(default pre-drain delay 0: nothing can ask /readyz)"),
        "{log}"
    );
}
