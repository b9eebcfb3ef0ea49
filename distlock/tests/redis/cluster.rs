//! The Redis backend on a three-master Redis Cluster (test-servers'
//! `RedisCluster`, no replicas): a held key's slot migrating to another
//! master, and a killed master. Each test starts its own cluster, since both
//! change it.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::{Error, Locker};
use test_servers::RedisCluster;
use tokio::time::Instant;

use crate::common::eventually;

const TTL: Duration = Duration::from_secs(30);

async fn connect(cluster: &RedisCluster) -> RedisLocker {
    RedisLocker::from_url(&cluster.url())
        .await
        .expect("connect to the test cluster")
}

/// A key (of `prefix` and a counter) whose lock lives on the master on
/// `port` (`on == true`) or on another one.
fn key_on(
    cluster: &RedisCluster,
    locker: &RedisLocker,
    port: u16,
    on: bool,
    prefix: &str,
) -> String {
    (0..1000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|key| {
            let owner = cluster.owner_of(cluster.slot_of(&locker.backend_key(key)));
            (owner == port) == on
        })
        .expect("1000 keys cover every master")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_keys_slot_migrates_and_the_holder_keeps_it() {
    let cluster = RedisCluster::start();
    let (holder, other) = (connect(&cluster).await, connect(&cluster).await);
    let key = "migrating";
    let slot = cluster.slot_of(&holder.backend_key(key));
    let from = cluster.owner_of(slot);
    let to = *cluster
        .ports()
        .iter()
        .find(|&&p| p != from)
        .expect("three nodes");

    let mut lease = holder
        .try_lock(key, TTL)
        .await
        .unwrap()
        .expect("a free key");
    let token = lease.fencing_token().expect("a fencing token");
    // A waiter subscribed (sharded, on the slot's node) before the move.
    let waiter = {
        let (other, key) = (other.clone(), key.to_owned());
        tokio::spawn(async move {
            let lease = other.lock(&key, TTL, Duration::from_secs(20)).await;
            (lease, Instant::now())
        })
    };
    let channel = holder.release_channel(key);
    let subscribers = |port: u16| -> u32 {
        let answer = cluster.cli(port, &["pubsub", "shardnumsub", &channel]);
        answer
            .lines()
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    eventually(
        Duration::from_secs(5),
        "the waiter subscribes on the slot's node",
        || subscribers(from) == 1,
    )
    .await;

    cluster.migrate_slot(slot, from, to);
    assert_eq!(cluster.owner_of(slot), to, "the slot moved");
    // The key moved with the slot; MOVED sends the holder's calls after it.
    assert_eq!(cluster.cli(to, &["exists", &holder.backend_key(key)]), "1");
    lease
        .refresh(TTL)
        .await
        .expect("the holder refreshes after the move");
    assert!(
        other.try_lock(key, TTL).await.unwrap().is_none(),
        "still held after the move"
    );
    // The old node dropped the sharded subscription (SUNSUBSCRIBE push); the
    // waiter's session subscribed again on the new node.
    let took = eventually(
        Duration::from_secs(5),
        "the waiter subscribes on the new node",
        || subscribers(to) == 1,
    )
    .await;
    eprintln!("subscription followed the slot within {took:?}");

    tokio::time::sleep(Duration::from_millis(600)).await;
    let released_at = Instant::now();
    lease
        .release()
        .await
        .expect("the holder releases after the move");
    let (granted, acquired_at) = waiter.await.expect("waiter task");
    let granted = granted.expect("the waiter acquires");
    let latency = acquired_at - released_at;
    eprintln!("waiter acquired {latency:?} after the release on the new node");
    assert!(
        latency < Duration::from_millis(100),
        "woken, not polling (polls are 100-200 ms apart): {latency:?}"
    );
    assert!(
        granted.fencing_token().expect("a fencing token") > token,
        "the fence counter moved with the slot"
    );
    granted.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_its_slots_and_never_reports_contention() {
    let mut cluster = RedisCluster::start();
    let locker = connect(&cluster).await;
    let victim = cluster.ports()[0];
    let doomed = key_on(&cluster, &locker, victim, true, "doomed");
    let spared = key_on(&cluster, &locker, victim, false, "spared");
    let mut held = locker.try_lock(&doomed, TTL).await.unwrap().expect("free");

    cluster.kill(victim);

    let started = Instant::now();
    let err = locker.try_lock(&doomed, TTL).await.unwrap_err();
    eprintln!(
        "acquire on the dead master's slot: {err} after {:?}",
        started.elapsed()
    );
    assert!(err.is_outage() && !err.is_contention(), "{err}");
    assert!(
        started.elapsed() <= locker.operation_bound() + Duration::from_secs(1),
        "bounded: {:?}",
        started.elapsed()
    );
    let err = held.refresh(TTL).await.unwrap_err();
    assert!(
        err.is_outage() && !matches!(err, Error::NotHeld { .. }),
        "{err}"
    );
    let err = locker.unlock(&doomed, held.owner()).await.unwrap_err();
    assert!(
        err.is_outage() && !matches!(err, Error::NotHeld { .. }),
        "{err}"
    );
    let err = locker
        .lock(&doomed, TTL, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        !err.is_contention() && !matches!(err, Error::Timeout { .. }),
        "{err}"
    );

    // The other masters' slots keep working (cluster-require-full-coverage no).
    let lease = locker
        .try_lock(&spared, TTL)
        .await
        .expect("the surviving masters answer")
        .expect("free");
    lease
        .release()
        .await
        .expect("release on a surviving master");
    drop(held);
}
