//! [`LockerExt`]: the wrappers composed around any [`Locker`], in the
//! order the trait's docs recommend. Re-exported at the crate root.

use std::sync::Arc;

use crate::{
    BreakerConfig, BreakerLocker, Locker, MetricsLocker, PrefixLocker, TraceLocker, WaitLocker,
    WaitPolicy,
};

/// Composition helpers for any [`Locker`].
///
/// Each wrapper is a `Locker` around a `Locker` (as `tower` layers wrap
/// services); [`get_ref`](PrefixLocker::get_ref) on any of them reaches the
/// locker inside, so backend-specific powers stay reachable.
///
/// # Order
///
/// Each call goes from the outermost wrapper in, so the order changes what
/// each one sees. The recommended order, innermost first:
///
/// 1. the backend;
/// 2. [`with_prefix`](Self::with_prefix): everything outside sees the
///    caller's keys, and the backend the prefixed ones;
/// 3. [`with_circuit_breaker`](Self::with_circuit_breaker): it counts backend
///    answers. Outside a [`WaitLocker`](crate::WaitLocker) it sees one call per `lock` (a whole
///    wait); inside one, one call per attempt, so an open circuit also ends
///    waits already under way with [`Error::Unavailable`](crate::Error::Unavailable);
/// 4. [`with_wait_policy`](Self::with_wait_policy), if the default waiting
///    does not suit (it replaces a backend's server-side wait with polling:
///    see [`Capabilities::release_notifications`](crate::Capabilities::release_notifications));
/// 5. [`with_metrics`](Self::with_metrics) and
///    [`with_tracing`](Self::with_tracing) outermost, so they record what
///    the caller gets, fast `Unavailable` answers of an open circuit
///    included.
///
/// ```
/// use std::time::Duration;
/// use distlock::{BreakerConfig, LockerExt, WaitPolicy};
///
/// let locker = distlock::memory::MemoryLocker::new()
///     .with_prefix("billing:")
///     .with_circuit_breaker(BreakerConfig::default())
///     .with_wait_policy(WaitPolicy::default().max_delay(Duration::from_millis(50)))
///     .with_metrics()
///     .with_tracing();
/// // Still reachable: the breaker's state, two wrappers in.
/// let breaker = locker.get_ref().get_ref().get_ref();
/// assert_eq!(breaker.state(), distlock::BreakerState::Closed);
/// let shared = locker.shared();
/// # let _ = shared;
/// ```
pub trait LockerExt: Locker + Sized {
    /// Prefixes every key with `prefix` (see [`PrefixLocker`]).
    fn with_prefix(self, prefix: impl Into<String>) -> PrefixLocker<Self> {
        PrefixLocker::new(self, prefix)
    }

    /// Fails fast while the backend is known down (see [`BreakerLocker`]).
    fn with_circuit_breaker(self, config: BreakerConfig) -> BreakerLocker<Self> {
        BreakerLocker::new(self, config)
    }

    /// Records metrics (see [`MetricsLocker`]).
    fn with_metrics(self) -> MetricsLocker<Self> {
        MetricsLocker::new(self)
    }

    /// Runs every operation in a span (see [`TraceLocker`]).
    fn with_tracing(self) -> TraceLocker<Self> {
        TraceLocker::new(self)
    }

    /// Waits with `policy` instead of the default (see [`WaitLocker`](crate::WaitLocker)).
    fn with_wait_policy(self, policy: WaitPolicy) -> WaitLocker<Self> {
        WaitLocker::new(self, policy)
    }

    /// Erases the type: `Arc<dyn Locker>`.
    fn shared(self) -> Arc<dyn Locker> {
        Arc::new(self)
    }
}

impl<L: Locker> LockerExt for L {}
