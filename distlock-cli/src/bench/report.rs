//! What a run measured, printed as a table row or as one JSON object.

use distlock::Locker;
use serde::Serialize;

use super::stats::Summary;
use crate::cli::{BenchArgs, Workload};

/// One run: one workload at one client count. Serialized with a
/// `"workload"` field naming the variant.
#[derive(Debug, Serialize)]
#[serde(tag = "workload", rename_all = "snake_case")]
pub(crate) enum Run {
    Uncontended(UncontendedRun),
    Contended(ContendedRun),
    Hold(HoldRun),
    Handoff(HandoffRun),
    Failover(FailoverRun),
    Permits(PermitsRun),
}

impl Run {
    fn common(&self) -> &Common {
        match self {
            Run::Uncontended(run) => &run.common,
            Run::Contended(run) => &run.common,
            Run::Hold(run) => &run.common,
            Run::Handoff(run) => &run.common,
            Run::Failover(run) => &run.common,
            Run::Permits(run) => &run.common,
        }
    }

    pub(crate) fn first_error(&self) -> Option<&str> {
        self.common().first_error.as_deref()
    }
}

/// Fields of every run.
#[derive(Debug, Serialize)]
pub(crate) struct Common {
    pub(crate) backend: &'static str,
    pub(crate) clients: usize,
    /// Measured time: the run's, or for hold the time the leases were held.
    pub(crate) duration_s: f64,
    pub(crate) ttl_s: f64,
    pub(crate) errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct UncontendedRun {
    #[serde(flatten)]
    pub(crate) common: Common,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_s: f64,
    pub(crate) acquire_us: Summary,
    pub(crate) release_us: Summary,
    /// Attempts that found a client's own key held (should stay 0).
    pub(crate) contended: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ContendedRun {
    #[serde(flatten)]
    pub(crate) common: Common,
    pub(crate) handoffs: u64,
    pub(crate) handoffs_per_s: f64,
    /// From one holder's release being sent to the next holder's grant returning.
    pub(crate) handoff_gap_us: Summary,
    /// Time in `lock` until granted.
    pub(crate) wait_us: Summary,
    pub(crate) release_us: Summary,
    /// Waits that ended without the lock (the run's end cuts the last ones).
    pub(crate) timeouts: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct HoldRun {
    #[serde(flatten)]
    pub(crate) common: Common,
    pub(crate) leases: u64,
    pub(crate) not_acquired: u64,
    pub(crate) acquire_s: f64,
    pub(crate) acquire_us: Summary,
    /// Resident memory grown per held lease, before the keepalives start
    /// (from `/proc/self/statm`, after glibc returned its free pages;
    /// includes the connections opened to acquire).
    pub(crate) bytes_per_lease: Option<f64>,
    /// The same at the end of the hold, with a keepalive running on every
    /// lease.
    pub(crate) bytes_per_lease_with_keepalive: Option<f64>,
    /// Bytes of live allocations grown per held lease (glibc's `mallinfo2`):
    /// what the leases themselves hold, without the allocator's free pages
    /// and fragmentation.
    pub(crate) heap_bytes_per_lease: Option<f64>,
    /// The same, with a keepalive running on every lease.
    pub(crate) heap_bytes_per_lease_with_keepalive: Option<f64>,
    /// Established TCP connections of this process while holding (from
    /// `/proc/self/fd` and `/proc/self/net/tcp*`): the server connections
    /// used, for a backend reached without a proxy.
    pub(crate) tcp_connections: Option<usize>,
    pub(crate) tcp_connections_before: Option<usize>,
    pub(crate) open_descriptors: Option<usize>,
    pub(crate) open_descriptors_before: Option<usize>,
    /// `refresh` calls the keepalives made while holding.
    pub(crate) refreshes: u64,
    pub(crate) refreshes_per_s: f64,
    /// The calls those refreshes reached the backend in (`refresh_many`
    /// batches and single refreshes): its keepalive traffic.
    pub(crate) refresh_batches: u64,
    pub(crate) refresh_batches_per_s: f64,
    pub(crate) refresh_failures: u64,
    pub(crate) keepalive_errors: u64,
    /// Leases whose lost signal had fired by the end of the hold.
    pub(crate) lost: u64,
    pub(crate) release_s: f64,
    pub(crate) release_us: Summary,
}

#[derive(Debug, Serialize)]
pub(crate) struct HandoffRun {
    /// `clients` is the number of candidates: the leader and the one waiting.
    #[serde(flatten)]
    pub(crate) common: Common,
    pub(crate) handoffs: u64,
    /// From the leader's `resign` starting to the waiting candidate's
    /// `campaign` returning.
    pub(crate) handoff_us: Summary,
    /// The leader's `resign`, start to return.
    pub(crate) resign_us: Summary,
    /// `try_lock` + `release` of a free key, by the leader's client
    /// between handoffs: at least two round trips to a server backend.
    pub(crate) cycle_us: Summary,
    /// `inspect` of a free key, by the same client: a read, one query or
    /// request (heavier than a ping on Postgres, which reads `pg_locks`).
    pub(crate) inspect_us: Summary,
    /// The median handoff over the median cycle: a handoff is a release,
    /// the wake-up and an acquire, about a cycle and one hop, so 1.5
    /// cycles is about three round trips.
    pub(crate) handoff_per_cycle: Option<f64>,
    /// A `release` of a free key the same client took, after the same
    /// quiet the resign follows (the waiting candidate's 100 ms) and with
    /// nobody waiting: one round trip from idle, the resign's
    /// like-for-like reference.
    pub(crate) idle_release_us: Summary,
    /// The median handoff over the median idle release: the handoff in
    /// round trips from idle (a release, the waiter's wake-up and its
    /// acquire).
    pub(crate) handoff_per_idle_release: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct FailoverRun {
    /// `clients` is the number of `distlock elect` replicas.
    #[serde(flatten)]
    pub(crate) common: Common,
    pub(crate) failovers: u64,
    /// From the leader's SIGKILL to the next leader's command's first line.
    pub(crate) failover_us: Summary,
}

#[derive(Debug, Serialize)]
pub(crate) struct PermitsRun {
    /// `duration_s` is the whole run: every slice.
    #[serde(flatten)]
    pub(crate) common: Common,
    /// The semaphore's permits (N).
    pub(crate) permits: u32,
    /// The native, generic and lock slices take turns, each this long.
    pub(crate) slice_s: f64,
    /// Permits through the locker's own `try_lock_any` (native where the
    /// backend has its own attempt, else the same default as `generic`);
    /// its fields are the run's top-level ones.
    #[serde(flatten)]
    pub(crate) native: PermitPath,
    /// Permits through the trait's default `try_lock_any`, one `try_lock`
    /// per key tried, on the same locker.
    pub(crate) generic: Box<PermitPath>,
    /// The lock's own cycle (`try_lock` + `release` of a key per client),
    /// in the lock slices of the same run.
    pub(crate) lock_cycles: u64,
    pub(crate) lock_cycles_per_s: f64,
    pub(crate) lock_acquire_us: Summary,
    pub(crate) lock_release_us: Summary,
    /// Lock attempts that found a client's own key held (should stay 0).
    pub(crate) lock_contended: u64,
}

/// One permit path of the permits workload.
#[derive(Debug, Serialize)]
pub(crate) struct PermitPath {
    /// `try_acquire` + `release` of a permit, completed.
    pub(crate) cycles: u64,
    /// Cycles per second of this path's slices.
    pub(crate) cycles_per_s: f64,
    /// `try_acquire` calls that returned a permit.
    pub(crate) acquire_us: Summary,
    pub(crate) release_us: Summary,
    /// `try_acquire` calls: those that returned a permit and those that
    /// found every permit held (each followed by a 1 ms pause).
    pub(crate) attempts: u64,
    pub(crate) full: u64,
    /// `full` / `attempts`.
    pub(crate) full_fraction: f64,
    /// `try_acquire` calls that found every permit held.
    pub(crate) full_attempt_us: Summary,
    /// Mean calls to the locker (`try_lock_any`, `try_lock`, `inspect`) per
    /// `try_acquire` that returned a permit, and per one that found all
    /// held; the most one attempt made. On one Redis server each call is
    /// one script, one round trip; a backend without its own
    /// `try_lock_any` makes up to N requests inside its one call.
    pub(crate) calls_per_acquire: Option<f64>,
    pub(crate) calls_per_full: Option<f64>,
    pub(crate) most_calls: u64,
    /// Cycles per second over the lock's cycles per second.
    pub(crate) permit_per_lock: Option<f64>,
}

/// Prints runs as a table (a description line, a column header, a row per
/// run) or as JSON (one object per line, per run).
pub(crate) struct Printer {
    json: bool,
    workload: Workload,
}

impl Printer {
    pub(crate) fn new(json: bool, workload: Workload) -> Self {
        Printer { json, workload }
    }

    pub(crate) fn header(&self, locker: &dyn Locker, args: &BenchArgs) {
        if self.json {
            return;
        }
        let duration = humantime::format_duration(args.duration);
        let ttl = humantime::format_duration(args.ttl);
        let backend = locker.backend();
        match self.workload {
            Workload::Uncontended => {
                println!("backend {backend}, uncontended (one key per client), {duration} per run, ttl {ttl}; latencies in µs");
                println!(
                    "{:>7} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}",
                    "clients",
                    "cycles",
                    "cycles/s",
                    "acq p50",
                    "acq p99",
                    "acq p999",
                    "rel p50",
                    "rel p99",
                    "rel p999",
                    "errors"
                );
            }
            Workload::Contended => {
                println!("backend {backend}, contended (every client on one key through lock), {duration} per run, ttl {ttl}; latencies in µs");
                println!(
                    "{:>7} {:>9} {:>10} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7}",
                    "clients",
                    "handoffs",
                    "handoffs/s",
                    "gap p50",
                    "gap p99",
                    "gap p999",
                    "wait p99",
                    "timeouts",
                    "errors"
                );
            }
            Workload::Hold => {
                println!(
                    "backend {backend}, hold {} leases with keepalive for {duration}, ttl {ttl} (refresh every ttl/3)",
                    args.keys
                );
                println!(
                    "{:>7} {:>8} {:>10} {:>12} {:>9} {:>11} {:>11} {:>9} {:>10} {:>5} {:>9} {:>7}",
                    "clients",
                    "leases",
                    "B/lease",
                    "B/lease+ka",
                    "heap B",
                    "heap B+ka",
                    "tcp conns",
                    "refreshes",
                    "refresh/s",
                    "lost",
                    "acquire s",
                    "errors"
                );
            }
            Workload::Handoff => {
                println!("backend {backend}, handoff (the leader resigns to a waiting candidate), {} runs, ttl {ttl}; latencies in ms", args.runs);
                println!(
                    "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7}",
                    "handoffs",
                    "p50",
                    "p99",
                    "max",
                    "resign",
                    "cycle",
                    "inspect",
                    "p50/cycle",
                    "idle rel",
                    "p50/idle",
                    "errors"
                );
            }
            Workload::Failover => {
                println!("backend {backend}, failover (SIGKILL the leader of {} `distlock elect` replicas), {} runs, ttl {ttl}; latencies in ms", super::election::REPLICAS, args.runs);
                println!(
                    "{:>9} {:>8} {:>8} {:>8} {:>8} {:>7}",
                    "failovers", "p50", "p99", "max", "min", "errors"
                );
            }
            Workload::Permits => {
                println!("backend {backend}, permits (semaphore try_acquire + release, 1 ms pause when full) through the locker's own try_lock_any (native) and the trait's default one key at a time (generic), beside the lock's own cycle (try_lock + release, a key per client), taking turns in slices, {duration} per run, ttl {ttl}; latencies in µs; calls: to the locker per attempt (mean when granted, when full; most)");
                println!(
                    "{:>7} {:>7} {:>7} {:>9} {:>10} {:>8} {:>8} {:>9} {:>6} {:>9} {:>10} {:>5} {:>11} {:>8} {:>8} {:>8} {:>7}",
                    "clients",
                    "permits",
                    "path",
                    "cycles",
                    "cycles/s",
                    "acq p50",
                    "acq p99",
                    "calls/acq",
                    "full %",
                    "full p50",
                    "calls/full",
                    "most",
                    "lock cyc/s",
                    "lock p50",
                    "lock p99",
                    "÷lock",
                    "errors"
                );
            }
        }
    }

    pub(crate) fn row(&self, run: &Run) {
        if self.json {
            match serde_json::to_string(run) {
                Ok(line) => println!("{line}"),
                Err(error) => eprintln!("distlock: cannot encode the run as JSON: {error}"),
            }
            return;
        }
        match run {
            Run::Uncontended(r) => println!(
                "{:>7} {:>9} {:>10.0} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7}",
                r.common.clients,
                r.cycles,
                r.cycles_per_s,
                r.acquire_us.p50,
                r.acquire_us.p99,
                r.acquire_us.p999,
                r.release_us.p50,
                r.release_us.p99,
                r.release_us.p999,
                r.common.errors
            ),
            Run::Contended(r) => println!(
                "{:>7} {:>9} {:>10.0} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>8} {:>7}",
                r.common.clients,
                r.handoffs,
                r.handoffs_per_s,
                r.handoff_gap_us.p50,
                r.handoff_gap_us.p99,
                r.handoff_gap_us.p999,
                r.wait_us.p99,
                r.timeouts,
                r.common.errors
            ),
            Run::Hold(r) => {
                println!(
                "{:>7} {:>8} {:>10} {:>12} {:>9} {:>11} {:>11} {:>9} {:>10.1} {:>5} {:>9.2} {:>7}",
                r.common.clients,
                r.leases,
                optional(r.bytes_per_lease.map(|b| format!("{b:.0}"))),
                optional(r.bytes_per_lease_with_keepalive.map(|b| format!("{b:.0}"))),
                optional(r.heap_bytes_per_lease.map(|b| format!("{b:.0}"))),
                optional(r.heap_bytes_per_lease_with_keepalive.map(|b| format!("{b:.0}"))),
                optional(r.tcp_connections.map(|n| n.to_string())),
                r.refreshes,
                r.refreshes_per_s,
                r.lost,
                r.acquire_s,
                r.common.errors
            )
            }
            Run::Handoff(r) => println!(
                "{:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>9.2} {:>9} {:>7}",
                r.handoffs,
                millis(r.handoff_us.p50),
                millis(r.handoff_us.p99),
                millis(r.handoff_us.max),
                millis(r.resign_us.p50),
                millis(r.cycle_us.p50),
                millis(r.inspect_us.p50),
                optional(r.handoff_per_cycle.map(|n| format!("{n:.1}"))),
                millis(r.idle_release_us.p50),
                optional(r.handoff_per_idle_release.map(|n| format!("{n:.1}"))),
                r.common.errors
            ),
            Run::Failover(r) => println!(
                "{:>9} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7}",
                r.failovers,
                millis(r.failover_us.p50),
                millis(r.failover_us.p99),
                millis(r.failover_us.max),
                millis(r.failover_us.min),
                r.common.errors
            ),
            Run::Permits(r) => {
                for (path, p) in [("native", &r.native), ("generic", &r.generic)] {
                    println!(
                        "{:>7} {:>7} {:>7} {:>9} {:>10.0} {:>8.1} {:>8.1} {:>9} {:>6.1} {:>9.1} {:>10} {:>5} {:>11.0} {:>8.1} {:>8.1} {:>8} {:>7}",
                        r.common.clients,
                        r.permits,
                        path,
                        p.cycles,
                        p.cycles_per_s,
                        p.acquire_us.p50,
                        p.acquire_us.p99,
                        optional(p.calls_per_acquire.map(|n| format!("{n:.2}"))),
                        p.full_fraction * 100.0,
                        p.full_attempt_us.p50,
                        optional(p.calls_per_full.map(|n| format!("{n:.2}"))),
                        p.most_calls,
                        r.lock_cycles_per_s,
                        r.lock_acquire_us.p50,
                        r.lock_acquire_us.p99,
                        optional(p.permit_per_lock.map(|n| format!("{n:.2}"))),
                        r.common.errors
                    );
                }
            }
        }
    }
}

fn millis(micros: f64) -> f64 {
    micros / 1000.0
}

fn optional(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".into())
}
