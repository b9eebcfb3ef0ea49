//! Helpers the Redis modules share.

use distlock::redis::RedisLocker;
use test_servers::RedisServer;

/// A locker on `server` with the default configuration.
pub async fn connect(server: &RedisServer) -> RedisLocker {
    RedisLocker::from_url(&server.url())
        .await
        .expect("connect to the test redis-server")
}
