//! How a lease ends: [`Lease::release`], and the release a dropped lease
//! still gets (synchronously where the backend can, else in the background on
//! the runtime it was granted on).

use super::signal::mark_lost;
use super::{Lease, LostReason};
use crate::Result;

impl Lease {
    /// Releases the lock: only if this owner still holds it, bounded by the
    /// release timeout. The lost signal fires ([`LostReason::Released`])
    /// before the unlock is sent, so tasks watching it stop first.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the lock had already
    /// expired or changed hands (nothing was deleted);
    /// [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded) if the backend did
    /// not answer within the release timeout, or a backend error: the lock is
    /// then freed by the backend's safety net.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before it completes, the release continues
    /// in the background as for a dropped lease.
    pub async fn release(mut self) -> Result<()> {
        self.stop_keepalive();
        mark_lost(&self.status, LostReason::Released);
        let outcome = crate::deadline::bounded(
            self.locker.backend(),
            "release",
            self.release_timeout,
            self.locker.unlock(&self.key, &self.owner),
        )
        .await;
        // Reached only if this future was not cancelled mid-release; otherwise
        // Drop sends the release again in the background.
        self.released = true;
        self.sync_release = None;
        outcome
    }

    /// Forgets the synchronous release, so dropping takes the background path
    /// as for a server backend.
    #[cfg(test)]
    pub(crate) fn without_sync_release(mut self) -> Self {
        self.sync_release = None;
        self
    }

    /// Stops the keepalive, if one runs (its registration leaves the
    /// scheduler when dropped).
    pub(super) fn stop_keepalive(&mut self) {
        self.keepalive = None;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_keepalive();
        mark_lost(&self.status, LostReason::Released);
        if let Some(release) = self.sync_release.take() {
            release(&self.key, &self.owner);
            return;
        }
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.take());
        crate::background::release(
            runtime,
            self.locker.clone(),
            self.key.to_string(),
            self.owner.to_string(),
            self.release_timeout,
            "a dropped lease",
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::lease::tests::granted;
    use crate::memory::MemoryLocker;
    use crate::{Error, Lease, Locker, LostReason, LostSignal, Result};

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_lease_dropped_outside_a_runtime_is_released_without_panicking() {
        let locker = MemoryLocker::new();
        let runtime = current_thread();
        let lease = runtime
            .block_on(locker.try_lock("k", Duration::from_secs(60)))
            .unwrap()
            .unwrap();
        drop(runtime);
        drop(lease);
        let runtime = current_thread();
        let again = runtime
            .block_on(locker.try_lock("k", Duration::from_secs(60)))
            .unwrap();
        assert!(again.is_some(), "the memory backend released synchronously");
    }

    /// Memory, but its leases see whether they were marked ended when their
    /// unlock arrived, and its unlock can be made never to answer.
    #[derive(Debug, Default, Clone)]
    struct Observing {
        inner: MemoryLocker,
        signal: Arc<Mutex<Option<LostSignal>>>,
        lost_at_unlock: Arc<Mutex<Option<Option<LostReason>>>>,
        hang_unlock: bool,
    }

    #[async_trait::async_trait]
    impl Locker for Observing {
        fn backend(&self) -> &'static str {
            "observing"
        }
        crate::forward::forward_to_inner!(capabilities);
        async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
            let lease = self.inner.try_lock(key, ttl).await?;
            Ok(lease.map(|lease| {
                *self.signal.lock().unwrap() = Some(lease.lost_signal());
                lease.rebind(Arc::new(self.clone()))
            }))
        }
        async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
            if self.hang_unlock {
                return std::future::pending().await;
            }
            let seen = self.signal.lock().unwrap().as_ref().map(LostSignal::reason);
            *self.lost_at_unlock.lock().unwrap() = seen;
            self.inner.unlock(key, owner).await
        }
    }

    #[tokio::test]
    async fn release_fires_the_lost_signal_before_the_unlock_is_sent() {
        let locker = Observing::default();
        let lease = granted(&locker, Duration::from_secs(60)).await;
        lease.release().await.unwrap();
        assert_eq!(
            *locker.lost_at_unlock.lock().unwrap(),
            Some(Some(LostReason::Released)),
            "watchers must be told to stop before the lock is freed"
        );
    }

    #[test]
    fn a_lease_dropped_off_the_runtime_is_released_on_the_runtime_it_was_granted_on() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let locker = MemoryLocker::new();
        let lease = runtime
            .block_on(locker.try_lock("k", Duration::from_secs(60)))
            .unwrap()
            .unwrap()
            .without_sync_release();
        // Dropped on a plain thread: no runtime is current there.
        std::thread::spawn(move || drop(lease)).join().unwrap();
        let again = runtime.block_on(async {
            locker
                .lock("k", Duration::from_secs(60), Duration::from_secs(2))
                .await
        });
        assert!(again.is_ok(), "released in the background: {again:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_past_its_timeout_is_a_matchable_deadline_error() {
        let locker = Observing {
            hang_unlock: true,
            ..Observing::default()
        };
        let mut lease = granted(&locker, Duration::from_secs(60)).await;
        lease.set_release_timeout(Duration::from_millis(250));
        let err = lease.release().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::DeadlineExceeded { backend: "observing", operation: "release", after }
                    if after == Duration::from_millis(250)
            ),
            "{err}"
        );
        assert!(err.is_outage() && !err.is_contention());
    }
}
