//! The connection a [`RedisLocker`](super::RedisLocker) sends its commands on,
//! whatever the deployment: one server, a Redis Cluster, or a master found
//! through Sentinel. The scripts, the bounded calls (`client.rs`) and the
//! error mapping (`errors.rs`) are written once against [`Connection`],
//! which is a redis-rs [`ConnectionLike`].
//!
//! - **Standalone**: a redis-rs [`ConnectionManager`] (multiplexed, RESP3,
//!   reconnects in the background).
//! - **Cluster**: a redis-rs cluster-async [`ClusterConnection`]: it routes
//!   each command by the slot of its first key (a script by its first key,
//!   and every key of our scripts shares one hash tag, so one slot), follows
//!   `MOVED` and `ASK` (slot migrations), refreshes the slot map and
//!   reconnects to nodes on its own.
//! - **Sentinel**: our own small wrapper ([`SentinelConnection`]) around a
//!   [`ConnectionManager`] to the master that redis-rs' [`Sentinel`] finds.
//!   redis-rs' `SentinelClient` hands out a fresh `MultiplexedConnection` per
//!   call, which never reconnects (a lock service needs one long-lived
//!   connection that follows failovers), so the wrapper keeps one manager per
//!   master and asks the sentinels again when the master stops being one.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    Client, Cmd, ConnectionInfo, ErrorKind, FromRedisValue, Pipeline, PushInfo, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::util;

/// How often the cluster connection retries a command that met `MOVED`,
/// `ASK`, `TRYAGAIN` or a broken node connection before failing it. Enough
/// for a slot migration (`ASK` then `MOVED`) and a reconnect; every call is
/// bounded by the locker's operation bound anyway.
const CLUSTER_RETRIES: u32 = 3;

/// A connection to the deployment, cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl Connection {
    /// Runs `cmd` on the node serving `key`'s slot (its master), for commands
    /// such as `WAIT` that redis-rs would otherwise send to every master of a
    /// cluster (it routes `WAIT` to all primaries and takes the minimum). On
    /// one server or a sentinel-managed master it is an ordinary call.
    pub(crate) async fn query_on_node_of<T: FromRedisValue>(
        &mut self,
        key: &str,
        cmd: Cmd,
    ) -> RedisResult<T> {
        match self {
            Connection::Cluster(cluster) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let value = cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                Ok(redis::from_redis_value(value)?)
            }
            other => cmd.query_async(other).await,
        }
    }
}

/// A node a listing scans: the one server (or sentinel-managed master) the
/// connection talks to, or one master of a cluster, named by a slot it
/// serves (redis-rs routes by its own slot map, so it follows reconnects).
pub(crate) enum ScanNode {
    Connected,
    Master(Route),
}

impl Connection {
    /// The nodes whose keys make up the whole key space: this one, or every
    /// master of a cluster (from `CLUSTER SLOTS`, one slot per master).
    pub(crate) async fn scan_nodes(&mut self) -> RedisResult<Vec<ScanNode>> {
        Ok(self
            .nodes()
            .await?
            .into_iter()
            .map(|(_, node)| node)
            .collect())
    }

    /// [`scan_nodes`](Self::scan_nodes), each with its `host:port` (`None`
    /// for the one server or sentinel-managed master, which the caller
    /// names), for messages about a node.
    pub(crate) async fn nodes(&mut self) -> RedisResult<Vec<(Option<String>, ScanNode)>> {
        let Connection::Cluster(cluster) = self else {
            return Ok(vec![(None, ScanNode::Connected)]);
        };
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(cluster)
            .await?;
        let mut masters: Vec<(Vec<u8>, i64, u16)> = Vec::new();
        for range in slots {
            // [start, end, [host, port, id, ...] (the master), replicas...]
            let Value::Array(range) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Array(master))) =
                (range.first(), range.get(2))
            else {
                continue;
            };
            let (Some(Value::BulkString(host)), Some(Value::Int(port)), Ok(start)) =
                (master.first(), master.get(1), u16::try_from(*start))
            else {
                continue;
            };
            if !masters.iter().any(|(h, p, _)| h == host && p == port) {
                masters.push((host.clone(), *port, start));
            }
        }
        Ok(masters
            .into_iter()
            .map(|(host, port, slot)| {
                let address = format!("{}:{port}", String::from_utf8_lossy(&host));
                (
                    Some(address),
                    ScanNode::Master(Route::new(slot, SlotAddr::Master)),
                )
            })
            .collect())
    }

    /// Runs `cmd` on `node` (a cluster's master by its route; otherwise the
    /// one server the connection talks to).
    pub(crate) async fn query_node<T: FromRedisValue>(
        &mut self,
        node: &ScanNode,
        cmd: Cmd,
    ) -> RedisResult<T> {
        match (self, node) {
            (Connection::Cluster(cluster), ScanNode::Master(route)) => {
                let value = cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(*route)),
                    )
                    .await?;
                Ok(redis::from_redis_value(value)?)
            }
            (other, _) => cmd.query_async(other).await,
        }
    }

    /// One `SCAN cursor MATCH pattern COUNT count` on `node`: the next
    /// cursor (0 when done) and the keys of this page.
    pub(crate) async fn scan_page(
        &mut self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
        count: u32,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        self.query_node(node, scan).await
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(manager) => manager.req_packed_command(cmd),
            Connection::Cluster(cluster) => cluster.req_packed_command(cmd),
            Connection::Sentinel(sentinel) => Box::pin(sentinel.request(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(manager) => manager.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(sentinel) => {
                Box::pin(sentinel.request_pipeline(pipeline, offset, count))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(manager) => manager.get_db(),
            Connection::Cluster(_) => 0,
            Connection::Sentinel(sentinel) => sentinel.shared.db,
        }
    }
}

/// What it takes to build a cluster client: the seed nodes and the bounds.
/// Kept whole because the subscriber needs a client of its own with a push
/// sender, which redis-rs takes only when the client is built.
#[derive(Clone)]
pub(crate) struct ClusterSettings {
    pub(crate) seeds: Vec<ConnectionInfo>,
    /// The configured CA and client certificate, if any.
    pub(crate) certificates: Option<redis::TlsCertificates>,
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) response_timeout: std::time::Duration,
}

impl ClusterSettings {
    /// A client on the seeds, sending RESP3 pushes (pub/sub messages) to
    /// `pushes` if given.
    pub(crate) fn client(
        &self,
        pushes: Option<UnboundedSender<PushInfo>>,
    ) -> RedisResult<ClusterClient> {
        let mut builder = ClusterClientBuilder::new(self.seeds.clone())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .retries(CLUSTER_RETRIES)
            .use_protocol(redis::ProtocolVersion::RESP3);
        if let Some(pushes) = pushes {
            builder = builder.push_sender(pushes);
        }
        if let Some(certificates) = &self.certificates {
            builder = builder.certs(certificates.clone());
        }
        builder.build()
    }
}

/// A connection to whichever server the sentinels call the master of
/// `master_name`, following failovers without being rebuilt.
///
/// It keeps one [`ConnectionManager`] to the master it last found. A command
/// that finds that server no longer a master (`READONLY`: it was demoted, and
/// Sentinel's `CLIENT KILL` made the manager reconnect to it as a replica), or
/// gone (connection refused, reset), forgets it, so the next command asks the
/// sentinels again. A command refused before it ran (`READONLY`, connection
/// refused) is sent once more to the newly found master; one whose connection
/// broke after it was sent is not (its outcome is unknown; the acquire path
/// retries with the same owner token itself).
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    /// redis-rs' sentinel client; held (across awaits) while asking.
    sentinel: tokio::sync::Mutex<Sentinel>,
    master_name: String,
    db: i64,
    /// How to connect to the master for commands (RESP3).
    commands: SentinelNodeConnectionInfo,
    /// How to connect to the master for the subscriber (RESP2).
    subscriber: SentinelNodeConnectionInfo,
    manager_config: ConnectionManagerConfig,
    /// The master last found. Locked only to read or replace it.
    current: Mutex<Option<Master>>,
    /// The next master's [`Master::generation`].
    generations: AtomicU64,
}

#[derive(Clone)]
struct Master {
    manager: ConnectionManager,
    /// Tells masters apart, so a stale failure cannot forget a newer one.
    generation: u64,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master_name", &self.shared.master_name)
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// A connection that asks `sentinels` for `master_name` and connects to it
    /// with `commands`' settings (and the subscriber with `subscriber`'s).
    /// Nothing is contacted until [`SentinelConnection::connect`] or the
    /// first command.
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        master_name: String,
        db: i64,
        commands: SentinelNodeConnectionInfo,
        subscriber: SentinelNodeConnectionInfo,
        manager_config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        Ok(SentinelConnection {
            shared: Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(Sentinel::build(sentinels)?),
                master_name,
                db,
                commands,
                subscriber,
                manager_config,
                current: Mutex::new(None),
                generations: AtomicU64::new(0),
            }),
        })
    }

    /// Finds the master and connects to it.
    pub(crate) async fn connect(&self) -> RedisResult<()> {
        self.master().await.map(drop)
    }

    /// A client for the current master with the subscriber's settings
    /// (asks the sentinels each time: the subscriber reconnects rarely).
    pub(crate) async fn subscriber_client(&self) -> RedisResult<Client> {
        let mut sentinel = self.shared.sentinel.lock().await;
        sentinel
            .async_master_for(&self.shared.master_name, Some(&self.shared.subscriber))
            .await
    }

    fn current(&self) -> Option<Master> {
        util::lock(&self.shared.current).clone()
    }

    /// The master last found, or a newly found one.
    async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.current() {
            return Ok(master);
        }
        // One discovery at a time: the others wait and use its result.
        let mut sentinel = self.shared.sentinel.lock().await;
        if let Some(master) = self.current() {
            return Ok(master);
        }
        let client = sentinel
            .async_master_for(&self.shared.master_name, Some(&self.shared.commands))
            .await?;
        let manager =
            ConnectionManager::new_with_config(client, self.shared.manager_config.clone()).await?;
        let master = Master {
            manager,
            generation: self.shared.generations.fetch_add(1, Ordering::Relaxed),
        };
        tracing::debug!(component = "distlock", backend = super::BACKEND,
            master = %self.shared.master_name, "connected to the master the sentinels name");
        *util::lock(&self.shared.current) = Some(master.clone());
        Ok(master)
    }

    /// Forgets master `generation` if it is still the current one.
    fn forget(&self, generation: u64) {
        let mut current = util::lock(&self.shared.current);
        if current.as_ref().map(|m| m.generation) == Some(generation) {
            tracing::debug!(component = "distlock", backend = super::BACKEND,
                master = %self.shared.master_name,
                "the master stopped answering as one; asking the sentinels again");
            *current = None;
        }
    }

    async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        let master = self.master().await?;
        // redis-rs hands server errors back as `Ok(Value::ServerError)`
        // (turned into errors when the value is converted), I/O errors as
        // `Err`.
        match master.manager.clone().req_packed_command(cmd).await {
            Ok(Value::ServerError(error)) if error.kind() == Some(ServerErrorKind::ReadOnly) => {
                self.forget(master.generation);
                // Refused before it ran: safe to send to the new master.
                let master = self.master().await?;
                master.manager.clone().req_packed_command(cmd).await
            }
            Err(err) if is_not_the_master(&err) => {
                self.forget(master.generation);
                if !refused_before_running(&err) {
                    return Err(err);
                }
                let master = self.master().await?;
                master.manager.clone().req_packed_command(cmd).await
            }
            other => other,
        }
    }

    async fn request_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let master = self.master().await?;
        let result = master
            .manager
            .clone()
            .req_packed_commands(pipeline, offset, count)
            .await;
        let read_only = |value: &Value| {
            matches!(value, Value::ServerError(error)
                if error.kind() == Some(ServerErrorKind::ReadOnly))
        };
        match &result {
            Err(err) if is_not_the_master(err) => self.forget(master.generation),
            Ok(values) if values.iter().any(read_only) => self.forget(master.generation),
            _ => {}
        }
        result
    }
}

/// The server we talk to is (probably) not the master any more: it refuses
/// writes as a replica, or cannot be reached.
fn is_not_the_master(err: &RedisError) -> bool {
    refused_before_running(err) || err.is_connection_dropped() || err.is_io_error()
}

/// The command was refused without running: safe to send to the new master.
fn refused_before_running(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || err.code() == Some("READONLY")
        || err.is_connection_refusal()
}
