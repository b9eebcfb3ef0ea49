//! The conformance suite on the etcd backend: one single-node etcd for the
//! whole test binary, every client a new `EtcdLocker` (its own connection
//! and session leases), opened through `distlock::connect` like an
//! application would.

use std::sync::Arc;

use distlock::Locker;
use test_servers::EtcdServer;

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&EtcdServer::shared().url())
        .await
        .expect("connect to the test etcd");
    assert_eq!(locker.backend(), "etcd");
    locker
});
