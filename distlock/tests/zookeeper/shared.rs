//! Shared (reader) locks beyond the conformance suite: inspection and a
//! forced release of a lock held by several readers, and a reader's lost
//! signal when its session can no longer be trusted.

use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::zookeeper::ZooKeeperLocker;
use distlock::{Error, Locker, LostReason};
use test_servers::{unique_key, ZooKeeperServer};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

async fn locker(server: &ZooKeeperServer, session_timeout: &str) -> ZooKeeperLocker {
    ZooKeeperLocker::from_url(&format!(
        "{}?session_timeout={session_timeout}&request_timeout=500ms",
        server.url()
    ))
    .await
    .expect("connect to the test zookeeper")
}

/// Two readers of two clients hold a key, a writer waits behind them:
/// `inspect` and `list` report the key held shared with the oldest
/// reader's czxid as token; `force_release` deletes both readers' nodes
/// (not the waiting writer's), each learns it at its next refresh, and the
/// writer is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_evicts_every_holding_reader_and_lets_the_writer_in() {
    let server = ZooKeeperServer::shared();
    let (a, b, w) = (
        locker(server, "4s").await,
        locker(server, "4s").await,
        locker(server, "4s").await,
    );
    let key = unique_key("force-readers");
    let first = a.try_lock_shared(&key, TTL).await.unwrap().expect("free");
    let second = b.try_lock_shared(&key, TTL).await.unwrap().expect("shared");
    assert_eq!(first.fencing_token(), second.fencing_token());
    let writer = {
        let (w, key) = (w.clone(), key.clone());
        tokio::spawn(async move { w.lock(&key, TTL, Duration::from_secs(20)).await })
    };
    let held = a.inspect(&key).await.unwrap().expect("held");
    assert!(held.shared, "{held:?}");
    assert_eq!(held.fencing_token, first.fencing_token());
    assert!(held.holder.is_some(), "the oldest reader's record");
    let listed = a.list(&key).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].shared && listed[0].key == key, "{listed:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the writer waits for both readers");

    let evicted = w
        .force_release(&key, ForceRelease::Lock)
        .await
        .unwrap()
        .expect("held");
    assert!(evicted.shared, "{evicted:?}");
    let lease = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer is woken by the eviction")
        .unwrap()
        .expect("granted");
    assert!(lease.fencing_token() > first.fencing_token());
    for (locker, reader) in [(&a, &first), (&b, &second)] {
        match locker.refresh(&key, reader.owner(), TTL).await {
            Err(Error::NotHeld { .. }) => {}
            other => panic!("an evicted reader's refresh must be NotHeld: {other:?}"),
        }
        assert_eq!(reader.lost_signal().reason(), Some(LostReason::NotHeld));
    }
    let held = a.inspect(&key).await.unwrap().expect("held by the writer");
    assert!(!held.shared, "{held:?}");
    lease.release().await.unwrap();
}

/// A reader whose server freezes past its session timeout gives its lock
/// up (lost signal, ConnectionLost) before the session can expire, so
/// before a writer on another session can be granted the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cut_off_past_its_session_timeout_is_lost_before_a_writer_gets_in() {
    let server = ZooKeeperServer::start();
    let reader = locker(&server, "2s").await;
    let writer = locker(&server, "20s").await;
    let key = "k";
    let lease = reader
        .try_lock_shared(key, TTL)
        .await
        .unwrap()
        .expect("free");
    let mut lost = lease.lost_signal();
    server.pause();
    let paused = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("lost while the server is frozen");
    let lost_after = paused.elapsed();
    eprintln!("reader lost ({reason}) {lost_after:?} into the pause");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(lost_after < Duration::from_secs(2), "{lost_after:?}");
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(paused.elapsed())).await;
    server.resume();
    let next = writer
        .lock(key, TTL, Duration::from_secs(15))
        .await
        .expect("the writer gets the key once the reader's session is gone");
    let granted_after = paused.elapsed();
    eprintln!("the writer was granted {granted_after:?} after the pause began");
    assert!(granted_after > lost_after, "the reader gave up first");
    assert!(next.fencing_token() > lease.fencing_token());
    next.release().await.unwrap();
}
