//! The conformance suite on the MySQL backend, against a real MariaDB
//! server this test binary starts; every client is a separate
//! `MysqlLocker` (its own sessions), as separate processes would be.

use std::sync::Arc;

use distlock::mysql::MysqlLocker;
use distlock::Locker;
use test_servers::MariaDbServer;

distlock::conformance_suite!(|| async {
    Arc::new(
        MysqlLocker::from_url(&MariaDbServer::shared().url())
            .await
            .expect("connect to the test server"),
    ) as Arc<dyn Locker>
});
