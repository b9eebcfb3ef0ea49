//! Postgres: one `postgres` server (test-servers' spawner), session advisory
//! locks.

use test_servers::PostgresServer;

use super::{Deployment, Holder};

/// One Postgres server.
#[derive(Debug)]
pub struct PostgresDeployment {
    server: PostgresServer,
}

impl PostgresDeployment {
    /// Starts the server (initdb on first use).
    pub fn start() -> Result<Self, String> {
        Ok(PostgresDeployment {
            server: PostgresServer::start(),
        })
    }
}

impl Deployment for PostgresDeployment {
    fn url(&self) -> String {
        self.server.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    /// Terminates the backend holding the holder's advisory lock (its key's,
    /// `distlock::postgres::advisory_key` without a namespace, as the URL
    /// has none; `pg_locks` shows a bigint key as its high and low halves),
    /// and no other: a semaphore's other permits are held on other
    /// sessions. It waits up to 5 s for the backend to exit: without the
    /// timeout, `pg_terminate_backend` returns before the lock is freed
    /// (Postgres 14+ `pg_terminate_backend(pid, timeout)`, "Server Signaling
    /// Functions" in the manual).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        let key = distlock::postgres::advisory_key("", &holder.key);
        let output = self.server.try_psql(&format!(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
             AND ((classid::int8 << 32) | objid::int8) = {key}"
        ));
        let stdout = String::from_utf8_lossy(&output.stdout);
        match (output.status.success(), stdout.trim()) {
            (true, "0") => Err(format!(
                "no session holds the advisory lock of {:?}",
                holder.key
            )),
            (true, _) => Ok(()),
            (false, _) => Err(format!(
                "pg_terminate_backend failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
