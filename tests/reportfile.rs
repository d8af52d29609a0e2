//! The report file under an app that may write its directory: an app started with
//! `--user` (or a sidecar sharing the volume) can plant symlinks at the report path
//! or at the temporary file's name; drainit, root, must never write through them
//! into a file the app could not write itself.
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

#[test]
fn a_planted_symlink_never_redirects_the_report() {
    for mode in BOTH {
        let scratch = TmpDir::new("report-symlink");
        let dir = scratch.join("ww");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let victim = scratch.join("victim");
        std::fs::write(&victim, "root-only\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let report = dir.join("r.json");
        // The app (nobody) plants a symlink at the report path and at every
        // temporary name it can guess (the old scheme: `.r.json.<drainit pid>.tmp`),
        // then exits.
        let plant = format!(
            "ln -s {v} {d}/r.json; for p in $PPID 1 2 3; do ln -s {v} {d}/.r.json.$p.tmp; done; \
             ls -la {d} >&2",
            v = victim.display(),
            d = dir.display()
        );
        let report_s = report.display().to_string();
        let mut r = Running::start(
            mode,
            &[
                OFF,
                "--user",
                "nobody",
                "--report-file",
                &report_s,
                "--",
                "sh",
                "-c",
                &plant,
            ],
        );
        let (rc, _) = r.wait(secs(10));
        assert_eq!(rc, 0, "{:?}: {}", mode, r.stderr_text());
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "root-only\n",
            "{mode:?}: the report was written through a symlink the app planted"
        );
        let meta = std::fs::symlink_metadata(&report).unwrap();
        assert!(meta.file_type().is_file(), "{mode:?}: {meta:?}");
        assert_eq!(meta.uid(), 0);
        let text = std::fs::read_to_string(&report).unwrap();
        assert!(text.contains(r#""final":true"#), "{text}");
    }
}

/// An operator's own symlink (drainit's user owns it), such as a report path
/// pointing at `/dev/termination-log`, is still followed.
#[test]
fn an_operators_symlink_is_still_followed() {
    let scratch = TmpDir::new("report-own-symlink");
    let target = scratch.join("termination-log");
    std::fs::write(&target, "").unwrap();
    let link = scratch.join("report.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let link_s = link.display().to_string();
    let mut r = Running::start(
        Mode::Subreaper,
        &[OFF, "--report-file", &link_s, "--", "true"],
    );
    assert_eq!(r.wait(secs(10)).0, 0);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(text.contains(r#""reason":"child_exited""#), "{text}");
}

/// A report name of up to 255 bytes (the longest a file name may be) gets its
/// reports, partial and final: the temporary file's name, longer than the report's,
/// once made the rename fail at exit ("File name too long") and the report was lost.
#[test]
fn a_report_file_with_the_longest_name_is_written() {
    let scratch = TmpDir::new("report-long-name");
    let report = scratch.join(&"r".repeat(250));
    let report_s = report.display().to_string();
    let mut r = Running::start(
        Mode::Subreaper,
        &[
            OFF,
            "--pre-drain-delay=0s",
            "--report-file",
            &report_s,
            "--",
            "sleep",
            "30",
        ],
    );
    r.child_running("sleep");
    r.signal(15);
    assert_eq!(r.wait(secs(10)).0, 0, "{}", r.stderr_text());
    assert!(!r.stderr_text().contains("error"), "{}", r.stderr_text());
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        text.contains(r#""final":true"#) && text.contains(r#""reason":"drained""#),
        "{text}\n{}",
        r.stderr_text()
    );
}

/// A report path the kernel cannot open as a file (a trailing `/`, a name longer
/// than 255 bytes) is a configuration error before anything starts (78), not an
/// error at exit when the report is lost.
#[test]
fn a_report_path_that_names_no_file_is_refused_before_the_start() {
    let scratch = TmpDir::new("report-no-file");
    let started = scratch.join("started");
    let app = format!("touch {}", started.display());
    for bad in [
        scratch.join("new/").display().to_string() + "/",
        scratch.join(&"r".repeat(256)).display().to_string(),
    ] {
        let mut r = Running::start(
            Mode::Subreaper,
            &[OFF, "--report-file", &bad, "--", "sh", "-c", &app],
        );
        let (rc, _) = r.wait(secs(10));
        let err = r.stderr_text();
        assert_eq!(rc, 78, "{err}");
        assert!(err.contains("--report-file"), "{err}");
        assert!(!started.exists(), "the child was started: {err}");
    }
}
