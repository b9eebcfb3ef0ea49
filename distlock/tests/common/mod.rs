//! Helpers shared by several test binaries (`tests/redis`, `tests/postgres`),
//! each of which includes this file as its `common` module. Only helpers every
//! including binary uses belong here, so none of them is dead code in one.

use std::time::Duration;

use tokio::time::Instant;

/// Polls `condition` every 10 ms until it holds and returns how long that
/// took, or panics naming `what` once `within` has passed.
pub async fn eventually(
    within: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        if condition() {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
