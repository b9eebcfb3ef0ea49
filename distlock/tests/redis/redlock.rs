//! What the Redlock backend promises beyond the shared contract, on real,
//! independent redis-servers each test starts: a minority of nodes down
//! (still works), a majority down (errors, never contention; `Unavailable`
//! through the breaker), a node holding a stale key (a majority still
//! grants), a node restarted without persistence (re-locked by refresh),
//! a refresh that loses the majority (the lost signal fires), the
//! drift-adjusted validity, and a release that cannot overtake a slow
//! node's acquire.

use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::redlock::{Config, RedlockLocker};
use distlock::{BreakerConfig, BreakerLocker, BreakerState, Error, KeepAlive, Locker, LostReason};
use test_servers::{FaultProxy, RedisServer};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn start(count: usize) -> Vec<RedisServer> {
    (0..count).map(|_| RedisServer::start()).collect()
}

fn url(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

async fn connect(servers: &[RedisServer]) -> RedlockLocker {
    RedlockLocker::from_url(&url(servers))
        .await
        .expect("connect to the Redlock nodes")
}

/// The owner token `server` stores under `key`'s lock key (empty if
/// nothing).
fn stored(server: &RedisServer, key: &str) -> String {
    crate::support::stored_owner(server, &format!("lock:{{{key}}}"))
}

/// Waits (up to 3 s) until `server` stores `expected` for `key`. A release
/// returns once a majority has answered; the other nodes' releases finish
/// in the background, so a node outside that majority may lag a little.
async fn eventually_stored(server: &RedisServer, key: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let now = stored(server, key);
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key:?} still holds {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn one_node_down_still_grants_refreshes_and_releases() {
    let mut servers = start(3);
    let locker = connect(&servers).await;
    servers[2].kill();
    let mut lease = locker
        .try_lock("k", TTL)
        .await
        .expect("two of three nodes are a majority")
        .expect("free");
    for server in &servers[..2] {
        assert_eq!(stored(server, "k"), lease.owner());
    }
    lease.refresh(TTL).await.expect("refresh on the majority");
    let contender = connect(&servers[..2]).await;
    assert!(
        contender.try_lock("k", TTL).await.unwrap().is_none(),
        "held on the live majority"
    );
    lease.release().await.expect("release on the majority");
    eventually_stored(&servers[0], "k", "").await;

    // A locker can also be built while that node is down.
    let late = connect(&servers).await;
    let lease = late.try_lock("k2", TTL).await.unwrap().expect("free");
    lease.release().await.unwrap();

    // Five nodes tolerate two down.
    let mut five = start(5);
    let locker = connect(&five).await;
    five[0].kill();
    five[3].kill();
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("3 of 5");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_majority_down_is_an_error_never_contention_and_opens_the_breaker() {
    let mut servers = start(3);
    let locker = connect(&servers).await;
    // Held while all are up, so the survivor holds a key: still an outage.
    let held = locker.try_lock("held", TTL).await.unwrap().expect("free");
    servers[0].kill();
    servers[1].kill();
    for key in ["free", "held"] {
        let started = Instant::now();
        match locker.try_lock(key, TTL).await {
            Err(error @ Error::Backend { .. }) => {
                let message = error.to_string();
                assert!(error.is_outage() && !error.is_contention(), "{message}");
                assert!(message.contains("no majority (2)"), "{message}");
                for dead in &servers[..2] {
                    assert!(
                        message.contains(&dead.port().to_string()),
                        "names the failed node {}: {message}",
                        dead.port()
                    );
                }
            }
            other => panic!("{key}: a majority down must be a backend error, got {other:?}"),
        }
        let took = started.elapsed();
        eprintln!("{key}: a failed Redlock acquire took {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "bounded by the node timeout: {took:?}"
        );
    }
    match locker.lock("free", TTL, Duration::from_millis(500)).await {
        Err(error) => assert!(
            error.is_outage() && !error.is_contention(),
            "waiting on a dead majority must end in an outage, got {error}"
        ),
        Ok(_) => panic!("granted without a majority"),
    }
    drop(held);

    let breaker = BreakerLocker::new(
        locker.clone(),
        BreakerConfig::default()
            .failure_threshold(2)
            .open_for(Duration::from_secs(30)),
    );
    for _ in 0..2 {
        assert!(matches!(
            breaker.try_lock("free", TTL).await,
            Err(Error::Backend { .. })
        ));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    match breaker.try_lock("free", TTL).await {
        Err(Error::Unavailable { backend, .. }) => assert_eq!(backend, "redlock"),
        other => panic!("with the circuit open: expected Unavailable, got {other:?}"),
    }

    // Building a locker with a majority down fails, naming the nodes.
    let err = RedlockLocker::from_url(&url(&servers)).await.unwrap_err();
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
    assert!(
        message.contains("only 1 of 3 Redlock nodes answered"),
        "{message}"
    );
}

#[tokio::test]
async fn a_node_holding_a_stale_key_does_not_stop_a_majority() {
    let servers = start(3);
    let locker = connect(&servers).await;
    // Left behind by a client that died mid-acquire: held on one node only.
    servers[1].cli(&["SET", "lock:{k}", "stale-owner", "PX", "60000"]);
    let lease = locker
        .try_lock("k", TTL)
        .await
        .expect("no error")
        .expect("two of three nodes are free: a majority");
    assert_eq!(stored(&servers[0], "k"), lease.owner());
    assert_eq!(stored(&servers[2], "k"), lease.owner());
    assert_eq!(stored(&servers[1], "k"), "stale-owner", "untouched");
    lease.release().await.expect("release on the majority");
    assert_eq!(stored(&servers[1], "k"), "stale-owner");
    eventually_stored(&servers[0], "k", "").await;

    // Stale keys on two of three: contention, and nothing of ours is left.
    servers[2].cli(&["SET", "lock:{k}", "stale-owner", "PX", "60000"]);
    assert!(locker.try_lock("k", TTL).await.unwrap().is_none());
    crate::common::eventually(
        Duration::from_secs(3),
        "the minority grant released",
        || stored(&servers[0], "k").is_empty(),
    )
    .await;
}

/// A key held on a minority of nodes is not held (a release still finishing
/// on a slow node leaves exactly that behind): forget goes ahead on the
/// nodes where it is free and leaves the minority's key to its ttl; a key
/// held on a majority is refused.
#[tokio::test]
async fn forget_refuses_a_majority_holder_only() {
    let servers = start(3);
    let locker = connect(&servers).await;
    servers[1].cli(&["SET", "lock:{f}", "stale-owner", "PX", "60000"]);
    locker
        .forget("f")
        .await
        .expect("held on one node of three: not held, so forgotten");
    assert_eq!(
        stored(&servers[1], "f"),
        "stale-owner",
        "the minority's key is left to its ttl"
    );

    servers[2].cli(&["SET", "lock:{f}", "stale-owner", "PX", "60000"]);
    match locker.forget("f").await {
        Err(Error::NotAcquired { key }) => assert_eq!(key, "f"),
        other => panic!("held on two nodes of three: refused, got {other:?}"),
    }
}

#[tokio::test]
async fn refresh_relocks_a_node_restarted_without_persistence() {
    let mut servers = start(3);
    let locker = connect(&servers).await;
    let mut lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    servers[0].restart();
    assert_eq!(stored(&servers[0], "k"), "", "the restart forgot the lock");
    // The node's connection finds the restart and reconnects: allow it a
    // few refreshes (the lease keeps its validity while they fail).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        lease.refresh(TTL).await.expect("a majority extends it");
        if stored(&servers[0], "k") == lease.owner() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node was not re-locked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pttl: u64 = servers[0].cli(&["PTTL", "lock:{k}"]).parse().unwrap();
    assert!(
        pttl > 9_000 && pttl <= 10_000,
        "re-locked for the ttl: {pttl} ms"
    );
    lease.release().await.unwrap();
    for server in &servers {
        eventually_stored(server, "k", "").await;
    }
}

#[tokio::test]
async fn a_refresh_after_a_force_release_is_not_held_and_retakes_nothing() {
    let servers = start(3);
    let (holder, operator) = (connect(&servers).await, connect(&servers).await);
    let mut lease = holder.try_lock("k", TTL).await.unwrap().expect("free");
    let evicted = operator
        .force_release("k", distlock::inspect::ForceRelease::Lock)
        .await
        .unwrap();
    assert!(evicted.is_some(), "the operator evicted the holder");
    // Nobody took the key since: every node is free, and a refresh that
    // re-locked free nodes would hand the lock back to the evicted holder.
    match lease.refresh(TTL).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("the evicted holder's refresh must be NotHeld, got {other:?}"),
    }
    assert_eq!(lease.lost_signal().reason(), Some(LostReason::NotHeld));
    tokio::time::sleep(Duration::from_millis(200)).await;
    for server in &servers {
        assert_eq!(stored(server, "k"), "", "no node was re-locked");
    }
    let next = operator.try_lock("k", TTL).await.unwrap();
    assert!(next.is_some(), "the key is free for the next holder");
}

#[tokio::test]
async fn a_refresh_that_loses_the_majority_fires_the_lost_signal() {
    let servers = start(3);
    let locker = connect(&servers).await;
    let ttl = Duration::from_millis(900);
    let mut lease = locker.try_lock("k", ttl).await.unwrap().expect("free");
    lease.keep_alive(KeepAlive::default()).unwrap();
    let mut lost = lease.lost_signal();
    // Someone else's key on two of three nodes (as after expiries and a
    // new grant the holder did not see).
    for server in &servers[..2] {
        server.cli(&["SET", "lock:{k}", "thief", "PX", "60000"]);
    }
    let reason = tokio::time::timeout(Duration::from_secs(3), lost.wait())
        .await
        .expect("the keepalive's refresh finds the majority lost within 3 s");
    assert_eq!(reason, LostReason::NotHeld);
    assert_eq!(
        stored(&servers[0], "k"),
        "thief",
        "the new holder is untouched"
    );
    drop(lease);
}

#[tokio::test]
async fn the_lease_validity_is_ttl_less_the_drift_allowance() {
    let servers = start(3);
    let locker = connect(&servers).await;
    let drift = locker.drift(TTL);
    assert_eq!(drift, Duration::from_millis(102));
    let before = Instant::now();
    let mut lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    let after = Instant::now();
    let valid_until = lease.valid_until().expect("Redlock leases expire");
    assert!(
        valid_until >= before + TTL - drift && valid_until <= after + TTL - drift,
        "validity {:?} after the call began, expected the ttl less {drift:?}",
        valid_until - before
    );
    let before = Instant::now();
    lease.refresh(TTL).await.unwrap();
    let after = Instant::now();
    let valid_until = lease.valid_until().unwrap();
    assert!(
        valid_until >= before + TTL - drift && valid_until <= after + TTL - drift,
        "a refresh's validity is drift-adjusted too: {:?}",
        valid_until - before
    );
    assert_eq!(lease.fencing_token(), None);
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_paused_node_costs_at_most_the_node_timeout() {
    let servers = start(3);
    let url = format!("{}?node_timeout=200ms", url(&servers));
    let locker = RedlockLocker::from_url(&url).await.unwrap();
    servers[1].pause();
    let started = Instant::now();
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("2 of 3");
    let took = started.elapsed();
    eprintln!("acquire with a paused node took {took:?}");
    // The majority answers without waiting for the paused node.
    assert!(took < Duration::from_secs(1), "{took:?}");
    let started = Instant::now();
    lease
        .release()
        .await
        .expect("a majority answers the release");
    let took = started.elapsed();
    eprintln!("release with a paused node took {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "bounded by the node timeout: {took:?}"
    );
    servers[1].resume();
}

#[tokio::test]
async fn configs_from_json_and_env_reach_the_same_nodes() {
    let servers = start(3);
    let addresses: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let json = format!(
        r#"{{"addresses": ["{}"], "keyPrefix": "rl:", "nodeTimeout": "150ms"}}"#,
        addresses.join("\", \"")
    );
    let env = Config::from_env_vars([
        ("DISTLOCK_REDIS_ADDRESSES", addresses.join(",")),
        ("DISTLOCK_REDIS_KEY_PREFIX", "rl:".to_owned()),
        ("DISTLOCK_REDLOCK_NODE_TIMEOUT", "150ms".to_owned()),
    ])
    .unwrap();
    for config in [Config::from_json(&json).unwrap(), env] {
        let locker = RedlockLocker::from_config(config).await.unwrap();
        assert_eq!((locker.nodes(), locker.quorum()), (3, 2));
        assert_eq!(locker.node_timeout(), Duration::from_millis(150));
        let lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
        // The grant returns with the majority; the last node follows.
        let owner = lease.owner().to_owned();
        crate::common::eventually(Duration::from_secs(2), "every node holds the lock", || {
            servers
                .iter()
                .all(|s| crate::support::stored_owner(s, "rl:{k}") == owner)
        })
        .await;
        lease.release().await.unwrap();
    }
    let twice = Config::from_url(&format!("redlock://{},{}", addresses[0], addresses[0])).unwrap();
    match RedlockLocker::from_config(twice).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("listed twice"), "{reason}")
        }
        other => panic!("a node listed twice must be refused, got {other:?}"),
    }
}

/// A grant returns once a majority holds the key; the slow node's acquire
/// goes on in the background. A release right after must not reach that
/// node before the acquire has: the acquire would land after it and hold
/// the key there, unreleased, until its ttl.
///
/// The slow node has the release script cached but not the acquire script,
/// and its replies are delayed: its acquire's `EVALSHA` is answered
/// `NOSCRIPT` late, so the script load and the second `EVALSHA` follow the
/// release's `EVALSHA`, which the server runs at once.
#[tokio::test]
async fn a_release_right_after_a_grant_does_not_overtake_a_slow_nodes_acquire() {
    let servers = start(3);
    let slow = &servers[2];
    let proxy = FaultProxy::start(slow.port());
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?node_timeout=2s",
        servers[0].port(),
        servers[1].port(),
        proxy.port()
    );
    let locker = RedlockLocker::from_url(&url).await.expect("connect");
    let direct = RedisLocker::from_url(&slow.url()).await.expect("connect");
    assert_eq!(slow.cli(&["SCRIPT", "FLUSH"]), "OK");
    // Caches the release script alone on the slow node.
    let unheld = direct.unlock("warm-up", "nobody").await;
    assert!(matches!(unheld, Err(Error::NotHeld { .. })), "{unheld:?}");
    proxy.delay_replies(Duration::from_millis(300));
    let lease = locker
        .try_lock("overtaken", TTL)
        .await
        .unwrap()
        .expect("granted by the fast two");
    lease.release().await.expect("released on a majority");
    proxy.restore();
    // Long enough for the slow node's acquire (three delayed round trips)
    // and anything after it to have landed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for server in &servers {
        assert_eq!(
            stored(server, "overtaken"),
            "",
            "the key outlived its release on {}",
            server.port()
        );
    }
}
