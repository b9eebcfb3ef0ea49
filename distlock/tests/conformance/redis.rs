//! The conformance suite on the Redis backend: one redis-server for the whole
//! test binary, every client a new connection to it (as separate processes
//! would have), opened through `distlock::connect` like an application would.
//!
//! The server is [`RedisServer::shared`], which dies with the test binary.

use std::sync::Arc;

use distlock::Locker;
use test_servers::RedisServer;

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&RedisServer::shared().url())
        .await
        .expect("connect to the test redis-server");
    assert_eq!(locker.backend(), "redis");
    locker
});
