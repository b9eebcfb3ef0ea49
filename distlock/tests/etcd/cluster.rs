//! A three-node cluster under failure: a leader killed while a lock is
//! held never yields two holders, and a lost quorum is an outage, never
//! contention, from which the same locker recovers.

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
