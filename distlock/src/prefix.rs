//! Key namespacing as a wrapper.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::{Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result};

/// Prefixes every key before it reaches the inner locker, so several
/// applications can share one backend without their keys colliding.
///
/// Leases and errors name the caller's key; only the backend sees the prefixed
/// one. The prefix counts towards [`crate::validate::MAX_KEY_LEN`].
///
/// ```
/// use std::time::Duration;
/// use distlock::{Locker, LockerExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = distlock::memory::MemoryLocker::new();
/// let billing = backend.clone().with_prefix("billing:");
/// let lease = billing.try_lock("sweep", Duration::from_secs(5)).await?.unwrap();
/// assert_eq!(lease.key(), "sweep");
/// // The backend holds "billing:sweep".
/// assert!(backend.try_lock("billing:sweep", Duration::from_secs(5)).await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PrefixLocker<L> {
    inner: Arc<L>,
    prefix: Arc<str>,
    /// The `Arc` every lease granted through this wrapper (or a clone) shares.
    leases: crate::SharedLocker,
}

impl<L> Clone for PrefixLocker<L> {
    fn clone(&self) -> Self {
        PrefixLocker {
            inner: self.inner.clone(),
            prefix: self.prefix.clone(),
            leases: self.leases.clone(),
        }
    }
}

inner_accessors!(PrefixLocker);

impl<L: Locker> PrefixLocker<L> {
    /// Wraps `inner` so every key is `prefix` + key.
    pub fn new(inner: L, prefix: impl Into<String>) -> Self {
        PrefixLocker {
            inner: Arc::new(inner),
            prefix: prefix.into().into(),
            leases: crate::SharedLocker::default(),
        }
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn own(&self, lease: Lease, key: &str) -> Lease {
        lease
            .rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
            .rename(key)
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here, not silently left to its
// default (as object_store's wrapper stores do).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for PrefixLocker<L> {
    forward_to_inner!(backend, durability_warnings, capabilities);
    fn backend_key(&self, key: &str) -> String {
        self.inner.backend_key(&self.full(key))
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        crate::validate::key(key)?;
        let lease = self.inner.try_lock(&self.full(key), ttl).await;
        let lease = lease.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(lease.map(|lease| self.own(lease, key)))
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        crate::validate::key(key)?;
        let lease = self.inner.lock(&self.full(key), ttl, timeout).await;
        let lease = lease.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(self.own(lease, key))
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        crate::validate::keys(keys)?;
        let full: Vec<String> = keys.iter().map(|key| self.full(key)).collect();
        let lease = self.inner.try_lock_any(&full, ttl).await;
        let own_name = |name: String| match name.strip_prefix(&*self.prefix) {
            Some(key) => key.to_owned(),
            None => name,
        };
        let lease = lease.map_err(|e| e.map_key(own_name))?;
        Ok(lease.map(|lease| {
            let key = own_name(lease.key().to_owned());
            self.own(lease, &key)
        }))
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        crate::validate::key(key)?;
        let lease = self.inner.try_lock_shared(&self.full(key), ttl).await;
        let lease = lease.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(lease.map(|lease| self.own(lease, key)))
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        crate::validate::key(key)?;
        let lease = self.inner.lock_shared(&self.full(key), ttl, timeout).await;
        let lease = lease.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(self.own(lease, key))
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        crate::validate::key(key)?;
        let unlocked = self.inner.unlock(&self.full(key), owner).await;
        unlocked.map_err(|e| e.map_key(|_| key.to_owned()))
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        crate::validate::key(key)?;
        let refreshed = self.inner.refresh(&self.full(key), owner, ttl).await;
        refreshed.map_err(|e| e.map_key(|_| key.to_owned()))
    }
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        // Each key as the inner locker names it; an invalid one is answered
        // here, the others go on in one batch.
        let full: Vec<Result<String>> = requests
            .iter()
            .map(|request| crate::validate::key(request.key).map(|()| self.full(request.key)))
            .collect();
        let inner: Vec<RefreshRequest<'_>> = requests
            .iter()
            .zip(&full)
            .filter_map(|(request, full)| {
                full.as_ref().ok().map(|key| RefreshRequest {
                    key,
                    owner: request.owner,
                    ttl: request.ttl,
                })
            })
            .collect();
        let mut refreshed = self.inner.refresh_many(&inner).await.into_iter();
        requests
            .iter()
            .zip(full)
            .map(|(request, full)| {
                let result = match full {
                    Ok(_) => refreshed.next().unwrap_or_else(|| {
                        Err(crate::Error::backend(
                            self.inner.backend(),
                            "refresh",
                            "the wrapped locker returned fewer results than requests",
                        ))
                    }),
                    Err(error) => Err(error),
                };
                result.map_err(|e| e.map_key(|_| request.key.to_owned()))
            })
            .collect()
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(&self.full(key)).await
    }
    async fn forget(&self, key: &str) -> Result<()> {
        crate::validate::key(key)?;
        let forgotten = self.inner.forget(&self.full(key)).await;
        forgotten.map_err(|e| e.map_key(|_| key.to_owned()))
    }
    /// Marks share the prefix: `name` becomes `prefix + name`.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        crate::validate::key(name)?;
        self.inner.advance_mark(&self.full(name), value).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        crate::validate::key(key)?;
        let held = self.inner.inspect(&self.full(key)).await;
        let held = held.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(held.map(|held| HeldLock {
            key: key.to_owned(),
            ..held
        }))
    }
    /// Lists under `prefix + prefix`, and names each lock by the caller's key.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let listed = self.inner.list(&self.full(prefix)).await?;
        Ok(listed
            .into_iter()
            .filter_map(|held| {
                let key = held.key.strip_prefix(&*self.prefix)?.to_owned();
                Some(HeldLock { key, ..held })
            })
            .collect())
    }
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        crate::validate::key(key)?;
        let evicted = self.inner.force_release(&self.full(key), how).await;
        let evicted = evicted.map_err(|e| e.map_key(|_| key.to_owned()))?;
        Ok(evicted.map(|held| HeldLock {
            key: key.to_owned(),
            ..held
        }))
    }
}
