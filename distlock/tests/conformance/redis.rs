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

/// The whole suite again on a locker with fencing off (`?fencing=off`):
/// everything but tokens holds as with fencing on; the checks of tokens
/// read `Capabilities::fencing` and check their absence instead.
mod fencing_off {
    use super::*;

    distlock::conformance_suite!(|| async {
        let url = format!("{}?fencing=off", RedisServer::shared().url());
        let locker: Arc<dyn Locker> = distlock::connect(&url)
            .await
            .expect("connect to the test redis-server");
        assert!(!locker.capabilities().fencing);
        locker
    });
}
