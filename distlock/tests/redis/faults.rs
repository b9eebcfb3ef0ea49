//! The Redis backend under faults: forgotten scripts, restarts, a dead or
//! frozen server, lost replies, cancelled and blackholed acquires (through
//! test-servers' [`FaultProxy`]), and keys written by other clients. Each test
//! owns its redis-server, since most of them break it.

use std::time::Duration;

use distlock::redis::{Config, RedisLocker};
use distlock::{Error, Locker};
use test_servers::{FaultProxy, RedisOptions, RedisServer};
use tokio::time::Instant;

use crate::support::connect;

const TTL: Duration = Duration::from_secs(30);

/// Retries `attempt` while it fails with an outage (the connection
/// recovering after a restart), for up to 5 s; anything else is returned.
async fn once_reconnected<T, F, Fut>(mut attempt: F) -> distlock::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = distlock::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match attempt().await {
            Err(err) if err.is_outage() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

fn assert_outage<T: std::fmt::Debug>(result: distlock::Result<T>, what: &str) {
    match result {
        Err(err @ Error::Backend { .. }) => {
            assert!(err.is_outage() && !err.is_contention(), "{what}: {err}")
        }
        other => panic!("{what} against a dead server must be a backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    let mut lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    lease
        .refresh(TTL)
        .await
        .expect("refresh reloads its script");
    server.cli(&["SCRIPT", "FLUSH"]);
    lease.release().await.expect("release reloads its script");
    server.cli(&["SCRIPT", "FLUSH"]);
    let again = locker
        .try_lock("k", TTL)
        .await
        .unwrap()
        .expect("acquire reloads its script");
    assert_eq!(again.fencing_token(), Some(2));
    again.release().await.unwrap();
}

#[tokio::test]
async fn the_keys_in_redis_are_the_documented_ones() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    let lease = locker.try_lock("jobs/nightly", TTL).await.unwrap().unwrap();
    assert_eq!(locker.backend_key("jobs/nightly"), "lock:{jobs/nightly}");
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{jobs/nightly}"),
        lease.owner()
    );
    assert_eq!(
        server.cli(&["GET", &locker.fence_key("jobs/nightly")]),
        lease.fencing_token().unwrap().to_string()
    );
    let pttl: u64 = server
        .cli(&["PTTL", "lock:{jobs/nightly}"])
        .parse()
        .unwrap();
    assert!(pttl > 29_000 && pttl <= 30_000, "PTTL {pttl}");
    let remaining = locker.remaining_ttl("jobs/nightly").await.unwrap().unwrap();
    assert!(remaining > Duration::from_secs(29), "{remaining:?}");
    lease.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "lock:{jobs/nightly}"]), "0");
    assert_eq!(locker.remaining_ttl("jobs/nightly").await.unwrap(), None);
}

#[tokio::test]
async fn a_key_set_by_another_client_is_contention() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    server.cli(&["SET", "lock:{k}", "x", "NX", "PX", "10000"]);
    assert!(locker.try_lock("k", TTL).await.unwrap().is_none());
    match locker.lock("k", TTL, Duration::from_millis(300)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(matches!(
        locker.unlock("k", "x").await,
        Ok(()) | Err(Error::NotHeld { .. })
    ));
    // A key without expiry (only a foreign client can write one).
    server.cli(&["SET", "lock:{forever}", "x"]);
    assert_eq!(
        locker.remaining_ttl("forever").await.unwrap(),
        Some(Duration::MAX)
    );
}

#[tokio::test]
async fn a_killed_server_is_an_outage_never_contention_and_recovery_follows() {
    let mut server = RedisServer::start();
    let locker = connect(&server).await;
    let held = locker.try_lock("held", TTL).await.unwrap().unwrap();
    let owner = held.owner().to_owned();
    std::mem::forget(held); // its background release would race the kill

    server.kill();
    assert_outage(locker.try_lock("k", TTL).await, "try_lock");
    assert_outage(locker.try_lock("k", TTL).await, "a second try_lock");
    assert_outage(
        locker.lock("k", TTL, Duration::from_millis(500)).await,
        "lock",
    );
    assert_outage(locker.unlock("held", &owner).await, "unlock");
    assert_outage(locker.refresh("held", &owner, TTL).await, "refresh");
    assert_outage(locker.remaining_ttl("held").await, "remaining_ttl");

    server.restart();
    let lease = once_reconnected(|| locker.try_lock("k", TTL))
        .await
        .expect("the connection recovers after the restart")
        .expect("k is free on the restarted server");
    lease.release().await.expect("release after recovery");
}

#[tokio::test]
async fn a_restart_without_persistence_forgets_the_lock_and_says_so() {
    let mut server = RedisServer::start();
    let locker = connect(&server).await;
    let other = connect(&server).await;
    let lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
    let owner = lease.owner().to_owned();

    server.restart();
    match once_reconnected(|| locker.unlock("k", &owner)).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("the restarted server forgot the lock: expected NotHeld, got {other:?}"),
    }
    let next = once_reconnected(|| other.try_lock("k", TTL))
        .await
        .unwrap()
        .expect("a new acquire works after the restart");
    // Documented: without persistence the fence counter starts again.
    assert_eq!(next.fencing_token(), Some(1));
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    next.release().await.unwrap();
}

#[tokio::test]
async fn with_appendonly_a_restart_keeps_the_lock_and_the_fence_counter() {
    let mut server = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    });
    let locker = connect(&server).await;
    let first = locker.try_lock("k", TTL).await.unwrap().unwrap();
    let token = first.fencing_token().unwrap();

    server.restart();
    assert!(
        once_reconnected(|| locker.try_lock("k", TTL))
            .await
            .unwrap()
            .is_none(),
        "the lock survived the restart"
    );
    first.release().await.expect("the holder still holds it");
    let second = locker.try_lock("k", TTL).await.unwrap().unwrap();
    assert!(second.fencing_token().unwrap() > token);
    second.release().await.unwrap();
}

#[tokio::test]
async fn an_acquire_whose_reply_times_out_is_an_error_and_is_undone() {
    let server = RedisServer::start();
    let config = Config {
        response_timeout: Duration::from_millis(200),
        ..Config::from_url(&server.url()).unwrap()
    };
    let locker = RedisLocker::from_config(config).await.unwrap();
    // Load the scripts: a first EVALSHA would meet NOSCRIPT on resume and do nothing.
    locker
        .try_lock("warm-up", TTL)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let result = locker.try_lock("k", TTL).await;
    // The acquire waits in the frozen server's socket and runs on resume.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    let err = match result {
        Err(err @ Error::Backend { .. }) => err,
        other => panic!("a timed-out acquire must be a backend error, got {other:?}"),
    };
    let message = err.to_string();
    assert!(
        message.contains("response timeout") && message.contains("released by its owner token"),
        "{message}"
    );
    // It did run (the fence counter moved), and the background release
    // deleted it long before its 30 s ttl.
    let deadline = Instant::now() + Duration::from_secs(4);
    while server.cli(&["EXISTS", "lock:{k}"]) != "0" {
        assert!(
            Instant::now() < deadline,
            "the lost acquire was not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.cli(&["GET", "lock:{k}:fence"]), "1");
    let lease = locker
        .try_lock("k", TTL)
        .await
        .unwrap()
        .expect("free again");
    lease.release().await.unwrap();
}

/// A locker whose every connection (commands and subscriber) goes through a
/// fresh [`FaultProxy`] in front of `server`, with its scripts loaded (so a
/// fault hits the acquire itself, not a `NOSCRIPT` round trip).
async fn connect_through_proxy(server: &RedisServer, config: Config) -> (RedisLocker, FaultProxy) {
    let proxy = FaultProxy::start(server.port());
    let config = Config {
        addresses: vec![format!("127.0.0.1:{}", proxy.port())],
        ..config
    };
    let locker = RedisLocker::from_config(config)
        .await
        .expect("connect through the proxy");
    let warm = locker.try_lock("warm-up", TTL).await.unwrap().unwrap();
    warm.release().await.unwrap();
    (locker, proxy)
}

fn default_config(server: &RedisServer) -> Config {
    Config::from_url(&server.url()).unwrap()
}

/// Polls until `key`'s lock is gone from the server, for up to `within`.
async fn until_free(server: &RedisServer, key: &str, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    let lock_key = format!("lock:{{{key}}}");
    while server.cli(&["EXISTS", &lock_key]) != "0" {
        assert!(
            Instant::now() < deadline,
            "{what}: still locked after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_is_cut_off_is_retried_and_granted_not_contention() {
    let server = RedisServer::start();
    let (locker, proxy) = connect_through_proxy(&server, default_config(&server)).await;
    // The server runs the SET, the connection is reset before its reply.
    proxy.cut_after_next_request();
    let lease = locker
        .try_lock("k", TTL)
        .await
        .expect("the retry on the new connection succeeds")
        .expect("the retry recognises its own grant: nobody else holds k");
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{k}"),
        lease.owner(),
        "the key holds the lease's token"
    );
    assert_eq!(
        lease.fencing_token(),
        Some(1),
        "the retry reports the first attempt's grant, not a second one"
    );
    assert_eq!(server.cli(&["GET", "lock:{k}:fence"]), "1");
    let pttl: u64 = server.cli(&["PTTL", "lock:{k}"]).parse().unwrap();
    assert!(pttl > 29_000, "the retry re-armed the ttl: PTTL {pttl}");
    // Nothing in the background deletes the lock from under the holder.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{k}"),
        lease.owner()
    );
    lease.release().await.expect("the holder releases");
}

/// `name#0` to `name#{n-1}`: a semaphore's permit keys.
fn permit_keys(name: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{name}#{i}")).collect()
}

/// The native `try_lock_any` retried after a lost reply looks for its own
/// grant before granting anything: it reports the key the first run took,
/// and takes no second one, even though a key before it was freed in
/// between (which a retry that granted the first free key would take).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_any_whose_reply_is_cut_off_reports_its_grant_and_takes_no_other() {
    let server = RedisServer::start();
    let (locker, proxy) = connect_through_proxy(&server, default_config(&server)).await;
    let other = connect(&server).await;
    let keys = permit_keys("p", 3);
    let held = other.try_lock(&keys[0], TTL).await.unwrap().unwrap();
    // The first run grants p#1 and its reply is lost. A retry that granted
    // the first free key would take p#2; one whose reconnect is slow enough
    // also finds p#0, released here as soon as p#1 is seen taken.
    proxy.cut_after_next_request();
    let attempt = tokio::spawn({
        let (locker, keys) = (locker.clone(), keys.clone());
        async move { locker.try_lock_any(&keys, TTL).await }
    });
    let started = Instant::now();
    while crate::support::stored_owner(&server, "lock:{p#1}").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "p#1 was never granted"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    held.release().await.unwrap();
    let lease = attempt
        .await
        .unwrap()
        .expect("the retry on the new connection succeeds")
        .expect("the retry recognises its own grant");
    assert_eq!(lease.key(), "p#1", "the key the first run took");
    assert_eq!(lease.fencing_token(), Some(1));
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{p#1}"),
        lease.owner()
    );
    for free in ["lock:{p#0}", "lock:{p#2}"] {
        assert_eq!(server.cli(&["EXISTS", free]), "0", "{free}: one grant only");
    }
    lease.release().await.unwrap();
}

/// A native `try_lock_any` dropped after its script ran: the key it took
/// (the second, the first being held) is released by its token in the
/// background, and the held key is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_any_dropped_mid_flight_is_undone_by_its_token() {
    let server = RedisServer::start();
    let (locker, proxy) = connect_through_proxy(&server, default_config(&server)).await;
    let other = connect(&server).await;
    let keys = permit_keys("q", 3);
    let held = other.try_lock(&keys[0], TTL).await.unwrap().unwrap();
    proxy.delay_replies(Duration::from_millis(300));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), locker.try_lock_any(&keys, TTL)).await;
    assert!(cancelled.is_err(), "the caller gave up first");
    until_free(
        &server,
        "q#1",
        Duration::from_secs(3),
        "the cancelled attempt",
    )
    .await;
    assert_eq!(server.cli(&["GET", "lock:{q#1}:fence"]), "1", "it ran");
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{q#0}"),
        held.owner(),
        "the other holder's key is untouched"
    );
    assert_eq!(server.cli(&["EXISTS", "lock:{q#2}"]), "0");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_dropped_mid_flight_is_undone_by_its_token() {
    let server = RedisServer::start();
    let (locker, proxy) = connect_through_proxy(&server, default_config(&server)).await;
    // Requests reach the server at once; replies take 300 ms (less than the
    // 500 ms response timeout, so only the caller's cancellation interferes).
    proxy.delay_replies(Duration::from_millis(300));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), locker.try_lock("k", TTL)).await;
    assert!(
        cancelled.is_err(),
        "the reply is delayed, so the caller gave up first"
    );
    // The acquire ran (the fence counter moved) and is released by its token
    // long before its 30 s ttl.
    until_free(
        &server,
        "k",
        Duration::from_secs(3),
        "the cancelled acquire",
    )
    .await;
    assert_eq!(server.cli(&["GET", "lock:{k}:fence"]), "1");
    proxy.restore();
    let lease = locker
        .try_lock("k", TTL)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(lease.fencing_token(), Some(2));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_against_a_blackholed_server_are_bounded_outages() {
    let server = RedisServer::start();
    let (locker, proxy) = connect_through_proxy(&server, default_config(&server)).await;
    let held = locker.try_lock("held", TTL).await.unwrap().unwrap();
    let owner = held.owner().to_owned();
    std::mem::forget(held);
    // The connection is reset and every reconnect hangs: accepted, unanswered.
    proxy.blackhole();
    proxy.cut_all();
    let bound = locker.operation_bound();
    assert_eq!(
        bound,
        distlock::redis::DEFAULT_CONNECT_TIMEOUT
            + distlock::redis::DEFAULT_RESPONSE_TIMEOUT
            + Duration::from_millis(700),
        "the documented bound"
    );
    let slack = Duration::from_millis(500);

    let started = Instant::now();
    let result = locker.try_lock("k", TTL).await;
    let elapsed = started.elapsed();
    match result {
        Err(
            ref err @ Error::DeadlineExceeded {
                backend: "redis",
                operation: "acquire",
                after,
            },
        ) => {
            assert_eq!(after, bound);
            assert!(err.is_outage() && !err.is_contention(), "{err}");
        }
        other => panic!("a blackholed acquire must exceed its deadline, got {other:?}"),
    }
    eprintln!("try_lock against a blackholed server returned after {elapsed:?}");
    assert!(
        elapsed < bound + slack,
        "try_lock returned after {elapsed:?}"
    );

    // Release and refresh are bounded the same way. They end either at the
    // bound or, if the connection manager's reconnect cycle gives up first,
    // with its timeout error: an outage either way, never NotHeld.
    let started = Instant::now();
    let released = locker.unlock("held", &owner).await;
    let release_took = started.elapsed();
    let started = Instant::now();
    let refreshed = locker.refresh("held", &owner, TTL).await;
    let refresh_took = started.elapsed();
    for (operation, result, took) in [
        ("release", released, release_took),
        ("refresh", refreshed, refresh_took),
    ] {
        match result {
            Err(err @ (Error::DeadlineExceeded { .. } | Error::Backend { .. })) => {
                assert!(
                    err.is_outage() && !err.is_contention(),
                    "{operation}: {err}"
                )
            }
            other => panic!("{operation} against a blackhole: expected an outage, got {other:?}"),
        }
        assert!(took < bound + slack, "{operation} returned after {took:?}");
    }

    proxy.restore();
    let lease = once_reconnected(|| locker.try_lock("k", TTL))
        .await
        .expect("the connection recovers once the server answers")
        .expect("k is free: the abandoned acquire never ran or was undone");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_abandoned_at_its_deadline_is_undone_by_its_token() {
    let server = RedisServer::start();
    // bound = 0.3 s + 1.2 s + 0.7 s = 2.2 s. With the script cache flushed,
    // the acquire is EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA: with replies
    // delayed 0.9 s, the script runs at about 1.8 s and its reply would
    // arrive at 2.7 s, past the bound; each reply comes within the 1.2 s
    // response timeout.
    let config = Config {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(1200),
        ..default_config(&server)
    };
    let (locker, proxy) = connect_through_proxy(&server, config).await;
    server.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(locker.operation_bound(), Duration::from_millis(2200));
    proxy.delay_replies(Duration::from_millis(900));
    match locker.try_lock("k", TTL).await {
        Err(Error::DeadlineExceeded { after, .. }) => {
            assert_eq!(after, Duration::from_millis(2200))
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    // The script did run; the abandoned acquire is released by its token.
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.cli(&["GET", "lock:{k}:fence"]) != "1" {
        assert!(
            Instant::now() < deadline,
            "the acquire never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_free(
        &server,
        "k",
        Duration::from_secs(4),
        "the abandoned acquire",
    )
    .await;
}
