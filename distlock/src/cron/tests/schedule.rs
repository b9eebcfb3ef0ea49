//! What runs when: every tick exactly once across skewed replicas, no
//! overlap, DST, the job context, job definitions, outcomes and labels.

use super::*;

#[tokio::test(start_paused = true)]
async fn three_replicas_one_skewed_run_every_tick_exactly_once() {
    let locker = shared(MemoryLocker::new());
    let base = TokioClock::starting_at(start());
    let recorded = Recorded::default();
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
    let running: Vec<_> = clocks
        .into_iter()
        .map(|(name, clock)| {
            let job = every_second("report");
            recorded.start(name, &locker, ArcClock(clock), job, |_| {
                tokio::time::sleep(Duration::from_millis(200))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(60)).await;
    shutdown_all(running).await;
    let runs = recorded.runs.snapshot();
    let first = start() + TimeDelta::milliseconds(500); // 10:00:01
    assert_exactly_once(&runs, first, first + TimeDelta::seconds(55));
    let by_replica = |r: &str| runs.values().filter(|who| who[0] == r).count();
    println!(
        "ticks {} (a {}, b {}, c {}); already_ran {}, held_elsewhere {}, previous_running {}",
        runs.len(),
        by_replica("a"),
        by_replica("b"),
        by_replica("c"),
        recorded.reports.count("already_ran"),
        recorded.reports.count("held_elsewhere"),
        recorded.reports.count("previous_running"),
    );
    // The lagging replica finds every tick done, by the mark.
    assert_eq!(by_replica("b"), 0, "b lags by 3.3 s: it never wins a tick");
    assert!(
        recorded.reports.count("already_ran") >= 55,
        "b skips each tick as already run"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_slower_than_its_period_never_overlaps_and_the_ticks_in_between_are_skipped() {
    let locker = shared(MemoryLocker::new());
    let clock = TokioClock::starting_at(start());
    let running_now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let recorded = Recorded::default();
    let mut running = Vec::new();
    for name in ["a", "b", "c"] {
        let (running_now, most) = (running_now.clone(), most.clone());
        let job = every_second("slow");
        let clock = clock.clone();
        running.push(recorded.start(name, &locker, clock, job, move |_| {
            let (running_now, most) = (running_now.clone(), most.clone());
            async move {
                let now = running_now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2500)).await;
                running_now.fetch_sub(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    shutdown_all(running).await;
    let runs = recorded.runs.snapshot();
    println!(
        "runs {}, previous_running {}",
        runs.len(),
        recorded.reports.count("previous_running")
    );
    assert_eq!(most.load(Ordering::SeqCst), 1, "runs overlapped");
    // A 2.5 s run every 3 s (the ticks at +1 s and +2 s find it running).
    assert!(
        (9..=11).contains(&runs.len()),
        "{} runs: {runs:?}",
        runs.len()
    );
    assert!(recorded.reports.count("previous_running") >= 2 * 9);
    assert!(runs.values().all(|who| who.len() == 1));
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
        let recorded = Recorded::default();
        let job = Job::new("dst", "*/30 * * * *").time_zone("Europe/Berlin");
        let running: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| recorded.start(name, &locker, clock.clone(), job.clone(), |_| async {}))
            .collect();
        tokio::time::sleep(Duration::from_secs(2 * 3600 + 15 * 60)).await;
        shutdown_all(running).await;
        let runs = recorded.runs.snapshot();
        let expected: Vec<DateTime<Utc>> = expected
            .into_iter()
            .map(|(y, mo, d, h, mi)| Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap())
            .collect();
        assert_ran_each_once(&runs, &expected, "");
    }
}

#[tokio::test(start_paused = true)]
async fn the_context_names_the_job_tick_replica_and_a_growing_fencing_token() {
    let scheduler = Scheduler::new(shared(MemoryLocker::new()))
        .replica_id("r1")
        .clock(TokioClock::starting_at(start()));
    let run_for = Duration::from_millis(2100);
    let seen = record_runs(scheduler, every_second("ctx"), run_for, |ctx| async move {
        assert!(!ctx.lost().is_lost());
        (
            ctx.job().to_owned(),
            ctx.replica().to_owned(),
            ctx.key().to_owned(),
            ctx.tick_key().to_owned(),
            ctx.fencing_token(),
        )
    })
    .await;
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

#[tokio::test(start_paused = true)]
async fn a_jobs_label_is_what_its_claims_record_as_their_holder() {
    let locker = shared(MemoryLocker::new());
    let scheduler = Scheduler::new(locker.clone()).clock(TokioClock::starting_at(start()));
    let job = every_second("labelled").label("cron job labelled: ./report.sh");
    let seen = record_runs(scheduler, job, Duration::from_millis(2500), move |ctx| {
        let inspector = locker.clone();
        async move {
            let held = inspector.inspect(ctx.tick_key()).await.expect("inspect");
            held.and_then(|held| held.holder).map(|holder| holder.label)
        }
    })
    .await;
    assert!(!seen.is_empty(), "the job ran");
    for label in seen.iter() {
        assert_eq!(label.as_deref(), Some("cron job labelled: ./report.sh"));
    }
}
