//! The conformance suite on a master found through Sentinel (one master, one
//! replica, three sentinels; no failover here, see `tests/redis/sentinel.rs`
//! for that): every client a new `redis+sentinel://` locker opened through
//! `distlock::connect`.

use std::sync::Arc;

use distlock::Locker;
use test_servers::RedisSentinelSet;

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&RedisSentinelSet::shared().url())
        .await
        .expect("connect through the test sentinels");
    assert_eq!(locker.backend(), "redis");
    locker
});
