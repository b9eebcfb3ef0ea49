//! The holder record in a Redis lock's value (`owner \n ttl \n granted \n
//! pid \n host \n label`), beyond what the conformance suite checks: the
//! grant time is the server's and survives refreshes, a refresh with a new
//! ttl records it, a value in another format is an unknown holder,
//! `holder=false` stores the bare owner token, `fencing=off` writes no
//! counter and gives no token, and listing escapes glob characters.

use std::time::{Duration, SystemTime};

use distlock::redis::RedisLocker;
use distlock::Locker;
use test_servers::RedisServer;

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cli(&["PTTL", key])
        .parse()
        .expect("PTTL is a number")
}

/// The line `index` (0-based) of the lock key's value.
fn value_line(server: &RedisServer, redis_key: &str, index: usize) -> String {
    let value = server.cli(&["GET", redis_key]);
    value.split('\n').nth(index).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_grant_time_is_the_servers_and_survives_refreshes() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    let before = SystemTime::now() - Duration::from_secs(1);
    let mut lease = locker
        .try_lock("job", Duration::from_secs(10))
        .await
        .expect("try_lock")
        .expect("free");
    let after = SystemTime::now() + Duration::from_secs(1);
    let lock_key = "lock:{job}";
    assert_eq!(
        value_line(&server, lock_key, 2),
        "",
        "the acquire leaves the grant time to the key's expiry"
    );
    let first = locker.inspect("job").await.expect("inspect").expect("held");
    let granted = first.granted.expect("a grant time").at;
    // The test server runs on this host, so its clock is this clock.
    assert!(before <= granted && granted <= after, "{granted:?}");
    assert_eq!(first.ttl, Some(Duration::from_secs(10)));

    tokio::time::sleep(Duration::from_millis(50)).await;
    lease
        .refresh(Duration::from_secs(60))
        .await
        .expect("refresh");
    assert_ne!(
        value_line(&server, lock_key, 2),
        "",
        "the first re-arming writes the grant time down"
    );
    assert!(pttl(&server, lock_key) > 58_000);
    let refreshed = locker.inspect("job").await.expect("inspect").expect("held");
    assert_eq!(refreshed.ttl, Some(Duration::from_secs(60)), "the new ttl");
    assert_eq!(refreshed.granted, first.granted, "still the grant's time");
    assert_eq!(refreshed.holder, first.holder);
    assert_eq!(refreshed.fencing_token, lease.fencing_token());

    // Same ttl again: the expiry moves, nothing else.
    let value = server.cli(&["GET", lock_key]);
    lease
        .refresh(Duration::from_secs(60))
        .await
        .expect("refresh");
    assert_eq!(server.cli(&["GET", lock_key]), value);
    lease.release().await.expect("release");
    assert_eq!(server.cli(&["EXISTS", lock_key]), "0");
}

#[tokio::test]
async fn a_value_in_another_format_is_an_unknown_holder() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    for foreign in [
        "foreign-token",
        "foreign\ntoken",
        "a\nb\nc\nnot a pid\nh\nl",
    ] {
        server.cli(&["SET", "lock:{job}", foreign, "PX", "30000"]);
        let held = locker.inspect("job").await.expect("inspect").expect("held");
        assert_eq!(held.holder, None, "{foreign:?}: {held:?}");
        assert_eq!(
            (held.granted, held.ttl, held.fencing_token),
            (None, None, None)
        );
        assert!(held.ttl_left.is_some());
        assert!(
            locker.unlock("job", "another-token").await.is_err(),
            "another token does not release it"
        );
    }
}

#[tokio::test]
async fn fencing_off_writes_no_counter_gives_no_token_and_leaves_fenced_tokens_rising() {
    let server = RedisServer::start();
    let fenced = RedisLocker::from_url(&server.url()).await.expect("connect");
    let unfenced = RedisLocker::from_url(&format!("{}?fencing=off", server.url()))
        .await
        .expect("connect");
    assert!(fenced.capabilities().fencing);
    assert!(!unfenced.capabilities().fencing);
    let ttl = Duration::from_secs(30);

    let lease = unfenced
        .try_lock("job", ttl)
        .await
        .expect("try_lock")
        .expect("free");
    assert_eq!(lease.fencing_token(), None);
    assert_eq!(server.cli(&["EXISTS", "lock:{job}:fence"]), "0");
    // Still a lock: the fenced locker is kept out, and inspection reports
    // the holder with no token.
    assert!(fenced
        .try_lock("job", ttl)
        .await
        .expect("try_lock")
        .is_none());
    let held = unfenced
        .inspect("job")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(held.fencing_token, None);
    assert!(held.holder.is_some());
    lease.release().await.expect("release");

    let first = fenced
        .try_lock("job", ttl)
        .await
        .expect("try_lock")
        .expect("free");
    assert_eq!(first.fencing_token(), Some(1));
    first.release().await.expect("release");
    // A grant without fencing between two fenced ones leaves the counter
    // alone, and its inspection does not pass the counter off as its token.
    let between = unfenced
        .try_lock("job", ttl)
        .await
        .expect("try_lock")
        .expect("free");
    assert_eq!(server.cli(&["GET", "lock:{job}:fence"]), "1");
    let held = unfenced
        .inspect("job")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(held.fencing_token, None);
    between.release().await.expect("release");
    let second = fenced
        .try_lock("job", ttl)
        .await
        .expect("try_lock")
        .expect("free");
    assert_eq!(second.fencing_token(), Some(2));
    second.release().await.expect("release");

    // One attempt over several keys (a semaphore's permits) grants the
    // first free one, as with fencing.
    let taken = unfenced
        .try_lock("p1", ttl)
        .await
        .expect("try_lock")
        .expect("free");
    let keys = ["p1", "p2", "p3"].map(String::from);
    let any = unfenced
        .try_lock_any(&keys, ttl)
        .await
        .expect("try_lock_any")
        .expect("p2 free");
    assert_eq!((any.key(), any.fencing_token()), ("p2", None));
    assert_eq!(server.cli(&["EXISTS", "lock:{p2}:fence"]), "0");
    any.release().await.expect("release");
    taken.release().await.expect("release");
}

#[tokio::test]
async fn holder_false_stores_the_bare_owner_token_and_inspects_as_an_unknown_holder() {
    let server = RedisServer::start();
    let locker = RedisLocker::from_url(&format!("{}?holder=false", server.url()))
        .await
        .expect("connect");
    let mut lease = locker
        .try_lock("job", Duration::from_secs(30))
        .await
        .expect("try_lock")
        .expect("free");
    assert!(lease.fencing_token().is_some(), "fencing is unchanged");
    assert_eq!(server.cli(&["GET", "lock:{job}"]), lease.owner());
    let held = locker.inspect("job").await.expect("inspect").expect("held");
    assert_eq!((held.holder, held.granted), (None, None));
    assert!(held.ttl_left.is_some());
    lease
        .refresh(Duration::from_secs(60))
        .await
        .expect("refresh");
    assert_eq!(server.cli(&["GET", "lock:{job}"]), lease.owner());
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
