//! The public struct, field table and constructors of the serde-derived
//! configs (Redis, etcd, ZooKeeper), written once.

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

/// A serde-derived `Config` and its `Default`, from its fields in order,
/// each with its docs and default. The fields every backend names alike are
/// written as their bare name (`username, password`, `key_prefix`, `tls`,
/// `connect_timeout`, `holder_record`), and the list of servers as
/// `hosts name`: their type, default, JSON and YAML names and older
/// spellings are the ones below, the same on every backend (the defaults of
/// `key_prefix` and `connect_timeout` are the module's `DEFAULT_KEY_PREFIX`
/// and `DEFAULT_CONNECT_TIMEOUT`). Any other field is
/// `pub name: Type = default,` after its attributes.
macro_rules! config_struct {
    ($(#[$attr:meta])* pub struct Config { $($fields:tt)* }) => {
        $crate::config::config_struct!(@field [$(#[$attr])*] [] [] $($fields)*);
    };
    // A field: its declaration and its default, then the fields after it.
    (@push $attrs:tt [$($decl:tt)*] [$($init:tt)*] [$($field:tt)*] [$($value:tt)*] $($rest:tt)*) => {
        $crate::config::config_struct!(@field $attrs [$($decl)* $($field)*,] [$($init)* $($value)*,] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $user_doc:expr])* username,
        $(#[doc = $password_doc:expr])* password, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $user_doc])*
            #[serde(skip_serializing_if = "Option::is_none")]
            pub username: Option<String>,
            $(#[doc = $password_doc])*
            #[serde(skip_serializing_if = "Option::is_none")]
            pub password: Option<$crate::config::Password>
        ] [username: None, password: None] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $doc:expr])* key_prefix, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $doc])*
            #[serde(alias = "key_prefix", alias = "prefix")]
            pub key_prefix: String
        ] [key_prefix: DEFAULT_KEY_PREFIX.to_owned()] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $doc:expr])* hosts $name:ident, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $doc])* pub $name: Vec<String>
        ] [$name: Vec::new()] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $doc:expr])* tls, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $doc])* pub tls: bool
        ] [tls: false] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $doc:expr])* connect_timeout, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $doc])*
            #[serde(alias = "connect_timeout", with = "crate::config::duration_text")]
            pub connect_timeout: std::time::Duration
        ] [connect_timeout: DEFAULT_CONNECT_TIMEOUT] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt $(#[doc = $doc:expr])* holder_record, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[doc = $doc])*
            #[serde(
                alias = "holder_record",
                alias = "holder",
                alias = "recordHolder",
                alias = "record_holder"
            )]
            pub holder_record: bool
        ] [holder_record: true] $($rest)*);
    };
    (@field $attrs:tt $decl:tt $init:tt
        $(#[$field_attr:meta])* pub $name:ident: $ty:ty = $default:expr, $($rest:tt)*) => {
        $crate::config::config_struct!(@push $attrs $decl $init [
            $(#[$field_attr])* pub $name: $ty
        ] [$name: $default] $($rest)*);
    };
    (@field [$($attr:tt)*] [$($decl:tt)*] [$($init:tt)*]) => {
        $($attr)*
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(default, deny_unknown_fields, rename_all = "camelCase")]
        pub struct Config {
            $($decl)*
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $($init)* }
            }
        }
    };
}
pub(crate) use config_struct;

/// The constructors a serde-derived `Config` (Redis, etcd, ZooKeeper)
/// shares, each reaching the one field table or the type's serde fields, its
/// [`FieldTable`](super::FieldTable) and its
/// [`HostList`](super::HostList). `$module` is the public module, `$env`
/// its `ENV_PREFIX`, `$holder` the field `holder_record` sets, `$hosts` the
/// list of servers, `positive` the timeouts that must be positive. The
/// field table reads the parameters every backend shares, then each field
/// by its kind: `parse` through [`Parse`](super::Parse), `text` an optional
/// text, `path` an optional file; the `set_param` body reads the others.
macro_rules! serde_config {
    (
        $name:literal, $module:literal, $env:literal, holder: $holder:ident, hosts: $hosts:ident,
        positive: [$($positive:ident),*], parse: [$($parsed:ident),*],
        $(text: [$($text:ident),*],)? $(path: [$($path:ident),*],)?
        fn set_param(&mut $self:ident, $key:ident, $value:ident, $source:ident) $body:block
    ) => {
        /// Environment variables read by [`Config::from_env`] start with this.
        pub const ENV_PREFIX: &str = $env;

        impl $crate::config::FieldTable for Config {
            const BACKEND: &'static str = $name;
            const PARAMETERS: $crate::config::Table = PARAMETERS;

            /// The field table: `key` is a name of [`PARAMETERS`]. Empty
            /// text leaves an optional field unset.
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
                    stringify!($hosts) => $self.$hosts = c::split_list($value),
                    $(stringify!($parsed) => $self.$parsed = c::parse($source, $value)?,)*
                    $($(stringify!($text) => $self.$text = c::optional_text($value),)*)?
                    $($(stringify!($path) => {
                        $self.$path = c::optional_text($value).map(std::path::PathBuf::from)
                    })*)?
                    _ => $body,
                }
                Ok(())
            }
        }

        impl $crate::config::HostList for Config {
            const LIST: &'static str = stringify!($hosts);
            const ENV_PREFIX: &'static str = ENV_PREFIX;

            fn hosts(&self) -> &[String] {
                &self.$hosts
            }

            fn username(&self) -> Option<&str> {
                self.username.as_deref()
            }

            fn password(&self) -> Option<&$crate::config::Password> {
                self.password.as_ref()
            }

            fn timeouts(&self) -> Vec<(&'static str, std::time::Duration)> {
                vec![$((stringify!($positive), self.$positive)),*]
            }

            fn set_hosts(
                &mut self,
                username: Option<String>,
                password: Option<$crate::config::Password>,
                hosts: Vec<String>,
            ) {
                self.username = username;
                self.password = password;
                self.$hosts = hosts;
            }

            #[cfg(test)]
            fn shared(&self) -> $crate::config::Shared {
                $crate::config::Shared {
                    username: self.username.clone(),
                    password: self.password.clone(),
                    key_prefix: self.key_prefix.clone(),
                    tls: self.tls,
                    connect_timeout: self.connect_timeout,
                    holder_record: self.$holder,
                }
            }
        }

        #[cfg(test)]
        impl $crate::config::Sources for Config {
            fn url(url: &str) -> $crate::Result<Config> {
                Config::from_url(url)
            }

            fn env(vars: Vec<(String, String)>) -> $crate::Result<Config> {
                Config::from_env_vars(vars)
            }

            fn json(text: &str) -> $crate::Result<Config> {
                Config::from_json(text)
            }

            fn yaml(text: &str) -> $crate::Result<Config> {
                Config::from_yaml(text)
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
