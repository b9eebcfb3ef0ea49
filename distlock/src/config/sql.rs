//! The sources of a SQL backend's settings (Postgres, MySQL): a connection
//! URL, a password, and the backend's own parameters, read from the URL's
//! query, `DISTLOCK_<BACKEND>_*` variables, JSON or YAML through one field
//! table. The backend's builder reads the result; this file only gathers
//! and checks the text, once for both backends.

use std::fmt;
use std::marker::PhantomData;

use super::{
    camel_to_snake, decode, optional_password, redact, Password, Settings, Source, Table,
    YamlSettings,
};
use crate::{Error, Result};

/// What a SQL backend tells the shared reader about itself.
pub(crate) trait SqlBackend {
    /// The backend's name in messages (`Postgres`).
    const NAME: &'static str;
    /// The URL schemes it reads (`postgres`, `postgresql`).
    const SCHEMES: &'static [&'static str];
    /// The prefix of its variables (`DISTLOCK_POSTGRES_`).
    const ENV_PREFIX: &'static str;
    /// Its own parameters (not the URL's user, host, database or password).
    const PARAMETERS: Table;
    /// Whether URL parameters it does not know are the driver's (Postgres
    /// passes them to tokio-postgres) rather than mistakes.
    const PASSES_ON_UNKNOWN: bool;

    /// Checks `value` for the parameter `key` (its one name) as the
    /// builder will read it.
    fn check(key: &'static str, value: &str, source: Source<'_>)
        -> std::result::Result<(), String>;
}

/// A connection URL, a password, and the backend's own parameters as
/// checked text, in the order they were set (a later one wins).
pub(crate) struct SqlConfig<B> {
    url: Option<String>,
    password: Option<Password>,
    settings: Vec<(&'static str, String)>,
    backend: PhantomData<fn() -> B>,
}

impl<B> Clone for SqlConfig<B> {
    fn clone(&self) -> Self {
        SqlConfig {
            url: self.url.clone(),
            password: self.password.clone(),
            settings: self.settings.clone(),
            backend: PhantomData,
        }
    }
}

impl<B> PartialEq for SqlConfig<B> {
    fn eq(&self, other: &Self) -> bool {
        (&self.url, &self.password, &self.settings)
            == (&other.url, &other.password, &other.settings)
    }
}

impl<B> fmt::Debug for SqlConfig<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.url.as_deref().map(redact))
            .field("password", &self.password)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<B> Default for SqlConfig<B> {
    fn default() -> Self {
        SqlConfig {
            url: None,
            password: None,
            settings: Vec::new(),
            backend: PhantomData,
        }
    }
}

impl<B: SqlBackend> SqlConfig<B> {
    /// Reads a URL: the backend's own query parameters are taken out and
    /// checked; the others stay in the URL for the driver, or are refused.
    pub(crate) fn from_url(url: &str) -> Result<Self> {
        let bad = |reason: String| Error::invalid("url", reason);
        let schemes = B::SCHEMES
            .iter()
            .map(|scheme| format!("{scheme}://"))
            .collect::<Vec<_>>()
            .join(" or ");
        match url.split_once("://") {
            Some((scheme, _)) if B::SCHEMES.contains(&scheme) => {}
            Some((scheme, _)) => {
                return Err(bad(format!(
                    "{scheme}:// is not a {} URL; use {schemes}",
                    B::NAME
                )))
            }
            None => return Err(bad(format!("a {} URL starts with {schemes}", B::NAME))),
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut config = SqlConfig::default();
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name).map_err(|e| bad(format!("a parameter's name is {e}")))?;
            let value = decode(value).map_err(|e| bad(format!("parameter {name:?} is {e}")))?;
            match B::PARAMETERS.find_in_url(&name) {
                Some(key) => config
                    .set_param(key, &value, Source::Url(&name))
                    .map_err(bad)?,
                None if B::PASSES_ON_UNKNOWN => passed_on.push(pair),
                None => {
                    return Err(bad(format!(
                        "unknown parameter {name:?}; distlock's {} URLs take {}",
                        B::NAME,
                        B::PARAMETERS.url_names()
                    )))
                }
            }
        }
        config.url = Some(if passed_on.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed_on.join("&"))
        });
        Ok(config)
    }

    /// Reads `<ENV_PREFIX>URL`, `<ENV_PREFIX>PASSWORD` and the parameters
    /// (`<ENV_PREFIX>QUERY_TIMEOUT` is `query_timeout`); other variables
    /// are ignored. A URL's own query parameters are read first, the
    /// variables over them.
    pub(crate) fn from_env_vars<I, K, V>(vars: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let mut url = None;
        let mut rest = Vec::new();
        for (name, value) in vars {
            let name = name.as_ref();
            match name.strip_prefix(B::ENV_PREFIX) {
                Some("URL") => url = Some(value.into()),
                Some(_) => rest.push((name.to_owned(), value.into())),
                None => {}
            }
        }
        let mut config = match url {
            Some(url) => Self::from_url(&url)?,
            None => SqlConfig::default(),
        };
        for (name, value) in rest {
            if name.strip_prefix(B::ENV_PREFIX) == Some("PASSWORD") {
                config.password = optional_password(&value);
            } else if let Some(key) = B::PARAMETERS.find_env(B::ENV_PREFIX, &name) {
                config
                    .set_param(key, &value, Source::Env(&name))
                    .map_err(|reason| Error::invalid("config", reason))?;
            }
        }
        Ok(config)
    }

    /// Reads a JSON object: `url`, `password` and the parameters, in
    /// snake_case or camelCase; unknown fields are refused.
    pub(crate) fn from_json(text: &str) -> Result<Self> {
        let fields = serde_json::from_str::<Settings>(text)
            .map(|s| s.0)
            .map_err(|e| e.to_string());
        Self::from_fields(fields, "JSON")
    }

    /// Reads a YAML mapping with the fields [`from_json`](Self::from_json)
    /// reads.
    pub(crate) fn from_yaml(text: &str) -> Result<Self> {
        let fields = serde_yaml_ng::from_str::<YamlSettings>(text)
            .map(|s| s.0)
            .map_err(|e| e.to_string());
        Self::from_fields(fields, "YAML")
    }

    fn from_fields(
        fields: std::result::Result<Vec<(String, String)>, String>,
        format: &str,
    ) -> Result<Self> {
        let bad = |reason: String| {
            Error::invalid(
                "config",
                format!("invalid {} config {format}: {reason}", B::NAME),
            )
        };
        let fields = fields.map_err(bad)?;
        let mut url = None;
        let mut rest = Vec::new();
        for (name, value) in fields {
            match camel_to_snake(&name).as_str() {
                "url" => url = Some(value),
                _ => rest.push((name, value)),
            }
        }
        let mut config = match url {
            Some(url) => Self::from_url(&url).map_err(|e| bad(e.to_string()))?,
            None => SqlConfig::default(),
        };
        for (name, value) in rest {
            let snake = camel_to_snake(&name);
            if snake == "password" {
                config.password = Some(Password::new(value));
                continue;
            }
            let key = B::PARAMETERS
                .find(&snake)
                .ok_or_else(|| bad(format!("unknown field {name:?}")))?
                .name;
            config
                .set_param(key, &value, Source::Field(&name))
                .map_err(bad)?;
        }
        Ok(config)
    }

    /// Sets parameter `key` (a name or alias of the table) from text.
    pub(crate) fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let param = B::PARAMETERS.find(key).ok_or_else(|| {
            Error::invalid("config", format!("unknown {} parameter {key:?}", B::NAME))
        })?;
        self.set_param(param.name, value, Source::Field(key))
            .map_err(|reason| Error::invalid("config", reason))
    }

    fn set_param(
        &mut self,
        key: &'static str,
        value: &str,
        source: Source<'_>,
    ) -> std::result::Result<(), String> {
        B::check(key, value, source)?;
        self.settings.push((key, value.to_owned()));
        Ok(())
    }

    /// The connection URL (the driver's parameters still in its query).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] if no source named one.
    pub(crate) fn url(&self) -> Result<&str> {
        self.url.as_deref().ok_or_else(|| {
            Error::invalid(
                "config",
                format!("no {} URL: set `url` (or {}URL)", B::NAME, B::ENV_PREFIX),
            )
        })
    }

    /// The password given apart from the URL, if any.
    pub(crate) fn password(&self) -> Option<&Password> {
        self.password.as_ref()
    }

    /// The parameters, by their one name, in the order set.
    pub(crate) fn settings(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.settings
            .iter()
            .map(|(key, value)| (*key, value.as_str()))
    }
}

/// The reason of an [`Error::InvalidInput`] (the whole message otherwise),
/// for a field table that reports text.
pub(crate) fn reason(error: Error) -> String {
    match error {
        Error::InvalidInput { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// A SQL backend's public `Config`: a newtype over [`SqlConfig`] with the
/// constructors every backend shares, documented for the backend, and the
/// [`SqlBackend`] description of it (`PARAMETERS` is the invoking module's
/// table; `check` reads one value as the builder will). The backend adds
/// `builder()`.
macro_rules! sql_config {
    (
        $(#[$meta:meta])*
        backend: $backend:ident($name:literal, $env:literal, [$($scheme:literal),+]),
        unknown_parameters_go_to_the_driver: $passes_on:literal,
        check: $check:expr $(,)?
    ) => {
        /// The backend as the shared SQL configuration reader sees it.
        pub(crate) struct $backend;

        impl $crate::config::SqlBackend for $backend {
            const NAME: &'static str = $name;
            const SCHEMES: &'static [&'static str] = &[$($scheme),+];
            const ENV_PREFIX: &'static str = $env;
            // The invoking module's table (macro_rules resolves item paths
            // where it is invoked).
            const PARAMETERS: $crate::config::Table = PARAMETERS;
            const PASSES_ON_UNKNOWN: bool = $passes_on;

            fn check(
                key: &'static str,
                value: &str,
                source: $crate::config::Source<'_>,
            ) -> ::std::result::Result<(), String> {
                let check: fn(&'static str, &str, $crate::config::Source<'_>)
                    -> ::std::result::Result<(), String> = $check;
                check(key, value, source)
            }
        }

        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config($crate::config::SqlConfig<$backend>);

        impl Config {
            #[doc = concat!("Reads a ", $("`", $scheme, "://` ",)+ "URL: distlock's")]
            /// parameters are read and checked now (see the field table in
            /// the module docs; durations as [`crate::config`] says); any
            /// others are left to the driver, or refused if it takes none.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) (`what:
            /// "url"`) for another scheme, an unknown or malformed
            /// parameter; never showing the password.
            pub fn from_url(url: &str) -> $crate::Result<Config> {
                $crate::config::SqlConfig::from_url(url).map(Config)
            }

            #[doc = concat!("Reads `", $env, "URL` (the connection, with any parameters), `",
                $env, "PASSWORD` (over the URL's), and a variable per parameter (`",
                $env, "QUERY_TIMEOUT`, ...; over the URL's, by their one name or an older one).")]
            /// Other variables with the prefix are ignored.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) naming
            /// the variable whose value is malformed.
            pub fn from_env() -> $crate::Result<Config> {
                Config::from_env_vars($crate::config::env_vars($env)?)
            }

            /// [`from_env`](Self::from_env) over the given `(name, value)`
            /// pairs instead of the process environment.
            ///
            /// # Errors
            ///
            /// As [`from_env`](Self::from_env).
            pub fn from_env_vars<I, K, V>(vars: I) -> $crate::Result<Config>
            where
                I: IntoIterator<Item = (K, V)>,
                K: AsRef<str>,
                V: Into<String>,
            {
                $crate::config::SqlConfig::from_env_vars(vars).map(Config)
            }

            /// Reads a JSON object: `url`, `password` and the parameters
            /// (snake_case or camelCase; numbers, booleans or text).
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for
            /// malformed JSON, an unknown field or a malformed value.
            pub fn from_json(text: &str) -> $crate::Result<Config> {
                $crate::config::SqlConfig::from_json(text).map(Config)
            }

            /// Reads a YAML mapping with the fields
            /// [`from_json`](Self::from_json) reads.
            ///
            /// # Errors
            ///
            /// As [`from_json`](Self::from_json).
            pub fn from_yaml(text: &str) -> $crate::Result<Config> {
                $crate::config::SqlConfig::from_yaml(text).map(Config)
            }

            /// Sets one parameter from text (its name or an older
            /// spelling), as a URL parameter would.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for an
            /// unknown parameter or a malformed value.
            pub fn set(&mut self, key: &str, value: &str) -> $crate::Result<()> {
                self.0.set(key, value)
            }
        }
    };
}
pub(crate) use sql_config;

/// The options a SQL backend's locker builder shares, documented once:
/// fencing, holder records, the fencing table, the session pool and the
/// query timeout. `$bare_lock` is what an acquire is without fencing,
/// `$default_schema` where the fencing table lives without a schema,
/// `$query_timeout_note` what else a timeout costs on that backend.
macro_rules! sql_builder_options {
    (
        bare_lock: $bare_lock:literal,
        default_schema: $default_schema:literal,
        query_timeout_note: $query_timeout_note:literal $(,)?
    ) => {
        #[doc = concat!("Turns fencing tokens on (the default) or off. Off, acquires are a bare `",
            $bare_lock, "`, no table is created, and leases carry no fencing token.")]
        pub fn fencing(mut self, enabled: bool) -> Self {
            self.fencing_enabled = enabled;
            self
        }

        /// Records each grant's [`Holder`](crate::inspect::Holder) (host,
        /// pid, label) and ttl in the lock's fencing row (the default), for
        /// [`Locker::inspect`](crate::Locker::inspect). Off (URL
        /// `holder_record=off`, or the older `holder=off`), grants clear
        /// those columns instead: inspection still reports the lock, its
        /// session, grant time and token, with an unknown holder. Without
        /// fencing there is no row and nothing is recorded either way.
        pub fn holder_record(mut self, enabled: bool) -> Self {
            self.holder_record = enabled;
            self
        }

        #[doc = concat!("Where fencing counters live: `table` in `schema`, or in ",
            $default_schema, " when `None`. Default: `distlock_fencing` there. Created if missing.")]
        pub fn fencing_table(mut self, schema: Option<&str>, table: &str) -> Self {
            self.fencing_table = Some((schema.map(str::to_owned), table.to_owned()));
            self
        }

        /// How many shared sessions carry locks taken without waiting
        /// (default [`DEFAULT_SESSIONS`]). Each key always uses the same
        /// one. At least 1.
        pub fn sessions(mut self, sessions: usize) -> Self {
            self.sessions = sessions;
            self
        }

        /// How many idle connections are kept for the next native wait
        /// (default [`DEFAULT_IDLE_WAITERS`]); 0 closes each after use.
        /// They count toward [`max_waiters`](Self::max_waiters).
        pub fn idle_waiters(mut self, idle_waiters: usize) -> Self {
            self.idle_waiters = idle_waiters;
            self
        }

        /// How many waiter connections may be open at once (default
        /// [`DEFAULT_MAX_WAITERS`]): each native wait of
        /// [`Locker::lock`](crate::Locker::lock) needs one, and keeps it
        /// while it holds the lock it won; idle ones count too. When all
        /// are in use, `lock` polls the shared sessions instead. At least 1.
        pub fn max_waiters(mut self, max_waiters: usize) -> Self {
            self.max_waiters = max_waiters;
            self
        }

        /// How long any one statement may go unanswered before the call
        /// fails (default [`DEFAULT_QUERY_TIMEOUT`]). A native wait gets
        #[doc = concat!("its own timeout plus this. ", $query_timeout_note)]
        pub fn query_timeout(mut self, timeout: Duration) -> Self {
            self.query_timeout = timeout;
            self
        }
    };
}
pub(crate) use sql_builder_options;
