//! Settings as data: one [`Setting`] per configurable value gives its file key,
//! its default, its validation into [`Config`], and its `--check-config` line. Its
//! flag and `DRAINIT_*` variable are the [`Cli`] field of the same name (clap reads
//! them; the flag is the key with dashes, the variable `DRAINIT_` + the key in
//! upper case), so adding a setting is one `Cli` field and one entry of
//! [`SETTINGS`].
//!
//! One path for every value: [`Resolver::given`] finds the value by precedence
//! (flag > environment > file > default) and hands it to the setting's `set` as
//! items, each with its [`Origin`]; a list from the command line, a comma-separated
//! `DRAINIT_*` list and a file's array are the same shape.
//!
//! The order of [`SETTINGS`] is the order of the file's keys (in the message for an
//! unknown key), of validation, and of `--check-config`'s lines.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use toml::Spanned;

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

/// One setting (DESIGN §8).
pub(super) struct Setting {
    /// The clap id and the file key (`snake_case`).
    pub key: &'static str,
    pub shape: Shape,
    /// The default as it would be written (a list comma-separated), validated
    /// like a given value.
    pub default: &'static str,
    /// A variable that also gives the value as plain milliseconds
    /// (`PRE_DRAIN_DELAY_MS`), ranked below `DRAINIT_*` and above the file.
    pub millis_env: Option<&'static str>,
    /// Validates the value into the configuration.
    pub set: fn(&mut Config, &Given<'_>) -> Result<(), ConfigError>,
    /// Writes the setting's `--check-config` line(s), if it has any.
    pub show: fn(&Config, &mut String),
}

/// A value as given: one item (a list: any number), each with where it came from.
/// An item is borrowed where it can be (a default, clap's value, the file's): the
/// settings are resolved at every start.
pub(super) struct Given<'a> {
    pub items: Vec<(Cow<'a, str>, Origin<'a>)>,
    /// Where the value as a whole came from (a list given empty is refused there).
    pub whole: Origin<'a>,
    pub env: &'a dyn Env,
}

impl Given<'_> {
    /// The one value, validated by `parse`; an error names its origin.
    pub fn one<T>(&self, parse: impl Fn(&str) -> Result<T, String>) -> Result<T, ConfigError> {
        let (v, origin) = self.items.first().expect("a scalar setting has one item");
        parse(v).map_err(|e| origin.error(&e))
    }

    /// Every item, validated by `parse`, in order.
    pub fn each<T>(
        &self,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Vec<T>, ConfigError> {
        self.items
            .iter()
            .map(|(v, origin)| parse(v).map_err(|e| origin.error(&e)))
            .collect()
    }

    /// The value is the built-in default (nothing was given).
    pub fn is_default(&self) -> bool {
        matches!(self.whole, Origin::Default)
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
fn show_nothing(_: &Config, _: &mut String) {}

/// Every setting, in the file's order (see the module comment).
pub(super) static SETTINGS: [Setting; 21] = [
    Setting {
        key: "probe_addr",
        shape: Shape::Text,
        default: "0.0.0.0:8079",
        millis_env: None,
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
        show: |c, s| {
            let probe = match &c.probe_addr {
                ProbeAddr::Off => "off".to_string(),
                ProbeAddr::Listen { addr, .. } => addr.to_string(),
            };
            line(s, "probe_addr", q(&probe));
        },
    },
    Setting {
        key: "pre_drain_delay",
        shape: Shape::Text,
        default: "5s",
        millis_env: Some("PRE_DRAIN_DELAY_MS"),
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
        show: |c, s| {
            if c.pre_drain_delay_rule == DelayRule::Explicit {
                show_dur(s, "pre_drain_delay", c.pre_drain_delay);
            } else {
                // Commented out: this text read back as a file would make it explicit.
                let _ = writeln!(
                    s,
                    "# pre_drain_delay = {}: {}",
                    q(&fmt_dur(c.pre_drain_delay)),
                    c.pre_drain_delay_note()
                );
            }
        },
    },
    Setting {
        key: "drain_timeout",
        shape: Shape::Text,
        default: "20s",
        millis_env: Some("DRAIN_TIMEOUT_MS"),
        set: |c, g| {
            c.drain_timeout = g.one(parse_duration)?;
            Ok(())
        },
        show: |c, s| show_dur(s, "drain_timeout", c.drain_timeout),
    },
    Setting {
        key: "grace_period",
        shape: Shape::Text,
        default: "30s",
        millis_env: None,
        set: |c, g| {
            c.grace_period = g.one(parse_duration)?;
            Ok(())
        },
        show: |c, s| show_dur(s, "grace_period", c.grace_period),
    },
    Setting {
        key: "strict_budget",
        shape: Shape::Switch,
        default: "false",
        millis_env: None,
        set: |c, g| {
            c.strict_budget = g.one(parse_bool)?;
            Ok(())
        },
        show: |c, s| line(s, "strict_budget", c.strict_budget),
    },
    Setting {
        key: "drain_signal",
        shape: Shape::List,
        default: "TERM,INT,QUIT",
        millis_env: None,
        set: |c, g| {
            if g.items.is_empty() {
                return Err(g.whole.error("at least one signal is needed"));
            }
            c.drain_signals = g.each(parse_drain_signal)?;
            Ok(())
        },
        show: |c, s| {
            let sigs = c.drain_signals.iter().map(Signal::to_string);
            line(s, "drain_signal", q_list(sigs));
        },
    },
    Setting {
        key: "second_signal",
        shape: Shape::Text,
        default: "skip",
        millis_env: None,
        set: |c, g| {
            c.second_signal = g.one(parse_second)?;
            Ok(())
        },
        show: |c, s| {
            let second = match c.second_signal {
                SecondSignal::Skip => "skip",
                SecondSignal::Ignore => "ignore",
            };
            line(s, "second_signal", q(second));
        },
    },
    Setting {
        key: "forward_to",
        shape: Shape::Text,
        default: "child",
        millis_env: None,
        set: |c, g| {
            c.forward_to = g.one(parse_forward)?;
            Ok(())
        },
        show: |c, s| {
            let fwd = match c.forward_to {
                ForwardTo::Child => "child",
                ForwardTo::Group => "group",
            };
            line(s, "forward_to", q(fwd));
        },
    },
    Setting {
        key: "rewrite",
        shape: Shape::List,
        default: "",
        millis_env: None,
        set: |c, g| {
            c.rewrite = rewrite_map(g)?;
            Ok(())
        },
        show: |c, s| {
            let pairs = c.rewrite.pairs().into_iter().map(|(a, b)| {
                if b.0 == 0 {
                    format!("{a}:0")
                } else {
                    format!("{a}:{b}")
                }
            });
            line(s, "rewrite", q_list(pairs));
        },
    },
    Setting {
        key: "ready_notify",
        shape: Shape::Switch,
        default: "false",
        millis_env: None,
        set: |c, g| {
            c.ready_notify = g.one(parse_bool)?;
            Ok(())
        },
        show: |c, s| line(s, "ready_notify", c.ready_notify),
    },
    Setting {
        key: "check_timeout",
        shape: Shape::Text,
        default: "1s",
        millis_env: None,
        set: |c, g| {
            c.check_timeout = g.one(parse_timeout)?;
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "ready_interval",
        shape: Shape::Text,
        default: "100ms",
        millis_env: None,
        set: |c, g| {
            c.ready_interval = g.one(parse_duration)?;
            if c.ready_interval.is_zero() {
                return Err(g.whole.error("must be greater than 0"));
            }
            Ok(())
        },
        show: |c, s| show_dur(s, "ready_interval", c.ready_interval),
    },
    Setting {
        key: "teardown_timeout",
        shape: Shape::Text,
        default: "5s",
        millis_env: None,
        set: |c, g| {
            c.teardown_timeout = g.one(parse_timeout)?;
            Ok(())
        },
        show: show_nothing,
    },
    Setting {
        key: "proxy",
        shape: Shape::Text,
        default: "",
        millis_env: None,
        set: |c, g| {
            if !g.is_default() {
                c.proxy = Some(g.one(parse_proxy)?);
                c.proxy_given_by = g.whole.given_by().unwrap_or_default();
            }
            Ok(())
        },
        show: |c, s| {
            if let Some(p) = &c.proxy {
                line(s, "proxy", q(&format!("{}={}", p.listen, p.upstream)));
            }
        },
    },
    Setting {
        key: "proxy_health",
        shape: Shape::Text,
        default: "",
        millis_env: None,
        set: |c, g| {
            if !g.is_default() {
                c.proxy_health = Some(g.one(parse_proxy_health)?);
            }
            Ok(())
        },
        show: |c, s| {
            if let Some(p) = &c.proxy_health {
                line(s, "proxy_health", q(p));
            }
        },
    },
    Setting {
        key: "stream_spread",
        shape: Shape::Text,
        default: "",
        millis_env: None,
        set: |c, g| {
            if !g.is_default() {
                c.stream_spread = Some(g.one(parse_duration)?);
            }
            Ok(())
        },
        show: |c, s| {
            if c.proxy.is_some() {
                show_dur(s, "stream_spread", c.stream_spread());
            }
        },
    },
    Setting {
        key: "proxy_threads",
        shape: Shape::Text,
        default: "auto",
        millis_env: None,
        set: |c, g| {
            c.proxy_threads = g.one(parse_proxy_threads)?;
            Ok(())
        },
        show: |c, s| {
            if c.proxy.is_some() {
                match c.proxy_threads {
                    Some(n) => line(s, "proxy_threads", q(&n.to_string())),
                    None => line(
                        s,
                        "proxy_threads",
                        format!("\"auto\"  # {} here", c.proxy_threads()),
                    ),
                }
            }
        },
    },
    Setting {
        key: "report_file",
        shape: Shape::Text,
        default: "",
        millis_env: None,
        set: |c, g| {
            // A missing directory is a fact of the system, not a typo in the
            // syntax: 78 even on the command line, like a taken probe port. Said
            // now, not at exit when the report is lost.
            let (v, origin) = &g.items[0];
            c.report_file = check_report_file(v).map_err(|e| origin.config_error(&e))?;
            Ok(())
        },
        show: |c, s| {
            if let Some(p) = &c.report_file {
                line(s, "report_file", q(&p.display().to_string()));
            }
        },
    },
    Setting {
        key: "user",
        shape: Shape::Text,
        default: "",
        millis_env: None,
        set: |c, g| {
            let (v, origin) = &g.items[0];
            if !g.is_default() {
                c.user = Some(resolve_user(v, origin)?);
            }
            Ok(())
        },
        show: |c, s| {
            if let Some(u) = &c.user {
                let groups: Vec<String> = u.groups.iter().map(u32::to_string).collect();
                let _ = writeln!(
                    s,
                    "user = {}  # uid {}, gid {}, groups {}, HOME={}",
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
        default: "text",
        millis_env: None,
        set: |c, g| {
            c.log_format = g.one(parse_format)?;
            Ok(())
        },
        show: |c, s| {
            let format = match c.log_format {
                LogFormat::Json => "json",
                LogFormat::Text => "text",
            };
            line(s, "log_format", q(format));
        },
    },
    Setting {
        key: "log_level",
        shape: Shape::Text,
        default: "info",
        millis_env: None,
        set: |c, g| {
            c.log_level = g.one(parse_level)?;
            Ok(())
        },
        show: |c, s| line(s, "log_level", q(&c.log_level.to_string().to_lowercase())),
    },
];

/// The file's keys that are tables (`[[check]]`, `[[teardown]]`), after the
/// settings'.
const TABLE_KEYS: [&str; 2] = ["check", "teardown"];

/// Every key the file may hold, in order: serde's "unknown field … expected one
/// of" lists them.
static FILE_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| SETTINGS.iter().map(|s| s.key).chain(TABLE_KEYS).collect());

/// The TOML file's contents (`--config`). Unknown keys are rejected; each value
/// is read with its position, for messages.
#[derive(Debug, Default)]
pub(super) struct FileConfig {
    values: HashMap<&'static str, FileValue>,
    pub check: Vec<Spanned<FileCheck>>,
    pub teardown: Vec<Spanned<FileTeardown>>,
}

/// A setting's value in the file, typed by its [`Shape`].
#[derive(Debug)]
enum FileValue {
    Text(Spanned<String>),
    Switch(Spanned<bool>),
    List(Spanned<Vec<Spanned<String>>>),
}

/// A `[[check]]` table.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileCheck {
    pub name: Option<String>,
    pub tcp: Option<Spanned<String>>,
    pub http: Option<Spanned<String>>,
    pub exec: Option<Vec<String>>,
    pub file: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
}

/// A `[[teardown]]` table.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTeardown {
    pub name: Option<String>,
    pub command: Vec<String>,
    pub timeout: Option<Spanned<String>>,
}

/// A file key, refused unless it is one of [`FILE_KEYS`] (as serde's
/// `deny_unknown_fields`, so the message and its position are serde's).
struct FileKey;

impl<'de> DeserializeSeed<'de> for FileKey {
    type Value = &'static str;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static str, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for FileKey {
    type Value = &'static str;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field identifier")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<&'static str, E> {
        FILE_KEYS
            .iter()
            .find(|k| **k == v)
            .copied()
            .ok_or_else(|| E::unknown_field(v, FILE_KEYS.as_slice()))
    }
}

impl<'de> Deserialize<'de> for FileConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("FileConfig", FILE_KEYS.as_slice(), FileVisitor)
    }
}

struct FileVisitor;

impl<'de> Visitor<'de> for FileVisitor {
    type Value = FileConfig;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct FileConfig")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FileConfig, A::Error> {
        let mut file = FileConfig::default();
        while let Some(key) = map.next_key_seed(FileKey)? {
            match key {
                "check" => file.check = map.next_value()?,
                "teardown" => file.teardown = map.next_value()?,
                _ => {
                    let value = match setting(key).shape {
                        Shape::Text => FileValue::Text(map.next_value()?),
                        Shape::Switch => FileValue::Switch(map.next_value()?),
                        Shape::List => FileValue::List(map.next_value()?),
                    };
                    file.values.insert(key, value);
                }
            }
        }
        Ok(file)
    }
}

/// The setting named `key`.
fn setting(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.key == key)
        .expect("a key of FILE_KEYS that is not a table names a setting")
}

/// Where the values are looked up, by precedence.
pub(super) struct Resolver<'a> {
    pub m: &'a ArgMatches,
    pub env: &'a dyn Env,
    pub file: FileConfig,
    /// The file's path as shown and its text, for positions in messages (empty
    /// without a file).
    pub path: String,
    pub text: String,
}

impl Resolver<'_> {
    /// The value of `s`: flag (or its clap-read variable) > `DRAINIT_*` list >
    /// plain-millisecond variable > file > default.
    ///
    /// # Errors
    /// A plain-millisecond variable that is no whole number, or too long, even when
    /// a flag overrides it.
    pub fn given(&self, s: &'static Setting) -> Result<Given<'_>, ConfigError> {
        let millis = match s.millis_env {
            Some(var) => self.millis(var)?,
            None => None,
        };
        let given = match s.shape {
            Shape::List => self.list(s.key),
            Shape::Text | Shape::Switch => self.scalar(s.key),
        };
        let items = given
            .or(millis)
            .or_else(|| self.in_file(s.key))
            .unwrap_or_else(|| self.default(s));
        Ok(items)
    }

    /// A scalar from the command line or its clap-read `DRAINIT_*` variable.
    fn scalar(&self, key: &'static str) -> Option<Given<'_>> {
        let v = self.m.get_one::<String>(key)?;
        let origin = match self.m.value_source(key) {
            Some(ValueSource::EnvVariable) => Origin::Env(env_name(key)),
            _ => Origin::Flag(flag_of(key)),
        };
        Some(self.one(Cow::Borrowed(v), origin))
    }

    /// A repeatable flag: the command line, else `DRAINIT_<FLAG>` split on
    /// commas (empty items dropped), else `None`.
    pub fn list(&self, key: &'static str) -> Option<Given<'_>> {
        let (items, whole): (Vec<Cow<'_, str>>, _) = match self.m.get_many::<String>(key) {
            Some(v) if self.m.value_source(key) == Some(ValueSource::CommandLine) => (
                v.map(|s| Cow::Borrowed(s.as_str())).collect(),
                Origin::Flag(flag_of(key)),
            ),
            _ => {
                let var = env_name(key);
                let v = self.env.get(&var)?;
                let items = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Cow::Owned(s.to_string()))
                    .collect();
                (items, Origin::Env(var))
            }
        };
        Some(Given {
            items: items.into_iter().map(|v| (v, whole.clone())).collect(),
            whole,
            env: self.env,
        })
    }

    /// A plain-milliseconds variable, as a duration in milliseconds.
    fn millis(&self, var: &'static str) -> Result<Option<Given<'_>>, ConfigError> {
        let Some(v) = self.env.get(var) else {
            return Ok(None);
        };
        let refuse = |why: String| {
            ConfigError::config(format!(
                "invalid value in environment variable {var}: {why}"
            ))
        };
        let n = v
            .trim()
            .parse::<u64>()
            .map_err(|_| refuse(format!("'{v}' is not a whole number of milliseconds")))?;
        at_most_max(Duration::from_millis(n))
            .map_err(|max| refuse(format!("'{v}' is too long: at most {max} (604800000)")))?;
        Ok(Some(self.one(
            Cow::Owned(format!("{n}ms")),
            Origin::Env(var.into()),
        )))
    }

    /// The file's value for `key`.
    fn in_file(&self, key: &'static str) -> Option<Given<'_>> {
        Some(match self.file.values.get(key)? {
            FileValue::Text(v) => self.one(Cow::Borrowed(v.get_ref()), self.at(key, v.span())),
            FileValue::Switch(v) => {
                let text = if *v.get_ref() { "true" } else { "false" };
                self.one(Cow::Borrowed(text), self.at(key, v.span()))
            }
            FileValue::List(list) => Given {
                items: list
                    .get_ref()
                    .iter()
                    .map(|v| (Cow::Borrowed(v.get_ref().as_str()), self.at(key, v.span())))
                    .collect(),
                whole: self.at(key, list.span()),
                env: self.env,
            },
        })
    }

    fn default(&self, s: &'static Setting) -> Given<'_> {
        match s.shape {
            Shape::List => Given {
                items: s
                    .default
                    .split(',')
                    .filter(|v| !v.is_empty())
                    .map(|v| (Cow::Borrowed(v), Origin::Default))
                    .collect(),
                whole: Origin::Default,
                env: self.env,
            },
            Shape::Text | Shape::Switch => self.one(Cow::Borrowed(s.default), Origin::Default),
        }
    }

    fn one<'a>(&'a self, v: Cow<'a, str>, origin: Origin<'a>) -> Given<'a> {
        Given {
            items: vec![(v, origin.clone())],
            whole: origin,
            env: self.env,
        }
    }

    /// The origin of a value in the file: `key` at `span`.
    pub fn at(&self, key: &'static str, span: std::ops::Range<usize>) -> Origin<'_> {
        Origin::File {
            path: &self.path,
            text: &self.text,
            key,
            span,
        }
    }

    /// An error about a whole `[[check]]` or `[[teardown]]` entry, at its position.
    pub fn entry_error(&self, span: std::ops::Range<usize>, msg: &str) -> ConfigError {
        let (line, col) = line_col(&self.text, span.start);
        ConfigError::config(format!("{}:{line}:{col}: {msg}", self.path))
    }
}

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
