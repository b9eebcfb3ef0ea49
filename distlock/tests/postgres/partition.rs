//! A real network partition of a Postgres holder (nftables drop rules in a
//! private network namespace, see `test_servers::netns`): the holder's lost
//! signal fires first, its lease stays valid for the grace the keepalive
//! settings leave, and the server frees the lock only after that. Needs root
//! and `nft`.

use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::{drift_margin, Locker};
use test_servers::{netns, PostgresServer};

use crate::support::{holder_port, still_held_by, told_of_a_silent_session};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

#[test]
fn a_partitioned_holder_is_told_before_the_server_frees_its_lock() {
    // The test's path in this binary, as `--exact` matches it.
    const NAME: &str = "partition::a_partitioned_holder_is_told_before_the_server_frees_its_lock";
    if !netns::inside(NAME) {
        return netns::rerun_inside(NAME);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(partitioned_holder());
}

async fn partitioned_holder() {
    let server = PostgresServer::start();
    let holder = PostgresLocker::from_url(&server.url()).await.unwrap();
    let contender = PostgresLocker::from_url(&server.url()).await.unwrap();
    let key = "partitioned";
    let id = holder.advisory_key(key);
    let lease = holder.try_lock(key, TTL).await.unwrap().expect("free");
    let (pid, port) = holder_port(&server, id);
    // Let both ends' keepalive timers reach their steady state.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let cut = Instant::now();
    netns::cut_port(port);
    let (detected, valid_until) = told_of_a_silent_session(&lease).await;
    let grace = valid_until.saturating_duration_since(detected);
    assert!(
        grace >= Duration::from_secs(3),
        "the lease stays valid {grace:?} after its lost signal"
    );
    assert!(
        still_held_by(&server, id, pid),
        "the server still holds it when the holder learns"
    );

    // distlock run stops its command by valid_until − drift_margin(ttl).
    tokio::time::sleep_until(valid_until - drift_margin(TTL)).await;
    let held_at_kill_deadline = still_held_by(&server, id, pid);
    tokio::time::sleep_until(valid_until).await;
    let held_at_valid_until = still_held_by(&server, id, pid);
    let freed = loop {
        if !still_held_by(&server, id, pid) {
            break Instant::now();
        }
        assert!(cut.elapsed() < Duration::from_secs(60), "never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "cut → holder told {:?} → valid until {:?} → server frees {:?} (held at valid_until − drift_margin: \
         {held_at_kill_deadline}, at valid_until: {held_at_valid_until})",
        detected - cut,
        valid_until - cut,
        freed - cut,
    );
    assert!(
        held_at_kill_deadline,
        "the server freed the lock before valid_until − drift_margin"
    );
    let next = contender.try_lock(key, TTL).await.unwrap();
    assert!(next.is_some(), "granted once the server freed it");
}
