//! A quick measurement, not a test (ignored by default): acquire+release
//! cycles per second on one `RedisLocker` against a local redis-server, with 1
//! and 16 concurrent tasks (each on its own key, so the figure is round trips,
//! not contention), next to the floor of the same number of plain `SET NX PX`
//! + `DEL` round trips on the same kind of connection.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-redis cargo test --release -p distlock \
//!     --features redis,testkit --test redis_throughput -- --ignored --nocapture
//! ```
//!
//! Client and server share the machine's cores, so figures swing between runs;
//! compare the two columns of one run.
#![cfg(feature = "redis")]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::redis::RedisLocker;
use distlock::Locker;
use redis::aio::ConnectionManager;
use test_servers::RedisServer;
use tokio::time::Instant;

const RUN_FOR: Duration = Duration::from_secs(2);
const TTL: Duration = Duration::from_secs(10);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it explicitly (see the file's docs)"]
async fn acquire_release_cycles_per_second() {
    let server = RedisServer::start();
    let locker = RedisLocker::from_url(&server.url()).await.unwrap();
    let raw = ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();

    println!("tasks  distlock cycles/s  raw SET NX PX + DEL cycles/s  ratio");
    for tasks in [1, 16] {
        let distlock = {
            let locker = locker.clone();
            cycles_per_second(tasks, move |task| {
                let locker = locker.clone();
                async move {
                    let key = format!("bench-{task}");
                    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("own key");
                    lease.release().await.unwrap();
                }
            })
            .await
        };
        let floor = {
            let raw = raw.clone();
            cycles_per_second(tasks, move |task| {
                let mut raw = raw.clone();
                async move {
                    let key = format!("raw-{task}");
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    assert!(set.is_some(), "own key");
                    let _: i64 = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                }
            })
            .await
        };
        println!(
            "{tasks:>5}  {distlock:>18.0}  {floor:>28.0}  {:>5.2}",
            distlock / floor
        );
    }
}
