//! The conformance suite on the Postgres backend, against a real server this
//! test binary starts; every client is a separate `PostgresLocker` (its own
//! sessions), as separate processes would be.

use std::sync::Arc;

use distlock::postgres::PostgresLocker;
use distlock::Locker;
use test_servers::PostgresServer;

distlock::conformance_suite!(|| async {
    Arc::new(
        PostgresLocker::from_url(&PostgresServer::shared().url())
            .await
            .expect("connect to the test server"),
    ) as Arc<dyn Locker>
});
