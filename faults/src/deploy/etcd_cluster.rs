//! etcd as a three-member cluster (test-servers' `EtcdCluster`), for the
//! faults a single member cannot have: a leader's death and the loss of a
//! majority.

use std::time::Duration;

use test_servers::EtcdCluster;

use super::Deployment;

/// Three etcd members.
#[derive(Debug)]
pub struct EtcdClusterDeployment {
    cluster: EtcdCluster,
    /// The members `lose_majority` killed.
    killed: Vec<usize>,
}

impl EtcdClusterDeployment {
    /// Starts the cluster and waits for a leader.
    pub fn start() -> Result<Self, String> {
        let cluster = EtcdCluster::start(3);
        cluster.wait_for_leader(Duration::from_secs(20));
        Ok(EtcdClusterDeployment {
            cluster,
            killed: Vec::new(),
        })
    }
}

impl Deployment for EtcdClusterDeployment {
    fn url(&self) -> String {
        self.cluster.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        (0..self.cluster.size())
            .map(|index| self.cluster.client_port(index))
            .collect()
    }

    fn kill_leader(&mut self) -> Result<(), String> {
        let leader = self.cluster.wait_for_leader(Duration::from_secs(10));
        self.cluster.kill(leader);
        self.cluster.wait_for_leader(Duration::from_secs(20));
        self.cluster.restart(leader);
        self.cluster.wait_healthy(leader, Duration::from_secs(20));
        Ok(())
    }

    /// Kills two of the three members, the leader among them.
    fn lose_majority(&mut self) -> Result<(), String> {
        let leader = self.cluster.wait_for_leader(Duration::from_secs(10));
        let killed = super::leader_and_another(leader, self.cluster.size())?;
        for &index in &killed {
            self.cluster.kill(index);
        }
        self.killed = killed;
        Ok(())
    }

    fn regain_majority(&mut self) -> Result<(), String> {
        for index in std::mem::take(&mut self.killed) {
            self.cluster.restart(index);
        }
        for index in 0..self.cluster.size() {
            self.cluster.wait_healthy(index, Duration::from_secs(30));
        }
        Ok(())
    }
}
