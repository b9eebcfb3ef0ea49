//! Configuring and authenticating the Redis backend against real servers:
//! passwords, ACL users, key prefixes from JSON/YAML/env, TLS.

use std::time::Duration;

use distlock::redis::{Config, RedisLocker};
use distlock::{Error, Locker};
use test_servers::{RedisOptions, RedisServer};

const TTL: Duration = Duration::from_secs(30);
const PASSWORD: &str = "correct-horse-battery";

fn protected_server() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        password: Some(PASSWORD.into()),
        ..RedisOptions::default()
    })
}

fn address(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port())
}

async fn round_trip(locker: &RedisLocker, key: &str) {
    let lease = locker
        .try_lock(key, TTL)
        .await
        .expect("acquire")
        .expect("free");
    lease.release().await.expect("release");
}

#[tokio::test]
async fn a_wrong_password_is_one_clear_authentication_error() {
    let server = protected_server();
    let url = format!("redis://:wrong-guess-42@{}", address(&server));
    let err = RedisLocker::from_url(&url)
        .await
        .expect_err("the password is wrong");
    let message = err.to_string();
    assert!(
        matches!(
            err,
            Error::Backend {
                operation: "connect",
                ..
            }
        ),
        "{message}"
    );
    assert!(message.contains("authentication failed"), "{message}");
    assert!(
        !message.contains("wrong-guess-42"),
        "leaks the password: {message}"
    );

    let anonymous = format!("redis://{}", address(&server));
    let message = RedisLocker::from_url(&anonymous)
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("authentication failed"), "{message}");

    let right = RedisLocker::from_url(&server.url())
        .await
        .expect("right password");
    round_trip(&right, "k").await;
}

#[tokio::test]
async fn acl_users_lock_and_a_user_without_channel_access_still_works() {
    let server = protected_server();
    server.cli(&[
        "ACL", "SETUSER", "app", "on", ">app-pw", "~lock:*", "&*", "+@all",
    ]);
    // No pub/sub channels: the release's PUBLISH fails inside the script, and
    // SUBSCRIBE is refused.
    server.cli(&[
        "ACL",
        "SETUSER",
        "quiet",
        "on",
        ">quiet-pw",
        "~lock:*",
        "resetchannels",
        "+@all",
    ]);
    let port = server.port();

    let app = RedisLocker::from_url(&format!("redis://app:app-pw@127.0.0.1:{port}"))
        .await
        .expect("ACL user app");
    round_trip(&app, "k").await;

    let quiet = RedisLocker::from_url(&format!("redis://quiet:quiet-pw@127.0.0.1:{port}"))
        .await
        .expect("ACL user quiet");
    let lease = quiet.try_lock("q", TTL).await.unwrap().unwrap();
    let waiter = {
        let quiet = quiet.clone();
        tokio::spawn(async move { quiet.lock("q", TTL, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease
        .release()
        .await
        .expect("release without permission to publish");
    let next = waiter
        .await
        .unwrap()
        .expect("the waiter acquires by polling");
    next.release().await.unwrap();

    let err = RedisLocker::from_url(&format!("redis://app:nope@127.0.0.1:{port}"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("authentication failed") && err.contains("app@"),
        "{err}"
    );
}

#[tokio::test]
async fn json_yaml_and_env_configs_connect_with_their_prefix() {
    let server = protected_server();
    let json = format!(
        r#"{{"addresses": ["{}"], "password": "{PASSWORD}", "keyPrefix": "json:"}}"#,
        address(&server)
    );
    let yaml = format!(
        "addresses: ['{}']\npassword: {PASSWORD}\nkey_prefix: 'yaml:'\nresponseTimeout: 1s\n",
        address(&server)
    );
    let env = [
        ("DISTLOCK_REDIS_ADDRESSES".to_owned(), address(&server)),
        ("DISTLOCK_REDIS_PASSWORD".to_owned(), PASSWORD.to_owned()),
        ("DISTLOCK_REDIS_KEY_PREFIX".to_owned(), "env:".to_owned()),
    ];
    let configs = [
        ("json:", Config::from_json(&json).unwrap()),
        ("yaml:", Config::from_yaml(&yaml).unwrap()),
        ("env:", Config::from_env_vars(env).unwrap()),
    ];
    for (prefix, config) in configs {
        let locker = RedisLocker::from_config(config).await.expect(prefix);
        assert_eq!(locker.key_prefix(), prefix);
        let lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
        let stored = format!("{prefix}{{k}}");
        assert_eq!(
            crate::support::stored_owner(&server, &stored),
            lease.owner()
        );
        lease.release().await.unwrap();
    }
}

#[tokio::test]
async fn debug_output_and_errors_never_show_the_password() {
    let server = protected_server();
    let locker = RedisLocker::from_url(&server.url()).await.unwrap();
    let debug = format!("{locker:?}");
    assert!(!debug.contains(PASSWORD), "{debug}");
    assert!(debug.contains(&address(&server)), "{debug}");

    let dead_port = test_servers::free_port();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{dead_port}");
    let err = RedisLocker::from_url(&url).await.unwrap_err().to_string();
    assert!(!err.contains(PASSWORD), "{err}");
    assert!(err.contains(&dead_port.to_string()), "{err}");
}

#[tokio::test]
async fn more_than_one_address_is_refused_before_connecting() {
    let config = Config {
        addresses: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        ..Config::default()
    };
    match RedisLocker::from_config(config).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("single node"), "{reason}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[tokio::test]
async fn rediss_uses_rustls_and_fails_cleanly_against_a_plain_server() {
    // The handshake is attempted (one crypto provider is linked, so rustls
    // picks it rather than panicking) and fails as an outage: the plain
    // server never completes it, so the attempts time out, or the connect
    // is abandoned at the locker's operation bound.
    let server = RedisServer::start();
    let url = format!("rediss://{}?connect_timeout=500ms", address(&server));
    match RedisLocker::from_url(&url).await {
        Err(Error::Backend {
            operation: "connect",
            ..
        })
        | Err(Error::DeadlineExceeded {
            operation: "connect",
            ..
        }) => {}
        other => panic!("TLS to a plain-text server must fail to connect, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_by_url_gives_a_redis_locker() {
    let server = RedisServer::start();
    let locker = distlock::connect(&format!("{}/3?prefix=app:", server.url()))
        .await
        .unwrap();
    assert_eq!(locker.backend(), "redis");
    let lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "app:{k}"]), "1");
    lease.release().await.unwrap();
}
