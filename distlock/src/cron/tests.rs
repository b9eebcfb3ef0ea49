//! Several schedulers in one process over one locker, on tokio's paused
//! clock with [`TokioClock`]: exactly once per tick under skew, no overlap,
//! a replica stopped mid-run, DST, the no-marks fallback, catch-up,
//! shutdown, at_least and at_most.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use super::*;
use crate::memory::MemoryLocker;
use crate::{Capabilities, Lease, LostReason, MarkAdvance, ReleaseWatch};

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

#[tokio::test(start_paused = true)]
async fn three_replicas_one_skewed_run_every_tick_exactly_once() {
    let locker = shared(MemoryLocker::new());
    let base = TokioClock::starting_at(start());
    let runs = Runs::default();
    let reports = Reports::default();
    let clocks: Vec<(&str, Arc<dyn Clock>)> = vec![
        ("a", Arc::new(base.clone())),
        (
            "b",
            Arc::new(SkewedClock::behind(
                base.clone(),
                Duration::from_millis(3300),
            )),
        ),
        (
            "c",
            Arc::new(SkewedClock::ahead(base.clone(), Duration::from_millis(400))),
        ),
    ];
    let mut running = Vec::new();
    for (name, clock) in clocks {
        let mut scheduler = Scheduler::new(locker.clone())
            .replica_id(name)
            .clock(ArcClock(clock))
            .on_tick(reports.observer());
        let runs = runs.clone();
        scheduler
            .add(every_second("report"), move |ctx| {
                let runs = runs.clone();
                async move {
                    runs.record(&ctx);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(())
                }
            })
            .unwrap();
        running.push(scheduler.start().unwrap());
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    for scheduler in running {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
    let runs = runs.snapshot();
    let first = start() + TimeDelta::milliseconds(500); // 10:00:01
    assert_exactly_once(&runs, first, first + TimeDelta::seconds(55));
    let by_replica = |r: &str| runs.values().filter(|who| who[0] == r).count();
    println!(
        "ticks {} (a {}, b {}, c {}); already_ran {}, held_elsewhere {}, previous_running {}",
        runs.len(),
        by_replica("a"),
        by_replica("b"),
        by_replica("c"),
        reports.count("already_ran"),
        reports.count("held_elsewhere"),
        reports.count("previous_running"),
    );
    // The lagging replica finds every tick done, by the mark.
    assert_eq!(by_replica("b"), 0, "b lags by 3.3 s: it never wins a tick");
    assert!(
        reports.count("already_ran") >= 55,
        "b skips each tick as already run"
    );
}

/// `Arc<dyn Clock>` as a clock (the tests pick clocks at run time).
#[derive(Debug)]
struct ArcClock(Arc<dyn Clock>);

impl Clock for ArcClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_slower_than_its_period_never_overlaps_and_the_ticks_in_between_are_skipped() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(start());
    let running_now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let runs = Runs::default();
    let reports = Reports::default();
    let mut running = Vec::new();
    for name in ["a", "b", "c"] {
        let mut scheduler = Scheduler::new(locker.clone())
            .replica_id(name)
            .clock(clock.clone())
            .on_tick(reports.observer());
        let (running_now, most, runs) = (running_now.clone(), most.clone(), runs.clone());
        scheduler
            .add(every_second("slow"), move |ctx| {
                let (running_now, most, runs) = (running_now.clone(), most.clone(), runs.clone());
                async move {
                    runs.record(&ctx);
                    let now = running_now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                    running_now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        running.push(scheduler.start().unwrap());
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    for scheduler in running {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
    let runs = runs.snapshot();
    println!(
        "runs {}, previous_running {}",
        runs.len(),
        reports.count("previous_running")
    );
    assert_eq!(most.load(Ordering::SeqCst), 1, "runs overlapped");
    // A 2.5 s run every 3 s (the ticks at +1 s and +2 s find it running).
    assert!(
        (9..=11).contains(&runs.len()),
        "{} runs: {runs:?}",
        runs.len()
    );
    assert!(reports.count("previous_running") >= 2 * 9);
    assert!(runs.values().all(|who| who.len() == 1));
}

#[tokio::test(start_paused = true)]
async fn a_replica_stopped_mid_run_does_not_get_its_tick_rerun_and_the_others_carry_on() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(start());
    let runs = Runs::default();
    let make = |name: &'static str, hang: bool| {
        let mut scheduler = Scheduler::new(locker.clone())
            .replica_id(name)
            .clock(clock.clone());
        let runs = runs.clone();
        scheduler
            .add(every_second("job"), move |ctx| {
                let runs = runs.clone();
                async move {
                    runs.record(&ctx);
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                }
            })
            .unwrap();
        scheduler.start().unwrap()
    };
    // The doomed replica starts first, so it wins the first tick and hangs in it.
    let doomed = make("doomed", true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let others = [make("a", false), make("b", false)];
    tokio::time::sleep(Duration::from_millis(1000)).await; // 10:00:01.501: doomed runs 10:00:01
    let first = start() + TimeDelta::milliseconds(500);
    assert_eq!(
        runs.snapshot().get(&first),
        Some(&vec!["doomed".to_owned()])
    );
    // Killed: its futures dropped, its leases dropped.
    drop(doomed);
    tokio::time::sleep(Duration::from_secs(20)).await;
    for scheduler in others {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
    let runs = runs.snapshot();
    assert_exactly_once(&runs, first, first + TimeDelta::seconds(19));
    assert_eq!(runs[&first], ["doomed"], "the doomed tick is not run again");
    assert!(runs
        .iter()
        .filter(|(at, _)| **at > first)
        .all(|(_, who)| who[0] != "doomed"));
}

/// Europe/Berlin falls back on 2026-10-25 at 03:00 CEST to 02:00 CET and
/// springs forward on 2026-03-29 at 02:00 CET to 03:00 CEST.
#[tokio::test(start_paused = true)]
async fn dst_transitions_run_each_distinct_instant_once_across_replicas() {
    for (from, expected) in [
        (
            Utc.with_ymd_and_hms(2026, 10, 24, 23, 50, 0).unwrap(), // 01:50 CEST
            vec![
                (2026, 10, 25, 0, 0),  // 02:00 CEST
                (2026, 10, 25, 0, 30), // 02:30 CEST
                (2026, 10, 25, 1, 0),  // 02:00 CET
                (2026, 10, 25, 1, 30), // 02:30 CET
                (2026, 10, 25, 2, 0),  // 03:00 CET
            ],
        ),
        (
            Utc.with_ymd_and_hms(2026, 3, 29, 0, 10, 0).unwrap(), // 01:10 CET
            vec![
                (2026, 3, 29, 0, 30), // 01:30 CET
                (2026, 3, 29, 1, 0),  // 03:00 CEST (02:00-03:00 does not exist)
                (2026, 3, 29, 1, 30), // 03:30 CEST
                (2026, 3, 29, 2, 0),  // 04:00 CEST
            ],
        ),
    ] {
        let locker = shared(MemoryLocker::new());
        let clock = TokioClock::starting_at(from);
        let runs = Runs::default();
        let mut running = Vec::new();
        for name in ["a", "b"] {
            let mut scheduler = Scheduler::new(locker.clone())
                .replica_id(name)
                .clock(clock.clone());
            let runs = runs.clone();
            scheduler
                .add(
                    Job::new("dst", "*/30 * * * *").time_zone("Europe/Berlin"),
                    move |ctx| {
                        let runs = runs.clone();
                        async move {
                            runs.record(&ctx);
                            Ok(())
                        }
                    },
                )
                .unwrap();
            running.push(scheduler.start().unwrap());
        }
        tokio::time::sleep(Duration::from_secs(2 * 3600 + 15 * 60)).await;
        for scheduler in running {
            scheduler.shutdown(Duration::from_secs(5)).await;
        }
        let runs = runs.snapshot();
        let expected: Vec<DateTime<Utc>> = expected
            .into_iter()
            .map(|(y, mo, d, h, mi)| Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap())
            .collect();
        assert_eq!(
            runs.keys().copied().collect::<Vec<_>>(),
            expected,
            "{runs:?}"
        );
        assert!(runs.values().all(|who| who.len() == 1), "{runs:?}");
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
    fn durability_warnings(&self) -> Vec<String> {
        self.inner.durability_warnings()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            marks: !self.no_marks,
            ..self.inner.capabilities()
        }
    }
    fn backend_key(&self, key: &str) -> String {
        self.inner.backend_key(key)
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

#[tokio::test(start_paused = true)]
async fn without_marks_skew_within_max_skew_never_duplicates_and_beyond_it_can() {
    for (skew, max_skew, expect_duplicates) in [
        (Duration::from_millis(2300), Duration::from_secs(5), false),
        (Duration::from_millis(2300), Duration::from_secs(1), true),
    ] {
        let locker = shared(Faulty::no_marks());
        let base = TokioClock::starting_at(start());
        let runs = Runs::default();
        let mut running = Vec::new();
        let clocks: Vec<(&str, Arc<dyn Clock>)> = vec![
            ("a", Arc::new(base.clone())),
            ("b", Arc::new(SkewedClock::behind(base.clone(), skew))),
        ];
        for (name, clock) in clocks {
            let mut scheduler = Scheduler::new(locker.clone())
                .replica_id(name)
                .clock(ArcClock(clock));
            let runs = runs.clone();
            scheduler
                .add(every_second("fallback").max_skew(max_skew), move |ctx| {
                    let runs = runs.clone();
                    async move {
                        runs.record(&ctx);
                        Ok(())
                    }
                })
                .unwrap();
            running.push(scheduler.start().unwrap());
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        for scheduler in running {
            scheduler.shutdown(Duration::from_secs(10)).await;
        }
        let runs = runs.snapshot();
        let duplicates = runs.values().filter(|who| who.len() > 1).count();
        println!(
            "skew {skew:?}, max_skew {max_skew:?}: {} ticks, {duplicates} duplicates",
            runs.len()
        );
        assert_eq!(duplicates > 0, expect_duplicates, "{runs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn catch_up_runs_the_latest_missed_tick_once_and_skip_does_not() {
    // Hourly; the replicas come up 10 minutes after 10:00, which nobody ran.
    let up = Utc.with_ymd_and_hms(2026, 12, 1, 10, 10, 0).unwrap();
    let missed = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap();
    for (policy, expected) in [
        (
            Missed::CatchUp {
                look_back: Duration::from_secs(3600),
            },
            vec![missed],
        ),
        (
            Missed::CatchUp {
                look_back: Duration::from_secs(300),
            },
            vec![],
        ),
        (Missed::Skip, vec![]),
    ] {
        let locker = shared(MemoryLocker::new());
        let runs = Runs::default();
        let mut running = Vec::new();
        for name in ["a", "b", "c"] {
            let clock = TokioClock::starting_at(up);
            let mut scheduler = Scheduler::new(locker.clone()).replica_id(name).clock(clock);
            let runs = runs.clone();
            scheduler
                .add(Job::new("hourly", "0 * * * *").missed(policy), move |ctx| {
                    let runs = runs.clone();
                    async move {
                        runs.record(&ctx);
                        Ok(())
                    }
                })
                .unwrap();
            running.push(scheduler.start().unwrap());
            // Replicas start a little apart, as they do.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        for scheduler in running {
            scheduler.shutdown(Duration::from_secs(5)).await;
        }
        let runs = runs.snapshot();
        assert_eq!(
            runs.keys().copied().collect::<Vec<_>>(),
            expected,
            "{policy:?}: {runs:?}"
        );
        assert!(runs.values().all(|who| who.len() == 1), "{runs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn catch_up_runs_a_tick_skipped_because_a_run_was_too_long_once_the_run_ends() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(Utc.with_ymd_and_hms(2026, 12, 1, 9, 59, 59).unwrap());
    let runs = Runs::default();
    let mut running = Vec::new();
    for name in ["a", "b"] {
        let mut scheduler = Scheduler::new(locker.clone())
            .replica_id(name)
            .clock(clock.clone());
        let runs = runs.clone();
        let job = Job::new("minutely", "* * * * *").missed(Missed::CatchUp {
            look_back: Duration::from_secs(120),
        });
        scheduler
            .add(job, move |ctx| {
                let runs = runs.clone();
                async move {
                    runs.record(&ctx);
                    // The 10:00 run lasts past 10:01.
                    if ctx.scheduled_at().format("%M").to_string() == "00" {
                        tokio::time::sleep(Duration::from_secs(70)).await;
                    }
                    Ok(())
                }
            })
            .unwrap();
        running.push(scheduler.start().unwrap());
    }
    tokio::time::sleep(Duration::from_secs(100)).await;
    for scheduler in running {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
    let runs = runs.snapshot();
    let at = |m| Utc.with_ymd_and_hms(2026, 12, 1, 10, m, 0).unwrap();
    // 09:59 at start-up (nobody ran it, within the look-back), 10:00, and
    // 10:01 (skipped while 10:00 ran) once 10:00's run ended.
    let nine = Utc.with_ymd_and_hms(2026, 12, 1, 9, 59, 0).unwrap();
    assert_eq!(
        runs.keys().copied().collect::<Vec<_>>(),
        [nine, at(0), at(1)],
        "{runs:?}"
    );
    assert!(runs.values().all(|who| who.len() == 1), "{runs:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_a_running_job_finish_within_the_grace_and_stops_it_after() {
    for (grace, job_takes, expected) in [
        (Duration::from_secs(10), Duration::from_secs(3), "ran"),
        (Duration::from_secs(1), Duration::from_secs(3600), "stopped"),
    ] {
        let locker = shared(MemoryLocker::new());
        let reports = Reports::default();
        let mut scheduler = Scheduler::new(locker.clone())
            .clock(TokioClock::starting_at(start()))
            .on_tick(reports.observer());
        let started = Arc::new(AtomicUsize::new(0));
        let counter = started.clone();
        scheduler
            .add(every_second("graceful"), move |_ctx| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(job_takes).await;
                    Ok(())
                }
            })
            .unwrap();
        let running = scheduler.start().unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await; // the 10:00:01 run started
        assert_eq!(started.load(Ordering::SeqCst), 1);
        let shutting = tokio::time::Instant::now();
        running.shutdown(grace).await;
        let took = shutting.elapsed();
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "no tick starts after shutdown"
        );
        assert_eq!(reports.count(expected), 1, "grace {grace:?}");
        assert!(
            took <= grace + DEFAULT_STOP_TIMEOUT + Duration::from_millis(10),
            "{took:?}"
        );
        // The claims are free again.
        assert!(locker
            .try_lock("cron:graceful", Duration::from_secs(1))
            .await
            .unwrap()
            .is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn the_tick_claim_is_held_until_at_least_after_the_tick_and_at_most_bounds_a_run() {
    let locker = shared(MemoryLocker::new());
    let reports = Reports::default();
    let mut scheduler = Scheduler::new(locker.clone())
        .clock(TokioClock::starting_at(start()))
        .on_tick(reports.observer());
    scheduler
        .add(
            Job::new("bounded", "*/10 * * * * *")
                .at_least(Duration::from_secs(4))
                .at_most(Duration::from_secs(6)),
            |ctx: JobContext| async move {
                // The 10:00:10 run hangs; at_most stops it.
                if ctx.scheduled_at().format("%S").to_string() == "10" {
                    std::future::pending::<()>().await;
                }
                Ok(())
            },
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    let tick = "cron:bounded@2026-12-01T10:00:10Z";
    tokio::time::sleep(Duration::from_millis(9500 + 3000)).await; // 10:00:13
    assert!(
        locker
            .try_lock(tick, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "held"
    );
    tokio::time::sleep(Duration::from_secs(4)).await; // 10:00:17: past at_most
    assert_eq!(reports.count("lost"), 1);
    assert!(
        locker
            .try_lock(tick, Duration::from_secs(1))
            .await
            .unwrap()
            .is_some(),
        "released"
    );
    tokio::time::sleep(Duration::from_millis(3500)).await; // 10:00:20.5: a quick run
    let quick = "cron:bounded@2026-12-01T10:00:20Z";
    assert!(
        locker
            .try_lock(quick, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "held until at_least even though the job finished at once"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(locker
        .try_lock(quick, Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn the_context_names_the_job_tick_replica_and_a_growing_fencing_token() {
    let locker = shared(MemoryLocker::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut scheduler = Scheduler::new(locker)
        .replica_id("r1")
        .clock(TokioClock::starting_at(start()));
    let record = seen.clone();
    scheduler
        .add(every_second("ctx"), move |ctx: JobContext| {
            let record = record.clone();
            async move {
                assert!(!ctx.lost().is_lost());
                record.lock().unwrap().push((
                    ctx.job().to_owned(),
                    ctx.replica().to_owned(),
                    ctx.key().to_owned(),
                    ctx.tick_key().to_owned(),
                    ctx.fencing_token(),
                ));
                Ok(())
            }
        })
        .unwrap();
    let running = scheduler.start().unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    running.shutdown(Duration::from_secs(1)).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, "ctx");
    assert_eq!(seen[0].1, "r1");
    assert_eq!(seen[0].2, "cron:ctx");
    assert_eq!(seen[0].3, "cron:ctx@2026-12-01T10:00:01Z");
    assert!(seen[1].4 > seen[0].4, "fencing tokens grow: {seen:?}");
}

#[test]
fn a_job_defined_twice_or_badly_is_refused_before_anything_runs() {
    let mut scheduler = Scheduler::new(shared(MemoryLocker::new()));
    scheduler
        .add(every_second("x"), |_| async { Ok(()) })
        .unwrap();
    let twice = scheduler.add(every_second("x"), |_| async { Ok(()) });
    assert!(
        matches!(
            twice,
            Err(Error::InvalidInput {
                what: "job name",
                ..
            })
        ),
        "{twice:?}"
    );
    let bad = scheduler.add(Job::new("y", "every day"), |_| async { Ok(()) });
    assert!(
        matches!(bad, Err(Error::InvalidInput { what: "cron schedule", ref reason }) if reason.contains("job \"y\"")),
        "{bad:?}"
    );
}

#[test]
fn outcomes_read_as_log_lines() {
    let lost = TickOutcome::Lost {
        lag: Duration::ZERO,
        duration: Duration::from_millis(1500),
        reason: LostReason::NotHeld,
    };
    assert_eq!(lost.label(), "lost");
    assert!(lost
        .to_string()
        .starts_with("ran: stopped after 1500ms: lock lost"));
    assert_eq!(
        TickOutcome::PreviousRunning.to_string(),
        "skipped: previous run still running"
    );
}

fn shared(locker: impl Locker) -> Arc<dyn Locker> {
    Arc::new(locker)
}

#[tokio::test(start_paused = true)]
async fn a_jobs_label_is_what_its_claims_record_as_their_holder() {
    let locker = shared(MemoryLocker::new());
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let mut scheduler = Scheduler::new(locker.clone()).clock(TokioClock::starting_at(start()));
    let (inspector, record) = (locker.clone(), seen.clone());
    scheduler
        .add(
            every_second("labelled").label("cron job labelled: ./report.sh"),
            move |ctx| {
                let (inspector, record) = (inspector.clone(), record.clone());
                async move {
                    let held = inspector.inspect(ctx.tick_key()).await.expect("inspect");
                    let label = held.and_then(|held| held.holder).map(|holder| holder.label);
                    record.lock().unwrap().push(label);
                    Ok(())
                }
            },
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    running.shutdown(Duration::from_secs(5)).await;
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "the job ran");
    for label in seen.iter() {
        assert_eq!(label.as_deref(), Some("cron job labelled: ./report.sh"));
    }
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
    replicas
        .into_iter()
        .map(|(name, locker, clock)| {
            let mut scheduler = Scheduler::new(locker)
                .replica_id(name)
                .clock(ArcClock(clock))
                .on_tick(reports.observer());
            let runs = runs.clone();
            scheduler
                .add(job.clone(), move |ctx| {
                    let runs = runs.clone();
                    async move {
                        runs.record(&ctx);
                        Ok(())
                    }
                })
                .unwrap();
            scheduler.start().unwrap()
        })
        .collect()
}

async fn shutdown_all(running: Vec<RunningScheduler>) {
    for scheduler in running {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
}

/// Issue 23: a tick claim whose reply took longer than the period was
/// overtaken by the next tick's claim on the same replica, which advanced
/// the mark; the slow one then found the mark past it and reported "already
/// ran", though nothing ran it. Ticks are now claimed in order: the slow one
/// runs, late, and so does the next.
#[tokio::test(start_paused = true)]
async fn a_claim_slower_than_the_period_runs_late_instead_of_being_overtaken() {
    let first = start() + TimeDelta::milliseconds(500); // 10:00:01
    let locker = Faulty::default().slow(
        "try_lock",
        &job::tick_key("slow-claim", first),
        Duration::from_millis(1500),
    );
    let (runs, reports) = (Runs::default(), Reports::default());
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(start()));
    let running = replicas(
        &every_second("slow-claim"),
        vec![("a", shared(locker), clock)],
        &runs,
        &reports,
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    shutdown_all(running).await;
    assert_eq!(reports.of(first), [("a".to_owned(), "ran")]);
    assert_exactly_once(&runs.snapshot(), first, first + TimeDelta::seconds(8));
    assert_eq!(reports.count("already_ran"), 0, "{:?}", reports.0);
}

/// Issue 23, across replicas: `a` holds tick 10:00:01's claim but its reply
/// is slower than the period; `b` waits for it until the next tick is due,
/// then moves on and runs 10:00:02, which makes 10:00:01 impossible to run
/// (marks only grow). `a` reported that "already ran": it is missed.
#[tokio::test(start_paused = true)]
async fn a_claim_overtaken_by_another_replica_reports_the_tick_missed_not_already_ran() {
    let first = start() + TimeDelta::milliseconds(500); // 10:00:01
    let memory = Faulty::default();
    let slow = memory.sibling().slow(
        "try_lock",
        &job::tick_key("overtaken", first),
        Duration::from_millis(1500),
    );
    let (runs, reports) = (Runs::default(), Reports::default());
    let base = TokioClock::starting_at(start());
    let running = replicas(
        &every_second("overtaken"),
        vec![
            ("a", shared(slow), Arc::new(base.clone())),
            (
                "b",
                shared(memory),
                Arc::new(SkewedClock::behind(base, Duration::from_millis(100))),
            ),
        ],
        &runs,
        &reports,
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    shutdown_all(running).await;
    assert_eq!(
        reports.of(first),
        [
            ("a".to_owned(), "missed"),
            ("b".to_owned(), "held_elsewhere")
        ]
    );
    let runs = runs.snapshot();
    assert!(!runs.contains_key(&first), "{runs:?}");
    assert_exactly_once(
        &runs,
        first + TimeDelta::seconds(1),
        first + TimeDelta::seconds(8),
    );
}

/// Issue 23: `a` wins tick 10:00:01's claim, then taking the job's key or
/// advancing the mark fails (after 300 ms, a timeout) and it releases the
/// claim. `b` had found the claim held and given up, so nobody ran the
/// tick. Now `b` waits for the claim to be completed or released, and runs
/// the tick once `a` lets it go.
#[tokio::test(start_paused = true)]
async fn a_winner_that_fails_after_claiming_lets_a_waiting_replica_run_the_tick() {
    let first = start() + TimeDelta::milliseconds(500); // 10:00:01
    for call in ["try_lock", "advance_mark"] {
        let memory = Faulty::default();
        let failing = memory
            .sibling()
            .failing(call, "cron:handover", Duration::from_millis(300));
        let (runs, reports) = (Runs::default(), Reports::default());
        let base = TokioClock::starting_at(start());
        let running = replicas(
            &every_second("handover"),
            vec![
                ("a", shared(failing), Arc::new(base.clone())),
                (
                    "b",
                    shared(memory),
                    Arc::new(SkewedClock::behind(base, Duration::from_millis(100))),
                ),
            ],
            &runs,
            &reports,
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        shutdown_all(running).await;
        assert_eq!(
            reports.of(first),
            [("a".to_owned(), "claim_failed"), ("b".to_owned(), "ran")],
            "{call}"
        );
        assert_exactly_once(&runs.snapshot(), first, first + TimeDelta::seconds(3));
    }
}

/// A wall clock the test steps, as NTP steps one that read nonsense at boot.
#[derive(Debug, Clone)]
struct SteppedClock {
    base: TokioClock,
    offset: Arc<Mutex<TimeDelta>>,
}

impl SteppedClock {
    fn starting_at(at: DateTime<Utc>) -> Self {
        SteppedClock {
            base: TokioClock::starting_at(at),
            offset: Arc::default(),
        }
    }

    fn step_to(&self, at: DateTime<Utc>) {
        *self.offset.lock().unwrap() = at - self.base.now();
    }
}

impl Clock for SteppedClock {
    fn now(&self) -> DateTime<Utc> {
        self.base.now() + *self.offset.lock().unwrap()
    }
}

/// Issue 23: croner answers an error, not a tick, for a search that has to
/// move on from a start past its limit (year 5000): here the scheduler's
/// clock reads 5001 when it starts (the job itself was checked against the
/// system clock), and is stepped back later, as NTP steps a clock that read
/// nonsense. The job's loop took any croner error for "the schedule has no
/// further tick" and ended for good after one warning, so the job never ran
/// again in that process. Now each failure is logged and counted, and the
/// loop retries from the clock's time, backing off (1 s, 2 s, ...).
#[test]
fn a_schedule_error_is_counted_and_retried_and_the_job_runs_once_the_clock_is_sane() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let runs = Runs::default();
    let reports = Reports::default();
    metrics::with_local_recorder(&recorder, || {
        crate::test_support::paused_runtime().block_on(async {
            let bogus = Utc.with_ymd_and_hms(5001, 6, 1, 0, 0, 0).unwrap();
            let clock = SteppedClock::starting_at(bogus);
            let running = replicas(
                &Job::new("boot-clock", "*/2 * * * * *").at_most(Duration::from_secs(30)),
                vec![("a", shared(MemoryLocker::new()), Arc::new(clock.clone()))],
                &runs,
                &reports,
            );
            tokio::time::sleep(Duration::from_millis(2500)).await;
            clock.step_to(start()); // 10:00:00.5
            tokio::time::sleep(Duration::from_secs(10)).await;
            shutdown_all(running).await;
        })
    });
    let runs = runs.snapshot();
    let at = |s| Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, s).unwrap();
    assert_eq!(
        runs.keys().copied().collect::<Vec<_>>(),
        [at(2), at(4), at(6), at(8), at(10)],
        "{runs:?}"
    );
    assert!(runs.values().all(|who| who.len() == 1), "{runs:?}");
    // Retried at +1 s (still year 5000) and at +3 s (10:00:01 by then).
    let errors: Vec<_> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "distlock_cron_schedule_errors_total")
        .map(|(key, _, _, value)| {
            let labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (labels, value)
        })
        .collect();
    assert_eq!(
        errors,
        [(
            vec![("job".to_owned(), "boot-clock".to_owned())],
            DebugValue::Counter(2)
        )]
    );
}
