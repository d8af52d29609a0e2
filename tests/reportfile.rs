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
