//! ZooKeeper as a three-member ensemble (test-servers'
//! `ZooKeeperEnsemble`), for the faults one server cannot have: the
//! leader's death and the loss of a quorum.

use std::time::Duration;

use test_servers::ZooKeeperEnsemble;

use super::zookeeper::with_session_timeout;
use super::Deployment;

/// How long a member may take to serve again (a JVM start, a leader
/// election).
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Three members.
#[derive(Debug)]
pub struct ZooKeeperEnsembleDeployment {
    ensemble: ZooKeeperEnsemble,
    /// The members `lose_majority` killed.
    killed: Vec<usize>,
}

impl ZooKeeperEnsembleDeployment {
    /// Starts the ensemble (it returns once every member serves).
    pub fn start() -> Result<Self, String> {
        Ok(ZooKeeperEnsembleDeployment {
            ensemble: ZooKeeperEnsemble::start(3),
            killed: Vec::new(),
        })
    }
}

impl Deployment for ZooKeeperEnsembleDeployment {
    fn url(&self) -> String {
        with_session_timeout(self.ensemble.url())
    }

    fn server_ports(&self) -> Vec<u16> {
        (0..self.ensemble.size())
            .map(|index| self.ensemble.client_port(index))
            .collect()
    }

    /// SIGKILL of the leader; returns once the two others have elected a
    /// new one and the old member serves again as a follower.
    fn kill_leader(&mut self) -> Result<(), String> {
        let leader = self.ensemble.wait_for_leader(Duration::from_secs(10));
        self.ensemble.kill(leader);
        self.ensemble.wait_for_leader(Duration::from_secs(30));
        self.ensemble.restart(leader);
        self.ensemble.wait_serving(leader, SERVE_TIMEOUT);
        Ok(())
    }

    /// Kills two of the three members, the leader among them.
    fn lose_majority(&mut self) -> Result<(), String> {
        let leader = self.ensemble.wait_for_leader(Duration::from_secs(10));
        let killed = super::leader_and_another(leader, self.ensemble.size())?;
        for &index in &killed {
            self.ensemble.kill(index);
        }
        self.killed = killed;
        Ok(())
    }

    fn regain_majority(&mut self) -> Result<(), String> {
        for index in std::mem::take(&mut self.killed) {
            self.ensemble.restart(index);
        }
        for index in 0..self.ensemble.size() {
            self.ensemble.wait_serving(index, SERVE_TIMEOUT);
        }
        Ok(())
    }
}
