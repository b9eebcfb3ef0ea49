//! Ticks nobody ran: the no-marks fallback and its skew bound, catch-up and
//! skip.

use super::*;

#[tokio::test(start_paused = true)]
async fn without_marks_skew_within_max_skew_never_duplicates_and_beyond_it_can() {
    for (skew, max_skew, expect_duplicates) in [
        (Duration::from_millis(2300), Duration::from_secs(5), false),
        (Duration::from_millis(2300), Duration::from_secs(1), true),
    ] {
        let locker = shared(Faulty::no_marks());
        let base = TokioClock::starting_at(start());
        let runs = Runs::default();
        let running = replicas(
            &every_second("fallback").max_skew(max_skew),
            vec![
                ("a", locker.clone(), Arc::new(base.clone())),
                ("b", locker, Arc::new(SkewedClock::behind(base, skew))),
            ],
            &runs,
            &Reports::default(),
        );
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
        let recorded = Recorded::default();
        let mut running = Vec::new();
        for name in ["a", "b", "c"] {
            let clock = TokioClock::starting_at(up);
            let job = Job::new("hourly", "0 * * * *").missed(policy);
            running.push(recorded.start(name, &locker, clock, job, |_| async {}));
            // Replicas start a little apart, as they do.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        shutdown_all(running).await;
        let runs = recorded.runs.snapshot();
        assert_ran_each_once(&runs, &expected, &format!("{policy:?}"));
    }
}

#[tokio::test(start_paused = true)]
async fn catch_up_runs_a_tick_skipped_because_a_run_was_too_long_once_the_run_ends() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(Utc.with_ymd_and_hms(2026, 12, 1, 9, 59, 59).unwrap());
    let recorded = Recorded::default();
    let mut running = Vec::new();
    for name in ["a", "b"] {
        let job = Job::new("minutely", "* * * * *").missed(Missed::CatchUp {
            look_back: Duration::from_secs(120),
        });
        let clock = clock.clone();
        running.push(recorded.start(name, &locker, clock, job, |ctx| async move {
            // The 10:00 run lasts past 10:01.
            if ctx.scheduled_at().format("%M").to_string() == "00" {
                tokio::time::sleep(Duration::from_secs(70)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(100)).await;
    shutdown_all(running).await;
    let runs = recorded.runs.snapshot();
    let at = |m| Utc.with_ymd_and_hms(2026, 12, 1, 10, m, 0).unwrap();
    // 09:59 at start-up (nobody ran it, within the look-back), 10:00, and
    // 10:01 (skipped while 10:00 ran) once 10:00's run ended.
    let nine = Utc.with_ymd_and_hms(2026, 12, 1, 9, 59, 0).unwrap();
    assert_ran_each_once(&runs, &[nine, at(0), at(1)], "");
}
