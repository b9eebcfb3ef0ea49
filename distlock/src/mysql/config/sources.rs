//! [`Config`]: a MySQL locker's settings read from a URL,
//! `DISTLOCK_MYSQL_*` variables, JSON or YAML, every source through the
//! builder's one field table ([`PARAMETERS`]).

use super::MysqlLockerBuilder;
use crate::config::sql_config;
use crate::Result;

sql_config! {
    /// Where a [`MysqlLocker`](crate::mysql::MysqlLocker) connects and how,
    /// read from every source as [`crate::config`] says, each reaching the
    /// parameters of the [module docs](crate::mysql#url);
    /// [`Config::builder`] makes the [`MysqlLockerBuilder`] for adjustments
    /// in code, and
    /// [`MysqlLocker::from_config`](crate::mysql::MysqlLocker::from_config)
    /// connects with it.
    ///
    /// ```
    /// use distlock::mysql::Config;
    ///
    /// let from_url = Config::from_url("mysql://app@db/jobs?key_prefix=billing&ping_interval=500ms")?;
    /// let from_json = Config::from_json(
    ///     r#"{"url": "mysql://app@db/jobs", "keyPrefix": "billing", "pingInterval": "500ms"}"#,
    /// )?;
    /// let from_env = Config::from_env_vars([
    ///     ("DISTLOCK_MYSQL_URL", "mysql://app@db/jobs"),
    ///     ("DISTLOCK_MYSQL_PREFIX", "billing"),
    ///     ("DISTLOCK_MYSQL_PING_INTERVAL", "500ms"),
    /// ])?;
    /// assert_eq!(from_url, from_json);
    /// assert_eq!(from_url, from_env);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    backend: Mysql("MySQL", "DISTLOCK_MYSQL_", ["mysql", "mariadb"]),
    /// distlock's MySQL parameters, by their one name and their older
    /// spellings: the field table URL parameters, `DISTLOCK_MYSQL_*`
    /// variables, JSON and YAML are read through (see [`crate::config`]).
    parameters: [
        "connect_timeout", "wait_timeout", "ping_interval", "ssl-mode" | "ssl_mode",
        "ssl-ca" | "ssl_ca",
    ],
    // mysql_async's URL options are not passed on: distlock reads the
    // ones it supports above.
    driver_parameters: [],
    builder: MysqlLockerBuilder, identifiers: super::super::fencing::MysqlIdentifiers,
    scratch: MysqlLockerBuilder::blank(String::new(), 0),
    settings: super::Settings,
}

impl Config {
    /// The builder these settings make: the URL's host, port, user,
    /// password and database, the password given apart, then each
    /// parameter in the order given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) without a URL,
    /// or for one that names no host (never showing the password).
    pub fn builder(&self) -> Result<MysqlLockerBuilder> {
        let mut builder = MysqlLockerBuilder::from_connection_url(self.0.url()?)?;
        if let Some(password) = self.0.password() {
            builder.password = Some(password.expose().to_owned());
        }
        self.0.apply(&mut builder)?;
        Ok(builder)
    }
}
