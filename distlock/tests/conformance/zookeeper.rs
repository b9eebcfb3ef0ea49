//! The conformance suite on the ZooKeeper backend: one standalone
//! ZooKeeper for the whole test binary, every client a new
//! `ZooKeeperLocker` (its own session), opened through `distlock::connect`
//! like an application would.

use std::sync::Arc;

use distlock::Locker;
use test_servers::ZooKeeperServer;

distlock::conformance_suite!(|| async {
    let url = format!("{}?session_timeout=4s", ZooKeeperServer::shared().url());
    let locker: Arc<dyn Locker> = distlock::connect(&url)
        .await
        .expect("connect to the test zookeeper");
    assert_eq!(locker.backend(), "zookeeper");
    locker
});
