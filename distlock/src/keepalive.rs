//! Opt-in automatic refresh of a held lease ([`crate::Lease::keep_alive`]).
//!
//! The renewal is tied to the lease: it is aborted when the lease is released
//! or dropped (a watchdog that outlives the unlock would keep the lock forever),
//! it signals loss instead of letting the holder work on without the lock, and
//! `max_hold` bounds it so a hung holder cannot keep a lock forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::{extend_validity, mark_lost, LostReason, StatusSender};
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
    /// the lock is released. Without it, renewal goes on until release.
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
pub(crate) struct Task {
    pub(crate) locker: Arc<dyn Locker>,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) status: StatusSender,
    pub(crate) release_timeout: Duration,
    pub(crate) config: KeepAlive,
}

impl Task {
    pub(crate) async fn run(self) {
        let interval = self.config.interval_for(self.ttl);
        // Transient failures are retried faster than the interval, so several
        // tries fit before the lease would expire.
        let retry_delay = (interval / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let max_hold_deadline = self.config.max_hold.map(|hold| self.acquired_at + hold);
        let mut next = Instant::now() + interval;
        loop {
            let wake = match max_hold_deadline {
                Some(deadline) if deadline < next => deadline,
                _ => next,
            };
            tokio::time::sleep_until(wake).await;

            let status = self.status.status();
            if status.lost.is_some() {
                return;
            }
            if max_hold_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                self.give_up_at_max_hold().await;
                return;
            }
            if status
                .valid_until
                .is_some_and(|until| Instant::now() >= until)
            {
                tracing::warn!(
                    component = "distlock",
                    key = self.key,
                    "lease expired before a refresh succeeded"
                );
                mark_lost(&self.status, LostReason::Expired);
                return;
            }

            let started = Instant::now();
            let refreshed = tokio::time::timeout(
                interval,
                self.locker.refresh(&self.key, &self.owner, self.ttl),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Error::backend(
                    self.locker.backend(),
                    "refresh",
                    format!("no answer within {interval:?}"),
                ))
            });
            match refreshed {
                Ok(()) => {
                    extend_validity(&self.status, started, self.ttl);
                    next = started + interval;
                }
                Err(Error::NotHeld { .. }) => {
                    tracing::warn!(
                        component = "distlock",
                        key = self.key,
                        "lock lost: refresh says it is no longer held"
                    );
                    mark_lost(&self.status, LostReason::NotHeld);
                    return;
                }
                Err(error @ (Error::Unsupported { .. } | Error::InvalidInput { .. })) => {
                    tracing::error!(component = "distlock", key = self.key, %error, "keepalive stopped: refresh is impossible");
                    return;
                }
                Err(error) => {
                    tracing::warn!(component = "distlock", key = self.key, %error, ?retry_delay, "refresh failed; retrying until the lease would expire");
                    next = Instant::now() + retry_delay;
                }
            }
        }
    }

    async fn give_up_at_max_hold(&self) {
        tracing::warn!(
            component = "distlock",
            key = self.key,
            max_hold = ?self.config.max_hold,
            "lease reached its max hold; releasing it"
        );
        mark_lost(&self.status, LostReason::MaxHoldExceeded);
        match tokio::time::timeout(
            self.release_timeout,
            self.locker.unlock(&self.key, &self.owner),
        )
        .await
        {
            Ok(Ok(())) | Ok(Err(Error::NotHeld { .. })) => {}
            Ok(Err(error)) => {
                tracing::warn!(component = "distlock", key = self.key, %error, "release at max hold failed; the backend's safety net frees it")
            }
            Err(_) => tracing::warn!(
                component = "distlock",
                key = self.key,
                "release at max hold timed out; the backend's safety net frees it"
            ),
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
}
