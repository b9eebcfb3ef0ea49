//! A locker that fails on demand, for testing code that uses a locker:
//! [`FaultyLocker`] and its control handle [`Faults`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::wait::{acquire_with, ReleaseWatch, WaitPolicy};
use crate::{Error, Lease, Locker, MarkAdvance, RefreshRequest, Result};

/// Wraps any [`Locker`] (typically a [`MemoryLocker`](crate::memory::MemoryLocker))
/// so that a test can make it fail the way a real backend fails, at any time,
/// through the [`Faults`] handle from [`faults`](FaultyLocker::faults):
///
/// - **outage** ([`Faults::start_outage`]): every call fails with
///   [`Error::Backend`] (`outcome_unknown` false: the call was refused, as a
///   dead server's closed port refuses it), as a real backend's transport
///   failure does. A keepalive retries through it, and its lease is lost
///   ([`LostReason::Expired`](crate::LostReason::Expired)) if the outage
///   outlasts the ttl;
/// - **contention** ([`Faults::start_contention`]): every acquire finds its
///   key held elsewhere: `try_lock` answers `Ok(None)`, `lock` waits until
///   its timeout ([`Error::Timeout`], or [`Error::NotAcquired`] for a zero
///   timeout) or until the contention ends, whichever comes first;
/// - **a lost lease** ([`Faults::lose_lease_after_refreshes`]): after `n`
///   more successful refreshes, the next refresh answers [`Error::NotHeld`]
///   and the lock is freed on the wrapped locker, as when a lock expired
///   and was taken over. The lease's lost signal fires with
///   [`LostReason::NotHeld`](crate::LostReason::NotHeld), whether the refresh
///   came from [`Lease::refresh`] or the lease's keepalive, so work under
///   [`with_lock`](crate::with_lock) or [`WithLock::run`](crate::WithLock::run)
///   is stopped with [`Error::Lost`];
/// - **latency** ([`Faults::set_latency`]): every call (every attempt of a
///   waiting `lock`, every `refresh_many` batch) first sleeps on tokio's
///   clock, so tests on paused time (`#[tokio::test(start_paused = true)]`)
///   see it without waiting for it.
///
/// With no fault injected it keeps the whole [`Locker`] contract of the
/// locker it wraps (the conformance suite runs through it). Clones share the
/// wrapped locker, the faults and the counters.
///
/// A memory or file lease dropped without [`Lease::release`] frees its lock
/// synchronously on the wrapped locker, without an `unlock` through this one:
/// such a release is neither counted in [`Faults::releases`] nor refused by
/// an outage.
///
/// # Errors
///
/// Besides the wrapped locker's own answers: [`Error::Backend`] from every
/// call during an outage (every result of a `refresh_many` batch);
/// [`Error::Timeout`] or [`Error::NotAcquired`] from `lock` under
/// contention; [`Error::NotHeld`] from the refresh an armed loss falls on.
/// An acquire with invalid input is still [`Error::InvalidInput`], checked
/// before any fault.
///
/// # Cancel safety
///
/// As the wrapped locker's: a call dropped during its injected delay never
/// reached it. A dropped refresh that an armed loss fell on has spent the
/// loss, and may or may not have freed the lock.
///
/// # Example: a job that must stop when its lock is lost
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use distlock::testkit::FaultyLocker;
/// use distlock::{memory::MemoryLocker, Error, KeepAlive, Locker, LockerExt, LostReason, WithLock};
///
/// /// The code under test: writes pages under the lock until it has 100, and
/// /// must stop as soon as the lock is lost.
/// async fn nightly_report(locker: Arc<dyn Locker>) -> Result<u32, Error> {
///     let ttl = Duration::from_secs(3);
///     let done = WithLock::default()
///         .keep_alive(KeepAlive::default())
///         .run(&*locker, "nightly-report", ttl, Duration::ZERO, |_lease| async {
///             let mut pages = 0;
///             while pages < 100 {
///                 tokio::time::sleep(Duration::from_millis(500)).await;
///                 pages += 1;
///             }
///             pages
///         })
///         .await?;
///     Ok(done.value)
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // In a `#[tokio::test(start_paused = true)]`:
/// let locker = FaultyLocker::new(MemoryLocker::new());
/// let faults = locker.faults();
/// faults.lose_lease_after_refreshes(2);
/// let started = tokio::time::Instant::now();
/// let outcome = nightly_report(locker.shared()).await;
/// assert!(matches!(
///     outcome,
///     Err(Error::Lost { reason: LostReason::NotHeld, .. })
/// ));
/// // Keepalive refreshes are due every ttl/3 = 1 s: two kept the lock, the
/// // third was told it was gone, and the job stopped then, not 50 s later.
/// assert_eq!(started.elapsed(), Duration::from_secs(3));
/// assert_eq!(faults.refreshes(), 3);
/// assert_eq!(faults.acquires(), 1);
/// # }
/// ```
#[derive(Debug)]
pub struct FaultyLocker<L> {
    inner: Arc<L>,
    faults: Faults,
    /// The `Arc` every lease granted through this wrapper (or a clone) shares.
    leases: crate::SharedLocker,
}

impl<L> Clone for FaultyLocker<L> {
    fn clone(&self) -> Self {
        FaultyLocker {
            inner: self.inner.clone(),
            faults: self.faults.clone(),
            leases: self.leases.clone(),
        }
    }
}

inner_accessors!(FaultyLocker);

/// The faults a [`FaultyLocker`] injects and what it has seen: a cloneable
/// handle, shared with the locker and every clone of it, usable from any task
/// at any time. A change applies to every call that starts after it, and
/// wakes `lock` calls waiting out an injected contention.
#[derive(Debug, Clone)]
pub struct Faults(Arc<FaultState>);

#[derive(Debug)]
struct FaultState {
    /// The faults every call consults; a watch channel, so that waiting
    /// acquires wake when contention ends.
    settings: watch::Sender<Settings>,
    /// Successful refreshes still allowed before the next one loses its
    /// lease; `None`: no loss armed.
    refreshes_before_loss: Mutex<Option<u64>>,
    acquires: AtomicU64,
    releases: AtomicU64,
    refreshes: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    outage: bool,
    contention: bool,
    latency: Duration,
}

impl Faults {
    fn new() -> Self {
        Faults(Arc::new(FaultState {
            settings: watch::Sender::new(Settings::default()),
            refreshes_before_loss: Mutex::new(None),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            refreshes: AtomicU64::new(0),
        }))
    }

    fn settings(&self) -> Settings {
        *self.0.settings.borrow()
    }

    /// Makes the backend unreachable: every call fails with
    /// [`Error::Backend`] until [`end_outage`](Faults::end_outage).
    pub fn start_outage(&self) {
        self.0.settings.send_modify(|s| s.outage = true);
    }

    /// Makes the backend reachable again. Locks taken before the outage are
    /// still held if their ttl has not run out.
    pub fn end_outage(&self) {
        self.0.settings.send_modify(|s| s.outage = false);
    }

    /// Makes every acquire find its key held elsewhere, until
    /// [`end_contention`](Faults::end_contention). Locks already held are
    /// unaffected.
    pub fn start_contention(&self) {
        self.0.settings.send_modify(|s| s.contention = true);
    }

    /// Lets acquires through again, and wakes the `lock` calls waiting: each
    /// then takes its key if it is free on the wrapped locker.
    pub fn end_contention(&self) {
        self.0.settings.send_modify(|s| s.contention = false);
    }

    /// Arms one lease loss: the next `n` successful refreshes (of any lease
    /// of this locker, counted in the order they arrive; a failed one does
    /// not count) go through, and the one after them answers
    /// [`Error::NotHeld`] and frees that lease's lock on the wrapped locker.
    /// Its later refreshes answer `NotHeld` too, from the wrapped locker,
    /// which no longer has the lock. Arming again replaces the count;
    /// [`clear`](Faults::clear) disarms it. One loss per arming.
    pub fn lose_lease_after_refreshes(&self, n: u64) {
        *crate::util::lock(&self.0.refreshes_before_loss) = Some(n);
    }

    /// Delays every later call by `latency` (zero: none), on tokio's clock.
    pub fn set_latency(&self, latency: Duration) {
        self.0.settings.send_modify(|s| s.latency = latency);
    }

    /// Removes every fault: no outage, no contention, no latency, no armed
    /// lease loss. The counters are kept.
    pub fn clear(&self) {
        self.0.settings.send_replace(Settings::default());
        *crate::util::lock(&self.0.refreshes_before_loss) = None;
    }

    /// Acquire calls seen (`try_lock`, `lock`, `try_lock_any` and their
    /// shared forms), whatever they answered; a waiting `lock` counts once.
    pub fn acquires(&self) -> u64 {
        self.0.acquires.load(Ordering::SeqCst)
    }

    /// `unlock` calls seen ([`Lease::release`] makes one), whatever they
    /// answered.
    pub fn releases(&self) -> u64 {
        self.0.releases.load(Ordering::SeqCst)
    }

    /// Refreshes seen ([`Lease::refresh`], and each lease of a keepalive's
    /// `refresh_many` batch), whatever they answered.
    pub fn refreshes(&self) -> u64 {
        self.0.refreshes.load(Ordering::SeqCst)
    }

    /// Whether the next refresh loses its lease; if not, counts it against
    /// an armed loss (given back by [`refresh_failed`](Self::refresh_failed)
    /// if the refresh then fails), so concurrent refreshes cannot both take
    /// the last allowed one.
    fn refresh_loses_lease(&self) -> bool {
        let mut left = crate::util::lock(&self.0.refreshes_before_loss);
        match *left {
            Some(0) => {
                *left = None;
                true
            }
            Some(n) => {
                *left = Some(n - 1);
                false
            }
            None => false,
        }
    }

    /// Gives back the refresh [`refresh_loses_lease`](Self::refresh_loses_lease)
    /// counted, since it did not succeed.
    fn refresh_failed(&self) {
        if let Some(n) = crate::util::lock(&self.0.refreshes_before_loss).as_mut() {
            *n = n.saturating_add(1);
        }
    }
}

impl<L: Locker> FaultyLocker<L> {
    /// Wraps `inner` with no fault injected.
    pub fn new(inner: L) -> Self {
        FaultyLocker {
            inner: Arc::new(inner),
            faults: Faults::new(),
            leases: crate::SharedLocker::default(),
        }
    }

    /// The handle that injects faults into this locker (and its clones) and
    /// reads its counters.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// What every call goes through first: the injected latency, then the
    /// injected outage.
    async fn call(&self, operation: &'static str) -> Result<Settings> {
        let settings = self.faults.settings();
        if !settings.latency.is_zero() {
            tokio::time::sleep(settings.latency).await;
        }
        // Read again: the outage may have begun or ended during the delay.
        let settings = self.faults.settings();
        if settings.outage {
            return Err(Error::backend(
                self.inner.backend(),
                operation,
                "connection refused (outage injected by FaultyLocker)",
            ));
        }
        Ok(settings)
    }

    /// Re-homes a lease granted by the wrapped locker, so that its release,
    /// refresh and keepalive pass through the faults.
    fn own(&self, lease: Lease) -> Lease {
        lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
    }

    /// One acquire attempt (exclusive, or `shared`): `None` under injected
    /// contention.
    async fn attempt(&self, key: &str, ttl: Duration, shared: bool) -> Result<Option<Lease>> {
        crate::validate::acquire(key, ttl)?;
        if self.call("acquire").await?.contention {
            return Ok(None);
        }
        let lease = match shared {
            true => self.inner.try_lock_shared(key, ttl).await?,
            false => self.inner.try_lock(key, ttl).await?,
        };
        Ok(lease.map(|lease| self.own(lease)))
    }

    /// `lock` and `lock_shared`: attempts through the faults, woken by the
    /// wrapped locker's releases and by every change of the faults (the end
    /// of a contention), with the crate's one waiting loop.
    async fn wait(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
        shared: bool,
    ) -> Result<Lease> {
        self.faults.0.acquires.fetch_add(1, Ordering::SeqCst);
        crate::validate::acquire(key, ttl)?;
        let releases = async {
            // Subscribed before the attempts that follow: a change after
            // one of them is seen, never missed.
            let changes = self.faults.0.settings.subscribe();
            let changes = ReleaseWatch::from_stream(futures_util::stream::unfold(
                changes,
                |mut changes| async move { changes.changed().await.ok().map(|()| ((), changes)) },
            ));
            let released = self.inner.watch_releases(key).await?;
            Ok(ReleaseWatch::merge(
                released.into_iter().chain([changes]).collect(),
            ))
        };
        acquire_with(
            self.inner.backend(),
            key,
            timeout,
            &WaitPolicy::default(),
            || self.attempt(key, ttl, shared),
            releases,
        )
        .await
    }

    /// One refresh, once the latency and outage are past: the armed loss,
    /// or the wrapped locker's answer.
    async fn refresh_through(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        if self.faults.refresh_loses_lease() {
            // The lock is gone, as after an expiry and a takeover: whatever
            // the wrapped locker answers, this owner no longer holds it.
            let _ = self.inner.unlock(key, owner).await;
            return Err(Error::not_held(key));
        }
        let refreshed = self.inner.refresh(key, owner, ttl).await;
        if refreshed.is_err() {
            self.faults.refresh_failed();
        }
        refreshed
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here (can it fail on demand?).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for FaultyLocker<L> {
    forward_to_inner!(backend, durability_warnings, capabilities, backend_key);
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.faults.0.acquires.fetch_add(1, Ordering::SeqCst);
        self.attempt(key, ttl, false).await
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.wait(key, ttl, timeout, false).await
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        self.faults.0.acquires.fetch_add(1, Ordering::SeqCst);
        crate::validate::keys(keys)?;
        if self.call("acquire").await?.contention {
            return Ok(None);
        }
        let lease = self.inner.try_lock_any(keys, ttl).await?;
        Ok(lease.map(|lease| self.own(lease)))
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.faults.0.acquires.fetch_add(1, Ordering::SeqCst);
        self.attempt(key, ttl, true).await
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.wait(key, ttl, timeout, true).await
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        self.faults.0.releases.fetch_add(1, Ordering::SeqCst);
        self.call("release").await?;
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.faults.0.refreshes.fetch_add(1, Ordering::SeqCst);
        self.call("refresh").await?;
        self.refresh_through(key, owner, ttl).await
    }
    /// One delay and one outage check for the batch (one round trip), then
    /// each request in order, so an armed loss falls on a definite one.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let seen = u64::try_from(requests.len()).unwrap_or(u64::MAX);
        self.faults.0.refreshes.fetch_add(seen, Ordering::SeqCst);
        if let Err(error) = self.call("refresh").await {
            return requests.iter().map(|_| Err(error.duplicate())).collect();
        }
        let mut results = Vec::with_capacity(requests.len());
        for request in requests {
            results.push(
                self.refresh_through(request.key, request.owner, request.ttl)
                    .await,
            );
        }
        results
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.call("watch releases").await?;
        self.inner.watch_releases(key).await
    }
    async fn forget(&self, key: &str) -> Result<()> {
        self.call("forget").await?;
        self.inner.forget(key).await
    }
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.call("advance mark").await?;
        self.inner.advance_mark(name, value).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.call("inspect").await?;
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.call("list").await?;
        self.inner.list(prefix).await
    }
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        self.call("force release").await?;
        self.inner.force_release(key, how).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;
    use crate::{KeepAlive, LostReason};
    use tokio::time::Instant;

    const TTL: Duration = Duration::from_secs(3);

    fn faulty() -> (FaultyLocker<MemoryLocker>, Faults) {
        let locker = FaultyLocker::new(MemoryLocker::new());
        let faults = locker.faults();
        (locker, faults)
    }

    async fn granted(locker: &impl Locker, key: &str) -> Lease {
        let lease = locker.try_lock(key, TTL).await;
        lease.unwrap().expect("the key is free")
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_fails_every_call_as_a_refused_connection_until_it_ends() {
        let (locker, faults) = faulty();
        let mut lease = granted(&locker, "held").await;
        faults.start_outage();
        let refused = locker.try_lock("k", TTL).await.unwrap_err();
        assert!(
            matches!(
                refused,
                Error::Backend {
                    backend: "memory",
                    operation: "acquire",
                    outcome_unknown: false,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(refused.is_outage() && !refused.is_contention());
        let waited = locker.lock("k", TTL, Duration::from_secs(5)).await;
        assert!(matches!(waited, Err(Error::Backend { .. })), "{waited:?}");
        let refreshed = lease.refresh(TTL).await;
        assert!(
            matches!(
                refreshed,
                Err(Error::Backend {
                    operation: "refresh",
                    ..
                })
            ),
            "{refreshed:?}"
        );
        assert_eq!(
            lease.lost_signal().reason(),
            None,
            "a failed refresh is not a loss"
        );
        assert!(matches!(
            locker.inspect("held").await,
            Err(Error::Backend {
                operation: "inspect",
                ..
            })
        ));
        faults.end_outage();
        assert!(locker.try_lock("held", TTL).await.unwrap().is_none());
        lease.refresh(TTL).await.unwrap();
        lease.release().await.unwrap();
        granted(&locker, "k").await.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn contention_answers_none_and_lock_waits_out_its_timeout() {
        let (locker, faults) = faulty();
        faults.start_contention();
        assert!(locker.try_lock("k", TTL).await.unwrap().is_none());
        assert!(locker.try_lock_shared("k", TTL).await.unwrap().is_none());
        let keys = ["a".to_owned(), "b".to_owned()];
        assert!(locker.try_lock_any(&keys, TTL).await.unwrap().is_none());
        assert!(matches!(
            locker.lock("k", TTL, Duration::ZERO).await,
            Err(Error::NotAcquired { .. })
        ));
        let started = Instant::now();
        let waited = locker.lock("k", TTL, Duration::from_secs(2)).await;
        assert!(
            matches!(&waited, Err(Error::Timeout { key, waited }) if key == "k" && *waited == Duration::from_secs(2)),
            "{waited:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        // Nothing was taken on the wrapped locker.
        granted(locker.get_ref(), "k")
            .await
            .release()
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_lock_is_granted_as_soon_as_contention_ends() {
        let (locker, faults) = faulty();
        faults.start_contention();
        let started = Instant::now();
        let waiter = {
            let locker = locker.clone();
            tokio::spawn(async move {
                let lease = locker.lock("k", TTL, Duration::from_secs(60)).await;
                (lease, Instant::now())
            })
        };
        // Longer than the wait's backoff cap, so a poll alone would be late.
        tokio::time::sleep(Duration::from_millis(5250)).await;
        faults.end_contention();
        let (lease, granted_at) = waiter.await.unwrap();
        assert_eq!(
            granted_at.duration_since(started),
            Duration::from_millis(5250),
            "woken by the end of the contention, not by a later poll"
        );
        assert_eq!(lease.unwrap().key(), "k");
        assert_eq!(faults.acquires(), 1, "a waiting lock counts once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_lost_on_the_refresh_after_the_allowed_ones() {
        let (locker, faults) = faulty();
        let mut lease = granted(&locker, "k").await;
        let mut lost = lease.lost_signal();
        faults.lose_lease_after_refreshes(2);
        lease.refresh(TTL).await.unwrap();
        lease.refresh(TTL).await.unwrap();
        assert_eq!(lost.reason(), None);
        assert!(matches!(
            lease.refresh(TTL).await,
            Err(Error::NotHeld { key }) if key == "k"
        ));
        assert_eq!(lost.wait().await, LostReason::NotHeld);
        // Gone on the backend: somebody else can take it, and the former
        // holder's own refresh and release are told so.
        let taker = granted(locker.get_ref(), "k").await;
        assert!(matches!(
            locker.refresh("k", lease.owner(), TTL).await,
            Err(Error::NotHeld { .. })
        ));
        assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(faults.refreshes(), 4);
        assert_eq!(faults.releases(), 1);
        // One loss per arming: the next lease keeps being refreshed.
        drop(taker);
        let mut next = granted(&locker, "k").await;
        next.refresh(TTL).await.unwrap();
        next.refresh(TTL).await.unwrap();
        next.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_does_not_count_towards_the_loss() {
        let (locker, faults) = faulty();
        let mut lease = granted(&locker, "k").await;
        faults.lose_lease_after_refreshes(1);
        faults.start_outage();
        assert!(lease.refresh(TTL).await.is_err());
        faults.end_outage();
        // A refresh of a key this owner does not hold fails on the backend.
        assert!(locker.refresh("k", "not-the-owner", TTL).await.is_err());
        lease.refresh(TTL).await.unwrap();
        assert!(matches!(
            lease.refresh(TTL).await,
            Err(Error::NotHeld { .. })
        ));
        assert_eq!(faults.refreshes(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_meets_the_loss_and_the_lost_signal_fires() {
        let (locker, faults) = faulty();
        faults.lose_lease_after_refreshes(2);
        let mut lease = granted(&locker, "k").await;
        let started = Instant::now();
        lease.keep_alive(KeepAlive::default()).unwrap();
        assert_eq!(lease.lost_signal().wait().await, LostReason::NotHeld);
        // Refreshes are due every ttl/3 = 1 s: two kept it, the third lost it.
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(faults.refreshes(), 3);
        assert!(locker.get_ref().inspect("k").await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn one_arming_loses_one_lease_of_a_keepalive_batch() {
        let (locker, faults) = faulty();
        let mut first = granted(&locker, "a").await;
        let mut second = granted(&locker, "b").await;
        first.keep_alive(KeepAlive::default()).unwrap();
        second.keep_alive(KeepAlive::default()).unwrap();
        faults.lose_lease_after_refreshes(0);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let reasons = [first.lost_signal().reason(), second.lost_signal().reason()];
        assert_eq!(
            reasons
                .iter()
                .filter(|r| **r == Some(LostReason::NotHeld))
                .count(),
            1,
            "{reasons:?}"
        );
        assert!(
            reasons.contains(&None),
            "the other lease is still held: {reasons:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_longer_than_the_ttl_expires_a_kept_alive_lease() {
        let (locker, faults) = faulty();
        let mut lease = granted(&locker, "k").await;
        let started = Instant::now();
        lease.keep_alive(KeepAlive::default()).unwrap();
        faults.start_outage();
        assert_eq!(lease.lost_signal().wait().await, LostReason::Expired);
        assert!(started.elapsed() <= TTL, "lost at {:?}", started.elapsed());
        assert!(
            faults.refreshes() >= 2,
            "the keepalive retried through the outage"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalid_input_is_reported_as_such_during_an_outage() {
        let (locker, faults) = faulty();
        faults.start_outage();
        faults.start_contention();
        assert!(matches!(
            locker.try_lock("", TTL).await,
            Err(Error::InvalidInput { what: "key", .. })
        ));
        assert!(matches!(
            locker
                .lock("k", Duration::ZERO, Duration::from_secs(1))
                .await,
            Err(Error::InvalidInput { what: "ttl", .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_delays_each_call_on_tokio_time() {
        let (locker, faults) = faulty();
        faults.set_latency(Duration::from_millis(250));
        let started = Instant::now();
        let mut lease = granted(&locker, "k").await;
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        lease.refresh(TTL).await.unwrap();
        lease.release().await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(750));
        faults.set_latency(Duration::ZERO);
        let now = Instant::now();
        granted(&locker, "k").await.release().await.unwrap();
        assert_eq!(now.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn clear_removes_every_fault_and_keeps_the_counts() {
        let (locker, faults) = faulty();
        faults.start_outage();
        faults.start_contention();
        faults.set_latency(Duration::from_secs(1));
        faults.lose_lease_after_refreshes(0);
        assert!(locker.try_lock("k", TTL).await.is_err());
        faults.clear();
        let started = Instant::now();
        let mut lease = granted(&locker, "k").await;
        lease.refresh(TTL).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        lease.release().await.unwrap();
        assert_eq!(
            (faults.acquires(), faults.refreshes(), faults.releases()),
            (2, 1, 1)
        );
    }
}
