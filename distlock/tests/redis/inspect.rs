//! The holder record beside a Redis lock (`<prefix>{<key>}:holder`), beyond
//! what the conformance suite checks: it expires with the lock and follows
//! its refreshes, a record left by an earlier grant never describes a later
//! one, `holder=false` records nothing, and listing escapes glob characters.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::Locker;
use test_servers::RedisServer;

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cli(&["PTTL", key])
        .parse()
        .expect("PTTL is a number")
}

#[tokio::test]
async fn the_record_expires_with_the_lock_and_follows_its_refreshes() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    let mut lease = locker
        .try_lock("job", Duration::from_secs(10))
        .await
        .expect("try_lock")
        .expect("free");
    let (lock_key, holder_key) = ("lock:{job}", "lock:{job}:holder");
    let record_left = pttl(&server, holder_key);
    assert!(
        record_left > 8_000 && record_left <= 10_000,
        "{record_left} ms"
    );
    lease
        .refresh(Duration::from_secs(60))
        .await
        .expect("refresh");
    let (lock_left, record_left) = (pttl(&server, lock_key), pttl(&server, holder_key));
    assert!(lock_left > 58_000, "{lock_left} ms");
    assert!(
        (lock_left - record_left).abs() < 1_000,
        "the record expires with the lock: {lock_left} vs {record_left} ms"
    );
    let held = locker.inspect("job").await.expect("inspect").expect("held");
    assert_eq!(held.ttl, Some(Duration::from_secs(60)), "the refreshed ttl");
    lease.release().await.expect("release");
    assert_eq!(
        server.cli(&["EXISTS", holder_key]),
        "0",
        "deleted with the lock"
    );
}

#[tokio::test]
async fn a_record_left_by_an_earlier_grant_never_describes_a_later_one() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    let lease = locker
        .try_lock("job", Duration::from_secs(30))
        .await
        .expect("try_lock")
        .expect("free");
    // A foreign client deletes the lock (leaving the record) and takes it.
    server.cli(&["DEL", "lock:{job}"]);
    server.cli(&["SET", "lock:{job}", "foreign-token", "PX", "30000"]);
    assert_eq!(server.cli(&["EXISTS", "lock:{job}:holder"]), "1");
    let held = locker.inspect("job").await.expect("inspect").expect("held");
    assert_eq!(held.holder, None, "the foreign holder is unknown: {held:?}");
    assert_eq!(held.fencing_token, None);
    drop(lease);
}

#[tokio::test]
async fn holder_false_records_nothing_and_inspects_as_an_unknown_holder() {
    let server = RedisServer::start();
    let locker = RedisLocker::from_url(&format!("{}?holder=false", server.url()))
        .await
        .expect("connect");
    let lease = locker
        .try_lock("job", Duration::from_secs(30))
        .await
        .expect("try_lock")
        .expect("free");
    assert!(lease.fencing_token().is_some(), "fencing is unchanged");
    assert_eq!(server.cli(&["EXISTS", "lock:{job}:holder"]), "0");
    let held = locker.inspect("job").await.expect("inspect").expect("held");
    assert_eq!((held.holder, held.granted), (None, None));
    assert!(held.ttl_left.is_some());
    lease.release().await.expect("release");
}

#[tokio::test]
async fn listing_escapes_glob_characters_of_the_prefix_and_skips_companion_keys() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    let ttl = Duration::from_secs(30);
    let mut leases = Vec::new();
    for key in ["a*b/1", "axb/1", "a*b", "[a]/1", "a/1"] {
        leases.push(
            locker
                .try_lock(key, ttl)
                .await
                .expect("try_lock")
                .expect("free"),
        );
    }
    // Companion keys and marks of the same names exist too.
    locker.advance_mark("a*b/1", 3).await.expect("mark");
    let keys = |listed: Vec<distlock::inspect::HeldLock>| -> Vec<String> {
        listed.into_iter().map(|held| held.key).collect()
    };
    assert_eq!(keys(locker.list("a*b/").await.expect("list")), ["a*b/1"]);
    assert_eq!(keys(locker.list("[a]").await.expect("list")), ["[a]/1"]);
    assert_eq!(
        keys(locker.list("").await.expect("list")),
        ["[a]/1", "a*b", "a*b/1", "a/1", "axb/1"]
    );
    for lease in leases {
        lease.release().await.expect("release");
    }
    assert!(locker.list("").await.expect("list").is_empty());
}
