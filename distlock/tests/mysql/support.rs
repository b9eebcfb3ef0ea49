//! Helpers the MySQL modules share.

use std::sync::OnceLock;
use std::time::Duration;

use distlock::mysql::{lock_name_in, MysqlLocker};
use test_servers::MariaDbServer;

pub const TTL: Duration = Duration::from_secs(30);

/// The server most tests share.
pub fn server() -> &'static MariaDbServer {
    static SERVER: OnceLock<MariaDbServer> = OnceLock::new();
    SERVER.get_or_init(MariaDbServer::start)
}

pub async fn connect(params: &str) -> MysqlLocker {
    connect_to(server(), params).await
}

pub async fn connect_to(server: &MariaDbServer, params: &str) -> MysqlLocker {
    MysqlLocker::from_url(&format!("{}{params}", server.url()))
        .await
        .expect("connect to the test server")
}

/// The lock name of `key` for a locker on [`MariaDbServer::url`]: in the
/// namespace of its database.
pub fn name_of(key: &str) -> String {
    lock_name_in(MariaDbServer::DATABASE, key)
}

/// A key no other test uses, so tests may share a server.
pub fn unique(name: &str) -> String {
    format!("{name}-{:016x}", rand::random::<u64>())
}

/// Connections waiting in `GET_LOCK` for lock `name` on the server.
pub fn waiting_for(server: &MariaDbServer, name: &str) -> Vec<u64> {
    server
        .sql(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' \
             AND INFO LIKE '%GET_LOCK(''{name}''%'"
        ))
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| line.parse().expect("a connection id"))
        .collect()
}
