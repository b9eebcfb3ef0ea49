//! MySQL: one MariaDB server (test-servers' spawner); `GET_LOCK` on a
//! session kept for the hold.

use test_servers::MariaDbServer;

use super::{Deployment, Holder};

/// One MariaDB server.
#[derive(Debug)]
pub struct MySqlDeployment {
    server: MariaDbServer,
}

impl MySqlDeployment {
    /// Starts the server (mariadb-install-db on first use).
    pub fn start() -> Result<Self, String> {
        Ok(MySqlDeployment {
            server: MariaDbServer::start(),
        })
    }
}

impl Deployment for MySqlDeployment {
    fn url(&self) -> String {
        self.server.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    /// `KILL` of the connection `IS_USED_LOCK` names for the key's lock name
    /// (`distlock::mysql::lock_name_in` the URL's database, the name the
    /// backend takes).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        let name = distlock::mysql::lock_name_in(MariaDbServer::DATABASE, &holder.key);
        let connection = self
            .server
            .lock_holder(&name)
            .ok_or_else(|| format!("no session holds {name}"))?;
        self.server.sql(&format!("KILL {connection}"));
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
