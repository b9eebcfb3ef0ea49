//! The value a granted lock is: [`Lease`], its lost signal, and what a backend
//! needs to build one.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::keepalive::KeepAlive;
use crate::{Error, Locker, Result};

/// How long a release may take before it is abandoned, unless
/// [`Lease::set_release_timeout`] says otherwise.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The safety margin a holder keeps between stopping its work and the end of
/// its lease's validity ([`Lease::valid_until`]): ttl/100 + 100 ms.
///
/// The holder measures validity on its own clock, the server expires the lock
/// on its clock; the two run at slightly different rates. Redlock's algorithm
/// allows ttl × 1 % + 2 ms for that drift
/// (<https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>);
/// the extra 100 ms covers delivering a signal and the kernel tearing a
/// process down. `distlock run` delivers SIGKILL this long before the lease
/// could lapse.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock::drift_margin(Duration::from_secs(30)), Duration::from_millis(400));
/// ```
pub fn drift_margin(ttl: Duration) -> Duration {
    (ttl / 100).saturating_add(Duration::from_millis(100))
}

/// Why a lease stopped being held. Delivered by [`LostSignal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The holder released the lease (or dropped it). Not a failure.
    Released,
    /// The backend says this owner no longer holds the lock: it expired and
    /// may have been taken by somebody else, or somebody released it by token.
    NotHeld,
    /// The ttl ran out before a refresh succeeded (the backend could not be
    /// reached in time). Treat the lock as taken by somebody else.
    Expired,
    /// The keepalive stopped renewing because the lease reached its
    /// [`KeepAlive::max_hold`], and released it.
    MaxHoldExceeded,
    /// The connection or session carrying the lock died; the server has
    /// dropped the lock.
    ConnectionLost,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Released => "released",
            LostReason::NotHeld => "the backend says this owner no longer holds the lock",
            LostReason::Expired => "the ttl ran out before a refresh succeeded",
            LostReason::MaxHoldExceeded => "the lease reached its maximum hold time",
            LostReason::ConnectionLost => "the connection holding the lock died",
        })
    }
}

/// What the holder currently knows about its lease; shared by the lease, its
/// keepalive task, every [`LostSignal`] and the backend's [`LostNotifier`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseStatus {
    /// Until when the lock is known to be held (client clock, conservative:
    /// measured from before the request that set it). `None` for backends
    /// whose locks do not expire (file, Postgres).
    pub(crate) valid_until: Option<Instant>,
    /// Set once, when the lease is lost or released.
    pub(crate) lost: Option<LostReason>,
}

/// The state shared by a lease, its keepalive, its lost signals and notifiers.
pub(crate) struct Shared {
    status: watch::Sender<LeaseStatus>,
    /// Run once, when the lease ends (see [`Lease::on_end`]).
    on_end: Mutex<Vec<EndCallback>>,
}

type EndCallback = Box<dyn FnOnce(LostReason) + Send>;

impl Shared {
    pub(crate) fn status(&self) -> LeaseStatus {
        *self.status.borrow()
    }
}

pub(crate) type StatusSender = Arc<Shared>;

/// Lets a backend tell a lease that its lock is gone (for example because the
/// connection that held it died). Cheap to clone; firing twice keeps the first
/// reason.
#[derive(Clone)]
pub struct LostNotifier(StatusSender);

impl LostNotifier {
    /// Marks the lease lost with `reason`, waking every [`LostSignal`]. The
    /// lock may be someone else's at once: the lease's
    /// [`valid_until`](Lease::valid_until) becomes now.
    pub fn notify(&self, reason: LostReason) {
        mark_lost_with_grace(&self.0, reason, Duration::ZERO);
    }

    /// Marks the lease lost with `reason`, where the backend knows the lock
    /// cannot be granted to anyone else for `grace` yet (Postgres: the holder
    /// detects a dead connection before the server does). The lease's
    /// [`valid_until`](Lease::valid_until) becomes now + `grace` (or stays
    /// earlier), so a holder such as `distlock run` can finish stopping its
    /// work within it.
    pub fn notify_with_grace(&self, reason: LostReason, grace: Duration) {
        mark_lost_with_grace(&self.0, reason, grace);
    }
}

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostNotifier").finish_non_exhaustive()
    }
}

/// Ends the lease with `reason` without touching its validity (a release, or
/// a max hold: the lock is still held until released or expired).
pub(crate) fn mark_lost(shared: &StatusSender, reason: LostReason) {
    mark_ended(shared, reason, None);
}

/// Ends the lease with `reason`: a loss, after which the lock stays ours for
/// at most `grace` more.
pub(crate) fn mark_lost_with_grace(shared: &StatusSender, reason: LostReason, grace: Duration) {
    mark_ended(shared, reason, Some(grace));
}

fn mark_ended(shared: &StatusSender, reason: LostReason, grace: Option<Duration>) {
    let now = Instant::now();
    let ended = shared.status.send_if_modified(|s| {
        if s.lost.is_some() {
            return false;
        }
        s.lost = Some(reason);
        if let Some(grace) = grace {
            let limit = crate::deadline::checked_deadline(now, grace);
            s.valid_until = match (s.valid_until, limit) {
                (Some(until), Some(limit)) => Some(until.min(limit)),
                (until, None) => until,
                (None, limit) => limit,
            };
        }
        true
    });
    if ended {
        let callbacks =
            std::mem::take(&mut *shared.on_end.lock().unwrap_or_else(PoisonError::into_inner));
        for callback in callbacks {
            callback(reason);
        }
    }
}

/// Resolves when a lease is lost, released, or outlives its known validity.
///
/// Obtained from [`Lease::lost_signal`]; clone it into the tasks doing the
/// guarded work so they can stop when the lock is gone. It needs no task of
/// its own: for expiring backends it sleeps until the lease's known validity
/// runs out and re-arms whenever a refresh extends it.
///
/// ```
/// # async fn demo(lease: distlock::Lease) {
/// let mut lost = lease.lost_signal();
/// tokio::select! {
///     reason = lost.wait() => eprintln!("stopping: {reason}"),
///     _ = do_work() => {}
/// }
/// # }
/// # async fn do_work() {}
/// ```
#[derive(Clone)]
pub struct LostSignal(watch::Receiver<LeaseStatus>);

impl LostSignal {
    /// Waits until the lease is lost and says why. Returns at once if it
    /// already is. Cancel-safe.
    pub async fn wait(&mut self) -> LostReason {
        loop {
            let status = *self.0.borrow_and_update();
            if let Some(reason) = status.lost {
                return reason;
            }
            match status.valid_until {
                Some(deadline) => {
                    if Instant::now() >= deadline {
                        return LostReason::Expired;
                    }
                    tokio::select! {
                        changed = self.0.changed() => if changed.is_err() { return LostReason::Released },
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => {
                    if self.0.changed().await.is_err() {
                        return LostReason::Released;
                    }
                }
            }
        }
    }

    /// The reason the lease is lost, or `None` while it is still believed held.
    pub fn reason(&self) -> Option<LostReason> {
        let status = *self.0.borrow();
        status.lost.or(match status.valid_until {
            Some(deadline) if Instant::now() >= deadline => Some(LostReason::Expired),
            _ => None,
        })
    }

    /// True once the lease is lost, released or expired.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("reason", &self.reason())
            .finish()
    }
}

/// The plain facts of a held lease, cheap to clone into the guarded work (see
/// [`crate::with_lease`]).
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    /// The key as the caller named it.
    pub key: String,
    /// The fencing token of this grant (see [`Lease::fencing_token`]).
    pub fencing_token: Option<u64>,
    /// Fires when the lease is lost.
    pub lost: LostSignal,
}

/// Everything a backend supplies to build a [`Lease`].
///
/// Backend implementors only: applications receive leases from
/// [`Locker::try_lock`] and [`Locker::lock`].
#[derive(Debug)]
pub struct LeaseParts {
    /// The key as the caller of this locker named it.
    pub key: String,
    /// The owner token: the holder's credential for unlock and refresh.
    pub owner: String,
    /// Strictly increasing per key for every grant, or `None` if this backend
    /// (as configured) has no fencing.
    pub fencing_token: Option<u64>,
    /// The ttl the lock was granted with.
    pub ttl: Duration,
    /// When the lock stops being held without a refresh, measured on the client
    /// clock from before the acquire request; `None` if it never expires.
    pub valid_until: Option<Instant>,
}

/// A granted lock.
///
/// Carries the key, the owner token (the credential that release and refresh
/// check), the fencing token, the ttl, and a [`LostSignal`] that fires when the
/// lock is known to be gone.
///
/// # Releasing
///
/// Call [`release`](Lease::release) when the work is done. A lease dropped
/// without `release` is still freed: the release is sent in the background on
/// the current tokio runtime, bounded by the release timeout. Outside a runtime,
/// backends that can release synchronously (memory, file) do; the others fall
/// back to their safety net (ttl expiry, connection death), which the backend
/// docs bound. Dropping never panics.
///
/// # Fencing
///
/// [`fencing_token`](Lease::fencing_token) strictly increases with every grant
/// of the same key on the same backend. Pass it to the resource you protect and
/// have it reject writes carrying a smaller token than it has seen: that, not
/// the lock alone, is what stops a paused or partitioned former holder.
pub struct Lease {
    key: String,
    owner: String,
    fencing_token: Option<u64>,
    ttl: Duration,
    acquired_at: Instant,
    locker: Arc<dyn Locker>,
    status: StatusSender,
    release_timeout: Duration,
    keepalive: Option<JoinHandle<()>>,
    sync_release: Option<Box<dyn FnOnce() + Send + Sync>>,
    released: bool,
}

impl Lease {
    /// Builds a lease granted by `locker` (backend implementors only).
    ///
    /// `locker` is what [`release`](Lease::release), [`refresh`](Lease::refresh)
    /// and the keepalive call; wrappers replace it with themselves through
    /// [`rebind`](Lease::rebind) so those calls pass through them too.
    pub fn new(parts: LeaseParts, locker: Arc<dyn Locker>) -> Self {
        let (status, _) = watch::channel(LeaseStatus {
            valid_until: parts.valid_until,
            lost: None,
        });
        let shared = Shared {
            status,
            on_end: Mutex::default(),
        };
        Lease {
            key: parts.key,
            owner: parts.owner,
            fencing_token: parts.fencing_token,
            ttl: parts.ttl,
            acquired_at: Instant::now(),
            locker,
            status: Arc::new(shared),
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            keepalive: None,
            sync_release: None,
            released: false,
        }
    }

    /// Registers a synchronous release used when the lease is dropped outside
    /// a tokio runtime (backend implementors only). It must not block.
    pub fn with_sync_release(mut self, release: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.sync_release = Some(Box::new(release));
        self
    }

    /// Routes release, refresh and keepalive of this lease through `locker`
    /// (wrapper implementors only). The key is left unchanged.
    pub fn rebind(mut self, locker: Arc<dyn Locker>) -> Self {
        self.locker = locker;
        self
    }

    /// Renames the key this lease reports and releases with (wrappers that
    /// rewrite keys, such as [`crate::Prefix`], use it to restore the caller's key).
    pub fn rename(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// A handle through which the backend can report that this lease's lock is
    /// gone (backend implementors only).
    pub fn lost_notifier(&self) -> LostNotifier {
        LostNotifier(self.status.clone())
    }

    /// The key as the caller named it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner token: the credential that [`Locker::unlock`] and
    /// [`Locker::refresh`] check. Treat it as a secret; it is never logged.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing token of this grant: strictly greater than that of every
    /// earlier grant of the same key on the same backend. `None` only for a
    /// backend configured without fencing.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The ttl the lock was granted (or last refreshed) with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When this lease was granted (the client's clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Until when the lock is known to be held, on the client's clock and
    /// conservatively (measured from before the request that granted or last
    /// refreshed it). `None` for backends whose locks do not expire.
    pub fn valid_until(&self) -> Option<Instant> {
        self.status.status().valid_until
    }

    /// A signal that resolves when this lease is lost (see [`LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.status.status.subscribe())
    }

    /// Runs `callback` once when this lease ends, with the reason: released,
    /// dropped ([`LostReason::Released`]) or lost (wrapper implementors: the
    /// metrics wrapper counts losses and hold times this way, without a task
    /// per lease). It runs on whichever task ends the lease, so it must be
    /// quick and must not block. A lease that already ended runs it at once.
    pub fn on_end(&self, callback: impl FnOnce(LostReason) + Send + 'static) {
        let mut callbacks = self
            .status
            .on_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match self.status.status().lost {
            Some(reason) => {
                drop(callbacks);
                callback(reason);
            }
            None => callbacks.push(Box::new(callback)),
        }
    }

    /// True once the lease is known lost, released or expired.
    pub fn is_lost(&self) -> bool {
        self.lost_signal().is_lost()
    }

    /// Key, fencing token and lost signal, cloneable into the guarded work.
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo {
            key: self.key.clone(),
            fencing_token: self.fencing_token,
            lost: self.lost_signal(),
        }
    }

    /// Bounds how long [`release`](Lease::release) (and the background release
    /// of a dropped lease) may take. Default [`DEFAULT_RELEASE_TIMEOUT`].
    pub fn set_release_timeout(&mut self, timeout: Duration) {
        self.release_timeout = timeout;
    }

    /// Runs `work` while the lease is held: returns its output, or the
    /// [`LostReason`] if the lease is lost first (then `work` is dropped).
    ///
    /// ```
    /// # async fn demo(lease: distlock::Lease) {
    /// match lease.run_while_held(async { 42 }).await {
    ///     Ok(answer) => assert_eq!(answer, 42),
    ///     Err(reason) => eprintln!("lock lost: {reason}"),
    /// }
    /// # }
    /// ```
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output, LostReason> {
        let mut lost = self.lost_signal();
        tokio::select! {
            output = work => Ok(output),
            reason = lost.wait() => Err(reason),
        }
    }

    /// Extends the lock to `ttl` from now, if this owner still holds it.
    ///
    /// Fails with [`Error::NotHeld`] (and fires the lost signal) if the lock
    /// expired or changed hands, and with [`Error::Unsupported`] on backends
    /// without refresh (see [`crate::Capabilities::refresh`]). For backends
    /// whose locks do not expire, refresh verifies the lock is still held.
    pub async fn refresh(&mut self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        match self.locker.refresh(&self.key, &self.owner, ttl).await {
            Ok(()) => {
                self.ttl = ttl;
                extend_validity(&self.status, started, ttl);
                Ok(())
            }
            Err(err @ Error::NotHeld { .. }) => {
                mark_lost(&self.status, LostReason::NotHeld);
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Starts refreshing this lease in the background (see [`KeepAlive`]):
    /// about every ttl/3, retrying transient errors until the lease would
    /// expire, firing the lost signal when the lock is gone, and stopping (then
    /// releasing) at `max_hold`. Replaces a keepalive already running.
    ///
    /// Fails with [`Error::InvalidInput`] outside a tokio runtime.
    pub fn keep_alive(&mut self, config: KeepAlive) -> Result<()> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "runtime",
                "Lease::keep_alive must be called inside a tokio runtime",
            )
        })?;
        if let Some(previous) = self.keepalive.take() {
            previous.abort();
        }
        let task = crate::keepalive::Task {
            locker: self.locker.clone(),
            key: self.key.clone(),
            owner: self.owner.clone(),
            ttl: self.ttl,
            acquired_at: self.acquired_at,
            status: self.status.clone(),
            release_timeout: self.release_timeout,
            config,
        };
        self.keepalive = Some(runtime.spawn(task.run()));
        Ok(())
    }

    /// Releases the lock: only if this owner still holds it, bounded by the
    /// release timeout.
    ///
    /// Returns [`Error::NotHeld`] if the lock had already expired or changed
    /// hands (nothing was deleted), or a backend error if the release could not
    /// be confirmed; the lock is then freed by the backend's safety net. If
    /// this future is dropped before it completes, the release continues in
    /// the background as for a dropped lease.
    pub async fn release(mut self) -> Result<()> {
        self.stop_keepalive();
        let outcome = tokio::time::timeout(
            self.release_timeout,
            self.locker.unlock(&self.key, &self.owner),
        )
        .await;
        // Reached only if this future was not cancelled mid-release; otherwise
        // Drop sends the release again in the background.
        self.released = true;
        self.sync_release = None;
        mark_lost(&self.status, LostReason::Released);
        match outcome {
            Ok(result) => result,
            Err(_) => Err(Error::backend(
                self.locker.backend(),
                "release",
                format!(
                    "no answer within the release timeout of {:?}",
                    self.release_timeout
                ),
            )),
        }
    }

    fn stop_keepalive(&mut self) {
        if let Some(task) = self.keepalive.take() {
            task.abort();
        }
    }
}

pub(crate) fn extend_validity(shared: &StatusSender, from: Instant, ttl: Duration) {
    shared.status.send_if_modified(|s| match s.valid_until {
        Some(_) => {
            s.valid_until = Some(from + ttl);
            true
        }
        None => false,
    });
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_keepalive();
        mark_lost(&self.status, LostReason::Released);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let locker = self.locker.clone();
            let key = std::mem::take(&mut self.key);
            let owner = std::mem::take(&mut self.owner);
            let timeout = self.release_timeout;
            runtime.spawn(async move {
                match tokio::time::timeout(timeout, locker.unlock(&key, &owner)).await {
                    Ok(Ok(())) => tracing::debug!(component = "distlock", key, "released dropped lease"),
                    // Already released (for example a release future dropped mid-way that had
                    // in fact completed) or expired: nothing left to free.
                    Ok(Err(Error::NotHeld { .. })) => {}
                    Ok(Err(error)) => tracing::warn!(
                        component = "distlock", key, %error,
                        "background release of a dropped lease failed; the backend's safety net frees it"
                    ),
                    Err(_) => tracing::warn!(
                        component = "distlock", key, ?timeout,
                        "background release of a dropped lease timed out; the backend's safety net frees it"
                    ),
                }
            });
        } else if let Some(release) = self.sync_release.take() {
            release();
        } else {
            tracing::warn!(
                component = "distlock",
                key = self.key,
                "lease dropped outside a tokio runtime; the backend's safety net (ttl or connection death) frees it"
            );
        }
    }
}

impl fmt::Debug for Lease {
    // The owner token is a credential: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .field("backend", &self.locker.backend())
            .field("lost", &self.lost_signal().reason())
            .finish_non_exhaustive()
    }
}

/// A fresh owner token: 128 random bits as 32 lowercase hex digits.
pub fn new_owner_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;

    #[test]
    fn a_lease_dropped_outside_a_runtime_is_released_without_panicking() {
        let locker = MemoryLocker::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lease = runtime
            .block_on(locker.try_lock("k", Duration::from_secs(60)))
            .unwrap()
            .unwrap();
        drop(runtime);
        drop(lease);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let again = runtime
            .block_on(locker.try_lock("k", Duration::from_secs(60)))
            .unwrap();
        assert!(again.is_some(), "the memory backend released synchronously");
    }

    #[tokio::test]
    async fn on_end_runs_once_with_the_reason() {
        let locker = MemoryLocker::new();
        let lease = locker
            .try_lock("k", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let early = tx.clone();
        lease.on_end(move |reason| early.send(reason).unwrap());
        lease.lost_notifier().notify(LostReason::ConnectionLost);
        lease.lost_notifier().notify(LostReason::NotHeld);
        // Registered after the end: runs at once with the first reason.
        lease.on_end(move |reason| tx.send(reason).unwrap());
        drop(lease);
        assert_eq!(rx.recv().await, Some(LostReason::ConnectionLost));
        assert_eq!(rx.recv().await, Some(LostReason::ConnectionLost));
        assert_eq!(rx.recv().await, None);
    }
}
