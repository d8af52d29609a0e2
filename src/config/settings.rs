//! Settings as data: one [`Setting`] per configurable value, in [`SETTINGS`],
//! gives its flag and `DRAINIT_*` variable (the key with dashes, and `DRAINIT_` +
//! the key in upper case), its file key, its default, its `--help` line and its
//! line of the configuration reference (`docs/configuration.md`), its validation
//! into [`Config`], and its `--check-config` line. Adding a setting is one entry
//! (and the [`Config`] field it sets): [`command`] builds clap's arguments from
//! the table, [`FileConfig`] reads the file's keys from it, [`Resolver::given`]
//! finds each value by precedence, and [`reference()`] writes the reference's
//! table.
//!
//! One path for every value (`lookup.rs`): [`Resolver::given`] finds the value
//! by precedence (flag > environment > file > default) and hands it to the
//! setting's `set` as items, each with its [`Origin`]; a list from the command
//! line, a comma-separated `DRAINIT_*` list and a file's array are the same shape.
//!
//! The order of [`SETTINGS`] is the order of `--help`, of the file's keys (in the
//! message for an unknown key), of validation, and of `--check-config`'s lines.

use std::fmt::Write as _;
use std::time::Duration;

use clap::{Arg, ArgAction};

use super::*;

/// How a setting is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// One value: `--flag VALUE`, `DRAINIT_FLAG=VALUE`, a string in the file.
    Text,
    /// A switch: `--flag` or `--flag=BOOL`, `DRAINIT_FLAG=BOOL`, a boolean in the
    /// file.
    Switch,
    /// Repeatable: `--flag A --flag B`, `DRAINIT_FLAG=A,B`, an array of strings in
    /// the file. Given anywhere, it replaces the lower-ranked list as a whole.
    List,
}

/// Where a setting is in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InFile {
    /// A key named as the setting (`drain_timeout = "20s"`).
    Key,
    /// A field of the file's tables instead (`[[check]]`, `tcp`): the readiness
    /// checks and teardown steps, which the file gives as tables of their own
    /// (read by `file_checks` and `file_teardown`).
    Table(&'static str, &'static str),
}

/// One setting (docs/configuration.md).
pub(super) struct Setting {
    /// The clap id and the file key (`snake_case`); the flag and the variable are
    /// made from it ([`flag_of`], [`env_name`]).
    pub key: &'static str,
    pub shape: Shape,
    pub file: InFile,
    /// The value's name in `--help` (`DUR`).
    pub value_name: &'static str,
    /// The default as it would be written (a list comma-separated), validated
    /// like a given value; empty: none.
    pub default: &'static str,
    /// The default as `--help` and the reference say it, when the value alone would
    /// not say it (`half the drain timeout`).
    pub default_doc: Option<&'static str>,
    /// A variable that also gives the value as plain milliseconds
    /// (`PRE_DRAIN_DELAY_MS`), ranked below `DRAINIT_*` and above the file.
    pub millis_env: Option<&'static str>,
    /// Its line of `--help` (the default and, for a list, the variable are added).
    pub help: &'static str,
    /// Its meaning in the configuration reference, in full.
    pub doc: &'static str,
    /// Validates the value into the configuration.
    pub set: fn(&mut Draft, &Given<'_>) -> Result<(), ConfigError>,
    /// Writes the setting's `--check-config` line(s), if it has any, given the key.
    pub show: fn(&Config, &str, &mut String),
}

/// The configuration while [`SETTINGS`] set it: what the checks and teardown
/// steps given by flag or variable wait for (their timeouts, set later), and
/// whether they replace the file's tables.
pub(super) struct Draft {
    pub config: Config,
    /// The `--ready-*` checks, named; `None` when no `--ready-*` flag or
    /// variable was given (the file's `[[check]]` tables apply).
    pub flag_checks: Option<Vec<(String, CheckKind)>>,
    /// The `--teardown` steps' argvs; `None`: the file's `[[teardown]]` tables.
    pub flag_teardown: Option<Vec<Vec<String>>>,
    /// The `--drain-phase` phases; `None`: the file's `[[drain.phase]]` tables.
    pub flag_phases: Option<Vec<DrainPhase>>,
}

impl std::ops::Deref for Draft {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

impl std::ops::DerefMut for Draft {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.config
    }
}

impl Draft {
    /// The checks of one `--ready-*` flag, named `prefix` when it gives one and
    /// `prefix-1`, `prefix-2`, … when more.
    fn flag_checks(
        &mut self,
        g: &Given<'_>,
        prefix: &str,
        parse: impl Fn(&str) -> Result<CheckKind, String>,
    ) -> Result<(), ConfigError> {
        if g.is_default() {
            return Ok(());
        }
        let kinds = g.each(parse)?;
        let one = kinds.len() == 1;
        let checks = self.flag_checks.get_or_insert_with(Vec::new);
        for (i, kind) in kinds.into_iter().enumerate() {
            let name = if one {
                prefix.to_string()
            } else {
                format!("{prefix}-{}", i + 1)
            };
            checks.push((name, kind));
        }
        Ok(())
    }
}

impl Setting {
    /// The default as `--help` and the reference say it; `None`: none.
    fn default_shown(&self) -> Option<&'static str> {
        self.default_doc.or_else(|| {
            (self.shape == Shape::Text && !self.default.is_empty()).then_some(self.default)
        })
    }

    /// The clap argument: its flag, and for a scalar its variable, which clap
    /// reads (a list's variable is split by [`Resolver::list`]); with its help
    /// text (and default) when `with_help` (see `config::command_with`).
    pub(super) fn arg(&self, with_help: bool) -> Arg {
        // Built at every start: pieces pushed, no formatting machinery.
        let arg = Arg::new(self.key)
            .long(flag_of(self.key))
            .value_name(self.value_name)
            .value_parser(clap::builder::ValueParser::string());
        let arg = match self.shape {
            Shape::Text => arg.env(env_name(self.key)).action(ArgAction::Set),
            Shape::Switch => arg
                .env(env_name(self.key))
                .action(ArgAction::Set)
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true"),
            Shape::List => arg.action(ArgAction::Append),
        };
        if !with_help {
            return arg;
        }
        let mut help = String::with_capacity(self.help.len() + 64);
        help.push_str(self.help);
        if let Some(d) = self.default_shown() {
            help.push_str(" [default: ");
            help.push_str(d);
            help.push(']');
        }
        if self.shape == Shape::List {
            help.push_str(" [env: ");
            help.push_str(&env_name(self.key));
            help.push(']');
        }
        arg.help(help)
    }
}

/// `key = value`, a line of `--check-config`.
fn line(s: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = writeln!(s, "{key} = {value}");
}

/// A TOML string (`"5s"`).
pub(super) fn q(v: &str) -> String {
    format!("{v:?}")
}

/// A TOML array of strings (`["a", "b"]`).
pub(super) fn q_list<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<String> = items.into_iter().map(|v| q(v.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// A duration exactly, in humantime's form (`1m 30s`, `500us`, `0s`).
pub(super) fn fmt_dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A duration setting's line (`drain_timeout = "20s"`).
fn show_dur(s: &mut String, key: &str, d: Duration) {
    line(s, key, q(&fmt_dur(d)));
}

/// Shown on the checks and teardown steps it is the default of, not on its own.
fn show_nothing(_: &Config, _: &str, _: &mut String) {}

/// The table of the configuration reference (`docs/configuration.md`), in
/// Markdown: one row per argument of [`command`], in `--help`'s order, with its
/// flag, variable(s), file key, default and meaning; a setting's row is made from
/// its entry of [`SETTINGS`].
pub(super) fn reference() -> String {
    let code = |v: &str| format!("`{}`", v.replace('|', "\\|"));
    let mut t = String::from(
        "| flag | env | file key | default | meaning |\n|---|---|---|---|---|\n\
         | `drainit [FLAGS] [--] CMD [ARGS…]` | | | | the command to run and its arguments; \
         `--` is needed only when CMD starts with `-` |\n",
    );
    for a in super::command()
        .get_arguments()
        .filter(|a| !a.is_positional())
    {
        let id = a.get_id().as_str();
        let mut flag = format!("--{}", a.get_long().unwrap_or(id));
        // A switch (`--strict-budget`) is shown bare, as it is mostly given.
        if let Some(name) = a.get_value_names().and_then(|n| n.first())
            && a.get_num_args().is_none_or(|n| n.min_values() > 0)
        {
            let _ = write!(flag, " {name}");
        }
        let (env, file, default, meaning) = match SETTINGS.iter().find(|s| s.key == id) {
            Some(s) => {
                let mut env = code(&env_name(s.key));
                if let Some(var) = s.millis_env {
                    let _ = write!(env, ", {}", code(var));
                }
                let file = match s.file {
                    InFile::Key => code(s.key),
                    InFile::Table(table, field) => format!("{} in {}", code(field), code(table)),
                };
                let default = match (s.default_doc, s.shape) {
                    (Some(d), _) => d.to_string(),
                    (None, Shape::Switch) => "off".to_string(),
                    (None, _) if s.default.is_empty() => "none".to_string(),
                    (None, _) => code(s.default),
                };
                (env, file, default, s.doc.replace('|', "\\|"))
            }
            None => {
                let env = a.get_env().map(|e| code(&e.to_string_lossy()));
                let help = a.get_help().map(ToString::to_string).unwrap_or_default();
                (env.unwrap_or_default(), String::new(), String::new(), help)
            }
        };
        let _ = writeln!(
            t,
            "| {} | {env} | {file} | {default} | {meaning} |",
            code(&flag)
        );
    }
    t.push_str("| `--version`, `--help` | | | | `--help` shows examples |\n");
    t
}

/// Every setting, in the order of `--help`, of the file's keys (in the message
/// for an unknown key), of validation, and of `--check-config`'s lines.
pub(super) static SETTINGS: [Setting; 29] = [
    Setting {
        key: "probe_addr",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "ADDR",
        default: "0.0.0.0:8079",
        default_doc: None,
        millis_env: None,
        help: "Probe server address (/healthz, /readyz, /metrics), or `off`",
        doc: "probe server address, or `off`; the port is 1-65535 (`:0`, a port the kernel \
            would pick and nobody be told, is refused: 64, or 78 from the environment or \
            file)",
        set: |c, g| {
            c.probe_addr = match g.one(parse_probe_addr)? {
                None => ProbeAddr::Off,
                // Given by the user: a bind failure is then fatal (78).
                Some(addr) => ProbeAddr::Listen {
                    addr,
                    given_by: g.whole.given_by(),
                },
            };
            Ok(())
        },
        show: |c, k, s| {
            let probe = match &c.probe_addr {
                ProbeAddr::Off => "off".to_string(),
                ProbeAddr::Listen { addr, .. } => addr.to_string(),
            };
            line(s, k, q(&probe));
        },
    },
    Setting {
        key: "platform",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "NAME",
        default: "auto",
        default_doc: None,
        millis_env: None,
        help: "Where drainit runs, for the default grace period: auto (detected), kubernetes, \
            docker, podman, systemd or none",
        doc: "where drainit runs, for the default grace period (`docs/drain-phases.md`): `auto` detects Kubernetes \
            (`KUBERNETES_SERVICE_HOST`, 30s), Podman (`/run/.containerenv`, 10s), Docker \
            (`/.dockerenv`, 10s), systemd (`INVOCATION_ID` or `NOTIFY_SOCKET`, 90s), else \
            none (30s); on a detected platform the defaults of the pre-drain delay, phase \
            budget and drain timeout that were not given shrink to fit its grace period",
        set: |c, g| {
            let (platform, why) = match g.one(Platform::parse)? {
                Some(p) => (p, "as configured".to_string()),
                None => {
                    let (p, why) = Platform::detect(g.env);
                    (p, format!("detected: {why}"))
                }
            };
            c.platform = platform;
            c.platform_why = why;
            c.platform_given = !g.is_default();
            Ok(())
        },
        show: |c, k, s| {
            if c.platform_given {
                line(s, k, q(c.platform.as_str()));
            } else {
                let _ = writeln!(s, "# {k} = {}: {}", q(c.platform.as_str()), c.platform_why);
            }
        },
    },
    Setting {
        key: "pre_drain_delay",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "5s",
        default_doc: Some("5s in Kubernetes or once /readyz was asked, else 0"),
        millis_env: Some("PRE_DRAIN_DELAY_MS"),
        help: "Beat 2: keep serving this long after the drain signal",
        doc: "beat 2 (README, \"How a drain goes\"); `--check-config` shows the default \
            commented out, with its rule",
        set: |c, g| {
            c.pre_drain_delay = g.one(parse_duration)?;
            c.pre_drain_delay_rule = if !g.is_default() {
                DelayRule::Explicit
            } else if g
                .env
                .get("KUBERNETES_SERVICE_HOST")
                .is_some_and(|v| !v.trim().is_empty())
            {
                DelayRule::Kubernetes
            } else {
                // `Unroutable` instead when nothing could ask (decided in
                // `resolve`, once the probe and proxy settings are known).
                DelayRule::WhenRouted
            };
            Ok(())
        },
        show: |c, k, s| {
            if c.pre_drain_delay_rule == DelayRule::Explicit {
                show_dur(s, k, c.pre_drain_delay);
            } else {
                // Commented out: this text read back as a file would make it explicit.
                let _ = writeln!(
                    s,
                    "# {k} = {}: {}",
                    q(&fmt_dur(c.pre_drain_delay)),
                    c.pre_drain_delay_note()
                );
            }
        },
    },
    Setting {
        key: "drain_timeout",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "20s",
        default_doc: None,
        millis_env: Some("DRAIN_TIMEOUT_MS"),
        help: "Beat 3: how long descendants get after the forward before SIGKILL",
        doc: "beat 3",
        set: |c, g| {
            c.drain_timeout = g.one(parse_duration)?;
            c.drain_timeout_given = !g.is_default();
            Ok(())
        },
        show: |c, k, s| {
            if c.fitted && !c.drain_timeout_given {
                let _ = writeln!(
                    s,
                    "# {k} = {}: default, fitted to the grace period",
                    q(&fmt_dur(c.drain_timeout))
                );
            } else {
                show_dur(s, k, c.drain_timeout);
            }
        },
    },
    Setting {
        key: "grace_period",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "",
        default_doc: Some(
            "the platform's: 30s in Kubernetes or none detected, 10s in Docker or Podman, 90s under systemd",
        ),
        millis_env: None,
        help: "The platform's wait before SIGKILL (Kubernetes terminationGracePeriodSeconds), \
            for the budget check",
        doc: "the platform's wait before SIGKILL (Kubernetes \
            `terminationGracePeriodSeconds`, `docker stop -t`), for the budget check; \
            by default the platform's (see `--platform`)",
        set: |c, g| {
            if g.is_default() {
                c.grace_period = c.platform.grace_period();
            } else {
                c.grace_period = g.one(parse_duration)?;
                c.grace_period_given = true;
            }
            Ok(())
        },
        show: |c, k, s| {
            if c.grace_period_given || c.platform == Platform::Unknown {
                show_dur(s, k, c.grace_period);
            } else {
                let _ = writeln!(
                    s,
                    "# {k} = {}: {}'s default",
                    q(&fmt_dur(c.grace_period)),
                    c.platform.as_str()
                );
            }
        },
    },
    Setting {
        key: "strict_budget",
        shape: Shape::Switch,
        file: InFile::Key,
        value_name: "BOOL",
        default: "false",
        default_doc: None,
        millis_env: None,
        help: "Refuse to start (exit 78) when delay + timeout + teardown does not fit the \
            grace period",
        doc: "refuse to start (78) when the budget does not fit (a switch; \
            `--strict-budget=false` turns off what the environment or file turned on; the \
            variable and `--strict-budget=` take `true`/`false`, also `1`/`0`, `yes`/`no`, \
            `on`/`off`, in any case; empty is `false`)",
        set: |c, g| {
            c.strict_budget = g.one(parse_bool)?;
            Ok(())
        },
        show: |c, k, s| line(s, k, c.strict_budget),
    },
    Setting {
        key: "drain_signal",
        shape: Shape::List,
        file: InFile::Key,
        value_name: "SIG",
        default: "TERM,INT,QUIT",
        default_doc: None,
        millis_env: None,
        help: "A signal that starts a drain (repeatable; replaces the default TERM, INT, \
            QUIT)",
        doc: "signals that start a drain (repeatable; replaces the default set)",
        set: |c, g| {
            if g.items.is_empty() {
                return Err(g.whole.error("at least one signal is needed"));
            }
            c.drain_signals = g.each(parse_drain_signal)?;
            Ok(())
        },
        show: |c, k, s| {
            let sigs = c.drain_signals.iter().map(Signal::to_string);
            line(s, k, q_list(sigs));
        },
    },
    Setting {
        key: "second_signal",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "skip|ignore",
        default: "skip",
        default_doc: None,
        millis_env: None,
        help: "What a second drain signal does: skip (cut the pending wait short) or ignore",
        doc: "what a second drain signal does",
        set: |c, g| {
            c.second_signal = g.one(parse_second)?;
            Ok(())
        },
        show: |c, k, s| {
            let second = match c.second_signal {
                SecondSignal::Skip => "skip",
                SecondSignal::Ignore => "ignore",
            };
            line(s, k, q(second));
        },
    },
    Setting {
        key: "forward_to",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "child|group",
        default: "child",
        default_doc: None,
        millis_env: None,
        help: "Who receives forwarded signals: the main child, or its process group",
        doc: "who gets forwarded signals: the main child (pre-fork servers such as nginx, \
            gunicorn, puma expect only their master to be signalled) or its process group",
        set: |c, g| {
            c.forward_to = g.one(parse_forward)?;
            Ok(())
        },
        show: |c, k, s| {
            let fwd = match c.forward_to {
                ForwardTo::Child => "child",
                ForwardTo::Group => "group",
            };
            line(s, k, q(fwd));
        },
    },
    Setting {
        key: "rewrite",
        shape: Shape::List,
        file: InFile::Key,
        value_name: "FROM:TO",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Rewrite a forwarded signal, e.g. TERM:QUIT; TO may be 0 to drop it \
            (repeatable)",
        doc: "rewrite a forwarded signal (the drain signal at beat 3 too), e.g. `TERM:QUIT` \
            for nginx; `TO` = `0` drops it; `FROM` must be a signal drainit receives (not \
            KILL or STOP), once",
        set: |c, g| {
            c.rewrite = rewrite_map(g)?;
            Ok(())
        },
        show: |c, k, s| {
            let pairs = c.rewrite.pairs().into_iter().map(|(a, b)| {
                if b.0 == 0 {
                    format!("{a}:0")
                } else {
                    format!("{a}:{b}")
                }
            });
            line(s, k, q_list(pairs));
        },
    },
    Setting {
        key: "ready_tcp",
        shape: Shape::List,
        file: InFile::Table("[[check]]", "tcp"),
        value_name: "ADDR",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Readiness check: a TCP connection to ADDR is accepted (repeatable)",
        doc: "check: a TCP connection is accepted; `IP:PORT`, `[IPv6]:PORT` or \
            `localhost:PORT` (see below)",
        set: |c, g| c.flag_checks(g, "tcp", |v| parse_tcp_target(v).map(CheckKind::Tcp)),
        show: show_nothing,
    },
    Setting {
        key: "ready_http",
        shape: Shape::List,
        file: InFile::Table("[[check]]", "http"),
        value_name: "URL",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Readiness check: GET URL answers 200-399 (repeatable)",
        doc: "check: `GET URL` answers 200–399; `http://` with the same hosts as \
            `--ready-tcp`",
        set: |c, g| c.flag_checks(g, "http", |v| parse_http_target(v).map(CheckKind::Http)),
        show: show_nothing,
    },
    Setting {
        key: "ready_exec",
        shape: Shape::List,
        file: InFile::Table("[[check]]", "exec"),
        value_name: "CMD",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Readiness check: the command (shell words, run without a shell) exits 0 \
            (repeatable)",
        doc: "check: the command (shell words, run without a shell, output discarded) exits \
            0; it runs in a process group of its own, and what it leaves running there \
            when it exits (`sh -c 'x & exit 0'`) or times out is SIGKILLed, so a check's \
            leftovers are never counted, drained or reported abandoned as the app's work",
        set: |c, g| c.flag_checks(g, "exec", |v| parse_words(v).map(CheckKind::Exec)),
        show: show_nothing,
    },
    Setting {
        key: "ready_file",
        shape: Shape::List,
        file: InFile::Table("[[check]]", "file"),
        value_name: "PATH",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Readiness check: PATH exists (repeatable)",
        doc: "check: the path exists",
        set: |c, g| c.flag_checks(g, "file", |v| parse_path(v).map(CheckKind::File)),
        show: show_nothing,
    },
    Setting {
        key: "ready_notify",
        shape: Shape::Switch,
        file: InFile::Key,
        value_name: "BOOL",
        default: "false",
        default_doc: None,
        millis_env: None,
        help: "Readiness through NOTIFY_SOCKET: the app sends READY=1 (systemd's sd_notify \
            protocol)",
        doc: "readiness through `NOTIFY_SOCKET` (`READY=1`, systemd's protocol); a switch \
            like `--strict-budget`",
        set: |c, g| {
            c.ready_notify = g.one(parse_bool)?;
            Ok(())
        },
        show: |c, k, s| line(s, k, c.ready_notify),
    },
    Setting {
        key: "check_timeout",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "1s",
        default_doc: None,
        millis_env: None,
        help: "Timeout of each readiness check",
        doc: "timeout of each check; greater than 0 (as a `[[check]]`'s `timeout`): `0s` is \
            refused at start (64, or 78 from the environment or file)",
        set: |c, g| {
            c.check_timeout = g.one(parse_timeout)?;
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "ready_interval",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "100ms",
        default_doc: None,
        millis_env: None,
        help: "How often checks are polled while starting",
        doc: "how often checks are polled while starting",
        set: |c, g| {
            c.ready_interval = g.one(parse_duration)?;
            if c.ready_interval.is_zero() {
                return Err(g.whole.error("must be greater than 0"));
            }
            Ok(())
        },
        show: |c, k, s| show_dur(s, k, c.ready_interval),
    },
    Setting {
        key: "teardown",
        shape: Shape::List,
        file: InFile::Table("[[teardown]]", "command"),
        value_name: "CMD",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "A teardown step (shell words, run without a shell) after the drain \
            (repeatable, run in order)",
        doc: "a teardown step (shell words; repeatable, run in order after the drain). A \
            program not found at start gets a warning then; the step fails only when it \
            runs",
        set: |c, g| {
            if !g.is_default() {
                c.flag_teardown = Some(g.each(parse_words)?);
            }
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "teardown_timeout",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "5s",
        default_doc: None,
        millis_env: None,
        help: "Timeout of each teardown step",
        doc: "timeout of each teardown step; greater than 0 (as a `[[teardown]]`'s \
            `timeout`): `0s`, which would time every step out at exit, is refused at start",
        set: |c, g| {
            c.teardown_timeout = g.one(parse_timeout)?;
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "drain_phase",
        shape: Shape::List,
        file: InFile::Table("[[drain.phase]]", "command"),
        value_name: "NAME=CMD",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "A drain phase: CMD (shell words, run without a shell) runs after the pre-drain \
            delay, before the forward (repeatable, run in order)",
        doc: "a drain phase (`docs/drain-phases.md`): `NAME=CMD`, CMD in shell words as \
            `--teardown`'s, run after the pre-drain delay while the app still serves, in \
            order, on the shared `--phase-budget`; the file's `[[drain.phase]]` tables \
            (`name`, `command` or `post = \"URL\"`, `max`) give more",
        set: |c, g| {
            if !g.is_default() {
                c.flag_phases = Some(g.each(parse_flag_phase)?);
            }
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "phase_budget",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "",
        default_doc: Some("the sum of the phases' `max` when each has one, else 10s"),
        millis_env: None,
        help: "The drain phases' shared budget",
        doc: "the drain phases' shared budget: each phase may take `min(max, budget left)`",
        set: |c, g| {
            if !g.is_default() {
                c.phase_budget = g.one(parse_duration)?;
                c.phase_budget_given = true;
            }
            Ok(())
        },
        show: |c, k, s| {
            if c.phases.is_empty() {
            } else if c.phase_budget_given {
                show_dur(s, k, c.phase_budget);
            } else {
                let _ = writeln!(s, "# {k} = {}: default", q(&fmt_dur(c.phase_budget)));
            }
        },
    },
    Setting {
        key: "proxy",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "LISTEN=UPSTREAM",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Admission proxy: listen on LISTEN, pass requests to the app at UPSTREAM (each \
            IP:PORT, an IPv6 address in brackets, or localhost:PORT), and keep a request \
            ledger",
        doc: "the admission proxy (`docs/proxy.md`): listen on `LISTEN`, pass \
            requests to the app at `UPSTREAM`; both `IP:PORT`, `[IPv6]:PORT` or \
            `localhost:PORT`; `LISTEN` is bound before the child starts (taken: 78); an \
            `UPSTREAM` the listener itself covers (the same address, or the same port on \
            an IPv4 loopback address behind a `0.0.0.0` listener or on either loopback \
            behind a dual-stack `[::]` one; a wildcard `UPSTREAM` means its family's \
            loopback) is refused, since every request would loop back to drainit; the \
            other family's loopback (`0.0.0.0:8080=[::1]:8080`) is another socket and is \
            accepted",
        set: |c, g| {
            if !g.is_default() {
                c.proxy = Some(g.one(parse_proxy)?);
                c.proxy_given_by = g.whole.given_by().unwrap_or_default();
            }
            Ok(())
        },
        show: |c, k, s| {
            if let Some(p) = &c.proxy {
                line(s, k, q(&format!("{}={}", p.listen, p.upstream)));
            }
        },
    },
    Setting {
        key: "proxy_health",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "PATH",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "With --proxy: requests for exactly PATH on the proxy port are answered by \
            drainit from its readiness (200, or 503 from the drain signal), never sent to \
            the app",
        doc: "with `--proxy`: `GET`/`HEAD` of exactly `PATH` on the proxy port is answered \
            by drainit from its readiness (200 `ready`, 503 before ready and from the \
            drain signal), never sent to the app; without `--proxy`: 64",
        set: |c, g| {
            if !g.is_default() {
                c.proxy_health = Some(g.one(parse_proxy_health)?);
            }
            Ok(())
        },
        show: |c, k, s| {
            if let Some(p) = &c.proxy_health {
                line(s, k, q(p));
            }
        },
    },
    Setting {
        key: "stream_spread",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "DUR",
        default: "",
        default_doc: Some("half the drain timeout"),
        millis_env: None,
        help: "With --proxy: at beat 3, close open WebSockets and event streams evenly over \
            DUR (0: all at once)",
        doc: "with `--proxy`: at beat 3, open WebSockets and event streams are closed evenly \
            over DUR (`0s`: all at once; at most the drain timeout)",
        set: |c, g| {
            if !g.is_default() {
                c.stream_spread = Some(g.one(parse_duration)?);
            }
            Ok(())
        },
        show: |c, k, s| {
            if c.proxy.is_some() {
                show_dur(s, k, c.stream_spread());
            }
        },
    },
    Setting {
        key: "proxy_threads",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "N",
        default: "auto",
        default_doc: None,
        millis_env: None,
        help: "With --proxy: threads that serve the proxy, 1-64, or auto: half the CPUs \
            drainit may use (affinity and cgroup CPU quota), at least 1, at most 4",
        doc: "with `--proxy`: how many threads serve the proxy, `1`–`64`, or `auto`: half \
            the CPUs drainit may run on (its affinity mask and a cgroup CPU quota, as \
            Rust's `available_parallelism` reads them; the app needs the rest), at least \
            1, at most 4; in the file a string (`proxy_threads = \"2\"`); `--check-config` \
            shows what `auto` gives; without `--proxy`: 64; threads the OS refuses (a pids \
            limit: `RLIMIT_NPROC`, the cgroup's `pids.max`): 1 with a message naming them, \
            before the child starts",
        set: |c, g| {
            c.proxy_threads = g.one(parse_proxy_threads)?;
            Ok(())
        },
        show: |c, k, s| {
            if c.proxy.is_some() {
                match c.proxy_threads {
                    Some(n) => line(s, k, q(&n.to_string())),
                    None => line(s, k, format!("\"auto\"  # {} here", c.proxy_threads())),
                }
            }
        },
    },
    Setting {
        key: "report_file",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "PATH",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Also write the exit report (JSON) to PATH (atomically when a regular file; its \
            directory must exist)",
        doc: "also write the exit report there (temp file + rename; written in place when \
            PATH is a device, fifo, bind-mounted file such as `/dev/termination-log`, or a \
            symlink owned by drainit's own user; a symlink owned by anyone else, such as \
            one an app run with `--user` planted, is replaced, never followed; the \
            temporary file is created exclusively, never through a planted name), and \
            partial reports (`\"final\":false`) at T0 and at the forward; its directory \
            must exist, and PATH must name a file (not a directory, no trailing `/`, `.` \
            or `..`, a last component of at most 255 bytes, the whole at most 4095) at \
            start (78), so the report is never lost at exit to a path the kernel refuses; \
            a name of 255 bytes works, the temporary file's name is shortened to fit)",
        set: |c, g| {
            // A missing directory is a fact of the system, not a typo in the
            // syntax: 78 even on the command line, like a taken probe port. Said
            // now, not at exit when the report is lost.
            let (v, origin) = &g.items[0];
            c.report_file = check_report_file(v).map_err(|e| origin.config_error(&e))?;
            Ok(())
        },
        show: |c, k, s| {
            if let Some(p) = &c.report_file {
                line(s, k, q(&p.display().to_string()));
            }
        },
    },
    Setting {
        key: "user",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "USER[:GROUP]",
        default: "",
        default_doc: None,
        millis_env: None,
        help: "Run the command as USER[:GROUP] (names from the image's /etc/passwd and \
            /etc/group, or numbers); drainit itself keeps its own ids",
        doc: "run the command as this user (see `--user` below)",
        set: |c, g| {
            let (v, origin) = &g.items[0];
            if !g.is_default() {
                c.user = Some(resolve_user(v, origin)?);
            }
            Ok(())
        },
        show: |c, k, s| {
            if let Some(u) = &c.user {
                let groups: Vec<String> = u.groups.iter().map(u32::to_string).collect();
                let _ = writeln!(
                    s,
                    "{k} = {}  # uid {}, gid {}, groups {}, HOME={}",
                    q(&u.spec),
                    u.uid,
                    u.gid,
                    groups.join(","),
                    u.home
                );
            }
        },
    },
    Setting {
        key: "log_format",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "text|json",
        default: "text",
        default_doc: None,
        millis_env: None,
        help: "Format of drainit's own log lines on stderr: text or json",
        doc: "drainit's own log lines on stderr, JSON ones with a `ts` (`docs/logs.md`; when \
            nobody reads stderr, lines are dropped and counted rather than stall drainit; \
            the exit report waits at most 2 s for it)",
        set: |c, g| {
            c.log_format = g.one(parse_format)?;
            Ok(())
        },
        show: |c, k, s| {
            let format = match c.log_format {
                LogFormat::Json => "json",
                LogFormat::Text => "text",
            };
            line(s, k, q(format));
        },
    },
    Setting {
        key: "log_level",
        shape: Shape::Text,
        file: InFile::Key,
        value_name: "LEVEL",
        default: "info",
        default_doc: None,
        millis_env: None,
        help: "error, warn, info, debug or off",
        doc: "`error`, `warn`, `info`, `debug`, `off`",
        set: |c, g| {
            c.log_level = g.one(parse_level)?;
            Ok(())
        },
        show: |c, k, s| line(s, k, q(&c.log_level.to_string().to_lowercase())),
    },
];

/// The flag of a clap id: the same with dashes (`pre_drain_delay` →
/// `pre-drain-delay`).
pub(super) fn flag_of(key: &str) -> String {
    key.replace('_', "-")
}

/// The `DRAINIT_*` variable of a clap id (one allocation: start-up builds one
/// per list setting).
pub(super) fn env_name(key: &str) -> String {
    let mut name = String::with_capacity("DRAINIT_".len() + key.len());
    name.push_str("DRAINIT_");
    name.push_str(key);
    name.make_ascii_uppercase();
    name
}
