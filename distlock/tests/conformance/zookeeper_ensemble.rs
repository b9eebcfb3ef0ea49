//! The conformance suite on a three-server ZooKeeper ensemble: one
//! ensemble for the whole test binary (Java servers start slowly), every
//! client a new `ZooKeeperLocker` (its own session) opened through
//! `distlock::connect` with a URL listing all three servers, so sessions
//! land on followers and the leader alike and every write goes through the
//! quorum. Failures are in `tests/zookeeper/ensemble.rs`.

use std::sync::{Arc, OnceLock};

use distlock::Locker;
use test_servers::ZooKeeperEnsemble;

/// The ensemble of this test binary, started by the first test; never
/// killed or paused (its members die with the test process).
fn ensemble() -> &'static ZooKeeperEnsemble {
    static ENSEMBLE: OnceLock<ZooKeeperEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZooKeeperEnsemble::start(3))
}

distlock::conformance_suite!(|| async {
    let ensemble = tokio::task::block_in_place(ensemble);
    assert_eq!(ensemble.size(), 3);
    let url = format!("{}?session_timeout=4s", ensemble.url());
    let locker: Arc<dyn Locker> = distlock::connect(&url)
        .await
        .expect("connect to the test zookeeper ensemble");
    assert_eq!(locker.backend(), "zookeeper");
    locker
});
