//! Where a Redis [`Config`] points: the deployment it names (one server, a
//! Redis Cluster's seed nodes, or sentinels and their master), checked, and
//! the redis-rs connection settings and TLS files for each node. Reading the
//! sources is `config.rs`'s part; this file resolves what they said.

use std::fmt;
use std::path::Path;

use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, TlsCertificates,
};

use super::{Config, DEFAULT_PORT, DEFAULT_SENTINEL_PORT};
use crate::config::{
    check_positive, display_url, format_address, parse_address, require_hosts, Checked, HostList,
};
use crate::{Error, Result};

impl Config {
    /// Checks the config and resolves the deployment it names.
    pub(crate) fn deployment(&self) -> Result<Deployment> {
        let bad = |reason: String| Error::invalid("config", reason);
        require_hosts(self, "Redis address", "a redis://").map_err(bad)?;
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
        check_positive(&self.timeouts()).map_err(bad)?;
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
    fn check_tls_files(&self) -> Checked {
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
                let user = seeds.first().and_then(|e| e.username.as_deref());
                f.write_str(&display_url(scheme, user, &list(seeds), ""))
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
        let address = format_address(&self.host, self.port);
        let db = format!("/{}", self.db);
        f.write_str(&display_url(
            scheme,
            self.username.as_deref(),
            &address,
            &db,
        ))
    }
}

// The contents of a PEM file named by the config's `field`.
fn read_pem(field: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid("config", format!("{field} {}: {e}", path.display())))
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
    use crate::config::{assert_error, Password};
    use crate::redis::config::DEFAULT_RESPONSE_TIMEOUT;
    use std::time::Duration;

    #[test]
    fn ipv6_hosts_keep_their_brackets_in_addresses_only() {
        let config = Config::from_url("redis://[::1]:7000").unwrap();
        assert_eq!(config.addresses, ["[::1]:7000"]);
        let endpoint = config.endpoint().unwrap();
        assert_eq!(endpoint.host, "::1");
        assert_eq!(endpoint.to_string(), "redis://[::1]:7000/0");
    }

    #[test]
    fn exactly_one_address_is_accepted() {
        assert_error(Config::default().endpoint(), "no Redis address");
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
        assert_error(both.deployment(), "not both");
        let cluster_db = Config {
            addresses: vec!["a".into()],
            cluster: true,
            db: 1,
            ..Config::default()
        };
        assert_error(cluster_db.deployment(), "only database 0");
        let slow_wait = Config {
            addresses: vec!["a".into()],
            min_replicas: 1,
            replica_timeout: DEFAULT_RESPONSE_TIMEOUT,
            ..Config::default()
        };
        assert_error(slow_wait.deployment(), "shorter than response_timeout");
    }

    #[test]
    fn zero_timeouts_and_negative_dbs_are_rejected() {
        let zero = Config::from_url("redis://h?response_timeout=0").unwrap();
        assert_error(zero.endpoint(), "response_timeout is zero");
        let negative = Config {
            db: -1,
            ..Config::from_url("redis://h").unwrap()
        };
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
        assert_error(sentinel.deployment(), "not supported with sentinel_master");
        let plain = Config::from_url("rediss+sentinel://s1,s2/orders").unwrap();
        assert!(plain.deployment().is_ok());
    }
}
