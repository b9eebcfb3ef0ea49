//! A misbehaving server: paused (the holder must give up in time, with the
//! grace the docs promise) and restarted (every lease is lost, and fencing
//! tokens keep increasing). Each test starts a server of its own.

use std::time::Duration;

use distlock::{Locker, LostReason};
use test_servers::MariaDbServer;
use tokio::time::Instant;

use crate::support::{connect_to, unique, TTL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_loses_the_lease_with_the_documented_grace() {
    let server = MariaDbServer::start();
    // Grace = wait_timeout − ping_interval − query_timeout − 1 s = 2.5 s.
    let locker = connect_to(&server, "&query_timeout=1&ping_interval=500&wait_timeout=5").await;
    let lease = locker
        .try_lock(&unique("paused"), TTL)
        .await
        .unwrap()
        .expect("free");
    let mut lost = lease.lost_signal();
    server.pause();
    let paused = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), lost.wait()).await;
    let detected = Instant::now();
    server.resume();
    assert_eq!(
        reason.expect("lost within 10 s"),
        LostReason::ConnectionLost
    );
    let after = detected - paused;
    eprintln!("lost {after:?} after the pause");
    // The next ping is due within 0.5 s and given 1 s to answer.
    assert!(after >= Duration::from_millis(900), "{after:?}");
    assert!(after < Duration::from_secs(5), "{after:?}");
    let until = lease.valid_until().expect("a lost lease says until when");
    let grace = until.saturating_duration_since(detected);
    eprintln!("valid for {grace:?} after the signal");
    assert!(
        grace > Duration::from_secs(2) && grace <= Duration::from_millis(2500),
        "{grace:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_every_lease_and_tokens_keep_increasing() {
    let mut server = MariaDbServer::start();
    let locker = connect_to(&server, "").await;
    let key = unique("restart");
    let first = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    let token = first.fencing_token().expect("fencing is on");
    let mut lost = first.lost_signal();
    server.restart();
    let reason = tokio::time::timeout(Duration::from_secs(10), lost.wait())
        .await
        .expect("lost within 10 s of the restart");
    assert_eq!(reason, LostReason::ConnectionLost);
    // The locker reconnects; the counter row survived the crash.
    let second = locker
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free after the restart");
    let next = second.fencing_token().expect("fencing is on");
    assert!(next > token, "{next} after {token}");
    second.release().await.unwrap();
}
