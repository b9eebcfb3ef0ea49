//! A misbehaving server: paused (the holder must give up in time, with the
//! grace the docs promise) and restarted (every lease is lost, and fencing
//! tokens keep increasing). Each test starts a server of its own.

use std::time::Duration;

use distlock::{drift_margin, Locker, LostReason};
use test_servers::{unique_key, MariaDbServer};
use tokio::time::Instant;

use crate::support::{connect_to, name_of, TTL};

/// A paused server: the holder gives its session up within its bound and
/// keeps the documented grace; and when the server comes back during that
/// grace, it must still hold the lock until the grace ends. (Closing the
/// connection at the lost signal let the resumed server free the lock at
/// once, seconds before the lease's validity ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_loses_the_lease_with_the_documented_grace() {
    let server = MariaDbServer::start();
    // Window = wait_timeout − 1 s = 4 s after the last answer; the session
    // is given up 1 to 1.5 s after it (a ping due within 0.5 s, given 1 s).
    let locker = connect_to(
        &server,
        "&query_timeout=1&ping_interval=500ms&wait_timeout=5",
    )
    .await;
    let key = unique_key("paused");
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    let holder = server
        .lock_holder(&name_of(&key))
        .expect("held on the server");
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
    assert!(after >= Duration::from_millis(900), "{after:?}");
    assert!(after < Duration::from_secs(5), "{after:?}");
    let until = lease.valid_until().expect("a lost lease says until when");
    let grace = until.saturating_duration_since(detected);
    eprintln!("valid for {grace:?} after the signal");
    assert!(
        grace > Duration::from_secs(2) && grace <= Duration::from_secs(3),
        "{grace:?}"
    );
    // The server is back; the lock must stay its holder's session's
    // through the grace.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        server.lock_holder(&name_of(&key)),
        Some(holder),
        "the resumed server freed the lock {:?} before the lease's validity ended",
        until.saturating_duration_since(Instant::now())
    );
    tokio::time::sleep_until(until - drift_margin(TTL)).await;
    assert_eq!(
        server.lock_holder(&name_of(&key)),
        Some(holder),
        "freed before valid_until − drift_margin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_every_lease_and_tokens_keep_increasing() {
    let mut server = MariaDbServer::start();
    let locker = connect_to(&server, "").await;
    let key = unique_key("restart");
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

/// As on Postgres: the release clears the holder record before
/// `RELEASE_LOCK`, in one batch; with the row locked by another client past
/// `innodb_lock_wait_timeout`, the batch stopped at the `UPDATE` and the
/// lock stayed on a live session for good. The release must still free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_the_lock_even_when_its_fencing_row_is_locked() {
    use std::io::Write;
    use std::process::Stdio;

    let server = MariaDbServer::start();
    let locker = connect_to(&server, "&query_timeout=4").await;
    let key = unique_key("row-locked-release");
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    let name = name_of(&key);

    let mut row_lock = server
        .client_command()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run the mariadb client");
    writeln!(
        row_lock.stdin.as_mut().unwrap(),
        "BEGIN; SELECT 1 FROM {}.distlock_fencing WHERE lock_name = '{name}' FOR UPDATE; SELECT SLEEP(60);",
        MariaDbServer::DATABASE
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let result = lease.release().await;
    let held_after = server.lock_holder(&name);
    let _ = row_lock.kill();
    let _ = row_lock.wait();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(held_after, None, "still held after the release");
}
