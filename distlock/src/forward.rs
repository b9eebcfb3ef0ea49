//! The [`Locker`](crate::Locker) methods a wrapper passes through to the
//! locker it wraps unchanged, and its accessors of that locker, written once;
//! and `Arc<L>` as a locker, the pass-through every wrapper can be built on.
//!
//! Every wrapper (tracing, metrics, breaker, prefix, wait) implements the
//! whole trait under `#[deny(clippy::missing_trait_methods)]`, so a method
//! added to `Locker` is a build failure in each wrapper until it is decided
//! on there. The synchronous methods most wrappers leave alone are the same
//! four bodies in every wrapper; [`forward_to_inner!`] writes them, and only
//! the ones named, so that decision stays explicit: an unnamed method is
//! still missing. The async methods are written out in each wrapper:
//! `#[async_trait]` rewrites their signatures before any macro inside the
//! impl expands, so a macro cannot supply them.

/// Writes the named synchronous `Locker` methods as calls to
/// `self.inner`, which must be a `Locker` (an `Arc<L>` or `L`).
///
/// Accepts `backend`, `durability_warnings`, `capabilities` and
/// `backend_key`; any other name is a compile error.
///
/// ```ignore
/// #[deny(clippy::missing_trait_methods)]
/// #[async_trait]
/// impl<L: Locker> Locker for MyWrapper<L> {
///     forward_to_inner!(backend, durability_warnings, capabilities, backend_key);
///     // every async method written out ...
/// }
/// ```
macro_rules! forward_to_inner {
    ($($method:ident),+ $(,)?) => {
        $($crate::forward::forward_to_inner!(@method $method);)+
    };
    (@method backend) => {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }
    };
    (@method durability_warnings) => {
        /// The inner locker's: a wrapper changes nothing the server keeps.
        fn durability_warnings(&self) -> Vec<String> {
            self.inner.durability_warnings()
        }
    };
    (@method capabilities) => {
        fn capabilities(&self) -> $crate::Capabilities {
            self.inner.capabilities()
        }
    };
    (@method backend_key) => {
        fn backend_key(&self, key: &str) -> String {
            self.inner.backend_key(key)
        }
    };
}

pub(crate) use forward_to_inner;

/// Writes `get_ref` and `into_inner` (tower's names) for `$wrapper<L>`,
/// which keeps the locker it wraps in an `Arc<L>` field `inner`: the same
/// two methods, with the same guarantees, on every wrapper.
macro_rules! inner_accessors {
    ($wrapper:ident) => {
        impl<L> $wrapper<L> {
            /// The wrapped locker, to reach its backend-specific powers (for
            /// example `RedisLocker::remaining_ttl`, `PostgresLocker::held_count`)
            /// through the wrapper.
            pub fn get_ref(&self) -> &L {
                &self.inner
            }

            /// The wrapped locker, shared: leases granted through this wrapper
            /// keep a handle on it (their release goes through it), so it is
            /// handed back as an `Arc` rather than by value.
            pub fn into_inner(self) -> std::sync::Arc<L> {
                self.inner
            }
        }
    };
}

pub(crate) use inner_accessors;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::inspect;
use crate::{Capabilities, Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result};

/// A shared locker is a locker: wrappers can take `Arc<dyn Locker>`.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker + ?Sized> Locker for Arc<L> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    fn durability_warnings(&self) -> Vec<String> {
        (**self).durability_warnings()
    }
    fn backend_key(&self, key: &str) -> String {
        (**self).backend_key(key)
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        (**self).try_lock(key, ttl).await
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        (**self).lock(key, ttl, timeout).await
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        (**self).try_lock_any(keys, ttl).await
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        (**self).try_lock_shared(key, ttl).await
    }
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        (**self).lock_shared(key, ttl, timeout).await
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        (**self).unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        (**self).refresh(key, owner, ttl).await
    }
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        (**self).refresh_many(requests).await
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        (**self).watch_releases(key).await
    }
    async fn forget(&self, key: &str) -> Result<()> {
        (**self).forget(key).await
    }
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        (**self).advance_mark(name, value).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<inspect::HeldLock>> {
        (**self).inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<inspect::HeldLock>> {
        (**self).list(prefix).await
    }
    async fn force_release(
        &self,
        key: &str,
        how: inspect::ForceRelease,
    ) -> Result<Option<inspect::HeldLock>> {
        (**self).force_release(key, how).await
    }
}
