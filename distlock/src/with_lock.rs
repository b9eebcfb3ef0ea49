//! Acquire, run, release — with a release that survives the caller's
//! cancellation and cannot hang.

use std::future::Future;
use std::time::Duration;

use crate::{Error, KeepAlive, LeaseInfo, Locker, Result, DEFAULT_RELEASE_TIMEOUT};

/// The result of [`WithLock::run`]: the work's output and, separately, how the
/// release went. A failed release never replaces the work's output.
#[derive(Debug)]
pub struct Completed<T> {
    /// What the guarded work returned.
    pub value: T,
    /// The release outcome. On error the lock is freed by the backend's
    /// safety net (ttl expiry or connection death).
    pub release: Result<()>,
}

/// Options of [`with_lock`] and [`with_lease`]: the release bound and the
/// keepalive.
///
/// The lease is **kept alive by default** ([`KeepAlive::default`]: refreshed
/// every ttl/3 while the work runs), so the same code means the same thing
/// on every backend: work longer than the ttl runs to its end as long as
/// refreshes succeed, and the ttl is how long the lock outlives a holder
/// that dies or stops refreshing. (Before, a lock that expires, as on Redis
/// or memory, stopped such work after one ttl, while a session lock, as on
/// Postgres, let it finish.) [`max_hold`](KeepAlive::max_hold) bounds the
/// hold; [`no_keep_alive`](Self::no_keep_alive) turns refreshing off.
///
/// ```
/// use std::time::Duration;
/// use distlock::{KeepAlive, WithLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = distlock::connect("memory://").await?;
/// let done = WithLock::default()
///     .release_timeout(Duration::from_secs(2))
///     .keep_alive(KeepAlive::default())
///     .run(&*locker, "rebuild-cache", Duration::from_secs(10), Duration::ZERO, |lease| async move {
///         lease.fencing_token
///     })
///     .await?;
/// assert!(done.value.is_some());
/// done.release?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct WithLock {
    release_timeout: Duration,
    keepalive: Option<KeepAlive>,
}

impl Default for WithLock {
    fn default() -> Self {
        WithLock {
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            keepalive: Some(KeepAlive::default()),
        }
    }
}

impl WithLock {
    /// Bounds the release (default [`DEFAULT_RELEASE_TIMEOUT`]).
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// Keeps the lease alive while the work runs with `keepalive` (the
    /// default is [`KeepAlive::default`]: no maximum hold).
    pub fn keep_alive(mut self, keepalive: KeepAlive) -> Self {
        self.keepalive = Some(keepalive);
        self
    }

    /// Does not refresh the lease: on a backend whose locks expire, work
    /// longer than the ttl is stopped (and [`Error::Lost`] returned) a drift
    /// margin before the lock could lapse; on a session backend (Postgres,
    /// MySQL, file, ZooKeeper) the lock lasts as long as the work. Prefer
    /// [`KeepAlive::max_hold`] to bound the work the same way everywhere.
    pub fn no_keep_alive(mut self) -> Self {
        self.keepalive = None;
        self
    }

    /// Acquires `key` (waiting up to `timeout`, see [`Locker::lock`]), runs
    /// `work` with the lease's [`LeaseInfo`] while the lease is held, then
    /// releases.
    ///
    /// The work is raced against the lease's lost signal: if the lease is
    /// lost first (a refresh says `NotHeld`, the session died, the ttl is
    /// about to run out without a refresh, or the keepalive's `max_hold`
    /// passed), `work` is dropped, which stops it, and only then is the lock
    /// released. Expiry counts [`crate::drift_margin`] early, so the work has
    /// stopped before the lock can lapse on the server. With
    /// [`no_keep_alive`](Self::no_keep_alive), a lock that expires lasts one
    /// ttl: work longer than that is stopped.
    ///
    /// # Errors
    ///
    /// The acquire error if the lock was not taken (`work` does not run);
    /// [`Error::Lost`] if the lease was lost while `work` ran (`work` was
    /// stopped; the release outcome is logged). Otherwise [`Completed`] with
    /// the work's value and the release outcome.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped while `work` runs, `work` is dropped with it
    /// and the lease is released in the background, bounded by the release
    /// timeout.
    pub async fn run<L, F, Fut>(
        &self,
        locker: &L,
        key: &str,
        ttl: Duration,
        timeout: Duration,
        work: F,
    ) -> Result<Completed<Fut::Output>>
    where
        L: Locker + ?Sized,
        F: FnOnce(LeaseInfo) -> Fut,
        Fut: Future,
    {
        let mut lease = locker.lock(key, ttl, timeout).await?;
        lease.set_release_timeout(self.release_timeout);
        if let Some(keepalive) = &self.keepalive {
            lease.keep_alive(keepalive.clone())?;
        }
        let work = work(lease.info());
        hold_then_release(lease, work).await
    }
}

/// Runs `work` while `lease` is held, then releases it (bounded by the
/// lease's release timeout): the second half of [`WithLock::run`], shared
/// with the election's [`lead`](crate::elect::Election::lead). `work` is
/// dropped first if the lease is lost, and the lock is released only once it
/// has stopped.
pub(crate) async fn hold_then_release<W: Future>(
    lease: crate::Lease,
    work: W,
) -> Result<Completed<W::Output>> {
    let key = lease.key().to_owned();
    let outcome = lease.run_while_held(work).await;
    let release = lease.release().await;
    match (&outcome, &release) {
        // A lost lock is usually no longer ours to release.
        (Err(_), Err(Error::NotHeld { .. })) | (_, Ok(())) => {}
        (_, Err(error)) => tracing::warn!(
            component = "distlock",
            key = key.as_str(),
            %error,
            "release after guarded work failed; the backend's safety net frees the lock"
        ),
    }
    match outcome {
        Ok(value) => Ok(Completed { value, release }),
        Err(reason) => {
            tracing::warn!(component = "distlock", key = key.as_str(), %reason, "lock lost while the guarded work ran; the work was stopped");
            Err(Error::Lost { key, reason })
        }
    }
}

/// Acquires `key`, runs `work`, releases: the everyday form of [`WithLock`].
///
/// Waits up to `timeout` for the lock (zero: one attempt). Returns `work`'s
/// output, or the acquire error ([`crate::Error::NotAcquired`],
/// [`crate::Error::Timeout`], ...) without running `work`, or
/// [`crate::Error::Lost`] if the lease was lost while `work` ran (then `work`
/// was stopped by dropping it before the lock was released; see
/// [`WithLock::run`]). The lease is kept alive while `work` runs (every
/// ttl/3), so work longer than `ttl` finishes on every backend; `ttl` is
/// how long the lock outlives a holder that dies. The release runs
/// even if this future is dropped while `work` runs, bounded by
/// [`DEFAULT_RELEASE_TIMEOUT`]; a release failure is logged (`component =
/// "distlock"`) and does not replace the output. Use [`WithLock::run`] to see
/// it.
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = distlock::connect("memory://").await?;
/// let rows = distlock::with_lock(&*locker, "migrate", Duration::from_secs(60), Duration::from_secs(5), || async {
///     17 // run the migration
/// })
/// .await?;
/// assert_eq!(rows, 17);
/// # Ok(())
/// # }
/// ```
pub async fn with_lock<L, F, Fut>(
    locker: &L,
    key: &str,
    ttl: Duration,
    timeout: Duration,
    work: F,
) -> Result<Fut::Output>
where
    L: Locker + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future,
{
    with_lease(locker, key, ttl, timeout, |_| work()).await
}

/// Like [`with_lock`], but `work` receives the lease's [`LeaseInfo`]: its
/// fencing token to pass downstream, and its lost signal to stop when the
/// lock is lost.
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = distlock::connect("memory://").await?;
/// let token = distlock::with_lease(&*locker, "sweep", Duration::from_secs(30), Duration::ZERO, |lease| async move {
///     // write_with_fence(lease.fencing_token) ...
///     lease.fencing_token
/// })
/// .await?;
/// assert!(token.is_some());
/// # Ok(())
/// # }
/// ```
pub async fn with_lease<L, F, Fut>(
    locker: &L,
    key: &str,
    ttl: Duration,
    timeout: Duration,
    work: F,
) -> Result<Fut::Output>
where
    L: Locker + ?Sized,
    F: FnOnce(LeaseInfo) -> Fut,
    Fut: Future,
{
    WithLock::default()
        .run(locker, key, ttl, timeout, work)
        .await
        .map(|done| done.value)
}
