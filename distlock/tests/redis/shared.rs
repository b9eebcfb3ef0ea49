//! Shared (reader) locks on Redis beyond the conformance checks
//! (`testkit/shared.rs`, which run on one server, a cluster and behind
//! Sentinel): the keys and values a shared hold writes, reader expiry,
//! fencing, how unlock and refresh tell a reader's token from a writer's,
//! release wake-ups both ways, loss at a restart, inspection and the
//! keepalive batch. Each test owns its redis-server.

use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::redis::RedisLocker;
use distlock::{Error, KeepAlive, Lease, Locker, LostReason, RefreshRequest};
use test_servers::{RedisOptions, RedisServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::connect;

const TTL: Duration = Duration::from_secs(30);
/// Long enough for a polling waiter to reach its largest delay (100–200 ms).
const SETTLE: Duration = Duration::from_millis(600);
/// A woken waiter acquires well within this; a polling one usually does not
/// (as in `wakeup.rs`).
const PROMPT: Duration = Duration::from_millis(50);

/// The server's clock (`TIME`) in milliseconds.
fn server_millis(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]);
    let mut parts = time.lines().map(|part| part.trim().parse::<u64>().unwrap());
    let (seconds, micros) = (parts.next().unwrap(), parts.next().unwrap());
    seconds * 1000 + micros / 1000
}

fn pttl(server: &RedisServer, redis_key: &str) -> i64 {
    server.cli(&["PTTL", redis_key]).parse().unwrap()
}

fn assert_not_held(result: distlock::Result<()>, what: &str) {
    match result {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("{what}: expected NotHeld, got {other:?}"),
    }
}

async fn shared(locker: &RedisLocker, key: &str, ttl: Duration) -> Lease {
    locker
        .try_lock_shared(key, ttl)
        .await
        .expect("try_lock_shared")
        .expect("no writer holds the key")
}

/// `locker.lock(key)` (exclusive, or shared) on a task of its own: the lease
/// and when it was granted.
fn wait_for(locker: &RedisLocker, key: &str, shared: bool) -> JoinHandle<(Lease, Instant)> {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move {
        let wait = Duration::from_secs(10);
        let lease = match shared {
            true => locker.lock_shared(&key, TTL, wait).await,
            false => locker.lock(&key, TTL, wait).await,
        };
        (lease.expect("the waiter gets the key"), Instant::now())
    })
}

#[tokio::test]
async fn the_keys_of_a_shared_hold_are_the_documented_ones() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    let reader = shared(&locker, "report", TTL).await;
    let now = server_millis(&server);
    assert_eq!(locker.readers_key("report"), "lock:{report}:readers");
    let owner = reader.owner();
    assert!(
        owner.len() == 39 && owner.starts_with("shared:"),
        "a reader's token: shared: and 32 hex digits, {owner:?}"
    );
    assert_eq!(server.cli(&["GET", "lock:{report}"]), "shared:readers");
    let score: f64 = server
        .cli(&["ZSCORE", "lock:{report}:readers", owner])
        .parse()
        .unwrap();
    let expiry = score as u64;
    assert!(
        expiry > now + 29_000 && expiry <= now + 30_000,
        "scored by its expiry on the server's clock: {expiry} at {now}"
    );
    for redis_key in ["lock:{report}", "lock:{report}:readers"] {
        let left = pttl(&server, redis_key);
        assert!(
            left > 29_000 && left <= 30_000,
            "{redis_key} expires with the reader: {left}"
        );
    }
    // A foreign client that locks with SET NX (redis-py's Lock) is kept out.
    assert_eq!(
        server.cli(&["SET", "lock:{report}", "x", "NX", "PX", "1000"]),
        ""
    );

    // A longer reader moves both expiries; its release moves them back.
    let longer = shared(&locker, "report", TTL * 2).await;
    assert!(pttl(&server, "lock:{report}") > 59_000);
    assert!(pttl(&server, "lock:{report}:readers") > 59_000);
    assert_eq!(server.cli(&["ZCARD", "lock:{report}:readers"]), "2");
    longer.release().await.expect("release the longer reader");
    let left = pttl(&server, "lock:{report}");
    assert!(
        left <= 30_000,
        "back to the remaining reader's expiry: {left}"
    );
    assert_eq!(
        locker
            .remaining_ttl("report")
            .await
            .unwrap()
            .map(|t| t <= TTL),
        Some(true)
    );

    // Readers read the fence counter, never write it.
    assert_eq!(reader.fencing_token(), Some(0));
    assert_eq!(server.cli(&["EXISTS", "lock:{report}:fence"]), "0");
    reader.release().await.expect("release the last reader");
    for redis_key in ["lock:{report}", "lock:{report}:readers"] {
        assert_eq!(server.cli(&["EXISTS", redis_key]), "0", "{redis_key}");
    }
}

#[tokio::test]
async fn a_readers_expiry_frees_a_waiting_writer_within_its_ttl() {
    let server = RedisServer::start();
    let (readers, writers) = (connect(&server).await, connect(&server).await);
    let reader_ttl = Duration::from_secs(1);
    let before = Instant::now();
    let reader = shared(&readers, "k", reader_ttl).await;
    let valid_until = reader.valid_until().expect("a Redis lease expires");
    // A reader that crashed: no release, no refresh.
    std::mem::forget(reader);
    let writer = writers
        .lock("k", TTL, Duration::from_secs(10))
        .await
        .expect("the writer gets the key once the reader expired");
    let waited = before.elapsed();
    assert!(
        Instant::now() >= valid_until,
        "not before the reader's lease could end"
    );
    // The writer polls (an expiry publishes nothing): its largest delay is
    // 200 ms, plus one round trip and this machine's noise.
    assert!(
        waited < reader_ttl + Duration::from_millis(700),
        "the writer got in {waited:?} after a {reader_ttl:?} reader was granted"
    );
    assert_eq!(server.cli(&["EXISTS", "lock:{k}:readers"]), "0");
    writer.release().await.unwrap();
}

/// A reader whose ttl ran out while another reader keeps the key: it holds
/// nothing (its refresh and unlock are NotHeld, and do not revive it), and
/// the key is free when the live reader leaves.
#[tokio::test]
async fn an_expired_reader_beside_a_live_one_is_not_revived() {
    let server = RedisServer::start();
    let (locker, other) = (connect(&server).await, connect(&server).await);
    let short = shared(&locker, "k", Duration::from_millis(300)).await;
    let short_owner = short.owner().to_owned();
    std::mem::forget(short);
    let long = shared(&locker, "k", TTL).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(other.try_lock("k", TTL).await.unwrap().is_none());
    assert_not_held(
        locker.refresh("k", &short_owner, TTL).await,
        "refresh of an expired reader",
    );
    assert_not_held(
        locker.unlock("k", &short_owner).await,
        "unlock of an expired reader",
    );
    assert_eq!(
        server.cli(&["ZRANGE", "lock:{k}:readers", "0", "-1"]),
        long.owner(),
        "only the live reader is left"
    );
    long.release().await.expect("release the live reader");
    let writer = other.try_lock("k", TTL).await.unwrap().expect("free");
    writer.release().await.unwrap();
}

/// A writer keeps readers out (try, and a wait that times out), and its
/// release wakes a waiting reader at once (the release's publish, not
/// polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_blocks_readers_and_its_release_wakes_them() {
    let server = RedisServer::start();
    let (locker, readers) = (connect(&server).await, connect(&server).await);
    let writer = locker.try_lock("k", TTL).await.unwrap().expect("free");
    assert!(readers.try_lock_shared("k", TTL).await.unwrap().is_none());
    match readers
        .lock_shared("k", TTL, Duration::from_millis(300))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a reader waiting on a writer times out, got {other:?}"),
    }
    assert_eq!(server.cli(&["EXISTS", "lock:{k}:readers"]), "0");
    let waiting = [wait_for(&readers, "k", true), wait_for(&readers, "k", true)];
    tokio::time::sleep(SETTLE).await;
    assert!(waiting.iter().all(|w| !w.is_finished()), "readers wait");
    let released = Instant::now();
    writer.release().await.expect("release the writer");
    for waiter in waiting {
        let (lease, at) = waiter.await.expect("reader task");
        let latency = at - released;
        assert!(latency < PROMPT, "woken {latency:?} after the release");
        lease.release().await.expect("release a reader");
    }
}

/// A writer waiting for two readers is not let in by the first release
/// (it publishes nothing), and is woken at once by the last one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_readers_release_wakes_a_waiting_writer() {
    let server = RedisServer::start();
    let (locker, writers) = (connect(&server).await, connect(&server).await);
    let first = shared(&locker, "k", TTL).await;
    let last = shared(&locker, "k", TTL).await;
    let writer = wait_for(&writers, "k", false);
    tokio::time::sleep(SETTLE).await;
    first.release().await.expect("release the first reader");
    tokio::time::sleep(SETTLE).await;
    assert!(!writer.is_finished(), "a reader still holds the key");
    let released = Instant::now();
    last.release().await.expect("release the last reader");
    let (lease, at) = writer.await.expect("writer task");
    let latency = at - released;
    assert!(latency < PROMPT, "woken {latency:?} after the last release");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_readers_fencing_token_is_the_last_writers() {
    let server = RedisServer::start();
    let (locker, other) = (connect(&server).await, connect(&server).await);
    for expected in 1..=3 {
        let writer = locker.try_lock("k", TTL).await.unwrap().unwrap();
        assert_eq!(writer.fencing_token(), Some(expected));
        writer.release().await.unwrap();
    }
    let first = shared(&locker, "k", TTL).await;
    let second = shared(&other, "k", TTL).await;
    assert_eq!(first.fencing_token(), Some(3), "the last writer's token");
    assert_eq!(second.fencing_token(), Some(3));
    assert_eq!(
        server.cli(&["GET", "lock:{k}:fence"]),
        "3",
        "readers do not advance the counter"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let next = other.try_lock("k", TTL).await.unwrap().unwrap();
    assert_eq!(next.fencing_token(), Some(4), "the next writer's is larger");
    next.release().await.unwrap();
}

/// unlock and refresh get only the owner token: a wrong one, whatever it
/// looks like (a reader's, a writer's, the marker the lock key holds, a
/// prefix of the reader's), is NotHeld and changes nothing.
#[tokio::test]
async fn a_readers_unlock_or_refresh_with_a_wrong_owner_is_not_held() {
    let server = RedisServer::start();
    let (locker, other) = (connect(&server).await, connect(&server).await);
    let reader = shared(&locker, "k", TTL).await;
    let truncated = &reader.owner()[..reader.owner().len() - 1];
    let forged_reader = format!("shared:{}", distlock::new_owner_token());
    let forged_writer = distlock::new_owner_token();
    for forged in [
        forged_reader.as_str(),
        forged_writer.as_str(),
        "shared:readers",
        "shared:",
        "",
        truncated,
    ] {
        assert_not_held(other.unlock("k", forged).await, forged);
        assert_not_held(other.refresh("k", forged, TTL * 2).await, forged);
    }
    assert_eq!(server.cli(&["GET", "lock:{k}"]), "shared:readers");
    assert_eq!(server.cli(&["ZCARD", "lock:{k}:readers"]), "1");
    assert!(pttl(&server, "lock:{k}") <= 30_000, "no forged refresh");
    assert!(other.try_lock("k", TTL).await.unwrap().is_none());
    other
        .refresh("k", reader.owner(), TTL * 2)
        .await
        .expect("the right token refreshes from any client");
    assert!(pttl(&server, "lock:{k}") > 59_000);
    other
        .unlock("k", reader.owner())
        .await
        .expect("the right token releases from any client");
    assert_eq!(server.cli(&["EXISTS", "lock:{k}"]), "0");
    assert!(matches!(reader.release().await, Err(Error::NotHeld { .. })));
}

/// A writer of another library whose token happens to start with the
/// reader prefix is still found by its token: the reader scripts act as
/// the exclusive ones when a writer holds the key.
#[tokio::test]
async fn a_writers_token_with_the_reader_prefix_is_still_found() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    server.cli(&["SET", "lock:{k}", "shared:foreign", "PX", "10000"]);
    assert!(locker.try_lock_shared("k", TTL).await.unwrap().is_none());
    locker
        .refresh("k", "shared:foreign", TTL)
        .await
        .expect("refreshed as a writer");
    assert!(pttl(&server, "lock:{k}") > 10_000);
    assert_not_held(locker.unlock("k", "shared:other").await, "another token");
    locker
        .unlock("k", "shared:foreign")
        .await
        .expect("released as a writer");
    assert_eq!(server.cli(&["EXISTS", "lock:{k}"]), "0");
}

#[tokio::test]
async fn a_shared_hold_is_inspected_listed_refused_to_forget_and_force_released() {
    let server = RedisServer::start();
    let (locker, operator) = (connect(&server).await, connect(&server).await);
    let writer = locker.try_lock("k", TTL).await.unwrap().unwrap();
    writer.release().await.unwrap();
    let first = shared(&locker, "k", TTL).await;
    let second = shared(&locker, "k", TTL * 2).await;
    let held = operator.inspect("k").await.unwrap().expect("held");
    assert!(held.shared, "{held:?}");
    assert_eq!(held.holder, None, "readers leave no record");
    assert_eq!(held.fencing_token, Some(1), "the token the readers carry");
    assert!(
        held.ttl_left.is_some_and(|left| left > TTL),
        "until the last reader's expiry: {held:?}"
    );
    let listed = operator.list("").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].shared && listed[0].key == "k", "{listed:?}");
    assert!(matches!(
        operator.forget("k").await,
        Err(Error::NotAcquired { .. })
    ));
    let evicted = operator
        .force_release("k", ForceRelease::Lock)
        .await
        .unwrap()
        .expect("held");
    assert!(evicted.shared, "{evicted:?}");
    for redis_key in ["lock:{k}", "lock:{k}:readers"] {
        assert_eq!(server.cli(&["EXISTS", redis_key]), "0", "{redis_key}");
    }
    let mut first = first;
    assert!(matches!(
        first.refresh(TTL).await,
        Err(Error::NotHeld { .. })
    ));
    let writer = operator.try_lock("k", TTL).await.unwrap().expect("free");
    assert_eq!(writer.fencing_token(), Some(2));
    writer.release().await.unwrap();
    drop(second);
}

/// The keepalive scheduler's batch carries readers and writers together:
/// each answers as its own refresh would.
#[tokio::test]
async fn the_keepalive_batch_refreshes_readers_and_writers_together() {
    let server = RedisServer::start();
    let locker = connect(&server).await;
    let writer = locker.try_lock("w", TTL).await.unwrap().unwrap();
    let first = shared(&locker, "r", TTL).await;
    let second = shared(&locker, "r", TTL).await;
    let forged = format!("shared:{}", distlock::new_owner_token());
    let long = TTL * 2;
    let answers = locker
        .refresh_many(&[
            RefreshRequest {
                key: "r",
                owner: first.owner(),
                ttl: long,
            },
            RefreshRequest {
                key: "w",
                owner: writer.owner(),
                ttl: long,
            },
            RefreshRequest {
                key: "r",
                owner: &forged,
                ttl: long,
            },
            RefreshRequest {
                key: "w",
                owner: second.owner(),
                ttl: long,
            },
            RefreshRequest {
                key: "r",
                owner: second.owner(),
                ttl: long,
            },
        ])
        .await;
    let held: Vec<bool> = answers.iter().map(Result::is_ok).collect();
    assert_eq!(held, [true, true, false, false, true], "{answers:?}");
    assert!(matches!(answers[2], Err(Error::NotHeld { .. })));
    assert!(pttl(&server, "lock:{w}") > 59_000);
    assert!(pttl(&server, "lock:{r}") > 59_000);
    let score: f64 = server
        .cli(&["ZSCORE", "lock:{r}:readers", first.owner()])
        .parse()
        .unwrap();
    assert!(score as u64 > server_millis(&server) + 59_000);
    for lease in [writer, first, second] {
        lease.release().await.unwrap();
    }
}

/// A restart without persistence forgets readers as it forgets writers: a
/// kept-alive reader's lost signal fires with NotHeld at its next refresh,
/// as the kept-alive writer's beside it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_fires_a_readers_lost_signal_as_a_writers() {
    let mut server = RedisServer::start();
    let locker = connect(&server).await;
    let ttl = Duration::from_secs(6);
    let mut reader = shared(&locker, "r", ttl).await;
    let mut writer = locker.try_lock("w", ttl).await.unwrap().unwrap();
    reader.keep_alive(KeepAlive::default()).unwrap();
    writer.keep_alive(KeepAlive::default()).unwrap();
    let (mut reader_lost, mut writer_lost) = (reader.lost_signal(), writer.lost_signal());

    server.restart();
    // Refreshed every ttl/3 = 2 s: the first refresh after the restart
    // finds nothing, well before the 6 s validity ends.
    let within = Duration::from_secs(5);
    let reader_reason = tokio::time::timeout(within, reader_lost.wait())
        .await
        .expect("the reader learns of the restart");
    let writer_reason = tokio::time::timeout(within, writer_lost.wait())
        .await
        .expect("the writer learns of the restart");
    assert_eq!(reader_reason, LostReason::NotHeld);
    assert_eq!(reader_reason, writer_reason);
    drop((reader, writer));
}

/// With `appendonly yes` readers survive a restart, as writers do: the
/// reader still refreshes and a writer is still kept out.
#[tokio::test]
async fn with_appendonly_a_restart_keeps_the_readers() {
    let mut server = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    });
    let locker = connect(&server).await;
    let mut reader = shared(&locker, "k", TTL).await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match reader.refresh(TTL).await {
            Ok(()) => break,
            Err(e) if e.is_outage() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the reader survives the restart: {e}"),
        }
    }
    assert!(locker.try_lock("k", TTL).await.unwrap().is_none());
    reader.release().await.expect("release after the restart");
    assert!(locker.try_lock("k", TTL).await.unwrap().is_some());
}
