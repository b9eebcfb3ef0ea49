//! The least ACL a lock user needs (`distlock::redis::ACL_RULES`, with the
//! key and channel patterns of the prefix), tested for real: such a user
//! can do everything the backend and Redlock do, and a user lacking any one
//! of the commands gets a clear "permission denied" error, never
//! contention.

use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::redis::{RedisLocker, ACL_RULES};
use distlock::redlock::RedlockLocker;
use distlock::{Error, Locker, MarkAdvance};
use test_servers::RedisServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// Creates `user` (password `pw`) on `server` with `rules`, limited to the
/// default prefix's keys and channels.
fn create_user(server: &RedisServer, user: &str, rules: &str) {
    let mut args = vec![
        "ACL", "SETUSER", user, "reset", "on", ">pw", "~lock:*", "&lock:*",
    ];
    args.extend(rules.split_whitespace());
    assert_eq!(server.cli(&args), "OK");
}

fn user_url(server: &RedisServer, user: &str) -> String {
    format!("redis://{user}:pw@127.0.0.1:{}", server.port())
}

#[tokio::test]
async fn the_minimal_user_can_do_everything_the_backend_does() {
    let server = RedisServer::start();
    create_user(&server, "lockuser", ACL_RULES);
    let locker = RedisLocker::from_url(&user_url(&server, "lockuser"))
        .await
        .expect("the minimal user connects");
    let other = RedisLocker::from_url(&user_url(&server, "lockuser"))
        .await
        .unwrap();
    let mut lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    assert!(other.try_lock("k", TTL).await.unwrap().is_none());
    lease.refresh(TTL).await.expect("refresh");
    assert!(locker.remaining_ttl("k").await.unwrap().is_some());
    // Inspection: the record the acquire script wrote (with TIME), read
    // back, listed (SCAN).
    let held = other.inspect("k").await.expect("inspect").expect("held");
    assert_eq!(held.holder.expect("recorded").pid, std::process::id());
    let listed = other.list("").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    // A waiter subscribes (SUBSCRIBE, and PING while it waits) and is woken
    // by the release's PUBLISH.
    let waiter = tokio::spawn(async move {
        let lease = other.lock("k", TTL, Duration::from_secs(5)).await;
        (lease, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let released_at = Instant::now();
    lease.release().await.expect("release");
    let (next, acquired_at) = waiter.await.unwrap();
    let woke = acquired_at - released_at;
    eprintln!("the minimal user's waiter acquired {woke:?} after the release");
    assert!(
        woke < Duration::from_millis(100),
        "woken, not polling: {woke:?}"
    );
    next.unwrap().release().await.unwrap();
    locker.forget("k").await.expect("forget");
    // Shared locks: the reader set (ZADD, ZREMRANGEBYSCORE, ZREVRANGE,
    // PEXPIREAT; ZSCORE and ZREM at refresh and release), inspected too.
    let mut reader = locker
        .try_lock_shared("s", TTL)
        .await
        .unwrap()
        .expect("free");
    let second = locker
        .try_lock_shared("s", TTL)
        .await
        .unwrap()
        .expect("readers beside readers");
    reader.refresh(TTL).await.expect("refresh a reader");
    assert!(locker.inspect("s").await.unwrap().expect("held").shared);
    reader.release().await.expect("release a reader");
    second.release().await.expect("release the last reader");
    assert_eq!(
        locker.advance_mark("k", 5).await.unwrap(),
        MarkAdvance::Advanced { previous: None }
    );
    // After the server forgets its scripts, SCRIPT LOAD brings them back.
    server.cli(&["SCRIPT", "FLUSH"]);
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    server.cli(&["SCRIPT", "FLUSH"]);
    assert!(locker.inspect("k").await.expect("inspect").is_some());
    server.cli(&["SCRIPT", "FLUSH"]);
    let evicted = locker
        .force_release("k", ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.fencing_token, lease.fencing_token());
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));

    // Redlock with the same user on three nodes (it also PINGs them).
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for node in &nodes {
        create_user(node, "lockuser", ACL_RULES);
    }
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let redlock = RedlockLocker::from_url(&format!("redlock://lockuser:pw@{}", hosts.join(",")))
        .await
        .expect("the minimal user on every node");
    let mut lease = redlock.try_lock("k", TTL).await.unwrap().expect("free");
    lease.refresh(TTL).await.unwrap();
    assert!(redlock.inspect("k").await.unwrap().is_some());
    assert_eq!(redlock.list("").await.unwrap().len(), 1);
    lease.release().await.unwrap();
    redlock.forget("k").await.unwrap();
}

#[tokio::test]
async fn a_user_lacking_one_command_gets_a_clear_error_not_contention() {
    let server = RedisServer::start();
    // Each command the scripts or the client send, taken away in turn.
    for (missing, operation) in [
        ("+evalsha", "acquire"),
        ("+set", "acquire"),
        ("+incr", "acquire"),
        ("+get", "release"),
        ("+del", "release"),
        ("+pexpire", "refresh"),
        ("+exists", "forget"),
        ("+pttl", "remaining_ttl"),
        ("+time", "inspect"),
        ("+scan", "list"),
        ("+zadd", "acquire_shared"),
        ("+pexpireat", "acquire_shared"),
    ] {
        // Whole rules only: `+pexpire` is a prefix of `+pexpireat`.
        let rules = ACL_RULES
            .split_whitespace()
            .filter(|rule| *rule != missing)
            .collect::<Vec<_>>()
            .join(" ");
        assert_ne!(rules, ACL_RULES, "{missing} is in ACL_RULES");
        let user = format!("no-{}", &missing[1..]);
        create_user(&server, &user, &rules);
        let locker = RedisLocker::from_url(&user_url(&server, &user))
            .await
            .expect("connecting needs none of them");
        let key = format!("k-{}", &missing[1..]);
        let result: distlock::Result<()> = match operation {
            "acquire" => match locker.try_lock(&key, TTL).await {
                Ok(None) => panic!("without {missing}: contention reported for a free key"),
                Ok(Some(_)) => panic!("without {missing}: acquired"),
                Err(error) => Err(error),
            },
            "acquire_shared" => match locker.try_lock_shared(&key, TTL).await {
                Ok(None) => panic!("without {missing}: contention reported for a free key"),
                Ok(Some(_)) => panic!("without {missing}: acquired shared"),
                Err(error) => Err(error),
            },
            "release" | "refresh" => {
                // Taken by an admin, as the user's lease would be.
                server.cli(&["SET", &format!("lock:{{{key}}}"), "tok", "PX", "10000"]);
                if operation == "release" {
                    locker.unlock(&key, "tok").await
                } else {
                    locker.refresh(&key, "tok", TTL).await
                }
            }
            "inspect" => {
                // A grant whose time the server has yet to write down
                // (`TIME` is read at the first refresh or inspection).
                let value = "tok\n10000\n\n42\nhost\nlabel";
                server.cli(&["SET", &format!("lock:{{{key}}}"), value, "PX", "10000"]);
                locker.inspect(&key).await.map(drop)
            }
            "forget" => locker.forget(&key).await,
            "list" => locker.list("").await.map(drop),
            _ => locker.remaining_ttl(&key).await.map(drop),
        };
        let error = result.expect_err(missing);
        let message = error.to_string();
        eprintln!("without {missing}: {message}");
        assert!(
            matches!(error, Error::Backend { .. }) && !error.is_contention(),
            "without {missing}: {message}"
        );
        assert!(
            message.contains("permission denied"),
            "without {missing}: {message}"
        );
        assert!(message.contains("+evalsha"), "names the rules: {message}");
        if operation == "acquire_shared" {
            // Refused before the marker is written: no writer is kept out.
            assert_eq!(
                server.cli(&["EXISTS", &format!("lock:{{{key}}}")]),
                "0",
                "without {missing}: no marker left behind"
            );
        }
        if missing == "+incr" {
            // SET ran before INCR was refused: undone by the owner token.
            let lock_key = format!("lock:{{{key}}}");
            crate::common::eventually(
                Duration::from_secs(3),
                "the half-run acquire undone",
                || server.cli(&["EXISTS", &lock_key]) == "0",
            )
            .await;
        }
    }

    // A key outside the user's pattern is refused the same way.
    create_user(&server, "jobs-only", ACL_RULES);
    let locker = RedisLocker::from_url(&format!("{}?prefix=jobs:", user_url(&server, "jobs-only")))
        .await
        .unwrap();
    let error = locker.try_lock("k", TTL).await.unwrap_err().to_string();
    assert!(error.contains("permission denied"), "{error}");

    // Redlock without PING: the nodes cannot be checked, a clear error.
    create_user(&server, "no-ping", &ACL_RULES.replace(" +ping", ""));
    let url = format!("redlock://no-ping:pw@127.0.0.1:{}", server.port());
    let error = RedlockLocker::from_url(&url).await.unwrap_err().to_string();
    assert!(error.contains("permission denied"), "{error}");
}
