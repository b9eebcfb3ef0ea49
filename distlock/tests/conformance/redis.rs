//! The conformance suite on the Redis backend: one redis-server for the whole
//! test binary, every client a new connection to it (as separate processes
//! would have), opened through `distlock::connect` like an application would.
//!
//! The server lives in a `static`, which is never dropped; test-servers ties it
//! to this process (`PR_SET_PDEATHSIG`), so it dies with the test binary under
//! both `cargo test` (one process) and `cargo nextest` (one per test).

use std::sync::{Arc, OnceLock};

use distlock::Locker;
use test_servers::RedisServer;

fn server_url() -> String {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start).url()
}

distlock::conformance_suite!(|| async {
    let locker: Arc<dyn Locker> = distlock::connect(&server_url())
        .await
        .expect("connect to the test redis-server");
    assert_eq!(locker.backend(), "redis");
    locker
});
