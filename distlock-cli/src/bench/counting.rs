//! A locker that counts the refreshes passing through it, so the hold
//! workload can report keepalive traffic for any backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{Capabilities, Lease, Locker, MarkAdvance, ReleaseWatch, Result};

/// Forwards everything to the inner locker and re-homes its leases here
/// ([`Lease::rebind`]), so a lease's keepalive refreshes are counted.
#[derive(Debug, Clone)]
pub(crate) struct CountingLocker {
    inner: Arc<dyn Locker>,
    counts: Arc<RefreshCounts>,
}

/// Refresh calls seen, and how many of them failed.
#[derive(Debug, Default)]
pub(crate) struct RefreshCounts {
    pub(crate) calls: AtomicU64,
    pub(crate) failures: AtomicU64,
}

impl CountingLocker {
    pub(crate) fn new(inner: Arc<dyn Locker>) -> Self {
        CountingLocker {
            inner,
            counts: Arc::default(),
        }
    }

    pub(crate) fn counts(&self) -> &RefreshCounts {
        &self.counts
    }

    fn rehome(&self, lease: Lease) -> Lease {
        lease.rebind(Arc::new(self.clone()))
    }
}

// Every method forwarded explicitly: a method added to the trait must be
// forwarded here too, or the keepalive traffic would bypass the count.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Locker for CountingLocker {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn backend_key(&self, key: &str) -> String {
        self.inner.backend_key(key)
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        Ok(self
            .inner
            .try_lock(key, ttl)
            .await?
            .map(|lease| self.rehome(lease)))
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        Ok(self.rehome(self.inner.lock(key, ttl, timeout).await?))
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.refresh(key, owner, ttl).await;
        if outcome.is_err() {
            self.counts.failures.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(key).await
    }
    async fn forget(&self, key: &str) -> Result<()> {
        self.inner.forget(key).await
    }
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.inner.advance_mark(name, value).await
    }
}
