//! Redlock: three independent `redis-server`s with `appendonly yes`, a
//! majority quorum.

use test_servers::{RedisOptions, RedisServer};

use super::{Deployment, Holder};

/// Three Redis nodes.
#[derive(Debug)]
pub struct RedlockDeployment {
    nodes: Vec<RedisServer>,
}

impl RedlockDeployment {
    /// Starts three nodes.
    pub fn start() -> Result<Self, String> {
        let nodes = (0..3)
            .map(|_| {
                RedisServer::start_with(RedisOptions {
                    appendonly: true,
                    ..RedisOptions::default()
                })
            })
            .collect();
        Ok(RedlockDeployment { nodes })
    }
}

impl Deployment for RedlockDeployment {
    fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        format!("redlock://{}", nodes.join(","))
    }

    fn server_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// `CLIENT KILL` of the holder's connections on every node.
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        self.nodes
            .iter()
            .try_for_each(|node| super::redis_client_kill(node, holder))
    }

    /// Kills two nodes of three.
    fn lose_majority(&mut self) -> Result<(), String> {
        for node in self.nodes.iter_mut().take(2) {
            node.kill();
        }
        Ok(())
    }

    /// Starts them again (appendonly: they come back with their keys).
    fn regain_majority(&mut self) -> Result<(), String> {
        for node in self.nodes.iter_mut().take(2) {
            node.restart();
        }
        Ok(())
    }

    /// Restarts one node (a minority): with appendonly it keeps the lock.
    fn restart(&mut self) -> Result<(), String> {
        let node = self.nodes.first_mut().ok_or("no nodes")?;
        node.restart();
        Ok(())
    }
}
