//! Where a setting was read from, the one parser per kind of value, and the
//! table of a backend's parameters that every source is checked against.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::{Error, Result};

/// Where a value was read from: errors name it, so a user can find the
/// text to fix.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A URL query parameter, by the name written.
    Url(&'a str),
    /// An environment variable, by its full name.
    Env(&'a str),
    /// A JSON or YAML field, by the name written.
    Field(&'a str),
}

impl fmt::Display for Source<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Url(name) => write!(f, "URL parameter `{name}`"),
            Source::Env(name) => write!(f, "variable `{name}`"),
            Source::Field(name) => write!(f, "field `{name}`"),
        }
    }
}

/// A kind of value, read from text the same way from every source (see the
/// [module docs](super) for the syntax of each).
pub(crate) trait Parse: Sized {
    /// What a valid value looks like, for errors.
    const EXPECTED: &'static str;

    /// The value, or `None` if `text` is not one.
    fn parse_text(text: &str) -> Option<Self>;
}

/// A value read from text, or why not (naming the parameter and its
/// source): what the field tables return, made an [`Error`] by their caller.
pub(crate) type Checked<T = ()> = std::result::Result<T, String>;

/// Reads `text` as a `T`; the error names the source and what was expected.
pub(crate) fn parse<T: Parse>(source: Source<'_>, text: &str) -> Checked<T> {
    T::parse_text(text.trim()).ok_or_else(|| expected(source, text, T::EXPECTED))
}

fn expected(source: Source<'_>, text: &str, what: &str) -> String {
    format!("{source}: {text:?} is not {what}")
}

impl Parse for bool {
    const EXPECTED: &'static str = "a boolean (true/false, 1/0, yes/no, on/off)";

    fn parse_text(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" | "" => Some(false),
            _ => None,
        }
    }
}

impl Parse for Duration {
    const EXPECTED: &'static str = "a duration like 500ms, 5s or 1m30s (a bare number is seconds)";

    fn parse_text(text: &str) -> Option<Self> {
        parse_duration_with(text, Duration::from_secs)
    }
}

/// A duration whose bare number is read with `bare` (libpq's parameters
/// keep libpq's unit: see the [module docs](super)); units as everywhere.
pub(crate) fn parse_duration_bare(
    source: Source<'_>,
    text: &str,
    bare: fn(u64) -> Duration,
    bare_unit: &str,
) -> Checked<Duration> {
    parse_duration_with(text.trim(), bare).ok_or_else(|| {
        let what = format!("a duration like 500ms or 5s (a bare number is {bare_unit} here)");
        expected(source, text, &what)
    })
}

fn parse_duration_with(text: &str, bare: fn(u64) -> Duration) -> Option<Duration> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok().map(bare);
    }
    humantime::parse_duration(text).ok()
}

macro_rules! parse_integer {
    ($($t:ty),*) => {$(
        impl Parse for $t {
            const EXPECTED: &'static str = "a number (a non-negative integer)";

            fn parse_text(text: &str) -> Option<Self> {
                text.parse().ok()
            }
        }
    )*};
}
parse_integer!(u32, u64, usize);

impl Parse for i64 {
    const EXPECTED: &'static str = "a number (an integer)";

    fn parse_text(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

impl Parse for PathBuf {
    const EXPECTED: &'static str = "a file path";

    fn parse_text(text: &str) -> Option<Self> {
        Some(PathBuf::from(text))
    }
}

/// One parameter of a backend's field table: its one name, the older
/// spellings still accepted, and whether a URL's query may set it (the
/// others come from the URL's user, host or path, or only from variables
/// and files).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Param {
    pub(crate) name: &'static str,
    pub(crate) aliases: &'static [&'static str],
    pub(crate) in_url: bool,
}

impl Param {
    /// A parameter a URL's query may set.
    pub(crate) const fn url(name: &'static str, aliases: &'static [&'static str]) -> Param {
        Param {
            name,
            aliases,
            in_url: true,
        }
    }

    /// A parameter only variables and files set.
    pub(crate) const fn other(name: &'static str, aliases: &'static [&'static str]) -> Param {
        Param {
            name,
            aliases,
            in_url: false,
        }
    }
}

/// The parameters several backends share, by one name and the same older
/// spellings everywhere: the vocabulary of the [module docs](super) and of
/// [`serde_config!`](super::serde_config), written once.
impl Param {
    pub(crate) const USERNAME: Param = Param::other("username", &[]);
    pub(crate) const PASSWORD: Param = Param::other("password", &[]);
    pub(crate) const TLS: Param = Param::other("tls", &[]);
    pub(crate) const KEY_PREFIX: Param = Param::url("key_prefix", &["prefix"]);
    pub(crate) const CONNECT_TIMEOUT: Param = Param::url("connect_timeout", &[]);
    pub(crate) const HOLDER_RECORD: Param =
        Param::url("holder_record", &["holder", "record_holder"]);
}

/// A backend's field table: every parameter its sources may set, in
/// parts (the SQL backends share one part, [`SQL_PARAMETERS`](super::SQL_PARAMETERS)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table(pub(crate) &'static [&'static [Param]]);

impl Table {
    /// Every parameter, part after part.
    pub(crate) fn params(&self) -> impl Iterator<Item = &'static Param> {
        self.0.iter().copied().flatten()
    }

    /// The parameter `key` names (by its name or an alias), in any source.
    pub(crate) fn find(&self, key: &str) -> Option<&'static Param> {
        self.params()
            .find(|p| p.name == key || p.aliases.contains(&key))
    }

    /// The one name of the URL parameter `key` names; `None` if a URL's
    /// query cannot set it.
    pub(crate) fn find_in_url(&self, key: &str) -> Option<&'static str> {
        self.find(key).filter(|p| p.in_url).map(|p| p.name)
    }

    /// The URL parameters, with their aliases, for "unknown parameter"
    /// errors.
    pub(crate) fn url_names(&self) -> String {
        let mut names = Vec::new();
        for param in self.params().filter(|p| p.in_url) {
            if param.aliases.is_empty() {
                names.push(param.name.to_owned());
            } else {
                names.push(format!("{} (or {})", param.name, param.aliases.join(", ")));
            }
        }
        names.join(", ")
    }

    /// The reason for URL parameter `name`, which neither this table nor
    /// the client library (`driver`: the parameters the backend passes on
    /// to it, listed after distlock's) reads: the name, then every name a
    /// URL may use; `note` follows the list.
    pub(crate) fn unknown_in_url(&self, name: &str, driver: &[&str], note: &str) -> String {
        let mut known = self.url_names();
        for param in driver {
            known.push_str(", ");
            known.push_str(param);
        }
        format!("unknown parameter {name:?}; known: {known}{note}")
    }

    /// The parameter of environment variable `name` (`<prefix>KEY_NAME` is
    /// `key_name`), as one name; `None` for variables of other backends
    /// and for names this table does not know (other tools may share the
    /// prefix).
    pub(crate) fn find_env(&self, prefix: &str, name: &str) -> Option<&'static str> {
        let key = name.strip_prefix(prefix)?.to_ascii_lowercase();
        self.find(&key).map(|p| p.name)
    }
}

/// A `Config` read through a field table: what the shared readers of
/// variables and of single settings need from it.
pub(crate) trait FieldTable: Default {
    /// The backend's name in messages (`Redis`).
    const BACKEND: &'static str;
    /// Its parameters.
    const PARAMETERS: Table;

    /// Sets `key` (a name of [`PARAMETERS`](Self::PARAMETERS)) from text.
    fn set_param(&mut self, key: &str, value: &str, source: Source<'_>) -> Checked;
}

/// Sets each URL query parameter through `C`'s field table. A parameter
/// must be one a URL may set (by its one name or an alias) and one
/// `allowed` accepts; `note` follows the list of known names in the error.
///
/// # Errors
///
/// The reason, naming the parameter, for an unknown one or a malformed
/// value.
pub(crate) fn set_url_query<'q, C: FieldTable>(
    config: &mut C,
    query: impl IntoIterator<Item = (Cow<'q, str>, Cow<'q, str>)>,
    allowed: impl Fn(&str) -> bool,
    note: &str,
) -> Checked {
    for (name, value) in query {
        let key = C::PARAMETERS
            .find_in_url(&name)
            .filter(|key| allowed(key))
            .ok_or_else(|| C::PARAMETERS.unknown_in_url(&name, &[], note))?;
        config.set_param(key, &value, Source::Url(&name))?;
    }
    Ok(())
}

/// Fails naming the first of `durations` that is zero: timeouts and
/// intervals must be positive.
pub(crate) fn check_positive(durations: &[(&str, Duration)]) -> Checked {
    match durations.iter().find(|(_, value)| value.is_zero()) {
        Some((name, _)) => Err(format!("{name} is zero; it must be positive")),
        None => Ok(()),
    }
}

/// Text for an optional field: trimmed, `None` if empty (a set but empty
/// variable unsets the field).
pub(crate) fn optional_text(value: &str) -> Option<String> {
    Some(value.trim().to_owned()).filter(|v| !v.is_empty())
}

/// A password for an optional field, as written (never trimmed: spaces may
/// be part of it); `None` if empty.
pub(crate) fn optional_password(value: &str) -> Option<super::Password> {
    Some(value)
        .filter(|v| !v.is_empty())
        .map(super::Password::new)
}

/// The defaults, with each variable of `vars` that starts with `prefix` and
/// names a parameter read over them (`<prefix>KEY_NAME` is `key_name`).
///
/// # Errors
///
/// [`Error::InvalidInput`] naming the variable whose value is malformed.
pub(crate) fn read_env<C, I, K, V>(prefix: &str, vars: I) -> Result<C>
where
    C: FieldTable,
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    let mut config = C::default();
    for (name, value) in vars {
        let name = name.as_ref();
        if let Some(key) = C::PARAMETERS.find_env(prefix, name) {
            let value: String = value.into();
            config
                .set_param(key, &value, Source::Env(name))
                .map_err(|reason| Error::invalid("config", reason))?;
        }
    }
    Ok(config)
}

/// Sets the parameter `key` names (its one name or an alias) from text.
///
/// # Errors
///
/// [`Error::InvalidInput`] for an unknown parameter or a malformed value.
pub(crate) fn set_by_name<C: FieldTable>(config: &mut C, key: &str, value: &str) -> Result<()> {
    let param = C::PARAMETERS.find(key).ok_or_else(|| {
        Error::invalid(
            "config",
            format!("unknown {} parameter {key:?}", C::BACKEND),
        )
    })?;
    config
        .set_param(param.name, value, Source::Field(key))
        .map_err(|reason| Error::invalid("config", reason))
}

/// The process's variables that start with `prefix`: what every
/// `from_env` reads.
///
/// # Errors
///
/// [`Error::InvalidInput`] naming a variable whose value is not UTF-8.
pub(crate) fn env_vars(prefix: &str) -> Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with(prefix)) else {
            continue;
        };
        let value = value.into_string().map_err(|_| {
            Error::invalid(
                "config",
                format!("environment variable {name} is not UTF-8"),
            )
        })?;
        vars.push((name.to_owned(), value));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_bare_seconds() {
        let source = Source::Url("query_timeout");
        for (text, want) in [
            ("5", Duration::from_secs(5)),
            ("5s", Duration::from_secs(5)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            (" 2m ", Duration::from_secs(120)),
        ] {
            assert_eq!(parse::<Duration>(source, text), Ok(want), "{text}");
        }
        let err = parse::<Duration>(source, "soon").unwrap_err();
        assert!(err.contains("URL parameter `query_timeout`"), "{err}");
        assert!(err.contains("not a duration"), "{err}");
        let millis = parse_duration_bare(source, "2500", Duration::from_millis, "milliseconds");
        assert_eq!(millis, Ok(Duration::from_millis(2500)));
        let err = parse_duration_bare(source, "x", Duration::from_millis, "milliseconds");
        assert!(err.unwrap_err().contains("milliseconds here"));
    }

    #[test]
    fn booleans_and_numbers_have_one_syntax() {
        let source = Source::Env("DISTLOCK_X_TLS");
        for text in ["1", "true", "YES", "on"] {
            assert_eq!(parse::<bool>(source, text), Ok(true), "{text}");
        }
        for text in ["0", "false", "No", "off", ""] {
            assert_eq!(parse::<bool>(source, text), Ok(false), "{text}");
        }
        let err = parse::<bool>(source, "maybe").unwrap_err();
        assert!(err.contains("variable `DISTLOCK_X_TLS`") && err.contains("not a boolean"));
        assert_eq!(parse::<usize>(Source::Field("sessions"), "8"), Ok(8));
        let err = parse::<usize>(Source::Field("sessions"), "-1").unwrap_err();
        assert!(err.contains("field `sessions`") && err.contains("not a number"));
    }

    #[test]
    fn tables_resolve_aliases_and_env_names() {
        const TABLE: Table = Table(&[&[
            Param::url("holder_record", &["holder", "record_holder"]),
            Param::other("password", &[]),
        ]]);
        assert_eq!(TABLE.find_in_url("holder"), Some("holder_record"));
        assert_eq!(TABLE.find_in_url("password"), None);
        assert_eq!(
            TABLE.find_env("DISTLOCK_X_", "DISTLOCK_X_RECORD_HOLDER"),
            Some("holder_record")
        );
        assert_eq!(TABLE.find_env("DISTLOCK_X_", "DISTLOCK_Y_HOLDER"), None);
        assert_eq!(
            TABLE.url_names(),
            "holder_record (or holder, record_holder)"
        );
    }
}
