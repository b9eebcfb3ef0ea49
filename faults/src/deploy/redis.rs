//! Redis: one `redis-server` with `appendonly yes`, so a restart keeps the
//! lock keys and their fence counters (without it a restart forgets both,
//! and fencing tokens start over: the README's Redis row says so).

use test_servers::{RedisOptions, RedisServer};

use super::{Deployment, Holder};

/// One Redis server.
#[derive(Debug)]
pub struct RedisDeployment {
    server: RedisServer,
}

impl RedisDeployment {
    /// Starts the server.
    pub fn start() -> Result<Self, String> {
        Ok(RedisDeployment {
            server: RedisServer::start_with(RedisOptions {
                appendonly: true,
                ..RedisOptions::default()
            }),
        })
    }
}

impl Deployment for RedisDeployment {
    fn url(&self) -> String {
        self.server.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        super::redis_client_kill(&self.server, holder)
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
