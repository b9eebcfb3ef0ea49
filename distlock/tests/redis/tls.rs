//! TLS against real TLS-only redis-servers (`--tls-port`, certificates made
//! with `openssl` per test): a private CA from the URL (`?ca=`) or the
//! config, client certificates where the server requires them, a server
//! certificate for another name refused with a clear error, a wrong
//! password refused without printing it, and Redlock over TLS.

use std::time::Duration;

use distlock::redis::{Config, RedisLocker};
use distlock::redlock::RedlockLocker;
use distlock::{Error, Locker};
use test_servers::{RedisOptions, RedisServer, RedisTls, TestCertificates};

const TTL: Duration = Duration::from_secs(30);
const PASSWORD: &str = "tls-pass-0451";

fn tls_server(certs: &TestCertificates, cert: &str, require_client_cert: bool) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        tls: Some(RedisTls {
            cert: certs.cert(cert),
            key: certs.key(cert),
            ca: certs.ca(),
            require_client_cert,
            cli_client: Some((certs.cert("client"), certs.key("client"))),
        }),
        ..RedisOptions::default()
    })
}

async fn round_trip(locker: &dyn Locker, key: &str) {
    let lease = locker
        .try_lock(key, TTL)
        .await
        .expect("acquire over TLS")
        .expect("free");
    lease.release().await.expect("release over TLS");
}

// The failing connects below allow each attempt 3 s (`connect_timeout`), so
// that the call is bounded at 4.2 s: redis-rs retries a refused handshake
// like any connection failure (about 1.1 s for the four attempts here,
// more on a loaded machine), and a bound cut short would report a bare
// deadline instead of the certificate error these tests look for.

/// The error a connect attempt ends in, with its sources, as one string.
fn chain(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(" <- ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[tokio::test]
async fn rediss_with_a_private_ca_from_the_url_or_the_config() {
    let certs = TestCertificates::make();
    let server = tls_server(&certs, "server", false);
    // `url()` is rediss://127.0.0.1:PORT?ca=CA.
    let locker = RedisLocker::from_url(&server.url())
        .await
        .expect("TLS with ?ca=");
    round_trip(&locker, "k").await;
    let lease = locker.try_lock("seen", TTL).await.unwrap().unwrap();
    assert_eq!(
        crate::support::stored_owner(&server, "lock:{seen}"),
        lease.owner()
    );
    lease.release().await.unwrap();

    let config = Config {
        addresses: vec![format!("localhost:{}", server.port())],
        tls: true,
        tls_ca: Some(certs.ca()),
        ..Config::default()
    };
    round_trip(
        &RedisLocker::from_config(config).await.expect("by name"),
        "k",
    )
    .await;
    let json = format!(
        r#"{{"addresses": ["127.0.0.1:{}"], "tls": true, "tlsCa": "{}"}}"#,
        server.port(),
        certs.ca().display()
    );
    let from_json = RedisLocker::from_config(Config::from_json(&json).unwrap())
        .await
        .expect("tlsCa from JSON");
    round_trip(&from_json, "k").await;
    let through_connect = distlock::connect(&server.url()).await.expect("connect()");
    round_trip(&*through_connect, "k").await;

    // Without the private CA the system roots do not know the server.
    let url = format!("rediss://127.0.0.1:{}?connect_timeout=3s", server.port());
    let started = std::time::Instant::now();
    let err = RedisLocker::from_url(&url).await.unwrap_err();
    let text = chain(&err);
    eprintln!("without the CA, after {:?}: {text}", started.elapsed());
    assert!(err.is_outage(), "{text}");
    assert!(
        text.contains("certificate") || text.contains("Unknown"),
        "{text}"
    );
}

#[tokio::test]
async fn a_server_that_requires_client_certificates_gets_one() {
    let certs = TestCertificates::make();
    let server = tls_server(&certs, "server", true);
    let with_cert = format!(
        "{}&client_cert={}&client_key={}",
        server.url(),
        certs.cert("client").display(),
        certs.key("client").display()
    );
    let locker = RedisLocker::from_url(&with_cert)
        .await
        .expect("client certificate accepted");
    round_trip(&locker, "k").await;

    let without = format!("{}&connect_timeout=3s", server.url());
    let err = RedisLocker::from_url(&without).await.unwrap_err();
    eprintln!("without a client certificate: {}", chain(&err));
    assert!(err.is_outage() && !err.is_contention(), "{}", chain(&err));
    assert!(matches!(
        err,
        Error::Backend {
            operation: "connect",
            ..
        } | Error::DeadlineExceeded {
            operation: "connect",
            ..
        }
    ));

    // A certificate without its key is refused before connecting.
    let half = format!(
        "{}&client_cert={}",
        server.url(),
        certs.cert("client").display()
    );
    match RedisLocker::from_url(&half).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("without tls_client_key"), "{reason}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // So is a CA file that does not exist, naming it.
    let missing = format!(
        "rediss://127.0.0.1:{}?ca=/nonexistent/ca.pem",
        server.port()
    );
    match RedisLocker::from_url(&missing).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // And TLS files on a plain-text URL.
    let plain = format!(
        "redis://127.0.0.1:{}?ca={}",
        server.port(),
        certs.ca().display()
    );
    assert!(matches!(
        RedisLocker::from_url(&plain).await,
        Err(Error::InvalidInput { .. })
    ));
}

#[tokio::test]
async fn a_certificate_for_another_name_is_a_clear_error() {
    let certs = TestCertificates::make();
    let server = tls_server(&certs, "wrong-name", false);
    let url = format!("{}&connect_timeout=3s", server.url());
    let err = RedisLocker::from_url(&url).await.unwrap_err();
    let text = chain(&err);
    eprintln!("wrong name: {text}");
    assert!(
        matches!(
            err,
            Error::Backend {
                operation: "connect",
                ..
            }
        ),
        "a clear connect error, not a timeout: {text}"
    );
    assert!(
        text.contains("certificate") && text.contains("127.0.0.1"),
        "says the certificate does not match the address: {text}"
    );
}

#[tokio::test]
async fn a_wrong_password_over_tls_is_a_clear_error_without_the_password() {
    let certs = TestCertificates::make();
    let server = RedisServer::start_with(RedisOptions {
        password: Some(PASSWORD.into()),
        tls: Some(RedisTls {
            cert: certs.cert("server"),
            key: certs.key("server"),
            ca: certs.ca(),
            require_client_cert: false,
            cli_client: None,
        }),
        ..RedisOptions::default()
    });
    let right = RedisLocker::from_url(&server.url())
        .await
        .expect("right password");
    round_trip(&right, "k").await;
    let wrong = format!(
        "rediss://:not-{PASSWORD}@127.0.0.1:{}?ca={}",
        server.port(),
        certs.ca().display()
    );
    let err = RedisLocker::from_url(&wrong).await.unwrap_err();
    let text = chain(&err);
    assert!(text.contains("authentication failed"), "{text}");
    assert!(!text.contains(PASSWORD), "leaks the password: {text}");
    assert!(
        !format!("{err:?}").contains(PASSWORD),
        "Debug leaks the password"
    );
}

#[tokio::test]
async fn redlock_over_tls() {
    let certs = TestCertificates::make();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| tls_server(&certs, "server", false))
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!(
        "redlock://{}?tls=true&ca={}",
        hosts.join(","),
        certs.ca().display()
    );
    let locker = RedlockLocker::from_url(&url)
        .await
        .expect("three TLS nodes");
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    // The grant returns with the majority; the last node follows.
    let owner = lease.owner().to_owned();
    crate::common::eventually(Duration::from_secs(2), "every node holds the lock", || {
        servers
            .iter()
            .all(|s| crate::support::stored_owner(s, "lock:{k}") == owner)
    })
    .await;
    lease.release().await.unwrap();
}
