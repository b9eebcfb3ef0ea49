//! Settings of a [`PostgresLocker`](super::PostgresLocker): from a URL, then
//! adjusted through [`PostgresLockerBuilder`].

use std::time::Duration;

use tokio_postgres::config::{Host, TargetSessionAttrs};

use super::fencing::PostgresIdentifiers;
use super::keys::validate_namespace;
use super::tls::{RootCerts, SslMode, Tls};
use super::PostgresLocker;
use crate::config::{
    display_url, parse, parse_duration_bare, reason, Checked, Source, SqlOptions, SqlSettings,
};
use crate::{Error, Result};

mod keepalive;
mod sources;

use keepalive::server_window;
pub use keepalive::TcpKeepalive;
pub use sources::Config;

pub use crate::config::sql::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_WAITERS, DEFAULT_MAX_WAITERS, DEFAULT_SESSIONS,
};

/// How long any one statement may go unanswered, by default.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a session may go without an answer before it is pinged, by
/// default.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered, by default: a session whose server
/// has answered nothing for `ping_interval + ping_timeout` (4 s) is given
/// up (its leases told, its connection closed once their grace has passed).
pub const DEFAULT_PING_TIMEOUT: Duration = Duration::from_secs(3);
/// The server's `idle_session_timeout` for distlock's sessions, by default:
/// a session the server has heard nothing from for this long is ended by
/// the server, with its locks, whatever sits between it and the holder.
pub const DEFAULT_IDLE_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`PostgresLocker`]: start from a URL with
/// [`PostgresLocker::builder`], adjust, then [`build`](Self::build).
///
/// Every option can also be given in the URL (see the
/// [module docs](super#url)); a builder call overrides the URL.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::postgres::PostgresLocker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = PostgresLocker::builder("postgres://app:secret@db.internal/app?sslmode=verify-full")?
///     .namespace("billing")
///     .fencing_table(Some("ops"), "distlock_fencing")
///     .sessions(8)
///     .max_waiters(32)
///     .query_timeout(Duration::from_secs(5))
///     .build()
///     .await?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresLockerBuilder {
    pub(super) pg: tokio_postgres::Config,
    ssl_mode: SslMode,
    root_certs: RootCerts,
    namespace: String,
    common: SqlOptions,
    ping_interval: Duration,
    ping_timeout: Duration,
    idle_session_timeout: Option<Duration>,
    client_keepalive: TcpKeepalive,
    server_keepalive: Option<TcpKeepalive>,
    /// Client keepalive options the URL set itself (kept over our defaults).
    url_keepalive: UrlKeepalive,
}

#[derive(Debug, Clone, Copy, Default)]
struct UrlKeepalive {
    idle: bool,
    interval: bool,
    retries: bool,
}

impl PostgresLockerBuilder {
    /// Parses a `postgres://` or `postgresql://` URL (see the
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

    /// Starts from a tokio-postgres [`Config`](tokio_postgres::Config) you
    /// already have. Its `sslmode` is kept (`disable`, `prefer` or `require`;
    /// use [`ssl_mode`](Self::ssl_mode) for certificate checks), and
    /// distlock's keepalive defaults apply.
    pub fn from_config(config: tokio_postgres::Config) -> Self {
        let ssl_mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        PostgresLockerBuilder {
            pg: config,
            ssl_mode,
            root_certs: RootCerts::default(),
            namespace: String::new(),
            common: SqlOptions::new(DEFAULT_QUERY_TIMEOUT),
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            idle_session_timeout: Some(DEFAULT_IDLE_SESSION_TIMEOUT),
            client_keepalive: TcpKeepalive::CLIENT,
            server_keepalive: Some(TcpKeepalive::SERVER),
            url_keepalive: UrlKeepalive::default(),
        }
    }

    /// The field table's Postgres part: sets `key` (a name of
    /// [`PARAMETERS`](sources::PARAMETERS) past
    /// [`SQL_PARAMETERS`](crate::config::SQL_PARAMETERS)) from text.
    fn set_own(&mut self, key: &str, value: &str, source: Source<'_>) -> Checked {
        match key {
            "key_prefix" => self.namespace = value.to_owned(),
            "ping_interval" => self.ping_interval = parse(source, value)?,
            "ping_timeout" => self.ping_timeout = parse(source, value)?,
            "idle_session_timeout" => {
                self.idle_session_timeout = match value.trim() {
                    "off" | "0" => None,
                    _ => Some(parse(source, value)?),
                }
            }
            "server_keepalives" => {
                if !parse::<bool>(source, value)? {
                    self.server_keepalive = None;
                }
            }
            "sslmode" => self.ssl_mode = SslMode::parse(value).map_err(reason)?,
            "sslrootcert" => {
                self.root_certs = match value {
                    "system" => RootCerts::System,
                    path => RootCerts::File(path.into()),
                }
            }
            "sslcert" | "sslkey" => {
                return Err(format!(
                    "{source}: client certificates are not supported; authenticate with a password"
                ))
            }
            // libpq's parameters keep libpq's units for a bare number, so a
            // URL means the same to psql.
            "connect_timeout" => {
                let timeout = libpq_duration(source, value, Duration::from_secs, "seconds")?;
                self.pg.connect_timeout(timeout);
            }
            "keepalives_idle" => {
                let idle = libpq_duration(source, value, Duration::from_secs, "seconds")?;
                self.pg.keepalives_idle(idle);
                self.url_keepalive.idle = true;
            }
            "keepalives_interval" => {
                let interval = libpq_duration(source, value, Duration::from_secs, "seconds")?;
                self.pg.keepalives_interval(interval);
                self.url_keepalive.interval = true;
            }
            "tcp_user_timeout" => {
                self.client_keepalive.user_timeout =
                    libpq_duration(source, value, Duration::from_millis, "milliseconds")?;
            }
            other => return Err(format!("{source}: {other:?} is not a Postgres parameter")),
        }
        Ok(())
    }

    /// Prefixes every key before hashing it (see
    /// [`advisory_key`](super::advisory_key)), so applications sharing one
    /// database cannot collide by choosing the same key names. Default: none.
    /// URL `key_prefix` (or the older `namespace`, `prefix`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    crate::config::sql_builder_options! {
        bare_lock: "pg_try_advisory_lock",
        default_schema: "the connection's current schema",
    }

    crate::config::setters! {
        /// How long a session may go without an answer from the server before
        /// it is pinged (default [`DEFAULT_PING_INTERVAL`]; URL
        /// `ping_interval`). Every session, idle or holding, is kept talking at
        /// this pace, so that a silent server is noticed by an answer that does
        /// not come, whatever sits between (see
        /// [Lost locks](super#semantics)).
        ping_interval(Duration) => ping_interval;

        /// How long a ping may go unanswered (default [`DEFAULT_PING_TIMEOUT`];
        /// URL `ping_timeout`): a session that has answered nothing for
        /// `ping_interval + ping_timeout` is given up: its leases fire their
        /// lost signal at once, and its connection is closed once their grace
        /// has passed (closing it sooner would free their locks at once on a
        /// server that was alive after all). A ping judged late because this
        /// process itself stalled is sent again rather than judged. Any statement on a shared session must be answered
        /// within that too, so the sessions' `lock_timeout` is at most half the
        /// ping timeout.
        ping_timeout(Duration) => ping_timeout;

        /// The server's `idle_session_timeout` for this locker's sessions
        /// (default [`DEFAULT_IDLE_SESSION_TIMEOUT`]; URL
        /// `idle_session_timeout`, `off` for none; Postgres 14 and later): the
        /// server ends a session it has heard nothing from for this long, and
        /// frees its locks, whatever sits between it and the holder (a pooler
        /// that keeps the server session open for a vanished client, a proxy
        /// that answers the server's keepalive). The pings keep a live holder's
        /// sessions well inside it. `None` leaves it off.
        idle_session_timeout(Option<Duration>) => idle_session_timeout;

        /// Whether TLS is used and what is checked (default: the URL's
        /// `sslmode`, else [`SslMode::Prefer`]).
        ssl_mode(SslMode) => ssl_mode;

        /// The trusted roots for [`SslMode::VerifyCa`] and
        /// [`SslMode::VerifyFull`] (default: the URL's `sslrootcert`, else the
        /// system store).
        root_certs(RootCerts) => root_certs;

        /// The server's TCP keepalive for this client's sessions (default
        /// [`TcpKeepalive::SERVER`]): how fast the server frees the locks
        /// of a holder that vanished. Set with `SET` when a session opens;
        /// `None` leaves the server's configuration alone.
        server_keepalive(Option<TcpKeepalive>) => server_keepalive;
    }

    /// How long opening a connection may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], unless the URL sets `connect_timeout`).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.pg.connect_timeout(timeout);
        self
    }

    /// This client's TCP keepalive (default [`TcpKeepalive::CLIENT`]): how
    /// fast a holder learns its session died.
    pub fn client_keepalive(mut self, keepalive: TcpKeepalive) -> Self {
        self.client_keepalive = keepalive;
        self.url_keepalive = UrlKeepalive::default();
        self
    }

    /// Opens the first session (so a wrong password or an unreachable server
    /// fails here, not at the first lock), creates the fencing table if
    /// missing, and returns the locker.
    pub async fn build(self) -> Result<PostgresLocker> {
        PostgresLocker::start(self.into_settings()?).await
    }

    fn into_settings(mut self) -> Result<Settings> {
        validate_namespace(&self.namespace)?;
        let shared = self
            .common
            .clone()
            .into_settings(self.target(), self.namespace.clone())?;
        if self.ping_interval.is_zero() || self.ping_timeout.is_zero() {
            return Err(Error::invalid(
                "ping_interval",
                "ping_interval and ping_timeout must be positive",
            ));
        }
        if let Some(idle) = self.idle_session_timeout {
            let silence_limit = self.ping_interval.saturating_add(self.ping_timeout);
            if idle <= silence_limit.saturating_add(self.ping_interval) {
                return Err(Error::invalid(
                    "idle_session_timeout",
                    format!(
                        "idle_session_timeout is {idle:?}; it must be longer than \
                         2 × ping_interval + ping_timeout ({:?}), or the server would end \
                         sessions a live holder is still pinging (or set it off)",
                        silence_limit.saturating_add(self.ping_interval)
                    ),
                ));
            }
        }
        let tls = Tls::new(self.ssl_mode, &self.root_certs)?;
        self.apply_connection_defaults();
        self.check_pings_fit_the_server_window()?;
        Ok(Settings {
            shared,
            pg: self.pg,
            tls,
            ping_interval: self.ping_interval,
            ping_timeout: self.ping_timeout,
            idle_session_timeout: self.idle_session_timeout,
            server_keepalive: self.server_keepalive,
        })
    }

    /// A holder must hear of a silent server before the server may free its
    /// locks: `ping_interval + ping_timeout` shorter than the server window
    /// (see [`Settings::server_window`]), or the lost signal would come with
    /// no grace, after the lock may be someone else's. (With the server's
    /// keepalive left alone nothing is promised anyway: no check.)
    fn check_pings_fit_the_server_window(&self) -> Result<()> {
        let silence_limit = self.ping_interval.saturating_add(self.ping_timeout);
        let window = server_window(self.server_keepalive, self.idle_session_timeout);
        if !window.is_zero() && silence_limit >= window {
            return Err(Error::invalid(
                "ping_timeout",
                format!(
                    "ping_interval + ping_timeout is {silence_limit:?}, not shorter than the \
                     {window:?} the server keeps a silent holder's locks (its keepalive and \
                     idle_session_timeout): a holder would learn of a silent server only after \
                     its locks may be someone else's; shorten the pings or lengthen \
                     idle_session_timeout"
                ),
            ));
        }
        Ok(())
    }

    /// distlock's defaults where the URL was silent: short keepalives, a
    /// connect timeout, an application name to find its sessions by, and
    /// `target_session_attrs=read-write` (a lock taken on a standby excludes
    /// nobody on the primary).
    fn apply_connection_defaults(&mut self) {
        let pg = &mut self.pg;
        pg.ssl_mode(self.ssl_mode.wire());
        pg.keepalives(true);
        let keepalive = self.client_keepalive;
        if !self.url_keepalive.idle {
            pg.keepalives_idle(keepalive.idle);
        }
        if !self.url_keepalive.interval {
            pg.keepalives_interval(keepalive.interval);
        }
        if !self.url_keepalive.retries {
            pg.keepalives_retries(keepalive.retries);
        }
        pg.tcp_user_timeout(keepalive.user_timeout);
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if pg.get_application_name().is_none() {
            pg.application_name(DEFAULT_APPLICATION_NAME);
        }
        if pg.get_target_session_attrs() == TargetSessionAttrs::Any {
            pg.target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
    }
}

/// The `application_name` of distlock's sessions unless the URL names one.
pub const DEFAULT_APPLICATION_NAME: &str = "distlock";

/// Everything a running locker needs, fixed at build time.
#[derive(Debug)]
pub(crate) struct Settings {
    /// What every SQL backend's settings hold (the target, the key prefix,
    /// the fencing table and the shared options), read as fields of these
    /// settings (`settings.query_timeout`) through `Deref`.
    pub(super) shared: SqlSettings<PostgresIdentifiers>,
    pub(super) pg: tokio_postgres::Config,
    pub(super) tls: Tls,
    /// A session silent this long is pinged.
    pub(super) ping_interval: Duration,
    /// A ping unanswered this long closes its session.
    pub(super) ping_timeout: Duration,
    /// Set as the server's `idle_session_timeout` on every session.
    pub(super) idle_session_timeout: Option<Duration>,
    pub(super) server_keepalive: Option<TcpKeepalive>,
}

impl Settings {
    /// The `lock_timeout` of every session (shared and waiter, outside a
    /// wait's own): half the query timeout, and at most half the ping
    /// timeout, so a statement blocked on a heavyweight lock (another
    /// client's `SELECT … FOR UPDATE` of a fencing row, an `ALTER TABLE` of
    /// the table) fails on the server, and so releases the session for the
    /// locks pipelined behind it, before the client gives up on it, and
    /// before the session's silence could be taken for a silent server. At
    /// least 1 ms (0 would mean none).
    pub(super) fn session_lock_timeout_ms(&self) -> u64 {
        let half = self.query_timeout.min(self.ping_timeout).as_millis() / 2;
        u64::try_from(half)
            .unwrap_or(u64::MAX)
            .clamp(1, i32::MAX as u64)
    }

    /// How long a session may answer nothing before the client closes it:
    /// `ping_interval + ping_timeout`. A live session is never that quiet:
    /// it is pinged after `ping_interval` of silence, and a ping (or any
    /// statement, whose server-side blocking `lock_timeout` bounds) is
    /// answered within `ping_timeout`.
    #[cfg(test)]
    fn silence_limit(&self) -> Duration {
        self.ping_interval.saturating_add(self.ping_timeout)
    }

    /// How long after the client sent a statement that the server answered
    /// the server keeps this session's locks at the least, whatever happens
    /// next (a partition, a vanished holder, a hop in between that goes
    /// silent): the earliest of the ways the server ends a silent session,
    ///
    /// - its TCP keepalive, set per session ([`TcpKeepalive::SERVER`]): the
    ///   server heard that statement after it was sent, and gives up on a
    ///   silent peer no sooner than `earliest_detection()` after it last
    ///   heard from it; `idle` is taken off, as the peer that answers its
    ///   probes may be a proxy's kernel that stops answering a probe
    ///   interval before the last segment the server counted;
    /// - `idle_session_timeout`, counted by the server from the end of the
    ///   session's last statement, which is after it was sent.
    ///
    /// Zero when the server's keepalive is left alone
    /// (`server_keepalives=off`): the server's own settings are unknown, so
    /// nothing is promised. A holder that learns its session is gone keeps
    /// treating its locks as held until `sent + server_window()` (see
    /// [`Session`](super::session::Session)); none of this holds for a holder
    /// paused through it (fencing tokens are the remedy), nor for a pooler
    /// between client and server whose own keepalive gives up on the client
    /// sooner (the module docs say what it must be configured with).
    pub(super) fn server_window(&self) -> Duration {
        server_window(self.server_keepalive, self.idle_session_timeout)
    }

    /// The grace a holder still has when its session is declared dead at the
    /// silence limit: `server_window() − silence_limit()` (6 s with the
    /// defaults). The module docs quote it.
    #[cfg(test)]
    fn grace_at_silence_limit(&self) -> Duration {
        self.server_window().saturating_sub(self.silence_limit())
    }
}

impl PostgresLockerBuilder {
    /// `postgres://user@host:port,host2:port/dbname`: where it points,
    /// never with its password.
    fn target(&self) -> String {
        describe_target(&self.pg)
    }
}

/// See [`PostgresLockerBuilder::target`].
fn describe_target(pg: &tokio_postgres::Config) -> String {
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{name}:{port}")
        })
        .collect();
    let db = format!("/{}", pg.get_dbname().unwrap_or_default());
    display_url("postgres", pg.get_user(), &hosts.join(","), &db)
}

/// A libpq duration parameter: units accepted, a bare number in `unit`
/// (see [`crate::config`]).
fn libpq_duration(
    source: Source<'_>,
    value: &str,
    bare: fn(u64) -> Duration,
    unit: &str,
) -> Checked<Duration> {
    parse_duration_bare(source, value, bare, &format!("{unit}, as in libpq"))
}

#[cfg(test)]
mod tests;
