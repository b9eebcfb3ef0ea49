//! Helpers the Postgres modules share.

use test_servers::PostgresServer;

/// A key no other test uses, so tests may share a server.
pub fn unique(name: &str) -> String {
    format!("{name}-{:016x}", rand::random::<u64>())
}

/// The server processes holding advisory key `key`.
pub fn holders(server: &PostgresServer, key: i64) -> Vec<i32> {
    server
        .advisory_locks()
        .into_iter()
        .filter(|(_, k)| *k == key)
        .map(|(pid, _)| pid)
        .collect()
}
