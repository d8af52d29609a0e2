//! Packaging stays true: the release-time generator (xtask) writes a man page and
//! bash/zsh/fish completions that carry drainit's real flags, the licences the
//! manifest names exist, release.sh is valid shell, and the shipped build is
//! stripped with its hot code first.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_generator_writes_a_man_page_and_completions_with_the_real_flags() {
    let out = TmpDir::new("docs");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The cargo running this test has released its build lock by now; the first
    // build compiles clap_mangen and clap_complete (under a minute here).
    let mut child = Command::new(cargo)
        .args(["run", "--quiet", "--offline", "-p", "xtask", "--", "docs"])
        .arg(out.path())
        .current_dir(ROOT)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(Duration::from_secs(600), || child.try_wait().unwrap());
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the generator took more than 600 s");
    });
    assert!(status.success(), "xtask docs failed");

    let man = std::fs::read_to_string(out.join("drainit.1")).unwrap();
    assert!(
        man.starts_with(".ie") || man.contains(".TH drainit"),
        "{man}"
    );
    for flag in [
        "pre\\-drain\\-delay",
        "drain\\-timeout",
        "grace\\-period",
        "probe\\-addr",
        "ready\\-tcp",
        "user",
        "check\\-config",
    ] {
        assert!(
            man.contains(&format!("\\-\\-{flag}")),
            "man page lacks --{flag}"
        );
    }
    assert!(
        man.contains("Exit codes"),
        "the man page carries --help's examples and exit codes"
    );

    for (file, needle) in [
        ("completions/drainit.bash", "--pre-drain-delay"),
        ("completions/_drainit", "--pre-drain-delay"),
        ("completions/drainit.fish", "pre-drain-delay"),
    ] {
        let text = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(text.contains(needle), "{file}");
        assert!(text.contains("user"), "{file}");
    }
    // bash can load what it generated.
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p drainit",
            out.join("completions/drainit.bash").display()
        ))
        .output()
        .unwrap();
    assert!(
        bash.status.success(),
        "{}",
        String::from_utf8_lossy(&bash.stderr)
    );
}

#[test]
fn licences_and_release_script_are_in_place() {
    let manifest = std::fs::read_to_string(format!("{ROOT}/Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT OR Apache-2.0\""));
    let mit = std::fs::read_to_string(format!("{ROOT}/LICENSE-MIT")).unwrap();
    assert!(mit.contains("Permission is hereby granted, free of charge"));
    let apache = std::fs::read_to_string(format!("{ROOT}/LICENSE-APACHE")).unwrap();
    assert!(apache.contains("Version 2.0, January 2004"));
    let syntax = Command::new("sh")
        .args(["-n", &format!("{ROOT}/release.sh")])
        .status()
        .unwrap();
    assert!(syntax.success(), "release.sh is not valid sh");
}

/// The shipped static build (`DRAINIT_BIN`, scripts/test.sh) has no symbols
/// and has its hot functions first, side by side (`hot-text.ld`, build.rs):
/// the code drainit runs to start, serve its probes, drain and exit is one
/// `.text.drainit.hot` section of a few hundred KiB, so that it keeps only that
/// resident (README "Performance"). A build without the linker script, or an
/// emptied script, fails here.
#[test]
fn the_shipped_build_is_stripped_and_has_its_hot_code_first() {
    let Ok(bin) = std::env::var("DRAINIT_BIN") else {
        eprintln!("DRAINIT_BIN is unset (not the static build): skipped");
        return;
    };
    let out = Command::new("readelf")
        .args(["-SW", &bin])
        .output()
        .expect("readelf (binutils)");
    let sections = String::from_utf8_lossy(&out.stdout);
    assert!(!sections.contains(".symtab"), "{bin} has a symbol table");
    let hot = sections
        .lines()
        .find(|l| l.contains(".text.drainit.hot"))
        .unwrap_or_else(|| panic!("{bin} has no .text.drainit.hot section:\n{sections}"));
    // [Nr] Name Type Address Off Size ...: the size is the 6th field after "]".
    let fields: Vec<&str> = hot.split(']').nth(1).unwrap().split_whitespace().collect();
    let size = u64::from_str_radix(fields[4], 16).unwrap();
    assert!(
        (256 * 1024..1024 * 1024).contains(&size),
        "the hot code is {size} bytes: {hot}"
    );
    let text = sections.lines().find(|l| l.contains(" .text ")).unwrap();
    let addr = |l: &str| {
        u64::from_str_radix(
            l.split(']')
                .nth(1)
                .unwrap()
                .split_whitespace()
                .nth(2)
                .unwrap(),
            16,
        )
        .unwrap()
    };
    assert!(
        addr(hot) < addr(text),
        "the hot code is not first:\n{sections}"
    );
}
