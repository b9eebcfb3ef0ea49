//! The sources of a SQL backend's settings (Postgres, MySQL): a connection
//! URL, a password, and the backend's own parameters, read from the URL's
//! query, `DISTLOCK_<BACKEND>_*` variables, JSON or YAML through one field
//! table. The backend's builder reads the result; this file only gathers
//! and checks the text, once for both backends.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use super::{
    camel_to_snake, decode, optional_password, parse, redact, Checked, Param, Password, Settings,
    Source, Table, YamlSettings,
};
use crate::sql::fencing::{FencingTable, Identifiers};
use crate::{Error, Result};

/// Shared sessions carrying locks taken without waiting, by default.
pub const DEFAULT_SESSIONS: usize = 4;
/// Idle connections kept for the next native wait, by default.
pub const DEFAULT_IDLE_WAITERS: usize = 2;
/// Waiter connections (for native waits and the locks they win, idle ones
/// included) a locker may have open at once, by default.
pub const DEFAULT_MAX_WAITERS: usize = 16;
/// The largest `max_waiters` accepted: tokio's semaphore limit.
const MAX_MAX_WAITERS: usize = tokio::sync::Semaphore::MAX_PERMITS;
/// How long opening a connection may take, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The parameters every SQL backend takes, first in its table:
/// [`SqlOptions`] reads them, but for `key_prefix` (each backend has its
/// own rules for a namespace).
pub(crate) const SQL_PARAMETERS: &[Param] = &[
    Param::url("key_prefix", &["prefix", "namespace"]),
    Param::url("fencing", &[]),
    Param::url("fencing_table", &[]),
    Param::url("holder_record", &["holder", "record_holder"]),
    Param::url("sessions", &[]),
    Param::url("idle_waiters", &[]),
    Param::url("max_waiters", &[]),
    Param::url("query_timeout", &[]),
];

/// The options both SQL lockers' builders take alike (fencing, holder
/// records, the session pool, the query timeout), with their one parser
/// and their one check; each builder holds one.
#[derive(Debug, Clone)]
pub(crate) struct SqlOptions {
    pub(crate) fencing_enabled: bool,
    /// `(schema, table)`, checked at build time; `None` for the default.
    pub(crate) fencing_table: Option<(Option<String>, String)>,
    pub(crate) holder_record: bool,
    pub(crate) sessions: usize,
    pub(crate) idle_waiters: usize,
    pub(crate) max_waiters: usize,
    pub(crate) query_timeout: Duration,
}

impl SqlOptions {
    /// Every default, with the backend's own default query timeout.
    pub(crate) fn new(query_timeout: Duration) -> Self {
        SqlOptions {
            fencing_enabled: true,
            fencing_table: None,
            holder_record: true,
            sessions: DEFAULT_SESSIONS,
            idle_waiters: DEFAULT_IDLE_WAITERS,
            max_waiters: DEFAULT_MAX_WAITERS,
            query_timeout,
        }
    }

    /// Sets `key` if it is one of these options: `Ok(false)` for another
    /// key, left to the backend. `I` is the server's identifier
    /// rules (the fencing table's name is only split here, checked at
    /// build time).
    pub(crate) fn set_param<I: Identifiers>(
        &mut self,
        key: &str,
        value: &str,
        source: Source<'_>,
    ) -> Checked<bool> {
        match key {
            "fencing" => self.fencing_enabled = parse(source, value)?,
            "fencing_table" => self.fencing_table = Some(FencingTable::<I>::split(value)),
            "holder_record" => self.holder_record = parse(source, value)?,
            "sessions" => self.sessions = parse(source, value)?,
            "idle_waiters" => self.idle_waiters = parse(source, value)?,
            "max_waiters" => {
                self.max_waiters = parse(source, value)
                    .ok()
                    .filter(|n| (1..=MAX_MAX_WAITERS).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "{source}: {value:?}: expected an integer from 1 to {MAX_MAX_WAITERS}"
                        )
                    })?;
            }
            "query_timeout" => self.query_timeout = parse(source, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the pool's sizes and the query timeout, and returns the
    /// fencing table (`None` without fencing), checked by `I`'s rules.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the option that cannot be used.
    pub(crate) fn check<I: Identifiers>(&self) -> Result<Option<FencingTable<I>>> {
        super::check_sessions(self.sessions)
            .map_err(|reason| Error::invalid("sessions", reason))?;
        if !(1..=MAX_MAX_WAITERS).contains(&self.max_waiters) {
            return Err(Error::invalid(
                "max_waiters",
                format!("max_waiters must be 1 to {MAX_MAX_WAITERS}"),
            ));
        }
        if self.query_timeout.is_zero() {
            return Err(Error::invalid(
                "query_timeout",
                "the query timeout must be positive",
            ));
        }
        match (self.fencing_enabled, &self.fencing_table) {
            (false, _) => Ok(None),
            (true, Some((schema, table))) => FencingTable::new(schema.as_deref(), table).map(Some),
            (true, None) => Ok(Some(FencingTable::default())),
        }
    }
}

/// What every SQL locker's settings hold alike, checked at build time
/// ([`SqlOptions::into_settings`]). A backend's `Settings` reads these as
/// its own fields through `Deref` (`settings.target`), and the shared
/// options through this one's (`settings.query_timeout`).
#[derive(Debug)]
pub(crate) struct SqlSettings<I> {
    /// The server as errors and `Debug` name it (`mysql://user@host:port/db`),
    /// never with the password.
    pub(crate) target: String,
    /// The key prefix, put into every lock's name on the server.
    pub(crate) namespace: String,
    pub(crate) fencing: Option<FencingTable<I>>,
    pub(crate) options: SqlOptions,
}

impl<I> std::ops::Deref for SqlSettings<I> {
    type Target = SqlOptions;

    fn deref(&self) -> &SqlOptions {
        &self.options
    }
}

impl SqlOptions {
    /// Checks these options (see [`check`](Self::check)) and keeps them
    /// with the locker's `target` and checked key prefix.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub(crate) fn into_settings<I: Identifiers>(
        self,
        target: String,
        namespace: String,
    ) -> Result<SqlSettings<I>> {
        let fencing = self.check()?;
        Ok(SqlSettings {
            target,
            namespace,
            fencing,
            options: self,
        })
    }
}

/// What a SQL backend tells the shared reader about itself. (A unit
/// struct: `Default` lets a [`SqlConfig`] of it derive its own.)
pub(crate) trait SqlBackend: Default {
    /// The backend's name in messages (`Postgres`).
    const NAME: &'static str;
    /// The URL schemes it reads (`postgres`, `postgresql`).
    const SCHEMES: &'static [&'static str];
    /// The prefix of its variables (`DISTLOCK_POSTGRES_`).
    const ENV_PREFIX: &'static str;
    /// Its own parameters (not the URL's user, host, database or password).
    const PARAMETERS: Table;
    /// The URL parameters that are the driver's, passed on to it in the
    /// URL (Postgres passes libpq's to tokio-postgres); any other name that
    /// is not one of [`PARAMETERS`](Self::PARAMETERS) is a mistake, refused
    /// naming it and listing both.
    const DRIVER_PARAMETERS: &'static [&'static str];

    /// Its locker builder, which reads the parameters.
    type Builder;

    /// Sets the parameter `key` (its one name) on `builder` from text: the
    /// shared options, or the backend's own.
    fn set(builder: &mut Self::Builder, key: &str, value: &str, source: Source<'_>) -> Checked;

    /// Checks `value` for the parameter `key` as a builder reads it.
    fn check(key: &str, value: &str, source: Source<'_>) -> Checked;
}

/// A connection URL, a password, and the backend's own parameters as
/// checked text, in the order they were set (a later one wins). (The
/// derives ask `B`, a unit struct, for the same traits.)
#[derive(Clone, PartialEq, Default)]
pub(crate) struct SqlConfig<B> {
    url: Option<String>,
    password: Option<Password>,
    settings: Vec<(&'static str, String)>,
    backend: PhantomData<fn() -> B>,
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
                None if B::DRIVER_PARAMETERS.contains(&name.as_str()) => passed_on.push(pair),
                None => {
                    return Err(bad(B::PARAMETERS.unknown_in_url(
                        &name,
                        B::DRIVER_PARAMETERS,
                        "",
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

    fn set_param(&mut self, key: &'static str, value: &str, source: Source<'_>) -> Checked {
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

    /// Sets each parameter on `builder`, in the order set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a value the builder refuses.
    pub(crate) fn apply(&self, builder: &mut B::Builder) -> Result<()> {
        for (key, value) in &self.settings {
            B::set(builder, key, value, Source::Field(key))
                .map_err(|reason| Error::invalid("config", reason))?;
        }
        Ok(())
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

/// Reads one backend's settings from each source (a URL, JSON, YAML,
/// then variables) and asserts that `summary` of each is `want`: the
/// sources name the same parameters their own ways. Returns them, in that
/// order, for the test's own checks.
#[cfg(test)]
pub(crate) fn assert_every_source_reaches<B: SqlBackend, S: PartialEq + fmt::Debug>(
    summary: impl Fn(&SqlConfig<B>) -> S,
    want: S,
    [url, json, yaml]: [&str; 3],
    vars: &[(&str, &str)],
) -> [SqlConfig<B>; 4] {
    let read = [
        SqlConfig::from_url(url),
        SqlConfig::from_json(json),
        SqlConfig::from_yaml(yaml),
        SqlConfig::from_env_vars(vars.iter().copied()),
    ];
    let configs = read.map(|config| config.unwrap());
    for config in &configs {
        assert_eq!(summary(config), want, "{config:?}");
    }
    configs
}

/// A SQL backend's public `Config`: a newtype over [`SqlConfig`] with the
/// constructors every backend shares, documented for the backend, and the
/// [`SqlBackend`] description of it, with its field table `PARAMETERS`:
/// [`SQL_PARAMETERS`], then the backend's own `parameters` (each a name,
/// then any older spellings after `|`). The builder (`builder`):
///
/// - holds the shared options in its field `common` and reads its own
///   parameters with `set_own`;
/// - gets a `Debug` showing its `target()`, `namespace`, `ssl_mode` and
///   shared options;
/// - names the fencing table by `identifiers`' rules;
/// - checks each value as it is read, set on `scratch` (every default).
///
/// The locker's `settings` (field `shared`, a [`SqlSettings`]) read the
/// shared settings through `Deref`. The backend adds `Config::builder()`.
macro_rules! sql_config {
    (
        $(#[$meta:meta])*
        backend: $backend:ident($name:literal, $env:literal, [$($scheme:literal),+]),
        $(#[$table_meta:meta])*
        parameters: [$($param:literal $(| $alias:literal)*),+ $(,)?],
        driver_parameters: [$($driver:literal),* $(,)?],
        builder: $builder:ty, identifiers: $identifiers:ty,
        scratch: $scratch:expr,
        settings: $settings:ty $(,)?
    ) => {
        $(#[$table_meta])*
        pub(crate) const PARAMETERS: $crate::config::Table = $crate::config::Table(&[
            $crate::config::SQL_PARAMETERS,
            &[$($crate::config::Param::url($param, &[$($alias),*])),+],
        ]);

        // Never the password: the target is written without it.
        impl ::std::fmt::Debug for $builder {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($builder))
                    .field("target", &self.target())
                    .field("namespace", &self.namespace)
                    .field("ssl_mode", &self.ssl_mode)
                    .field("options", &self.common)
                    .finish_non_exhaustive()
            }
        }

        // The locker's settings read the shared settings, and through them
        // the shared options, as their own fields (`settings.target`,
        // `settings.query_timeout`).
        impl ::std::ops::Deref for $settings {
            type Target = $crate::config::SqlSettings<$identifiers>;

            fn deref(&self) -> &Self::Target {
                &self.shared
            }
        }

        /// The backend as the shared SQL configuration reader sees it.
        #[derive(Clone, PartialEq, Default)]
        pub(crate) struct $backend;

        impl $crate::config::SqlBackend for $backend {
            const NAME: &'static str = $name;
            const SCHEMES: &'static [&'static str] = &[$($scheme),+];
            const ENV_PREFIX: &'static str = $env;
            const PARAMETERS: $crate::config::Table = PARAMETERS;
            const DRIVER_PARAMETERS: &'static [&'static str] = &[$($driver),*];

            type Builder = $builder;

            fn set(
                builder: &mut $builder,
                key: &str,
                value: &str,
                source: $crate::config::Source<'_>,
            ) -> $crate::config::Checked {
                if builder.common.set_param::<$identifiers>(key, value, source)? {
                    return Ok(());
                }
                builder.set_own(key, value, source)
            }

            fn check(
                key: &str,
                value: &str,
                source: $crate::config::Source<'_>,
            ) -> $crate::config::Checked {
                Self::set(&mut $scratch, key, value, source)
            }
        }

        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config(pub(super) $crate::config::SqlConfig<$backend>);

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
/// `$default_schema` where the fencing table lives without a schema, and
/// the optional `$query_timeout_note` what else a timeout costs on that
/// backend.
macro_rules! sql_builder_options {
    (
        bare_lock: $bare_lock:literal,
        default_schema: $default_schema:literal
        $(, query_timeout_note: $query_timeout_note:literal)? $(,)?
    ) => {
        #[doc = concat!("Where fencing counters live: `table` in `schema`, or in ",
            $default_schema, " when `None`. Default: `distlock_fencing` there. Created if missing.")]
        pub fn fencing_table(mut self, schema: Option<&str>, table: &str) -> Self {
            self.common.fencing_table = Some((schema.map(str::to_owned), table.to_owned()));
            self
        }

        $crate::config::setters! {
            #[doc = concat!("Turns fencing tokens on (the default) or off. Off, acquires are a bare `",
                $bare_lock, "`, no table is created, and leases carry no fencing token.")]
            fencing(bool) => common.fencing_enabled;

            /// Records each grant's [`Holder`](crate::inspect::Holder)
            /// (host, pid, label) and ttl in the lock's fencing row (the
            /// default), for [`Locker::inspect`](crate::Locker::inspect).
            /// Off (URL `holder_record=off`, or the older `holder=off`),
            /// grants clear those columns instead: inspection still reports
            /// the lock, its session, grant time and token, with an unknown
            /// holder. Without fencing there is no row and nothing is
            /// recorded either way.
            holder_record(bool) => common.holder_record;

            /// How many shared sessions carry locks taken without waiting
            /// (default [`DEFAULT_SESSIONS`]). Each key always uses the
            /// same one. At least 1.
            sessions(usize) => common.sessions;

            /// How many idle connections are kept for the next native wait
            /// (default [`DEFAULT_IDLE_WAITERS`]); 0 closes each after use.
            /// They count toward [`max_waiters`](Self::max_waiters).
            idle_waiters(usize) => common.idle_waiters;

            /// How many waiter connections may be open at once (default
            /// [`DEFAULT_MAX_WAITERS`]): each native wait of
            /// [`Locker::lock`](crate::Locker::lock) needs one, and keeps
            /// it while it holds the lock it won; idle ones count too. When
            /// all are in use, `lock` polls the shared sessions instead. At
            /// least 1.
            max_waiters(usize) => common.max_waiters;

            /// How long any one statement may go unanswered before the
            /// call fails (default [`DEFAULT_QUERY_TIMEOUT`]). A native
            /// wait gets
            #[doc = concat!("its own timeout plus this. ", $($query_timeout_note)?)]
            query_timeout(Duration) => common.query_timeout;
        }
    };
}
pub(crate) use sql_builder_options;
