//! The Debian packages hold the binaries the suite tested, and the amd64 one
//! installs, runs and removes cleanly: `dpkg -i` the package `DRAINIT_DEB` names
//! (scripts/test.sh builds both with cargo-deb from the static binaries it tested),
//! run the installed `/usr/bin/drainit`, `dpkg -r` it, and the machine is as it was.
//! The arm64 package (`DRAINIT_ARM64_DEB`) cannot be installed here: its contents
//! are checked. Skipped when the variables are unset, and the install skipped (said
//! on stderr) when drainit is already installed here, by a package or by hand: the
//! test never replaces or removes what it did not install.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

const INSTALLED: &str = "/usr/bin/drainit";

/// Runs a dpkg command, retrying for up to two minutes while another dpkg or apt
/// holds the lock (this machine is shared).
fn dpkg(args: &[&str]) -> Output {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let out = Command::new("dpkg").args(args).output().expect("dpkg");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("lock") || Instant::now() >= end {
            return out;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Status}", "drainit"])
        .output()
        .is_ok_and(|o| o.stdout == b"installed")
}

/// What the package puts where: the binary, the man page, the completions and the
/// licences, where man, bash, zsh and fish look for them.
const FILES: [&str; 16] = [
    INSTALLED,
    "/usr/bin/drainit-gate",
    "/usr/share/man/man1/drainit-gate.1.gz",
    "/usr/share/man/man1/drainit-gate-model.1.gz",
    "/usr/share/man/man1/drainit-gate-drill.1.gz",
    "/usr/share/man/man1/drainit-gate-check.1.gz",
    "/usr/share/bash-completion/completions/drainit-gate",
    "/usr/share/zsh/vendor-completions/_drainit-gate",
    "/usr/share/fish/vendor_completions.d/drainit-gate.fish",
    "/usr/share/man/man1/drainit.1.gz",
    "/usr/share/bash-completion/completions/drainit",
    "/usr/share/zsh/vendor-completions/_drainit",
    "/usr/share/fish/vendor_completions.d/drainit.fish",
    "/usr/share/doc/drainit/copyright",
    "/usr/share/doc/drainit/LICENSE-MIT",
    "/usr/share/doc/drainit/LICENSE-APACHE",
];

/// The control fields of the package `deb` for Debian architecture `arch`.
fn assert_fields(deb: &str, arch: &str) {
    let field = |name: &str| {
        let out = Command::new("dpkg-deb")
            .args(["--field", deb, name])
            .output()
            .expect("dpkg-deb");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(field("Package"), "drainit");
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));
    assert_eq!(field("Architecture"), arch);
    assert_eq!(field("Depends"), "", "a static binary depends on nothing");
}

/// Removes the package on drop, so a failed assertion leaves nothing installed.
struct Removed;

impl Drop for Removed {
    fn drop(&mut self) {
        if installed() {
            let _ = dpkg(&["-r", "drainit"]);
        }
    }
}

#[test]
fn the_package_installs_runs_and_removes_cleanly() {
    let Ok(deb) = std::env::var("DRAINIT_DEB") else {
        eprintln!("DRAINIT_DEB is unset (scripts/test.sh builds the package): skipped");
        return;
    };
    if installed() || Path::new(INSTALLED).exists() {
        eprintln!("drainit is already installed here ({INSTALLED}): skipped, left as it is");
        return;
    }

    assert_fields(&deb, "amd64");

    let _removed = Removed;
    let out = dpkg(&["-i", &deb]);
    assert!(
        out.status.success(),
        "dpkg -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(installed());
    if let Ok(tested) = std::env::var("DRAINIT_BIN") {
        assert!(
            std::fs::read(INSTALLED).unwrap() == std::fs::read(&tested).unwrap(),
            "{INSTALLED} is not the binary the suite tested ({tested})"
        );
    }

    let listed = String::from_utf8_lossy(&dpkg(&["-L", "drainit"]).stdout).into_owned();
    for path in FILES {
        assert!(
            listed.lines().any(|l| l == path),
            "{path} not in:\n{listed}"
        );
        assert!(Path::new(path).exists(), "{path}");
    }

    // The installed binary runs: its version, an exit code passed on, a drain.
    let version = Command::new(INSTALLED).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("drainit {}", env!("CARGO_PKG_VERSION"))
    );
    let mut r = Running::start_program(
        Start {
            mode: Mode::Subreaper,
            launch: &[],
            args: &[OFF, "--", "sh", "-c", "exit 3"],
            env: &[],
        },
        &[INSTALLED],
    );
    assert_eq!(r.wait(secs(10)).0, 3, "{}", r.stderr_text());
    let app = sigapp("app", &["CLEANUP=0.1"]);
    let mut r = Running::start_program(
        Start {
            mode: Mode::Pid1,
            launch: &[],
            args: &cmd(&[OFF, "--pre-drain-delay", "0s"], &app),
            env: &[],
        },
        &[INSTALLED],
    );
    let (rc, _) = r.stop_after_start(&["app"], secs(10));
    assert_eq!(rc, 0, "{}", r.stderr_text());
    assert_eq!(text(&r.report(), "reason"), "drained");

    // dpkg -r: nothing of it is left, not even in dpkg's database.
    let out = dpkg(&["-r", "drainit"]);
    assert!(
        out.status.success(),
        "dpkg -r: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!installed());
    assert!(!Path::new(INSTALLED).exists());
    assert!(!Path::new("/usr/share/doc/drainit").exists());
    let status = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Abbrev}", "drainit"])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.trim().is_empty() || status.starts_with("un"),
        "dpkg still knows drainit: {status:?}"
    );
}

#[test]
fn the_arm64_package_holds_the_tested_arm64_binary_and_the_same_files() {
    let Ok(deb) = std::env::var("DRAINIT_ARM64_DEB") else {
        eprintln!("DRAINIT_ARM64_DEB is unset (scripts/test.sh builds the package): skipped");
        return;
    };
    assert_fields(&deb, "arm64");
    let tmp = TmpDir::new("deb-arm64");
    let out = Command::new("dpkg-deb")
        .args(["-x", &deb])
        .arg(tmp.path())
        .output()
        .expect("dpkg-deb");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for path in FILES {
        let at = tmp.path().join(path.trim_start_matches('/'));
        assert!(at.exists(), "{path} not in {deb}");
    }
    let bin = tmp.path().join("usr/bin/drainit");
    let header = assert_shipped_build(bin.to_str().unwrap());
    assert!(header.contains("AArch64"), "{header}");
    if let Ok(tested) = std::env::var("DRAINIT_ARM64_BIN") {
        assert!(
            std::fs::read(&bin).unwrap() == std::fs::read(&tested).unwrap(),
            "the arm64 package's binary is not the one the suite tested ({tested})"
        );
    }
}
