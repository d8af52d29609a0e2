//! The release-time generator (xtask, run by release.sh) writes drainit-gate's
//! man pages and completions from its clap definition, with the real flags.

use std::path::Path;
use std::process::Command;

#[test]
fn xtask_writes_the_gates_man_pages_and_completions() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gate-docs");
    let _ = std::fs::remove_dir_all(&dir);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The cargo running this test has released its build lock; the first build of
    // xtask compiles clap_mangen and clap_complete.
    let out = Command::new(cargo)
        .args(["run", "--quiet", "--offline", "-p", "xtask", "--", "docs"])
        .arg(&dir)
        .current_dir(&root)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "xtask docs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read =
        |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let man = read("drainit-gate.1");
    assert!(man.contains(".TH drainit-gate"), "{man}");
    assert!(man.contains("model"), "the page lists the subcommand");
    let model = read("drainit-gate-model.1");
    for flag in ["signal\\-at", "grace", "allow\\-503", "replacement", "html"] {
        assert!(model.contains(&format!("\\-\\-{flag}")), "lacks --{flag}");
    }
    assert!(
        model.contains("Exit codes"),
        "the exit codes are in the page"
    );
    for (file, needle) in [
        ("completions/drainit-gate.bash", "--allow-503"),
        ("completions/_drainit-gate", "--allow-503"),
        ("completions/drainit-gate.fish", "allow-503"),
    ] {
        assert!(read(file).contains(needle), "{file} lacks {needle}");
    }
}
