//! What a [`RedisLocker`](super::RedisLocker) connects to and how: [`Config`],
//! read from a URL, environment variables, JSON or YAML.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, TlsCertificates,
};
use serde::{Deserialize, Serialize};
use url::{Host, Url};

pub use crate::config_util::Password;
use crate::config_util::{decoded, duration_text, parse_bool, parse_duration};
use crate::util::redact;
use crate::{Error, Result};

/// The key prefix used unless configured otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "lock:";
/// How long establishing a connection may take, unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the server may take to answer one command, unless configured
/// otherwise.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// The port used when an address or URL names none.
pub const DEFAULT_PORT: u16 = 6379;
/// The port of a sentinel address that names none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// How long an acquire waits for [`Config::min_replicas`] replicas to
/// acknowledge it, unless configured otherwise.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(100);
/// Environment variables read by [`Config::from_env`] start with this.
pub const ENV_PREFIX: &str = "DISTLOCK_REDIS_";

/// The query parameters [`Config::from_url`] understands.
const URL_PARAMETERS: &str =
    "prefix, connect_timeout, response_timeout, min_replicas, replica_timeout, db (sentinel only), \
     ca, client_cert, client_key, holder, allow_eviction, require_appendonly";

/// The URL schemes [`Config::from_url`] reads.
const SCHEMES: &str =
    "redis, rediss, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel";

/// How to reach a Redis deployment (one server, a Redis Cluster, or a master
/// behind Sentinel) and how to name keys in it.
///
/// What [`addresses`](Config::addresses) are depends on two fields:
///
/// | [`cluster`](Config::cluster) | [`sentinel_master`](Config::sentinel_master) | addresses | URL scheme |
/// | --- | --- | --- | --- |
/// | `false` | `None` | exactly one server (a primary) | `redis://`, `rediss://` |
/// | `true` | `None` | seed nodes of a Redis Cluster (any of them will do) | `redis+cluster://`, `rediss+cluster://` |
/// | `false` | `Some(name)` | sentinels monitoring master `name` (port 26379 by default) | `redis+sentinel://`, `rediss+sentinel://` |
///
/// Build it from a URL ([`Config::from_url`]), the environment
/// ([`Config::from_env`]), JSON ([`Config::from_json`]), YAML
/// ([`Config::from_yaml`]), or in code from [`Config::default`]. The field
/// names in JSON and YAML are those of the Go seed this backend descends from
/// (`username`, `password`, `keyPrefix`, `addresses`, plus `db`, `tls`,
/// `tlsCa`, `tlsClientCert`, `tlsClientKey`, `connectTimeout`,
/// `responseTimeout`, `cluster`, `sentinelMaster`, `sentinelUsername`,
/// `sentinelPassword`, `minReplicas`, `replicaTimeout`, `recordHolder`,
/// `allowEviction`, `requireAppendonly`); the snake_case
/// spellings are accepted too, unknown fields are rejected.
///
/// `Debug` never shows the password (see [`Password`]).
///
/// ```
/// use std::time::Duration;
/// use distlock::redis::Config;
///
/// let config = Config {
///     addresses: vec!["10.0.0.5:6380".into()],
///     password: Some("s3cret".into()),
///     response_timeout: Duration::from_millis(250),
///     ..Config::default()
/// };
/// assert_eq!(config.key_prefix, "lock:");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// ACL user name (Redis 6+). `None` authenticates as the `default` user
    /// when a password is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password (`AUTH`); `None` for a server without authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<Password>,
    /// Prepended to every key: the caller's key `k` is stored as
    /// `<key_prefix>{k}` (see [`RedisLocker::backend_key`](super::RedisLocker::backend_key)).
    /// Default [`DEFAULT_KEY_PREFIX`].
    #[serde(alias = "key_prefix")]
    pub key_prefix: String,
    /// `host:port` addresses (`host`, `[::1]:6379`, ... ; the port defaults
    /// to 6379, or 26379 for sentinels). Without [`cluster`](Config::cluster)
    /// or [`sentinel_master`](Config::sentinel_master), exactly one: the
    /// backend then talks to a single node (a primary, or an address that
    /// always leads to the current primary).
    /// The Redlock backend (`distlock::redlock`, feature `redlock`) reads
    /// its list of independent nodes from here.
    pub addresses: Vec<String>,
    /// Database number (`SELECT`). Default 0; a cluster has only database 0.
    pub db: i64,
    /// The addresses are seed nodes of a Redis Cluster: the locker learns the
    /// cluster's slot map from them and routes each lock to its slot's master.
    pub cluster: bool,
    /// The addresses are sentinels, and this is the name of the master they
    /// monitor (`sentinel monitor NAME ...`): the locker asks them for the
    /// master and follows failovers.
    #[serde(alias = "sentinel_master", skip_serializing_if = "Option::is_none")]
    pub sentinel_master: Option<String>,
    /// ACL user name for the sentinels themselves (not the master; for that
    /// see [`username`](Config::username)).
    #[serde(alias = "sentinel_username", skip_serializing_if = "Option::is_none")]
    pub sentinel_username: Option<String>,
    /// Password for the sentinels themselves (`requirepass` in the sentinel's
    /// config), if they demand one.
    #[serde(alias = "sentinel_password", skip_serializing_if = "Option::is_none")]
    pub sentinel_password: Option<Password>,
    /// After each grant, and each mark that was advanced
    /// ([`Locker::advance_mark`](crate::Locker::advance_mark)), wait (Redis
    /// `WAIT`) until at least this many replicas have the write; a shortfall
    /// fails the acquire (the lock is released at once, the error is
    /// [`Error::Backend`], never contention) or the mark (an outage whose
    /// outcome is unknown: the mark stays advanced on the master).
    /// 0 (the default) does not wait. This narrows the window in which a
    /// failover loses a grant; it does not close it (see the [module
    /// docs](super), "Replica acknowledgement").
    #[serde(alias = "min_replicas")]
    pub min_replicas: u32,
    /// How long the `WAIT` of [`min_replicas`](Config::min_replicas) may
    /// take. Default [`DEFAULT_REPLICA_TIMEOUT`]; must be shorter than
    /// [`response_timeout`](Config::response_timeout), since the server holds
    /// the reply that long.
    #[serde(alias = "replica_timeout", with = "duration_text")]
    pub replica_timeout: Duration,
    /// Connect with TLS (rustls on the `ring` provider), as a `rediss://`
    /// URL does. The server's certificate must be valid for the host name
    /// of the address (an IP address must be in the certificate's subject
    /// alternative names) and chain to the system's root certificates, or
    /// to [`tls_ca`](Config::tls_ca) if set.
    pub tls: bool,
    /// A PEM file of the CA certificates that sign the server's
    /// certificate (URL parameter `ca`): they *replace* the system's roots.
    /// Needs [`tls`](Config::tls). Read when the locker is built. Applies
    /// to one server, a cluster's nodes and Redlock's nodes; refused with
    /// [`sentinel_master`](Config::sentinel_master) (as are the client
    /// certificate files), since redis-rs' `Sentinel` takes no certificates.
    #[serde(alias = "tls_ca", skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// A PEM file with the client certificate (and its chain) to present,
    /// for servers that demand one (`tls-auth-clients yes`; URL parameter
    /// `client_cert`). Needs [`tls`](Config::tls) and
    /// [`tls_client_key`](Config::tls_client_key).
    #[serde(alias = "tls_client_cert", skip_serializing_if = "Option::is_none")]
    pub tls_client_cert: Option<PathBuf>,
    /// The PEM file of the client certificate's private key (URL parameter
    /// `client_key`). Its contents are never logged or put in errors.
    #[serde(alias = "tls_client_key", skip_serializing_if = "Option::is_none")]
    pub tls_client_key: Option<PathBuf>,
    /// Bound on establishing one connection (TCP, TLS, `HELLO`/`AUTH`).
    /// Default [`DEFAULT_CONNECT_TIMEOUT`]. Text like `"1s"`, `"500ms"`.
    /// `connect_timeout + response_timeout + 0.7 s` bounds every call of the
    /// locker (see the [module docs](super), "Connections").
    #[serde(alias = "connect_timeout", with = "duration_text")]
    pub connect_timeout: Duration,
    /// Bound on the answer to one command. Default
    /// [`DEFAULT_RESPONSE_TIMEOUT`]. An acquire whose answer times out may
    /// have succeeded (see the [module docs](super)). Also the `PING` period
    /// of the subscriber connection while waiters listen.
    #[serde(alias = "response_timeout", with = "duration_text")]
    pub response_timeout: Duration,
    /// Record who holds each lock (host, pid, label, grant time on the
    /// server's clock, ttl, fencing token) in the lock key's value, after the
    /// owner token, written by the acquire's own `SET` (no extra round trip,
    /// key or command); [`Locker::inspect`]
    /// and [`Locker::list`] report it. Default `true`; URL parameter
    /// `holder=false` turns it off: the lock's value is then the bare owner
    /// token, and grants are inspected as held by an unknown holder (see the [module
    /// docs](super), "Inspection").
    ///
    /// [`Locker::inspect`]: crate::Locker::inspect
    /// [`Locker::list`]: crate::Locker::list
    #[serde(alias = "record_holder")]
    pub record_holder: bool,
    /// Accept a server that may evict keys when its memory fills
    /// (`maxmemory` set and `maxmemory-policy` other than `noeviction`),
    /// with a warning logged at connect. Default `false`: such a server is
    /// refused with [`Error::InvalidInput`] when the locker is built,
    /// because an evicted lock key lets a second caller acquire the lock
    /// (two holders), and under `allkeys-*` an evicted fence counter or
    /// mark makes tokens restart at 1 and finished cron ticks run again.
    /// URL parameter `allow_eviction=true`. See the [module
    /// docs](super), "What the server must be configured with".
    #[serde(alias = "allow_eviction")]
    pub allow_eviction: bool,
    /// Refuse a server that does not write every change to its append-only
    /// file (`appendonly yes`), or whose setting cannot be read, with
    /// [`Error::InvalidInput`] when the locker is built. Default `false`: such
    /// a server is accepted, and [`Locker::durability_warnings`] (printed by
    /// `distlock cron` at start) says what a restart would forget. URL
    /// parameter `require_appendonly=true`.
    ///
    /// [`Locker::durability_warnings`]: crate::Locker::durability_warnings
    #[serde(alias = "require_appendonly")]
    pub require_appendonly: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            username: None,
            password: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            addresses: Vec::new(),
            db: 0,
            tls: false,
            tls_ca: None,
            tls_client_cert: None,
            tls_client_key: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            cluster: false,
            sentinel_master: None,
            sentinel_username: None,
            sentinel_password: None,
            min_replicas: 0,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
            record_holder: true,
            allow_eviction: false,
            require_appendonly: false,
        }
    }
}

impl Config {
    /// Reads a URL:
    ///
    /// - `redis://[user:password@]host[:port][/db][?params]` (one server;
    ///   `rediss://` for TLS);
    /// - `redis+cluster://[user:password@]host1:port,host2:port,...[?params]`
    ///   (seed nodes of a Redis Cluster; `rediss+cluster://` for TLS);
    /// - `redis+sentinel://[user:password@]sentinel1:port,sentinel2:port/MASTER_NAME[?params]`
    ///   (sentinels, port 26379 by default, and the master's name;
    ///   `rediss+sentinel://` for TLS to master and sentinels). The user name
    ///   and password are the master's; the sentinels' are
    ///   [`Config::sentinel_username`] and [`Config::sentinel_password`].
    ///
    /// User name and password are percent-decoded. Parameters:
    /// `prefix` (the key prefix; may be empty), `connect_timeout`,
    /// `response_timeout` and `replica_timeout` (durations such as `2s` or
    /// `250ms`), `min_replicas` (a number), for Sentinel `db` (the master's
    /// database; the path holds the master's name), and for TLS (`rediss`
    /// schemes) the PEM files `ca` (a private CA for the server's
    /// certificate), `client_cert` and `client_key` (a client certificate,
    /// for servers that require one): [`Config::tls_ca`],
    /// [`Config::tls_client_cert`], [`Config::tls_client_key`]; `holder`
    /// (`false` turns holder records off: [`Config::record_holder`]);
    /// `allow_eviction` and `require_appendonly` (booleans:
    /// [`Config::allow_eviction`], [`Config::require_appendonly`]).
    /// Anything else is [`Error::InvalidInput`], as is a URL without a host. Error messages
    /// never contain the password.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::redis::Config;
    ///
    /// let config = Config::from_url(
    ///     "rediss://app:p%40ss@redis.internal:6380/2?prefix=billing:&response_timeout=250ms",
    /// )?;
    /// assert_eq!(config.addresses, ["redis.internal:6380"]);
    /// assert_eq!(config.username.as_deref(), Some("app"));
    /// assert_eq!(config.password.as_ref().map(|p| p.expose()), Some("p@ss"));
    /// assert_eq!((config.db, config.tls), (2, true));
    /// assert_eq!(config.key_prefix, "billing:");
    /// assert_eq!(config.response_timeout, Duration::from_millis(250));
    ///
    /// let private_ca = Config::from_url("rediss://10.0.0.5:6380?ca=/etc/redis/ca.pem")?;
    /// assert_eq!(private_ca.tls_ca.as_deref(), Some(std::path::Path::new("/etc/redis/ca.pem")));
    ///
    /// let cluster = Config::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000")?;
    /// assert!(cluster.cluster);
    /// assert_eq!(cluster.addresses, ["10.0.0.1:7000", "10.0.0.2:7000"]);
    ///
    /// let sentinel = Config::from_url(
    ///     "redis+sentinel://s1,s2:26380/orders?min_replicas=1&replica_timeout=50ms",
    /// )?;
    /// assert_eq!(sentinel.sentinel_master.as_deref(), Some("orders"));
    /// assert_eq!(sentinel.addresses, ["s1:26379", "s2:26380"]);
    /// assert_eq!((sentinel.min_replicas, sentinel.replica_timeout), (1, Duration::from_millis(50)));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Config> {
        let shown = redact_url(url);
        let bad = |reason: String| Error::invalid("url", format!("{shown}: {reason}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a URL: no scheme://".into()))?;
        let (tls, kind) = match scheme {
            "redis" => (false, Kind::Standalone),
            "rediss" => (true, Kind::Standalone),
            "redis+cluster" => (false, Kind::Cluster),
            "rediss+cluster" => (true, Kind::Cluster),
            "redis+sentinel" => (false, Kind::Sentinel),
            "rediss+sentinel" => (true, Kind::Sentinel),
            other => return Err(bad(format!("scheme {other:?} is not one of {SCHEMES}"))),
        };
        // Several hosts are comma-separated in the authority, which the url
        // crate does not parse: it reads the URL with the first host only
        // (user info, path and query included), the others are addresses.
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (user_info, hosts) = match authority.rsplit_once('@') {
            Some((user_info, hosts)) => (format!("{user_info}@"), hosts),
            None => (String::new(), authority),
        };
        if user_info.contains(',') {
            // `u:p@h1,u:p@h2`: the last `@` ends the user info, which then
            // spans hosts. Do not echo it.
            return Err(bad(
                "an address must not carry credentials; give them once, before the first host"
                    .into(),
            ));
        }
        let mut hosts = hosts.split(',');
        let first = hosts.next().unwrap_or_default();
        let others: Vec<&str> = hosts.collect();
        if kind == Kind::Standalone && !others.is_empty() {
            return Err(bad(format!(
                "{scheme}:// names one server; for several use redis+cluster:// (a Redis Cluster) \
                 or redis+sentinel://.../MASTER_NAME (sentinels)"
            )));
        }
        let parsed = Url::parse(&format!("redis://{user_info}{first}{tail}"))
            .map_err(|e| bad(format!("not a URL: {e}")))?;
        let host = host_of(&parsed).ok_or_else(|| bad("the URL names no host".into()))?;
        let default_port = match kind {
            Kind::Sentinel => DEFAULT_SENTINEL_PORT,
            Kind::Standalone | Kind::Cluster => DEFAULT_PORT,
        };
        let mut addresses = vec![format_address(&host, parsed.port().unwrap_or(default_port))];
        for other in others {
            let (host, port) = parse_address(other, default_port).map_err(&bad)?;
            addresses.push(format_address(&host, port));
        }
        let mut config = Config {
            username: decoded(parsed.username()).map_err(|e| bad(format!("user name: {e}")))?,
            password: match parsed.password() {
                Some(text) => decoded(text)
                    .map_err(|e| bad(format!("password: {e}")))?
                    .map(Password::new),
                None => None,
            },
            addresses,
            tls,
            cluster: kind == Kind::Cluster,
            ..Config::default()
        };
        match kind {
            Kind::Standalone => config.db = parse_db(parsed.path()).map_err(&bad)?,
            Kind::Cluster => {
                if parse_db(parsed.path()).map_err(&bad)? != 0 {
                    return Err(bad("a Redis Cluster has only database 0".into()));
                }
            }
            Kind::Sentinel => {
                let name = decoded(parsed.path().trim_start_matches('/'))
                    .map_err(|e| bad(format!("master name: {e}")))?
                    .ok_or_else(|| {
                        bad(
                            "the path must name the master: redis+sentinel://host:port/MASTER_NAME"
                                .into(),
                        )
                    })?;
                config.sentinel_master = Some(name);
            }
        }
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "prefix" => config.key_prefix = value.into_owned(),
                "connect_timeout" => {
                    config.connect_timeout = parse_duration(&name, &value).map_err(&bad)?
                }
                "response_timeout" => {
                    config.response_timeout = parse_duration(&name, &value).map_err(&bad)?
                }
                "replica_timeout" => {
                    config.replica_timeout = parse_duration(&name, &value).map_err(&bad)?
                }
                "min_replicas" => {
                    config.min_replicas = value.trim().parse().map_err(|_| {
                        bad(format!(
                            "min_replicas {value:?} is not a number of replicas"
                        ))
                    })?
                }
                "db" if kind == Kind::Sentinel => {
                    config.db = parse_db(&value).map_err(&bad)?;
                }
                "holder" => config.record_holder = parse_bool(&value).map_err(&bad)?,
                "allow_eviction" => config.allow_eviction = parse_bool(&value).map_err(&bad)?,
                "require_appendonly" => {
                    config.require_appendonly = parse_bool(&value).map_err(&bad)?
                }
                "ca" => config.tls_ca = Some(PathBuf::from(&*value)),
                "client_cert" => config.tls_client_cert = Some(PathBuf::from(&*value)),
                "client_key" => config.tls_client_key = Some(PathBuf::from(&*value)),
                other => {
                    return Err(bad(format!(
                        "unknown parameter {other:?}; known: {URL_PARAMETERS}"
                    )))
                }
            }
        }
        Ok(config)
    }

    /// Reads the `DISTLOCK_REDIS_*` environment variables over the defaults:
    ///
    /// | variable | field |
    /// | --- | --- |
    /// | `DISTLOCK_REDIS_USERNAME` | [`username`](Config::username) (empty: none) |
    /// | `DISTLOCK_REDIS_PASSWORD` | [`password`](Config::password) (empty: none) |
    /// | `DISTLOCK_REDIS_KEY_PREFIX` | [`key_prefix`](Config::key_prefix) (set but empty: no prefix) |
    /// | `DISTLOCK_REDIS_ADDRESSES` | [`addresses`](Config::addresses), comma-separated |
    /// | `DISTLOCK_REDIS_DB` | [`db`](Config::db) |
    /// | `DISTLOCK_REDIS_TLS` | [`tls`](Config::tls): `true`/`false`/`1`/`0`/`yes`/`no` |
    /// | `DISTLOCK_REDIS_TLS_CA` | [`tls_ca`](Config::tls_ca), a PEM file (empty: none) |
    /// | `DISTLOCK_REDIS_TLS_CLIENT_CERT` | [`tls_client_cert`](Config::tls_client_cert) (empty: none) |
    /// | `DISTLOCK_REDIS_TLS_CLIENT_KEY` | [`tls_client_key`](Config::tls_client_key) (empty: none) |
    /// | `DISTLOCK_REDIS_CONNECT_TIMEOUT` | [`connect_timeout`](Config::connect_timeout), e.g. `2s` |
    /// | `DISTLOCK_REDIS_RESPONSE_TIMEOUT` | [`response_timeout`](Config::response_timeout), e.g. `500ms` |
    /// | `DISTLOCK_REDIS_CLUSTER` | [`cluster`](Config::cluster): a boolean as for `TLS` |
    /// | `DISTLOCK_REDIS_SENTINEL_MASTER` | [`sentinel_master`](Config::sentinel_master) (empty: none) |
    /// | `DISTLOCK_REDIS_SENTINEL_USERNAME` | [`sentinel_username`](Config::sentinel_username) (empty: none) |
    /// | `DISTLOCK_REDIS_SENTINEL_PASSWORD` | [`sentinel_password`](Config::sentinel_password) (empty: none) |
    /// | `DISTLOCK_REDIS_MIN_REPLICAS` | [`min_replicas`](Config::min_replicas) |
    /// | `DISTLOCK_REDIS_REPLICA_TIMEOUT` | [`replica_timeout`](Config::replica_timeout), e.g. `50ms` |
    /// | `DISTLOCK_REDIS_RECORD_HOLDER` | [`record_holder`](Config::record_holder): a boolean as for `TLS` |
    /// | `DISTLOCK_REDIS_ALLOW_EVICTION` | [`allow_eviction`](Config::allow_eviction): a boolean as for `TLS` |
    /// | `DISTLOCK_REDIS_REQUIRE_APPENDONLY` | [`require_appendonly`](Config::require_appendonly): a boolean as for `TLS` |
    ///
    /// Other variables with the prefix are ignored (other tools may share it).
    /// A malformed value is [`Error::InvalidInput`] naming the variable.
    pub fn from_env() -> Result<Config> {
        let mut vars = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|n| n.starts_with(ENV_PREFIX)) else {
                continue;
            };
            let value = value.into_string().map_err(|_| {
                Error::invalid(
                    "config",
                    format!("environment variable {name} is not UTF-8"),
                )
            })?;
            vars.push((name.to_owned(), value));
        }
        Config::from_env_vars(vars)
    }

    /// [`from_env`](Config::from_env) over the given `(name, value)` pairs
    /// instead of the process environment (for tests, or variables gathered
    /// elsewhere).
    ///
    /// ```
    /// use distlock::redis::Config;
    ///
    /// let config = Config::from_env_vars([
    ///     ("DISTLOCK_REDIS_ADDRESSES", "cache-1:6379"),
    ///     ("DISTLOCK_REDIS_KEY_PREFIX", "jobs:"),
    ///     ("PATH", "/usr/bin"),
    /// ])?;
    /// assert_eq!(config.addresses, ["cache-1:6379"]);
    /// assert_eq!(config.key_prefix, "jobs:");
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_env_vars<I, K, V>(vars: I) -> Result<Config>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let mut config = Config::default();
        for (name, value) in vars {
            let name = name.as_ref();
            let Some(field) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let value: String = value.into();
            let bad = |reason: String| Error::invalid("config", format!("{name}: {reason}"));
            match field {
                "USERNAME" => config.username = Some(value).filter(|v| !v.is_empty()),
                "PASSWORD" => {
                    config.password = Some(value).filter(|v| !v.is_empty()).map(Password::new)
                }
                "KEY_PREFIX" => config.key_prefix = value,
                "ADDRESSES" => {
                    config.addresses = value
                        .split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_owned)
                        .collect()
                }
                "DB" => {
                    config.db = value
                        .trim()
                        .parse()
                        .map_err(|e| bad(format!("{value:?} is not a database number: {e}")))?
                }
                "TLS" => config.tls = parse_bool(&value).map_err(bad)?,
                "TLS_CA" => config.tls_ca = non_empty_path(value),
                "TLS_CLIENT_CERT" => config.tls_client_cert = non_empty_path(value),
                "TLS_CLIENT_KEY" => config.tls_client_key = non_empty_path(value),
                "CONNECT_TIMEOUT" => {
                    config.connect_timeout = parse_duration(name, &value).map_err(bad)?
                }
                "RESPONSE_TIMEOUT" => {
                    config.response_timeout = parse_duration(name, &value).map_err(bad)?
                }
                "CLUSTER" => config.cluster = parse_bool(&value).map_err(bad)?,
                "SENTINEL_MASTER" => {
                    config.sentinel_master = Some(value.trim().to_owned()).filter(|v| !v.is_empty())
                }
                "SENTINEL_USERNAME" => {
                    config.sentinel_username = Some(value).filter(|v| !v.is_empty())
                }
                "SENTINEL_PASSWORD" => {
                    config.sentinel_password =
                        Some(value).filter(|v| !v.is_empty()).map(Password::new)
                }
                "MIN_REPLICAS" => {
                    config.min_replicas = value
                        .trim()
                        .parse()
                        .map_err(|e| bad(format!("{value:?} is not a number of replicas: {e}")))?
                }
                "REPLICA_TIMEOUT" => {
                    config.replica_timeout = parse_duration(name, &value).map_err(bad)?
                }
                "RECORD_HOLDER" => config.record_holder = parse_bool(&value).map_err(bad)?,
                "ALLOW_EVICTION" => config.allow_eviction = parse_bool(&value).map_err(bad)?,
                "REQUIRE_APPENDONLY" => {
                    config.require_appendonly = parse_bool(&value).map_err(bad)?
                }
                _ => {}
            }
        }
        Ok(config)
    }

    /// Reads a JSON object with the fields of [`Config`] (all optional).
    ///
    /// ```
    /// use distlock::redis::Config;
    ///
    /// let config = Config::from_json(r#"{"addresses": ["redis:6379"], "keyPrefix": "jobs:"}"#)?;
    /// assert_eq!(config.key_prefix, "jobs:");
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Config> {
        serde_json::from_str(text)
            .map_err(|e| Error::invalid("config", format!("invalid Redis config JSON: {e}")))
    }

    /// Reads a YAML mapping with the fields of [`Config`] (all optional).
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::redis::Config;
    ///
    /// let config = Config::from_yaml("
    /// addresses: [redis:6379]
    /// password: 'hunter2'
    /// connectTimeout: 2s
    /// ")?;
    /// assert_eq!(config.connect_timeout, Duration::from_secs(2));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_yaml(text: &str) -> Result<Config> {
        serde_yaml_ng::from_str(text)
            .map_err(|e| Error::invalid("config", format!("invalid Redis config YAML: {e}")))
    }

    /// Checks the config and resolves the deployment it names.
    pub(crate) fn deployment(&self) -> Result<Deployment> {
        let bad = |reason: String| Error::invalid("config", reason);
        if self.addresses.is_empty() {
            return Err(bad(format!(
                "no Redis address: set `addresses` (or {ENV_PREFIX}ADDRESSES), or use a redis:// URL"
            )));
        }
        if self.cluster && self.sentinel_master.is_some() {
            return Err(bad(
                "both `cluster` and `sentinel_master` are set; a deployment is a Redis Cluster \
                 or a master behind Sentinel, not both"
                    .into(),
            ));
        }
        if self.db < 0 {
            return Err(bad(format!("db is {}; it must be 0 or more", self.db)));
        }
        self.check_tls_files().map_err(bad)?;
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(bad(format!("{name} is zero; it must be positive")));
            }
        }
        if self.min_replicas > 0
            && (self.replica_timeout.is_zero() || self.replica_timeout >= self.response_timeout)
        {
            return Err(bad(format!(
                "replica_timeout is {:?}; with min_replicas it must be positive and shorter than \
                 response_timeout ({:?}), which bounds the WAIT's reply",
                self.replica_timeout, self.response_timeout
            )));
        }
        let endpoints = |default_port: u16| -> Result<Vec<Endpoint>> {
            self.addresses
                .iter()
                .map(|address| {
                    let (host, port) = parse_address(address, default_port).map_err(bad)?;
                    Ok(Endpoint {
                        host,
                        port,
                        tls: self.tls,
                        db: self.db,
                        username: self.username.clone(),
                    })
                })
                .collect()
        };
        if self.cluster {
            if self.db != 0 {
                return Err(bad(format!(
                    "db is {}; a Redis Cluster has only database 0",
                    self.db
                )));
            }
            return Ok(Deployment::Cluster(endpoints(DEFAULT_PORT)?));
        }
        if let Some(master) = &self.sentinel_master {
            if master.trim().is_empty() {
                return Err(bad(
                    "sentinel_master is empty; name the monitored master".into()
                ));
            }
            if self.tls_ca.is_some() || self.tls_client_cert.is_some() {
                // redis-rs' `Sentinel` (which this backend uses to follow
                // failovers) takes no certificates, only a TLS mode; its
                // certificate support is in the different `SentinelClient`.
                return Err(bad(
                    "tls_ca, tls_client_cert and tls_client_key are not supported with \
                     sentinel_master (redis-rs' Sentinel verifies against the system's roots \
                     only); use certificates the system trusts, or a standalone or cluster \
                     deployment"
                        .into(),
                ));
            }
            let mut sentinels = endpoints(DEFAULT_SENTINEL_PORT)?;
            for sentinel in &mut sentinels {
                sentinel.db = 0;
                sentinel.username.clone_from(&self.sentinel_username);
            }
            return Ok(Deployment::Sentinel {
                sentinels,
                master: master.clone(),
            });
        }
        match self.addresses.as_slice() {
            [_] => Ok(Deployment::Standalone(endpoints(DEFAULT_PORT)?.remove(0))),
            many => Err(bad(format!(
                "{} addresses given ({}); without `cluster` or `sentinel_master` the redis backend \
                 talks to a single node (a primary, or an address that always leads to the \
                 current primary). Set `cluster: true` for a Redis Cluster's seed nodes or \
                 `sentinel_master` for sentinels. For a quorum over independent nodes use \
                 Redlock (redlock://host1:port,host2:port,host3:port, feature `redlock`)",
                many.len(),
                many.iter().map(|a| redact_address(a)).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// The one server of a standalone config (tests and messages).
    #[cfg(test)]
    pub(crate) fn endpoint(&self) -> Result<Endpoint> {
        match self.deployment()? {
            Deployment::Standalone(endpoint) => Ok(endpoint),
            other => Err(Error::invalid(
                "config",
                format!("{other} is not one server"),
            )),
        }
    }

    /// What redis-rs needs to connect to sentinel `endpoint`: the sentinels'
    /// own credentials, TLS as for the master.
    pub(crate) fn sentinel_connection_info(&self, endpoint: &Endpoint) -> Result<ConnectionInfo> {
        let sentinel = Config {
            username: self.sentinel_username.clone(),
            password: self.sentinel_password.clone(),
            db: 0,
            ..self.clone()
        };
        sentinel.connection_info(endpoint, ProtocolVersion::RESP3)
    }

    /// The redis-rs settings (database, credentials, protocol) for data
    /// nodes, without an address: what Sentinel connects to the master with.
    pub(crate) fn redis_settings(&self, protocol: ProtocolVersion) -> RedisConnectionInfo {
        let mut redis_settings = RedisConnectionInfo::default()
            .set_db(self.db)
            .set_protocol(protocol);
        if let Some(username) = &self.username {
            redis_settings = redis_settings.set_username(username);
        }
        if let Some(password) = &self.password {
            redis_settings = redis_settings.set_password(password.expose());
        }
        redis_settings
    }

    /// What redis-rs needs to connect to `endpoint` speaking `protocol`.
    pub(crate) fn connection_info(
        &self,
        endpoint: &Endpoint,
        protocol: ProtocolVersion,
    ) -> Result<ConnectionInfo> {
        let addr = if endpoint.tls {
            ConnectionAddr::TcpTls {
                host: endpoint.host.clone(),
                port: endpoint.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(endpoint.host.clone(), endpoint.port)
        };
        let redis_settings = self.redis_settings(protocol);
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::invalid("config", format!("{endpoint}: {e}")))?;
        Ok(info.set_redis_settings(redis_settings))
    }

    /// A redis-rs client for `endpoint` speaking `protocol`, with the
    /// configured CA and client certificate if any (read from their files
    /// now).
    pub(crate) fn client(
        &self,
        endpoint: &Endpoint,
        protocol: ProtocolVersion,
    ) -> Result<redis::Client> {
        let info = self.connection_info(endpoint, protocol)?;
        let invalid = |e: redis::RedisError| Error::invalid("config", format!("{endpoint}: {e}"));
        let certificates = match self.tls_certificates()? {
            Some(certificates) if endpoint.tls => certificates,
            _ => return redis::Client::open(info).map_err(invalid),
        };
        // redis-rs parses the PEM here: a file that holds no certificate or
        // key is refused now, naming what it could not parse (never the key).
        redis::Client::build_with_tls(info, certificates).map_err(|e| {
            Error::invalid(
                "config",
                format!("{endpoint}: the TLS files do not hold usable PEM: {e}"),
            )
        })
    }

    /// The configured CA and client certificate, read from their files now;
    /// `None` without TLS or without either.
    pub(crate) fn tls_certificates(&self) -> Result<Option<TlsCertificates>> {
        if !self.tls || (self.tls_ca.is_none() && self.tls_client_cert.is_none()) {
            return Ok(None);
        }
        let client_tls = match (&self.tls_client_cert, &self.tls_client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read_pem("tls_client_cert", cert)?,
                client_key: read_pem("tls_client_key", key)?,
            }),
            _ => None,
        };
        let root_cert = match &self.tls_ca {
            Some(ca) => Some(read_pem("tls_ca", ca)?),
            None => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// TLS files only with TLS, and a client certificate only with its key.
    fn check_tls_files(&self) -> std::result::Result<(), String> {
        let any_file = self.tls_ca.is_some()
            || self.tls_client_cert.is_some()
            || self.tls_client_key.is_some();
        if any_file && !self.tls {
            return Err(
                "tls_ca, tls_client_cert and tls_client_key need TLS (a rediss:// URL, or tls: true)"
                    .into(),
            );
        }
        match (&self.tls_client_cert, &self.tls_client_key) {
            (Some(_), None) => Err("tls_client_cert is set without tls_client_key".into()),
            (None, Some(_)) => Err("tls_client_key is set without tls_client_cert".into()),
            _ => Ok(()),
        }
    }
}

/// The deployment a [`Config`] names, checked. `Display` is its URL without
/// the password, for messages and `Debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server.
    Standalone(Endpoint),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<Endpoint>),
    /// Sentinels, and the name of the master they monitor.
    Sentinel {
        sentinels: Vec<Endpoint>,
        master: String,
    },
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |endpoints: &[Endpoint]| {
            endpoints
                .iter()
                .map(|e| format_address(&e.host, e.port))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Deployment::Standalone(endpoint) => endpoint.fmt(f),
            Deployment::Cluster(seeds) => {
                let scheme = if seeds.first().is_some_and(|e| e.tls) {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                };
                let user = match seeds.first().and_then(|e| e.username.as_deref()) {
                    Some(name) => format!("{name}@"),
                    None => String::new(),
                };
                write!(f, "{scheme}://{user}{}", list(seeds))
            }
            Deployment::Sentinel { sentinels, master } => {
                let scheme = if sentinels.first().is_some_and(|e| e.tls) {
                    "rediss+sentinel"
                } else {
                    "redis+sentinel"
                };
                write!(f, "{scheme}://{}/{master}", list(sentinels))
            }
        }
    }
}

/// What a URL's scheme says the addresses are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Standalone,
    Cluster,
    Sentinel,
}

/// One server a [`Config`] names, checked. `Display` is the URL without the
/// password, for messages and `Debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Without brackets, also for IPv6.
    host: String,
    port: u16,
    tls: bool,
    db: i64,
    username: Option<String>,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let user = match &self.username {
            Some(name) => format!("{name}@"),
            None => String::new(),
        };
        let address = format_address(&self.host, self.port);
        write!(f, "{scheme}://{user}{address}/{}", self.db)
    }
}

/// The contents of a PEM file named by the config's `field`.
fn read_pem(field: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid("config", format!("{field} {}: {e}", path.display())))
}

/// An environment variable's path, `None` if empty.
fn non_empty_path(value: String) -> Option<PathBuf> {
    Some(value).filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn parse_db(path: &str) -> std::result::Result<i64, String> {
    match path.trim_start_matches('/') {
        "" => Ok(0),
        db => db
            .parse::<u32>()
            .map(i64::from)
            .map_err(|_| format!("the path {path:?} is not a database number")),
    }
}

/// The host of a parsed URL, IPv6 without brackets; `None` if it has none.
fn host_of(url: &Url) -> Option<String> {
    match url.host()? {
        Host::Domain("") => None,
        Host::Domain(domain) => Some(domain.to_owned()),
        Host::Ipv4(ip) => Some(ip.to_string()),
        Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

/// `host:port`, bracketing IPv6 hosts.
fn format_address(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port` (port `default_port`
/// if none).
fn parse_address(address: &str, default_port: u16) -> std::result::Result<(String, u16), String> {
    if address.contains('@') {
        // Do not echo it: it may carry a password.
        return Err(
            "an address must not carry credentials; set username and password instead".into(),
        );
    }
    if address.contains("://") {
        return Err(format!(
            "{address:?} is a URL; addresses are host:port (set tls for TLS)"
        ));
    }
    let not_an_address = || format!("{address:?} is not a host:port address");
    let url = Url::parse(&format!("redis://{}", address.trim())).map_err(|_| not_an_address())?;
    if !url.path().is_empty() || url.query().is_some() || url.fragment().is_some() {
        return Err(not_an_address());
    }
    let host = host_of(&url).ok_or_else(not_an_address)?;
    Ok((host, url.port().unwrap_or(default_port)))
}

/// `url` with the password of its user info (which may precede several
/// comma-separated hosts, which the url crate cannot parse) replaced by
/// `***`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact(url);
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, hosts)) => {
            let user = match user_info.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => user_info.to_owned(),
            };
            format!("{scheme}://{user}@{hosts}{tail}")
        }
        // An `@` past the authority: a password with an unencoded `/` or `?`
        // may sit anywhere, so show nothing past the scheme.
        None if tail.contains('@') => format!("{scheme}://…"),
        None => url.to_owned(),
    }
}

fn redact_address(address: &str) -> String {
    if address.contains('@') {
        "<address with credentials>".to_owned()
    } else {
        format!("{address:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_records_are_on_unless_turned_off() {
        assert!(Config::default().record_holder);
        assert!(Config::from_url("redis://h/").unwrap().record_holder);
        assert!(
            !Config::from_url("redis://h/?holder=false")
                .unwrap()
                .record_holder
        );
        let error = Config::from_url("redis://h/?holder=maybe").unwrap_err();
        assert!(error.to_string().contains("not a boolean"), "{error}");
        let env = Config::from_env_vars([("DISTLOCK_REDIS_RECORD_HOLDER", "no")]).unwrap();
        assert!(!env.record_holder);
        let json = Config::from_json(r#"{"addresses": ["h"], "recordHolder": false}"#).unwrap();
        assert!(!json.record_holder);
    }

    #[test]
    fn the_server_checks_are_configured_from_every_source() {
        let defaults = Config::default();
        assert!(!defaults.allow_eviction && !defaults.require_appendonly);
        let url =
            Config::from_url("redis://h/?allow_eviction=true&require_appendonly=yes").unwrap();
        assert!(url.allow_eviction && url.require_appendonly);
        let error = Config::from_url("redis://h/?allow_eviction=sure").unwrap_err();
        assert!(error.to_string().contains("not a boolean"), "{error}");
        let env = Config::from_env_vars([
            ("DISTLOCK_REDIS_ALLOW_EVICTION", "1"),
            ("DISTLOCK_REDIS_REQUIRE_APPENDONLY", "true"),
        ])
        .unwrap();
        assert!(env.allow_eviction && env.require_appendonly);
        let json =
            Config::from_json(r#"{"allowEviction": true, "require_appendonly": true}"#).unwrap();
        assert!(json.allow_eviction && json.require_appendonly);
        let yaml = Config::from_yaml("allow_eviction: true\nrequireAppendonly: true").unwrap();
        assert_eq!(yaml, json);
    }

    #[test]
    fn urls_give_every_field() {
        let config =
            Config::from_url("redis://alice:p%40ss%3Aword@cache.local:6380/3?prefix=app:").unwrap();
        assert_eq!(config.username.as_deref(), Some("alice"));
        assert_eq!(config.password, Some(Password::new("p@ss:word")));
        assert_eq!(config.addresses, ["cache.local:6380"]);
        assert_eq!(config.db, 3);
        assert!(!config.tls);
        assert_eq!(config.key_prefix, "app:");
        assert_eq!(config.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    }

    #[test]
    fn url_defaults_and_password_only_auth() {
        let config = Config::from_url("rediss://:secret@10.1.2.3").unwrap();
        assert_eq!(config.username, None);
        assert_eq!(config.password, Some(Password::new("secret")));
        assert_eq!(config.addresses, ["10.1.2.3:6379"]);
        assert_eq!((config.db, config.tls), (0, true));
        assert_eq!(config.key_prefix, DEFAULT_KEY_PREFIX);
        let config = Config::from_url("redis://h/?prefix=").unwrap();
        assert_eq!(config.key_prefix, "");
    }

    #[test]
    fn ipv6_hosts_keep_their_brackets_in_addresses_only() {
        let config = Config::from_url("redis://[::1]:7000").unwrap();
        assert_eq!(config.addresses, ["[::1]:7000"]);
        let endpoint = config.endpoint().unwrap();
        assert_eq!(endpoint.host, "::1");
        assert_eq!(endpoint.to_string(), "redis://[::1]:7000/0");
    }

    #[test]
    fn url_timeouts_are_human_durations() {
        let config =
            Config::from_url("redis://h:1?connect_timeout=3s&response_timeout=150ms").unwrap();
        assert_eq!(config.connect_timeout, Duration::from_secs(3));
        assert_eq!(config.response_timeout, Duration::from_millis(150));
    }

    #[test]
    fn bad_urls_say_why_without_the_password() {
        let cases = [
            ("redis://u:topsecret@h/notadb", "not a database number"),
            (
                "redis://u:topsecret@h/1?pool=3",
                "unknown parameter \"pool\"",
            ),
            (
                "redis://u:topsecret@h?connect_timeout=soon",
                "not a duration",
            ),
            ("redis://:topsecret@/0", "host"),
            ("http://u:topsecret@h", "is not one of redis, rediss"),
            (
                "redis://u:topsecret@h1:1,h2:2",
                "names one server; for several use redis+cluster://",
            ),
            ("redis+cluster://u:topsecret@h1:1,h2:2/3", "only database 0"),
            ("redis+sentinel://u:topsecret@s1,s2", "must name the master"),
            (
                "redis+sentinel://u:topsecret@s1/m?min_replicas=x",
                "not a number",
            ),
            (
                "redis+cluster://u:topsecret@h1,u:pw@h2",
                "must not carry credentials",
            ),
        ];
        for (url, expected) in cases {
            let err = Config::from_url(url).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, Error::InvalidInput { what: "url", .. }),
                "{message}"
            );
            assert!(message.contains(expected), "{url}: {message}");
            assert!(
                !message.contains("topsecret"),
                "leaks the password: {message}"
            );
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        let config = Config::from_url("redis://bob:hunter2@h:1").unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("***") && debug.contains("bob"), "{debug}");
        let endpoint = config.endpoint().unwrap().to_string();
        assert_eq!(endpoint, "redis://bob@h:1/0");
    }

    #[test]
    fn env_vars_override_the_defaults() {
        let config = Config::from_env_vars([
            ("DISTLOCK_REDIS_USERNAME", "svc"),
            ("DISTLOCK_REDIS_PASSWORD", "pw"),
            ("DISTLOCK_REDIS_KEY_PREFIX", "jobs:"),
            ("DISTLOCK_REDIS_ADDRESSES", " a:1 , "),
            ("DISTLOCK_REDIS_DB", "4"),
            ("DISTLOCK_REDIS_TLS", "yes"),
            ("DISTLOCK_REDIS_CONNECT_TIMEOUT", "2s"),
            ("DISTLOCK_REDIS_RESPONSE_TIMEOUT", "50ms"),
            ("DISTLOCK_REDIS_SOMETHING_ELSE", "ignored"),
            ("HOME", "/root"),
        ])
        .unwrap();
        assert_eq!(
            config,
            Config {
                username: Some("svc".into()),
                password: Some("pw".into()),
                key_prefix: "jobs:".into(),
                addresses: vec!["a:1".into()],
                db: 4,
                tls: true,
                connect_timeout: Duration::from_secs(2),
                response_timeout: Duration::from_millis(50),
                ..Config::default()
            }
        );
        let untouched = Config::from_env_vars(Vec::<(String, String)>::new()).unwrap();
        assert_eq!(untouched, Config::default());
        let empty_password = Config::from_env_vars([("DISTLOCK_REDIS_PASSWORD", "")]).unwrap();
        assert_eq!(empty_password.password, None);
    }

    #[test]
    fn malformed_env_vars_name_the_variable() {
        let err = Config::from_env_vars([("DISTLOCK_REDIS_TLS", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("DISTLOCK_REDIS_TLS"), "{err}");
        let err = Config::from_env_vars([("DISTLOCK_REDIS_RESPONSE_TIMEOUT", "5")]).unwrap_err();
        assert!(
            err.to_string().contains("DISTLOCK_REDIS_RESPONSE_TIMEOUT"),
            "{err}"
        );
    }

    #[test]
    fn json_and_yaml_read_the_seed_field_names() {
        let json = r#"{"username":"u","password":"p","keyPrefix":"x:","addresses":["h:1"],
                       "db":1,"tls":true,"connectTimeout":"2s","responseTimeout":"100ms"}"#;
        let yaml = "
username: u
password: p
key_prefix: 'x:'
addresses: ['h:1']
db: 1
tls: true
connect_timeout: 2s
responseTimeout: 100ms
";
        let from_json = Config::from_json(json).unwrap();
        assert_eq!(from_json, Config::from_yaml(yaml).unwrap());
        assert_eq!(from_json.response_timeout, Duration::from_millis(100));
        assert_eq!(from_json.key_prefix, "x:");
        // Round trip.
        let text = serde_json::to_string(&from_json).unwrap();
        assert_eq!(Config::from_json(&text).unwrap(), from_json);
    }

    #[test]
    fn config_files_reject_typos_and_never_echo_the_password() {
        let err = Config::from_yaml("adresses: [h]").unwrap_err().to_string();
        assert!(err.contains("adresses"), "{err}");
        // YAML hands a plain scalar over as the text it was written as.
        let config = Config::from_yaml("password: 0123456789").unwrap();
        assert_eq!(config.password, Some(Password::new("0123456789")));
        let err = Config::from_json(r#"{"password": 9876543210}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be a string"), "{err}");
        assert!(!err.contains("9876543210"), "{err}");
    }

    #[test]
    fn exactly_one_address_is_accepted() {
        let none = Config::default().endpoint().unwrap_err().to_string();
        assert!(none.contains("no Redis address"), "{none}");
        let two = Config {
            addresses: vec!["a:1".into(), "b:2".into()],
            ..Config::default()
        };
        let err = two.endpoint().unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }));
        let message = err.to_string();
        assert!(
            message.contains("single node")
                && message.contains("cluster")
                && message.contains("sentinel_master"),
            "{message}"
        );
    }

    #[test]
    fn cluster_urls_list_their_seed_nodes() {
        let config =
            Config::from_url("rediss+cluster://app:pw@10.0.0.1:7000,[::1]:7001,node3?prefix=x:")
                .unwrap();
        assert!(config.cluster && config.tls);
        assert_eq!(
            config.addresses,
            ["10.0.0.1:7000", "[::1]:7001", "node3:6379"]
        );
        assert_eq!(config.password, Some(Password::new("pw")));
        assert_eq!(config.key_prefix, "x:");
        let deployment = config.deployment().unwrap();
        assert_eq!(
            deployment.to_string(),
            "rediss+cluster://app@10.0.0.1:7000,[::1]:7001,node3:6379"
        );
        assert!(matches!(deployment, Deployment::Cluster(seeds) if seeds.len() == 3));
    }

    #[test]
    fn sentinel_urls_name_the_master_in_the_path() {
        let config = Config::from_url(
            "redis+sentinel://:pw@s1,s2:26380/my%20master?db=2&min_replicas=1&replica_timeout=50ms",
        )
        .unwrap();
        assert_eq!(config.sentinel_master.as_deref(), Some("my master"));
        assert_eq!(config.addresses, ["s1:26379", "s2:26380"]);
        assert_eq!(config.db, 2);
        assert_eq!(config.min_replicas, 1);
        assert_eq!(config.replica_timeout, Duration::from_millis(50));
        let deployment = config.deployment().unwrap();
        assert_eq!(
            deployment.to_string(),
            "redis+sentinel://s1:26379,s2:26380/my master"
        );
        let Deployment::Sentinel { sentinels, master } = deployment else {
            panic!("not a sentinel deployment");
        };
        assert_eq!(master, "my master");
        // The sentinels are asked with their own credentials and database 0.
        assert!(sentinels.iter().all(|s| s.db == 0 && s.username.is_none()));
    }

    #[test]
    fn the_seed_address_list_configures_clusters_and_sentinels() {
        let yaml = "
addresses: ['10.0.0.1:7000', '10.0.0.2:7000']
cluster: true
";
        let config = Config::from_yaml(yaml).unwrap();
        assert!(matches!(
            config.deployment().unwrap(),
            Deployment::Cluster(_)
        ));
        let json = r#"{"addresses": ["s1", "s2"], "sentinelMaster": "orders",
                       "sentinelPassword": "spw", "minReplicas": 1, "replicaTimeout": "20ms"}"#;
        let config = Config::from_json(json).unwrap();
        assert_eq!(config.sentinel_password, Some(Password::new("spw")));
        assert!(!format!("{config:?}").contains("spw"));
        assert_eq!(
            config.deployment().unwrap().to_string(),
            "redis+sentinel://s1:26379,s2:26379/orders"
        );
        let env = Config::from_env_vars([
            ("DISTLOCK_REDIS_ADDRESSES", "s1:1,s2:2"),
            ("DISTLOCK_REDIS_SENTINEL_MASTER", "orders"),
            ("DISTLOCK_REDIS_SENTINEL_USERNAME", "watcher"),
            ("DISTLOCK_REDIS_SENTINEL_PASSWORD", "spw"),
            ("DISTLOCK_REDIS_MIN_REPLICAS", "2"),
            ("DISTLOCK_REDIS_REPLICA_TIMEOUT", "30ms"),
        ])
        .unwrap();
        assert_eq!(env.sentinel_master.as_deref(), Some("orders"));
        assert_eq!(env.sentinel_username.as_deref(), Some("watcher"));
        assert_eq!(
            (env.min_replicas, env.replica_timeout),
            (2, Duration::from_millis(30))
        );
        let cluster = Config::from_env_vars([
            ("DISTLOCK_REDIS_ADDRESSES", "a:1,b:2"),
            ("DISTLOCK_REDIS_CLUSTER", "true"),
        ])
        .unwrap();
        assert!(cluster.cluster);
    }

    #[test]
    fn contradictory_deployments_are_rejected() {
        let both = Config {
            addresses: vec!["a".into()],
            cluster: true,
            sentinel_master: Some("m".into()),
            ..Config::default()
        };
        let err = both.deployment().unwrap_err().to_string();
        assert!(err.contains("not both"), "{err}");
        let cluster_db = Config {
            addresses: vec!["a".into()],
            cluster: true,
            db: 1,
            ..Config::default()
        };
        let err = cluster_db.deployment().unwrap_err().to_string();
        assert!(err.contains("only database 0"), "{err}");
        let slow_wait = Config {
            addresses: vec!["a".into()],
            min_replicas: 1,
            replica_timeout: DEFAULT_RESPONSE_TIMEOUT,
            ..Config::default()
        };
        let err = slow_wait.deployment().unwrap_err().to_string();
        assert!(err.contains("shorter than response_timeout"), "{err}");
    }

    #[test]
    fn multi_host_urls_are_redacted() {
        assert_eq!(
            redact_url("redis+cluster://u:secret@h1:1,h2:2/?prefix=a"),
            "redis+cluster://u:***@h1:1,h2:2/?prefix=a"
        );
        assert_eq!(redact_url("redis+cluster://h1,h2"), "redis+cluster://h1,h2");
        assert_eq!(redact_url("redis://u:se/cret@h"), "redis://…");
    }

    #[test]
    fn addresses_are_host_and_port_only() {
        assert_eq!(
            parse_address("h", DEFAULT_PORT).unwrap(),
            ("h".to_owned(), DEFAULT_PORT)
        );
        assert_eq!(
            parse_address("[::1]:7", DEFAULT_PORT).unwrap(),
            ("::1".to_owned(), 7)
        );
        assert!(parse_address("redis://h:1", DEFAULT_PORT)
            .unwrap_err()
            .contains("is a URL"));
        assert!(parse_address("h:1/2", DEFAULT_PORT).is_err());
        let err = parse_address("u:pw@h:1", DEFAULT_PORT).unwrap_err();
        assert!(!err.contains("pw"), "{err}");
    }

    #[test]
    fn zero_timeouts_and_negative_dbs_are_rejected() {
        let base = Config {
            addresses: vec!["h".into()],
            ..Config::default()
        };
        let zero = Config {
            response_timeout: Duration::ZERO,
            ..base.clone()
        };
        assert!(zero
            .endpoint()
            .unwrap_err()
            .to_string()
            .contains("response_timeout"));
        let negative = Config { db: -1, ..base };
        assert!(negative.endpoint().is_err());
    }

    #[test]
    fn tls_files_apply_to_clusters_and_are_refused_behind_sentinel() {
        let cluster =
            Config::from_url("rediss+cluster://10.0.0.1:7000,10.0.0.2:7000?ca=/nonexistent/ca.pem")
                .unwrap();
        assert!(matches!(
            cluster.deployment().unwrap(),
            Deployment::Cluster(_)
        ));
        // The cluster builder reads the CA like a standalone client does.
        let err = cluster.tls_certificates().err().unwrap().to_string();
        assert!(err.contains("tls_ca /nonexistent/ca.pem"), "{err}");
        let sentinel = Config::from_url("rediss+sentinel://s1,s2/orders?ca=/etc/ca.pem").unwrap();
        let err = sentinel.deployment().unwrap_err().to_string();
        assert!(err.contains("not supported with sentinel_master"), "{err}");
        let plain = Config::from_url("rediss+sentinel://s1,s2/orders").unwrap();
        assert!(plain.deployment().is_ok());
    }
}
