//! Helpers the MySQL modules share.

use std::time::Duration;

use distlock::mysql::{lock_name_in, MysqlLocker};
use test_servers::MariaDbServer;

pub const TTL: Duration = Duration::from_secs(30);

/// A locker on the server most tests share, with `params` appended to its
/// URL.
pub async fn connect(params: &str) -> MysqlLocker {
    connect_to(MariaDbServer::shared(), params).await
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
