//! `distlock bench`: a backend's lock throughput, handoff and hold costs,
//! like redis-benchmark for Redis. Six workloads (see [`Workload`]), a
//! table by default or one JSON object per run (`--json`).
//!
//! After each run it forgets every key it used ([`Locker::forget`]), so a
//! bench leaves nothing behind: no fencing counter, row or lock file. Its
//! keys are unique to the invocation and never locked again, which is what
//! makes restarting their fencing tokens harmless.
//!
//! The client is the CLI's one-threaded runtime: the figures include the
//! client's CPU, on one core, beside the server's.

mod counting;
mod election;
mod probe;
mod report;
mod stats;
mod workload;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, Locker};

use crate::cli::{BenchArgs, Workload};
use crate::exit;

/// What every workload needs to know about one run.
pub(crate) struct Plan {
    pub(crate) clients: usize,
    pub(crate) duration: Duration,
    pub(crate) ttl: Duration,
    /// Leases held by the hold workload.
    pub(crate) keys: usize,
    /// Unique to this invocation: every key name starts with it.
    pub(crate) prefix: String,
    /// Completed operations (cycles, handoffs, refreshes), for the progress line.
    pub(crate) progress: Arc<AtomicU64>,
    /// Leases the hold workload has taken so far, for the progress line
    /// while it acquires (minutes for 100,000 on Postgres and MariaDB).
    pub(crate) acquired: Arc<AtomicU64>,
    /// Handoffs or failovers the election workloads measure.
    pub(crate) runs: usize,
    /// The backend's URL, for the election workloads' other candidates.
    pub(crate) url: String,
    /// The semaphore's permits, for the permits workload.
    pub(crate) permits: u32,
}

pub(crate) async fn bench(args: BenchArgs) -> u8 {
    let workload = if args.shared_key {
        Workload::Contended
    } else {
        args.workload
    };
    if let Err(message) = check(&args) {
        eprintln!("distlock: {message}");
        return exit::USAGE;
    }
    // The bare backend: the figures are the backend's, not the wrappers'.
    let locker = match distlock::connect(&args.backend.url()).await {
        Ok(locker) => locker,
        Err(error) => {
            eprintln!("distlock: {error}");
            return exit::for_error(&error);
        }
    };
    let prefix = format!("distlock-bench-{:08x}", rand_id());
    let printer = report::Printer::new(args.json, workload);
    printer.header(&*locker, &args);
    let mut failed = false;
    let mut cleanup = Cleanup::default();
    // The election workloads have a fixed cast of candidates: one run.
    let client_counts = match workload {
        Workload::Handoff => vec![election::CANDIDATES],
        Workload::Failover => vec![election::REPLICAS],
        _ => args.clients.clone(),
    };
    // The permits workload runs once per client count and permit count.
    let permit_counts = match workload {
        Workload::Permits => args.permits.clone(),
        _ => vec![1],
    };
    let runs = client_counts
        .iter()
        .flat_map(|&clients| permit_counts.iter().map(move |&permits| (clients, permits)));
    for (clients, permits) in runs {
        let plan = Plan {
            clients,
            duration: args.duration,
            ttl: args.ttl,
            keys: args.keys,
            prefix: match workload {
                Workload::Permits => format!("{prefix}-{clients}-{permits}"),
                _ => format!("{prefix}-{clients}"),
            },
            progress: Arc::default(),
            acquired: Arc::default(),
            runs: args.runs,
            url: args.backend.url().into_owned(),
            permits,
        };
        let progress = Progress::start(&plan, workload);
        let (run, keys) = match workload {
            Workload::Uncontended => workload::uncontended(&locker, &plan).await,
            Workload::Contended => workload::contended(&locker, &plan).await,
            Workload::Hold => workload::hold(&locker, &plan).await,
            Workload::Handoff => election::handoff(&locker, &plan).await,
            Workload::Failover => election::failover(&locker, &plan).await,
            Workload::Permits => workload::permits(&locker, &plan).await,
        };
        progress.stop();
        cleanup.forget(&*locker, &keys).await;
        printer.row(&run);
        if let Some(error) = run.first_error() {
            let permits = match workload {
                Workload::Permits => format!(" and {permits} permits"),
                _ => String::new(),
            };
            eprintln!("distlock: first error with {clients} clients{permits}: {error}");
            failed = true;
        }
    }
    if failed {
        exit::UNAVAILABLE
    } else {
        cleanup.first_error.as_ref().map_or(0, exit::for_error)
    }
}

/// The longest run: a day is already far past any useful benchmark, and it
/// keeps the deadline arithmetic far from overflow.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Enough tasks to saturate any server from one client process.
const MAX_CLIENTS: usize = 10_000;
/// Ten times the 100,000-lease target.
const MAX_KEYS: usize = 1_000_000;
/// Handoffs or failovers: a failover on an expiring backend takes a ttl.
const MAX_RUNS: usize = 10_000;

/// Flags clap cannot check on its own; the message names the flag.
fn check(args: &BenchArgs) -> Result<(), String> {
    if args.duration > MAX_DURATION {
        return Err(format!(
            "--duration {} is longer than the {} a benchmark run may last",
            humantime::format_duration(args.duration),
            humantime::format_duration(MAX_DURATION)
        ));
    }
    if args.duration.is_zero() {
        return Err("--duration must be longer than zero".into());
    }
    if let Some(bad) = args.clients.iter().find(|&&n| n == 0 || n > MAX_CLIENTS) {
        return Err(format!(
            "--clients {bad} is out of range: each value must be 1 to {MAX_CLIENTS}"
        ));
    }
    if args.keys == 0 || args.keys > MAX_KEYS {
        return Err(format!(
            "--keys {} is out of range: 1 to {MAX_KEYS} leases",
            args.keys
        ));
    }
    let max_permits = distlock::semaphore::MAX_PERMITS;
    if let Some(bad) = args.permits.iter().find(|&&n| n == 0 || n > max_permits) {
        return Err(format!(
            "--permits {bad} is out of range: each value must be 1 to {max_permits}"
        ));
    }
    if args.runs == 0 || args.runs > MAX_RUNS {
        return Err(format!(
            "--runs {} is out of range: 1 to {MAX_RUNS}",
            args.runs
        ));
    }
    Ok(())
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

/// A once-a-second progress line on stderr, only when stderr is a terminal
/// and the run lasts long enough to wonder whether it is stuck.
struct Progress(Option<tokio::task::JoinHandle<()>>);

impl Progress {
    const MIN_RUN: Duration = Duration::from_secs(3);

    fn start(plan: &Plan, workload: Workload) -> Self {
        // The election workloads run --runs times, not for --duration; the
        // hold workload first acquires its leases, for as long as it takes.
        let timed = !matches!(workload, Workload::Handoff | Workload::Failover);
        let long = plan.duration >= Self::MIN_RUN || matches!(workload, Workload::Hold);
        if !timed || !long || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let (done, acquired) = (plan.progress.clone(), plan.acquired.clone());
        let (clients, total, keys) = (plan.clients, plan.duration.as_secs(), plan.keys);
        let hold = matches!(workload, Workload::Hold);
        let started = tokio::time::Instant::now();
        Progress(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let elapsed = started.elapsed().as_secs();
                if hold {
                    eprint!(
                        "\r{workload} with {clients} clients: {} of {keys} leases acquired, {} refreshes, {elapsed}s   ",
                        acquired.load(Ordering::Relaxed),
                        done.load(Ordering::Relaxed)
                    );
                } else {
                    eprint!(
                        "\r{workload} with {clients} clients: {elapsed}s of {total}s, {} done   ",
                        done.load(Ordering::Relaxed)
                    );
                }
            }
        })))
    }

    fn stop(self) {
        if let Some(task) = self.0 {
            task.abort();
            // Erase the line so the table starts clean.
            eprint!("\r\x1b[2K");
        }
    }
}

fn rand_id() -> u32 {
    let token = distlock::new_owner_token();
    u32::from_str_radix(token.get(..8).unwrap_or_default(), 16).unwrap_or_default()
}
