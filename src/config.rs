//! Configuration: command line + environment + TOML file → a validated [`Config`].
//!
//! Owns: parsing and validation of every setting (docs/configuration.md), the precedence
//! flag > environment > file > default, the grace-budget arithmetic, and the exit
//! codes for bad input (64 for the command line, 78 for environment and file).
//!
//! Must not: start anything. A bad value is found here, before the probe socket is
//! bound or the child spawned, so bad input never leaves a half-started app.
//!
//! Shape (ripgrep's): clap parses raw strings ([`command`]); [`load_from`] validates them,
//! together with the environment and the file, into the [`Config`] the rest of
//! drainit uses. Values are kept as strings until then so that an error can name
//! where the value came from: the flag, the `DRAINIT_*` variable, or the file's key
//! with its line and column.
//!
//! Settings as data (`settings.rs`): each setting is one entry of a table that
//! gives its flag, variable, file key, default, help, validation, `--check-config`
//! line and its row of the configuration reference (`docs/configuration.md`); one
//! lookup by precedence (`lookup.rs`, which also reads the file) serves every
//! setting, lists included. The readiness checks
//! and teardown steps given by flag are settings too; the file gives them as
//! tables (`[[check]]`, `[[teardown]]`), read when no flag or variable gave any.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};

pub use crate::checks::{Check, CheckKind};
use crate::drain::SecondSignal;
use crate::exit;
pub use crate::proxy::ProxySpec;
use crate::signals::{RewriteMap, Signal};
use crate::util::io_word_or_text;

mod lookup;
pub mod platform;
mod settings;
use lookup::{FileCheck, FileConfig, Given, Resolver};
pub use platform::Platform;
use settings::{Draft, SETTINGS, Setting, env_name, fmt_dur, q, q_list};

const EXAMPLES: &str = "\
Examples:
  drainit --ready-tcp 127.0.0.1:8080 -- python3 -m http.server 8080
  drainit --pre-drain-delay 10s --drain-timeout 30s --grace-period 45s -- node server.js
  drainit --rewrite TERM:QUIT -- nginx -g 'daemon off;'
  drainit --probe-addr off --teardown 'sh -c \"flush-logs\"' -- ./batch-job
  drainit --user app:app --ready-tcp 127.0.0.1:8080 -- ./server
  drainit --check-config --config /etc/drainit.toml -- true

Every flag is also read from DRAINIT_<FLAG> (e.g. DRAINIT_PRE_DRAIN_DELAY=3s);
repeatable flags take a comma-separated list there. PRE_DRAIN_DELAY_MS and
DRAIN_TIMEOUT_MS are accepted as plain milliseconds.

Exit codes: 0 drained, 2 work abandoned or left unkillable, teardown failed, or a
request lost (--proxy), N the child's own code (128+S for a signal), 126 cannot
execute, 127 not found, 64 usage, 78 configuration, 1 internal error.";

/// drainit's command line: one argument per setting of the table of settings (its flag,
/// value name, help and, for a scalar, the `DRAINIT_*` variable clap reads), then
/// the arguments that are no setting: `--config`, `--check-config`, `--probe`,
/// and the command. Values stay strings here; [`load_from`] validates them. The
/// man page and the shell completions are made from it (`cargo run -p xtask`).
pub fn command() -> Command {
    command_with(true)
}

/// [`command`], with the settings' help texts (`with_help`) or without them: a
/// command line that parses is parsed the same either way (a help text is no
/// part of parsing), and building the 26 texts (each with its default, a
/// string apiece) is work every start would do for a `--help` that rarely
/// comes. [`load_from`] parses with the lean one and turns to the whole one
/// for anything clap refuses or answers (`--help`, `--version`, an error).
fn command_with(with_help: bool) -> Command {
    // `--help` has always listed drainit's own flags before the log settings.
    let (app, log) = SETTINGS.split_at(SETTINGS.len() - 2);
    let arg = |s: &Setting| s.arg(with_help);
    debug_assert!(log.iter().all(|s| s.key.starts_with("log_")));
    Command::new("drainit")
        .version(env!("CARGO_PKG_VERSION"))
        .about(
            "A container init that drains: reaps, forwards signals, serves /healthz and /readyz, \
             and on SIGTERM fails readiness, waits a pre-drain delay, forwards, and enforces a drain timeout.",
        )
        .after_help(EXAMPLES)
        .override_usage("drainit [FLAGS] [--] CMD [ARGS...]")
        .args(app.iter().map(arg))
        .arg(
            Arg::new("config")
                .long("config")
                .env("DRAINIT_CONFIG")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .action(ArgAction::Set)
                .help("TOML configuration file (keys as the flags, snake_case)"),
        )
        .arg(
            Arg::new("check_config")
                .long("check-config")
                .action(ArgAction::SetTrue)
                .help("Print the resolved configuration and the grace budget, then exit (0, or 78)"),
        )
        .arg(
            Arg::new("probe")
                .long("probe")
                .value_name("readyz|healthz")
                .value_parser(clap::builder::ValueParser::string())
                .action(ArgAction::Set)
                .conflicts_with("check_config")
                .help(
                    "Health-check client: GET /readyz or /healthz on the probe address, exit 0 on 200, \
                     1 otherwise (3 s at most); starts nothing",
                ),
        )
        .args(log.iter().map(arg))
        .arg(
            Arg::new("command")
                .value_name("CMD")
                .value_parser(clap::value_parser!(OsString))
                .action(ArgAction::Append)
                .num_args(1..)
                .trailing_var_arg(true)
                .help("The command to run and its arguments"),
        )
}

/// The table of every flag with its variable, file key, default and meaning, in
/// Markdown, as `docs/configuration.md` carries it (`cargo run -p xtask --
/// reference` writes it there; a test fails while the file differs).
pub fn reference_table() -> String {
    settings::reference()
}

/// Where the probe server listens.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeAddr {
    Off,
    /// `given_by`: where the user gave it (`--probe-addr`, `DRAINIT_PROBE_ADDR`, or
    /// the file's `PATH:LINE:COLUMN`), for the message of a bind failure, which is
    /// then fatal (exit 78); `None` for the default address (a failure is a warning).
    Listen {
        addr: SocketAddr,
        given_by: Option<String>,
    },
}

/// Who receives forwarded signals (`--forward-to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardTo {
    Child,
    Group,
}

/// One teardown step.
#[derive(Clone, Debug, PartialEq)]
pub struct TeardownStep {
    pub name: String,
    pub argv: Vec<String>,
    pub timeout: Duration,
}

/// What a drain phase does (docs/drain-phases.md).
#[derive(Clone, Debug, PartialEq)]
pub enum PhaseAction {
    /// Runs this argv (no shell), in a process group of its own, with
    /// `DRAINIT_PHASE_BUDGET_MS` in its environment.
    Command(Vec<String>),
    /// POSTs (empty body) to this `http://` URL with a `Drainit-Phase-Budget-Ms`
    /// header; a status ≥ 400 or no answer is a failure.
    Post(String),
}

/// One drain phase (`[[drain.phase]]`, `--drain-phase NAME=CMD`).
#[derive(Clone, Debug, PartialEq)]
pub struct DrainPhase {
    pub name: String,
    pub action: PhaseAction,
    /// The longest it may take; `None`: everything left of the phase budget.
    pub max: Option<Duration>,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Whether the pre-drain delay applies at T0 (docs/processes-and-signals.md): the delay exists for
/// load balancers and endpoints that route by drainit's readiness; when nothing
/// does, waiting only slows `docker stop` and shell tests down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayRule {
    /// Given by flag, environment or file: applies (when readiness passed).
    Explicit,
    /// The default, in Kubernetes (`KUBERNETES_SERVICE_HOST` set): applies.
    Kubernetes,
    /// The default, outside Kubernetes: applies only when a client asked `/readyz`
    /// before T0; otherwise the delay is 0.
    WhenRouted,
    /// The default, outside Kubernetes, with nothing that could ask: the probe
    /// server off (`--probe-addr off`) and no `--proxy-health`. The delay is 0,
    /// and the grace budget counts 0.
    Unroutable,
}

/// The validated configuration: what the rest of drainit reads. A field named as
/// a setting (`drain_timeout`) is set by that setting's entry in the table of
/// `settings.rs` (which declares its flag, variable, file key, default and
/// validation); `checks` and `teardown` come from the `--ready-*` and
/// `--teardown` settings or the file's tables; `check_config`, `probe_client` and
/// `command` from the arguments that are no setting.
#[derive(Clone, Debug)]
pub struct Config {
    pub probe_addr: ProbeAddr,
    /// Beat 2, from T0: the delay when it applies (see `pre_drain_delay_rule`).
    pub pre_drain_delay: Duration,
    /// Whether `pre_drain_delay` applies at T0 or is 0.
    pub pre_drain_delay_rule: DelayRule,
    /// Beat 3.
    pub drain_timeout: Duration,
    /// The platform's grace period (for the budget only): given, or the
    /// platform's ([`Platform::grace_period`]).
    pub grace_period: Duration,
    /// `--grace-period` was given (else it is the platform's).
    pub grace_period_given: bool,
    /// `--drain-timeout` was given (else it is the default, maybe fitted).
    pub drain_timeout_given: bool,
    /// Where drainit runs (`--platform`, or detected).
    pub platform: Platform,
    /// Why: `detected: /.dockerenv exists`, or `as configured`.
    pub platform_why: String,
    /// `--platform` was given (not `auto` by default).
    pub platform_given: bool,
    /// The defaults not given (delay, phase budget, drain timeout) were shrunk to
    /// fit the detected platform's grace period.
    pub fitted: bool,
    /// The drain phases, in order (docs/drain-phases.md); empty: none.
    pub phases: Vec<DrainPhase>,
    /// The phases' shared budget: given, or the sum of their `max` when each has
    /// one, else 10 s (maybe fitted).
    pub phase_budget: Duration,
    pub phase_budget_given: bool,
    pub strict_budget: bool,
    /// Never empty.
    pub drain_signals: Vec<Signal>,
    pub second_signal: SecondSignal,
    pub forward_to: ForwardTo,
    pub rewrite: RewriteMap,
    pub checks: Vec<Check>,
    /// `--check-timeout`: the timeout of each check that sets none of its own.
    pub check_timeout: Duration,
    pub ready_notify: bool,
    pub ready_interval: Duration,
    pub teardown: Vec<TeardownStep>,
    /// `--teardown-timeout`: the timeout of each step that sets none of its own.
    pub teardown_timeout: Duration,
    pub report_file: Option<PathBuf>,
    /// `--proxy`: the admission proxy's addresses; `None`: no proxy.
    pub proxy: Option<ProxySpec>,
    /// Where `proxy` was given (`--proxy`, `DRAINIT_PROXY`, or the file's
    /// `PATH:LINE:COLUMN`), for the message of a bind failure (78).
    pub proxy_given_by: String,
    /// `--proxy-health`: the path drainit answers itself on the proxy port.
    pub proxy_health: Option<String>,
    /// `--stream-spread` as given; see [`Config::stream_spread`].
    pub stream_spread: Option<Duration>,
    /// `--proxy-threads` as given (`None`: `auto`); see [`Config::proxy_threads`].
    pub proxy_threads: Option<usize>,
    /// `--user`: whom the child runs as; `None`: as drainit.
    pub user: Option<crate::user::Identity>,
    pub check_config: bool,
    /// `--probe`: run as a health-check client for this path instead of as an init.
    pub probe_client: Option<ProbePath>,
    pub log_format: LogFormat,
    pub log_level: log::LevelFilter,
    /// argv of the child; empty only with `--check-config` or `--probe`.
    pub command: Vec<OsString>,
}

/// A configuration problem, with the exit code it maps to.
#[derive(Debug)]
pub struct ConfigError {
    pub code: i32,
    pub message: String,
}

impl ConfigError {
    fn usage(message: String) -> ConfigError {
        ConfigError {
            code: exit::USAGE,
            message,
        }
    }
    fn config(message: String) -> ConfigError {
        ConfigError {
            code: exit::CONFIG,
            message,
        }
    }
}

/// Where a value came from, for the error message.
#[derive(Clone, Debug)]
enum Origin<'a> {
    /// The flag, without its dashes (`pre-drain-delay`).
    Flag(String),
    /// The variable (`DRAINIT_PRE_DRAIN_DELAY`).
    Env(String),
    File {
        path: &'a str,
        text: &'a str,
        key: &'static str,
        span: std::ops::Range<usize>,
    },
    Default,
}

impl Origin<'_> {
    fn error(&self, msg: &str) -> ConfigError {
        match self {
            Origin::Flag(f) => ConfigError::usage(format!("invalid value for --{f}: {msg}")),
            Origin::Env(v) => {
                ConfigError::config(format!("invalid value in environment variable {v}: {msg}"))
            }
            Origin::File {
                path,
                text,
                key,
                span,
            } => {
                let (line, col) = line_col(text, span.start);
                ConfigError::config(format!(
                    "{path}:{line}:{col}: invalid value for key `{key}`: {msg}"
                ))
            }
            Origin::Default => ConfigError {
                code: exit::INTERNAL,
                message: format!("built-in default is invalid: {msg}"),
            },
        }
    }

    /// The flag (`--probe-addr`), the variable (`DRAINIT_PROBE_ADDR`) or the file's
    /// `PATH:LINE:COLUMN` the value came from, for a message about it after
    /// validation; `None` for the default.
    fn given_by(&self) -> Option<String> {
        match self {
            Origin::Flag(f) => Some(format!("--{f}")),
            Origin::Env(v) => Some(v.clone()),
            Origin::File {
                path, text, span, ..
            } => {
                let (line, col) = line_col(text, span.start);
                Some(format!("{path}:{line}:{col}"))
            }
            Origin::Default => None,
        }
    }

    /// [`Origin::error`], but 78 wherever the value came from: for a value that is
    /// well formed but refused by a fact of the system (a missing directory, a
    /// user the image does not know).
    fn config_error(&self, msg: &str) -> ConfigError {
        ConfigError {
            code: exit::CONFIG,
            message: self.error(msg).message,
        }
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The longest duration any setting accepts: 7 days. Far beyond any grace period a
/// platform grants, and small enough that sums and `Instant` arithmetic never
/// overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Parses a duration as written on the command line: `500ms`, `5s`, `1m`, `1m30s`,
/// or `0`. Uses humantime's grammar.
///
/// # Errors
/// A message quoting the value when it is no duration or longer than
/// [`MAX_DURATION`] (7 days).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let d = humantime::parse_duration(t)
        .map_err(|e| format!("'{s}' is not a duration like 500ms, 5s or 1m ({e})"))?;
    at_most_max(d).map_err(|max| format!("'{s}' is too long: at most {max}"))
}

/// A check's or teardown step's timeout: a duration ([`parse_duration`]) greater
/// than 0. A zero timeout can only fail: every teardown step would be "timed out
/// after 0s" at exit (2), and a check would pass or fail by a race with the
/// timer; refused at start like a zero `--ready-interval`.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("'{s}' is no timeout: it must be greater than 0")),
        d => Ok(d),
    }
}

/// `d` when it is at most [`MAX_DURATION`], else the maximum as text (`7d`).
fn at_most_max(d: Duration) -> Result<Duration, &'static str> {
    if d <= MAX_DURATION { Ok(d) } else { Err("7d") }
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(format!("'{s}' is not a boolean (true or false)")),
    }
}

/// The probe a `--probe` client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbePath {
    Readyz,
    Healthz,
}

impl ProbePath {
    /// The request path: `/readyz` or `/healthz`.
    pub fn as_path(self) -> &'static str {
        match self {
            ProbePath::Readyz => "/readyz",
            ProbePath::Healthz => "/healthz",
        }
    }
}

fn parse_probe_path(s: &str) -> Result<ProbePath, String> {
    match s.trim().trim_start_matches('/') {
        "readyz" => Ok(ProbePath::Readyz),
        "healthz" => Ok(ProbePath::Healthz),
        _ => Err(format!("'{s}' is not a probe: readyz or healthz")),
    }
}

/// `--probe-addr`: `off`, or `IP:PORT` with a port of 1-65535. Port 0 is refused
/// as `--proxy` and `--ready-tcp` refuse it: the kernel would pick a port nobody
/// is told, so neither the platform's probes nor `drainit --probe` could ask it.
fn parse_probe_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let addr = s.trim().parse::<SocketAddr>().map_err(|_| {
        format!("'{s}' is not an address like 0.0.0.0:8079, 127.0.0.1:9000 or [::]:8079 (or 'off')")
    })?;
    if addr.port() == 0 {
        return Err(format!("'{s}' has no valid port (1-65535)"));
    }
    Ok(Some(addr))
}

impl Config {
    /// Over how long the proxy closes open streams at beat 3 (docs/proxy.md, Streams):
    /// `--stream-spread`, by default half the drain timeout; never longer than
    /// the drain timeout (a stream closed after the deadline would be abandoned).
    pub fn stream_spread(&self) -> Duration {
        self.stream_spread
            .unwrap_or(self.drain_timeout / 2)
            .min(self.drain_timeout)
    }
}

/// The most threads `--proxy-threads auto` gives the proxy: it serves one app,
/// and each thread costs memory; a larger number can be given.
pub const PROXY_THREADS_AUTO_MAX: usize = 4;

/// `--proxy-threads auto` for `cpus` CPUs this process may run on: half of
/// them (the app the proxy serves needs the rest), at least 1, at most
/// [`PROXY_THREADS_AUTO_MAX`]. On 2 CPUs, 1: on this project's 2-core machine a
/// second thread cost CPU and throughput and did not lower the added latency
/// (bench/README.md).
pub fn proxy_threads_auto(cpus: usize) -> usize {
    (cpus / 2).clamp(1, PROXY_THREADS_AUTO_MAX)
}

/// The most threads `--proxy-threads` takes.
pub const PROXY_THREADS_MAX: usize = 64;

impl Config {
    /// How many threads serve the admission proxy: `--proxy-threads`, or by
    /// default (`auto`) [`proxy_threads_auto`] of the CPUs this process may run
    /// on ([`std::thread::available_parallelism`]: the affinity mask and a
    /// cgroup CPU quota; 1 when that cannot be read). HAProxy's `nbthread` and
    /// nginx's `worker_processes` are the same knob.
    pub fn proxy_threads(&self) -> usize {
        self.proxy_threads.unwrap_or_else(|| {
            proxy_threads_auto(std::thread::available_parallelism().map_or(1, usize::from))
        })
    }
}

fn parse_proxy_threads(s: &str) -> Result<Option<usize>, String> {
    let t = s.trim();
    if t == "auto" {
        return Ok(None);
    }
    match t.parse::<usize>() {
        Ok(n) if (1..=PROXY_THREADS_MAX).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "'{s}' is not a number of threads from 1 to {PROXY_THREADS_MAX}, or 'auto'"
        )),
    }
}

fn parse_proxy(s: &str) -> Result<ProxySpec, String> {
    let (listen, upstream) = s
        .trim()
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not LISTEN=UPSTREAM, e.g. 0.0.0.0:8080=127.0.0.1:8081"))?;
    let addr = |part: &str, what: &str| -> Result<SocketAddr, String> {
        let part = part.trim();
        let parsed = match part.strip_prefix("localhost:") {
            Some(port) => port
                .parse::<u16>()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                .ok(),
            None => part.parse::<SocketAddr>().ok(),
        };
        match parsed {
            Some(a) if a.port() != 0 => Ok(a),
            _ => Err(format!(
                "'{s}': the {what} '{part}' is not IP:PORT (e.g. 127.0.0.1:8081, [::1]:8081, localhost:8081)"
            )),
        }
    };
    let spec = ProxySpec {
        listen: addr(listen, "listen address")?,
        upstream: addr(upstream, "upstream")?,
    };
    if is_own_upstream(spec) {
        return Err(format!(
            "'{s}': the proxy cannot listen on its own upstream"
        ));
    }
    Ok(spec)
}

/// The upstream is the proxy's own listener: a connect to the upstream reaches
/// the listen socket. A connect to a wildcard (`0.0.0.0`, `[::]`) goes to the
/// loopback address of its family (`127.0.0.1`, `[::1]`); it reaches a listener
/// on that very address, an IPv4 wildcard listener when it is IPv4 loopback, and
/// an `[::]` listener (dual-stack: IPv4 too) when it is either loopback. The
/// other family's loopback (`0.0.0.0:8080=[::1]:8080`) is another socket, a
/// real upstream. Every request to its own listener would come back to
/// drainit, hop after hop, until its `X-Forwarded-For` grew past the header
/// limit.
fn is_own_upstream(spec: ProxySpec) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    if spec.listen.port() != spec.upstream.port() {
        return false;
    }
    let listen = spec.listen.ip().to_canonical();
    let target = match spec.upstream.ip().to_canonical() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        a => a,
    };
    listen == target
        || match listen {
            IpAddr::V4(l) => l.is_unspecified() && target.is_ipv4() && target.is_loopback(),
            IpAddr::V6(l) => l.is_unspecified() && target.is_loopback(),
        }
}

fn parse_proxy_health(s: &str) -> Result<String, String> {
    let t = s.trim();
    if !t.starts_with('/') || t.contains('?') || t.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "'{s}' is not a path like /health (no query, no spaces)"
        ));
    }
    Ok(t.to_string())
}

fn parse_tcp_target(s: &str) -> Result<String, String> {
    let t = s.trim();
    let (host, port) = t
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' is not host:port"))?;
    if host.is_empty() {
        return Err(format!("'{s}' has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("'{s}' has no valid port (1-65535)")),
    }
    if crate::checks::target_addrs(t).is_none() {
        return Err(format!("'{s}': {NAMED_HOST}"));
    }
    Ok(t.to_string())
}

/// Why a check target with a host name is refused (see `checks::target_addrs`).
const NAMED_HOST: &str = "the host must be an IP address or localhost \
     (checks probe the app in drainit's own network namespace; names are not resolved)";

fn parse_http_target(s: &str) -> Result<String, String> {
    let t = s.trim();
    let rest = t
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{}' is not an http:// URL", redact_url(s)))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    if hostport.is_empty() {
        return Err(format!("'{}' has no host", redact_url(s)));
    }
    if let Some((_, port)) = hostport.rsplit_once(':')
        && !port.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err(format!("'{}' has no valid port", redact_url(s)));
    }
    // The whole URL must parse (no spaces, a real host, one port): found now, not
    // as a check that can never pass.
    let uri = match t.parse::<hyper::Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => u,
        _ => return Err(format!("'{}' is not a valid URL", redact_url(s))),
    };
    let host = uri.host().unwrap_or_default();
    let port = uri.port_u16().unwrap_or(80);
    if crate::checks::target_addrs(&format!("{host}:{port}")).is_none() {
        return Err(format!("'{}': {NAMED_HOST}", redact_url(s)));
    }
    Ok(t.to_string())
}

/// A URL for messages and `--check-config`: any `user:password@` becomes `***@`
/// and any query (with the fragment after it) becomes `?***`, since both carry
/// credentials (`?token=…`). The check itself uses the real URL.
pub fn redact_url(s: &str) -> String {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, s),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, _)) => format!("{path}?***"),
        None => tail.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    }
}

fn parse_words(s: &str) -> Result<Vec<String>, String> {
    let words =
        shell_words::split(s).map_err(|e| format!("'{s}' is not valid shell words ({e})"))?;
    if words.is_empty() {
        return Err("the command is empty".into());
    }
    Ok(words)
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.trim().is_empty() {
        return Err("the path is empty".into());
    }
    no_nul(s)?;
    Ok(PathBuf::from(s))
}

/// A path or argument with a NUL byte cannot be passed to the kernel: only the
/// config file can hold one (`"\u0000"`), and it is refused at start, not when
/// the report is written or the step runs.
fn no_nul(s: &str) -> Result<(), String> {
    if s.contains('\0') {
        return Err(format!("'{}' contains a NUL byte", s.escape_debug()));
    }
    Ok(())
}

/// [`no_nul`] for every word of an argv.
fn argv_no_nul(argv: &[String]) -> Result<(), String> {
    argv.iter().try_for_each(|w| no_nul(w))
}

/// The longest file name (one path component) Linux file systems take, in bytes.
pub const NAME_MAX: usize = 255;

/// The longest path the kernel takes, in bytes (`PATH_MAX` less its NUL).
const PATH_MAX: usize = 4095;

/// `None` for an empty value (no report file), else the path, once it is known to
/// name a file the kernel can open (its last component a name, not `.`, `..` or
/// empty after a trailing `/`, of at most [`NAME_MAX`] bytes, the whole at most
/// [`PATH_MAX`]) and its directory is known to exist and be writable (or the file
/// itself writable: a bind-mounted `/dev/termination-log` in a read-only `/dev`).
/// What the kernel would refuse at exit is refused now, when the report is not
/// yet lost.
fn check_report_file(s: &str) -> Result<Option<PathBuf>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    no_nul(s)?;
    let last = s.rsplit('/').next().unwrap_or(s);
    if last.is_empty() || last == "." || last == ".." {
        return Err(format!("'{s}' names a directory, not a file"));
    }
    if last.len() > NAME_MAX {
        return Err(format!(
            "'{s}': the file name is longer than {NAME_MAX} bytes"
        ));
    }
    let absolute = std::env::current_dir()
        .map(|d| d.join(s))
        .unwrap_or_else(|_| PathBuf::from(s));
    if absolute.as_os_str().len() > PATH_MAX {
        return Err(format!("'{s}': the path is longer than {PATH_MAX} bytes"));
    }
    let path = PathBuf::from(s);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("'{s}': {} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "'{s}': the directory {} does not exist",
                dir.display()
            ));
        }
        Err(e) => return Err(format!("'{s}': {}: {}", dir.display(), io_word_or_text(&e))),
    }
    if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
        return Err(format!("'{s}' is a directory"));
    }
    let writable =
        |p: &std::path::Path| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
    let file_writable = std::fs::metadata(&path).is_ok() && writable(&path);
    if !file_writable && !writable(dir) {
        return Err(format!(
            "'{s}': the directory {} is not writable",
            dir.display()
        ));
    }
    Ok(Some(path))
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.trim()
        .parse::<log::LevelFilter>()
        .map_err(|_| format!("'{s}' is not a log level (error, warn, info, debug, trace, off)"))
}

fn parse_second(s: &str) -> Result<SecondSignal, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "skip" => Ok(SecondSignal::Skip),
        "ignore" => Ok(SecondSignal::Ignore),
        _ => Err(format!("'{s}' is not skip or ignore")),
    }
}

fn parse_forward(s: &str) -> Result<ForwardTo, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "child" => Ok(ForwardTo::Child),
        "group" => Ok(ForwardTo::Group),
        _ => Err(format!("'{s}' is not child or group")),
    }
}

fn parse_format(s: &str) -> Result<LogFormat, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("'{s}' is not text or json")),
    }
}

/// Environment lookup, injectable for tests.
pub trait Env {
    /// The value of `key`, `None` when unset (or not UTF-8: [`load_from`] refuses
    /// a non-UTF-8 value of every variable it reads, through [`Env::get_os`],
    /// before it reads any).
    fn get(&self, key: &str) -> Option<String>;
    /// The raw value of `key`, `None` when unset.
    fn get_os(&self, key: &str) -> Option<OsString> {
        self.get(key).map(OsString::from)
    }
    /// Whether some variable's value may not be UTF-8 (`true` when unknown): when
    /// `false`, [`load_from`] skips its per-variable check.
    fn may_have_non_utf8(&self) -> bool {
        true
    }
    /// Whether the platform marker file at `path` exists (`/.dockerenv`); `false`
    /// unless the environment is the process's.
    fn marker(&self, _path: &str) -> bool {
        false
    }
}

/// The process environment, read once ([`ProcessEnv::read`]): a lookup is a scan
/// of this copy, not a `getenv` (which compares the name against every variable
/// with `strncmp`, about 1,300 instructions each in a 35-variable environment;
/// start-up reads some forty names). The same copy becomes the child's
/// environment ([`ProcessEnv::into_vars`]): drainit never changes its own.
pub struct ProcessEnv {
    vars: Vec<(OsString, OsString)>,
}

impl ProcessEnv {
    /// Every variable of the process environment, in `environ`'s order.
    pub fn read() -> ProcessEnv {
        ProcessEnv {
            vars: std::env::vars_os().collect(),
        }
    }

    /// The variables, `(name, value)` in `environ`'s order.
    pub fn into_vars(self) -> Vec<(OsString, OsString)> {
        self.vars
    }
}

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        self.get_os(key)?.into_string().ok()
    }
    fn marker(&self, path: &str) -> bool {
        std::path::Path::new(path).exists()
    }
    /// The first variable named `key`, as `getenv` finds it.
    fn get_os(&self, key: &str) -> Option<OsString> {
        self.vars
            .iter()
            .find(|(k, _)| k.as_encoded_bytes() == key.as_bytes())
            .map(|(_, v)| v.clone())
    }
    /// One pass over the values (almost always all UTF-8).
    fn may_have_non_utf8(&self) -> bool {
        self.vars.iter().any(|(_, v)| v.to_str().is_none())
    }
}

/// Every environment variable drainit reads as text: `DRAINIT_<FLAG>` of every
/// setting (those clap reads, and the lists drainit splits itself), and the
/// plain-millisecond ones. `DRAINIT_CONFIG`, no setting, is a path and may be any
/// bytes: a file name need not be UTF-8 (as `--config`).
fn env_vars() -> impl Iterator<Item = String> {
    let millis = SETTINGS
        .iter()
        .filter_map(|s| s.millis_env.map(String::from));
    SETTINGS.iter().map(|s| env_name(s.key)).chain(millis)
}

/// A variable drainit reads whose value is not UTF-8 is a configuration error
/// (78) naming it, whatever else is given: taken as unset, a typo'd or corrupted
/// value would silently become the default (README, Exit codes).
fn check_env_utf8(env: &dyn Env) -> Result<(), ConfigError> {
    if !env.may_have_non_utf8() {
        return Ok(());
    }
    for var in env_vars() {
        if env.get_os(&var).is_some_and(|v| v.to_str().is_none()) {
            return Err(ConfigError::config(format!(
                "invalid value in environment variable {var}: not valid UTF-8"
            )));
        }
    }
    Ok(())
}

/// Parses the process's command line and environment and the config file.
///
/// # Errors
/// `--help` / `--version` come back as code 0 with the text to print on stdout;
/// everything else as 64 (command line) or 78 (environment, file) with a message
/// naming the flag, variable or key.
pub fn load_from(args: Vec<OsString>, env: &dyn Env) -> Result<Config, ConfigError> {
    // Built once: the command is the largest piece of work at start-up, so it
    // is built without the settings' help texts; what clap refuses or answers
    // (`--help`, `--version`, an error) is asked again of the whole command,
    // whose answer the user sees.
    let cmd = command_with(false);
    check_env_utf8(env)?;
    let m = match cmd.try_get_matches_from(&args) {
        Ok(m) => m,
        Err(_) => match command().try_get_matches_from(&args) {
            Ok(m) => m,
            Err(e) => return Err(clap_error(e, &args)),
        },
    };
    resolve(Direct::from_matches(&m), &m, env)
}

/// The arguments that are no setting, as clap parsed them; every setting
/// [`resolve`] reads from the matches through the resolver (flag, variable, file,
/// default). Read one by one, not into a struct of every flag (a derived
/// `from_arg_matches` copied the whole matches and every value to fill fields
/// nothing read: about 20,000 instructions and 40 allocations at start-up).
struct Direct {
    config: Option<PathBuf>,
    check_config: bool,
    probe: Option<String>,
    command: Vec<OsString>,
}

impl Direct {
    fn from_matches(m: &ArgMatches) -> Direct {
        Direct {
            config: m.get_one::<PathBuf>("config").cloned(),
            check_config: m.get_flag("check_config"),
            probe: m.get_one::<String>("probe").cloned(),
            command: m
                .get_many::<OsString>("command")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// The [`ConfigError`] for an error of clap's: `--help` / `--version` as code 0 with
/// the text for stdout; a value clap read from `DRAINIT_*` and refused (an empty
/// `DRAINIT_CONFIG`: clap reads the scalar flags' variables itself) as 78 naming
/// the variable, like every other environment error (README, Exit codes); anything else as
/// 64, never clap's own 2, which would read as "abandoned".
fn clap_error(e: clap::Error, args: &[OsString]) -> ConfigError {
    use clap::error::{ContextKind, ErrorKind};
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return ConfigError {
            code: exit::CLEAN,
            message: e.render().to_string(),
        };
    }
    // The argument the error names (`--config <PATH>`), and its variable.
    let var = e.get(ContextKind::InvalidArg).and_then(|arg| {
        let long = arg.to_string();
        let long = long
            .strip_prefix("--")?
            .split([' ', '='])
            .next()?
            .to_string();
        let cmd = command();
        let var = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(&long))?
            .get_env()?;
        Some(var.to_string_lossy().into_owned())
    });
    // From the environment when the same command line without any variable parses.
    let from_env = var.filter(|_| {
        command()
            .mut_args(|a| a.env(None::<&str>))
            .try_get_matches_from(args)
            .is_ok()
    });
    match from_env {
        Some(var) => {
            // clap reads the process environment itself, not `Env`.
            let why = match std::env::var_os(&var) {
                Some(v) if v.is_empty() => "the value is empty".to_string(),
                _ => e.kind().as_str().unwrap_or("refused").to_lowercase(),
            };
            ConfigError::config(format!(
                "invalid value in environment variable {var}: {why}"
            ))
        }
        None => ConfigError::usage(e.render().to_string()),
    }
}

/// The largest config file drainit reads: a real one is a few hundred bytes.
pub const MAX_CONFIG_FILE: u64 = 1024 * 1024;

/// The text of the config file: a regular file of at most [`MAX_CONFIG_FILE`]
/// bytes, UTF-8. Opened non-blocking, so a FIFO (or a device) is refused at once
/// instead of blocking start-up with every signal blocked; read with a bound, so
/// `/dev/zero` or a file that grows cannot grow drainit.
fn read_text(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| io_word_or_text(&e))?;
    let meta = file.metadata().map_err(|e| io_word_or_text(&e))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_word_or_text(&e))?;
    if bytes.len() as u64 > MAX_CONFIG_FILE {
        return Err(format!("larger than {} KiB", MAX_CONFIG_FILE / 1024));
    }
    String::from_utf8(bytes).map_err(|_| "not valid UTF-8".into())
}

fn read_file(path: &std::path::Path) -> Result<(FileConfig, String), ConfigError> {
    let shown = path.display();
    let text = read_text(path)
        .map_err(|e| ConfigError::config(format!("reading config file {shown} failed: {e}")))?;
    let file: FileConfig = toml::from_str(&text).map_err(|e| {
        let msg = e.message().trim_end();
        let Some(span) = e.span() else {
            return ConfigError::config(format!("{shown}: {msg}"));
        };
        let (l, c) = line_col(&text, span.start);
        // A bad value (`pre_drain_delay = 5`): name its key, as every other file
        // error does.
        match key_of_value_at(&text, span.start) {
            Some(key) => ConfigError::config(format!(
                "{shown}:{l}:{c}: invalid value for key `{key}`: {msg}"
            )),
            None => ConfigError::config(format!("{shown}:{l}:{c}: {msg}")),
        }
    })?;
    Ok((file, text))
}

/// The key whose value starts at byte `at`: the bare key before `=` on that line
/// (`pre_drain_delay = 5` → `pre_drain_delay`), or `None` when `at` is not after a
/// `key =` on its line.
fn key_of_value_at(text: &str, at: usize) -> Option<&str> {
    let line_start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let before = &text[line_start..at.min(text.len())];
    let (key, value_so_far) = before.split_once('=')?;
    let key = key.trim();
    // Inside an inline table or array (`check = [{ tcp = … }]`) the error is about
    // something deeper than the line's first key: then no key is named.
    let nested = value_so_far.contains(['[', '{']);
    (!nested
        && !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(key)
}

fn resolve(cli: Direct, m: &ArgMatches, env: &dyn Env) -> Result<Config, ConfigError> {
    let (file, text, path) = match &cli.config {
        Some(p) => {
            let (f, t) = read_file(p)?;
            (f, t, p.display().to_string())
        }
        None => (FileConfig::default(), String::new(), String::new()),
    };
    let r = Resolver {
        m,
        env,
        file,
        path,
        text,
    };
    let mut draft = Draft {
        config: Config::unset(cli.check_config, cli.command),
        flag_checks: None,
        flag_teardown: None,
        flag_phases: None,
    };
    for s in &SETTINGS {
        (s.set)(&mut draft, &r.given(s)?)?;
    }
    let mut config = checks_and_teardown(&r, draft)?;
    if let Some(v) = &cli.probe {
        let path = parse_probe_path(v).map_err(|e| Origin::Flag("probe".into()).error(&e))?;
        config.probe_client = Some(path);
    }
    if config.probe_client.is_some() && !config.command.is_empty() {
        return Err(ConfigError::usage(
            "--probe checks a running drainit and starts nothing: give no command".into(),
        ));
    }
    if config.command.is_empty() && !config.check_config && config.probe_client.is_none() {
        return Err(ConfigError::usage(
            "no command given\n\nUsage: drainit [FLAGS] [--] CMD [ARGS...]\n\nFor more information, try '--help'.".into(),
        ));
    }
    if config.proxy_health.is_some() && config.proxy.is_none() {
        return Err(ConfigError::usage(
            "--proxy-health answers on the proxy port: it needs --proxy".into(),
        ));
    }
    if config.proxy_threads.is_some() && config.proxy.is_none() {
        return Err(ConfigError::usage(
            "--proxy-threads sets the proxy's threads: it needs --proxy".into(),
        ));
    }
    if config.pre_drain_delay_rule == DelayRule::WhenRouted
        && config.probe_addr == ProbeAddr::Off
        && config.proxy_health.is_none()
    {
        config.pre_drain_delay_rule = DelayRule::Unroutable;
        config.pre_drain_delay = Duration::ZERO;
    }
    fit_to_platform(&mut config);
    if config.strict_budget && !config.budget().fits() {
        return Err(ConfigError::config(format!(
            "the grace budget does not fit (--strict-budget): {}",
            config.budget()
        )));
    }
    Ok(config)
}

/// A drain signal: one drainit catches, and not SIGCHLD (its own).
fn parse_drain_signal(v: &str) -> Result<Signal, String> {
    let sig = Signal::parse(v, false)?;
    if sig.is_caught() && sig != Signal::CHLD {
        Ok(sig)
    } else {
        Err(format!(
            "{sig} cannot be a drain signal (it is never caught)"
        ))
    }
}

/// `--rewrite` pairs: FROM must be a signal drainit receives and forwards, and one
/// FROM has one TO (the same pair twice is one).
fn rewrite_map(g: &Given<'_>) -> Result<RewriteMap, ConfigError> {
    let mut rewrite = RewriteMap::default();
    let mut rewritten: Vec<(Signal, Signal, &str)> = Vec::new();
    for (pair, origin) in &g.items {
        let (from, to) = RewriteMap::parse_pair(pair).map_err(|e| origin.error(&e))?;
        // Rewriting applies to what drainit receives and forwards: KILL, STOP and
        // the never-caught signals never reach it, and SIGCHLD is its own.
        if !from.is_caught() {
            return Err(origin.error(&format!(
                "'{pair}': drainit never receives {from}, so it cannot be rewritten"
            )));
        }
        if from == Signal::CHLD {
            return Err(origin.error(&format!(
                "'{pair}': drainit never forwards {from}, so it cannot be rewritten"
            )));
        }
        if let Some((_, other_to, other)) = rewritten.iter().find(|(f, _, _)| *f == from) {
            if *other_to == to {
                continue;
            }
            return Err(origin.error(&format!(
                "'{other}' and '{pair}' both rewrite {from}; give one"
            )));
        }
        rewritten.push((from, to, pair.trim()));
        rewrite.insert(from, to);
    }
    Ok(rewrite)
}

/// The configuration once every setting is set: the readiness checks given by
/// `--ready-*` flags or variables (each with `--check-timeout`), else the file's
/// `[[check]]` tables, with unique names; and the steps of `--teardown` (each with
/// `--teardown-timeout`), else the file's `[[teardown]]` tables, in order.
fn checks_and_teardown(r: &Resolver<'_>, draft: Draft) -> Result<Config, ConfigError> {
    let Draft {
        mut config,
        flag_checks,
        flag_teardown,
        flag_phases,
    } = draft;
    config.checks = match flag_checks {
        Some(named) => named
            .into_iter()
            .map(|(name, kind)| Check {
                name,
                kind,
                timeout: config.check_timeout,
            })
            .collect(),
        None => (r.file.check.iter().enumerate())
            .map(|(i, c)| file_check(r, i, c, config.check_timeout))
            .collect::<Result<_, _>>()?,
    };
    let mut seen = std::collections::HashSet::new();
    if let Some(c) = config.checks.iter().find(|c| !seen.insert(&c.name)) {
        return Err(ConfigError::config(format!(
            "two readiness checks are named '{}'",
            c.name
        )));
    }
    config.teardown = match flag_teardown {
        Some(argvs) => argvs
            .into_iter()
            .map(|argv| TeardownStep {
                name: step_name(&argv),
                argv,
                timeout: config.teardown_timeout,
            })
            .collect(),
        None => file_teardown(r, config.teardown_timeout)?,
    };
    config.phases = match flag_phases {
        Some(phases) => phases,
        None => file_phases(r)?,
    };
    let mut seen = std::collections::HashSet::new();
    if let Some(p) = config.phases.iter().find(|p| !seen.insert(&p.name)) {
        return Err(ConfigError::config(format!(
            "two drain phases are named '{}'",
            p.name
        )));
    }
    if !config.phase_budget_given {
        config.phase_budget = match config
            .phases
            .iter()
            .map(|p| p.max)
            .sum::<Option<Duration>>()
        {
            Some(sum) if !config.phases.is_empty() => sum,
            _ => DEFAULT_PHASE_BUDGET,
        };
    }
    Ok(config)
}

/// The phase budget when neither `--phase-budget` nor every phase's `max` gives one.
pub const DEFAULT_PHASE_BUDGET: Duration = Duration::from_secs(10);

/// `--drain-phase NAME=CMD`.
fn parse_flag_phase(v: &str) -> Result<DrainPhase, String> {
    let Some((name, cmd)) = v.split_once('=') else {
        return Err(format!("'{v}' is not NAME=CMD"));
    };
    let name = name.trim();
    check_entry_name(name)?;
    let argv = parse_words(cmd)?;
    argv_no_nul(&argv)?;
    Ok(DrainPhase {
        name: name.to_string(),
        action: PhaseAction::Command(argv),
        max: None,
    })
}

/// A `post` URL: `http://HOST:PORT/PATH` (drainit speaks plain HTTP to the app).
fn parse_post_url(v: &str) -> Result<String, String> {
    let uri: hyper::Uri = v.parse().map_err(|e| format!("'{v}' is not a URL ({e})"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("'{v}' is not an http:// URL with a host"));
    }
    Ok(v.to_string())
}

/// The file's `[[drain.phase]]` tables, in order.
fn file_phases(r: &Resolver<'_>) -> Result<Vec<DrainPhase>, ConfigError> {
    let mut phases = Vec::new();
    for (i, p) in r.file.phases().iter().enumerate() {
        let at =
            |msg: String| r.entry_error(p.span(), &format!("[[drain.phase]] #{}: {msg}", i + 1));
        let p = p.get_ref();
        check_entry_name(&p.name).map_err(at)?;
        let action = match (&p.command, &p.post) {
            (Some(argv), None) => {
                if argv.is_empty() {
                    return Err(at("command is empty".into()));
                }
                argv_no_nul(argv).map_err(|e| at(format!("command: {e}")))?;
                PhaseAction::Command(argv.clone())
            }
            (None, Some(url)) => PhaseAction::Post(
                parse_post_url(url.get_ref()).map_err(|e| r.at("post", url.span()).error(&e))?,
            ),
            _ => return Err(at("give one of command or post".into())),
        };
        let max = match &p.max {
            Some(d) => {
                Some(parse_timeout(d.get_ref()).map_err(|e| r.at("max", d.span()).error(&e))?)
            }
            None => None,
        };
        phases.push(DrainPhase {
            name: p.name.clone(),
            action,
            max,
        });
    }
    Ok(phases)
}

/// On a detected (or named) platform whose grace period was not overridden: the
/// pre-drain delay, phase budget and drain timeout that were not given shrink, in
/// proportion, to fit what the given ones leave of the grace period (less the
/// spare). Outside any known platform nothing changes: the budget is checked (and
/// warned about) as before.
fn fit_to_platform(c: &mut Config) {
    if c.grace_period_given || c.platform == Platform::Unknown {
        return;
    }
    let delay_default = matches!(
        c.pre_drain_delay_rule,
        DelayRule::Kubernetes | DelayRule::WhenRouted
    );
    let budget_default = !c.phases.is_empty() && !c.phase_budget_given;
    let b = c.budget();
    let mut given = b.total();
    let mut wanted = Vec::new();
    if delay_default {
        given -= c.pre_drain_delay;
        wanted.push(c.pre_drain_delay);
    }
    if budget_default {
        given -= c.phase_budget;
        wanted.push(c.phase_budget);
    }
    if !c.drain_timeout_given {
        given -= c.drain_timeout;
        wanted.push(c.drain_timeout);
    }
    let room = c
        .grace_period
        .saturating_sub(BUDGET_SPARE)
        .saturating_sub(given);
    let fitted = platform::fit(&wanted, room);
    if fitted == wanted {
        return;
    }
    c.fitted = true;
    let mut fitted = fitted.into_iter();
    if delay_default {
        c.pre_drain_delay = fitted.next().expect("one per wanted");
    }
    if budget_default {
        c.phase_budget = fitted.next().expect("one per wanted");
    }
    if !c.drain_timeout_given {
        c.drain_timeout = fitted.next().expect("one per wanted");
    }
}

/// A `[[check]]` or `[[teardown]]` name: not empty, and no control character
/// (it goes into log lines, the report and `/metrics` labels, where a `\r` or a
/// newline would split or garble a line).
fn check_entry_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name is empty".into());
    }
    if name.chars().any(char::is_control) {
        return Err(format!("name {name:?} has a control character"));
    }
    Ok(())
}

/// The `i`-th `[[check]]` table: exactly one of tcp, http, exec, file.
fn file_check(
    r: &Resolver<'_>,
    i: usize,
    c: &toml::Spanned<FileCheck>,
    check_timeout: Duration,
) -> Result<Check, ConfigError> {
    let at = |msg: String| r.entry_error(c.span(), &format!("[[check]] #{}: {msg}", i + 1));
    let c = c.get_ref();
    let mut kinds: Vec<CheckKind> = Vec::new();
    if let Some(v) = &c.tcp {
        let t = parse_tcp_target(v.get_ref()).map_err(|e| r.at("tcp", v.span()).error(&e))?;
        kinds.push(CheckKind::Tcp(t));
    }
    if let Some(v) = &c.http {
        let u = parse_http_target(v.get_ref()).map_err(|e| r.at("http", v.span()).error(&e))?;
        kinds.push(CheckKind::Http(u));
    }
    if let Some(v) = &c.exec {
        if v.is_empty() {
            return Err(at("exec is an empty command".into()));
        }
        argv_no_nul(v).map_err(|e| at(format!("exec: {e}")))?;
        kinds.push(CheckKind::Exec(v.clone()));
    }
    if let Some(v) = &c.file {
        let p = parse_path(v.get_ref()).map_err(|e| r.at("file", v.span()).error(&e))?;
        kinds.push(CheckKind::File(p));
    }
    if kinds.len() != 1 {
        return Err(at("needs exactly one of tcp, http, exec, file".into()));
    }
    if let Some(name) = &c.name {
        check_entry_name(name).map_err(at)?;
    }
    let timeout = match &c.timeout {
        Some(t) => parse_timeout(t.get_ref()).map_err(|e| r.at("timeout", t.span()).error(&e))?,
        None => check_timeout,
    };
    Ok(Check {
        name: c.name.clone().unwrap_or_else(|| format!("check-{}", i + 1)),
        kind: kinds.pop().expect("exactly one kind, checked above"),
        timeout,
    })
}

/// The file's `[[teardown]]` tables, in order.
fn file_teardown(
    r: &Resolver<'_>,
    teardown_timeout: Duration,
) -> Result<Vec<TeardownStep>, ConfigError> {
    let mut steps = Vec::new();
    for (i, t) in r.file.teardown.iter().enumerate() {
        let at = |msg: String| r.entry_error(t.span(), &format!("[[teardown]] #{}: {msg}", i + 1));
        let t = t.get_ref();
        if t.command.is_empty() {
            return Err(at("command is empty".into()));
        }
        argv_no_nul(&t.command).map_err(|e| at(format!("command: {e}")))?;
        if let Some(name) = &t.name {
            check_entry_name(name).map_err(at)?;
        }
        let timeout = match &t.timeout {
            Some(d) => {
                parse_timeout(d.get_ref()).map_err(|e| r.at("timeout", d.span()).error(&e))?
            }
            None => teardown_timeout,
        };
        steps.push(TeardownStep {
            name: t.name.clone().unwrap_or_else(|| step_name(&t.command)),
            argv: t.command.clone(),
            timeout,
        });
    }
    Ok(steps)
}

/// `--user` against the image's `/etc` (see [`crate::user`]). A malformed value is
/// a usage error from the command line; a name the image does not know, or a
/// drainit that is not root, is a fact of the system: 78 wherever it came from.
fn resolve_user(v: &str, origin: &Origin<'_>) -> Result<crate::user::Identity, ConfigError> {
    use crate::user::{UserError, resolve};
    let id = resolve(
        v.trim(),
        std::path::Path::new("/etc"),
        nix::unistd::getgid().as_raw(),
    )
    .map_err(|e| match e {
        UserError::Syntax(m) => origin.error(&m),
        UserError::Unknown(m) => origin.config_error(&m),
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if me != 0 {
        return Err(origin.config_error(&format!(
            "switching the child to '{v}' needs drainit to run as root (it runs as uid {me})"
        )));
    }
    Ok(id)
}

fn step_name(argv: &[String]) -> String {
    let first = argv.first().map(String::as_str).unwrap_or("step");
    first.rsplit('/').next().unwrap_or(first).to_string()
}

/// The grace-budget arithmetic of docs/configuration.md: what the drain may take at most,
/// against what the platform waits before SIGKILL.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub pre_drain_delay: Duration,
    /// The phase budget (zero without phases).
    pub phases: Duration,
    /// How many phases there are, and 1 s per `command` phase: the cancellation
    /// one that overran may ignore before it is SIGKILLed.
    pub phase_count: usize,
    pub phase_cancel: Duration,
    pub drain_timeout: Duration,
    /// One per step.
    pub teardown: Vec<Duration>,
    pub grace_period: Duration,
}

/// The spare a budget must leave under the grace period.
pub const BUDGET_SPARE: Duration = Duration::from_secs(1);

impl Budget {
    /// delay + timeout + every teardown timeout; saturates at `Duration::MAX`
    /// rather than overflow.
    pub fn total(&self) -> Duration {
        self.teardown.iter().fold(
            self.pre_drain_delay
                .saturating_add(self.phases)
                .saturating_add(self.phase_cancel)
                .saturating_add(self.drain_timeout),
            |a, d| a.saturating_add(*d),
        )
    }

    /// Whether the total fits under the grace period with [`BUDGET_SPARE`] to spare.
    pub fn fits(&self) -> bool {
        self.total().saturating_add(BUDGET_SPARE) <= self.grace_period
    }
}

impl std::fmt::Display for Budget {
    /// `pre-drain delay 5s + drain timeout 20s + teardown 0s = 25s of grace period 30s (5s spare)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let td = self
            .teardown
            .iter()
            .fold(Duration::ZERO, |a, d| a.saturating_add(*d));
        let mut steps = String::new();
        if self.teardown.len() > 1 {
            steps = format!(
                " ({})",
                self.teardown
                    .iter()
                    .map(|d| fmt_dur(*d))
                    .collect::<Vec<_>>()
                    .join(" + ")
            );
        }
        let mut phases = String::new();
        if self.phase_count > 0 {
            phases = format!(" + {} phase(s) {}", self.phase_count, fmt_dur(self.phases));
            if !self.phase_cancel.is_zero() {
                let _ = write!(phases, " + cancel {}", fmt_dur(self.phase_cancel));
            }
        }
        write!(
            f,
            "pre-drain delay {}{} + drain timeout {} + teardown {}{} = {} of grace period {}",
            fmt_dur(self.pre_drain_delay),
            phases,
            fmt_dur(self.drain_timeout),
            fmt_dur(td),
            steps,
            fmt_dur(self.total()),
            fmt_dur(self.grace_period)
        )?;
        if self.fits() {
            write!(f, " ({} spare)", fmt_dur(self.grace_period - self.total()))
        } else {
            write!(f, " (does not fit with {} to spare)", fmt_dur(BUDGET_SPARE))
        }
    }
}

impl Config {
    /// The grace budget of this configuration.
    pub fn budget(&self) -> Budget {
        let commands = self
            .phases
            .iter()
            .filter(|p| matches!(p.action, PhaseAction::Command(_)))
            .count() as u32;
        Budget {
            pre_drain_delay: self.pre_drain_delay,
            phases: if self.phases.is_empty() {
                Duration::ZERO
            } else {
                self.phase_budget
            },
            phase_count: self.phases.len(),
            phase_cancel: crate::drain::PHASE_KILL_AFTER * commands,
            drain_timeout: self.drain_timeout,
            teardown: self.teardown.iter().map(|t| t.timeout).collect(),
            grace_period: self.grace_period,
        }
    }

    /// The resolved configuration as TOML-like text, for `--check-config`: one
    /// line per setting (in the file's order), the checks and teardown steps as
    /// tables, and the grace budget.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for setting in &SETTINGS {
            (setting.show)(self, setting.key, &mut s);
        }
        for c in &self.checks {
            let _ = writeln!(s, "\n[[check]]\nname = {}", q(&c.name));
            let _ = match &c.kind {
                CheckKind::Tcp(a) => writeln!(s, "tcp = {}", q(a)),
                CheckKind::Http(u) => writeln!(s, "http = {}", q(&redact_url(u))),
                CheckKind::Exec(v) => writeln!(s, "exec = {}", q_list(v)),
                CheckKind::File(p) => writeln!(s, "file = {}", q(&p.display().to_string())),
            };
            let _ = writeln!(s, "timeout = {}", q(&fmt_dur(c.timeout)));
        }
        for t in &self.teardown {
            let _ = writeln!(s, "\n[[teardown]]\nname = {}", q(&t.name));
            let _ = writeln!(s, "command = {}", q_list(&t.argv));
            let _ = writeln!(s, "timeout = {}", q(&fmt_dur(t.timeout)));
        }
        for p in &self.phases {
            let _ = writeln!(s, "\n[[drain.phase]]\nname = {}", q(&p.name));
            let _ = match &p.action {
                PhaseAction::Command(argv) => writeln!(s, "command = {}", q_list(argv)),
                PhaseAction::Post(url) => writeln!(s, "post = {}", q(url)),
            };
            if let Some(max) = p.max {
                let _ = writeln!(s, "max = {}", q(&fmt_dur(max)));
            }
        }
        let _ = writeln!(s, "\n# grace budget: {}", self.budget());
        let _ = writeln!(s, "# {}", self.platform_note());
        s
    }

    /// A configuration with every setting at a placeholder, before
    /// [`SETTINGS`] sets each (from its default when nothing is given).
    fn unset(check_config: bool, command: Vec<OsString>) -> Config {
        Config {
            probe_addr: ProbeAddr::Off,
            pre_drain_delay: Duration::ZERO,
            pre_drain_delay_rule: DelayRule::Explicit,
            drain_timeout: Duration::ZERO,
            grace_period: Duration::ZERO,
            grace_period_given: false,
            drain_timeout_given: false,
            platform: Platform::Unknown,
            platform_why: String::new(),
            platform_given: false,
            fitted: false,
            phases: Vec::new(),
            phase_budget: DEFAULT_PHASE_BUDGET,
            phase_budget_given: false,
            strict_budget: false,
            drain_signals: Vec::new(),
            second_signal: SecondSignal::Skip,
            forward_to: ForwardTo::Child,
            rewrite: RewriteMap::default(),
            checks: Vec::new(),
            check_timeout: Duration::ZERO,
            ready_notify: false,
            ready_interval: Duration::ZERO,
            teardown: Vec::new(),
            teardown_timeout: Duration::ZERO,
            report_file: None,
            proxy: None,
            proxy_given_by: String::new(),
            proxy_health: None,
            stream_spread: None,
            proxy_threads: None,
            user: None,
            check_config,
            probe_client: None,
            log_format: LogFormat::Text,
            log_level: log::LevelFilter::Info,
            command,
        }
    }

    /// The platform, its grace period and what it did to the budget, for the
    /// budget line at start and `--check-config`: `platform docker (detected:
    /// /.dockerenv exists); grace period 10s, the platform's default; …`.
    pub fn platform_note(&self) -> String {
        let mut s = format!(
            "platform {} ({})",
            self.platform.as_str(),
            self.platform_why
        );
        if self.grace_period_given {
            let _ = write!(
                s,
                "; grace period {} as configured",
                fmt_dur(self.grace_period)
            );
        } else {
            let _ = write!(
                s,
                "; grace period {}, the platform's default",
                fmt_dur(self.grace_period)
            );
        }
        if self.platform == Platform::Systemd {
            s.push_str(" (drainit extends it at the drain with EXTEND_TIMEOUT_USEC)");
        }
        if self.fitted {
            s.push_str("; the defaults not given were shrunk to fit it");
        }
        s
    }

    /// Which pre-drain delay applies and why, for the budget line at start and
    /// `--check-config`: `pre-drain delay as configured`, or the default's rule.
    pub fn pre_drain_delay_note(&self) -> &'static str {
        match self.pre_drain_delay_rule {
            DelayRule::Explicit => "pre-drain delay as configured",
            DelayRule::Kubernetes => {
                "default pre-drain delay: applies, in Kubernetes (KUBERNETES_SERVICE_HOST is set)"
            }
            DelayRule::WhenRouted => {
                "default pre-drain delay: 0s unless a client asks /readyz before the drain signal \
                 (not in Kubernetes: KUBERNETES_SERVICE_HOST is unset); the budget counts it in full"
            }
            DelayRule::Unroutable => {
                "default pre-drain delay: 0s, nothing can ask /readyz (--probe-addr off, no \
                 --proxy-health; not in Kubernetes: KUBERNETES_SERVICE_HOST is unset)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct MapEnv(HashMap<String, String>);
    impl Env for MapEnv {
        fn get(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
    }

    #[test]
    fn a_proxy_is_refused_as_its_own_upstream_but_not_beside_it() {
        let own = |s: &str| parse_proxy(s).is_err_and(|e| e.contains("its own upstream"));
        for s in [
            "127.0.0.1:8080=127.0.0.1:8080",
            "0.0.0.0:8080=127.0.0.1:8080",
            "0.0.0.0:8080=0.0.0.0:8080",
            "[::]:8080=127.0.0.1:8080",
            "[::]:8080=[::1]:8080",
            "127.0.0.1:8080=0.0.0.0:8080",
            "[::]:8080=[::]:8080",
            "[::]:8080=0.0.0.0:8080",
            "[::1]:8080=[::]:8080",
            "0.0.0.0:8080=127.0.0.2:8080",
            "[::]:8080=[::ffff:127.0.0.1]:8080",
        ] {
            assert!(own(s), "{s}");
        }
        // Another port, another host, or a loopback address the listener does
        // not cover: a real upstream.
        for s in [
            "0.0.0.0:8080=127.0.0.1:8081",
            "0.0.0.0:8080=10.0.0.7:8080",
            "127.0.0.1:8080=127.0.0.2:8080",
            "10.0.0.7:8080=127.0.0.1:8080",
            // The other address family's loopback: an IPv4 socket never gets a
            // connection to [::1], an IPv6 one bound to [::1] never one to
            // 127.0.0.1 (a connect to 0.0.0.0 goes to 127.0.0.1, to [::] to [::1]).
            "0.0.0.0:8080=[::1]:8080",
            "0.0.0.0:8080=[::]:8080",
            "[::1]:8080=0.0.0.0:8080",
            "[::1]:8080=127.0.0.1:8080",
            "127.0.0.1:8080=[::]:8080",
        ] {
            assert!(parse_proxy(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn proxy_threads_auto_is_half_the_cpus_from_1_to_4() {
        let got: Vec<usize> = [1, 2, 3, 4, 6, 8, 64].map(proxy_threads_auto).to_vec();
        assert_eq!(got, [1, 1, 1, 2, 3, 4, 4]);
    }

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        // clap reads `env = ...` attributes from the real process environment; the
        // tests that need those set use names no other test uses.
        let mut a: Vec<OsString> = vec!["drainit".into()];
        a.extend(args.iter().map(OsString::from));
        let env = MapEnv(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        load_from(a, &env)
    }

    #[test]
    fn defaults() {
        let c = load(&["--", "true"], &[]).unwrap();
        assert_eq!(c.pre_drain_delay, Duration::from_secs(5));
        assert_eq!(c.drain_timeout, Duration::from_secs(20));
        assert_eq!(c.grace_period, Duration::from_secs(30));
        assert_eq!(
            c.drain_signals,
            vec![Signal::TERM, Signal::INT, Signal::QUIT]
        );
        assert_eq!(
            c.probe_addr,
            ProbeAddr::Listen {
                addr: "0.0.0.0:8079".parse().unwrap(),
                given_by: None
            }
        );
        assert_eq!(c.forward_to, ForwardTo::Child);
        assert_eq!(c.command, vec![OsString::from("true")]);
        assert!(c.budget().fits());
    }

    #[test]
    fn the_default_delay_applies_in_kubernetes_or_when_routed_and_an_explicit_one_always() {
        let c = load(&["true"], &[]).unwrap();
        assert_eq!(c.pre_drain_delay_rule, DelayRule::WhenRouted);
        assert!(c.render().contains("# pre_drain_delay = \"5s\": default"));
        let c = load(&["true"], &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")]).unwrap();
        assert_eq!(c.pre_drain_delay_rule, DelayRule::Kubernetes);
        assert_eq!(c.pre_drain_delay, Duration::from_secs(5));
        // (DRAINIT_PRE_DRAIN_DELAY is read by clap, like the flag: tests/defaults.rs.)
        let c = load(&["true"], &[("PRE_DRAIN_DELAY_MS", "0")]).unwrap();
        assert_eq!(c.pre_drain_delay_rule, DelayRule::Explicit);
        assert_eq!(c.pre_drain_delay, Duration::ZERO);
        let c = load(&["--pre-drain-delay", "5s", "true"], &[]).unwrap();
        assert_eq!(c.pre_drain_delay_rule, DelayRule::Explicit);
        assert!(c.render().contains("\npre_drain_delay = \"5s\"\n"));
        let p = write_file("delay", "pre_drain_delay = \"1s\"\n");
        let c = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap();
        assert_eq!(c.pre_drain_delay_rule, DelayRule::Explicit);
    }

    #[test]
    fn command_without_double_dash_keeps_its_flags() {
        let c = load(&["--probe-addr", "off", "sh", "-c", "exit 3"], &[]).unwrap();
        assert_eq!(
            c.command,
            vec![OsString::from("sh"), "-c".into(), "exit 3".into()]
        );
        assert_eq!(c.probe_addr, ProbeAddr::Off);
    }

    #[test]
    fn usage_errors_are_64_and_name_the_flag() {
        let e = load(&["--no-such-flag", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 64);
        let e = load(&["--drain-timeout", "soon", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 64);
        assert!(
            e.message.contains("--drain-timeout") && e.message.contains("soon"),
            "{}",
            e.message
        );
        let e = load(&["--rewrite", "TERM", "true"], &[]).unwrap_err();
        assert!(e.message.contains("--rewrite"), "{}", e.message);
        let e = load(&[], &[]).unwrap_err();
        assert_eq!(e.code, 64);
        let e = load(&["--drain-signal", "KILL", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 64);
    }

    #[test]
    fn repeatable_flags_from_env_split_on_commas_and_errors_are_78() {
        let c = load(&["true"], &[("DRAINIT_REWRITE", "TERM:QUIT, HUP:USR1")]).unwrap();
        assert_eq!(c.rewrite.apply(Signal::TERM), Some(Signal::QUIT));
        assert_eq!(c.rewrite.apply(Signal::HUP), Some(Signal(libc::SIGUSR1)));
        let e = load(&["true"], &[("DRAINIT_DRAIN_SIGNAL", "TERM,NOPE")]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains("DRAINIT_DRAIN_SIGNAL") && e.message.contains("NOPE"),
            "{}",
            e.message
        );
        // The flag wins over the environment.
        let c = load(
            &["--drain-signal", "USR1", "true"],
            &[("DRAINIT_DRAIN_SIGNAL", "TERM")],
        )
        .unwrap();
        assert_eq!(c.drain_signals, vec![Signal(libc::SIGUSR1)]);
    }

    #[test]
    fn plain_millisecond_variables() {
        let c = load(
            &["true"],
            &[("PRE_DRAIN_DELAY_MS", "250"), ("DRAIN_TIMEOUT_MS", "1500")],
        )
        .unwrap();
        assert_eq!(c.pre_drain_delay, Duration::from_millis(250));
        assert_eq!(c.drain_timeout, Duration::from_millis(1500));
        let c = load(
            &["--pre-drain-delay", "1s", "true"],
            &[("PRE_DRAIN_DELAY_MS", "250")],
        )
        .unwrap();
        assert_eq!(c.pre_drain_delay, Duration::from_secs(1));
        let e = load(&["true"], &[("DRAIN_TIMEOUT_MS", "2s")]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(e.message.contains("DRAIN_TIMEOUT_MS"));
    }

    fn write_file(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "drainit-config-test-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn file_values_rank_below_flags_and_above_defaults() {
        let p = write_file(
            "prec",
            "pre_drain_delay = \"2s\"\ndrain_timeout = \"7s\"\n\n[[check]]\nname = \"db\"\ntcp = \"127.0.0.1:5432\"\ntimeout = \"500ms\"\n\n[[teardown]]\nname = \"flush\"\ncommand = [\"sync\"]\ntimeout = \"2s\"\n",
        );
        let c = load(
            &[
                "--config",
                p.to_str().unwrap(),
                "--drain-timeout",
                "9s",
                "true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.pre_drain_delay, Duration::from_secs(2));
        assert_eq!(c.drain_timeout, Duration::from_secs(9));
        assert_eq!(c.checks.len(), 1);
        assert_eq!(c.checks[0].name, "db");
        assert_eq!(c.checks[0].timeout, Duration::from_millis(500));
        assert_eq!(c.teardown[0].name, "flush");
        assert_eq!(c.budget().total(), Duration::from_secs(13));
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn file_errors_name_the_key_line_and_column() {
        let p = write_file(
            "bad",
            "pre_drain_delay = \"2s\"\ndrain_timeout = \"soon\"\n",
        );
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains(":2:17") && e.message.contains("drain_timeout"),
            "{}",
            e.message
        );
        let p2 = write_file("unknown", "pre_drain_delay = \"2s\"\nfrobnicate = 1\n");
        let e = load(&["--config", p2.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains("frobnicate") && e.message.contains(":2:1"),
            "{}",
            e.message
        );
        let e = load(&["--config", "/nonexistent/drainit.toml", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        // A value of the wrong type: the key is named too, also inside a table.
        let p3 = write_file("types", "pre_drain_delay = 5\n");
        let e = load(&["--config", p3.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert!(
            e.message
                .contains(":1:19: invalid value for key `pre_drain_delay`"),
            "{}",
            e.message
        );
        let p4 = write_file(
            "check-types",
            "[[check]]\ntcp = \"127.0.0.1:1\"\ntimeout = 3\n",
        );
        let e = load(&["--config", p4.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert!(
            e.message.contains(":3:11: invalid value for key `timeout`"),
            "{}",
            e.message
        );
        // Inside an inline table: the line's first key is not the culprit.
        let p5 = write_file("inline", "check = [{ tcp = \"127.0.0.1:1\", bogus = 3 }]\n");
        let e = load(&["--config", p5.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert!(
            e.message.contains("bogus") && !e.message.contains("key `check`"),
            "{}",
            e.message
        );
        for p in [p, p2, p3, p4, p5] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn strict_budget_refuses_what_does_not_fit() {
        let e = load(
            &[
                "--strict-budget",
                "--pre-drain-delay",
                "10s",
                "--drain-timeout",
                "20s",
                "true",
            ],
            &[],
        )
        .unwrap_err();
        assert_eq!(e.code, 78);
        assert!(e.message.contains("pre-drain delay 10s"), "{}", e.message);
        // 29 s + 1 s spare fits exactly.
        let c = load(&["--strict-budget", "--pre-drain-delay", "9s", "true"], &[]).unwrap();
        assert!(c.budget().fits());
    }

    #[test]
    fn switches_take_a_value_only_after_an_equals_sign() {
        // `true` right after the switch is the command, not the switch's value.
        for flag in ["--strict-budget", "--ready-notify"] {
            let c = load(&[flag, "true"], &[]).unwrap();
            assert_eq!(c.command, vec![OsString::from("true")], "{flag}");
        }
        let c = load(&["--strict-budget", "true"], &[]).unwrap();
        assert!(c.strict_budget);
        let c = load(&["--strict-budget=false", "true"], &[]).unwrap();
        assert!(!c.strict_budget);
        let c = load(&["--ready-notify=true", "sleep", "1"], &[]).unwrap();
        assert!(c.ready_notify);
        assert_eq!(
            load(&["--strict-budget=maybe", "true"], &[])
                .unwrap_err()
                .code,
            64
        );
    }

    #[test]
    fn checks_from_flags() {
        let c = load(
            &[
                "--ready-tcp",
                "127.0.0.1:8080",
                "--ready-exec",
                "pg_isready -h 'a b'",
                "--check-timeout",
                "500ms",
                "true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.checks[0].kind, CheckKind::Tcp("127.0.0.1:8080".into()));
        assert_eq!(
            c.checks[1].kind,
            CheckKind::Exec(vec!["pg_isready".into(), "-h".into(), "a b".into()])
        );
        assert_eq!(c.checks[1].timeout, Duration::from_millis(500));
        assert!(load(&["--ready-tcp", "localhost", "true"], &[]).is_err());
        // Names other than localhost are refused, naming the flag and the reason.
        let e = load(&["--ready-tcp", "db:5432", "true"], &[]).unwrap_err();
        assert_eq!(e.code, exit::USAGE);
        assert!(
            e.message.contains("--ready-tcp") && e.message.contains("IP address or localhost"),
            "{}",
            e.message
        );
        let e = load(&["--ready-http", "http://app.internal/health", "true"], &[]).unwrap_err();
        assert!(
            e.message.contains("--ready-http") && e.message.contains("IP address or localhost"),
            "{}",
            e.message
        );
        for ok in ["localhost:80", "[::1]:8080"] {
            assert!(load(&["--ready-tcp", ok, "true"], &[]).is_ok(), "{ok}");
        }
        for ok in [
            "http://localhost/x",
            "http://[::1]:8080/",
            "http://127.0.0.1",
        ] {
            assert!(load(&["--ready-http", ok, "true"], &[]).is_ok(), "{ok}");
        }
        let e = load(&["--ready-http", "https://u:secret@h/x", "true"], &[]).unwrap_err();
        assert!(!e.message.contains("secret"), "{}", e.message);
    }

    #[test]
    fn durations_above_seven_days_are_refused_not_overflowed() {
        let huge = "18446744073709551615s";
        for flag in [
            "--pre-drain-delay",
            "--drain-timeout",
            "--grace-period",
            "--teardown-timeout",
            "--check-timeout",
            "--ready-interval",
        ] {
            let e = load(&[flag, huge, "true"], &[]).unwrap_err();
            assert_eq!(e.code, 64, "{flag}: {}", e.message);
            assert!(
                e.message.contains(flag) && e.message.contains("at most 7d"),
                "{}",
                e.message
            );
        }
        let e = load(&["--drain-timeout", "9000000000000000000s", "true"], &[]).unwrap_err();
        assert!(e.message.contains("at most 7d"), "{}", e.message);
        // Exactly 7 days is accepted; one second more is not.
        let c = load(&["--drain-timeout", "7d", "true"], &[]).unwrap();
        assert_eq!(c.drain_timeout, MAX_DURATION);
        assert!(load(&["--drain-timeout", "7d 1s", "true"], &[]).is_err());
        let e = load(&["true"], &[("DRAIN_TIMEOUT_MS", "604800001")]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains("DRAIN_TIMEOUT_MS") && e.message.contains("at most 7d"),
            "{}",
            e.message
        );
        let p = write_file(
            "huge",
            "[[teardown]]\ncommand = [\"true\"]\ntimeout = \"8d\"\n",
        );
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains(":3:11") && e.message.contains("at most 7d"),
            "{}",
            e.message
        );
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn budget_total_saturates() {
        let b = Budget {
            pre_drain_delay: Duration::MAX,
            phases: Duration::ZERO,
            phase_count: 0,
            phase_cancel: Duration::ZERO,
            drain_timeout: Duration::from_secs(1),
            teardown: vec![Duration::MAX, Duration::from_secs(1)],
            grace_period: Duration::from_secs(30),
        };
        assert_eq!(b.total(), Duration::MAX);
        assert!(!b.fits());
        assert!(b.to_string().contains("does not fit"));
    }

    #[test]
    fn an_empty_drain_signal_list_is_78_outside_the_command_line() {
        let e = load(&["true"], &[("DRAINIT_DRAIN_SIGNAL", "")]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(e.message.contains("DRAINIT_DRAIN_SIGNAL"), "{}", e.message);
        let e = load(&["true"], &[("DRAINIT_DRAIN_SIGNAL", " , ")]).unwrap_err();
        assert_eq!(e.code, 78);
        let p = write_file("nosig", "drain_timeout = \"1s\"\ndrain_signal = []\n");
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains(":2:16") && e.message.contains("`drain_signal`"),
            "{}",
            e.message
        );
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn check_and_teardown_entry_errors_have_line_and_column() {
        let p = write_file(
            "entries",
            "drain_timeout = \"1s\"\n\n[[check]]\ntcp = \"127.0.0.1:1\"\n\n[[check]]\nname = \"two\"\ntcp = \"127.0.0.1:2\"\nfile = \"/x\"\n",
        );
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message
                .contains(":6:1: [[check]] #2: needs exactly one of"),
            "{}",
            e.message
        );
        let p2 = write_file("teardown", "[[teardown]]\nname = \"x\"\ncommand = []\n");
        let e = load(&["--config", p2.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message
                .contains(":1:1: [[teardown]] #1: command is empty"),
            "{}",
            e.message
        );
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_file(p2);
    }

    #[test]
    fn drain_phases_come_from_the_file_or_the_flags_and_set_the_budget() {
        let p = write_file(
            "phases",
            "[[drain.phase]]\nname = \"handoff\"\npost = \"http://127.0.0.1:8080/drain/handoff\"\nmax = \"3s\"\n\n\
             [[drain.phase]]\nname = \"consul\"\ncommand = [\"deregister\", \"web\"]\nmax = \"2s\"\n",
        );
        let path = p.to_str().unwrap();
        let c = load(&["--config", path, "true"], &[]).unwrap();
        assert_eq!(
            c.phases,
            vec![
                DrainPhase {
                    name: "handoff".into(),
                    action: PhaseAction::Post("http://127.0.0.1:8080/drain/handoff".into()),
                    max: Some(Duration::from_secs(3)),
                },
                DrainPhase {
                    name: "consul".into(),
                    action: PhaseAction::Command(vec!["deregister".into(), "web".into()]),
                    max: Some(Duration::from_secs(2)),
                },
            ]
        );
        assert_eq!(
            c.phase_budget,
            Duration::from_secs(5),
            "the sum of the maxes"
        );
        let b = c.budget();
        assert_eq!(
            (b.phases, b.phase_cancel, b.total()),
            (
                Duration::from_secs(5),
                Duration::from_secs(1),
                Duration::from_secs(31)
            ),
            "delay 5 + phases 5 + a second per command phase + timeout 20"
        );
        // Flags replace the file's tables; without every max, 10 s.
        let c = load(
            &[
                "--config",
                path,
                "--drain-phase",
                "a=sh -c 'exit 0'",
                "true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.phases.len(), 1);
        assert_eq!(c.phases[0].name, "a");
        assert_eq!(c.phase_budget, DEFAULT_PHASE_BUDGET);
        let c = load(
            &["--drain-phase", "a=true", "--phase-budget", "2s", "true"],
            &[],
        )
        .unwrap();
        assert_eq!(c.phase_budget, Duration::from_secs(2));
        assert!(
            c.render()
                .contains("[[drain.phase]]\nname = \"a\"\ncommand = [\"true\"]")
        );
        // Refused: no NAME=, both command and post, a URL that is not http.
        assert_eq!(
            load(&["--drain-phase", "true", "true"], &[])
                .unwrap_err()
                .code,
            64
        );
        for (name, text, msg) in [
            (
                "both",
                "[[drain.phase]]\nname = \"x\"\ncommand = [\"a\"]\npost = \"http://h:1/\"\n",
                "give one of command or post",
            ),
            (
                "https",
                "[[drain.phase]]\nname = \"x\"\npost = \"https://h/\"\n",
                "is not an http:// URL",
            ),
            (
                "twice",
                "[[drain.phase]]\nname = \"x\"\ncommand = [\"a\"]\n[[drain.phase]]\nname = \"x\"\ncommand = [\"b\"]\n",
                "two drain phases are named 'x'",
            ),
        ] {
            let f = write_file(name, text);
            let e = load(&["--config", f.to_str().unwrap(), "true"], &[]).unwrap_err();
            assert_eq!(e.code, 78, "{}", e.message);
            assert!(e.message.contains(msg), "{}", e.message);
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn entry_names_with_control_characters_or_empty_are_refused() {
        for (text, want) in [
            (
                "[[check]]\nname = \"a\\rb\"\ntcp = \"127.0.0.1:1\"\n",
                ":1:1: [[check]] #1: name \"a\\rb\" has a control character",
            ),
            (
                "[[check]]\nname = \"\"\ntcp = \"127.0.0.1:1\"\n",
                ":1:1: [[check]] #1: name is empty",
            ),
            (
                "[[teardown]]\nname = \"x\\ny\"\ncommand = [\"true\"]\n",
                ":1:1: [[teardown]] #1: name \"x\\ny\" has a control character",
            ),
        ] {
            let p = write_file("names", text);
            let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
            assert_eq!(e.code, 78, "{text}");
            assert!(e.message.contains(want), "{text}: {}", e.message);
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn empty_file_checks_are_refused() {
        let e = load(&["--ready-file", "", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 64);
        assert!(e.message.contains("--ready-file"), "{}", e.message);
        let p = write_file("emptyfile", "[[check]]\nfile = \"\"\n");
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains(":2:8") && e.message.contains("`file`"),
            "{}",
            e.message
        );
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn rewrites_need_a_received_from_and_one_target() {
        for pair in ["KILL:TERM", "STOP:0", "SEGV:TERM", "CHLD:0"] {
            let e = load(&["--rewrite", pair, "true"], &[]).unwrap_err();
            assert_eq!(e.code, 64, "{pair}");
            assert!(e.message.contains("--rewrite"), "{}", e.message);
        }
        let e = load(&["true"], &[("DRAINIT_REWRITE", "TERM:QUIT,TERM:INT")]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains("DRAINIT_REWRITE")
                && e.message.contains("TERM:QUIT")
                && e.message.contains("TERM:INT"),
            "{}",
            e.message
        );
        let e = load(
            &["--rewrite", "TERM:QUIT", "--rewrite", "15:2", "true"],
            &[],
        )
        .unwrap_err();
        assert_eq!(e.code, 64);
        assert!(
            e.message.contains("'TERM:QUIT' and '15:2'"),
            "{}",
            e.message
        );
        // The same rewrite twice is no conflict; KILL as the target is allowed.
        let c = load(
            &[
                "--rewrite",
                "TERM:QUIT",
                "--rewrite",
                "SIGTERM:3",
                "--rewrite",
                "HUP:KILL",
                "true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.rewrite.apply(Signal::TERM), Some(Signal::QUIT));
        assert_eq!(c.rewrite.apply(Signal::HUP), Some(Signal::KILL));
    }

    #[test]
    fn urls_lose_userinfo_and_query_when_shown() {
        assert_eq!(
            redact_url("http://u:p@h:8080/x?token=s#f"),
            "http://***@h:8080/x?***"
        );
        assert_eq!(redact_url("http://h:8080?token=s"), "http://h:8080?***");
        assert_eq!(redact_url("http://h/health"), "http://h/health");
        let c = load(
            &[
                "--check-config",
                "--ready-http",
                "http://localhost:81/r?token=secret",
            ],
            &[],
        )
        .unwrap();
        // The check keeps the real URL; only what is shown is redacted.
        assert_eq!(
            c.checks[0].kind,
            CheckKind::Http("http://localhost:81/r?token=secret".into())
        );
        let shown = c.render();
        assert!(
            !shown.contains("secret") && shown.contains("http://localhost:81/r?***"),
            "{shown}"
        );
    }

    #[test]
    fn short_durations_render_exactly() {
        let c = load(
            &[
                "--check-config",
                "--pre-drain-delay",
                "500us",
                "--drain-timeout",
                "1500ms",
            ],
            &[],
        )
        .unwrap();
        let shown = c.render();
        assert!(shown.contains("pre_drain_delay = \"500us\""), "{shown}");
        assert!(shown.contains("drain_timeout = \"1s 500ms\""), "{shown}");
    }

    #[test]
    fn a_report_file_needs_an_existing_directory() {
        let dir =
            std::env::temp_dir().join(format!("drainit-config-test-{}-nodir", std::process::id()));
        let missing = dir.join("report.json");
        let missing = missing.to_str().unwrap();
        let e = load(&["--report-file", missing, "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains("--report-file") && e.message.contains("does not exist"),
            "{}",
            e.message
        );
        let p = write_file("report", &format!("report_file = {missing:?}\n"));
        let e = load(&["--config", p.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(
            e.message.contains(":1:15") && e.message.contains("`report_file`"),
            "{}",
            e.message
        );
        // A file for a directory.
        let e = load(&["--report-file", "/dev/null/report.json", "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(e.message.contains("not a directory"), "{}", e.message);
        // A directory for a file (the report would be lost at exit).
        let tmp = std::env::temp_dir();
        let e = load(&["--report-file", tmp.to_str().unwrap(), "true"], &[]).unwrap_err();
        assert_eq!(e.code, 78);
        assert!(e.message.contains("is a directory"), "{}", e.message);
        // What the kernel would refuse at exit, when the report is lost, is
        // refused at start: a trailing `/`, `.` or `..` (no file name), a name
        // longer than 255 bytes, a path longer than 4095.
        let dir = tmp.to_str().unwrap();
        for (bad, why) in [
            (format!("{dir}/new/"), "names a directory"),
            (format!("{dir}/new/."), "names a directory"),
            (format!("{dir}/.."), "names a directory"),
            (
                format!("{dir}/{}", "r".repeat(256)),
                "longer than 255 bytes",
            ),
            (
                format!("{dir}{}/r", "/.".repeat(2100)),
                "longer than 4095 bytes",
            ),
        ] {
            let e = load(&["--report-file", &bad, "true"], &[]).unwrap_err();
            assert_eq!(e.code, 78, "{bad}");
            assert!(
                e.message.contains("--report-file") && e.message.contains(why),
                "{}",
                e.message
            );
        }
        let long = format!("{dir}/{}", "r".repeat(255));
        assert!(load(&["--report-file", &long, "true"], &[]).is_ok());
        // An existing directory, and an existing device, are fine.
        let ok = std::env::temp_dir().join("drainit-report.json");
        let c = load(&["--report-file", ok.to_str().unwrap(), "true"], &[]).unwrap();
        assert_eq!(c.report_file.as_deref(), Some(ok.as_path()));
        let c = load(&["--report-file", "/dev/null", "true"], &[]).unwrap();
        assert!(c.report_file.is_some());
        let c = load(&["--report-file", "", "true"], &[]).unwrap();
        assert!(c.report_file.is_none());
        let _ = std::fs::remove_file(p);
    }

    /// Settings as data: the reference's table is generated from the settings;
    /// `docs/configuration.md` carries it as generated. A setting added, renamed or
    /// re-documented without `cargo run -p xtask -- docs` fails here.
    #[test]
    fn the_configuration_reference_carries_the_generated_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let doc = std::fs::read_to_string(path).expect("docs/configuration.md exists");
        let table = reference_table();
        assert!(
            doc.contains(&table),
            "docs/configuration.md lacks the table of today's settings: run \
             `cargo run -p xtask -- reference` (it rewrites the file's table)\n{table}"
        );
    }

    /// Every setting is one flag of [`command`] with its variable (clap reads a
    /// scalar's; a list's is split by the resolver), and every file key but the
    /// tables is a setting.
    #[test]
    fn every_setting_is_one_flag_and_its_variable() {
        let cmd = command();
        for s in &SETTINGS {
            let a = cmd
                .get_arguments()
                .find(|a| a.get_id() == s.key)
                .unwrap_or_else(|| panic!("{} has no flag", s.key));
            assert_eq!(a.get_long(), Some(settings::flag_of(s.key).as_str()));
            let clap_env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            let want = (s.shape != settings::Shape::List).then(|| env_name(s.key));
            assert_eq!(clap_env, want, "{}: its variable", s.key);
            assert!(
                s.shape == settings::Shape::List || s.file == settings::InFile::Key,
                "{}: only a list is given by the file's tables",
                s.key
            );
        }
        let settings = cmd
            .get_arguments()
            .filter(|a| SETTINGS.iter().any(|s| s.key == a.get_id()))
            .count();
        assert_eq!(
            cmd.get_arguments().count() - settings,
            4,
            "no setting: --config, --check-config, --probe and the command"
        );
    }
}
