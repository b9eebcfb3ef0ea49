//! One tick of one job on one replica: peek at the mark, claim the tick,
//! take the job's key, advance the mark, run, release. What it found is a
//! [`TickOutcome`], reported once ([`TickReport`]), counted and logged.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::future::BoxFuture;
use metrics::{counter, histogram};
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use super::job::{job_key, plus, since, tick_key, Compiled, Overlap};
use super::Clock;
use crate::{
    drift_margin, BoxError, Error, KeepAlive, Lease, Locker, LostReason, LostSignal, MarkAdvance,
};

/// What a job's handler returns: `Err` counts the run as failed (it still
/// ran: the tick is not retried).
pub type JobResult = std::result::Result<(), BoxError>;

pub(super) type Handler = Arc<dyn Fn(JobContext) -> BoxFuture<'static, JobResult> + Send + Sync>;
pub(super) type Observer = Arc<dyn Fn(&TickReport) + Send + Sync>;

/// Where the scheduler is in its life; every tick task watches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Running,
    /// No new ticks; running jobs may finish within the grace period.
    Draining,
    /// The grace period is over: jobs are asked to stop, and dropped
    /// `stop_timeout` later.
    Stopping,
}

/// What every tick task of one job shares.
pub(super) struct JobEnv {
    pub(super) job: Compiled,
    pub(super) handler: Handler,
    pub(super) locker: Arc<dyn Locker>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) replica: Arc<str>,
    pub(super) observer: Option<Observer>,
    pub(super) phase: watch::Receiver<Phase>,
    pub(super) stop_timeout: Duration,
    /// Woken when a run on this replica ends (catch-up checks).
    pub(super) run_ended: Notify,
    warned_no_marks: AtomicBool,
    pub(super) mark: String,
}

impl JobEnv {
    pub(super) fn new(
        job: Compiled,
        handler: Handler,
        shared: &super::Shared,
        phase: watch::Receiver<Phase>,
    ) -> Self {
        let mark = job_key(&job.name);
        JobEnv {
            job,
            handler,
            locker: shared.locker.clone(),
            clock: shared.clock.clone(),
            replica: shared.replica.clone(),
            observer: shared.observer.clone(),
            phase,
            stop_timeout: shared.stop_timeout,
            run_ended: Notify::new(),
            warned_no_marks: AtomicBool::new(false),
            mark,
        }
    }

    fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// The backend stores no marks: say once per job what that costs.
    pub(super) fn warn_no_marks(&self) {
        if !self.warned_no_marks.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                component = "distlock",
                job = %self.job.name,
                backend = self.locker.backend(),
                hold = ?self.job.fallback_hold(),
                "this backend stores no marks: a tick's claim is held for max(at_least, max_skew) after the tick instead, and a replica whose clock lags by more could run a finished tick again; catch-up is off"
            );
        }
    }
}

/// What a job's handler gets for one run.
///
/// The lease it carries is the one that matters for the run: the job's key
/// (`cron:NAME`) with [`Overlap::Forbid`], the tick's claim
/// (`cron:NAME@INSTANT`) with [`Overlap::Allow`]. Its keepalive runs while
/// the handler does, bounded by [`Job::at_most`](super::Job::at_most).
pub struct JobContext {
    job: Arc<str>,
    scheduled_at: DateTime<Utc>,
    replica: Arc<str>,
    tick_key: String,
    lease: Arc<Lease>,
    phase: watch::Receiver<Phase>,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("job", &self.job)
            .field("scheduled_at", &self.scheduled_at)
            .field("replica", &self.replica)
            .field("tick_key", &self.tick_key)
            .field("fencing_token", &self.lease.fencing_token())
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The tick's scheduled instant. It grows with every run of the job
    /// (marks make every tick run at most once, in order), so it fences
    /// like a token: a resource that has seen a later instant can reject
    /// writes of an earlier run.
    pub fn scheduled_at(&self) -> DateTime<Utc> {
        self.scheduled_at
    }

    /// The replica running it ([`Scheduler::replica_id`](super::Scheduler::replica_id)).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The tick's claim key, `cron:NAME@2026-12-01T10:00:00Z`.
    pub fn tick_key(&self) -> &str {
        &self.tick_key
    }

    /// The key of [`lease`](Self::lease): `cron:NAME` with
    /// [`Overlap::Forbid`], the tick key with [`Overlap::Allow`].
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// The fencing token of [`lease`](Self::lease): with [`Overlap::Forbid`]
    /// it grows with every run of the job; see [`Overlap::Allow`] otherwise.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fencing_token()
    }

    /// Fires when the run's lock is lost ([`crate::drift_margin`] before a
    /// lapse, so work that stops on it has stopped in time). Unless the job
    /// was built with [`Job::handler_watches_loss`](super::Job::handler_watches_loss), the scheduler also
    /// drops the handler's future then.
    pub fn lost(&self) -> LostSignal {
        self.lease.info().lost
    }

    /// The run's lease, for what [`lost`](Self::lost) does not say: its
    /// exact validity, its owner token, a descriptor of a file lock.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Resolves when the scheduler's shutdown grace period is over: stop
    /// now. The handler's future is dropped
    /// [`Scheduler::stop_timeout`](super::Scheduler::stop_timeout) later.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: wait again.
    pub async fn stop_requested(&self) {
        let mut phase = self.phase.clone();
        // An error means the scheduler is gone: stop as well.
        let _ = phase.wait_for(|p| *p == Phase::Stopping).await;
    }

    /// True once [`stop_requested`](Self::stop_requested) has resolved.
    pub fn is_stop_requested(&self) -> bool {
        *self.phase.borrow() == Phase::Stopping
    }
}

/// What one replica did with one tick.
#[derive(Debug)]
#[non_exhaustive]
pub enum TickOutcome {
    /// The job ran here and returned; `result` is the handler's.
    Ran {
        /// From the scheduled instant to the start of the run.
        lag: Duration,
        /// How long the handler ran.
        duration: Duration,
        /// What the handler returned.
        result: JobResult,
    },
    /// The job ran here and was stopped (its future dropped, or it stopped
    /// itself) because its lock was lost.
    Lost {
        /// From the scheduled instant to the start of the run.
        lag: Duration,
        /// How long it ran.
        duration: Duration,
        /// Why the lock was lost.
        reason: LostReason,
    },
    /// The job ran here and was stopped by the scheduler's shutdown.
    Stopped {
        /// From the scheduled instant to the start of the run.
        lag: Duration,
        /// How long it ran.
        duration: Duration,
    },
    /// Another replica holds this tick's claim. Where the backend has marks,
    /// this replica kept looking until that replica took the tick (the mark
    /// reached it), or until the tick's window ended (the next tick came
    /// due) with the claim still held and the tick not taken.
    HeldElsewhere,
    /// An earlier run of the job is still running ([`Overlap::Forbid`]).
    PreviousRunning,
    /// The job's mark says this tick, or a later one, already started.
    AlreadyRan,
    /// This replica was too late for these ticks and skipped them;
    /// `scheduled_at` is the first. Either it woke too late (its process was
    /// paused, its clock jumped, or claiming its previous tick took longer
    /// than the period), or (`count` 1) its claim of this tick was decided
    /// only after a later tick had started somewhere: marks only grow, so
    /// this tick can run nowhere any more, and nobody ran it while this
    /// replica held its claim.
    Missed {
        /// How many ticks were skipped (counted up to 10 000).
        count: u64,
    },
    /// The backend failed while the tick was claimed: the job did not run
    /// here. It may have been taken (an outcome-unknown error), so this
    /// replica does not retry it; the claim is released, and a replica that
    /// found it held and is still within the tick's window claims it then
    /// and runs it unless the mark says it was taken.
    ClaimFailed {
        /// What failed.
        error: Error,
    },
}

impl TickOutcome {
    /// The metrics label: `ran`, `failed`, `lost`, `stopped`,
    /// `held_elsewhere`, `previous_running`, `already_ran`, `missed`,
    /// `claim_failed`.
    pub fn label(&self) -> &'static str {
        match self {
            TickOutcome::Ran { result: Ok(()), .. } => "ran",
            TickOutcome::Ran { result: Err(_), .. } => "failed",
            TickOutcome::Lost { .. } => "lost",
            TickOutcome::Stopped { .. } => "stopped",
            TickOutcome::HeldElsewhere => "held_elsewhere",
            TickOutcome::PreviousRunning => "previous_running",
            TickOutcome::AlreadyRan => "already_ran",
            TickOutcome::Missed { .. } => "missed",
            TickOutcome::ClaimFailed { .. } => "claim_failed",
        }
    }

    /// True if the job's handler ran on this replica for this tick.
    pub fn ran_here(&self) -> bool {
        matches!(
            self,
            TickOutcome::Ran { .. } | TickOutcome::Lost { .. } | TickOutcome::Stopped { .. }
        )
    }
}

impl fmt::Display for TickOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: &Duration| humanize(*d);
        match self {
            TickOutcome::Ran {
                lag,
                duration,
                result: Ok(()),
            } => write!(f, "ran: ok in {} (lag {})", ms(duration), ms(lag)),
            TickOutcome::Ran {
                lag,
                duration,
                result: Err(error),
            } => write!(f, "ran: {error} after {} (lag {})", ms(duration), ms(lag)),
            TickOutcome::Lost {
                duration, reason, ..
            } => write!(
                f,
                "ran: stopped after {}: lock lost ({reason})",
                ms(duration)
            ),
            TickOutcome::Stopped { duration, .. } => {
                write!(f, "ran: stopped after {} by shutdown", ms(duration))
            }
            TickOutcome::HeldElsewhere => f.write_str("skipped: held elsewhere"),
            TickOutcome::PreviousRunning => f.write_str("skipped: previous run still running"),
            TickOutcome::AlreadyRan => f.write_str("skipped: already ran"),
            TickOutcome::Missed { count } => write!(f, "missed: {count} tick(s), too late"),
            TickOutcome::ClaimFailed { error } => write!(f, "failed to claim: {error}"),
        }
    }
}

fn humanize(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 10_000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", duration.as_secs_f64())
    }
}

/// One report per tick per replica, to [`Scheduler::on_tick`](super::Scheduler::on_tick).
#[derive(Debug)]
#[non_exhaustive]
pub struct TickReport {
    /// The job.
    pub job: Arc<str>,
    /// The tick's scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// This replica.
    pub replica: Arc<str>,
    /// A catch-up attempt ([`Missed::CatchUp`](super::Missed::CatchUp)) rather than the tick's own.
    pub catch_up: bool,
    /// What happened.
    pub outcome: TickOutcome,
}

/// Runs tick `at` of the job and reports it. Catch-up attempts report only
/// what they did (a run, a failure to claim), not every "already ran".
///
/// `claimed` is dropped once the tick's claim is decided (run here, or not),
/// before the run: the job's loop waits for that before it tries the next
/// tick, so that this replica never advances the mark past a tick it is
/// still claiming.
pub(super) async fn tick(
    env: Arc<JobEnv>,
    at: DateTime<Utc>,
    catch_up: bool,
    claimed: Option<oneshot::Sender<()>>,
) {
    let span = tracing::info_span!(
        "cron_tick",
        job = %env.job.name,
        scheduled_at = %at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        replica = %env.replica,
        catch_up,
        outcome = tracing::field::Empty,
    );
    async {
        let claimed = claim_and_run(&env, at, catch_up, claimed);
        let (outcome, claims) = match &env.job.label {
            // The claims record the job's label as their holder's.
            Some(label) => crate::inspect::with_label(label.clone(), claimed).await,
            None => claimed.await,
        };
        let quiet =
            catch_up && !outcome.ran_here() && !matches!(outcome, TickOutcome::ClaimFailed { .. });
        if !quiet {
            report(&env, at, catch_up, outcome);
        }
        if let Some(claims) = claims {
            // The job's key is free again: a catch-up may run now.
            env.run_ended.notify_one();
            claims.finish(&env).await;
        }
    }
    .instrument(span)
    .await
}

/// Counts, logs and hands on one outcome.
pub(super) fn report(env: &JobEnv, at: DateTime<Utc>, catch_up: bool, outcome: TickOutcome) {
    let job = env.job.name.clone();
    let label = outcome.label();
    tracing::Span::current().record("outcome", label);
    counter!("distlock_cron_ticks_total", "job" => job.clone(), "outcome" => label).increment(1);
    match &outcome {
        TickOutcome::Ran { lag, duration, .. }
        | TickOutcome::Lost { lag, duration, .. }
        | TickOutcome::Stopped { lag, duration } => {
            histogram!("distlock_cron_lag_seconds", "job" => job.clone()).record(lag.as_secs_f64());
            histogram!("distlock_cron_run_duration_seconds", "job" => job.clone())
                .record(duration.as_secs_f64());
        }
        _ => {}
    }
    match &outcome {
        TickOutcome::ClaimFailed { error } => {
            tracing::warn!(component = "distlock", job = %job, %error, "cron tick: failed to claim")
        }
        outcome => tracing::info!(component = "distlock", job = %job, %outcome, "cron tick"),
    }
    if let Some(observer) = &env.observer {
        observer(&TickReport {
            job: job.into(),
            scheduled_at: at,
            replica: env.replica.clone(),
            catch_up,
            outcome,
        });
    }
}

/// The claims of a tick that ran, to release once the run is over.
pub(super) struct Claims {
    tick: Lease,
    /// The tick's claim is held until then (this replica's clock).
    hold_until: DateTime<Utc>,
}

impl Claims {
    /// Holds the tick's claim until `hold_until` (or until the grace period
    /// is over), releases it and forgets the tick's key, so that per-tick
    /// state (a fencing counter, a lock file, a fencing row) does not pile
    /// up on the backend: the key is never locked again, except by a
    /// lagging replica that then finds the mark.
    async fn finish(self, env: &JobEnv) {
        let mut phase = env.phase.clone();
        loop {
            let left = since(self.hold_until, env.clock.now());
            if left.is_zero() || *phase.borrow() == Phase::Stopping {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(left.min(Duration::from_secs(1))) => {}
                changed = phase.changed() => if changed.is_err() { break },
            }
        }
        release_and_forget(env, self.tick).await;
    }
}

async fn release_and_forget(env: &JobEnv, lease: Lease) {
    let key = lease.key().to_owned();
    match lease.release().await {
        Ok(()) => {}
        Err(Error::NotHeld { .. }) => return,
        Err(error) => {
            tracing::warn!(component = "distlock", key, %error, "releasing a cron claim failed; the backend's safety net frees it");
            return;
        }
    }
    match env.locker.forget(&key).await {
        Ok(()) | Err(Error::Unsupported { .. } | Error::NotAcquired { .. }) => {}
        Err(error) => {
            tracing::debug!(component = "distlock", key, %error, "forgetting a tick's claim failed")
        }
    }
}

async fn release_quietly(lease: Lease) {
    if let Err(error @ (Error::Backend { .. } | Error::DeadlineExceeded { .. })) =
        lease.release().await
    {
        tracing::warn!(component = "distlock", %error, "releasing a cron claim failed; the backend's safety net frees it");
    }
}

/// Steps 0–5 of a tick (see the module docs of [`super`]).
async fn claim_and_run(
    env: &JobEnv,
    at: DateTime<Utc>,
    catch_up: bool,
    claimed: Option<oneshot::Sender<()>>,
) -> (TickOutcome, Option<Claims>) {
    let job = &env.job;
    let at_ms = at.timestamp_millis();
    let locker = &env.locker;
    // 0. Peek: advancing to 0 changes nothing (every tick is after the
    //    epoch) and says where the mark is, so a lagging replica skips a
    //    finished tick without touching the job's key.
    let marks = match locker.advance_mark(&env.mark, 0).await {
        Ok(MarkAdvance::AlreadyAt { current }) if current >= at_ms => {
            return (TickOutcome::AlreadyRan, None)
        }
        Ok(_) => true,
        Err(Error::Unsupported { .. }) => {
            env.warn_no_marks();
            false
        }
        Err(error) => return (TickOutcome::ClaimFailed { error }, None),
    };
    if catch_up && !marks {
        // Without a record of the last run a catch-up could repeat a
        // finished tick (reported quietly: catch-ups report only runs).
        return (TickOutcome::AlreadyRan, None);
    }
    // 1. The tick's claim; held elsewhere, wait for its holder to take the
    //    tick or let it go (where marks say which), never queue.
    let tick_key = tick_key(&job.name, at);
    let mut tick = match claim_tick(env, &tick_key, at, marks).await {
        Ok(lease) => lease,
        Err(outcome) => return (outcome, None),
    };
    // 2. The job's key, held while the run lasts.
    let mut job_lease = None;
    if job.overlap == Overlap::Forbid {
        match locker.try_lock(&env.mark, job.at_most).await {
            Ok(Some(lease)) => job_lease = Some(lease),
            Ok(None) => {
                release_and_forget(env, tick).await;
                return (TickOutcome::PreviousRunning, None);
            }
            Err(error) => {
                release_and_forget(env, tick).await;
                return (TickOutcome::ClaimFailed { error }, None);
            }
        }
    }
    // 3. The mark, while both are held: exactly one replica advances it.
    if marks {
        let outcome = match locker.advance_mark(&env.mark, at_ms).await {
            Ok(MarkAdvance::Advanced { .. }) => None,
            Ok(MarkAdvance::AlreadyAt { current }) if current == at_ms => {
                Some(TickOutcome::AlreadyRan)
            }
            // A later tick started while this replica was claiming this
            // one (its claim was slower than the tick's window): marks only
            // grow, so this tick can no longer run anywhere. Nobody ran it
            // while this replica held its claim: it is missed, not "already
            // ran".
            Ok(MarkAdvance::AlreadyAt { .. }) => Some(TickOutcome::Missed { count: 1 }),
            Err(error) => Some(TickOutcome::ClaimFailed { error }),
        };
        if let Some(outcome) = outcome {
            if let Some(lease) = job_lease {
                release_quietly(lease).await;
            }
            release_and_forget(env, tick).await;
            return (outcome, None);
        }
    }
    // The tick is decided: this replica runs it.
    drop(claimed);
    // 4. Run, keeping both claims alive.
    let keepalive = KeepAlive::default().max_hold(job.at_most);
    for lease in std::iter::once(&mut tick).chain(job_lease.as_mut()) {
        if let Err(error) = lease.keep_alive(keepalive.clone()) {
            return (
                TickOutcome::ClaimFailed { error },
                Some(hold(env, at, tick, marks)),
            );
        }
    }
    let lag = since(env.clock.now(), at);
    let (outcome, tick) = match job_lease {
        Some(job_lease) => {
            let (outcome, job_lease) = run(env, at, job_lease, Some(&tick), marks, lag).await;
            if let Some(lease) = job_lease {
                release_quietly(lease).await;
            }
            (outcome, tick)
        }
        None => {
            let (outcome, tick) = run(env, at, tick, None, marks, lag).await;
            match tick {
                Some(tick) => (outcome, tick),
                None => return (outcome, None),
            }
        }
    };
    // 5. The tick's claim is released once held long enough.
    (outcome, Some(hold(env, at, tick, marks)))
}

/// The first pause between two looks at a tick's claim held elsewhere;
/// it doubles up to [`CLAIM_POLL_MAX`].
const CLAIM_POLL_MIN: Duration = Duration::from_millis(50);
const CLAIM_POLL_MAX: Duration = Duration::from_secs(1);

/// Step 1: claims tick `at` under `key`.
///
/// Held elsewhere, on a backend with marks, it keeps looking until the
/// holder has taken the tick (the mark reaches it: [`TickOutcome::HeldElsewhere`]),
/// or has let it go without taking it (its job's key or mark failed, or an
/// earlier run still runs: then it claims the tick itself), or the tick's
/// window ends (the next tick is due, or the scheduler drains). Giving up
/// at once left a tick whose winner failed after claiming it to nobody.
/// Where the backend has no marks the claim itself is the record of a run,
/// so a claim found held is never waited for: its release may mean the
/// tick ran.
async fn claim_tick(
    env: &JobEnv,
    key: &str,
    at: DateTime<Utc>,
    marks: bool,
) -> std::result::Result<Lease, TickOutcome> {
    let at_ms = at.timestamp_millis();
    // Without a next tick (croner failed: see the job's loop) the window
    // is this tick's own instant: one attempt.
    let window_end = env.job.next_after(at).unwrap_or(at);
    let mut phase = env.phase.clone();
    let mut pause = CLAIM_POLL_MIN;
    loop {
        match env.locker.try_lock(key, env.job.at_most).await {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) => {}
            Err(error) => return Err(TickOutcome::ClaimFailed { error }),
        }
        let left = since(window_end, env.clock.now());
        if !marks || left.is_zero() || env.phase() != Phase::Running {
            return Err(TickOutcome::HeldElsewhere);
        }
        tokio::select! {
            () = tokio::time::sleep(pause.min(left)) => {}
            _ = phase.wait_for(|p| *p != Phase::Running) => return Err(TickOutcome::HeldElsewhere),
        }
        pause = pause.saturating_mul(2).min(CLAIM_POLL_MAX);
        match env.locker.advance_mark(&env.mark, 0).await {
            Ok(MarkAdvance::AlreadyAt { current }) if current >= at_ms => {
                return Err(TickOutcome::HeldElsewhere)
            }
            Ok(_) => {}
            Err(error) => return Err(TickOutcome::ClaimFailed { error }),
        }
    }
}

fn hold(env: &JobEnv, at: DateTime<Utc>, tick: Lease, marks: bool) -> Claims {
    let hold = if marks {
        env.job.at_least
    } else {
        env.job.fallback_hold()
    };
    Claims {
        tick,
        hold_until: plus(at, hold),
    }
}

/// Runs the handler with `lease` in its context, raced against the loss of
/// `lease` (unless the handler watches it), the loss of `other` where the
/// backend has no marks (there the tick's claim is what keeps a lagging
/// replica out), and the end of the shutdown. Returns the lease back, unless
/// the handler kept its context beyond the run.
async fn run(
    env: &JobEnv,
    at: DateTime<Utc>,
    lease: Lease,
    other: Option<&Lease>,
    marks: bool,
    lag: Duration,
) -> (TickOutcome, Option<Lease>) {
    let lease = Arc::new(lease);
    let mut lost = lease.info().lost;
    let mut other_lost = other
        .filter(|_| !marks)
        .map(|other| other.lost_signal().early_by(drift_margin(other.ttl())));
    let context = JobContext {
        job: env.job.name.as_str().into(),
        scheduled_at: at,
        replica: env.replica.clone(),
        tick_key: tick_key(&env.job.name, at),
        lease: lease.clone(),
        phase: env.phase.clone(),
    };
    let work = (env.handler)(context);
    let watches = env.job.handler_watches_loss;
    let started = Instant::now();
    let ended = tokio::select! {
        result = work => Ended::Returned(result),
        reason = lost.wait(), if !watches => Ended::Lost(reason),
        reason = wait_opt(&mut other_lost) => Ended::Lost(reason),
        () = stop_deadline(env) => Ended::Stopped,
    };
    let duration = started.elapsed();
    let outcome = match ended {
        // A handler that watches the loss stops itself and returns: still lost.
        Ended::Returned(_) if lost_reason(&lease).is_some() => TickOutcome::Lost {
            lag,
            duration,
            reason: lost_reason(&lease).unwrap_or(LostReason::Expired),
        },
        Ended::Returned(result) => TickOutcome::Ran {
            lag,
            duration,
            result,
        },
        Ended::Lost(reason) => TickOutcome::Lost {
            lag,
            duration,
            reason,
        },
        Ended::Stopped => TickOutcome::Stopped { lag, duration },
    };
    match Arc::try_unwrap(lease) {
        Ok(lease) => (outcome, Some(lease)),
        Err(_) => {
            tracing::warn!(
                component = "distlock",
                job = %env.job.name,
                "the job's context outlived its run; its lock is released when the last copy is dropped"
            );
            (outcome, None)
        }
    }
}

enum Ended {
    Returned(JobResult),
    Lost(LostReason),
    Stopped,
}

/// Why `lease` ended, if it ended other than by release.
fn lost_reason(lease: &Lease) -> Option<LostReason> {
    lease
        .lost_signal()
        .reason()
        .filter(|reason| *reason != LostReason::Released)
}

async fn wait_opt(signal: &mut Option<LostSignal>) -> LostReason {
    match signal {
        Some(signal) => signal.wait().await,
        None => std::future::pending().await,
    }
}

/// Resolves `stop_timeout` after the grace period ended.
async fn stop_deadline(env: &JobEnv) {
    let mut phase = env.phase.clone();
    if phase.wait_for(|p| *p == Phase::Stopping).await.is_err() && env.phase() != Phase::Stopping {
        // The scheduler is gone without saying stop: it was dropped, which
        // aborts this task anyway.
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(env.stop_timeout).await;
}
