//! The replay page in a real headless browser: `drainit-gate model --html` writes
//! the page, `page.py` drives Debian's chromium through chromium-driver (Selenium)
//! and asserts what a person sees (the table and the ledger after Next event and
//! the scrubber, Restart, Play) and that a screenshot is not blank.
//!
//! Skipped, loudly, only when chromium or chromium-driver is not installed
//! (`.ci/run` installs both, and Selenium).

use std::path::Path;
use std::process::Command;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

#[test]
fn the_page_replays_the_opening_run_in_headless_chromium() {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        eprintln!(
            "\n\n************************************************************\n\
             SKIPPED the_page_replays_the_opening_run_in_headless_chromium:\n\
             {CHROMIUM} or {CHROMEDRIVER} is missing\n\
             (apt-get install chromium chromium-driver; .ci/run does)\n\
             ************************************************************\n"
        );
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gate-page");
    std::fs::create_dir_all(&dir).expect("the test's directory");
    let page = dir.join("opening.html");
    let json = dir.join("opening.json");
    let shot = dir.join("opening.png");
    let _ = std::fs::remove_file(&shot);

    let out = Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args(["model", "--json", "--html"])
        .arg(&page)
        .output()
        .expect("drainit-gate runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the opening settings fail the gate"
    );
    std::fs::write(&json, &out.stdout).expect("the run's JSON");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/page.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([&page, &json, &shot])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "page.py failed ({}):\n{stdout}\n{stderr}\n(needs the Python package selenium: \
         pip install selenium; .ci/run installs it)",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        shot.is_file(),
        "the screenshot {} was saved",
        shot.display()
    );
    eprintln!("{stdout}");
}

/// A drill's page (measured times, a stopped-early row) and a fleet check's page
/// in the same browser: no script error, the verdict, the final table and ledger.
#[test]
fn the_drills_and_the_checks_pages_render_in_headless_chromium() {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        eprintln!(
            "\n\nSKIPPED the_drills_and_the_checks_pages_render_in_headless_chromium: no chromium\n"
        );
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gate-page-live");
    std::fs::create_dir_all(&dir).expect("the test's directory");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/page_live.py");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let drainit = std::env::var_os("DRAINIT_BIN")
        .filter(|b| !b.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let st = Command::new(env!("CARGO"))
                .args(["build", "-q", "-p", "drainit", "--bin", "drainit"])
                .current_dir(&root)
                .status()
                .expect("cargo runs");
            assert!(st.success());
            root.join("target/debug/drainit")
        });
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/drillapp.py");
    let page = dir.join("drill.html");
    let out = Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args([
            "drill",
            "--json",
            "--time-scale",
            "0.05",
            "--requests",
            "6",
            "--signal-at",
            "4s",
            "--check-interval",
            "0",
            "--path",
            "/work?ms=100",
            "--html",
        ])
        .arg(&page)
        .arg("--drainit")
        .arg(&drainit)
        .arg("--")
        .arg("python3")
        .arg(&app)
        .arg("{port}")
        .env("DRAINIT_PRE_DRAIN_DELAY", "0")
        .output()
        .expect("drainit-gate runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = dir.join("drill.json");
    std::fs::write(&json, &out.stdout).expect("the JSON");

    // The check page: the drill's replicas' reports are gone with its temp dir, so
    // two report lines stand in (one clean, one lossy).
    let clean = dir.join("a.log");
    std::fs::write(&clean, "{\"drainit\":\"0.1.0\",\"final\":true,\"exit_code\":0,\"reason\":\"drained\",\"requests\":{\"received\":3,\"rejected\":0,\"completed\":3,\"unknown\":0,\"abandoned\":0,\"canceled\":0,\"in_flight\":0}}\n").expect("write");
    let lossy = dir.join("b.log");
    std::fs::write(&lossy, "{\"drainit\":\"0.1.0\",\"final\":true,\"exit_code\":2,\"reason\":\"abandoned\",\"requests\":{\"received\":3,\"rejected\":0,\"completed\":2,\"unknown\":0,\"abandoned\":1,\"canceled\":0,\"in_flight\":0}}\n").expect("write");
    let check_page = dir.join("check.html");
    let out = Command::new(env!("CARGO_BIN_EXE_drainit-gate"))
        .args(["check", "--json", "--html"])
        .arg(&check_page)
        .arg(&clean)
        .arg(&lossy)
        .output()
        .expect("drainit-gate runs");
    assert_eq!(out.status.code(), Some(1));
    let check_json = dir.join("check.json");
    std::fs::write(&check_json, &out.stdout).expect("the JSON");

    for (page, json) in [(&page, &json), (&check_page, &check_json)] {
        let out = Command::new("python3")
            .arg(&script)
            .arg(page)
            .arg(json)
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "page_live.py {} failed:\n{stdout}\n{}",
            page.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
