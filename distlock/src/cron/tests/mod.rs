//! Several schedulers in one process over one locker, on tokio's paused
//! clock with [`TokioClock`]: exactly once per tick under skew, no overlap,
//! a replica stopped mid-run, DST, the no-marks fallback, catch-up,
//! shutdown, at_least and at_most. The fixtures are here; the tests are
//! grouped by what they check.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use super::*;
use crate::memory::MemoryLocker;
use crate::{Capabilities, Lease, LostReason, MarkAdvance, ReleaseWatch};

mod claims;
mod clock_errors;
mod missed_ticks;
mod schedule;

fn start() -> DateTime<Utc> {
    // Half a second past a whole second, so ticks fall between wake-ups of
    // the test.
    Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap() + TimeDelta::milliseconds(500)
}

/// Runs per tick instant, with the replicas that ran them.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<DateTime<Utc>, Vec<String>>>>);

impl Runs {
    fn record(&self, ctx: &JobContext) {
        self.0
            .lock()
            .unwrap()
            .entry(ctx.scheduled_at())
            .or_default()
            .push(ctx.replica().to_owned());
    }
    fn snapshot(&self) -> BTreeMap<DateTime<Utc>, Vec<String>> {
        self.0.lock().unwrap().clone()
    }
}

/// Every report of every replica, as (replica, instant, outcome label).
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<Seen>>>);

/// (replica, instant, outcome label).
type Seen = (String, DateTime<Utc>, &'static str);

impl Reports {
    /// (replica, outcome label) of each report of tick `at`, sorted.
    fn of(&self, at: DateTime<Utc>) -> Vec<(String, &'static str)> {
        let mut seen: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.1 == at)
            .map(|r| (r.0.clone(), r.2))
            .collect();
        seen.sort();
        seen
    }
    fn observer(&self) -> impl Fn(&TickReport) + Send + Sync + 'static {
        let reports = self.0.clone();
        move |report: &TickReport| {
            reports.lock().unwrap().push((
                report.replica.to_string(),
                report.scheduled_at,
                report.outcome.label(),
            ))
        }
    }
    fn count(&self, label: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.2 == label)
            .count()
    }
}

fn every_second(name: &str) -> Job {
    Job::new(name, "* * * * * *").at_most(Duration::from_secs(30))
}

/// Asserts each whole second in `[from, to]` ran exactly once and nothing
/// else ran.
fn assert_exactly_once(
    runs: &BTreeMap<DateTime<Utc>, Vec<String>>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) {
    let duplicates: Vec<_> = runs.iter().filter(|(_, who)| who.len() > 1).collect();
    assert!(
        duplicates.is_empty(),
        "ticks run more than once: {duplicates:?}"
    );
    let mut at = from;
    let mut missing = Vec::new();
    while at <= to {
        if !runs.contains_key(&at) {
            missing.push(at);
        }
        at += TimeDelta::seconds(1);
    }
    assert!(
        missing.is_empty(),
        "ticks never run: {missing:?} (ran: {runs:?})"
    );
}

/// Asserts the ticks run were exactly `expected`, each by one replica;
/// `context` (the case of a table test) prefixes the failure message.
fn assert_ran_each_once(
    runs: &BTreeMap<DateTime<Utc>, Vec<String>>,
    expected: &[DateTime<Utc>],
    context: &str,
) {
    assert_eq!(
        runs.keys().copied().collect::<Vec<_>>(),
        expected,
        "{context}: {runs:?}"
    );
    assert!(runs.values().all(|who| who.len() == 1), "{runs:?}");
}

/// `Arc<dyn Clock>` as a clock (the tests pick clocks at run time).
#[derive(Debug)]
struct ArcClock(Arc<dyn Clock>);

impl Clock for ArcClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}

/// Memory with faults injected into chosen calls, and optionally without
/// marks (what a backend that cannot store them looks like).
#[derive(Debug, Clone, Default)]
struct Faulty {
    inner: MemoryLocker,
    no_marks: bool,
    faults: Arc<Mutex<Vec<Fault>>>,
}

/// One injected fault: the next `times` calls `call` on `key` (a
/// `try_lock` key, or the name of an `advance_mark` that writes, not a
/// peek) answer `delay` late (the call takes effect at once, its reply is
/// slow), or fail with a backend error `delay` late without reaching the
/// backend (a timeout).
#[derive(Debug, Clone)]
struct Fault {
    call: &'static str,
    key: String,
    delay: Duration,
    fail: bool,
    times: usize,
}

impl Faulty {
    fn no_marks() -> Self {
        Faulty {
            no_marks: true,
            ..Faulty::default()
        }
    }

    /// Another view of the same memory with faults of its own (one replica's
    /// slow or failing connection).
    fn sibling(&self) -> Self {
        Faulty {
            inner: self.inner.clone(),
            no_marks: self.no_marks,
            faults: Arc::default(),
        }
    }

    fn slow(self, call: &'static str, key: &str, delay: Duration) -> Self {
        self.inject(call, key, delay, false)
    }

    fn failing(self, call: &'static str, key: &str, after: Duration) -> Self {
        self.inject(call, key, after, true)
    }

    fn inject(self, call: &'static str, key: &str, delay: Duration, fail: bool) -> Self {
        self.faults.lock().unwrap().push(Fault {
            call,
            key: key.to_owned(),
            delay,
            fail,
            times: 1,
        });
        self
    }

    /// The fault injected into this call, if any (used up by it).
    fn fault(&self, call: &str, key: &str) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap();
        let fault = faults
            .iter_mut()
            .find(|f| f.call == call && f.key == key && f.times > 0)?;
        fault.times -= 1;
        Some(fault.clone())
    }

    async fn around<T>(
        &self,
        call: &'static str,
        key: &str,
        real: impl Future<Output = crate::Result<T>>,
    ) -> crate::Result<T> {
        let Some(fault) = self.fault(call, key) else {
            return real.await;
        };
        if fault.fail {
            tokio::time::sleep(fault.delay).await;
            return Err(Error::backend(
                "faulty",
                call,
                std::io::Error::other("injected failure"),
            ));
        }
        let result = real.await;
        tokio::time::sleep(fault.delay).await;
        result
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Locker for Faulty {
    fn backend(&self) -> &'static str {
        "faulty"
    }
    crate::forward::forward_to_inner!(durability_warnings, backend_key);
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            marks: !self.no_marks,
            ..self.inner.capabilities()
        }
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> crate::Result<Option<Lease>> {
        let lease = self
            .around("try_lock", key, self.inner.try_lock(key, ttl))
            .await?;
        Ok(lease.map(|lease| lease.rebind(Arc::new(self.clone()))))
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> crate::Result<Lease> {
        let lease = self.inner.lock(key, ttl, timeout).await?;
        Ok(lease.rebind(Arc::new(self.clone())))
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> crate::Result<Option<Lease>> {
        let first = keys.first().map_or("", String::as_str);
        let lease = self
            .around("try_lock_any", first, self.inner.try_lock_any(keys, ttl))
            .await?;
        Ok(lease.map(|lease| lease.rebind(Arc::new(self.clone()))))
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> crate::Result<Option<Lease>> {
        let lease = self
            .around("try_lock_shared", key, self.inner.try_lock_shared(key, ttl))
            .await?;
        Ok(lease.map(|lease| lease.rebind(Arc::new(self.clone()))))
    }
    async fn lock_shared(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> crate::Result<Lease> {
        let lease = self.inner.lock_shared(key, ttl, timeout).await?;
        Ok(lease.rebind(Arc::new(self.clone())))
    }
    async fn unlock(&self, key: &str, owner: &str) -> crate::Result<()> {
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> crate::Result<()> {
        self.inner.refresh(key, owner, ttl).await
    }
    async fn refresh_many(&self, requests: &[crate::RefreshRequest<'_>]) -> Vec<crate::Result<()>> {
        self.inner.refresh_many(requests).await
    }
    async fn forget(&self, key: &str) -> crate::Result<()> {
        self.inner.forget(key).await
    }
    async fn advance_mark(&self, name: &str, value: i64) -> crate::Result<MarkAdvance> {
        if self.no_marks {
            return Err(Error::unsupported("faulty", "advance_mark", "test"));
        }
        if value == 0 {
            // A peek.
            return self.inner.advance_mark(name, value).await;
        }
        self.around("advance_mark", name, self.inner.advance_mark(name, value))
            .await
    }
    async fn watch_releases(&self, key: &str) -> crate::Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(key).await
    }
    async fn inspect(&self, key: &str) -> crate::Result<Option<crate::inspect::HeldLock>> {
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> crate::Result<Vec<crate::inspect::HeldLock>> {
        self.inner.list(prefix).await
    }
    async fn force_release(
        &self,
        key: &str,
        how: crate::inspect::ForceRelease,
    ) -> crate::Result<Option<crate::inspect::HeldLock>> {
        self.inner.force_release(key, how).await
    }
}

fn shared(locker: impl Locker) -> Arc<dyn Locker> {
    Arc::new(locker)
}

/// A replica's name, its view of the backend and its clock.
type Replica<'a> = (&'a str, Arc<dyn Locker>, Arc<dyn Clock>);

/// One scheduler per (replica, locker, clock) running `job`, recording its
/// runs and every report.
fn replicas(
    job: &Job,
    replicas: Vec<Replica<'_>>,
    runs: &Runs,
    reports: &Reports,
) -> Vec<RunningScheduler> {
    let recorded = Recorded {
        runs: runs.clone(),
        reports: reports.clone(),
    };
    replicas
        .into_iter()
        .map(|(name, locker, clock)| {
            recorded.start(name, &locker, ArcClock(clock), job.clone(), |_| async {})
        })
        .collect()
}

/// Where the replicas of one test record what they did: each run in
/// `runs`, every report in `reports`.
#[derive(Default)]
struct Recorded {
    runs: Runs,
    reports: Reports,
}

impl Recorded {
    /// Starts replica `name` running `job` on `locker` by `clock`: each run
    /// is recorded, then does `then` (sleeps, hangs, ...) and succeeds.
    fn start<T, Fut>(
        &self,
        name: &str,
        locker: &Arc<dyn Locker>,
        clock: impl Clock,
        job: Job,
        then: T,
    ) -> RunningScheduler
    where
        T: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut scheduler = Scheduler::new(locker.clone())
            .replica_id(name)
            .clock(clock)
            .on_tick(self.reports.observer());
        let (runs, then) = (self.runs.clone(), Arc::new(then));
        scheduler
            .add(job, move |ctx| {
                let (runs, then) = (runs.clone(), then.clone());
                async move {
                    runs.record(&ctx);
                    then(ctx).await;
                    Ok(())
                }
            })
            .unwrap();
        scheduler.start().unwrap()
    }
}

/// Runs `job` alone on `scheduler` for `run_for`, then shuts it down:
/// what `record` made of each run's context, in order.
async fn record_runs<R, Fut>(
    mut scheduler: Scheduler,
    job: Job,
    run_for: Duration,
    record: impl Fn(JobContext) -> Fut + Send + Sync + 'static,
) -> Vec<R>
where
    R: Send + 'static,
    Fut: std::future::Future<Output = R> + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (sink, record) = (seen.clone(), Arc::new(record));
    scheduler
        .add(job, move |ctx| {
            let (sink, record) = (sink.clone(), record.clone());
            async move {
                let recorded = record(ctx).await;
                sink.lock().unwrap().push(recorded);
                Ok(())
            }
        })
        .unwrap();
    let running = scheduler.start().unwrap();
    tokio::time::sleep(run_for).await;
    running.shutdown(Duration::from_secs(5)).await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    seen
}

async fn shutdown_all(running: Vec<RunningScheduler>) {
    for scheduler in running {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
}

/// Replica `a` on its view of the backend and the test's clock, and replica
/// `b` on its own view with a clock 100 ms behind, both running `job` for
/// `run_for`, then shut down: what they ran and reported. `b` reaches each
/// tick just after `a` has claimed it.
async fn a_then_b(job: &Job, a: Faulty, b: Faulty, run_for: Duration) -> (Runs, Reports) {
    let (runs, reports) = (Runs::default(), Reports::default());
    let base = TokioClock::starting_at(start());
    let behind = SkewedClock::behind(base.clone(), Duration::from_millis(100));
    let running = replicas(
        job,
        vec![
            ("a", shared(a), Arc::new(base)),
            ("b", shared(b), Arc::new(behind)),
        ],
        &runs,
        &reports,
    );
    tokio::time::sleep(run_for).await;
    shutdown_all(running).await;
    (runs, reports)
}
