//! The conformance suite on a three-master Redis Cluster (no replicas): one
//! cluster for the whole test binary, every client a new
//! `redis+cluster://` locker opened through `distlock::connect`. The suite's
//! keys spread over the three masters' slots; each lock's keys and release
//! channel share one slot (their hash tag), so the scripts and the sharded
//! release notifications work on any of them.

use std::sync::Arc;

use distlock::Locker;
use test_servers::RedisCluster;

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&RedisCluster::shared().url())
        .await
        .expect("connect to the test cluster");
    assert_eq!(locker.backend(), "redis");
    locker
});
