//! Replica acknowledgement (`?min_replicas=N&replica_timeout=T`): a grant is
//! kept only once `WAIT` reports N replicas have it; a shortfall is an
//! outage (the grant released at once), never contention.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::Locker;
use test_servers::{RedisOptions, RedisServer};
use tokio::time::Instant;

use crate::common::eventually;

const TTL: Duration = Duration::from_secs(30);

fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    (primary, replica)
}

async fn in_sync(replica: &RedisServer) {
    eventually(Duration::from_secs(10), "the replica syncs", || {
        replica
            .cli(&["info", "replication"])
            .lines()
            .any(|line| line.trim() == "master_link_status:up")
    })
    .await;
}

#[tokio::test]
async fn a_grant_is_kept_once_the_replica_has_it() {
    let (primary, replica) = primary_and_replica();
    in_sync(&replica).await;
    let url = format!("{}?min_replicas=1&replica_timeout=200ms", primary.url());
    let locker = RedisLocker::from_url(&url).await.expect("connect");
    for round in 0..20 {
        let key = format!("acked-{round}");
        let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
        // WAIT returned: the replica has the key now, not eventually.
        assert_eq!(
            crate::support::stored_owner(&replica, &locker.backend_key(&key)),
            lease.owner(),
            "round {round}"
        );
        lease.release().await.expect("release");
    }
}

#[tokio::test]
async fn too_few_replicas_fail_the_acquire_and_release_it() {
    // No replica at all.
    let alone = RedisServer::start();
    let url = format!("{}?min_replicas=1&replica_timeout=50ms", alone.url());
    let locker = RedisLocker::from_url(&url).await.expect("connect");
    let started = Instant::now();
    let err = locker.try_lock("short", TTL).await.unwrap_err();
    eprintln!("shortfall after {:?}: {err}", started.elapsed());
    assert!(err.is_outage() && !err.is_contention(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("only 0 replica(s)") && message.contains("min_replicas"),
        "{message}"
    );
    assert!(message.contains("it was released"), "{message}");
    assert_eq!(
        alone.cli(&["exists", &locker.backend_key("short")]),
        "0",
        "released at once"
    );

    // A replica that stopped answering (SIGSTOP) acknowledges nothing.
    let (primary, replica) = primary_and_replica();
    in_sync(&replica).await;
    let url = format!("{}?min_replicas=1&replica_timeout=50ms", primary.url());
    let locker = RedisLocker::from_url(&url).await.expect("connect");
    let lease = locker.try_lock("warm", TTL).await.unwrap().expect("acked");
    lease.release().await.expect("release");
    replica.pause();
    let err = locker.try_lock("paused", TTL).await.unwrap_err();
    replica.resume();
    assert!(err.is_outage() && !err.is_contention(), "{err}");
    assert_eq!(primary.cli(&["exists", &locker.backend_key("paused")]), "0");
    // Contention is still contention: a held key never waits for replicas.
    let holder = RedisLocker::from_url(&primary.url())
        .await
        .expect("connect");
    let held = holder.try_lock("held", TTL).await.unwrap().expect("free");
    assert!(locker.try_lock("held", TTL).await.unwrap().is_none());
    held.release().await.expect("release");
}
