//! How each backend is deployed for the suite: which servers to start, the
//! URL the workers use, and the backend-specific fault injectors (the server
//! ending a session, a restart). One file per deployment; the generic
//! faults (SIGKILL, SIGSTOP, partitions, resets) need only
//! [`Deployment::server_ports`].

mod file;
mod postgres;
mod redis;

pub use file::FileDeployment;
pub use postgres::PostgresDeployment;
pub use redis::RedisDeployment;

/// The process holding the lock when a fault is injected.
#[derive(Debug, Clone)]
pub struct Holder {
    /// The worker's process id.
    pub pid: u32,
    /// The local ports of its connections to [`Deployment::server_ports`].
    pub local_ports: Vec<u16>,
}

/// A running deployment of one backend. Dropping it stops its servers.
pub trait Deployment {
    /// The URL the workers (and the final check) connect to.
    fn url(&self) -> String;

    /// The ports of the servers the workers connect to (empty for the file
    /// backend): partitions and resets cut the holder's connections to them.
    fn server_ports(&self) -> Vec<u16>;

    /// The server ends the holder's session (`pg_terminate_backend`, `CLIENT
    /// KILL`, ...).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        let _ = holder;
        Err("this backend has no server session to end".to_owned())
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and
    /// data; returns once it accepts connections.
    fn restart(&mut self) -> Result<(), String> {
        Err("this backend has no server to restart".to_owned())
    }
}
