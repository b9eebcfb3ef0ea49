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

    /// `CLIENT KILL ADDR` for each of the holder's connections (the new-style
    /// filter form answers a count, never an error, for an address that is
    /// already gone).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        if holder.local_ports.is_empty() {
            return Err("the holder has no connection to Redis".to_owned());
        }
        for port in &holder.local_ports {
            self.server
                .cli(&["CLIENT", "KILL", "ADDR", &format!("127.0.0.1:{port}")]);
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
