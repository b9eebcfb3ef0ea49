//! The Postgres backend when the server misbehaves: paused (SIGSTOP),
//! configured with timeouts that would end waits or idle sessions, or
//! blocked by another client's row lock. Each test owns its server, since it
//! pauses or reconfigures it.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::{Error, Locker, DEADLINE_GRACE};
use test_servers::{unique_key, PostgresServer};
use tokio::time::Instant;

use crate::common::eventually;
use crate::support::holders;

const TTL: Duration = Duration::from_secs(30);

/// Waits on advisory key `key` that the server has not granted yet.
fn waiting_on(server: &PostgresServer, key: i64) -> usize {
    server
        .psql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND ((classid::int8 << 32) | objid::int8) = {key}"
        ))
        .parse()
        .expect("a count")
}

/// A backend error whose text contains `needle`.
fn assert_backend(result: &Error, needle: &str) {
    assert!(
        matches!(result, Error::Backend { .. }) && result.to_string().contains(needle),
        "expected a backend error mentioning {needle:?}, got {result:?}: {result}"
    );
}

/// While an abandoned attempt's cleanup is pending, the key may be held on
/// the server for nobody: `try_lock` must not call that contention, nor
/// `unlock` "not held". An attempt of another caller that is merely in
/// flight stays contention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_cleanup_is_reported_as_such_not_as_contention_or_not_held() {
    let server = PostgresServer::start();
    let locker = PostgresLocker::builder(&server.url())
        .unwrap()
        .sessions(1)
        .query_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let (abandoned_key, in_flight_key) = (unique_key("abandoned"), unique_key("in-flight"));

    server.pause();
    // Sent to a server that does not answer, then dropped: its cleanup
    // waits for the server too.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(200),
        locker.try_lock(&abandoned_key, TTL),
    )
    .await;
    assert!(abandoned.is_err(), "a paused server cannot answer");

    let tried = locker.try_lock(&abandoned_key, TTL).await;
    assert_backend(
        &tried.expect_err("not contention"),
        "still being cleaned up",
    );
    let unlocked = locker.unlock(&abandoned_key, "some-owner").await;
    assert_backend(
        &unlocked.expect_err("not NotHeld"),
        "still being cleaned up",
    );

    let first = tokio::spawn({
        let (locker, key) = (locker.clone(), in_flight_key.clone());
        async move { locker.try_lock(&key, TTL).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished(), "the server is paused");
    assert!(
        locker
            .try_lock(&in_flight_key, TTL)
            .await
            .expect("contention, answered locally")
            .is_none(),
        "another caller's attempt in flight is contention"
    );

    server.resume();
    let lease = first
        .await
        .unwrap()
        .unwrap()
        .expect("the first caller wins");
    lease.release().await.unwrap();
    // Once the cleanup is done, the key is simply free again.
    let started = Instant::now();
    let lease = loop {
        match locker.try_lock(&abandoned_key, TTL).await {
            Ok(Some(lease)) => break lease,
            Err(e) if e.to_string().contains("still being cleaned up") => {}
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "cleanup ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    lease.release().await.unwrap();
    assert_eq!(locker.held_count(), 0);
}

/// `lock(key, ttl, timeout)` returns within `timeout + DEADLINE_GRACE`
/// whether the server stops answering before the first attempt or during the
/// native wait, and says "outage", not "timeout"; `try_lock` is bounded by
/// the query timeout. Nothing stays granted afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_bounds_lock_by_its_timeout_and_try_lock_by_the_query_timeout() {
    let server = PostgresServer::start();
    let url = format!("{}&idle_waiters=0", server.url());
    let (locker, holder) = (
        PostgresLocker::from_url(&url).await.unwrap(),
        PostgresLocker::from_url(&url).await.unwrap(),
    );
    let timeout = Duration::from_secs(1);
    let bound = timeout + DEADLINE_GRACE + Duration::from_millis(300);
    let key = unique_key("paused");
    let id = locker.advisory_key(&key);

    // Paused before the first attempt (default query timeout: 10 s).
    locker
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let started = Instant::now();
    let err = locker.lock(&key, TTL, timeout).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    eprintln!("paused before the attempt: {err} after {took:?}");
    assert!(
        err.is_outage() && !matches!(err, Error::Timeout { .. }),
        "{err:?}"
    );
    assert!(took < bound, "returned after {took:?}");
    // The abandoned attempt reaches the server once it resumes and may take
    // the lock; its guard undoes that in the background.
    eventually(
        Duration::from_secs(5),
        "the abandoned attempt is undone",
        || holders(&server, id).is_empty(),
    )
    .await;

    // Paused during the native wait.
    let held = holder.try_lock(&key, TTL).await.unwrap().expect("free");
    let waiting = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            let started = Instant::now();
            (locker.lock(&key, TTL, timeout).await, started.elapsed())
        }
    });
    eventually(
        Duration::from_secs(5),
        "the wait reaches the server",
        || waiting_on(&server, id) == 1,
    )
    .await;
    server.pause();
    let (result, took) = waiting.await.unwrap();
    server.resume();
    let err = result.unwrap_err();
    eprintln!("paused during the wait: {err} after {took:?}");
    assert!(
        err.is_outage() && !matches!(err, Error::Timeout { .. }),
        "{err:?}"
    );
    assert!(took < bound, "returned after {took:?}");
    held.release().await.unwrap();
    // The abandoned wait was cancelled and its connection closed.
    eventually(
        Duration::from_secs(5),
        "nothing stays granted or waiting",
        || holders(&server, id).is_empty() && waiting_on(&server, id) == 0,
    )
    .await;

    // try_lock: bounded by the query timeout.
    let quick = PostgresLocker::builder(&server.url())
        .unwrap()
        .query_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    quick
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let started = Instant::now();
    let err = quick.try_lock(&key, TTL).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(err.is_outage(), "{err:?}");
    assert!(
        took < Duration::from_millis(1300),
        "returned after {took:?}"
    );
    let checker = PostgresLocker::from_url(&server.url()).await.unwrap();
    let started = Instant::now();
    while checker.try_lock(&key, TTL).await.unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(5), "stranded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A role whose `statement_timeout` (100 ms) would end every native wait
/// and whose `idle_session_timeout` (1 s) would end idle sessions, and with
/// them their locks: distlock's sessions turn both off for themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_timeouts_end_neither_native_waits_nor_idle_holders() {
    let server = PostgresServer::start();
    server.psql(
        "ALTER ROLE postgres SET statement_timeout = '100ms'; \
         ALTER ROLE postgres SET idle_session_timeout = '1s'; \
         ALTER ROLE postgres SET idle_in_transaction_session_timeout = '100ms'",
    );
    let (holder, waiter) = (
        PostgresLocker::from_url(&server.url()).await.unwrap(),
        PostgresLocker::from_url(&server.url()).await.unwrap(),
    );
    let key = unique_key("role-timeouts");
    let id = holder.advisory_key(&key);
    let held = holder.try_lock(&key, TTL).await.unwrap().expect("free");
    let mut lost = held.lost_signal();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.lock(&key, TTL, Duration::from_secs(20)).await }
    });

    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiting.is_finished(), "still waiting after 2.5 s");
    assert_eq!(waiting_on(&server, id), 1, "the wait is on the server");
    assert_eq!(lost.reason(), None, "an idle holder keeps its session");
    assert_eq!(holders(&server, id).len(), 1, "and its lock");
    holder.refresh(&key, held.owner(), TTL).await.unwrap();
    held.release().await.unwrap();

    let won = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the wait ends at the release")
        .unwrap()
        .expect("the waiter acquires");
    assert!(won.fencing_token().is_some());
    won.release().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(10), lost.wait())
        .await
        .is_ok_and(|reason| reason == distlock::LostReason::Released));
}

/// Another client's `SELECT … FOR UPDATE` of a key's fencing row blocks that
/// key's counter bump. The session's `lock_timeout` fails that one attempt
/// with a backend error (and its cleanup frees the advisory lock) while the
/// other keys on the same shared session keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_fencing_row_fails_one_attempt_and_spares_its_session() {
    let server = PostgresServer::start();
    let query_timeout = Duration::from_secs(4);
    let locker = PostgresLocker::builder(&server.url())
        .unwrap()
        .sessions(1)
        .query_timeout(query_timeout)
        .build()
        .await
        .unwrap();
    let (blocked, other) = (unique_key("row-locked"), unique_key("bystander"));
    let id = locker.advisory_key(&blocked);
    for key in [&blocked, &other] {
        locker
            .try_lock(key, TTL)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    let mut row_lock = lock_fencing_row(&server, id).await;

    let attempt = tokio::spawn({
        let (locker, key) = (locker.clone(), blocked.clone());
        async move {
            let started = Instant::now();
            (locker.try_lock(&key, TTL).await, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Pipelined behind the blocked statement on the one shared session.
    let bystander = locker.try_lock(&other, TTL).await;
    let (result, took) = attempt.await.unwrap();
    eprintln!("blocked attempt: {result:?} after {took:?}");
    assert_backend(&result.expect_err("a backend error"), "55P03");
    assert!(took < query_timeout, "failed on the server, after {took:?}");
    bystander
        .expect("other keys on the session work")
        .expect("free")
        .release()
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the cleanup frees the advisory lock",
        || holders(&server, id).is_empty(),
    )
    .await;

    drop(row_lock.stdin.take());
    row_lock.wait().unwrap();
    let started = Instant::now();
    let lease = loop {
        match locker.try_lock(&blocked, TTL).await {
            Ok(Some(lease)) => break lease,
            Err(e) if e.to_string().contains("still being cleaned up") => {}
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    lease.release().await.unwrap();
}

/// The release also clears the holder record of the key's fencing row; with
/// that row locked by another client past `lock_timeout`, the clearing
/// fails, and the unlock in the same statement never ran: the lock stayed on
/// a live session for good. The release must still free the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_the_lock_even_when_its_fencing_row_is_locked() {
    let server = PostgresServer::start();
    let locker = PostgresLocker::from_url(&server.url()).await.unwrap();
    let key = unique_key("row-locked-release");
    let id = locker.advisory_key(&key);
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");

    let mut row_lock = lock_fencing_row(&server, id).await;

    let result = lease.release().await;
    let held_after = holders(&server, id);
    let _ = row_lock.kill();
    let _ = row_lock.wait();
    assert!(result.is_ok(), "{result:?}");
    assert!(
        held_after.is_empty(),
        "still held by {held_after:?} after the release"
    );
    let other = PostgresLocker::from_url(&server.url()).await.unwrap();
    assert!(other.try_lock(&key, TTL).await.unwrap().is_some());
}

/// An open transaction of another client (psql) holding the fencing row of
/// advisory key `id` (`SELECT … FOR UPDATE`), returned once the row is
/// locked; killing the child ends it.
async fn lock_fencing_row(server: &PostgresServer, id: i64) -> std::process::Child {
    let mut row_lock = server
        .psql_command()
        .arg("-q")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run psql");
    writeln!(
        row_lock.stdin.as_mut().unwrap(),
        "BEGIN; SELECT 1 FROM distlock_fencing WHERE lock_key = {id} FOR UPDATE;"
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the row is locked", || {
        server.psql("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'")
            == "1"
    })
    .await;
    row_lock
}
