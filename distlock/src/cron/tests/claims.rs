//! The tick claim: held from at_least to at_most, released by shutdown,
//! kept by a replica stopped mid-run, claimed in order, handed over when its
//! winner fails.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_replica_stopped_mid_run_does_not_get_its_tick_rerun_and_the_others_carry_on() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(start());
    let recorded = Recorded::default();
    let make = |name: &'static str, hang: bool| {
        let job = every_second("job");
        recorded.start(name, &locker, clock.clone(), job, move |_| async move {
            if hang {
                std::future::pending::<()>().await;
            }
        })
    };
    // The doomed replica starts first, so it wins the first tick and hangs in it.
    let doomed = make("doomed", true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let others = [make("a", false), make("b", false)];
    tokio::time::sleep(Duration::from_millis(1000)).await; // 10:00:01.501: doomed runs 10:00:01
    let first = start() + TimeDelta::milliseconds(500);
    assert_eq!(
        recorded.runs.snapshot().get(&first),
        Some(&vec!["doomed".to_owned()])
    );
    // Killed: its futures dropped, its leases dropped.
    drop(doomed);
    tokio::time::sleep(Duration::from_secs(20)).await;
    for scheduler in others {
        scheduler.shutdown(Duration::from_secs(5)).await;
    }
    let runs = recorded.runs.snapshot();
    assert_exactly_once(&runs, first, first + TimeDelta::seconds(19));
    assert_eq!(runs[&first], ["doomed"], "the doomed tick is not run again");
    assert!(runs
        .iter()
        .filter(|(at, _)| **at > first)
        .all(|(_, who)| who[0] != "doomed"));
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
        assert!(takes_at_once(&*locker, "cron:graceful").await);
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
    assert!(!takes_at_once(&*locker, tick).await, "held");
    tokio::time::sleep(Duration::from_secs(4)).await; // 10:00:17: past at_most
    assert_eq!(reports.count("lost"), 1);
    assert!(takes_at_once(&*locker, tick).await, "released");
    tokio::time::sleep(Duration::from_millis(3500)).await; // 10:00:20.5: a quick run
    let quick = "cron:bounded@2026-12-01T10:00:20Z";
    assert!(
        !takes_at_once(&*locker, quick).await,
        "held until at_least even though the job finished at once"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(takes_at_once(&*locker, quick).await);
    running.shutdown(Duration::from_secs(5)).await;
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
    let run_for = Duration::from_secs(10);
    let (runs, reports) = a_then_b(&every_second("overtaken"), slow, memory, run_for).await;
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
        let run_for = Duration::from_secs(5);
        let (runs, reports) = a_then_b(&every_second("handover"), failing, memory, run_for).await;
        assert_eq!(
            reports.of(first),
            [("a".to_owned(), "claim_failed"), ("b".to_owned(), "ran")],
            "{call}"
        );
        assert_exactly_once(&runs.snapshot(), first, first + TimeDelta::seconds(3));
    }
}

/// Whether `key` is free: a one-second lock of it is granted (and dropped
/// again at once).
async fn takes_at_once(locker: &dyn Locker, key: &str) -> bool {
    let taken = locker.try_lock(key, Duration::from_secs(1)).await;
    taken.unwrap().is_some()
}
