//! The conformance suite on the Redlock backend, against 3 and against 5
//! independent redis-servers (one set per node count for the whole test
//! binary, each client a new set of connections opened through
//! `distlock::connect`). The fencing checks assert the documented absence
//! of fencing tokens, the mark checks the documented `Unsupported`.

use std::sync::{Arc, OnceLock};

use distlock::Locker;
use test_servers::RedisServer;

/// `redlock://` over `count` fresh servers, started once per count.
fn nodes_url(servers: &'static OnceLock<Vec<RedisServer>>, count: usize) -> String {
    let servers = servers.get_or_init(|| (0..count).map(|_| RedisServer::start()).collect());
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

async fn connect(url: String) -> Arc<dyn Locker> {
    let locker = distlock::connect(&url)
        .await
        .expect("connect to the test redis-servers");
    assert_eq!(locker.backend(), "redlock");
    assert!(!locker.capabilities().fencing && !locker.capabilities().marks);
    locker
}

mod three_nodes {
    use super::*;

    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();

    distlock::conformance_suite!(|| connect(nodes_url(&SERVERS, 3)));
}

mod five_nodes {
    use super::*;

    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();

    distlock::conformance_suite!(|| connect(nodes_url(&SERVERS, 5)));
}
