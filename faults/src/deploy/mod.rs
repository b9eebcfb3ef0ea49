//! How each backend is deployed for the suite: which servers to start, the
//! URL the workers use, and the backend-specific fault injectors (the server
//! ending a session, a restart). One file per deployment; the generic
//! faults (SIGKILL, SIGSTOP, partitions, resets) need only
//! [`Deployment::server_ports`].

mod etcd;
mod etcd_cluster;
mod file;
mod mysql;
mod pgbouncer;
mod postgres;
mod postgres_hop;
mod redis;
mod redlock;
mod sentinel;
mod zookeeper;
mod zookeeper_ensemble;

pub use etcd::EtcdDeployment;
pub use etcd_cluster::EtcdClusterDeployment;
pub use file::FileDeployment;
pub use mysql::MySqlDeployment;
pub use pgbouncer::PgBouncerDeployment;
pub use postgres::PostgresDeployment;
pub use postgres_hop::PostgresHopDeployment;
pub use redis::RedisDeployment;
pub use redlock::RedlockDeployment;
pub use sentinel::SentinelDeployment;
pub use zookeeper::{ZooKeeperDeployment, SESSION_TIMEOUT as ZOOKEEPER_SESSION_TIMEOUT};
pub use zookeeper_ensemble::ZooKeeperEnsembleDeployment;

/// The process holding the lock when a fault is injected.
#[derive(Debug, Clone)]
pub struct Holder {
    /// The key of the lock it holds (in the semaphore workload, its
    /// permit's key, `name#i`).
    pub key: String,
    /// The worker's process id.
    pub pid: u32,
    /// The local ports of its connections to [`Deployment::server_ports`].
    pub local_ports: Vec<u16>,
}

/// A running deployment of one backend. Dropping it stops its servers.
pub trait Deployment {
    /// The URL the workers (and the final check) connect to.
    fn url(&self) -> String;

    /// The URL the final check (is the lock free at the end?) uses: the
    /// workers' unless the server must be asked past a pooler.
    fn check_url(&self) -> String {
        self.url()
    }

    /// The ports of the servers the workers connect to (empty for the file
    /// backend): partitions and resets cut the holder's connections to them.
    fn server_ports(&self) -> Vec<u16>;

    /// The ports a partition of the holder drops segments of: by default its
    /// own connections' local ports; a deployment with a hop between the
    /// workers and the server (a local proxy) names the hop's upstream
    /// connections instead, so the hop stays up and its upstream goes silent.
    fn partition_ports(&self, holder: &Holder) -> Vec<u16> {
        holder.local_ports.clone()
    }

    /// The server ends the holder's session (`pg_terminate_backend`, `CLIENT
    /// KILL`, ...).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        let _ = holder;
        Err("this backend has no server session to end".to_owned())
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and
    /// data; returns once it accepts connections.
    fn restart(&mut self) -> Result<(), String> {
        Err("this backend has no server to restart".to_owned())
    }

    /// Arranges for the next writes to reach the primary only (Redis: the
    /// replica paused and its replication link dropped).
    fn prepare_failover(&mut self) -> Result<(), String> {
        Err("this backend has no replica to fail over to".to_owned())
    }

    /// Kills the primary and promotes the replica; returns once clients can
    /// find the new primary.
    fn fail_over(&mut self) -> Result<(), String> {
        Err("this backend has no replica to fail over to".to_owned())
    }

    /// True once a fault has left the deployment unusable for another run
    /// (a failover's dead master); the orchestrator starts a new one.
    fn spent(&self) -> bool {
        false
    }

    /// Kills the cluster's leader, waits for a new one, and starts the old
    /// member again.
    fn kill_leader(&mut self) -> Result<(), String> {
        Err("this backend has no leader".to_owned())
    }

    /// Kills a majority of the nodes.
    fn lose_majority(&mut self) -> Result<(), String> {
        Err("this backend has no quorum".to_owned())
    }

    /// Starts the nodes [`lose_majority`](Deployment::lose_majority) killed;
    /// returns once they serve.
    fn regain_majority(&mut self) -> Result<(), String> {
        Err("this backend has no quorum".to_owned())
    }
}

/// The members a majority loss kills in a cluster of three: the leader and
/// the first other member.
fn leader_and_another(leader: usize, size: usize) -> Result<Vec<usize>, String> {
    let other = (0..size)
        .find(|&index| index != leader)
        .ok_or("a cluster of one has no majority to lose")?;
    Ok(vec![leader, other])
}

/// `CLIENT KILL ADDR` on `server` for each of the holder's connections (the
/// new-style filter form answers a count, never an error, for an address
/// that is not connected there).
fn redis_client_kill(server: &test_servers::RedisServer, holder: &Holder) -> Result<(), String> {
    if holder.local_ports.is_empty() {
        return Err("the holder has no connection to Redis".to_owned());
    }
    for port in &holder.local_ports {
        server.cli(&["CLIENT", "KILL", "ADDR", &format!("127.0.0.1:{port}")]);
    }
    Ok(())
}
