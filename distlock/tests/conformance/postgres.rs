//! The conformance suite on the Postgres backend, against a real server this
//! test binary starts; every client is a separate `PostgresLocker` (its own
//! sessions), as separate processes would be.

use std::sync::Arc;

use distlock::postgres::PostgresLocker;
use distlock::Locker;
use test_servers::PostgresServer;

distlock::conformance_suite!(connect);

// A check for backends whose records are SQL text columns, which cannot
// hold a zero byte.
distlock::conformance_suite!(@checks connect;
    a_zero_byte_in_a_key_or_label_does_not_break_the_grant,
);

async fn connect() -> Arc<dyn Locker> {
    Arc::new(
        PostgresLocker::from_url(&PostgresServer::shared().url())
            .await
            .expect("connect to the test server"),
    )
}
