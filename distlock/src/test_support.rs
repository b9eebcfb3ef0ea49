//! Test doubles shared by the crate's unit tests.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::memory::MemoryLocker;
use crate::{Error, Lease, Locker, Result};

/// A memory locker that can be switched to failing like a dead server.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flaky {
    pub(crate) inner: MemoryLocker,
    pub(crate) down: Arc<AtomicBool>,
    pub(crate) calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn check(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            Err(Error::backend("flaky", "call", "connection refused"))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl Locker for Flaky {
    fn backend(&self) -> &'static str {
        "flaky"
    }
    crate::forward::forward_to_inner!(capabilities);
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.check()?;
        let lease = self.inner.try_lock(key, ttl).await?;
        Ok(lease.map(|lease| lease.rebind(Arc::new(self.clone()))))
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        self.check()?;
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.check()?;
        self.inner.refresh(key, owner, ttl).await
    }
}

/// Any duration a caller can pass, the largest included: property tests
/// check that such input is an answer or an error, never a panic
/// (`Instant + Duration` overflowed once).
pub(crate) fn any_duration() -> impl proptest::strategy::Strategy<Value = Duration> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        (0u64..5_000).prop_map(Duration::from_millis),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Runs `test` on a current-thread runtime on tokio's paused clock, for
/// property tests (which cannot use `#[tokio::test]`).
pub(crate) fn block_on_paused<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a test runtime")
        .block_on(test)
}
