//! The command line: `drainit-gate model|…`, parsed by clap into [`Cli`], then
//! validated into the model's [`Settings`](crate::model::Settings).
//!
//! What it owns: flag names, their units at the edge (`7s` or `7`, whole seconds;
//! `10` or `10%`) and their defaults, which are the opening settings (docs/gate.md).
//! xtask renders the man page and the completions from [`Cli`], so they never drift
//! from the flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};

use crate::drill::Router;
use crate::model::Settings;

/// The exit codes (`--help` lists them): the gate passes, fails, or a flag is bad.
pub mod exit {
    /// The gate passes.
    pub const PASS: u8 = 0;
    /// The gate fails.
    pub const FAIL: u8 = 1;
    /// A bad flag or value (sysexits `EX_USAGE`); the message names the flag.
    pub const USAGE: u8 = 64;
    /// An output file (`--html`) could not be written (sysexits `EX_CANTCREAT`).
    pub const CANT_CREATE: u8 = 73;
    /// `drill`: the drill itself could not run (no `{port}`, no drainit, a port
    /// taken, a replica never ready, HAProxy missing); nothing is left running.
    pub const DRILL_ERROR: u8 = 2;
}

const AFTER_HELP: &str = "\
Exit codes: 0 the gate passes, 1 it fails, 64 a bad flag (the message names it),
73 the --html file could not be written.";

const TOP_AFTER_HELP: &str = "\
Exit codes: 0 the gate passes, 1 it fails, 2 (drill) the drill could not run,
64 a bad flag (the message names it), 73 the --html file could not be written.";

/// `drainit-gate`: before a deploy, see what your settings do to the requests in
/// flight.
#[derive(Debug, Parser)]
#[command(
    name = "drainit-gate",
    version,
    about = "The deployment gate: did every request commit, or get an answer a client can safely retry?",
    long_about = "The deployment gate: did every request commit, or get an answer a client can safely retry?\n\n\
                  `model` runs the drill's scenario as a deterministic whole-second model: \
                  workers, requests, one SIGTERM, a ledger and a verdict. `drill` runs the same scenario \
                  on your app, with replicas under drainit --proxy, a router and a real SIGTERM. `check` \
                  merges replicas' exit reports into one verdict for a whole rollout.",
    after_help = TOP_AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The drill as a model: N workers, requests at fixed times, SIGTERM to W1, in
    /// whole seconds; prints the events, the requests, the ledger and the verdict.
    #[command(after_help = AFTER_HELP)]
    Model(ModelArgs),
    /// The drill with real processes: replicas of CMD under drainit --proxy, a
    /// router, SIGTERM to W1; every request's outcome from the client's side and
    /// from the replica's exit report. Exit 0 pass, 1 fail, 2 the drill could not
    /// run.
    #[command(after_help = DRILL_AFTER_HELP)]
    Drill(DrillArgs),
    /// The fleet gate: merges the exit reports of any number of replicas (files,
    /// `-` for stdin; report lines found among other log output) into one verdict.
    #[command(after_help = AFTER_HELP)]
    Check(CheckArgs),
}

const DRILL_AFTER_HELP: &str = "\
{port} in CMD is each replica's app port. drainit's other settings come from the
environment (DRAINIT_DRAIN_TIMEOUT=1s drainit-gate drill ... sets them for every
replica). Scenario times (--every, --first-at, --signal-at, --check-interval) are
multiplied by --time-scale; the app and drainit run in real time.
Exit codes: 0 the gate passes, 1 it fails, 2 the drill could not run (nothing is
left running), 64 a bad flag, 73 the --html file could not be written.";

/// `drainit-gate drill`'s flags; the scenario defaults are the model's.
#[derive(Debug, Args)]
pub struct DrillArgs {
    /// Replicas started before 0 s (W1…Wn; W1 gets the signal).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub replicas: u32,
    /// Requests the built-in router sends to one replica at once (HAProxy: maxconn).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slots: u32,
    /// Planned requests (#1…#N).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: u32,
    /// Time between two arrivals (scenario time).
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = scenario_seconds)]
    pub every: f64,
    /// When request #1 is sent (scenario time from the moment every replica is ready).
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = scenario_seconds)]
    pub first_at: f64,
    /// When W1 gets SIGTERM (scenario time).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = scenario_seconds)]
    pub signal_at: f64,
    /// Boot a replacement W(n+1) at the signal.
    #[arg(long)]
    pub replacement: bool,
    /// Retryable 503 rejections the clients absorb, in percent of the requests.
    #[arg(long = "allow-503", value_name = "PCT", default_value = "0", value_parser = percent)]
    pub allow_503: u32,
    /// The request each arrival sends (GET).
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub path: String,
    /// Real seconds per scenario second (0.25 runs the 40 s scenario in 10 s).
    #[arg(long, value_name = "F", default_value = "1", value_parser = time_scale)]
    pub time_scale: f64,
    /// How often the router checks each replica's /readyz (scenario time; 0 = before
    /// every request).
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = scenario_seconds)]
    pub check_interval: f64,
    /// The router in front of the replicas.
    #[arg(long, value_enum, default_value = "builtin")]
    pub router: Router,
    /// Retry a retryable 503 up to N times through the router (honouring
    /// Retry-After, capped at 1 scenario second).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retry: u32,
    /// drainit's binary [default: the `drainit` beside drainit-gate, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub drainit: Option<PathBuf>,
    /// drainit flags given to every replica before `--` (split like a shell;
    /// `{port}` is the replica's app port). The default makes a replica ready only
    /// once its app accepts connections.
    #[arg(
        long,
        value_name = "ARGS",
        default_value = "--ready-tcp 127.0.0.1:{port}",
        allow_hyphen_values = true
    )]
    pub drainit_args: String,
    /// HAProxy's binary (--router haproxy).
    #[arg(long, value_name = "PATH", default_value = "haproxy")]
    pub haproxy: PathBuf,
    /// How long (real time) every replica gets to answer /readyz 200 before the
    /// drill gives up (exit 2).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = real_duration)]
    pub ready_timeout: Duration,
    /// How long (real time) a replica gets to exit after its SIGTERM.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = real_duration)]
    pub exit_timeout: Duration,
    /// How long (real time) one attempt may take.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = real_duration)]
    pub request_timeout: Duration,
    /// Use consecutive ports from this one (3 per replica, then the router's),
    /// instead of free ones the kernel picks.
    #[arg(long, value_name = "PORT")]
    pub port_base: Option<u16>,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page that replays the run.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// The app's command; `{port}` is each replica's app port.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

impl DrillArgs {
    /// The drill's settings these flags give (drainit resolved by the caller).
    ///
    /// # Errors
    /// `--drainit-args` does not split like a shell (an open quote).
    pub fn settings(&self, drainit: PathBuf) -> Result<crate::drill::Settings, String> {
        let drainit_args =
            shell_words::split(&self.drainit_args).map_err(|e| format!("--drainit-args: {e}"))?;
        Ok(crate::drill::Settings {
            drainit_args,
            replicas: self.replicas,
            slots: self.slots,
            requests: self.requests,
            every_s: self.every,
            first_at_s: self.first_at,
            signal_at_s: self.signal_at,
            replacement: self.replacement,
            allow_503_pct: self.allow_503,
            path: self.path.clone(),
            time_scale: self.time_scale,
            check_interval_s: self.check_interval,
            router: self.router,
            retry: self.retry,
            drainit,
            haproxy: self.haproxy.clone(),
            ready_timeout: self.ready_timeout,
            exit_timeout: self.exit_timeout,
            request_timeout: self.request_timeout,
            port_base: self.port_base,
            cmd: self.cmd.clone(),
        })
    }
}

/// `drainit-gate check`'s flags.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Retryable 503 rejections accepted, in percent of the requests received.
    #[arg(long = "allow-503", value_name = "PCT", default_value = "0", value_parser = percent)]
    pub allow_503: u32,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page with each replica's ledger and the
    /// verdict.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Exit reports: files (a log holding the report line among others is fine),
    /// `-` for stdin. One per replica.
    #[arg(required = true, value_name = "REPORT")]
    pub reports: Vec<String>,
}

/// A scenario duration in seconds, fractions allowed: `2`, `2s`, `1.5s`, `500ms`.
///
/// # Errors
/// Not a duration, or above 10⁹ s.
pub fn scenario_seconds(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let secs = match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => v,
        Ok(_) => return Err("a duration is a finite number of seconds, at least 0".into()),
        Err(_) => humantime::parse_duration(t)
            .map_err(|e| format!("{e} (write 2s, 1.5s or 500ms)"))?
            .as_secs_f64(),
    };
    if secs > MAX_SECONDS as f64 {
        return Err(format!("at most {MAX_SECONDS}s"));
    }
    Ok(secs)
}

/// A real duration (humantime, or plain seconds).
///
/// # Errors
/// Not a duration.
pub fn real_duration(text: &str) -> Result<Duration, String> {
    scenario_seconds(text).map(Duration::from_secs_f64)
}

/// `--time-scale`: a number above 0, at most 100.
///
/// # Errors
/// Not a number, 0 or less, or above 100.
pub fn time_scale(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 100.0 => Ok(f),
        _ => Err("a number above 0 and at most 100 (0.25 runs the scenario 4x faster)".into()),
    }
}

/// `drainit-gate model`'s flags; the defaults are the opening settings.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Workers booted at 0 s (W1…Wn; W1 gets the signal).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub workers: u32,
    /// Invocation slots per worker.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slots: u32,
    /// Requests in the drill (#1…#N).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: u32,
    /// Time between two arrivals (whole seconds: 2s or 2).
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = seconds)]
    pub every: u64,
    /// When request #1 arrives.
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = seconds)]
    pub first_at: u64,
    /// How long each invocation runs; it commits only when it finishes (at least 1s).
    #[arg(long, value_name = "DUR", default_value = "7s", value_parser = positive_seconds)]
    pub duration: u64,
    /// From a worker's start to its readiness.
    #[arg(long, value_name = "DUR", default_value = "4s", value_parser = seconds)]
    pub startup: u64,
    /// When W1 gets SIGTERM.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = seconds)]
    pub signal_at: u64,
    /// From SIGTERM to SIGKILL (terminationGracePeriodSeconds); 0 kills at the signal.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = seconds)]
    pub grace: u64,
    /// W1 drains on SIGTERM (stops admitting, lets in-flight work finish) instead of
    /// exiting at once.
    #[arg(long, value_name = "BOOL", default_value = "true", value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub handles_term: bool,
    /// The router sends only to ready workers (else a request sent to a worker not
    /// yet ready fails with 500).
    #[arg(long, value_name = "BOOL", default_value = "true", value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub route_ready: bool,
    /// Retryable 503 rejections the clients absorb, in percent of the requests
    /// (10 or 10%).
    #[arg(long = "allow-503", value_name = "PCT", default_value = "0", value_parser = percent)]
    pub allow_503: u32,
    /// Boot a replacement W(n+1) at the signal (maxSurge), ready after --startup.
    #[arg(long)]
    pub replacement: bool,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page that replays the run.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

impl ModelArgs {
    /// The model's settings these flags give.
    pub fn settings(&self) -> Settings {
        Settings {
            workers: self.workers,
            slots: self.slots,
            requests: self.requests,
            every_s: self.every,
            first_at_s: self.first_at,
            duration_s: self.duration,
            startup_s: self.startup,
            signal_at_s: self.signal_at,
            grace_s: self.grace,
            handles_term: self.handles_term,
            route_ready: self.route_ready,
            allow_503_pct: self.allow_503,
            replacement: self.replacement,
        }
    }
}

/// Most seconds a time flag takes (about 31 years): keeps every sum of them far
/// from overflow.
const MAX_SECONDS: u64 = 1_000_000_000;

/// A whole number of seconds: `7`, `7s`, or any humantime duration (`1m`,
/// `1m 30s`) that is whole seconds.
///
/// # Errors
/// Not a duration, a fraction of a second (`1.5s`, `500ms`), or above 10⁹ s.
pub fn seconds(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let secs = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>().map_err(|e| e.to_string())?
    } else if t.contains('.') || t.contains(',') {
        return Err(format!(
            "the model counts whole seconds: {t} has a fraction (write 7s or 7)"
        ));
    } else {
        let d = humantime::parse_duration(t)
            .map_err(|e| format!("{e} (write whole seconds: 7s or 7)"))?;
        if d.subsec_nanos() != 0 {
            return Err("the model counts whole seconds: no fraction of a second".into());
        }
        d.as_secs()
    };
    if secs > MAX_SECONDS {
        return Err(format!("at most {MAX_SECONDS}s"));
    }
    Ok(secs)
}

/// [`seconds`], at least 1.
///
/// # Errors
/// As [`seconds`], and 0.
pub fn positive_seconds(text: &str) -> Result<u64, String> {
    match seconds(text)? {
        0 => Err("an invocation runs at least 1s".into()),
        s => Ok(s),
    }
}

/// A whole percentage, 0 to 100: `10` or `10%`.
///
/// # Errors
/// Not a whole number, or above 100.
pub fn percent(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let digits = t.strip_suffix('%').unwrap_or(t).trim();
    match digits.parse::<u32>() {
        Ok(p) if p <= 100 => Ok(p),
        Ok(_) => Err("a percentage is at most 100".into()),
        Err(_) => Err("a whole percentage, 0 to 100 (10 or 10%)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_whole_seconds() {
        assert_eq!(seconds("7"), Ok(7));
        assert_eq!(seconds("7s"), Ok(7));
        assert_eq!(seconds("0"), Ok(0));
        assert_eq!(seconds("1m"), Ok(60));
        assert!(seconds("1.5s").unwrap_err().contains("whole seconds"));
        assert!(seconds("1.5").unwrap_err().contains("whole seconds"));
        assert!(seconds("500ms").unwrap_err().contains("whole seconds"));
        assert!(seconds("soon").is_err());
        assert!(seconds("").is_err());
        assert!(positive_seconds("0s").is_err());
    }

    #[test]
    fn percentages_are_whole_and_at_most_100() {
        assert_eq!(percent("10"), Ok(10));
        assert_eq!(percent("10%"), Ok(10));
        assert!(percent("101").is_err());
        assert!(percent("2.5").is_err());
    }

    #[test]
    fn the_defaults_are_the_opening_settings() {
        let cli = Cli::try_parse_from(["drainit-gate", "model"]).expect("no flags parse");
        let Command::Model(args) = cli.command else {
            panic!("model parses as Model")
        };
        assert_eq!(args.settings(), Settings::default());
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
