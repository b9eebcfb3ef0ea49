//! The session lease under a holder: revoked from outside, lost with the
//! server, revoked by `close`, and the ttl rounding; the keepalive's
//! refresh batches.

use std::time::{Duration, Instant};

use distlock::etcd::EtcdLocker;
use distlock::{Locker, LostReason};
use test_servers::EtcdServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_lease_fires_every_lost_signal_under_it() {
    let server = EtcdServer::start();
    let locker = EtcdLocker::from_url(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let a = locker.try_lock("a", ttl).await.unwrap().unwrap();
    let b = locker.try_lock("b", ttl).await.unwrap().unwrap();
    let leases = locker.session_leases().await;
    assert_eq!(leases.len(), 1, "one session for one ttl class: {leases:?}");
    server.etcdctl_ok(&["lease", "revoke", &leases[0]]);
    let revoked_at = Instant::now();
    for lease in [&a, &b] {
        let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost_signal().wait())
            .await
            .expect("lost within one keep-alive interval");
        assert_eq!(reason, LostReason::ConnectionLost);
    }
    eprintln!(
        "lost signals fired {:?} after the revoke",
        revoked_at.elapsed()
    );
    // The locker recovers: a new session.
    let again = locker.try_lock("a", ttl).await.unwrap().expect("free");
    assert_ne!(locker.session_leases().await, leases);
    again.release().await.unwrap();
    assert!(matches!(
        a.release().await,
        Err(distlock::Error::NotHeld { .. })
    ));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_loses_the_lock_before_its_lease_could_expire() {
    let mut server = EtcdServer::start();
    let locker = EtcdLocker::from_url(&format!("{}?keepalive_timeout=300ms", server.url()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    let lease = locker.try_lock("k", ttl).await.unwrap().unwrap();
    let mut lost = lease.lost_signal();
    server.kill();
    let killed = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("lost within the ttl");
    let after = killed.elapsed();
    eprintln!("lost ({reason}) {after:?} after the server died (ttl {ttl:?})");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        after < ttl,
        "must give up before the lease can expire: {after:?}"
    );
    // An outage, never contention.
    let err = locker.try_lock("other", ttl).await.unwrap_err();
    assert!(err.is_outage() && !err.is_contention(), "{err}");
    server.restart();
    // etcd restores leases with a fresh ttl on restart (as on a leader
    // change), so the old key is freed one ttl after the restart; the same
    // locker, not rebuilt, queues behind it on a new session.
    let restarted = Instant::now();
    let lease = locker
        .lock("k", ttl, Duration::from_secs(15))
        .await
        .expect("the same locker recovers after the restart");
    eprintln!(
        "granted again {:?} after the restart (the old lease's ttl restarted with the server)",
        restarted.elapsed()
    );
    lease.release().await.unwrap();
}

/// A release that cannot reach the server leaves the key held under a
/// session that is still alive as far as this locker knows; the release
/// goes on in the background. Asking for the key again meanwhile must be an
/// outage, as it is for any other client: "held elsewhere" would be this
/// locker's own stale hold read as somebody else's (found by the fault
/// suite's etcd-cluster majority-loss cell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_release_is_pending_is_an_outage_not_contention() {
    let mut server = EtcdServer::start();
    let locker = EtcdLocker::from_url(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(10);
    let lease = locker.try_lock("k", ttl).await.unwrap().unwrap();
    server.kill();
    let err = lease.release().await.unwrap_err();
    assert!(err.is_outage(), "the release cannot reach etcd: {err}");
    let err = locker.try_lock("k", ttl).await.unwrap_err();
    assert!(
        err.is_outage() && !err.is_contention(),
        "try_lock while the release is pending: {err}"
    );
    let err = locker
        .lock("k", ttl, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        err.is_outage() && !err.is_contention(),
        "lock while the release is pending: {err}"
    );
    server.restart();
    // The background release reaches the restarted server: the key is free
    // well before the lease's ttl.
    let restarted = Instant::now();
    let again = locker
        .lock("k", ttl, Duration::from_secs(8))
        .await
        .expect("free once the pending release lands");
    assert!(
        restarted.elapsed() < Duration::from_secs(8),
        "{:?}",
        restarted.elapsed()
    );
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_the_sessions_and_frees_their_locks_at_once() {
    let server = EtcdServer::start();
    let a = EtcdLocker::from_url(&server.url()).await.unwrap();
    let b = EtcdLocker::from_url(&server.url()).await.unwrap();
    let lease = a
        .try_lock("k", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    a.close().await;
    assert_eq!(
        lease.lost_signal().reason(),
        Some(LostReason::ConnectionLost)
    );
    let next = b.try_lock("k", Duration::from_secs(30)).await.unwrap();
    assert!(next.is_some(), "freed by the revoke, not after 30 s");
    let listed = server.etcdctl_ok(&["lease", "list"]);
    assert!(listed.lines().count() <= 2, "a's lease is gone: {listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_second_ttls_are_one_second_leases() {
    let server = EtcdServer::start();
    let locker = EtcdLocker::from_url(&server.url()).await.unwrap();
    let lease = locker
        .try_lock("short", Duration::from_millis(400))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        lease.ttl(),
        Duration::from_millis(400),
        "reports the ttl asked for"
    );
    let id = locker.session_leases().await.remove(0);
    let ttl = server.etcdctl_ok(&["lease", "timetolive", &id]);
    assert!(ttl.contains("granted with TTL(1s)"), "{ttl}");
    let long = locker
        .try_lock("long", Duration::from_millis(1200))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        locker.session_leases().await.len(),
        2,
        "1.2 s is a 2 s class"
    );
    let ids = locker.session_leases().await;
    let two = ids.iter().find(|l| **l != id).unwrap();
    let ttl = server.etcdctl_ok(&["lease", "timetolive", two]);
    assert!(ttl.contains("granted with TTL(2s)"), "{ttl}");
    drop((lease, long));
}

/// A keepalive batch reads 128 keys per transaction: 300 leases are two
/// full transactions and one of 44, not 300.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_batch_is_one_transaction_per_128_leases() {
    let server = EtcdServer::start();
    let locker = EtcdLocker::from_url(&server.url()).await.unwrap();
    let leases = hold(&locker, 300).await;
    let before = server.grpc_calls("Txn");
    let results = locker.refresh_many(&requests(&leases)).await;
    assert_eq!(
        server.grpc_calls("Txn") - before,
        3,
        "transactions for 300 leases"
    );
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// On a cluster whose `--max-txn-ops` is below 128 the batch's read is
/// refused; the leases are then checked one transaction each, with the same
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_batch_works_under_a_lower_max_txn_ops() {
    let server = EtcdServer::start_with_args(&["--max-txn-ops=16"]);
    let locker = EtcdLocker::from_url(&server.url()).await.unwrap();
    let mut leases = hold(&locker, 40).await;
    let released = leases.pop().unwrap();
    let (released_key, released_owner) = (released.key().to_owned(), released.owner().to_owned());
    released.release().await.unwrap();
    let mut batch = requests(&leases);
    batch.push(distlock::RefreshRequest {
        key: &released_key,
        owner: &released_owner,
        ttl: Duration::from_secs(10),
    });
    let before = server.grpc_calls("Txn");
    let results = locker.refresh_many(&batch).await;
    assert_eq!(
        server.grpc_calls("Txn") - before,
        41,
        "the refused read, then one transaction per lease"
    );
    assert_eq!(results.len(), 40);
    assert!(results[..39].iter().all(Result::is_ok), "{results:?}");
    assert!(
        matches!(&results[39], Err(distlock::Error::NotHeld { key }) if *key == released_key),
        "{:?}",
        results[39]
    );
}

async fn hold(locker: &EtcdLocker, count: usize) -> Vec<distlock::Lease> {
    let mut leases = Vec::with_capacity(count);
    for index in 0..count {
        let key = format!("batch-{index}");
        let lease = locker
            .try_lock(&key, Duration::from_secs(10))
            .await
            .unwrap();
        leases.push(lease.expect("free"));
    }
    leases
}

fn requests(leases: &[distlock::Lease]) -> Vec<distlock::RefreshRequest<'_>> {
    leases
        .iter()
        .map(|lease| distlock::RefreshRequest {
            key: lease.key(),
            owner: lease.owner(),
            ttl: Duration::from_secs(10),
        })
        .collect()
}
