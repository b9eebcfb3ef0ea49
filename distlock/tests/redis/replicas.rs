//! Replica acknowledgement (`?min_replicas=N&replica_timeout=T`): a grant is
//! kept only once `WAIT` reports N replicas have it; a shortfall is an
//! outage (the grant released at once), never contention.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::{Locker, MarkAdvance};
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
    // 1 s: a loaded machine can hold a running replica's ack past a
    // shorter WAIT; the response timeout bounding the reply stays above it.
    let url = format!(
        "{}?min_replicas=1&replica_timeout=1s&response_timeout=2s",
        primary.url()
    );
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

/// The Redis key of mark `name` under the default prefix.
fn mark_key(name: &str) -> String {
    format!("lock:{{{name}}}:mark")
}

#[tokio::test]
async fn an_advanced_mark_is_on_the_replica_when_the_call_returns() {
    let (primary, replica) = primary_and_replica();
    in_sync(&replica).await;
    // 1 s: a loaded machine can hold a running replica's ack past a
    // shorter WAIT; the response timeout bounding the reply stays above it.
    let url = format!(
        "{}?min_replicas=1&replica_timeout=1s&response_timeout=2s",
        primary.url()
    );
    let locker = RedisLocker::from_url(&url).await.expect("connect");
    // min_replicas is set: no warning about the replica.
    assert_eq!(locker.durability_warnings().len(), 1, "appendonly only");
    for tick in 1..=20 {
        let advanced = locker.advance_mark("cron:rep", tick).await.unwrap();
        assert!(
            matches!(advanced, MarkAdvance::Advanced { .. }),
            "{advanced:?}"
        );
        // WAIT returned: the replica has the mark now, not eventually.
        assert_eq!(
            replica.cli(&["get", &mark_key("cron:rep")]),
            primary.cli(&["get", &mark_key("cron:rep")]),
            "tick {tick}"
        );
    }
    // Without min_replicas the replica is a durability warning.
    let unacked = RedisLocker::from_url(&primary.url()).await.unwrap();
    let warnings = unacked.durability_warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("1 replica(s) and min_replicas is 0")),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn a_mark_the_replica_does_not_acknowledge_fails_as_an_outage() {
    let (primary, replica) = primary_and_replica();
    in_sync(&replica).await;
    // 1 s, not 50 ms: the first mark must be acknowledged by a replica that
    // is running, which a loaded test machine can delay past 50 ms. The
    // replica timeout must stay under the response timeout that bounds the
    // WAIT's reply, hence 2 s for that.
    let url = format!(
        "{}?min_replicas=1&replica_timeout=1s&response_timeout=2s",
        primary.url()
    );
    let locker = RedisLocker::from_url(&url).await.expect("connect");
    locker.advance_mark("cron:rep", 1).await.expect("acked");
    replica.pause();
    let started = Instant::now();
    let result = locker.advance_mark("cron:rep", 2).await;
    let took = started.elapsed();
    replica.resume();
    let err = result.unwrap_err();
    eprintln!("unacknowledged mark after {took:?}: {err}");
    assert!(err.is_outage() && err.is_outcome_unknown(), "{err:?}");
    assert!(!err.is_contention());
    let message = err.to_string();
    assert!(
        message.contains("only 0 replica(s) acknowledged the mark \"cron:rep\"")
            && message.contains("min_replicas")
            && message.contains("treat the tick as taken"),
        "{message}"
    );
    assert!(took < 2 * locker.operation_bound(), "{took:?}");
    // The mark stays advanced on the primary: the tick is not run again.
    assert_eq!(
        locker.advance_mark("cron:rep", 2).await.unwrap(),
        MarkAdvance::AlreadyAt { current: 2 }
    );
    // A peek that finds the mark there writes nothing and waits for nobody.
    replica.pause();
    let peek = locker.advance_mark("cron:rep", 0).await;
    // Nor does the first peek of a job that never ran (the mark absent): it
    // records no progress, so it does not wait for the paused replica.
    let first_peek = locker.advance_mark("cron:never-ran", 0).await;
    replica.resume();
    assert_eq!(peek.unwrap(), MarkAdvance::AlreadyAt { current: 2 });
    assert_eq!(
        first_peek.unwrap(),
        MarkAdvance::Advanced { previous: None }
    );
}
