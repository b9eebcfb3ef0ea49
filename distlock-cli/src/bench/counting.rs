//! A locker that counts the calls passing through it, so the hold
//! workload can report keepalive traffic for any backend, and the permits
//! workload the calls of each attempt; and that can take the trait's
//! default `try_lock_any` instead of the backend's, so the permits workload
//! sets the two side by side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::inspect::{ForceRelease, HeldLock};
use distlock::{
    Capabilities, Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result, SharedLocker,
};

/// Forwards everything to the inner locker and re-homes its leases here
/// ([`Lease::rebind`]), so a lease's keepalive refreshes are counted.
#[derive(Debug, Clone)]
pub(crate) struct CountingLocker {
    inner: Arc<dyn Locker>,
    counts: Arc<Counts>,
    /// `try_lock_any` is [`distlock::try_lock_in_turn`] over this locker
    /// (the trait's default: a `try_lock` per key, each counted), not the
    /// inner locker's own.
    in_turn: bool,
    /// One `Arc` for every lease: the keepalive batches per `Arc`, and an
    /// `Arc` per lease would measure a round trip per lease per refresh.
    leases: SharedLocker,
}

/// What passed through: leases refreshed (`calls`), how many of those
/// refreshes failed, and in how many calls they reached the backend
/// (`batches`: the keepalive sends the refreshes due
/// together as one `refresh_many` batch, which a backend sends in as few
/// round trips as it can (one script on Redis, one statement per session on
/// Postgres), so batches, not refreshes, are its traffic); and the calls
/// of acquire attempts.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) calls: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) batches: AtomicU64,
    /// Calls that make an acquire attempt's requests: `try_lock`,
    /// `try_lock_any`, `try_lock_shared` and `inspect` (a semaphore's check
    /// for a larger limit). On one Redis server each is one script, one
    /// round trip; a backend without its own `try_lock_any` makes up to a
    /// request per key inside that one call.
    pub(crate) attempt_calls: AtomicU64,
}

impl CountingLocker {
    pub(crate) fn new(inner: Arc<dyn Locker>) -> Self {
        CountingLocker {
            inner,
            counts: Arc::default(),
            in_turn: false,
            leases: SharedLocker::default(),
        }
    }

    /// Like [`new`](Self::new), but `try_lock_any` tries the keys one at a
    /// time through this locker's `try_lock` (the trait's default), whatever
    /// the inner locker does: the generic path, beside its native one.
    pub(crate) fn in_turn(inner: Arc<dyn Locker>) -> Self {
        CountingLocker {
            in_turn: true,
            ..CountingLocker::new(inner)
        }
    }

    fn attempt_call(&self) {
        self.counts.attempt_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    fn rehome(&self, lease: Lease) -> Lease {
        lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
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
    fn durability_warnings(&self) -> Vec<String> {
        self.inner.durability_warnings()
    }
    fn backend_key(&self, key: &str) -> String {
        self.inner.backend_key(key)
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.attempt_call();
        Ok(self
            .inner
            .try_lock(key, ttl)
            .await?
            .map(|lease| self.rehome(lease)))
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        Ok(self.rehome(self.inner.lock(key, ttl, timeout).await?))
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        if self.in_turn {
            // Each `try_lock` is counted (and its lease re-homed) on its way.
            return distlock::try_lock_in_turn(self, keys, ttl).await;
        }
        self.attempt_call();
        Ok(self
            .inner
            .try_lock_any(keys, ttl)
            .await?
            .map(|lease| self.rehome(lease)))
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.attempt_call();
        Ok(self
            .inner
            .try_lock_shared(key, ttl)
            .await?
            .map(|lease| self.rehome(lease)))
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        Ok(self.rehome(self.inner.lock_shared(key, ttl, timeout).await?))
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.counts.batches.fetch_add(1, Ordering::Relaxed);
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.refresh(key, owner, ttl).await;
        if outcome.is_err() {
            self.counts.failures.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        self.counts.batches.fetch_add(1, Ordering::Relaxed);
        let outcomes = self.inner.refresh_many(requests).await;
        let failed = outcomes.iter().filter(|outcome| outcome.is_err()).count();
        self.counts
            .calls
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        self.counts
            .failures
            .fetch_add(failed as u64, Ordering::Relaxed);
        outcomes
    }
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.attempt_call();
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.inner.list(prefix).await
    }
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        self.inner.force_release(key, how).await
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
