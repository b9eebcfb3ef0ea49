//! Opt-in automatic refresh of a held lease ([`crate::Lease::keep_alive`]).
//!
//! The renewal is tied to the lease: it stops when the lease is released or
//! dropped (a watchdog that outlives the unlock would keep the lock forever),
//! it signals loss instead of letting the holder work on without the lock, and
//! `max_hold` bounds it so a hung holder cannot keep a lock forever.
//!
//! One scheduler task per locker (and per runtime, where one locker is
//! shared by several) renews all of that locker's kept-alive leases: a timer queue ordered by when each lease is next due, and the
//! refreshes that fall due together sent as one
//! [`Locker::refresh_many`] batch, which backends turn into one round trip
//! (Redis: one script per Cluster slot; Postgres: one statement per
//! session). A task and a round trip per lease per ttl/3 cost 0.9 KiB a
//! lease and 30,000 round trips a second for 100,000 leases held for 10 s;
//! batched, the keepalive of a lease is one queue entry.
//!
//! "The same locker" is the same `Arc<dyn Locker>` the leases refresh
//! through: backends and wrappers hand every lease of one locker the same
//! one; a locker that builds a new `Arc` per
//! lease still works, with a scheduler (and no batching) per lease.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::signal::StatusSender;
use crate::deadline::checked_deadline;
use crate::Locker;

mod scheduler;

use scheduler::{Command, Scheduler};

/// Settings of a lease's background refresh.
///
/// ```
/// use std::time::Duration;
/// use distlock::KeepAlive;
///
/// let keepalive = KeepAlive::default().max_hold(Duration::from_secs(3600));
/// assert_eq!(keepalive.interval_for(Duration::from_secs(30)), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Default)]
pub struct KeepAlive {
    interval: Option<Duration>,
    max_hold: Option<Duration>,
}

impl KeepAlive {
    /// Refresh every `interval` instead of every ttl/3. It should stay well
    /// under the ttl so a failed refresh can be retried before expiry.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Stop renewing once the lease has been held this long (counted from the
    /// grant): the lost signal fires with
    /// [`LostReason::MaxHoldExceeded`](crate::LostReason::MaxHoldExceeded) and
    /// refreshing stops. The lock is **not** released then: it stays held
    /// until the holder, having stopped its work, releases it (or drops the
    /// lease), or until its ttl runs out where locks expire. So a lock is
    /// never freed under running work; [`crate::with_lock`] and
    /// `distlock run` stop the work and then release. A `max_hold` too long
    /// to represent means no maximum.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The refresh interval used for a lease of `ttl`.
    pub fn interval_for(&self, ttl: Duration) -> Duration {
        interval_for(self.interval, ttl)
    }
}

fn interval_for(interval: Option<Duration>, ttl: Duration) -> Duration {
    interval.unwrap_or(ttl / 3).max(Duration::from_millis(1))
}

/// What a lease's keepalive needs, handed to its locker's scheduler.
pub(super) struct Entry {
    pub(super) status: StatusSender,
    pub(super) key: Arc<str>,
    pub(super) owner: Arc<str>,
    pub(super) interval: Option<Duration>,
    /// When renewal stops ([`KeepAlive::max_hold`] after the grant).
    pub(super) max_hold_at: Option<Instant>,
}

impl Entry {
    pub(super) fn new(
        status: StatusSender,
        key: Arc<str>,
        owner: Arc<str>,
        acquired_at: Instant,
        config: &KeepAlive,
    ) -> Self {
        Entry {
            status,
            key,
            owner,
            interval: config.interval,
            max_hold_at: config
                .max_hold
                .and_then(|hold| checked_deadline(acquired_at, hold)),
        }
    }
}

/// A lease's place in its locker's scheduler: dropping it stops the lease's
/// keepalive (the lease drops it on release, on drop, and when a new
/// keepalive replaces this one).
pub(super) struct Registration {
    scheduler: Arc<Scheduler>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A closed scheduler has nothing left to stop.
        let _ = self.scheduler.commands.send(Command::Remove(self.id));
    }
}

impl Registration {
    /// Starts renewing `entry` on `locker`'s scheduler for `runtime`
    /// (started there if none runs).
    pub(super) fn start(
        locker: &Arc<dyn Locker>,
        entry: Entry,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let scheduler = Scheduler::of(locker, runtime);
        let id = scheduler.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::error::SendError(_)) = scheduler.commands.send(Command::Add(id, entry)) {
            // Only if its runtime shut down between the lookup and now; the
            // lease then expires unrenewed and its signal says so.
            tracing::warn!(
                component = "distlock",
                "keepalive scheduler stopped with its runtime; the lease is not renewed"
            );
        }
        Registration { scheduler, id }
    }

    /// The scheduler task's handle, for tests that check how it ended.
    #[cfg(test)]
    pub(super) fn take_task_for_test(&self) -> Option<tokio::task::JoinHandle<()>> {
        crate::util::lock(&self.scheduler.task).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Flaky;
    use crate::LostReason;
    use crate::RefreshRequest;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const TTL: Duration = Duration::from_secs(3);

    /// A lease of `k` on `flaky` for [`TTL`], kept alive with `settings`.
    async fn kept_alive(flaky: &Flaky, settings: KeepAlive) -> crate::Lease {
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(settings).unwrap();
        lease
    }

    /// Asserts that `count` stays as it is for `wait`: `why` it must.
    async fn assert_unchanged(count: &AtomicUsize, wait: Duration, why: &str) {
        let before = count.load(Ordering::SeqCst);
        tokio::time::sleep(wait).await;
        assert_eq!(count.load(Ordering::SeqCst), before, "{why}");
    }

    /// A locker shared by two runtimes: the scheduler the first one started
    /// dies with it, and must not take the second one's leases along.
    #[test]
    fn a_lease_keeps_its_keepalive_when_another_runtime_ends() {
        let locker = crate::memory::MemoryLocker::new();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime");
        let mut started_first = first.block_on(async {
            let mut lease = locker.try_lock("a", TTL).await.unwrap().unwrap();
            lease.keep_alive(KeepAlive::default()).unwrap();
            lease
        });
        let lease = second.block_on(async {
            let mut lease = locker.try_lock("b", TTL).await.unwrap().unwrap();
            let max_hold = Duration::from_millis(300);
            lease
                .keep_alive(KeepAlive::default().max_hold(max_hold))
                .unwrap();
            lease
        });
        started_first.stop_keepalive();
        drop(first);
        let reason = second.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), lease.lost_signal().wait()).await
        });
        assert_eq!(
            reason,
            Ok(LostReason::MaxHoldExceeded),
            "the second runtime's lease is still watched after the first runtime ended"
        );
        drop(started_first);
        drop(lease);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_refresh_failures_are_retried_before_expiry() {
        let flaky = Flaky::default();
        let lease = kept_alive(&flaky, KeepAlive::default()).await;
        flaky.down.store(true, Ordering::SeqCst);
        // Past the first refresh (at 1 s) and several retries, short of expiry.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            flaky.calls.load(Ordering::SeqCst) >= 3,
            "the keepalive retried"
        );
        assert_eq!(lease.lost_signal().reason(), None);
        flaky.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            lease.lost_signal().reason(),
            None,
            "a late success renewed the lease"
        );
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_down_until_expiry_means_the_lease_is_lost() {
        let flaky = Flaky::default();
        let lease = kept_alive(&flaky, KeepAlive::default()).await;
        flaky.down.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let reason = lease.lost_signal().wait().await;
        assert_eq!(reason, LostReason::Expired);
        let after = started.elapsed();
        assert!(after <= TTL, "lost reported at {after:?}, after the ttl");
        assert!(
            after >= TTL - Duration::from_millis(800),
            "lost reported early, at {after:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_stops_when_the_lease_is_released() {
        let flaky = Flaky::default();
        let lease = kept_alive(&flaky, KeepAlive::default()).await;
        lease.release().await.unwrap();
        assert_unchanged(&flaky.calls, TTL * 5, "no refresh after release").await;
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_renewal_without_freeing_the_lock() {
        let flaky = Flaky::default();
        let settings = KeepAlive::default().max_hold(Duration::from_millis(1500));
        let lease = kept_alive(&flaky, settings).await;
        let reason = lease.lost_signal().wait().await;
        assert_eq!(reason, LostReason::MaxHoldExceeded);
        assert!(
            flaky.inner.try_lock("k", TTL).await.unwrap().is_none(),
            "the work may still run: the lock stays held until released"
        );
        assert_unchanged(&flaky.calls, Duration::from_secs(1), "renewal stopped").await;
        lease.release().await.unwrap();
        assert!(flaky.inner.try_lock("k", TTL).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_refresh_is_due_a_third_of_the_ttl_after_the_grant() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        let after_grant = flaky.calls.load(Ordering::SeqCst);
        // Started late: the refresh that was due at 1 s is overdue now.
        tokio::time::sleep(Duration::from_millis(1800)).await;
        lease.keep_alive(KeepAlive::default()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            flaky.calls.load(Ordering::SeqCst),
            after_grant + 1,
            "refreshed at once, not 1 s after keep_alive() (past 2/3 of the ttl)"
        );
        assert_eq!(lease.lost_signal().reason(), None);
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_follows_a_refresh_to_a_new_ttl() {
        let flaky = Flaky::default();
        let mut lease = kept_alive(&flaky, KeepAlive::default()).await;
        lease.refresh(Duration::from_secs(30)).await.unwrap();
        let calls = flaky.calls.load(Ordering::SeqCst);
        // Every 10 s now, counted from that refresh.
        tokio::time::sleep(Duration::from_millis(9900)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls + 1);
        assert_eq!(lease.ttl(), Duration::from_secs(30));
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_max_hold_too_long_for_an_instant_means_no_max_hold() {
        let flaky = Flaky::default();
        let lease = kept_alive(&flaky, KeepAlive::default().max_hold(Duration::MAX)).await;
        tokio::time::sleep(TTL * 10).await;
        assert_eq!(lease.lost_signal().reason(), None, "still renewed");
        lease.release().await.unwrap();
    }

    /// Memory, counting the keepalive's batches; its leases share one
    /// `Arc`, as every backend's do.
    #[derive(Debug, Clone, Default)]
    struct Batching {
        inner: crate::memory::MemoryLocker,
        batches: Arc<AtomicUsize>,
        refreshed: Arc<AtomicUsize>,
        leases: crate::SharedLocker,
    }

    #[async_trait::async_trait]
    impl Locker for Batching {
        fn backend(&self) -> &'static str {
            "batching"
        }
        crate::forward::forward_to_inner!(capabilities);
        async fn try_lock(&self, key: &str, ttl: Duration) -> crate::Result<Option<crate::Lease>> {
            let lease = self.inner.try_lock(key, ttl).await?;
            Ok(lease.map(|lease| lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))))
        }
        async fn unlock(&self, key: &str, owner: &str) -> crate::Result<()> {
            self.inner.unlock(key, owner).await
        }
        async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> crate::Result<()> {
            self.inner.refresh(key, owner, ttl).await
        }
        async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<crate::Result<()>> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.refreshed.fetch_add(requests.len(), Ordering::SeqCst);
            self.inner.refresh_many(requests).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_refreshes_of_many_leases_go_out_in_few_batches() {
        let locker = Batching::default();
        let mut leases = Vec::new();
        for i in 0..200 {
            let mut lease = locker
                .try_lock(&format!("k{i}"), TTL)
                .await
                .unwrap()
                .unwrap();
            lease.keep_alive(KeepAlive::default()).unwrap();
            leases.push(lease);
        }
        // Refreshes due at 1 s, 2 s and 3 s after the grants.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(locker.refreshed.load(Ordering::SeqCst), 600);
        assert_eq!(
            locker.batches.load(Ordering::SeqCst),
            3,
            "one batch per round, not one refresh per lease"
        );
        assert!(leases.iter().all(|lease| !lease.is_lost()));
        for lease in leases {
            lease.release().await.unwrap();
        }
        assert_unchanged(&locker.refreshed, TTL * 2, "no refresh after release").await;
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// Any interval and max hold, the largest included: the keepalive
        /// task renews or stops, it never panics (a panic would silently end
        /// renewal).
        #[test]
        fn extreme_keepalive_settings_never_panic(
            interval in crate::test_support::any_duration(),
            max_hold in crate::test_support::any_duration(),
        ) {
            crate::test_support::block_on_paused(async {
                let flaky = Flaky::default();
                let settings = KeepAlive::default().interval(interval).max_hold(max_hold);
                let mut lease = kept_alive(&flaky, settings).await;
                tokio::time::sleep(TTL * 3).await;
                let task = lease.take_keepalive_for_test().expect("started");
                if task.is_finished() {
                    task.await.expect("the keepalive task ended without panicking");
                }
            });
        }
    }
}
