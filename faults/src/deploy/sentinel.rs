//! Sentinel: a master, its replica and three sentinels (test-servers'
//! `RedisSentinelSet`); the locker asks the sentinels for the master.

use test_servers::RedisSentinelSet;

use super::{Deployment, Holder};

/// A Sentinel-managed master and replica.
#[derive(Debug)]
pub struct SentinelDeployment {
    set: RedisSentinelSet,
}

impl SentinelDeployment {
    /// Starts the set and waits until the replica is in sync.
    pub fn start() -> Result<Self, String> {
        Ok(SentinelDeployment {
            set: RedisSentinelSet::start(),
        })
    }
}

impl Deployment for SentinelDeployment {
    fn url(&self) -> String {
        self.set.url()
    }

    /// The data servers (cutting the holder from the sentinels changes
    /// nothing while the master stays).
    fn server_ports(&self) -> Vec<u16> {
        vec![self.set.master().port(), self.set.replica().port()]
    }

    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        super::redis_client_kill(self.set.master(), holder)
    }
}
