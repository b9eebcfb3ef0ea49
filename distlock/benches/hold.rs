//! Holding many leases with keepalive: client memory per held lease and the
//! keepalive's round trips per second, per backend, each on a private server
//! test-servers starts on a free loopback port.
//!
//! For each backend it acquires `HOLD_LEASES` leases (default 100,000) on
//! distinct keys, measures the process's resident memory before and after
//! (RSS from `/proc/self/statm`, so everything the leases cost: the `Lease`
//! values, the backend's bookkeeping, connection buffers), starts a keepalive
//! on every lease, lets it run for two refresh intervals and measures again,
//! and counts the server's commands (Redis: `EVALSHA` calls from `INFO
//! commandstats`) or transactions (Postgres: `xact_commit` of the database
//! in `pg_stat_database`, which lags by up to a second) over one more
//! interval: the keepalive's round trips per second. Each backend runs in a
//! process of its own (this program runs itself again), so memory freed by
//! one backend's run cannot hide another's.
//!
//! A measurement, not a check: it asserts nothing about the figures.
//!
//! ```text
//! cargo bench -p distlock --all-features --bench hold
//! HOLD_LEASES=10000 HOLD_BACKENDS=redis cargo bench -p distlock --all-features --bench hold
//! ```
//!
//! `HOLD_BACKENDS` is a comma-separated list of `memory`, `redis`, `postgres`
//! (default: all three).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use distlock::memory::MemoryLocker;
use distlock::postgres::PostgresLocker;
use distlock::redis::RedisLocker;
use distlock::{KeepAlive, Lease, Locker};
use test_servers::{PostgresOptions, PostgresServer, RedisServer};
use tokio::time::Instant;

/// The ttl of every held lease: refreshed every 3 s.
const TTL: Duration = Duration::from_secs(9);
/// Concurrent acquiring tasks.
const ACQUIRERS: usize = 16;
const BACKENDS: [&str; 3] = ["memory", "redis", "postgres"];

fn main() {
    let leases: usize = std::env::var("HOLD_LEASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    if let Ok(backend) = std::env::var("HOLD_BACKEND_CHILD") {
        run_one(&backend, leases);
        return;
    }
    let backends = std::env::var("HOLD_BACKENDS")
        .map(|list| list.split(',').map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_else(|_| BACKENDS.iter().map(|b| b.to_string()).collect());
    println!(
        "{leases} held leases, ttl {TTL:?} (a refresh every {:?})",
        KeepAlive::default().interval_for(TTL)
    );
    println!(
        "backend    KiB/lease held  KiB/lease with keepalive  keepalive round trips/s  leases refreshed/s"
    );
    let exe = std::env::current_exe().expect("the bench's own path");
    for backend in backends {
        let status = Command::new(&exe)
            .env("HOLD_BACKEND_CHILD", &backend)
            .env("HOLD_LEASES", leases.to_string())
            .status()
            .expect("run the bench for one backend");
        assert!(status.success(), "the {backend} run failed: {status}");
    }
}

fn run_one(backend: &str, leases: usize) {
    // Two workers, as the machine has two vCPUs shared with the server.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            match backend {
                "memory" => {
                    let locker: Arc<dyn Locker> = Arc::new(MemoryLocker::new());
                    hold(backend, locker, leases, Counter::None).await;
                }
                "redis" => {
                    let server = RedisServer::start();
                    let locker = RedisLocker::from_url(&server.url())
                        .await
                        .expect("connect to the bench redis-server");
                    hold(backend, Arc::new(locker), leases, Counter::Redis(&server)).await;
                }
                "postgres" => {
                    // Every held advisory lock takes a slot of the server's
                    // lock table: max_locks_per_transaction × max_connections.
                    let server = PostgresServer::start_with(PostgresOptions {
                        settings: vec![("max_locks_per_transaction".into(), "1024".into())],
                        ..PostgresOptions::default()
                    });
                    let locker = PostgresLocker::from_url(&server.url())
                        .await
                        .expect("connect to the bench server");
                    hold(
                        backend,
                        Arc::new(locker),
                        leases,
                        Counter::Postgres(&server),
                    )
                    .await;
                }
                other => panic!("unknown backend {other:?} (memory, redis, postgres)"),
            }
        });
}

/// Where the server's round trips are counted.
enum Counter<'a> {
    None,
    Redis(&'a RedisServer),
    Postgres(&'a PostgresServer),
}

impl Counter<'_> {
    /// The server's count of round trips so far, if it has one.
    fn round_trips(&self) -> Option<u64> {
        match self {
            Counter::None => None,
            Counter::Redis(server) => {
                let stats = server.cli(&["INFO", "commandstats"]);
                let calls = stats
                    .lines()
                    .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                    .and_then(|rest| rest.split(',').next())
                    .and_then(|calls| calls.parse().ok())
                    .unwrap_or(0);
                Some(calls)
            }
            Counter::Postgres(server) => server
                .psql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
                .trim()
                .parse()
                .ok(),
        }
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|resident| resident.parse().ok())
        .expect("resident pages in /proc/self/statm");
    pages * 4096
}

async fn acquire_all(locker: &Arc<dyn Locker>, leases: usize) -> Vec<Lease> {
    let per_task = leases.div_ceil(ACQUIRERS);
    let tasks: Vec<_> = (0..ACQUIRERS)
        .map(|task| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let first = task * per_task;
                let last = (first + per_task).min(leases);
                let mut held = Vec::with_capacity(last.saturating_sub(first));
                for i in first..last {
                    let lease = locker
                        .try_lock(&format!("hold-{i}"), TTL)
                        .await
                        .expect("acquire")
                        .expect("a key of its own");
                    held.push(lease);
                }
                held
            })
        })
        .collect();
    let mut all = Vec::with_capacity(leases);
    for task in tasks {
        all.extend(task.await.expect("acquiring task"));
    }
    all
}

async fn hold(backend: &str, locker: Arc<dyn Locker>, leases: usize, counter: Counter<'_>) {
    // Warm up: connections, statements, the runtime's workers.
    drop(acquire_all(&locker, ACQUIRERS * 4).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_bytes();
    let started = Instant::now();
    let mut held = acquire_all(&locker, leases).await;
    let acquired_in = started.elapsed();
    let held_rss = rss_bytes();
    for lease in &mut held {
        lease
            .keep_alive(KeepAlive::default())
            .expect("start the keepalive");
    }
    let interval = KeepAlive::default().interval_for(TTL);
    tokio::time::sleep(interval * 2).await;
    let kept_rss = rss_bytes();
    let trips_before = counter.round_trips();
    let window = Instant::now();
    tokio::time::sleep(interval * 2).await;
    let trips = counter
        .round_trips()
        .zip(trips_before)
        .map(|(after, before)| {
            after.saturating_sub(before) as f64 / window.elapsed().as_secs_f64()
        });
    let mut lost = std::collections::HashMap::new();
    for reason in held.iter().filter_map(|lease| lease.lost_signal().reason()) {
        *lost.entry(format!("{reason:?}")).or_insert(0usize) += 1;
    }
    if !lost.is_empty() {
        if let Counter::Postgres(server) = &counter {
            let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!(
                "server log, last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    assert!(lost.is_empty(), "leases lost while held: {lost:?}");
    let per_lease = |rss: u64| rss.saturating_sub(before) as f64 / leases as f64 / 1024.0;
    let trips = trips.map_or("n/a".to_owned(), |trips| format!("{trips:.1}"));
    println!(
        "{backend:<9}  {:>14.2}  {:>24.2}  {trips:>23}  {:>18.0}   (acquired in {acquired_in:.1?})",
        per_lease(held_rss),
        per_lease(kept_rss),
        leases as f64 / interval.as_secs_f64(),
    );
    let released = Instant::now();
    for lease in held {
        drop(lease);
    }
    // Dropped leases release in the background: give them a moment.
    tokio::time::sleep(Duration::from_millis(500).max(released.elapsed())).await;
}
