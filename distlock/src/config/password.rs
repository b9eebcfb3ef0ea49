//! The [`Password`] that never prints, and durations in JSON and YAML.

use std::fmt;

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
    ///
    /// ```
    /// use distlock::config::Password;
    ///
    /// let password = Password::new("hunter2");
    /// assert_eq!(password.expose(), "hunter2");
    /// assert_eq!(format!("{password:?}"), "\"***\"");
    /// ```
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

/// Durations in JSON and YAML: written as text (`"1s"`, `"250ms"`), read
/// from text or from a bare number of seconds (`5`), as every other source
/// reads them (see the [module docs](super)).
pub(crate) mod duration_text {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    use crate::config::Parse;

    pub(crate) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*value))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationVisitor)
    }

    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(<Duration as Parse>::EXPECTED)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            Duration::parse_text(text.trim()).ok_or_else(|| {
                E::custom(format!("{text:?} is not {}", <Duration as Parse>::EXPECTED))
            })
        }

        fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(seconds))
        }

        fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Duration, E> {
            u64::try_from(seconds)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(format!("{seconds} is not a duration: it is negative")))
        }

        fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Duration, E> {
            Duration::try_from_secs_f64(seconds)
                .map_err(|_| E::custom(format!("{seconds} is not a duration in seconds")))
        }
    }
}
