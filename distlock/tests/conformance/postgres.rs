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

/// The shared-lock checks through every wrapper at once: their `lock` is
/// the polling loop of a `WaitLocker`, in no server queue, so the waiting
/// writer check takes its branch without writer priority here.
mod shared_through_every_wrapper {
    use super::*;
    use distlock::{BreakerConfig, LockerExt, WaitPolicy};

    distlock::conformance_suite!(@checks || async {
        connect()
            .await
            .with_prefix("wrapped:")
            .with_wait_policy(WaitPolicy::default())
            .with_circuit_breaker(BreakerConfig::default())
            .with_metrics()
            .with_tracing()
            .shared()
    };
        shared_holders_coexist,
        exclusive_is_contention_while_shared_held,
        shared_is_contention_while_exclusive_held,
        last_shared_release_lets_the_writer_in,
        lock_shared_waits_for_the_writer,
        a_waiting_writer_and_later_readers,
        dropped_shared_lease_is_released,
        shared_lease_answers_to_its_owner_token,
        shared_fencing_tokens_sit_between_writers,
        shared_keepalive_holds_and_reports_loss,
    );
}
