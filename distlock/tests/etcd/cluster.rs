//! A three-node cluster under failure: a leader killed while a lock is
//! held never yields two holders, a lost quorum is an outage, never
//! contention, from which the same locker recovers, and each leader change
//! gives a dead holder's lease up to one more ttl.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{BreakerConfig, Error, Locker, LockerExt};
use test_servers::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_while_a_lock_is_held_never_makes_two_holders() {
    let mut cluster = EtcdCluster::start(3);
    let url = cluster.url();
    let holder = distlock::connect(&url).await.unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(2);
    let lease = holder.try_lock("k", ttl).await.unwrap().unwrap();
    let lost = lease.lost_signal();

    // The rival tries in a loop; each grant is recorded with whether the
    // holder's lost signal had fired by then.
    let stop = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let trying = {
        let (stop, overlaps, grants, lost) =
            (stop.clone(), overlaps.clone(), grants.clone(), lost.clone());
        tokio::spawn(async move {
            let mut errors = 0u64;
            while !stop.load(Ordering::SeqCst) {
                match rival.try_lock("k", ttl).await {
                    Ok(Some(granted)) => {
                        grants.fetch_add(1, Ordering::SeqCst);
                        if !lost.is_lost() {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        granted.release().await.ok();
                    }
                    Ok(None) => {}
                    Err(_) => errors += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            errors
        })
    };
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    cluster.kill(leader);
    let killed = Instant::now();
    let new_leader = cluster.wait_for_leader(Duration::from_secs(15));
    eprintln!(
        "leader {leader} killed; member {new_leader} leads after {:?}",
        killed.elapsed()
    );
    // Three ttls: long enough for a keep-alive that did not recover to
    // lose the lease and the rival to be granted it.
    tokio::time::sleep(ttl * 3).await;
    stop.store(true, Ordering::SeqCst);
    let errors = trying.await.unwrap();
    let (grants, overlaps) = (
        grants.load(Ordering::SeqCst),
        overlaps.load(Ordering::SeqCst),
    );
    eprintln!(
        "holder lost: {:?}; rival grants {grants}, overlaps {overlaps}, rival errors {errors}",
        lost.reason()
    );
    assert_eq!(
        overlaps, 0,
        "the rival was granted the lock while the holder still held it"
    );
    if lost.is_lost() {
        assert!(grants > 0 || errors > 0);
    } else {
        assert_eq!(
            grants, 0,
            "the holder kept the lock: nobody else may get it"
        );
        assert!(
            holder.refresh("k", lease.owner(), ttl).await.is_ok(),
            "the keep-alive recovered through another member"
        );
    }
    drop(lease);
    cluster.restart(leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_quorum_is_an_outage_and_the_locker_recovers_after_it() {
    let mut cluster = EtcdCluster::start(3);
    let locker =
        distlock::etcd::EtcdLocker::from_url(&format!("{}?request_timeout=500ms", cluster.url()))
            .await
            .unwrap();
    let ttl = Duration::from_secs(2);
    let lease = locker.try_lock("before", ttl).await.unwrap().unwrap();
    lease.release().await.unwrap();
    cluster.kill(0);
    cluster.kill(1);
    let breaker = locker.clone().with_circuit_breaker(
        BreakerConfig::default()
            .failure_threshold(2)
            .open_for(Duration::from_secs(30)),
    );
    for round in 0..3 {
        let err = breaker.try_lock("during", ttl).await.unwrap_err();
        eprintln!("round {round}: {err}");
        assert!(err.is_outage() && !err.is_contention(), "{err}");
        if round == 2 {
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        }
    }
    let err = locker
        .lock("during", ttl, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        err.is_outage() && !err.is_contention(),
        "a wait without quorum: {err}"
    );
    cluster.restart(0);
    cluster.restart(1);
    for index in 0..cluster.size() {
        cluster.wait_healthy(index, Duration::from_secs(30));
    }
    // The same locker, not rebuilt.
    let deadline = Instant::now() + Duration::from_secs(15);
    let lease = loop {
        match locker.try_lock("after", ttl).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("nobody holds \"after\""),
            Err(error) => {
                assert!(Instant::now() < deadline, "no recovery: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    lease.release().await.unwrap();
}

/// etcd resets a lease's remaining ttl to the full ttl (plus an election
/// timeout) whenever a new leader takes over, so each leader change while a
/// dead holder's lease is outstanding extends its hold by up to one more
/// ttl: the bound is ttl × (1 + leader changes), plus an election timeout
/// per change, as the module docs say. A holder that never renews (a raw
/// lease and key, as a crashed `etcdctl lock` or Go client leaves them)
/// outlives two leader changes past 2 × ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_leader_change_extends_a_dead_holders_lease_by_up_to_one_ttl() {
    const TTL: Duration = Duration::from_secs(3);
    // test-servers' `--election-timeout`, which etcd adds on promotion.
    const ELECTION: Duration = Duration::from_millis(600);
    // etcd looks for expired leases every 500 ms.
    const EXPIRY_CHECK: Duration = Duration::from_millis(500);
    let cluster = EtcdCluster::start(3);
    let endpoints: Vec<String> = cluster.endpoints().split(',').map(str::to_owned).collect();
    let mut raw = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect etcd-client");
    let rival = distlock::connect(&cluster.url()).await.unwrap();
    let granted_at = Instant::now();
    let lease = raw.lease_grant(TTL.as_secs() as i64, None).await.unwrap();
    let key = format!("lock:k/{:x}", lease.id());
    raw.put(
        key.as_str(),
        "",
        Some(etcd_client::PutOptions::new().with_lease(lease.id())),
    )
    .await
    .unwrap();
    assert!(rival.try_lock("k", TTL).await.unwrap().is_none(), "held");

    // Two leader changes, each before the lease could expire.
    let mut changes = 0;
    for at in [Duration::from_secs(2), Duration::from_secs(4)] {
        tokio::time::sleep_until((granted_at + at).into()).await;
        let leader = cluster.wait_for_leader(Duration::from_secs(10));
        let next = (leader + 1) % cluster.size();
        tokio::task::block_in_place(|| cluster.move_leader(next));
        changes += 1;
        eprintln!("leader {leader} -> {next} at {:?}", granted_at.elapsed());
    }
    // Past 2 × ttl the dead holder still holds the lock.
    tokio::time::sleep_until((granted_at + TTL * 2 + Duration::from_millis(300)).into()).await;
    assert!(
        rival.try_lock("k", TTL).await.unwrap().is_none(),
        "the dead holder's key outlived 2 x ttl"
    );
    let gone_after = loop {
        let found = raw.get(key.as_str(), None).await.unwrap();
        if found.kvs().is_empty() {
            break granted_at.elapsed();
        }
        assert!(
            granted_at.elapsed() < Duration::from_secs(30),
            "never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let bound = TTL * (1 + changes) + ELECTION * changes + EXPIRY_CHECK;
    eprintln!(
        "ttl {TTL:?}, {changes} leader changes: the dead holder's key lived {gone_after:?} \
         (2 x ttl {:?}, documented bound {bound:?})",
        TTL * 2
    );
    assert!(gone_after > TTL * 2, "{gone_after:?}");
    assert!(gone_after < bound, "{gone_after:?} >= {bound:?}");
    let lease = rival
        .try_lock("k", TTL)
        .await
        .unwrap()
        .expect("free at last");
    lease.release().await.unwrap();
}
