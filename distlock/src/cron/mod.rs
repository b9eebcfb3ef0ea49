//! Replica-safe cron (feature `cron`): every replica runs the same
//! [`Scheduler`] over the same [`Locker`], and each tick of each job runs
//! once across them, whatever their clocks say.
//!
//! ```
//! use std::time::Duration;
//! use distlock::cron::{Job, JobContext, Scheduler};
//! use distlock::LockerExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! // Any locker: a backend, an `Arc<dyn Locker>`, or one wrapped as here.
//! let locker = distlock::connect("memory://").await?.with_metrics();
//! let mut scheduler = Scheduler::new(locker).replica_id("web-1");
//! scheduler.add(
//!     Job::new("sweep", "*/5 * * * * *") // every 5 s (six fields: seconds first)
//!         .time_zone("Europe/Berlin")
//!         .at_most(Duration::from_secs(60)),
//!     |ctx: JobContext| async move {
//!         println!("{} at {} on {}", ctx.job(), ctx.scheduled_at(), ctx.replica());
//!         Ok(())
//!     },
//! )?;
//! let running = scheduler.start()?;
//! // ... until the service shuts down:
//! running.shutdown(Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! # How a tick runs
//!
//! For tick `T` (its scheduled instant, UTC) of job `J`, on every replica
//! whose clock reaches `T` (each replica tries a job's ticks in order: the
//! next once this one's steps 0–3 are decided; its run may go on):
//!
//! 0. **Peek** at the job's mark (`Locker::advance_mark("cron:J", 0)`, which
//!    changes nothing): at or past `T` means the tick already started
//!    somewhere: skip ("already ran").
//! 1. **Claim the tick**: `try_lock("cron:J@T", at_most)`. Held means
//!    another replica is on it ("held elsewhere"). With marks this replica
//!    keeps looking, never queueing, until that one has advanced the mark
//!    to `T`, or has released the claim without taking the tick (then this
//!    replica claims it), or the next tick is due. Without marks it skips at
//!    once: there a released claim may mean the tick ran.
//! 2. With [`Overlap::Forbid`] (the default), **take the job's key**
//!    `cron:J`, held for as long as the run lasts. Held means an earlier run
//!    still runs: skip ("previous run still running").
//! 3. **Advance the mark** `cron:J` to `T` while both are held
//!    ([`Locker::advance_mark`]): atomic and only growing, so exactly one
//!    replica advances it to `T`; the others find it there ("already ran").
//!    A backend error here means the tick may have been taken: the job does
//!    not run ("failed to claim"). The mark found past `T` means a later
//!    tick started while this replica claimed `T` (slower than the period):
//!    `T` can run nowhere any more ("missed").
//! 4. **Run** the handler with a [`JobContext`], keeping both claims alive
//!    ([`Lease::keep_alive`](crate::Lease::keep_alive), bounded by
//!    [`Job::at_most`]); a lost lock stops it.
//! 5. **Release** the job's key at once, and the tick's claim once
//!    [`Job::at_least`] after `T` has passed; then forget the tick's key
//!    ([`Locker::forget`]), so per-tick state does not pile up on the backend.
//!
//! # Guarantees
//!
//! - **Exactly once per tick, at most once per start.** With marks (memory,
//!   and every backend whose [`Capabilities::marks`](crate::Capabilities::marks)
//!   is true) no tick starts twice, whatever the clock skew between replicas:
//!   the mark is checked and written while the tick is claimed. A replica
//!   that crashes after step 3 has used the tick: it is **not** re-run
//!   elsewhere (as ShedLock, this is "at most once" for a tick whose runner
//!   died).
//! - **A tick runs while a replica is up**, with marks, unless one of these
//!   holds, each reported as shown: every replica that tried it found an
//!   earlier run still running ("previous running"; see [Missed
//!   ticks](#missed-ticks)); no replica tried it before the next tick was
//!   due (all down, paused, lagging by more than the period, or each still
//!   deciding its previous tick: "missed" where they woke late); the replica
//!   holding its claim neither advanced the mark nor released the claim
//!   before the next tick was due (a claim slower than the period: it then
//!   reports "missed"; or a replica hung or killed while claiming); its mark
//!   advance failed after reaching the backend (the tick counts as taken,
//!   not run); its runner died after step 3 (above); or a replica whose
//!   clock runs ahead by more than the period moved the mark past it
//!   ([clock skew](#clock-skew)). A replica that fails at step 2 or 3 and
//!   releases the claim hands the tick to those still looking. Without marks
//!   a claim found held is never waited for, so a tick whose winner fails
//!   after claiming it is not run.
//! - **A job's loop does not die**: if croner cannot compute the next tick
//!   (a clock that reads past its year-5000 limit), the job logs it at error
//!   level and counts it each time, and retries from the clock's time (1 s,
//!   doubling to 60 s); it runs no tick until that succeeds.
//! - **No overlap** with [`Overlap::Forbid`]: the job's key excludes a second
//!   run while one lasts, on any replica.
//! - **The job stops before its lock can lapse**: its claims are kept alive;
//!   a refresh that says `NotHeld`, a dead session, or [`Job::at_most`]
//!   reached fires [`JobContext::lost`] and drops the handler's future
//!   (unless it stops itself: [`Job::handler_watches_loss`]).
//!
//! # Clock skew
//!
//! A replica whose clock **lags** by any amount tries each tick late, finds
//! the mark at or past it, and skips it: no duplicate (ShedLock double-runs
//! here once the skew exceeds `lockAtLeastFor`:
//! <https://github.com/lukas-krecan/ShedLock#lock-assumptions>). A replica
//! whose clock runs **ahead** starts ticks early, by its skew. If it runs
//! ahead by more than the period, it advances the mark past ticks the others
//! have not reached yet; a tick it skipped itself (say, because an earlier
//! run still ran) is then missed by everybody. That is the bound: **no skew
//! causes a duplicate; a skew ahead of more than the period can cause
//! misses.** Keep replicas on NTP.
//!
//! # The marks are as durable as the backend
//!
//! That bound holds only while the backend keeps the marks. **A backend that
//! forgets a mark re-runs the tick it recorded**, whatever the clocks say:
//! after the mark is gone, a lagging replica, a replica started with
//! [`Missed::CatchUp`], or the same replica catching up after its run was
//! stopped finds no trace of the finished tick and runs it again; the job
//! key's fencing token can restart at 1 too. On Redis:
//!
//! - **Restart**: without `appendonly yes` a restart forgets every mark (with
//!   RDB snapshots only, it rolls back to the last snapshot). With
//!   `appendonly yes` and `appendfsync everysec` a crash loses at most about
//!   the last second's marks; `always` loses none.
//! - **Failover**: replication is asynchronous, so a promoted replica can
//!   lack the last mark, unless `min_replicas` is set (`?min_replicas=N`):
//!   each advanced mark then waits (`WAIT`) for N replicas, and a shortfall
//!   fails the claim (the tick is treated as taken, not run).
//! - **Eviction**: a server with `maxmemory` and an `allkeys-*` policy can
//!   evict marks; the Redis backend refuses such a server unless told to
//!   accept it (`allow_eviction`).
//!
//! The locker reports what it found when it connected as
//! [`Locker::durability_warnings`]: show them when the scheduler starts
//! (`distlock cron` prints them once on stderr; the Redis backend otherwise
//! logs them once at the first mark write). Postgres, MySQL and etcd keep
//! marks as durably as their other data (their own durability settings).
//!
//! **Backends without marks** ([`Error::Unsupported`]
//! from `advance_mark`) fall back to ShedLock's `lockAtLeastFor` semantics,
//! with a warning logged once per job: the tick's claim is held until
//! `max(at_least, max_skew)` after `T` (capped at `at_most`), so replicas
//! lagging by less than [`Job::max_skew`] (default 5 s) find it held; a
//! larger lag can re-run a finished tick. [`Missed::CatchUp`] is off there.
//!
//! # Daylight saving time
//!
//! Schedules are read in the job's IANA time zone by croner
//! (<https://github.com/hexagon/croner-rust#daylight-saving-time-dst-handling>):
//!
//! - **Gap** (spring forward, 02:00 → 03:00): a fixed-time job (`30 2 * * *`)
//!   runs at the first instant after the gap, the same day; an interval or
//!   wildcard job (`*/15 * * * *`) skips the times that do not exist.
//! - **Overlap** (fall back, 03:00 → 02:00): a fixed-time job runs once, in
//!   the first pass; an interval job runs in both passes (they are distinct
//!   UTC instants, so distinct ticks).
//!
//! Ticks are identified by their UTC instant, so a DST change never makes
//! two replicas disagree about which tick is which.
//!
//! # Missed ticks
//!
//! A tick nobody tried (every replica down) or everybody skipped (a run
//! longer than the period under [`Overlap::Forbid`]) is skipped by default.
//! [`Missed::CatchUp`] runs the latest such tick once, within a bounded
//! look-back, when a replica starts or a run ends on it. A replica that wakes
//! later than a tick it slept for (a paused process, a clock that jumped, a
//! claim of its previous tick slower than the period) runs the latest due
//! tick and reports the ones before it as [`TickOutcome::Missed`].
//!
//! # Shutdown
//!
//! [`RunningScheduler::shutdown`] stops starting ticks, lets running jobs
//! finish within the grace period (tick claims stay held until `at_least`
//! within it), then fires [`JobContext::stop_requested`] and drops the jobs
//! still running [`Scheduler::stop_timeout`] later. Their claims are
//! released, or where that fails freed by the backend's safety net.
//!
//! # Observability
//!
//! One [`TickReport`] per tick per replica ([`Scheduler::on_tick`]), a
//! `cron_tick` span per tick (job, scheduled_at, replica, outcome), an info
//! event per tick, and through the [`metrics`] facade:
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `distlock_cron_ticks_total` | counter | job, outcome ([`TickOutcome::label`]) |
//! | `distlock_cron_run_duration_seconds` | histogram | job |
//! | `distlock_cron_lag_seconds` | histogram | job (scheduled instant to start) |
//! | `distlock_cron_schedule_errors_total` | counter | job (croner could not compute the next tick; retried) |
//!
//! Labels never carry a key or an instant. Wrap the locker with
//! [`LockerExt::with_metrics`](crate::LockerExt::with_metrics) and
//! [`with_tracing`](crate::LockerExt::with_tracing) to see each claim too.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::FutureExt;
use metrics::counter;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{Error, Locker, Result};

mod clock;
mod job;
mod tick;

pub use chrono;
pub use clock::{Clock, SkewedClock, SystemClock, TokioClock};
pub use job::{Job, Missed, Overlap, DEFAULT_AT_MOST, DEFAULT_MAX_SKEW, MAX_JOB_NAME_LEN};
pub use tick::{JobContext, JobResult, TickOutcome, TickReport};

use job::{since, Compiled};
use tick::{Handler, JobEnv, Observer, Phase};

/// Default [`Scheduler::stop_timeout`].
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs named jobs on cron schedules, each tick once across every replica
/// that runs the same jobs over the same backend (see the [module
/// docs](self)).
pub struct Scheduler {
    shared: Shared,
    jobs: Vec<(Compiled, Handler)>,
}

/// What every job of a scheduler shares.
struct Shared {
    locker: Arc<dyn Locker>,
    clock: Arc<dyn Clock>,
    replica: Arc<str>,
    observer: Option<Observer>,
    stop_timeout: Duration,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("locker", &self.shared.locker)
            .field("replica", &self.shared.replica)
            .field(
                "jobs",
                &self
                    .jobs
                    .iter()
                    .map(|(job, _)| &job.name)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler with no jobs over `locker`, on the system clock, named
    /// `hostname:pid`. `locker` is any [`Locker`]: a backend, a wrapped one
    /// (`MemoryLocker::new().with_metrics()`), or an `Arc<dyn Locker>`
    /// shared with the rest of the program (kept as it is, not boxed again).
    pub fn new(locker: impl Locker) -> Self {
        Scheduler {
            shared: Shared {
                locker: crate::lease::into_shared(locker),
                clock: Arc::new(SystemClock),
                replica: default_replica_id().into(),
                observer: None,
                stop_timeout: DEFAULT_STOP_TIMEOUT,
            },
            jobs: Vec::new(),
        }
    }

    /// Names this replica in logs, reports and [`JobContext::replica`]
    /// (default `hostname:pid`).
    pub fn replica_id(mut self, id: impl Into<String>) -> Self {
        self.shared.replica = id.into().into();
        self
    }

    /// Reads the time from `clock` instead of the system's (tests: a
    /// [`TokioClock`] on paused time, a [`SkewedClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.shared.clock = Arc::new(clock);
        self
    }

    /// Calls `observer` once per tick per replica with what happened. It
    /// runs on the tick's task: keep it quick.
    pub fn on_tick(mut self, observer: impl Fn(&TickReport) + Send + Sync + 'static) -> Self {
        self.shared.observer = Some(Arc::new(observer));
        self
    }

    /// How long a job still running when the shutdown's grace period ends
    /// may take to stop after [`JobContext::stop_requested`] fires, before
    /// its future is dropped (default [`DEFAULT_STOP_TIMEOUT`]).
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.shared.stop_timeout = timeout;
        self
    }

    /// Adds `job`, run by `handler` on every tick this replica wins.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the job and the field for anything
    /// [`Job::validate`] rejects, or for a second job of the same name.
    pub fn add<F, Fut>(&mut self, job: Job, handler: F) -> Result<()>
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = JobResult> + Send + 'static,
    {
        let compiled = job.compile()?;
        if self
            .jobs
            .iter()
            .any(|(other, _)| other.name == compiled.name)
        {
            return Err(Error::invalid(
                "job name",
                format!("job {:?} is defined twice", compiled.name),
            ));
        }
        let handler: Handler = Arc::new(move |context| handler(context).boxed());
        self.jobs.push((compiled, handler));
        Ok(())
    }

    /// Starts every job on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] outside a tokio runtime.
    pub fn start(self) -> Result<RunningScheduler> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "runtime",
                "Scheduler::start must be called inside a tokio runtime",
            )
        })?;
        let (phase, watcher) = watch::channel(Phase::Running);
        let mut loops = JoinSet::new();
        let mut names = HashSet::new();
        for (job, handler) in self.jobs {
            names.insert(job.name.clone());
            let env = Arc::new(JobEnv::new(job, handler, &self.shared, watcher.clone()));
            loops.spawn_on(job_loop(env), &runtime);
        }
        Ok(RunningScheduler {
            phase,
            loops,
            stop_timeout: self.shared.stop_timeout,
        })
    }

    /// Runs every job until `shutdown` resolves, then shuts down with
    /// `grace` (see [`RunningScheduler::shutdown`]).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops every job's future at once; their leases
    /// are released in the background.
    pub async fn run(self, shutdown: impl Future<Output = ()>, grace: Duration) -> Result<()> {
        let running = self.start()?;
        shutdown.await;
        running.shutdown(grace).await;
        Ok(())
    }
}

/// A started [`Scheduler`]. Dropping it stops every job at once (their
/// futures are dropped, their leases released in the background); prefer
/// [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct RunningScheduler {
    phase: watch::Sender<Phase>,
    loops: JoinSet<()>,
    stop_timeout: Duration,
}

impl RunningScheduler {
    /// Graceful shutdown: no new ticks start; running jobs may finish
    /// within `grace` (and tick claims stay held until `at_least` within
    /// it); then [`JobContext::stop_requested`] fires and jobs still running
    /// [`Scheduler::stop_timeout`] later are dropped. Returns when every
    /// claim is released; at most about `grace + stop_timeout` plus the
    /// releases' own bound.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops every job still running.
    pub async fn shutdown(mut self, grace: Duration) {
        self.phase.send_replace(Phase::Draining);
        if self.join_within(grace).await {
            return;
        }
        self.phase.send_replace(Phase::Stopping);
        // Past the stop timeout the tick tasks drop their handlers and
        // release; give the releases their own bound.
        let releases = crate::DEFAULT_RELEASE_TIMEOUT.saturating_mul(2);
        if self
            .join_within(self.stop_timeout.saturating_add(releases))
            .await
        {
            return;
        }
        tracing::warn!(
            component = "distlock",
            "cron jobs did not stop in time; dropping them"
        );
        self.loops.shutdown().await;
    }

    /// True if every job loop ended within `limit`.
    async fn join_within(&mut self, limit: Duration) -> bool {
        let all = async { while self.loops.join_next().await.is_some() {} };
        tokio::time::timeout(limit, all).await.is_ok()
    }
}

/// `hostname:pid`, or `pid` alone if the host name cannot be read.
fn default_replica_id() -> String {
    match crate::inspect::host_name() {
        "" => std::process::id().to_string(),
        host => format!("{host}:{}", std::process::id()),
    }
}

/// Ticks counted when reporting a late wake-up, at most.
const MISSED_COUNT_LIMIT: u64 = 10_000;
/// The longest sleep between two looks at the clock: a wall clock that is
/// stepped (NTP, a test's skew) is noticed within this.
const CLOCK_RECHECK: Duration = Duration::from_secs(1);

/// The first pause before computing a job's next tick again after croner
/// failed to; it doubles up to [`SCHEDULE_RETRY_MAX`].
const SCHEDULE_RETRY_MIN: Duration = Duration::from_secs(1);
const SCHEDULE_RETRY_MAX: Duration = Duration::from_secs(60);

/// One job on this replica: sleep to each tick, hand it to a task, repeat
/// until the scheduler drains; then wait for the tick tasks.
async fn job_loop(env: Arc<JobEnv>) {
    let mut tasks = JoinSet::new();
    let mut phase = env.phase.clone();
    let look_back = match env.job.missed {
        Missed::CatchUp { look_back } => Some(look_back),
        Missed::Skip => None,
    };
    let mut cursor = env.clock.now();
    let mut retry = SCHEDULE_RETRY_MIN;
    if let Some(look_back) = look_back {
        catch_up(&env, &mut tasks, cursor, look_back);
    }
    while *phase.borrow() == Phase::Running {
        let next = match env.job.next_after(cursor) {
            Ok(next) => {
                retry = SCHEDULE_RETRY_MIN;
                next
            }
            Err(error) => {
                // Ending the loop here left the job dead in a running
                // process after one warning. croner's errors depend on the
                // instant searched from (a clock that read nonsense), so
                // keep the loop and retry from the clock's time, which
                // skips the ticks in between: say so at error level, each
                // time, and count it.
                counter!("distlock_cron_schedule_errors_total", "job" => env.job.name.clone())
                    .increment(1);
                tracing::error!(
                    component = "distlock",
                    job = %env.job.name,
                    after = %cursor.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                    %error,
                    retry_in = ?retry,
                    "cron: cannot compute the job's next tick; it runs no tick until this succeeds"
                );
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    changed = phase.changed() => if changed.is_err() { break },
                }
                retry = retry.saturating_mul(2).min(SCHEDULE_RETRY_MAX);
                cursor = env.clock.now();
                continue;
            }
        };
        let left = since(next, env.clock.now());
        if !left.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(left.min(CLOCK_RECHECK)) => {}
                changed = phase.changed() => if changed.is_err() { break },
                () = env.run_ended.notified(), if look_back.is_some() => {
                    if let Some(look_back) = look_back {
                        catch_up(&env, &mut tasks, env.clock.now(), look_back);
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
            continue;
        }
        // Due. If this replica woke late, the latest due tick runs and the
        // ones before it are reported missed.
        let now = env.clock.now();
        let due = env
            .job
            .latest_at_or_before(now)
            .filter(|due| *due > next)
            .unwrap_or(next);
        if due > next {
            let count = count_between(&env.job, next, due);
            tick::report(&env, next, false, TickOutcome::Missed { count });
        }
        cursor = due;
        // The next tick waits until this one's claim is decided: claimed
        // concurrently, a later tick could advance the mark past this one
        // while its claim is slow, and it could then run nowhere. A claim
        // slower than the period makes this replica try the next tick late
        // (or report it missed, above) instead.
        let (claimed, decided) = tokio::sync::oneshot::channel();
        tasks.spawn(tick::tick(env.clone(), due, false, Some(claimed)));
        tokio::select! {
            // The tick's task drops its end once the claim is decided.
            _ = decided => {}
            _ = phase.wait_for(|p| *p != Phase::Running) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// Ticks from `first` (included) to `last` (excluded), up to
/// [`MISSED_COUNT_LIMIT`].
fn count_between(job: &Compiled, first: DateTime<Utc>, last: DateTime<Utc>) -> u64 {
    let mut count = 0;
    let mut at = first;
    while at < last && count < MISSED_COUNT_LIMIT {
        count += 1;
        match job.next_after(at) {
            Ok(next) => at = next,
            Err(_) => break,
        }
    }
    count
}

/// Tries the latest tick at or before `now`, if it lies within
/// `look_back`: the mark decides whether anyone ran it.
fn catch_up(env: &Arc<JobEnv>, tasks: &mut JoinSet<()>, now: DateTime<Utc>, look_back: Duration) {
    let Some(latest) = env.job.latest_at_or_before(now) else {
        return;
    };
    if since(now, latest) <= look_back {
        tasks.spawn(tick::tick(env.clone(), latest, true, None));
    }
}

#[cfg(test)]
mod tests;
