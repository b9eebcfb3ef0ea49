//! Acquire+release cycles per second on the Postgres backend, next to the
//! physical floor: the same cycle as bare `pg_try_advisory_lock` +
//! `pg_advisory_unlock` round trips on one tokio-postgres connection per task.
//! A measurement, not a check (the machine's two vCPUs are shared by client
//! and server); run it with:
//!
//! ```text
//! cargo test --release -p distlock --features postgres,testkit \
//!     --test postgres_throughput -- --ignored --nocapture
//! ```
#![cfg(feature = "postgres")]

use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::Locker;
use test_servers::PostgresServer;
use tokio::time::Instant;

const RUN_FOR: Duration = Duration::from_secs(2);
const TTL: Duration = Duration::from_secs(30);

/// Cycles per second of `tasks` tasks each running `cycle` on its own key.
async fn measure<F, Fut>(tasks: usize, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + RUN_FOR;
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    cycle(task).await;
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for worker in workers {
        total += worker.await.expect("worker");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn acquire_release_cycles_per_second() {
    let server = PostgresServer::start();
    for (label, params) in [("fencing on", ""), ("fencing off", "&fencing=off")] {
        let locker = PostgresLocker::from_url(&format!("{}{params}", server.url()))
            .await
            .expect("connect");
        for tasks in [1, 16] {
            let locker = locker.clone();
            let rate = measure(tasks, move |task| {
                let locker = locker.clone();
                async move {
                    let key = format!("bench-{task}");
                    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("own key");
                    lease.release().await.unwrap();
                }
            })
            .await;
            eprintln!("distlock postgres ({label}), {tasks:>2} tasks: {rate:>8.0} cycles/s");
        }
    }
    for tasks in [1, 16] {
        let mut clients = Vec::new();
        for _ in 0..tasks {
            let (client, connection) =
                tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                    .await
                    .expect("connect");
            tokio::spawn(connection);
            let lock = client
                .prepare("SELECT pg_try_advisory_lock($1)")
                .await
                .unwrap();
            let unlock = client
                .prepare("SELECT pg_advisory_unlock($1)")
                .await
                .unwrap();
            clients.push(std::sync::Arc::new((client, lock, unlock)));
        }
        let rate = measure(tasks, move |task| {
            let prepared = clients[task].clone();
            async move {
                let (client, lock, unlock) = &*prepared;
                let key = 1_000_000 + task as i64;
                let got: bool = client.query_one(lock, &[&key]).await.unwrap().get(0);
                assert!(got);
                let _: bool = client.query_one(unlock, &[&key]).await.unwrap().get(0);
            }
        })
        .await;
        eprintln!("raw pg_try_advisory_lock + unlock, {tasks:>2} tasks: {rate:>8.0} cycles/s (the floor: 2 round trips)");
    }
}
