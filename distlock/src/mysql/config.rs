//! Settings of a [`MysqlLocker`](super::MysqlLocker): from a URL, then
//! adjusted through [`MysqlLockerBuilder`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use mysql_async::Conn;
use url::Url;

use super::errors;
use super::fencing::MysqlIdentifiers;
use super::MysqlLocker;
use crate::config::{
    decode, display_url, format_address, parse, reason, redact, Checked, Source, SqlOptions,
    SqlSettings,
};
use crate::{Error, Result};

mod sources;

pub use sources::Config;

pub use crate::config::sql::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_WAITERS, DEFAULT_MAX_WAITERS, DEFAULT_SESSIONS,
};

/// How long any one statement (or ping) may go unanswered, by default.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an otherwise idle session is pinged, by default.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(1);
/// The `wait_timeout` every session sets for itself, by default: the server
/// ends a session (and frees its locks) after this much silence.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(15);
/// The client's TCP keepalive idle time (mysql_async sets only this one).
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(1);
/// Room left for timer slack and the network's one-way delay in the
/// partition grace (see [`MysqlLockerBuilder::wait_timeout`]).
const GRACE_MARGIN: Duration = Duration::from_secs(1);

/// Whether TLS is used and what is checked, as MySQL's `--ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    Disabled,
    /// TLS if the server offers it (without checking its certificate),
    /// plain TCP otherwise: MySQL's default. Decided for each connection,
    /// never remembered: a "no TLS" answer forged once by someone on the
    /// path costs that connection only. A server that offers no TLS costs
    /// one extra greeting per connection opened. Like MySQL's own
    /// `PREFERRED`, this stops passive eavesdropping only: an active
    /// attacker can strip TLS from every connection, or present any
    /// certificate. Use [`VerifyIdentity`](Self::VerifyIdentity) against
    /// them (the `distlock` CLI's default).
    #[default]
    Preferred,
    /// TLS, without checking the certificate (encryption against passive
    /// eavesdropping only).
    Required,
    /// TLS, with a trusted certificate that names the host connected to.
    VerifyIdentity,
}

impl SslMode {
    /// The mode as the URL spells it (`VERIFY_IDENTITY`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disabled => "DISABLED",
            SslMode::Preferred => "PREFERRED",
            SslMode::Required => "REQUIRED",
            SslMode::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }

    fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_uppercase().as_str() {
            "DISABLED" => Ok(SslMode::Disabled),
            "PREFERRED" => Ok(SslMode::Preferred),
            "REQUIRED" => Ok(SslMode::Required),
            // mysql_async 0.37 skips only the host check by matching the
            // text "NotValidForName" in rustls' error, which rustls 0.23
            // no longer prints ("certificate not valid for name …"): every
            // VERIFY_CA connection would fail. Refused rather than faked.
            "VERIFY_CA" => Err(Error::invalid(
                "url",
                "ssl-mode=VERIFY_CA is not supported (mysql_async cannot skip only the host check with \
                 rustls 0.23); use VERIFY_IDENTITY with the host name the certificate names, or REQUIRED",
            )),
            "VERIFY_IDENTITY" => Ok(SslMode::VerifyIdentity),
            _ => Err(Error::invalid(
                "url",
                format!(
                    "ssl-mode={value:?}: expected DISABLED, PREFERRED, REQUIRED or VERIFY_IDENTITY"
                ),
            )),
        }
    }
}

/// Builds a [`MysqlLocker`]: start from a URL with
/// [`MysqlLocker::builder`], adjust, then [`build`](Self::build).
///
/// Every option can also be given in the URL (see the
/// [module docs](super#url)); a builder call overrides the URL.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::mysql::{MysqlLocker, SslMode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = MysqlLocker::builder("mysql://app:secret@db.internal:3306/app")?
///     .ssl_mode(SslMode::VerifyIdentity)
///     .fencing_table(Some("ops"), "distlock_fencing")
///     .sessions(8)
///     .query_timeout(Duration::from_secs(3))
///     .build()
///     .await?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MysqlLockerBuilder {
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    database: Option<String>,
    /// `None`: the database's name (see [`Self::namespace`]).
    namespace: Option<String>,
    ssl_mode: SslMode,
    ssl_ca: Option<PathBuf>,
    common: SqlOptions,
    connect_timeout: Duration,
    ping_interval: Duration,
    wait_timeout: Duration,
}

/// The smallest bare `ping_interval` refused: `ping_interval` was bare
/// milliseconds before a bare number meant seconds everywhere, and a minute
/// between pings is far past any `wait_timeout` a holder could keep, so a
/// value this large was surely written as milliseconds.
const PING_INTERVAL_BARE_LIMIT: u64 = 60;

impl MysqlLockerBuilder {
    /// Parses a `mysql://` or `mariadb://` URL (see the
    /// [module docs](super#url) for the parameters): the same as
    /// [`Config::from_url`] then [`Config::builder`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL or parameter, never
    /// showing the password.
    pub fn from_url(url: &str) -> Result<Self> {
        Config::from_url(url)?.builder()
    }

    /// The builder for a URL without distlock's parameters: its host, port,
    /// user, password and database, with every default.
    pub(super) fn from_connection_url(url: &str) -> Result<Self> {
        let parsed = Url::parse(url)
            .map_err(|e| Error::invalid("url", format!("{:?} is not a URL: {e}", redact(url))))?;
        if !matches!(parsed.scheme(), "mysql" | "mariadb") {
            return Err(Error::invalid(
                "url",
                format!(
                    "{}:// is not a MySQL URL; use mysql:// or mariadb://",
                    parsed.scheme()
                ),
            ));
        }
        let host = crate::config::host_of(&parsed)
            .ok_or_else(|| Error::invalid("url", format!("{:?} names no host", redact(url))))?;
        let decode = |text: &str| -> Result<String> {
            decode(text).map_err(|e| Error::invalid("url", format!("a part of the URL is {e}")))
        };
        let mut builder = MysqlLockerBuilder::blank(host, parsed.port().unwrap_or(3306));
        builder.user = Some(decode(parsed.username())?).filter(|u| !u.is_empty());
        builder.password = parsed.password().map(decode).transpose()?;
        builder.database =
            Some(decode(parsed.path().trim_start_matches('/'))?).filter(|d| !d.is_empty());
        Ok(builder)
    }

    /// Every default, for `host:port` without credentials or database.
    pub(super) fn blank(host: String, port: u16) -> Self {
        MysqlLockerBuilder {
            host,
            port,
            user: None,
            password: None,
            database: None,
            namespace: None,
            ssl_mode: SslMode::default(),
            ssl_ca: None,
            common: SqlOptions::new(DEFAULT_QUERY_TIMEOUT),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            ping_interval: DEFAULT_PING_INTERVAL,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }

    /// The field table's MySQL part: sets `key` (a name of
    /// [`PARAMETERS`](sources::PARAMETERS) past
    /// [`SQL_PARAMETERS`](crate::config::SQL_PARAMETERS)) from text.
    fn set_own(&mut self, key: &str, value: &str, source: Source<'_>) -> Checked {
        match key {
            // Empty is a namespace too: none, the bare lock name.
            "key_prefix" => self.namespace = Some(value.to_owned()),
            "connect_timeout" => self.connect_timeout = parse(source, value)?,
            "wait_timeout" => self.wait_timeout = parse(source, value)?,
            "ping_interval" => {
                let bare = value.trim().parse::<u64>().ok();
                if let Some(number) = bare.filter(|n| *n >= PING_INTERVAL_BARE_LIMIT) {
                    return Err(format!(
                        "{source}: {value:?} would be {number} seconds (a bare number is \
                         seconds since ping_interval took units); write {number}ms for \
                         milliseconds, or {number}s if seconds were meant"
                    ));
                }
                self.ping_interval = parse(source, value)?;
            }
            "ssl-mode" => self.ssl_mode = SslMode::parse(value).map_err(reason)?,
            "ssl-ca" => self.ssl_ca = Some(PathBuf::from(value)),
            other => return Err(format!("{source}: {other:?} is not a MySQL parameter")),
        }
        Ok(())
    }

    /// The namespace put into every lock name ([`lock_name_in`]), and so into
    /// every fencing row and mark: by default the URL's database, so that two
    /// databases on one server never share a lock (lock names are
    /// server-wide). URL `key_prefix` (or the older `prefix`, `namespace`). An empty
    /// namespace takes [`lock_name`]`(key)` itself, the name other
    /// `GET_LOCK` users can take by hand: every client of a lock must use
    /// the same namespace. No zero byte, at most 1024 bytes.
    ///
    /// [`lock_name_in`]: super::lock_name_in
    /// [`lock_name`]: super::lock_name
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    crate::config::sql_builder_options! {
        bare_lock: "GET_LOCK",
        default_schema: "the URL's database",
        query_timeout_note: "A ping has as long; a session whose statement or ping timed out is closed.",
    }

    crate::config::setters! {
        /// How long opening a connection may take (default
        /// [`DEFAULT_CONNECT_TIMEOUT`]).
        connect_timeout(Duration) => connect_timeout;

        /// How often an idle session is pinged (default
        /// [`DEFAULT_PING_INTERVAL`]): it keeps the session inside its
        /// `wait_timeout`, and bounds how late a holder learns that its session
        /// was killed.
        ping_interval(Duration) => ping_interval;

        /// The `wait_timeout` every session sets for itself (default
        /// [`DEFAULT_WAIT_TIMEOUT`], whole seconds): how long the server keeps a
        /// silent client's session, and its locks. It must be at least
        /// `ping_interval + query_timeout + 1 s`, so that a holder cut off from
        /// the server closes its session (and fires its lost signals) before the
        /// server can free its locks: the difference is the partition grace.
        wait_timeout(Duration) => wait_timeout;

        /// Whether TLS is used and what is checked (default: the URL's
        /// `ssl-mode`, else [`SslMode::Preferred`]).
        ssl_mode(SslMode) => ssl_mode;
    }

    /// A CA certificate file (PEM) trusted besides the Mozilla roots, for
    /// [`SslMode::VerifyIdentity`].
    pub fn ssl_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssl_ca = Some(path.into());
        self
    }

    /// Opens the first session (so a wrong password or an unreachable server
    /// fails here, not at the first lock), creates the fencing table if
    /// missing, and returns the locker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an unusable option; [`Error::Backend`] or
    /// [`Error::DeadlineExceeded`] if the server cannot be reached, refuses
    /// the login, or the table cannot be created.
    pub async fn build(self) -> Result<MysqlLocker> {
        MysqlLocker::start(self.into_settings()?).await
    }

    /// `mysql://user@host:port/db`: never the password.
    fn target(&self) -> String {
        let address = format_address(&self.host, self.port);
        let db = format!("/{}", self.database.as_deref().unwrap_or_default());
        display_url("mysql", self.user.as_deref(), &address, &db)
    }

    pub(super) fn into_settings(self) -> Result<Settings> {
        let namespace = match &self.namespace {
            Some(namespace) => namespace.clone(),
            None => self.database.clone().unwrap_or_default(),
        };
        let shared = self
            .common
            .clone()
            .into_settings(self.target(), namespace)?;
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("ping_interval", self.ping_interval),
        ] {
            if value.is_zero() {
                return Err(Error::invalid(what, format!("{what} must be positive")));
            }
        }
        let least_wait = self
            .ping_interval
            .saturating_add(self.common.query_timeout)
            .saturating_add(GRACE_MARGIN);
        if self.wait_timeout < least_wait || self.wait_timeout.as_secs() > 31_536_000 {
            return Err(Error::invalid(
                "wait_timeout",
                format!(
                    "wait_timeout is {:?}; it must be at least ping_interval + query_timeout + 1 s ({least_wait:?}) \
                     so that a cut-off holder learns it before the server frees its locks, and at most a year",
                    self.wait_timeout
                ),
            ));
        }
        if let Some(path) = &self.ssl_ca {
            if !path.is_file() {
                return Err(Error::invalid(
                    "ssl-ca",
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        crate::validate::namespace(&shared.namespace)?;
        let connect = ConnectOptions {
            plain: self.opts(None),
            with_tls: self.ssl_opts().map(|tls| self.opts(Some(tls))),
            ssl_mode: self.ssl_mode,
        };
        Ok(Settings {
            shared,
            connect,
            connect_timeout: self.connect_timeout,
            ping_interval: self.ping_interval,
            wait_timeout: self.wait_timeout,
        })
    }

    fn ssl_opts(&self) -> Option<mysql_async::SslOpts> {
        let base = mysql_async::SslOpts::default();
        let base = match &self.ssl_ca {
            Some(path) => base.with_root_certs(vec![path.clone().into()]),
            None => base,
        };
        match self.ssl_mode {
            SslMode::Disabled => None,
            SslMode::Preferred | SslMode::Required => Some(
                base.with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
            ),
            SslMode::VerifyIdentity => Some(base),
        }
    }

    /// The driver's options. Every session is one `Conn` of its own, never
    /// a `mysql_async::Pool` (whose reset on return releases `GET_LOCK`).
    fn opts(&self, tls: Option<mysql_async::SslOpts>) -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(self.user.clone())
            .pass(self.password.clone())
            .db_name(self.database.clone())
            // On a loopback address mysql_async would otherwise reconnect
            // through the server's Unix socket: no TCP keepalive there, and
            // a second connection for every session.
            .prefer_socket(false)
            .tcp_keepalive(Some(TCP_KEEPALIVE_IDLE))
            .tcp_nodelay(true)
            .stmt_cache_size(0)
            // Given here, these spare a settings query per connection.
            .wait_timeout(Some(self.wait_timeout.as_secs() as usize))
            .max_allowed_packet(Some(4 << 20))
            .ssl_opts(tls)
            .init(vec![setup_sql(
                self.wait_timeout,
                self.common.query_timeout,
            )])
            .into()
    }
}

/// The one statement every session runs as it opens:
///
/// - its own `wait_timeout`, so a silent client's locks are freed in seconds
///   rather than the default 8 hours, while the pings keep a live one open;
/// - `innodb_lock_wait_timeout` and `lock_wait_timeout` of half the query
///   timeout (at least 1 s), so a fencing-row update blocked by another
///   client fails on the server before the client gives up on the session;
/// - `autocommit` on (each fencing bump commits at once);
/// - on MariaDB, `max_statement_time` off: a role default would turn a
///   native wait into an error;
/// - `time_zone` UTC: a `TIMESTAMP` read back in a zone with daylight saving
///   time is ambiguous in the hour the clocks go back, which would misreport
///   a grant time by an hour.
fn setup_sql(wait_timeout: Duration, query_timeout: Duration) -> String {
    let lock_wait = (query_timeout.as_secs() / 2).max(1);
    format!(
        "SET SESSION wait_timeout = {}, innodb_lock_wait_timeout = {lock_wait}, \
         lock_wait_timeout = {lock_wait}, autocommit = 1, time_zone = '+00:00' /*M!100108 , max_statement_time = 0 */",
        wait_timeout.as_secs()
    )
}

/// Everything a running locker needs, fixed at build time.
pub(crate) struct Settings {
    /// What every SQL backend's settings hold (the target, the key prefix
    /// put into every lock name by [`super::lock_name_in`], the fencing
    /// table and the shared options), read as fields of these settings
    /// (`settings.query_timeout`) through `Deref`.
    pub(super) shared: SqlSettings<MysqlIdentifiers>,
    pub(super) connect: ConnectOptions,
    pub(super) connect_timeout: Duration,
    pub(super) ping_interval: Duration,
    pub(super) wait_timeout: Duration,
}

// The driver's options hold the password: never printed.
impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("shared", &self.shared)
            .field("ssl_mode", &self.connect.ssl_mode)
            .finish_non_exhaustive()
    }
}

/// How a session's connection is opened: the driver's options without TLS
/// and (unless `ssl-mode=DISABLED`) with it, and the mode that picks.
pub(super) struct ConnectOptions {
    plain: mysql_async::Opts,
    with_tls: Option<mysql_async::Opts>,
    ssl_mode: SslMode,
}

impl ConnectOptions {
    /// Opens one connection as `ssl_mode` says. `PREFERRED` decides per
    /// connection, as MySQL's own client does, never for the locker's
    /// lifetime: a "no TLS" answer is unauthenticated (a greeting without
    /// the SSL capability), so anyone on the path can forge it for one
    /// connection, and remembering it would turn TLS off for every later
    /// session. A server that really has no TLS costs one greeting more per
    /// connection opened (sessions are few and long-lived).
    ///
    /// # Errors
    ///
    /// The driver's error, with `context`; a server offering no TLS where
    /// the mode requires it, saying how to connect without.
    ///
    /// # Cancel safety
    ///
    /// Dropping it drops the connection being opened.
    pub(super) async fn connect(&self, context: impl Fn() -> String) -> Result<Conn> {
        let plain = || async {
            Conn::new(self.plain.clone())
                .await
                .map_err(|e| errors::driver("connect", context(), e))
        };
        let Some(tls) = &self.with_tls else {
            return plain().await;
        };
        match Conn::new(tls.clone()).await {
            Ok(conn) => Ok(conn),
            Err(e) if errors::is_no_tls(&e) && self.ssl_mode == SslMode::Preferred => plain().await,
            Err(e) if errors::is_no_tls(&e) => Err(Error::backend(
                errors::BACKEND,
                "connect",
                format!(
                    "{}: the server offers no TLS, which ssl-mode={} requires; pass \
                     ssl-mode=DISABLED to connect without it (or fix the server's TLS setup)",
                    context(),
                    self.ssl_mode.as_str()
                ),
            )),
            Err(e) => Err(errors::driver("connect", context(), e)),
        }
    }
}

impl Settings {
    /// How long after this client last heard an answer from the server the
    /// server keeps the session's locks at the least, whatever happens next:
    /// it frees them `wait_timeout` after the last command it answered, and
    /// it answered that one no later than the client heard the answer; a
    /// second is taken off for timer slack and the answer's way back. 15 − 1
    /// = 14 s with the defaults. A silent session's leases stay valid until
    /// then (see [`Session`](super::session::Session)). None of this holds
    /// for a holder paused through it: fencing tokens are the remedy.
    pub(super) fn server_window(&self) -> Duration {
        self.wait_timeout.saturating_sub(GRACE_MARGIN)
    }

    /// The grace a holder has left when its session is given up at the
    /// latest: the client gives a silent session up at most `ping_interval +
    /// query_timeout` after it last heard from the server (an idle session
    /// is pinged after `ping_interval`; any statement or ping is bounded by
    /// `query_timeout`), so `server_window() − ping_interval −
    /// query_timeout`: 15 − 1 − 1 − 5 = 8 s with the defaults.
    #[cfg(test)]
    pub(super) fn partition_grace(&self) -> Duration {
        self.server_window()
            .saturating_sub(self.ping_interval)
            .saturating_sub(self.query_timeout)
    }
}

#[cfg(test)]
mod tests;
