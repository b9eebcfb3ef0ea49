//! Pieces every backend's `Config` shares: the [`Password`] that never
//! prints, durations as text, and the small parsers of URL and environment
//! values.

use std::fmt;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A password: shown as `***` by `Debug`, so it never reaches logs through a
/// `{:?}` of the config. Read it with [`expose`](Password::expose).
///
/// In JSON and YAML it is a string (in YAML an unquoted `password: 0123` is
/// read as the text written). A value of another type, such as a JSON number,
/// is rejected without echoing it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    /// The password itself. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl From<String> for Password {
    fn from(password: String) -> Self {
        Password(password)
    }
}

impl From<&str> for Password {
    fn from(password: &str) -> Self {
        Password(password.to_owned())
    }
}

impl Serialize for Password {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        // The format's own type error would quote the offending value: the
        // password itself.
        String::deserialize(deserializer)
            .map(Password)
            .map_err(|_| {
                serde::de::Error::custom("the password must be a string (quote it in YAML)")
            })
    }
}

/// Durations as human-readable text (`"1s"`, `"250ms"`).
pub(crate) mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*value))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not a duration like \"500ms\": {e}"))
        })
    }
}

pub(crate) fn parse_duration(name: &str, value: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("{name} {value:?} is not a duration like \"500ms\": {e}"))
}

pub(crate) fn parse_bool(value: &str) -> std::result::Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(format!("{value:?} is not a boolean (true/false)")),
    }
}

/// Percent-decodes a URL's user name or password; `None` if empty.
pub(crate) fn decoded(text: &str) -> std::result::Result<Option<String>, &'static str> {
    let text = percent_decode_str(text)
        .decode_utf8()
        .map_err(|_| "not UTF-8 after percent-decoding")?;
    Ok(Some(text.into_owned()).filter(|t| !t.is_empty()))
}
