//! ZooKeeper: one standalone server (test-servers' spawner, `tickTime`
//! 200 ms); Curator's lock recipe on the locker's one session.

use std::time::Duration;

use test_servers::ZooKeeperServer;

use super::Deployment;

/// The session timeout the workers ask for: a holder that stops being
/// heard from (killed, stopped, cut off) keeps its lock this long, and the
/// suite's pause (the profile's ttl + 1 s, at least 2 s) outlasts it, so a
/// paused holder's session expires under it as a Redis key's ttl does.
/// The server grants it as asked (test-servers allows 400 ms to 60 s).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(1);

/// `url` with the suite's session timeout.
pub fn with_session_timeout(url: String) -> String {
    format!("{url}?session_timeout={}ms", SESSION_TIMEOUT.as_millis())
}

/// One standalone server.
#[derive(Debug)]
pub struct ZooKeeperDeployment {
    server: ZooKeeperServer,
}

impl ZooKeeperDeployment {
    /// Starts the server.
    pub fn start() -> Result<Self, String> {
        Ok(ZooKeeperDeployment {
            server: ZooKeeperServer::start(),
        })
    }
}

impl Deployment for ZooKeeperDeployment {
    fn url(&self) -> String {
        with_session_timeout(self.server.url())
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    /// SIGKILL and a start on the same data directory: the server restores
    /// its sessions and their ephemeral nodes from its transaction log, and
    /// a session lives on if its client is back within the session timeout.
    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
