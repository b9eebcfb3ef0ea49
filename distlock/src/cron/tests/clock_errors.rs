//! A wall clock stepped by NTP: schedule errors are counted and retried.

use super::*;

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
        crate::test_support::block_on_paused(async {
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
    assert_ran_each_once(&runs, &[at(2), at(4), at(6), at(8), at(10)], "");
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
