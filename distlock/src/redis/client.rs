//! Client wiring: what a [`Config`] becomes before anything is sent (the
//! deployment, the connection manager's reconnect policy, the bounds), the
//! connection to one server, a cluster or a sentinel-managed master, and
//! how every call goes out on it: under the operation bound, its redis-rs
//! error mapped once.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::{ProtocolVersion, TlsMode};

use super::acquire::ReplicaAck;
use super::config::{self, Deployment};
use super::connection::{ClusterSettings, Connection, SentinelConnection};
use super::errors::Target;
use super::keys::KeySpace;
use super::releases::{ReleaseHub, SubscriberSource};
use super::{Config, Inner, RedisLocker, BACKEND};
use crate::deadline::bounded;
use crate::{Error, Result};

/// How often the connection manager retries a broken connection before the
/// waiting command fails (it retries again on the next command). With the
/// delays below, restarts shorter than about 0.35 s are bridged, and a command
/// during an outage fails within about 0.7 s plus the connect attempts, or at
/// the operation bound ([`RedisLocker::operation_bound`]), whichever comes
/// first.
const RECONNECT_RETRIES: usize = 3;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(400);
/// The longest the connection manager sleeps between the attempts of one
/// reconnect cycle: 50 + 100 + 200 ms, each up to doubled by its jitter
/// (redis-rs builds a jittered exponential backoff; see
/// `ConnectionManager::new_lazy_with_config` in redis-rs 1.x).
const RECONNECT_PAUSES: Duration = Duration::from_millis(700);

impl RedisLocker {
    /// Connects to the deployment `config` names (one server, a Redis
    /// Cluster's seed nodes, or sentinels and their master), failing if it
    /// cannot be reached or rejects the credentials (one attempt plus the
    /// reconnect retries, all within [`RedisLocker::operation_bound`]).
    /// Then reads each master's eviction and persistence settings (one more
    /// round trip, also bounded; see the [module docs](super), "What the
    /// server must be configured with").
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a config that names no server, several
    /// without saying they are a cluster or sentinels, or has invalid
    /// settings; also (`what` = `"server configuration"`) for a server that
    /// may evict keys (`maxmemory` set, `maxmemory-policy` other than
    /// `noeviction`) unless [`Config::allow_eviction`], and for one without
    /// `appendonly yes` under [`Config::require_appendonly`].
    /// [`Error::Backend`] if connecting fails (an authentication
    /// failure says so; for Sentinel, also when no sentinel names a reachable
    /// master), and also if it does not finish within the bound (the
    /// message names the server, `connect_timeout` and `response_timeout`).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt; nothing is left
    /// behind on the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::redis::{Config, RedisLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = RedisLocker::from_config(Config::from_env()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        let parts = Parts::new(&config)?;
        let (connection, subscriber, publish) = match &parts.deployment {
            Deployment::Standalone(endpoint) => {
                let (command_client, subscriber_client) = standalone_clients(&config, endpoint)?;
                let connection = parts
                    .connect(ConnectionManager::new_with_config(
                        command_client,
                        parts.manager.clone(),
                    ))
                    .await?;
                (
                    Connection::Standalone(connection),
                    SubscriberSource::Node(subscriber_client),
                    "PUBLISH",
                )
            }
            Deployment::Cluster(seeds) => {
                let settings = ClusterSettings {
                    seeds: seeds
                        .iter()
                        .map(|seed| config.connection_info(seed, ProtocolVersion::RESP3))
                        .collect::<Result<_>>()?,
                    certificates: config.tls_certificates()?,
                    connect_timeout: config.connect_timeout,
                    response_timeout: config.response_timeout,
                };
                let client = settings.client(None).map_err(|e| parts.invalid(e))?;
                let connection = parts.connect(client.get_async_connection()).await?;
                (
                    Connection::Cluster(connection),
                    SubscriberSource::Cluster(settings),
                    "SPUBLISH",
                )
            }
            Deployment::Sentinel { sentinels, master } => {
                let node = |protocol| {
                    let info = SentinelNodeConnectionInfo::default()
                        .set_redis_connection_info(config.redis_settings(protocol));
                    if config.tls {
                        info.set_tls_mode(TlsMode::Secure)
                    } else {
                        info
                    }
                };
                let connection = SentinelConnection::new(
                    sentinels
                        .iter()
                        .map(|sentinel| config.sentinel_connection_info(sentinel))
                        .collect::<Result<_>>()?,
                    master.clone(),
                    config.db,
                    node(ProtocolVersion::RESP3),
                    node(ProtocolVersion::RESP2),
                    parts.manager.clone(),
                )
                .map_err(|e| parts.invalid(e))?;
                parts.connect(connection.connect()).await?;
                (
                    Connection::Sentinel(connection.clone()),
                    SubscriberSource::Sentinel(connection),
                    "PUBLISH",
                )
            }
        };
        let locker = parts.into_locker(config, connection, subscriber, publish);
        locker.check_server().await?;
        Ok(locker)
    }

    /// A locker on the one server `config` names that connects on first use
    /// (and keeps reconnecting), so it can be built while the server is
    /// down: the Redlock backend's nodes, a minority of which may be. Only a
    /// standalone server without replica acknowledgement: a Redlock node is
    /// an independent server, and Redlock's acquire does not `WAIT`.
    #[cfg(feature = "redlock")]
    pub(crate) fn from_config_lazy(config: Config) -> Result<Self> {
        let parts = Parts::new(&config)?;
        let Deployment::Standalone(endpoint) = &parts.deployment else {
            return Err(Error::invalid(
                "config",
                format!(
                    "{}: a Redlock node is one independent server, not a Redis Cluster or a \
                     master behind Sentinel",
                    parts.deployment
                ),
            ));
        };
        if config.min_replicas > 0 {
            return Err(Error::invalid(
                "config",
                format!(
                    "{endpoint}: min_replicas is {}; Redlock's nodes are independent servers \
                     and its acquire does not wait for replicas (leave it 0)",
                    config.min_replicas
                ),
            ));
        }
        let (command_client, subscriber_client) = standalone_clients(&config, endpoint)?;
        let connection =
            ConnectionManager::new_lazy_with_config(command_client, parts.manager.clone())
                .map_err(|e| parts.target.error("connect", e, false))?;
        Ok(parts.into_locker(
            config,
            Connection::Standalone(connection),
            SubscriberSource::Node(subscriber_client),
            "PUBLISH",
        ))
    }

    /// Connects to the deployment a URL names (see [`Config::from_url`] for
    /// the schemes and parameters).
    ///
    /// # Errors
    ///
    /// As [`Config::from_url`] and [`RedisLocker::from_config`].
    ///
    /// # Cancel safety
    ///
    /// As [`RedisLocker::from_config`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::redis::RedisLocker;
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let cluster = RedisLocker::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    /// let sentinel = RedisLocker::from_url("redis+sentinel://10.0.0.5,10.0.0.6/orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

    /// `PING`, under the operation bound: the Redlock backend's check that a
    /// node answers (and, on a lazy locker, its first connection).
    #[cfg(feature = "redlock")]
    pub(crate) async fn ping(&self) -> Result<()> {
        self.bounded("connect", async {
            redis::cmd("PING")
                .query_async::<()>(&mut self.connection())
                .await
        })
        .await
    }

    /// Where this locker's errors say they happened: the server's URL
    /// without password.
    #[cfg(feature = "redlock")]
    pub(crate) fn endpoint(&self) -> &str {
        &self.inner.target.endpoint
    }

    /// The connection every call is sent on (a clone shares it).
    pub(super) fn connection(&self) -> Connection {
        self.inner.connection.clone()
    }

    /// Runs one Redis call under [`RedisLocker::operation_bound`]: its
    /// redis-rs error becomes [`Error::Backend`] (see [`Target::error`](super::errors::Target::error)), its
    /// timeout [`Error::DeadlineExceeded`].
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        bounded(BACKEND, operation, self.inner.operation_bound, async {
            call.await
                .map_err(|e| self.inner.target.error(operation, e, false))
        })
        .await
    }

    /// Runs `script` (its keys and arguments set) like every call and says
    /// whether it answered 1, i.e. did what was asked (released, refreshed,
    /// forgot); 0 means the lock was not in the state the call needs.
    pub(super) async fn script_did(
        &self,
        operation: &'static str,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<bool> {
        let answer: u8 = self
            .bounded(operation, async {
                script.invoke_async(&mut self.connection()).await
            })
            .await?;
        Ok(answer == 1)
    }
}

/// What every constructor derives from a [`Config`] before it connects:
/// the checked deployment, the bounds and the connection manager settings.
struct Parts {
    deployment: Deployment,
    manager: ConnectionManagerConfig,
    operation_bound: Duration,
    target: Target,
}

impl Parts {
    fn new(config: &Config) -> Result<Self> {
        let deployment = config.deployment()?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(RECONNECT_MAX_DELAY);
        Ok(Parts {
            target: Target {
                endpoint: deployment.to_string(),
                connect_timeout: config.connect_timeout,
                response_timeout: config.response_timeout,
            },
            deployment,
            manager,
            operation_bound: operation_bound(config.connect_timeout, config.response_timeout),
        })
    }

    /// Waits for `connecting` within the operation bound; its failure is a
    /// connect error naming the deployment.
    async fn connect<C>(
        &self,
        connecting: impl std::future::Future<Output = redis::RedisResult<C>>,
    ) -> Result<C> {
        let connecting = async {
            connecting
                .await
                .map_err(|e| self.target.error("connect", e, false))
        };
        crate::deadline::connect::bounded_connect(
            BACKEND,
            &self.target.endpoint,
            "connect_timeout= plus response_timeout= in the URL",
            self.operation_bound,
            connecting,
        )
        .await
    }

    /// A client that redis-rs refused to build: bad input, naming the
    /// deployment.
    fn invalid(&self, error: redis::RedisError) -> Error {
        Error::invalid("config", format!("{}: {error}", self.deployment))
    }

    fn into_locker(
        self,
        config: Config,
        connection: Connection,
        subscriber: SubscriberSource,
        publish: &'static str,
    ) -> RedisLocker {
        let replicas = (config.min_replicas > 0).then_some(ReplicaAck {
            min_replicas: config.min_replicas,
            timeout: config.replica_timeout,
        });
        let acquire_bound = match replicas {
            // The WAIT's reply (held up to the replica timeout, which is
            // shorter than the response timeout) and the release of a grant
            // too few replicas acknowledged.
            Some(_) => self
                .operation_bound
                .saturating_add(config.response_timeout)
                .saturating_add(config.response_timeout),
            None => self.operation_bound,
        };
        RedisLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                connection,
                operation_bound: self.operation_bound,
                acquire_bound,
                keys: KeySpace::new(config.key_prefix),
                target: self.target,
                releases: ReleaseHub::new(
                    subscriber,
                    config.connect_timeout,
                    config.response_timeout,
                ),
                publish,
                replicas,
                record_holder: config.record_holder,
                fencing: config.fencing,
                allow_eviction: config.allow_eviction,
                require_appendonly: config.require_appendonly,
                server: OnceLock::new(),
                durability_reported: AtomicBool::new(false),
            }),
        }
    }
}

/// The command client (RESP3) and the subscriber's (RESP2: a connection in
/// `SUBSCRIBE` mode is what redis-rs' `PubSub` is built for, and any server
/// version supports it) for one server, with the configured TLS files.
fn standalone_clients(
    config: &Config,
    endpoint: &config::Endpoint,
) -> Result<(redis::Client, redis::Client)> {
    Ok((
        config.client(endpoint, ProtocolVersion::RESP3)?,
        config.client(endpoint, ProtocolVersion::RESP2)?,
    ))
}

/// The bound on every call of a locker (acquire with its retry, release,
/// refresh, `remaining_ttl`, connect): one connection attempt, one reply, and
/// the pauses of one reconnect cycle ([`RECONNECT_PAUSES`]), so a server that
/// refuses connections is still reported as refusing ([`Error::Backend`])
/// rather than cut short. Past it the call is abandoned with
/// [`Error::DeadlineExceeded`]. Without it a call against a server that
/// accepts connections but never answers waited for every reconnect attempt
/// of the connection manager (each up to the connect timeout), twice when the
/// acquire was retried: several seconds.
fn operation_bound(connect_timeout: Duration, response_timeout: Duration) -> Duration {
    connect_timeout
        .saturating_add(response_timeout)
        .saturating_add(RECONNECT_PAUSES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};

    #[test]
    fn the_reconnect_pauses_cover_one_jittered_backoff_cycle() {
        let mut delay = RECONNECT_MIN_DELAY;
        let mut longest = Duration::ZERO;
        for _ in 0..RECONNECT_RETRIES {
            // Each pause is at most twice its nominal delay (jitter).
            longest += 2 * delay;
            delay = (delay * 2).min(RECONNECT_MAX_DELAY);
        }
        assert_eq!(longest, RECONNECT_PAUSES);
        assert_eq!(
            operation_bound(DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT),
            Duration::from_millis(2200)
        );
        assert_eq!(operation_bound(Duration::MAX, Duration::MAX), Duration::MAX);
    }
}
