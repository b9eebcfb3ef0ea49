//! The circuit breaker over a real Redis that dies and comes back: transport
//! errors, then `Unavailable` once the circuit opens — never contention — and
//! the circuit closes once the server is back.

use std::time::Duration;

use distlock::{BreakerConfig, BreakerLocker, BreakerState, Error, Locker};
use test_servers::RedisServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_outage_opens_the_circuit_and_recovery_closes_it() {
    let mut server = RedisServer::start();
    let backend = distlock::connect(&format!(
        "{}?connect_timeout=200ms&response_timeout=200ms",
        server.url()
    ))
    .await
    .expect("connect");
    let open_for = Duration::from_millis(500);
    let breaker = BreakerLocker::new(
        backend,
        BreakerConfig::default()
            .failure_threshold(3)
            .open_for(open_for),
    );

    let lease = breaker.try_lock("k", TTL).await.unwrap().expect("free");
    lease.release().await.unwrap();

    server.kill();
    for attempt in 0..3 {
        match breaker.try_lock("k", TTL).await {
            Err(error @ Error::Backend { .. }) => assert!(error.is_outage()),
            other => panic!(
                "attempt {attempt} with the server down: expected a transport error, got {other:?}"
            ),
        }
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let started = Instant::now();
    match breaker.try_lock("k", TTL).await {
        Err(Error::Unavailable {
            backend: "redis",
            reason,
        }) => assert!(reason.contains("circuit open"), "{reason}"),
        other => panic!("with the circuit open: expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "an open circuit fails fast"
    );
    assert!(matches!(
        breaker.lock("k", TTL, Duration::from_secs(1)).await,
        Err(Error::Unavailable { .. })
    ));

    server.restart();
    tokio::time::sleep(open_for).await;
    // The half-open probe may meet the reconnecting client once; within a few
    // probes the circuit must close and the lock be granted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        match breaker.try_lock("k", TTL).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("a restarted server without persistence holds no lock"),
            Err(error) => {
                assert!(error.is_outage(), "{error}");
                assert!(Instant::now() < deadline, "no recovery within 10s: {error}");
                tokio::time::sleep(open_for).await;
            }
        }
    };
    assert_eq!(breaker.state(), BreakerState::Closed);
    lease.release().await.unwrap();
}
