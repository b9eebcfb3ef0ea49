//! Settings of a [`PostgresLocker`](super::PostgresLocker): from a URL, then
//! adjusted through [`PostgresLockerBuilder`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use tokio_postgres::config::{Host, TargetSessionAttrs};

use super::fencing::FencingTable;
use super::keys::validate_namespace;
use super::tls::{RootCerts, SslMode, Tls};
use super::PostgresLocker;
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
/// How long any one statement may go unanswered, by default.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a connection may take, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
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

/// TCP keepalive and user-timeout settings for one side of a connection.
///
/// A silent peer (host down, network partition) is detected after about
/// `idle + interval × retries` without traffic, or after `user_timeout` when
/// data sent to it stays unacknowledged. The kernel defaults (2 hours idle)
/// would let a dead holder's lock stand for hours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Silence before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub retries: u32,
    /// How long sent data may stay unacknowledged (`TCP_USER_TIMEOUT`).
    pub user_timeout: Duration,
}

impl TcpKeepalive {
    /// This client's side: idle 1 s, every 1 s, 3 probes, user timeout 4 s:
    /// a silent server is declared dead at most 4 s after the last segment
    /// heard from it ([`latest_detection`](Self::latest_detection)).
    ///
    /// It only speeds up noticing the death of a direct connection: the
    /// bound a holder relies on comes from the pings, which a proxy between
    /// client and server cannot answer in the server's place (see
    /// [`PostgresLocker`](super::PostgresLocker)'s "Lost locks" and
    /// [`PostgresLockerBuilder::ping_timeout`]).
    pub const CLIENT: TcpKeepalive = TcpKeepalive {
        idle: Duration::from_secs(1),
        interval: Duration::from_secs(1),
        retries: 3,
        user_timeout: Duration::from_secs(4),
    };

    /// The server's side, set per session: idle 2 s, every 2 s, 5 probes,
    /// user timeout 12 s: a vanished holder's locks are freed 12 s after the
    /// server last heard from it, which is at most 2 s before the holder
    /// went silent (the server's own probes are answered until then), so
    /// 10 to 12 s after.
    pub const SERVER: TcpKeepalive = TcpKeepalive {
        idle: Duration::from_secs(2),
        interval: Duration::from_secs(2),
        retries: 5,
        user_timeout: Duration::from_secs(12),
    };

    /// About how long a silent peer takes to be declared dead: the later of
    /// the two ways ([`latest_detection`](Self::latest_detection), ignoring
    /// a zero `user_timeout`).
    pub fn detection_time(&self) -> Duration {
        self.probes_time().max(self.user_timeout)
    }

    /// `idle + interval × retries`: when unanswered keepalive probes give
    /// up, counted from the last segment heard from the peer.
    fn probes_time(&self) -> Duration {
        self.idle
            .saturating_add(self.interval.saturating_mul(self.retries))
    }

    /// The soonest this side can declare a silent peer dead:
    /// `min(user_timeout, idle + interval × retries)` (Linux's
    /// `TCP_USER_TIMEOUT` also cuts keepalive probing short, tcp(7)). A zero
    /// `user_timeout` means the kernel default (none): probes only.
    pub fn earliest_detection(&self) -> Duration {
        if self.user_timeout.is_zero() {
            return self.probes_time();
        }
        self.probes_time().min(self.user_timeout)
    }

    /// The latest this side declares a silent peer dead, whether it was
    /// idle (probes) or sending (`user_timeout`):
    /// `max(user_timeout, idle + interval × retries)`. `None` with a zero
    /// `user_timeout`: unacknowledged data is then retransmitted for the
    /// kernel's `tcp_retries2` (about 15 minutes), which is no bound to
    /// build on.
    pub fn latest_detection(&self) -> Option<Duration> {
        (!self.user_timeout.is_zero()).then(|| self.probes_time().max(self.user_timeout))
    }
}

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
    fencing_enabled: bool,
    /// `(schema, table)`, checked at build time; `None` for the default.
    fencing_table: Option<(Option<String>, String)>,
    holder_record: bool,
    sessions: usize,
    idle_waiters: usize,
    max_waiters: usize,
    query_timeout: Duration,
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
    user_timeout: bool,
}

impl fmt::Debug for PostgresLockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockerBuilder")
            .field("target", &describe_target(&self.pg))
            .field("ssl_mode", &self.ssl_mode)
            .field("namespace", &self.namespace)
            .field("fencing", &self.fencing_enabled)
            .field("sessions", &self.sessions)
            .field("max_waiters", &self.max_waiters)
            .finish_non_exhaustive()
    }
}

/// The query parameters distlock reads itself; the rest go to tokio-postgres.
const OWN_PARAMS: &[&str] = &[
    "namespace",
    "fencing",
    "fencing_table",
    "holder",
    "idle_session_timeout",
    "sessions",
    "idle_waiters",
    "max_waiters",
    "ping_interval",
    "ping_timeout",
    "query_timeout",
    "server_keepalives",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "tcp_user_timeout",
];

impl PostgresLockerBuilder {
    /// Parses a `postgres://` or `postgresql://` URL (see the
    /// [module docs](super#url) for the parameters).
    pub fn from_url(url: &str) -> Result<Self> {
        let (scheme, _) = url.split_once("://").ok_or_else(|| {
            Error::invalid(
                "url",
                "a Postgres URL starts with postgres:// or postgresql://",
            )
        })?;
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(Error::invalid(
                "url",
                format!("{scheme}:// is not a Postgres URL; use postgres:// or postgresql://"),
            ));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut own = Vec::new();
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name)?;
            if OWN_PARAMS.contains(&name.as_str()) {
                own.push((name, decode(value)?));
            } else {
                passed_on.push(pair);
            }
        }
        let rebuilt = if passed_on.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed_on.join("&"))
        };
        let pg = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
            // Never echo the URL: it may hold a password.
            Error::invalid("url", format!("not a valid Postgres URL: {e}"))
        })?;
        let mut builder = Self::from_config(pg);
        let url_sets = |name: &str| passed_on.iter().any(|p| p.split('=').next() == Some(name));
        builder.url_keepalive = UrlKeepalive {
            idle: url_sets("keepalives_idle"),
            interval: url_sets("keepalives_interval"),
            retries: url_sets("keepalives_retries"),
            user_timeout: false,
        };
        for (name, value) in own {
            builder.apply_param(&name, &value)?;
        }
        Ok(builder)
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
            fencing_enabled: true,
            fencing_table: None,
            holder_record: true,
            sessions: DEFAULT_SESSIONS,
            idle_waiters: DEFAULT_IDLE_WAITERS,
            max_waiters: DEFAULT_MAX_WAITERS,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            idle_session_timeout: Some(DEFAULT_IDLE_SESSION_TIMEOUT),
            client_keepalive: TcpKeepalive::CLIENT,
            server_keepalive: Some(TcpKeepalive::SERVER),
            url_keepalive: UrlKeepalive::default(),
        }
    }

    fn apply_param(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "namespace" => self.namespace = value.to_owned(),
            "fencing" => self.fencing_enabled = parse_switch(name, value)?,
            "fencing_table" => self.fencing_table = Some(FencingTable::split(value)),
            "holder" => self.holder_record = parse_switch(name, value)?,
            "sessions" => self.sessions = parse_number(name, value)?,
            "idle_waiters" => self.idle_waiters = parse_number(name, value)?,
            "max_waiters" => {
                self.max_waiters = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_MAX_WAITERS).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(
                            "url",
                            format!(
                                "{name}={value:?}: expected an integer from 1 to {MAX_MAX_WAITERS}"
                            ),
                        )
                    })?;
            }
            "query_timeout" => self.query_timeout = Duration::from_secs(parse_number(name, value)?),
            "ping_interval" => self.ping_interval = parse_duration(name, value)?,
            "ping_timeout" => self.ping_timeout = parse_duration(name, value)?,
            "idle_session_timeout" => {
                self.idle_session_timeout = match value {
                    "off" | "0" => None,
                    _ => Some(parse_duration(name, value)?),
                }
            }
            "server_keepalives" => {
                if !parse_switch(name, value)? {
                    self.server_keepalive = None;
                }
            }
            "sslmode" => self.ssl_mode = SslMode::parse(value)?,
            "sslrootcert" => {
                self.root_certs = match value {
                    "system" => RootCerts::System,
                    path => RootCerts::File(path.into()),
                }
            }
            "sslcert" | "sslkey" => {
                return Err(Error::invalid(
                    "url",
                    format!(
                    "{name}: client certificates are not supported; authenticate with a password"
                ),
                ))
            }
            // libpq's unit is milliseconds (tokio-postgres reads seconds).
            "tcp_user_timeout" => {
                self.client_keepalive.user_timeout =
                    Duration::from_millis(parse_number(name, value)?);
                self.url_keepalive.user_timeout = true;
            }
            // OWN_PARAMS and this match list the same names.
            _ => {
                return Err(Error::invalid(
                    "url",
                    format!("parameter {name:?} is not handled (a distlock bug)"),
                ))
            }
        }
        Ok(())
    }

    /// Prefixes every key before hashing it (see
    /// [`advisory_key`](super::advisory_key)), so applications sharing one
    /// database cannot collide by choosing the same key names. Default: none.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Turns fencing tokens on (the default) or off. Off, acquires are a bare
    /// `pg_try_advisory_lock`, no table is created, and leases carry no
    /// fencing token.
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing_enabled = enabled;
        self
    }

    /// Records each grant's [`Holder`](crate::inspect::Holder) (host, pid,
    /// label) and ttl in the key's fencing row (the default), for
    /// [`Locker::inspect`](crate::Locker::inspect). Off (URL `holder=off`),
    /// grants clear those columns instead, so inspection reports the lock,
    /// its session, grant time and token, but an unknown holder. Without
    /// fencing there is no row and nothing is recorded either way.
    pub fn holder_record(mut self, enabled: bool) -> Self {
        self.holder_record = enabled;
        self
    }

    /// Where fencing counters live: `table` in `schema`, or in the
    /// connection's current schema when `None`. Default:
    /// `distlock_fencing` in the current schema. Created if missing.
    pub fn fencing_table(mut self, schema: Option<&str>, table: &str) -> Self {
        self.fencing_table = Some((schema.map(str::to_owned), table.to_owned()));
        self
    }

    /// How many shared sessions carry locks taken without waiting (default
    /// [`DEFAULT_SESSIONS`]). Each key always uses the same one. At least 1.
    pub fn sessions(mut self, sessions: usize) -> Self {
        self.sessions = sessions;
        self
    }

    /// How many idle connections are kept for the next native wait (default
    /// [`DEFAULT_IDLE_WAITERS`]); 0 closes each after use. They count
    /// toward [`max_waiters`](Self::max_waiters).
    pub fn idle_waiters(mut self, idle_waiters: usize) -> Self {
        self.idle_waiters = idle_waiters;
        self
    }

    /// How many waiter connections may be open at once (default
    /// [`DEFAULT_MAX_WAITERS`]): each native wait of [`Locker::lock`]
    /// needs one, and keeps it while it holds the lock it won; idle ones
    /// count too. When all are in use, `lock` polls the shared sessions
    /// instead (see [Connections](super#connections)). At least 1.
    ///
    /// [`Locker::lock`]: crate::Locker::lock
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// How long any one statement may go unanswered before the call fails
    /// (default [`DEFAULT_QUERY_TIMEOUT`]). A native wait gets its own
    /// timeout plus this.
    pub fn query_timeout(mut self, timeout: Duration) -> Self {
        self.query_timeout = timeout;
        self
    }

    /// How long a session may go without an answer from the server before
    /// it is pinged (default [`DEFAULT_PING_INTERVAL`]; URL
    /// `ping_interval`). Every session, idle or holding, is kept talking at
    /// this pace, so that a silent server is noticed by an answer that does
    /// not come, whatever sits between (see
    /// [Lost locks](super#semantics)).
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// How long a ping may go unanswered (default [`DEFAULT_PING_TIMEOUT`];
    /// URL `ping_timeout`): a session that has answered nothing for
    /// `ping_interval + ping_timeout` is given up: its leases fire their
    /// lost signal at once, and its connection is closed once their grace
    /// has passed (closing it sooner would free their locks at once on a
    /// server that was alive after all). A ping judged late because this
    /// process itself stalled is sent again rather than judged. Any statement on a shared session must be answered
    /// within that too, so the sessions' `lock_timeout` is at most half the
    /// ping timeout.
    pub fn ping_timeout(mut self, timeout: Duration) -> Self {
        self.ping_timeout = timeout;
        self
    }

    /// The server's `idle_session_timeout` for this locker's sessions
    /// (default [`DEFAULT_IDLE_SESSION_TIMEOUT`]; URL
    /// `idle_session_timeout`, `off` for none; Postgres 14 and later): the
    /// server ends a session it has heard nothing from for this long, and
    /// frees its locks, whatever sits between it and the holder (a pooler
    /// that keeps the server session open for a vanished client, a proxy
    /// that answers the server's keepalive). The pings keep a live holder's
    /// sessions well inside it. `None` leaves it off.
    pub fn idle_session_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_session_timeout = timeout;
        self
    }

    /// How long opening a connection may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], unless the URL sets `connect_timeout`).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.pg.connect_timeout(timeout);
        self
    }

    /// Whether TLS is used and what is checked (default: the URL's
    /// `sslmode`, else [`SslMode::Prefer`]).
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.ssl_mode = mode;
        self
    }

    /// The trusted roots for [`SslMode::VerifyCa`] and
    /// [`SslMode::VerifyFull`] (default: the URL's `sslrootcert`, else the
    /// system store).
    pub fn root_certs(mut self, roots: RootCerts) -> Self {
        self.root_certs = roots;
        self
    }

    /// This client's TCP keepalive (default [`TcpKeepalive::CLIENT`]): how
    /// fast a holder learns its session died.
    pub fn client_keepalive(mut self, keepalive: TcpKeepalive) -> Self {
        self.client_keepalive = keepalive;
        self.url_keepalive = UrlKeepalive::default();
        self
    }

    /// The server's TCP keepalive for this client's sessions (default
    /// [`TcpKeepalive::SERVER`]): how fast the server frees the locks of a
    /// holder that vanished. Set with `SET` when a session opens; `None`
    /// leaves the server's configuration alone.
    pub fn server_keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.server_keepalive = keepalive;
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
        if self.sessions == 0 {
            return Err(Error::invalid("sessions", "at least one session is needed"));
        }
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
        let fencing = match (self.fencing_enabled, &self.fencing_table) {
            (false, _) => None,
            (true, Some((schema, table))) => Some(FencingTable::new(schema.as_deref(), table)?),
            (true, None) => Some(FencingTable::default()),
        };
        let tls = Tls::new(self.ssl_mode, &self.root_certs)?;
        self.apply_connection_defaults();
        self.check_pings_fit_the_server_window()?;
        Ok(Settings {
            target: describe_target(&self.pg),
            pg: self.pg,
            tls,
            namespace: self.namespace,
            fencing,
            holder_record: self.holder_record,
            sessions: self.sessions,
            idle_waiters: self.idle_waiters,
            max_waiters: self.max_waiters,
            query_timeout: self.query_timeout,
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
pub(super) struct Settings {
    /// `postgres://user@host:port/db`: for errors and `Debug`, no password.
    pub(super) target: String,
    pub(super) pg: tokio_postgres::Config,
    pub(super) tls: Tls,
    pub(super) namespace: String,
    pub(super) fencing: Option<FencingTable>,
    /// Grants record their holder in the fencing row.
    pub(super) holder_record: bool,
    pub(super) sessions: usize,
    pub(super) idle_waiters: usize,
    pub(super) max_waiters: usize,
    pub(super) query_timeout: Duration,
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

/// See [`Settings::server_window`].
fn server_window(
    server_keepalive: Option<TcpKeepalive>,
    idle_session_timeout: Option<Duration>,
) -> Duration {
    let Some(server) = server_keepalive else {
        return Duration::ZERO;
    };
    let keepalive = server.earliest_detection().saturating_sub(server.idle);
    match idle_session_timeout {
        Some(idle) => keepalive.min(idle),
        None => keepalive,
    }
}

/// `postgres://user@host:port,host2:port/dbname`: where a config points,
/// never with its password.
pub(super) fn describe_target(pg: &tokio_postgres::Config) -> String {
    let user = pg.get_user().map(|u| format!("{u}@")).unwrap_or_default();
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
    let db = pg.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

fn decode(text: &str) -> Result<String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::invalid("url", "a query parameter is not valid UTF-8 once decoded"))
}

fn parse_switch(name: &str, value: &str) -> Result<bool> {
    match value {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        other => Err(Error::invalid(
            "url",
            format!("{name}={other:?}: expected on or off"),
        )),
    }
}

/// A duration parameter: `500ms`, `2s`, `1m`; a bare number is seconds.
fn parse_duration(name: &str, value: &str) -> Result<Duration> {
    if let Ok(seconds) = value.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(value).map_err(|e| {
        Error::invalid(
            "url",
            format!("{name}={value:?}: expected a duration like 500ms or 2s ({e})"),
        )
    })
}

fn parse_number<T: FromStr>(name: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::invalid(
            "url",
            format!("{name}={value:?}: expected a non-negative integer"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> Result<Settings> {
        PostgresLockerBuilder::from_url(url)?.into_settings()
    }

    #[test]
    fn own_parameters_are_read_and_the_rest_passed_on() {
        let s = settings(
            "postgresql://app:pw@db:6543/jobs?namespace=billing&sessions=2&fencing_table=ops.fence\
             &sslmode=disable&application_name=cron&connect_timeout=3&tcp_user_timeout=2500",
        )
        .unwrap();
        assert_eq!(s.namespace, "billing");
        assert_eq!(s.sessions, 2);
        assert_eq!(s.fencing, Some(FencingTable::parse("ops.fence").unwrap()));
        assert_eq!(s.pg.get_application_name(), Some("cron"));
        assert_eq!(s.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(
            s.pg.get_tcp_user_timeout(),
            Some(&Duration::from_millis(2500))
        );
        assert_eq!(s.target, "postgres://app@db:6543/jobs");
    }

    #[test]
    fn defaults_are_short_keepalives_and_read_write_sessions() {
        let s = settings("postgres://u@h/d?sslmode=disable").unwrap();
        assert_eq!(s.pg.get_keepalives_idle(), TcpKeepalive::CLIENT.idle);
        assert_eq!(s.pg.get_keepalives_retries(), Some(3));
        assert_eq!(
            s.pg.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(s.pg.get_application_name(), Some(DEFAULT_APPLICATION_NAME));
        assert_eq!(s.fencing, Some(FencingTable::default()));
        assert_eq!(s.server_keepalive, Some(TcpKeepalive::SERVER));
        let s = settings(
            "postgres://u@h/d?sslmode=disable&keepalives_idle=30&fencing=off&server_keepalives=off",
        )
        .unwrap();
        assert_eq!(s.pg.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(s.fencing, None);
        assert_eq!(s.server_keepalive, None);
    }

    #[test]
    fn bad_urls_are_invalid_input_without_the_password() {
        for url in [
            "mysql://u:hunter2@h/d",
            "postgres://u:hunter2@h/d?sslmode=allow",
            "postgres://u:hunter2@h/d?sessions=many",
            "postgres://u:hunter2@h/d?sslcert=/c.pem",
            "postgres://u:hunter2@h:notaport/d",
            "postgres://u:hunter2@h/d?fencing_table=a.b.c",
            "postgres://u:hunter2@h/d?sessions=0",
        ] {
            let err = settings(url).unwrap_err();
            assert!(err.to_string().contains("invalid"), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{url}: {err}");
        }
    }

    #[test]
    fn max_waiters_is_read_from_the_url_and_must_be_positive() {
        assert_eq!(
            settings("postgres://u@h/d").unwrap().max_waiters,
            DEFAULT_MAX_WAITERS
        );
        let s = settings("postgres://u@h/d?max_waiters=2&idle_waiters=1").unwrap();
        assert_eq!((s.max_waiters, s.idle_waiters), (2, 1));
        for value in ["0", "-1", "many", "", "2.5", "99999999999999999999999"] {
            let url = format!("postgres://u:hunter2@h/d?max_waiters={value}");
            match settings(&url) {
                Err(Error::InvalidInput {
                    what: "url",
                    reason,
                }) => {
                    assert!(reason.contains("max_waiters"), "{value:?}: {reason}");
                    assert!(!reason.contains("hunter2"), "{value:?}: {reason}");
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
        // The builder overrides the URL, and checks the same range.
        let builder = PostgresLockerBuilder::from_url("postgres://u@h/d?max_waiters=2").unwrap();
        assert_eq!(
            builder
                .clone()
                .max_waiters(5)
                .into_settings()
                .unwrap()
                .max_waiters,
            5
        );
        assert!(matches!(
            builder.max_waiters(0).into_settings(),
            Err(Error::InvalidInput {
                what: "max_waiters",
                ..
            })
        ));
    }

    #[test]
    fn debug_never_shows_the_password() {
        let builder = PostgresLockerBuilder::from_url("postgres://u:hunter2@h/d").unwrap();
        assert!(!format!("{builder:?}").contains("hunter2"));
        let s = builder.into_settings().unwrap();
        assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
    }

    #[test]
    fn the_defaults_leave_a_grace_of_six_seconds_after_a_silent_server_is_noticed() {
        assert_eq!(
            TcpKeepalive::SERVER.earliest_detection(),
            Duration::from_secs(12)
        );
        let s = settings("postgres://u@h/d").unwrap();
        assert_eq!(s.pg.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
        assert_eq!(s.silence_limit(), Duration::from_secs(4));
        assert_eq!(s.server_window(), Duration::from_secs(10));
        assert_eq!(s.grace_at_silence_limit(), Duration::from_secs(6));
        assert_eq!(s.session_lock_timeout_ms(), 1500);
        // The client's own TCP timers no longer set the bound: the pings do.
        for url in [
            "postgres://u@h/d?tcp_user_timeout=0",
            "postgres://u@h/d?keepalives_idle=30",
        ] {
            assert_eq!(
                settings(url).unwrap().grace_at_silence_limit(),
                Duration::from_secs(6),
                "{url}"
            );
        }
        // The server's keepalive left alone: nothing known, no grace.
        let s = settings("postgres://u@h/d?server_keepalives=off").unwrap();
        assert_eq!(s.server_window(), Duration::ZERO);
        // A shorter idle_session_timeout shortens the window; off leaves
        // the keepalive's.
        let s = settings("postgres://u@h/d?idle_session_timeout=7s").unwrap();
        assert_eq!(s.server_window(), Duration::from_secs(7));
        assert_eq!(s.grace_at_silence_limit(), Duration::from_secs(3));
        let s = settings("postgres://u@h/d?idle_session_timeout=off").unwrap();
        assert_eq!(s.idle_session_timeout, None);
        assert_eq!(s.server_window(), Duration::from_secs(10));
        // Pings slower than the server window are refused: the holder
        // would hear of a silent server only after its locks may be freed.
        let err =
            settings("postgres://u@h/d?ping_interval=5s&ping_timeout=6s&idle_session_timeout=off")
                .unwrap_err()
                .to_string();
        assert!(err.contains("not shorter than the 10s"), "{err}");
        // With the server's keepalive left alone nothing is promised: no check.
        let s = settings(
            "postgres://u@h/d?ping_interval=5s&ping_timeout=6s&idle_session_timeout=off\
             &server_keepalives=off",
        )
        .unwrap();
        assert_eq!(s.silence_limit(), Duration::from_secs(11));
        assert_eq!(s.grace_at_silence_limit(), Duration::ZERO);
    }

    #[test]
    fn durations_take_units_and_bare_seconds() {
        let s =
            settings("postgres://u@h/d?ping_interval=500ms&ping_timeout=2&idle_session_timeout=1m")
                .unwrap();
        assert_eq!(s.ping_interval, Duration::from_millis(500));
        assert_eq!(s.ping_timeout, Duration::from_secs(2));
        assert_eq!(s.idle_session_timeout, Some(Duration::from_secs(60)));
        for url in [
            "postgres://u:hunter2@h/d?ping_interval=soon",
            "postgres://u:hunter2@h/d?ping_interval=0",
            "postgres://u:hunter2@h/d?ping_timeout=0s",
        ] {
            let err = settings(url).unwrap_err().to_string();
            assert!(err.contains("ping_"), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{url}: {err}");
        }
        // An idle_session_timeout the pings could not stay inside.
        let err = settings("postgres://u@h/d?idle_session_timeout=5s")
            .unwrap_err()
            .to_string();
        assert!(err.contains("idle_session_timeout is 5s"), "{err}");
    }

    #[test]
    fn keepalive_detection_time() {
        assert_eq!(
            TcpKeepalive::CLIENT.detection_time(),
            Duration::from_secs(4)
        );
        assert_eq!(
            TcpKeepalive::SERVER.detection_time(),
            Duration::from_secs(12)
        );
    }
}
