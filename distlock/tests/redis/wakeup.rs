//! Release notifications on Redis: one shared subscriber connection per
//! locker, subscriptions following the waiters, waiters that keep going
//! (by polling) when that connection dies, and a silent connection (through
//! test-servers' [`FaultProxy`]) found dead by its PING.

use std::time::Duration;

use distlock::redis::{Config, RedisLocker};
use distlock::{Lease, Locker};
use test_servers::{FaultProxy, RedisServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::eventually;
use crate::support::connect;

const TTL: Duration = Duration::from_secs(30);
/// Long enough for a polling waiter to reach its largest delay (100–200 ms).
const SETTLE: Duration = Duration::from_millis(600);
/// A woken waiter acquires well within this; a polling one usually does not.
const PROMPT: Duration = Duration::from_millis(50);
/// How long the server may take to show a subscription change.
const SETTLED_WITHIN: Duration = Duration::from_secs(3);

fn wait_for(locker: &RedisLocker, key: &str) -> JoinHandle<(Lease, Instant)> {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move {
        let lease = locker
            .lock(&key, TTL, Duration::from_secs(10))
            .await
            .expect("the waiter acquires");
        (lease, Instant::now())
    })
}

/// A waiter that releases as soon as it acquires (so waiters of one key
/// never wait on each other's test bookkeeping).
fn wait_then_release(locker: &RedisLocker, key: &str) -> JoinHandle<()> {
    let waiter = wait_for(locker, key);
    tokio::spawn(async move {
        let (lease, _) = waiter.await.expect("waiter task");
        lease.release().await.expect("release by the waiter");
    })
}

fn subscriber_connections(server: &RedisServer) -> usize {
    server
        .cli(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscriber_connection_and_unsubscribe_when_done() {
    let server = RedisServer::start();
    let (holder, waiters) = (connect(&server).await, connect(&server).await);
    let keys = ["a", "b", "c"];
    let mut leases = Vec::new();
    for key in keys {
        leases.push(holder.try_lock(key, TTL).await.unwrap().unwrap());
    }
    // Three waiters on "a", one on each of the others.
    let mut tasks: Vec<_> = keys
        .iter()
        .map(|key| wait_then_release(&waiters, key))
        .collect();
    tasks.push(wait_then_release(&waiters, "a"));
    tasks.push(wait_then_release(&waiters, "a"));
    tokio::time::sleep(SETTLE).await;

    assert_eq!(
        subscriber_connections(&server),
        1,
        "one connection for five waiters"
    );
    let channel_a = waiters.release_channel("a");
    let numsub = server.cli(&["PUBSUB", "NUMSUB", &channel_a]);
    assert_eq!(
        numsub.lines().nth(1),
        Some("1"),
        "one subscription for three waiters: {numsub}"
    );
    assert_eq!(server.cli(&["PUBSUB", "NUMPAT"]), "0");

    for lease in leases {
        lease.release().await.unwrap();
    }
    for task in tasks {
        task.await.expect("every waiter acquires and releases");
    }
    eventually(SETTLED_WITHIN, "every channel is unsubscribed", || {
        server.cli(&["PUBSUB", "CHANNELS", "*"]).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_connection_ends_the_streams_and_the_next_waiter_reconnects() {
    let server = RedisServer::start();
    let (holder, waiters) = (connect(&server).await, connect(&server).await);
    let lease = holder.try_lock("k", TTL).await.unwrap().unwrap();
    let waiter = wait_for(&waiters, "k");
    tokio::time::sleep(SETTLE).await;
    server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    eventually(SETTLED_WITHIN, "the subscriber connection is gone", || {
        subscriber_connections(&server) == 0
    })
    .await;

    // Nobody hears this release: the waiter finds it by polling.
    lease.release().await.unwrap();
    let (lease, _) = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter acquires by polling")
        .unwrap();

    // The next waiter opens a new subscriber connection and is woken again.
    let next = wait_for(&waiters, "k");
    tokio::time::sleep(SETTLE).await;
    assert_eq!(subscriber_connections(&server), 1);
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let (next_lease, acquired_at) = next.await.unwrap();
    let latency = acquired_at - released_at;
    assert!(latency < PROMPT, "woken {latency:?} after the release");
    next_lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_server_restart_and_wake_ups_resume() {
    let mut server = RedisServer::start();
    let (holder, waiters) = (connect(&server).await, connect(&server).await);
    let _forgotten = holder.try_lock("k", TTL).await.unwrap().unwrap();
    let waiter = wait_for(&waiters, "k");
    tokio::time::sleep(SETTLE).await;

    // The restarted server has no lock (no persistence) and no subscriber:
    // the waiter's notifications end, and it acquires by polling.
    server.restart();
    let (lease, _) = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter acquires after the restart")
        .unwrap();

    let next = wait_for(&waiters, "k");
    tokio::time::sleep(SETTLE).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let (next_lease, acquired_at) = next.await.unwrap();
    let latency = acquired_at - released_at;
    assert!(latency < PROMPT, "woken {latency:?} after the release");
    next_lease.release().await.unwrap();
}

/// A locker connected through a fresh [`FaultProxy`] in front of `server`.
async fn connect_through_proxy(
    server: &RedisServer,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> (RedisLocker, FaultProxy) {
    let proxy = FaultProxy::start(server.port());
    let config = Config {
        connect_timeout,
        response_timeout,
        ..Config::from_url(&proxy.proxied_url(&server.url())).unwrap()
    };
    let locker = RedisLocker::from_config(config)
        .await
        .expect("connect through the proxy");
    (locker, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscriber_connection_is_found_dead_and_replaced() {
    let server = RedisServer::start();
    let response_timeout = Duration::from_millis(300);
    let (waiters, proxy) =
        connect_through_proxy(&server, Duration::from_secs(1), response_timeout).await;
    let holder = connect(&server).await;
    let mut watch = waiters
        .watch_releases("k")
        .await
        .unwrap()
        .expect("subscribed through the proxy");

    // A half-open connection: nothing comes back, nothing is reset.
    proxy.blackhole();
    let blackholed_at = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(3), watch.next())
        .await
        .expect("the silent subscriber connection is detected dead");
    let detected_after = blackholed_at.elapsed();
    assert!(!ended, "the stream ends rather than yielding a release");
    eprintln!("silent subscriber connection detected dead after {detected_after:?}");
    assert!(
        detected_after < 2 * response_timeout + Duration::from_millis(300),
        "detected after {detected_after:?}, PINGed every {response_timeout:?}"
    );

    // Reachable again: the next waiter subscribes on a new connection and
    // hears the next release (a stream yields only on a message).
    proxy.restore();
    let mut fresh = waiters
        .watch_releases("k")
        .await
        .unwrap()
        .expect("a new subscriber connection");
    let lease = holder.try_lock("k", TTL).await.unwrap().unwrap();
    lease.release().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(2), fresh.next())
        .await
        .expect("the release is published to the new subscriber connection");
    assert!(woke, "a release event, not the end of the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_subscriber_connect_holds_up_no_other_waiter_past_its_own_bound() {
    let server = RedisServer::start();
    let connect_timeout = Duration::from_secs(2);
    let (waiters, proxy) =
        connect_through_proxy(&server, connect_timeout, Duration::from_millis(300)).await;
    // No subscriber connection yet; every connect attempt now hangs.
    proxy.blackhole();
    let first = {
        let waiters = waiters.clone();
        tokio::spawn(async move { waiters.watch_releases("a").await })
    };
    tokio::time::sleep(connect_timeout / 2).await;
    let started = Instant::now();
    let second = waiters.watch_releases("b").await;
    let waited = started.elapsed();
    assert!(
        matches!(second, Ok(None)),
        "a waiter that cannot subscribe polls: {second:?}"
    );
    // Its own connect attempt is bounded by the connect timeout; it must not
    // also wait out the first waiter's attempt.
    assert!(
        waited < connect_timeout + Duration::from_millis(500),
        "the second waiter waited {waited:?} (connect timeout {connect_timeout:?})"
    );
    assert!(matches!(first.await.unwrap(), Ok(None)));
}
