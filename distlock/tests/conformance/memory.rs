//! The conformance suite on the in-process backend.

use std::sync::{Arc, OnceLock};

use distlock::memory::MemoryLocker;
use distlock::Locker;

/// Every client of the suite is a clone of one locker: clones share locks.
fn shared() -> Arc<dyn Locker> {
    static LOCKER: OnceLock<MemoryLocker> = OnceLock::new();
    Arc::new(LOCKER.get_or_init(MemoryLocker::new).clone())
}

distlock::conformance_suite!(|| async { shared() });

mod through_every_wrapper {
    use super::*;
    use distlock::{BreakerConfig, LockerExt, WaitPolicy};

    // The wrappers must keep the contract too: run the whole suite through all
    // of them at once.
    distlock::conformance_suite!(|| async {
        shared()
            .with_prefix("wrapped:")
            .with_wait_policy(WaitPolicy::default())
            .with_circuit_breaker(BreakerConfig::default())
            .with_metrics()
            .with_tracing()
            .shared()
    });
}

mod through_the_fault_double {
    use super::*;
    use distlock::testkit::FaultyLocker;
    use distlock::LockerExt;

    // With no fault injected, the test double keeps the contract it wraps:
    // code tested against it is tested against a real locker's behaviour.
    distlock::conformance_suite!(|| async { FaultyLocker::new(shared()).shared() });
}
