//! The shipped examples stay true: the exit-code script passes against this build,
//! the Kubernetes and systemd examples' drainit flags are valid and fit their
//! grace periods (checked with `--check-config`, as an operator would), and the
//! Kubernetes manifest runs what Dockerfile.example builds. No Docker engine runs
//! here: the Dockerfile is parsed, its drainit flags and environment are run
//! through `--check-config`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::*;

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn repo_file(name: &str) -> String {
    std::fs::read_to_string(format!("{}/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// A Dockerfile's instructions as `(INSTRUCTION, rest)`, continuation lines joined;
/// with `commented`, the instructions of its `#   INSTR …` example lines instead.
fn dockerfile(text: &str, commented: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let line = if commented {
            match line.strip_prefix("#   ") {
                Some(l) if l.starts_with(|c: char| c.is_ascii_uppercase()) => l,
                _ => continue,
            }
        } else if line.trim_start().starts_with('#') {
            continue;
        } else {
            line
        };
        match line.trim_end().strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(line);
                let t = std::mem::take(&mut cur);
                if let Some((instr, rest)) = t.trim().split_once(' ') {
                    out.push((instr.to_string(), rest.trim().to_string()));
                }
            }
        }
    }
    out
}

/// The instructions of the last stage (from its `FROM`).
fn last_stage(instrs: &[(String, String)]) -> &[(String, String)] {
    let from = instrs.iter().rposition(|(i, _)| i == "FROM").expect("FROM");
    &instrs[from..]
}

/// The JSON array of an exec-form instruction (`ENTRYPOINT [...]`, `CMD [...]`).
fn exec_form(rest: &str) -> Vec<String> {
    let json = &rest[rest.find('[').expect("exec form")..];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{rest}: {e}"))
}

fn instr<'a>(stage: &'a [(String, String)], name: &str) -> &'a str {
    &stage
        .iter()
        .rfind(|(i, _)| i == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
}

/// The value of `--probe-addr` in `args` (`--probe-addr X` or `--probe-addr=X`).
fn probe_addr(args: &[String]) -> String {
    args.iter()
        .enumerate()
        .find_map(|(i, a)| {
            a.strip_prefix("--probe-addr=")
                .map(String::from)
                .or_else(|| (a == "--probe-addr").then(|| args[i + 1].clone()))
        })
        .expect("--probe-addr")
}

fn port_of(addr: &str) -> &str {
    addr.rsplit_once(':').expect("host:port").1
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

#[test]
fn dockerfile_example_needs_no_buildkit_and_its_context_is_small() {
    let text = repo_file("Dockerfile.example");
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(!line.contains("--mount="), "BuildKit-only: {line}");
        assert!(!line.contains("--link"), "BuildKit-only: {line}");
        assert!(!line.contains("<<"), "BuildKit-only heredoc: {line}");
    }
    assert!(
        !text.contains("# syntax="),
        "a syntax directive needs BuildKit"
    );
    let ignore = repo_file(".dockerignore");
    for entry in ["target/", ".git/"] {
        assert!(ignore.lines().any(|l| l.trim() == entry), "{entry}");
    }
    // What the build stage copies exists (a COPY of a missing path fails the build).
    for (i, rest) in dockerfile(&text, false) {
        if i == "COPY" && !rest.starts_with("--from") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            for src in &words[..words.len() - 1] {
                let p = format!("{}/{src}", env!("CARGO_MANIFEST_DIR"));
                assert!(std::path::Path::new(&p).exists(), "COPY {src}: missing");
            }
        }
    }
}

#[test]
fn dockerfile_example_drainit_flags_and_environment_are_valid() {
    let text = repo_file("Dockerfile.example");
    let instrs = dockerfile(&text, false);
    let stage = last_stage(&instrs);
    let entry = exec_form(instr(stage, "ENTRYPOINT"));
    let flags: Vec<&String> = entry[1..].iter().take_while(|a| *a != "--").collect();
    let env: Vec<(String, String)> = stage
        .iter()
        .filter(|(i, _)| i == "ENV")
        .flat_map(|(_, rest)| {
            rest.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        })
        .filter(|(k, _)| k.starts_with("DRAINIT_"))
        .collect();
    assert!(!env.is_empty(), "the budget is set as environment");
    let out = Command::new(bin())
        .arg("--check-config")
        .args(&flags)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("spare)"), "the budget fits: {stdout}");
    assert!(
        out.stderr.is_empty(),
        "no warning: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dockerfile_healthchecks_use_drainit_probe_at_the_entrypoint_address() {
    let text = repo_file("Dockerfile.example");
    for commented in [false, true] {
        let instrs = dockerfile(&text, commented);
        let stage = if commented {
            &instrs[..]
        } else {
            last_stage(&instrs)
        };
        let entry = exec_form(instr(stage, "ENTRYPOINT"));
        let check = instr(stage, "HEALTHCHECK");
        let cmd = exec_form(check.split_once("CMD").expect("HEALTHCHECK CMD").1);
        assert_eq!(cmd[0], entry[0], "the health check runs drainit itself");
        assert_eq!(cmd[1..3], ["--probe", "readyz"]);
        let served = probe_addr(&entry);
        let asked = probe_addr(&cmd);
        assert_eq!(port_of(&asked), port_of(&served), "{asked} vs {served}");
        assert!(asked.starts_with("127.0.0.1:"), "{asked}");
    }
}

#[test]
fn kubernetes_example_runs_what_dockerfile_example_builds() {
    let instrs = dockerfile(&repo_file("Dockerfile.example"), false);
    let stage = last_stage(&instrs);
    let entry = exec_form(instr(stage, "ENTRYPOINT"));
    let cmd = exec_form(instr(stage, "CMD"));
    // Programs the image has: what it copies in, and the base image's.
    let copied: Vec<String> = stage
        .iter()
        .filter(|(i, _)| i == "COPY")
        .map(|(_, rest)| rest.split_whitespace().last().unwrap().to_string())
        .collect();
    assert!(
        instr(stage, "FROM").starts_with("python:3"),
        "the app needs python3"
    );
    let base_has = ["python3", "sync", "sh"];

    let yaml = example("kubernetes.yaml");
    let command = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("command:"))
        .expect("command:");
    let command: Vec<String> = serde_json::from_str(command.trim()).unwrap();
    assert_eq!(
        command[0], entry[0],
        "the manifest runs the image's drainit"
    );
    assert!(copied.contains(&command[0]));
    let items: Vec<String> = yaml
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .map(|l| {
            let v = l
                .split(" #")
                .next()
                .unwrap()
                .trim()
                .trim_start_matches("- ")
                .trim();
            v.trim_matches('"').to_string()
        })
        .collect();
    let dash = items.iter().position(|a| a == "--").expect("--");
    assert_eq!(
        items[dash + 1..],
        cmd[..],
        "the manifest runs the image's CMD"
    );
    for a in &items[..dash] {
        if let Some(step) = a.strip_prefix("--teardown=") {
            let program = shell_words::split(step).unwrap()[0].clone();
            assert!(
                copied.contains(&program) || base_has.contains(&program.as_str()),
                "teardown program {program} is not in the image"
            );
        }
    }
    // The kubelet probes the port drainit serves.
    let served = probe_addr(&items[..dash]);
    let probes_port = yaml
        .lines()
        .skip_while(|l| !l.contains("name: probes"))
        .find_map(|l| l.trim().strip_prefix("containerPort:"))
        .expect("the probes port")
        .trim()
        .to_string();
    assert_eq!(port_of(&served), probes_port);
    assert!(yaml.contains("path: /readyz") && yaml.contains("path: /healthz"));
}

/// The value after `prefix` on the first line of `text` that starts with it, up to
/// `end`.
fn after<'a>(text: &'a str, prefix: &str, end: char) -> &'a str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix}"))
        .split(end)
        .next()
        .unwrap()
}

/// The multi-arch build: the build stage's first RUN (run here with `rustup`
/// stubbed) picks, for each TARGETARCH Docker sets, the Rust target and linker
/// flags that release.sh builds with, and release.sh ships that architecture's
/// binary as `drainit-<TARGETARCH>` (what docs/packaging.md's `COPY
/// drainit-${TARGETARCH}` takes); any other architecture fails the build.
#[test]
fn dockerfile_example_builds_for_each_targetarch_what_release_sh_ships() {
    let text = repo_file("Dockerfile.example");
    let instrs = dockerfile(&text, false);
    let build = &instrs[..instrs.iter().rposition(|(i, _)| i == "FROM").unwrap()];
    assert_eq!(
        instr(build, "FROM"),
        "--platform=$BUILDPLATFORM rust:1 AS build",
        "the build stage runs on the builder's arch and cross-compiles"
    );
    // A default would override the value BuildKit sets (every image amd64).
    assert_eq!(instr(build, "ARG"), "TARGETARCH");
    let select = &build.iter().find(|(i, _)| i == "RUN").unwrap().1;

    let release = repo_file("release.sh");
    let amd64 = after(&release, "TARGET=${TARGET:-", '}');
    let arm64 = after(&release, "ARM64_TARGET=", ' ');
    let arm64_flags = after(&release, "build \"$ARM64_TARGET\" \"", '"');
    let flags = "-C target-feature=+crt-static -C relocation-model=static";
    assert!(release.contains(flags));
    assert!(text.contains(&format!("RUSTFLAGS=\"{flags} $LINKER\"")));

    let tmp = TmpDir::new("targetarch");
    for (arch, target, linker) in [
        ("amd64", amd64, ""),
        ("", amd64, ""),
        ("arm64", arm64, arm64_flags),
    ] {
        let env = tmp.join("target.env");
        let script = format!(
            "rustup() {{ echo \"rustup $*\"; }}; {} && echo \"$TARGET|$LINKER\"",
            select.replace("/target.env", env.to_str().unwrap())
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .env("TARGETARCH", arch)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "TARGETARCH={arch:?}: {stdout}");
        assert_eq!(
            stdout,
            format!("rustup target add {target}\n{target}|{linker}\n"),
            "TARGETARCH={arch:?}"
        );
        if !arch.is_empty() {
            assert!(
                release.contains(&format!("\"$DIST/drainit-{arch}\"")),
                "release.sh ships no drainit-{arch}"
            );
        }
    }
    let out = Command::new("sh")
        .args(["-c", &select.replace("/target.env", "/dev/null")])
        .env("TARGETARCH", "riscv64")
        .output()
        .unwrap();
    assert!(!out.status.success(), "riscv64 has no static build here");
    assert!(String::from_utf8_lossy(&out.stderr).contains("amd64 and arm64 only"));
    assert!(
        repo_file("docs/packaging.md").contains("COPY drainit-${TARGETARCH} "),
        "docs/packaging.md shows the prebuilt binaries picked by TARGETARCH"
    );
}
