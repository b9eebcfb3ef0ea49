//! What an [`EtcdLocker`](super::EtcdLocker) connects to and how: [`Config`],
//! read from a URL, environment variables, JSON or YAML, as the Redis
//! backend's.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::config::Password;
use crate::config::{
    check_hosts, duration_text, hosts_url, optional_text, require_user, resolve_addresses,
    HostsUrl, Param, Source, Table,
};
use crate::{Error, Result};

/// The key prefix used unless configured otherwise: the distlock key `K` is
/// the etcd lock name `lock:K`, the name `etcdctl lock lock:K` takes.
pub const DEFAULT_KEY_PREFIX: &str = "lock:";
/// How long establishing a connection to one member may take, unless
/// configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one request (a transaction, a get, a lease grant) may take,
/// unless configured otherwise. etcd-client has no default: without one a
/// request to a cluster that lost its quorum waits for ever.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a lease keep-alive may go unanswered before the keep-alive
/// stream is reopened, and the HTTP/2 ping timeout of the connections,
/// unless configured otherwise.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// The port used when an endpoint names none.
pub const DEFAULT_PORT: u16 = 2379;

/// Every parameter of [`Config`], by its one name and its older spellings:
/// the table URL parameters, `DISTLOCK_ETCD_*` variables and
/// [`Config::set`] are read through (see [`crate::config`]).
pub(crate) const PARAMETERS: Table = Table(&[&[
    Param::USERNAME,
    Param::PASSWORD,
    Param::other("endpoints", &[]),
    Param::TLS,
    Param::KEY_PREFIX,
    Param::CONNECT_TIMEOUT,
    Param::url("request_timeout", &[]),
    Param::url("keepalive_timeout", &[]),
    Param::url("ca_file", &["tls_ca", "ca"]),
    Param::HOLDER_RECORD,
]]);

crate::config::config_struct! {
    /// How to reach an etcd cluster and how to name locks in it.
    ///
    /// Read from every source as [`crate::config`] says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::etcd::Config;
    ///
    /// let config = Config {
    ///     endpoints: vec!["10.0.0.5:2379".into(), "10.0.0.6:2379".into()],
    ///     password: Some("s3cret".into()),
    ///     username: Some("app".into()),
    ///     request_timeout: Duration::from_millis(500),
    ///     ..Config::default()
    /// };
    /// assert_eq!(config.key_prefix, "lock:");
    /// assert!(!format!("{config:?}").contains("s3cret"));
    /// ```
    pub struct Config {
        /// etcd user (etcd's auth). `None` for a cluster without auth.
        username,
        /// The user's password.
        password,
        /// Prepended to every key: the caller's key `k` is the etcd lock name
        /// `<key_prefix>k`, whose lock keys are `<key_prefix>k/<lease id in
        /// hex>`. Default [`DEFAULT_KEY_PREFIX`].
        key_prefix,
        /// `host:port` of each member (the port defaults to 2379). Requests are
        /// balanced over every endpoint; a member that is down is skipped.
        hosts endpoints,
        /// Connect with TLS (rustls on the `ring` provider), verifying the
        /// members against the system's root certificates, or against
        /// [`ca_file`](Config::ca_file), as an `etcd+https://` URL does.
        tls,
        /// A PEM file of the certificate authority that signed the members'
        /// certificates (implies [`tls`](Config::tls)).
        #[serde(
            alias = "ca_file",
            alias = "tls_ca",
            alias = "ca",
            skip_serializing_if = "Option::is_none"
        )]
        pub ca_file: Option<PathBuf> = None,
        /// Bound on establishing a connection to one member. Default
        /// [`DEFAULT_CONNECT_TIMEOUT`]. Text like `"1s"`, `"500ms"`.
        connect_timeout,
        /// Bound on every request: each transaction, get, lease grant or
        /// revoke, and each step of a wait other than the wait itself.
        /// Default [`DEFAULT_REQUEST_TIMEOUT`]. An acquire whose answer timed
        /// out may have written its key: it is deleted by lease and owner before
        /// the error is reported (see the [module docs](super)).
        #[serde(alias = "request_timeout", with = "duration_text")]
        pub request_timeout: Duration = DEFAULT_REQUEST_TIMEOUT,
        /// How long one lease keep-alive may go unanswered before the stream is
        /// reopened (the lease is given up only when its ttl is nearly spent),
        /// and the HTTP/2 keep-alive ping interval and timeout of the
        /// connections, so a dead connection is noticed even while idle.
        /// Default [`DEFAULT_KEEPALIVE_TIMEOUT`].
        #[serde(alias = "keepalive_timeout", with = "duration_text")]
        pub keepalive_timeout: Duration = DEFAULT_KEEPALIVE_TIMEOUT,
        /// Write each grant's holder record (host, pid, label, grant time on
        /// the holder's clock, ttl) into its lock key's value, for
        /// [`Locker::inspect`](crate::Locker::inspect). Default `true`; off
        /// (URL `holder_record=off`, or the older `holder=off`), the value
        /// carries only the grant's secret and inspection reports an unknown
        /// holder.
        holder_record,
    }
}

impl Config {
    /// Reads `etcd://[user:password@]host1[:port][,host2[:port]...][/][?params]`,
    /// or `etcd+https://...` for TLS.
    ///
    /// User name and password are percent-decoded. The query sets any
    /// parameter a URL may set (the README's parameter table
    /// lists them; values as [`crate::config`] says; `ca_file` implies
    /// TLS). Anything else is [`Error::InvalidInput`], as is a URL without
    /// an endpoint; error messages never contain the password.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::etcd::Config;
    ///
    /// let config = Config::from_url(
    ///     "etcd+https://app:p%40ss@etcd-1:2379,etcd-2,[::1]:2381?prefix=jobs:&request_timeout=500ms",
    /// )?;
    /// assert_eq!(config.endpoints, ["etcd-1:2379", "etcd-2:2379", "[::1]:2381"]);
    /// assert_eq!(config.username.as_deref(), Some("app"));
    /// assert_eq!(config.password.as_ref().map(|p| p.expose()), Some("p@ss"));
    /// assert!(config.tls);
    /// assert_eq!(config.key_prefix, "jobs:");
    /// assert_eq!(config.request_timeout, Duration::from_millis(500));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Config> {
        HostsUrl::read(url, DEFAULT_PORT, |parts| {
            let tls = match parts.scheme {
                "etcd" => false,
                "etcd+https" => true,
                other => return Err(format!("scheme {other:?} is neither etcd nor etcd+https")),
            };
            if !parts.path.is_empty() && parts.path != "/" {
                return Err(format!(
                    "the path {:?} means nothing here; etcd has no databases",
                    parts.path
                ));
            }
            Ok(Config {
                tls,
                ..Config::default()
            })
        })
    }
}

crate::config::serde_config! {
    "etcd", "etcd", "DISTLOCK_ETCD_", holder: holder_record, hosts: endpoints,
    positive: [connect_timeout, request_timeout, keepalive_timeout],
    parse: [request_timeout, keepalive_timeout],
    fn set_param(&mut self, key, value, source) {
        match key {
            // A CA file means TLS, from whatever source it is named.
            "ca_file" => {
                self.ca_file = optional_text(value).map(PathBuf::from);
                if matches!(source, Source::Url(_)) {
                    self.tls |= self.ca_file.is_some();
                }
            }
            other => return Err(format!("{source}: {other:?} is not an etcd parameter")),
        }
    }
}

impl Config {
    /// Checks the config and resolves its endpoints to the URLs etcd-client
    /// connects to (`http://h:p` or `https://h:p`).
    pub(crate) fn endpoint_urls(&self) -> Result<Vec<String>> {
        let bad = |reason: String| Error::invalid("config", reason);
        check_hosts(self, "etcd endpoint", "an etcd://").map_err(bad)?;
        require_user(self, "etcd authenticates a named user").map_err(bad)?;
        let scheme = if self.uses_tls() { "https" } else { "http" };
        let endpoints = resolve_addresses(self.endpoints.iter().map(String::as_str), DEFAULT_PORT);
        Ok(endpoints
            .map_err(bad)?
            .into_iter()
            .map(|endpoint| format!("{scheme}://{endpoint}"))
            .collect())
    }

    /// Whether connections use TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        self.tls || self.ca_file.is_some()
    }
}

/// The cluster as a URL without the password, for messages.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.uses_tls() {
            "etcd+https"
        } else {
            "etcd"
        };
        f.write_str(&hosts_url(self, scheme, ""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{assert_error, redact};

    #[test]
    fn urls_give_every_field() {
        let url = "etcd://alice:p%40ss%3Aword@e1:2379,e2:2380/?prefix=app:&connect_timeout=3s&keepalive_timeout=250ms";
        let hosts = ["e1:2379", "e2:2380"];
        let config: Config = crate::config::assert_hosts_url(url, "p@ss:word", &hosts);
        assert!(!config.tls);
        assert_eq!(config.key_prefix, "app:");
        assert_eq!(config.connect_timeout, Duration::from_secs(3));
        assert_eq!(config.keepalive_timeout, Duration::from_millis(250));
        assert_eq!(config.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(
            config.endpoint_urls().unwrap(),
            ["http://e1:2379", "http://e2:2380"]
        );
        let tls = Config::from_url("etcd://h?ca_file=/etc/ca.pem").unwrap();
        assert!(tls.uses_tls());
        assert_eq!(tls.endpoint_urls().unwrap(), ["https://h:2379"]);
        assert_eq!(Config::from_url("etcd://h:80").unwrap().endpoints, ["h:80"]);
    }

    #[test]
    fn bad_urls_say_why_without_the_password() {
        let cases = [
            ("etcd://u:topsecret@h/db", "no databases"),
            ("http://u:topsecret@h", "neither etcd nor etcd+https"),
        ];
        crate::config::assert_url_errors(Config::from_url, "topsecret", &cases);
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let config = Config::from_url("etcd+https://bob:hunter2@h:1,g:2").unwrap();
        crate::config::assert_redacted(&config, "hunter2");
        assert_eq!(config.to_string(), "etcd+https://bob@h:1,g:2");
        assert_eq!(
            redact("etcd://bob:hunter2@h:1,g:2/?prefix=x"),
            "etcd://bob:***@h:1,g:2/?prefix=x"
        );
    }

    #[test]
    fn env_vars_override_the_defaults() {
        let vars = "CA_FILE=/ca.pem REQUEST_TIMEOUT=50ms KEEPALIVE_TIMEOUT=3s";
        let config: Config = crate::config::assert_shared_env(vars);
        assert_eq!(config.ca_file, Some("/ca.pem".into()));
        assert_eq!(config.request_timeout, Duration::from_millis(50));
        assert_eq!(config.keepalive_timeout, Duration::from_secs(3));
    }

    #[test]
    fn json_and_yaml_read_the_same_fields() {
        let json = r#"{"username":"u","password":"p","keyPrefix":"x:","endpoints":["h:1"],
                       "tls":true,"connectTimeout":"2s","requestTimeout":"100ms","keepaliveTimeout":"1s"}"#;
        let yaml = "
username: u
password: p
key_prefix: 'x:'
endpoints: ['h:1']
tls: true
connect_timeout: 2s
requestTimeout: 100ms
keepaliveTimeout: 1s
";
        let from_json = Config::from_json(json).unwrap();
        assert_eq!(from_json, Config::from_yaml(yaml).unwrap());
        let text = serde_json::to_string(&from_json).unwrap();
        assert_eq!(Config::from_json(&text).unwrap(), from_json);
        assert_error(Config::from_yaml("endpionts: [h]"), "endpionts");
    }

    #[test]
    fn configs_are_checked_before_connecting() {
        assert_error(Config::default().endpoint_urls(), "no etcd endpoint");
        let zero = Config::from_url("etcd://h?request_timeout=0").unwrap();
        assert_error(zero.endpoint_urls(), "request_timeout is zero");
        let anonymous = Config::from_url("etcd://:pw@h").unwrap();
        assert!(anonymous.username.is_none() && anonymous.password.is_some());
        assert_error(anonymous.endpoint_urls(), "a password without a user name");
    }

    #[test]
    fn every_source_reaches_the_same_settings() {
        let url: Config = crate::config::assert_every_source(
            "etcd://e1:2379,e2:2379?key_prefix=jobs:&request_timeout=5&keepalive_timeout=500ms&holder_record=off",
            "ENDPOINTS=e1:2379,e2:2379 KEY_PREFIX=jobs: REQUEST_TIMEOUT=5 KEEPALIVE_TIMEOUT=500ms HOLDER_RECORD=off",
            r#"{"endpoints": ["e1:2379", "e2:2379"], "keyPrefix": "jobs:", "requestTimeout": 5,
                "keepaliveTimeout": "500ms", "holderRecord": false}"#,
            "endpoints: [e1:2379, e2:2379]\nprefix: 'jobs:'\nrequest_timeout: 5s\n\
             keepalive_timeout: 500ms\nholder: false\n",
        );
        assert_eq!(url.request_timeout, Duration::from_secs(5));
        for param in ["holder", "record_holder", "holder_record"] {
            let url = Config::from_url(&format!("etcd://h?{param}=off")).unwrap();
            assert!(!url.holder_record, "{param}");
        }
        for param in ["ca_file", "tls_ca", "ca"] {
            let url = Config::from_url(&format!("etcd://h?{param}=/ca.pem")).unwrap();
            assert!(url.ca_file.is_some() && url.tls, "{param}");
        }
        let mut set = Config::default();
        set.set("prefix", "x:").unwrap();
        assert_eq!(set.key_prefix, "x:");
    }

    #[test]
    fn every_url_parameter_is_in_the_readme() {
        crate::config::assert_in_readme("etcd", PARAMETERS);
    }
}
