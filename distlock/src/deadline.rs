//! Time bounds, written once: deadlines that saturate instead of overflowing,
//! and backend calls bounded by a timeout that report
//! [`Error::DeadlineExceeded`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// How far past its `timeout` a [`crate::Locker::lock`] call may return: the
/// time an attempt already sent when the deadline passes is given to answer
/// (and a native wait that ended on the server, to be confirmed). After it the
/// call is abandoned with [`Error::DeadlineExceeded`] (its attempt undone in
/// the background), whatever the backend does.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// `from + duration`, or `None` when that is too far in the future for an
/// [`Instant`] to hold: "never", for callers that pass [`Duration::MAX`] to
/// mean "no bound".
pub(crate) fn checked_deadline(from: Instant, duration: Duration) -> Option<Instant> {
    from.checked_add(duration)
}

/// `from + duration`, or about 30 years from `from` when that is too far
/// for an [`Instant`] (as tokio's own "far future"): for instants that must
/// exist, such as when an open circuit may be probed again.
pub(crate) fn saturating_deadline(from: Instant, duration: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(duration)
        .or_else(|| from.checked_add(FAR_FUTURE))
        .unwrap_or(from)
}

/// Sleeps until `deadline`, or forever when there is none.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Runs `call`, abandoning it after `limit` with
/// [`Error::DeadlineExceeded`]. `call` must be safe to drop at any await
/// point (backends make their attempts so with undo guards).
pub(crate) async fn bounded<T>(
    backend: &'static str,
    operation: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    // tokio's timeout treats a limit too large for an Instant as "never".
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::DeadlineExceeded {
            backend,
            operation,
            after: limit,
        }),
    }
}

// The server backends' connects are its only callers: a build with none of
// them has no use for it.
#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "mysql",
    feature = "postgres"
))]
pub(crate) mod connect;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_too_far_away_is_none_not_a_panic() {
        let now = Instant::now();
        assert_eq!(checked_deadline(now, Duration::MAX), None);
        assert_eq!(
            checked_deadline(now, Duration::from_secs(1)),
            Some(now + Duration::from_secs(1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_reports_deadline_exceeded_and_passes_results_through() {
        let slow = bounded("memory", "release", Duration::from_millis(10), async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        })
        .await;
        assert!(matches!(
            slow,
            Err(Error::DeadlineExceeded {
                backend: "memory",
                operation: "release",
                after
            }) if after == Duration::from_millis(10)
        ));
        let quick = bounded("memory", "release", Duration::MAX, async { Ok(7) }).await;
        assert_eq!(quick.unwrap(), 7);
    }
}
