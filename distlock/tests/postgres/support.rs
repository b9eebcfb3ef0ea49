//! Helpers the Postgres modules share.

use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::{Lease, LostReason};
use test_servers::PostgresServer;
use tokio::time::Instant;

pub const TTL: Duration = Duration::from_secs(30);

/// A locker on the server most tests share, with `params` appended to its
/// URL.
pub async fn connect(params: &str) -> PostgresLocker {
    connect_to(PostgresServer::shared(), params).await
}

pub async fn connect_to(server: &PostgresServer, params: &str) -> PostgresLocker {
    PostgresLocker::from_url(&format!("{}{params}", server.url()))
        .await
        .expect("connect to the test server")
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

/// The server pid of the session holding advisory key `key`, and its client
/// port as the server sees it (the holder's own, or a hop's upstream one).
pub fn holder_port(server: &PostgresServer, key: i64) -> (i32, u16) {
    let row = server.psql(&format!(
        "SELECT a.pid, a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
         AND ((l.classid::int8 << 32) | l.objid::int8) = {key}"
    ));
    let (pid, port) = row.split_once('|').expect("one holder: pid|port");
    (pid.parse().expect("pid"), port.parse().expect("port"))
}

/// True while server process `pid` holds advisory key `key`.
pub fn still_held_by(server: &PostgresServer, key: i64, pid: i32) -> bool {
    server.advisory_locks().contains(&(pid, key))
}

/// Waits (up to 30 s) for `lease` to be lost after a cut that left its
/// session silent, asserts it was lost as `ConnectionLost`, and returns when
/// the holder was told and until when the lease stays valid.
pub async fn told_of_a_silent_session(lease: &Lease) -> (Instant, Instant) {
    let reason = tokio::time::timeout(Duration::from_secs(30), lease.lost_signal().wait())
        .await
        .expect("the holder learns within 30 s that its session went silent");
    let told = Instant::now();
    assert_eq!(reason, LostReason::ConnectionLost);
    let valid_until = lease.valid_until().expect("a lost lease has a validity");
    (told, valid_until)
}
