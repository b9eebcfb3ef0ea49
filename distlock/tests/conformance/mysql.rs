//! The conformance suite on the MySQL backend, against a real MariaDB
//! server this test binary starts; every client is a separate
//! `MysqlLocker` (its own sessions), as separate processes would be.

use std::sync::Arc;

use distlock::mysql::MysqlLocker;
use distlock::Locker;
use test_servers::MariaDbServer;

distlock::conformance_suite!(connect);

// A check for backends whose records are SQL text columns, which cannot
// hold a zero byte.
distlock::conformance_suite!(@checks connect;
    a_zero_byte_in_a_key_or_label_does_not_break_the_grant,
);

async fn connect() -> Arc<dyn Locker> {
    Arc::new(
        MysqlLocker::from_url(&MariaDbServer::shared().url())
            .await
            .expect("connect to the test server"),
    )
}
