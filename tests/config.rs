//! Configuration, black box: precedence flag > environment > file > default for each
//! kind of setting, `--check-config`, and bad input: exit 64 on the command line, 78
//! in the environment or the file, a message naming the flag, variable or key (with
//! its line and column), and nothing started.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::*;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn file(tmp: &TmpDir, text: &str) -> String {
    let p = tmp.join("drainit.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn precedence_flag_over_env_over_file_over_default() {
    let tmp = TmpDir::new("prec");
    let cfg = file(
        &tmp,
        "drain_timeout = \"7s\"\nrewrite = [\"TERM:QUIT\"]\nforward_to = \"group\"\n",
    );
    let check = |args: &[&str], env: &[(&str, &str)], want: &[&str]| {
        let mut a = vec!["--check-config"];
        a.extend_from_slice(args);
        let o = run(&a, env);
        assert_eq!(o.code, 0, "{}", o.stderr);
        for w in want {
            assert!(o.stdout.contains(w), "want {w} in:\n{}", o.stdout);
        }
    };
    check(
        &[],
        &[],
        &[
            "drain_timeout = \"20s\"",
            "rewrite = []",
            "forward_to = \"child\"",
        ],
    );
    check(
        &["--config", &cfg],
        &[],
        &[
            "drain_timeout = \"7s\"",
            "rewrite = [\"SIGTERM:SIGQUIT\"]",
            "forward_to = \"group\"",
        ],
    );
    check(
        &["--config", &cfg],
        &[
            ("DRAINIT_DRAIN_TIMEOUT", "8s"),
            ("DRAINIT_REWRITE", "HUP:USR1"),
            ("DRAINIT_FORWARD_TO", "child"),
        ],
        &[
            "drain_timeout = \"8s\"",
            "rewrite = [\"SIGHUP:SIGUSR1\"]",
            "forward_to = \"child\"",
        ],
    );
    check(
        &[
            "--config",
            &cfg,
            "--drain-timeout",
            "9s",
            "--rewrite",
            "INT:0",
        ],
        &[
            ("DRAINIT_DRAIN_TIMEOUT", "8s"),
            ("DRAINIT_REWRITE", "HUP:USR1"),
        ],
        &["drain_timeout = \"9s\"", "rewrite = [\"SIGINT:0\"]"],
    );
    // The config file can come from the environment too; plain milliseconds rank
    // below DRAINIT_* and above the file.
    check(
        &[],
        &[("DRAINIT_CONFIG", &cfg), ("DRAIN_TIMEOUT_MS", "1500")],
        &["drain_timeout = \"1s 500ms\""],
    );
    check(
        &[],
        &[
            ("DRAINIT_CONFIG", &cfg),
            ("DRAIN_TIMEOUT_MS", "1500"),
            ("DRAINIT_DRAIN_TIMEOUT", "3s"),
        ],
        &["drain_timeout = \"3s\""],
    );
}

#[test]
fn check_config_prints_checks_teardown_and_the_budget_figure_by_figure() {
    let tmp = TmpDir::new("show");
    let cfg = file(
        &tmp,
        "pre_drain_delay = \"5s\"\ndrain_timeout = \"20s\"\ngrace_period = \"30s\"\n\n[[check]]\nname = \"db\"\nhttp = \"http://user:secret@127.0.0.1:5432/health\"\ntimeout = \"500ms\"\n\n[[teardown]]\nname = \"flush\"\ncommand = [\"sync\"]\ntimeout = \"2s\"\n\n[[teardown]]\ncommand = [\"/bin/true\"]\n",
    );
    let o = run(&["--check-config", "--config", &cfg], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("name = \"db\"") && o.stdout.contains("timeout = \"500ms\""),
        "{}",
        o.stdout
    );
    assert!(
        !o.stdout.contains("secret"),
        "credentials are never printed: {}",
        o.stdout
    );
    assert!(
        o.stdout.contains("pre-drain delay 5s + drain timeout 20s + teardown 7s (2s + 5s) = 32s of grace period 30s"),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr.contains("warning"),
        "a budget that does not fit warns: {}",
        o.stderr
    );
}

#[test]
fn bad_values_name_their_source_and_start_nothing() {
    let tmp = TmpDir::new("bad");
    let witness = tmp.join("started");
    let touch = format!("touch {}", witness.display());
    let cmd = ["sh", "-c", touch.as_str()];
    let expect = |args: &[&str], env: &[(&str, &str)], code: i32, needles: &[&str]| {
        let mut a = args.to_vec();
        a.push("--");
        a.extend_from_slice(&cmd);
        let o = run(&a, env);
        assert_eq!(o.code, code, "{args:?} {env:?}: {}", o.stderr);
        for n in needles {
            assert!(
                o.stderr.contains(n),
                "{args:?} {env:?}: want {n:?} in: {}",
                o.stderr
            );
        }
        assert!(
            o.stderr.starts_with("drainit: error:") || o.stderr.contains("error:"),
            "{}",
            o.stderr
        );
    };
    bad_flags(&expect, &tmp);
    bad_environment(&expect, &tmp);
    bad_files(&expect, &tmp);
    assert!(
        !witness.exists(),
        "bad configuration must never start the child"
    );
}

/// How a refusal is checked: the arguments, the environment, the exit code, and
/// what the message must name.
type Expect<'a> = dyn Fn(&[&str], &[(&str, &str)], i32, &[&str]) + 'a;

fn bad_flags(expect: &Expect, tmp: &TmpDir) {
    // Command line: 64, naming the flag.
    expect(
        &["--pre-drain-delay", "5 parsecs"],
        &[],
        64,
        &["--pre-drain-delay", "5 parsecs"],
    );
    expect(
        &["--drain-signal", "TERMINATE"],
        &[],
        64,
        &["--drain-signal", "TERMINATE"],
    );
    expect(&["--probe-addr", "localhost"], &[], 64, &["--probe-addr"]);
    expect(
        &["--ready-tcp", "127.0.0.1:99999"],
        &[],
        64,
        &["--ready-tcp", "port"],
    );
    expect(&["--second-signal", "twice"], &[], 64, &["--second-signal"]);
    expect(
        &["--drain-timeout", "18446744073709551615s"],
        &[],
        64,
        &["--drain-timeout", "at most 7d"],
    );
    expect(&["--ready-file", ""], &[], 64, &["--ready-file", "empty"]);
    expect(
        &["--rewrite", "KILL:TERM"],
        &[],
        64,
        &["--rewrite", "SIGKILL"],
    );
    expect(
        &["--rewrite", "TERM:QUIT", "--rewrite", "TERM:INT"],
        &[],
        64,
        &["--rewrite", "TERM:QUIT", "TERM:INT"],
    );
    // A report file that could never be written: 78 even on the command line,
    // like a probe port that is taken.
    let nowhere = tmp.join("missing-dir").join("report.json");
    expect(
        &["--report-file", nowhere.to_str().unwrap()],
        &[],
        78,
        &["--report-file", "does not exist"],
    );
}

fn bad_environment(expect: &Expect, tmp: &TmpDir) {
    let nowhere = tmp.join("missing-dir").join("report.json");
    // Environment: 78, naming the variable.
    expect(
        &[],
        &[("DRAINIT_PROBE_ADDR", "nowhere")],
        78,
        &["DRAINIT_PROBE_ADDR"],
    );
    expect(
        &[],
        &[("DRAINIT_DRAIN_SIGNAL", "TERM,BOGUS")],
        78,
        &["DRAINIT_DRAIN_SIGNAL", "BOGUS"],
    );
    expect(
        &[],
        &[("PRE_DRAIN_DELAY_MS", "5s")],
        78,
        &["PRE_DRAIN_DELAY_MS"],
    );
    expect(
        &[],
        &[("DRAINIT_DRAIN_SIGNAL", "")],
        78,
        &["DRAINIT_DRAIN_SIGNAL", "at least one"],
    );
    expect(
        &[],
        &[("DRAINIT_PRE_DRAIN_DELAY", "9000000000000000000s")],
        78,
        &["DRAINIT_PRE_DRAIN_DELAY", "at most 7d"],
    );
    expect(
        &[],
        &[("DRAINIT_REWRITE", "TERM:QUIT,TERM:INT")],
        78,
        &["DRAINIT_REWRITE", "TERM:QUIT", "TERM:INT"],
    );
    expect(
        &[],
        &[("DRAINIT_REPORT_FILE", nowhere.to_str().unwrap())],
        78,
        &["DRAINIT_REPORT_FILE", "does not exist"],
    );
}

fn bad_files(expect: &Expect, tmp: &TmpDir) {
    // File: 78, naming the key with its line and column.
    let cases = [
        (
            "pre_drain_delay = \"2s\"\ndrain_timeout = \"soon\"\n",
            &["drain_timeout", ":2:17"][..],
        ),
        (
            "probe_addr = \"off\"\nfrobnicate = true\n",
            &["frobnicate", ":2:1"][..],
        ),
        ("strict_budget = \"yes\"\n", &[":1:17"][..]),
        (
            "drain_signal = [\"TERM\", \"NOPE\"]\n",
            &["drain_signal", ":1:25", "NOPE"][..],
        ),
        (
            "[[check]]\nname = \"app\"\ntcp = \"127.0.0.1:0\"\n",
            &["tcp", ":3:7"][..],
        ),
        (
            "[[check]]\nname = \"app\"\n",
            &[":1:1", "exactly one of tcp, http, exec, file"][..],
        ),
        ("drain_signal = []\n", &["drain_signal", ":1:16"][..]),
        (
            "[[teardown]]\ncommand = [\"x\"]\ntimeout = \"8d\"\n",
            &["timeout", ":3:11", "at most 7d"][..],
        ),
        (
            "report_file = \"/nonexistent/report.json\"\n",
            &["report_file", ":1:15", "does not exist"][..],
        ),
        (
            "[[teardown]]\ncommand = [\"x\"]\ntimeout = \"1 fortnight\"\n",
            &["timeout", ":3:11"][..],
        ),
        ("pre_drain_delay = \n", &[":1:"][..]),
    ];
    for (text, needles) in cases {
        let cfg = file(tmp, text);
        expect(&["--config", &cfg], &[], 78, needles);
    }
    expect(
        &["--config", "/nonexistent/drainit.toml"],
        &[],
        78,
        &["/nonexistent/drainit.toml", "not found"],
    );
}

#[test]
fn check_config_redacts_query_strings_and_shows_short_durations_exactly() {
    let o = run(
        &[
            "--check-config",
            "--ready-http",
            "http://127.0.0.1:8080/health?token=hunter2",
            "--pre-drain-delay",
            "500us",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains("hunter2"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("http = \"http://127.0.0.1:8080/health?***\""),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("pre_drain_delay = \"500us\""),
        "{}",
        o.stdout
    );
}

/// The report file is written in place when it is not a regular file: a device
/// stays a device, a symlink stays a symlink (and its target gets the report).
#[test]
fn the_report_file_never_replaces_a_device_or_a_symlink() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = TmpDir::new("report-special");
    let o = run(
        &[
            "--probe-addr",
            "off",
            "--report-file",
            "/dev/null",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
    assert!(
        t.is_char_device(),
        "/dev/null is no longer a character device"
    );

    let real = tmp.join("real.json");
    let link = tmp.join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = run(
        &[
            "--probe-addr",
            "off",
            "--report-file",
            link.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
        &[],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert_eq!(report["exit_code"], 3);
    // The report is still the last line of stderr.
    let last = o.stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("{\"drainit\":\"exit\""), "{}", o.stderr);
}

/// A teardown step or exec check whose program is not there gets a warning at
/// start, naming it, while the app still runs (it may appear later); the step then
/// fails at the drain with the same word in the log and the report.
#[test]
fn a_missing_helper_program_is_warned_about_at_start() {
    let o = run(
        &[
            "--probe-addr",
            "off",
            "--teardown",
            "/nonexistent/flush-metrics --now",
            "--ready-exec",
            "no-such-check-program",
            "--",
            "true",
        ],
        &[],
    );
    let warned = |what: &str, program: &str| {
        o.stderr.lines().any(|l| {
            l.contains("warning") && l.contains(what) && l.contains(&format!("'{program}'"))
        })
    };
    assert!(
        warned("teardown step", "/nonexistent/flush-metrics"),
        "{}",
        o.stderr
    );
    assert!(
        warned("exec check", "no-such-check-program"),
        "{}",
        o.stderr
    );
    assert_eq!(o.code, 2, "the step fails at the end: {}", o.stderr);
    assert!(
        o.stderr.contains("could not be started: not found"),
        "{}",
        o.stderr
    );
}

/// A value clap itself reads from the environment and refuses (an empty
/// `DRAINIT_CONFIG`) is an environment error like any other: 78, naming the
/// variable (the exit-code table), while the same mistake on the command line stays 64.
#[test]
fn a_value_clap_refuses_in_the_environment_is_78_naming_the_variable() {
    let tmp = TmpDir::new("clapenv");
    let witness = tmp.join("started");
    let touch = format!("touch {}", witness.display());
    let o = run(
        &["--probe-addr", "off", "--", "sh", "-c", &touch],
        &[("DRAINIT_CONFIG", "")],
    );
    assert_eq!(o.code, 78, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("invalid value in environment variable DRAINIT_CONFIG: the value is empty"),
        "{}",
        o.stderr
    );
    let o = run(
        &["--probe-addr", "off", "--config=", "--", "sh", "-c", &touch],
        &[],
    );
    assert_eq!(o.code, 64, "{}", o.stderr);
    assert!(o.stderr.contains("--config"), "{}", o.stderr);
    assert!(!witness.exists(), "the child was started");
}
