//! Postgres behind PgBouncer in transaction mode (one server connection per
//! pool, as a busy pool ends up): the deployment the Postgres backend's docs
//! warn against for session locks, since two clients can be handed one
//! server session, and advisory locks are re-entrant within a session.

use test_servers::{PgBouncer, PostgresServer};

use super::Deployment;

/// A Postgres server and a transaction-mode PgBouncer in front of it.
#[derive(Debug)]
pub struct PgBouncerDeployment {
    // Dropped first: the bouncer before its server.
    bouncer: PgBouncer,
    server: PostgresServer,
}

impl PgBouncerDeployment {
    /// Starts both.
    pub fn start() -> Result<Self, String> {
        let server = PostgresServer::start();
        let bouncer = PgBouncer::start(&server, "transaction", 1);
        Ok(PgBouncerDeployment { bouncer, server })
    }
}

impl Deployment for PgBouncerDeployment {
    fn url(&self) -> String {
        self.bouncer.url()
    }

    /// The server itself: a client of another process cannot use the
    /// pooler while the workers' prepared statements sit on its one server
    /// session (see `Workers::OneProcess`).
    fn check_url(&self) -> String {
        self.server.url()
    }

    /// Always, after a run: the prepared statements a run's worker process
    /// left on the shared server session would collide with the next
    /// process's (`s0` already exists), so each run gets a fresh pair.
    fn spent(&self) -> bool {
        true
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.bouncer.port()]
    }
}
