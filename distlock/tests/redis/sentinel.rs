//! The Redis backend behind Sentinel (test-servers' `RedisSentinelSet`: one
//! master, one replica, three sentinels): a failover while locks are held.
//! The locker is built once, before the failover, and must follow it.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::{KeepAlive, Locker, LostReason};
use test_servers::RedisSentinelSet;
use tokio::time::Instant;

use crate::common::eventually;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_locker_to_the_new_master_and_ends_leases_it_lacks() {
    let set = RedisSentinelSet::start();
    let locker = RedisLocker::from_url(&set.url())
        .await
        .expect("connect through the sentinels");
    let old_master = set.master_port();

    let mut kept = locker.try_lock("kept", TTL).await.unwrap().expect("free");
    let mut lost = locker.try_lock("lost", TTL).await.unwrap().expect("free");
    let (kept_key, lost_key) = (locker.backend_key("kept"), locker.backend_key("lost"));
    // The first refresh writes the grant time into the lock's value (a
    // `SET`, which replicates the whole key); later ones with the same ttl
    // only move the expiry, which cannot bring back a key a replica lacks.
    lost.refresh(TTL).await.expect("refresh");
    let refreshed_value = set.server(old_master).cli(&["get", &lost_key]);
    eventually(
        Duration::from_secs(5),
        "the replica has both grants, refreshed",
        || {
            set.replica().cli(&["exists", &kept_key, &lost_key]) == "2"
                && set.replica().cli(&["get", &lost_key]) == refreshed_value
        },
    )
    .await;
    // The replica "misses" one grant, as if the master had acknowledged the
    // SET and died before replicating it: a writable replica's own DEL is
    // not propagated anywhere.
    set.replica()
        .cli(&["config", "set", "replica-read-only", "no"]);
    assert_eq!(set.replica().cli(&["del", &lost_key]), "1");
    lost.keep_alive(KeepAlive::default().interval(Duration::from_millis(200)))
        .expect("keepalive");
    let mut lost_signal = lost.lost_signal();

    let started = Instant::now();
    let new_master = set.failover();
    eprintln!(
        "failover {old_master} -> {new_master} took {:?}",
        started.elapsed()
    );
    assert_ne!(new_master, old_master);

    // The same locker, not rebuilt: the first calls after the failover may
    // fail (the demoted master's clients were killed); within a few seconds
    // they reach the new master.
    let started = Instant::now();
    loop {
        match kept.refresh(TTL).await {
            Ok(()) => break,
            Err(err) => {
                eprintln!("refresh after the failover: {err}");
                assert!(err.is_outage(), "an outage, not {err}");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "not reconnected: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!(
        "the locker reached the new master {:?} after the failover",
        started.elapsed()
    );
    let fresh = locker.try_lock("fresh", TTL).await.unwrap().expect("free");
    assert_eq!(
        set.server(new_master)
            .cli(&["exists", &locker.backend_key("fresh")]),
        "1",
        "new grants are written to the new master"
    );
    assert!(
        locker.try_lock("kept", TTL).await.unwrap().is_none(),
        "the replicated grant survived the failover"
    );

    let reason = tokio::time::timeout(Duration::from_secs(10), lost_signal.wait())
        .await
        .expect("the lost signal fires");
    assert_eq!(reason, LostReason::NotHeld);
    let refreshed = locker.refresh("lost", lost.owner(), TTL).await;
    assert!(
        matches!(refreshed, Err(distlock::Error::NotHeld { .. })),
        "the new master lacks the key: {refreshed:?}"
    );
    assert_eq!(
        set.server(new_master).cli(&["exists", &lost_key]),
        "0",
        "the new master lacks the key"
    );

    kept.release().await.expect("release on the new master");
    fresh.release().await.expect("release");
    drop(lost);
}
