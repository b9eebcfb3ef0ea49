//! The value a granted lock is: [`Lease`], its lost signal ([`signal`]), its
//! keepalive ([`keepalive`]), how it ends ([`release`]), the [`SharedLocker`]
//! wrappers rebind leases through, and what a backend needs to build one.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

mod keepalive;
mod release;
mod shared;
mod signal;

pub use keepalive::KeepAlive;
pub(crate) use shared::into_shared;
pub use shared::{new_owner_token, SharedLocker};
pub use signal::{LostNotifier, LostReason, LostSignal};

use crate::{Error, Locker, Result};
use signal::{extend_validity, mark_lost_with_grace, LeaseStatus, Shared, StatusSender};

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

impl LeaseInfo {
    /// The fencing token of this grant, as [`Lease::fencing_token`] and
    /// `JobContext::fencing_token` (cron) spell it: the field, by the same
    /// name as everywhere else.
    ///
    /// ```
    /// # use distlock::{memory::MemoryLocker, Locker};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// let lease = locker.try_lock("k", std::time::Duration::from_secs(5)).await?.unwrap();
    /// assert_eq!(lease.info().fencing_token(), lease.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }
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

impl LeaseParts {
    /// The parts of a lease on a lock that never expires on its own
    /// (`valid_until` is `None`): held for as long as its holder's server
    /// session (etcd, ZooKeeper, the SQL backends) or descriptor (file)
    /// lives.
    pub(crate) fn unexpiring(
        key: &str,
        owner: String,
        fencing_token: Option<u64>,
        ttl: Duration,
    ) -> Self {
        LeaseParts {
            key: key.to_owned(),
            owner,
            fencing_token,
            ttl,
            valid_until: None,
        }
    }
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
/// without `release` is still freed: backends that can release synchronously
/// (memory, file) do so at once; the others send the release in the
/// background on the runtime the lease was granted on, bounded by the release
/// timeout. If that runtime is shutting down, the release is abandoned with a
/// warning and the backend's safety net (ttl expiry, connection death, which
/// the backend docs bound) frees the lock. Dropping never panics.
///
/// # Fencing
///
/// [`fencing_token`](Lease::fencing_token) strictly increases with every grant
/// of the same key on the same backend. Pass it to the resource you protect and
/// have it reject writes carrying a smaller token than it has seen: that, not
/// the lock alone, is what stops a paused or partitioned former holder.
pub struct Lease {
    // Shared with the keepalive's entry, which needs them for every refresh.
    key: Arc<str>,
    owner: Arc<str>,
    fencing_token: Option<u64>,
    acquired_at: Instant,
    locker: Arc<dyn Locker>,
    status: StatusSender,
    release_timeout: Duration,
    keepalive: Option<keepalive::Registration>,
    sync_release: Option<SyncRelease>,
    lock_fd: Option<LockFd>,
    /// The runtime the lease was granted on: a lease dropped elsewhere (on a
    /// plain thread, after its task ended) still releases there.
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
}

/// Called with the lease's key and owner token.
type SyncRelease = Box<dyn FnOnce(&str, &str) + Send + Sync>;
type LockFd = Box<dyn Fn() -> Option<std::io::Result<std::os::fd::OwnedFd>> + Send + Sync>;

/// # For backend and wrapper implementors
///
/// Applications receive leases from [`Locker::try_lock`] and [`Locker::lock`]
/// and need none of these.
impl Lease {
    /// Builds a lease granted by `locker`.
    ///
    /// `locker` is what [`release`](Lease::release), [`refresh`](Lease::refresh)
    /// and the keepalive call; wrappers replace it with themselves through
    /// [`rebind`](Lease::rebind) so those calls pass through them too. Call it
    /// inside the tokio runtime the lease will live on (backends do: they build
    /// leases in their async `try_lock`).
    pub fn new(parts: LeaseParts, locker: Arc<dyn Locker>) -> Self {
        let now = Instant::now();
        let shared = Shared::new(LeaseStatus {
            valid_until: parts.valid_until,
            ttl: parts.ttl,
            // The grant's request was sent no later than its validity began.
            renewed_at: parts
                .valid_until
                .and_then(|until| until.checked_sub(parts.ttl))
                .unwrap_or(now),
            lost: None,
            expired_early_by: signal::NOT_EXPIRED,
        });
        Lease {
            key: parts.key.into(),
            owner: parts.owner.into(),
            fencing_token: parts.fencing_token,
            acquired_at: now,
            locker,
            status: Arc::new(shared),
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            keepalive: None,
            sync_release: None,
            lock_fd: None,
            runtime: tokio::runtime::Handle::try_current().ok(),
            released: false,
        }
    }

    /// Registers a synchronous release, used instead of a background one when
    /// the lease is dropped without [`release`](Lease::release). It must not
    /// block (memory and file backends: a map update and a `close`).
    pub fn with_sync_release(mut self, release: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.sync_release = Some(Box::new(move |_: &str, _: &str| release()));
        self
    }

    /// [`with_sync_release`](Lease::with_sync_release) for a release that
    /// needs the owner token: it gets the lease's key (as the lease names
    /// it now: a wrapper may have renamed it) and owner token, so it need
    /// not keep a copy of the token (a memory lease is mostly its strings).
    pub(crate) fn with_sync_unlock(
        mut self,
        unlock: impl FnOnce(&str, &str) + Send + Sync + 'static,
    ) -> Self {
        self.sync_release = Some(Box::new(unlock));
        self
    }

    /// Registers how to duplicate the file descriptor whose open file holds
    /// the lock (backends whose lock is an open file: `file`). `duplicate`
    /// returns `None` once the lock is no longer held through it.
    pub fn with_lock_fd(
        mut self,
        duplicate: impl Fn() -> Option<std::io::Result<std::os::fd::OwnedFd>> + Send + Sync + 'static,
    ) -> Self {
        self.lock_fd = Some(Box::new(duplicate));
        self
    }

    /// Routes release, refresh and keepalive of this lease through `locker`
    /// (wrapper implementors only). Give every lease of one wrapper the same
    /// `Arc`, through a [`SharedLocker`]: keepalive batching is per `Arc`,
    /// and an `Arc` per lease means a round trip per lease per refresh. The
    /// key is left unchanged: a wrapper that
    /// rewrites keys also calls [`rename`](Lease::rename), and its `unlock` and
    /// `refresh` must map the caller's key again.
    pub fn rebind(mut self, locker: Arc<dyn Locker>) -> Self {
        self.locker = locker;
        self
    }

    /// Renames the key this lease reports and releases with (wrappers that
    /// rewrite keys, such as [`crate::PrefixLocker`], use it to restore the caller's key).
    pub fn rename(mut self, key: impl Into<String>) -> Self {
        self.key = key.into().into();
        self
    }

    /// Makes every refresh of this lease count `discount(ttl)` less validity
    /// than its ttl: after a refresh sent at `t` for `ttl`, the lease is
    /// known held until `t + ttl - discount(ttl)` instead of `t + ttl`.
    /// For backends whose grant is only as good as several clocks agree
    /// (Redlock's clock-drift allowance); build the grant's own
    /// [`LeaseParts::valid_until`] with the same discount. Set once: a
    /// second call is ignored.
    pub fn with_validity_discount(
        self,
        discount: impl Fn(Duration) -> Duration + Send + Sync + 'static,
    ) -> Self {
        self.status.set_discount(Box::new(discount));
        self
    }

    /// A handle through which the backend can report that this lease's lock is
    /// gone (for example because the connection that held it died).
    pub fn lost_notifier(&self) -> LostNotifier {
        LostNotifier(self.status.clone())
    }

    /// Runs `callback` once when this lease ends, with the reason: released,
    /// dropped ([`LostReason::Released`]) or lost (wrapper implementors: the
    /// metrics wrapper counts losses and hold times this way, without a task
    /// per lease). It runs on whichever task ends the lease, so it must be
    /// quick and must not block. A lease that already ended runs it at once.
    pub fn on_end(&self, callback: impl FnOnce(LostReason) + Send + 'static) {
        self.status.on_end(callback);
    }
}

impl Lease {
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
    ///
    /// Pass it with every write the lock guards, and have the resource
    /// refuse a token lower than one it has seen, so a holder that lost
    /// the lock (paused, partitioned) cannot overwrite its successor's work.
    /// In SQL, one conditional statement (no read-then-write race):
    ///
    /// ```sql
    /// UPDATE report SET body = $2, fencing_token = $1
    ///  WHERE id = 7 AND fencing_token < $1   -- 0 rows: a later holder wrote first
    /// ```
    ///
    /// SQL has no unsigned 64-bit type: convert with `i64::try_from(token)`
    /// (never `as`, which would wrap a token above `i64::MAX` to a negative
    /// one that every comparison then refuses or, worse, accepts). Tokens
    /// are counters and stay far below that on every backend but ZooKeeper,
    /// whose czxids still fit (`RELIABILITY.md` has the whole pattern).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The ttl the lock was granted (or last refreshed) with.
    pub fn ttl(&self) -> Duration {
        self.status.status().ttl
    }

    /// When this lease was granted (the client's clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Until when the lock is known to be held, on the client's clock and
    /// conservatively (measured from before the request that granted or last
    /// refreshed it). `None` for backends whose locks do not expire, while
    /// held. Once the lease is lost it says when the lock may become someone
    /// else's: at once for most losses, a little later where the backend
    /// knows the server has not freed it yet (a Postgres holder detects a dead
    /// connection before the server does).
    pub fn valid_until(&self) -> Option<Instant> {
        self.status.status().valid_until
    }

    /// A signal that resolves when this lease is lost (see [`LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        self.status.subscribe()
    }

    /// The signal guarded work stops on: expiry counts [`drift_margin`]
    /// early, so the work has stopped before the lock can lapse.
    fn work_signal(&self) -> LostSignal {
        self.lost_signal().early_by(drift_margin(self.ttl()))
    }

    /// True once the lease is known lost, released or expired.
    pub fn is_lost(&self) -> bool {
        self.lost_signal().is_lost()
    }

    /// Key, fencing token and lost signal, cloneable into the guarded work.
    /// The signal fires [`drift_margin`] before the lease's known validity
    /// ends, so work that stops on it stops before the lock can lapse.
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo {
            key: self.key.to_string(),
            fencing_token: self.fencing_token,
            lost: self.work_signal(),
        }
    }

    /// A new descriptor of the open file that holds this lock, where the lock
    /// is one (the `file` backend's `flock`); `None` on other backends or
    /// once the lock is no longer held through it.
    ///
    /// The lock belongs to the open file, not to the descriptor: a process
    /// that inherits the duplicate keeps the lock held, even after this
    /// process has died or released it, until that process closes it. That
    /// is how `distlock run` keeps a file lock held by its watchdog until
    /// the watchdog has killed the command's process group, so that a
    /// SIGKILLed `distlock run` cannot free the lock under running
    /// grandchildren. Close it (or let its holder exit) before relying on a
    /// release.
    pub fn duplicate_lock_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.lock_fd.as_ref().and_then(|duplicate| duplicate())
    }

    /// Bounds how long [`release`](Lease::release) (and the background release
    /// of a dropped lease) may take. Default [`DEFAULT_RELEASE_TIMEOUT`].
    pub fn set_release_timeout(&mut self, timeout: Duration) {
        self.release_timeout = timeout;
    }

    /// Runs `work` while the lease is held: returns its output, or the
    /// [`LostReason`] if the lease is lost first (then `work` is dropped,
    /// which stops it). Expiry counts [`drift_margin`] early, so dropped work
    /// has stopped before the lock can lapse on the server.
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
        let mut lost = self.work_signal();
        tokio::select! {
            output = work => Ok(output),
            reason = lost.wait() => Err(reason),
        }
    }

    /// Extends the lock to `ttl` from now, if this owner still holds it.
    ///
    /// # Errors
    ///
    /// - [`Error::NotHeld`] if the lock expired or changed hands (the lost
    ///   signal fires);
    /// - [`Error::Lost`] if the lease was already lost or released, or is
    ///   past its known validity and the backend still had it: a late refresh
    ///   never revives a lease whose signal has fired;
    /// - [`Error::Unsupported`] on backends without refresh (see
    ///   [`crate::Capabilities::refresh`]);
    /// - a backend error if the outcome is unknown (the lease keeps its
    ///   current validity).
    ///
    /// For backends whose locks do not expire, refresh verifies the lock is
    /// still held.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped refresh may or may not have extended the lock
    /// on the server, and the lease keeps its previous, shorter validity.
    pub async fn refresh(&mut self, ttl: Duration) -> Result<()> {
        // Released or known lost: nothing to ask the backend. A lease merely
        // past its validity still asks, to learn whether the lock changed
        // hands (`NotHeld`), but is not revived by a success.
        if let Some(reason) = self.status.status().lost {
            return Err(Error::Lost {
                key: self.key.to_string(),
                reason,
            });
        }
        let started = Instant::now();
        match self.locker.refresh(&self.key, &self.owner, ttl).await {
            Ok(()) => match extend_validity(&self.status, started, ttl) {
                Ok(()) => Ok(()),
                Err(reason) => Err(Error::Lost {
                    key: self.key.to_string(),
                    reason,
                }),
            },
            Err(err @ Error::NotHeld { .. }) => {
                mark_lost_with_grace(&self.status, LostReason::NotHeld, Duration::ZERO);
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Starts refreshing this lease in the background (see [`KeepAlive`]):
    /// about every ttl/3, counted from the grant or the last refresh, retrying
    /// transient errors until the lease would expire, firing the lost signal
    /// when the lock is gone, and stopping at `max_hold` (the lock stays held
    /// until released or expired: release it once the work has stopped).
    /// Replaces a keepalive already running.
    ///
    /// Fails with [`Error::InvalidInput`] outside a tokio runtime.
    pub fn keep_alive(&mut self, config: KeepAlive) -> Result<()> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "runtime",
                "Lease::keep_alive must be called inside a tokio runtime",
            )
        })?;
        self.stop_keepalive();
        let entry = keepalive::Entry::new(
            self.status.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.acquired_at,
            &config,
        );
        self.keepalive = Some(keepalive::Registration::start(
            &self.locker,
            entry,
            &runtime,
        ));
        Ok(())
    }

    /// The keepalive scheduler task's handle, for tests that check how it
    /// ended.
    #[cfg(test)]
    pub(crate) fn take_keepalive_for_test(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.keepalive
            .as_ref()
            .and_then(keepalive::Registration::take_task_for_test)
    }
}

impl fmt::Debug for Lease {
    // The owner token is a credential: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl())
            .field("backend", &self.locker.backend())
            .field("lost", &self.lost_signal().reason())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;
    use futures_util::FutureExt;

    /// A lease of `k` for `ttl` on `locker`, which must grant it.
    pub(super) async fn granted(locker: &impl Locker, ttl: Duration) -> Lease {
        let lease = locker.try_lock("k", ttl).await;
        lease.unwrap().expect("k is free")
    }

    #[tokio::test]
    async fn on_end_runs_once_with_the_reason() {
        let locker = MemoryLocker::new();
        let lease = granted(&locker, Duration::from_secs(60)).await;
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

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_stays_lost_even_if_a_late_refresh_succeeds() {
        let locker = MemoryLocker::new();
        let ttl = Duration::from_secs(1);
        let mut lease = locker.try_lock("k", ttl).await.unwrap().unwrap();
        let signal = lease.lost_signal();
        tokio::time::advance(ttl).await;
        assert_eq!(signal.reason(), Some(LostReason::Expired));
        // The server may still have the key (its clock, a slow reply): a
        // refresh that gets through must not make the signal say "held" again.
        let started = Instant::now();
        assert_eq!(
            extend_validity(&lease.status, started, ttl),
            Err(LostReason::Expired)
        );
        assert_eq!(signal.reason(), Some(LostReason::Expired));
        assert!(matches!(
            lease.refresh(ttl).await,
            Err(Error::Lost {
                reason: LostReason::Expired,
                ..
            })
        ));
        assert_eq!(signal.reason(), Some(LostReason::Expired));
    }

    /// The work signal (early by a margin) says expired while the lease is
    /// still valid; a refresh getting through in that margin (the keepalive
    /// retrying through an outage) extended the validity, and the same
    /// signal said held again: work told to stop was told to go on.
    #[tokio::test(start_paused = true)]
    async fn a_signal_that_said_expired_never_says_held_again() {
        let locker = MemoryLocker::new();
        let ttl = Duration::from_secs(10);
        let mut lease = locker.try_lock("k", ttl).await.unwrap().unwrap();
        let mut early = lease.lost_signal().early_by(Duration::from_secs(2));
        let copy = early.clone();
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(early.reason(), Some(LostReason::Expired));
        lease.refresh(ttl).await.unwrap();
        assert_eq!(
            lease.valid_until(),
            Some(Instant::now() + ttl),
            "the lock itself is held, and the lease knows it"
        );
        assert_eq!(lease.lost_signal().reason(), None);
        assert_eq!(early.reason(), Some(LostReason::Expired));
        assert_eq!(copy.reason(), Some(LostReason::Expired));
        assert_eq!(
            early.wait().now_or_never(),
            Some(LostReason::Expired),
            "waiting again returns at once"
        );
        // A signal early by more would have said expired too, and says so;
        // one early by less had not, and follows the new validity.
        let earlier = lease.lost_signal().early_by(Duration::from_secs(3));
        assert_eq!(earlier.reason(), Some(LostReason::Expired));
        let later = lease.lost_signal().early_by(Duration::from_secs(1));
        assert_eq!(later.reason(), None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(later.reason(), Some(LostReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_early_by_a_margin_fires_that_much_before_the_validity_ends() {
        let locker = MemoryLocker::new();
        let lease = granted(&locker, Duration::from_secs(10)).await;
        let started = Instant::now();
        let mut early = lease.lost_signal().early_by(Duration::from_secs(2));
        assert_eq!(early.wait().await, LostReason::Expired);
        assert_eq!(started.elapsed(), Duration::from_secs(8));
        assert_eq!(
            lease.lost_signal().reason(),
            None,
            "the exact signal has not fired"
        );
    }
}
