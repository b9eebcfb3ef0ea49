//! Releases that nobody waits for (a dropped lease, an abandoned attempt),
//! written once: sent on a runtime, bounded in time, and logged however they
//! end, including when the runtime goes away before they ran.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::{Error, Locker};

/// Sends `locker.unlock(key, owner)` in the background on `runtime`, bounded
/// by `timeout`. `what` names the release in the log (`"a dropped lease"`).
///
/// While the backend cannot be reached the unlock is retried with backoff
/// (50 ms doubling to 400 ms) within `timeout`: a release by owner token is
/// safe to repeat, since nobody else has the token, and a connection being
/// re-established often comes back within it.
///
/// Never blocks and never panics. Without a runtime, or if the runtime shuts
/// down before the release ran, the release is abandoned with a warning: the
/// backend's safety net (ttl expiry, connection death) frees the lock.
pub(crate) fn release(
    runtime: Option<Handle>,
    locker: Arc<dyn Locker>,
    key: String,
    owner: String,
    timeout: Duration,
    what: &'static str,
) {
    release_first_held(runtime, locker, vec![key], owner, timeout, what);
}

/// As [`release`], for an attempt that may have taken any one of `keys`
/// ([`Locker::try_lock_any`] whose outcome is unknown): unlocks them by
/// `owner` in order until one was held by it (at most one is: an attempt
/// grants one key), all within `timeout`. Keys `owner` does not hold
/// answer [`Error::NotHeld`] and change nothing.
pub(crate) fn release_first_held(
    runtime: Option<Handle>,
    locker: Arc<dyn Locker>,
    keys: Vec<String>,
    owner: String,
    timeout: Duration,
    what: &'static str,
) {
    let named = name_keys(&keys);
    let Some(runtime) = runtime else {
        tracing::warn!(
            component = "distlock",
            backend = locker.backend(),
            key = named,
            "release of {what} abandoned: no tokio runtime to send it on; the backend's safety net (ttl or connection death) frees the lock"
        );
        return;
    };
    let abandoned = Abandoned {
        backend: locker.backend(),
        key: named,
        what,
        armed: true,
    };
    // A runtime shutting down drops the task unpolled: `abandoned` then warns.
    runtime.spawn(async move {
        let mut abandoned = abandoned;
        let (key, outcome) = unlock_first_held(&*locker, &keys, &owner, timeout).await;
        abandoned.armed = false;
        match outcome {
            Ok(()) => tracing::debug!(component = "distlock", backend = locker.backend(), key, "released {what}"),
            // Already released (a release future dropped after it completed)
            // or expired: nothing left to free.
            Err(Error::NotHeld { .. }) => {}
            Err(error) => tracing::warn!(
                component = "distlock", backend = locker.backend(), key, %error,
                "background release of {what} failed; the backend's safety net (ttl or connection death) frees the lock"
            ),
        }
    });
}

/// The keys of a background release as the log names them: the key, or
/// the first and last of several.
fn name_keys(keys: &[String]) -> String {
    match keys {
        [] => String::new(),
        [key] => key.clone(),
        [first, .., last] => format!("{first} .. {last} ({} keys)", keys.len()),
    }
}

/// [`unlock_retrying`] on each of `keys` in turn until one answers other
/// than [`Error::NotHeld`], all within `timeout`: that key and its answer
/// (the last key's `NotHeld` if none held `owner`).
async fn unlock_first_held<'k>(
    locker: &dyn Locker,
    keys: &'k [String],
    owner: &str,
    timeout: Duration,
) -> (&'k str, crate::Result<()>) {
    let started = Instant::now();
    let mut last = ("", Err(Error::not_held("")));
    for key in keys {
        let left = timeout.saturating_sub(started.elapsed());
        match unlock_retrying(locker, key, owner, left).await {
            Err(Error::NotHeld { .. }) => last = (key.as_str(), Err(Error::not_held(key))),
            other => return (key, other),
        }
    }
    last
}

/// The first and the largest pause between tries of a background release.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_millis(400);

/// `locker.unlock(key, owner)`, tried again after outages while `timeout`
/// leaves room for another try; the last answer is returned.
async fn unlock_retrying(
    locker: &dyn Locker,
    key: &str,
    owner: &str,
    timeout: Duration,
) -> crate::Result<()> {
    let started = Instant::now();
    let left = || timeout.saturating_sub(started.elapsed());
    let mut delay = FIRST_RETRY;
    loop {
        match crate::deadline::bounded(
            locker.backend(),
            "release",
            left(),
            locker.unlock(key, owner),
        )
        .await
        {
            Err(error) if error.is_outage() && delay < left() => {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2).min(MAX_RETRY);
            }
            other => return other,
        }
    }
}

/// Warns if a background release is dropped before it ran to completion.
struct Abandoned {
    backend: &'static str,
    key: String,
    what: &'static str,
    armed: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.armed {
            tracing::warn!(
                component = "distlock",
                backend = self.backend,
                key = self.key,
                "release of {} abandoned: the runtime shut down first; the backend's safety net (ttl or connection death) frees the lock",
                self.what
            );
        }
    }
}
