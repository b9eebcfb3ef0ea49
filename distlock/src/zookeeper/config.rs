//! What a [`ZooKeeperLocker`](super::ZooKeeperLocker) connects to and how:
//! [`Config`], read from a URL, environment variables, JSON or YAML, as the
//! etcd backend's.

use std::fmt;
use std::time::Duration;

pub use crate::config::Password;
use crate::config::{
    check_hosts, decode, duration_text, hosts_url, require_user, resolve_addresses, HostsUrl,
    Param, Table,
};
use crate::{Error, Result};

/// The key prefix used unless configured otherwise: the distlock key `K` is
/// the lock path `/distlock/locks/K` (with `/` and `%` in `K`
/// percent-encoded), the path to give kazoo's `Lock` or Curator's
/// `InterProcessMutex` to share the lock.
pub const DEFAULT_KEY_PREFIX: &str = "/distlock/locks/";
/// The session timeout asked of the ensemble unless configured otherwise
/// (kazoo's default). The ensemble may negotiate it into its
/// `minSessionTimeout`..`maxSessionTimeout` (2 to 20 ticks by default);
/// every bound this backend states uses the negotiated one.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long establishing a session may take, unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request (a create, a read, a delete) may take, unless
/// configured otherwise. zookeeper-client has no request timeout: a request
/// sent while the client is disconnected waits until it reconnects.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The port used when an endpoint names none.
pub const DEFAULT_PORT: u16 = 2181;
/// The most sessions a locker spreads its locks over, unless configured
/// otherwise: as the SQL backends' `sessions`.
pub const DEFAULT_SESSIONS: usize = 4;

crate::config::config_struct! {
    /// How to reach a ZooKeeper ensemble and where its locks live.
    ///
    /// Read from every source as [`crate::config`] says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::zookeeper::Config;
    ///
    /// let config = Config {
    ///     endpoints: vec!["10.0.0.5:2181".into(), "10.0.0.6:2181".into()],
    ///     chroot: Some("/apps/billing".into()),
    ///     session_timeout: Duration::from_secs(6),
    ///     ..Config::default()
    /// };
    /// assert_eq!(config.key_prefix, "/distlock/locks/");
    /// assert_eq!(config.to_string(), "zookeeper://10.0.0.5:2181,10.0.0.6:2181/apps/billing");
    /// ```
    pub struct Config {
        /// A user of ZooKeeper's `digest` authentication scheme: the session
        /// sends `addauth digest <user>:<password>` when it connects. `None`
        /// for an ensemble without authentication. The lock nodes are created
        /// with the open ACL (`world:anyone`), as kazoo's and Curator's
        /// recipes create theirs by default.
        username,
        /// The user's password.
        password,
        /// `host:port` of each server (the port defaults to 2181). The client
        /// connects to one at a time and moves to another when it loses it.
        hosts endpoints,
        /// A path every other path is relative to (ZooKeeper's chroot, the
        /// `/path` after the hosts of a connect string). It must exist:
        /// connecting fails saying so if it does not.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub chroot: Option<String> = None,
        /// TLS is not supported yet: `true` is refused when connecting, with
        /// the reason (zookeeper-client's TLS links rustls with its default
        /// `aws-lc-rs` provider, and distlock builds rustls on `ring` alone:
        /// with both linked, rustls cannot pick a default provider).
        tls,
        /// Prepended to every key, after percent-encoding `/` and `%` in it:
        /// the key `k` is the lock path `<key_prefix>k`, whose children are
        /// the contenders' nodes. An absolute path (it starts with `/`);
        /// default [`DEFAULT_KEY_PREFIX`]. The lock path's parent is created
        /// (persistent) when missing, and each lock path as a container node,
        /// which the server deletes once it has no child.
        key_prefix,
        /// The session timeout asked of the ensemble (it negotiates it into
        /// its bounds): how long a session outlives a client that stopped
        /// answering, and so how long a crashed holder keeps its locks.
        /// Default [`DEFAULT_SESSION_TIMEOUT`]. Text like `"6s"`.
        #[serde(alias = "session_timeout", with = "duration_text")]
        pub session_timeout: Duration = DEFAULT_SESSION_TIMEOUT,
        /// Bound on establishing a session (connecting to a server and the
        /// session handshake). Default [`DEFAULT_CONNECT_TIMEOUT`].
        connect_timeout,
        /// Bound on every request: each create, read, delete and watch set.
        /// Default [`DEFAULT_REQUEST_TIMEOUT`]. A create whose answer timed out
        /// may have been applied: it is found by its protection prefix and
        /// deleted (see the [module docs](super)).
        #[serde(alias = "request_timeout", with = "duration_text")]
        pub request_timeout: Duration = DEFAULT_REQUEST_TIMEOUT,
        /// The most sessions the locker spreads its locks over (1 to
        /// [`MAX_SESSIONS`](crate::config::MAX_SESSIONS); default
        /// [`DEFAULT_SESSIONS`]). A key's locks always live on
        /// the same one (chosen by a hash of the key), opened when a key
        /// first needs it. One session answers its requests in order, and
        /// the server spends more CPU a request on one busy session than
        /// on several: many clients of one locker run faster over several
        /// (BENCHMARKS.md, ZooKeeper). Each session has its own heartbeat
        /// and lost signal; a session lost loses only its own locks. The
        /// session opened to check the ensemble is the first key's, so a
        /// locker of one key has one. Each session is a TCP connection, and
        /// a server refuses more than its `maxClientCnxns` (60 by default)
        /// from one client address: where many lockers run on one host,
        /// mind `sessions` × lockers.
        pub sessions: usize = DEFAULT_SESSIONS,
        /// Write each grant's holder record (host, pid, label, grant time on
        /// the holder's clock, ttl) as its node's data, for
        /// [`Locker::inspect`](crate::Locker::inspect). Default `true`; off
        /// (URL `holder_record=off`), the node's data is empty and inspection
        /// reports an unknown holder.
        holder_record,
    }
}

/// Every parameter of [`Config`], by its one name and its older spellings:
/// the table URL parameters, `DISTLOCK_ZOOKEEPER_*` variables and
/// [`Config::set`] are read through (see [`crate::config`]).
pub(crate) const PARAMETERS: Table = Table(&[&[
    Param::USERNAME,
    Param::PASSWORD,
    Param::other("endpoints", &[]),
    Param::other("chroot", &[]),
    Param::TLS,
    Param::KEY_PREFIX,
    Param::url("session_timeout", &[]),
    Param::CONNECT_TIMEOUT,
    Param::url("request_timeout", &[]),
    Param::url("sessions", &[]),
    Param::HOLDER_RECORD,
]]);

crate::config::serde_config! {
    "zookeeper", "zookeeper", "DISTLOCK_ZOOKEEPER_", holder: holder_record, hosts: endpoints,
    positive: [session_timeout, connect_timeout, request_timeout],
    parse: [session_timeout, request_timeout, sessions], text: [chroot],
    fn set_param(&mut self, key, value, source) {
        return Err(format!("{source}: {key:?} is not a zookeeper parameter"))
    }
}

impl Config {
    /// Reads `zookeeper://[user:password@]host1[:port][,host2[:port]...][/chroot][?params]`.
    ///
    /// User name and password (ZooKeeper `digest` authentication) are
    /// percent-decoded; so is the chroot. The query sets any parameter a
    /// URL may set (the README's parameter table lists them; values as
    /// [`crate::config`] says). Anything else is [`Error::InvalidInput`], as
    /// is a URL without an endpoint; error messages never contain the
    /// password.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::zookeeper::Config;
    ///
    /// let config = Config::from_url(
    ///     "zookeeper://zk-1:2181,zk-2,[::1]:2182/apps/billing?session_timeout=6s&request_timeout=500ms",
    /// )?;
    /// assert_eq!(config.endpoints, ["zk-1:2181", "zk-2:2181", "[::1]:2182"]);
    /// assert_eq!(config.chroot.as_deref(), Some("/apps/billing"));
    /// assert_eq!(config.session_timeout, Duration::from_secs(6));
    /// assert_eq!(config.request_timeout, Duration::from_millis(500));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Config> {
        HostsUrl::read(url, DEFAULT_PORT, |parts| {
            if parts.scheme != "zookeeper" {
                return Err(format!("scheme {:?} is not zookeeper", parts.scheme));
            }
            let mut config = Config::default();
            let path = parts.path;
            if !path.is_empty() && path != "/" {
                let chroot = decode(path.trim_end_matches('/'))
                    .map_err(|e| format!("the chroot {path:?} is {e}"))?;
                config.chroot = Some(chroot);
            }
            Ok(config)
        })
    }
}

impl Config {
    /// Checks the config and resolves it to zookeeper-client's connect
    /// string (`h1:p1,h2:p2[/chroot]`).
    pub(crate) fn connect_string(&self) -> Result<String> {
        let bad = |reason: String| Error::invalid("config", reason);
        check_hosts(self, "ZooKeeper endpoint", "a zookeeper://").map_err(bad)?;
        if self.tls {
            return Err(bad(
                "TLS to ZooKeeper is not supported yet: zookeeper-client's TLS links rustls with \
                 the aws-lc-rs provider, and distlock builds rustls on ring alone (with both, \
                 rustls cannot choose a default provider); reach the ensemble over a TLS tunnel \
                 or a trusted network instead"
                    .into(),
            ));
        }
        require_user(
            self,
            "ZooKeeper's digest scheme authenticates user:password",
        )
        .map_err(bad)?;
        crate::config::check_sessions(self.sessions).map_err(bad)?;
        if !self.key_prefix.starts_with('/') {
            return Err(bad(format!(
                "key_prefix {:?} is not an absolute ZooKeeper path; it must start with `/` (default {DEFAULT_KEY_PREFIX:?})",
                self.key_prefix
            )));
        }
        let parent = self.key_prefix.rsplit_once('/').map_or("", |(dir, _)| dir);
        if parent.contains("//") || parent.ends_with('/') {
            return Err(bad(format!(
                "key_prefix {:?} has an empty path segment",
                self.key_prefix
            )));
        }
        let hosts = resolve_addresses(self.endpoints.iter().map(String::as_str), DEFAULT_PORT);
        let mut connect = hosts.map_err(bad)?.join(",");
        if let Some(chroot) = self.chroot() {
            if !chroot.starts_with('/') || chroot.contains("//") {
                return Err(bad(format!(
                    "chroot {chroot:?} is not an absolute ZooKeeper path (like /apps/billing)"
                )));
            }
            connect.push_str(chroot);
        }
        Ok(connect)
    }

    /// The chroot, if any other than `/`.
    pub(crate) fn chroot(&self) -> Option<&str> {
        self.chroot
            .as_deref()
            .map(|c| c.trim_end_matches('/'))
            .filter(|c| !c.is_empty())
    }
}

/// The ensemble as a URL without the password, for messages.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hosts_url(self, "zookeeper", self.chroot().unwrap_or("")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::assert_error;

    #[test]
    fn bad_urls_say_why_without_the_password() {
        let cases = [
            (
                "zookeeper://u:topsecret@h?session_timeout=soon",
                "not a duration",
            ),
            ("zk://u:topsecret@h", "is not zookeeper"),
        ];
        crate::config::assert_url_errors(Config::from_url, "topsecret", &cases);
    }

    #[test]
    fn urls_give_every_field() {
        let url = "zookeeper://alice:p%40ss@z1:2181,z2:2182/apps/b%20c/?prefix=/jobs/&session_timeout=4s&connect_timeout=3s";
        let hosts = ["z1:2181", "z2:2182"];
        let config: Config = crate::config::assert_hosts_url(url, "p@ss", &hosts);
        assert_eq!(config.chroot.as_deref(), Some("/apps/b c"));
        assert_eq!(config.key_prefix, "/jobs/");
        assert_eq!(config.session_timeout, Duration::from_secs(4));
        assert_eq!(config.connect_timeout, Duration::from_secs(3));
        assert_eq!(config.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(config.connect_string().unwrap(), "z1:2181,z2:2182/apps/b c");
        let plain = Config::from_url("zookeeper://h").unwrap();
        assert_eq!(plain.connect_string().unwrap(), "h:2181");
        assert_eq!(plain.chroot, None);
        assert_eq!(Config::from_url("zookeeper://h/").unwrap().chroot, None);
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let config = Config::from_url("zookeeper://bob:hunter2@h:1,g:2/c").unwrap();
        crate::config::assert_redacted(&config, "hunter2");
        assert_eq!(config.to_string(), "zookeeper://bob@h:1,g:2/c");
    }

    #[test]
    fn env_vars_override_the_defaults() {
        let vars = "CHROOT=/apps SESSION_TIMEOUT=6s REQUEST_TIMEOUT=50ms";
        let config: Config = crate::config::assert_shared_env(vars);
        assert_eq!(config.chroot.as_deref(), Some("/apps"));
        assert_eq!(config.session_timeout, Duration::from_secs(6));
        assert_eq!(config.request_timeout, Duration::from_millis(50));
    }

    #[test]
    fn every_source_reaches_the_same_settings() {
        crate::config::assert_every_source::<Config>(
            "zookeeper://z1:2181,z2:2181/apps?key_prefix=/jobs/&session_timeout=5&request_timeout=500ms&holder_record=off&sessions=2",
            "ENDPOINTS=z1:2181,z2:2181 CHROOT=/apps KEY_PREFIX=/jobs/ SESSION_TIMEOUT=5 REQUEST_TIMEOUT=500ms HOLDER_RECORD=off SESSIONS=2",
            r#"{"endpoints": ["z1:2181", "z2:2181"], "chroot": "/apps", "keyPrefix": "/jobs/",
                "sessionTimeout": 5, "requestTimeout": "500ms", "holderRecord": false, "sessions": 2}"#,
            "endpoints: [z1:2181, z2:2181]\nchroot: /apps\nprefix: /jobs/\nsession_timeout: 5s\n\
             request_timeout: 500ms\nholder: false\nsessions: 2\n",
        );
        assert_error(Config::from_yaml("endpionts: [h]"), "endpionts");
    }

    #[test]
    fn configs_are_checked_before_connecting() {
        let check =
            |config: Config, expected: &str| assert_error(config.connect_string(), expected);
        check(Config::default(), "no ZooKeeper endpoint");
        let url = |u: &str| Config::from_url(u).unwrap();
        check(
            url("zookeeper://h?session_timeout=0"),
            "session_timeout is zero",
        );
        check(url("zookeeper://h?sessions=0"), "sessions is 0");
        check(url("zookeeper://h?sessions=1000000000"), "at most 1024");
        check(url("zookeeper://h?prefix=locks/"), "not an absolute");
        check(url("zookeeper://h?prefix=/a//b/"), "empty path segment");
        check(url("zookeeper://:pw@h"), "a password without a user name");
        let mut tls = url("zookeeper://h");
        tls.set("tls", "on").unwrap();
        check(tls, "TLS to ZooKeeper is not supported yet");
    }

    #[test]
    fn every_url_parameter_is_in_the_readme() {
        crate::config::assert_in_readme("zookeeper", PARAMETERS);
    }
}
