//! What a [`RedisLocker`](super::RedisLocker) connects to and how: [`Config`],
//! read from a URL, environment variables, JSON or YAML.

use std::path::PathBuf;
use std::time::Duration;

use url::Url;

pub use crate::config::Password;
use crate::config::{
    decoded, decoded_credentials, duration_text, format_address, host_of, optional_password,
    parse_address, redact, set_url_query, split_authority, Checked, Param, Table,
};
use crate::{Error, Result};

mod deployment;

pub(crate) use deployment::{Deployment, Endpoint};

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

/// Every parameter of [`Config`], by its one name and its older spellings:
/// the table URL parameters, `DISTLOCK_REDIS_*` variables
/// (`DISTLOCK_REDIS_HOLDER_RECORD` is `holder_record`) and
/// [`Config::set`] are read through (see [`crate::config`]). A URL's query
/// sets `db` for Sentinel only: elsewhere the path names the database.
pub(crate) const PARAMETERS: Table = Table(&[&[
    Param::USERNAME,
    Param::PASSWORD,
    Param::other("addresses", &[]),
    Param::TLS,
    Param::other("cluster", &[]),
    Param::other("sentinel_master", &[]),
    Param::other("sentinel_username", &[]),
    Param::other("sentinel_password", &[]),
    Param::url("db", &[]),
    Param::KEY_PREFIX,
    Param::CONNECT_TIMEOUT,
    Param::url("response_timeout", &[]),
    Param::url("min_replicas", &[]),
    Param::url("replica_timeout", &[]),
    Param::url("tls_ca", &["ca", "ca_file"]),
    Param::url("tls_client_cert", &["client_cert"]),
    Param::url("tls_client_key", &["client_key"]),
    Param::HOLDER_RECORD,
    Param::url("fencing", &[]),
    Param::url("allow_eviction", &[]),
    Param::url("require_appendonly", &[]),
]]);

/// The URL schemes [`Config::from_url`] reads.
const SCHEMES: &str =
    "redis, rediss, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel";

crate::config::config_struct! {
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
    /// Read from every source as [`crate::config`] says (the camelCase names
    /// are those of the Go seed this backend descends from).
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
    pub struct Config {
        /// ACL user name (Redis 6+). `None` authenticates as the `default` user
        /// when a password is set.
        username,
        /// Password (`AUTH`); `None` for a server without authentication.
        password,
        /// Prepended to every key: the caller's key `k` is stored as
        /// `<key_prefix>{k}` (see [`RedisLocker::backend_key`](super::RedisLocker::backend_key)).
        /// Default [`DEFAULT_KEY_PREFIX`].
        key_prefix,
        /// `host:port` addresses (`host`, `[::1]:6379`, ... ; the port defaults
        /// to 6379, or 26379 for sentinels). Without [`cluster`](Config::cluster)
        /// or [`sentinel_master`](Config::sentinel_master), exactly one: the
        /// backend then talks to a single node (a primary, or an address that
        /// always leads to the current primary).
        /// The Redlock backend (`distlock::redlock`, feature `redlock`) reads
        /// its list of independent nodes from here.
        hosts addresses,
        /// Database number (`SELECT`). Default 0; a cluster has only database 0.
        pub db: i64 = 0,
        /// The addresses are seed nodes of a Redis Cluster: the locker learns the
        /// cluster's slot map from them and routes each lock to its slot's master.
        pub cluster: bool = false,
        /// The addresses are sentinels, and this is the name of the master they
        /// monitor (`sentinel monitor NAME ...`): the locker asks them for the
        /// master and follows failovers.
        #[serde(alias = "sentinel_master", skip_serializing_if = "Option::is_none")]
        pub sentinel_master: Option<String> = None,
        /// ACL user name for the sentinels themselves (not the master; for that
        /// see [`username`](Config::username)).
        #[serde(alias = "sentinel_username", skip_serializing_if = "Option::is_none")]
        pub sentinel_username: Option<String> = None,
        /// Password for the sentinels themselves (`requirepass` in the sentinel's
        /// config), if they demand one.
        #[serde(alias = "sentinel_password", skip_serializing_if = "Option::is_none")]
        pub sentinel_password: Option<Password> = None,
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
        pub min_replicas: u32 = 0,
        /// How long the `WAIT` of [`min_replicas`](Config::min_replicas) may
        /// take. Default [`DEFAULT_REPLICA_TIMEOUT`]; must be shorter than
        /// [`response_timeout`](Config::response_timeout), since the server holds
        /// the reply that long.
        #[serde(alias = "replica_timeout", with = "duration_text")]
        pub replica_timeout: Duration = DEFAULT_REPLICA_TIMEOUT,
        /// Connect with TLS (rustls on the `ring` provider), as a `rediss://`
        /// URL does. The server's certificate must be valid for the host name
        /// of the address (an IP address must be in the certificate's subject
        /// alternative names) and chain to the system's root certificates, or
        /// to [`tls_ca`](Config::tls_ca) if set.
        tls,
        /// A PEM file of the CA certificates that sign the server's
        /// certificate (URL parameter `ca`): they *replace* the system's roots.
        /// Needs [`tls`](Config::tls). Read when the locker is built. Applies
        /// to one server, a cluster's nodes and Redlock's nodes; refused with
        /// [`sentinel_master`](Config::sentinel_master) (as are the client
        /// certificate files), since redis-rs' `Sentinel` takes no certificates.
        #[serde(
            alias = "tls_ca",
            alias = "ca",
            skip_serializing_if = "Option::is_none"
        )]
        pub tls_ca: Option<PathBuf> = None,
        /// A PEM file with the client certificate (and its chain) to present,
        /// for servers that demand one (`tls-auth-clients yes`; URL parameter
        /// `client_cert`). Needs [`tls`](Config::tls) and
        /// [`tls_client_key`](Config::tls_client_key).
        #[serde(alias = "tls_client_cert", skip_serializing_if = "Option::is_none")]
        pub tls_client_cert: Option<PathBuf> = None,
        /// The PEM file of the client certificate's private key (URL parameter
        /// `client_key`). Its contents are never logged or put in errors.
        #[serde(alias = "tls_client_key", skip_serializing_if = "Option::is_none")]
        pub tls_client_key: Option<PathBuf> = None,
        /// Bound on establishing one connection (TCP, TLS, `HELLO`/`AUTH`).
        /// Default [`DEFAULT_CONNECT_TIMEOUT`]. Text like `"1s"`, `"500ms"`.
        /// `connect_timeout + response_timeout + 0.7 s` bounds every call of the
        /// locker (see the [module docs](super), "Connections").
        connect_timeout,
        /// Bound on the answer to one command. Default
        /// [`DEFAULT_RESPONSE_TIMEOUT`]. An acquire whose answer times out may
        /// have succeeded (see the [module docs](super)). Also the `PING` period
        /// of the subscriber connection while waiters listen.
        #[serde(alias = "response_timeout", with = "duration_text")]
        pub response_timeout: Duration = DEFAULT_RESPONSE_TIMEOUT,
        /// Record who holds each lock (host, pid, label, grant time on the
        /// server's clock, ttl, fencing token) in the lock key's value, after the
        /// owner token, written by the acquire's own `SET` (no extra round trip,
        /// key or command); [`Locker::inspect`]
        /// and [`Locker::list`] report it. Default `true`; URL parameter
        /// `holder_record=false` turns it off: the lock's value is then the bare owner
        /// token, and grants are inspected as held by an unknown holder (see the [module
        /// docs](super), "Inspection"). Named `holder_record` in every source,
        /// as on every backend (see [`crate::config`]).
        ///
        /// [`Locker::inspect`]: crate::Locker::inspect
        /// [`Locker::list`]: crate::Locker::list
        #[serde(
            rename = "holderRecord",
            alias = "holder_record",
            alias = "recordHolder",
            alias = "record_holder",
            alias = "holder"
        )]
        pub record_holder: bool = true,
        /// Give every exclusive grant a fencing token: the grant script bumps
        /// the key's counter (`INCR <prefix>{<key>}:fence`) in the same atomic
        /// step as its `SET NX`. Default `true`. URL parameter `fencing=off`
        /// (as on Postgres and MySQL) turns it off for callers that never pass
        /// a token on: the grant is the `SET NX` alone, no counter key is
        /// written, and [`Lease::fencing_token`] and the inspected
        /// `fencing_token` are `None` (so are readers' tokens). Mutual
        /// exclusion, expiry, owner-checked release and refresh are unchanged;
        /// what is lost is the one defence against a holder that stalls past
        /// its ttl (a GC pause, a stopped VM, a slow network): its late writes
        /// carry no token a resource could reject, so they may land after the
        /// next holder's (see the [module docs](super), "Fencing off").
        ///
        /// [`Lease::fencing_token`]: crate::Lease::fencing_token
        pub fencing: bool = true,
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
        pub allow_eviction: bool = false,
        /// Refuse a server that does not write every change to its append-only
        /// file (`appendonly yes`), or whose setting cannot be read, with
        /// [`Error::InvalidInput`] when the locker is built. Default `false`: such
        /// a server is accepted, and [`Locker::durability_warnings`] (printed by
        /// `distlock cron` at start) says what a restart would forget. URL
        /// parameter `require_appendonly=true`.
        ///
        /// [`Locker::durability_warnings`]: crate::Locker::durability_warnings
        #[serde(alias = "require_appendonly")]
        pub require_appendonly: bool = false,
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
    /// User name and password are percent-decoded. The query sets any
    /// parameter a URL may set (the README's parameter table
    /// lists them, with their older spellings; values as [`crate::config`]
    /// says), `db` behind Sentinel only. Anything else is
    /// [`Error::InvalidInput`], as is a URL without a host; error messages
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
        let shown = redact(url);
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
        let (user_info, hosts, tail) = split_authority(rest);
        let user_info = user_info.map(|u| format!("{u}@")).unwrap_or_default();
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
        let (username, password) =
            decoded_credentials(parsed.username(), parsed.password()).map_err(&bad)?;
        let mut config = Config {
            username,
            password,
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
        // `db` is the path's, except behind Sentinel, whose path names
        // the master.
        let db_in_query = |key: &str| key != "db" || kind == Kind::Sentinel;
        let note = " (db behind Sentinel only)";
        set_url_query(&mut config, parsed.query_pairs(), db_in_query, note).map_err(&bad)?;
        Ok(config)
    }
}

crate::config::serde_config! {
    "Redis", "redis", "DISTLOCK_REDIS_", holder: record_holder, hosts: addresses,
    positive: [connect_timeout, response_timeout],
    parse: [cluster, db, response_timeout, min_replicas, replica_timeout, fencing, allow_eviction,
        require_appendonly],
    text: [sentinel_master, sentinel_username], path: [tls_ca, tls_client_cert, tls_client_key],
    fn set_param(&mut self, key, value, source) {
        match key {
            "sentinel_password" => self.sentinel_password = optional_password(value),
            other => return Err(format!("{source}: {other:?} is not a Redis parameter")),
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

/// The database a URL's path or `db` parameter names (0 if none).
fn parse_db(path: &str) -> Checked<i64> {
    match path.trim_start_matches('/') {
        "" => Ok(0),
        db => db
            .parse::<u32>()
            .map(i64::from)
            .map_err(|_| format!("the path {path:?} is not a database number")),
    }
}

#[cfg(test)]
mod tests;
