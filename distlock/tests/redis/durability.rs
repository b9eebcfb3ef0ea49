//! What a restart or a failover can forget: the locker reads the server's
//! persistence (`appendonly`, `appendfsync`, `save`) and replicas when it is
//! built, says what that means for marks and fencing tokens
//! ([`Locker::durability_warnings`], logged once at the first mark write),
//! and refuses a server that does not persist under `require_appendonly`.

use distlock::redis::RedisLocker;
use distlock::{Error, Locker, LockerExt, MarkAdvance};
use test_servers::{RedisOptions, RedisServer};

use crate::support::Warnings;

const NOT_PERSISTED: &str = "appendonly is no (read with CONFIG GET) and takes no RDB snapshots \
                             (save \"\"): a restart forgets which cron ticks ran (a finished tick \
                             can run again) and resets fencing tokens to 1";

fn persisting_server() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    })
}

#[tokio::test]
async fn a_server_without_appendonly_is_named_in_the_durability_warnings() {
    let server = RedisServer::start();
    let locker = distlock::connect(&server.url())
        .await
        .expect("accepted by default")
        .with_tracing()
        .shared();
    let warnings = locker.durability_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(&format!("redis://127.0.0.1:{}/0: ", server.port())),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains(NOT_PERSISTED), "{}", warnings[0]);
    assert!(
        warnings[0].contains("Set `appendonly yes`"),
        "{}",
        warnings[0]
    );

    // With RDB snapshots only, a restart rolls back to the last one.
    server.cli(&["CONFIG", "SET", "save", "3600 1"]);
    let snapshots = RedisLocker::from_url(&server.url()).await.unwrap();
    let warnings = snapshots.durability_warnings();
    assert!(
        warnings[0].contains("its RDB snapshots (save \"3600 1\") roll a restart back"),
        "{warnings:?}"
    );

    let durable = persisting_server();
    let locker = RedisLocker::from_url(&durable.url()).await.unwrap();
    assert_eq!(locker.server_facts()[0].appendonly, Some(true));
    assert_eq!(locker.durability_warnings(), Vec::<String>::new());
}

#[tokio::test]
async fn the_first_mark_write_logs_the_warning_once() {
    let server = RedisServer::start();
    let (warnings, _guard) = Warnings::capture();
    let locker = RedisLocker::from_url(&server.url()).await.unwrap();
    assert!(warnings.all().is_empty(), "nothing before marks are used");
    for tick in 1..=3 {
        assert!(matches!(
            locker.advance_mark("cron:job", tick).await.unwrap(),
            MarkAdvance::Advanced { .. }
        ));
    }
    let logged = warnings.containing(NOT_PERSISTED);
    assert_eq!(logged.len(), 1, "{:?}", warnings.all());

    // A caller that asked for the warnings (as `distlock cron` does at
    // start) showed them already: the mark path does not repeat them.
    let asked = RedisLocker::from_url(&server.url()).await.unwrap();
    assert_eq!(asked.durability_warnings().len(), 1);
    asked.advance_mark("cron:other", 1).await.unwrap();
    assert_eq!(warnings.containing(NOT_PERSISTED).len(), 1);

    let durable = persisting_server();
    let locker = RedisLocker::from_url(&durable.url()).await.unwrap();
    locker.advance_mark("cron:job", 1).await.unwrap();
    assert_eq!(
        warnings.containing("appendonly").len(),
        1,
        "{:?}",
        warnings.all()
    );
}

#[tokio::test]
async fn require_appendonly_refuses_a_server_that_does_not_persist() {
    let server = RedisServer::start();
    let strict = format!("{}?require_appendonly=true", server.url());
    let err = RedisLocker::from_url(&strict).await.unwrap_err();
    let Error::InvalidInput {
        what: "server configuration",
        reason,
    } = err
    else {
        panic!("not a server-configuration refusal: {err:?}");
    };
    assert!(
        reason.contains("appendonly is no and require_appendonly is set")
            && reason.contains("CONFIG SET appendonly yes"),
        "{reason}"
    );
    let durable = persisting_server();
    let strict = format!("{}?require_appendonly=true", durable.url());
    RedisLocker::from_url(&strict)
        .await
        .expect("a persisting server is accepted");
}
