//! What a [`RedisLocker`](super::RedisLocker) connects to and how: [`Config`],
//! read from a URL, environment variables, JSON or YAML.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use percent_encoding::percent_decode_str;
use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, TlsCertificates,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::{Host, Url};

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
/// Environment variables read by [`Config::from_env`] start with this.
pub const ENV_PREFIX: &str = "DISTLOCK_REDIS_";

/// The query parameters [`Config::from_url`] understands.
const URL_PARAMETERS: &str =
    "prefix, connect_timeout, response_timeout, ca, client_cert, client_key";

/// How to reach one Redis server and how to name keys in it.
///
/// Build it from a URL ([`Config::from_url`]), the environment
/// ([`Config::from_env`]), JSON ([`Config::from_json`]), YAML
/// ([`Config::from_yaml`]), or in code from [`Config::default`]. The field
/// names in JSON and YAML are those of the Go seed this backend descends from
/// (`username`, `password`, `keyPrefix`, `addresses`, plus `db`, `tls`,
/// `tlsCa`, `tlsClientCert`, `tlsClientKey`, `connectTimeout`,
/// `responseTimeout`); the snake_case spellings are accepted too, unknown
/// fields are rejected.
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
    /// `host:port` of the server (`host`, `[::1]:6379`, ... ; the port
    /// defaults to 6379). Exactly one: the backend talks to a single node
    /// (a primary, or an address that always leads to the current primary).
    /// The Redlock backend (`distlock::redlock`, feature `redlock`) reads
    /// its list of independent nodes from here.
    pub addresses: Vec<String>,
    /// Database number (`SELECT`). Default 0.
    pub db: i64,
    /// Connect with TLS (rustls on the `ring` provider), as a `rediss://`
    /// URL does. The server's certificate must be valid for the host name
    /// of the address (an IP address must be in the certificate's subject
    /// alternative names) and chain to the system's root certificates, or
    /// to [`tls_ca`](Config::tls_ca) if set.
    pub tls: bool,
    /// A PEM file of the CA certificates that sign the server's
    /// certificate (URL parameter `ca`): they *replace* the system's roots.
    /// Needs [`tls`](Config::tls). Read when the locker is built.
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
        }
    }
}

impl Config {
    /// Reads `redis://[user:password@]host[:port][/db][?params]`, or
    /// `rediss://...` for TLS.
    ///
    /// User name and password are percent-decoded. Parameters:
    /// `prefix` (the key prefix; may be empty), `connect_timeout` and
    /// `response_timeout` (durations such as `2s` or `250ms`), and for
    /// `rediss://` the PEM files `ca` (a private CA for the server's
    /// certificate), `client_cert` and `client_key` (a client certificate,
    /// for servers that require one): [`Config::tls_ca`],
    /// [`Config::tls_client_cert`], [`Config::tls_client_key`]. Anything else
    /// is [`Error::InvalidInput`], as is a URL without a host. Error messages
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
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Config> {
        let bad = |reason: String| Error::invalid("url", format!("{}: {reason}", redact(url)));
        let parsed = Url::parse(url).map_err(|e| bad(format!("not a URL: {e}")))?;
        let tls = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            other => return Err(bad(format!("scheme {other:?} is neither redis nor rediss"))),
        };
        let host = host_of(&parsed).ok_or_else(|| bad("the URL names no host".into()))?;
        let port = parsed.port().unwrap_or(DEFAULT_PORT);
        let mut config = Config {
            username: decoded(parsed.username()).map_err(|e| bad(format!("user name: {e}")))?,
            password: match parsed.password() {
                Some(text) => decoded(text)
                    .map_err(|e| bad(format!("password: {e}")))?
                    .map(Password::new),
                None => None,
            },
            addresses: vec![format_address(&host, port)],
            db: parse_db(parsed.path()).map_err(bad)?,
            tls,
            ..Config::default()
        };
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "prefix" => config.key_prefix = value.into_owned(),
                "connect_timeout" => {
                    config.connect_timeout = parse_duration(&name, &value).map_err(bad)?
                }
                "response_timeout" => {
                    config.response_timeout = parse_duration(&name, &value).map_err(bad)?
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

    /// Checks the config and resolves the one server it names.
    pub(crate) fn endpoint(&self) -> Result<Endpoint> {
        let bad = |reason: String| Error::invalid("config", reason);
        let address = match self.addresses.as_slice() {
            [] => {
                return Err(bad(format!(
                    "no Redis address: set `addresses` (or {ENV_PREFIX}ADDRESSES), or use a redis:// URL"
                )))
            }
            [address] => address,
            many => {
                return Err(bad(format!(
                    "{} addresses given ({}); the redis backend talks to a single node \
                     (a primary, or an address that always leads to the current primary). \
                     For a quorum over independent nodes use Redlock \
                     (redlock://host1:port,host2:port,host3:port, feature `redlock`)",
                    many.len(),
                    many.iter().map(|a| redact_address(a)).collect::<Vec<_>>().join(", ")
                )))
            }
        };
        let (host, port) = parse_address(address).map_err(bad)?;
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
        Ok(Endpoint {
            host,
            port,
            tls: self.tls,
            db: self.db,
            username: self.username.clone(),
        })
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
        let mut redis_settings = RedisConnectionInfo::default()
            .set_db(self.db)
            .set_protocol(protocol);
        if let Some(username) = &self.username {
            redis_settings = redis_settings.set_username(username);
        }
        if let Some(password) = &self.password {
            redis_settings = redis_settings.set_password(password.expose());
        }
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
        if !endpoint.tls || (self.tls_ca.is_none() && self.tls_client_cert.is_none()) {
            return redis::Client::open(info).map_err(invalid);
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
        // redis-rs parses the PEM here: a file that holds no certificate or
        // key is refused now, naming what it could not parse (never the key).
        redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| {
            Error::invalid(
                "config",
                format!("{endpoint}: the TLS files do not hold usable PEM: {e}"),
            )
        })
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

/// The one server a [`Config`] names, checked. `Display` is the URL without the
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

/// A password: shown as `***` by `Debug`, so it never reaches logs through a
/// `{:?}` of the config. Read it with [`expose`](Password::expose).
///
/// In JSON and YAML it is a string (in YAML an unquoted `password: 0123` is
/// read as the text written). A value of another type, such as a JSON number,
/// is rejected without echoing it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    /// The password itself. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl From<String> for Password {
    fn from(password: String) -> Self {
        Password(password)
    }
}

impl From<&str> for Password {
    fn from(password: &str) -> Self {
        Password(password.to_owned())
    }
}

impl Serialize for Password {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        // The format's own type error would quote the offending value: the
        // password itself.
        String::deserialize(deserializer)
            .map(Password)
            .map_err(|_| {
                serde::de::Error::custom("the password must be a string (quote it in YAML)")
            })
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

/// Durations as human-readable text (`"1s"`, `"250ms"`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not a duration like \"500ms\": {e}"))
        })
    }
}

fn parse_duration(name: &str, value: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("{name} {value:?} is not a duration like \"500ms\": {e}"))
}

fn parse_bool(value: &str) -> std::result::Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(format!("{value:?} is not a boolean (true/false)")),
    }
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

/// Percent-decodes a URL's user name or password; `None` if empty.
fn decoded(text: &str) -> std::result::Result<Option<String>, &'static str> {
    let text = percent_decode_str(text)
        .decode_utf8()
        .map_err(|_| "not UTF-8 after percent-decoding")?;
    Ok(Some(text.into_owned()).filter(|t| !t.is_empty()))
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

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port`.
fn parse_address(address: &str) -> std::result::Result<(String, u16), String> {
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
    Ok((host, url.port().unwrap_or(DEFAULT_PORT)))
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
            ("http://u:topsecret@h", "neither redis nor rediss"),
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
            message.contains("single node") && message.contains("Redlock"),
            "{message}"
        );
    }

    #[test]
    fn addresses_are_host_and_port_only() {
        assert_eq!(parse_address("h").unwrap(), ("h".to_owned(), DEFAULT_PORT));
        assert_eq!(parse_address("[::1]:7").unwrap(), ("::1".to_owned(), 7));
        assert!(parse_address("redis://h:1")
            .unwrap_err()
            .contains("is a URL"));
        assert!(parse_address("h:1/2").is_err());
        let err = parse_address("u:pw@h:1").unwrap_err();
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
}
