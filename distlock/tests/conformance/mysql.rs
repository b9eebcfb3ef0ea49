//! The conformance suite on the MySQL backend, against a real MariaDB
//! server this test binary starts; every client is a separate
//! `MysqlLocker` (its own sessions), as separate processes would be.

use std::sync::{Arc, OnceLock};

use distlock::mysql::MysqlLocker;
use distlock::Locker;
use test_servers::MariaDbServer;

fn url() -> String {
    static SERVER: OnceLock<MariaDbServer> = OnceLock::new();
    SERVER.get_or_init(MariaDbServer::start).url()
}

distlock::conformance_suite!(|| async {
    Arc::new(
        MysqlLocker::from_url(&url())
            .await
            .expect("connect to the test server"),
    ) as Arc<dyn Locker>
});
