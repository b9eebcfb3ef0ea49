//! Postgres behind PgBouncer.
//!
//! - In transaction mode (one server connection per pool, as a busy pool
//!   ends up): the deployment the Postgres backend's docs warn against for
//!   session locks, since two clients can be handed one server session, and
//!   advisory locks are re-entrant within a session.
//! - In session mode, with PgBouncer's default client keepalive (the OS's, 2
//!   hours): each client has a server session of its own; a client that goes
//!   silent leaves its session (and its locks) to a pooler that does not
//!   notice, which is what the backend's `idle_session_timeout` is for.

use test_servers::{PgBouncer, PostgresServer};

use super::Deployment;

/// A Postgres server and a PgBouncer in front of it.
#[derive(Debug)]
pub struct PgBouncerDeployment {
    // Dropped first: the bouncer before its server.
    bouncer: PgBouncer,
    server: PostgresServer,
    session_mode: bool,
}

impl PgBouncerDeployment {
    /// Starts both, PgBouncer in transaction mode with one server connection.
    pub fn start() -> Result<Self, String> {
        let server = PostgresServer::start();
        let bouncer = PgBouncer::start(&server, "transaction", 1);
        Ok(PgBouncerDeployment {
            bouncer,
            server,
            session_mode: false,
        })
    }

    /// Starts both, PgBouncer in session mode with room for every worker's
    /// sessions and waiter connections.
    pub fn start_session_mode() -> Result<Self, String> {
        let server = PostgresServer::start();
        let bouncer = PgBouncer::start(&server, "session", 200);
        Ok(PgBouncerDeployment {
            bouncer,
            server,
            session_mode: true,
        })
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

    /// In transaction mode, always, after a run: the prepared statements a
    /// run's worker process left on the shared server session would collide
    /// with the next process's (`s0` already exists), so each run gets a
    /// fresh pair. In session mode each client has its own server session.
    fn spent(&self) -> bool {
        !self.session_mode
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.bouncer.port()]
    }
}
