//! Helpers the Redis modules share.

use distlock::redis::RedisLocker;
use test_servers::RedisServer;

/// A locker on `server` with the default configuration.
/// The owner token held in the Redis key `redis_key` (`""` if it is
/// absent): the lock key's value up to its first line break, where the
/// holder record starts (see `src/redis/scripts.rs`).
pub fn stored_owner(server: &RedisServer, redis_key: &str) -> String {
    let value = server.cli(&["GET", redis_key]);
    value.split('\n').next().unwrap_or_default().to_owned()
}

pub async fn connect(server: &RedisServer) -> RedisLocker {
    RedisLocker::from_url(&server.url())
        .await
        .expect("connect to the test redis-server")
}
