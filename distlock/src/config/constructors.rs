//! The public constructors of the serde-derived configs (Redis, etcd),
//! written once.

use crate::{Error, Result};

/// A config read from JSON or YAML, or [`Error::InvalidInput`] naming the
/// backend and the format with the parser's reason.
pub(crate) fn or_invalid_config<T, E: std::fmt::Display>(
    read: std::result::Result<T, E>,
    backend: &str,
    format: &str,
) -> Result<T> {
    read.map_err(|e| Error::invalid("config", format!("invalid {backend} config {format}: {e}")))
}

/// The constructors a serde-derived `Config` (Redis, etcd) shares, each
/// reaching the one field table or the type's serde fields, and its
/// [`FieldTable`](super::FieldTable) around the backend's `set_param` body (a `match` on the
/// parameter's one name). `$module` is the public module, `$env` its
/// `ENV_PREFIX`, `$holder` the field `holder_record` sets.
macro_rules! serde_config {
    (
        $name:literal, $module:literal, $env:literal, holder: $holder:ident,
        fn set_param(&mut $self:ident, $key:ident, $value:ident, $source:ident) $body:block
    ) => {
        impl $crate::config::FieldTable for Config {
            const BACKEND: &'static str = $name;
            const PARAMETERS: $crate::config::Table = PARAMETERS;

            /// The field table: `key` is a name of [`PARAMETERS`]. Empty
            /// text leaves an optional field unset. The parameters both
            /// backends have, by the same field names, are read here; the
            /// backend's `set_param` body reads the others.
            fn set_param(
                &mut $self,
                $key: &str,
                $value: &str,
                $source: $crate::config::Source<'_>,
            ) -> $crate::config::Checked {
                use $crate::config as c;
                match $key {
                    "username" => $self.username = c::optional_text($value),
                    "password" => $self.password = c::optional_password($value),
                    "tls" => $self.tls = c::parse($source, $value)?,
                    "key_prefix" => $self.key_prefix = $value.to_owned(),
                    "connect_timeout" => $self.connect_timeout = c::parse($source, $value)?,
                    "holder_record" => $self.$holder = c::parse($source, $value)?,
                    _ => $body,
                }
                Ok(())
            }
        }

        impl Config {
            #[doc = concat!("Reads the `", $env, "*` environment variables over the defaults:")]
            /// one per parameter, by its one name or an older one
            #[doc = concat!("(`", $env, "KEY_PREFIX` is `key_prefix`; the README's parameter")]
            /// table lists them). A set but empty optional value is unset;
            /// other variables with the prefix are ignored (other tools may
            /// share it). Values read as [`crate::config`] says.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) naming
            /// the variable whose value is malformed or not UTF-8.
            pub fn from_env() -> $crate::Result<Config> {
                Config::from_env_vars($crate::config::env_vars($env)?)
            }

            /// [`from_env`](Config::from_env) over the given `(name, value)`
            /// pairs instead of the process environment (for tests, or
            /// variables gathered elsewhere).
            ///
            /// ```
            #[doc = concat!("use distlock::", $module, "::Config;")]
            ///
            /// let config = Config::from_env_vars([
            #[doc = concat!("    (\"", $env, "KEY_PREFIX\", \"jobs:\"),")]
            ///     ("PATH", "/usr/bin"),
            /// ])?;
            /// assert_eq!(config.key_prefix, "jobs:");
            /// # Ok::<(), distlock::Error>(())
            /// ```
            ///
            /// # Errors
            ///
            /// As [`from_env`](Config::from_env).
            pub fn from_env_vars<I, K, V>(vars: I) -> $crate::Result<Config>
            where
                I: IntoIterator<Item = (K, V)>,
                K: AsRef<str>,
                V: Into<String>,
            {
                $crate::config::read_env($env, vars)
            }

            /// Sets the parameter `key` (its one name or an older spelling;
            /// see [`crate::config`] for the syntax of each kind of value)
            /// from text, as a URL parameter or variable would.
            ///
            /// ```
            /// use std::time::Duration;
            #[doc = concat!("use distlock::", $module, "::Config;")]
            ///
            /// let mut config = Config::default();
            /// config.set("connect_timeout", "5")?;
            /// config.set("holder", "off")?;
            /// assert_eq!(config.connect_timeout, Duration::from_secs(5));
            #[doc = concat!("assert!(!config.", stringify!($holder), ");")]
            /// # Ok::<(), distlock::Error>(())
            /// ```
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for an
            /// unknown parameter or a malformed value.
            pub fn set(&mut self, key: &str, value: &str) -> $crate::Result<()> {
                $crate::config::set_by_name(self, key, value)
            }

            /// Reads a JSON object with the fields of [`Config`] (all
            /// optional; camelCase or snake_case).
            ///
            /// ```
            #[doc = concat!("use distlock::", $module, "::Config;")]
            ///
            /// let config = Config::from_json(r#"{"keyPrefix": "jobs:"}"#)?;
            /// assert_eq!(config.key_prefix, "jobs:");
            /// # Ok::<(), distlock::Error>(())
            /// ```
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for
            /// malformed JSON, an unknown field or a malformed value.
            pub fn from_json(text: &str) -> $crate::Result<Config> {
                $crate::config::constructors::or_invalid_config(serde_json::from_str(text), $name, "JSON")
            }

            /// Reads a YAML mapping with the fields of [`Config`] (all
            /// optional).
            ///
            /// ```
            /// use std::time::Duration;
            #[doc = concat!("use distlock::", $module, "::Config;")]
            ///
            /// let config = Config::from_yaml("
            /// password: 'hunter2'
            /// connectTimeout: 2s
            /// ")?;
            /// assert_eq!(config.connect_timeout, Duration::from_secs(2));
            /// # Ok::<(), distlock::Error>(())
            /// ```
            ///
            /// # Errors
            ///
            /// As [`from_json`](Config::from_json), for YAML.
            pub fn from_yaml(text: &str) -> $crate::Result<Config> {
                $crate::config::constructors::or_invalid_config(serde_yaml_ng::from_str(text), $name, "YAML")
            }
        }
    };
}
pub(crate) use serde_config;
