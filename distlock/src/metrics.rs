//! Metrics as a wrapper, through the [`metrics`] facade: free when no
//! recorder is installed, exported by whatever recorder the application
//! installs (the CLI serves Prometheus text). The metric names are listed on
//! [`MetricsLocker`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use metrics::{counter, gauge, histogram};
use tokio::time::Instant;

use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::{Error, Lease, Locker, LostReason, MarkAdvance, RefreshRequest, ReleaseWatch, Result};

/// Wraps a [`Locker`] to record these metrics:
///
/// | name | kind | labels |
/// | --- | --- | --- |
/// | `distlock_attempts_total` | counter | backend, operation (`try_lock`, `lock`, `try_lock_any`, `try_lock_shared`, `lock_shared`) |
/// | `distlock_acquired_total` | counter | backend, operation |
/// | `distlock_contended_total` | counter | backend, operation |
/// | `distlock_timeouts_total` | counter | backend |
/// | `distlock_releases_total` | counter | backend, outcome (`released`, `not_held`, error kind) |
/// | `distlock_refreshes_total` | counter | backend, outcome (`refreshed`, `not_held`, error kind) |
/// | `distlock_not_held_total` | counter | backend, operation (`unlock`, `refresh`) |
/// | `distlock_lost_total` | counter | backend, reason (`not_held`, `expired`, `max_hold_exceeded`, `connection_lost`) |
/// | `distlock_errors_total` | counter | backend, operation, outcome (error kind) |
/// | `distlock_breaker_transitions_total` | counter | backend, state (see [`crate::BreakerLocker`]) |
/// | `distlock_operation_duration_seconds` | histogram | backend, operation, outcome |
/// | `distlock_wait_duration_seconds` | histogram | backend, outcome (time in `lock` until acquired or given up) |
/// | `distlock_hold_duration_seconds` | histogram | backend (grant to release, drop or loss) |
///
/// Keys are never labels: their number is unbounded.
///
/// ```
/// use distlock::LockerExt;
///
/// distlock::describe_metrics(); // optional: units and help texts for exporters
/// let locker = distlock::memory::MemoryLocker::new().with_metrics().shared();
/// # let _ = locker;
/// ```
#[derive(Debug)]
pub struct MetricsLocker<L> {
    inner: Arc<L>,
    /// The `Arc` every lease granted through this wrapper (or a clone) shares.
    leases: crate::SharedLocker,
}

impl<L> Clone for MetricsLocker<L> {
    fn clone(&self) -> Self {
        MetricsLocker {
            inner: self.inner.clone(),
            leases: self.leases.clone(),
        }
    }
}

inner_accessors!(MetricsLocker);

impl<L: Locker> MetricsLocker<L> {
    /// Wraps `inner`.
    pub fn new(inner: L) -> Self {
        MetricsLocker {
            inner: Arc::new(inner),
            leases: crate::SharedLocker::default(),
        }
    }

    /// Routes the lease's release and refresh through this wrapper and records
    /// its hold time and any loss when it ends.
    fn observe(&self, lease: Lease) -> Lease {
        let backend = self.inner.backend();
        let granted = Instant::now();
        gauge!("distlock_leases_held", "backend" => backend).increment(1.0);
        lease.on_end(move |reason| {
            gauge!("distlock_leases_held", "backend" => backend).decrement(1.0);
            histogram!("distlock_hold_duration_seconds", "backend" => backend)
                .record(granted.elapsed().as_secs_f64());
            if reason != LostReason::Released {
                counter!("distlock_lost_total", "backend" => backend, "reason" => reason_name(reason))
                    .increment(1);
            }
        });
        lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
    }

    /// Runs `call`, timed as `operation` with the outcome label `outcome`
    /// gives its result.
    async fn measured<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T>>,
        outcome: impl FnOnce(&Result<T>) -> &'static str,
    ) -> Result<T> {
        let started = Instant::now();
        let result = call.await;
        self.timed(operation, outcome(&result), started);
        result
    }

    fn timed(&self, operation: &'static str, outcome: &'static str, started: Instant) {
        histogram!(
            "distlock_operation_duration_seconds",
            "backend" => self.inner.backend(), "operation" => operation, "outcome" => outcome
        )
        .record(started.elapsed().as_secs_f64());
    }

    /// The outcome label of a call that only reads or evicts: `found`'s
    /// name for what it returned, or the error kind (counted as an error).
    fn read_outcome<T>(
        &self,
        operation: &'static str,
        result: &Result<T>,
        found: impl FnOnce(&T) -> &'static str,
    ) -> &'static str {
        match result {
            Ok(value) => found(value),
            Err(error) => self.error(operation, error),
        }
    }

    /// Counts a failed operation; returns its outcome label, the error kind.
    fn error(&self, operation: &'static str, error: &Error) -> &'static str {
        counter!(
            "distlock_errors_total",
            "backend" => self.inner.backend(), "operation" => operation, "outcome" => error.kind_name()
        )
        .increment(1);
        error.kind_name()
    }

    /// One attempt (`try_lock`, `try_lock_any`, `try_lock_shared`) counted and timed under
    /// `operation`.
    async fn attempted(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<Option<Lease>>>,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let result = call.await;
        let outcome = self.acquire_outcome(operation, result.as_ref().map(Option::is_some));
        self.timed(operation, outcome, started);
        Ok(result?.map(|lease| self.observe(lease)))
    }

    /// One wait (`lock`, `lock_shared`) counted and timed under
    /// `operation`, its duration also in the wait histogram.
    async fn waited(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<Lease>>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let result = call.await;
        let outcome = self.acquire_outcome(operation, result.as_ref().map(|_| true));
        self.timed(operation, outcome, started);
        histogram!("distlock_wait_duration_seconds", "backend" => self.inner.backend(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        result.map(|lease| self.observe(lease))
    }

    /// Counts an acquire attempt's outcome (`Ok(acquired?)`); returns the
    /// outcome label.
    fn acquire_outcome(
        &self,
        operation: &'static str,
        result: Result<bool, &Error>,
    ) -> &'static str {
        let backend = self.inner.backend();
        counter!("distlock_attempts_total", "backend" => backend, "operation" => operation)
            .increment(1);
        match result {
            Ok(true) => {
                counter!("distlock_acquired_total", "backend" => backend, "operation" => operation)
                    .increment(1);
                "acquired"
            }
            Ok(false) | Err(Error::NotAcquired { .. }) => {
                counter!("distlock_contended_total", "backend" => backend, "operation" => operation).increment(1);
                "contended"
            }
            Err(Error::Timeout { .. }) => {
                counter!("distlock_timeouts_total", "backend" => backend).increment(1);
                "timeout"
            }
            Err(error) => self.error(operation, error),
        }
    }

    /// Counts a release or refresh outcome; returns the outcome label.
    fn holder_outcome(
        &self,
        operation: &'static str,
        success: &'static str,
        result: &Result<()>,
    ) -> &'static str {
        let backend = self.inner.backend();
        let outcome = match result {
            Ok(()) => success,
            Err(Error::NotHeld { .. }) => {
                counter!("distlock_not_held_total", "backend" => backend, "operation" => operation)
                    .increment(1);
                "not_held"
            }
            Err(error) => self.error(operation, error),
        };
        let total = if operation == "unlock" {
            "distlock_releases_total"
        } else {
            "distlock_refreshes_total"
        };
        counter!(total, "backend" => backend, "outcome" => outcome).increment(1);
        outcome
    }
}

/// A [`LostReason`] as a metric label (`not_held`, `expired`, ...).
pub(crate) fn reason_name(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Released => "released",
        LostReason::NotHeld => "not_held",
        LostReason::Expired => "expired",
        LostReason::MaxHoldExceeded => "max_hold_exceeded",
        LostReason::ConnectionLost => "connection_lost",
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here, not silently left to its
// default (as object_store's wrapper stores do).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for MetricsLocker<L> {
    forward_to_inner!(backend, durability_warnings, capabilities, backend_key);
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.attempted("try_lock", self.inner.try_lock(key, ttl))
            .await
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.waited("lock", self.inner.lock(key, ttl, timeout))
            .await
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        self.attempted("try_lock_any", self.inner.try_lock_any(keys, ttl))
            .await
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.attempted("try_lock_shared", self.inner.try_lock_shared(key, ttl))
            .await
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.waited("lock_shared", self.inner.lock_shared(key, ttl, timeout))
            .await
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        let call = self.inner.unlock(key, owner);
        self.measured("unlock", call, |result| {
            self.holder_outcome("unlock", "released", result)
        })
        .await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let call = self.inner.refresh(key, owner, ttl);
        self.measured("refresh", call, |result| {
            self.holder_outcome("refresh", "refreshed", result)
        })
        .await
    }
    /// Each request counts as one `refresh`, timed as the whole batch took.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let started = Instant::now();
        let results = self.inner.refresh_many(requests).await;
        for result in &results {
            let outcome = self.holder_outcome("refresh", "refreshed", result);
            self.timed("refresh", outcome, started);
        }
        results
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(key).await
    }
    /// Timed as operation `forget` (outcome `forgotten`, `held` or the error
    /// kind); failures other than a held key count as errors.
    async fn forget(&self, key: &str) -> Result<()> {
        let outcome = |result: &Result<()>| match result {
            Ok(()) => "forgotten",
            Err(Error::NotAcquired { .. }) => "held",
            Err(error) => self.error("forget", error),
        };
        self.measured("forget", self.inner.forget(key), outcome)
            .await
    }
    /// Timed as operation `advance_mark` (outcome `advanced`, `already_at`
    /// or the error kind); failures count as errors.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        let call = self.inner.advance_mark(name, value);
        self.measured("advance_mark", call, |result| {
            self.read_outcome("advance_mark", result, |advance| match advance {
                MarkAdvance::Advanced { .. } => "advanced",
                MarkAdvance::AlreadyAt { .. } => "already_at",
            })
        })
        .await
    }
    /// Timed as operation `inspect` (outcome `held`, `free` or the error kind).
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.measured("inspect", self.inner.inspect(key), |result| {
            self.read_outcome("inspect", result, held_or_free)
        })
        .await
    }
    /// Timed as operation `list` (outcome `listed` or the error kind).
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.measured("list", self.inner.list(prefix), |result| {
            self.read_outcome("list", result, |_| "listed")
        })
        .await
    }
    /// Timed as operation `force_release` (outcome `held` when it evicted a
    /// holder, `free`, or the error kind).
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let call = self.inner.force_release(key, how);
        self.measured("force_release", call, |result| {
            self.read_outcome("force_release", result, held_or_free)
        })
        .await
    }
}

fn held_or_free(found: &Option<HeldLock>) -> &'static str {
    match found {
        Some(_) => "held",
        None => "free",
    }
}

/// Bucket bounds, in seconds, for every distlock duration histogram (their
/// names end in `_seconds`): from half a millisecond (a lock round trip on
/// loopback) to an hour (a long hold or cron run).
///
/// The `metrics` facade leaves the choice of summary or histogram to the
/// exporter; Prometheus can aggregate histograms across replicas and cannot
/// aggregate summaries, so configure these buckets when you install one,
/// as `distlock --metrics-addr` does:
///
/// ```
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
///
/// let builder = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), distlock::DURATION_BUCKETS)
///     .expect("non-empty buckets");
/// # drop(builder);
/// ```
pub const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
];

/// Registers units and help texts of every distlock metric with the installed
/// recorder (optional; exporters show them).
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        "distlock_leases_held",
        "Leases this process holds now (granted and not yet ended)."
    );
    describe_counter!(
        "distlock_attempts_total",
        "Acquire attempts (try_lock and lock calls, shared ones included)."
    );
    describe_counter!("distlock_acquired_total", "Locks acquired.");
    describe_counter!(
        "distlock_contended_total",
        "Acquire attempts that found the lock held elsewhere."
    );
    describe_counter!(
        "distlock_timeouts_total",
        "lock calls that gave up at their timeout."
    );
    describe_counter!("distlock_releases_total", "Releases, by outcome.");
    describe_counter!("distlock_refreshes_total", "Refreshes, by outcome.");
    describe_counter!(
        "distlock_not_held_total",
        "Releases or refreshes by an owner that no longer held the lock."
    );
    describe_counter!("distlock_lost_total", "Leases lost while held, by reason.");
    describe_counter!("distlock_errors_total", "Failed operations, by error kind.");
    describe_counter!(
        "distlock_breaker_transitions_total",
        "Circuit breaker state changes, by new state."
    );
    describe_histogram!(
        "distlock_operation_duration_seconds",
        Unit::Seconds,
        "Latency of each operation."
    );
    describe_histogram!(
        "distlock_wait_duration_seconds",
        Unit::Seconds,
        "Time spent in lock() until acquired or given up."
    );
    describe_histogram!(
        "distlock_hold_duration_seconds",
        Unit::Seconds,
        "Time from grant to release, drop or loss."
    );
    describe_counter!(
        "distlock_election_campaigns_total",
        "Campaigns, by election and outcome (elected, timeout, error kind)."
    );
    describe_gauge!(
        "distlock_election_leader",
        "1 while this process leads the election, else 0."
    );
    describe_counter!(
        "distlock_election_terms_ended_total",
        "Terms this process led that ended, by election and reason (resigned, not_held, expired, max_hold_exceeded, connection_lost)."
    );
    describe_histogram!(
        "distlock_election_term_duration_seconds",
        Unit::Seconds,
        "How long each term this process led lasted, by election."
    );
    describe_counter!(
        "distlock_election_leader_changes_total",
        "Leader changes seen by this process's observers, by election."
    );
    describe_counter!(
        "distlock_semaphore_acquires_total",
        "Semaphore acquire calls, by semaphore, operation (try_acquire, acquire) and outcome (acquired, full, timeout, error kind)."
    );
    describe_gauge!(
        "distlock_semaphore_permits_held",
        "Semaphore permits this process holds now, by semaphore."
    );
    describe_counter!(
        "distlock_cron_ticks_total",
        "Cron ticks seen by this replica, by job and outcome (ran, failed, lost, stopped, held_elsewhere, previous_running, already_ran, missed, claim_failed)."
    );
    describe_histogram!(
        "distlock_cron_run_duration_seconds",
        Unit::Seconds,
        "How long each cron run took, by job."
    );
    describe_histogram!(
        "distlock_cron_lag_seconds",
        Unit::Seconds,
        "From a tick's scheduled instant to the start of its run, by job."
    );
    describe_counter!(
        "distlock_cron_schedule_errors_total",
        "Failures to compute a cron job's next tick (retried with back-off), by job."
    );
}
