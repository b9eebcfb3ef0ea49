//! [`Config`]: a Postgres locker's settings read from a URL,
//! `DISTLOCK_POSTGRES_*` variables, JSON or YAML, every source through the
//! builder's one field table ([`PARAMETERS`]).

use std::str::FromStr;

use super::{PostgresLockerBuilder, UrlKeepalive};
use crate::config::sql_config;
use crate::{Error, Result};

sql_config! {
    /// Where a [`PostgresLocker`](crate::postgres::PostgresLocker) connects
    /// and how, read from every source as [`crate::config`] says, each
    /// reaching the parameters of the [module docs](crate::postgres#url);
    /// [`Config::builder`] makes the [`PostgresLockerBuilder`] for
    /// adjustments in code, and
    /// [`PostgresLocker::from_config`](crate::postgres::PostgresLocker::from_config)
    /// connects with it.
    ///
    /// ```
    /// use distlock::postgres::Config;
    ///
    /// let from_url = Config::from_url("postgres://app@db/jobs?key_prefix=billing&query_timeout=5s")?;
    /// let from_env = Config::from_env_vars([
    ///     ("DISTLOCK_POSTGRES_URL", "postgres://app@db/jobs"),
    ///     ("DISTLOCK_POSTGRES_KEY_PREFIX", "billing"),
    ///     ("DISTLOCK_POSTGRES_QUERY_TIMEOUT", "5"),
    /// ])?;
    /// let from_yaml = Config::from_yaml("
    /// url: postgres://app@db/jobs
    /// keyPrefix: billing
    /// queryTimeout: 5s
    /// ")?;
    /// for config in [from_url, from_env, from_yaml] {
    ///     let builder = config.builder()?;
    ///     assert!(format!("{builder:?}").contains(r#"namespace: "billing""#));
    /// }
    /// # Ok::<(), distlock::Error>(())
    /// ```
    backend: Postgres("Postgres", "DISTLOCK_POSTGRES_", ["postgres", "postgresql"]),
    /// distlock's own parameters, by their one name and their older
    /// spellings: the field table URL parameters, `DISTLOCK_POSTGRES_*`
    /// variables, JSON and YAML are read through (see [`crate::config`]); a
    /// URL's other parameters go to tokio-postgres. `connect_timeout`,
    /// `keepalives_idle`, `keepalives_interval` and `tcp_user_timeout` are
    /// libpq's, read here so that they accept units, with libpq's unit for a
    /// bare number.
    parameters: [
        "ping_interval", "ping_timeout", "idle_session_timeout", "server_keepalives",
        "sslmode", "sslrootcert", "sslcert", "sslkey",
        "connect_timeout", "keepalives_idle", "keepalives_interval", "tcp_user_timeout",
    ],
    // tokio-postgres 0.7's own URL parameters (`Config::param` in
    // tokio-postgres/src/config.rs), less those read above: the URL keeps
    // them for the driver; any other name is refused, naming it.
    driver_parameters: [
        "user", "password", "dbname", "options", "application_name", "sslnegotiation",
        "host", "hostaddr", "port", "keepalives", "keepalives_retries",
        "target_session_attrs", "channel_binding", "load_balance_hosts",
    ],
    builder: PostgresLockerBuilder, identifiers: super::super::fencing::PostgresIdentifiers,
    scratch: PostgresLockerBuilder::from_config(tokio_postgres::Config::new()),
    settings: super::Settings,
}

impl Config {
    /// The builder these settings make: the URL read by tokio-postgres,
    /// the password, then each parameter in the order given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] without a URL, or for one tokio-postgres
    /// cannot read (never echoed: it may hold a password).
    pub fn builder(&self) -> Result<PostgresLockerBuilder> {
        let url = self.0.url()?;
        let pg = tokio_postgres::Config::from_str(url).map_err(|e| {
            let reason = super::super::errors::describe(&e);
            Error::invalid("url", format!("not a valid Postgres URL: {reason}"))
        })?;
        let mut builder = PostgresLockerBuilder::from_config(pg);
        if let Some(password) = self.0.password() {
            builder.pg.password(password.expose());
        }
        // A retry count the URL gave tokio-postgres stays over distlock's.
        let query = url.split_once('?').map_or("", |(_, query)| query);
        builder.url_keepalive = UrlKeepalive {
            retries: query
                .split('&')
                .any(|pair| pair.split('=').next() == Some("keepalives_retries")),
            ..UrlKeepalive::default()
        };
        self.0.apply(&mut builder)?;
        Ok(builder)
    }
}
