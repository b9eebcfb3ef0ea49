//! `refresh_many` as multi reads (issue 27): a batch answers exactly the
//! leases whose node is gone or replaced as NotHeld, and costs one request
//! per chunk, counted by the server (`zk_packets_received` in `mntr`: the
//! packets it read from clients, the `mntr` asking included).

use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::zookeeper::ZooKeeperLocker;
use distlock::{Error, Lease, Locker, LostReason, RefreshRequest};
use test_servers::ZooKeeperServer;

const TTL: Duration = Duration::from_secs(30);

/// A locker with the longest session timeout the test server accepts, so
/// its watchdog (every fifth of it) and zookeeper-client's pings (after a
/// third of it idle) rarely fall inside a measurement, and every lock on
/// one session, so a batch's requests are counted per chunk alone.
async fn locker(server: &ZooKeeperServer) -> ZooKeeperLocker {
    locker_with(server, 1).await
}

pub(crate) async fn locker_with(server: &ZooKeeperServer, sessions: usize) -> ZooKeeperLocker {
    ZooKeeperLocker::from_url(&format!(
        "{}?session_timeout=60s&request_timeout=2s&sessions={sessions}",
        server.url()
    ))
    .await
    .expect("connect to the test zookeeper")
}

/// The server's count of requests read from clients.
fn packets_received(server: &ZooKeeperServer) -> u64 {
    server
        .mntr("zk_packets_received")
        .expect("zk_packets_received in mntr")
}

/// `count` leases on keys `<prefix><i>`, acquired 50 at a time.
pub(crate) async fn hold(locker: &ZooKeeperLocker, prefix: &str, count: usize) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(count);
    let keys: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    for wave in keys.chunks(50) {
        let granted =
            futures_util::future::join_all(wave.iter().map(|key| locker.try_lock(key, TTL))).await;
        leases.extend(granted.into_iter().map(|g| g.unwrap().expect("free")));
    }
    leases
}

/// Waits until every thread of process `pid` is stopped: SIGSTOP reaches
/// the JVM's threads one by one, and a thread still running answers.
fn wait_stopped(pid: u32) {
    let stopped = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
        tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            state.is_some_and(|rest| rest.starts_with('T') || rest.starts_with('t'))
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !stopped() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn requests(leases: &[Lease]) -> Vec<RefreshRequest<'_>> {
    leases
        .iter()
        .map(|lease| RefreshRequest {
            key: lease.key(),
            owner: lease.owner(),
            ttl: TTL,
        })
        .collect()
}

/// Runs `refresh_many(requests)` and returns its results and the packets
/// the server received meanwhile. A ping or watchdog request can fall in
/// the window: a measurement above `expected` is taken again (up to three
/// times), so the count returned is `expected` unless every try saw more.
pub(crate) async fn counted(
    server: &ZooKeeperServer,
    locker: &ZooKeeperLocker,
    requests: &[RefreshRequest<'_>],
    expected: u64,
) -> (Vec<distlock::Result<()>>, u64) {
    let mut seen = Vec::new();
    for _ in 0..3 {
        let before = packets_received(server);
        let results = locker.refresh_many(requests).await;
        // The `mntr` itself is one packet in its count (two `mntr` in a
        // row differ by 1).
        let sent = packets_received(server) - before - 1;
        if sent <= expected {
            return (results, sent);
        }
        seen.push(sent);
    }
    panic!("every try sent more than {expected} requests: {seen:?}");
}

/// 300 leases, one force-released and one asked for with another czxid in
/// its owner token: exactly those two answer NotHeld (the force-released
/// one's lost signal fires), the rest hold, and the batch is one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_multi_read_and_answers_only_the_lost_lease_not_held() {
    let server = ZooKeeperServer::start();
    let locker = locker(&server).await;
    let leases = hold(&locker, "batch-", 300).await;
    let evicted = 137;
    locker
        .force_release(leases[evicted].key(), ForceRelease::Lock)
        .await
        .unwrap()
        .expect("held");
    // The same node name with another czxid: a different node.
    let (czxid, node) = leases[42].owner().split_once('/').expect("czxid/node");
    let czxid = i64::from_str_radix(czxid, 16).expect("hex czxid");
    let forged = format!("{:x}/{node}", czxid + 1);
    let mut batch = requests(&leases);
    batch[42].owner = &forged;

    let (results, sent) = counted(&server, &locker, &batch, 1).await;
    assert_eq!(sent, 1, "one multi read for 300 leases");
    assert_eq!(results.len(), 300);
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (137 | 42, Err(Error::NotHeld { key })) => assert_eq!(key, leases[i].key()),
            (137 | 42, other) => panic!("lease {i} must be NotHeld: {other:?}"),
            (_, Ok(())) => {}
            (_, other) => panic!("lease {i} still holds: {other:?}"),
        }
    }
    assert_eq!(
        leases[evicted].lost_signal().reason(),
        Some(LostReason::NotHeld)
    );
    assert_eq!(
        leases[42].lost_signal().reason(),
        None,
        "its own token holds"
    );
    locker
        .refresh(leases[42].key(), leases[42].owner(), TTL)
        .await
        .unwrap();
    locker.close().await;
}

/// A batch is cut into multi reads of at most 1,000 checks (1,001 leases:
/// two requests) and at most 512 KiB of request (leases on keys of 1,024
/// `/`, 3,072 bytes escaped: about 160 per request, so 200 take two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_chunked_by_count_and_by_request_size() {
    let server = ZooKeeperServer::start();
    let locker = locker(&server).await;
    let many = hold(&locker, "many-", 1001).await;
    let (results, sent) = counted(&server, &locker, &requests(&many), 2).await;
    assert_eq!(sent, 2, "1,001 leases: 1,000 + 1");
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let long = "/".repeat(1020);
    let long = hold(&locker, &long, 200).await;
    assert!(locker.backend_key(long[0].key()).len() > 3060);
    let (results, sent) = counted(&server, &locker, &requests(&long), 2).await;
    assert_eq!(sent, 2, "200 paths of 3 KiB: two requests of under 512 KiB");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    locker.close().await;
}

/// A batch whose multi read gets no answer (the server frozen) is that
/// error (the request timeout, or the connection lost) for every lease,
/// never NotHeld, and the leases stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_server_does_not_answer_is_an_error_for_every_lease() {
    let server = ZooKeeperServer::start();
    let locker = locker(&server).await;
    let leases = hold(&locker, "frozen-", 20).await;
    let batch = requests(&leases);
    server.pause();
    wait_stopped(server.pid());
    let results = locker.refresh_many(&batch).await;
    server.resume();
    assert_eq!(results.len(), 20);
    for result in &results {
        assert!(
            matches!(
                result,
                Err(Error::DeadlineExceeded { .. } | Error::Backend { .. })
            ),
            "{result:?}"
        );
    }
    assert!(leases.iter().all(|l| l.lost_signal().reason().is_none()));
    let results = locker.refresh_many(&batch).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    locker.close().await;
}
