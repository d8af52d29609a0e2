//! How a setting's value is found: [`Resolver::given`] looks it up by precedence
//! (flag > `DRAINIT_*` variable > plain-millisecond variable > config file >
//! default) and hands it to the setting's `set` as a [`Given`]: its items, each
//! with its [`Origin`] for messages. The config file is read here ([`FileConfig`]):
//! its keys are the settings' (from the table), its tables the checks' and
//! teardown steps'.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use super::settings::{InFile, SETTINGS, Setting, Shape, env_name, flag_of};
use super::*;

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

/// The file's keys that are tables (`[[check]]`, `[[teardown]]`), after the
/// settings'.
const TABLE_KEYS: [&str; 3] = ["check", "teardown", "drain"];

/// Every key the file may hold, in order: serde's "unknown field … expected one
/// of" lists them.
static FILE_KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let keys = SETTINGS.iter().filter(|s| s.file == InFile::Key);
    keys.map(|s| s.key).chain(TABLE_KEYS).collect()
});

/// The TOML file's contents (`--config`). Unknown keys are rejected; each value
/// is read with its position, for messages.
#[derive(Debug, Default)]
pub(super) struct FileConfig {
    values: HashMap<&'static str, FileValue>,
    pub check: Vec<Spanned<FileCheck>>,
    pub teardown: Vec<Spanned<FileTeardown>>,
    pub drain: Option<FileDrain>,
}

impl FileConfig {
    /// The `[[drain.phase]]` tables, in order.
    pub fn phases(&self) -> &[Spanned<FilePhase>] {
        self.drain.as_ref().map_or(&[], |d| d.phase.as_slice())
    }
}

/// The file's `[drain]` table: its `[[drain.phase]]` tables.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDrain {
    #[serde(default)]
    pub phase: Vec<Spanned<FilePhase>>,
}

/// A `[[drain.phase]]` table.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePhase {
    pub name: String,
    pub command: Option<Vec<String>>,
    pub post: Option<Spanned<String>>,
    pub max: Option<Spanned<String>>,
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
                "drain" => file.drain = Some(map.next_value()?),
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
