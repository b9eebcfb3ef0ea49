//! The conformance suite on the etcd backend: one single-node etcd for the
//! whole test binary, every client a new `EtcdLocker` (its own connection
//! and session leases), opened through `distlock::connect` like an
//! application would.

use std::sync::{Arc, OnceLock};

use distlock::Locker;
use test_servers::EtcdServer;

fn server_url() -> String {
    static SERVER: OnceLock<EtcdServer> = OnceLock::new();
    SERVER.get_or_init(EtcdServer::start).url()
}

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&server_url())
        .await
        .expect("connect to the test etcd");
    assert_eq!(locker.backend(), "etcd");
    locker
});
