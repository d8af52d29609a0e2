//! Property tests ("fuzzing" on stable, with proptest): the three parsers that
//! take input from outside drainit, and the admission proxy's clients.
//!
//! - The configuration (flags + environment + TOML file), through
//!   `config::load_from`: never a panic; an error is 64 or 78 (0 only for
//!   `--help`/`--version`); and, black box, with the real binary: exit 0, 64 or
//!   78 only, and on 64/78 the command never started.
//! - The sd_notify message parser (`notify::Message::parse`), on any bytes.
//! - The HTTP check's response parser (`checks::response_verdict`), on any bytes
//!   fed in any chunks, and on well-formed heads with any status.
//! - The admission proxy, black box: the real binary with `--proxy` in front of
//!   the real test app, fed hostile requests (framing that disagrees with
//!   itself, bad syntax, oversized heads, junk, HTTP/2 prefaces with junk): it
//!   stays up, answers with status lines, leaks no descriptor, lets the app see
//!   no request its ledger did not admit, and drains cleanly with the ledger
//!   whole.
//!
//! Bounded for CI: a fixed number of cases per property (`PROPTEST_CASES`
//! overrides it for a longer run). Failures proptest finds are saved in
//! `tests/fuzz.proptest-regressions` and replayed first on every run; the seed
//! inputs in `tests/corpus/` (config files, notify datagrams, response heads)
//! are replayed by the `corpus_*` tests.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use drainit::checks::{MAX_RESPONSE_HEAD, response_verdict};
use drainit::config::{self, Env};
use drainit::notify::{MAX_STATUS_BYTES, Message};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, FileFailurePersistence};

use common::*;

fn cases(default: u32) -> PtConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    PtConfig {
        cases: n,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/fuzz.proptest-regressions",
        ))),
        ..PtConfig::default()
    }
}

// ---- configuration ----

/// Values that mean something to some flag, and some that mean nothing; commands
/// only from a harmless pool (the black-box test runs what it accepts).
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "", "0", "5s", "500ms", "1m30s", "7d", "8d", "-1s", "1.5s", "99999999999999999999s",
            "TERM", "SIGQUIT", "15", "RTMIN+3", "RTMAX-40", "KILL", "CHLD", "PIPE", "0", "65",
            "TERM:QUIT", "HUP:0", "KILL:TERM", "TERM:TERM:TERM", ":",
            "off", "127.0.0.1:0", "[::1]:0", "localhost:0", "example.com:80", "1.2.3.4",
            "http://127.0.0.1:1/x?y", "http://u:p@localhost:1/", "https://x/", "http://[::1/",
            "true", "false", "sleep 0", "'unclosed", "\"a b\" c", "true,false",
            "skip", "ignore", "child", "group", "text", "json", "debug", "trace", "loud",
            "/nonexistent/dir/report.json", "/tmp", "report.json", "TRUE", "yes",
        ]).prop_map(String::from),
        1 => "\\PC{0,12}",
    ]
}

const FLAGS: [&str; 22] = [
    "probe-addr",
    "pre-drain-delay",
    "drain-timeout",
    "grace-period",
    "strict-budget",
    "drain-signal",
    "second-signal",
    "forward-to",
    "rewrite",
    "ready-tcp",
    "ready-http",
    "ready-exec",
    "ready-file",
    "ready-notify",
    "check-timeout",
    "ready-interval",
    "teardown",
    "teardown-timeout",
    "report-file",
    "log-format",
    "log-level",
    "check-config",
];

/// One command-line token, always starting with `-` (so that none becomes the
/// command): `--flag=value`, a bare `--flag`, or something unknown.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (prop::sample::select(FLAGS.to_vec()), value()).prop_map(|(f, v)| format!("--{f}={v}")),
        2 => prop::sample::select(FLAGS.to_vec()).prop_map(|f| format!("--{f}")),
        1 => prop::sample::select(vec!["--help", "-h", "--version", "--nope", "-x", "--"])
            .prop_map(String::from),
    ]
}

const ENV_VARS: [&str; 9] = [
    "DRAINIT_DRAIN_SIGNAL",
    "DRAINIT_REWRITE",
    "DRAINIT_READY_TCP",
    "DRAINIT_READY_HTTP",
    "DRAINIT_READY_EXEC",
    "DRAINIT_READY_FILE",
    "DRAINIT_TEARDOWN",
    "PRE_DRAIN_DELAY_MS",
    "DRAIN_TIMEOUT_MS",
];

/// The environment drainit reads itself (clap reads the other `DRAINIT_*` from
/// the process environment, which the black-box test varies): valid text or any
/// bytes.
fn env_map() -> impl Strategy<Value = HashMap<String, Vec<u8>>> {
    let val = prop_oneof![
        4 => value().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::hash_map(
        prop::sample::select(ENV_VARS.to_vec()).prop_map(String::from),
        val,
        0..3,
    )
}

const KEYS: [&str; 18] = [
    "probe_addr",
    "pre_drain_delay",
    "drain_timeout",
    "grace_period",
    "strict_budget",
    "drain_signal",
    "second_signal",
    "forward_to",
    "rewrite",
    "ready_notify",
    "check_timeout",
    "ready_interval",
    "teardown_timeout",
    "report_file",
    "log_format",
    "log_level",
    "unknown_key",
    "check",
];

fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => value().prop_map(|v| format!("{v:?}")),
        1 => prop::collection::vec(value(), 0..3).prop_map(|v| format!("{v:?}")),
        1 => prop::sample::select(vec!["true", "false", "5", "-1", "1.5", "{}", "[1, 2]", "\"\\u0000\"", "'''x'''"])
            .prop_map(String::from),
    ]
}

/// A TOML file: lines from the real keys and tables with valid or bad values, or
/// any bytes.
fn toml_text() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        6 => (prop::sample::select(KEYS.to_vec()), toml_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => (prop::sample::select(vec!["tcp", "http", "file", "name", "timeout"]), value())
            .prop_map(|(k, v)| format!("[[check]]\n{k} = {v:?}")),
        1 => prop::sample::select(vec![
            "[[check]]\nexec = [\"true\"]",
            "[[check]]\nexec = []",
            "[[check]]\ntcp = \"127.0.0.1:1\"\nhttp = \"http://127.0.0.1:1/\"",
            "[[teardown]]\ncommand = [\"true\"]\ntimeout = \"1s\"",
            "[[teardown]]\ncommand = []",
            "[[teardown]]\nname = \"x\"",
            "[teardown]",
            "[[bogus]]",
            "check = [{ tcp = \"127.0.0.1:1\" }]",
        ]).prop_map(String::from),
        1 => "\\PC{0,16}",
    ];
    prop_oneof![
        5 => prop::collection::vec(line, 0..6).prop_map(|l| l.join("\n").into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

struct MapEnv(HashMap<String, Vec<u8>>);

impl Env for MapEnv {
    fn get(&self, key: &str) -> Option<String> {
        self.0
            .get(key)
            .and_then(|v| String::from_utf8(v.clone()).ok())
    }
    fn get_os(&self, key: &str) -> Option<OsString> {
        self.0
            .get(key)
            .map(|v| std::ffi::OsStr::from_bytes(v).to_os_string())
    }
}

fn config_file(dir: &Path, text: &[u8]) -> PathBuf {
    let p = dir.join("fuzz.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// What a configuration error or success must look like.
fn check_outcome(args: &[String], r: &Result<config::Config, config::ConfigError>) {
    match r {
        Ok(c) => assert!(
            !c.command.is_empty() || c.check_config,
            "accepted without a command: {args:?}"
        ),
        Err(e) if e.code == 0 => assert!(
            args.iter()
                .any(|a| ["--help", "-h", "--version", "-V"].contains(&a.as_str())),
            "exit 0 without --help/--version: {args:?}"
        ),
        Err(e) => {
            assert!(
                [64, 78].contains(&e.code),
                "code {} for {args:?}: {}",
                e.code,
                e.message
            );
            assert!(!e.message.trim().is_empty(), "an error without a message");
        }
    }
}

proptest! {
    #![proptest_config(cases(300))]

    /// Library level: flags × environment × file, no panic, only 0/64/78.
    #[test]
    fn config_never_panics_and_errors_are_64_or_78(
        tokens in prop::collection::vec(token(), 0..6),
        env in env_map(),
        file in prop::option::of(toml_text()),
        with_command in any::<bool>(),
    ) {
        let tmp = TmpDir::new("fuzzcfg");
        let mut args: Vec<String> = vec!["drainit".into()];
        if let Some(text) = &file {
            args.push("--config".into());
            args.push(config_file(tmp.path(), text).display().to_string());
        }
        args.extend(tokens);
        if with_command {
            args.extend(["--".into(), "true".into()]);
        }
        let os: Vec<OsString> = args.iter().map(OsString::from).collect();
        let r = std::panic::catch_unwind(|| config::load_from(os, &MapEnv(env.clone())));
        let r = r.unwrap_or_else(|_| panic!("load_from panicked: {args:?} env {env:?}"));
        check_outcome(&args[1..], &r);
    }
}

/// Black box: the real binary on `args` (+ `--config` with `file`, + `env`), its
/// command `touch STARTED`; returns the exit code and whether the command ran.
fn run_drainit(
    tmp: &TmpDir,
    args: &[String],
    env: &[(String, Vec<u8>)],
    file: Option<&[u8]>,
) -> (i32, bool, String) {
    let started = tmp.join("started");
    let _ = std::fs::remove_file(&started);
    let mut cmd = Command::new(bin());
    if let Some(text) = file {
        cmd.arg("--config").arg(config_file(tmp.path(), text));
    }
    cmd.args([
        "--drain-timeout=2s",
        "--teardown-timeout=2s",
        "--check-timeout=1s",
    ])
    .args(args)
    .arg("--")
    .arg(touch())
    .arg(&started)
    // Generated commands (a teardown step, an exec check) are never found:
    // nothing the generator writes can run a real program.
    .env("PATH", tmp.path())
    // A generated relative `--report-file` or `--ready-file` lands here.
    .current_dir(tmp.path())
    .env("DRAINIT_TEST_TMP", tmp.path())
    .env_remove("KUBERNETES_SERVICE_HOST")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, std::ffi::OsStr::from_bytes(v));
    }
    let mut child = cmd.spawn().unwrap();
    let status = wait_child(
        &mut child,
        Duration::from_secs(20),
        Duration::from_millis(5),
        tmp.path(),
        &format!("drainit {args:?}"),
    );
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    // drainit exited: it leaves nothing running (it SIGKILLs what is left), and on
    // 64/78 it started nothing; `kill_marked` (a walk of every /proc entry) is
    // needed only on the timeout above.
    (status.code().unwrap_or(-1), started.exists(), err)
}

fn touch() -> &'static str {
    ["/usr/bin/touch", "/bin/touch"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("touch(1)")
}

fn assert_black_box(
    code: i32,
    started: bool,
    stderr: &str,
    what: &dyn std::fmt::Debug,
    command_given: bool,
) {
    // A generated `--` makes the tokens after it the command: not found (127).
    let command_codes: &[i32] = if command_given { &[126, 127] } else { &[] };
    assert!(
        [0, 2, 64, 78].contains(&code) || command_codes.contains(&code),
        "exit {code} for {what:?}:\n{stderr}"
    );
    if code == 64 || code == 78 {
        assert!(
            !started,
            "the command ran although drainit exited {code}: {what:?}"
        );
    }
    assert!(!stderr.contains("panicked"), "{what:?}:\n{stderr}");
}

proptest! {
    // Each case starts the binary: few cases, still bounded in seconds.
    #![proptest_config(cases(24))]

    /// Black box: exit 0/64/78 only (2 when an accepted teardown step fails), and
    /// on 64/78 the command never ran. Every variable reaches the binary, the ones
    /// clap reads included.
    #[test]
    fn binary_on_bad_input_starts_nothing(
        tokens in prop::collection::vec(token(), 0..4),
        env in env_map(),
        clap_env in prop::option::of((prop::sample::select(vec![
            "DRAINIT_PRE_DRAIN_DELAY", "DRAINIT_LOG_LEVEL", "DRAINIT_STRICT_BUDGET",
            "DRAINIT_REPORT_FILE", "DRAINIT_FORWARD_TO",
        ]), prop::collection::vec(any::<u8>(), 0..6))),
        file in prop::option::of(toml_text()),
    ) {
        let tmp = TmpDir::new("fuzzbin");
        // No argument or variable can hold a NUL byte (execve(2) takes C strings).
        let tokens: Vec<String> = tokens.into_iter().map(|t| t.replace('\0', "\u{1}")).collect();
        let env: HashMap<String, Vec<u8>> = env
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().map(|b| if b == 0 { 1 } else { b }).collect()))
            .collect();
        let clap_env = clap_env.map(|(k, v)| (k, v.into_iter().map(|b| if b == 0 { 1 } else { b }).collect::<Vec<u8>>()));
        // The probe server: a free port (never the default's, shared by tests).
        let mut args = vec![format!("--probe-addr=127.0.0.1:{}", free_port())];
        args.extend(tokens);
        let mut env: Vec<(String, Vec<u8>)> = env.into_iter().collect();
        if let Some((k, v)) = clap_env {
            env.push((k.to_string(), v));
        }
        let (code, started, stderr) = run_drainit(&tmp, &args, &env, file.as_deref());
        let command_given = args.iter().any(|a| a == "--");
        assert_black_box(code, started, &stderr, &(&args, &env), command_given);
    }
}

// ---- sd_notify ----

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn notify_parser_takes_any_bytes(datagram in prop::collection::vec(any::<u8>(), 0..600)) {
        let m = Message::parse(&datagram);
        if let Some(s) = &m.status {
            prop_assert!(s.len() <= MAX_STATUS_BYTES);
        }
    }

    /// Well-formed datagrams say what they carry, in any order, among noise.
    #[test]
    fn notify_parser_reads_what_is_sent(
        ready in any::<bool>(),
        stopping in any::<bool>(),
        beat in any::<bool>(),
        status in prop::option::of("[^\n]{0,300}"),
        usec in prop::option::of(0u64..10_000_000_000),
        noise in prop::collection::vec("[A-Z_]{0,8}=?[^\n]{0,8}", 0..4),
    ) {
        let mut lines: Vec<String> = noise
            .into_iter()
            .filter(|l| !["READY=", "STOPPING=", "WATCHDOG", "STATUS="].iter().any(|k| l.starts_with(k)))
            .collect();
        if ready { lines.push("READY=1".into()); }
        if stopping { lines.push("STOPPING=1".into()); }
        if beat { lines.push("WATCHDOG=1".into()); }
        if let Some(s) = &status { lines.push(format!("STATUS={s}")); }
        if let Some(u) = usec { lines.push(format!("WATCHDOG_USEC={u}")); }
        let m = Message::parse(lines.join("\n").as_bytes());
        prop_assert_eq!(m.ready, ready);
        prop_assert_eq!(m.stopping, stopping);
        prop_assert_eq!(m.beat, beat);
        match (&status, &m.status) {
            (Some(sent), Some(got)) => prop_assert!(sent.starts_with(got.as_str()) && got.len() <= MAX_STATUS_BYTES),
            (None, None) => {}
            (a, b) => prop_assert!(false, "status {:?} parsed as {:?}", a, b),
        }
        prop_assert_eq!(
            m.watchdog,
            usec.map(|u| (u > 0).then(|| Duration::from_micros(u)))
        );
    }
}

// ---- the HTTP check's response head ----

/// Feeds `bytes` in chunks of `sizes` (cycled) as the check does; the verdict, or
/// `None` when the bytes end before one.
fn feed(bytes: &[u8], sizes: &[usize]) -> Option<Result<(), String>> {
    let mut head = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = sizes[i % sizes.len()].clamp(1, 1024).min(bytes.len() - at);
        head.extend_from_slice(&bytes[at..at + n]);
        at += n;
        i += 1;
        if let Some(v) = response_verdict(&mut head) {
            return Some(v);
        }
        assert!(
            head.len() < MAX_RESPONSE_HEAD + 1024,
            "the head grows past its bound"
        );
    }
    None
}

proptest! {
    // Each case re-parses the head after every chunk: fewer cases.
    #![proptest_config(cases(400))]

    #[test]
    fn response_parser_takes_any_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        sizes in prop::collection::vec(1usize..1024, 1..4),
    ) {
        if let Some(Err(e)) = feed(&bytes, &sizes) {
            prop_assert!(e == "bad response" || e.starts_with("http status "), "{}", e);
        }
    }

    /// A well-formed head passes exactly for a final status 200–399, after any
    /// interim responses, whatever the chunking.
    #[test]
    fn response_parser_judges_the_final_status(
        interim in prop::collection::vec(prop::sample::select(vec![100u16, 102, 103]), 0..3),
        code in 100u16..1000,
        // Up to 70: more than the 64 the parser has room for.
        headers in prop::collection::vec(("[A-Za-z-]{1,12}", "[ -~]{0,20}"), 0..70),
        body in "[ -~]{0,30}",
        sizes in prop::collection::vec(1usize..64, 1..4),
    ) {
        let mut text = String::new();
        for c in &interim {
            text.push_str(&format!("HTTP/1.1 {c} Info\r\n\r\n"));
        }
        text.push_str(&format!("HTTP/1.1 {code} Reason\r\n"));
        for (k, v) in &headers {
            text.push_str(&format!("{k}: {}\r\n", v.trim()));
        }
        text.push_str("\r\n");
        let final_code = code;
        let interim_last = final_code < 200 && final_code != 101;
        if !interim_last {
            // After an interim head come only more heads.
            text.push_str(&body);
        }
        let verdict = feed(text.as_bytes(), &sizes);
        if interim_last {
            // Another interim response: the answer has not come yet.
            prop_assert!(verdict.is_none(), "{:?}", verdict);
        } else if (200..400).contains(&final_code) {
            prop_assert_eq!(verdict, Some(Ok(())));
        } else {
            prop_assert_eq!(verdict, Some(Err(format!("http status {final_code}"))));
        }
    }
}

// ---- the corpus ----

fn corpus(kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no corpus in {}", dir.display());
    v
}

#[test]
fn corpus_config_files() {
    let tmp = TmpDir::new("corpus-cfg");
    for (path, text) in corpus("config") {
        let args = vec!["--probe-addr=off".to_string()];
        let (code, started, stderr) = run_drainit(&tmp, &args, &[], Some(&text));
        assert_black_box(code, started, &stderr, &path, false);
        // The library agrees, and says why.
        let os = vec![
            OsString::from("drainit"),
            "--config".into(),
            config_file(tmp.path(), &text).into(),
            "--".into(),
            "true".into(),
        ];
        let r = config::load_from(os, &MapEnv(HashMap::new()));
        check_outcome(&[], &r);
        let expect_ok = path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("ok-");
        assert_eq!(r.is_ok(), expect_ok, "{}: {:?}", path.display(), r.err());
    }
}

#[test]
fn corpus_notify_datagrams() {
    for (_, d) in corpus("notify") {
        let m = Message::parse(&d);
        assert!(
            m.status
                .as_ref()
                .is_none_or(|s| s.len() <= MAX_STATUS_BYTES)
        );
    }
}

#[test]
fn corpus_http_heads() {
    for (path, head) in corpus("http") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let v = feed(&head, &[7, 100, 1]);
        let want_ok = name.starts_with("ok-");
        assert_eq!(matches!(v, Some(Ok(()))), want_ok, "{name}: {v:?}");
    }
}

// ---- the admission proxy ----

/// A request line's method: real ones, odd ones, and bytes that are no token.
fn px_method() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "CONNECT", "PRI", "get", "", "G T",
        ])
        .prop_map(String::from),
        "[A-Z]{1,12}",
        "[ -~]{0,8}",
    ]
}

/// A request target: the app's routes, the other forms (RFC 9112 §3.2), and
/// junk, up to 20 kB.
fn px_target() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "/ok",
            "/",
            "*",
            "http://a.example/ok",
            "a.example:443",
            "/slow?ms=50",
            "/upload",
            "/chunked?n=3",
            "//x/../..",
            "/%00?q=%ff",
        ])
        .prop_map(String::from),
        "/[ -~]{0,40}",
        "[^\r\n]{0,20}",
        (0usize..20_000).prop_map(|n| format!("/{}", "a".repeat(n))),
    ]
}

/// A header line: framing that disagrees with itself (the request smuggling
/// kinds: two lengths, length and chunked, odd codings), hop-by-hop fields,
/// upgrades, bad syntax (no colon, space before it, obs-fold, NUL), and
/// fields up to 80 kB (past the head limit: 431).
fn px_field() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "Host: a.example",
            "Host: ",
            "Host: a b",
            "Content-Length: -1",
            "Content-Length: 99999999999999999999",
            "Content-Length: 5, 5",
            "Content-Length: 5, 6",
            "Content-Length: +5",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: chunked, identity",
            "Transfer-Encoding: xchunked",
            "Transfer-Encoding: gzip",
            "Connection: close",
            "Connection: keep-alive, Upgrade",
            "Connection: host",
            "Upgrade: websocket",
            "Upgrade: h2c",
            "Expect: 100-continue",
            "TE: trailers",
            " folded",
            "NoColon",
            "Host : a",
            "X-Nul: a\0b",
        ])
        .prop_map(String::from),
        (0u32..3000).prop_map(|n| format!("Content-Length: {n}")),
        "X-Request-Id: [ -~]{0,40}",
        "[A-Za-z-]{1,20}: [ -~]{0,40}",
        (0usize..80_000).prop_map(|n| format!("X-Big: {}", "b".repeat(n))),
    ]
}

/// What follows the head: nothing, chunked bodies (good, with a pipelined
/// request after the last chunk, with an absurd size), or any bytes.
fn px_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"5\r\nhello\r\n0\r\n\r\n".to_vec()),
        Just(b"0\r\n\r\nGET /ok HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()),
        Just(b"ffffffffffffffffff\r\nx".to_vec()),
        prop::collection::vec(any::<u8>(), 0..2000),
    ]
}

/// One hostile client's bytes, and whether they open as HTTP/2 (whose answer is
/// binary frames, not a status line).
fn px_request() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let http1 = (
        px_method(),
        px_target(),
        prop::sample::select(vec![
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/2.0",
            "HTTP/1.1 ",
            "http/1.1",
            "HTTP/9.9",
            "",
        ]),
        prop::collection::vec(px_field(), 0..8),
        prop::sample::select(vec!["\r\n", "\n"]),
        px_body(),
    )
        .prop_map(|(method, target, version, fields, eol, body)| {
            let mut b = format!("{method} {target} {version}{eol}").into_bytes();
            for f in fields {
                b.extend(f.as_bytes());
                b.extend(eol.as_bytes());
            }
            b.extend(eol.as_bytes());
            b.extend(body);
            (b, false)
        });
    // Mostly well-formed heads (a method, an origin-form target, HTTP/1.1, a
    // Host) with odd fields and bodies: these reach the app, where framing
    // and the ledger are tested; the rest mostly end as 400.
    let forwarded = (
        prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS"]),
        prop::sample::select(vec![
            "/ok",
            "/upload",
            "/slow?ms=20",
            "/chunked?n=3",
            "/echo-headers",
            "/nothing-here",
        ]),
        prop::collection::vec(px_field(), 0..5),
        px_body(),
    )
        .prop_map(|(method, target, fields, body)| {
            let mut b = format!("{method} {target} HTTP/1.1\r\nHost: a.example\r\n").into_bytes();
            for f in fields {
                b.extend(f.as_bytes());
                b.extend(b"\r\n");
            }
            b.extend(b"\r\n");
            b.extend(body);
            (b, false)
        });
    prop_oneof![
        6 => forwarded,
        3 => http1,
        1 => prop::collection::vec(any::<u8>(), 0..500).prop_map(|b| (b, false)),
        1 => prop::collection::vec(any::<u8>(), 0..500).prop_map(|b| {
            let mut v = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            v.extend(b);
            (v, true)
        }),
    ]
}

/// Sends `bytes` on a new connection to the proxy and reads what comes back
/// for at most 1.5 s (a request still waiting for its body is left there: the
/// connection is then dropped, as a client that gives up).
fn px_exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return Vec::new();
    };
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let _ = c.write_all(bytes);
    let (mut got, mut buf) = (Vec::new(), [0u8; 16384]);
    let end = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < end && got.len() < 1 << 20 {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend(&buf[..n]),
        }
    }
    got
}

/// The admission proxy (`--proxy`) in front of the real test app, fed hostile
/// requests one connection each (docs/proxy.md: nothing the client sends can make
/// drainit exit, hang, or forget a request): after every one drainit is alive
/// and whatever came back starts with a status line; every 25, `/healthz`
/// answers; after them all, a normal request is served, the descriptors opened
/// for them are closed again, the app received no request the ledger did not
/// admit (no framing the app read differently from drainit), and a SIGTERM
/// drains cleanly (exit 0) with the ledger's equations whole.
#[test]
fn the_proxy_survives_hostile_requests_and_forgets_none() {
    let ports = ProxyPorts::new();
    let log_flag = "$TMP/app.log";
    let mut r = ports.start_under_nofile(
        "4096",
        &["--pre-drain-delay", "0s", "--drain-timeout", "5s"],
        &[
            "python3",
            &fixture("proxyapp.py"),
            "--port",
            "{app}",
            "--mode",
            "graceful",
            "--log",
            log_flag,
        ],
    );
    let warm = px_exchange(ports.port, b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(warm.starts_with(b"HTTP/1.1 200"), "{}", r.stderr_text());
    let baseline = open_fds(r.pid);
    let mut runner = proptest::test_runner::TestRunner::new(cases(300));
    let n = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&px_request(), |(bytes, h2)| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let got = px_exchange(ports.port, &bytes);
        prop_assert!(
            alive(r.pid),
            "drainit died on {:?}",
            String::from_utf8_lossy(&bytes)
        );
        if !h2 && !got.is_empty() {
            prop_assert!(
                got.starts_with(b"HTTP/1."),
                "not a status line {:?} for {:?}",
                String::from_utf8_lossy(&got[..got.len().min(80)]),
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            );
        }
        if i.is_multiple_of(25) {
            prop_assert_eq!(http(ports.probe, "/healthz", "GET").0, 200);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\n{}", r.stderr_text());
    }
    let ok = px_exchange(ports.port, b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(
        ok.starts_with(b"HTTP/1.1 200"),
        "after the hostile requests: {}",
        r.stderr_text()
    );
    assert!(
        wait_until(secs(15), || open_fds(r.pid) <= baseline + 2),
        "descriptors: {} at the start, {} after the hostile requests\n{}",
        baseline,
        open_fds(r.pid),
        r.stderr_text()
    );
    let metrics = http(ports.probe, "/metrics", "GET").2;
    let resent: i64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drainit_proxy_upstream_resent_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(secs(15));
    let rep = r.report();
    assert_eq!(code, 0, "{rep}\n{}", r.stderr_text());
    let q = ledger(&rep);
    let app_log = fs::read_to_string(r.tmp.join("app.log")).unwrap_or_default();
    let app_received = app_log.lines().filter(|l| l.starts_with("recv ")).count() as i64;
    assert!(
        app_received <= num(q, "admitted") + resent,
        "the app received {app_received} requests, the ledger admitted {} (+{resent} resent): {q}",
        num(q, "admitted")
    );
    eprintln!(
        "proxy fuzz: {} hostile connections; ledger {q}; the app received {app_received}",
        n.into_inner()
    );
}
