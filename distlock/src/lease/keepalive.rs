//! Opt-in automatic refresh of a held lease ([`crate::Lease::keep_alive`]).
//!
//! The renewal is tied to the lease: it is aborted when the lease is released
//! or dropped (a watchdog that outlives the unlock would keep the lock forever),
//! it signals loss instead of letting the holder work on without the lock, and
//! `max_hold` bounds it so a hung holder cannot keep a lock forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::signal::{extend_validity, mark_lost, mark_lost_with_grace, LostReason, StatusSender};
use crate::deadline::{bounded, checked_deadline, sleep_until};
use crate::{Error, Locker};

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
    /// grant): the lost signal fires with [`LostReason::MaxHoldExceeded`] and
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
        self.interval
            .unwrap_or(ttl / 3)
            .max(Duration::from_millis(1))
    }
}

/// The background task behind [`crate::Lease::keep_alive`].
pub(super) struct Task {
    pub(super) locker: Arc<dyn Locker>,
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) acquired_at: Instant,
    pub(super) status: StatusSender,
    pub(super) config: KeepAlive,
}

impl Task {
    pub(super) async fn run(self) {
        let max_hold_at = self
            .config
            .max_hold
            .and_then(|hold| checked_deadline(self.acquired_at, hold));
        // Set after a transient failure: the next try comes sooner than the
        // interval, so several fit before the lease would expire.
        let mut retry_at: Option<Instant> = None;
        loop {
            let status = self.status.status();
            if status.lost.is_some() {
                return;
            }
            let interval = self.config.interval_for(status.ttl);
            // Scheduled from the grant or the last refresh (whoever made it),
            // not from when this task started.
            let due = retry_at.or_else(|| checked_deadline(status.renewed_at, interval));
            let wake = match (due, max_hold_at) {
                (Some(due), Some(max)) => Some(due.min(max)),
                (due, max) => due.or(max),
            };
            sleep_until(wake).await;

            let status = self.status.status();
            if status.lost.is_some() {
                return;
            }
            let now = Instant::now();
            if max_hold_at.is_some_and(|max| now >= max) {
                tracing::warn!(
                    component = "distlock",
                    key = self.key,
                    max_hold = ?self.config.max_hold,
                    "lease reached its max hold; renewal stops and the holder must stop its work and release"
                );
                mark_lost(&self.status, LostReason::MaxHoldExceeded);
                return;
            }
            if status.valid_until.is_some_and(|until| now >= until) {
                tracing::warn!(
                    component = "distlock",
                    key = self.key,
                    "lease expired before a refresh succeeded"
                );
                mark_lost(&self.status, LostReason::Expired);
                return;
            }
            // The schedule moved (a refresh through the lease itself): recompute.
            if retry_at.is_none()
                && checked_deadline(status.renewed_at, interval).is_some_and(|due| now < due)
            {
                continue;
            }

            let started = Instant::now();
            let ttl = status.ttl;
            let refreshed = bounded(
                self.locker.backend(),
                "refresh",
                interval,
                self.locker.refresh(&self.key, &self.owner, ttl),
            )
            .await;
            match refreshed {
                Ok(()) => {
                    if extend_validity(&self.status, started, ttl).is_err() {
                        return;
                    }
                    retry_at = None;
                }
                Err(Error::NotHeld { .. }) => {
                    tracing::warn!(
                        component = "distlock",
                        key = self.key,
                        "lock lost: refresh says it is no longer held"
                    );
                    mark_lost_with_grace(&self.status, LostReason::NotHeld, Duration::ZERO);
                    return;
                }
                Err(error @ (Error::Unsupported { .. } | Error::InvalidInput { .. })) => {
                    tracing::error!(component = "distlock", key = self.key, %error, "keepalive stopped: refresh is impossible");
                    return;
                }
                Err(error) => {
                    let retry_delay =
                        (interval / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    tracing::warn!(component = "distlock", key = self.key, %error, ?retry_delay, "refresh failed; retrying until the lease would expire");
                    retry_at = checked_deadline(Instant::now(), retry_delay);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Flaky;
    use crate::LostReason;
    use std::sync::atomic::Ordering;

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn transient_refresh_failures_are_retried_before_expiry() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
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
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
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
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        lease.release().await.unwrap();
        let calls = flaky.calls.load(Ordering::SeqCst);
        tokio::time::sleep(TTL * 5).await;
        assert_eq!(
            flaky.calls.load(Ordering::SeqCst),
            calls,
            "no refresh after release"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_renewal_without_freeing_the_lock() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease
            .keep_alive(KeepAlive::default().max_hold(Duration::from_millis(1500)))
            .unwrap();
        let reason = lease.lost_signal().wait().await;
        assert_eq!(reason, LostReason::MaxHoldExceeded);
        assert!(
            flaky.inner.try_lock("k", TTL).await.unwrap().is_none(),
            "the work may still run: the lock stays held until released"
        );
        let calls = flaky.calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls, "renewal stopped");
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
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
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
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease
            .keep_alive(KeepAlive::default().max_hold(Duration::MAX))
            .unwrap();
        tokio::time::sleep(TTL * 10).await;
        assert_eq!(lease.lost_signal().reason(), None, "still renewed");
        lease.release().await.unwrap();
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
            let runtime = crate::test_support::paused_runtime();
            runtime.block_on(async {
                let flaky = Flaky::default();
                let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
                lease
                    .keep_alive(KeepAlive::default().interval(interval).max_hold(max_hold))
                    .unwrap();
                tokio::time::sleep(TTL * 3).await;
                let task = lease.take_keepalive_for_test().expect("started");
                if task.is_finished() {
                    task.await.expect("the keepalive task ended without panicking");
                }
            });
        }
    }
}
