//! `pgbouncer` (Debian's `/usr/sbin/pgbouncer`) on a free port in front of a
//! [`PostgresServer`], in the pool mode a test asks for.
//!
//! PgBouncer refuses to run as root, so when the tests run as root it runs as
//! the `postgres` user, like the server. Clients connect as the server's
//! superuser; PgBouncer trusts them (`auth_type = trust`) and the server
//! trusts PgBouncer (the server's own TCP trust, or its password).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::postgres::{chown, unprivileged_account_if_root, SUPERUSER};
use crate::{find_binary, free_port, wait_for_port, PostgresServer};

/// A `pgbouncer` owned by one test; killed when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    child: Option<Child>,
    port: u16,
    upstream_url: String,
    _dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `pool_mode` (`session`, `transaction` or
    /// `statement`) in front of `server`, with `pool_size` server
    /// connections per database and user.
    pub fn start(server: &PostgresServer, pool_mode: &str, pool_size: u32) -> Self {
        let binary = find_binary("pgbouncer", "pgbouncer");
        let dir = tempfile::Builder::new()
            .prefix("distlock-pgbouncer-")
            .tempdir()
            .expect("temp dir for pgbouncer");
        let port = free_port();
        let config = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("userlist.txt");
        std::fs::write(&users, format!("\"{SUPERUSER}\" \"\"\n")).expect("write userlist.txt");
        // `options` is a startup parameter PgBouncer 1.18 rejects unless told
        // to ignore it; clients may send it (settings for the session).
        std::fs::write(
            &config,
            format!(
                "[databases]\n\
                 postgres = host=127.0.0.1 port={upstream} dbname=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {log}\n",
                upstream = server.port(),
                users = users.display(),
                log = dir.path().join("pgbouncer.log").display(),
            ),
        )
        .expect("write pgbouncer.ini");
        let mut command = Command::new(binary);
        command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(account) = unprivileged_account_if_root() {
            for path in [dir.path(), config.as_path(), users.as_path()] {
                chown(path, account);
            }
            std::os::unix::process::CommandExt::uid(&mut command, account.uid);
            std::os::unix::process::CommandExt::gid(&mut command, account.gid);
        }
        let mut child = crate::spawn_tied_to_this_process(command).expect("spawn pgbouncer");
        wait_for_port(port, &mut child, "pgbouncer", Duration::from_secs(10));
        PgBouncer {
            child: Some(child),
            port,
            upstream_url: server.url(),
            _dir: dir,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's URL with PgBouncer's port instead of the server's.
    pub fn url(&self) -> String {
        let (before, after) = self
            .upstream_url
            .split_once("@127.0.0.1:")
            .expect("a PostgresServer URL names 127.0.0.1");
        let rest = after
            .split_once('/')
            .map_or(String::new(), |(_, rest)| format!("/{rest}"));
        format!("{before}@127.0.0.1:{}{rest}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
