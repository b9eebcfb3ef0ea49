//! Acquire+release cycles per second of the Redis backend as deployed (a
//! standalone server, a three-master Cluster, a master behind Sentinel, a
//! primary with one replica and `min_replicas=1`, where each grant waits
//! for the replica's `WAIT`) and of Redlock on three nodes beside the
//! standalone backend, 1 and 16 concurrent tasks, each on its own key, so
//! the figure is round trips, not contention.
//!
//! Every backend beside its raw floor and the peer crates (rslock, sqlx,
//! distributed-lock, etcd's Lock RPC, GET_LOCK) is measured by the harness
//! in `bench/` at the repository's root, outside the workspace; this bench
//! keeps only what that harness does not cover: the Redis deployments.
//!
//! A measurement, not a check: it asserts nothing about speed. The servers
//! are private ones test-servers starts on free loopback ports. Run it with:
//!
//! ```text
//! cargo bench -p distlock --features redis,redlock,testkit --bench throughput
//! ```
//!
//! Client and server share the machine's cores, so figures swing between
//! runs: the contenders are interleaved per task count, so compare the
//! columns of one run.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::redlock::RedlockLocker;
use distlock::Locker;
use test_servers::{RedisCluster, RedisOptions, RedisSentinelSet, RedisServer};
use tokio::time::Instant;

const RUN_FOR: Duration = Duration::from_secs(2);
/// Long enough that no cycle ever meets an expiry.
const REDIS_TTL: Duration = Duration::from_secs(10);
const TASKS: [usize; 2] = [1, 16];

fn main() {
    // Two workers, as the machine has two vCPUs shared with the server.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            redis_deployment_cycles().await;
            println!();
            redlock_cycles().await;
        });
}

/// Runs `cycle(task index)` in `tasks` concurrent loops for [`RUN_FOR`] and
/// returns completed cycles per second.
async fn cycles_per_second<F, Fut>(tasks: usize, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let cycle = Arc::new(cycle);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + RUN_FOR;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (cycle, done) = (cycle.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    cycle(task).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("measuring task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// One `try_lock` + `release` of a key of the task's own.
async fn distlock_cycle(locker: impl Locker, ttl: Duration, task: usize) {
    let key = format!("bench-{task}");
    let lease = locker
        .try_lock(&key, ttl)
        .await
        .expect("acquire")
        .expect("own key");
    lease.release().await.expect("release");
}

async fn redlock_cycles() {
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    let standalone = RedisLocker::from_url(&servers[3].url())
        .await
        .expect("connect to the bench redis-server");
    let hosts: Vec<String> = servers[..3]
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let redlock = RedlockLocker::from_url(&format!("redlock://{}", hosts.join(",")))
        .await
        .expect("connect to the bench Redlock nodes");
    println!("tasks  redlock (3 nodes) cycles/s  redis standalone cycles/s  ratio");
    for tasks in TASKS {
        let quorum = {
            let redlock = redlock.clone();
            cycles_per_second(tasks, move |task| {
                distlock_cycle(redlock.clone(), REDIS_TTL, task)
            })
            .await
        };
        let single = {
            let standalone = standalone.clone();
            cycles_per_second(tasks, move |task| {
                distlock_cycle(standalone.clone(), REDIS_TTL, task)
            })
            .await
        };
        println!(
            "{tasks:>5}  {quorum:>26.0}  {single:>25.0}  {:>5.2}",
            quorum / single
        );
    }
}

/// The same cycle on each way Redis is deployed, interleaved per task count
/// so the rows of one run compare.
async fn redis_deployment_cycles() {
    let standalone = RedisServer::start();
    let cluster = RedisCluster::start();
    let sentinels = RedisSentinelSet::start();
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    // The replica must be in sync before WAIT can count it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replica
        .cli(&["info", "replication"])
        .contains("master_link_status:up")
    {
        assert!(std::time::Instant::now() < deadline, "the replica syncs");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut lockers = Vec::new();
    for (label, url) in [
        ("standalone", standalone.url()),
        ("cluster (3 masters)", cluster.url()),
        ("sentinel (1 master)", sentinels.url()),
        (
            "min_replicas=1",
            format!("{}?min_replicas=1&replica_timeout=100ms", primary.url()),
        ),
    ] {
        let locker = RedisLocker::from_url(&url)
            .await
            .expect("connect to the bench deployment");
        lockers.push((label, locker));
    }
    println!("redis deployment       tasks  cycles/s");
    for tasks in TASKS {
        for (label, locker) in &lockers {
            let locker = locker.clone();
            let rate = cycles_per_second(tasks, move |task| {
                distlock_cycle(locker.clone(), REDIS_TTL, task)
            })
            .await;
            println!("{label:<21}  {tasks:>5}  {rate:>8.0}");
        }
    }
}
