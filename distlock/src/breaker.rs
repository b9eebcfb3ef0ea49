//! A circuit breaker as a wrapper: once a backend is known down, new
//! acquisitions fail fast with [`Error::Unavailable`] instead of each waiting
//! for a transport timeout, and an outage is never mistaken for contention.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::deadline::saturating_deadline;
use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::util;
use crate::{Error, Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result};

/// Thresholds of a [`BreakerLocker`].
///
/// ```
/// use std::time::Duration;
/// use distlock::BreakerConfig;
///
/// let config = BreakerConfig::default()
///     .failure_threshold(3)
///     .open_for(Duration::from_secs(10));
/// # let _ = config;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    failure_threshold: u32,
    open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            open_for: Duration::from_secs(5),
        }
    }
}

impl BreakerConfig {
    /// Consecutive backend failures that open the circuit (default 5, at least 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How long the circuit stays open before one probe is let through
    /// (default 5 s).
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.open_for = duration;
        self
    }
}

/// Where a [`BreakerLocker`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass; consecutive failures are counted.
    Closed,
    /// Acquisitions fail fast with [`Error::Unavailable`] until the interval ends.
    Open,
    /// One probe acquisition is in flight; its outcome closes or reopens the circuit.
    HalfOpen,
}

impl BreakerState {
    fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
struct Circuit {
    state: BreakerState,
    consecutive_failures: u32,
    open_until: Instant,
    probe_in_flight: bool,
}

/// Wraps a [`Locker`] with a circuit breaker.
///
/// - Only backend failures ([`Error::Backend`], [`Error::DeadlineExceeded`]) count. Contention, `NotHeld`,
///   and invalid input are healthy answers: the backend responded.
/// - After [`BreakerConfig::failure_threshold`] consecutive failures the
///   circuit opens: `try_lock`, `lock`, their shared forms
///   (`try_lock_shared`, `lock_shared`) and `watch_releases` fail at once with
///   [`Error::Unavailable`] for [`BreakerConfig::open_for`], then one probe is
///   let through (half-open); its success closes the circuit, its failure
///   reopens it.
/// - The half-open probe is the first backend answer: a `try_lock`, or the
///   first attempt of a `lock` (shared ones alike; after which, if the key was merely held, the
///   wait goes on as a normal call), never a whole wait. A probe whose future
///   is dropped before it answered reopens the circuit.
/// - `unlock` and `refresh` are never blocked: they concern a lock that may be
///   held, and failing them fast would strand the lock or lose it needlessly.
///   Their failures count toward opening the circuit; their successes only
///   reset the count of a closed one (an open circuit is closed by its probe
///   alone, not by a stray release that happened to get through).
/// - Transitions are logged (`component = "distlock"`) and counted in
///   `distlock_breaker_transitions_total{backend, state}`.
///
/// It runs on tokio's clock, so tests can drive it with paused time.
///
/// ```
/// use std::time::Duration;
/// use distlock::{BreakerConfig, LockerExt};
///
/// let locker = distlock::memory::MemoryLocker::new()
///     .with_circuit_breaker(BreakerConfig::default().failure_threshold(3))
///     .shared();
/// # let _ = locker;
/// ```
#[derive(Debug)]
pub struct BreakerLocker<L> {
    inner: Arc<L>,
    config: BreakerConfig,
    circuit: Arc<Mutex<Circuit>>,
    /// The `Arc` every lease granted through this wrapper (or a clone) shares.
    leases: crate::SharedLocker,
}

impl<L> Clone for BreakerLocker<L> {
    fn clone(&self) -> Self {
        BreakerLocker {
            inner: self.inner.clone(),
            config: self.config,
            circuit: self.circuit.clone(),
            leases: self.leases.clone(),
        }
    }
}

/// Whether a call may proceed, and if so whether it is the half-open probe.
enum Admission {
    Call,
    Probe,
}

/// Only failures of the backend count: contention, `NotHeld` and bad input
/// are answers from a working backend.
fn counts_as_failure(error: &Error) -> bool {
    matches!(
        error,
        Error::Backend { .. } | Error::DeadlineExceeded { .. }
    )
}

/// Alive while an admitted call awaits its answer; dropped with the call's
/// future (the caller gave up), it reopens the circuit if the call was the
/// probe.
struct Unanswered<'a, L: Locker> {
    breaker: &'a BreakerLocker<L>,
    /// The call is the probe and has not answered yet.
    probe: bool,
}

impl<L: Locker> Drop for Unanswered<'_, L> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.abandon_probe();
        }
    }
}

inner_accessors!(BreakerLocker);

impl<L: Locker> BreakerLocker<L> {
    /// Wraps `inner` with a closed circuit.
    pub fn new(inner: L, config: BreakerConfig) -> Self {
        BreakerLocker {
            inner: Arc::new(inner),
            config,
            circuit: Arc::new(Mutex::new(Circuit {
                state: BreakerState::Closed,
                consecutive_failures: 0,
                open_until: Instant::now(),
                probe_in_flight: false,
            })),
            leases: crate::SharedLocker::default(),
        }
    }

    /// The circuit's current state.
    pub fn state(&self) -> BreakerState {
        self.circuit().state
    }

    fn circuit(&self) -> MutexGuard<'_, Circuit> {
        util::lock(&self.circuit)
    }

    fn admit(&self) -> Result<Admission> {
        let mut circuit = self.circuit();
        match circuit.state {
            BreakerState::Closed => Ok(Admission::Call),
            BreakerState::Open if Instant::now() >= circuit.open_until => {
                self.transition(&mut circuit, BreakerState::HalfOpen);
                circuit.probe_in_flight = true;
                Ok(Admission::Probe)
            }
            BreakerState::HalfOpen if !circuit.probe_in_flight => {
                circuit.probe_in_flight = true;
                Ok(Admission::Probe)
            }
            BreakerState::Open | BreakerState::HalfOpen => {
                let retry_in = circuit.open_until.saturating_duration_since(Instant::now());
                Err(Error::Unavailable {
                    backend: self.inner.backend(),
                    reason: format!(
                        "circuit open after {} consecutive failures; next probe in {retry_in:?}",
                        circuit.consecutive_failures
                    ),
                })
            }
        }
    }

    /// Records the outcome of a call that reached the backend: an acquire
    /// (admitted as a call or as the probe), or a release or refresh (`None`).
    fn record<T>(&self, admission: Option<Admission>, result: &Result<T>) {
        let failed = result.as_ref().is_err_and(counts_as_failure);
        let mut circuit = self.circuit();
        if matches!(admission, Some(Admission::Probe)) {
            circuit.probe_in_flight = false;
        } else if admission.is_none() && !failed && circuit.state != BreakerState::Closed {
            // A release or refresh that got through says little about new
            // acquisitions; only the probe closes the circuit.
            return;
        }
        if failed {
            circuit.consecutive_failures = circuit.consecutive_failures.saturating_add(1);
            let trips = circuit.state == BreakerState::HalfOpen
                || circuit.consecutive_failures >= self.config.failure_threshold;
            if trips {
                circuit.open_until = saturating_deadline(Instant::now(), self.config.open_for);
                if circuit.state != BreakerState::Open {
                    self.transition(&mut circuit, BreakerState::Open);
                }
            }
        } else {
            circuit.consecutive_failures = 0;
            if circuit.state != BreakerState::Closed {
                self.transition(&mut circuit, BreakerState::Closed);
            }
        }
    }

    fn transition(&self, circuit: &mut Circuit, to: BreakerState) {
        let backend = self.inner.backend();
        let from = circuit.state;
        circuit.state = to;
        match to {
            BreakerState::Open => tracing::warn!(
                component = "distlock", backend, from = from.name(),
                failures = circuit.consecutive_failures, open_for = ?self.config.open_for,
                "circuit breaker opened: acquisitions fail fast"
            ),
            _ => tracing::info!(
                component = "distlock",
                backend,
                from = from.name(),
                to = to.name(),
                "circuit breaker state change"
            ),
        }
        metrics::counter!("distlock_breaker_transitions_total", "backend" => backend, "state" => to.name())
            .increment(1);
    }

    async fn guarded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let admission = self.admit()?;
        let mut unanswered = Unanswered {
            breaker: self,
            probe: matches!(admission, Admission::Probe),
        };
        let result = call.await;
        unanswered.probe = false;
        self.record(Some(admission), &result);
        result
    }

    /// A probe dropped before the backend answered: open again, so the next
    /// call after the interval probes anew (otherwise `probe_in_flight` would
    /// stay set and every acquisition would be refused for ever).
    fn abandon_probe(&self) {
        let mut circuit = self.circuit();
        circuit.probe_in_flight = false;
        circuit.open_until = saturating_deadline(Instant::now(), self.config.open_for);
        if circuit.state != BreakerState::Open {
            self.transition(&mut circuit, BreakerState::Open);
        }
    }

    fn own(&self, lease: Lease) -> Lease {
        lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
    }

    /// `lock` and `lock_shared` through the circuit, written once: `attempt`
    /// is one try of the kind asked for, `wait` the inner locker's wait for
    /// it with what is left of `timeout`.
    async fn guarded_wait<'a, A, W>(
        &'a self,
        key: &str,
        timeout: Duration,
        attempt: impl FnOnce() -> A,
        wait: impl FnOnce(Duration) -> W,
    ) -> Result<Lease>
    where
        A: std::future::Future<Output = Result<Option<Lease>>> + 'a,
        W: std::future::Future<Output = Result<Lease>> + 'a,
    {
        let started = Instant::now();
        if self.state() != BreakerState::Closed {
            // Probe with one attempt, not a whole wait that would hold the
            // probe (and with it every other acquisition) for `timeout`.
            if let Some(lease) = self.guarded(attempt()).await? {
                return Ok(self.own(lease));
            }
            if timeout.is_zero() {
                return Err(Error::not_acquired(key));
            }
        }
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() && !timeout.is_zero() {
            return Err(Error::Timeout {
                key: key.to_owned(),
                waited: started.elapsed(),
            });
        }
        let lease = self.guarded(wait(left)).await?;
        Ok(self.own(lease))
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here, not silently left to its
// default (as object_store's wrapper stores do).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for BreakerLocker<L> {
    forward_to_inner!(backend, durability_warnings, capabilities, backend_key);
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let lease = self.guarded(self.inner.try_lock(key, ttl)).await?;
        Ok(lease.map(|lease| self.own(lease)))
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.guarded_wait(
            key,
            timeout,
            || self.inner.try_lock(key, ttl),
            |left| self.inner.lock(key, ttl, left),
        )
        .await
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        let lease = self.guarded(self.inner.try_lock_any(keys, ttl)).await?;
        Ok(lease.map(|lease| self.own(lease)))
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let lease = self.guarded(self.inner.try_lock_shared(key, ttl)).await?;
        Ok(lease.map(|lease| self.own(lease)))
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.guarded_wait(
            key,
            timeout,
            || self.inner.try_lock_shared(key, ttl),
            |left| self.inner.lock_shared(key, ttl, left),
        )
        .await
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        let result = self.inner.unlock(key, owner).await;
        self.record(None, &result);
        result
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let result = self.inner.refresh(key, owner, ttl).await;
        self.record(None, &result);
        result
    }
    /// Like [`refresh`](Locker::refresh): never blocked, each result counted.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let results = self.inner.refresh_many(requests).await;
        for result in &results {
            self.record(None, result);
        }
        results
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.guarded(self.inner.watch_releases(key)).await
    }
    /// Never blocked by an open circuit (like a release, it is cleanup that
    /// should reach a backend that may have recovered); its outcome counts
    /// like a release's.
    async fn forget(&self, key: &str) -> Result<()> {
        let result = self.inner.forget(key).await;
        self.record(None, &result);
        result
    }
    /// Refused with [`Error::Unavailable`] while the circuit is open, like an
    /// acquire (a mark is advanced to claim a tick, so it is new work), and
    /// counted like one.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.guarded(self.inner.advance_mark(name, value)).await
    }
    /// Never blocked and never counted: an operator looking at a backend
    /// while the circuit is open should reach it, and a read says nothing
    /// about acquisitions.
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.inner.inspect(key).await
    }
    /// As [`inspect`](Self::inspect): never blocked, never counted.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.inner.list(prefix).await
    }
    /// Never blocked (an operator's cleanup), counted like a release.
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let result = self.inner.force_release(key, how).await;
        self.record(None, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Flaky;
    use std::sync::atomic::Ordering;

    const TTL: Duration = Duration::from_secs(10);

    fn breaker() -> (Flaky, BreakerLocker<Flaky>) {
        let flaky = Flaky::default();
        let config = BreakerConfig::default()
            .failure_threshold(3)
            .open_for(Duration::from_secs(5));
        (flaky.clone(), BreakerLocker::new(flaky, config))
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_then_fails_fast() {
        let (flaky, breaker) = breaker();
        flaky.down.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            let err = breaker.try_lock("k", TTL).await.unwrap_err();
            assert!(matches!(err, Error::Backend { .. }), "{err}");
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        let calls = flaky.calls.load(Ordering::SeqCst);
        let err = breaker.try_lock("k", TTL).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Unavailable {
                    backend: "flaky",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_contention());
        assert_eq!(
            flaky.calls.load(Ordering::SeqCst),
            calls,
            "an open circuit must not call the backend"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn contention_is_healthy_and_resets_the_count() {
        let (flaky, breaker) = breaker();
        let _held = breaker.try_lock("k", TTL).await.unwrap().unwrap();
        flaky.down.store(true, Ordering::SeqCst);
        breaker.try_lock("k", TTL).await.unwrap_err();
        breaker.try_lock("k", TTL).await.unwrap_err();
        flaky.down.store(false, Ordering::SeqCst);
        assert!(
            breaker.try_lock("k", TTL).await.unwrap().is_none(),
            "contention"
        );
        flaky.down.store(true, Ordering::SeqCst);
        breaker.try_lock("k", TTL).await.unwrap_err();
        breaker.try_lock("k", TTL).await.unwrap_err();
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "contention reset the failure count"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_probe_closes_or_reopens() {
        let (flaky, breaker) = breaker();
        open_and_wait(&flaky, &breaker).await;
        // The probe fails: open again for another interval.
        assert!(matches!(
            breaker.try_lock("k", TTL).await,
            Err(Error::Backend { .. })
        ));
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(matches!(
            breaker.try_lock("k", TTL).await,
            Err(Error::Unavailable { .. })
        ));
        tokio::time::advance(Duration::from_secs(5)).await;
        flaky.down.store(false, Ordering::SeqCst);
        assert_probe_closes(&breaker).await;
    }

    #[tokio::test(start_paused = true)]
    async fn release_and_refresh_are_never_blocked() {
        let (flaky, breaker) = breaker();
        let mut lease = breaker.try_lock("k", TTL).await.unwrap().unwrap();
        trip_open(&flaky, &breaker).await;
        flaky.down.store(false, Ordering::SeqCst);
        lease
            .refresh(TTL)
            .await
            .expect("refresh passes an open circuit");
        lease
            .release()
            .await
            .expect("release passes an open circuit");
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "a stray successful refresh or release does not close an open circuit: only the probe does"
        );
    }

    /// Takes the backend down and trips the breaker open with three failed
    /// attempts (on a key no test holds: they fail before reaching it).
    async fn trip_open(flaky: &Flaky, breaker: &BreakerLocker<Flaky>) {
        flaky.down.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            breaker.try_lock("trip", TTL).await.unwrap_err();
        }
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    /// Asserts that the probe let through after the open interval acquires
    /// the free key `k` and closes the circuit.
    async fn assert_probe_closes(breaker: &BreakerLocker<Flaky>) {
        let lease = breaker
            .try_lock("k", TTL)
            .await
            .expect("the probe is let through after the interval")
            .expect("probe acquires");
        assert_eq!(breaker.state(), BreakerState::Closed);
        lease.release().await.unwrap();
    }

    /// Trips the breaker open, then lets the open interval pass.
    async fn open_and_wait(flaky: &Flaky, breaker: &BreakerLocker<Flaky>) {
        trip_open(flaky, breaker).await;
        tokio::time::advance(Duration::from_secs(5)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_reopens_the_circuit_instead_of_wedging_it() {
        let (flaky, breaker) = breaker();
        open_and_wait(&flaky, &breaker).await;
        flaky.down.store(false, Ordering::SeqCst);
        // The probe is admitted, then its caller gives up before an answer.
        let probe = breaker.guarded(std::future::pending::<Result<()>>());
        assert!(tokio::time::timeout(Duration::from_millis(10), probe)
            .await
            .is_err());
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_probe_closes(&breaker).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_probing_lock_on_a_held_key_is_one_attempt_then_an_ordinary_wait() {
        let (flaky, breaker) = breaker();
        let held = flaky.inner.try_lock("busy", TTL).await.unwrap().unwrap();
        open_and_wait(&flaky, &breaker).await;
        flaky.down.store(false, Ordering::SeqCst);
        let waiter = {
            let breaker = breaker.clone();
            tokio::spawn(async move { breaker.lock("busy", TTL, Duration::from_secs(60)).await })
        };
        // The probe answered "held": the backend works, so the circuit is
        // closed and other acquisitions pass while the wait goes on.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(breaker.state(), BreakerState::Closed);
        let other = breaker.try_lock("other", TTL).await.unwrap().expect("free");
        other.release().await.unwrap();
        held.release().await.unwrap();
        let won = waiter.await.unwrap().expect("the wait goes on and wins");
        won.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_interval_too_long_for_an_instant_keeps_the_circuit_open_without_panicking() {
        let flaky = Flaky::default();
        let breaker = BreakerLocker::new(
            flaky.clone(),
            BreakerConfig::default()
                .failure_threshold(1)
                .open_for(Duration::MAX),
        );
        flaky.down.store(true, Ordering::SeqCst);
        breaker.try_lock("k", TTL).await.unwrap_err();
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
        assert!(matches!(
            breaker.try_lock("k", TTL).await,
            Err(Error::Unavailable { .. })
        ));
    }
}
