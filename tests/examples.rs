//! The shipped examples stay true: the exit-code script passes against this build,
//! and the Kubernetes and systemd examples' drainit flags are valid and fit their
//! grace periods (checked with `--check-config`, as an operator would).
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::*;

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn exit_codes_script_passes() {
    let out = Command::new("sh")
        .arg(format!(
            "{}/examples/exit-codes.sh",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(bin())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" passed, 0 failed"), "{text}");
}

#[test]
fn kubernetes_example_flags_fit_its_grace_period() {
    let yaml = example("kubernetes.yaml");
    let grace: u64 = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .expect("terminationGracePeriodSeconds")
        .trim()
        .parse()
        .unwrap();
    // The drainit flags: the `- --x` items of `args:` up to the lone `- --`.
    let args: Vec<String> = yaml
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .map(|l| {
            l.split(" #")
                .next()
                .unwrap()
                .trim()
                .trim_start_matches("- ")
                .trim()
                .to_string()
        })
        .take_while(|a| a != "--")
        .collect();
    assert!(
        args.iter()
            .any(|a| a == &format!("--grace-period={grace}s")),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a == "--strict-budget"), "{args:?}");
    let stdout = check_config(&args);
    assert!(stdout.contains(&format!("of grace period {grace}s (")));
}

#[test]
fn systemd_example_flags_are_valid() {
    let unit = example("drainit.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let words = shell_words::split(exec).unwrap();
    let flags: Vec<&str> = words[1..]
        .iter()
        .map(String::as_str)
        .take_while(|w| *w != "--")
        .collect();
    check_config(&flags);
}

/// `drainit --check-config ARGS` must exit 0; returns its stdout.
fn check_config<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = Command::new(bin())
        .arg("--check-config")
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
