//! `distlock bench`: acquire+release cycles per second of a backend, like
//! redis-benchmark for Redis.
//!
//! After each run it forgets every key it used ([`Locker::forget`]), so a
//! bench leaves nothing behind: no fencing counter, row or lock file. Its
//! keys are unique to the invocation and never locked again, which is what
//! makes restarting their fencing tokens harmless.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, Locker};
use tokio::time::Instant;

use crate::cli::BenchArgs;
use crate::exit;

/// What one task measured.
#[derive(Default)]
struct TaskReport {
    latencies: Vec<Duration>,
    contended: u64,
    errors: u64,
    first_error: Option<String>,
}

pub(crate) async fn bench(args: BenchArgs) -> u8 {
    if args.duration > MAX_DURATION {
        eprintln!(
            "distlock: --duration {} is longer than the {} a benchmark run may last",
            humantime::format_duration(args.duration),
            humantime::format_duration(MAX_DURATION)
        );
        return exit::USAGE;
    }
    // The bare backend: the figures are the backend's, not the wrappers'.
    let url = args.backend.url.as_deref().unwrap_or("file://");
    let locker = match distlock::connect(url).await {
        Ok(locker) => locker,
        Err(error) => {
            eprintln!("distlock: {error}");
            return exit::for_error(&error);
        }
    };
    println!(
        "backend {}, {} per run, keys {}, ttl {}",
        locker.backend(),
        humantime::format_duration(args.duration),
        if args.shared_key {
            "shared (contended)"
        } else {
            "one per task"
        },
        humantime::format_duration(args.ttl),
    );
    println!(
        "{:>6} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "tasks", "cycles", "cycles/s", "p50", "p99", "max", "contended", "errors"
    );
    let run_id: u32 = rand_id();
    let mut failed = false;
    let mut cleanup = Cleanup::default();
    for &tasks in &args.tasks {
        let keys = keys(&args, tasks, run_id);
        let reports = run_once(&locker, &args, tasks, &keys).await;
        cleanup.forget(&*locker, &keys).await;
        let mut latencies: Vec<Duration> = reports
            .iter()
            .flat_map(|r| r.latencies.iter().copied())
            .collect();
        latencies.sort_unstable();
        let contended: u64 = reports.iter().map(|r| r.contended).sum();
        let errors: u64 = reports.iter().map(|r| r.errors).sum();
        let percentile = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        println!(
            "{tasks:>6} {:>10} {:>12.0} {:>10} {:>10} {:>10} {contended:>10} {errors:>7}",
            latencies.len(),
            latencies.len() as f64 / args.duration.as_secs_f64(),
            micros(percentile(0.5)),
            micros(percentile(0.99)),
            micros(latencies.last().copied().unwrap_or_default()),
        );
        if let Some(error) = reports.iter().find_map(|r| r.first_error.clone()) {
            eprintln!("distlock: first error with {tasks} tasks: {error}");
            failed = true;
        }
    }
    if failed {
        exit::UNAVAILABLE
    } else {
        cleanup.first_error.as_ref().map_or(0, exit::for_error)
    }
}

/// The keys of one run: one per task, or one for all.
fn keys(args: &BenchArgs, tasks: usize, run_id: u32) -> Vec<String> {
    if args.shared_key {
        vec![format!("distlock-bench-{run_id:08x}")]
    } else {
        (0..tasks)
            .map(|task| format!("distlock-bench-{run_id:08x}-{tasks}-{task}"))
            .collect()
    }
}

/// Forgets the keys of each run, reporting every failure on stderr.
#[derive(Default)]
struct Cleanup {
    /// The backend said it cannot forget (said once, then not asked again).
    unsupported: bool,
    first_error: Option<Error>,
}

impl Cleanup {
    async fn forget(&mut self, locker: &dyn Locker, keys: &[String]) {
        for key in keys {
            if self.unsupported {
                return;
            }
            match locker.forget(key).await {
                Ok(()) => {}
                Err(error @ Error::Unsupported { .. }) => {
                    eprintln!("distlock: the bench's keys stay in the backend: {error}");
                    self.unsupported = true;
                }
                Err(error) => {
                    eprintln!("distlock: cannot forget bench key {key:?}: {error}");
                    self.first_error.get_or_insert(error);
                }
            }
        }
    }
}

/// The longest run: a day is already far past any useful benchmark, and it
/// keeps the deadline arithmetic far from overflow.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Runs `tasks` tasks, task `i` on `keys[i]`, or all on the one shared key.
async fn run_once(
    locker: &Arc<dyn Locker>,
    args: &BenchArgs,
    tasks: usize,
    keys: &[String],
) -> Vec<TaskReport> {
    // `bench` checked the duration against MAX_DURATION.
    let deadline = Instant::now() + args.duration.min(MAX_DURATION);
    let handles: Vec<_> = (0..tasks)
        .filter_map(|task| keys.get(task).or(keys.first()).cloned())
        .map(|key| {
            let locker = locker.clone();
            let ttl = args.ttl;
            tokio::spawn(async move { cycle_until(&*locker, &key, ttl, deadline).await })
        })
        .collect();
    let mut reports = Vec::with_capacity(tasks);
    for handle in handles {
        reports.push(handle.await.unwrap_or_else(|panic| TaskReport {
            errors: 1,
            first_error: Some(format!("benchmark task failed: {panic}")),
            ..TaskReport::default()
        }));
    }
    reports
}

/// try_lock + release until the deadline; a cycle is one grant and its release.
async fn cycle_until(
    locker: &dyn Locker,
    key: &str,
    ttl: Duration,
    deadline: Instant,
) -> TaskReport {
    let mut report = TaskReport::default();
    while Instant::now() < deadline {
        let started = Instant::now();
        let outcome = match locker.try_lock(key, ttl).await {
            Ok(Some(lease)) => lease.release().await.map(|()| true),
            Ok(None) => Ok(false),
            Err(error) => Err(error),
        };
        match outcome {
            Ok(true) => report.latencies.push(started.elapsed()),
            Ok(false) => {
                report.contended += 1;
                tokio::task::yield_now().await;
            }
            Err(error) => {
                report.errors += 1;
                report.first_error.get_or_insert_with(|| error.to_string());
                if matches!(error, Error::InvalidInput { .. }) {
                    break;
                }
            }
        }
    }
    report
}

fn micros(duration: Duration) -> String {
    format!("{}µs", duration.as_micros())
}

fn rand_id() -> u32 {
    let token = distlock::new_owner_token();
    u32::from_str_radix(&token[..8], 16).unwrap_or_default()
}
