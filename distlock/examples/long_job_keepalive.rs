//! A job longer than its lock's ttl: the lease is kept alive (refreshed
//! every ttl/3) and bounded by a maximum hold; the job checks the lease's
//! lost signal at every step and stops with `Error::Lost` when it fires; the
//! lock is released only after the job has stopped.
//!
//! ```sh
//! cargo run -p distlock --example long_job_keepalive
//! ```
//!
//! By default the job has 8 steps of 1 s and the maximum hold is 5 s, so the
//! run shows the exit path: the keepalive stops renewing at 5 s, the lost
//! signal fires (`MaxHoldExceeded`), the job stops between steps, the lock
//! is released, and the process exits 1 saying where to resume.
//! `MAX_HOLD=1m` lets it finish (exit 0); a second copy started meanwhile
//! exits 75, the lock being held. With no `DISTLOCK_URL` the lock is a file
//! in the default directory; `DISTLOCK_URL=redis://127.0.0.1:6379 cargo run
//! -p distlock --example long_job_keepalive --features redis` shows the
//! refreshes doing real work (a Redis lock expires without them).

use std::process::ExitCode;
use std::time::Duration;

use distlock::{Error, KeepAlive, LeaseInfo};

mod common;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEY: &str = "long-job";
/// Shorter than the job: without the keepalive an expiring backend would
/// let the lock go at 3 s while the job still runs.
const TTL: Duration = Duration::from_secs(3);
const STEP: Duration = Duration::from_secs(1);
const STEPS: u32 = 8;

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let max_hold = match std::env::var("MAX_HOLD") {
        Ok(text) => humantime::parse_duration(&text)
            .map_err(|error| format!("MAX_HOLD={text:?}: {error} (try 5s, 1m)"))?,
        Err(_) => Duration::from_secs(5),
    };
    let locker = common::locker_from_env().await?;

    let Some(mut lease) = locker.try_lock(KEY, TTL).await? else {
        eprintln!("{KEY} is held elsewhere");
        // EX_TEMPFAIL, as `distlock run` exits when the lock is held.
        return Ok(ExitCode::from(75));
    };
    let keepalive = KeepAlive::default().max_hold(max_hold);
    println!(
        "holding {KEY} (fencing token {:?}); refreshed every {:?}, for at most {max_hold:?}",
        lease.fencing_token(),
        keepalive.interval_for(TTL)
    );
    lease.keep_alive(keepalive)?;

    // `info().lost` fires when the lock is known lost, and a drift margin
    // before a lease that could not be refreshed would lapse: work stopped
    // on it has stopped before the lock can be anyone else's.
    let mut done = 0;
    let outcome = run_job(lease.info(), STEPS, &mut done).await;
    // The job has stopped (finished or given up); only now is the lock let
    // go. A lost lease is usually no longer ours: `NotHeld` is expected then.
    match lease.release().await {
        Ok(()) => println!("released {KEY}"),
        Err(Error::NotHeld { .. }) => println!("{KEY} was no longer held"),
        Err(error) => eprintln!("release failed (the backend's ttl or session frees it): {error}"),
    }
    match outcome {
        Ok(()) => {
            println!("job finished: {done} of {STEPS} steps");
            Ok(ExitCode::SUCCESS)
        }
        Err(Error::Lost { reason, .. }) => {
            let next = done.saturating_add(1);
            println!("job stopped cleanly after {done} of {STEPS} steps ({reason}); the next run resumes at step {next}");
            Ok(ExitCode::FAILURE)
        }
        Err(error) => Err(error.into()),
    }
}

/// Runs the job's steps until they are done or the lease is lost; `done`
/// counts the steps completed. A step interrupted by the loss is dropped
/// whole, so a step must leave nothing half-done: write its result at its
/// end, fenced with `lease.fencing_token` (see the `nightly_fenced`
/// example).
///
/// # Errors
///
/// [`Error::Lost`] with the reason, once the lost signal fires.
async fn run_job(lease: LeaseInfo, steps: u32, done: &mut u32) -> distlock::Result<()> {
    let mut lost = lease.lost.clone();
    while *done < steps {
        tokio::select! {
            // Checked first: a lease already lost starts no further step.
            biased;
            reason = lost.wait() => {
                return Err(Error::Lost { key: lease.key, reason });
            }
            () = step(*done) => *done += 1,
        }
    }
    Ok(())
}

/// One step of the job.
async fn step(index: u32) {
    tokio::time::sleep(STEP).await;
    println!("step {} done", index + 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::memory::MemoryLocker;
    use distlock::{Locker, LostReason};

    /// The exit path the example shows: the max hold passes mid-job, the
    /// job stops between steps with `Error::Lost`, the steps done counted.
    #[tokio::test(start_paused = true)]
    async fn job_stops_with_lost_at_max_hold() {
        let locker = MemoryLocker::new();
        let mut lease = locker.try_lock(KEY, TTL).await.unwrap().unwrap();
        lease
            .keep_alive(KeepAlive::default().max_hold(STEP * 5 / 2))
            .unwrap();
        let mut done = 0;
        let outcome = run_job(lease.info(), STEPS, &mut done).await;
        assert!(
            matches!(
                outcome,
                Err(Error::Lost {
                    reason: LostReason::MaxHoldExceeded,
                    ..
                })
            ),
            "{outcome:?}"
        );
        assert_eq!(done, 2, "two whole steps fit in 2.5 steps' time");
        lease.release().await.unwrap();
    }

    /// Without the max hold in the way, the keepalive carries the job past
    /// its ttl to the end.
    #[tokio::test(start_paused = true)]
    async fn job_outlives_its_ttl_under_keepalive() {
        let locker = MemoryLocker::new();
        let mut lease = locker.try_lock(KEY, TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        let mut done = 0;
        run_job(lease.info(), STEPS, &mut done).await.unwrap();
        assert_eq!(done, STEPS);
        assert!(STEP * STEPS > TTL, "the job is longer than the ttl");
        lease.release().await.unwrap();
    }
}
