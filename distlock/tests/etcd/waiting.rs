//! How a wait in the queue ends when etcd failed during it: a failure the
//! wait recovered from leaves a plain timeout a timeout (75, not counted by
//! a breaker); a failure still current at the deadline is an outage.

use std::time::{Duration, Instant};

use distlock::etcd::EtcdLocker;
use distlock::{BreakerConfig, Error, Locker, LockerExt};
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(5);

/// A waiter whose requests and keep-alive pings give up after 500 ms, so a
/// frozen server breaks its watch well within the wait.
async fn impatient(server: &EtcdServer) -> EtcdLocker {
    EtcdLocker::from_url(&format!(
        "{}?request_timeout=500ms&keepalive_timeout=500ms",
        server.url()
    ))
    .await
    .expect("connect to the test etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_recovered_from_a_frozen_server_times_out_as_a_timeout() {
    let server = EtcdServer::start();
    let holder = EtcdLocker::from_url(&server.url()).await.expect("connect");
    let held = holder.try_lock("k", TTL).await.expect("try").expect("free");
    let waiter = impatient(&server).await;
    let breaker = waiter.clone().with_circuit_breaker(
        BreakerConfig::default()
            .failure_threshold(1)
            .open_for(Duration::from_secs(60)),
    );
    let started = Instant::now();
    let waiting = tokio::spawn({
        let breaker = breaker.clone();
        async move { breaker.lock("k", TTL, WAIT).await }
    });
    // Frozen for 1.5 s early in the wait: the watch breaks, and is
    // re-established (the key ahead read again) once etcd answers.
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.pause();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.resume();
    let ended = waiting.await.expect("join");
    eprintln!("the wait ended after {:?}: {ended:?}", started.elapsed());
    match ended {
        // The breaker passes on what is left of the wait after its check.
        Err(Error::Timeout { key, waited }) => {
            assert_eq!(key, "k");
            assert!(
                waited <= WAIT && waited > WAIT - Duration::from_millis(100),
                "{waited:?}"
            );
        }
        other => panic!("a healthy server at the deadline: a timeout, not {other:?}"),
    }
    // The breaker did not count it as an outage.
    let other = breaker
        .try_lock("other", TTL)
        .await
        .expect("the breaker is closed")
        .expect("free");
    other.release().await.expect("release");
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_server_is_still_frozen_at_the_deadline_is_an_outage() {
    let server = EtcdServer::start();
    let holder = EtcdLocker::from_url(&server.url()).await.expect("connect");
    let held = holder.try_lock("k", TTL).await.expect("try").expect("free");
    let waiter = impatient(&server).await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("k", TTL, Duration::from_secs(3)).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.pause();
    let ended = waiting.await.expect("join");
    server.resume();
    let error = ended.expect_err("nothing can be granted by a frozen server");
    assert!(
        error.is_outage() && !matches!(error, Error::Timeout { .. }),
        "{error:?}"
    );
    held.release().await.expect("release");
}
