//! A three-server ensemble under failure, as `tests/etcd/cluster.rs` does
//! for etcd: the leader killed (every server drops its clients for the
//! election; the holder's session reconnects, to another server if it was
//! on the leader, the lock stays held, nobody else gets it); two of three killed (quorum lost) is an outage for new attempts,
//! never contention, the holder gets its lost signal within its bound, and
//! the same locker locks again once quorum is back. Each test owns its
//! ensemble (they kill members).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::zookeeper::ZooKeeperLocker;
use distlock::{Locker, LostReason};
use test_servers::{four_letter_word, ZooKeeperEnsemble};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

async fn locker(ensemble: &ZooKeeperEnsemble, session_timeout: &str) -> ZooKeeperLocker {
    ZooKeeperLocker::from_url(&format!(
        "{}?session_timeout={session_timeout}&request_timeout=500ms",
        ensemble.url()
    ))
    .await
    .expect("connect to the test ensemble")
}

/// The member whose `cons` lists session `id` (the server the session is
/// connected to now), if a running one does.
fn member_serving(ensemble: &ZooKeeperEnsemble, id: i64) -> Option<usize> {
    let sid = format!("sid=0x{id:x}");
    (0..ensemble.size()).find(|&index| {
        ensemble.is_running(index)
            && four_letter_word(
                ensemble.client_port(index),
                "cons",
                Duration::from_millis(500),
            )
            .contains(&sid)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_holders_session_and_lock() {
    let mut ensemble = tokio::task::block_in_place(|| ZooKeeperEnsemble::start(3));
    // The default session timeout: what an application gets.
    let holder = locker(&ensemble, "10s").await;
    let rival = locker(&ensemble, "10s").await;
    let lease = holder.try_lock("k", TTL).await.unwrap().expect("free");
    let session = holder.session_id("k").await.expect("a session");
    let lost = lease.lost_signal();
    let on = tokio::task::block_in_place(|| member_serving(&ensemble, session))
        .expect("a member serves the holder's session");
    let leader = tokio::task::block_in_place(|| ensemble.leader()).expect("a leader");

    // The rival tries in a loop; a grant while the holder's lost signal has
    // not fired is two holders.
    let stop = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let trying = {
        let (stop, overlaps, grants, lost) =
            (stop.clone(), overlaps.clone(), grants.clone(), lost.clone());
        tokio::spawn(async move {
            let mut errors = 0u64;
            while !stop.load(Ordering::SeqCst) {
                match rival.try_lock("k", TTL).await {
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

    tokio::task::block_in_place(|| ensemble.kill(leader));
    let killed = Instant::now();
    eprintln!(
        "killed the leader, member {leader} ({})",
        if on == leader {
            "the holder's server"
        } else {
            "the holder is on a follower"
        }
    );
    // The holder's refresh succeeds again once a new leader serves and its
    // session reconnected: well before a 10 s session's holder gives up
    // (at least 8 s after its last answered heartbeat).
    let deadline = killed + Duration::from_secs(8);
    loop {
        match holder.refresh("k", lease.owner(), TTL).await {
            Ok(()) => break,
            Err(error) if Instant::now() < deadline && error.is_outage() => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("the holder must still hold its lock: {other:?}"),
        }
    }
    let moved = killed.elapsed();
    let now_on = tokio::task::block_in_place(|| member_serving(&ensemble, session));
    eprintln!(
        "the holder's session is on member {now_on:?}; refresh succeeded {moved:?} after the kill"
    );
    assert_ne!(now_on, Some(leader), "the killed leader serves nobody");
    // Watch a little longer: the lock stays the holder's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    holder
        .refresh("k", lease.owner(), TTL)
        .await
        .expect("still held");
    stop.store(true, Ordering::SeqCst);
    let errors = trying.await.unwrap();
    let (grants, overlaps) = (
        grants.load(Ordering::SeqCst),
        overlaps.load(Ordering::SeqCst),
    );
    eprintln!("rival grants {grants}, overlaps {overlaps}, rival errors {errors}");
    assert!(
        !lost.is_lost(),
        "the session survived the server's death: no lost signal ({:?})",
        lost.reason()
    );
    assert_eq!(
        grants, 0,
        "the holder kept the lock: nobody else may get it"
    );
    assert_eq!(overlaps, 0);
    assert_eq!(
        holder.session_id("k").await,
        Some(session),
        "the same session"
    );
    lease.release().await.expect("release on the moved session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_quorum_is_an_outage_the_holder_loses_its_lock_in_time_and_the_locker_recovers() {
    let mut ensemble = tokio::task::block_in_place(|| ZooKeeperEnsemble::start(3));
    let holder = locker(&ensemble, "4s").await;
    let session_timeout = holder.negotiated_session_timeout().await.unwrap();
    assert_eq!(session_timeout, Duration::from_secs(4));
    let lease = holder.try_lock("k", TTL).await.unwrap().expect("free");
    let token = lease.fencing_token();
    let mut lost = lease.lost_signal();
    // Two of three gone: the one left stops serving (it cannot form a
    // quorum) and drops its clients.
    let survivor = tokio::task::block_in_place(|| ensemble.leader()).unwrap_or(0);
    let victims: Vec<usize> = (0..3).filter(|&index| index != survivor).collect();
    tokio::task::block_in_place(|| {
        for &index in &victims {
            ensemble.kill(index);
        }
    });
    let killed = Instant::now();

    // New attempts: an outage, never contention.
    let err = holder.try_lock("other", TTL).await.unwrap_err();
    eprintln!("try_lock without quorum: {err}");
    assert!(err.is_outage() && !err.is_contention(), "{err}");

    // The lost signal, within the documented bound: before the session
    // could expire (its last answered heartbeat, at most a fifth of the
    // timeout before the cut, + the timeout − the drift margin).
    let reason = tokio::time::timeout(session_timeout * 2, lost.wait())
        .await
        .expect("the lost signal fires without quorum");
    let after = killed.elapsed();
    eprintln!(
        "lost ({reason}) {after:?} after quorum was lost (session timeout {session_timeout:?})"
    );
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        after < session_timeout,
        "must give up before the session can expire: {after:?}"
    );
    assert!(
        after >= session_timeout * 3 / 5,
        "gave up much earlier than the bound: {after:?}"
    );

    // A wait without quorum ends as an outage too, once the session was
    // given up (a new one cannot be opened).
    let err = holder
        .lock("other", TTL, Duration::from_secs(1))
        .await
        .unwrap_err();
    eprintln!("lock without quorum: {err}");
    assert!(
        err.is_outage() && !err.is_contention(),
        "a wait without quorum: {err}"
    );

    tokio::task::block_in_place(|| {
        for &index in &victims {
            ensemble.restart(index);
        }
        for index in 0..ensemble.size() {
            ensemble.wait_serving(index, Duration::from_secs(60));
        }
    });
    let restored = Instant::now();
    // The same locker, not rebuilt; the old session's node goes when the
    // ensemble expires or closes that session.
    let again = holder
        .lock("k", TTL, Duration::from_secs(20))
        .await
        .expect("the same locker locks again once quorum is back");
    eprintln!(
        "granted again {:?} after quorum was back",
        restored.elapsed()
    );
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();
    assert!(matches!(
        lease.release().await,
        Err(distlock::Error::NotHeld { .. })
    ));
}
