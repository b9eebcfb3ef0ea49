//! What the examples share: the locker they run against.

use std::sync::Arc;

use distlock::Locker;

/// The backend `DISTLOCK_URL` names (`redis://...`, `postgres://...`,
/// `etcd://...`; the example needs that backend's feature), else the
/// embedded file backend in its default directory, as the `distlock` CLI
/// does: the example runs with no server, and copies of it in several
/// terminals contend for the same locks.
///
/// # Errors
///
/// As [`distlock::connect`]: a malformed URL, a scheme whose feature is not
/// enabled, a backend that cannot be opened.
pub async fn locker_from_env() -> distlock::Result<Arc<dyn Locker>> {
    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "file://".to_owned());
    // The scheme only: the rest of a URL can carry a password.
    let scheme = url.split("://").next().unwrap_or_default();
    eprintln!("backend: {scheme}:// (set DISTLOCK_URL to choose another)");
    distlock::connect(&url).await
}
